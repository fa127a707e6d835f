//! Every read and write the worker makes in the run lifecycle's KV buckets: a run's status
//! record, its thread's lock, the prompts its agent asks and their deadlines. Each operation is
//! one small function named for what it does; it computes its keys itself, so the consumer and
//! the deadline sweep hold only the lifecycle's rules. The guarantees live in the writes: a
//! status record is created only if absent (a cancel may have created it first) and changed
//! only by compare-and-set, so two workers or a worker and a cancel never overwrite each other.

use chrono::{DateTime, Utc};
use platform::lifecycle::{Claim, RunBuckets};
use platform::nats::Created;
use protocol::interaction::{PromptRecord, ThreadPrompt, prompt_key, thread_prompt_key};
use protocol::messaging::{RunStatus, RunStatusRecord, RunTaskV1, status_key};

use crate::registry::AgentSet;

/// How a run ended: its final status and, when it failed, why (safe to show).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunEnd {
    /// The status the run's record ends with.
    pub(crate) status: RunStatus,
    /// Why it failed, safe to show; `None` when it did not.
    pub(crate) error: Option<String>,
    /// The tokens it used.
    pub(crate) usage: Vec<protocol::usage::TokenUsage>,
    /// When it started and first showed output.
    pub(crate) times: crate::sink::RunTimes,
}

impl RunEnd {
    /// A run ended with `status`, and `error` when it failed.
    pub(crate) fn new(status: RunStatus, error: Option<String>) -> Self {
        Self {
            status,
            error,
            usage: Vec::new(),
            times: crate::sink::RunTimes::default(),
        }
    }

    /// The same end, having used `usage`.
    pub(crate) fn with_usage(mut self, usage: Vec<protocol::usage::TokenUsage>) -> Self {
        self.usage = usage;
        self
    }

    /// The same end, of a run that started and first showed output at `times`.
    pub(crate) fn with_times(mut self, times: crate::sink::RunTimes) -> Self {
        self.times = times;
        self
    }
}

/// What [`RunStore::mark_running`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Started {
    /// The run may go on: its record says running now, or held a status without a cancel.
    Running,
    /// A cancel reached the run before its worker did: the run starts cancelled.
    Cancelled,
}

/// A prompt as stored, with the revision a compare-and-set write must name.
#[derive(Debug, Clone)]
pub(crate) struct StoredPrompt {
    /// The prompt.
    pub(crate) record: PromptRecord,
    /// Its KV revision when read.
    pub(crate) revision: u64,
}

/// The outcome of a compare-and-set write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Written {
    /// The value is stored.
    Stored,
    /// The key moved on since it was read (someone else wrote first); nothing was written.
    MovedOn,
}

/// A change in the prompt deadlines bucket, as its watch reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeadlineChange {
    /// The prompt's key (the same in the prompts and deadlines buckets).
    pub(crate) key: String,
    /// Its deadline; `None` for a deleted deadline, a prompt without one, or an undecodable one.
    pub(crate) deadline: Option<DateTime<Utc>>,
}

/// The worker's view of the run lifecycle buckets (cheap to clone: the buckets are handles).
#[derive(Clone)]
pub(crate) struct RunStore {
    buckets: RunBuckets,
    /// Each owner's prompts waiting for an answer, and how many may be.
    pending_prompts: platform::owner_set::OwnerSet,
    max_pending_prompts: usize,
    /// Each owner's active runs (a run leaves as its end is written).
    active_runs: platform::owner_set::OwnerSet,
    /// Where runs' tokens are charged to their owners.
    tokens: std::sync::Arc<platform::tokens::TokenLedger>,
}

impl RunStore {
    /// The store of the run lifecycle buckets (opened by [`platform::lifecycle::ensure_run_buckets`]).
    pub(crate) fn new(buckets: RunBuckets, max_pending_prompts: usize) -> Self {
        let pending_prompts =
            platform::owner_set::OwnerSet::pending_prompts(buckets.owner_budgets.clone());
        let active_runs = platform::owner_set::OwnerSet::active_runs(buckets.owner_budgets.clone());
        let tokens = std::sync::Arc::new(platform::tokens::TokenLedger::new(
            buckets.owner_tokens.clone(),
        ));
        Self {
            buckets,
            pending_prompts,
            max_pending_prompts,
            active_runs,
            tokens,
        }
    }

