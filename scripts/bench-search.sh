#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Benchmarks conversation search (GET /api/v1/agent/threads?q=, issue 28) in PostgreSQL alone:
# the query of services/history/src/store/read.rs (`search_threads`), verbatim, over
# BENCH_MESSAGES messages (default 1M) of BENCH_OWNERS owners (10k), 10 threads an owner, in a
# scratch database migrated with migrations/history/*.sql exactly as the service migrates it.
#
# 1. Load: messages in English, Vietnamese and Chinese (no spaces) made from small vocabularies
#    by generate_series (deterministic: the same rows every run), loaded before the search
#    indexes exist; then the indexes of 0008 are built (their build time and size reported),
#    then VACUUM ANALYZE.
# 2. Search latency: pgbench, prepared statements (`-M prepared`, as sqlx runs it: the generic
#    plan a pooled connection settles on), one search of a random owner's own threads a
#    transaction, per query class (an English word, an English phrase, a Vietnamese phrase, a
#    Chinese phrase, two Chinese characters, a word nobody wrote); p50/p99 from pgbench's
#    per-transaction log, at 1 client (unloaded) and at BENCH_CLIENTS clients. EXPLAIN
#    (ANALYZE, BUFFERS) of each class for one owner is saved (explain.txt).
# 3. Write path: pgbench, the per-message transaction of history's insert_message (upsert the
#    thread row, insert the message) and, separately, a streaming append to a message
#    (`content = content || delta`, as every TEXT_MESSAGE_CONTENT does), for BENCH_WRITE_SECONDS
#    each, with the search indexes and again after dropping them (then rebuilt).
#
# Prints a markdown summary (saved as summary.md in BENCH_OUT). Repeat with BENCH_RUNS (3) runs
# of steps 2 and 3 on the same data. Needs the local PostgreSQL of scripts/infra.sh (started if
# down). The scratch database is dropped on exit (BENCH_KEEP_DB=1 keeps it).
#
# Settings (environment): BENCH_MESSAGES (1000000, a multiple of BENCH_OWNERS * 10),
# BENCH_OWNERS (10000), BENCH_CLIENTS (2), BENCH_SECONDS (seconds per search measurement, 15),
# BENCH_WRITE_SECONDS (20), BENCH_RUNS (3), BENCH_OUT (default .data/bench/search-<time>).
# shellcheck source=lib/common.sh
source "$(dirname "$0")/lib/common.sh"
cd "$ROOT" || exit 1

MESSAGES="${BENCH_MESSAGES:-1000000}"
OWNERS="${BENCH_OWNERS:-10000}"
CLIENTS="${BENCH_CLIENTS:-2}"
SECONDS_PER="${BENCH_SECONDS:-15}"
WRITE_SECONDS="${BENCH_WRITE_SECONDS:-20}"
RUNS="${BENCH_RUNS:-3}"
OUT="${BENCH_OUT:-$DATA/bench/search-$(date +%Y%m%dT%H%M%S)}"
THREADS_PER_OWNER=10
((MESSAGES % (OWNERS * THREADS_PER_OWNER) == 0)) || die "BENCH_MESSAGES must be a multiple of BENCH_OWNERS * 10"
PER_THREAD=$((MESSAGES / OWNERS / THREADS_PER_OWNER))
((PER_THREAD >= 2)) || die "at least 2 messages a thread"
mkdir -p "$OUT"

