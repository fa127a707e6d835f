//! The WebSocket message schema of `websocket-message-schema.md`: what a client sends, what
//! the server answers, and how a run's AG-UI events become those messages. A socket whose
//! client speaks the NeMo Agent Toolkit's schema types gets the toolkit's wire values
//! ([`WsDialect`]).

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::agui::Event;
use crate::files::{ATTACHMENTS_EVENT, GeneratedAttachments};
use crate::interaction::{INTERACTION_TIMEOUT_EVENT, Prompt};
use crate::messaging::RunEventV1;

mod dialect;
mod inbound;

pub use dialect::{SEED_SCHEMA_TYPES, TOOLKIT_SCHEMA_TYPES, WsDialect};
pub use inbound::{Inbound, parse_inbound, parse_inbound_value};

/// Largest WebSocket message accepted, in bytes.
pub const MAX_WS_MESSAGE_BYTES: usize = 256 * 1024;
/// Longest conversation id.
pub const MAX_CONVERSATION_ID_CHARS: usize = 128;
/// Longest user text, as on the runs API.
pub const MAX_TEXT_CHARS: usize = 10_000;

/// `type` of a message, both directions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WsType {
    /// Client: a new turn.
    UserMessage,
    /// Client: the answer to a prompt.
    UserInteractionMessage,
    /// Server: a step of the run (tool call, step).
    SystemIntermediateMessage,
    /// Server: response tokens, then the end of the response.
    SystemResponseMessage,
    /// Server: a human-in-the-loop prompt.
    SystemInteractionMessage,
    /// Server: the run's OpenTelemetry trace id.
    ObservabilityTraceMessage,
    /// Server: something went wrong.
    ErrorMessage,
}

/// `status` of a server message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WsStatus {
    /// Still going.
    InProgress,
    /// Done.
    Completed,
    /// Failed.
    Failed,
}

/// The seed's error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WsErrorCode {
    /// Something failed on our side.
    UnknownError,
    /// The agent's run failed.
    WorkflowError,
    /// Not a message we can read (not JSON, missing or malformed fields).
    InvalidMessage,
    /// A `type` the client may not send.
    InvalidMessageType,
    /// The user content is missing, empty or over its limits.
    InvalidUserMessageContent,
    /// An attachment or data part is unusable.
    InvalidDataContent,
}

/// A message from the server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WsMessage {
    /// Message type.
    #[serde(rename = "type")]
    pub kind: WsType,
    /// Message id.
    pub id: String,
    /// Thread (the conversation); `null` on an error about a message that named none, absent
    /// on the trace message (as in the seed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<Option<String>>,
    /// The user message this answers (`null` on an error about a message without an id).
    #[serde(default)]
    pub parent_id: Option<String>,
    /// Parent step of an intermediate message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intermediate_parent_id: Option<String>,
    /// Conversation id (`null` on an error about a message that named none).
    #[serde(default)]
    pub conversation_id: Option<String>,
    /// The content, per type.
    pub content: Value,
    /// Processing state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<WsStatus>,
    /// ISO-8601.
    pub timestamp: String,
}

/// A refused or failed message: the seed's `error_message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WsError {
    /// Code.
    pub code: WsErrorCode,
    /// What went wrong, naming the field.
    pub message: String,
    /// Machine-readable detail.
    pub details: String,
}

impl WsError {
    /// An error.
    pub fn new(code: WsErrorCode, message: impl Into<String>, details: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            details: details.into(),
        }
    }

    /// The `error_message` for it.
    pub fn to_message(
        &self,
        id: String,
        conversation_id: Option<&str>,
        parent_id: Option<&str>,
        now: DateTime<Utc>,
    ) -> WsMessage {
        WsMessage {
            kind: WsType::ErrorMessage,
            id,
            thread_id: Some(conversation_id.map(str::to_owned)),
            parent_id: parent_id.map(str::to_owned),
            intermediate_parent_id: None,
            conversation_id: conversation_id.map(str::to_owned),
            content: json!({"code": self.code, "message": self.message, "details": self.details}),
            status: Some(WsStatus::Failed),
            timestamp: timestamp(now),
        }
    }
}

