#!/usr/bin/env bash
# Benchmarks the worker's relay to a remote AG-UI agent (services/worker/src/remote/, release
# build): what the relay adds to each event's latency, and how many events a second one worker
# relays. One pass; run it several times and compare within a pass (BENCHMARKS.md section 10).
#
# A bench agent (relay-bench --mode agent) answers every RunAgentInput with RUN_STARTED,
# TEXT_MESSAGE_START, N TEXT_MESSAGE_CONTENT events whose delta carries their send time,
# TEXT_MESSAGE_END and RUN_FINISHED. The worker knows it as the default agent through an agents
# file (SB_WORKER_AGENTS_FILE). In the same pass:
#
# 1. direct, paced: BENCH_RUNS runs of BENCH_EVENTS events BENCH_INTERVAL_MS apart read from the
#    agent itself: per-event latency without the relay (HTTP + SSE on loopback).
# 2. relayed, paced: the same runs through the runs service (POST /api/v1/agent/runs with
#    Accept: text/event-stream): agent -> worker -> JetStream -> runs -> client.
#    Added by the relay = relayed - direct, percentile by percentile.
# 3. direct and relayed as fast as possible: BENCH_FAST_RUNS runs of BENCH_FAST_EVENTS events,
#    one at a time: events a second through one worker (and the agent's own rate beside it), with
#    the CPU seconds each process used meanwhile.
# 4. the floor: BENCH_FAST_EVENTS run events published one after the other as the worker's
#    EventSink publishes them (publish, await the ack, next), on a prefix nothing listens to.
#
# Services (runs, history, worker; attachments is not needed: the runs carry no files) run on a
# fresh database and a fresh NATS prefix; infrastructure is started if needed and left running.
# Everything started here is stopped on exit, the prefixes' streams deleted (BENCH_KEEP_STREAMS=1
# keeps them) and the database dropped (BENCH_KEEP_DB=1 keeps it). Every load is bounded (each
# binary's --max-seconds and `timeout`).
#
# Settings (environment): BENCH_RUNS (10), BENCH_EVENTS (200), BENCH_INTERVAL_MS (10),
# BENCH_FAST_RUNS (3), BENCH_FAST_EVENTS (5000), BENCH_CONCURRENCY (runs in flight in the relayed
# modes, 1), BENCH_WORKER_CONCURRENCY (the worker's SB_WORKER_CONCURRENCY, 8), BENCH_SKIP_BUILD (1:
# the release binaries in target/release as they are), BENCH_OUT (raw results; default
# .data/bench/relay-<time>).
source "$(dirname "$0")/lib/common.sh"
cd "$ROOT"

RUNS="${BENCH_RUNS:-10}"
EVENTS="${BENCH_EVENTS:-200}"
INTERVAL_MS="${BENCH_INTERVAL_MS:-10}"
FAST_RUNS="${BENCH_FAST_RUNS:-3}"
FAST_EVENTS="${BENCH_FAST_EVENTS:-5000}"
CONCURRENCY="${BENCH_CONCURRENCY:-1}"
WORKER_CONCURRENCY="${BENCH_WORKER_CONCURRENCY:-8}"
OUT="${BENCH_OUT:-$DATA/bench/relay-$(date +%Y%m%dT%H%M%S)}"
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release"
mkdir -p "$OUT"

"$ROOT/scripts/infra.sh"
if [ "${BENCH_SKIP_BUILD:-0}" != 1 ]; then
  log "building the services and relay-bench (release)"
  cargo build --release --locked --quiet -p switchboard-bench --bin relay-bench --bin js-publish-loop
  cargo build --release --locked --quiet -p switchboard-runs -p switchboard-history -p switchboard-worker
fi
for bin in relay-bench js-publish-loop switchboard-runs switchboard-history switchboard-worker; do
  [ -x "$BIN/$bin" ] || die "$BIN/$bin is missing (build it, or unset BENCH_SKIP_BUILD)"
done

