//! Retention that follows consumption: an accepted run stays in the RUNS stream (7 days, the
//! stream's age limit) only while something may still need it. History deletes a run's task from
//! the stream once the run has ended and is older than both the stream's duplicate window (a
//! retried request within it is answered from the task) and the run events' age (a WebSocket
//! reconnect reads the task while its events are there to replay). By then history holds the run
//! (`run_progress`, the messages) and the worker has acknowledged it: so RUNS holds about a day
//! of ended runs plus the queued and running ones, not a week of everything accepted.
//!
//! Every history replica sweeps once a minute (`SB_HISTORY_RUNS_SWEEP_SECS`); a PostgreSQL
//! advisory lock lets one at a time do it, 500 runs a batch.

use std::time::Duration;

use async_nats::jetstream::stream::{DeleteMessageErrorKind, Stream};
use chrono::Utc;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::store;

/// Runs deleted from the stream per batch.
const BATCH: i64 = 500;

/// How long after its end a run's task is kept: the longer of the duplicate window and the
/// events' age.
pub(crate) fn keep_after_end(limits: &platform::nats::StreamLimits) -> Duration {
    limits.runs_dedup_window.max(limits.events_max_age)
}

/// Calls `sweep` every `every` (a sweep that overruns delays the next) until `shutdown`.
pub(crate) async fn every<F, Fut>(every: Duration, shutdown: CancellationToken, mut sweep: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        sweep().await;
    }
}

/// Sweeps every `every` until `shutdown`.
pub(crate) async fn run(
    pool: PgPool,
    runs: Stream,
    keep: Duration,
    every: Duration,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let (pool, runs) = (&pool, &runs);
    self::every(every, shutdown, || async move {
        match sweep(pool, runs, keep).await {
            Ok(0) => {}
            Ok(deleted) => tracing::info!(deleted, "ended runs deleted from the RUNS stream"),
            Err(err) => tracing::warn!(error = format!("{err:#}"), "RUNS retention sweep failed"),
        }
    })
    .await;
    Ok(())
}

/// One sweep: the ended runs past `keep` deleted from the stream, in batches; how many.
async fn sweep(pool: &PgPool, runs: &Stream, keep: Duration) -> anyhow::Result<u64> {
    let ended_before = Utc::now() - chrono::Duration::from_std(keep)?;
    let mut deleted = 0;
    loop {
        let mut tx = pool.begin().await?;
        if !store::lock_runs_sweep(&mut tx).await? {
            return Ok(deleted); // another replica is at it
        }
        let batch = store::runs_to_delete(&mut tx, ended_before, BATCH).await?;
        for run in &batch {
            match runs.delete_message(run.runs_seq.cast_unsigned()).await {
                Ok(_) => {}
                // Gone already (the stream's own age limit, or a sweep whose mark was lost).
                Err(err)
                    if matches!(err.kind(), DeleteMessageErrorKind::JetStream(e)
                        if e.error_code() == async_nats::jetstream::ErrorCode::NO_MESSAGE_FOUND) => {
                }
                Err(err) => return Err(anyhow::Error::new(err).context("cannot delete a run")),
            }
        }
        let ids: Vec<uuid::Uuid> = batch.iter().map(|run| run.task_id).collect();
        store::mark_runs_deleted(&mut tx, &ids).await?;
        tx.commit().await?;
        metrics::counter!("switchboard_history_runs_deleted_total").increment(ids.len() as u64);
        deleted += ids.len() as u64;
        if (batch.len() as i64) < BATCH {
            return Ok(deleted);
        }
    }
}
