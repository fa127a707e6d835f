//! NATS names and the messages that travel on them.
//!
//! Every stream, subject and consumer is named here; services never spell one as a literal.
//! A deployment (or a test) picks a prefix, so several can share one NATS server.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::agui::Event;
use crate::run_input::RunAgentInput;

/// Header carrying the JetStream de-duplication id.
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";
/// Header carrying the W3C trace context.
pub const TRACEPARENT_HEADER: &str = "traceparent";

/// Queue group of the attachments service's request/reply endpoints (one replica answers).
pub const ATTACHMENTS_QUEUE: &str = "attachments";

/// Durable consumer of accepted runs used by the worker.
pub const WORKER_CONSUMER: &str = "worker";
/// Durable consumer of accepted runs used by history (persists the user message).
pub const HISTORY_RUNS_CONSUMER: &str = "history-runs";
/// Durable consumer of run events used by history (persists the agent's messages).
pub const HISTORY_EVENTS_CONSUMER: &str = "history-events";
/// Queue group of the history service's request/reply endpoints (one replica answers).
pub const HISTORY_QUEUE: &str = "history";

/// The names of one deployment's streams and subjects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    prefix: String,
}

/// A prefix that cannot be used in NATS subjects and stream names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("NATS prefix {0:?} must be 1-32 characters of A-Z, a-z, 0-9, '_' or '-'")]
pub struct InvalidPrefix(pub String);

impl Names {
    /// Names under `prefix`, which must be a single safe subject token.
    pub fn new(prefix: &str) -> Result<Self, InvalidPrefix> {
        let valid = !prefix.is_empty()
            && prefix.len() <= 32
            && prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if valid {
            Ok(Self {
                prefix: prefix.to_owned(),
            })
        } else {
            Err(InvalidPrefix(prefix.to_owned()))
        }
    }

    /// The prefix itself.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Stream of accepted runs (one message per task).
    pub fn runs_stream(&self) -> String {
        format!(
            "{}_RUNS",
            self.prefix.to_ascii_uppercase().replace('-', "_")
        )
    }

    /// Subjects captured by [`Self::runs_stream`].
    pub fn runs_subjects(&self) -> String {
        format!("{}.runs.accepted.>", self.prefix)
    }

    /// Subject every new run is published on. One subject for all runs: a subject per run
    /// would cost the broker ~550 bytes of memory for as long as the stream keeps the run
    /// (BENCHMARKS.md section 9). Idempotency comes from the message id ([`run_key`]) inside the
    /// stream's duplicate window; the durable record of every run is history's `run_progress`.
    pub fn run_queue_subject(&self) -> String {
        format!("{}.runs.accepted.q", self.prefix)
    }

    /// Stream of run events (every event of every run, in per-run order).
    pub fn run_events_stream(&self) -> String {
        format!(
            "{}_RUN_EVENTS",
            self.prefix.to_ascii_uppercase().replace('-', "_")
        )
    }

    /// Subjects captured by [`Self::run_events_stream`].
    pub fn run_events_subjects(&self) -> String {
        format!("{}.runs.events.>", self.prefix)
    }

    /// Where the RUN_EVENTS stream republishes each event it stored (`<p>.runs.live.<taskId>`):
    /// what live readers subscribe to, so they never see an event the log refused (a fenced
    /// writer's, see `platform::nats::publish_fenced`) or did not store.
    pub fn run_events_live_subjects(&self) -> String {
        format!("{}.runs.live.>", self.prefix)
    }

    /// Subject of one task's events.
    pub fn run_event_subject(&self, task_id: Uuid) -> String {
        format!("{}.runs.events.{task_id}", self.prefix)
    }

    /// Core NATS subject on which a cancel request for one task is broadcast to the workers.
    pub fn run_cancel_subject(&self, task_id: Uuid) -> String {
        format!("{}.runs.cancel.{task_id}", self.prefix)
    }

    /// Subjects of every cancel request.
    pub fn run_cancel_subjects(&self) -> String {
        format!("{}.runs.cancel.*", self.prefix)
    }

    /// Request/reply subject of the attachments service's resolve endpoint.
    pub fn attachments_resolve_subject(&self) -> String {
        format!("{}.attachments.resolve", self.prefix)
    }

