#!/usr/bin/env bash
# Stops the four services started by up.sh, and with --all the infrastructure too. Data is kept.
source "$(dirname "$0")/lib/common.sh"

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

for service in attachments runs history worker; do stop_pidfile "$DATA/run/$service.pid"; done
if [ "${1:-}" = "--all" ]; then
  stop_pidfile "$DATA/nats.pid"
  stop_pidfile "$DATA/s3.pid"
  if [ -f "$DATA/postgres/postmaster.pid" ]; then
    bin="$(ls -d /usr/lib/postgresql/*/bin | tail -1)"
    as_postgres "$bin/pg_ctl" -D "$DATA/postgres" -m fast -w stop >/dev/null
  fi
fi
log "stopped"
