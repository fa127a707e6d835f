#!/usr/bin/env bash
# What retained runs cost the broker (issue 12, BENCHMARKS.md section 9): fills a RUNS stream on a
# private nats-server (own port, own store directory) with accepted runs in one layout, and at
# each checkpoint records nats-server's RSS, the store's size on disk and the fill rate; with
# BENCH_ACCEPT=1 it also measures the runs service's HTTP acceptance (wrk, 10 s) against the
# filled stream at each checkpoint and against an empty one first.
#
#   scripts/bench-broker.sh [LAYOUT]     # queue (the service since issue 12), per-run (before), per-thread
#   scripts/bench-broker.sh started      # instead of accepted runs, what a worker leaves per run it
#                                        # starts: status record, thread lock, events (BENCH_EVENTS_PER_RUN, 4)
#
# Settings: BENCH_CHECKPOINTS (1000000,5000000,10000000), BENCH_TEXT_BYTES (2000: messages of
# ~2.2 KB), BENCH_DEDUP_WINDOW_SECS (1: see BENCHMARKS 9 for why), BENCH_ACCEPT (0),
# BENCH_MAX_SECONDS (per fill step, 3600), BENCH_IDLE_SECS (idle before each reading, 5),
# BENCH_BIN (a directory of saved binaries to measure instead of building). Everything stops by itself: every fill step is bounded
# in count and time, wrk by -d; the private server and its store are removed on exit
# (BENCH_KEEP=1 keeps the store). Output: .data/bench/broker-<layout>-<time>/.
source "$(dirname "$0")/lib/common.sh"
cd "$ROOT"

LAYOUT="${1:-queue}"
CHECKPOINTS="${BENCH_CHECKPOINTS:-1000000,5000000,10000000}"
OUT="${BENCH_OUT:-$DATA/bench/broker-$LAYOUT-$(date +%Y%m%dT%H%M%S)}"
STORE="$OUT/store"
BIN="${BENCH_BIN:-$ROOT/target/release}"
mkdir -p "$OUT"

"$ROOT/scripts/infra.sh" >/dev/null   # installs nats-server (and the rest) if missing
NATS="$(nats_bin)" || die "no nats-server"
if [ "${BENCH_ACCEPT:-0}" = 1 ] && ! command -v wrk >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
fi
if [ -z "${BENCH_BIN:-}" ]; then
  log "building broker-fill and switchboard-runs (release)"
  cargo build --release --locked --quiet -p switchboard-bench -p switchboard-runs
fi

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}
PORT="$(free_port)"
PREFIX="brk"
URL="nats://127.0.0.1:$PORT"
STARTED=()
cleanup() {
  local status=$? pid
  for pid in "${STARTED[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${STARTED[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  [ "${BENCH_KEEP:-0}" = 1 ] || rm -rf "$STORE"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# JetStream reserves every stream's max_bytes against the server's store limit, which by default
# follows the free disk; the runs (32 GiB) and the service's other streams need it stated.
printf 'listen: 127.0.0.1:%s\njetstream { store_dir: "%s", max_file_store: 256GB, max_memory_store: 1GB }\n' \
  "$PORT" "$STORE" >"$OUT/nats.conf"
"$NATS" -c "$OUT/nats.conf" >"$OUT/nats.log" 2>&1 &
NATS_PID=$!
STARTED+=("$NATS_PID")
wait_until "private nats-server" 30 bash -c "exec 3<>/dev/tcp/127.0.0.1/$PORT"

# Limits that hold 10M runs of 2.2 KB (the services' defaults would refuse new runs at 8 GiB).
export SB_NATS_URL="$URL" SB_NATS_PREFIX="$PREFIX" SB_NATS_RUNS_MAX_BYTES=$((32 << 30))
rss_mb() { awk '/^VmRSS/ { printf "%.0f", $2 / 1024 }' "/proc/$NATS_PID/status"; }
disk_mb() { du -sm "$STORE" | cut -f1; }

TOKEN="$("$ROOT/scripts/token.sh" bench 7200)"
accept_rate() { # label: the runs service against this stream, 10 s of wrk, req/s
  local port pid out
  port="$(free_port)"
  (
    set -a; source <(service_env); set +a
    export SB_NATS_URL="$URL" SB_NATS_PREFIX="$PREFIX" SB_RUNS_ADDR="127.0.0.1:$port" \
      SB_RUNS_RATE_PER_MINUTE=100000000 SB_RUNS_OWNER_BYTES_PER_DAY=1099511627776 SB_RUNS_MAX_ACTIVE_PER_OWNER=0 SB_RUNS_RATE_BURST=100000000 RUST_LOG=warn
    exec "$BIN/switchboard-runs"
  ) >>"$OUT/runs.log" 2>&1 &
  pid=$!
  wait_until "runs" 60 curl -fs "http://127.0.0.1:$port/readyz"
  out="$(BENCH_TOKEN="$TOKEN" BENCH_NONCE="$(printf '%08x' $RANDOM$RANDOM)" \
    timeout 60 wrk -t2 -c16 -d10s -s "$ROOT/scripts/bench/runs.lua" \
    "http://127.0.0.1:$port/api/v1/agent/runs" 2>&1)"
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  echo "$out" >"$OUT/wrk-$1.txt"
  echo "$out" | awk '/Requests\/sec/ { printf "%.0f", $2 }'
}

{
  echo "| layout | runs retained | nats-server RSS (MB) | disk (MB) | fill rate (runs/s) | fill p99 (ms) | runs service accept (req/s) |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
} >"$OUT/summary.md"
empty_accept="-"
[ "${BENCH_ACCEPT:-0}" = 1 ] && empty_accept="$(accept_rate empty)"
echo "| $LAYOUT | 0 (the service's own runs aside) | $(rss_mb) | $(disk_mb) | - | - | $empty_accept |" >>"$OUT/summary.md"

done_count=0
IFS=, read -r -a marks <<<"$CHECKPOINTS"
for mark in "${marks[@]}"; do
  step=$((mark - done_count))
  log "filling $LAYOUT: runs $done_count..$mark"
  "$BIN/broker-fill" --layout "$LAYOUT" --prefix "$PREFIX" --nats-url "$URL" \
    --first "$done_count" --count "$step" --text-bytes "${BENCH_TEXT_BYTES:-2000}" \
    --dedup-window-secs "${BENCH_DEDUP_WINDOW_SECS:-1}" --events-per-run "${BENCH_EVENTS_PER_RUN:-4}" \
    --max-seconds "${BENCH_MAX_SECONDS:-3600}" | tee -a "$OUT/fill.jsonl" >"$OUT/last.json"
  done_count=$mark
  sleep "${BENCH_IDLE_SECS:-5}" # let the duplicate window and the write cache of the last step lapse
  rate="$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(round(d["rate_per_s"]), d["p99_ms"])' "$OUT/last.json")"
  accept="-"
  [ "${BENCH_ACCEPT:-0}" = 1 ] && accept="$(accept_rate "$mark")"
  echo "| $LAYOUT | $mark | $(rss_mb) | $(disk_mb) | ${rate% *} | ${rate#* } | $accept |" >>"$OUT/summary.md"
  tail -1 "$OUT/summary.md" >&2
done
cat "$OUT/summary.md"
