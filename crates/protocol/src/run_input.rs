//! `RunAgentInput` and `TaskAcceptedResponse` of `agent-run-input-protocol.md`.
//!
//! Every struct keeps unknown fields in `extra` so a message survives the round trip through
//! JetStream and PostgreSQL unchanged; absent optional fields are omitted on output, never `null`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The body of `POST /api/v1/agent/runs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunAgentInput {
    /// Conversation id; a UUID on `/api/v1/agent/runs`.
    pub thread_id: String,
    /// Client-chosen run id, at most 128 characters.
    pub run_id: String,
    /// The run this one continues, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<String>,
    /// Opaque agent state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<Value>,
    /// The conversation turn: exactly one user message, first.
    pub messages: Vec<Message>,
    /// Client tools the agent may call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Tool>>,
    /// Extra context for the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Vec<Context>>,
    /// Opaque properties forwarded to the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarded_props: Option<Value>,
    /// Fields this version does not know, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl RunAgentInput {
    /// AG-UI `RUN_STARTED.input` for the clients that did not start the run: the thread, the
    /// run and the turn's new user message (the last message, when it is the user's), so a
    /// client following the thread adds the question it has not seen (AG-UI clients add
    /// `input.messages` they do not hold, by id).
    pub fn started_input(&self) -> serde_json::Value {
        let turn: Vec<&Message> = self
            .messages
            .last()
            .filter(|m| matches!(m, Message::User(_)))
            .into_iter()
            .collect();
        serde_json::json!({
            "threadId": self.thread_id,
            "runId": self.run_id,
            "messages": turn,
        })
    }

    /// A one-message turn on `thread_id`: the user's `content` as message `message_id`, with
    /// empty state, tools, context and forwarded props (what the WebSocket and chat APIs start).
    pub fn turn(thread_id: &str, run_id: &str, message_id: &str, content: UserContent) -> Self {
        Self {
            thread_id: thread_id.to_owned(),
            run_id: run_id.to_owned(),
            parent_run_id: None,
            state: Some(Value::Object(Map::new())),
            messages: vec![Message::User(UserMessage {
                id: message_id.to_owned(),
                content,
                name: None,
                encrypted_value: None,
                extra: Map::new(),
            })],
            tools: Some(Vec::new()),
            context: Some(Vec::new()),
            forwarded_props: Some(Value::Object(Map::new())),
            extra: Map::new(),
        }
    }
}

impl ContentBlock {
    /// A text block.
    pub fn text(text: &str) -> Self {
        ContentBlock::Text(TextBlock {
            text: text.to_owned(),
            extra: Map::new(),
        })
    }

    /// An AG-UI `document` part whose bytes are at `url`.
    pub fn document_at(url: &str) -> Self {
        let mut source = Map::new();
        source.insert("type".to_owned(), Value::String("url".to_owned()));
        source.insert("value".to_owned(), Value::String(url.to_owned()));
        ContentBlock::Document(SourcePart {
            source: Value::Object(source),
            extra: Map::new(),
        })
    }
}

/// One message of the conversation, tagged by `role`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Message {
    /// `role: "user"`.
    User(UserMessage),
    /// `role: "assistant"`.
    Assistant(AssistantMessage),
    /// `role: "system"`.
    System(TextMessage),
    /// `role: "developer"`.
    Developer(TextMessage),
    /// `role: "tool"`.
    Tool(ToolMessage),
    /// `role: "reasoning"`.
    Reasoning(OtherMessage),
    /// `role: "activity"`.
    Activity(OtherMessage),
}

impl Message {
    /// The message id, whatever its role.
    pub fn id(&self) -> &str {
        match self {
            Message::User(m) => &m.id,
            Message::Assistant(m) => &m.id,
            Message::System(m) | Message::Developer(m) => &m.id,
            Message::Tool(m) => &m.id,
            Message::Reasoning(m) | Message::Activity(m) => &m.id,
        }
    }

    /// The role as it appears on the wire.
    pub fn role(&self) -> &'static str {
        match self {
            Message::User(_) => "user",
            Message::Assistant(_) => "assistant",
            Message::System(_) => "system",
            Message::Developer(_) => "developer",
            Message::Tool(_) => "tool",
            Message::Reasoning(_) => "reasoning",
            Message::Activity(_) => "activity",
        }
    }
}

/// A user message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserMessage {
    /// Message id.
    pub id: String,
    /// Plain text or content blocks.
    pub content: UserContent,
    /// Optional author name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Opaque encrypted payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted_value: Option<String>,
    /// Unknown fields, kept.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// User content: a string or a list of blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum UserContent {
    /// Plain text.
    Text(String),
    /// Multimodal blocks.
    Blocks(Vec<ContentBlock>),
}

