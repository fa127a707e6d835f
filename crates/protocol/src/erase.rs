//! Erasure: `DELETE /api/v1/agent/threads/{threadId}` removes a thread from every store, and
//! `DELETE /api/v1/agent/me` an owner. The runs service serves both (it cancels what still
//! runs); history erases its own rows and the thread's traces in the streams and buckets, and
//! asks attachments to drop the thread's files. Every request here is idempotent.

use serde::{Deserialize, Serialize};

/// Request on [`crate::messaging::Names::attachments_erase_subject`]: drop the owner's files of
/// one session (thread), or every file of the owner. A file still attached to another session
/// of the owner stays (only its link to this session goes). Versioned by `v`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum AttachmentsEraseRequest {
    /// Version 1.
    #[serde(rename = "1")]
    V1 {
        /// Whose files.
        owner: String,
        /// The session (thread) whose files go; `None`: every file of the owner, in every
        /// session or none.
        session_id: Option<String>,
    },
}

/// Answer to an [`AttachmentsEraseRequest`]. Versioned by `v`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum AttachmentsEraseReply {
    /// Version 1: done; nothing of what was asked is left in the database or the bucket.
    #[serde(rename = "1")]
    V1 {
        /// Files removed (their rows and objects).
        files_deleted: u64,
        /// Links of files to the session removed (a file kept for another session counts here
        /// only).
        links_deleted: u64,
    },
}

/// Request on [`crate::messaging::Names::attachments_link_subject`]: link every file of the
/// owner's session `from` to the session `to` as well (a fork of a thread holds its files too).
/// Idempotent. Versioned by `v`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum AttachmentsLinkRequest {
    /// Version 1.
    #[serde(rename = "1")]
    V1 {
        /// Whose files.
        owner: String,
        /// The session whose files are linked.
        from_session: String,
        /// The session they are linked to.
        to_session: String,
    },
}

/// Answer to an [`AttachmentsLinkRequest`]. Versioned by `v`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum AttachmentsLinkReply {
    /// Version 1.
    #[serde(rename = "1")]
    V1 {
        /// Links made now (a link that existed is not counted).
        linked: u64,
    },
}

/// Request on [`crate::messaging::Names::history_thread_erase_subject`]: erase one thread of
/// the owner everywhere. Versioned by `v`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum ThreadEraseRequest {
    /// Version 1.
    #[serde(rename = "1")]
    V1 {
        /// The caller's `sub`: another owner's thread is never erased (nor found).
        owner: String,
        /// The thread.
        thread_id: String,
        /// The RUNS stream's last sequence when the caller asked: history answers
        /// [`EraseReply::Behind`] until it has written every run accepted before.
        runs_seq: u64,
        /// Erase even if runs of the thread have not ended (the caller cancelled them and
        /// waited): their later events are dropped as they come.
        force: bool,
    },
}

/// Request on [`crate::messaging::Names::history_owner_erase_subject`]: erase every thread of
/// the owner, their files and the owner's own records. Versioned by `v`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum OwnerEraseRequest {
    /// Version 1.
    #[serde(rename = "1")]
    V1 {
        /// The owner to erase.
        owner: String,
        /// As in [`ThreadEraseRequest`].
        runs_seq: u64,
        /// As in [`ThreadEraseRequest`].
        force: bool,
    },
}

/// A run that has not ended, which the caller cancels before it asks again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnendedRun {
    /// Its thread.
    pub thread_id: String,
    /// Its run id.
    pub run_id: String,
}

/// Answer to a [`ThreadEraseRequest`] or an [`OwnerEraseRequest`]. Versioned by `v`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum EraseReply {
    /// Erased: nothing of it is left in any store.
    #[serde(rename = "1")]
    V1 {
        /// Threads erased.
        threads: u64,
        /// Runs erased.
        runs: u64,
        /// Messages erased.
        messages: u64,
        /// Files removed.
        files: u64,
        /// An owner's erasure stopped at its time budget with threads left: ask again.
        #[serde(default)]
        more: bool,
    },
    /// The owner has no such thread (or, for an owner, nothing at all).
    #[serde(rename = "1-not-found")]
    NotFound,
    /// History has not written every run accepted before the request yet; ask again.
    #[serde(rename = "1-behind")]
    Behind,
    /// Runs have not ended (and `force` was not set): cancel them, then ask again.
    #[serde(rename = "1-busy")]
    Busy {
        /// The runs, at most 100.
        runs: Vec<UnendedRun>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erase_messages_are_versioned_on_the_wire() {
        let request = ThreadEraseRequest::V1 {
            owner: "alice".into(),
            thread_id: "t".into(),
            runs_seq: 7,
            force: false,
        };
        let json = serde_json::to_value(&request).unwrap_or_default();
        assert_eq!(json["v"], "1");
        assert_eq!(json["thread_id"], "t");
        let busy: EraseReply = serde_json::from_value(serde_json::json!({
            "v": "1-busy",
            "runs": [{"thread_id": "t", "run_id": "r"}],
        }))
        .unwrap_or(EraseReply::NotFound);
        assert_eq!(
            busy,
            EraseReply::Busy {
                runs: vec![UnendedRun {
                    thread_id: "t".into(),
                    run_id: "r".into(),
                }],
            }
        );
    }
}
