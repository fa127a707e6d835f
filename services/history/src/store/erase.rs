//! The queries of erasure (`crate::erase`): a thread's runs as the streams and buckets know
//! them, the tombstones of erased runs, and the rows themselves.

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

/// A run of a thread being erased: what locates its traces outside PostgreSQL.
#[derive(Debug, Clone)]
pub(crate) struct ErasedRun {
    pub(crate) task_id: Uuid,
    pub(crate) run_id: String,
    /// Where its task is in the RUNS stream (`None`: written before history recorded it, or
    /// deleted already by the retention sweep; a delete of a missing message is harmless).
    pub(crate) runs_seq: Option<i64>,
    /// Whether history has written its terminal event.
    pub(crate) ended: bool,
    /// The prompts it asked.
    pub(crate) prompt_ids: Vec<String>,
}

/// Every run of the owner's thread (a thread holds few runs next to its messages).
pub(crate) async fn thread_runs(
    pool: &PgPool,
    owner: &str,
    thread_id: &str,
) -> sqlx::Result<Vec<ErasedRun>> {
    sqlx::query_as!(
        ErasedRun,
        r#"SELECT task_id, run_id, runs_seq, ended_at IS NOT NULL AS "ended!",
                  coalesce(prompt_ids, '{}') AS "prompt_ids!"
             FROM run_progress WHERE owner = $1 AND thread_id = $2"#,
        owner,
        thread_id
    )
    .fetch_all(pool)
    .await
}

/// Whether the owner has this thread (a row, or a run not yet written into one).
pub(crate) async fn thread_or_runs_exist(
    pool: &PgPool,
    owner: &str,
    thread_id: &str,
) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT (EXISTS (SELECT 1 FROM threads WHERE owner = $1 AND thread_id = $2)
                OR EXISTS (SELECT 1 FROM run_progress WHERE owner = $1 AND thread_id = $2))
                AS "exists!""#,
        owner,
        thread_id
    )
    .fetch_one(pool)
    .await
}

/// Up to `limit` of the owner's threads (any order): what an owner's erasure goes through.
pub(crate) async fn owner_threads(
    pool: &PgPool,
    owner: &str,
    limit: i64,
) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        "SELECT thread_id FROM threads WHERE owner = $1
         UNION
         SELECT DISTINCT thread_id FROM run_progress WHERE owner = $1
         LIMIT $2",
        owner,
        limit
    )
    .fetch_all(pool)
    .await
    .map(|ids| ids.into_iter().flatten().collect())
}

/// Up to `limit` runs of the owner that have not ended, with their threads.
pub(crate) async fn owner_unended_runs(
    pool: &PgPool,
    owner: &str,
    limit: i64,
) -> sqlx::Result<Vec<(String, String)>> {
    let rows = sqlx::query!(
        "SELECT thread_id, run_id FROM run_progress
         WHERE owner = $1 AND ended_at IS NULL LIMIT $2",
        owner,
        limit
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.thread_id, r.run_id)).collect())
}

/// Records that these runs are erased (before anything of them is removed, so what the
/// consumers receive of them from now on is dropped).
pub(crate) async fn tombstone_runs(pool: &PgPool, task_ids: &[Uuid]) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO erased_runs (task_id) SELECT unnest($1::uuid[]) ON CONFLICT DO NOTHING",
        task_ids
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Tombstones older than `before` dropped (the streams cannot hold their runs' messages any
/// more); how many.
pub(crate) async fn forget_tombstones(pool: &PgPool, before: DateTime<Utc>) -> sqlx::Result<u64> {
    let done = sqlx::query!("DELETE FROM erased_runs WHERE erased_at < $1", before)
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}

/// What one erasure removed from PostgreSQL.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Removed {
    pub(crate) runs: u64,
    pub(crate) messages: u64,
    /// What the owner keeps in history after it (0: no thread left).
    pub(crate) kept: i64,
}

