#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# (SC2031: the service subshells only source SB_* settings, never ROOT or DATA.)
# shellcheck disable=SC2031
# Benchmarks the day snapshot of the history service (GET /api/v1/agent/history?threadId=T,
# release build) as its database grows, in one run:
#
# The benchmark thread's latest day has 200 messages (alternating user / assistant), 50 of the
# user messages with an attachment, so every snapshot also asks the attachments service (over
# NATS) to sign 50 download URLs; that service runs too, on its own fresh database holding the
# 50 verified files of the benchmark owner among BENCH_ATTACHMENT_FILES files of other owners.
# The history database is grown step by step through BENCH_SIZES messages in total (default
# 10k, 1M, 10M: many owners, BENCH_PER_THREAD messages a thread, BENCH_THREADS_PER_OWNER
# threads an owner, spread over 180 days; scripts/bench/history-data.sql), each step followed
# by VACUUM ANALYZE. After each step:
#
# - EXPLAIN (ANALYZE, BUFFERS) of every query the endpoint runs (services/history/src/store.rs),
#   prepared as sqlx prepares them and executed 6 times first, so the plan shown is the one a
#   pooled connection settles on (explain-SIZE.txt; the custom plans are in
#   explain-SIZE-custom.txt), and of the attachments service's per-URL lookup;
# - wrk closed loops: BENCH_CONNECTIONS connections, and one connection (the unloaded latency);
#   then the same on a second thread of the same shape without attachments (no signing: the
#   database and JSON part alone), a diagnostic.
#
# Prints markdown tables (saved as summary.md). See BENCHMARKS.md, "4. History day snapshots".
#
# Everything is on loopback. Every load is bounded in time (wrk -d and `timeout`). Disk space is
# checked before each step; a step that would leave less than BENCH_MIN_FREE_GB free is skipped
# (with the larger ones). Infrastructure is started if needed and left running. The services run
# on fresh databases (dropped on exit; BENCH_KEEP_DB=1 keeps them) and a fresh NATS prefix (its
# streams deleted on exit); the processes started here are stopped on exit.
#
# Settings (environment): BENCH_SIZES ("10000 1000000 10000000", ascending, each > 800),
# BENCH_THREADS (wrk threads, 2), BENCH_CONNECTIONS (8), BENCH_DURATION (seconds per measured
# loaded run, 15), BENCH_FLOOR_DURATION (seconds per one-connection run, 10), BENCH_WARMUP
# (seconds, 3), BENCH_PER_THREAD (100), BENCH_THREADS_PER_OWNER (10), BENCH_CHUNK (rows per
# insert statement, 1000000), BENCH_ATTACHMENT_FILES (100000), BENCH_MIN_FREE_GB (5), BENCH_OUT
# (where raw results go; default .data/bench/history-<time>), BENCH_SKIP_BUILD (1: use the
# release binaries in target/release as they are, e.g. while the workspace does not build).
# shellcheck source=lib/common.sh
source "$(dirname "$0")/lib/common.sh"
cd "$ROOT" || exit 1

read -r -a SIZES <<<"${BENCH_SIZES:-10000 1000000 10000000}"
THREADS="${BENCH_THREADS:-2}"
CONNECTIONS="${BENCH_CONNECTIONS:-8}"
DURATION="${BENCH_DURATION:-15}"
FLOOR_DURATION="${BENCH_FLOOR_DURATION:-10}"
WARMUP="${BENCH_WARMUP:-3}"
PER_THREAD="${BENCH_PER_THREAD:-100}"
THREADS_PER_OWNER="${BENCH_THREADS_PER_OWNER:-10}"
CHUNK="${BENCH_CHUNK:-1000000}"
ATTACHMENT_FILES="${BENCH_ATTACHMENT_FILES:-100000}"
MIN_FREE_GB="${BENCH_MIN_FREE_GB:-5}"
OUT="${BENCH_OUT:-$DATA/bench/history-$(date +%Y%m%dT%H%M%S)}"
LUA="$ROOT/scripts/bench/history.lua"
DATA_SQL="$ROOT/scripts/bench/history-data.sql"
BIN="$ROOT/target/release"
BUCKET="${SB_S3_BUCKET:-switchboard}"
OWNER=bench-owner
# The two benchmark threads (scripts/bench/history-data.sql, bench.bench_rows): 400 messages
# each; the latest day (2025-07-15, UTC) has 200.
SIGN_THREAD=5b2f6c1e-0d4a-4c57-9a61-2f0c3d9e7a01
NOSIGN_THREAD=5b2f6c1e-0d4a-4c57-9a61-2f0c3d9e7a02
BENCH_ROWS=800
EXPECT_DAY=2025-07-15

