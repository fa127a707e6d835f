#!/usr/bin/env bash
# Worker fleet throughput (issue 10): completed runs per second with 1, 2 and 3 worker replicas,
# each running SB_WORKER_CONCURRENCY runs at once of about 1 s each (the built-in agent's
# `/slow`), and the same with the fleet ceiling set to one replica's concurrency (what the
# durable consumer's max_ack_pending was before: a second replica added nothing).
# Then fairness: one owner floods long runs, another owner's run waits for its start, with and
# without the per-owner cap (SB_WORKER_MAX_RUNS_PER_OWNER).
# Usage: scripts/bench-workers.sh [repetitions]   (BENCH_RUNS, BENCH_CONCURRENCY to change sizes;
# BENCH_ONLY=fairness for the fairness rounds alone)
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

round() { # round REPLICAS CEILING LABEL [PER_OWNER [worker-throughput args...]]
  local replicas="$1" ceiling="$2" label="$3" per_owner="${4:-$(((CONCURRENCY + 1) / 2))}" prefix="bw$RANDOM$RANDOM"
  shift 4 2>/dev/null || shift 3
  for i in $(seq 1 "$replicas"); do
    local port=$((58600 + i))
    SB_NATS_URL="$NATS_URL" SB_NATS_PREFIX="$prefix" SB_WORKER_ADDR="127.0.0.1:$port" \
      SB_WORKER_CONCURRENCY="$CONCURRENCY" SB_WORKER_FLEET_MAX_IN_FLIGHT="$ceiling" \
      SB_WORKER_MAX_RUNS_PER_OWNER="$per_owner" \
      SB_NATS_RUNS_MAX_BYTES=67108864 SB_NATS_EVENTS_MAX_BYTES=67108864 SB_NATS_KV_MAX_BYTES=8388608 \
      RUST_LOG=warn "$BIN/switchboard-worker" >>"$DATA/logs/bench-workers.log" 2>&1 &
    pids+=($!)
    wait_until "worker $i" 30 curl -fs "http://127.0.0.1:$port/readyz"
  done
  local line
  line=$("$BIN/worker-throughput" --prefix "$prefix" --nats-url "$NATS_URL" --runs "$RUNS" "$@")
  stop_workers
  "$BIN/js-publish-loop" --prefix "$prefix" --nats-url "$NATS_URL" --mode cleanup >/dev/null
  printf '%s replicas=%s concurrency=%s ceiling=%s per_owner=%s %s\n' "$label" "$replicas" "$CONCURRENCY" "$ceiling" "$per_owner" "$line"
}

log "worker throughput: $RUNS runs of ~1 s, $CONCURRENCY slots per replica, $REPS repetitions"
[ "${BENCH_ONLY:-}" = fairness ] && REPS_THROUGHPUT=0 || REPS_THROUGHPUT="$REPS"
for rep in $(seq 1 "$REPS_THROUGHPUT"); do
  for replicas in 1 2 3; do
    round "$replicas" 4096 "per-replica"
    round "$replicas" "$CONCURRENCY" "old-ceiling"
  done
done

# Fairness: one owner floods 4 x the slots with ~5 s runs; how long does another owner's run
# wait to start, with the per-owner cap (default: half the slots) and without it (all slots)?
log "fairness: one owner floods $((CONCURRENCY * 4)) runs of ~5 s; another owner's run waits for its start"
for rep in $(seq 1 "$REPS"); do
  round 1 4096 "fair-capped" "$(((CONCURRENCY + 1) / 2))" --flood "$((CONCURRENCY * 4))"
  round 1 4096 "fair-uncapped" "$CONCURRENCY" --flood "$((CONCURRENCY * 4))"
done
