//! `AgentChatMessageMetadata` of `agent-chat-messages-protocol.md`: the `metadata` jsonb of
//! every stored message.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Metadata stored with every message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentChatMessageMetadata {
    /// Unique run identifier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Processing stage (`intent`, `execution`, `tool_execution`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// Processing latency in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
    /// Message identifier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// Where the user's attachment is stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_message_attachments: Option<UserMessageAttachments>,
    /// Additional custom fields (`tool_name`, ...), kept.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Storage location of a user message's attachment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserMessageAttachments {
    /// Storage bucket name.
    pub bucket: String,
    /// Object storage path.
    pub path: String,
    /// MIME type, e.g. `image/jpeg`.
    pub mime_type: String,
}

/// A file of a user message as admission resolved it: where it is plus what the file-attachments
/// history shape shows (name, size). Kept in `metadata.user_message_attachment_list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachedFile {
    /// Storage bucket name.
    pub bucket: String,
    /// Object storage path.
    pub path: String,
    /// Verified MIME type.
    pub mime_type: String,
    /// Original file name (absent in tasks accepted before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_name: Option<String>,
    /// Size in bytes (absent in tasks accepted before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
}

impl AttachedFile {
    /// The seed's `user_message_attachments` object: bucket, path, MIME type.
    pub fn location(&self) -> UserMessageAttachments {
        UserMessageAttachments {
            bucket: self.bucket.clone(),
            path: self.path.clone(),
            mime_type: self.mime_type.clone(),
        }
    }

    /// `s3://bucket/path`.
    pub fn content_url(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.path)
    }

    /// The file name: the recorded one, else the path's last segment.
    pub fn name(&self) -> &str {
        self.file_name
            .as_deref()
            .unwrap_or_else(|| self.path.rsplit('/').next().unwrap_or_default())
    }
}
