#!/usr/bin/env bash
# Everything CI checks: format, clippy with warnings denied, and every test (unit, integration and
# system tests against the real PostgreSQL, NATS JetStream and S3 that infra.sh brings up).
# Idempotent; installs what is missing. CI runs exactly this (see .ci/run).
source "$(dirname "$0")/lib/common.sh"
cd "$ROOT"

started=$SECONDS
# No incremental compilation caches: a test run builds each crate once, and the caches of every
# workspace crate's library, binaries and test targets took more disk (19 GB here) than the
# artifacts themselves; a CI run ran out of disk linking.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
ensure_toolchain() {
  local component
  for component in rustfmt clippy; do
    if ! rustup component list --installed 2>/dev/null | grep -q "^$component"; then
      log "installing the $component component"
      rustup component add "$component"
    fi
  done
  if ! cargo nextest --version >/dev/null 2>&1; then
    log "installing cargo-nextest from crates.io"
    cargo install --quiet --locked cargo-nextest
  fi
}

# The system tests that drive real JavaScript clients: tests/system/browser.rs (Debian's Chromium
# and playwright-core, which downloads no browser of its own) and tests/system/agui.rs (AG-UI's
# @ag-ui/client). Node.js from Debian if missing; each driver's npm packages from its lock file.
ensure_js_clients() {
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    log "installing Node.js and npm (Debian packages)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
  fi
  if [ ! -x /usr/bin/chromium ]; then
    log "installing Chromium (Debian package)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  fi
  local dir
  for dir in "$ROOT/tests/browser" "$ROOT/tests/agui" "$ROOT/web"; do
    if [ ! -d "$dir/node_modules" ] || [ "$dir/package-lock.json" -nt "$dir/node_modules" ]; then
      log "installing npm packages (npm ci in ${dir#"$ROOT"/})"
      (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
      touch "$dir/node_modules"
    fi
  done
  # The web client's production build (type check included), served by tests/system/web.rs.
  log "building the web client (npm run build in web)"
  (cd "$ROOT/web" && npm run --silent build >/dev/null)
  # Its event reducer's unit tests (Vitest).
  log "web client unit tests (npm test in web)"
  (cd "$ROOT/web" && npm test --silent) || die "the web client's unit tests failed"
}

ensure_toolchain
ensure_js_clients
# The real AG-UI agent servers (Pydantic AI, LangGraph) the remote-agent tests relay to.
source "$ROOT/scripts/lib/agents.sh"
ensure_agent_venv
"$ROOT/scripts/infra.sh"

# Kubernetes: every overlay rendered and validated against the schemas, and the rules test.
"$ROOT/scripts/check-deploy.sh"

log "cargo fmt --check"
cargo fmt --all --check

log "cargo clippy (warnings denied)"
cargo clippy --workspace --all-targets --locked --quiet -- -D warnings

# The committed sqlx offline data (services/*/.sqlx) against the queries and migrations.
"$ROOT/scripts/sqlx-prepare.sh" --check

log "building the service binaries (the system tests start them as processes)"
cargo build --workspace --bins --locked --quiet

# Databases of earlier test runs; every test makes its own.
pg_admin -tAc \
  "SELECT 'DROP DATABASE IF EXISTS ' || quote_ident(datname) || ' WITH (FORCE);' FROM pg_database WHERE datname LIKE 'sbt\_%'" \
  | pg_admin >/dev/null

export SB_TEST_DATABASE_URL="$(database_url)"
export SB_TEST_NATS_URL="nats://127.0.0.1:$NATS_PORT"
export SB_TEST_S3_ENDPOINT="http://127.0.0.1:$S3_PORT"
export SB_TEST_S3_ACCESS_KEY="$S3_ACCESS_KEY"
export SB_TEST_S3_SECRET_KEY="$S3_SECRET_KEY"
export SB_TEST_JWT_SECRET="$JWT_SECRET"
# The Python that serves tests/agents/serve.py (the venv ensure_agent_venv made).
export SB_TEST_AGENTS_PYTHON="$AGENTS_VENV/bin/python"
# The nats-server the cluster tests start nodes of their own with.
SB_TEST_NATS_SERVER="$(nats_bin)" || die "no nats-server (scripts/infra.sh installs it)"
export SB_TEST_NATS_SERVER

# NATS streams of earlier test runs that ended before their cleanup (each test removes its own).
cargo run --locked -q -p switchboard-test-support --bin clean-test-streams

log "cargo nextest run"
cargo nextest run --workspace --locked --no-fail-fast "$@"
log "all checks passed in $((SECONDS - started))s"