/// ISO-8601 with milliseconds.
pub fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Turns one run's events into server messages for a WebSocket client.
#[derive(Debug, Clone)]
pub struct WsMapper {
    conversation_id: String,
    parent_id: String,
    trace_id: Option<String>,
    /// Whether a failed run still ends the response ([`WsDialect::ends_failed_turns`]).
    dialect: WsDialect,
    /// Open tool calls: id -> (name, arguments so far).
    tools: std::collections::HashMap<String, (String, String)>,
}

impl WsMapper {
    /// A mapper for the run answering the user message `parent_id`.
    pub fn new(conversation_id: &str, parent_id: &str, trace_id: Option<String>) -> Self {
        Self {
            conversation_id: conversation_id.to_owned(),
            parent_id: parent_id.to_owned(),
            trace_id,
            dialect: WsDialect::Seed,
            tools: std::collections::HashMap::new(),
        }
    }

    /// The user message this run answers (every message's `parent_id`).
    pub fn parent_id(&self) -> &str {
        &self.parent_id
    }

    /// The same mapper for a client of `dialect`: the toolkit's gets the end of the response
    /// after a failed run's `error_message`, as the toolkit's own server sends it. (Statuses
    /// are the writer's: [`WsMessage::to_json`].)
    #[must_use]
    pub fn in_dialect(mut self, dialect: WsDialect) -> Self {
        self.dialect = dialect;
        self
    }

    fn message(
        &self,
        kind: WsType,
        id: String,
        content: Value,
        status: Option<WsStatus>,
        at: DateTime<Utc>,
    ) -> WsMessage {
        WsMessage {
            kind,
            id,
            thread_id: Some(Some(self.conversation_id.clone())),
            parent_id: Some(self.parent_id.clone()),
            intermediate_parent_id: (kind == WsType::SystemIntermediateMessage)
                .then(|| "default".to_owned()),
            conversation_id: Some(self.conversation_id.clone()),
            content,
            status,
            timestamp: timestamp(at),
        }
    }

