//! What one run event changes in history, as plain data: [`changes`] is a pure function from an
//! event to the [`Change`]s it makes, unit-tested without PostgreSQL; the store applies each
//! with a small function of its own, in one transaction with the run's progress.

use chrono::{DateTime, Utc};
use protocol::agui::Event;
use protocol::files::{ATTACHMENTS_EVENT, GeneratedAttachments};
use protocol::messaging::{RunEventV1, RunStatus};
use protocol::metadata::{
    AgentChatMessageMetadata as Metadata, AgentMetadata, MESSAGE_METADATA_EVENT, STAGE_RESPONSE,
    STAGE_TOOL_EXECUTION,
};
use protocol::ui_schema::{UI_HINTS_EVENT, UiHints};
use protocol::usage::TokenUsage;
use serde_json::Value;

/// One change to history.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Change {
    /// The run's status (running, or how it ended).
    Status(RunStatus),
    /// Why the run ended with an error (its `RUN_ERROR` message, safe to show).
    Error(String),
    /// The assistant message exists (created empty with this metadata if not).
    EnsureAssistant {
        /// Its id.
        message_id: String,
        /// Metadata if it is created now.
        metadata: Metadata,
    },
    /// Text streamed into a message.
    AppendText {
        /// The message.
        message_id: String,
        /// The text.
        delta: String,
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
        metadata: Metadata,
    },
    /// Fields merged into a message's metadata (its `latency_ms` when it ends, `ui_hints`,
    /// `attachments`, the agent's own).
    MergeMetadata {
        /// The message (of this run).
        message_id: String,
        /// The fields (those set).
        fields: Metadata,
    },
    /// The tokens the run used, one entry per provider and model, as its terminal event
    /// reported them.
    Usage(Vec<TokenUsage>),
    /// Nothing is kept of the event, and why (logged).
    Ignored(String),
}

/// When a run started, first showed output and ended, as far as one event tells: the store
/// keeps the first of each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Marks {
    /// `RUN_STARTED`.
    pub(crate) started_at: Option<DateTime<Utc>>,
    /// A text message's content or a tool call's start.
    pub(crate) first_output_at: Option<DateTime<Utc>>,
    /// The terminal event.
    pub(crate) ended_at: Option<DateTime<Utc>>,
    /// The prompts a `RUN_FINISHED` stopped on (its interrupts' ids): what an erasure of the
    /// thread removes from the prompts buckets.
    pub(crate) prompt_ids: Option<Vec<String>>,
}

/// What `event` tells of its run's times.
pub(crate) fn marks(event: &RunEventV1) -> Marks {
    let at = Some(event.emitted_at);
    match &event.event {
        Event::RunStarted { .. } => Marks {
            started_at: at,
            ..Marks::default()
        },
        Event::TextMessageContent { .. } | Event::ToolCallStart { .. } => Marks {
            first_output_at: at,
            ..Marks::default()
        },
        Event::RunFinished {
            outcome: Some(outcome),
            ..
        } => Marks {
            ended_at: at,
            prompt_ids: interrupt_ids(outcome),
            ..Marks::default()
        },
        e if e.is_terminal() => Marks {
            ended_at: at,
            ..Marks::default()
        },
        _ => Marks::default(),
    }
}

/// The ids of an interrupt outcome's interrupts (`None`: no interrupt with an id).
fn interrupt_ids(outcome: &Value) -> Option<Vec<String>> {
    let ids: Vec<String> = outcome
        .get("interrupts")?
        .as_array()?
        .iter()
        .filter_map(|interrupt| interrupt.get("id")?.as_str().map(str::to_owned))
        .collect();
    (!ids.is_empty()).then_some(ids)
}

/// The run's usage as one entry per provider and model (a remote agent may report a model
/// twice), or no change when it reported none.
fn usage_change(usage: Option<&Vec<TokenUsage>>) -> Option<Change> {
    let mut merged = Vec::new();
    for entry in usage.into_iter().flatten() {
        protocol::usage::add(&mut merged, entry.clone());
    }
    (!merged.is_empty()).then_some(Change::Usage(merged))
}

