//! The reads of the history endpoints.

use chrono::{DateTime, NaiveDate, Utc};
use protocol::metadata::{AgentChatMessageMetadata as Metadata, StoredToolCall, keys};
use serde_json::Value;
use sqlx::PgPool;
use sqlx::types::Json;
use uuid::Uuid;

use super::Role;

/// `seq` of the last event of `task_id` whose changes are committed, if history knows the run.
pub(crate) async fn written_seq(pool: &PgPool, task_id: Uuid) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar!(
        "SELECT last_event_seq FROM run_progress WHERE task_id = $1",
        task_id
    )
    .fetch_optional(pool)
    .await
}

/// A run as `run_progress` keeps it.
#[derive(Debug)]
pub(crate) struct RunRow {
    pub(crate) task_id: Uuid,
    pub(crate) thread_id: String,
    pub(crate) accepted_at: DateTime<Utc>,
    pub(crate) status: String,
    pub(crate) runs_seq: Option<i64>,
    pub(crate) error: Option<String>,
}

/// The owner's latest run with this run id (`run_progress_owner_run_idx`).
pub(crate) async fn latest_run(
    pool: &PgPool,
    owner: &str,
    run_id: &str,
) -> sqlx::Result<Option<RunRow>> {
    sqlx::query_as!(
        RunRow,
        "SELECT task_id, thread_id, accepted_at, status, runs_seq, error FROM run_progress
         WHERE owner = $1 AND run_id = $2 ORDER BY accepted_at DESC LIMIT 1",
        owner,
        run_id
    )
    .fetch_optional(pool)
    .await
}

/// A stored message, as the history endpoints read it.
#[derive(Debug)]
pub(crate) struct MessageRow {
    pub(crate) message_id: String,
    pub(crate) seq: i64,
    pub(crate) role: Role,
    pub(crate) content: String,
    pub(crate) metadata: Metadata,
    pub(crate) created_at: DateTime<Utc>,
}

/// The caller's most recently active thread.
pub(crate) async fn latest_thread(pool: &PgPool, owner: &str) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!(
        "SELECT thread_id FROM threads WHERE owner = $1 ORDER BY updated_at DESC LIMIT 1",
        owner
    )
    .fetch_optional(pool)
    .await
}

/// Whether the caller has a thread with this id.
pub(crate) async fn thread_exists(
    pool: &PgPool,
    owner: &str,
    thread_id: &str,
) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM threads WHERE owner = $1 AND thread_id = $2) AS "exists!""#,
        owner,
        thread_id
    )
    .fetch_one(pool)
    .await
}

/// The latest day (in time zone `tz`) with a message strictly before the day `before`, if any.
pub(crate) async fn latest_day_before(
    pool: &PgPool,
    owner: &str,
    thread_id: &str,
    before: Option<NaiveDate>,
    tz: &str,
) -> sqlx::Result<Option<NaiveDate>> {
    // One index entry, read backwards from the bound: the bound is part of the index
    // condition (an `IS NULL OR` would only be a filter over every newer message).
    sqlx::query_scalar!(
        r#"SELECT (created_at AT TIME ZONE $4)::date AS "day!" FROM messages
         WHERE owner = $1 AND thread_id = $2
           AND created_at < COALESCE($3::date::timestamp AT TIME ZONE $4, 'infinity')
         ORDER BY created_at DESC
         LIMIT 1"#,
        owner,
        thread_id,
        before,
        tz
    )
    .fetch_optional(pool)
    .await
}

/// The instants a day starts and ends at in a time zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DayBounds {
    /// Its first instant.
    pub(crate) starts: DateTime<Utc>,
    /// The first instant of the next day.
    pub(crate) ends: DateTime<Utc>,
}

/// The instants `day` starts and ends at in time zone `tz`.
pub(crate) async fn day_bounds(pool: &PgPool, day: NaiveDate, tz: &str) -> sqlx::Result<DayBounds> {
    sqlx::query_as!(
        DayBounds,
        r#"SELECT ($1::date::timestamp AT TIME ZONE $2) AS "starts!",
                  (($1::date + 1)::timestamp AT TIME ZONE $2) AS "ends!""#,
        day,
        tz
    )
    .fetch_one(pool)
    .await
}

/// Every time zone name PostgreSQL knows (loaded once at start).
pub(crate) async fn time_zone_names(pool: &PgPool) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(r#"SELECT name AS "name!" FROM pg_timezone_names"#)
        .fetch_all(pool)
        .await
}