    /// Request/reply subject of the attachments service's bulk download signing.
    pub fn attachments_sign_subject(&self) -> String {
        format!("{}.attachments.sign", self.prefix)
    }

    /// Request/reply subject on which the worker registers a generated file.
    pub fn attachments_register_subject(&self) -> String {
        format!("{}.attachments.register", self.prefix)
    }

    /// Request/reply subject on which the worker asks for an upload form for a generated file
    /// too large to register inline.
    pub fn attachments_generated_upload_subject(&self) -> String {
        format!("{}.attachments.generated-upload", self.prefix)
    }

    /// Request/reply subject on which history says how far it has written a run's events.
    pub fn history_progress_subject(&self) -> String {
        format!("{}.history.progress", self.prefix)
    }

    /// Request/reply subject on which history finds an owner's latest run with a run id.
    pub fn history_run_lookup_subject(&self) -> String {
        format!("{}.history.run-lookup", self.prefix)
    }

    /// Request/reply subject on which history answers a thread's earlier messages in AG-UI form
    /// (for a remote agent, which keeps nothing between runs).
    pub fn history_thread_messages_subject(&self) -> String {
        format!("{}.history.thread-messages", self.prefix)
    }

    /// Request/reply subject on which history renames an owner's thread (the runs service
    /// serves `PATCH /api/v1/agent/threads/{threadId}`).
    pub fn history_thread_rename_subject(&self) -> String {
        format!("{}.history.thread-rename", self.prefix)
    }

    /// Request/reply subject on which history erases an owner's thread everywhere (the runs
    /// service serves `DELETE /api/v1/agent/threads/{threadId}`).
    pub fn history_thread_erase_subject(&self) -> String {
        format!("{}.history.thread-erase", self.prefix)
    }

    /// Request/reply subject on which history erases an owner (`DELETE /api/v1/agent/me`).
    pub fn history_owner_erase_subject(&self) -> String {
        format!("{}.history.owner-erase", self.prefix)
    }

    /// Request/reply subject on which attachments drops an owner's files of a session, or all
    /// of them (asked by history as it erases a thread or an owner).
    pub fn attachments_erase_subject(&self) -> String {
        format!("{}.attachments.erase", self.prefix)
    }

    /// Request/reply subject on which history forks an owner's thread (the runs service serves
    /// `POST /api/v1/agent/threads/{threadId}/fork`).
    pub fn history_thread_fork_subject(&self) -> String {
        format!("{}.history.thread-fork", self.prefix)
    }

    /// Request/reply subject on which attachments links a session's files to another session
    /// of the owner (asked by history as it forks a thread).
    pub fn attachments_link_subject(&self) -> String {
        format!("{}.attachments.link", self.prefix)
    }

    /// Core NATS subject on which the runs replica that erased a thread tells every replica
    /// (payload: the thread's lock key, [`thread_lock_key`]): their streams of it end.
    pub fn threads_erased_subject(&self) -> String {
        format!("{}.threads.erased", self.prefix)
    }

    fn bucket(&self, name: &str) -> String {
        format!(
            "{}_{name}",
            self.prefix.to_ascii_uppercase().replace('-', "_")
        )
    }

    /// KV bucket of the agent cards workers register (`agent.<name>`).
    pub fn agents_bucket(&self) -> String {
        self.bucket("AGENTS")
    }

    /// KV bucket of run status records (`task.<id>`), written once a worker or a cancel
    /// touches the run; a run without one is queued.
    pub fn run_status_bucket(&self) -> String {
        self.bucket("RUN_STATUS")
    }

    /// KV bucket of per-thread locks: the task that holds a thread while it runs.
    pub fn thread_locks_bucket(&self) -> String {
        self.bucket("THREAD_LOCKS")
    }

    /// KV bucket of human-in-the-loop prompts (one store for every transport).
    pub fn prompts_bucket(&self) -> String {
        self.bucket("PROMPTS")
    }

    /// KV bucket of each thread's last agent state (`state.<digest>`), sent to a remote agent
    /// with the thread's next run when the client sends none.
    pub fn thread_state_bucket(&self) -> String {
        self.bucket("THREAD_STATE")
    }

    /// KV bucket of each owner's budgets per day (`bytes.<digest>.<yyyymmdd>`: the bytes of
    /// accepted runs leased to runs replicas).
    pub fn owner_budgets_bucket(&self) -> String {
        self.bucket("OWNER_BUDGETS")
    }

