//! What a remote agent's events become: each AG-UI event it sends is checked against the
//! protocol's order (as AG-UI's own verifier checks it) and turned into the events relayed into
//! the run's log. Pure: JSON in, events or a [`ProtocolError`] out.
//!
//! - The agent's `RUN_STARTED` is checked and dropped (the worker sent its own); its
//!   `RUN_FINISHED` and `RUN_ERROR` end the relay ([`End`]): the worker sends its own terminal
//!   event after its checks.
//! - `TEXT_MESSAGE_CHUNK` / `TOOL_CALL_CHUNK` are expanded into start, content and end events as
//!   AG-UI clients expand them: a chunk with a new id starts a message (or call), the next event
//!   of another kind ends it.
//! - `STATE_SNAPSHOT` / `STATE_DELTA` also move the thread's state kept between runs.
//! - Reasoning, `MESSAGES_SNAPSHOT`, activity and `RAW` events pass through verbatim.

use protocol::usage::TokenUsage;
use std::collections::{BTreeMap, BTreeSet};

use protocol::agui::{Event, is_relayed_type};
use protocol::files::ATTACHMENTS_EVENT;
use protocol::interaction::INTERACTION_TIMEOUT_EVENT;
use serde_json::{Map, Value};

/// An event that breaks the AG-UI protocol: the message names it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProtocolError(pub String);

/// How the agent ended its run.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    /// `RUN_FINISHED`, with its `result` and `outcome` (an interrupt).
    Finished {
        /// Its `result`.
        result: Option<Value>,
        /// Its `outcome`.
        outcome: Option<Value>,
        /// The tokens the agent reported (AG-UI `usage`).
        usage: Vec<TokenUsage>,
    },
    /// `RUN_ERROR`.
    Failed {
        /// Its message.
        message: String,
        /// The tokens the agent reported (AG-UI `usage`).
        usage: Vec<TokenUsage>,
    },
}

/// AG-UI's `usage` of a terminal event: a list of `TokenUsage`, or (as some bridges send it) one
/// object; entries that are not usage are left out.
fn usage_of(event: &serde_json::Map<String, Value>) -> Vec<TokenUsage> {
    let entries = match event.get("usage") {
        Some(Value::Array(entries)) => entries.clone(),
        Some(entry @ Value::Object(_)) => vec![entry.clone()],
        _ => Vec::new(),
    };
    entries
        .into_iter()
        .filter_map(|entry| serde_json::from_value(entry).ok())
        .collect()
}

/// What one event from the agent gives.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Step {
    /// Events to relay, in order.
    pub relay: Vec<Event>,
    /// The run's end, if this event ended it.
    pub end: Option<End>,
}

/// The order checker and translator of one remote run.
#[derive(Debug, Default)]
pub struct Verifier {
    started: bool,
    ended: bool,
    /// Open text messages; `Some(role)` while the message's start is held back because nothing
    /// was said in it yet (an empty message is dropped whole).
    messages: BTreeMap<String, Option<String>>,
    calls: BTreeSet<String>,
    /// The message a `TEXT_MESSAGE_CHUNK` opened, still open.
    chunk_message: Option<String>,
    /// The call a `TOOL_CALL_CHUNK` opened, still open.
    chunk_call: Option<String>,
    state: Option<Value>,
    state_changed: bool,
}

fn field<'a>(
    event: &'a Map<String, Value>,
    kind: &str,
    name: &str,
) -> Result<&'a str, ProtocolError> {
    event
        .get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| ProtocolError(format!("{kind} without a string {name}")))
}

fn optional<'a>(event: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    event.get(name).and_then(Value::as_str)
}

impl Verifier {
    /// A verifier whose thread state starts as `state`.
    pub fn new(state: Option<Value>) -> Self {
        Self {
            state,
            ..Self::default()
        }
    }