/// Where a page of a day is read: the thread's messages written in `[from, to)` with a `seq`
/// below `below`, the newest first.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DayWindow<'a> {
    pub(crate) owner: &'a str,
    pub(crate) thread_id: &'a str,
    pub(crate) from: DateTime<Utc>,
    pub(crate) to: DateTime<Utc>,
    pub(crate) below: i64,
}

/// A page of a day as read: its rows in `seq` order, and how many the window held up to the
/// row limit (more than the rows: the byte bound stopped the page).
#[derive(Debug)]
pub(crate) struct DayPage {
    pub(crate) rows: Vec<MessageRow>,
    pub(crate) fetched: i64,
}

/// A row of [`day_page`]: the message and the window's count.
struct DayPageRow {
    message_id: String,
    seq: i64,
    role: Role,
    content: String,
    metadata: Json<Metadata>,
    created_at: DateTime<Utc>,
    fetched: i64,
}

/// The newest messages of `window`, at most `limit` of them and, past the first (newest), at
/// most `max_bytes` of text and metadata (`octet_length`: the database measures, without
/// detoasting, and sends only the rows kept), returned in `seq` order.
pub(crate) async fn day_page(
    pool: &PgPool,
    window: DayWindow<'_>,
    limit: i64,
    max_bytes: i64,
) -> sqlx::Result<DayPage> {
    let rows = sqlx::query_as!(
        DayPageRow,
        r#"WITH newest AS (
             SELECT message_id, seq, role, content, metadata, created_at,
                    octet_length(content)::bigint + octet_length(metadata::text) AS size
               FROM messages
              WHERE owner = $1 AND thread_id = $2 AND created_at >= $3 AND created_at < $4
                AND seq < $5
              ORDER BY seq DESC
              LIMIT $6
           ), sized AS (
             SELECT message_id, seq, role, content, metadata, created_at,
                    sum(size) OVER (ORDER BY seq DESC ROWS UNBOUNDED PRECEDING) AS upto,
                    row_number() OVER (ORDER BY seq DESC) AS nth,
                    count(*) OVER () AS fetched
               FROM newest
           )
           SELECT message_id AS "message_id!", seq AS "seq!", role AS "role!: Role",
                  content AS "content!", metadata AS "metadata!: Json<Metadata>",
                  created_at AS "created_at!",
                  fetched AS "fetched!"
             FROM sized
            WHERE nth = 1 OR upto <= $7::bigint
            ORDER BY seq"#,
        window.owner,
        window.thread_id,
        window.from,
        window.to,
        window.below,
        limit,
        max_bytes
    )
    .fetch_all(pool)
    .await?;
    let fetched = rows.first().map_or(0, |r| r.fetched);
    let rows = rows
        .into_iter()
        .map(|r| MessageRow {
            message_id: r.message_id,
            seq: r.seq,
            role: r.role,
            content: r.content,
            metadata: r.metadata.0,
            created_at: r.created_at,
        })
        .collect();
    Ok(DayPage { rows, fetched })
}

/// Whether any message was written before `at`.
pub(crate) async fn has_messages_before(
    pool: &PgPool,
    owner: &str,
    thread_id: &str,
    at: DateTime<Utc>,
) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (
             SELECT 1 FROM messages WHERE owner = $1 AND thread_id = $2 AND created_at < $3
           ) AS "exists!""#,
        owner,
        thread_id,
        at
    )
    .fetch_one(pool)
    .await
}

/// A thread in the caller's list.
#[derive(Debug)]
pub(crate) struct ThreadRow {
    pub(crate) thread_id: String,
    pub(crate) title: Option<String>,
    pub(crate) last_seq: i64,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
}

/// Where a page of threads starts: strictly after the thread last shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ThreadCursor {
    /// The last shown thread's `updated_at`.
    pub(crate) updated_at: DateTime<Utc>,
    /// Its id (the tie-breaker).
    pub(crate) thread_id: String,
}

/// The owner's threads, most recently active first, strictly after the cursor when one is
/// given (keyset pagination: stable under inserts).
pub(crate) async fn threads(
    pool: &PgPool,
    owner: &str,
    after: Option<&ThreadCursor>,
    limit: i64,
) -> sqlx::Result<Vec<ThreadRow>> {
    sqlx::query_as!(
        ThreadRow,
        "SELECT thread_id, title, last_seq, created_at, updated_at FROM threads
         WHERE owner = $1 AND ($2::timestamptz IS NULL OR (updated_at, thread_id) < ($2, $3))
         ORDER BY updated_at DESC, thread_id DESC
         LIMIT $4",
        owner,
        after.map(|c| c.updated_at),
        after.map(|c| c.thread_id.as_str()),
        limit
    )
    .fetch_all(pool)
    .await
}