    /// KV bucket of the tokens each owner's runs used, per UTC day and month
    /// (`tokens.<digest>.d<yyyymmdd>`, `tokens.<digest>.m<yyyymm>`): charged by the worker as a
    /// run ends, read by every runs replica against the owner's token budgets.
    pub fn owner_tokens_bucket(&self) -> String {
        self.bucket("OWNER_TOKENS")
    }

    /// KV bucket of the deadlines of pending prompts with a timeout (what the sweeper scans).
    pub fn prompt_deadlines_bucket(&self) -> String {
        self.bucket("PROMPT_DEADLINES")
    }
}

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Accepted, not yet picked up by a worker.
    Queued,
    /// A worker is running the agent.
    Running,
    /// Ended with `RUN_FINISHED`.
    Completed,
    /// Ended with `RUN_ERROR`.
    Failed,
    /// Ended because its owner cancelled it.
    Cancelled,
}

impl RunStatus {
    /// Whether the run has ended.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
        )
    }
}

/// The status record of one task, kept in [`Names::run_status_bucket`] under `task.<id>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStatusRecord {
    /// Task id.
    pub task_id: Uuid,
    /// The run's owner.
    pub owner: String,
    /// Thread id.
    pub thread_id: String,
    /// Run id.
    pub run_id: String,
    /// Current status.
    pub status: RunStatus,
    /// The owner asked to cancel while the run was running.
    #[serde(default)]
    pub cancel_requested: bool,
    /// When the run was accepted.
    pub created: DateTime<Utc>,
    /// When the status last changed.
    pub updated_at: DateTime<Utc>,
    /// Why the run failed, safe to show.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The last heartbeat of the worker running it: a redelivered run whose worker beat within
    /// the ack wait is still alive somewhere (NATS was slow to hear its progress), not lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alive_at: Option<DateTime<Utc>>,
    /// The tokens the run used, one entry per model, once it ended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usage: Vec<crate::usage::TokenUsage>,
    /// Where the run's time went, once it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<crate::usage::RunTimings>,
}

impl RunStatusRecord {
    /// The record of `task`'s run as its worker starts it at `now`: running, and alive.
    pub fn running(task: &RunTaskV1, now: DateTime<Utc>) -> Self {
        Self {
            task_id: task.task_id,
            owner: task.owner.clone(),
            thread_id: task.input.thread_id.clone(),
            run_id: task.input.run_id.clone(),
            status: RunStatus::Running,
            cancel_requested: false,
            created: task.accepted_at,
            updated_at: now,
            error: None,
            alive_at: Some(now),
            usage: Vec::new(),
            timings: None,
        }
    }
}

/// Key of a task's status record: `run.<digest of owner and run id>.<task id>`, so the owner's
/// runs with one run id are found by [`status_pattern`] without any other index.
pub fn status_key(owner: &str, run_id: &str, task_id: Uuid) -> String {
    format!("run.{}.{task_id}", &digest(&[owner, run_id])[..32])
}

/// The keys of every status record of the owner's runs with `run_id` (any thread).
pub fn status_pattern(owner: &str, run_id: &str) -> String {
    format!("run.{}.*", &digest(&[owner, run_id])[..32])
}

/// A fixed-length digest of several fields, each length-prefixed so boundaries cannot shift.
/// Used for KV keys and message ids, which must never carry raw client ids.
pub fn digest(parts: &[&str]) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    hex::encode(hasher.finalize())
}

/// 128-bit hex digest of one field, used as a subject token (never the raw client id).
pub fn short_digest(part: &str) -> String {
    digest(&[part])[..32].to_owned()
}

/// The idempotency key of the run `(owner, threadId, runId)`: its message id in the RUNS stream
/// (never the raw client ids).
pub fn run_key(owner: &str, thread_id: &str, run_id: &str) -> String {
    digest(&[owner, thread_id, run_id])
}

/// Key of `(owner, threadId)`'s record in the thread state bucket: what a remote agent left
/// of the thread (its state, its pending interrupts).
pub fn thread_state_key(owner: &str, thread_id: &str) -> String {
    format!("state.{}", digest(&[owner, thread_id]))
}

