//! Acceptance of a validated run, idempotent per `(owner, threadId, runId)`.
//!
//! Every new run is published on the one RUNS queue subject with its run key (a digest of
//! owner, thread and run id) as message id, and JetStream stores one message per key within
//! the stream's duplicate window (`SB_NATS_RUNS_DEDUP_WINDOW_SECS`, 1 hour), atomically. A
//! duplicate is answered with the original's sequence; the stored task is read back there and
//! the caller gets the original answer (same body) or 409 (different body). So: one JetStream
//! write per accepted run, any number of concurrent duplicates make one task and one message,
//! and a retry is recognised for the duplicate window. The broker's memory follows the rate of
//! new runs times that window, not the number of runs the stream keeps (a subject per run cost
//! ~550 bytes each for 7 days: BENCHMARKS.md section 9). A retry later than the window is a new
//! run. History's `run_progress` is the durable record of every run (status lookups ask it).
//!
//! Under the `reject` policy the thread's lock is claimed first (one more write, in KV); under
//! `enqueue` the worker serialises runs per thread.

use async_nats::jetstream;
use chrono::Utc;
use platform::lifecycle::{Claim, RunBuckets};
use platform::nats::Published;
use protocol::messaging::{Names, Resumed, RunTaskV1};
use protocol::metadata::AttachedFile;
use protocol::{RunAgentInput, TaskAcceptedResponse};
use uuid::Uuid;

/// What to do with a new run on a thread whose previous run is still active.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActiveRunPolicy {
    /// Refuse it with 409.
    Reject,
    /// Accept it; the worker starts it when the thread is free.
    Enqueue,
}

impl std::str::FromStr for ActiveRunPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "reject" => Ok(Self::Reject),
            "enqueue" => Ok(Self::Enqueue),
            other => Err(format!("{other:?} is not a policy; use reject or enqueue")),
        }
    }
}

/// The longest a run waits to be counted among its owner's active runs (milliseconds
/// normally; a cut-off replica's KV read and write would otherwise wait out seconds each).
const ACTIVE_ENTER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// What acceptance can end in besides success.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AcceptError {
    /// The same `(threadId, runId)` was accepted before with a different body (409).
    #[error("run already accepted with a different body")]
    Conflict,
    /// Another run is still active on the thread and the policy is `reject` (409).
    #[error("another run is active on this thread")]
    ThreadBusy,
    /// The owner's bytes of runs for the day are spent (`SB_RUNS_OWNER_BYTES_PER_DAY`, 403).
    #[error("the owner's bytes of runs per day are spent")]
    OverBudget(crate::budget::Exhausted),
    /// The owner has the most runs queued or running it may (`SB_RUNS_MAX_ACTIVE_PER_OWNER`,
    /// 429).
    #[error("the owner has {} runs queued or running", .0.max)]
    TooManyActive(platform::owner_set::Full),
    /// NATS did not answer or acknowledge (503).
    #[error("NATS unavailable: {0:#}")]
    Unavailable(#[from] anyhow::Error),
}

/// Publishes accepted runs.
pub(crate) struct Acceptor {
    /// Sends the runs of concurrent requests to NATS together.
    publisher: platform::publish_batch::Batcher,
    runs: jetstream::stream::Stream,
    names: Names,
    buckets: RunBuckets,
    policy: ActiveRunPolicy,
    budget: std::sync::Arc<platform::budget::DailyBudget>,
    /// Each owner's runs queued or running, and how many may be.
    active: platform::owner_set::OwnerSet,
    max_active: usize,
}

impl Acceptor {
    pub(crate) fn new(
        js: jetstream::Context,
        runs: jetstream::stream::Stream,
        names: Names,
        buckets: RunBuckets,
        policy: ActiveRunPolicy,
        budget: std::sync::Arc<platform::budget::DailyBudget>,
        max_active: usize,
    ) -> Self {
        let active = platform::owner_set::OwnerSet::active_runs(buckets.owner_budgets.clone());
        Self {
            publisher: platform::publish_batch::Batcher::start(js),
            runs,
            names,
            buckets,
            policy,
            budget,
            active,
            max_active,
        }
    }

    /// Takes back what a run that was not stored after all (or was a retry of a stored one)
    /// took: its bytes of the day and its place among the owner's active runs.
    async fn undo(&self, task: &RunTaskV1, bytes: u64) {
        self.budget.refund(&task.owner, bytes, task.accepted_at);
        if self.max_active == 0 {
            return;
        }
        if let Err(err) = self
            .active
            .leave(&task.owner, &task.task_id.to_string())
            .await
        {
            // Counted until it is stale (a day): the owner may start one run fewer meanwhile.
            tracing::warn!(task.id = %task.task_id, error = format!("{err:#}"), "active run not taken back");
        }
    }