/// Gives the owner's thread `title`; the thread as the list shows it, `None` when the owner
/// has no such thread. The thread's `updated_at` stays: it says when it was last written to.
pub(crate) async fn rename_thread(
    pool: &PgPool,
    owner: &str,
    thread_id: &str,
    title: &str,
) -> sqlx::Result<Option<ThreadRow>> {
    sqlx::query_as!(
        ThreadRow,
        "UPDATE threads SET title = $3 WHERE owner = $1 AND thread_id = $2
         RETURNING thread_id, title, last_seq, created_at, updated_at",
        owner,
        thread_id,
        title
    )
    .fetch_optional(pool)
    .await
}

/// What a search looks for, as [`crate::search::SearchQuery`] makes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SearchTerms<'a> {
    /// The query as typed (trimmed): its words, as a full-text query.
    pub(crate) words: &'a str,
    /// `ILIKE` pattern of its terms in order, anything between (`%term%term%`).
    pub(crate) loose: &'a str,
    /// `ILIKE` pattern of the whole query (`%query%`): a match ranks first.
    pub(crate) phrase: &'a str,
}

/// A thread found by a search, with its best matching message.
#[derive(Debug)]
pub(crate) struct SearchHit {
    pub(crate) thread_id: String,
    pub(crate) title: Option<String>,
    pub(crate) updated_at: DateTime<Utc>,
    pub(crate) message_id: String,
    pub(crate) created_at: DateTime<Utc>,
    /// The searched part of the message (its first 10 000 characters).
    pub(crate) text: String,
}

/// The owner's threads with a message (not a tool result) that matches, best first: a message
/// holding the whole query, then by full-text rank, then the most recently active thread; each
/// with its best message (the latest among equals). `limit` of them after the first `offset`.
///
/// Both conditions are served by the owner-first GIN indexes of migration 0008 (the same
/// `left(content, 10000)` expression and `role <> 'tool'` predicate), so only the caller's own
/// entries are read.
pub(crate) async fn search_threads(
    pool: &PgPool,
    owner: &str,
    terms: SearchTerms<'_>,
    limit: i64,
    offset: i64,
) -> sqlx::Result<Vec<SearchHit>> {
    sqlx::query_as!(
        SearchHit,
        r#"WITH hits AS (
             SELECT m.thread_id, m.message_id, m.seq, m.created_at,
                    (CASE WHEN left(m.content, 10000) ILIKE $4 THEN 1 ELSE 0 END
                     + ts_rank_cd(to_tsvector('simple', left(m.content, 10000)),
                                  plainto_tsquery('simple', $2)))::float8 AS rank
               FROM messages m
              WHERE m.owner = $1 AND m.role <> 'tool'
                AND (to_tsvector('simple', left(m.content, 10000)) @@ plainto_tsquery('simple', $2)
                     OR left(m.content, 10000) ILIKE $3)
           ), best AS (
             SELECT DISTINCT ON (thread_id) thread_id, message_id, seq, created_at, rank
               FROM hits
              ORDER BY thread_id, rank DESC, seq DESC
           ), page AS (
             SELECT b.thread_id, t.title, t.updated_at, b.message_id, b.created_at, b.seq, b.rank
               FROM best b
               JOIN threads t ON t.owner = $1 AND t.thread_id = b.thread_id
              ORDER BY b.rank DESC, t.updated_at DESC, b.thread_id
              LIMIT $5 OFFSET $6
           )
           -- The text only of the page's messages.
           SELECT p.thread_id AS "thread_id!", p.title, p.updated_at AS "updated_at!",
                  p.message_id AS "message_id!", p.created_at AS "created_at!",
                  left(m.content, 10000) AS "text!"
             FROM page p
             JOIN messages m ON m.owner = $1 AND m.thread_id = p.thread_id AND m.seq = p.seq
            ORDER BY p.rank DESC, p.updated_at DESC, p.thread_id"#,
        owner,
        terms.words,
        terms.loose,
        terms.phrase,
        limit,
        offset
    )
    .fetch_all(pool)
    .await
}

