//! The reads of the history endpoints.

use chrono::{DateTime, NaiveDate, Utc};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

/// `seq` of the last event of `task_id` whose changes are committed, if history knows the run.
pub(crate) async fn written_seq(pool: &PgPool, task_id: Uuid) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar("SELECT last_event_seq FROM run_progress WHERE task_id = $1")
        .bind(task_id)
        .fetch_optional(pool)
        .await
}

/// A stored message, as the history endpoints read it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct MessageRow {
    pub(crate) message_id: String,
    pub(crate) seq: i64,
    pub(crate) role: String,
    pub(crate) content: String,
    pub(crate) metadata: Value,
    pub(crate) created_at: DateTime<Utc>,
}

/// The caller's most recently active thread.
pub(crate) async fn latest_thread(pool: &PgPool, owner: &str) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar(
        "SELECT thread_id FROM threads WHERE owner = $1 ORDER BY updated_at DESC LIMIT 1",
    )
    .bind(owner)
    .fetch_optional(pool)
    .await
}

/// Whether the caller has a thread with this id.
pub(crate) async fn thread_exists(
    pool: &PgPool,
    owner: &str,
    thread_id: &str,
) -> sqlx::Result<bool> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM threads WHERE owner = $1 AND thread_id = $2)")
        .bind(owner)
        .bind(thread_id)
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
    sqlx::query_scalar::<_, NaiveDate>(
        "SELECT (created_at AT TIME ZONE $4)::date FROM messages
         WHERE owner = $1 AND thread_id = $2
           AND created_at < COALESCE($3::date::timestamp AT TIME ZONE $4, 'infinity')
         ORDER BY created_at DESC
         LIMIT 1",
    )
    .bind(owner)
    .bind(thread_id)
    .bind(before)
    .bind(tz)
    .fetch_optional(pool)
    .await
}

/// The instants `day` starts and ends at in time zone `tz`.
pub(crate) async fn day_bounds(
    pool: &PgPool,
    day: NaiveDate,
    tz: &str,
) -> sqlx::Result<(DateTime<Utc>, DateTime<Utc>)> {
    sqlx::query_as(
        "SELECT ($1::date::timestamp AT TIME ZONE $2), (($1::date + 1)::timestamp AT TIME ZONE $2)",
    )
    .bind(day)
    .bind(tz)
    .fetch_one(pool)
    .await
}

/// Every time zone name PostgreSQL knows (loaded once at start).
pub(crate) async fn time_zone_names(pool: &PgPool) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar("SELECT name FROM pg_timezone_names")
        .fetch_all(pool)
        .await
}

/// The messages written in `[from, to)`, in `seq` order.
pub(crate) async fn messages_between(
    pool: &PgPool,
    owner: &str,
    thread_id: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<Vec<MessageRow>> {
    sqlx::query_as(
        "SELECT message_id, seq, role, content, metadata, created_at FROM messages
         WHERE owner = $1 AND thread_id = $2 AND created_at >= $3 AND created_at < $4
         ORDER BY seq",
    )
    .bind(owner)
    .bind(thread_id)
    .bind(from)
    .bind(to)
    .fetch_all(pool)
    .await
}

/// Whether any message was written before `at`.
pub(crate) async fn has_messages_before(
    pool: &PgPool,
    owner: &str,
    thread_id: &str,
    at: DateTime<Utc>,
) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM messages WHERE owner = $1 AND thread_id = $2 AND created_at < $3)",
    )
    .bind(owner)
    .bind(thread_id)
    .bind(at)
    .fetch_one(pool)
    .await
}

/// A thread in the caller's list.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct ThreadRow {
    pub(crate) thread_id: String,
    pub(crate) last_seq: i64,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
}

/// The owner's threads, most recently active first, strictly after the cursor `(updated_at,
/// thread_id)` when one is given (keyset pagination: stable under inserts).
pub(crate) async fn threads(
    pool: &PgPool,
    owner: &str,
    after: Option<(DateTime<Utc>, String)>,
    limit: i64,
) -> sqlx::Result<Vec<ThreadRow>> {
    let (at, id) = after.unzip();
    sqlx::query_as(
        "SELECT thread_id, last_seq, created_at, updated_at FROM threads
         WHERE owner = $1 AND ($2::timestamptz IS NULL OR (updated_at, thread_id) < ($2, $3))
         ORDER BY updated_at DESC, thread_id DESC
         LIMIT $4",
    )
    .bind(owner)
    .bind(at)
    .bind(id)
    .bind(limit)
    .fetch_all(pool)
    .await
}
