//! Which wire values a socket's server messages use: the seed's (`websocket-message-schema.md`)
//! or the NeMo Agent Toolkit's.
//!
//! The seed is written from the toolkit's WebSocket, and the two differ in a few values only.
//! The toolkit's models (`nat.data_models.api_server`: `WebSocketMessageStatus`) have two statuses,
//! `in_progress` and `complete`, where the seed has `in_progress | completed | failed`; its
//! `error_message` is sent `in_progress` (as in the seed's own example); and its server ends
//! every workflow it started, a failed one too, with an empty `system_response_message`
//! `complete`. Its UI (`NeMo-Agent-Toolkit-UI`, `types/websocket.ts`) ends a response only on
//! that `complete`, so a toolkit client that got `completed` waits for ever. A client says which
//! it speaks by its `schema_type`: the toolkit's four (`chat_stream`, `chat`, `generate_stream`,
//! `generate`) or the seed's (`string`, or none). The server keeps one [`WsMessage`] model in
//! the seed's terms and writes it in the socket's dialect ([`WsMessage::to_json`]).

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{WsMessage, WsStatus, WsType, timestamp};

/// The seed's `schema_type` values (also when absent): the response is streamed text.
pub const SEED_SCHEMA_TYPES: [&str; 1] = ["string"];

/// The NeMo Agent Toolkit's `schema_type` values (`WorkflowSchemaType`). The response is the
/// same streamed text for all four: its UI appends every `in_progress` text it gets, so a
/// non-streaming schema reads the same.
pub const TOOLKIT_SCHEMA_TYPES: [&str; 4] = ["chat_stream", "chat", "generate_stream", "generate"];

/// The wire values of one socket's server messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WsDialect {
    /// The seed's: statuses `in_progress | completed | failed`.
    #[default]
    Seed,
    /// The NeMo Agent Toolkit's: statuses `in_progress | complete`; an `error_message` is
    /// `in_progress`, and a failed run still ends with `complete`.
    Toolkit,
}

impl WsDialect {
    /// The dialect a `schema_type` names: the seed's for `string` or none, the toolkit's for one
    /// of [`TOOLKIT_SCHEMA_TYPES`], `None` for anything else (which the parser refuses).
    pub fn of_schema_type(schema_type: Option<&str>) -> Option<Self> {
        match schema_type {
            None => Some(Self::Seed),
            Some(kind) if SEED_SCHEMA_TYPES.contains(&kind) => Some(Self::Seed),
            Some(kind) if TOOLKIT_SCHEMA_TYPES.contains(&kind) => Some(Self::Toolkit),
            Some(_) => None,
        }
    }

    /// The dialect a client message asks for, read before (and whether or not) it is accepted,
    /// so that a refusal is already in the client's values: a `user_message` decides by its
    /// `schema_type` (`null` is none); every other message, an answer to a prompt included
    /// (neither the seed nor the toolkit gives it a `schema_type`), and a `schema_type` of
    /// neither leave the socket's dialect as it is (`None`).
    pub fn requested_by(message: &Value) -> Option<Self> {
        if message.get("type").and_then(Value::as_str) != Some("user_message") {
            return None;
        }
        match message.get("schema_type") {
            None | Some(Value::Null) => Some(Self::Seed),
            Some(Value::String(kind)) => Self::of_schema_type(Some(kind)),
            Some(_) => None,
        }
    }

    /// `status` on the wire.
    pub fn status(self, status: WsStatus) -> &'static str {
        match (self, status) {
            (_, WsStatus::InProgress) | (Self::Toolkit, WsStatus::Failed) => "in_progress",
            (Self::Seed, WsStatus::Completed) => "completed",
            (Self::Toolkit, WsStatus::Completed) => "complete",
            (Self::Seed, WsStatus::Failed) => "failed",
        }
    }

    /// Whether a client of this dialect is told that a turn ended without a response (its run
    /// failed, or it was refused before one started) by a `system_response_message` that ends
    /// the response after the `error_message`: the toolkit's, whose server does so and whose UI
    /// waits for it; the seed's `error_message` (`failed`) ends it on its own.
    pub fn ends_failed_turns(self) -> bool {
        self == Self::Toolkit
    }
}

impl WsMessage {
    /// The message as JSON text in `dialect`'s values.
    pub fn to_json(&self, dialect: WsDialect) -> serde_json::Result<String> {
        let Some(status) = self.status else {
            return serde_json::to_string(self);
        };
        let mut value = serde_json::to_value(self)?;
        if let Some(field) = value.get_mut("status") {
            *field = Value::from(dialect.status(status));
        }
        serde_json::to_string(&value)
    }