    /// Where runs' tokens are charged to their owners.
    pub(crate) fn token_ledger(&self) -> std::sync::Arc<platform::tokens::TokenLedger> {
        std::sync::Arc::clone(&self.tokens)
    }

    /// Writes the card of every agent this worker runs to the agents bucket.
    pub(crate) async fn register_agents(&self, agents: &AgentSet) -> anyhow::Result<()> {
        agents.register(&self.buckets.agents).await
    }

    /// The status record of the task's run, if it has one.
    pub(crate) async fn status_of(
        &self,
        task: &RunTaskV1,
    ) -> anyhow::Result<Option<RunStatusRecord>> {
        let key = task_status_key(task);
        let record = self.buckets.run_status.get::<RunStatusRecord>(&key).await?;
        Ok(record.map(|(record, _)| record))
    }

    /// Creates the run's status record, running and alive now, unless a record exists: then
    /// says whether a cancel is in it (it came first, so the run starts cancelled).
    pub(crate) async fn mark_running(&self, task: &RunTaskV1) -> anyhow::Result<Started> {
        let key = task_status_key(task);
        let running = RunStatusRecord::running(task, Utc::now());
        if self.buckets.run_status.create(&key, &running).await? == Created::Exists {
            let existing = self.buckets.run_status.get::<RunStatusRecord>(&key).await?;
            if existing.is_some_and(|(record, _)| cancelled_first(&record)) {
                return Ok(Started::Cancelled);
            }
        }
        Ok(Started::Running)
    }

    /// Records that the task's run is alive now (`alive_at`), while its record says running.
    pub(crate) async fn heartbeat(&self, task: &RunTaskV1) -> anyhow::Result<()> {
        let now = Utc::now();
        let key = task_status_key(task);
        self.buckets
            .run_status
            .modify::<RunStatusRecord, _>(&key, |record| with_heartbeat(record, now))
            .await?;
        Ok(())
    }

    /// Records how the task's run ended, unless its record has that status already.
    pub(crate) async fn finish(&self, task: &RunTaskV1, end: &RunEnd) -> anyhow::Result<()> {
        let now = Utc::now();
        let key = task_status_key(task);
        self.buckets
            .run_status
            .modify::<RunStatusRecord, _>(&key, |record| with_end(record, end, now))
            .await?;
        // No longer one of the owner's active runs (idempotent: a redelivered end finds it out).
        if let Err(err) = self
            .active_runs
            .leave(&task.owner, &task.task_id.to_string())
            .await
        {
            // Counted until it is stale (a day): the owner may start one run fewer meanwhile.
            tracing::warn!(task.id = %task.task_id, error = format!("{err:#}"), "active run not taken back");
        }
        Ok(())
    }

    /// Takes the lock of the task's thread for it (the task is in the RUNS stream: the worker
    /// pulled it); a lock held by a run that ended is taken over.
    pub(crate) async fn claim_thread(&self, task: &RunTaskV1) -> anyhow::Result<Claim> {
        self.buckets.claim_thread(task, true).await
    }

    /// Releases the lock of the task's thread if the task holds it.
    pub(crate) async fn release_thread(&self, task: &RunTaskV1) -> anyhow::Result<()> {
        self.buckets
            .release_thread(&task.owner, &task.input.thread_id, task.task_id)
            .await
    }

