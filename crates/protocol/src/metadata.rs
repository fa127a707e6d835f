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

/// Name of the AG-UI `CUSTOM` event by which an agent sets fields of its own message's
/// metadata: `{"messageId", "metadata": {"stage": "intent", "<field>": <value>, ...}}`.
pub const MESSAGE_METADATA_EVENT: &str = "message_metadata";
/// Most fields an agent sets in one event.
pub const MAX_AGENT_METADATA_FIELDS: usize = 16;
/// Most bytes of an agent's fields, as compact JSON.
pub const MAX_AGENT_METADATA_BYTES: usize = 4096;
/// Longest field name, and longest `stage`.
pub const MAX_AGENT_METADATA_NAME_CHARS: usize = 64;
/// Fields the platform writes itself; an agent cannot set them.
pub const RESERVED_METADATA_FIELDS: [&str; 10] = [
    "run_id",
    "message_id",
    "latency_ms",
    "user_message_attachments",
    "user_message_attachment_list",
    "tool_calls",
    "tool_call_id",
    "tool_name",
    "ui_hints",
    "attachments",
];

/// The value of a `CUSTOM message_metadata` event: fields an agent sets on one of its messages
/// of the same run (`stage` and custom fields, the seed's `[key: string]: any`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentMetadata {
    /// The agent's message the fields belong to.
    pub message_id: String,
    /// The fields, merged into the message's metadata (a later event overwrites a field).
    pub metadata: Map<String, Value>,
}

impl AgentMetadata {
    /// Checks the fields: 1 to [`MAX_AGENT_METADATA_FIELDS`] snake_case names (`[a-z0-9_]`, at
    /// most [`MAX_AGENT_METADATA_NAME_CHARS`]) none of [`RESERVED_METADATA_FIELDS`], a `stage`
    /// that is such a name too, at most [`MAX_AGENT_METADATA_BYTES`] in all.
    pub fn new(message_id: &str, metadata: Map<String, Value>) -> Result<Self, String> {
        if message_id.is_empty() || message_id.chars().count() > 128 {
            return Err("messageId must be 1 to 128 characters".to_owned());
        }
        if metadata.is_empty() || metadata.len() > MAX_AGENT_METADATA_FIELDS {
            return Err(format!(
                "metadata must have 1 to {MAX_AGENT_METADATA_FIELDS} fields"
            ));
        }
        for (name, value) in &metadata {
            if !is_snake_name(name) {
                return Err(format!(
                    "metadata field {name:?} must be 1 to {MAX_AGENT_METADATA_NAME_CHARS} characters of a-z, 0-9 and _"
                ));
            }
            if RESERVED_METADATA_FIELDS.contains(&name.as_str()) {
                return Err(format!(
                    "metadata field {name:?} is set by the platform, not by agents"
                ));
            }
            if name == "stage" && !value.as_str().is_some_and(is_snake_name) {
                return Err(format!(
                    "stage must be 1 to {MAX_AGENT_METADATA_NAME_CHARS} characters of a-z, 0-9 and _"
                ));
            }
        }
        let size = serde_json::to_vec(&metadata).map_or(usize::MAX, |bytes| bytes.len());
        if size > MAX_AGENT_METADATA_BYTES {
            return Err(format!(
                "metadata must be at most {MAX_AGENT_METADATA_BYTES} bytes as JSON"
            ));
        }
        Ok(Self {
            message_id: message_id.to_owned(),
            metadata,
        })
    }

    /// Parses and checks an event value.
    pub fn parse_event(value: &Value) -> Result<Self, String> {
        let raw: Self = serde_json::from_value(value.clone()).map_err(|err| err.to_string())?;
        Self::new(&raw.message_id, raw.metadata)
    }

    /// The event value.
    pub fn to_value(&self) -> Value {
        serde_json::json!({"messageId": self.message_id, "metadata": self.metadata})
    }
}

fn is_snake_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().count() <= MAX_AGENT_METADATA_NAME_CHARS
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn fields(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn an_agent_sets_its_stage_and_custom_fields() {
        let event = json!({"messageId": "m1", "metadata": {"stage": "intent", "intent": "greeting", "confidence": 0.9}});
        let parsed = AgentMetadata::parse_event(&event).unwrap();
        assert_eq!(parsed.metadata["stage"], "intent");
        assert_eq!(parsed.to_value(), event);
    }

    #[test]
    fn reserved_oversized_and_badly_named_fields_are_refused_naming_the_rule() {
        let cases = [
            (json!({"run_id": "x"}), "set by the platform"),
            (json!({"latency_ms": 1}), "set by the platform"),
            (json!({"Stage": "x"}), "a-z, 0-9 and _"),
            (json!({"stage": "Intent Detection"}), "stage must be"),
            (json!({"stage": 3}), "stage must be"),
            (json!({}), "1 to 16 fields"),
            (json!({"note": "x".repeat(5000)}), "at most 4096 bytes"),
        ];
        for (metadata, rule) in cases {
            let err = AgentMetadata::new("m1", fields(metadata.clone())).unwrap_err();
            assert!(err.contains(rule), "{metadata}: {err}");
        }
        let many: Map<String, Value> = (0..17).map(|i| (format!("f{i}"), json!(i))).collect();
        assert!(AgentMetadata::new("m1", many).is_err());
        assert!(AgentMetadata::new("", fields(json!({"stage": "x"}))).is_err());
        assert!(
            AgentMetadata::parse_event(
                &json!({"messageId": "m1", "metadata": {"stage": "x"}, "extra": 1})
            )
            .is_err()
        );
    }
}
