//! The chat-completions request body, as typed structs (serialized by serde): what
//! [`super::build_request`] fills from a run.

use serde::Serialize;
use serde_json::Value;

/// `POST {base}/chat/completions` with `stream: true`.
#[derive(Debug, Serialize)]
pub struct ChatRequest<'a> {
    /// The configured model.
    pub model: &'a str,
    /// Always true: the reply is streamed.
    pub stream: bool,
    /// The conversation.
    pub messages: Vec<ChatMessage<'a>>,
    /// The client's tools, as functions; omitted when there are none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ChatTool<'a>>,
    /// No usage chunk at the end.
    pub stream_options: StreamOptions,
}

/// `stream_options`.
#[derive(Debug, Serialize)]
pub struct StreamOptions {
    /// Whether the last chunk carries token usage.
    pub include_usage: bool,
}

/// One message, tagged by its `role`.
#[derive(Debug, Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum ChatMessage<'a> {
    /// Instructions (AG-UI `system` and `developer` messages, and the agent's system prompt).
    System {
        /// The text.
        content: &'a str,
        /// The author's name, if any.
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<&'a str>,
    },
    /// The user's turn.
    User {
        /// Text, or content parts (text and images).
        content: UserContent,
        /// The author's name, if any.
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<&'a str>,
    },
    /// The model's earlier turn.
    Assistant {
        /// Its text; `null` when it only called tools.
        content: Option<&'a str>,
        /// The tools it called.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall<'a>>,
        /// The author's name, if any.
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<&'a str>,
    },
    /// A tool's result.
    Tool {
        /// The call it answers.
        tool_call_id: &'a str,
        /// The result (or `Error: ...`).
        content: String,
    },
}

/// A user message's content: a string, or parts (`{"type": "text", ...}`, `image_url`, ...).
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum UserContent {
    /// Plain text.
    Text(String),
    /// Content parts.
    Parts(Vec<Value>),
}

/// A tool call of an earlier assistant turn.
#[derive(Debug, Serialize)]
pub struct ToolCall<'a> {
    /// Its id.
    pub id: &'a str,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The function and its arguments (a JSON string).
    pub function: FunctionCall<'a>,
}

/// `function` of a tool call.
#[derive(Debug, Serialize)]
pub struct FunctionCall<'a> {
    /// The tool's name.
    pub name: &'a str,
    /// Its arguments, a JSON string.
    pub arguments: &'a str,
}

/// A tool the model may call.
#[derive(Debug, Serialize)]
pub struct ChatTool<'a> {
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The function.
    pub function: FunctionSpec<'a>,
}

/// `function` of a tool.
#[derive(Debug, Serialize)]
pub struct FunctionSpec<'a> {
    /// Its name.
    pub name: &'a str,
    /// What it does.
    pub description: &'a str,
    /// Its JSON Schema.
    pub parameters: &'a Value,
}
