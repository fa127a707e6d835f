#!/usr/bin/env bash
# Benchmarks the attachments service (release build) in one run:
#
# 1. POST /api/v1/agent/attachments with a 100 MiB PDF (curl, multipart), beside a direct S3 PUT
#    of the same file to the same S3 server with the same credentials (crates/bench `s3-put`,
#    streamed from disk): wall time, MB/s, and the service's peak RSS during the upload against
#    its RSS when idle. Diagnostic: the same file sent directly as a multipart upload in the
#    service's 8 MiB parts. BENCH_UPLOAD_RUNS rounds of the three, interleaved; each and the
#    median.
# 2. POST /v2/files/upload-url (dedup lookup in PostgreSQL, insert of a pending row, SigV4 POST
#    policy) under wrk, beside a bare axum handler answering a same-shaped JSON (crates/bench
#    `bare-axum`): throughput, p50, p99, CPU per request of the target, of its PostgreSQL
#    backends and of wrk; then the same owner again (the owner's rows grow), many owners, and
#    one connection (diagnostics).
# 3. Right after the many-owners load, (b) the same PostgreSQL work without the service: crates/bench
#    `pg-upload-loop` runs what one upload-url request runs in PostgreSQL (the service's own
#    function for it, so the same statements and transactions, committed) on a pool made by the
#    service's own constructor from the service's environment, with as many requests in flight as
#    wrk has connections, for as many fresh owners and as long: "upload-url / raw loop" is the
#    many-owners throughput over the loop's (issue 12).
#
# Prints markdown tables (saved as summary.md). See BENCHMARKS.md, "3. Attachments".
#
# Everything is on loopback. Every load is bounded in time (wrk -d, curl --max-time, s3-put
# --max-seconds and `timeout`) and in count (BENCH_UPLOAD_RUNS uploads of each kind).
# Infrastructure is started if needed and left running. The service runs on a fresh database
# (dropped on exit; BENCH_KEEP_DB=1 keeps it) and a fresh bucket (emptied and deleted on exit;
# BENCH_KEEP_BUCKET=1 keeps it); the processes started here are stopped on exit.
#
# Settings (environment): BENCH_THREADS (wrk threads, 2), BENCH_CONNECTIONS (16),
# BENCH_DURATION (seconds per measured wrk run, 15), BENCH_FLOOR_DURATION (seconds of the
# one-connection run, 8), BENCH_OWNERS (owners of the many-owners run, 64), BENCH_UPLOAD_RUNS
# (3), BENCH_OUT (where raw results go; default .data/bench/attachments-<time>), BENCH_ONLY
# (`upload-url`: skip the 100 MiB uploads, measure upload-url, its diagnostics and the raw loop
# only; a quick re-measure of the ratio), BENCH_BIN (a directory of prebuilt release binaries,
# switchboard-attachments, bare-axum, s3-put and pg-upload-loop, to measure instead of building
# this tree's: an earlier tree's, say).
source "$(dirname "$0")/lib/common.sh"
cd "$ROOT"

THREADS="${BENCH_THREADS:-2}"
CONNECTIONS="${BENCH_CONNECTIONS:-16}"
DURATION="${BENCH_DURATION:-15}"
FLOOR_DURATION="${BENCH_FLOOR_DURATION:-8}"
OWNERS="${BENCH_OWNERS:-64}"
UPLOAD_RUNS="${BENCH_UPLOAD_RUNS:-3}"
ONLY="${BENCH_ONLY:-}"
STAMP="$(date +%Y%m%dT%H%M%S)"
OUT="${BENCH_OUT:-$DATA/bench/attachments-$STAMP}"
LUA="$ROOT/scripts/bench/upload_url.lua"
BIN="${BENCH_BIN:-$ROOT/target/release}"
PATH_UPLOAD_URL=/v2/files/upload-url
PATH_ATTACHMENTS=/api/v1/agent/attachments
# The largest file the service takes (its MAX_FILE_BYTES, "100 MB"): a PDF header, then random
# bytes. Made once and kept.
UPLOAD_FILE="$DATA/bench/attachments-upload-100MiB.pdf"
UPLOAD_BYTES=104857600

((UPLOAD_RUNS >= 1 && UPLOAD_RUNS <= 10)) || die "BENCH_UPLOAD_RUNS must be 1..10"
((OWNERS >= 1 && OWNERS <= 1000)) || die "BENCH_OWNERS must be 1..1000"
[ -z "$ONLY" ] || [ "$ONLY" = upload-url ] || die "BENCH_ONLY must be empty or upload-url"
mkdir -p "$OUT"

