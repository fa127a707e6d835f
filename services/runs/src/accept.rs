//! Acceptance of a validated run, idempotent per `(owner, threadId, runId)`.
//!
//! 1. The idempotency record is created atomically in KV (`create` fails if it exists), so of
//!    any number of concurrent duplicates exactly one mints the task id; the others adopt it.
//! 2. Under the `reject` policy the thread's lock is claimed for the task (409 if another run is
//!    still active on the thread); under `enqueue` the worker serialises runs per thread.
//! 3. The task is published with its task id as JetStream message id, so a duplicate that
//!    publishes again is dropped by the server: one task, one message.
//! 4. Only after the publish ack is the record marked published and the client answered 202.

use async_nats::jetstream;
use chrono::{DateTime, Utc};
use platform::nats::{Created, RunBuckets};
use protocol::messaging::{
    Names, RunStatus, RunStatusRecord, RunTask, RunTaskV1, run_key, run_lookup_key, status_key,
};
use protocol::{RunAgentInput, TaskAcceptedResponse};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
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

/// What acceptance can end in besides success.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AcceptError {
    /// The same `(threadId, runId)` was accepted before with a different body (409).
    #[error("run already accepted with a different body")]
    Conflict,
    /// Another run is still active on the thread and the policy is `reject` (409).
    #[error("another run is active on this thread")]
    ThreadBusy,
    /// NATS did not answer or acknowledge (503).
    #[error("NATS unavailable: {0:#}")]
    Unavailable(#[from] anyhow::Error),
}

/// The idempotency record of one `(owner, threadId, runId)`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct AcceptedRecord {
    owner: String,
    task_id: Uuid,
    accepted_at: DateTime<Utc>,
    body_sha256: String,
    published: bool,
}

/// Publishes accepted runs.
pub(crate) struct Acceptor {
    js: jetstream::Context,
    names: Names,
    buckets: RunBuckets,
    policy: ActiveRunPolicy,
}

impl Acceptor {
    pub(crate) fn new(
        js: jetstream::Context,
        names: Names,
        buckets: RunBuckets,
        policy: ActiveRunPolicy,
    ) -> Self {
        Self {
            js,
            names,
            buckets,
            policy,
        }
    }

    /// Accepts the run (or recognises a retry of it) and returns the answer for the client,
    /// once JetStream holds the task.
    pub(crate) async fn accept(
        &self,
        owner: &str,
        input: RunAgentInput,
    ) -> Result<TaskAcceptedResponse, AcceptError> {
        let body_sha256 = hex::encode(Sha256::digest(
            serde_json::to_vec(&input).map_err(anyhow::Error::from)?,
        ));
        let key = run_key(owner, &input.thread_id, &input.run_id);
        let (record, created_here) = self.record(&key, owner, body_sha256.clone()).await?;
        if record.owner != owner || record.body_sha256 != body_sha256 {
            return Err(AcceptError::Conflict);
        }
        let task = RunTaskV1 {
            task_id: record.task_id,
            owner: owner.to_owned(),
            accepted_at: record.accepted_at,
            input,
        };
        if record.published {
            tracing::info!(task.id = %task.task_id, "retried run request answered with the original task");
            return Ok(response(&task));
        }
        if self.policy == ActiveRunPolicy::Reject
            && !self
                .buckets
                .claim_thread(owner, &task.input.thread_id, task.task_id)
                .await?
        {
            if created_here {
                self.buckets.run_keys.delete(&key).await?;
            }
            return Err(AcceptError::ThreadBusy);
        }
        let now = Utc::now();
        let status = RunStatusRecord {
            task_id: task.task_id,
            owner: owner.to_owned(),
            thread_id: task.input.thread_id.clone(),
            run_id: task.input.run_id.clone(),
            status: RunStatus::Queued,
            cancel_requested: false,
            created: task.accepted_at,
            updated_at: now,
            error: None,
        };
        self.buckets
            .run_status
            .create(&status_key(task.task_id), &status)
            .await?;
        self.buckets
            .run_status
            .put(&run_lookup_key(owner, &task.input.run_id), &task.task_id)
            .await?;
        self.publish(&task).await?;
        self.buckets
            .run_keys
            .modify::<AcceptedRecord, _>(&key, |r| {
                (!r.published).then(|| AcceptedRecord {
                    published: true,
                    ..r.clone()
                })
            })
            .await?;
        tracing::info!(task.id = %task.task_id, run.id = %task.input.run_id, "run accepted");
        Ok(response(&task))
    }

    /// The idempotency record under `key`: created now, or the one a previous request made.
    async fn record(
        &self,
        key: &str,
        owner: &str,
        body_sha256: String,
    ) -> anyhow::Result<(AcceptedRecord, bool)> {
        let fresh = AcceptedRecord {
            owner: owner.to_owned(),
            task_id: Uuid::now_v7(),
            accepted_at: Utc::now(),
            body_sha256,
            published: false,
        };
        loop {
            if let Created::Created(_) = self.buckets.run_keys.create(key, &fresh).await? {
                return Ok((fresh, true));
            }
            if let Some((existing, _)) = self.buckets.run_keys.get::<AcceptedRecord>(key).await? {
                return Ok((existing, false));
            }
            // Deleted between our create and get (a rejected duplicate cleaned up): try again.
        }
    }

    async fn publish(&self, task: &RunTaskV1) -> anyhow::Result<()> {
        let payload = serde_json::to_vec(&RunTask::V1(task.clone()))?;
        let headers = platform::nats::publish_headers(&task.task_id.to_string());
        self.js
            .publish_with_headers(
                self.names.run_accepted_subject(task.task_id),
                headers,
                payload.into(),
            )
            .await?
            .await?;
        Ok(())
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
