#!/usr/bin/env bash
# Stops what up.sh started (either mode: the gateway and every replica), and with --all the
# infrastructure too (PostgreSQL, S3, the single NATS and the cluster's nodes). Data is kept.
source "$(dirname "$0")/lib/common.sh"


# The gateway and every replica of either mode of up.sh.
for pidfile in "$DATA"/run/*.pid; do [ -e "$pidfile" ] && stop_pidfile "$pidfile"; done
if [ "${1:-}" = "--all" ]; then
  for i in 1 2 3; do stop_pidfile "$DATA/nats-cluster/n$i.pid"; done
  stop_pidfile "$DATA/nats.pid"
  stop_pidfile "$DATA/s3.pid"
  if [ -f "$DATA/postgres/postmaster.pid" ]; then
    bin="$(ls -d /usr/lib/postgresql/*/bin | tail -1)"
    as_postgres "$bin/pg_ctl" -D "$DATA/postgres" -m fast -w stop >/dev/null
  fi
fi
log "stopped"