"$ROOT/scripts/infra.sh" >/dev/null
DB="sbbench_search_$(date +%s)_$((RANDOM % 10000))"
cleanup() {
  if [ "${BENCH_KEEP_DB:-0}" = 1 ]; then
    log "kept database $DB"
  else
    pg_admin -c "DROP DATABASE IF EXISTS $DB" >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT
pg_admin -c "CREATE DATABASE $DB OWNER $PG_USER"
URL="$(database_url "$DB")"
# As the service connects: its own role, the history schema alone on the search path.
export PGOPTIONS="-c search_path=history"
sql() { psql -X -q -v ON_ERROR_STOP=1 "$URL" "$@"; }
psql -X -q -v ON_ERROR_STOP=1 "$URL" -c "CREATE SCHEMA history" >/dev/null

log "migrating (0001..0007)"
for migration in migrations/history/*.sql; do
  case "$migration" in *0008_thread_search.sql) continue ;; esac
  sql -f "$migration" >/dev/null
done

# ---------------------------------------------------------------- 1. load
log "loading $MESSAGES messages of $OWNERS owners ($PER_THREAD a thread)"
start=$(date +%s.%N)
sql -v owners="$OWNERS" -v per_thread="$PER_THREAD" -v threads="$THREADS_PER_OWNER" <<'SQL'
SET synchronous_commit = off;
INSERT INTO threads (owner, thread_id, last_seq, created_at, updated_at)
SELECT 'owner-' || o, 't-' || o || '-' || t, :per_thread,
       timestamptz '2026-01-01' + (o * 7 + t) * interval '1 minute',
       timestamptz '2026-06-01' + (o * 7 + t) * interval '1 minute'
  FROM generate_series(1, :owners) o, generate_series(1, :threads) t;
-- Text from three small vocabularies, chosen by a hash of the row: a third English, a third
-- Vietnamese, a third Chinese (characters, no spaces); 8 to 40 words (characters: 8 to 40).
CREATE TEMP TABLE vocab AS SELECT
  string_to_array('the a to of and in is it you that for on with as this be at by not are from or have an they which one had word but what some we can out other were all there when up use your how said each she do time if will way about many then them write would like so these her long make thing see him two has look more day could go come did number sound no most people my over know water than call first who may down side been now find any new work part take get place made live where after back little only round man year came show every good me give our under name very through just form sentence great think say help low line differ turn cause much mean before move right boy old too same tell does set three want air well also play small end put home read hand port large spell add even land here must big high such follow act why ask men change went light kind off need house picture try us again animal point mother world near build self earth father weather beijing report calendar meeting schedule analysis file upload', ' ') AS en,
  string_to_array('tôi bạn phân tích file này cho của và là có không được một những các người trong với đã để khi thì này đó làm gì sao như thế nào tài liệu kết quả báo cáo hôm nay thời tiết hà nội lịch họp tạo xong giúp xem ảnh hình nội dung đây', ' ') AS vi,
  string_to_array('帮我查一下北京今天的天气怎么样这张图片里内容是什么创建个日程好的来您会议成功分析文件结果报告上海明天下雨温度多少时间地点人们工作学习', NULL) AS zh;
INSERT INTO messages (id, owner, thread_id, seq, task_id, message_id, role, content, metadata, created_at)
SELECT gen_random_uuid(), 'owner-' || o, 't-' || o || '-' || t, s, gen_random_uuid(),
       'm-' || o || '-' || t || '-' || s,
       CASE WHEN s % 2 = 1 THEN 'user' ELSE 'assistant' END,
       (SELECT CASE lang
                 WHEN 0 THEN string_agg(v.en[1 + (hashint8(n * 1000003 + k) & 2147483647) % array_length(v.en, 1)], ' ')
                 WHEN 1 THEN string_agg(v.vi[1 + (hashint8(n * 1000003 + k) & 2147483647) % array_length(v.vi, 1)], ' ')
                 ELSE string_agg(v.zh[1 + (hashint8(n * 1000003 + k) & 2147483647) % array_length(v.zh, 1)], '')
               END
          FROM vocab v, generate_series(1, 8 + (hashint8(n) & 2147483647) % 33) k),
       '{}'::jsonb,
       timestamptz '2026-01-01' + (o * 7 + t) * interval '1 minute' + s * interval '1 hour'
  FROM generate_series(1, :owners) o, generate_series(1, :threads) t,
       generate_series(1, :per_thread) s,
       LATERAL (SELECT ((o::bigint * 1000 + t) * 1000 + s) AS n) id,
       LATERAL (SELECT (hashint8(id.n + 7) & 2147483647) % 3 AS lang) l;
SQL
load_s=$(echo "$(date +%s.%N) - $start" | bc)
log "loaded in ${load_s}s; migrating 0008 (titles backfilled, search indexes built)"
start=$(date +%s.%N)
sql -c "SET maintenance_work_mem = '256MB'" -f migrations/history/0008_thread_search.sql >/dev/null
index_s=$(echo "$(date +%s.%N) - $start" | bc)
sql -c "VACUUM ANALYZE" >/dev/null
sizes=$(sql -tA -F ' | ' -c "SELECT relname, pg_size_pretty(pg_relation_size(oid)) FROM pg_class
  WHERE relname IN ('messages', 'messages_search_words_idx', 'messages_search_trigrams_idx', 'messages_thread_time_idx') ORDER BY relname")
titled=$(sql -tA -c "SELECT count(*) FILTER (WHERE title IS NOT NULL) || ' of ' || count(*) FROM threads")

# ---------------------------------------------------------------- 2. search
# The query of store::search_threads, verbatim but for its parameters: $1 owner, $2 the query,
# $3 the loose pattern (%term%term%), $4 the phrase pattern (%query%), LIMIT 21 OFFSET 0.
SEARCH_SQL="WITH hits AS (
             SELECT m.thread_id, m.message_id, m.seq, m.created_at,
                    (CASE WHEN left(m.content, 10000) ILIKE \$4 THEN 1 ELSE 0 END
                     + ts_rank_cd(to_tsvector('simple', left(m.content, 10000)),
                                  plainto_tsquery('simple', \$2)))::float8 AS rank
               FROM messages m
              WHERE m.owner = \$1 AND m.role <> 'tool'
                AND (to_tsvector('simple', left(m.content, 10000)) @@ plainto_tsquery('simple', \$2)
                     OR left(m.content, 10000) ILIKE \$3)
           ), best AS (
             SELECT DISTINCT ON (thread_id) thread_id, message_id, seq, created_at, rank
               FROM hits
              ORDER BY thread_id, rank DESC, seq DESC
           ), page AS (
             SELECT b.thread_id, t.title, t.updated_at, b.message_id, b.created_at, b.seq, b.rank
               FROM best b
               JOIN threads t ON t.owner = \$1 AND t.thread_id = b.thread_id
              ORDER BY b.rank DESC, t.updated_at DESC, b.thread_id
              LIMIT 21 OFFSET 0
           )
           SELECT p.thread_id, p.title, p.updated_at, p.message_id, p.created_at,
                  left(m.content, 10000)
             FROM page p
             JOIN messages m ON m.owner = \$1 AND m.thread_id = p.thread_id AND m.seq = p.seq
            ORDER BY p.rank DESC, p.updated_at DESC, p.thread_id"
# store::search_threads_short: a query without a term of three characters (no trigram).
SHORT_SQL="$(sed "s/OR left(m.content, 10000) ILIKE/OR (left(m.content, 10000) || '') ILIKE/" <<<"$SEARCH_SQL")"
[ "$SHORT_SQL" != "$SEARCH_SQL" ] || die "the short form of the search query was not made"
# name|query: a class of queries; the short form for one whose terms are all under 3 characters.
CLASSES=("english-word|weather" "english-phrase|how many people" "vietnamese-phrase|phân tích" \
  "chinese-phrase|北京今天" "chinese-2-chars|天气" "absent|zyzzyva")
# query_sql Q: the statement history runs for Q (SearchQuery::has_trigram picks it).
query_sql() {
  if python3 -c 'import re, sys; sys.exit(0 if any(len(t) >= 3 for t in re.split(r"[\W_]+", sys.argv[1])) else 1)' "$1"; then
    printf '%s' "$SEARCH_SQL"
  else
    printf '%s' "$SHORT_SQL"
  fi
}

# pgbench script of one class: a random owner, the class's query and its patterns (made as
# SearchQuery::parse makes them: terms split on spaces, joined by %) as bind parameters of the
# prepared statement (\gset variables are), as sqlx binds them.
script_for() {
  local q="$1" file="$2"
  {
    echo "\\set o random(1, $OWNERS)"
    echo "SELECT 'owner-' || :o AS owner, '$q' AS q, '%${q// /%}%' AS loose, '%$q%' AS phrase \\gset"
    # One statement on one line, as pgbench reads it.
    printf '%s\n' "$(sed -e 's/\$1/:owner/g' -e 's/\$2/:q/g' -e 's/\$3/:loose/g' -e 's/\$4/:phrase/g' \
      <<<"$(query_sql "$q")" | tr '\n' ' ');"
  } >"$file"
}

# percentile FILE P: the P-th percentile (ms) of the latencies (µs, third field) of pgbench logs.
percentile() {
  cat "$1".* | awk '{print $3}' | sort -n | awk -v p="$2" '{a[NR]=$1} END {i=int(NR*p/100); if (i<1) i=1; printf "%.2f", a[i]/1000}'
}

# EXPLAIN (ANALYZE, BUFFERS) of a class for one owner, prepared and executed 6 times first so the
# plan shown is the one a pooled connection settles on.
explain() {
  local name="$1" q="$2" args i
  args="'owner-4242', '$q', '%${q// /%}%', '%$q%'"
  local cmds=(-c "PREPARE s(text, text, text, text) AS $(query_sql "$q")" -c '\o /dev/null')
  for i in 1 2 3 4 5 6; do cmds+=(-c "EXECUTE s($args)"); done
  cmds+=(-c '\o' -c "EXPLAIN (ANALYZE, BUFFERS) EXECUTE s($args)")
  {
    echo "== $name: q=$q, owner-4242"
    sql "${cmds[@]}"
  } >>"$OUT/explain.txt"
}

# The per-message write transaction of store::insert_message, on new threads of other owners
# (writer-N: what is written never adds results to the searches measured after it).
cat >"$OUT/insert.sql" <<SQL
\\set o random(1, $OWNERS)
\\set n random(1, 1000000000)
BEGIN;
INSERT INTO threads (owner, thread_id, last_seq, created_at, updated_at, title) VALUES ('writer-' || :o, 'w-' || :client_id || '-' || :n, 1, now(), now(), 'bench') ON CONFLICT (owner, thread_id) DO UPDATE SET last_seq = threads.last_seq + 1, updated_at = GREATEST(threads.updated_at, EXCLUDED.updated_at), title = COALESCE(threads.title, EXCLUDED.title) RETURNING last_seq;
INSERT INTO messages (id, owner, thread_id, seq, task_id, message_id, role, content, metadata, created_at) VALUES (gen_random_uuid(), 'writer-' || :o, 'w-' || :client_id || '-' || :n, 1, gen_random_uuid(), 'w-' || :n, 'user', 'Phân tích file này cho tôi: how many people live in 北京 and what is the weather like today, please write a report ' || :n, '{}', now());
END;
SQL
# A streaming delta appended to an assistant message of a random thread (one of the loaded rows).
cat >"$OUT/append.sql" <<SQL
\\set o random(1, $OWNERS)
\\set t random(1, $THREADS_PER_OWNER)
UPDATE messages SET content = content || ' more words of a reply' WHERE owner = 'owner-' || :o AND thread_id = 't-' || :o || '-' || :t AND seq = 2;
SQL

# ---------------------------------------------------------------- runs
RESULTS="$OUT/results.tsv"
printf 'run\tmeasure\tclients\tp50_ms\tp99_ms\ttps\n' >"$RESULTS"
for name_q in "${CLASSES[@]}"; do explain "${name_q%%|*}" "${name_q#*|}"; done
for run in $(seq "$RUNS"); do
  for name_q in "${CLASSES[@]}"; do
    name="${name_q%%|*}" q="${name_q#*|}"
    script_for "$q" "$OUT/search-$name.sql"
    for c in 1 "$CLIENTS"; do
      log "run $run: search $name, $c client(s), ${SECONDS_PER}s"
      rm -f "$OUT"/log.*
      tps=$(pgbench -n -M prepared -c "$c" -j "$c" -T "$SECONDS_PER" -l --log-prefix="$OUT/log" \
        -f "$OUT/search-$name.sql" "$URL" 2>>"$OUT/pgbench.err" | awk '/^tps/ {print $3; exit}')
      printf '%s\tsearch %s\t%s\t%s\t%s\t%s\n' "$run" "$name" "$c" "$(percentile "$OUT/log" 50)" \
        "$(percentile "$OUT/log" 99)" "$tps" >>"$RESULTS"
    done
  done
  for indexes in with without; do
    if [ "$indexes" = without ]; then
      sql -c "DROP INDEX messages_search_words_idx, messages_search_trigrams_idx" >/dev/null
    fi
    for kind in insert append; do
      log "run $run: $kind, $CLIENTS clients, ${WRITE_SECONDS}s, $indexes the search indexes"
      rm -f "$OUT"/log.*
      tps=$(pgbench -n -M prepared -c "$CLIENTS" -j "$CLIENTS" -T "$WRITE_SECONDS" -l --log-prefix="$OUT/log" \
        -f "$OUT/$kind.sql" "$URL" 2>>"$OUT/pgbench.err" | awk '/^tps/ {print $3; exit}')
      printf '%s\t%s %s indexes\t%s\t%s\t%s\t%s\n' "$run" "$kind" "$indexes" "$CLIENTS" \
        "$(percentile "$OUT/log" 50)" "$(percentile "$OUT/log" 99)" "$tps" >>"$RESULTS"
    done
    if [ "$indexes" = without ]; then
      log "rebuilding the search indexes"
      sql -c "SET maintenance_work_mem = '256MB'" \
        -c "CREATE INDEX messages_search_words_idx ON messages USING gin (owner, to_tsvector('simple', left(content, 10000))) WHERE role <> 'tool'" \
        -c "CREATE INDEX messages_search_trigrams_idx ON messages USING gin (owner, left(content, 10000) gin_trgm_ops) WHERE role <> 'tool'" \
        -c "VACUUM ANALYZE messages" >/dev/null
    fi
  done
done
rm -f "$OUT"/log.*

{
  echo "## search benchmark, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "$MESSAGES messages, $OWNERS owners, $PER_THREAD a thread; load ${load_s}s, migration 0008 (backfill + indexes) ${index_s}s; titled threads: $titled"
  echo
  echo "$sizes"
  echo
  echo "| measure | clients | p50 ms (runs) | p99 ms (runs) | tps (runs) |"
  echo "|---|---:|---|---|---|"
  awk -F'\t' 'NR > 1 {k = $2 "\t" $3; if (!(k in p50)) order[++n] = k; p50[k] = p50[k] (p50[k] ? " / " : "") $4; p99[k] = p99[k] (p99[k] ? " / " : "") $5; tps[k] = tps[k] (tps[k] ? " / " : "") int($6)}
    END {for (i = 1; i <= n; i++) {split(order[i], f, "\t"); printf "| %s | %s | %s | %s | %s |\n", f[1], f[2], p50[order[i]], p99[order[i]], tps[order[i]]}}' "$RESULTS"
} | tee "$OUT/summary.md"
log "results in $OUT"
