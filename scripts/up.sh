#!/usr/bin/env bash
# Brings up the whole platform: infrastructure (installed if missing) and the four services,
# built from this checkout. Idempotent: running services are restarted on the fresh build.
source "$(dirname "$0")/lib/common.sh"
cd "$ROOT"

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

"$ROOT/scripts/infra.sh"
log "building the services"
cargo build --workspace --bins --locked --quiet
build_web

declare -A PORTS=([attachments]=${SB_ATTACHMENTS_PORT:-8081} [runs]=${SB_RUNS_PORT:-8082} [history]=${SB_HISTORY_PORT:-8083} [worker]=${SB_WORKER_PORT:-8084})
mkdir -p "$DATA/logs" "$DATA/run"
env_file="$DATA/run/services.env"
service_env >"$env_file"

for service in attachments runs history worker; do
  pidfile="$DATA/run/$service.pid"
  stop_pidfile "$pidfile"
  addr_var="SB_$(echo "$service" | tr a-z A-Z)_ADDR"
  (
    set -a; source "$env_file"; set +a
    export "$addr_var=127.0.0.1:${PORTS[$service]}"
    setsid nohup "$ROOT/target/debug/switchboard-$service" >>"$DATA/logs/$service.log" 2>&1 </dev/null &
    echo $! >"$pidfile"
  )
done

for service in attachments runs history worker; do
  wait_until "$service" 60 curl -fs "http://127.0.0.1:${PORTS[$service]}/readyz"
done

# The gateway: one origin for every client (the web client at /, the API beside it).
stop_pidfile "$DATA/run/gateway.pid"
(
  setsid nohup "$ROOT/scripts/gateway.sh" --dir "$DATA/gateway" --listen "127.0.0.1:$GATEWAY_PORT" \
    --runs "127.0.0.1:${PORTS[runs]}" --history "127.0.0.1:${PORTS[history]}" \
    --attachments "127.0.0.1:${PORTS[attachments]}" --web "$ROOT/web/dist" \
    >>"$DATA/logs/gateway.log" 2>&1 </dev/null &
  echo $! >"$DATA/run/gateway.pid"
)
wait_until gateway 30 curl -fs "http://127.0.0.1:$GATEWAY_PORT/api/v1/agents" -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $(dev_token gateway-check)"

cat <<INFO

Switchboard is up (logs in .data/logs/, stop with scripts/down.sh):
  gateway      http://127.0.0.1:$GATEWAY_PORT  every public path, and the web client at /
  sign in      http://127.0.0.1:$GATEWAY_PORT/#token=$(dev_token "${SB_DEV_USER:-developer}" 86400)
  attachments  http://127.0.0.1:${PORTS[attachments]}
  runs         http://127.0.0.1:${PORTS[runs]}      POST /api/v1/agent/runs
  history      http://127.0.0.1:${PORTS[history]}      GET  /api/v1/agent/history
  worker       http://127.0.0.1:${PORTS[worker]}      (health only)
Infrastructure: PostgreSQL 127.0.0.1:$PG_PORT, NATS 127.0.0.1:$NATS_PORT, S3 http://127.0.0.1:$S3_PORT

Get a token (HS256, local secret):   TOKEN=\$(scripts/token.sh alice)
Start a run:
  curl -s -H "Authorization: Bearer \$TOKEN" -H 'Content-Type: application/json' \\
    -d '{"threadId":"550e8400-e29b-41d4-a716-446655440000","runId":"run-001","messages":[{"id":"m1","role":"user","content":"hello"}]}' \\
    http://127.0.0.1:${PORTS[runs]}/api/v1/agent/runs
Watch its events (AG-UI over SSE; Last-Event-ID resumes):
  curl -sN -H "Authorization: Bearer \$TOKEN" http://127.0.0.1:${PORTS[runs]}/api/v1/agent/runs/run-001/events
Read it back:
  curl -s -H "Authorization: Bearer \$TOKEN" 'http://127.0.0.1:${PORTS[history]}/api/v1/agent/history?threadId=550e8400-e29b-41d4-a716-446655440000'
Also: POST /api/v1/agent/ag-ui (AG-UI HttpAgent), POST /v2/chat, ws://127.0.0.1:${PORTS[runs]}/websocket
INFO