    /// Stores `record` unless its prompt is stored already (a redelivered run asks again), and
    /// returns the prompt as stored.
    /// The thread's pointer to its last prompt ([`thread_prompt_key`]) is written too, so a
    /// client joining the thread finds the question.
    /// Past the owner's most pending prompts, an [`AgentFailure`](crate::agent::AgentFailure)
    /// `quota_exceeded` naming the setting.
    pub(crate) async fn save_prompt(&self, record: PromptRecord) -> anyhow::Result<PromptRecord> {
        let key = prompt_key(&record.prompt_id);
        let entered = self
            .pending_prompts
            .enter(
                &record.owner,
                &record.prompt_id,
                record.created_at,
                self.max_pending_prompts,
            )
            .await?;
        if let Err(full) = entered {
            return Err(crate::agent::AgentFailure {
                code: "quota_exceeded",
                message: format!(
                    "you have {} questions from agents waiting for your answer, the most you may \
                     (SB_WORKER_MAX_PENDING_PROMPTS_PER_OWNER); answer or cancel some first",
                    full.max
                ),
            }
            .into());
        }
        let pointer = ThreadPrompt {
            prompt_id: record.prompt_id.clone(),
            task_id: record.task_id,
        };
        self.buckets
            .prompts
            .put(
                &thread_prompt_key(&record.owner, &record.thread_id),
                &pointer,
            )
            .await?;
        match self.buckets.prompts.create(&key, &record).await? {
            Created::Created(_) => Ok(record),
            Created::Exists => self
                .buckets
                .prompts
                .get::<PromptRecord>(&key)
                .await?
                .map(|(stored, _)| stored)
                .ok_or_else(|| anyhow::anyhow!("prompt {key} vanished")),
        }
    }

    /// Writes the prompt's deadline (`expires_at`) for the sweep to enforce.
    pub(crate) async fn set_deadline(&self, record: &PromptRecord) -> anyhow::Result<()> {
        let key = prompt_key(&record.prompt_id);
        self.buckets
            .prompt_deadlines
            .put(&key, &record.expires_at)
            .await?;
        Ok(())
    }

    /// Every current prompt deadline, then every change to them; ends when the watch fails.
    pub(crate) async fn watch_deadlines(
        &self,
    ) -> anyhow::Result<impl futures::Stream<Item = DeadlineChange> + Send + 'static> {
        use futures::StreamExt as _;
        let changes = self
            .buckets
            .prompt_deadlines
            .watch_all::<Option<DateTime<Utc>>>()
            .await?;
        Ok(changes.map(|(key, deadline)| DeadlineChange {
            key,
            deadline: deadline.flatten(),
        }))
    }

    /// The prompt under `key` (a deadline's key), if it exists.
    pub(crate) async fn prompt_at(&self, key: &str) -> anyhow::Result<Option<StoredPrompt>> {
        let stored = self.buckets.prompts.get::<PromptRecord>(key).await?;
        Ok(stored.map(|(record, revision)| StoredPrompt { record, revision }))
    }

    /// Replaces the prompt under `key` with `record` if it is still at `revision`.
    pub(crate) async fn replace_prompt(
        &self,
        key: &str,
        record: &PromptRecord,
        revision: u64,
    ) -> anyhow::Result<Written> {
        let written = self.buckets.prompts.update(key, record, revision).await?;
        Ok(match written {
            Some(_) => Written::Stored,
            None => Written::MovedOn,
        })
    }

    /// The prompt `prompt_id` of `owner` no longer waits (timed out).
    pub(crate) async fn prompt_closed(&self, owner: &str, prompt_id: &str) -> anyhow::Result<()> {
        self.pending_prompts.leave(owner, prompt_id).await
    }

    /// Removes the deadline under `key` (enforced, or its prompt closed or gone).
    pub(crate) async fn drop_deadline(&self, key: &str) -> anyhow::Result<()> {
        self.buckets.prompt_deadlines.delete(key).await
    }
}

/// The key of the task's status record.
fn task_status_key(task: &RunTaskV1) -> String {
    status_key(&task.owner, &task.input.run_id, task.task_id)
}

/// Whether a status record found when starting says the run was cancelled first.
fn cancelled_first(record: &RunStatusRecord) -> bool {
    record.cancel_requested || record.status == RunStatus::Cancelled
}

/// `record` alive at `now`; `None` (no write) unless it is running: a heartbeat must not bring
/// an ended run back to life.
fn with_heartbeat(record: &RunStatusRecord, now: DateTime<Utc>) -> Option<RunStatusRecord> {
    (record.status == RunStatus::Running).then(|| RunStatusRecord {
        alive_at: Some(now),
        ..record.clone()
    })
}

