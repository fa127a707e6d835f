#!/usr/bin/env bash
# The local 3-node NATS JetStream cluster of `scripts/up.sh --cluster`: each node with its own
# store under .data/nats-cluster/, routes to the others, and the authorization block that gives
# each service its own user with only the subjects it needs (`switchboard-nats-config`, from
# platform::nats_auth; passwords made once in .data/nats-cluster/passwords/). Idempotent: a
# healthy node is left alone. Needs nats-server (scripts/infra.sh installs it) and the built
# workspace binaries.
source "$(dirname "$0")/lib/common.sh"

bin="$(nats_bin)" || die "no nats-server: run scripts/infra.sh"
dir="$DATA/nats-cluster"
mkdir -p "$dir"
"$ROOT/target/debug/switchboard-nats-config" "${SB_NATS_PREFIX:-sb}" >"$dir/auth.conf"

routes=""
for i in 1 2 3; do routes+="${routes:+, }nats-route://127.0.0.1:$((NATS_CLUSTER_PORT + 2000 + i))"; done

node_healthy() { curl -fs "http://127.0.0.1:$((NATS_CLUSTER_PORT + 4000 + $1))/healthz" >/dev/null; }

for i in 1 2 3; do
  node_healthy "$i" && continue
  cat >"$dir/n$i.conf" <<CONF
server_name: n$i
listen: 127.0.0.1:$((NATS_CLUSTER_PORT + i))
http: 127.0.0.1:$((NATS_CLUSTER_PORT + 4000 + i))
jetstream { store_dir: "$dir/n$i", max_file_store: 8GB, max_memory_store: 256MB }
cluster { name: switchboard, listen: 127.0.0.1:$((NATS_CLUSTER_PORT + 2000 + i)), routes: [$routes] }
include ./auth.conf
CONF
  log "starting NATS node n$i on 127.0.0.1:$((NATS_CLUSTER_PORT + i))"
  (
    for user in attachments runs history worker admin; do
      export "SB_NATS_PASSWORD_$(echo "$user" | tr a-z A-Z)=$(nats_password "$user")"
    done
    setsid nohup "$bin" -c "$dir/n$i.conf" -P "$dir/n$i.pid" >>"$DATA/logs/nats-n$i.log" 2>&1 </dev/null &
  )
done
for i in 1 2 3; do wait_until "NATS node n$i" 60 node_healthy "$i"; done
log "NATS cluster ready: $(nats_cluster_urls)"
