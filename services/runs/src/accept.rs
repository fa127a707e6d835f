//! Acceptance of a validated run: publish to JetStream, wait for the ack, answer.
//!
//! The JetStream message id is derived from `(owner, threadId, runId)`, so a retried request
//! inside the stream's duplicate window is recognised by the server itself: we then read the
//! original task back and answer with it (same body) or refuse (different body).

use async_nats::jetstream;
use chrono::Utc;
use protocol::RunAgentInput;
use protocol::TaskAcceptedResponse;
use protocol::messaging::{Names, RunTask, RunTaskV1};
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// What acceptance can end in besides success.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AcceptError {
    /// The same `(threadId, runId)` was accepted before with a different body (409).
    #[error("run already accepted with a different body")]
    Conflict,
    /// NATS did not acknowledge the publish (503).
    #[error("publish not acknowledged: {0:#}")]
    Unavailable(anyhow::Error),
}

/// Publishes accepted runs.
pub(crate) struct Acceptor {
    js: jetstream::Context,
    names: Names,
}

impl Acceptor {
    pub(crate) fn new(js: jetstream::Context, names: Names) -> Self {
        Self { js, names }
    }

    /// Publishes the run and returns the answer for the client, once JetStream has it.
    pub(crate) async fn accept(
        &self,
        owner: &str,
        input: RunAgentInput,
    ) -> Result<TaskAcceptedResponse, AcceptError> {
        let task = RunTaskV1 {
            task_id: Uuid::now_v7(),
            owner: owner.to_owned(),
            accepted_at: Utc::now(),
            input,
        };
        let payload = serde_json::to_vec(&RunTask::V1(task.clone()))
            .map_err(|e| AcceptError::Unavailable(e.into()))?;
        let msg_id = dedup_id(owner, &task.input.thread_id, &task.input.run_id);
        let headers = platform::nats::publish_headers(&msg_id);
        let ack = self
            .js
            .publish_with_headers(
                self.names.run_accepted_subject(task.task_id),
                headers,
                payload.into(),
            )
            .await
            .map_err(|e| AcceptError::Unavailable(e.into()))?
            .await
            .map_err(|e| AcceptError::Unavailable(e.into()))?;
        if !ack.duplicate {
            tracing::info!(task.id = %task.task_id, run.id = %task.input.run_id, "run accepted");
            return Ok(response(&task));
        }
        let original = self
            .stored_task(ack.sequence)
            .await
            .map_err(AcceptError::Unavailable)?;
        if original.owner == task.owner && original.input == task.input {
            tracing::info!(task.id = %original.task_id, "duplicate run request answered with the original task");
            Ok(response(&original))
        } else {
            Err(AcceptError::Conflict)
        }
    }

    async fn stored_task(&self, sequence: u64) -> anyhow::Result<RunTaskV1> {
        let stream = self.js.get_stream(self.names.runs_stream()).await?;
        let message = stream.get_raw_message(sequence).await?;
        let RunTask::V1(task) = serde_json::from_slice(&message.payload)?;
        Ok(task)
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

/// JetStream de-duplication id of a run: a digest of who asked and which run, never the raw ids.
fn dedup_id(owner: &str, thread_id: &str, run_id: &str) -> String {
    let mut hasher = Sha256::new();
    for part in [owner, thread_id, run_id] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    hex::encode(hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::dedup_id;

    #[test]
    fn dedup_ids_differ_when_a_boundary_moves_between_fields() {
        assert_ne!(dedup_id("ab", "c", "d"), dedup_id("a", "bc", "d"));
        assert_eq!(dedup_id("a", "b", "c"), dedup_id("a", "b", "c"));
    }
}
