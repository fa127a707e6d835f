# The Python virtualenv of the AG-UI agent servers the system tests run (tests/agents/serve.py),
# which also holds the OTLP receiver of the trace test (oteltest, tests/system/traces.rs).
# Sourced after scripts/lib/common.sh (ROOT, DATA, log, die), not run.

AGENTS_VENV="$DATA/agents-venv"
AGENTS_REQUIREMENTS="$ROOT/tests/agents/requirements.txt"

# ensure_agent_venv: makes $DATA/agents-venv with python3 -m venv and installs
# tests/agents/requirements.txt into it. Idempotent: does nothing, and prints nothing, while the
# venv works and its stamp holds the sha256 of the requirements it was made from; otherwise makes
# it anew. Installs Debian's python3-venv when python3 cannot make a venv without it.
ensure_agent_venv() {
  local stamp="$AGENTS_VENV/.requirements.sha256" want
  [ -f "$AGENTS_REQUIREMENTS" ] || die "missing $AGENTS_REQUIREMENTS"
  want="$(sha256sum "$AGENTS_REQUIREMENTS" | cut -d' ' -f1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
    && "$AGENTS_VENV/bin/python" -c '' >/dev/null 2>&1; then
    return 0
  fi

  command -v python3 >/dev/null || die "python3 is needed for the agent servers (tests/agents)"
  log "making the agent servers' Python venv (${AGENTS_VENV#"$ROOT"/})"
  rm -rf "$AGENTS_VENV"
  if ! python3 -m venv "$AGENTS_VENV" >/dev/null 2>&1; then
    # Debian's python3 makes a venv (with pip) only with python3-venv installed.
    rm -rf "$AGENTS_VENV"
    log "installing python3-venv (Debian package)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv "$AGENTS_VENV" || die "python3 -m venv failed"
  fi
  log "installing the agent servers' Python packages (pip install -r ${AGENTS_REQUIREMENTS#"$ROOT"/})"
  "$AGENTS_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    -r "$AGENTS_REQUIREMENTS" >&2 || die "pip install -r $AGENTS_REQUIREMENTS failed"
  printf '%s\n' "$want" >"$stamp"
}
