#!/usr/bin/env bash
# Benchmarks HTTP acceptance of the runs service (POST /api/v1/agent/runs, release build) in one
# run beside (a) a bare axum handler reading the same body and (b) a Rust loop publishing the same
# RunTask messages to the same JetStream stream with the same concurrency; prints a markdown table
# with throughput, p50, p99 and the ratios. Diagnostics: CPU per request of the target and of
# nats-server, NATS messages per request, (b) paced to the runs service's half load (the broker's
# share of that p99), and the latency floor with one request in flight.
# See BENCHMARKS.md.
#
# Everything is on loopback. Every load is bounded in time (wrk -d, the loop's --max-seconds and
# `timeout`) and in count (the loop's --count). Infrastructure is started if needed and left
# running; the processes started here are stopped on exit, and the NATS streams and KV buckets of
# the fresh prefix are deleted (BENCH_KEEP_STREAMS=1 keeps them).
#
# Settings (environment): BENCH_THREADS (wrk threads, 2), BENCH_CONNECTIONS (16: wrk connections
# and the loop's publishes in flight), BENCH_DURATION (seconds per measured wrk run, 15),
# BENCH_FLOOR_DURATION (seconds of each one-in-flight diagnostic run, 8), BENCH_TEXT (the user text),
# BENCH_AGENT (1: the worker's echo agent is registered as the default first, as a deployment's
# worker does, so each run is checked against its input schema; 0: no agent, the path measured
# before 2026-11-26 night), BENCH_RUST_LOG (the runs service's RUST_LOG: info, the deployment's
# level; before 2026-11-26 night: warn),
# BENCH_OUT (where raw results go; default .data/bench/runs-<time>). SB_RUNS_ACTIVE_RUN_POLICY, when
# set, is passed to the runs service (default: the service's own default).
source "$(dirname "$0")/lib/common.sh"
cd "$ROOT"

THREADS="${BENCH_THREADS:-2}"
CONNECTIONS="${BENCH_CONNECTIONS:-16}"
DURATION="${BENCH_DURATION:-15}"
FLOOR_DURATION="${BENCH_FLOOR_DURATION:-8}"
OUT="${BENCH_OUT:-$DATA/bench/runs-$(date +%Y%m%dT%H%M%S)}"
export BENCH_TEXT="${BENCH_TEXT:-Summarise the attached quarterly report in three bullet points and list the open risks.}"
LUA="$ROOT/scripts/bench/runs.lua"
BIN="$ROOT/target/release"
PATH_RUNS=/api/v1/agent/runs

mkdir -p "$OUT"

# ---------------------------------------------------------------- tools, infrastructure, build
if ! command -v wrk >/dev/null; then
  log "installing wrk (Debian package)"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
fi
"$ROOT/scripts/infra.sh"
log "building switchboard-runs and switchboard-bench (release)"
cargo build --release --locked --quiet -p switchboard-runs -p switchboard-bench

# ---------------------------------------------------------------- processes, cleaned up on exit
PREFIX="bench-$(date +%s)-$((RANDOM % 10000))"
export SB_NATS_PREFIX="$PREFIX"
# Stream reservations that fit beside the local platform's on the one NATS (a run is ~400 B);
# the runs service and the publish loop both read them.
export SB_NATS_RUNS_MAX_BYTES=2147483648 SB_NATS_EVENTS_MAX_BYTES=1073741824 \
  SB_NATS_KV_MAX_BYTES=268435456
NATS_URL="nats://127.0.0.1:$NATS_PORT"
STARTED=()

