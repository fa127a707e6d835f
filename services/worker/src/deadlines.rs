//! Enforces the timeouts of human-in-the-loop prompts: a prompt not answered by its deadline is
//! closed as timed out and a continuation run is started on its thread, so the agent receives
//! the timeout and every client the prompt's error. Every worker replica sweeps; the prompt's
//! compare-and-set and the run's one-subject publish make the outcome happen once.

use std::time::Duration;

use async_nats::jetstream;
use chrono::{DateTime, Utc};
use platform::nats::RunBuckets;
use protocol::interaction::{PromptOutcome, PromptRecord, PromptStatus};
use protocol::messaging::{Names, Resumed, RunTaskV1};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// How often the deadlines are checked.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Sweeps until `shutdown`.
pub(crate) async fn sweep(
    js: jetstream::Context,
    names: Names,
    buckets: RunBuckets,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {
                if let Err(err) = sweep_once(&js, &names, &buckets).await {
                    tracing::warn!(error = format!("{err:#}"), "prompt deadline sweep failed");
                }
            }
        }
    }
}

async fn sweep_once(
    js: &jetstream::Context,
    names: &Names,
    buckets: &RunBuckets,
) -> anyhow::Result<()> {
    let now = Utc::now();
    for key in buckets.prompt_deadlines.keys().await? {
        let deadline = buckets
            .prompt_deadlines
            .get::<Option<DateTime<Utc>>>(&key)
            .await?
            .and_then(|(deadline, _)| deadline);
        if deadline.is_none_or(|at| at > now) {
            continue;
        }
        let Some((record, revision)) = buckets.prompts.get::<PromptRecord>(&key).await? else {
            buckets.prompt_deadlines.delete(&key).await?;
            continue;
        };
        let record = match record.status {
            PromptStatus::Pending => {
                let closed = PromptRecord {
                    status: PromptStatus::TimedOut,
                    continuation_run_id: Some(format!("{}-timeout", record.prompt_id)),
                    ..record
                };
                if buckets
                    .prompts
                    .update(&key, &closed, revision)
                    .await?
                    .is_none()
                {
                    continue; // answered (or swept) meanwhile: look again next time
                }
                closed
            }
            // Closed by a sweep that stopped before starting the continuation: start it now.
            PromptStatus::TimedOut => record,
            PromptStatus::Answered | PromptStatus::Cancelled => {
                buckets.prompt_deadlines.delete(&key).await?;
                continue;
            }
        };
        start_continuation(js, names, &record).await?;
        buckets.prompt_deadlines.delete(&key).await?;
        tracing::info!(prompt.id = %record.prompt_id, "prompt timed out; the agent is told");
    }
    Ok(())
}

/// Publishes the run that tells the agent its prompt timed out (once: one subject per run).
async fn start_continuation(
    js: &jetstream::Context,
    names: &Names,
    record: &PromptRecord,
) -> anyhow::Result<()> {
    let run_id = record
        .continuation_run_id
        .clone()
        .unwrap_or_else(|| format!("{}-timeout", record.prompt_id));
    let input = serde_json::from_value(serde_json::json!({
        "threadId": record.thread_id,
        "runId": run_id,
        "state": {},
        "messages": [],
        "context": [],
        "forwardedProps": {},
    }))?;
    let task = RunTaskV1 {
        task_id: Uuid::now_v7(),
        owner: record.owner.clone(),
        accepted_at: Utc::now(),
        input,
        attachments: Vec::new(),
        conversation: true,
        resumed: Some(Resumed {
            prompt_id: record.prompt_id.clone(),
            prompt: record.prompt.clone(),
            outcome: PromptOutcome::TimedOut,
        }),
        trace_id: None,
        agent: record.agent.clone(),
    };
    let subject = names.run_accepted_subject(&record.owner, &record.thread_id, &run_id);
    platform::nats::publish_task(js, &subject, &task).await?;
    Ok(())
}
