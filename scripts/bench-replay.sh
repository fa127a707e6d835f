#!/usr/bin/env bash
# Benchmarks compact replay (issue 29): one run of BENCH_EVENTS (10,000) events, shaped like a
# streamed reply (one TEXT_MESSAGE_CONTENT per token), replayed from the start through
# GET /api/v1/agent/runs/{runId}/events as the log holds it (?compact=false) and compacted (the
# default), alternating, BENCH_REPEAT (3) times each per round, BENCH_ROUNDS (3) rounds (a fresh
# run each). Release builds of the runs and history services; the benchmark plays the worker
# (crates/bench/src/bin/sse-replay.rs). Prints a markdown table: bytes and events on the wire,
# the median time from the request to the stream's end, and the ratios, per round.
#
# Infrastructure is started if needed and left running; the processes started here are stopped on
# exit and the NATS streams of the fresh prefix deleted. Raw results go to BENCH_OUT (default
# .data/bench/replay-<time>).
source "$(dirname "$0")/lib/common.sh"
cd "$ROOT"

EVENTS="${BENCH_EVENTS:-10000}"
REPEAT="${BENCH_REPEAT:-3}"
ROUNDS="${BENCH_ROUNDS:-3}"
OUT="${BENCH_OUT:-$DATA/bench/replay-$(date +%Y%m%dT%H%M%S)}"
BIN="$ROOT/target/release"
mkdir -p "$OUT"

"$ROOT/scripts/infra.sh"
log "building switchboard-runs, switchboard-history and the benchmark (release)"
cargo build --release --locked --quiet -p switchboard-runs -p switchboard-history
cargo build --release --locked --quiet -p switchboard-bench --bin sse-replay --bin js-publish-loop

PREFIX="bench$(date +%s)$((RANDOM % 10000))"
export SB_NATS_PREFIX="$PREFIX"
NATS_URL="nats://127.0.0.1:$NATS_PORT"
PIDS=()
cleanup() {
  local status=$?
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  timeout 30 "$BIN/js-publish-loop" --mode cleanup --prefix "$PREFIX" --nats-url "$NATS_URL" \
    >"$OUT/cleanup.json" 2>>"$OUT/cleanup.log" || log "could not delete the streams of $PREFIX"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}
HISTORY_PORT="$(free_port)"
(
  set -a; source <(service_env); set +a
  export SB_HISTORY_ADDR="127.0.0.1:$HISTORY_PORT" RUST_LOG=warn
  exec "$BIN/switchboard-history"
) >"$OUT/history.log" 2>&1 &
PIDS+=($!)
wait_until "history" 60 curl -fs "http://127.0.0.1:$HISTORY_PORT/readyz"
RUNS_PORT="$(free_port)"
(
  set -a; source <(service_env); set +a
  export SB_RUNS_ADDR="127.0.0.1:$RUNS_PORT" SB_RUNS_RATE_PER_MINUTE=100000000 SB_RUNS_RATE_BURST=100000000 \
    SB_RUNS_MAX_ACTIVE_PER_OWNER=0 RUST_LOG=warn
  exec "$BIN/switchboard-runs"
) >"$OUT/runs.log" 2>&1 &
PIDS+=($!)
wait_until "runs" 60 curl -fs "http://127.0.0.1:$RUNS_PORT/readyz"
TOKEN="$("$ROOT/scripts/token.sh" bench 7200)"

for round in $(seq "$ROUNDS"); do
  log "round $round: $EVENTS events, $REPEAT replays each way"
  timeout 600 "$BIN/sse-replay" --url "http://127.0.0.1:$RUNS_PORT" --token "$TOKEN" --owner bench \
    --prefix "$PREFIX" --nats-url "$NATS_URL" --events "$EVENTS" --repeat "$REPEAT" \
    >"$OUT/round-$round.json" 2>"$OUT/round-$round.log" ||
    die "sse-replay failed (see $OUT/round-$round.log)"
done

python3 - "$OUT" "$ROUNDS" <<'PY'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
print("| round | events stored | raw: events, bytes, ms (median) | compacted: events, bytes, ms (median) | bytes raw/compacted | time raw/compacted |")
print("|---|---|---|---|---|---|")
for r in range(1, rounds + 1):
    x = json.load(open(f"{out}/round-{r}.json"))
    raw, c = x["raw"], x["compact"]
    print(f"| {r} | {x['events_published']} | {raw['events']}, {raw['bytes']:,}, {raw['ms_median']} | "
          f"{c['events']}, {c['bytes']:,}, {c['ms_median']} | {x['bytes_ratio']}x | {x['time_ratio']}x |")
PY
echo
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -1); raw results in $OUT"
