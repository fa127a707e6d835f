#!/usr/bin/env bash
# Benchmarks the runs service's event streams (GET /api/v1/agent/runs/{runId}/events, release
# build) without a worker: the benchmark binaries play the worker, publishing each run's events to
# JetStream exactly as services/worker/src/sink.rs does. Prints two markdown tables:
#
# 1. latency (sse-latency): worker publish -> SSE client receipt, p50/p90/p99/max, measured from
#    the publish start and from the JetStream ack, beside a raw core NATS subscriber on the same
#    subjects (what NATS alone costs) and the per-event difference SSE - NATS (what the service
#    adds); 1 run, then 50 concurrent runs at two total rates.
# 2. idle streams (sse-idle): RSS, CPU, NATS traffic and JetStream consumers of a fresh runs
#    instance holding BENCH_STREAMS (10,000) idle streams on one run for BENCH_HOLD_SECONDS (45),
#    a fresh run's latency while holding them vs before, and two events fanned out to all of them
#    (a live one, then the terminal one), read by a raw-socket client (sse-idle --client raw);
#    then as many streams on a bare axum SSE endpoint (sse-bare) and on the fan-out floor
#    (sse-floor: each event written to every socket from one loop, nothing but the kernel's TCP).
#
# Everything is on loopback. Every load is bounded in time (each binary's own limits and
# `timeout`). Infrastructure is started if needed and left running; the processes started here are
# stopped on exit and the NATS streams of the fresh prefix deleted (BENCH_KEEP_STREAMS=1 keeps
# them). Raw results go to BENCH_OUT (default .data/bench/streams-<time>).
#
# 4. a slow client (sse-slow): BENCH_SLOW_STREAMS (1,000) fast clients of one run, alone and beside
#    one client that reads nothing; the fast clients' p50/p99 in both passes, the live events the
#    slow reader skipped (counted once it reads again), and what it gets once it reads.
#
# Settings (environment): BENCH_STREAMS (10000), BENCH_HOLD_SECONDS (45), BENCH_OPEN_CONCURRENCY
# (64), BENCH_SKIP_LATENCY=1 / BENCH_SKIP_IDLE=1 / BENCH_SKIP_WS=1 / BENCH_SKIP_SLOW=1 to skip a
# part, BENCH_SKIP_RUNS_FANOUT=1 / BENCH_SKIP_THREAD_FANOUT=1 to skip the streams-of-as-many-runs
# / streams-of-one-thread pass of part 2, BENCH_ALLOW_STALE_RUNS=1 to
# measure the last switchboard-runs binary built when the tree does not build, BENCH_RUNS_WRAPPER
# (a command the runs service is started under, e.g. `heaptrack -o /tmp/runs`; the RSS figures are
# then those of the wrapper, not of the service).
source "$(dirname "$0")/lib/common.sh"
cd "$ROOT"

STREAMS="${BENCH_STREAMS:-10000}"
HOLD="${BENCH_HOLD_SECONDS:-45}"
OPEN_CONCURRENCY="${BENCH_OPEN_CONCURRENCY:-64}"
OUT="${BENCH_OUT:-$DATA/bench/streams-$(date +%Y%m%dT%H%M%S)}"
BIN="$ROOT/target/release"
mkdir -p "$OUT"

# Both the runs service and the client hold one socket per stream.
want_fds=$((STREAMS + 2000))
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
[ "$(ulimit -n)" = unlimited ] || [ "$(ulimit -n)" -ge "$want_fds" ] ||
  die "open files limit $(ulimit -n) < $want_fds; raise the hard limit (ulimit -Hn) or lower BENCH_STREAMS"

"$ROOT/scripts/infra.sh"
log "building switchboard-runs and switchboard-bench (release)"
cargo build --release --locked --quiet -p switchboard-bench --bin sse-latency --bin sse-idle \
  --bin sse-bare --bin sse-floor --bin ws-idle --bin sse-slow
