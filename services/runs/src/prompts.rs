//! Answers to human-in-the-loop prompts, from any transport: the WebSocket's
//! `user_interaction_message` and AG-UI's `resume`. One store (the prompts bucket); the first
//! answer wins, a late one is refused with the prompt's own `error`, and a retried answer
//! (same continuation run) goes through again so its run is accepted exactly once.

use chrono::Utc;
use platform::lifecycle::RunBuckets;
use protocol::interaction::{PromptOutcome, PromptRecord, PromptStatus, prompt_key};
use protocol::messaging::Resumed;
use serde_json::Value;

/// What the user did with a prompt.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Reply {
    /// Answered (raw; checked against the prompt).
    Answer(Value),
    /// Abandoned.
    Cancel,
}

/// Why a prompt cannot be answered.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PromptError {
    /// No prompt with this id on this thread for this owner.
    #[error("no pending prompt with this id on this thread")]
    NotFound,
    /// Already answered, timed out or cancelled.
    #[error("this prompt was already {0}")]
    Closed(&'static str),
    /// Past its timeout: the prompt's `error`.
    #[error("{0}")]
    Expired(String),
    /// The answer does not fit the prompt.
    #[error("{0}")]
    BadAnswer(String),
    /// NATS failed.
    #[error(transparent)]
    Nats(#[from] anyhow::Error),
}

/// Closes the prompt `prompt_id` of `owner`'s thread with `reply`, for the continuation run
/// `run_id`, and returns what that run resumes with.
pub(crate) async fn answer(
    buckets: &RunBuckets,
    owner: &str,
    thread_id: &str,
    prompt_id: &str,
    reply: Reply,
    run_id: &str,
) -> Result<Resumed, PromptError> {
    let key = prompt_key(prompt_id);
    let mut round = 0;
    loop {
        let read = buckets
            .prompts
            .get_for_round::<PromptRecord>(&key, round)
            .await?;
        round += 1;
        let Some((record, revision)) = read else {
            return Err(PromptError::NotFound);
        };
        if record.owner != owner || record.thread_id != thread_id || record.prompt_id != prompt_id {
            return Err(PromptError::NotFound);
        }
        let resumed = |outcome| Resumed {
            prompt_id: prompt_id.to_owned(),
            prompt: record.prompt.clone(),
            outcome,
            parent_id: Some(record.parent_id.clone()),
        };
        match record.status {
            PromptStatus::Pending => {}
            // A retry of the answer that closed it: the same continuation again.
            PromptStatus::Answered | PromptStatus::Cancelled
                if record.continuation_run_id.as_deref() == Some(run_id) =>
            {
                let outcome = match (&record.status, &record.answer) {
                    (PromptStatus::Answered, Some(payload)) => PromptOutcome::Resolved {
                        payload: payload.clone(),
                    },
                    _ => PromptOutcome::Cancelled,
                };
                return Ok(resumed(outcome));
            }
            PromptStatus::Answered => return Err(PromptError::Closed("answered")),
            PromptStatus::Cancelled => return Err(PromptError::Closed("cancelled")),
            PromptStatus::TimedOut => {
                return Err(PromptError::Expired(record.prompt.error.clone()));
            }
        }
        if record.expired(Utc::now()) {
            return Err(PromptError::Expired(record.prompt.error.clone()));
        }
        let (status, answer, outcome) = match &reply {
            Reply::Answer(raw) => {
                let payload = record
                    .prompt
                    .check_answer(raw)
                    .map_err(PromptError::BadAnswer)?;
                (
                    PromptStatus::Answered,
                    Some(payload.clone()),
                    PromptOutcome::Resolved { payload },
                )
            }
            Reply::Cancel => (PromptStatus::Cancelled, None, PromptOutcome::Cancelled),
        };
        let closed = PromptRecord {
            status,
            answer,
            continuation_run_id: Some(run_id.to_owned()),
            ..record.clone()
        };
        if buckets
            .prompts
            .update(&key, &closed, revision)
            .await?
            .is_some()
        {
            buckets.prompt_deadlines.delete(&key).await?;
            // No longer one of the owner's pending prompts (see platform::owner_set).
            platform::owner_set::OwnerSet::pending_prompts(buckets.owner_budgets.clone())
                .leave(owner, prompt_id)
                .await?;
            return Ok(resumed(outcome));
        }
        // Someone else closed or changed it meanwhile: look again.
    }
}

/// The prompt `prompt_id` if it is `owner`'s, whatever its status.
pub(crate) async fn record(
    buckets: &RunBuckets,
    owner: &str,
    prompt_id: &str,
) -> anyhow::Result<Option<PromptRecord>> {
    Ok(buckets
        .prompts
        .get::<PromptRecord>(&prompt_key(prompt_id))
        .await?
        .map(|(record, _)| record)
        .filter(|r| r.owner == owner && r.prompt_id == prompt_id))
}

/// The prompt `prompt_id` if it is `owner`'s and still pending (for a reconnecting client).
pub(crate) async fn pending(
    buckets: &RunBuckets,
    owner: &str,
    prompt_id: &str,
) -> anyhow::Result<Option<PromptRecord>> {
    Ok(record(buckets, owner, prompt_id)
        .await?
        .filter(|r| r.status == PromptStatus::Pending))
}
