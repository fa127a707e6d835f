//! `HistorySnapshotResponse` of `agent-run-input-protocol.md`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::files::GeneratedFile;
use crate::metadata::AgentChatMessageMetadata;
use crate::run_input::ToolCall;

/// The only scope a day snapshot has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum HistoryScope {
    /// `"history_day"`.
    #[serde(rename = "history_day")]
    HistoryDay,
}

/// The answer of `GET /api/v1/agent/history`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistorySnapshotResponse {
    /// Always `history_day`.
    pub scope: HistoryScope,
    /// The thread shown, `null` when the caller has none.
    pub thread_id: Option<String>,
    /// The day shown (`YYYY-MM-DD`), `null` when there is nothing to show.
    pub day: Option<String>,
    /// Whether messages earlier than this page exist: more of this day (then `nextCursor`
    /// continues it) or earlier days (`before`).
    pub has_more: bool,
    /// Continues this day with its earlier messages (`cursor=`); absent when the page reaches
    /// the day's first message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// A page of that day's messages, in `seq` order: its latest ones, or those before the
    /// cursor.
    pub messages: Vec<HistoryMessage>,
}

/// One message of a day snapshot, tagged by `role`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum HistoryMessage {
    /// A user message.
    User(HistoryUserMessage),
    /// A tool result.
    Tool(HistoryAgentMessage),
    /// An assistant message.
    Assistant(HistoryAgentMessage),
}

/// `role = "user"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HistoryUserMessage {
    /// Message id.
    pub id: String,
    /// Position in the thread.
    pub seq: i64,
    /// The text.
    pub content: String,
    /// A freshly signed URL of the attachment, `null` when none.
    pub url: Option<String>,
    /// ISO-8601.
    pub timestamp: String,
}

/// `role = "assistant"` or `role = "tool"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistoryAgentMessage {
    /// Message id.
    pub id: String,
    /// Position in the thread.
    pub seq: i64,
    /// The text.
    pub content: String,
    /// Compiled `UiSchemaRenderer`, `null` when the agent gave no UI hints.
    pub ui_schema: Option<Value>,
    /// ISO-8601.
    pub timestamp: String,
}

/// The answer of `GET /api/v1/agent/history/blocks`: the same day as
/// [`HistorySnapshotResponse`], each message in the block form of
/// `agent-chat-messages-protocol.md` (content blocks, `binary` urls re-signed, metadata).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlockHistoryResponse {
    /// Always `history_day`.
    pub scope: HistoryScope,
    /// The thread shown, `null` when the caller has none.
    pub thread_id: Option<String>,
    /// The day shown (`YYYY-MM-DD`), `null` when there is nothing to show.
    pub day: Option<String>,
    /// Whether messages earlier than this page exist: more of this day (then `nextCursor`
    /// continues it) or earlier days (`before`).
    pub has_more: bool,
    /// Continues this day with its earlier messages (`cursor=`); absent when the page reaches
    /// the day's first message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// A page of that day's messages, in `seq` order: its latest ones, or those before the
    /// cursor.
    pub messages: Vec<BlockMessage>,
}

/// `GET /api/v1/agent/history/bodies`: the same day with every message as a
/// [`MessageBody`](crate::message_body::MessageBody) (`message-body-structure-proposal.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BodyHistoryResponse {
    /// Always `history_day`.
    pub scope: HistoryScope,
    /// The thread shown, `null` when the caller has none.
    pub thread_id: Option<String>,
    /// The day shown (`YYYY-MM-DD`), `null` when there is nothing to show.
    pub day: Option<String>,
    /// Whether messages earlier than this page exist: more of this day (then `nextCursor`
    /// continues it) or earlier days (`before`).
    pub has_more: bool,
    /// Continues this day with its earlier messages (`cursor=`); absent when the page reaches
    /// the day's first message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// A page of that day's messages, in `seq` order: its latest ones, or those before the
    /// cursor.
    pub messages: Vec<BodyMessage>,
}

/// One message as a `MessageBody`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BodyMessage {
    /// Message id.
    pub id: String,
    /// Position in the thread.
    pub seq: i64,
    /// `user`, `assistant` or `tool`.
    pub role: String,
    /// The message's parts: `{"parts": [...]}` (message-body-schema.md).
    #[schema(value_type = Object)]
    pub body: crate::message_body::MessageBody,
    /// The stored metadata.
    pub metadata: AgentChatMessageMetadata,
    /// ISO-8601.
    pub timestamp: String,
}