/// Key of the lock on `(owner, threadId)`.
pub fn thread_lock_key(owner: &str, thread_id: &str) -> String {
    format!("t.{}", digest(&[owner, thread_id]))
}

/// An accepted run, as published on [`Names::run_queue_subject`]. Versioned by `v`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum RunTask {
    /// Version 1.
    #[serde(rename = "1")]
    V1(RunTaskV1),
}

/// Version 1 of [`RunTask`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunTaskV1 {
    /// Server-assigned task id.
    pub task_id: Uuid,
    /// The caller's `sub`.
    pub owner: String,
    /// When the run was accepted.
    pub accepted_at: DateTime<Utc>,
    /// The validated input; attachment URLs already rewritten to `s3://bucket/path`.
    pub input: RunAgentInput,
    /// The user message's files, as the attachments service resolved them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<crate::metadata::AttachedFile>,
    /// Whether `input.messages` is a whole conversation resent by the client (AG-UI's
    /// `HttpAgent`): history keeps only the messages it does not hold yet (by id), and the new
    /// turn is the last message.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub conversation: bool,
    /// Set on a run that continues after a human-in-the-loop prompt: the prompt and what
    /// became of it (answered, timed out, cancelled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed: Option<Resumed>,
    /// OpenTelemetry trace id of the request that started the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// The agent the run is for (its card's name); `None`: the worker's default agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

/// The prompt a continuation run answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resumed {
    /// The prompt's id.
    pub prompt_id: String,
    /// The question.
    pub prompt: crate::interaction::Prompt,
    /// The answer, or why there is none.
    pub outcome: crate::interaction::PromptOutcome,
    /// The user message the asking run answered (the prompt's `parent_id`): the run that
    /// continues answers it too, so a WebSocket client sees one reply under one `parent_id`,
    /// and a prompt it asks again names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
}

/// Request on [`Names::history_progress_subject`]: how far has history written this run's
/// events? Versioned by `v`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum ProgressRequest {
    /// Version 1.
    #[serde(rename = "1")]
    V1 {
        /// The run's task id.
        task_id: Uuid,
    },
}

/// Answer to a [`ProgressRequest`]. Versioned by `v`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum ProgressReply {
    /// Version 1.
    #[serde(rename = "1")]
    V1 {
        /// `seq` of the last event whose changes are committed (0: none, or an unknown run).
        written_seq: u64,
    },
}

/// Request on [`Names::history_run_lookup_subject`]: the owner's latest run with this run id
/// (a run id may be reused on several threads). Versioned by `v`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum RunLookupRequest {
    /// Version 1.
    #[serde(rename = "1")]
    V1 {
        /// The caller's `sub`: another owner's run is never found.
        owner: String,
        /// The run id.
        run_id: String,
        /// Sequence of the RUNS stream's last message when the question was asked: history
        /// answers only once it has written every run up to it, so a run accepted before the
        /// request is always found (read-your-writes).
        runs_seq: u64,
    },
}

/// Answer to a [`RunLookupRequest`]. Versioned by `v`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum RunLookupReply {
    /// Version 1.
    #[serde(rename = "1")]
    V1 {
        /// The run, if the owner has one with that id.
        run: Option<RunRecord>,
    },
    /// History has not written every run up to `runs_seq` yet (it is behind or catching up):
    /// the answer would not be authoritative.
    #[serde(rename = "1-behind")]
    Behind,
}

/// Most messages a [`ThreadMessagesRequest`] may ask for.
pub const MAX_THREAD_MESSAGES: u32 = 1_000;

/// Request on [`Names::history_thread_messages_subject`]: the messages of a thread written
/// before a run, in AG-UI form, for a remote agent (it keeps nothing between requests).
/// Versioned by `v`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum ThreadMessagesRequest {
    /// Version 1.
    #[serde(rename = "1")]
    V1 {
        /// The caller's `sub`: another owner's thread has no messages.
        owner: String,
        /// The thread.
        thread_id: String,
        /// The run asking: its own messages are left out (the agent gets them from its task), and
        /// so are those of runs accepted after it (a follow-up already queued). The runs service
        /// asks for a thread's snapshot as of the run a joining client will follow from its
        /// first event, or with the nil UUID for every message up to `runs_seq`.
        task_id: Uuid,
        /// Sequence of the asking run's task in the RUNS stream: history answers only once it
        /// has written every run up to it and every event of the thread's earlier runs, so the
        /// previous run's reply is never missing (read-your-writes); otherwise
        /// [`ThreadMessagesReply::Behind`].
        runs_seq: u64,
        /// At most this many (the most recent), up to [`MAX_THREAD_MESSAGES`].
        limit: u32,
        /// Every `s3://` file part of a user message answered as a freshly signed link (an
        /// AG-UI 1.0 part), or a text part when the file is gone: for a client (a thread's
        /// snapshot). The worker signs what it sends a remote agent itself.
        #[serde(default)]
        signed_links: bool,
    },
}