    /// The thread's state after the events so far, if any event changed it.
    pub fn changed_state(&self) -> Option<&Value> {
        self.state_changed.then_some(self.state.as_ref()).flatten()
    }

    /// Whether the agent ended its run.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Checks and translates one event (the JSON of one SSE `data`).
    pub fn accept(&mut self, value: Value) -> Result<Step, ProtocolError> {
        let Value::Object(event) = value else {
            return Err(ProtocolError(
                "an event that is not a JSON object".to_owned(),
            ));
        };
        let kind = event
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| ProtocolError("an event without a string type".to_owned()))?
            .to_owned();
        if self.ended {
            return Err(ProtocolError(format!("{kind} after the run's end")));
        }
        if !self.started && kind != "RUN_STARTED" && kind != "RUN_ERROR" {
            return Err(ProtocolError(format!("{kind} before RUN_STARTED")));
        }
        let mut step = Step::default();
        // A chunk-opened message or call ends at the next event of another kind.
        if kind != "TEXT_MESSAGE_CHUNK"
            && let Some(id) = self.chunk_message.take()
        {
            self.end_message(&id, &mut step);
        }
        if kind != "TOOL_CALL_CHUNK"
            && let Some(id) = self.chunk_call.take()
        {
            self.calls.remove(&id);
            step.relay.push(Event::ToolCallEnd { tool_call_id: id });
        }
        match kind.as_str() {
            "RUN_STARTED" => {
                if self.started {
                    return Err(ProtocolError("a second RUN_STARTED".to_owned()));
                }
                self.started = true;
            }
            "RUN_FINISHED" => {
                if let Some((id, _)) = self.messages.first_key_value() {
                    return Err(ProtocolError(format!(
                        "RUN_FINISHED while text message {id:?} is still open"
                    )));
                }
                if let Some(id) = self.calls.first() {
                    return Err(ProtocolError(format!(
                        "RUN_FINISHED while tool call {id:?} is still open"
                    )));
                }
                self.ended = true;
                let present = |name: &str| event.get(name).filter(|v| !v.is_null()).cloned();
                step.end = Some(End::Finished {
                    result: present("result"),
                    outcome: present("outcome"),
                    usage: usage_of(&event),
                });
            }
            "RUN_ERROR" => {
                self.ended = true;
                let message = optional(&event, "message")
                    .filter(|m| !m.trim().is_empty())
                    .unwrap_or("the agent failed without a message");
                step.end = Some(End::Failed {
                    message: message.to_owned(),
                    usage: usage_of(&event),
                });
            }
            "TEXT_MESSAGE_START" => {
                let id = field(&event, &kind, "messageId")?.to_owned();
                let role = optional(&event, "role").unwrap_or("assistant").to_owned();
                self.open_message(&kind, &id, role)?;
            }
            "TEXT_MESSAGE_CONTENT" => {
                let id = field(&event, &kind, "messageId")?;
                self.require_message(&kind, id)?;
                let delta = field(&event, &kind, "delta")?;
                self.content(id, delta, &mut step);
            }
            "TEXT_MESSAGE_END" => {
                let id = field(&event, &kind, "messageId")?;
                self.require_message(&kind, id)?;
                self.end_message(id, &mut step);
            }
            "TEXT_MESSAGE_CHUNK" => self.text_chunk(&event, &mut step)?,
            "TOOL_CALL_START" => {
                let id = field(&event, &kind, "toolCallId")?.to_owned();
                let name = field(&event, &kind, "toolCallName")?.to_owned();
                self.open_call(&kind, &id)?;
                step.relay.push(Event::ToolCallStart {
                    tool_call_id: id,
                    tool_call_name: name,
                    parent_message_id: optional(&event, "parentMessageId").map(str::to_owned),
                });
            }
            "TOOL_CALL_ARGS" => {
                let id = field(&event, &kind, "toolCallId")?;
                self.require_call(&kind, id)?;
                step.relay.push(Event::ToolCallArgs {
                    tool_call_id: id.to_owned(),
                    delta: field(&event, &kind, "delta")?.to_owned(),
                });
            }
            "TOOL_CALL_END" => {
                let id = field(&event, &kind, "toolCallId")?;
                self.require_call(&kind, id)?;
                self.calls.remove(id);
                step.relay.push(Event::ToolCallEnd {
                    tool_call_id: id.to_owned(),
                });
            }
            "TOOL_CALL_CHUNK" => self.call_chunk(&event, &mut step)?,
            "TOOL_CALL_RESULT" => {
                let content = match event.get("content") {
                    Some(Value::String(text)) => text.clone(),
                    Some(other) if !other.is_null() => other.to_string(),
                    _ => return Err(ProtocolError(format!("{kind} without content"))),
                };
                step.relay.push(Event::ToolCallResult {
                    message_id: field(&event, &kind, "messageId")?.to_owned(),
                    tool_call_id: field(&event, &kind, "toolCallId")?.to_owned(),
                    content,
                });
            }
            "STEP_STARTED" => step.relay.push(Event::StepStarted {
                step_name: field(&event, &kind, "stepName")?.to_owned(),
            }),
            "STEP_FINISHED" => step.relay.push(Event::StepFinished {
                step_name: field(&event, &kind, "stepName")?.to_owned(),
            }),
            "STATE_SNAPSHOT" => {
                let snapshot = event.get("snapshot").cloned().unwrap_or(Value::Null);
                self.state = Some(snapshot.clone());
                self.state_changed = true;
                step.relay.push(Event::StateSnapshot { snapshot });
            }
            "STATE_DELTA" => {
                let Some(Value::Array(delta)) = event.get("delta") else {
                    return Err(ProtocolError(format!("{kind} without a delta array")));
                };
                let patch: json_patch::Patch = serde_json::from_value(Value::Array(delta.clone()))
                    .map_err(|err| ProtocolError(format!("{kind} is not a JSON Patch: {err}")))?;
                let state = self.state.get_or_insert_with(|| Value::Object(Map::new()));
                json_patch::patch(state, &patch).map_err(|err| {
                    ProtocolError(format!("{kind} does not apply to the state: {err}"))
                })?;
                self.state_changed = true;
                step.relay.push(Event::StateDelta {
                    delta: delta.clone(),
                });
            }
            "CUSTOM" => {
                let name = field(&event, &kind, "name")?;
                if name == ATTACHMENTS_EVENT || name == INTERACTION_TIMEOUT_EVENT {
                    return Err(ProtocolError(format!(
                        "CUSTOM {name:?} is the platform's own event"
                    )));
                }
                step.relay.push(Event::Custom {
                    name: name.to_owned(),
                    value: event.get("value").cloned().unwrap_or(Value::Null),
                });
            }
            other if is_relayed_type(other) => step.relay.push(Event::Other(event)),
            other => return Err(ProtocolError(format!("unknown event type {other:?}"))),
        }
        Ok(step)
    }

    /// Opens a message; its start is relayed with its first text.
    fn open_message(&mut self, kind: &str, id: &str, role: String) -> Result<(), ProtocolError> {
        if self.messages.contains_key(id) {
            return Err(ProtocolError(format!(
                "{kind} for text message {id:?}, which is already open"
            )));
        }
        self.messages.insert(id.to_owned(), Some(role));
        Ok(())
    }

    /// Text of an open message: its held-back start first.
    fn content(&mut self, id: &str, delta: &str, step: &mut Step) {
        if delta.is_empty() {
            return;
        }
        if let Some(held) = self.messages.get_mut(id)
            && let Some(role) = held.take()
        {
            step.relay.push(Event::TextMessageStart {
                message_id: id.to_owned(),
                role,
            });
        }
        step.relay.push(Event::TextMessageContent {
            message_id: id.to_owned(),
            delta: delta.to_owned(),
        });
    }

    /// Ends an open message; one that said nothing was never started and is dropped.
    fn end_message(&mut self, id: &str, step: &mut Step) {
        if let Some(None) = self.messages.remove(id) {
            step.relay.push(Event::TextMessageEnd {
                message_id: id.to_owned(),
            });
        }
    }

    fn require_message(&self, kind: &str, id: &str) -> Result<(), ProtocolError> {
        if self.messages.contains_key(id) {
            Ok(())
        } else {
            Err(ProtocolError(format!(
                "{kind} for text message {id:?} without its TEXT_MESSAGE_START"
            )))
        }
    }

    fn open_call(&mut self, kind: &str, id: &str) -> Result<(), ProtocolError> {
        if !self.calls.insert(id.to_owned()) {
            return Err(ProtocolError(format!(
                "{kind} for tool call {id:?}, which is already open"
            )));
        }
        Ok(())
    }

    fn require_call(&self, kind: &str, id: &str) -> Result<(), ProtocolError> {
        if self.calls.contains(id) {
            Ok(())
        } else {
            Err(ProtocolError(format!(
                "{kind} for tool call {id:?} without its TOOL_CALL_START"
            )))
        }
    }

    fn text_chunk(
        &mut self,
        event: &Map<String, Value>,
        step: &mut Step,
    ) -> Result<(), ProtocolError> {
        let kind = "TEXT_MESSAGE_CHUNK";
        let id = match (optional(event, "messageId"), &self.chunk_message) {
            (Some(id), _) => id.to_owned(),
            (None, Some(open)) => open.clone(),
            (None, None) => {
                return Err(ProtocolError(format!(
                    "{kind} without a messageId starts no message"
                )));
            }
        };
        if self.chunk_message.as_deref() != Some(id.as_str()) {
            if let Some(earlier) = self.chunk_message.take() {
                self.end_message(&earlier, step);
            }
            if !self.messages.contains_key(&id) {
                let role = optional(event, "role").unwrap_or("assistant").to_owned();
                self.open_message(kind, &id, role)?;
                self.chunk_message = Some(id.clone());
            }
        }
        if let Some(delta) = optional(event, "delta") {
            self.content(&id, delta, step);
        }
        Ok(())
    }

    fn call_chunk(
        &mut self,
        event: &Map<String, Value>,
        step: &mut Step,
    ) -> Result<(), ProtocolError> {
        let kind = "TOOL_CALL_CHUNK";
        let id = match (optional(event, "toolCallId"), &self.chunk_call) {
            (Some(id), _) => id.to_owned(),
            (None, Some(open)) => open.clone(),
            (None, None) => {
                return Err(ProtocolError(format!(
                    "{kind} without a toolCallId starts no call"
                )));
            }
        };
        if self.chunk_call.as_deref() != Some(id.as_str()) {
            if let Some(earlier) = self.chunk_call.take() {
                self.calls.remove(&earlier);
                step.relay.push(Event::ToolCallEnd {
                    tool_call_id: earlier,
                });
            }
            if !self.calls.contains(&id) {
                let name = optional(event, "toolCallName").ok_or_else(|| {
                    ProtocolError(format!(
                        "{kind} starting tool call {id:?} without a toolCallName"
                    ))
                })?;
                self.open_call(kind, &id)?;
                step.relay.push(Event::ToolCallStart {
                    tool_call_id: id.clone(),
                    tool_call_name: name.to_owned(),
                    parent_message_id: optional(event, "parentMessageId").map(str::to_owned),
                });
                self.chunk_call = Some(id.clone());
            }
        }
        if let Some(delta) = optional(event, "delta").filter(|d| !d.is_empty()) {
            step.relay.push(Event::ToolCallArgs {
                tool_call_id: id,
                delta: delta.to_owned(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn run(events: &[Value]) -> Result<(Vec<Value>, Option<End>), ProtocolError> {
        let mut verifier = Verifier::new(None);
        let mut relayed = Vec::new();
        let mut end = None;
        for event in events {
            let step = verifier.accept(event.clone())?;
            relayed.extend(step.relay.iter().map(|e| serde_json::to_value(e).unwrap()));
            if step.end.is_some() {
                end = step.end;
            }
        }
        Ok((relayed, end))
    }

    fn started() -> Value {
        json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r"})
    }

    fn finished() -> Value {
        json!({"type": "RUN_FINISHED", "threadId": "t", "runId": "r"})
    }

    fn error_of(events: &[Value]) -> String {
        run(events).unwrap_err().0
    }

    #[test]
    fn a_well_formed_run_is_relayed_without_its_own_start_and_end() {
        let (relayed, end) = run(&[
            started(),
            json!({"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant", "timestamp": 1}),
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "Hi"}),
            json!({"type": "TEXT_MESSAGE_END", "messageId": "m"}),
            json!({"type": "TOOL_CALL_START", "toolCallId": "c", "toolCallName": "f", "parentMessageId": "m"}),
            json!({"type": "TOOL_CALL_ARGS", "toolCallId": "c", "delta": "{}"}),
            json!({"type": "TOOL_CALL_END", "toolCallId": "c"}),
            json!({"type": "TOOL_CALL_RESULT", "messageId": "t1", "toolCallId": "c", "content": {"ok": true}, "role": "tool"}),
            json!({"type": "REASONING_MESSAGE_CONTENT", "messageId": "r1", "delta": "hmm"}),
            json!({"type": "RUN_FINISHED", "threadId": "t", "runId": "r", "result": {"n": 1}}),
        ])
        .unwrap();
        let types: Vec<&str> = relayed
            .iter()
            .map(|e| e["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            types,
            [
                "TEXT_MESSAGE_START",
                "TEXT_MESSAGE_CONTENT",
                "TEXT_MESSAGE_END",
                "TOOL_CALL_START",
                "TOOL_CALL_ARGS",
                "TOOL_CALL_END",
                "TOOL_CALL_RESULT",
                "REASONING_MESSAGE_CONTENT"
            ]
        );
        assert_eq!(relayed[6]["content"], "{\"ok\":true}");
        assert_eq!(
            relayed[7],
            json!({"type": "REASONING_MESSAGE_CONTENT", "messageId": "r1", "delta": "hmm"})
        );
        assert_eq!(
            end,
            Some(End::Finished {
                result: Some(json!({"n": 1})),
                outcome: None,
                usage: Vec::new(),
            })
        );
    }

    #[test]
    fn a_message_that_says_nothing_is_dropped_whole() {
        let (relayed, _) = run(&[
            started(),
            json!({"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"}),
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": ""}),
            json!({"type": "TEXT_MESSAGE_END", "messageId": "m"}),
            json!({"type": "TOOL_CALL_START", "toolCallId": "c", "toolCallName": "f", "parentMessageId": "m"}),
            json!({"type": "TOOL_CALL_END", "toolCallId": "c"}),
            finished(),
        ])
        .unwrap();
        let types: Vec<&str> = relayed
            .iter()
            .map(|e| e["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["TOOL_CALL_START", "TOOL_CALL_END"]);
    }

    #[test]
    fn chunks_become_start_content_and_end() {
        let (relayed, _) = run(&[
            started(),
            json!({"type": "TEXT_MESSAGE_CHUNK", "messageId": "m", "delta": "a"}),
            json!({"type": "TEXT_MESSAGE_CHUNK", "delta": "b"}),
            json!({"type": "TOOL_CALL_CHUNK", "toolCallId": "c", "toolCallName": "f", "delta": "{"}),
            json!({"type": "TOOL_CALL_CHUNK", "toolCallId": "c", "delta": "}"}),
            finished(),
        ])
        .unwrap();
        assert_eq!(
            relayed,
            [
                json!({"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"}),
                json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "a"}),
                json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "b"}),
                json!({"type": "TEXT_MESSAGE_END", "messageId": "m"}),
                json!({"type": "TOOL_CALL_START", "toolCallId": "c", "toolCallName": "f"}),
                json!({"type": "TOOL_CALL_ARGS", "toolCallId": "c", "delta": "{"}),
                json!({"type": "TOOL_CALL_ARGS", "toolCallId": "c", "delta": "}"}),
                json!({"type": "TOOL_CALL_END", "toolCallId": "c"}),
            ]
        );
    }

    #[test]
    fn out_of_order_events_are_protocol_errors_naming_them() {
        let content = json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "x"});
        assert!(error_of(&[started(), content.clone()]).contains("without its TEXT_MESSAGE_START"));
        assert!(error_of(std::slice::from_ref(&content)).contains("before RUN_STARTED"));
        assert!(
            error_of(&[started(), finished(), content.clone()]).contains("after the run's end")
        );
        let open = json!({"type": "TEXT_MESSAGE_START", "messageId": "m"});
        assert!(error_of(&[started(), open.clone(), finished()]).contains("still open"));
        assert!(error_of(&[started(), open.clone(), open]).contains("already open"));
        let call = json!({"type": "TOOL_CALL_START", "toolCallId": "c", "toolCallName": "f"});
        assert!(error_of(&[started(), call, finished()]).contains("tool call \"c\" is still open"));
        assert!(
            error_of(&[started(), json!({"type": "NOPE"})]).contains("unknown event type \"NOPE\"")
        );
        assert!(
            error_of(&[started(), json!({"type": "TEXT_MESSAGE_START"})]).contains("messageId")
        );
        assert!(error_of(&[started(), json!([1])]).contains("not a JSON object"));
        assert!(error_of(&[started(), started()]).contains("second RUN_STARTED"));
        let platform = json!({"type": "CUSTOM", "name": "attachments", "value": {}});
        assert!(error_of(&[started(), platform]).contains("platform's own"));
    }

    #[test]
    fn the_agents_error_ends_the_run_with_its_message() {
        let (_, end) = run(&[
            started(),
            json!({"type": "RUN_ERROR", "message": "model down", "code": "x",
                   "usage": [{"model": "m", "inputTokens": 5, "outputTokens": 1, "totalTokens": 6}]}),
        ])
        .unwrap();
        assert_eq!(
            end,
            Some(End::Failed {
                message: "model down".to_owned(),
                usage: vec![TokenUsage {
                    model: Some("m".to_owned()),
                    input_tokens: 5,
                    output_tokens: 1,
                    total_tokens: 6,
                    ..TokenUsage::default()
                }],
            })
        );
        let (_, end) = run(&[json!({"type": "RUN_ERROR"})]).unwrap();
        assert!(matches!(end, Some(End::Failed { .. })));
    }

    #[test]
    fn state_follows_snapshots_and_deltas() {
        let mut verifier = Verifier::new(Some(json!({"notes": ["a"]})));
        verifier.accept(started()).unwrap();
        assert_eq!(verifier.changed_state(), None);
        verifier
            .accept(json!({"type": "STATE_DELTA", "delta": [{"op": "add", "path": "/notes/-", "value": "b"}]}))
            .unwrap();
        assert_eq!(
            verifier.changed_state(),
            Some(&json!({"notes": ["a", "b"]}))
        );
        verifier
            .accept(json!({"type": "STATE_SNAPSHOT", "snapshot": {"n": 1}}))
            .unwrap();
        assert_eq!(verifier.changed_state(), Some(&json!({"n": 1})));
        let bad = verifier.accept(
            json!({"type": "STATE_DELTA", "delta": [{"op": "remove", "path": "/missing"}]}),
        );
        assert!(bad.unwrap_err().0.contains("does not apply"));
    }
}
