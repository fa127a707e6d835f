#!/usr/bin/env bash
# Worker fleet throughput (issue 10): completed runs per second with 1, 2 and 3 worker replicas,
# each running SB_WORKER_CONCURRENCY runs at once of about 1 s each (the built-in agent's
# `/slow`), and the same with the fleet ceiling set to one replica's concurrency (what the
# durable consumer's max_ack_pending was before: a second replica added nothing).
# Usage: scripts/bench-workers.sh [repetitions]   (BENCH_RUNS, BENCH_CONCURRENCY to change sizes)
# Starts and stops its own workers on the infrastructure of scripts/infra.sh; removes its streams.
source "$(dirname "$0")/lib/common.sh"
cd "$ROOT"
"$ROOT/scripts/infra.sh"
cargo build -q --locked -p switchboard-worker -p switchboard-bench --bins
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug"
REPS="${1:-2}"
RUNS="${BENCH_RUNS:-48}"
CONCURRENCY="${BENCH_CONCURRENCY:-4}"
NATS_URL="nats://127.0.0.1:$NATS_PORT"
pids=()
stop_workers() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done; pids=(); }
trap stop_workers EXIT

round() { # round REPLICAS CEILING LABEL
  local replicas="$1" ceiling="$2" label="$3" prefix="bw$RANDOM$RANDOM"
  for i in $(seq 1 "$replicas"); do
    local port=$((58600 + i))
    SB_NATS_URL="$NATS_URL" SB_NATS_PREFIX="$prefix" SB_WORKER_ADDR="127.0.0.1:$port" \
      SB_WORKER_CONCURRENCY="$CONCURRENCY" SB_WORKER_FLEET_MAX_IN_FLIGHT="$ceiling" \
      SB_NATS_RUNS_MAX_BYTES=67108864 SB_NATS_EVENTS_MAX_BYTES=67108864 SB_NATS_KV_MAX_BYTES=8388608 \
      RUST_LOG=warn "$BIN/switchboard-worker" >>"$DATA/logs/bench-workers.log" 2>&1 &
    pids+=($!)
    wait_until "worker $i" 30 curl -fs "http://127.0.0.1:$port/readyz"
  done
  local line
  line=$("$BIN/worker-throughput" --prefix "$prefix" --nats-url "$NATS_URL" --runs "$RUNS")
  stop_workers
  "$BIN/js-publish-loop" --prefix "$prefix" --nats-url "$NATS_URL" --mode cleanup >/dev/null
  printf '%s replicas=%s concurrency=%s ceiling=%s %s\n' "$label" "$replicas" "$CONCURRENCY" "$ceiling" "$line"
}

log "worker throughput: $RUNS runs of ~1 s, $CONCURRENCY slots per replica, $REPS repetitions"
for rep in $(seq 1 "$REPS"); do
  for replicas in 1 2 3; do
    round "$replicas" 4096 "per-replica"
    round "$replicas" "$CONCURRENCY" "old-ceiling"
  done
done