impl UserContent {
    /// The text of the message: the string, or its text blocks joined with newlines.
    pub fn text(&self) -> String {
        match self {
            UserContent::Text(text) => text.clone(),
            UserContent::Blocks(blocks) => blocks
                .iter()
                .filter_map(|block| match block {
                    ContentBlock::Text(t) => Some(t.text.as_str()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

/// One block of user content, tagged by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ContentBlock {
    /// `type: "text"`.
    Text(TextBlock),
    /// `type: "binary"`: the seed's attachment block.
    Binary(BinaryBlock),
    /// `type: "image"`: AG-UI 1.0's image part.
    Image(SourcePart),
    /// `type: "document"`: AG-UI 1.0's document part.
    Document(SourcePart),
    /// `type: "audio"`: AG-UI 1.0's audio part (an uploaded audio file, by URL).
    Audio(SourcePart),
}

/// A text block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TextBlock {
    /// The text.
    pub text: String,
    /// Unknown fields, kept.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The seed's `binary` block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BinaryBlock {
    /// MIME type; must be `image/*` (absent is refused by validation with the seed's message,
    /// not by the parser).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// Optional block id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Signed URL of the uploaded file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Inline data, of any JSON value; refused by validation. `Some` whenever the field is
    /// present, even as `null`, so `"data": null` is refused too.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub data: Option<Value>,
    /// Original file name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
    /// Unknown fields, kept.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `Some` for a field that is present, whatever its value (`null` included).
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

impl BinaryBlock {
    /// The MIME type, empty when absent.
    pub fn mime(&self) -> &str {
        self.mime_type.as_deref().unwrap_or_default()
    }
}

/// AG-UI 1.0 `image` / `document` / `audio` part with a `source`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SourcePart {
    /// Where the bytes are: `{"type": "url", "value": ..., "mimeType"?}` or inline data.
    pub source: Value,
    /// Unknown fields, kept.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// An assistant message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AssistantMessage {
    /// Message id.
    pub id: String,
    /// Text, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Optional author name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Tool calls the assistant made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// Opaque encrypted payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted_value: Option<String>,
    /// Unknown fields, kept.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A tool call inside an assistant message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolCall {
    /// Tool call id.
    pub id: String,
    /// Always `"function"`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function called.
    pub function: FunctionCall,
    /// Opaque encrypted payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted_value: Option<String>,
    /// Unknown fields, kept.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Function name and JSON-encoded arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FunctionCall {
    /// Function name.
    pub name: String,
    /// Arguments as a JSON string.
    pub arguments: String,
}

/// A system or developer message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TextMessage {
    /// Message id.
    pub id: String,
    /// Text.
    pub content: String,
    /// Optional author name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Opaque encrypted payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted_value: Option<String>,
    /// Unknown fields, kept.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A tool result message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolMessage {
    /// Message id.
    pub id: String,
    /// Tool output.
    pub content: String,
    /// The tool call this answers.
    pub tool_call_id: String,
    /// Error text when the tool failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Opaque encrypted payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted_value: Option<String>,
    /// Unknown fields, kept.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A reasoning or activity message: an id plus whatever the client sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OtherMessage {
    /// Message id.
    pub id: String,
    /// Every other field, kept.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A client tool the agent may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Tool {
    /// Tool name.
    pub name: String,
    /// What the tool does.
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: Value,
    /// Unknown fields, kept.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A piece of context for the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Context {
    /// What this context is.
    pub description: String,
    /// The context itself.
    pub value: String,
    /// Unknown fields, kept.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The 202 answer of `POST /api/v1/agent/runs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskAcceptedResponse {
    /// Server-assigned task id (UUIDv7).
    pub task_id: String,
    /// Echo of the request's thread id.
    pub thread_id: String,
    /// Echo of the request's run id.
    pub run_id: String,
    /// When the task was accepted, ISO-8601.
    pub created: DateTime<Utc>,
}

/// The answer of `GET /api/v1/agent/runs/{runId}` and of its cancel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunStatusResponse {
    /// Server-assigned task id.
    pub task_id: String,
    /// Thread id.
    pub thread_id: String,
    /// Run id.
    pub run_id: String,
    /// `queued`, `running`, `completed`, `failed` or `cancelled`.
    pub status: crate::messaging::RunStatus,
    /// The owner asked to cancel and the worker has not stopped yet.
    pub cancel_requested: bool,
    /// When the run was accepted.
    pub created: DateTime<Utc>,
    /// When the status last changed.
    pub updated_at: DateTime<Utc>,
    /// Why the run failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The tokens the run used, one entry per model (AG-UI `TokenUsage`), once it ended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usage: Vec<crate::usage::TokenUsage>,
    /// Where the run's time went (milliseconds from acceptance), once it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<crate::usage::RunTimings>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_turn_is_the_run_input_its_json_form_parses_to() {
        let content = UserContent::Blocks(vec![
            ContentBlock::text("read this"),
            ContentBlock::document_at("s3://b/k.pdf"),
        ]);
        let built = RunAgentInput::turn("t-1", "r-1", "m-1", content);
        let parsed: RunAgentInput = serde_json::from_value(json!({
            "threadId": "t-1", "runId": "r-1", "state": {}, "tools": [], "context": [],
            "forwardedProps": {},
            "messages": [{"id": "m-1", "role": "user", "content": [
                {"type": "text", "text": "read this"},
                {"type": "document", "source": {"type": "url", "value": "s3://b/k.pdf"}},
            ]}],
        }))
        .unwrap();
        assert_eq!(built, parsed);
        assert_eq!(
            serde_json::to_value(&built).unwrap()["messages"][0]["role"],
            "user"
        );
    }
}