/// [`search_threads`] for a query none of whose terms has three characters (`天气`, `ok`): its
/// pattern has no trigram, and a GIN scan whose only key on a column matches everything reads
/// every entry of that column (the whole trigram index, every owner's), so the pattern is not
/// the indexed expression here (`|| ''`): it filters the owner's messages, read through an
/// owner-first index, instead.
pub(crate) async fn search_threads_short(
    pool: &PgPool,
    owner: &str,
    terms: SearchTerms<'_>,
    limit: i64,
    offset: i64,
) -> sqlx::Result<Vec<SearchHit>> {
    sqlx::query_as!(
        SearchHit,
        r#"WITH hits AS (
             SELECT m.thread_id, m.message_id, m.seq, m.created_at,
                    (CASE WHEN left(m.content, 10000) ILIKE $4 THEN 1 ELSE 0 END
                     + ts_rank_cd(to_tsvector('simple', left(m.content, 10000)),
                                  plainto_tsquery('simple', $2)))::float8 AS rank
               FROM messages m
              WHERE m.owner = $1 AND m.role <> 'tool'
                AND (to_tsvector('simple', left(m.content, 10000)) @@ plainto_tsquery('simple', $2)
                     OR (left(m.content, 10000) || '') ILIKE $3)
           ), best AS (
             SELECT DISTINCT ON (thread_id) thread_id, message_id, seq, created_at, rank
               FROM hits
              ORDER BY thread_id, rank DESC, seq DESC
           ), page AS (
             SELECT b.thread_id, t.title, t.updated_at, b.message_id, b.created_at, b.seq, b.rank
               FROM best b
               JOIN threads t ON t.owner = $1 AND t.thread_id = b.thread_id
              ORDER BY b.rank DESC, t.updated_at DESC, b.thread_id
              LIMIT $5 OFFSET $6
           )
           -- The text only of the page's messages.
           SELECT p.thread_id AS "thread_id!", p.title, p.updated_at AS "updated_at!",
                  p.message_id AS "message_id!", p.created_at AS "created_at!",
                  left(m.content, 10000) AS "text!"
             FROM page p
             JOIN messages m ON m.owner = $1 AND m.thread_id = p.thread_id AND m.seq = p.seq
            ORDER BY p.rank DESC, p.updated_at DESC, p.thread_id"#,
        owner,
        terms.words,
        terms.loose,
        terms.phrase,
        limit,
        offset
    )
    .fetch_all(pool)
    .await
}

/// A run of a thread that has not ended in history's view, and how far its events are written.
#[derive(Debug)]
pub(crate) struct UnendedRun {
    pub(crate) task_id: Uuid,
    pub(crate) last_event_seq: i64,
}

/// The runs of the thread accepted before the run `task_id` (RUNS stream sequence below
/// `runs_seq`, or not recorded) that have not ended in history's view
/// (`run_progress_thread_unended_idx`).
pub(crate) async fn unended_runs_before(
    pool: &PgPool,
    owner: &str,
    thread_id: &str,
    task_id: Uuid,
    runs_seq: i64,
) -> sqlx::Result<Vec<UnendedRun>> {
    sqlx::query_as!(
        UnendedRun,
        "SELECT task_id, last_event_seq FROM run_progress
         WHERE owner = $1 AND thread_id = $2 AND status IN ('queued', 'running')
           AND task_id <> $3 AND (runs_seq IS NULL OR runs_seq < $4)",
        owner,
        thread_id,
        task_id,
        runs_seq
    )
    .fetch_all(pool)
    .await
}

/// A stored message with what its AG-UI form needs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AguiRow {
    pub(crate) message_id: String,
    pub(crate) role: Role,
    pub(crate) content: String,
    pub(crate) metadata: Metadata,
    /// A user message as its run's input carried it (`None`: written before migration 0006).
    pub(crate) agui: Option<Value>,
    /// An assistant message's tool calls from `tool_calls`, in call order; `None` when the
    /// run's events made none.
    pub(crate) tool_calls: Option<Vec<StoredToolCall>>,
}

/// A row of [`messages_before_run`]: its tool calls as `[id, name, arguments]` arrays.
struct AguiRecord {
    message_id: String,
    role: Role,
    content: String,
    metadata: Json<Metadata>,
    agui: Option<Value>,
    tool_calls: Option<Json<Vec<(String, String, String)>>>,
}

