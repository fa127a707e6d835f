//! What each owner keeps in history, in bytes (migration 0012): each thread's `bytes`, and the
//! owner's sum in `owner_bytes`, changed together in the transactions that add or remove what
//! they count. `platform::kept` tells the runs replicas the sums.

use sqlx::{Postgres, Transaction};
use uuid::Uuid;

/// Adds the bytes of run `task_id`'s messages (text, metadata, AG-UI form) and tool-call
/// arguments to its thread and owner; called once per run, in the transaction that writes its
/// end. What the owner keeps now, if the run has a thread.
pub(crate) async fn add_run(
    tx: &mut Transaction<'_, Postgres>,
    task_id: Uuid,
) -> sqlx::Result<Option<i64>> {
    let added = sqlx::query!(
        r#"WITH run AS (SELECT owner, thread_id FROM run_progress WHERE task_id = $1),
                size AS (
                  SELECT (SELECT coalesce(sum(octet_length(content) + octet_length(metadata::text)
                                              + coalesce(octet_length(agui::text), 0)), 0)
                            FROM messages WHERE task_id = $1)
                       + (SELECT coalesce(sum(octet_length(arguments)), 0)
                            FROM tool_calls WHERE task_id = $1) AS bytes)
           UPDATE threads t SET bytes = t.bytes + size.bytes
             FROM run, size
            WHERE t.owner = run.owner AND t.thread_id = run.thread_id
        RETURNING t.owner, size.bytes::bigint AS "bytes!""#,
        task_id
    )
    .fetch_optional(&mut **tx)
    .await?;
    match added {
        Some(row) => Ok(Some(add_owner(tx, &row.owner, row.bytes).await?)),
        None => Ok(None),
    }
}

/// Sets a new thread's bytes to what it holds (a fork's copied messages and tool calls) and adds
/// them to its owner; what the owner keeps now.
pub(crate) async fn count_thread(
    tx: &mut Transaction<'_, Postgres>,
    owner: &str,
    thread_id: &str,
) -> sqlx::Result<i64> {
    let bytes = sqlx::query_scalar!(
        r#"UPDATE threads SET bytes =
             (SELECT coalesce(sum(octet_length(content) + octet_length(metadata::text)
                                  + coalesce(octet_length(agui::text), 0)), 0)
                FROM messages WHERE owner = $1 AND thread_id = $2)
           + (SELECT coalesce(sum(octet_length(c.arguments)), 0) FROM tool_calls c
               WHERE c.task_id IN (SELECT task_id FROM messages WHERE owner = $1 AND thread_id = $2))
           WHERE owner = $1 AND thread_id = $2
        RETURNING bytes"#,
        owner,
        thread_id
    )
    .fetch_one(&mut **tx)
    .await?;
    add_owner(tx, owner, bytes).await
}

/// Takes a removed thread's `bytes` off its owner; the owner's row goes with their last thread.
/// What the owner keeps now (0 once no thread is left).
pub(crate) async fn take_thread(
    tx: &mut Transaction<'_, Postgres>,
    owner: &str,
    bytes: i64,
) -> sqlx::Result<i64> {
    let left = sqlx::query_scalar!(
        "UPDATE owner_bytes SET bytes = greatest(bytes - $2, 0) WHERE owner = $1 RETURNING bytes",
        owner,
        bytes
    )
    .fetch_optional(&mut **tx)
    .await?
    .unwrap_or(0);
    let gone = sqlx::query!(
        "DELETE FROM owner_bytes WHERE owner = $1
           AND NOT EXISTS (SELECT 1 FROM threads WHERE owner = $1)",
        owner
    )
    .execute(&mut **tx)
    .await?;
    Ok(if gone.rows_affected() > 0 { 0 } else { left })
}

async fn add_owner(
    tx: &mut Transaction<'_, Postgres>,
    owner: &str,
    bytes: i64,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        "INSERT INTO owner_bytes (owner, bytes) VALUES ($1, $2)
         ON CONFLICT (owner) DO UPDATE SET bytes = owner_bytes.bytes + EXCLUDED.bytes
         RETURNING bytes",
        owner,
        bytes
    )
    .fetch_one(&mut **tx)
    .await
}
