#!/usr/bin/env bash
# Brings up the whole platform: infrastructure (installed if missing), the four services built
# from this checkout and the gateway on one origin (127.0.0.1:8080). Idempotent: running
# services are restarted on the fresh build.
#
#   scripts/up.sh             one replica of each service on the single-node NATS
#   scripts/up.sh --cluster   the production shape: a 3-node NATS JetStream cluster (streams of 3
#                             replicas, a NATS user per service), two replicas of each service
#
# SB_WORKER_AGENTS_FILE=path/agents.toml scripts/up.sh: the workers also relay to the remote
# AG-UI agents that file configures (docs/agents.md, "Bring your own agent").
source "$(dirname "$0")/lib/common.sh"
cd "$ROOT"

cluster=0
case "${1:-}" in
  --cluster) cluster=1 ;;
  "") ;;
  *) die "usage: scripts/up.sh [--cluster]" ;;
esac

# The web client (web/): npm packages from its lock file, then a production build into web/dist.
build_web() {
  [ -f "$ROOT/web/package.json" ] || return 0
  if ! command -v npm >/dev/null; then
    log "installing Node.js and npm (Debian packages)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
  fi
  if [ ! -d "$ROOT/web/node_modules" ] || [ "$ROOT/web/package-lock.json" -nt "$ROOT/web/node_modules" ]; then
    log "installing the web client's npm packages"
    (cd "$ROOT/web" && npm ci --no-audit --no-fund --loglevel=error) && touch "$ROOT/web/node_modules"
  fi
  log "building the web client"
  (cd "$ROOT/web" && npm run --silent build >/dev/null)
}

# The remote agents file, checked to exist here (the worker checks what it says) and passed to
# every worker replica by its absolute path.
agents_file=""
if [ -n "${SB_WORKER_AGENTS_FILE:-}" ]; then
  [ -f "$SB_WORKER_AGENTS_FILE" ] || die "SB_WORKER_AGENTS_FILE=$SB_WORKER_AGENTS_FILE is not a file"
  agents_file="$(cd "$(dirname "$SB_WORKER_AGENTS_FILE")" && pwd)/$(basename "$SB_WORKER_AGENTS_FILE")"
fi

"$ROOT/scripts/infra.sh"
log "building the services"
cargo build --workspace --bins --locked --quiet
build_web

declare -A PORTS=([attachments]=${SB_ATTACHMENTS_PORT:-8081} [runs]=${SB_RUNS_PORT:-8082} [history]=${SB_HISTORY_PORT:-8083} [worker]=${SB_WORKER_PORT:-8084})
# The second replica of each service in cluster mode listens 1000 ports higher.
REPLICA_OFFSET=1000
mkdir -p "$DATA/logs" "$DATA/run"
env_file="$DATA/run/services.env"
service_env >"$env_file"
[ -n "$agents_file" ] && echo "SB_WORKER_AGENTS_FILE=$agents_file" >>"$env_file"
replicas=1
if [ "$cluster" = 1 ]; then
  replicas=2
  "$ROOT/scripts/nats-cluster.sh"
  # Every node, each service as its own NATS user (platform::nats_auth), streams of 3 replicas
  # whose reserved sizes fit the nodes' 8 GB stores.
  cat >>"$env_file" <<ENV
SB_NATS_URL=$(nats_cluster_urls)
SB_NATS_REPLICAS=3
SB_NATS_RUNS_MAX_BYTES=2147483648
SB_NATS_EVENTS_MAX_BYTES=2147483648
SB_NATS_KV_MAX_BYTES=134217728
ENV
fi