# ---------------------------------------------------------------- tools, infrastructure, build
if ! command -v wrk >/dev/null; then
  log "installing wrk (Debian package)"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
fi
"$ROOT/scripts/infra.sh"
if [ -z "${BENCH_BIN:-}" ]; then
  log "building switchboard-attachments and switchboard-bench (release)"
  cargo build --release --locked --quiet -p switchboard-attachments -p switchboard-bench
else
  log "measuring the binaries of $BIN (not built here)"
fi

if [ -z "$ONLY" ]; then
  if [ "$(stat -c %s "$UPLOAD_FILE" 2>/dev/null || echo 0)" != "$UPLOAD_BYTES" ] \
    || [ "$(head -c 9 "$UPLOAD_FILE")" != "%PDF-1.7" ]; then
    log "writing the $UPLOAD_BYTES-byte test file $UPLOAD_FILE"
    mkdir -p "$(dirname "$UPLOAD_FILE")"
    { printf '%%PDF-1.7\n'; head -c $((UPLOAD_BYTES - 9)) /dev/urandom; } >"$UPLOAD_FILE.tmp"
    mv "$UPLOAD_FILE.tmp" "$UPLOAD_FILE"
  fi
  # Both uploads read it from the page cache, not from the disk.
  cat "$UPLOAD_FILE" >/dev/null
fi