((${#SIZES[@]} >= 1)) || die "BENCH_SIZES is empty"
prev=0
for size in "${SIZES[@]}"; do
  if ! [[ "$size" =~ ^[0-9]+$ ]] || ((size <= BENCH_ROWS || size <= prev)); then
    die "BENCH_SIZES must be ascending integers above $BENCH_ROWS (got '$size')"
  fi
  prev="$size"
done
((PER_THREAD >= 2 && THREADS_PER_OWNER >= 1 && CHUNK >= 1000)) || die "bad BENCH_PER_THREAD / BENCH_THREADS_PER_OWNER / BENCH_CHUNK"
mkdir -p "$OUT"

# ---------------------------------------------------------------- tools, infrastructure, build
if ! command -v wrk >/dev/null; then
  log "installing wrk (Debian package)"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
fi
"$ROOT/scripts/infra.sh"
if [ "${BENCH_SKIP_BUILD:-0}" = 1 ]; then
  for bin in switchboard-history switchboard-attachments js-publish-loop; do
    [ -x "$BIN/$bin" ] || die "BENCH_SKIP_BUILD=1 but $BIN/$bin is missing"
  done
  log "using the release binaries already built (BENCH_SKIP_BUILD=1): $(stat -c '%y' "$BIN/switchboard-history" | cut -d. -f1)"
else
  log "building switchboard-history, switchboard-attachments and switchboard-bench (release)"
  cargo build --release --locked --quiet -p switchboard-history -p switchboard-attachments -p switchboard-bench
fi

# ---------------------------------------------------------------- databases, processes
RUN_ID="$(date +%s)-$((RANDOM % 10000))"
HDB="sbbench_history_${RUN_ID//-/_}"
ADB="sbbench_history_att_${RUN_ID//-/_}"
PREFIX="bh-$RUN_ID"
export SB_NATS_PREFIX="$PREFIX"
PSQL=(psql -X -q -h "$DATA/pgsock" -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1)
hsql() { as_postgres "${PSQL[@]}" -d "$HDB" -tA "$@"; }
asql() { as_postgres "${PSQL[@]}" -d "$ADB" -tA "$@"; }
STARTED=()
DBS=()

cleanup() {
  local status=$? pid db
  for pid in "${STARTED[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${STARTED[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  if [ -x "$BIN/js-publish-loop" ]; then
    timeout 30 "$BIN/js-publish-loop" --mode cleanup --prefix "$PREFIX" \
      --nats-url "nats://127.0.0.1:$NATS_PORT" >"$OUT/cleanup.json" 2>>"$OUT/cleanup.log" \
      || log "could not delete the streams of $PREFIX"
  fi
  if [ "${BENCH_KEEP_DB:-0}" != 1 ]; then
    for db in "${DBS[@]}"; do
      as_postgres "${PSQL[@]}" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" 2>>"$OUT/cleanup.log" \
        || log "could not drop the database $db"
    done
  elif ((${#DBS[@]})); then
    log "kept the databases ${DBS[*]} (BENCH_KEEP_DB=1)"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for db in "$HDB" "$ADB"; do
  as_postgres "${PSQL[@]}" -c "CREATE DATABASE $db OWNER $PG_USER"
  DBS+=("$db")
done

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

ATT_PORT="$(free_port)"
{
  service_env | grep -v '^SB_ATTACHMENTS_DATABASE_URL='
  echo "SB_ATTACHMENTS_DATABASE_URL=$(database_url "$ADB")"
} >"$OUT/attachments.env"
(
  # shellcheck disable=SC1091
  set -a; source "$OUT/attachments.env"; set +a
  SB_ATTACHMENTS_ADDR="127.0.0.1:$ATT_PORT" RUST_LOG=warn exec "$BIN/switchboard-attachments"
) >"$OUT/attachments.log" 2>&1 &
ATT_PID=$!
STARTED+=("$ATT_PID")

HIST_PORT="$(free_port)"
{
  service_env | grep -v '^SB_HISTORY_DATABASE_URL='
  echo "SB_HISTORY_DATABASE_URL=$(database_url "$HDB")"
} >"$OUT/history.env"
(
  # shellcheck disable=SC1091
  set -a; source "$OUT/history.env"; set +a
  SB_HISTORY_ADDR="127.0.0.1:$HIST_PORT" RUST_LOG=warn exec "$BIN/switchboard-history"
) >"$OUT/history.log" 2>&1 &
HIST_PID=$!
STARTED+=("$HIST_PID")

wait_until "attachments" 60 curl -fs "http://127.0.0.1:$ATT_PORT/readyz"
wait_until "history" 60 curl -fs "http://127.0.0.1:$HIST_PORT/readyz"
log "history on :$HIST_PORT (pid $HIST_PID, database $HDB), attachments on :$ATT_PORT (pid $ATT_PID, database $ADB), NATS prefix $PREFIX"

# ---------------------------------------------------------------- fixed data
hsql -f "$DATA_SQL" >/dev/null
# The benchmark owner's 50 verified files (their paths are bench.attachment_path(i) of the data
# script) and ATTACHMENT_FILES verified files of 10,000 other owners.
asql -v bucket="$BUCKET" -v n="$ATTACHMENT_FILES" >/dev/null <<'SQL'
INSERT INTO attachments.files (id, owner, bucket, object_key, file_name, content_type, size_bytes,
                               declared_sha256, sha256, status, created_at, verified_at)
SELECT gen_random_uuid(), 'bench-owner', :'bucket',
       'uploads/bench-owner/' || ('a' || lpad(to_hex(i), 31, '0'))::uuid || '/quarterly-report-' || i || '.pdf',
       'quarterly-report-' || i || '.pdf', 'application/pdf', 1048576 + i,
       sha256(('bench-' || i)::bytea), sha256(('bench-' || i)::bytea), 'verified',
       timestamptz '2025-07-15 08:00:00+00' + make_interval(mins => 8 * (i - 1)),
       timestamptz '2025-07-15 08:00:00+00' + make_interval(mins => 8 * (i - 1))
FROM generate_series(1, 50) AS i;
INSERT INTO attachments.files (id, owner, bucket, object_key, file_name, content_type, size_bytes,
                               declared_sha256, sha256, status, created_at, verified_at)
SELECT gen_random_uuid(), 'user-' || lpad((i % 10000)::text, 8, '0'), :'bucket',
       'uploads/user-' || lpad((i % 10000)::text, 8, '0') || '/' || md5('file-' || i)::uuid || '/report-' || i || '.pdf',
       'report-' || i || '.pdf', 'application/pdf', 1048576 + i,
       sha256(('file-' || i)::bytea), sha256(('file-' || i)::bytea), 'verified',
       timestamptz '2025-01-01 00:00:00+00' + make_interval(mins => i % 259200),
       timestamptz '2025-01-01 00:00:00+00' + make_interval(mins => i % 259200)
FROM generate_series(1, :n) AS i;
VACUUM ANALYZE attachments.files;
SQL

# ---------------------------------------------------------------- helpers
TOKEN="$("$ROOT/scripts/token.sh" "$OWNER" 7200)"
HIST_URL="http://127.0.0.1:$HIST_PORT/api/v1/agent/history"
SIGN_URL="$HIST_URL?threadId=$SIGN_THREAD"
NOSIGN_URL="$HIST_URL?threadId=$NOSIGN_THREAD"
NATS_PID="$(cat "$DATA/nats.pid" 2>/dev/null || true)"
kill -0 "$NATS_PID" 2>/dev/null || NATS_PID=""
TICKS="$(getconf CLK_TCK)"
wall() { date +%s.%N; }
secs_since() { python3 -c 'import sys, time; print(f"{time.time() - float(sys.argv[1]):.1f}")' "$1"; }

# cpu_seconds PID: user + system CPU time of a live process ("" if it is not there).
cpu_seconds() {
  if [ -z "$1" ] || [ ! -r "/proc/$1/stat" ]; then echo ""; return; fi
  # Fields after the ")" of the command name: utime is the 12th, stime the 13th.
  sed 's/^.*) //' "/proc/$1/stat" | awk -v t="$TICKS" '{ printf "%.2f", ($12 + $13) / t }'
}
# pg_cpu: "pid=seconds" of every PostgreSQL backend connected to either benchmark database.
pg_cpu() {
  local pid
  for pid in $(hsql -c "SELECT pid FROM pg_stat_activity WHERE datname IN ('$HDB', '$ADB') AND pid <> pg_backend_pid()"); do
    echo "$pid=$(cpu_seconds "$pid")"
  done | tr '\n' ' '
}

# check_snapshot NAME URL URLS: one request; the answer must be the latest day, 200 messages, in
# seq order, earlier days announced, and URLS signed attachment URLs (checked, not assumed: the
# service serves null URLs when signing fails).
check_snapshot() {
  local name="$1" url="$2" urls="$3" code
  code="$(curl -s -o "$OUT/$name.json" -w '%{http_code}' --max-time 10 -H "Authorization: Bearer $TOKEN" "$url")"
  [ "$code" = 200 ] || die "$name: HTTP $code (see $OUT/history.log)"
  python3 - "$OUT/$name.json" "$EXPECT_DAY" "$urls" <<'PY' || die "$name: unexpected answer"
import json, sys
path, day, urls = sys.argv[1], sys.argv[2], int(sys.argv[3])
r = json.load(open(path))
messages = r["messages"]
signed = [m for m in messages if m["role"] == "user" and m.get("url")]
seqs = [m["seq"] for m in messages]
problems = []
if r["day"] != day: problems.append(f"day {r['day']} != {day}")
if len(messages) != 200: problems.append(f"{len(messages)} messages")
if seqs != sorted(seqs): problems.append("not in seq order")
if not r["hasMore"]: problems.append("hasMore is false")
if len(signed) != urls: problems.append(f"{len(signed)} signed URLs, expected {urls}")
if any("X-Amz-Signature=" not in m["url"] for m in signed): problems.append("a URL is not presigned")
if problems:
    sys.exit(f"{path}: " + "; ".join(problems))
PY
}

# measure NAME COMMAND...: runs COMMAND (output to $OUT/NAME.out) and writes $OUT/NAME.json:
# wrk's BENCH_JSON line plus CPU seconds of history, attachments, their PostgreSQL backends,
# nats-server and wrk.
measure() {
  local name="$1"; shift
  local h0 a0 n0 p0 h1 a1 n1 p1 gen
  h0="$(cpu_seconds "$HIST_PID")"; a0="$(cpu_seconds "$ATT_PID")"; n0="$(cpu_seconds "$NATS_PID")"; p0="$(pg_cpu)"
  local TIMEFORMAT='%U %S'
  { time "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"; } 2>"$OUT/$name.time" || {
    log "$name failed:"; cat "$OUT/$name.err" >&2; exit 1
  }
  h1="$(cpu_seconds "$HIST_PID")"; a1="$(cpu_seconds "$ATT_PID")"; n1="$(cpu_seconds "$NATS_PID")"; p1="$(pg_cpu)"
  gen="$(awk '{ printf "%.2f", $1 + $2 }' "$OUT/$name.time")"
  python3 - "$OUT/$name" "$name" "$h0" "$h1" "$a0" "$a1" "$n0" "$n1" "$p0" "$p1" "$gen" <<'PY'
import json, sys
path, name, h0, h1, a0, a1, n0, n1, p0, p1, gen = sys.argv[1:]
line = None
for raw in open(path + ".out"):
    if raw.startswith("BENCH_JSON "):
        line = raw[len("BENCH_JSON "):]
if line is None:
    sys.exit(f"{name}: no result line in {path}.out")
result = json.loads(line)
def parse(snapshot):
    return {p: float(s) for p, _, s in (x.partition("=") for x in snapshot.split()) if s}
before, after = parse(p0), parse(p1)
pg = sum(s - before.get(p, 0.0) for p, s in after.items())
diff = lambda a, b: round(float(b) - float(a), 2) if a and b else None
result.update(name=name, history_cpu_s=diff(h0, h1), attachments_cpu_s=diff(a0, a1),
              nats_cpu_s=diff(n0, n1), pg_cpu_s=round(pg, 2), wrk_cpu_s=float(gen))
json.dump(result, open(path + ".json", "w"))
PY
}

# run_wrk NAME URL SECONDS CONNECTIONS THREADS: a closed loop.
run_wrk() {
  local name="$1" url="$2" secs="$3" conns="$4" threads="$5"
  log "wrk $name: -t$threads -c$conns -d${secs}s"
  BENCH_TOKEN="$TOKEN" measure "$name" timeout $((secs + 30)) \
    wrk -t"$threads" -c"$conns" -d"${secs}s" --timeout 10s --latency -s "$LUA" "$url"
}

# explain SIZE: EXPLAIN (ANALYZE, BUFFERS) of the endpoint's queries (store.rs, in the order the
# handler runs them, with the parameters of the benchmark request; tz UTC, no `before`), in
# explain-SIZE.txt (plan_cache_mode auto, after 6 executions: what a pooled connection runs) and
# explain-SIZE-custom.txt (custom plans); the attachments lookup in explain-SIZE-attachments.txt.
explain() {
  local size="$1" mode file q
  local -A args=(
    [thread_exists]="(:'owner', :'thread')"
    [latest_day_before]="(:'owner', :'thread', NULL, 'UTC')"
    [day_bounds]="(:'day', 'UTC')"
    [messages_between]="(:'owner', :'thread', :'day_from', :'day_to')"
    [has_messages_before]="(:'owner', :'thread', :'day_from')"
    [latest_thread]="(:'owner')"
  )
  local order=(thread_exists latest_day_before day_bounds messages_between has_messages_before latest_thread)
  for mode in auto force_custom_plan; do
    file="$OUT/explain-$size.txt"; [ "$mode" = auto ] || file="$OUT/explain-$size-custom.txt"
    {
      cat <<'SQL'
SET search_path = history;
SET plan_cache_mode = :'mode';
SELECT (max(created_at) AT TIME ZONE 'UTC')::date AS day FROM messages
  WHERE owner = :'owner' AND thread_id = :'thread' \gset
SELECT (:'day'::date::timestamp AT TIME ZONE 'UTC') AS day_from,
       ((:'day'::date + 1)::timestamp AT TIME ZONE 'UTC') AS day_to \gset
PREPARE thread_exists(text, text) AS
  SELECT EXISTS (SELECT 1 FROM threads WHERE owner = $1 AND thread_id = $2);
PREPARE latest_day_before(text, text, date, text) AS
  SELECT (max(created_at) AT TIME ZONE $4)::date FROM messages
  WHERE owner = $1 AND thread_id = $2
    AND ($3::date IS NULL OR created_at < ($3::date::timestamp AT TIME ZONE $4));
PREPARE day_bounds(date, text) AS
  SELECT ($1::date::timestamp AT TIME ZONE $2), (($1::date + 1)::timestamp AT TIME ZONE $2);
PREPARE messages_between(text, text, timestamptz, timestamptz) AS
  SELECT message_id, seq, role, content, metadata, created_at FROM messages
  WHERE owner = $1 AND thread_id = $2 AND created_at >= $3 AND created_at < $4
  ORDER BY seq;
PREPARE has_messages_before(text, text, timestamptz) AS
  SELECT EXISTS (SELECT 1 FROM messages WHERE owner = $1 AND thread_id = $2 AND created_at < $3);
PREPARE latest_thread(text) AS
  SELECT thread_id FROM threads WHERE owner = $1 ORDER BY updated_at DESC LIMIT 1;
\o /dev/null
SQL
      for q in "${order[@]}"; do
        for _ in 1 2 3 4 5 6; do echo "EXECUTE $q${args[$q]};"; done
      done
      echo '\o'
      for q in "${order[@]}"; do
        printf '\\echo %s\n' "'### $q'"
        echo "EXPLAIN (ANALYZE, BUFFERS) EXECUTE $q${args[$q]};"
      done
    } | hsql -v owner="$OWNER" -v thread="$SIGN_THREAD" -v mode="$mode" >"$file"
  done
  {
    cat <<'SQL'
SET search_path = attachments;
PREPARE find_owned(text, text, text) AS
  SELECT id, bucket, object_key, file_name, content_type, size_bytes, declared_sha256, status, expires_at
  FROM files WHERE owner = $1 AND bucket = $2 AND object_key = $3;
\o /dev/null
SQL
    for _ in 1 2 3 4 5 6; do echo "EXECUTE find_owned(:'owner', :'bucket', :'key');"; done
    echo '\o'
    printf '\\echo %s\n' "'### find_owned (attachments, once per URL)'"
    echo "EXPLAIN (ANALYZE, BUFFERS) EXECUTE find_owned(:'owner', :'bucket', :'key');"
  } | asql -v owner="$OWNER" -v bucket="$BUCKET" \
      -v key="uploads/bench-owner/$(printf 'a%031x' 7 | sed -E 's/(.{8})(.{4})(.{4})(.{4})(.{12})/\1-\2-\3-\4-\5/')/quarterly-report-7.pdf" \
      >"$OUT/explain-$size-attachments.txt"
}

# ---------------------------------------------------------------- the steps
echo "size,load_s,vacuum_s" >"$OUT/steps.csv"
MEASURED=()
SKIPPED=()
prev=0
for size in "${SIZES[@]}"; do
  # Room for the new rows: ~1.2 kB a message (heap, indexes, WAL until the next checkpoint).
  need=$(((size - prev) * 1200 / 1000000000 + MIN_FREE_GB))
  free=$(($(df --output=avail -B1 "$DATA" | tail -1) / 1000000000))
  if ((free < need)); then
    log "skipping $size messages and larger: $free GB free, $need GB wanted"
    SKIPPED=("${SIZES[@]:${#MEASURED[@]}}")
    break
  fi
  log "growing the history database to $size messages ($((size - prev)) new; $free GB free)"
  t0="$(wall)"
  if ((prev == 0)); then
    hsql -c "SET session_replication_role = replica" -c "SET bench.bucket = '$BUCKET'" \
      -c "SELECT bench.load_first($((size - BENCH_ROWS)), $PER_THREAD, $THREADS_PER_OWNER, '$SIGN_THREAD', '$NOSIGN_THREAD')" >/dev/null
  else
    # Foreign-key triggers are off while loading (session_replication_role = replica): every
    # message's thread row is written by the same call, just before.
    for ((first = prev - BENCH_ROWS + 1; first <= size - BENCH_ROWS; first += CHUNK)); do
      last=$((first + CHUNK - 1)); ((last <= size - BENCH_ROWS)) || last=$((size - BENCH_ROWS))
      hsql -c "SET session_replication_role = replica" \
        -c "SELECT bench.load_filler($first, $last, $PER_THREAD, $THREADS_PER_OWNER)" >/dev/null
      log "  filler messages up to $last ($(secs_since "$t0") s)"
    done
  fi
  load_s="$(secs_since "$t0")"
  t0="$(wall)"
  hsql -c "VACUUM (ANALYZE) history.threads" -c "VACUUM (ANALYZE) history.messages" >/dev/null
  vacuum_s="$(secs_since "$t0")"
  echo "$size,$load_s,$vacuum_s" >>"$OUT/steps.csv"
  hsql -F, -c "SELECT (SELECT count(*) FROM history.messages), (SELECT count(*) FROM history.threads),
      (SELECT count(DISTINCT owner) FROM history.threads),
      pg_relation_size('history.messages'), pg_indexes_size('history.messages'),
      pg_total_relation_size('history.threads')" >"$OUT/rows-$size.csv"
  hsql -F, -c "SELECT indexrelid::regclass, pg_relation_size(indexrelid) FROM pg_index
      WHERE indrelid = 'history.messages'::regclass ORDER BY 1::text" >"$OUT/indexes-$size.csv"
  [ "$(cut -d, -f1 "$OUT/rows-$size.csv")" = "$size" ] || die "the database holds $(cut -d, -f1 "$OUT/rows-$size.csv") messages, not $size"
  log "loaded in $load_s s, VACUUM ANALYZE in $vacuum_s s: $(cat "$OUT/rows-$size.csv") (messages, threads, owners, heap bytes, index bytes, threads bytes)"

  check_snapshot "snapshot-$size" "$SIGN_URL" 50
  check_snapshot "snapshot-$size-nosign" "$NOSIGN_URL" 0
  explain "$size"
  run_wrk "warmup-$size" "$SIGN_URL" "$WARMUP" "$CONNECTIONS" "$THREADS"
  run_wrk "s$size-max" "$SIGN_URL" "$DURATION" "$CONNECTIONS" "$THREADS"
  run_wrk "s$size-c1" "$SIGN_URL" "$FLOOR_DURATION" 1 1
  run_wrk "s$size-nosign-max" "$NOSIGN_URL" "$DURATION" "$CONNECTIONS" "$THREADS"
  run_wrk "s$size-nosign-c1" "$NOSIGN_URL" "$FLOOR_DURATION" 1 1
  check_snapshot "snapshot-$size-after" "$SIGN_URL" 50
  MEASURED+=("$size")
  prev="$size"
done
((${#MEASURED[@]})) || die "nothing measured"

# ---------------------------------------------------------------- report
UNSIGNED="$(grep -c 'not signed' "$OUT/history.log" || true)"
{
  echo "machine: $(nproc) cores, $(free -h | awk '/^Mem:/ { print $2 }') memory, $(lscpu | sed -n 's/^Model name: *//p' | head -1), kernel $(uname -r), load average before the report $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "PostgreSQL $(hsql -c 'SHOW server_version' | cut -d' ' -f1): shared_buffers $(hsql -c 'SHOW shared_buffers'), work_mem $(hsql -c 'SHOW work_mem'), random_page_cost $(hsql -c 'SHOW random_page_cost')"
  echo "settings: wrk -t$THREADS -c$CONNECTIONS -d${DURATION}s (and -t1 -c1 -d${FLOOR_DURATION}s) after a ${WARMUP}s warm-up; $PER_THREAD messages a thread, $THREADS_PER_OWNER threads an owner; attachments database: 50 files of the owner + $ATTACHMENT_FILES of others; databases $HDB, $ADB; NATS prefix $PREFIX"
  echo "raw results in $OUT"
  echo "answer: $(stat -c %s "$OUT/snapshot-${MEASURED[0]}.json") bytes (200 messages, 50 signed URLs); without attachments $(stat -c %s "$OUT/snapshot-${MEASURED[0]}-nosign.json") bytes"
  ((${#SKIPPED[@]} == 0)) || echo "SKIPPED for lack of disk space: ${SKIPPED[*]}"
  echo
  python3 - "$OUT" "$UNSIGNED" "$CONNECTIONS" "${MEASURED[@]}" <<'PY'
import csv, json, os, re, sys
out, unsigned, conns, sizes = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
load = lambda n: json.load(open(os.path.join(out, n + ".json")))
steps = {r["size"]: r for r in csv.DictReader(open(os.path.join(out, "steps.csv")))}
def human(n):
    n = int(n)
    return f"{n // 1000000}M" if n >= 1000000 and n % 1000000 == 0 else (f"{n // 1000}k" if n % 1000 == 0 else str(n))
gb = lambda b: f"{int(b) / 2**30:.2f}" if int(b) >= 2**30 else f"{int(b) / 2**20:.0f} MiB"

print("Database after each step (sizes on disk; GiB unless marked):")
print()
print("| messages | threads | owners | messages heap | messages indexes | threads table+indexes | load (s) | VACUUM ANALYZE (s) |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|")
for s in sizes:
    m, t, o, heap, idx, thr = open(os.path.join(out, f"rows-{s}.csv")).read().strip().split(",")
    print(f"| {human(m)} | {int(t):,} | {int(o):,} | {gb(heap)} | {gb(idx)} | {gb(thr)} | "
          f"{steps[s]['load_s']} | {steps[s]['vacuum_s']} |")
print()

r = {}
for s in sizes:
    for k in ["max", "c1", "nosign-max", "nosign-c1"]:
        v = load(f"s{s}-{k}")
        v["error_count"] = sum(v["errors"].values())
        r[(s, k)] = v
def per_req(v, key):
    x = v.get(key)
    return "n/a" if x is None or not v["requests"] else f"{x * 1000 / v['requests']:.2f}"
base = sizes[0]
for kind, title in [("", "The day snapshot (200 messages, 50 URLs signed by the attachments service over NATS)"),
                    ("nosign-", "Diagnostic: a thread of the same shape without attachments (no signing)")]:
    print(f"{title}:")
    print()
    print("| messages | load | requests | errors | req/s | p50 (ms) | p99 (ms) | p50 / p50 at "
          f"{human(base)} | p99 / p99 at {human(base)} | history CPU ms/req | attachments CPU ms/req "
          "| PostgreSQL CPU ms/req | nats-server CPU ms/req |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k, label in [(kind + "max", None), (kind + "c1", "1 connection")]:
        for s in sizes:
            v, b = r[(s, k)], r[(base, k)]
            load_ = label or f"max, {conns} connections"
            print(f"| {human(s)} | {load_} | {v['requests']} | {v['error_count']} | {v['rps']:.0f} | "
                  f"{v['p50_ms']:.2f} | {v['p99_ms']:.2f} | {v['p50_ms'] / b['p50_ms']:.2f} | "
                  f"{v['p99_ms'] / b['p99_ms']:.2f} | {per_req(v, 'history_cpu_s')} | "
                  f"{per_req(v, 'attachments_cpu_s')} | {per_req(v, 'pg_cpu_s')} | {per_req(v, 'nats_cpu_s')} |")
    print()

# The endpoint's queries per size: plan shape and EXPLAIN ANALYZE time.
def sections(path):
    out_, name = {}, None
    for line in open(path):
        line = line.rstrip("\n")
        if line.startswith("### "):
            name = line[4:]
            out_[name] = []
        elif name:
            out_[name].append(line)
    return out_
plans = {s: sections(os.path.join(out, f"explain-{s}.txt")) for s in sizes}
for s in sizes:
    plans[s].update(sections(os.path.join(out, f"explain-{s}-attachments.txt")))
def summary(lines):
    nodes = [re.sub(r"\s+\(cost=.*", "", l).strip().lstrip("-> ").strip() for l in lines
             if re.search(r"(Scan|Sort|Limit|Result|Aggregate|InitPlan)", l) and "cost=" in l]
    heap = [re.search(r"Heap Fetches: (\d+)", l).group(1) for l in lines if "Heap Fetches" in l]
    t = [re.search(r"Execution Time: ([\d.]+)", l).group(1) for l in lines if "Execution Time" in l]
    buf = [re.search(r"shared hit=(\d+)(?: read=(\d+))?", l) for l in lines if "Buffers: shared" in l]
    hits = sum(int(b.group(1)) + int(b.group(2) or 0) for b in buf[:1]) if buf else 0
    return "; ".join(nodes), ",".join(heap), t[0] if t else "?", hits
print("The endpoint's queries (EXPLAIN (ANALYZE, BUFFERS) EXECUTE after 6 executions, as on a pooled "
      "connection; execution time in ms / buffers of the top node):")
print()
print("| query | plan | heap fetches | " + " | ".join(f"{human(s)}: ms / buffers" for s in sizes) + " |")
print("|---|---|---:|" + "---:|" * len(sizes))
for q in plans[sizes[-1]]:
    nodes, heap, _, _ = summary(plans[sizes[-1]][q])
    cells = []
    for s in sizes:
        _, _, t, hits = summary(plans[s].get(q, []))
        cells.append(f"{t} / {hits}")
    print(f"| {q} | {nodes} | {heap or '-'} | " + " | ".join(cells) + " |")
print()
bad = [f"{s}/{k}" for (s, k), v in r.items() if v["error_count"]]
seq = [q for q, lines in plans[sizes[-1]].items() if any("Seq Scan on messages" in l for l in lines)]
print(f"- Seq Scan on messages at {human(sizes[-1])}: {', '.join(seq) if seq else 'none'}")
print(f"- snapshots served with unsigned URLs (history log, 'not signed'): {unsigned}")
if bad:
    print(f"WARNING: errors in {', '.join(bad)}: the figures of those rows are not valid")
    sys.exit(2)
PY
  echo
  echo "Plans at $(python3 -c 'import sys; print(sys.argv[1])' "${MEASURED[-1]}") messages: $OUT/explain-${MEASURED[-1]}.txt"
} | tee "$OUT/summary.md"