cleanup() {
  local status=$? pid
  for pid in "${STARTED[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${STARTED[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  if [ "${BENCH_KEEP_STREAMS:-0}" != 1 ] && [ -x "$BIN/js-publish-loop" ]; then
    timeout 30 "$BIN/js-publish-loop" --mode cleanup --prefix "$PREFIX" --nats-url "$NATS_URL" \
      >"$OUT/cleanup.json" 2>>"$OUT/cleanup.log" || log "could not delete the streams of $PREFIX"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

TOKEN="$("$ROOT/scripts/token.sh" bench 7200)"
SMOKE_BODY='{"threadId":"'"$(python3 -c 'import uuid; print(uuid.uuid4())')"'","runId":"smoke","messages":[{"id":"m1","role":"user","content":"hi"}]}'
# posts_202 URL: one valid run answers 202.
posts_202() {
  [ "$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer $TOKEN" \
    -H 'Content-Type: application/json' --data "$SMOKE_BODY" "$1")" = 202 ]
}

BARE_PORT="$(free_port)"
"$BIN/bare-axum" "127.0.0.1:$BARE_PORT" >"$OUT/bare-axum.log" 2>&1 &
BARE_PID=$!
STARTED+=("$BARE_PID")

if [ "${BENCH_AGENT:-1}" = 1 ]; then
  timeout 30 "$BIN/js-publish-loop" --mode register-agent --prefix "$PREFIX" --nats-url "$NATS_URL" \
    >"$OUT/register-agent.json" || die "could not register the echo agent on $PREFIX"  # A worker registers its cards again every 15 s (a card lives a minute): so does this, in the
  # background until the benchmark ends.
  "$BIN/js-publish-loop" --mode register-agent --prefix "$PREFIX" --nats-url "$NATS_URL" \
    --keep-registered-secs 86400 >/dev/null 2>>"$OUT/register-agent.log" &
  STARTED+=("$!")
fi

RUNS_PORT="$(free_port)"
service_env >"$OUT/runs.env"
(
  set -a; source "$OUT/runs.env"; set +a
  export SB_RUNS_ADDR="127.0.0.1:$RUNS_PORT" SB_RUNS_RATE_PER_MINUTE=100000000 SB_RUNS_OWNER_BYTES_PER_DAY=1099511627776 SB_RUNS_MAX_ACTIVE_PER_OWNER=0 \
    SB_RUNS_RATE_BURST=100000000 RUST_LOG="${BENCH_RUST_LOG:-info}"
  exec "$BIN/switchboard-runs"
) >"$OUT/runs.log" 2>&1 &
RUNS_PID=$!
STARTED+=("$RUNS_PID")

wait_until "bare axum" 30 posts_202 "http://127.0.0.1:$BARE_PORT$PATH_RUNS"
wait_until "runs" 60 curl -fs "http://127.0.0.1:$RUNS_PORT/readyz"
posts_202 "http://127.0.0.1:$RUNS_PORT$PATH_RUNS" || die "runs does not answer 202 to a valid run (see $OUT/runs.log)"
log "bare axum on :$BARE_PORT (pid $BARE_PID), runs on :$RUNS_PORT (pid $RUNS_PID), NATS prefix $PREFIX"

# ---------------------------------------------------------------- measurements
NATS_PID="$(cat "$DATA/nats.pid" 2>/dev/null || true)"
kill -0 "$NATS_PID" 2>/dev/null || NATS_PID=""
TICKS="$(getconf CLK_TCK)"

# cpu_seconds PID: user + system CPU time of a live process ("" if it is not there).
cpu_seconds() {
  [ -n "$1" ] && [ -r "/proc/$1/stat" ] || { echo ""; return; }
  # Fields after the ")" of the command name: utime is the 12th, stime the 13th.
  sed 's/^.*) //' "/proc/$1/stat" | awk -v t="$TICKS" '{ printf "%.2f", ($12 + $13) / t }'
}
nats_in_msgs() {
  curl -fs "http://127.0.0.1:$NATS_MONITOR_PORT/varz" | python3 -c 'import json,sys; print(json.load(sys.stdin)["in_msgs"])' 2>/dev/null || echo ""
}
wall() { date +%s.%N; }

# measure NAME TARGET_PID COMMAND...: runs COMMAND (output to $OUT/NAME.out) and writes
# $OUT/NAME.json: the line the command printed (wrk's BENCH_JSON or the loop's JSON) plus CPU
# seconds of the target, of nats-server and of the load generator, and NATS messages received.
measure() {
  local name="$1" target="$2"; shift 2
  local t0 n0 m0 w0 t1 n1 m1 w1 gen
  t0="$(cpu_seconds "$target")"; n0="$(cpu_seconds "$NATS_PID")"; m0="$(nats_in_msgs)"; w0="$(wall)"
  local TIMEFORMAT='%U %S'
  { time "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"; } 2>"$OUT/$name.time" || {
    log "$name failed:"; cat "$OUT/$name.err" >&2; exit 1
  }
  t1="$(cpu_seconds "$target")"; n1="$(cpu_seconds "$NATS_PID")"; m1="$(nats_in_msgs)"; w1="$(wall)"
  gen="$(awk '{ printf "%.2f", $1 + $2 }' "$OUT/$name.time")"
  python3 - "$OUT/$name" "$name" "$t0" "$t1" "$n0" "$n1" "$m0" "$m1" "$w0" "$w1" "$gen" <<'PY'
import json, sys
path, name, t0, t1, n0, n1, m0, m1, w0, w1, gen = sys.argv[1:]
line = None
for raw in open(path + ".out"):
    raw = raw.strip()
    if raw.startswith("BENCH_JSON "):
        line = raw[len("BENCH_JSON "):]
    elif raw.startswith("{"):
        line = raw
if line is None:
    sys.exit(f"{name}: no result line in {path}.out")
result = json.loads(line)
diff = lambda a, b: round(float(b) - float(a), 2) if a and b else None
result.update(name=name, target_cpu_s=diff(t0, t1), nats_cpu_s=diff(n0, n1),
              nats_in_msgs=diff(m0, m1), wall_s=diff(w0, w1), generator_cpu_s=float(gen))
json.dump(result, open(path + ".json", "w"))
PY
}

# run_wrk NAME URL TARGET_PID SECONDS [RATE [CONNECTIONS [THREADS]]]: RATE 0 is a closed loop at
# full speed, otherwise wrk's delay() hook paces the requests to RATE per second.
run_wrk() {
  local name="$1" url="$2" target="$3" secs="$4" rate="${5:-0}" conns="${6:-$CONNECTIONS}" threads="${7:-$THREADS}"
  log "wrk $name: -t$threads -c$conns -d${secs}s, paced to $rate req/s (0: unpaced)"
  BENCH_TOKEN="$TOKEN" BENCH_RATE="$rate" BENCH_THREADS="$threads" \
    BENCH_NONCE="$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')" \
    measure "$name" "$target" timeout $((secs + 30)) \
    wrk -t"$threads" -c"$conns" -d"${secs}s" --timeout 10s --latency -s "$LUA" "$url"
}

# run_loop NAME COUNT CONCURRENCY SECONDS [RATE]: the JetStream loop, bounded in count and time;
# RATE (per second, 0: unpaced) paces the publishes as the wrk script paces requests.
run_loop() {
  local name="$1" count="$2" conc="$3" secs="$4" rate="${5:-0}"
  log "js-publish-loop $name: $count runs, $conc in flight, at most ${secs}s, paced to $rate/s (0: unpaced)"
  measure "$name" "$NATS_PID" timeout $((secs + 30)) \
    "$BIN/js-publish-loop" --prefix "$PREFIX" --nats-url "$NATS_URL" --rate "$rate" \
    --count "$count" --concurrency "$conc" --max-seconds "$secs" --owner bench --text "$BENCH_TEXT"
}

field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$OUT/$1.json" "$2"; }
half_of() { python3 -c 'import sys; print(round(float(sys.argv[1]) / 2, 1))' "$(field "$1" rps)"; }

BARE_URL="http://127.0.0.1:$BARE_PORT$PATH_RUNS"
RUNS_URL="http://127.0.0.1:$RUNS_PORT$PATH_RUNS"

# Maximum throughput: closed loops, CONNECTIONS in flight.
run_wrk bare-max "$BARE_URL" "$BARE_PID" "$DURATION"
curl -fs "http://127.0.0.1:$RUNS_PORT/metrics" >"$OUT/runs-max.metrics0" || true
run_wrk runs-max "$RUNS_URL" "$RUNS_PID" "$DURATION"
curl -fs "http://127.0.0.1:$RUNS_PORT/metrics" >"$OUT/runs-max.metrics1" || true
# (b): as many RunTask messages as the runs service accepted at full load (at least 2,000), the
# same concurrency, to the same stream.
COUNT="$(python3 -c 'import sys; print(max(2000, int(sys.argv[1])))' "$(field runs-max requests)")"
run_loop js-loop "$COUNT" "$CONNECTIONS" $((DURATION * 4))

# Half load: each target paced to half of its own maximum.
run_wrk bare-half "$BARE_URL" "$BARE_PID" "$DURATION" "$(half_of bare-max)"
curl -fs "http://127.0.0.1:$RUNS_PORT/metrics" >"$OUT/runs-half.metrics0" || true
run_wrk runs-half "$RUNS_URL" "$RUNS_PID" "$DURATION" "$(half_of runs-max)"
curl -fs "http://127.0.0.1:$RUNS_PORT/metrics" >"$OUT/runs-half.metrics1" || true
# The floor under runs-half, a diagnostic: (b) paced to the same rate (the broker's round trip
# alone, on the same cores, with the same pacing).
run_loop js-loop-half "$COUNT" "$CONNECTIONS" "$DURATION" "$(half_of runs-max)"

# Latency floor, a diagnostic: one request in flight.
run_wrk runs-c1 "$RUNS_URL" "$RUNS_PID" "$FLOOR_DURATION" 0 1 1
run_loop js-loop-c1 "$COUNT" 1 "$FLOOR_DURATION"

# ---------------------------------------------------------------- report
{
  echo "machine: $(nproc) cores, $(free -h | awk '/^Mem:/ { print $2 }') memory, $(lscpu | sed -n 's/^Model name: *//p' | head -1), kernel $(uname -r)"
  echo "settings: wrk -t$THREADS -c$CONNECTIONS -d${DURATION}s; loop concurrency $CONNECTIONS; runs policy ${SB_RUNS_ACTIVE_RUN_POLICY:-(service default)}; default agent $([ "${BENCH_AGENT:-1}" = 1 ] && echo 'echo (input schema checked)' || echo 'none'); runs RUST_LOG ${BENCH_RUST_LOG:-info}; NATS prefix $PREFIX"
  echo "tree: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet HEAD -- services crates 2>/dev/null || echo ' + uncommitted changes'); raw results in $OUT"
  echo
  python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
r = {n: json.load(open(os.path.join(out, n + ".json")))
     for n in ["bare-max", "runs-max", "js-loop", "bare-half", "runs-half", "js-loop-half",
               "runs-c1", "js-loop-c1"]}
for n, v in r.items():
    v["goal_rps"] = v.get("goal_rps") or v.get("goal_rate_per_s")
    errors = v.get("errors")
    v["error_count"] = sum(errors.values()) if isinstance(errors, dict) else (errors or 0)
    v["rate"] = v.get("rps", v.get("throughput_per_s"))
    v["count"] = v.get("requests", v.get("count"))

def per_req(v, key):
    x = v.get(key)
    return "n/a" if x is None or not v["count"] else f"{x * 1000 / v['count']:.3f}"

def msgs(v):
    x = v.get("nats_in_msgs")
    return "n/a" if x is None or not v["count"] else f"{x / v['count']:.1f}"

def table(rows):
    print("| target | load | requests | errors | seconds | throughput (req/s) | p50 (ms) | p99 (ms) "
          "| target CPU ms/req | nats-server CPU ms/req | load generator CPU ms/req | NATS msgs in/req |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, load, n in rows:
        v = r[n]
        if v.get("goal_rps"):
            load = f"{load} (paced to {v['goal_rps']:.0f}/s)"
        target_cpu = "-" if n.startswith("js-") else per_req(v, "target_cpu_s")
        print(f"| {label} | {load} | {v['count']} | {v['error_count']} | {v['seconds']:.1f} | "
              f"{v['rate']:.0f} | {v['p50_ms']:.2f} | {v['p99_ms']:.2f} | {target_cpu} | "
              f"{per_req(v, 'nats_cpu_s')} | {per_req(v, 'generator_cpu_s')} | {msgs(v)} |")
    print()

table([
    ("(a) bare axum", "max, closed loop", "bare-max"),
    ("runs service", "max, closed loop", "runs-max"),
    ("(b) JetStream publish loop", "max, same concurrency", "js-loop"),
    ("(a) bare axum", "half of its max", "bare-half"),
    ("runs service", "half of its max", "runs-half"),
    ("(b) JetStream publish loop", "runs' half load", "js-loop-half"),
])
runs, bare, loop = (r[n]["rate"] for n in ["runs-max", "bare-max", "js-loop"])
half = r["runs-half"]
print("| ratio (throughput at max) | value |")
print("|---|---:|")
print(f"| runs / (b) | {runs / loop:.1%} |")
print(f"| runs / (a) | {runs / bare:.1%} |")
print(f"| (b) / (a) | {loop / bare:.1%} |")
print()
ok_rate = runs >= 0.6 * loop
ok_p99 = half["p99_ms"] < 5
print(f"- goal 1, acceptance >= 60% of (b): {runs:.0f} vs {0.6 * loop:.0f} req/s "
      f"({runs / loop:.1%} of (b)) -> {'MET' if ok_rate else 'NOT MET'}")
print(f"- goal 2, p99 < 5 ms at half load: {half['p99_ms']:.2f} ms at {half['rate']:.0f} req/s "
      f"-> {'MET' if ok_p99 else 'NOT MET'}; under it, (b) alone at that rate: p99 "
      f"{r['js-loop-half']['p99_ms']:.2f} ms, (a) at its own half load: {r['bare-half']['p99_ms']:.2f} ms")

def buckets(path):
    """The runs route's cumulative request-duration buckets {le: count} in a /metrics text."""
    found = {}
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return found
    for line in lines:
        if (line.startswith("http_request_duration_seconds_bucket{")
                and 'route="/api/v1/agent/runs"' in line and 'method="POST"' in line):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            found[le] = float(line.rsplit(" ", 1)[1])
    return found

before, after = (buckets(os.path.join(out, f"runs-half.metrics{i}")) for i in (0, 1))
served = after.get("+Inf", 0) - before.get("+Inf", 0)
if served:
    share = lambda le: (after.get(le, 0) - before.get(le, 0)) / served
    print(f"- inside the runs service at half load (its own histogram, request to response head): "
          f"{share('0.0025'):.2%} within 2.5 ms, {share('0.005'):.2%} within 5 ms")

def counter(path, name):
    """A counter's value in a /metrics text (0 when absent or unreadable)."""
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return 0.0
    return next((float(line.rsplit(" ", 1)[1]) for line in lines
                 if line.split(" ", 1)[0] == name), 0.0)

# The runs sent to NATS together (platform::publish_batch): runs per write of the connection.
for load in ("runs-max", "runs-half"):
    sent, batches = (
        counter(os.path.join(out, f"{load}.metrics1"), name)
        - counter(os.path.join(out, f"{load}.metrics0"), name)
        for name in ("switchboard_nats_batched_publishes_total",
                     "switchboard_nats_publish_batches_total"))
    if batches:
        print(f"- {load}: runs sent to NATS {sent / batches:.2f} at a time on average "
              f"({sent:.0f} in {batches:.0f} batches)")
print()
print("Latency floor (diagnostic): one request in flight.")
print()
table([
    ("runs service", "1 connection, closed loop", "runs-c1"),
    ("(b) JetStream publish loop", "1 in flight", "js-loop-c1"),
])
bad = [n for n, v in r.items() if v["error_count"]]
if bad:
    print(f"WARNING: errors in {', '.join(bad)}: the figures of those rows are not valid")
    sys.exit(2)
PY
} | tee "$OUT/summary.md"
