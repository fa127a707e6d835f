#!/usr/bin/env bash
# Regenerates the offline query data of the services whose SQL sqlx checks at compile time
# (`sqlx::query!` and friends): services/<service>/.sqlx/, committed, so CI and a fresh clone
# build without a database. Run it after changing a query or a migration, then commit the
# .sqlx directories:
#
#     scripts/sqlx-prepare.sh               # history and attachments
#     scripts/sqlx-prepare.sh history       # one of them
#     scripts/sqlx-prepare.sh --check       # CI (scripts/test.sh): fails, naming the files,
#                                           # when the committed data is not what the queries
#                                           # and migrations give now; changes nothing
#
# Each service's migrations (migrations/<service>/*.sql, in order) go into a scratch database,
# in a schema named after the service, which the build's DATABASE_URL puts on the search path
# (as platform::db does at run time); the crate is then checked online with SQLX_OFFLINE_DIR
# set, which makes the macros write their data there. Needs the local PostgreSQL of infra.sh.
source "$(dirname "$0")/lib/common.sh"
cd "$ROOT"

check=0
if [ "${1:-}" = --check ]; then
  check=1
  shift
fi
services=("$@")
[ ${#services[@]} -gt 0 ] || services=(history attachments)
scratch="sqlx_prepare_$$"
trap 'rm -rf services/*/.sqlx.new; pg_admin -c "DROP DATABASE IF EXISTS $scratch" >/dev/null 2>&1 || true' EXIT
pg_admin -c "CREATE DATABASE $scratch OWNER $PG_USER"

for service in "${services[@]}"; do
  crate="services/$service"
  [ -d "migrations/$service" ] && [ -f "$crate/Cargo.toml" ] || die "no service named $service"
  log "migrating the $service schema of the scratch database"
  psql -q -X -v ON_ERROR_STOP=1 "$(database_url "$scratch")" -c "CREATE SCHEMA $service" >/dev/null
  for migration in "migrations/$service"/*.sql; do
    PGOPTIONS="-c search_path=$service" \
      psql -q -X -v ON_ERROR_STOP=1 "$(database_url "$scratch")" -f "$migration" >/dev/null
  done
  # Written next to the committed data, then swapped in: a concurrent offline build never sees
  # a half-written directory, and queries that are gone leave no file behind.
  fresh="$crate/.sqlx.new"
  rm -rf "$fresh" && mkdir -p "$fresh"
  # The macros run only when the crate compiles again.
  touch "$crate/src/lib.rs"
  log "checking switchboard-$service against it (writes $crate/.sqlx)"
  DATABASE_URL="$(database_url "$scratch")?options=-c%20search_path%3D$service" \
    SQLX_OFFLINE=false SQLX_OFFLINE_DIR="$ROOT/$fresh" \
    cargo check --quiet --package "switchboard-$service" --all-targets
  [ -n "$(ls -A "$fresh")" ] || die "no query data was written for $service"
  if [ "$check" = 1 ]; then
    if ! diff -r -q "$crate/.sqlx" "$fresh"; then
      die "$crate/.sqlx is not what the queries and migrations give now: run scripts/sqlx-prepare.sh $service and commit $crate/.sqlx"
    fi
    rm -rf "$fresh"
    log "$service: the committed query data is current ($(ls "$crate/.sqlx" | wc -l) queries)"
    continue
  fi
  rm -rf "$crate/.sqlx" && mv "$fresh" "$crate/.sqlx"
  log "$service: $(ls "$crate/.sqlx" | wc -l) queries"
done