/// The thread's most recent `limit` messages before the run `task_id`, newest first: none of
/// its own, none superseded by a regenerated reply, none of a run accepted after it (RUNS stream sequence past `runs_seq`, or past
/// `task_id`'s own when history holds that run; a task id of no run leaves out nothing more).
pub(crate) async fn messages_before_run(
    pool: &PgPool,
    owner: &str,
    thread_id: &str,
    task_id: Uuid,
    runs_seq: i64,
    limit: i64,
) -> sqlx::Result<Vec<AguiRow>> {
    // Read backwards on messages_thread_seq_key; the tool calls only for the rows returned.
    let records = sqlx::query_as!(
        AguiRecord,
        r#"SELECT m.message_id, m.role AS "role: Role", m.content,
                  m.metadata AS "metadata: Json<Metadata>", m.agui,
                  (SELECT jsonb_agg(jsonb_build_array(c.tool_call_id, c.name, c.arguments)
                                    ORDER BY c.started_seq)
                     FROM tool_calls c
                    WHERE m.role = 'assistant' AND c.task_id = m.task_id
                      AND c.message_id = m.message_id)
                    AS "tool_calls: Json<Vec<(String, String, String)>>"
             FROM messages m
            WHERE m.owner = $1 AND m.thread_id = $2 AND m.task_id <> $3
              AND NOT (m.metadata ? $6)
              AND NOT EXISTS (SELECT 1 FROM run_progress r
                               WHERE r.task_id = m.task_id
                                 AND (r.runs_seq > $4
                                      OR r.runs_seq > (SELECT a.runs_seq FROM run_progress a
                                                        WHERE a.task_id = $3)))
            ORDER BY m.seq DESC
            LIMIT $5"#,
        owner,
        thread_id,
        task_id,
        runs_seq,
        limit,
        keys::SUPERSEDED_BY
    )
    .fetch_all(pool)
    .await?;
    let rows = records.into_iter().map(|r| AguiRow {
        message_id: r.message_id,
        role: r.role,
        content: r.content,
        metadata: r.metadata.0,
        agui: r.agui,
        tool_calls: r.tool_calls.map(|Json(calls)| {
            calls
                .into_iter()
                .map(|(id, name, arguments)| StoredToolCall {
                    id,
                    name,
                    arguments,
                })
                .collect()
        }),
    });
    Ok(rows.collect())
}

/// Whose runs, ended when: the window of a usage answer.
pub(crate) struct UsageWindow<'a> {
    /// One owner's runs; `None`: every owner's.
    pub(crate) owner: Option<&'a str>,
    /// Runs that ended at or after.
    pub(crate) from: DateTime<Utc>,
    /// Runs that ended before.
    pub(crate) to: DateTime<Utc>,
}

/// The runs of one group of a usage answer: their count, tokens and times (milliseconds from
/// acceptance; `None` when no run of the group had one).
#[derive(Debug)]
pub(crate) struct UsageGroup {
    /// Its owner when every owner's runs are grouped apart, else "".
    pub(crate) owner: String,
    pub(crate) key: String,
    pub(crate) runs: i64,
    pub(crate) input_tokens: i64,
    pub(crate) output_tokens: i64,
    pub(crate) total_tokens: i64,
    pub(crate) reasoning_tokens: i64,
    pub(crate) cached_input_tokens: i64,
    pub(crate) ttft_avg: Option<f64>,
    pub(crate) ttft_p50: Option<f64>,
    pub(crate) ttft_p95: Option<f64>,
    pub(crate) duration_avg: Option<f64>,
    pub(crate) duration_p50: Option<f64>,
    pub(crate) duration_p95: Option<f64>,
}

