//! AG-UI events, as the worker publishes them and the stream endpoints serve them.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One AG-UI event, tagged by `type` (`RUN_STARTED`, `TEXT_MESSAGE_CONTENT`, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Event {
    /// The run started.
    #[serde(rename_all = "camelCase")]
    RunStarted {
        /// Thread id.
        thread_id: String,
        /// Run id.
        run_id: String,
        /// AG-UI's `input`: what the run was started with, as far as a client that did not
        /// start it needs it (`{threadId, runId, messages}`: the turn's user message), so that
        /// a second device following the thread shows the question with the answer.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input: Option<serde_json::Value>,
    },
    /// The run finished successfully.
    #[serde(rename_all = "camelCase")]
    RunFinished {
        /// Thread id.
        thread_id: String,
        /// Run id.
        run_id: String,
        /// Optional result.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
        /// AG-UI 1.0 outcome: `{"type": "interrupt", "interrupts": [...]}` when the run stopped
        /// for a human; absent for a plain success.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        outcome: Option<Value>,
        /// AG-UI's token usage of the run, one entry per model (absent: none reported).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<Vec<crate::usage::TokenUsage>>,
    },
    /// The run failed.
    #[serde(rename_all = "camelCase")]
    RunError {
        /// What went wrong, safe to show.
        message: String,
        /// Machine-readable code.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<String>,
        /// AG-UI's token usage of what the run did before it failed or was cancelled.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<Vec<crate::usage::TokenUsage>>,
    },
    /// A step started.
    #[serde(rename_all = "camelCase")]
    StepStarted {
        /// Step name.
        step_name: String,
    },
    /// A step finished.
    #[serde(rename_all = "camelCase")]
    StepFinished {
        /// Step name.
        step_name: String,
    },
    /// A message starts streaming.
    #[serde(rename_all = "camelCase")]
    TextMessageStart {
        /// Message id.
        message_id: String,
        /// Always `assistant` for now.
        role: String,
    },
    /// A piece of a streaming message.
    #[serde(rename_all = "camelCase")]
    TextMessageContent {
        /// Message id.
        message_id: String,
        /// The text to append.
        delta: String,
    },
    /// A message finished streaming.
    #[serde(rename_all = "camelCase")]
    TextMessageEnd {
        /// Message id.
        message_id: String,
    },
    /// A tool call starts.
    #[serde(rename_all = "camelCase")]
    ToolCallStart {
        /// Tool call id.
        tool_call_id: String,
        /// Tool name.
        tool_call_name: String,
        /// The assistant message the call belongs to.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent_message_id: Option<String>,
    },
    /// A piece of the tool call's JSON arguments.
    #[serde(rename_all = "camelCase")]
    ToolCallArgs {
        /// Tool call id.
        tool_call_id: String,
        /// The JSON text to append.
        delta: String,
    },
    /// The tool call's arguments are complete.
    #[serde(rename_all = "camelCase")]
    ToolCallEnd {
        /// Tool call id.
        tool_call_id: String,
    },
    /// A tool's result.
    #[serde(rename_all = "camelCase")]
    ToolCallResult {
        /// Id of the tool message carrying the result.
        message_id: String,
        /// Tool call id.
        tool_call_id: String,
        /// The result.
        content: String,
    },
    /// The whole agent state.
    #[serde(rename_all = "camelCase")]
    StateSnapshot {
        /// The state.
        snapshot: Value,
    },
    /// A JSON Patch on the agent state.
    #[serde(rename_all = "camelCase")]
    StateDelta {
        /// RFC 6902 operations.
        delta: Vec<Value>,
    },
    /// An application-defined event.
    #[serde(rename_all = "camelCase")]
    Custom {
        /// Event name.
        name: String,
        /// Event value.
        value: Value,
    },
    /// Any other AG-UI event (`MESSAGES_SNAPSHOT`, reasoning, activity, `RAW`, ...) as a remote
    /// agent sent it: its `type` and every field verbatim. Only what [`is_relayed_type`] names
    /// is relayed; a known type above that fails to parse lands here too, so a producer checks
    /// [`Event::other_type`] against that list.
    #[serde(untagged)]
    Other(Map<String, Value>),
}

/// The AG-UI event types (1.0, with the older `THINKING_*` names) that pass through the relay
/// as [`Event::Other`]: none of them changes a run's messages as history keeps them.
pub const RELAYED_TYPES: &[&str] = &[
    "MESSAGES_SNAPSHOT",
    "ACTIVITY_SNAPSHOT",
    "ACTIVITY_DELTA",
    "RAW",
    "REASONING_START",
    "REASONING_MESSAGE_START",
    "REASONING_MESSAGE_CONTENT",
    "REASONING_MESSAGE_END",
    "REASONING_MESSAGE_CHUNK",
    "REASONING_END",
    "REASONING_ENCRYPTED_VALUE",
    "THINKING_START",
    "THINKING_END",
    "THINKING_TEXT_MESSAGE_START",
    "THINKING_TEXT_MESSAGE_CONTENT",
    "THINKING_TEXT_MESSAGE_END",
];

/// Whether `kind` is one of [`RELAYED_TYPES`].
pub fn is_relayed_type(kind: &str) -> bool {
    RELAYED_TYPES.contains(&kind)
}

impl Event {
    /// Whether this event ends the run: nothing may follow it.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Event::RunFinished { .. } | Event::RunError { .. })
    }

    /// The `type` of an [`Event::Other`]; `None` for the typed variants.
    pub fn other_type(&self) -> Option<&str> {
        match self {
            Event::Other(fields) => fields.get("type").and_then(Value::as_str),
            _ => None,
        }
    }
}

/// Extra fields some producers attach to events; kept for forward compatibility.
pub type EventExtra = Map<String, Value>;