/// Removes the owner's thread and everything of it from history's tables, in one transaction:
/// its tool calls, messages, usage, runs and the thread itself.
pub(crate) async fn delete_thread(
    pool: &PgPool,
    owner: &str,
    thread_id: &str,
) -> sqlx::Result<Removed> {
    let mut tx = pool.begin().await?;
    // The thread row first: it serialises with the ingest, which writes messages under it.
    sqlx::query!(
        "SELECT thread_id FROM threads WHERE owner = $1 AND thread_id = $2 FOR UPDATE",
        owner,
        thread_id
    )
    .fetch_optional(&mut *tx)
    .await?;
    // The runs' tool calls, and those of copied messages (a fork's tasks have no run record).
    sqlx::query!(
        "DELETE FROM tool_calls WHERE task_id IN
           (SELECT task_id FROM run_progress WHERE owner = $1 AND thread_id = $2
            UNION SELECT task_id FROM messages WHERE owner = $1 AND thread_id = $2)",
        owner,
        thread_id
    )
    .execute(&mut *tx)
    .await?;
    let messages = sqlx::query!(
        "DELETE FROM messages WHERE owner = $1 AND thread_id = $2",
        owner,
        thread_id
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    // run_usage goes with its run (ON DELETE CASCADE).
    let runs = sqlx::query!(
        "DELETE FROM run_progress WHERE owner = $1 AND thread_id = $2",
        owner,
        thread_id
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let bytes = sqlx::query_scalar!(
        "DELETE FROM threads WHERE owner = $1 AND thread_id = $2 RETURNING bytes",
        owner,
        thread_id
    )
    .fetch_optional(&mut *tx)
    .await?;
    let kept = super::take_thread(&mut tx, owner, bytes.unwrap_or(0)).await?;
    tx.commit().await?;
    Ok(Removed {
        runs,
        messages,
        kept,
    })
}

/// Up to `limit` threads (owner, thread) idle since before `idle_before` with no run that has
/// not ended: what the thread retention erases.
pub(crate) async fn idle_threads(
    pool: &PgPool,
    idle_before: DateTime<Utc>,
    limit: i64,
) -> sqlx::Result<Vec<(String, String)>> {
    let rows = sqlx::query!(
        "SELECT t.owner, t.thread_id FROM threads t
         WHERE t.updated_at < $1
           AND NOT EXISTS (SELECT 1 FROM run_progress p
                           WHERE p.owner = t.owner AND p.thread_id = t.thread_id
                             AND p.ended_at IS NULL)
         ORDER BY t.updated_at
         LIMIT $2",
        idle_before,
        limit
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.owner, r.thread_id)).collect())
}

/// Key of the advisory lock the replica sweeping thread retention holds.
const THREAD_RETENTION_LOCK: i64 = 0x0053_4254_544c; // "SBTTL"

/// The thread retention's lock, held as long as the returned transaction is open; `None` when
/// another replica holds it.
pub(crate) async fn retention_lock(
    pool: &PgPool,
) -> sqlx::Result<Option<sqlx::Transaction<'static, sqlx::Postgres>>> {
    let mut tx = pool.begin().await?;
    let locked = sqlx::query_scalar!(
        r#"SELECT pg_try_advisory_xact_lock($1) AS "locked!""#,
        THREAD_RETENTION_LOCK
    )
    .fetch_one(&mut *tx)
    .await?;
    Ok(locked.then_some(tx))
}

/// Up to `limit` of the owner's threads idle since before `idle_before` with no run that has
/// not ended (`threads_owner_recent_idx`).
pub(crate) async fn owner_idle_threads(
    pool: &PgPool,
    owner: &str,
    idle_before: DateTime<Utc>,
    limit: i64,
) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        "SELECT t.thread_id FROM threads t
         WHERE t.owner = $1 AND t.updated_at < $2
           AND NOT EXISTS (SELECT 1 FROM run_progress p
                           WHERE p.owner = t.owner AND p.thread_id = t.thread_id
                             AND p.ended_at IS NULL)
         ORDER BY t.updated_at
         LIMIT $3",
        owner,
        idle_before,
        limit
    )
    .fetch_all(pool)
    .await
}