/// One message in block form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlockMessage {
    /// Message id.
    pub id: String,
    /// Position in the thread.
    pub seq: i64,
    /// `user`, `assistant` or `tool`.
    pub role: String,
    /// `{"type": "text", "text"}` then, for a user's files, `{"type": "binary", "mimeType",
    /// "url"}` with a freshly signed url (`null` once the file is deleted).
    pub content: Vec<Value>,
    /// The stored metadata.
    pub metadata: AgentChatMessageMetadata,
    /// Assistant and tool messages: compiled `UiSchemaRenderer` or `null`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ui_schema: Option<Option<Value>>,
    /// Assistant messages that call tools: `[{"id", "type": "function", "function": {"name",
    /// "arguments"}}]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// Tool messages: the call they answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// ISO-8601.
    pub timestamp: String,
}

/// The answer of `GET /v2/history`: one day of a chat session in the form of
/// `file-attachments.md` (snake_case, text and `attachment` blocks, assistant `attachments`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SessionHistoryResponse {
    /// Always `history_day`.
    pub scope: HistoryScope,
    /// The session (thread) shown, `null` when the caller has none.
    pub session_id: Option<String>,
    /// The day shown (`YYYY-MM-DD`), `null` when there is nothing to show.
    pub day: Option<String>,
    /// Whether messages earlier than this page exist: more of this day (then `next_cursor`
    /// continues it) or earlier days (`before`).
    pub has_more: bool,
    /// Continues this day with its earlier messages (`cursor=`); absent when the page reaches
    /// the day's first message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// A page of that day's messages, in `seq` order: its latest ones, or those before the
    /// cursor.
    pub messages: Vec<SessionMessage>,
}

/// One message of a chat session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SessionMessage {
    /// Message id.
    pub id: String,
    /// Position in the session.
    pub seq: i64,
    /// `user`, `assistant` or `tool`.
    pub role: String,
    /// `{"type": "text", "text"}` blocks, then a user's files as `{"type": "attachment", "path",
    /// "filename", "icon_type", "source", "url", "file_size", "content_type"}`.
    pub content: Vec<Value>,
    /// Assistant messages: the tool calls (`[]` when none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// Tool messages: the call they answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Assistant messages: the files the agent made (`[]` when none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachments: Option<Vec<GeneratedFile>>,
    /// ISO-8601.
    pub timestamp: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_example_round_trips_field_for_field() {
        let seed = serde_json::json!({
            "scope": "history_day",
            "threadId": "550e8400-e29b-41d4-a716-446655440000",
            "day": "2026-03-15",
            "hasMore": true,
            "messages": [
                {"id": "msg-001", "seq": 1, "role": "user", "content": "帮我创建一个日程",
                 "url": null, "timestamp": "2026-03-15T10:00:00Z"},
                {"id": "msg-002", "seq": 2, "role": "assistant", "content": "好的,我来帮您创建日程。",
                 "uiSchema": {"version": "2.0", "locale": "zh-CN", "status": "success", "theme": "default",
                   "root": {"type": "stack", "appearance": "card", "children": [
                     {"type": "text", "content": "日程已创建", "role": "title"}]}},
                 "timestamp": "2026-03-15T10:00:05Z"}
            ]
        });
        let parsed: Result<HistorySnapshotResponse, _> = serde_json::from_value(seed.clone());
        let back = parsed.map(|p| serde_json::to_value(p).unwrap_or_default());
        assert_eq!(back.ok(), Some(seed));
    }

    #[test]
    fn only_a_page_that_leaves_part_of_its_day_out_names_a_cursor() {
        let page = |next_cursor: Option<&str>| SessionHistoryResponse {
            scope: HistoryScope::HistoryDay,
            session_id: Some("s".to_owned()),
            day: Some("2026-03-15".to_owned()),
            has_more: true,
            next_cursor: next_cursor.map(str::to_owned),
            messages: Vec::new(),
        };
        let whole = serde_json::to_value(page(None)).unwrap_or_default();
        assert!(whole.get("next_cursor").is_none(), "{whole}");
        let part = serde_json::to_value(page(Some("c"))).unwrap_or_default();
        assert_eq!(part["next_cursor"], "c");
        let snapshot: Result<HistorySnapshotResponse, _> =
            serde_json::from_value(serde_json::json!({
                "scope": "history_day", "threadId": "t", "day": "2026-03-15", "hasMore": true,
                "nextCursor": "c", "messages": []
            }));
        assert_eq!(
            snapshot.ok().and_then(|s| s.next_cursor).as_deref(),
            Some("c")
        );
    }
}