/// The changes `event` makes to a run accepted at `accepted_at`, in order.
pub(crate) fn changes(event: &RunEventV1, accepted_at: DateTime<Utc>) -> Vec<Change> {
    let latency_ms = (event.emitted_at - accepted_at).num_milliseconds();
    let run_meta =
        |message_id: &str, stage: &str| Metadata::of_run(&event.run_id, message_id, stage);
    match &event.event {
        Event::RunStarted { .. } => vec![Change::Status(RunStatus::Running)],
        Event::RunFinished { usage, .. } => std::iter::once(Change::Status(RunStatus::Completed))
            .chain(usage_change(usage.as_ref()))
            .collect(),
        Event::RunError {
            code,
            message,
            usage,
        } => {
            let status = if code.as_deref() == Some("cancelled") {
                RunStatus::Cancelled
            } else {
                RunStatus::Failed
            };
            [Change::Status(status), Change::Error(message.clone())]
                .into_iter()
                .chain(usage_change(usage.as_ref()))
                .collect()
        }
        Event::TextMessageStart { message_id, .. } => vec![Change::EnsureAssistant {
            message_id: message_id.clone(),
            metadata: run_meta(message_id, STAGE_RESPONSE),
        }],
        Event::TextMessageContent { message_id, delta } => vec![Change::AppendText {
            message_id: message_id.clone(),
            delta: delta.clone(),
        }],
        Event::TextMessageEnd { message_id } => vec![Change::MergeMetadata {
            message_id: message_id.clone(),
            fields: Metadata {
                latency_ms: Some(latency_ms),
                ..Metadata::default()
            },
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
                    metadata: run_meta(message_id, STAGE_RESPONSE),
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
        } => vec![Change::ToolResult {
            message_id: message_id.clone(),
            tool_call_id: tool_call_id.clone(),
            content: content.clone(),
            metadata: Metadata {
                tool_call_id: Some(tool_call_id.clone()),
                latency_ms: Some(latency_ms),
                ..run_meta(message_id, STAGE_TOOL_EXECUTION)
            },
        }],
        Event::Custom { name, value } if name == UI_HINTS_EVENT => {
            match UiHints::parse_event(value) {
                Ok(hints) => vec![Change::MergeMetadata {
                    message_id: hints.message_id,
                    fields: Metadata {
                        ui_hints: Some(hints.hints),
                        ..Metadata::default()
                    },
                }],
                Err(err) => vec![Change::Ignored(format!("ui_hints: {err}"))],
            }
        }
        Event::Custom { name, value } if name == ATTACHMENTS_EVENT => {
            match GeneratedAttachments::parse_event(value) {
                Ok(generated) => vec![Change::MergeMetadata {
                    message_id: generated.message_id,
                    fields: Metadata {
                        attachments: Some(generated.files),
                        ..Metadata::default()
                    },
                }],
                Err(err) => vec![Change::Ignored(format!("attachments: {err}"))],
            }
        }
        // The platform's own fields cannot be set: such an event is refused whole.
        Event::Custom { name, value } if name == MESSAGE_METADATA_EVENT => {
            match AgentMetadata::parse_event(value) {
                Ok(fields) => vec![Change::MergeMetadata {
                    message_id: fields.message_id,
                    fields: Metadata::from_fields(fields.metadata),
                }],
                Err(err) => vec![Change::Ignored(format!("message_metadata: {err}"))],
            }
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn metadata(value: Value) -> Metadata {
        serde_json::from_value(value).unwrap()
    }

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
            [
                Change::Status(RunStatus::Cancelled),
                Change::Error("x".into())
            ]
        );
        assert_eq!(
            of(json!({"type": "RUN_ERROR", "message": "the agent broke"})),
            [
                Change::Status(RunStatus::Failed),
                Change::Error("the agent broke".into())
            ]
        );
    }

    #[test]
    fn a_terminal_event_keeps_its_usage_one_entry_per_model() {
        let usage = |input: u64, output: u64| json!({"provider": "openai", "model": "m", "inputTokens": input, "outputTokens": output, "totalTokens": input + output});
        let finished = of(
            json!({"type": "RUN_FINISHED", "threadId": "t", "runId": "r1",
                                 "usage": [usage(10, 2), usage(5, 1)]}),
        );
        let Change::Usage(entries) = &finished[1] else {
            panic!("no usage change: {finished:?}");
        };
        assert_eq!(entries.len(), 1, "the same model twice is summed");
        assert_eq!(
            (
                entries[0].input_tokens,
                entries[0].output_tokens,
                entries[0].total_tokens
            ),
            (15, 3, 18)
        );
        let cancelled = of(
            json!({"type": "RUN_ERROR", "message": "x", "code": "cancelled",
                                  "usage": [usage(7, 0)]}),
        );
        assert_eq!(cancelled[0], Change::Status(RunStatus::Cancelled));
        assert!(matches!(&cancelled[2], Change::Usage(e) if e[0].input_tokens == 7));
        assert_eq!(
            of(json!({"type": "RUN_FINISHED", "threadId": "t", "runId": "r1", "usage": []})).len(),
            1,
            "an empty usage changes nothing"
        );
    }

    #[test]
    fn a_run_is_marked_started_at_first_output_and_ended() {
        let at = Some(DateTime::from_timestamp(1_000, 0).unwrap_or_default());
        let mark = |value: Value| marks(&event(value));
        assert_eq!(
            mark(json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r1"})).started_at,
            at
        );
        assert_eq!(
            mark(json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "hi"}))
                .first_output_at,
            at
        );
        assert_eq!(
            mark(json!({"type": "TOOL_CALL_START", "toolCallId": "c", "toolCallName": "f"}))
                .first_output_at,
            at
        );
        assert_eq!(
            mark(json!({"type": "RUN_ERROR", "message": "x"})).ended_at,
            at
        );
        assert_eq!(
            mark(json!({"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"})),
            Marks::default()
        );
    }

    #[test]
    fn a_text_message_is_created_filled_and_timed() {
        assert_eq!(
            of(json!({"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"})),
            [Change::EnsureAssistant {
                message_id: "m".into(),
                metadata: metadata(json!({"run_id": "r1", "message_id": "m", "stage": "response"})),
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
            [Change::MergeMetadata {
                message_id: "m".into(),
                fields: metadata(json!({"latency_ms": 1_500}))
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
                metadata: metadata(
                    json!({"run_id": "r1", "message_id": "t1", "stage": "tool_execution",
                                          "tool_call_id": "c1", "latency_ms": 1_500})
                ),
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
                fields: metadata(json!({"stage": "intent"}))
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
