#!/usr/bin/env bash
# Peak memory of attachment extraction on hostile files (BENCHMARKS.md section 6), release build,
# no infrastructure needed. For each file of `extract::bombs` (decompression bombs and
# maximum-size files) and each mode, runs `extract-peak` BENCH_RUNS times, each in a fresh process,
# and prints a markdown table of the outcome and the peak RSS (min-max over the runs):
#
# - inprocess: `extract::extract` on a thread per file, as the worker did before issue 14, with
#   today's in-crate bounds. Run under `ulimit -v` BENCH_ULIMIT_KIB (8 GB) so a bomb cannot take
#   the machine: a run that aborts there is reported as such.
# - isolated: the worker's own `Extractor` (a `switchboard-extract` helper process per file,
#   SB_WORKER_EXTRACT_CONCURRENCY at once, each limited to SB_WORKER_EXTRACT_MEMORY_MIB), the
#   file streamed from disk as the worker streams it from S3. Columns: this process's peak
#   (the worker's share), the largest peak a helper reported, and the largest sum of this
#   process and its helpers seen by a 2 ms sampler (what a container limit counts).
#
# Settings (environment): BENCH_RUNS (3), BENCH_MODES ("inprocess isolated"), BENCH_BOMBS (all),
# BENCH_COPIES (files extracted at once per run, 1; 6 = two messages of three files),
# BENCH_ULIMIT_KIB (8000000), SB_WORKER_EXTRACT_CONCURRENCY (2), SB_WORKER_EXTRACT_MEMORY_MIB
# (384). Raw JSON lines go to BENCH_OUT (default .data/bench/extract-<time>.jsonl).
source "$(dirname "$0")/lib/common.sh"
cd "$ROOT"

RUNS="${BENCH_RUNS:-3}"
MODES="${BENCH_MODES:-inprocess isolated}"
COPIES="${BENCH_COPIES:-1}"
ULIMIT_KIB="${BENCH_ULIMIT_KIB:-8000000}"
OUT="${BENCH_OUT:-$DATA/bench/extract-$(date +%Y%m%dT%H%M%S).jsonl}"
BOMBS="${BENCH_BOMBS:-bmp-rle8-9000 png-100000 docx-inflate-1g docx-lying-sizes xlsx-empty-strings pdf-flate-500m pdf-flate-tokens pdf-objstm pdf-array-100m text-100m pdf-images-100m}"
mkdir -p "$(dirname "$OUT")"
: >"$OUT"

log "building extract-peak and the switchboard-extract helper (release)"
cargo build --release --locked --quiet -p switchboard-bench --bin extract-peak \
  -p switchboard-extract --bin switchboard-extract

log "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -n1), $(nproc) cores"
for mode in $MODES; do
  for bomb in $BOMBS; do
    for ((i = 1; i <= RUNS; i++)); do
      line=$(
        ulimit -v "$ULIMIT_KIB"
        timeout 300 "$ROOT/target/release/extract-peak" --bomb "$bomb" --mode "$mode" \
          --copies "$COPIES" 2>/dev/null
      ) || line="{\"bomb\": \"$bomb\", \"mode\": \"$mode\", \"copies\": $COPIES, \"aborted\": $?}"
      echo "$line" >>"$OUT"
    done
    log "$mode $bomb done"
  done
done

python3 - "$OUT" "$ULIMIT_KIB" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows.setdefault((r["mode"], r["bomb"]), []).append(r)
def span(values):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return f"{lo}" if lo == hi else f"{lo}-{hi}"
limit_gb = int(sys.argv[2]) * 1024 / 1e9
print("| mode | file | bytes | outcome | seconds | process peak MiB | helper peak MiB | sampled total MiB |")
print("|---|---|---:|---|---:|---:|---:|---:|")
for (mode, bomb), runs in rows.items():
    done = [r for r in runs if "aborted" not in r]
    aborted = len(runs) - len(done)
    if not done:
        print(f"| {mode} | {bomb} | | aborted at the {limit_gb:.0f} GB ulimit ({aborted}/{len(runs)}) | | > {limit_gb * 1e9 / 2**20:,.0f} | | |")
        continue
    outcome = "; ".join(sorted({o for r in done for o in r["outcomes"]}))
    if aborted:
        outcome += f" ({aborted}/{len(runs)} aborted)"
    # A helper that died at its memory limit reports no peak (0): shown as "-".
    helper = span([r.get("helper_peak_rss_mib") or None for r in done]) if mode == "isolated" else ""
    total = span([r.get("sampled_total_peak_mib") for r in done]) if mode == "isolated" else ""
    print(f"| {mode} | {bomb} | {done[0]['file_bytes']:,} | {outcome} | {span([r['seconds'] for r in done])} "
          f"| {span([r['peak_rss_mib'] for r in done])} | {helper} | {total} |")
PY
log "raw results: $OUT"