/// Answer to a [`ThreadMessagesRequest`]. Versioned by `v`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum ThreadMessagesReply {
    /// Version 1.
    #[serde(rename = "1")]
    V1 {
        /// Oldest first. A user message exactly as its run's input carried it (same id, same
        /// content shape); an assistant message `{id, role, content?, toolCalls?}` (toolCalls
        /// as `[{id, type: "function", function: {name, arguments}}]`); a tool result
        /// `{id, role: "tool", toolCallId, content}`.
        messages: Vec<serde_json::Value>,
        /// Whether older messages were left out by `limit`.
        truncated: bool,
    },
    /// History has not written every run up to `runs_seq`, or an earlier run of the thread
    /// has events not written yet: ask again shortly.
    #[serde(rename = "1-behind")]
    Behind,
}

/// What history keeps of a run (`run_progress`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The run's task id.
    pub task_id: Uuid,
    /// Its thread.
    pub thread_id: String,
    /// When it was accepted.
    pub accepted_at: DateTime<Utc>,
    /// Its status as far as history has written its events.
    pub status: RunStatus,
    /// Where its task is in the RUNS stream (unknown for runs written before history kept it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs_seq: Option<u64>,
    /// Why it ended with an error (its `RUN_ERROR` message), once history has written its end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One event of one run, as published on [`Names::run_event_subject`]. Versioned by `v`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum RunEventMessage {
    /// Version 1.
    #[serde(rename = "1")]
    V1(RunEventV1),
}

/// Version 1 of [`RunEventMessage`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEventV1 {
    /// Task id.
    pub task_id: Uuid,
    /// The run's owner.
    pub owner: String,
    /// Thread id.
    pub thread_id: String,
    /// Run id.
    pub run_id: String,
    /// Position of this event in the run, from 1, without gaps.
    pub seq: u64,
    /// When the worker emitted it.
    pub emitted_at: DateTime<Utc>,
    /// The AG-UI event.
    pub event: Event,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_with_a_dot_or_wildcard_is_refused() {
        assert!(Names::new("a.b").is_err());
        assert!(Names::new("a*").is_err());
        assert!(Names::new("").is_err());
        assert!(Names::new("t-01_x").is_ok());
    }

    #[test]
    fn digests_differ_when_a_boundary_moves_between_fields() {
        assert_ne!(digest(&["ab", "c", "d"]), digest(&["a", "bc", "d"]));
        let key = run_key("alice", "t1", "r1");
        assert_eq!(key, run_key("alice", "t1", "r1"));
        assert_ne!(key, run_key("alice", "t1", "r2"));
        assert_ne!(key, run_key("bob", "t1", "r1"));
        assert_ne!(run_key("a", "bt", "r"), run_key("ab", "t", "r"));
        let task = Uuid::now_v7();
        let pattern = status_pattern("alice", "r1");
        assert!(status_key("alice", "r1", task).starts_with(pattern.trim_end_matches('*')));
        assert!(!status_key("bob", "r1", task).starts_with(pattern.trim_end_matches('*')));
        let names = Names::new("p").unwrap_or_else(|_| unreachable!());
        assert!(
            names
                .run_queue_subject()
                .starts_with(names.runs_subjects().trim_end_matches('>')),
            "the queue subject is one of the RUNS stream's"
        );
    }

    #[test]
    fn stream_names_are_derived_from_the_prefix() {
        let names = Names::new("t-1").unwrap_or_else(|_| unreachable!());
        assert_eq!(names.runs_stream(), "T_1_RUNS");
        assert_eq!(names.run_events_subjects(), "t-1.runs.events.>");
    }
}