    /// The empty `system_response_message` that ends the response to `parent_id` (`completed`;
    /// the toolkit's `complete`).
    pub fn response_end(
        id: String,
        conversation_id: &str,
        parent_id: &str,
        at: DateTime<Utc>,
    ) -> Self {
        Self {
            kind: WsType::SystemResponseMessage,
            id,
            thread_id: Some(Some(conversation_id.to_owned())),
            parent_id: Some(parent_id.to_owned()),
            intermediate_parent_id: None,
            conversation_id: Some(conversation_id.to_owned()),
            content: serde_json::json!({"text": ""}),
            status: Some(WsStatus::Completed),
            timestamp: timestamp(at),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn wire(message: &WsMessage, dialect: WsDialect) -> Value {
        serde_json::from_str(&message.to_json(dialect).unwrap()).unwrap()
    }

    fn end() -> WsMessage {
        let at = DateTime::parse_from_rfc3339("2025-01-13T10:00:02Z").unwrap();
        WsMessage::response_end("r1:9".to_owned(), "c1", "m1", at.with_timezone(&Utc))
    }

    #[test]
    fn the_seed_and_the_toolkit_schema_types_name_their_dialects_and_nothing_else_does() {
        assert_eq!(WsDialect::of_schema_type(None), Some(WsDialect::Seed));
        assert_eq!(
            WsDialect::of_schema_type(Some("string")),
            Some(WsDialect::Seed)
        );
        for kind in TOOLKIT_SCHEMA_TYPES {
            assert_eq!(
                WsDialect::of_schema_type(Some(kind)),
                Some(WsDialect::Toolkit),
                "{kind}"
            );
        }
        for kind in ["", "String", "CHAT_STREAM", "json_schema", "chat-stream"] {
            assert_eq!(WsDialect::of_schema_type(Some(kind)), None, "{kind:?}");
        }
    }

    #[test]
    fn only_a_user_message_decides_the_dialect() {
        let turn = |schema_type: Value| {
            json!({"type": "user_message", "schema_type": schema_type, "id": "m1",
                   "conversation_id": "c1", "content": {"messages": []}})
        };
        assert_eq!(
            WsDialect::requested_by(&turn(json!("chat_stream"))),
            Some(WsDialect::Toolkit)
        );
        assert_eq!(
            WsDialect::requested_by(&turn(json!("generate"))),
            Some(WsDialect::Toolkit)
        );
        assert_eq!(
            WsDialect::requested_by(&turn(json!("string"))),
            Some(WsDialect::Seed)
        );
        assert_eq!(
            WsDialect::requested_by(&turn(json!(null))),
            Some(WsDialect::Seed)
        );
        let mut bare = turn(json!(null));
        bare.as_object_mut().unwrap().remove("schema_type");
        assert_eq!(WsDialect::requested_by(&bare), Some(WsDialect::Seed));
        for refused in [json!("json_schema"), json!(5), json!(["chat"])] {
            assert_eq!(
                WsDialect::requested_by(&turn(refused.clone())),
                None,
                "{refused}"
            );
        }
        // The NeMo UI's answer to a prompt carries no schema_type: the socket's stays.
        let answer = json!({"type": "user_interaction_message", "id": "a1", "parent_id": "m1",
            "conversation_id": "c1", "content": {"messages": []}});
        assert_eq!(WsDialect::requested_by(&answer), None);
        let answer = json!({"type": "user_interaction_message", "schema_type": "string"});
        assert_eq!(WsDialect::requested_by(&answer), None);
        for other in [
            json!({"type": "chat", "message": "hi", "session_id": "s1"}),
            json!({"schema_type": "chat_stream"}),
            json!("user_message"),
        ] {
            assert_eq!(WsDialect::requested_by(&other), None, "{other}");
        }
    }

    #[test]
    fn a_seed_socket_gets_the_seeds_statuses() {
        assert_eq!(
            [WsStatus::InProgress, WsStatus::Completed, WsStatus::Failed]
                .map(|s| WsDialect::Seed.status(s)),
            ["in_progress", "completed", "failed"]
        );
        assert_eq!(wire(&end(), WsDialect::Seed)["status"], "completed");
    }

    #[test]
    fn a_toolkit_socket_gets_complete_and_errors_in_progress() {
        assert_eq!(
            [WsStatus::InProgress, WsStatus::Completed, WsStatus::Failed]
                .map(|s| WsDialect::Toolkit.status(s)),
            ["in_progress", "complete", "in_progress"]
        );
        assert_eq!(wire(&end(), WsDialect::Toolkit)["status"], "complete");
    }

    #[test]
    fn the_dialect_changes_the_status_and_nothing_else() {
        let error = super::super::WsError::new(
            super::super::WsErrorCode::WorkflowError,
            "boom",
            "run_error",
        )
        .to_message(
            "r1:3".to_owned(),
            Some("c1"),
            Some("m1"),
            chrono::Utc::now(),
        );
        for message in [end(), error] {
            let seed = wire(&message, WsDialect::Seed);
            let mut toolkit = wire(&message, WsDialect::Toolkit);
            assert_eq!(
                seed,
                serde_json::to_value(&message).unwrap(),
                "the seed's wire is the model as it is"
            );
            assert_eq!(
                seed.as_object().unwrap().keys().collect::<Vec<_>>(),
                toolkit.as_object().unwrap().keys().collect::<Vec<_>>(),
                "same fields, same order"
            );
            toolkit["status"] = seed["status"].clone();
            assert_eq!(toolkit, seed);
        }
    }

    #[test]
    fn a_message_without_a_status_is_written_alike_in_both() {
        let trace = WsMessage {
            kind: WsType::ObservabilityTraceMessage,
            id: "r1:1".to_owned(),
            thread_id: None,
            parent_id: Some("m1".to_owned()),
            intermediate_parent_id: None,
            conversation_id: Some("c1".to_owned()),
            content: json!({"observability_trace_id": "0af7651916cd43dd8448eb211c80319c"}),
            status: None,
            timestamp: "2025-01-20T10:00:00.000Z".to_owned(),
        };
        assert_eq!(
            trace.to_json(WsDialect::Toolkit).unwrap(),
            trace.to_json(WsDialect::Seed).unwrap()
        );
        assert!(wire(&trace, WsDialect::Toolkit).get("status").is_none());
    }

    #[test]
    fn the_response_end_is_the_seeds_empty_completed_response() {
        assert_eq!(
            wire(&end(), WsDialect::Seed),
            json!({"type": "system_response_message", "id": "r1:9", "thread_id": "c1",
                   "parent_id": "m1", "conversation_id": "c1", "content": {"text": ""},
                   "status": "completed", "timestamp": "2025-01-13T10:00:02.000Z"})
        );
        assert!(WsDialect::Toolkit.ends_failed_turns());
        assert!(!WsDialect::Seed.ends_failed_turns());
    }
}