# js-publish-loop only deletes the prefix's streams at exit; an older binary does that as well.
cargo build --release --locked --quiet -p switchboard-bench --bin js-publish-loop 2>/dev/null ||
  log "js-publish-loop does not build; the last binary built (if any) deletes the streams"
# History answers the runs service's run lookups (opening a run's event stream asks it).
cargo build --release --locked --quiet -p switchboard-history
if ! cargo build --release --locked --quiet -p switchboard-runs; then
  # The tree may be mid-edit; BENCH_ALLOW_STALE_RUNS=1 measures the last binary that built.
  [ "${BENCH_ALLOW_STALE_RUNS:-0}" = 1 ] && [ -x "$BIN/switchboard-runs" ] ||
    die "switchboard-runs does not build (BENCH_ALLOW_STALE_RUNS=1 uses the last binary built)"
  log "WARNING: switchboard-runs does not build; measuring the binary of $(date -r "$BIN/switchboard-runs" '+%F %T')"
fi
RUNS_BUILT="$(date -r "$BIN/switchboard-runs" '+%F %T')"

# ---------------------------------------------------------------- processes, cleaned up on exit
PREFIX="bench$(date +%s)$((RANDOM % 10000))"
export SB_NATS_PREFIX="$PREFIX"
# JetStream reserves each stream's and bucket's max_bytes up front (the defaults, 8 GiB a stream,
# do not fit a disk with less than ~24 GiB free); these hold everything the benchmark publishes.
export SB_NATS_RUNS_MAX_BYTES=1073741824 SB_NATS_EVENTS_MAX_BYTES=2147483648 \
  SB_NATS_KV_MAX_BYTES=134217728
NATS_URL="nats://127.0.0.1:$NATS_PORT"
MONITOR_URL="http://127.0.0.1:$NATS_MONITOR_PORT"
RUNS_PID=""
RUNS_PORT=""
BARE_PID=""
HISTORY_PID=""

stop_runs() {
  [ -n "$RUNS_PID" ] || return 0
  kill -TERM "$RUNS_PID" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$RUNS_PID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$RUNS_PID" 2>/dev/null || true
  wait "$RUNS_PID" 2>/dev/null || true
  RUNS_PID=""
}