/// The runs in `window` grouped by `group_by` (`day`: the UTC day it ended, `thread`, `agent`
/// ("" for the worker's default), `owner`, or `all`: one group), each owner's apart when
/// `split`; days in order, other groups by tokens, most first; at most `limit` groups.
pub(crate) async fn usage_groups(
    pool: &PgPool,
    window: &UsageWindow<'_>,
    group_by: &str,
    split: bool,
    limit: i64,
) -> sqlx::Result<Vec<UsageGroup>> {
    sqlx::query_as!(
        UsageGroup,
        r#"WITH runs AS (
             SELECT p.task_id,
                    CASE WHEN $4 THEN p.owner ELSE '' END AS owner,
                    CASE $5 WHEN 'day' THEN to_char(p.ended_at AT TIME ZONE 'UTC', 'YYYY-MM-DD')
                            WHEN 'thread' THEN p.thread_id
                            WHEN 'agent' THEN coalesce(p.agent, '')
                            WHEN 'owner' THEN p.owner
                            ELSE '' END AS key,
                    extract(epoch FROM p.first_output_at - p.accepted_at) * 1000 AS ttft,
                    extract(epoch FROM p.ended_at - p.accepted_at) * 1000 AS duration
             FROM run_progress p
             WHERE ($1::text IS NULL OR p.owner = $1)
               AND p.ended_at IS NOT NULL AND p.ended_at >= $2 AND p.ended_at < $3
           ), tokens AS (
             SELECT r.task_id, sum(u.input_tokens) AS input, sum(u.output_tokens) AS output,
                    sum(u.total_tokens) AS total, sum(u.reasoning_tokens) AS reasoning,
                    sum(u.cached_input_tokens) AS cached
             FROM runs r JOIN run_usage u ON u.task_id = r.task_id
             GROUP BY r.task_id
           )
           SELECT r.owner AS "owner!", r.key AS "key!", count(*) AS "runs!",
                  coalesce(sum(t.input), 0)::bigint AS "input_tokens!",
                  coalesce(sum(t.output), 0)::bigint AS "output_tokens!",
                  coalesce(sum(t.total), 0)::bigint AS "total_tokens!",
                  coalesce(sum(t.reasoning), 0)::bigint AS "reasoning_tokens!",
                  coalesce(sum(t.cached), 0)::bigint AS "cached_input_tokens!",
                  avg(r.ttft)::float8 AS ttft_avg,
                  percentile_cont(0.5) WITHIN GROUP (ORDER BY r.ttft::float8) AS ttft_p50,
                  percentile_cont(0.95) WITHIN GROUP (ORDER BY r.ttft::float8) AS ttft_p95,
                  avg(r.duration)::float8 AS duration_avg,
                  percentile_cont(0.5) WITHIN GROUP (ORDER BY r.duration::float8) AS duration_p50,
                  percentile_cont(0.95) WITHIN GROUP (ORDER BY r.duration::float8) AS duration_p95
           FROM runs r LEFT JOIN tokens t ON t.task_id = r.task_id
           GROUP BY r.owner, r.key
           ORDER BY CASE WHEN $5 = 'day' THEN r.key END, 6 DESC, r.owner, r.key
           LIMIT $6"#,
        window.owner,
        window.from,
        window.to,
        split,
        group_by,
        limit
    )
    .fetch_all(pool)
    .await
}

/// The tokens of one model in one group of a usage answer.
#[derive(Debug)]
pub(crate) struct UsageModel {
    pub(crate) owner: String,
    pub(crate) key: String,
    /// "" when the usage named none.
    pub(crate) provider: String,
    pub(crate) model: String,
    pub(crate) runs: i64,
    pub(crate) input_tokens: i64,
    pub(crate) output_tokens: i64,
    pub(crate) total_tokens: i64,
    pub(crate) reasoning_tokens: Option<i64>,
    pub(crate) cached_input_tokens: Option<i64>,
}

/// The tokens of every model in every group of [`usage_groups`].
pub(crate) async fn usage_models(
    pool: &PgPool,
    window: &UsageWindow<'_>,
    group_by: &str,
    split: bool,
) -> sqlx::Result<Vec<UsageModel>> {
    sqlx::query_as!(
        UsageModel,
        r#"SELECT CASE WHEN $4 THEN p.owner ELSE '' END AS "owner!",
                  CASE $5 WHEN 'day' THEN to_char(p.ended_at AT TIME ZONE 'UTC', 'YYYY-MM-DD')
                          WHEN 'thread' THEN p.thread_id
                          WHEN 'agent' THEN coalesce(p.agent, '')
                          WHEN 'owner' THEN p.owner
                          ELSE '' END AS "key!",
                  u.provider, u.model, count(*) AS "runs!",
                  sum(u.input_tokens)::bigint AS "input_tokens!",
                  sum(u.output_tokens)::bigint AS "output_tokens!",
                  sum(u.total_tokens)::bigint AS "total_tokens!",
                  sum(u.reasoning_tokens)::bigint AS reasoning_tokens,
                  sum(u.cached_input_tokens)::bigint AS cached_input_tokens
           FROM run_progress p JOIN run_usage u ON u.task_id = p.task_id
           WHERE ($1::text IS NULL OR p.owner = $1)
             AND p.ended_at IS NOT NULL AND p.ended_at >= $2 AND p.ended_at < $3
           GROUP BY 1, 2, 3, 4
           ORDER BY 1, 2, 8 DESC"#,
        window.owner,
        window.from,
        window.to,
        split,
        group_by
    )
    .fetch_all(pool)
    .await
}