    /// Accepts the run (or recognises a retry of it) and returns the answer for the client,
    /// once JetStream holds the task.
    #[tracing::instrument(name = "runs.accept.publish", skip_all, fields(run.id = %input.run_id))]
    pub(crate) async fn accept(
        &self,
        owner: &str,
        input: RunAgentInput,
        attachments: Vec<AttachedFile>,
        conversation: bool,
        resumed: Option<Resumed>,
        agent: Option<String>,
    ) -> Result<TaskAcceptedResponse, AcceptError> {
        let task = RunTaskV1 {
            task_id: Uuid::now_v7(),
            owner: owner.to_owned(),
            accepted_at: Utc::now(),
            input,
            attachments,
            conversation,
            resumed,
            trace_id: platform::telemetry::current_trace_id(),
            agent,
        };
        let thread_id = task.input.thread_id.as_str();
        // What the run costs the shared stream, from the owner's budget of the day (given back
        // if it is not stored after all, or is a retry of a run stored before).
        let payload = platform::nats::run_payload(&task)?;
        let bytes = u64::try_from(payload.len()).unwrap_or(u64::MAX);
        if let Err(exhausted) = self.budget.spend(owner, bytes, task.accepted_at).await? {
            return Err(AcceptError::OverBudget(exhausted));
        }
        // One of the owner's active runs from now until its worker writes its end (unless
        // they are not counted: `SB_RUNS_MAX_ACTIVE_PER_OWNER=0`).
        let entered = if self.max_active == 0 {
            Ok(Ok(()))
        } else {
            // Bounded: a replica cut off from the bus with the record's leader answers 503 at
            // once rather than after a read and a write each waited out their timeouts.
            tokio::time::timeout(
                ACTIVE_ENTER_TIMEOUT,
                self.active.enter(
                    owner,
                    &task.task_id.to_string(),
                    task.accepted_at,
                    self.max_active,
                ),
            )
            .await
            .unwrap_or_else(|_| {
                Err(anyhow::anyhow!(
                    "counting the owner's active runs timed out"
                ))
            })
        };
        match entered {
            Ok(Ok(())) => {}
            Ok(Err(full)) => {
                self.budget.refund(owner, bytes, task.accepted_at);
                return Err(AcceptError::TooManyActive(full));
            }
            Err(err) => {
                self.budget.refund(owner, bytes, task.accepted_at);
                return Err(err.into());
            }
        }
        let reject = self.policy == ActiveRunPolicy::Reject;
        if reject {
            // A retry of the holder's own run is not "busy": JetStream recognises it below.
            let claim = match self.buckets.claim_thread(&task, false).await {
                Ok(claim) => claim,
                Err(err) => {
                    self.undo(&task, bytes).await;
                    return Err(err.into());
                }
            };
            if claim == Claim::Busy {
                self.undo(&task, bytes).await;
                return Err(AcceptError::ThreadBusy);
            }
        }
        let published =
            match platform::nats::publish_run_batched(&self.publisher, &self.names, &task, payload)
                .await
            {
                Ok(published) => published,
                Err(err) => {
                    self.undo(&task, bytes).await;
                    return Err(err.into());
                }
            };
        match published {
            Published::New(_) => {
                if reject {
                    self.buckets
                        .mark_published(owner, thread_id, task.task_id)
                        .await?;
                }
                metrics::counter!("switchboard_runs_accepted_total").increment(1);
                // Not a line per run at the deployment's level: ~200 bytes of JSON and a write
                // per run (3 MB/s at 15k runs/s, up to ~10 % of a run's CPU: BENCHMARKS.md
                // section 2). The count is a metric, the run is in history;
                // `RUST_LOG=switchboard_runs=debug` shows each.
                tracing::debug!(task.id = %task.task_id, run.id = %task.input.run_id, "run accepted");
                Ok(response(&task))
            }
            Published::Duplicate(seq) => {
                self.undo(&task, bytes).await;
                if reject {
                    self.buckets
                        .release_thread(owner, thread_id, task.task_id)
                        .await?;
                }
                let original =
                    platform::nats::task_at(&self.runs, seq)
                        .await?
                        .ok_or_else(|| {
                            anyhow::anyhow!("JetStream refused a duplicate run it does not hold")
                        })?;
                answer_retry(&task, original)
            }
        }
    }
}

/// A retry with the same body gets the original answer; another body is a conflict. (The
/// agent is not compared: a retry keeps the agent its original was accepted for.)
fn answer_retry(
    task: &RunTaskV1,
    original: RunTaskV1,
) -> Result<TaskAcceptedResponse, AcceptError> {
    if original.owner == task.owner
        && original.input == task.input
        && original.attachments == task.attachments
        && original.conversation == task.conversation
        && original.resumed == task.resumed
    {
        metrics::counter!("switchboard_runs_retries_recognised_total").increment(1);
        tracing::info!(task.id = %original.task_id, "retried run request answered with the original task");
        Ok(response(&original))
    } else {
        Err(AcceptError::Conflict)
    }
}

fn response(task: &RunTaskV1) -> TaskAcceptedResponse {
    TaskAcceptedResponse {
        task_id: task.task_id.to_string(),
        thread_id: task.input.thread_id.clone(),
        run_id: task.input.run_id.clone(),
        created: task.accepted_at,
    }
}