    /// The messages for one event; `now` sets a prompt's remaining time.
    /// Every message's id is `<runId>:<seq>` of its event (a prompt's is the prompt id), so a
    /// client can name the last one it got when it reconnects.
    pub fn map(&mut self, event: &RunEventV1, now: DateTime<Utc>) -> Vec<WsMessage> {
        let at = event.emitted_at;
        let id = format!("{}:{}", event.run_id, event.seq);
        let intermediate = |this: &Self, id: &String, name: &str, payload: String, status| {
            this.message(
                WsType::SystemIntermediateMessage,
                id.clone(),
                json!({"name": name, "payload": payload}),
                Some(status),
                at,
            )
        };
        match &event.event {
            Event::RunStarted { .. } => self.trace(id, at).into_iter().collect(),
            Event::TextMessageContent { delta, .. } if !delta.is_empty() => vec![self.message(
                WsType::SystemResponseMessage,
                id.clone(),
                json!({"text": delta}),
                Some(WsStatus::InProgress),
                at,
            )],
            Event::StepStarted { step_name } => vec![intermediate(
                self,
                &id,
                step_name,
                String::new(),
                WsStatus::InProgress,
            )],
            Event::StepFinished { step_name } => vec![intermediate(
                self,
                &id,
                step_name,
                String::new(),
                WsStatus::Completed,
            )],
            Event::ToolCallStart {
                tool_call_id,
                tool_call_name,
                ..
            } => {
                self.tools.insert(
                    tool_call_id.clone(),
                    (tool_call_name.clone(), String::new()),
                );
                vec![intermediate(
                    self,
                    &id,
                    tool_call_name,
                    String::new(),
                    WsStatus::InProgress,
                )]
            }
            Event::ToolCallArgs {
                tool_call_id,
                delta,
            } => {
                if let Some((_, args)) = self.tools.get_mut(tool_call_id) {
                    args.push_str(delta);
                }
                Vec::new()
            }
            Event::ToolCallEnd { tool_call_id } => {
                let (name, args) = self.tools.get(tool_call_id).cloned().unwrap_or_default();
                vec![intermediate(self, &id, &name, args, WsStatus::Completed)]
            }
            Event::ToolCallResult {
                tool_call_id,
                content,
                ..
            } => {
                let name = self
                    .tools
                    .get(tool_call_id)
                    .map(|(n, _)| n.clone())
                    .unwrap_or_default();
                vec![intermediate(
                    self,
                    &id,
                    &name,
                    content.clone(),
                    WsStatus::Completed,
                )]
            }
            // Files the agent made: the seed has no message type for them, and a response
            // message's content is only `{text}`. An intermediate message is a named step whose
            // payload "can be json", so it carries them as a completed step named `attachments`
            // whose payload is the JSON list of files, in the shape of the assistant message's
            // `attachments` in history (`file-attachments.md`): a client renders it as the
            // message's FilesBlock (each event holds all files so far, so the latest replaces
            // the block), and one that does not know it shows a finished step.
            Event::Custom { name, value } if name == ATTACHMENTS_EVENT => {
                GeneratedAttachments::parse_event(value)
                    .ok()
                    .and_then(|event| serde_json::to_string(&event.files).ok())
                    .map(|files| {
                        intermediate(self, &id, ATTACHMENTS_EVENT, files, WsStatus::Completed)
                    })
                    .into_iter()
                    .collect()
            }
            Event::Custom { name, value } if name == INTERACTION_TIMEOUT_EVENT => {
                vec![self.prompt_timeout(value, at)]
            }
            Event::RunFinished { outcome, usage, .. } => {
                let mut sent = self.finished(outcome.as_ref(), id, now, at);
                // The response's end carries what the run used (AG-UI `TokenUsage`s).
                if let Some(usage) = usage
                    && let Some(end) = sent.iter_mut().find(|m| {
                        m.kind == WsType::SystemResponseMessage
                            && m.status == Some(WsStatus::Completed)
                    })
                {
                    end.content["usage"] = serde_json::to_value(usage).unwrap_or_default();
                }
                sent
            }
            Event::RunError { message, code, .. } => {
                let error = WsError::new(
                    WsErrorCode::WorkflowError,
                    message.clone(),
                    code.clone().unwrap_or_else(|| "run_error".to_owned()),
                )
                .to_message(
                    id.clone(),
                    Some(&self.conversation_id),
                    Some(&self.parent_id),
                    at,
                );
                let end = self.dialect.ends_failed_turns().then(|| {
                    WsMessage::response_end(id.clone(), &self.conversation_id, &self.parent_id, at)
                });
                std::iter::once(error).chain(end).collect()
            }
            _ => Vec::new(),
        }
    }

    /// The run's trace id, for clients that show it (when the run has one).
    fn trace(&self, id: String, at: DateTime<Utc>) -> Option<WsMessage> {
        let trace = self.trace_id.clone()?;
        let mut m = self.message(
            WsType::ObservabilityTraceMessage,
            id,
            json!({"observability_trace_id": trace}),
            None,
            at,
        );
        m.thread_id = None;
        Some(m)
    }

    /// The error message of a prompt that timed out (`CUSTOM interaction_timeout`).
    fn prompt_timeout(&self, value: &Value, at: DateTime<Utc>) -> WsMessage {
        let prompt_id = value
            .get("promptId")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let error = value
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or(crate::interaction::DEFAULT_PROMPT_ERROR);
        // Under the user message the prompt was about, like the rest of the reply (the seed:
        // "id from user message"); the message's own id names the prompt.
        let mut m = WsError::new(WsErrorCode::WorkflowError, error, "TimeoutError").to_message(
            format!("{prompt_id}-timeout"),
            Some(&self.conversation_id),
            Some(&self.parent_id),
            at,
        );
        m.status = Some(WsStatus::Failed);
        m
    }