# Whatever ran before (either mode) stops first; then every replica starts on the fresh build.
for pidfile in "$DATA"/run/*.pid; do [ -e "$pidfile" ] && stop_pidfile "$pidfile"; done

upstreams() {
  local service="$1" replica list=""
  for ((replica = 0; replica < replicas; replica++)); do
    list+="${list:+,}127.0.0.1:$((PORTS[$service] + replica * REPLICA_OFFSET))"
  done
  echo "$list"
}

# On the cluster the services' own NATS users may not create streams and buckets: the admin
# does, as a deployment's Job does (`<service> nats-setup`), before any service starts.
if [ "$cluster" = 1 ]; then
  (
    set -a; source "$env_file"; set +a
    export SB_NATS_USER=admin
    SB_NATS_PASSWORD="$(nats_password admin)"; export SB_NATS_PASSWORD
    "$ROOT/target/debug/switchboard-runs" nats-setup >>"$DATA/logs/nats-setup.log" 2>&1 </dev/null
  ) || die "nats-setup failed; see $DATA/logs/nats-setup.log"
fi

for service in attachments runs history worker; do
  for ((replica = 0; replica < replicas; replica++)); do
    port=$((PORTS[$service] + replica * REPLICA_OFFSET))
    name="$service"; [ "$replica" -gt 0 ] && name="$service-$((replica + 1))"
    addr_var="SB_$(echo "$service" | tr a-z A-Z)_ADDR"
    (
      set -a; source "$env_file"; set +a
      export "$addr_var=127.0.0.1:$port"
      if [ "$cluster" = 1 ]; then
        export SB_NATS_USER="$service"
        SB_NATS_PASSWORD="$(nats_password "$service")"; export SB_NATS_PASSWORD
      fi
      setsid nohup "$ROOT/target/debug/switchboard-$service" >>"$DATA/logs/$name.log" 2>&1 </dev/null &
      echo $! >"$DATA/run/$name.pid"
    )
  done
done

for service in attachments runs history worker; do
  for ((replica = 0; replica < replicas; replica++)); do
    wait_until "$service" 60 curl -fs "http://127.0.0.1:$((PORTS[$service] + replica * REPLICA_OFFSET))/readyz"
  done
done

# The gateway: one origin for every client (the web client at /, the API beside it).
(
  setsid nohup "$ROOT/scripts/gateway.sh" --dir "$DATA/gateway" --listen "127.0.0.1:$GATEWAY_PORT" \
    --runs "$(upstreams runs)" --history "$(upstreams history)" \
    --attachments "$(upstreams attachments)" --web "$ROOT/web/dist" \
    >>"$DATA/logs/gateway.log" 2>&1 </dev/null &
  echo $! >"$DATA/run/gateway.pid"
)
wait_until gateway 30 curl -fs "http://127.0.0.1:$GATEWAY_PORT/api/v1/agents" -o /dev/null -H "Authorization: Bearer $(dev_token gateway-check)"

mode="one replica of each service, single-node NATS"
[ "$cluster" = 1 ] && mode="two replicas of each service, a 3-node NATS cluster ($(nats_cluster_urls)) with a user per service"
G="http://127.0.0.1:$GATEWAY_PORT"
cat <<INFO

Switchboard is up: $mode.
Logs in .data/logs/; stop with scripts/down.sh (--all: the infrastructure too).
  gateway      $G  every public path, and the web client at /
  sign in      $G/#token=$(dev_token "${SB_DEV_USER:-developer}" 86400)
  metrics      http://127.0.0.1:<service port>/metrics (attachments ${PORTS[attachments]}, runs ${PORTS[runs]}, history ${PORTS[history]}, worker ${PORTS[worker]}; not routed by the gateway)
Infrastructure: PostgreSQL 127.0.0.1:$PG_PORT, NATS 127.0.0.1:$NATS_PORT, S3 http://127.0.0.1:$S3_PORT

Get a token (HS256, local secret):   TOKEN=\$(scripts/token.sh alice)
Start a run:
  curl -s -H "Authorization: Bearer \$TOKEN" -H 'Content-Type: application/json' \\
    -d '{"threadId":"550e8400-e29b-41d4-a716-446655440000","runId":"run-001","messages":[{"id":"m1","role":"user","content":"hello"}]}' \\
    $G/api/v1/agent/runs
Watch its events (AG-UI over SSE; Last-Event-ID resumes):
  curl -sN -H "Authorization: Bearer \$TOKEN" $G/api/v1/agent/runs/run-001/events
Read it back:
  curl -s -H "Authorization: Bearer \$TOKEN" '$G/api/v1/agent/history?threadId=550e8400-e29b-41d4-a716-446655440000'
Also: POST /api/v1/agent/ag-ui (AG-UI HttpAgent), POST /v2/chat, ws://127.0.0.1:$GATEWAY_PORT/websocket
INFO