# ---------------------------------------------------------------- database, bucket, processes
RUN_ID="$(date +%s)-$((RANDOM % 10000))"
DB="sbbench_attachments_${RUN_ID//-/_}"
BUCKET="bench-$RUN_ID"
PSQL=(psql -q -h "$DATA/pgsock" -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1)
psql_db() { as_postgres "${PSQL[@]}" -d "$DB" -tA "$@"; }
as_postgres "${PSQL[@]}" -c "CREATE DATABASE $DB OWNER $PG_USER"
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
  rm -f "$OUT"/*.polling
  if [ "${BENCH_KEEP_BUCKET:-0}" != 1 ] && [ -x "$BIN/s3-put" ] && [ -f "$OUT/attachments.env" ]; then
    ( set -a; source "$OUT/attachments.env"; set +a
      timeout 120 "$BIN/s3-put" --mode delete-bucket --bucket "$BUCKET" --max-seconds 90 ) \
      >"$OUT/cleanup.json" 2>>"$OUT/cleanup.log" || log "could not delete the bucket $BUCKET"
  fi
  if [ "${BENCH_KEEP_DB:-0}" != 1 ]; then
    as_postgres "${PSQL[@]}" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" 2>>"$OUT/cleanup.log" \
      || log "could not drop the database $DB"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}
hex64() { od -An -N32 -tx1 /dev/urandom | tr -d ' \n'; }

TOKEN_SMOKE="$("$ROOT/scripts/token.sh" "bench-$RUN_ID-smoke" 7200)"
# post_upload_url URL OUTPUT: one valid, new upload-url request; prints status and answer size.
post_upload_url() {
  curl -s -o "$2" -w '%{http_code} %{size_download}' -X POST \
    -H "Authorization: Bearer $TOKEN_SMOKE" -H 'Content-Type: application/json' \
    --data '{"file_name":"bench-smoke-0-1.pdf","file_type":"application/pdf","file_size":1048576,"content_hash":"'"$(hex64)"'"}' \
    "$1"
}
answers_200() { [ "$(post_upload_url "$1" /dev/null | cut -d' ' -f1)" = 200 ]; }

BARE_PORT="$(free_port)"
"$BIN/bare-axum" "127.0.0.1:$BARE_PORT" >"$OUT/bare-axum.log" 2>&1 &
BARE_PID=$!
STARTED+=("$BARE_PID")

ATT_PORT="$(free_port)"
{
  SB_S3_BUCKET="$BUCKET" service_env | grep -v '^SB_ATTACHMENTS_DATABASE_URL='
  echo "SB_ATTACHMENTS_DATABASE_URL=$(database_url "$DB")"
  # The per-owner quotas (60 forms a minute, 20 unfinished uploads, 10,000 files, 10 GiB) would
  # answer most of these loads 429 or 403. Out of reach here, so every request does the whole
  # work; the quota's count of the owner's files still runs in every request.
  echo "SB_ATTACHMENTS_UPLOAD_RATE_PER_MINUTE=1000000000"
  echo "SB_ATTACHMENTS_UPLOAD_RATE_BURST=1000000000"
  echo "SB_ATTACHMENTS_MAX_PENDING_PER_OWNER=1000000000000"
  echo "SB_ATTACHMENTS_MAX_FILES_PER_OWNER=1000000000000"
  echo "SB_ATTACHMENTS_MAX_BYTES_PER_OWNER=1000000000000000000"
} >"$OUT/attachments.env"
(
  set -a; source "$OUT/attachments.env"; set +a
  export SB_ATTACHMENTS_ADDR="127.0.0.1:$ATT_PORT" RUST_LOG=warn
  exec "$BIN/switchboard-attachments"
) >"$OUT/attachments.log" 2>&1 &
ATT_PID=$!
STARTED+=("$ATT_PID")

BARE_URL="http://127.0.0.1:$BARE_PORT$PATH_UPLOAD_URL"
ATT_URL="http://127.0.0.1:$ATT_PORT$PATH_UPLOAD_URL"
wait_until "bare axum" 30 answers_200 "$BARE_URL"
wait_until "attachments" 60 curl -fs "http://127.0.0.1:$ATT_PORT/readyz"
read -r BARE_SMOKE BARE_ANSWER_BYTES <<<"$(post_upload_url "$BARE_URL" "$OUT/smoke-bare.json")"
read -r ATT_SMOKE ATT_ANSWER_BYTES <<<"$(post_upload_url "$ATT_URL" "$OUT/smoke-attachments.json")"
[ "$ATT_SMOKE" = 200 ] || die "attachments does not answer 200 to a valid upload-url request (see $OUT/attachments.log)"
[ "$BARE_SMOKE" = 200 ] || die "bare axum does not answer 200 to upload-url"
log "bare axum on :$BARE_PORT (pid $BARE_PID), attachments on :$ATT_PORT (pid $ATT_PID), database $DB, bucket $BUCKET"

# ---------------------------------------------------------------- helpers
TICKS="$(getconf CLK_TCK)"
S3_PID="$(cat "$DATA/s3.pid" 2>/dev/null || true)"
kill -0 "$S3_PID" 2>/dev/null || S3_PID=""

# cpu_seconds PID: user + system CPU time of a live process ("" if it is not there).
cpu_seconds() {
  [ -n "$1" ] && [ -r "/proc/$1/stat" ] || { echo ""; return; }
  # Fields after the ")" of the command name: utime is the 12th, stime the 13th.
  sed 's/^.*) //' "/proc/$1/stat" | awk -v t="$TICKS" '{ printf "%.2f", ($12 + $13) / t }'
}
# pg_cpu: "pid=seconds" of every PostgreSQL backend connected to the benchmark database.
pg_cpu() {
  local pid
  for pid in $(psql_db -c "SELECT pid FROM pg_stat_activity WHERE datname = '$DB' AND pid <> pg_backend_pid()"); do
    echo "$pid=$(cpu_seconds "$pid")"
  done | tr '\n' ' '
}
# kib PID FIELD: a /proc/PID/status field (VmRSS, VmHWM) in KiB, without forking.
kib() {
  local key value _
  while read -r key value _; do
    if [ "$key" = "$2:" ]; then echo "$value"; return; fi
  done <"/proc/$1/status"
  echo ""
}
# poll_rss PID FILE: while FILE.polling exists (at most 10 minutes), reads VmRSS every 50 ms;
# then writes the largest value seen to FILE.
poll_rss() {
  local pid="$1" file="$2" max=0 value i
  for ((i = 0; i < 12000; i++)); do
    [ -e "$file.polling" ] || break
    value="$(kib "$pid" VmRSS)"
    [ -n "$value" ] && ((value > max)) && max="$value"
    sleep 0.05
  done
  echo "$max" >"$file"
}
wall() { date +%s.%N; }

# measure NAME TARGET_PID COMMAND...: runs COMMAND (output to $OUT/NAME.out) and writes
# $OUT/NAME.json: wrk's BENCH_JSON line plus CPU seconds of the target, of its PostgreSQL
# backends and of the load generator, and the benchmark owner's rows before and after.
measure() {
  local name="$1" target="$2"; shift 2
  local t0 p0 w0 t1 p1 w1 gen r0 r1
  r0="$(psql_db -c "SELECT count(*) FROM attachments.files WHERE owner = '$OWNER'")"
  t0="$(cpu_seconds "$target")"; p0="$(pg_cpu)"; w0="$(wall)"
  local TIMEFORMAT='%U %S'
  { time "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"; } 2>"$OUT/$name.time" || {
    log "$name failed:"; cat "$OUT/$name.err" >&2; exit 1
  }
  t1="$(cpu_seconds "$target")"; p1="$(pg_cpu)"; w1="$(wall)"
  r1="$(psql_db -c "SELECT count(*) FROM attachments.files WHERE owner = '$OWNER'")"
  gen="$(awk '{ printf "%.2f", $1 + $2 }' "$OUT/$name.time")"
  python3 - "$OUT/$name" "$name" "$t0" "$t1" "$p0" "$p1" "$w0" "$w1" "$gen" "$r0" "$r1" <<'PY'
import json, sys
path, name, t0, t1, p0, p1, w0, w1, gen, r0, r1 = sys.argv[1:]
line = None
for raw in open(path + ".out"):
    if raw.startswith("BENCH_JSON "):
        line = raw[len("BENCH_JSON "):]
    elif raw.startswith("{"):  # pg-upload-loop's line
        line = raw
if line is None:
    sys.exit(f"{name}: no result line in {path}.out")
result = json.loads(line)
if isinstance(result.get("errors"), int):
    result["errors"] = {"failed": result["errors"]}
def parse(snapshot):
    return {p: float(s) for p, _, s in (x.partition("=") for x in snapshot.split()) if s}
before, after = parse(p0), parse(p1)
# A backend opened during the phase started from 0; one closed during it is lost (the pool
# keeps its connections, so that does not happen in practice).
pg = sum(s - before.get(p, 0.0) for p, s in after.items())
# pg-upload-loop's backends are gone when it exits: it counts their CPU itself.
pg = result.get("pg_cpu_s", pg)
diff = lambda a, b: round(float(b) - float(a), 2) if a and b else None
result.update(name=name, target_cpu_s=diff(t0, t1), pg_cpu_s=round(pg, 2),
              pg_backends=len(after), wall_s=diff(w0, w1), generator_cpu_s=float(gen),
              owner_rows_before=int(r0), owner_rows_after=int(r1))
json.dump(result, open(path + ".json", "w"))
PY
}

# run_wrk NAME URL TARGET_PID SECONDS CONNECTIONS THREADS [TOKENS_FILE]: a closed loop.
run_wrk() {
  local name="$1" url="$2" target="$3" secs="$4" conns="$5" threads="$6" tokens="${7:-}"
  log "wrk $name: -t$threads -c$conns -d${secs}s, closed loop${tokens:+, $(wc -l <"$tokens") owners}"
  BENCH_TOKEN="$TOKEN" BENCH_TOKENS_FILE="$tokens" \
    BENCH_NONCE="$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')" \
    measure "$name" "$target" timeout $((secs + 30)) \
    wrk -t"$threads" -c"$conns" -d"${secs}s" --timeout 10s --latency -s "$LUA" "$url"
}

# upload_service I: POST /api/v1/agent/attachments of the test file, as a fresh owner (so the
# upload is never answered from the owner's earlier file), into $OUT/upload-service-I.json.
upload_service() {
  local i="$1" name="upload-service-$1" token idle t0 s0 w0 t1 s1 w1 hwm after polled
  token="$("$ROOT/scripts/token.sh" "bench-$RUN_ID-upload-$i" 600)"
  sleep 1
  idle="$(kib "$ATT_PID" VmRSS)"
  echo 5 >"/proc/$ATT_PID/clear_refs" # resets VmHWM to the current RSS (Linux >= 4.0)
  touch "$OUT/$name.polled.polling"
  poll_rss "$ATT_PID" "$OUT/$name.polled" &
  local poller=$!
  t0="$(cpu_seconds "$ATT_PID")"; s0="$(cpu_seconds "$S3_PID")"; w0="$(wall)"
  local TIMEFORMAT='%U %S'
  { time curl -sS --max-time 300 -o "$OUT/$name.answer" \
      -w '{"http_code":%{http_code},"curl_time_total_s":%{time_total},"size_upload":%{size_upload}}' \
      -H 'Expect:' -H "Authorization: Bearer $token" \
      -F "file=@$UPLOAD_FILE;type=application/pdf" "http://127.0.0.1:$ATT_PORT$PATH_ATTACHMENTS" \
      >"$OUT/$name.out" 2>"$OUT/$name.err"; } 2>"$OUT/$name.time" || {
    log "$name failed:"; cat "$OUT/$name.err" >&2; exit 1
  }
  w1="$(wall)"; t1="$(cpu_seconds "$ATT_PID")"; s1="$(cpu_seconds "$S3_PID")"
  hwm="$(kib "$ATT_PID" VmHWM)"; after="$(kib "$ATT_PID" VmRSS)"
  rm -f "$OUT/$name.polled.polling"; wait "$poller"; polled="$(cat "$OUT/$name.polled")"
  python3 - "$OUT/$name" "$w0" "$w1" "$t0" "$t1" "$s0" "$s1" "$idle" "$hwm" "$after" "$polled" "$UPLOAD_BYTES" <<'PY'
import json, sys
path, w0, w1, t0, t1, s0, s1, idle, hwm, after, polled, size = sys.argv[1:]
r = json.load(open(path + ".out"))
answer = json.load(open(path + ".answer"))
if r["http_code"] != 200 or not all(k in answer for k in ("bucket", "path", "mime_type", "url")):
    sys.exit(f"{path}: HTTP {r['http_code']}: {answer}")
gen = sum(float(x) for x in open(path + ".time").read().split())
diff = lambda a, b: round(float(b) - float(a), 2) if a and b else None
wall_s = float(w1) - float(w0)
r.update(kind="service", wall_s=wall_s, mb_per_s=int(size) / wall_s / 1e6,
         target_cpu_s=diff(t0, t1), s3_cpu_s=diff(s0, s1), client_cpu_s=round(gen, 2),
         idle_rss_kib=int(idle), peak_rss_kib=int(hwm), polled_max_rss_kib=int(polled),
         after_rss_kib=int(after), path=answer["path"])
json.dump(r, open(path + ".json", "w"))
PY
}

# upload_direct I PART_MIB: the same file straight to S3 with s3-put, into
# $OUT/upload-direct-I.json (PART_MIB 0: one PutObject) or $OUT/upload-multipart-I.json (a
# multipart upload in PART_MIB parts, one after the other, as the service sends it).
upload_direct() {
  local i="$1" part_mib="$2" name s0 w0 s1 w1
  if [ "$part_mib" = 0 ]; then name="upload-direct-$i"; else name="upload-multipart-$i"; fi
  sleep 1
  s0="$(cpu_seconds "$S3_PID")"; w0="$(wall)"
  local TIMEFORMAT='%U %S'
  # (bash's `time` reports nothing for a bare subshell; in braces it does.)
  { time { (
      set -a; source "$OUT/attachments.env"; set +a
      exec timeout 330 "$BIN/s3-put" --file "$UPLOAD_FILE" --bucket "$BUCKET" \
        --key "$name/attachments-upload-100MiB.pdf" --part-mib "$part_mib" --max-seconds 300
    ); } >"$OUT/$name.out" 2>"$OUT/$name.err"; } 2>"$OUT/$name.time" || {
    log "$name failed:"; cat "$OUT/$name.err" >&2; exit 1
  }
  w1="$(wall)"; s1="$(cpu_seconds "$S3_PID")"
  python3 - "$OUT/$name" "$w0" "$w1" "$s0" "$s1" "$UPLOAD_BYTES" <<'PY'
import json, sys
path, w0, w1, s0, s1, size = sys.argv[1:]
r = json.loads(open(path + ".out").read().strip().splitlines()[-1])
if r["bytes"] != int(size):
    sys.exit(f"{path}: sent {r['bytes']} bytes, not {size}")
gen = sum(float(x) for x in open(path + ".time").read().split())
diff = lambda a, b: round(float(b) - float(a), 2) if a and b else None
wall_s = float(w1) - float(w0)
r.update(kind=r["mode"], wall_s=wall_s, mb_per_s=int(size) / wall_s / 1e6,
         s3_cpu_s=diff(s0, s1), client_cpu_s=round(gen, 2))
json.dump(r, open(path + ".json", "w"))
PY
}

# ---------------------------------------------------------------- measurements
# 1. Server-side upload vs. direct PUT (and a direct multipart upload in the service's part
# size, a diagnostic), interleaved, before any upload-url load: the service is idle (no pending
# rows for its verifier to look at) and its RSS is the idle one.
PART_MIB=8 # the service's PART_BYTES (services/attachments/src/server_upload.rs)
sleep 2
IDLE_RSS_START="$(kib "$ATT_PID" VmRSS)"
for ((i = 1; i <= UPLOAD_RUNS; i++)); do
  [ -z "$ONLY" ] || break
  log "upload $i/$UPLOAD_RUNS: through the service, as one PutObject, as a $PART_MIB MiB multipart upload"
  upload_service "$i"
  upload_direct "$i" 0
  upload_direct "$i" "$PART_MIB"
done

# 2. upload-url, closed loops. $OWNER is the one owner of the single-owner runs; the rows
# counted before and after each run are its rows.
OWNER="bench-$RUN_ID"
TOKEN="$("$ROOT/scripts/token.sh" "$OWNER" 7200)"
TOKENS_FILE="$OUT/owners.tokens"
for ((i = 1; i <= OWNERS; i++)); do
  "$ROOT/scripts/token.sh" "bench-$RUN_ID-owner-$i" 7200
done >"$TOKENS_FILE"

run_wrk bare-max "$BARE_URL" "$BARE_PID" "$DURATION" "$CONNECTIONS" "$THREADS"
run_wrk att-max "$ATT_URL" "$ATT_PID" "$DURATION" "$CONNECTIONS" "$THREADS"
run_wrk att-max-again "$ATT_URL" "$ATT_PID" "$DURATION" "$CONNECTIONS" "$THREADS"
run_wrk att-owners "$ATT_URL" "$ATT_PID" "$DURATION" "$CONNECTIONS" "$THREADS" "$TOKENS_FILE"
# (b) the same PostgreSQL work without the service, at once: as many in flight as wrk's
# connections, as many fresh owners, as long (and at most 10 million requests).
raw_loop() {
  (
    set -a; source "$OUT/attachments.env"; set +a
    exec timeout $((DURATION + 60)) "$BIN/pg-upload-loop" --owner-prefix "bench-$RUN_ID-raw-owner" \
      --owners "$OWNERS" --concurrency "$CONNECTIONS" --max-seconds "$DURATION" \
      --count 10000000 --clock-ticks "$TICKS"
  )
}
log "pg-upload-loop: $CONNECTIONS in flight, ${DURATION}s, $OWNERS owners"
measure raw-owners "" raw_loop
run_wrk att-c1 "$ATT_URL" "$ATT_PID" "$FLOOR_DURATION" 1 1 "$TOKENS_FILE"

# explain_lookup OWNER FILE: the dedup lookup (store::find_by_hash) of OWNER as PostgreSQL plans
# and runs it now, for a hash no row has.
explain_lookup() {
  local hash; hash="$(hex64)"
  psql_db -c "EXPLAIN (ANALYZE, BUFFERS) SELECT id, bucket, object_key, file_name, content_type,
    size_bytes, declared_sha256, status, expires_at FROM (
      SELECT * FROM attachments.files WHERE owner = '$1' AND sha256 = '\\x$hash'::bytea AND status = 'verified'
      UNION ALL
      SELECT * FROM attachments.files WHERE owner = '$1' AND declared_sha256 = '\\x$hash'::bytea
        AND declared_sha256 IS NOT NULL AND status IN ('pending', 'verified')
    ) AS live
    ORDER BY status = 'verified' DESC, created_at LIMIT 1" >"$2"
}
explain_lookup "$OWNER" "$OUT/explain-lookup.txt"
explain_lookup "bench-$RUN_ID-owner-1" "$OUT/explain-lookup-many.txt"
psql_db -c "SELECT status, count(*) FROM attachments.files GROUP BY status ORDER BY status" \
  >"$OUT/rows.txt"

# ---------------------------------------------------------------- report
{
  echo "machine: $(nproc) cores, $(free -h | awk '/^Mem:/ { print $2 }') memory, $(lscpu | sed -n 's/^Model name: *//p' | head -1), kernel $(uname -r), load average before the report $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "settings: wrk -t$THREADS -c$CONNECTIONS -d${DURATION}s; $OWNERS owners in the many-owners run and the raw loop; $([ -n "$ONLY" ] && echo "no uploads (BENCH_ONLY=$ONLY)" || echo "$UPLOAD_RUNS uploads of each kind of a $UPLOAD_BYTES-byte PDF"); database $DB, bucket $BUCKET"
  echo "tree: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet HEAD -- services crates migrations 2>/dev/null || echo ' + uncommitted changes'); raw results in $OUT"
  echo "answer sizes (upload-url): attachments $ATT_ANSWER_BYTES bytes, bare axum $BARE_ANSWER_BYTES bytes"
  echo
  python3 - "$OUT" "$UPLOAD_RUNS" "$OWNERS" "$CONNECTIONS" "$IDLE_RSS_START" "$ONLY" <<'PY'
