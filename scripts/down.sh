#!/usr/bin/env bash
# Stops the four services started by up.sh, and with --all the infrastructure too. Data is kept.
source "$(dirname "$0")/lib/common.sh"


for service in gateway attachments runs history worker; do stop_pidfile "$DATA/run/$service.pid"; done
if [ "${1:-}" = "--all" ]; then
  stop_pidfile "$DATA/nats.pid"
  stop_pidfile "$DATA/s3.pid"
  if [ -f "$DATA/postgres/postmaster.pid" ]; then
    bin="$(ls -d /usr/lib/postgresql/*/bin | tail -1)"
    as_postgres "$bin/pg_ctl" -D "$DATA/postgres" -m fast -w stop >/dev/null
  fi
fi
log "stopped"
