//! What one run event changes in history, as plain data: [`changes`] is a pure function from an
//! event to the [`Change`]s it makes, unit-tested without PostgreSQL; the store applies each
//! with a small function of its own, in one transaction with the run's progress.

use chrono::{DateTime, Utc};
use protocol::agui::Event;
use protocol::files::{ATTACHMENTS_EVENT, GeneratedAttachments};
use protocol::messaging::{RunEventV1, RunStatus};
use protocol::metadata::{AgentMetadata, MESSAGE_METADATA_EVENT};
use protocol::ui_schema::{UI_HINTS_EVENT, UiHints};
use serde_json::{Value, json};

/// One change to history.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Change {
    /// The run's status (running, or how it ended).
    Status(RunStatus),
    /// The assistant message exists (created empty with this metadata if not).
    EnsureAssistant {
        /// Its id.
        message_id: String,
        /// Metadata if it is created now.
        metadata: Value,
    },
    /// Text streamed into a message.
    AppendText {
        /// The message.
        message_id: String,
        /// The text.
        delta: String,
    },
    /// A message ended: its latency since acceptance.
    Latency {
        /// The message.
        message_id: String,
        /// Milliseconds since the run was accepted.
        latency_ms: i64,
    },
    /// A tool call started on a message.
    ToolCallStarted {
        /// The call.
        tool_call_id: String,
        /// The message it belongs to.
        message_id: String,
        /// The tool.
        name: String,
    },
    /// Arguments streamed into a tool call.
    ToolCallArgs {
        /// The call.
        tool_call_id: String,
        /// The text.
        delta: String,
    },
    /// A tool call ended: its message's `tool_calls` are rebuilt, and a message made only of
    /// tool calls gets its latency (a text message keeps the one its end set).
    ToolCallEnded {
        /// The call.
        tool_call_id: String,
        /// Milliseconds since the run was accepted.
        latency_ms: i64,
    },
    /// A tool's result: a `tool` message (the store adds `tool_name` from the call).
    ToolResult {
        /// The result message's id.
        message_id: String,
        /// The call it answers.
        tool_call_id: String,
        /// The result.
        content: String,
        /// Its metadata, `tool_name` aside.
        metadata: Value,
    },
    /// Fields merged into a message's metadata (`ui_hints`, `attachments`, the agent's own).
    MergeMetadata {
        /// The message (of this run).
        message_id: String,
        /// The fields.
        fields: Value,
    },
    /// Nothing is kept of the event, and why (logged).
    Ignored(String),
}

