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