/// `record` ended as `end` at `now`, its cancel request settled; `None` (no write) when it has
/// that status already, so a redelivered end changes nothing.
/// The record with the run's end, unless it has ended already: the first end written stays
/// (a worker cut off from NATS whose run another worker ended must not overwrite that end).
fn with_end(record: &RunStatusRecord, end: &RunEnd, now: DateTime<Utc>) -> Option<RunStatusRecord> {
    (!record.status.is_terminal() && record.status != end.status).then(|| RunStatusRecord {
        status: end.status,
        cancel_requested: false,
        updated_at: now,
        error: end.error.clone(),
        usage: end.usage.clone(),
        timings: Some(protocol::usage::RunTimings::of(
            record.created,
            end.times.started_at,
            end.times.first_output_at,
            now,
        )),
        ..record.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn task() -> RunTaskV1 {
        serde_json::from_value(json!({
            "task_id": "0190c3a0-0000-7000-8000-000000000001",
            "owner": "user-1",
            "accepted_at": "2025-01-01T00:00:00Z",
            "input": {"threadId": "th", "runId": "r1",
                      "messages": [{"role": "user", "id": "u1", "content": "hi"}]},
        }))
        .unwrap()
    }

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_750_000_000 + secs, 0).unwrap()
    }

    fn record(status: RunStatus) -> RunStatusRecord {
        RunStatusRecord {
            status,
            ..RunStatusRecord::running(&task(), at(0))
        }
    }

    #[test]
    fn a_started_run_is_recorded_running_and_alive_with_its_ids() {
        let task = task();
        let started = RunStatusRecord::running(&task, at(5));
        assert_eq!(started.task_id, task.task_id);
        assert_eq!(started.owner, "user-1");
        assert_eq!(started.thread_id, "th");
        assert_eq!(started.run_id, "r1");
        assert_eq!(started.status, RunStatus::Running);
        assert!(!started.cancel_requested, "a new record carries no cancel");
        assert_eq!(
            started.created, task.accepted_at,
            "created is when the run was accepted"
        );
        assert_eq!(started.updated_at, at(5));
        assert_eq!(started.alive_at, Some(at(5)));
        assert_eq!(started.error, None);
    }

    #[test]
    fn a_run_starts_cancelled_when_a_cancel_was_requested_or_recorded_first() {
        assert!(!cancelled_first(&record(RunStatus::Queued)));
        assert!(!cancelled_first(&record(RunStatus::Running)));
        assert!(cancelled_first(&record(RunStatus::Cancelled)));
        let requested = RunStatusRecord {
            cancel_requested: true,
            ..record(RunStatus::Queued)
        };
        assert!(cancelled_first(&requested));
    }

    #[test]
    fn a_heartbeat_moves_only_alive_at_and_only_of_a_running_record() {
        let beaten = with_heartbeat(&record(RunStatus::Running), at(9))
            .expect("a running record takes the heartbeat");
        assert_eq!(beaten.alive_at, Some(at(9)));
        assert_eq!(
            beaten,
            RunStatusRecord {
                alive_at: Some(at(9)),
                ..record(RunStatus::Running)
            },
            "nothing but alive_at changes",
        );
        for ended in [
            RunStatus::Queued,
            RunStatus::Completed,
            RunStatus::Failed,
            RunStatus::Cancelled,
        ] {
            assert_eq!(
                with_heartbeat(&record(ended), at(9)),
                None,
                "{ended:?} is left alone"
            );
        }
    }

    #[test]
    fn an_end_records_status_error_and_time_and_settles_the_cancel_request() {
        let running = RunStatusRecord {
            cancel_requested: true,
            ..record(RunStatus::Running)
        };
        let end = RunEnd::new(RunStatus::Cancelled, Some("why".to_owned()));
        let ended = with_end(&running, &end, at(7)).expect("a running record takes the end");
        assert_eq!(ended.status, RunStatus::Cancelled);
        assert_eq!(ended.error.as_deref(), Some("why"));
        assert_eq!(ended.updated_at, at(7));
        assert!(
            !ended.cancel_requested,
            "the cancel request is settled by the end"
        );
        assert_eq!(
            ended.alive_at, running.alive_at,
            "the last heartbeat is kept"
        );
    }

    #[test]
    fn an_end_already_recorded_writes_nothing() {
        let end = RunEnd::new(RunStatus::Completed, None);
        assert_eq!(with_end(&record(RunStatus::Completed), &end, at(7)), None);
    }
}