cleanup() {
  local status=$?
  stop_runs
  if [ -n "$HISTORY_PID" ]; then kill -TERM "$HISTORY_PID" 2>/dev/null || true; wait "$HISTORY_PID" 2>/dev/null || true; fi
  if [ -n "$BARE_PID" ]; then kill -TERM "$BARE_PID" 2>/dev/null || true; wait "$BARE_PID" 2>/dev/null || true; fi
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

# start_runs NAME: a fresh runs instance (log in $OUT/NAME.log); sets RUNS_PID and RUNS_PORT.
start_runs() {
  RUNS_PORT="$(free_port)"
  service_env >"$OUT/runs.env"
  (
    set -a; source "$OUT/runs.env"; set +a
    # One benchmark owner holds every stream: lift the per-owner stream cap.
    export SB_RUNS_ADDR="127.0.0.1:$RUNS_PORT" SB_RUNS_RATE_PER_MINUTE=100000000 SB_RUNS_OWNER_BYTES_PER_DAY=1099511627776 SB_RUNS_MAX_ACTIVE_PER_OWNER=0 \
      SB_RUNS_RATE_BURST=100000000 SB_RUNS_MAX_STREAMS_PER_OWNER=1000000 \
      SB_RUNS_LOOKUP_RATE_PER_MINUTE=100000000 SB_RUNS_LOOKUP_RATE_BURST=100000000 RUST_LOG=warn
    exec ${BENCH_RUNS_WRAPPER:-} "$BIN/switchboard-runs"
  ) >"$OUT/$1.log" 2>&1 &
  RUNS_PID=$!
  wait_until "runs" 60 curl -fs "http://127.0.0.1:$RUNS_PORT/readyz"
  log "runs on :$RUNS_PORT (pid $RUNS_PID), NATS prefix $PREFIX"
}

# One history instance on the same prefix for the whole benchmark: since issue 12 it is the run
# index the runs service looks a run up in.
HISTORY_PORT="$(free_port)"
(
  set -a; source <(service_env); set +a
  export SB_HISTORY_ADDR="127.0.0.1:$HISTORY_PORT" RUST_LOG=warn
  exec "$BIN/switchboard-history"
) >"$OUT/history.log" 2>&1 &
HISTORY_PID=$!
wait_until "history" 60 curl -fs "http://127.0.0.1:$HISTORY_PORT/readyz"

OWNER=bench
TOKEN="$("$ROOT/scripts/token.sh" "$OWNER" 7200)"
NATS_PID="$(cat "$DATA/nats.pid" 2>/dev/null || true)"
kill -0 "$NATS_PID" 2>/dev/null || NATS_PID=""
TICKS="$(getconf CLK_TCK)"
cpu_seconds() {
  [ -n "$1" ] && [ -r "/proc/$1/stat" ] || { echo ""; return; }
  sed 's/^.*) //' "/proc/$1/stat" | awk -v t="$TICKS" '{ printf "%.2f", ($12 + $13) / t }'
}
common_args() {
  echo --url "http://127.0.0.1:$RUNS_PORT" --token "$TOKEN" --owner "$OWNER" \
    --prefix "$PREFIX" --nats-url "$NATS_URL"
}

# latency NAME RUNS EVENTS RATE: one sse-latency run; $OUT/NAME.json gets its line plus the CPU
# seconds the runs service and nats-server used meanwhile.
latency() {
  local name="$1" runs="$2" events="$3" rate="$4" r0 n0
  log "sse-latency $name: $runs runs x $events events, $rate events/s in total"
  r0="$(cpu_seconds "$RUNS_PID")"; n0="$(cpu_seconds "$NATS_PID")"
  # shellcheck disable=SC2046
  timeout 300 "$BIN/sse-latency" $(common_args) --runs "$runs" --events "$events" \
    --rate "$rate" --warmup 10 --max-seconds 200 --label "$name" \
    >"$OUT/$name.out" 2>"$OUT/$name.err" || { log "$name failed:"; cat "$OUT/$name.err" >&2; exit 1; }
  python3 - "$OUT/$name" "$r0" "$(cpu_seconds "$RUNS_PID")" "$n0" "$(cpu_seconds "$NATS_PID")" <<'PY'
import json, sys
path, r0, r1, n0, n1 = sys.argv[1:]
result = json.loads(open(path + ".out").read().strip().splitlines()[-1])
d = lambda a, b: round(float(b) - float(a), 2) if a and b else None
result.update(runs_cpu_s=d(r0, r1), nats_cpu_s=d(n0, n1))
json.dump(result, open(path + ".json", "w"))
PY
}

# fanout_pass NAME WHAT ARGS...: a fresh runs instance holding as many streams as sse-idle's ARGS
# say (held 5 s, no probe), then the two events fanned out to them; $OUT/idle-NAME.json gets
# sse-idle's line.
fanout_pass() {
  local name="$1" what="$2"
  shift 2
  start_runs "runs-$name"
  log "sse-idle: $what"
  # shellcheck disable=SC2046
  timeout 900 "$BIN/sse-idle" $(common_args) --runs-pid "$RUNS_PID" --streams "$STREAMS" \
    --open-concurrency "$OPEN_CONCURRENCY" --hold-seconds 5 --probe-events 0 --fanout-wait-seconds 30 \
    "$@" >"$OUT/idle-$name.json" 2>"$OUT/idle-$name.err" ||
    { log "sse-idle ($what) failed:"; cat "$OUT/idle-$name.err" >&2; exit 1; }
  stop_runs
}

# baseline BIN NAME HOLD WHAT: as many idle streams as the runs service held, on the baseline
# server BIN (given the NATS prefix), held HOLD seconds, then the two events fanned out to them;
# $OUT/NAME.json gets sse-idle's line.
baseline() {
  local bin="$1" name="$2" hold="$3" what="$4"
  BARE_PORT="$(free_port)"
  "$BIN/$bin" "127.0.0.1:$BARE_PORT" --nats-url "$NATS_URL" --prefix "$PREFIX" >"$OUT/$bin.log" 2>&1 &
  BARE_PID=$!
  wait_until "$bin" 30 bash -c "exec 3<>/dev/tcp/127.0.0.1/$BARE_PORT"
  log "sse-idle against $what (pid $BARE_PID)"
  timeout 600 "$BIN/sse-idle" --url "http://127.0.0.1:$BARE_PORT" --token "$TOKEN" --owner "$OWNER" \
    --prefix "$PREFIX" --nats-url "$NATS_URL" --runs-pid "$BARE_PID" --streams "$STREAMS" \
    --open-concurrency "$OPEN_CONCURRENCY" --hold-seconds "$hold" --probe-events 0 --fanout-wait-seconds 2 \
    >"$OUT/$name.json" 2>"$OUT/$name.err" || { log "sse-idle ($what) failed:"; cat "$OUT/$name.err" >&2; exit 1; }
  kill -TERM "$BARE_PID" 2>/dev/null || true
  wait "$BARE_PID" 2>/dev/null || true
  BARE_PID=""
}

# ---------------------------------------------------------------- 1. latency
if [ "${BENCH_SKIP_LATENCY:-0}" != 1 ]; then
  start_runs runs-latency
  latency warmup 5 50 500
  latency lat-1 1 1000 100
  latency lat-50 50 100 200
  latency lat-50-fast 50 200 1000
  stop_runs
fi

# ---------------------------------------------------------------- 2. idle streams
if [ "${BENCH_SKIP_IDLE:-0}" != 1 ]; then
  start_runs runs-idle
  log "sse-idle: $STREAMS streams, held ${HOLD}s, opened $OPEN_CONCURRENCY at a time"
  # shellcheck disable=SC2046
  timeout $((HOLD + 600)) "$BIN/sse-idle" $(common_args) --runs-pid "$RUNS_PID" \
    --nats-pid "${NATS_PID:-0}" --monitor-url "$MONITOR_URL" --streams "$STREAMS" \
    --open-concurrency "$OPEN_CONCURRENCY" --hold-seconds "$HOLD" \
    >"$OUT/idle.json" 2>"$OUT/idle.err" || { log "sse-idle failed:"; cat "$OUT/idle.err" >&2; exit 1; }
  stop_runs

  # As many streams of one run's thread (the run made the thread's active one): what every tab of
  # a conversation follows. Before the pass of many runs, which leaves history minutes of writes
  # behind (its run ends would wait for them).
  [ "${BENCH_SKIP_THREAD_FANOUT:-0}" = 1 ] ||
    fanout_pass thread "$STREAMS streams of one thread" --stream thread
  # The same number of streams, one on each of as many runs: an event on every run at once.
  [ "${BENCH_SKIP_RUNS_FANOUT:-0}" = 1 ] ||
    fanout_pass runs "$STREAMS streams of $STREAMS runs, one event on each run" --runs "$STREAMS"

  # Baseline: as many idle streams on a bare axum SSE endpoint (same heartbeat; no auth), with
  # one core NATS subscription to the stored events, each encoded once and written to every
  # stream. Then the floor of fan-out on this machine: sse-floor writes each event to every socket
  # from a loop (the kernel's TCP and the measuring client, nothing else).
  baseline sse-bare idle-bare 20 "the bare axum baseline"
  baseline sse-floor idle-floor 5 "the fan-out floor"
fi

# ---------------------------------------------------------------- 3. idle WebSockets
# A fresh runs instance (the streams' memory is not given back to the system), then the bare
# axum endpoint's WebSockets, as many of each, held as long.
if [ "${BENCH_SKIP_WS:-0}" != 1 ]; then
  stop_runs
  start_runs runs-ws
  log "ws-idle: $STREAMS WebSockets, held ${HOLD}s, opened $OPEN_CONCURRENCY at a time"
  timeout $((HOLD + 300)) "$BIN/ws-idle" --url "http://127.0.0.1:$RUNS_PORT" --token "$TOKEN" \
    --pid "$RUNS_PID" --sockets "$STREAMS" --open-concurrency "$OPEN_CONCURRENCY" --hold-seconds "$HOLD" \
    >"$OUT/ws.json" 2>"$OUT/ws.err" || { log "ws-idle failed:"; cat "$OUT/ws.err" >&2; exit 1; }
  stop_runs
  BARE_PORT="$(free_port)"
  "$BIN/sse-bare" "127.0.0.1:$BARE_PORT" >"$OUT/ws-bare.log" 2>&1 &
  BARE_PID=$!
  wait_until "sse-bare" 30 bash -c "exec 3<>/dev/tcp/127.0.0.1/$BARE_PORT"
  log "ws-idle against the bare axum baseline (pid $BARE_PID)"
  timeout $((HOLD + 300)) "$BIN/ws-idle" --url "http://127.0.0.1:$BARE_PORT" --token "$TOKEN" \
    --pid "$BARE_PID" --sockets "$STREAMS" --open-concurrency "$OPEN_CONCURRENCY" --hold-seconds 20 \
    >"$OUT/ws-bare.json" 2>"$OUT/ws-bare.err" || { log "ws-idle (bare) failed:"; cat "$OUT/ws-bare.err" >&2; exit 1; }
  kill -TERM "$BARE_PID" 2>/dev/null || true
  wait "$BARE_PID" 2>/dev/null || true
  BARE_PID=""
fi

# ---------------------------------------------------------------- 4. a slow client among fast ones
# A fresh runs instance; two passes of one run each, BENCH_SLOW_STREAMS (1,000) fast SSE clients,
# the second with one client that reads nothing (sse-slow).
if [ "${BENCH_SKIP_SLOW:-0}" != 1 ]; then
  stop_runs
  start_runs runs-slow
  log "sse-slow: ${BENCH_SLOW_STREAMS:-1000} fast streams, alone and beside one that reads nothing"
  # shellcheck disable=SC2046
  timeout 900 "$BIN/sse-slow" $(common_args) --streams "${BENCH_SLOW_STREAMS:-1000}" --slow 1 \
    >"$OUT/slow.json" 2>"$OUT/slow.err" || { log "sse-slow failed:"; cat "$OUT/slow.err" >&2; exit 1; }
  # Enough bytes (2,000 events of 4 KiB, 8 MiB) to fill what the kernel buffers for a client that
  # reads nothing, so its reader's queue overflows; fewer fast clients to keep the bytes written
  # within this machine.
  log "sse-slow (big): 100 fast streams of 8 MiB each, alone and beside one that reads nothing"
  # shellcheck disable=SC2046
  timeout 900 "$BIN/sse-slow" $(common_args) --streams 100 --slow 1 --events 2000 --rate 100 \
    --delta-bytes 4096 \
    >"$OUT/slow-big.json" 2>"$OUT/slow-big.err" || { log "sse-slow (big) failed:"; cat "$OUT/slow-big.err" >&2; exit 1; }
  stop_runs
fi

# ---------------------------------------------------------------- report
{
  echo "machine: $(nproc) cores, $(free -h | awk '/^Mem:/ { print $2 }') memory, $(lscpu | sed -n 's/^Model name: *//p' | head -1), kernel $(uname -r)"
  echo "runs binary built $RUNS_BUILT; streams: $STREAMS held ${HOLD}s; NATS prefix $PREFIX; raw results in $OUT"
  echo
  python3 "$ROOT/scripts/bench/streams-report.py" "$OUT"
} | tee "$OUT/summary.md"
