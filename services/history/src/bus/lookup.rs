//! The run index: the request/reply endpoint on which the runs service finds an owner's latest
//! run with a run id (`GET /api/v1/agent/runs/{runId}`, cancel, WebSocket reconnects). The RUNS
//! stream keeps every run on one subject, so history's `run_progress` is where runs are found.
//!
//! Read-your-writes: the request carries the RUNS stream's last sequence when it was asked, and
//! is answered only once history's RUNS consumer has written every run up to it (its ack floor),
//! so a run accepted before the lookup is always found. History behind by more than
//! [`CATCH_UP`] answers `Behind` (the caller answers 503), never a wrong "not found".

use std::time::Duration;

use protocol::messaging::{Names, RunLookupReply, RunLookupRequest, RunRecord, RunStatus};
use sqlx::PgPool;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::bus::ingest::PullConsumer;
use crate::bus::respond;
use crate::store;

/// How long a lookup waits for history to write the runs accepted before it.
pub(crate) const CATCH_UP: Duration = Duration::from_secs(2);
/// Between two looks at the consumer's ack floor while catching up.
pub(crate) const CATCH_UP_STEP: Duration = Duration::from_millis(20);

/// Answers [`RunLookupRequest`]s until `shutdown`; an error gets no answer (the caller times
/// out and answers 503).
pub(crate) async fn serve(
    client: async_nats::Client,
    names: Names,
    pool: PgPool,
    runs: PullConsumer,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let (pool, runs) = (&pool, &runs);
    respond::serve(
        client,
        &names,
        names.history_run_lookup_subject(),
        shutdown,
        || tracing::info_span!("history.lookup.handle", otel.kind = "server"),
        |request| answer(pool, runs, request),
    )
    .await
}

async fn answer(
    pool: &PgPool,
    runs: &PullConsumer,
    request: RunLookupRequest,
) -> anyhow::Result<RunLookupReply> {
    let RunLookupRequest::V1 {
        owner,
        run_id,
        runs_seq,
    } = request;
    if !caught_up(runs, runs_seq, Instant::now() + CATCH_UP).await? {
        return Ok(RunLookupReply::Behind);
    }
    let Some(row) = store::latest_run(pool, &owner, &run_id).await? else {
        return Ok(RunLookupReply::V1 { run: None });
    };
    let status: RunStatus = serde_json::from_value(row.status.into())?;
    Ok(RunLookupReply::V1 {
        run: Some(RunRecord {
            task_id: row.task_id,
            thread_id: row.thread_id,
            accepted_at: row.accepted_at,
            status,
            runs_seq: row.runs_seq.and_then(|seq| u64::try_from(seq).ok()),
            error: row.error,
        }),
    })
}

/// Whether history's RUNS consumer has written every run up to `runs_seq`, waiting for it
/// until `deadline`.
pub(crate) async fn caught_up(
    runs: &PullConsumer,
    runs_seq: u64,
    deadline: Instant,
) -> anyhow::Result<bool> {
    loop {
        let floor = runs.get_info().await?.ack_floor.stream_sequence;
        if floor >= runs_seq {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(CATCH_UP_STEP).await;
    }
}