/// The changes `event` makes to a run accepted at `accepted_at`, in order.
pub(crate) fn changes(event: &RunEventV1, accepted_at: DateTime<Utc>) -> Vec<Change> {
    let latency_ms = (event.emitted_at - accepted_at).num_milliseconds();
    let run_meta = |message_id: &str, stage: &str| json!({"run_id": event.run_id, "message_id": message_id, "stage": stage});
    match &event.event {
        Event::RunStarted { .. } => vec![Change::Status(RunStatus::Running)],
        Event::RunFinished { .. } => vec![Change::Status(RunStatus::Completed)],
        Event::RunError { code, .. } => {
            vec![Change::Status(if code.as_deref() == Some("cancelled") {
                RunStatus::Cancelled
            } else {
                RunStatus::Failed
            })]
        }
        Event::TextMessageStart { message_id, .. } => vec![Change::EnsureAssistant {
            message_id: message_id.clone(),
            metadata: run_meta(message_id, "response"),
        }],
        Event::TextMessageContent { message_id, delta } => vec![Change::AppendText {
            message_id: message_id.clone(),
            delta: delta.clone(),
        }],
        Event::TextMessageEnd { message_id } => vec![Change::Latency {
            message_id: message_id.clone(),
            latency_ms,
        }],
        Event::ToolCallStart {
            tool_call_id,
            tool_call_name,
            parent_message_id,
        } => {
            // The call belongs to its parent assistant message, or to a message of its own.
            let message_id = parent_message_id.as_deref().unwrap_or(tool_call_id);
            vec![
                Change::EnsureAssistant {
                    message_id: message_id.to_owned(),
                    metadata: run_meta(message_id, "response"),
                },
                Change::ToolCallStarted {
                    tool_call_id: tool_call_id.clone(),
                    message_id: message_id.to_owned(),
                    name: tool_call_name.clone(),
                },
            ]
        }
        Event::ToolCallArgs {
            tool_call_id,
            delta,
        } => vec![Change::ToolCallArgs {
            tool_call_id: tool_call_id.clone(),
            delta: delta.clone(),
        }],
        Event::ToolCallEnd { tool_call_id } => vec![Change::ToolCallEnded {
            tool_call_id: tool_call_id.clone(),
            latency_ms,
        }],
        Event::ToolCallResult {
            message_id,
            tool_call_id,
            content,
        } => {
            let mut metadata = run_meta(message_id, "tool_execution");
            metadata["tool_call_id"] = Value::String(tool_call_id.clone());
            metadata["latency_ms"] = json!(latency_ms);
            vec![Change::ToolResult {
                message_id: message_id.clone(),
                tool_call_id: tool_call_id.clone(),
                content: content.clone(),
                metadata,
            }]
        }
        Event::Custom { name, value } if name == UI_HINTS_EVENT => {
            match UiHints::parse_event(value) {
                Ok(hints) => vec![Change::MergeMetadata {
                    message_id: hints.message_id,
                    fields: json!({"ui_hints": hints.hints}),
                }],
                Err(err) => vec![Change::Ignored(format!("ui_hints: {err}"))],
            }
        }
        Event::Custom { name, value } if name == ATTACHMENTS_EVENT => {
            match GeneratedAttachments::parse_event(value) {
                Ok(generated) => vec![Change::MergeMetadata {
                    message_id: generated.message_id,
                    fields: json!({"attachments": generated.files}),
                }],
                Err(err) => vec![Change::Ignored(format!("attachments: {err}"))],
            }
        }
        // The platform's own fields cannot be set: such an event is refused whole.
        Event::Custom { name, value } if name == MESSAGE_METADATA_EVENT => {
            match AgentMetadata::parse_event(value) {
                Ok(fields) => vec![Change::MergeMetadata {
                    message_id: fields.message_id,
                    fields: Value::Object(fields.metadata),
                }],
                Err(err) => vec![Change::Ignored(format!("message_metadata: {err}"))],
            }
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(value: Value) -> RunEventV1 {
        RunEventV1 {
            task_id: uuid::Uuid::nil(),
            owner: "alice".into(),
            thread_id: "t".into(),
            run_id: "r1".into(),
            seq: 3,
            emitted_at: DateTime::from_timestamp(1_000, 0).unwrap_or_default(),
            event: serde_json::from_value(value).unwrap(),
        }
    }

    fn accepted() -> DateTime<Utc> {
        DateTime::from_timestamp(998, 500_000_000).unwrap_or_default()
    }

    fn of(value: Value) -> Vec<Change> {
        changes(&event(value), accepted())
    }

    #[test]
    fn the_run_lifecycle_sets_the_status() {
        assert_eq!(
            of(json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r1"})),
            [Change::Status(RunStatus::Running)]
        );
        assert_eq!(
            of(json!({"type": "RUN_FINISHED", "threadId": "t", "runId": "r1"})),
            [Change::Status(RunStatus::Completed)]
        );
        assert_eq!(
            of(json!({"type": "RUN_ERROR", "message": "x", "code": "cancelled"})),
            [Change::Status(RunStatus::Cancelled)]
        );
        assert_eq!(
            of(json!({"type": "RUN_ERROR", "message": "x"})),
            [Change::Status(RunStatus::Failed)]
        );
    }

    #[test]
    fn a_text_message_is_created_filled_and_timed() {
        assert_eq!(
            of(json!({"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"})),
            [Change::EnsureAssistant {
                message_id: "m".into(),
                metadata: json!({"run_id": "r1", "message_id": "m", "stage": "response"}),
            }]
        );
        assert_eq!(
            of(json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "hi"})),
            [Change::AppendText {
                message_id: "m".into(),
                delta: "hi".into()
            }]
        );
        assert_eq!(
            of(json!({"type": "TEXT_MESSAGE_END", "messageId": "m"})),
            [Change::Latency {
                message_id: "m".into(),
                latency_ms: 1_500
            }]
        );
    }

    #[test]
    fn a_tool_call_belongs_to_its_parent_or_to_a_message_of_its_own() {
        let own = of(json!({"type": "TOOL_CALL_START", "toolCallId": "c1", "toolCallName": "f"}));
        assert_eq!(
            own[1],
            Change::ToolCallStarted {
                tool_call_id: "c1".into(),
                message_id: "c1".into(),
                name: "f".into()
            }
        );
        let parented = of(
            json!({"type": "TOOL_CALL_START", "toolCallId": "c1", "toolCallName": "f", "parentMessageId": "m"}),
        );
        assert!(
            matches!(&parented[0], Change::EnsureAssistant { message_id, .. } if message_id == "m")
        );
        assert_eq!(
            of(json!({"type": "TOOL_CALL_END", "toolCallId": "c1"})),
            [Change::ToolCallEnded {
                tool_call_id: "c1".into(),
                latency_ms: 1_500
            }]
        );
        let result = of(
            json!({"type": "TOOL_CALL_RESULT", "messageId": "t1", "toolCallId": "c1", "content": "18C"}),
        );
        assert_eq!(
            result,
            [Change::ToolResult {
                message_id: "t1".into(),
                tool_call_id: "c1".into(),
                content: "18C".into(),
                metadata: json!({"run_id": "r1", "message_id": "t1", "stage": "tool_execution",
                                 "tool_call_id": "c1", "latency_ms": 1_500}),
            }]
        );
    }

    #[test]
    fn custom_events_merge_checked_metadata_or_are_ignored_with_a_reason() {
        let merged = of(json!({"type": "CUSTOM", "name": "message_metadata",
                               "value": {"messageId": "m", "metadata": {"stage": "intent"}}}));
        assert_eq!(
            merged,
            [Change::MergeMetadata {
                message_id: "m".into(),
                fields: json!({"stage": "intent"})
            }]
        );
        let forged = of(json!({"type": "CUSTOM", "name": "message_metadata",
                               "value": {"messageId": "m", "metadata": {"run_id": "x"}}}));
        assert!(
            matches!(&forged[..], [Change::Ignored(why)] if why.contains("set by the platform"))
        );
        let bad_hints = of(json!({"type": "CUSTOM", "name": "ui_hints", "value": {"nope": 1}}));
        assert!(matches!(&bad_hints[..], [Change::Ignored(why)] if why.starts_with("ui_hints")));
        assert!(of(json!({"type": "CUSTOM", "name": "other", "value": {}})).is_empty());
    }

    #[test]
    fn events_relayed_from_a_remote_agent_change_nothing() {
        for relayed in [
            json!({"type": "REASONING_MESSAGE_CONTENT", "messageId": "r1", "delta": "thinking"}),
            json!({"type": "MESSAGES_SNAPSHOT", "messages": [{"id": "m", "role": "user", "content": "x"}]}),
            json!({"type": "RAW", "event": {"anything": true}}),
        ] {
            let kind = relayed["type"].clone();
            let parsed = event(relayed);
            assert!(
                matches!(parsed.event, Event::Other(_)),
                "{kind} parses as an event relayed verbatim"
            );
            assert!(
                changes(&parsed, accepted()).is_empty(),
                "{kind} changes nothing"
            );
        }
    }
}