# ---------------------------------------------------------------- processes, cleaned up on exit
ID="$(date +%s)$((RANDOM % 10000))"
PREFIX="brelay$ID"
FLOOR_PREFIX="brelayfloor$ID"
DB="sbbench_relay_$ID"
export SB_NATS_PREFIX="$PREFIX"
# Stream reservations that fit beside the local platform's on the one NATS server.
export SB_NATS_RUNS_MAX_BYTES=268435456 SB_NATS_EVENTS_MAX_BYTES=536870912 \
  SB_NATS_KV_MAX_BYTES=67108864
NATS_URL="nats://127.0.0.1:$NATS_PORT"
STARTED=()
DB_MADE=0

cleanup() {
  local status=$? pid prefix
  for pid in "${STARTED[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${STARTED[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [ "${BENCH_KEEP_STREAMS:-0}" != 1 ] && [ -x "$BIN/js-publish-loop" ]; then
    for prefix in "$PREFIX" "$FLOOR_PREFIX"; do
      timeout 30 "$BIN/js-publish-loop" --mode cleanup --prefix "$prefix" --nats-url "$NATS_URL" \
        >>"$OUT/cleanup.json" 2>>"$OUT/cleanup.log" || log "could not delete the streams of $prefix"
    done
  fi
  if [ "$DB_MADE" = 1 ] && [ "${BENCH_KEEP_DB:-0}" != 1 ]; then
    pg_admin -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" 2>>"$OUT/cleanup.log" \
      || log "could not drop the database $DB"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

pg_admin -c "CREATE DATABASE $DB OWNER $PG_USER"
DB_MADE=1
{
  service_env | grep -v -e '^SB_HISTORY_DATABASE_URL=' -e '^SB_ATTACHMENTS_DATABASE_URL='
  echo "SB_HISTORY_DATABASE_URL=$(database_url "$DB")"
  echo "SB_ATTACHMENTS_DATABASE_URL=$(database_url "$DB")"
} >"$OUT/services.env"

# start NAME ENV...: the release binary switchboard-NAME with the services' environment plus ENV
# (log in $OUT/NAME.log); its pid in STARTED and in the variable PID_NAME.
start() {
  local name="$1"; shift
  (
    set -a; source "$OUT/services.env"; set +a
    export RUST_LOG=warn "$@"
    exec "$BIN/switchboard-$name"
  ) >"$OUT/$name.log" 2>&1 &
  STARTED+=("$!")
  printf -v "PID_$name" '%s' "$!"
}

AGENT_PORT="$(free_port)"
"$BIN/relay-bench" --mode agent --port "$AGENT_PORT" --events "$EVENTS" \
  --interval-ms "$INTERVAL_MS" --max-seconds 3600 >"$OUT/agent.log" 2>&1 &
PID_agent=$!
STARTED+=("$PID_agent")
AGENT_URL="http://127.0.0.1:$AGENT_PORT/agent"
wait_until "the bench agent" 30 curl -fs "http://127.0.0.1:$AGENT_PORT/healthz"

cat >"$OUT/agents.toml" <<TOML
[[agents]]
name = "relay-bench"
url = "$AGENT_URL"
description = "The relay benchmark's AG-UI agent (scripts/bench-relay.sh)."
default = true
TOML

HISTORY_PORT="$(free_port)"
WORKER_PORT="$(free_port)"
RUNS_PORT="$(free_port)"
start history "SB_HISTORY_ADDR=127.0.0.1:$HISTORY_PORT"
wait_until "history" 60 curl -fs "http://127.0.0.1:$HISTORY_PORT/readyz"
start worker "SB_WORKER_ADDR=127.0.0.1:$WORKER_PORT" "SB_WORKER_AGENTS_FILE=$OUT/agents.toml" \
  "SB_WORKER_CONCURRENCY=$WORKER_CONCURRENCY"
wait_until "worker" 60 curl -fs "http://127.0.0.1:$WORKER_PORT/readyz"
start runs "SB_RUNS_ADDR=127.0.0.1:$RUNS_PORT" SB_RUNS_RATE_PER_MINUTE=100000000 \
  SB_RUNS_RATE_BURST=100000000
wait_until "runs" 60 curl -fs "http://127.0.0.1:$RUNS_PORT/readyz"

OWNER=bench-relay
TOKEN="$("$ROOT/scripts/token.sh" "$OWNER" 7200)"
# The runs service sends runs that name no agent to the default the worker registered.
default_is_ours() {
  curl -fs -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$RUNS_PORT/api/v1/agents" |
    python3 -c 'import json, sys; sys.exit(json.load(sys.stdin).get("default") != "relay-bench")'
}
wait_until "the relay-bench agent as the default" 60 default_is_ours
log "agent on :$AGENT_PORT, history :$HISTORY_PORT, worker :$WORKER_PORT, runs :$RUNS_PORT; NATS prefix $PREFIX, database $DB"

# ---------------------------------------------------------------- measurements
LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
NATS_PID="$(cat "$DATA/nats.pid" 2>/dev/null || true)"
kill -0 "$NATS_PID" 2>/dev/null || NATS_PID=""
TICKS="$(getconf CLK_TCK)"
# cpu_seconds PID: user + system CPU time of a live process ("" if it is not there).
cpu_seconds() {
  [ -n "$1" ] && [ -r "/proc/$1/stat" ] || { echo ""; return; }
  sed 's/^.*) //' "/proc/$1/stat" | awk -v t="$TICKS" '{ printf "%.2f", ($12 + $13) / t }'
}
cpu_all() {
  echo "worker=$(cpu_seconds "$PID_worker") runs=$(cpu_seconds "$PID_runs")" \
    "history=$(cpu_seconds "$PID_history") nats=$(cpu_seconds "$NATS_PID")" \
    "agent=$(cpu_seconds "$PID_agent") wall=$(date +%s.%N)"
}

# bench NAME ARGS...: one relay-bench reading; its line in $OUT/NAME.json, with the CPU seconds
# every process used meanwhile (cpu_before / cpu_after).
bench() {
  local name="$1" before after; shift
  log "$name"
  before="$(cpu_all)"
  timeout 600 "$BIN/relay-bench" --label "$name" --max-seconds 500 "$@" \
    >"$OUT/$name.out" 2>"$OUT/$name.err" || { log "$name failed:"; cat "$OUT/$name.out" "$OUT/$name.err" >&2; exit 1; }
  after="$(cpu_all)"
  python3 - "$OUT/$name" "$before" "$after" <<'PY'
import json, sys
path, before, after = sys.argv[1:]
line = json.loads(open(path + ".out").read().strip().splitlines()[-1])
parse = lambda text: {k: float(v) for k, v in (p.split("=") for p in text.split()) if v}
line.update(cpu_before=parse(before), cpu_after=parse(after))
json.dump(line, open(path + ".json", "w"))
PY
}
relayed=(--mode relayed --runs "http://127.0.0.1:$RUNS_PORT" --token "$TOKEN" --concurrency "$CONCURRENCY")
direct=(--mode direct --url "$AGENT_URL")

# Warm-up (not reported): connections, the agent's and the services' first runs.
bench warmup "${relayed[@]}" --runs-count 3 --events 50 --interval-ms 1 --warmup 0
bench direct-paced "${direct[@]}" --runs-count "$RUNS" --events "$EVENTS" --interval-ms "$INTERVAL_MS"
bench relayed-paced "${relayed[@]}" --runs-count "$RUNS" --events "$EVENTS" --interval-ms "$INTERVAL_MS"
bench direct-fast "${direct[@]}" --runs-count "$FAST_RUNS" --events "$FAST_EVENTS" --interval-ms 0
# Meanwhile, an observer samples the event stream, history's consumer and every process's CPU.
"$BIN/relay-bench" --mode observe --prefix "$PREFIX" --nats-url "$NATS_URL" --clk-tck "$TICKS" \
  --pids "worker=$PID_worker,runs=$PID_runs,history=$PID_history,nats=${NATS_PID:-0},agent=$PID_agent" \
  --min-events "$((FAST_RUNS * FAST_EVENTS))" --label relayed-fast --max-seconds 600 \
  >"$OUT/observe.out" 2>"$OUT/observe.err" &
OBSERVER=$!
STARTED+=("$OBSERVER")
sleep 1
bench relayed-fast "${relayed[@]}" --runs-count "$FAST_RUNS" --events "$FAST_EVENTS" --interval-ms 0
log "waiting for history to catch up"
wait "$OBSERVER" || { log "the observer failed:"; cat "$OUT/observe.err" >&2; exit 1; }
tail -1 "$OUT/observe.out" >"$OUT/observe.json"
bench floor --mode publish --prefix "$FLOOR_PREFIX" --nats-url "$NATS_URL" --events "$FAST_EVENTS"

# ---------------------------------------------------------------- report
{
  echo "machine: $(nproc) cores, $(grep 'model name' /proc/cpuinfo | head -1 | sed 's/^model name[[:space:]]*: //'), kernel $(uname -r); load average before / after: $LOAD_BEFORE / $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "$RUNS runs x $EVENTS events every $INTERVAL_MS ms (paced); $FAST_RUNS runs x $FAST_EVENTS events (fast); relayed runs in flight: $CONCURRENCY; NATS prefix $PREFIX; raw results in $OUT"
  echo
  python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
r = {n: json.load(open(f"{out}/{n}.json")) for n in
     ("direct-paced", "relayed-paced", "direct-fast", "relayed-fast", "floor")}
f = lambda v: "-" if v is None else f"{v:,.2f}"
print("| mode | content events | latency p50 | p90 | p99 | max (ms) | events/s per run (median) | first content p50 (ms) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for n in ("direct-paced", "relayed-paced", "direct-fast", "relayed-fast"):
    x = r[n]; l = x["latency"]
    print(f"| {n} | {x['content_events']} | {f(l.get('p50_ms'))} | {f(l.get('p90_ms'))} | {f(l.get('p99_ms'))} "
          f"| {f(l.get('max_ms'))} | {f(x['events_per_s'].get('median'))} | {f(x['first_content'].get('p50_ms'))} |")
d, p = r["direct-paced"]["latency"], r["relayed-paced"]["latency"]
print()
print(f"added by the relay (relayed - direct, paced): p50 {p['p50_ms'] - d['p50_ms']:.2f} ms, "
      f"p90 {p['p90_ms'] - d['p90_ms']:.2f} ms, p99 {p['p99_ms'] - d['p99_ms']:.2f} ms")
fl = r["floor"]
fast = r["relayed-fast"]
rates = fast["events_per_s"]
print(f"relayed as fast as possible: {f(rates.get('min'))} / {f(rates.get('median'))} / {f(rates.get('max'))} "
      f"events/s (min / median / max of {rates.get('count')} runs); the agent alone: "
      f"{f(r['direct-fast']['events_per_s'].get('median'))} events/s")
o = json.load(open(f"{out}/observe.json"))
end = fast["finished_after_last_content"]
print(f"relayed-fast, RUN_FINISHED after the last content event: p50 {f(end.get('p50_ms'))} ms, max {f(end.get('max_ms'))} ms "
      f"(the runs service holds a run's end until history has written it, at most 10 s)")
print(f"observed while the stream grew ({o['relaying_seconds']:.1f} s): {o['relayed_per_s']:,.0f} events/s published; cores: "
      + ", ".join(f"{k} {v:.2f}" for k, v in o["cores_while_relaying"].items())
      + f", total {o['cores_while_relaying_total']:.2f}")
print(f"history: at most {o['history_behind_max']:,} events behind, behind for {o['history_behind_seconds']:.1f} s, "
      f"applying {o['history_applied_per_s']:,.0f} events/s meanwhile; caught up: {o['drained']}")
print(f"floor, sequential JetStream publish + ack: {fl['events_per_s']:,.0f} events/s, "
      f"publish->ack p50 {fl['publish_to_ack']['p50_ms']:.3f} ms, p99 {fl['publish_to_ack']['p99_ms']:.3f} ms "
      f"({fl['payload_bytes']} B messages)")
b, a = fast["cpu_before"], fast["cpu_after"]
wall = a["wall"] - b["wall"]
events = fast["content_events"]
parts = []
total = 0.0
for k in ("worker", "runs", "history", "nats", "agent"):
    if k in a and k in b:
        s = a[k] - b[k]; total += s
        parts.append(f"{k} {s:.2f} s ({1000 * s / events:.3f} ms/event)")
print(f"CPU over the whole relayed-fast reading, end holds included ({wall:.1f} s wall, {events} events): " + ", ".join(parts)
      + f"; all together {total:.2f} s = {total / wall:.2f} cores")
PY
} | tee "$OUT/summary.md"
