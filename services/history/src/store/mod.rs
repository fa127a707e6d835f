//! All SQL of the history service: writes (the two consumers) in `write`, reads (the history
//! endpoints) in `read`. Every statement is checked at compile time against the migrations
//! (`sqlx::query!` and friends; `scripts/sqlx-prepare.sh` refreshes the offline data in
//! `services/history/.sqlx/` after a query or a migration changes).

mod erase;
mod fork;
mod kept;
mod read;
mod retention;
mod write;

pub(crate) use erase::*;
pub(crate) use fork::*;
pub(crate) use kept::*;
pub(crate) use read::*;
pub(crate) use retention::*;
pub(crate) use write::*;

use protocol::messaging::RunStatus;

/// What applying a message from JetStream did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Written now.
    Written,
    /// Written now: the run's first end, whose bytes now count for its owner, who keeps
    /// `kept` bytes in all (`platform::kept`).
    Ended {
        /// What the owner keeps in history now.
        kept: i64,
    },
    /// Already written before (a redelivery): nothing changed.
    Duplicate,
    /// Depends on something not written yet (the run's user message, an earlier event).
    NotYet,
    /// Of a run erased with its thread: dropped, and to be removed from its stream.
    Erased,
}

/// Who wrote a message: the `messages.role` column (`messages_role_check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
pub(crate) enum Role {
    /// The person who started the run.
    User,
    /// The agent's reply.
    Assistant,
    /// A tool's result.
    Tool,
}

impl Role {
    /// The column's (and the API's) spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// The `run_progress.status` spelling of `status` (`run_progress_status_check`).
fn status_column(status: RunStatus) -> &'static str {
    match status {
        RunStatus::Queued => "queued",
        RunStatus::Running => "running",
        RunStatus::Completed => "completed",
        RunStatus::Failed => "failed",
        RunStatus::Cancelled => "cancelled",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_spellings_are_those_the_columns_check() {
        // messages_role_check and run_progress_status_check (migrations/history/0001).
        let roles = [Role::User, Role::Assistant, Role::Tool].map(Role::as_str);
        assert_eq!(roles, ["user", "assistant", "tool"]);
        let statuses = [
            RunStatus::Queued,
            RunStatus::Running,
            RunStatus::Completed,
            RunStatus::Failed,
            RunStatus::Cancelled,
        ]
        .map(status_column);
        assert_eq!(
            statuses,
            ["queued", "running", "completed", "failed", "cancelled"]
        );
        // The protocol's own (serde) spelling is the same one.
        for status in statuses {
            let parsed: Result<RunStatus, _> = serde_json::from_value(status.into());
            assert!(parsed.is_ok_and(|p| status_column(p) == status), "{status}");
        }
    }
}
