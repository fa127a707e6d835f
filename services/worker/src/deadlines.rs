//! Enforces the timeouts of human-in-the-loop prompts: a prompt not answered by its deadline is
//! closed as timed out and a continuation run is started on its thread, so the agent receives
//! the timeout and every client the prompt's error. Every worker replica sweeps; the prompt's
//! compare-and-set and the run's one-subject publish make the outcome happen once.

use std::time::Duration;

use async_nats::jetstream;
use chrono::{DateTime, Utc};
use protocol::interaction::{PromptOutcome, PromptRecord, PromptStatus};
use protocol::messaging::{Names, Resumed, RunTaskV1};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::store::{DeadlineChange, RunStore, StoredPrompt, Written};

/// How soon a deadline whose enforcement failed (NATS unavailable) is tried again.
const RETRY: Duration = Duration::from_secs(1);

/// Enforces deadlines until `shutdown`: follows the deadlines bucket with a KV watch into an
/// in-memory queue ordered by deadline, and wakes only when the earliest is due, so the cost
/// follows prompts asked and answered, not replicas times pending prompts. A watch that ends is
/// opened again (it redelivers every current deadline).
pub(crate) async fn sweep(
    js: jetstream::Context,
    names: Names,
    store: RunStore,
    shutdown: CancellationToken,
) {
    while !shutdown.is_cancelled() {
        match store.watch_deadlines().await {
            Ok(changes) => follow(&js, &names, &store, changes, &shutdown).await,
            Err(err) => tracing::warn!(error = format!("{err:#}"), "cannot watch prompt deadlines"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(RETRY) => {}
        }
    }
}

/// The pending deadlines, earliest first.
#[derive(Debug, Default)]
struct Queue {
    by_time: std::collections::BTreeSet<(DateTime<Utc>, String)>,
    by_key: std::collections::HashMap<String, DateTime<Utc>>,
}

impl Queue {
    fn set(&mut self, key: String, deadline: Option<DateTime<Utc>>) {
        if let Some(old) = self.by_key.remove(&key) {
            self.by_time.remove(&(old, key.clone()));
        }
        if let Some(at) = deadline {
            self.by_time.insert((at, key.clone()));
            self.by_key.insert(key, at);
        }
    }

    fn earliest(&self) -> Option<Due> {
        self.by_time.first().map(|(at, key)| Due {
            at: *at,
            key: key.clone(),
        })
    }
}

/// The earliest pending deadline: when it is due, and its prompt's key.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Due {
    at: DateTime<Utc>,
    key: String,
}

async fn follow(
    js: &jetstream::Context,
    names: &Names,
    store: &RunStore,
    changes: impl futures::Stream<Item = DeadlineChange>,
    shutdown: &CancellationToken,
) {
    use futures::StreamExt as _;
    let mut changes = std::pin::pin!(changes);
    let mut queue = Queue::default();
    loop {
        let due = queue.earliest();
        let wait = due.as_ref().map_or(Duration::from_secs(3600), |due| {
            (due.at - Utc::now()).to_std().unwrap_or(Duration::ZERO)
        });
        tokio::select! {
            () = shutdown.cancelled() => return,
            change = changes.next() => match change {
                Some(DeadlineChange { key, deadline }) => queue.set(key, deadline),
                None => return, // the watch ended: the caller opens it again
            },
            () = tokio::time::sleep(wait), if due.is_some() => {
                let Some(Due { key, .. }) = due else { continue };
                queue.set(key.clone(), None);
                if let Err(err) = expire(js, names, store, &key).await {
                    tracing::warn!(error = format!("{err:#}"), "prompt deadline not enforced yet");
                    queue.set(key, Some(Utc::now() + RETRY));
                }
            }
        }
    }
}

/// Closes the prompt under `key` as timed out (unless it was answered first) and starts its
/// continuation run; removes the deadline. Every replica may try: the compare-and-set on the
/// prompt and the continuation's one-subject publish make it happen once.
async fn expire(
    js: &jetstream::Context,
    names: &Names,
    store: &RunStore,
    key: &str,
) -> anyhow::Result<()> {
    let Some(StoredPrompt { record, revision }) = store.prompt_at(key).await? else {
        store.drop_deadline(key).await?;
        return Ok(());
    };
    let record = match record.status {
        PromptStatus::Pending => {
            let closed = PromptRecord {
                status: PromptStatus::TimedOut,
                continuation_run_id: Some(format!("{}-timeout", record.prompt_id)),
                ..record
            };
            if store.replace_prompt(key, &closed, revision).await? == Written::MovedOn {
                return Ok(()); // answered meanwhile
            }
            closed
        }
        // Closed by a sweep that stopped before starting the continuation: start it now.
        PromptStatus::TimedOut => record,
        PromptStatus::Answered | PromptStatus::Cancelled => {
            store.drop_deadline(key).await?;
            return Ok(());
        }
    };
    start_continuation(js, names, &record).await?;
    store
        .prompt_closed(&record.owner, &record.prompt_id)
        .await?;
    store.drop_deadline(key).await?;
    tracing::info!(prompt.id = %record.prompt_id, "prompt timed out; the agent is told");
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
            parent_id: Some(record.parent_id.clone()),
        }),
        trace_id: None,
        agent: record.agent.clone(),
    };
    // A second timeout of the same prompt (another replica) is the same run: one message.
    platform::nats::publish_run(js, names, &task).await?;
    Ok(())
}