    /// The end of a run: `completed`, or the questions it stopped on. A run that stops on a
    /// question has not completed the response: `completed` comes with the end of the run that
    /// continues after the answer or timeout.
    fn finished(
        &self,
        outcome: Option<&Value>,
        id: String,
        now: DateTime<Utc>,
        at: DateTime<Utc>,
    ) -> Vec<WsMessage> {
        let interrupts = outcome
            .filter(|o| o.get("type").and_then(Value::as_str) == Some("interrupt"))
            .and_then(|o| o.get("interrupts"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if interrupts.is_empty() {
            return vec![WsMessage::response_end(
                id,
                &self.conversation_id,
                &self.parent_id,
                at,
            )];
        }
        interrupts
            .iter()
            .filter_map(|interrupt| self.interaction(interrupt, now, at))
            .collect()
    }

    /// The `system_interaction_message` of an AG-UI interrupt, with the time left at `now`.
    fn interaction(
        &self,
        interrupt: &Value,
        now: DateTime<Utc>,
        at: DateTime<Utc>,
    ) -> Option<WsMessage> {
        let id = interrupt.get("id")?.as_str()?.to_owned();
        let mut prompt: Prompt =
            serde_json::from_value(interrupt.get("metadata")?.get("prompt")?.clone()).ok()?;
        if let Some(expires) = interrupt
            .get("expiresAt")
            .and_then(Value::as_str)
            .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        {
            let ms = (expires.with_timezone(&Utc) - now)
                .num_milliseconds()
                .max(0);
            prompt.timeout = Some(u64::try_from(ms).unwrap_or(0).div_ceil(1000));
        }
        Some(self.message(
            WsType::SystemInteractionMessage,
            id,
            serde_json::to_value(prompt).ok()?,
            Some(WsStatus::InProgress),
            at,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(raw: &str) -> WsErrorCode {
        parse_inbound(raw).unwrap_err().code
    }

    #[test]
    fn the_seed_user_message_example_is_read_as_its_last_user_message() {
        let seed = json!({
            "type": "user_message", "schema_type": "string", "id": "string", "conversation_id": "string",
            "content": {"messages": [
                {"role": "user", "content": [{"type": "text", "text": "Hello, how are you?"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "im good"}]},
                {"role": "user", "content": [{"type": "text", "text": "solve this question"}]}
            ]},
            "timestamp": "string", "user": {"name": "string", "email": "string"},
            "security": {"api_key": "string", "token": "string"},
            "error": {"code": "string", "message": "string", "details": "string"},
            "schema_version": "string"
        });
        let Ok(Inbound::UserMessage {
            id,
            conversation_id,
            content,
        }) = parse_inbound(&seed.to_string())
        else {
            panic!("not a user message");
        };
        assert_eq!(
            (id.as_str(), conversation_id.as_str()),
            ("string", "string")
        );
        assert_eq!(content.text(), "solve this question");
    }

    #[test]
    fn every_error_code_a_client_can_cause_has_a_failing_message() {
        assert_eq!(code("{not json"), WsErrorCode::InvalidMessage);
        assert_eq!(
            code(r#"{"type":"user_message","conversation_id":"c","content":{"messages":[]}}"#),
            WsErrorCode::InvalidMessage,
        );
        assert_eq!(
            code(r#"{"type":"telepathy"}"#),
            WsErrorCode::InvalidMessageType
        );
        assert_eq!(
            code(r#"{"type":"system_response_message"}"#),
            WsErrorCode::InvalidMessageType
        );
        assert_eq!(
            code(
                r#"{"type":"user_message","id":"m","conversation_id":"c","content":{"messages":[{"role":"assistant","content":"x"}]}}"#
            ),
            WsErrorCode::InvalidUserMessageContent
        );
        assert_eq!(
            code(
                r#"{"type":"user_message","id":"m","conversation_id":"c","content":{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,!!"}}]}]}}"#
            ),
            WsErrorCode::InvalidDataContent
        );
        // A well-formed inline image is refused too, saying what to do instead.
        let inline = json!({"type": "user_message", "id": "m", "conversation_id": "c",
            "content": {"messages": [{"role": "user", "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]}});
        let err = parse_inbound(&inline.to_string()).unwrap_err();
        assert_eq!(
            (err.code, err.details.as_str()),
            (WsErrorCode::InvalidDataContent, "image_url.url")
        );
        assert!(err.message.contains("upload-url"), "{}", err.message);
        // schema_type: "string" (the seed's example) or absent; anything else is named.
        let mut typed = json!({"type": "user_message", "schema_type": "string", "id": "m",
            "conversation_id": "c", "content": {"messages": [{"role": "user", "content": "hi"}]}});
        assert!(parse_inbound(&typed.to_string()).is_ok());
        typed["schema_type"] = json!("json_schema");
        let err = parse_inbound(&typed.to_string()).unwrap_err();
        assert_eq!(
            (err.code, err.details.as_str()),
            (WsErrorCode::InvalidMessage, "schema_type")
        );
        let long = "x".repeat(129);
        let err = parse_inbound(
            &json!({"type": "chat", "message": "hi", "session_id": long}).to_string(),
        )
        .unwrap_err();
        assert_eq!(
            (err.code, err.details.as_str()),
            (WsErrorCode::InvalidMessage, "session_id")
        );
    }

    fn finished(outcome: Option<Value>) -> RunEventV1 {
        RunEventV1 {
            task_id: uuid::Uuid::nil(),
            owner: "alice".to_owned(),
            thread_id: "c1".to_owned(),
            run_id: "r1".to_owned(),
            seq: 4,
            emitted_at: Utc::now(),
            event: Event::RunFinished {
                thread_id: "c1".to_owned(),
                run_id: "r1".to_owned(),
                result: None,
                outcome,
                usage: None,
            },
        }
    }

    #[test]
    fn a_run_that_stops_on_a_question_asks_without_saying_completed() {
        let prompt = json!({"input_type": "text", "text": "Why?", "required": true,
                            "timeout": null, "error": "This prompt is no longer available."});
        let outcome = json!({"type": "interrupt",
                             "interrupts": [{"id": "p1", "metadata": {"prompt": prompt}}]});
        let mut mapper = WsMapper::new("c1", "m1", None);
        let asked = mapper.map(&finished(Some(outcome)), Utc::now());
        let kinds: Vec<_> = asked.iter().map(|m| (m.kind, m.status)).collect();
        assert_eq!(
            kinds,
            [(WsType::SystemInteractionMessage, Some(WsStatus::InProgress))],
            "only the question, still in progress"
        );
        let done = mapper.map(&finished(None), Utc::now());
        let kinds: Vec<_> = done.iter().map(|m| (m.kind, m.status)).collect();
        assert_eq!(
            kinds,
            [(WsType::SystemResponseMessage, Some(WsStatus::Completed))]
        );
    }

    fn failed() -> RunEventV1 {
        RunEventV1 {
            seq: 5,
            event: Event::RunError {
                message: "the agent failed".to_owned(),
                code: Some("agent_error".to_owned()),
                usage: None,
            },
            ..finished(None)
        }
    }

    #[test]
    fn a_failed_run_ends_with_its_error_for_a_seed_client() {
        let mut mapper = WsMapper::new("c1", "m1", None);
        let sent = mapper.map(&failed(), Utc::now());
        let kinds: Vec<_> = sent.iter().map(|m| (m.kind, m.status)).collect();
        assert_eq!(kinds, [(WsType::ErrorMessage, Some(WsStatus::Failed))]);
        assert_eq!(
            sent[0].to_json(WsDialect::Seed).unwrap(),
            serde_json::to_string(&sent[0]).unwrap()
        );
    }

    #[test]
    fn a_failed_run_still_ends_the_response_for_a_toolkit_client() {
        // The toolkit's server sends `complete` after a workflow's error (`_run_workflow`'s
        // `finally`); its UI stops "generating" only then.
        let mut mapper = WsMapper::new("c1", "m1", None).in_dialect(WsDialect::Toolkit);
        let sent: Vec<Value> = mapper
            .map(&failed(), Utc::now())
            .iter()
            .map(|m| serde_json::from_str(&m.to_json(WsDialect::Toolkit).unwrap()).unwrap())
            .collect();
        let shape: Vec<_> = sent
            .iter()
            .map(|m| {
                (
                    m["type"].as_str().unwrap(),
                    m["status"].as_str().unwrap(),
                    m["parent_id"].as_str().unwrap(),
                    m["conversation_id"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            shape,
            [
                ("error_message", "in_progress", "m1", "c1"),
                ("system_response_message", "complete", "m1", "c1")
            ]
        );
        assert_eq!(sent[0]["content"]["code"], "workflow_error");
        assert_eq!(sent[1]["content"], json!({"text": ""}));
    }

    #[test]
    fn a_toolkit_client_gets_complete_where_the_seed_says_completed() {
        let mut mapper = WsMapper::new("c1", "m1", None).in_dialect(WsDialect::Toolkit);
        let done = mapper.map(&finished(None), Utc::now());
        let [end] = done.as_slice() else {
            panic!("one message: {done:?}");
        };
        let wire: Value = serde_json::from_str(&end.to_json(WsDialect::Toolkit).unwrap()).unwrap();
        assert_eq!(
            (&wire["type"], &wire["status"]),
            (&json!("system_response_message"), &json!("complete"))
        );
        let wire: Value = serde_json::from_str(&end.to_json(WsDialect::Seed).unwrap()).unwrap();
        assert_eq!(wire["status"], "completed");
        // A tool step's end likewise.
        let step = RunEventV1 {
            seq: 2,
            event: Event::StepFinished {
                step_name: "plan".to_owned(),
            },
            ..finished(None)
        };
        let steps = mapper.map(&step, Utc::now());
        let wire: Value =
            serde_json::from_str(&steps[0].to_json(WsDialect::Toolkit).unwrap()).unwrap();
        assert_eq!(
            (&wire["type"], &wire["status"]),
            (&json!("system_intermediate_message"), &json!("complete"))
        );
    }

    #[test]
    fn files_the_agent_made_reach_the_client_as_a_completed_attachments_step() {
        let files = json!([{"path": "/notes.md", "filename": "notes.md", "icon_type": "md",
                            "source": "generated", "content_url": "s3://b/generated/o/i/notes.md"}]);
        let event = |value: Value| RunEventV1 {
            seq: 7,
            event: Event::Custom {
                name: "attachments".to_owned(),
                value,
            },
            ..finished(None)
        };
        let mut mapper = WsMapper::new("c1", "m1", None);
        let sent = mapper.map(
            &event(json!({"messageId": "r1-reply", "files": files})),
            Utc::now(),
        );
        let [message] = sent.as_slice() else {
            panic!("one message: {sent:?}");
        };
        assert_eq!(
            (message.kind, message.status, message.id.as_str()),
            (
                WsType::SystemIntermediateMessage,
                Some(WsStatus::Completed),
                "r1:7"
            )
        );
        assert_eq!(message.content["name"], "attachments");
        let payload: Value =
            serde_json::from_str(message.content["payload"].as_str().unwrap()).unwrap();
        assert_eq!(payload, files, "the payload is the JSON list of files");
        let refused = json!({"messageId": "r1-reply", "files": [{"path": "../x", "filename": "x",
                              "icon_type": "txt", "source": "generated"}]});
        assert!(
            mapper.map(&event(refused), Utc::now()).is_empty(),
            "an event history would refuse is not shown either"
        );
    }
}
