//! The queries of the RUNS retention sweep (`crate::retention`).

use chrono::{DateTime, Utc};
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

/// Key of the advisory lock one sweeping replica holds (an arbitrary constant).
const RUNS_SWEEP_LOCK: i64 = 0x5342_5255_4e53; // "SBRUNS"

/// Takes the sweep's lock for the transaction; false when another replica holds it.
pub(crate) async fn lock_runs_sweep(tx: &mut Transaction<'_, Postgres>) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT pg_try_advisory_xact_lock($1) AS "locked!""#,
        RUNS_SWEEP_LOCK
    )
    .fetch_one(&mut **tx)
    .await
}

/// A run whose task may leave the RUNS stream.
pub(crate) struct RunToDelete {
    pub(crate) task_id: Uuid,
    pub(crate) runs_seq: i64,
}

/// Up to `limit` runs that ended before `ended_before` and whose task is still in the stream
/// (`run_progress_runs_kept_idx`).
pub(crate) async fn runs_to_delete(
    tx: &mut Transaction<'_, Postgres>,
    ended_before: DateTime<Utc>,
    limit: i64,
) -> sqlx::Result<Vec<RunToDelete>> {
    sqlx::query_as!(
        RunToDelete,
        r#"SELECT task_id, runs_seq AS "runs_seq!" FROM run_progress
           WHERE runs_seq IS NOT NULL AND runs_deleted_at IS NULL
             AND ended_at IS NOT NULL AND ended_at < $1
           ORDER BY ended_at
           LIMIT $2"#,
        ended_before,
        limit
    )
    .fetch_all(&mut **tx)
    .await
}

/// Records that these runs' tasks left the stream.
pub(crate) async fn mark_runs_deleted(
    tx: &mut Transaction<'_, Postgres>,
    task_ids: &[Uuid],
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE run_progress SET runs_deleted_at = now() WHERE task_id = ANY($1)",
        task_ids
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}