import json, os, statistics, sys
out, runs, many, conns = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
idle_start = int(sys.argv[5])
only = sys.argv[6]
load = lambda n: json.load(open(os.path.join(out, n + ".json")))
mib = lambda kib: f"{kib / 1024:.1f}"

if not only:
    print("Server-side upload of the 100 MiB PDF vs. direct uploads of the same file to the same S3 server.")
    print()
    print(f"The service's RSS when idle after start: {mib(idle_start)} MiB.")
    print()
    print("| run | path | wall (s) | MB/s | RSS before (MiB) | peak RSS, VmHWM (MiB) "
          "| peak - RSS at start (MiB) | max VmRSS polled every 50 ms (MiB) | RSS after (MiB) "
          "| uploading process CPU (s) | S3 server CPU (s) | curl CPU (s) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    service = [load(f"upload-service-{i}") for i in range(1, runs + 1)]
    direct = [load(f"upload-direct-{i}") for i in range(1, runs + 1)]
    multi = [load(f"upload-multipart-{i}") for i in range(1, runs + 1)]
    for s in service:
        s["over_start_kib"] = s["peak_rss_kib"] - idle_start
    def direct_row(label, d, bold=""):
        return (f"| {label} | {bold}{d['wall_s']:.3f}{bold} | {bold}{d['mb_per_s']:.0f}{bold} | - | "
                f"{mib(d['peak_rss_kib'])} (s3-put) | - | - | - | {d['client_cpu_s']:.2f} | "
                f"{d['s3_cpu_s']:.2f} | - |")
    for i, (s, d, m) in enumerate(zip(service, direct, multi), 1):
        print(f"| {i} | service (curl -F) | {s['wall_s']:.3f} | {s['mb_per_s']:.0f} | {mib(s['idle_rss_kib'])} | "
              f"{mib(s['peak_rss_kib'])} | {mib(s['over_start_kib'])} | {mib(s['polled_max_rss_kib'])} | "
              f"{mib(s['after_rss_kib'])} | {s['target_cpu_s']:.2f} | {s['s3_cpu_s']:.2f} | "
              f"{s['client_cpu_s']:.2f} |")
        print(direct_row(f"{i} | direct, one PutObject (s3-put)", d))
        print(direct_row(f"{i} | direct, multipart (s3-put --part-mib)", m))
    med = lambda rows, k: statistics.median(r[k] for r in rows)
    sw, dw, mw = med(service, "wall_s"), med(direct, "wall_s"), med(multi, "wall_s")
    print(f"| **median** | service | **{sw:.3f}** | **{med(service, 'mb_per_s'):.0f}** | "
          f"{mib(med(service, 'idle_rss_kib'))} | **{mib(med(service, 'peak_rss_kib'))}** | "
          f"{mib(med(service, 'over_start_kib'))} | {mib(med(service, 'polled_max_rss_kib'))} | "
          f"{mib(med(service, 'after_rss_kib'))} | {med(service, 'target_cpu_s'):.2f} | "
          f"{med(service, 's3_cpu_s'):.2f} | {med(service, 'client_cpu_s'):.2f} |")
    for label, rows in [("direct, one PutObject", direct), ("direct, multipart", multi)]:
        print(f"| **median** | {label} | **{med(rows, 'wall_s'):.3f}** | **{med(rows, 'mb_per_s'):.0f}** | - | "
              f"{mib(med(rows, 'peak_rss_kib'))} (s3-put) | - | - | - | {med(rows, 'client_cpu_s'):.2f} | "
              f"{med(rows, 's3_cpu_s'):.2f} | - |")
    print()
    print(f"- service / direct PutObject, median wall time: **{sw / dw:.2f}x** "
          f"(throughput {med(service, 'mb_per_s') / med(direct, 'mb_per_s'):.0%} of direct)")
    print(f"- service / direct multipart in the same part size, median wall time: {sw / mw:.2f}x; "
          f"the CompleteMultipartUpload call alone took {med(multi, 'complete_seconds'):.3f} s (median)")
    print(f"- the service's peak RSS was at most {mib(max(s['over_start_kib'] for s in service))} MiB "
          f"above its RSS when idle after start")
    print()

print("`POST /v2/files/upload-url`: closed loops.")
print()
r = {n: load(n) for n in ["bare-max", "att-max", "att-max-again", "att-owners", "att-c1", "raw-owners"]}
for v in r.values():
    v["error_count"] = sum(v["errors"].values())
def per_req(v, key):
    x = v.get(key)
    return "n/a" if x is None or not v["requests"] else f"{x * 1000 / v['requests']:.3f}"
print("| target | load | owners | owner's rows before -> after | requests | errors | req/s | p50 (ms) "
      "| p99 (ms) | target CPU ms/req | PostgreSQL CPU ms/req | wrk CPU ms/req |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for label, load_, owners, n in [
    ("(a) bare axum", f"max, {conns} connections", "-", "bare-max"),
    ("attachments", f"max, {conns} connections", "1", "att-max"),
    ("attachments", f"max, {conns} connections, the same owner again", "1", "att-max-again"),
    ("attachments", f"max, {conns} connections", many, "att-owners"),
    ("attachments", "1 connection", many, "att-c1"),
    ("(b) raw PostgreSQL loop (pg-upload-loop)", f"max, {conns} in flight", many, "raw-owners"),
]:
    v = r[n]
    rows = "-" if owners != "1" else f"{v['owner_rows_before']} -> {v['owner_rows_after']}"
    pg = "-" if n.startswith("bare") else per_req(v, "pg_cpu_s")
    # The raw loop is its own load generator: its CPU is the target's, no wrk.
    target, generator = per_req(v, "target_cpu_s"), per_req(v, "generator_cpu_s")
    if n.startswith("raw"):
        target, generator = generator, "-"
    print(f"| {label} | {load_} | {owners} | {rows} | {v['requests']} | {v['error_count']} | "
          f"{v['rps']:.0f} | {v['p50_ms']:.2f} | {v['p99_ms']:.2f} | {target} | "
          f"{pg} | {generator} |")
print()
bare = r["bare-max"]["rps"]
print("| ratio (throughput at max) | value |")
print("|---|---:|")
print(f"| attachments, 1 owner from empty / (a) | {r['att-max']['rps'] / bare:.1%} |")
print(f"| attachments, the same owner again / (a) | {r['att-max-again']['rps'] / bare:.1%} |")
print(f"| attachments, many owners / (a) | {r['att-owners']['rps'] / bare:.1%} |")
print(f"| **upload-url / raw loop**: attachments, many owners / (b) | "
      f"**{r['att-owners']['rps'] / r['raw-owners']['rps']:.1%}** |")
print()
print(f"upload-url / raw loop: {r['att-owners']['rps'] / r['raw-owners']['rps']:.3f} "
      f"({r['att-owners']['rps']:.0f} req/s, p99 {r['att-owners']['p99_ms']:.2f} ms / "
      f"{r['raw-owners']['rps']:.0f} ops/s, p99 {r['raw-owners']['p99_ms']:.2f} ms)")
print()
bad = [n for n, v in r.items() if v["error_count"]]
if bad:
    print(f"WARNING: errors in {', '.join(bad)}: the figures of those rows are not valid")
    sys.exit(2)
PY
  echo
  echo "The dedup lookup after the runs (EXPLAIN ANALYZE; $(psql_db -c "SELECT count(*) FROM attachments.files") rows in the table):"
  echo
  echo '```'
  echo "-- the single owner ($(psql_db -c "SELECT count(*) FROM attachments.files WHERE owner = '$OWNER'") rows)"
  grep -E 'Scan|Rows Removed|Execution Time' "$OUT/explain-lookup.txt" | sed 's/^ *//'
  echo "-- one of the $OWNERS owners ($(psql_db -c "SELECT count(*) FROM attachments.files WHERE owner = 'bench-$RUN_ID-owner-1'") rows)"
  grep -E 'Scan|Rows Removed|Execution Time' "$OUT/explain-lookup-many.txt" | sed 's/^ *//'
  echo '```'
} | tee "$OUT/summary.md"
