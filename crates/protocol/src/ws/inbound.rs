//! What a client sends over the WebSocket (and `POST /v2/chat`), read into [`Inbound`].
//!
//! The text is read into a `serde_json::Value` first, so text that is not JSON is told apart
//! from JSON that is not a message, and a repeated key keeps its last value. The object is then
//! read as [`Wire`], an enum tagged by `type` whose variants are typed structs of typed fields:
//! a field type refuses a bad value with a [`Refusal`], and `serde_path_to_error` names the
//! field it was found in. Every answer is the one the hand-written checks before these types
//! gave, down to which of several broken rules is named: the fields reach serde in the order
//! those checks ran ([`CHECK_ORDER`]), an absent one as `null` (which every check treats like
//! absent), so serde stops where they stopped; and the user's `content`, checked last, is read
//! after the other fields, from its last user message only.

use serde::de::{self, DeserializeOwned, Deserializer};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::{
    MAX_CONVERSATION_ID_CHARS, MAX_TEXT_CHARS, MAX_WS_MESSAGE_BYTES, SEED_SCHEMA_TYPES,
    TOOLKIT_SCHEMA_TYPES, WsError, WsErrorCode,
};
use crate::run_input::{ContentBlock, SourcePart, TextBlock, UserContent};

/// What a client sent, checked.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    /// A new turn: the last user message of `content.messages`.
    UserMessage {
        /// Message id (becomes the run id and the user message's id).
        id: String,
        /// Conversation (thread).
        conversation_id: String,
        /// The user's content.
        content: UserContent,
    },
    /// The answer to the prompt `parent_id`.
    UserInteraction {
        /// Message id.
        id: String,
        /// Conversation (thread).
        conversation_id: String,
        /// The prompt answered.
        parent_id: String,
        /// The answer text.
        answer: String,
    },
    /// The chat form of `file-attachments.md`.
    Chat {
        /// Text.
        message: String,
        /// Session (thread).
        session_id: String,
        /// Files (`s3://` content URLs).
        content_urls: Vec<String>,
    },
}

/// Reads one client message.
pub fn parse_inbound(raw: &str) -> Result<Inbound, WsError> {
    if raw.len() > MAX_WS_MESSAGE_BYTES {
        return Err(WsError::new(
            WsErrorCode::InvalidMessage,
            format!("a message may be at most {MAX_WS_MESSAGE_BYTES} bytes"),
            "size",
        ));
    }
    let message: Value = serde_json::from_str(raw).map_err(|e| {
        WsError::new(
            WsErrorCode::InvalidMessage,
            format!("message is not valid JSON: {e}"),
            "json",
        )
    })?;
    parse_inbound_value(message)
}

/// Reads one client message that is already JSON, as [`parse_inbound`] reads its text after the
/// size and JSON checks; the caller bounds the size (`POST /v2/chat` reads at most 256 KiB).
pub fn parse_inbound_value(message: Value) -> Result<Inbound, WsError> {
    let Value::Object(fields) = message else {
        return Err(WsError::new(
            WsErrorCode::InvalidMessage,
            "message must be a JSON object",
            "json",
        ));
    };
    let message = in_check_order(fields);
    let Envelope {
        kind: Required(kind),
    } = read(&message)?;
    match read(message)? {
        Wire::UserMessage(turn) => turn.0?.inbound(),
        Wire::UserInteractionMessage(answer) => answer.0?.inbound(),
        Wire::Chat(chat) => Ok(chat.0?.inbound()),
        Wire::SystemIntermediateMessage
        | Wire::SystemResponseMessage
        | Wire::SystemInteractionMessage
        | Wire::ObservabilityTraceMessage
        | Wire::ErrorMessage => Err(WsError::new(
            WsErrorCode::InvalidMessageType,
            format!("{kind} is sent by the server, not by clients"),
            "type",
        )),
        Wire::Unknown => Err(WsError::new(
            WsErrorCode::InvalidMessageType,
            format!("type must be user_message, user_interaction_message or chat, not {kind:?}"),
            "type",
        )),
    }
}

/// Every field a message type reads, in the order its checks run: `type`; then those of
/// `user_message` and `user_interaction_message`; then those of `chat`.
const CHECK_ORDER: [&str; 9] = [
    "type",
    "schema_type",
    "id",
    "conversation_id",
    "parent_id",
    "content",
    "message",
    "session_id",
    "content_urls",
];

/// The fields of [`CHECK_ORDER`] in that order, an absent one as `null`. Fields no message type
/// reads are left out: they are ignored either way.
fn in_check_order(mut fields: Map<String, Value>) -> Value {
    let ordered: Map<String, Value> = CHECK_ORDER
        .iter()
        .map(|&name| (name.to_owned(), fields.remove(name).unwrap_or(Value::Null)))
        .collect();
    Value::Object(ordered)
}

/// Reads a `T`, answering the first refused field as its [`Refusal`] says, named by its path.
fn read<'de, T: Deserialize<'de>>(
    fields: impl Deserializer<'de, Error = serde_json::Error>,
) -> Result<T, WsError> {
    serde_path_to_error::deserialize(fields).map_err(|error| {
        let field = error.path().to_string();
        let reason = error.into_inner().to_string();
        match serde_json::from_str::<Refusal>(&reason) {
            Ok(refusal) => refusal.answer(&field),
            // Not reached: every field type refuses with a `Refusal`, and the fields are all
            // there (`in_check_order`).
            Err(_) => WsError::new(
                WsErrorCode::InvalidMessage,
                format!("{field} is malformed: {reason}"),
                field,
            ),
        }
    })
}

/// Why a field was refused; [`Refusal::answer`] words it, naming the field. serde carries errors
/// as text, so a field type refuses with its JSON and [`read`] reads it back.
#[derive(Debug, Serialize, Deserialize)]
enum Refusal {
    /// Absent, `null` or empty.
    Missing,
    /// Not a string.
    NotString,
    /// A conversation id over [`MAX_CONVERSATION_ID_CHARS`].
    LongId,
    /// Chat text over [`MAX_TEXT_CHARS`].
    LongText,
    /// A `schema_type` not in [`SCHEMA_TYPES`], as sent (its JSON).
    SchemaType(String),
    /// Not a list of strings.
    NotUrls,
}

impl Refusal {
    /// The error a field type returns.
    fn into_error<E: de::Error>(self) -> E {
        E::custom(serde_json::to_string(&self).unwrap_or_default())
    }

    /// The answer to the client.
    fn answer(self, field: &str) -> WsError {
        let (code, message) = match self {
            Self::Missing => (WsErrorCode::InvalidMessage, format!("{field} is required")),
            Self::NotString => (
                WsErrorCode::InvalidMessage,
                format!("{field} must be a string"),
            ),
            Self::LongId => (
                WsErrorCode::InvalidMessage,
                format!("{field} must be at most {MAX_CONVERSATION_ID_CHARS} characters"),
            ),
            Self::LongText => (
                WsErrorCode::InvalidUserMessageContent,
                format!("{field} is longer than {MAX_TEXT_CHARS} characters"),
            ),
            Self::SchemaType(sent) => (
                WsErrorCode::InvalidMessage,
                format!(
                    "{field} must be one of {SCHEMA_TYPES:?} (the response is streamed text), not {sent}"
                ),
            ),
            Self::NotUrls => (
                WsErrorCode::InvalidDataContent,
                format!("{field} must be a list of s3:// URLs"),
            ),
        };
        WsError::new(code, message, field)
    }
}

/// The `type` of a message, read on its own first: serde's tag would take a number for a
/// variant's index, and today's answers name an absent, empty or non-string `type` as such.
#[derive(Deserialize)]
struct Envelope {
    #[serde(rename = "type")]
    kind: Required,
}

/// A client message by its `type`. The server's types are listed so that they are refused as
/// the server's.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Wire {
    /// A new turn.
    UserMessage(Fields<Turn>),
    /// The answer to a prompt.
    UserInteractionMessage(Fields<Answer>),
    /// The chat form of `file-attachments.md`.
    Chat(Fields<Chat>),
    /// Server only.
    SystemIntermediateMessage,
    /// Server only.
    SystemResponseMessage,
    /// Server only.
    SystemInteractionMessage,
    /// Server only.
    ObservabilityTraceMessage,
    /// Server only.
    ErrorMessage,
    /// Any other `type`.
    #[serde(other)]
    Unknown,
}

/// A variant's fields, or the answer refusing them. serde reads an internally tagged variant
/// from a copy it buffered, which `serde_path_to_error` cannot follow, so the variant reads that
/// copy again through [`read`] to name a refused field by its path.
struct Fields<T>(Result<T, WsError>);

impl<'de, T: DeserializeOwned> Deserialize<'de> for Fields<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Value::deserialize(deserializer).map(|fields| Self(read(fields)))
    }
}

/// `user_message`.
#[derive(Deserialize)]
struct Turn {
    /// Checked, not kept: every response is streamed text (the socket's dialect is read from
    /// it apart, refused message or not: [`super::WsDialect::requested_by`]).
    #[serde(rename = "schema_type")]
    _schema_type: SchemaType,
    id: Required,
    conversation_id: ConversationId,
    /// Read by [`user_content`], after the other fields.
    content: Value,
}

impl Turn {
    fn inbound(self) -> Result<Inbound, WsError> {
        Ok(Inbound::UserMessage {
            id: self.id.0,
            conversation_id: self.conversation_id.0,
            content: user_content(self.content)?,
        })
    }
}

/// `user_interaction_message`.
#[derive(Deserialize)]
struct Answer {
    /// Checked, not kept: every response is streamed text (the socket's dialect is read from
    /// it apart, refused message or not: [`super::WsDialect::requested_by`]).
    #[serde(rename = "schema_type")]
    _schema_type: SchemaType,
    id: Required,
    conversation_id: ConversationId,
    parent_id: Required,
    /// Read by [`user_content`], after the other fields.
    content: Value,
}

impl Answer {
    fn inbound(self) -> Result<Inbound, WsError> {
        Ok(Inbound::UserInteraction {
            id: self.id.0,
            conversation_id: self.conversation_id.0,
            parent_id: self.parent_id.0,
            // May be empty: skipping a prompt that is not required; the prompt decides.
            answer: content_of(self.content, true)?.text(),
        })
    }
}

/// `chat`.
#[derive(Deserialize)]
struct Chat {
    message: ChatText,
    session_id: ConversationId,
    content_urls: ContentUrls,
}

impl Chat {
    fn inbound(self) -> Inbound {
        Inbound::Chat {
            message: self.message.0,
            session_id: self.session_id.0,
            content_urls: self.content_urls.0,
        }
    }
}

/// A required string: absent, `null` and `""` are missing.
struct Required(String);

impl<'de> Deserialize<'de> for Required {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Option::<String>::deserialize(deserializer) {
            Ok(Some(text)) if !text.is_empty() => Ok(Self(text)),
            Ok(_) => Err(Refusal::Missing.into_error()),
            Err(_) => Err(Refusal::NotString.into_error()),
        }
    }
}

/// A conversation (`conversation_id`, or chat's `session_id`): required, at most
/// [`MAX_CONVERSATION_ID_CHARS`] characters.
struct ConversationId(String);

impl<'de> Deserialize<'de> for ConversationId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let Required(id) = Required::deserialize(deserializer)?;
        if id.chars().count() > MAX_CONVERSATION_ID_CHARS {
            return Err(Refusal::LongId.into_error());
        }
        Ok(Self(id))
    }
}

/// Chat's `message`: required, at most [`MAX_TEXT_CHARS`] characters (blank is fine).
struct ChatText(String);

impl<'de> Deserialize<'de> for ChatText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let Required(text) = Required::deserialize(deserializer)?;
        if text.chars().count() > MAX_TEXT_CHARS {
            return Err(Refusal::LongText.into_error());
        }
        Ok(Self(text))
    }
}

/// The response schemas a client may ask for with `schema_type`: the seed's `string` (also when
/// absent) and the NeMo Agent Toolkit's four, which its UI sends; each is answered with the
/// streamed text of `system_response_message`s.
const SCHEMA_TYPES: [&str; 5] = [
    SEED_SCHEMA_TYPES[0],
    TOOLKIT_SCHEMA_TYPES[0],
    TOOLKIT_SCHEMA_TYPES[1],
    TOOLKIT_SCHEMA_TYPES[2],
    TOOLKIT_SCHEMA_TYPES[3],
];

/// `schema_type`: absent, `null` or one of [`SCHEMA_TYPES`].
struct SchemaType;

impl<'de> Deserialize<'de> for SchemaType {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::Null => Ok(Self),
            Value::String(kind) if SCHEMA_TYPES.contains(&kind.as_str()) => Ok(Self),
            other => Err(Refusal::SchemaType(other.to_string()).into_error()),
        }
    }
}

/// Chat's `content_urls`: a list of strings, none when absent or `null`. Admission checks what
/// they point to.
struct ContentUrls(Vec<String>);

impl<'de> Deserialize<'de> for ContentUrls {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Read as a whole, so that a refused element names the list, not its index.
        let urls = Value::deserialize(deserializer)?;
        match Option::<Vec<String>>::deserialize(urls) {
            Ok(urls) => Ok(Self(urls.unwrap_or_default())),
            Err(_) => Err(Refusal::NotUrls.into_error()),
        }
    }
}

/// `content` of a user or interaction message.
#[derive(Deserialize)]
struct Conversation {
    /// OpenAI-compatible chat messages.
    messages: Vec<Value>,
}

/// One of [`Conversation::messages`], as far as it is read.
#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Value,
}

/// `value` as the struct `T` when it is a JSON object (serde also reads a struct from a list,
/// by position, which these messages never allowed).
fn object<T: DeserializeOwned>(value: Value) -> Option<T> {
    if value.is_object() {
        serde_json::from_value(value).ok()
    } else {
        None
    }
}

fn bad_content(message: impl Into<String>, details: &str) -> WsError {
    WsError::new(WsErrorCode::InvalidUserMessageContent, message, details)
}

/// The user's content: the last user message of `content.messages` (the seed: "only the last
/// user message in the list will be processed", so the others are not checked), its parts as
/// AG-UI blocks, with some text and at most [`MAX_TEXT_CHARS`] characters of it.
fn user_content(content: Value) -> Result<UserContent, WsError> {
    content_of(content, false)
}

/// The last user message of `content`; `may_be_empty`: an answer, which may skip a prompt that
/// is not required.
fn content_of(content: Value, may_be_empty: bool) -> Result<UserContent, WsError> {
    let Conversation { messages } = object(content).ok_or_else(|| {
        bad_content(
            "content.messages must be a list of messages",
            "content.messages",
        )
    })?;
    let last = messages
        .into_iter()
        .rev()
        .filter_map(object::<ChatMessage>)
        .find(|message| message.role == "user")
        .ok_or_else(|| bad_content("content.messages has no user message", "content.messages"))?;
    let blocks = match last.content {
        Value::String(text) => vec![text_block(text)],
        Value::Array(parts) => parts.into_iter().map(block).collect::<Result<_, _>>()?,
        _ => {
            return Err(bad_content(
                "the user message's content must be text or a list of parts",
                "content.messages[].content",
            ));
        }
    };
    let content = UserContent::Blocks(blocks);
    let text = content.text();
    if text.trim().is_empty() && !may_be_empty {
        return Err(bad_content(
            "the user message has no text",
            "content.messages[].content",
        ));
    }
    if text.chars().count() > MAX_TEXT_CHARS {
        return Err(bad_content(
            format!("the user message is longer than {MAX_TEXT_CHARS} characters"),
            "content.messages[].content",
        ));
    }
    Ok(content)
}

fn text_block(text: String) -> ContentBlock {
    ContentBlock::Text(TextBlock {
        text,
        extra: Map::new(),
    })
}

/// One OpenAI content part as an AG-UI block: text, or an image as an `image` part with a URL
/// source.
fn block(part: Value) -> Result<ContentBlock, WsError> {
    match part.get("type").and_then(Value::as_str).unwrap_or_default() {
        "text" => match part.get("text") {
            Some(Value::String(text)) => Ok(text_block(text.clone())),
            _ => Err(bad_content(
                "a text part needs text",
                "content.messages[].content[].text",
            )),
        },
        "image_url" => {
            let url = part
                .get("image_url")
                .and_then(|image| image.get("url"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    WsError::new(
                        WsErrorCode::InvalidDataContent,
                        "an image_url part needs image_url.url",
                        "image_url.url",
                    )
                })?;
            check_url(url, "image_url.url")?;
            Ok(ContentBlock::Image(SourcePart {
                source: json!({"type": "url", "value": url}),
                extra: Map::new(),
            }))
        }
        // OpenAI's audio part, by URL: `input_audio.url` an uploaded audio file (OpenAI's inline
        // `input_audio.data` is refused like an inline image).
        "input_audio" => {
            let audio = part.get("input_audio");
            if audio.and_then(|a| a.get("data")).is_some() {
                return Err(WsError::new(
                    WsErrorCode::InvalidDataContent,
                    "inline audio data is not accepted; upload the file first (POST /v2/files/upload-url) and send its content_url as input_audio.url",
                    "input_audio.data",
                ));
            }
            let url = audio
                .and_then(|a| a.get("url"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    WsError::new(
                        WsErrorCode::InvalidDataContent,
                        "an input_audio part needs input_audio.url (an uploaded file's content_url)",
                        "input_audio.url",
                    )
                })?;
            check_url(url, "input_audio.url")?;
            Ok(ContentBlock::Audio(SourcePart {
                source: json!({"type": "url", "value": url}),
                extra: Map::new(),
            }))
        }
        other => Err(WsError::new(
            WsErrorCode::InvalidDataContent,
            format!("content parts must be text, image_url or input_audio, not {other:?}"),
            "content.messages[].content[].type",
        )),
    }
}

/// A URL a part may carry: a file of the attachments service, as an `s3://` content URL or a
/// URL it signed (admission checks which, and that it is the caller's verified file). Inline
/// `data:` images are refused here, naming why: every file an agent sees is an upload the
/// attachments service verified and the owner can list, download and delete.
fn check_url(url: &str, field: &str) -> Result<(), WsError> {
    if url.starts_with("data:") {
        return Err(WsError::new(
            WsErrorCode::InvalidDataContent,
            "inline data: URLs are not accepted; upload the file first (POST /v2/files/upload-url) and send its content_url",
            field,
        ));
    }
    if url.starts_with("https://") || url.starts_with("http://") || url.starts_with("s3://") {
        return Ok(());
    }
    Err(WsError::new(
        WsErrorCode::InvalidDataContent,
        format!("{field} must be an s3:// content_url or a URL signed by the attachments service"),
        field,
    ))
}

/// Pins what [`parse_inbound`] answers, one case per refusal and per accepted form: the code,
/// the message and the field of every `error_message` a client can cause.
#[cfg(test)]
mod tests {
    use super::*;

    fn turn() -> Value {
        json!({"type": "user_message", "id": "m1", "conversation_id": "c1",
               "content": {"messages": [{"role": "user", "content": "hello"}]}})
    }

    fn answer() -> Value {
        json!({"type": "user_interaction_message", "id": "m2", "conversation_id": "c1",
               "parent_id": "p1", "content": {"messages": [{"role": "user", "content": "yes"}]}})
    }

    fn chat() -> Value {
        json!({"type": "chat", "message": "hi", "session_id": "s1"})
    }

    fn with(mut message: Value, key: &str, value: Value) -> Value {
        message[key] = value;
        message
    }

    fn without(mut message: Value, key: &str) -> Value {
        message.as_object_mut().unwrap().remove(key);
        message
    }

    /// A user message whose last user message has `content`.
    fn turn_with(content: Value) -> Value {
        with(
            turn(),
            "content",
            json!({"messages": [{"role": "user", "content": content}]}),
        )
    }

    fn read(message: &Value) -> Inbound {
        parse_inbound(&message.to_string()).expect("accepted")
    }

    fn refusal(message: &Value) -> WsError {
        parse_inbound(&message.to_string()).expect_err("refused")
    }

    fn refused(code: WsErrorCode, message: &str, details: &str) -> WsError {
        WsError::new(code, message, details)
    }

    fn invalid(message: &str, details: &str) -> WsError {
        refused(WsErrorCode::InvalidMessage, message, details)
    }

    fn bad_content(message: &str, details: &str) -> WsError {
        refused(WsErrorCode::InvalidUserMessageContent, message, details)
    }

    fn bad_data(message: &str, details: &str) -> WsError {
        refused(WsErrorCode::InvalidDataContent, message, details)
    }

    fn text(text: &str) -> ContentBlock {
        ContentBlock::Text(TextBlock {
            text: text.to_owned(),
            extra: Map::new(),
        })
    }

    fn image(url: &str) -> ContentBlock {
        ContentBlock::Image(SourcePart {
            source: json!({"type": "url", "value": url}),
            extra: Map::new(),
        })
    }

    fn user_message(blocks: Vec<ContentBlock>) -> Inbound {
        Inbound::UserMessage {
            id: "m1".to_owned(),
            conversation_id: "c1".to_owned(),
            content: UserContent::Blocks(blocks),
        }
    }

    const MISSING_MESSAGES: &str = "content.messages must be a list of messages";
    const NOT_TEXT_OR_PARTS: &str = "the user message's content must be text or a list of parts";
    const INLINE_DATA: &str = "inline data: URLs are not accepted; upload the file first (POST /v2/files/upload-url) and send its content_url";
    const OTHER_SCHEME: &str =
        "image_url.url must be an s3:// content_url or a URL signed by the attachments service";
    const CONTENT_URLS: &str = "content_urls must be a list of s3:// URLs";

    #[test]
    fn a_message_over_256_kib_is_refused_naming_the_size() {
        let raw = format!("{{}}{}", " ".repeat(MAX_WS_MESSAGE_BYTES - 1));
        assert_eq!(
            parse_inbound(&raw).unwrap_err(),
            invalid("a message may be at most 262144 bytes", "size")
        );
    }

    #[test]
    fn a_message_of_exactly_256_kib_is_read() {
        let short = chat().to_string();
        let raw = format!("{short}{}", " ".repeat(MAX_WS_MESSAGE_BYTES - short.len()));
        assert_eq!(raw.len(), MAX_WS_MESSAGE_BYTES);
        assert!(
            parse_inbound(&raw).is_ok(),
            "trailing spaces are JSON whitespace"
        );
    }

    #[test]
    fn a_message_that_is_not_json_is_refused_with_the_parser_reason() {
        assert_eq!(
            parse_inbound("{not json").unwrap_err(),
            invalid(
                "message is not valid JSON: key must be a string at line 1 column 2",
                "json"
            )
        );
        assert_eq!(
            parse_inbound("").unwrap_err(),
            invalid(
                "message is not valid JSON: EOF while parsing a value at line 1 column 0",
                "json"
            )
        );
    }

    #[test]
    fn characters_after_the_json_value_are_refused_as_not_json() {
        assert_eq!(
            parse_inbound(r#"{"type": "chat"} x"#).unwrap_err(),
            invalid(
                "message is not valid JSON: trailing characters at line 1 column 18",
                "json"
            )
        );
    }

    #[test]
    fn a_json_value_that_is_not_an_object_is_refused() {
        for raw in ["[]", "[1]", "\"chat\"", "5", "null", "true"] {
            assert_eq!(
                parse_inbound(raw).unwrap_err(),
                invalid("message must be a JSON object", "json"),
                "{raw}"
            );
        }
    }

    #[test]
    fn a_message_without_a_type_or_with_a_null_or_empty_one_is_refused_as_required() {
        for message in [
            without(chat(), "type"),
            with(chat(), "type", json!(null)),
            with(chat(), "type", json!("")),
        ] {
            assert_eq!(
                refusal(&message),
                invalid("type is required", "type"),
                "{message}"
            );
        }
    }

    #[test]
    fn a_type_that_is_not_a_string_is_refused_naming_type() {
        for kind in [json!(0), json!(true), json!(["chat"]), json!({"chat": 1})] {
            assert_eq!(
                refusal(&with(chat(), "type", kind.clone())),
                invalid("type must be a string", "type"),
                "{kind}"
            );
        }
    }

    #[test]
    fn a_server_message_type_sent_by_a_client_is_refused_as_the_server_s() {
        for kind in [
            "system_intermediate_message",
            "system_response_message",
            "system_interaction_message",
            "observability_trace_message",
            "error_message",
        ] {
            assert_eq!(
                refusal(&json!({"type": kind})),
                refused(
                    WsErrorCode::InvalidMessageType,
                    &format!("{kind} is sent by the server, not by clients"),
                    "type"
                )
            );
        }
    }

    #[test]
    fn an_unknown_type_is_refused_quoting_it() {
        assert_eq!(
            refusal(&json!({"type": "telepathy", "id": 5})),
            refused(
                WsErrorCode::InvalidMessageType,
                r#"type must be user_message, user_interaction_message or chat, not "telepathy""#,
                "type"
            )
        );
        assert_eq!(
            refusal(&json!({"type": "User_Message\"\n"})).message,
            r#"type must be user_message, user_interaction_message or chat, not "User_Message\"\n""#,
        );
    }

    #[test]
    fn a_user_message_with_text_content_is_read_as_one_text_block() {
        assert_eq!(read(&turn()), user_message(vec![text("hello")]));
    }

    #[test]
    fn a_user_message_keeps_its_text_and_image_parts_in_order() {
        let message = turn_with(json!([
            {"type": "text", "text": "look", "cache": true},
            {"type": "image_url", "image_url": {"url": "s3://bucket/a.png", "detail": "low"}},
            {"type": "image_url", "image_url": {"url": "https://files.example/b.png?sig=1"}},
            {"type": "text", "text": "and"},
            {"type": "image_url", "image_url": {"url": "http://localhost/c.png"}}
        ]));
        assert_eq!(
            read(&message),
            user_message(vec![
                text("look"),
                image("s3://bucket/a.png"),
                image("https://files.example/b.png?sig=1"),
                text("and"),
                image("http://localhost/c.png"),
            ])
        );
    }

    #[test]
    fn only_the_last_user_message_is_read_and_the_others_are_not_checked() {
        let message = with(
            turn(),
            "content",
            json!({"messages": [
                {"role": "user", "content": 5},
                7,
                {"role": "user", "content": [{"type": "audio"}]},
                {"role": "user", "content": "the last"},
                {"role": "assistant", "content": {"not": "checked"}},
                {"role": 5}
            ]}),
        );
        assert_eq!(read(&message), user_message(vec![text("the last")]));
    }

    #[test]
    fn the_seed_s_optional_and_unknown_fields_are_ignored() {
        let mut message = turn();
        message["timestamp"] = json!(5);
        message["user"] = json!({"name": "n"});
        message["security"] = json!({"token": "t"});
        message["error"] = json!("e");
        message["schema_version"] = json!(["1"]);
        message["parent_id"] = json!(5);
        message["message"] = json!(5);
        message["session_id"] = json!(5);
        message["content_urls"] = json!(5);
        message["content"]["extra"] = json!(true);
        assert_eq!(read(&message), user_message(vec![text("hello")]));
    }

    #[test]
    fn a_schema_type_of_string_or_null_is_accepted() {
        for kind in [json!("string"), json!(null)] {
            assert_eq!(
                read(&with(turn(), "schema_type", kind)),
                user_message(vec![text("hello")])
            );
        }
    }

    #[test]
    fn the_nemo_agent_toolkits_schema_types_are_accepted_on_turns_and_answers() {
        for kind in ["chat_stream", "chat", "generate_stream", "generate"] {
            assert_eq!(
                read(&with(turn(), "schema_type", json!(kind))),
                user_message(vec![text("hello")]),
                "{kind}"
            );
            assert!(
                matches!(
                    read(&with(answer(), "schema_type", json!(kind))),
                    Inbound::UserInteraction { .. }
                ),
                "{kind}"
            );
        }
    }

    /// What the NeMo Agent Toolkit UI sends (`components/Chat/Chat.tsx`, `handleSend`): its
    /// custom payload fields, the schema type of its settings (`chat_stream` by default), a
    /// uuid, the conversation's id, the whole conversation when its chat history is on (an
    /// assistant message's text part may be empty), and a timestamp.
    fn nemo_ui_turn() -> Value {
        json!({
            "custom_field": {"from": "settings"},
            "type": "user_message",
            "schema_type": "chat_stream",
            "id": "5f0c1a0e-2b8d-4a56-9d43-3f1e0b7c2a11",
            "conversation_id": "0b6f7c2e-9a4d-4e1b-8f7a-6c5d4e3b2a19",
            "content": {"messages": [
                {"role": "user", "content": [{"type": "text", "text": "Hello"}]},
                {"role": "assistant", "content": [{"type": "text", "text": ""}]},
                {"role": "user", "content": [{"type": "text", "text": "What can you do?"}]}
            ]},
            "timestamp": "2026-07-01T09:30:00.123Z"
        })
    }

    #[test]
    fn the_nemo_ui_user_message_is_read_as_its_last_user_message() {
        assert_eq!(
            read(&nemo_ui_turn()),
            Inbound::UserMessage {
                id: "5f0c1a0e-2b8d-4a56-9d43-3f1e0b7c2a11".to_owned(),
                conversation_id: "0b6f7c2e-9a4d-4e1b-8f7a-6c5d4e3b2a19".to_owned(),
                content: UserContent::Blocks(vec![text("What can you do?")]),
            }
        );
        // Its chat history off: only the last message, as sent.
        let mut last_only = nemo_ui_turn();
        last_only["content"]["messages"] =
            json!([{"role": "user", "content": [{"type": "text", "text": "What can you do?"}]}]);
        assert_eq!(read(&last_only), read(&nemo_ui_turn()));
    }

    #[test]
    fn the_nemo_ui_answer_to_a_prompt_is_read_with_the_parent_id_it_sends() {
        // `handleUserInteraction`: no schema_type, the prompt's thread_id and parent_id (the
        // user message's id, not the prompt's), the chosen option's value as a text part.
        let answer = json!({
            "type": "user_interaction_message",
            "id": "9c2d4e6f-1a3b-4c5d-8e7f-0a1b2c3d4e5f",
            "conversation_id": "0b6f7c2e-9a4d-4e1b-8f7a-6c5d4e3b2a19",
            "thread_id": "0b6f7c2e-9a4d-4e1b-8f7a-6c5d4e3b2a19",
            "parent_id": "5f0c1a0e-2b8d-4a56-9d43-3f1e0b7c2a11",
            "content": {"messages": [{"role": "user", "content": [{"type": "text", "text": "sms"}]}]},
            "timestamp": "2026-07-01T09:30:05.456Z"
        });
        assert_eq!(
            read(&answer),
            Inbound::UserInteraction {
                id: "9c2d4e6f-1a3b-4c5d-8e7f-0a1b2c3d4e5f".to_owned(),
                conversation_id: "0b6f7c2e-9a4d-4e1b-8f7a-6c5d4e3b2a19".to_owned(),
                parent_id: "5f0c1a0e-2b8d-4a56-9d43-3f1e0b7c2a11".to_owned(),
                answer: "sms".to_owned(),
            }
        );
    }

    #[test]
    fn any_other_schema_type_is_refused_quoting_its_json() {
        for (kind, shown) in [
            (json!("json_schema"), r#""json_schema""#),
            (json!(""), r#""""#),
            (json!(5), "5"),
            (json!(1.5), "1.5"),
            (json!(["string"]), r#"["string"]"#),
            (json!("CHAT_STREAM"), r#""CHAT_STREAM""#),
            (json!("chat-stream"), r#""chat-stream""#),
            (json!({"b": 1, "a": 2}), r#"{"b":1,"a":2}"#),
        ] {
            assert_eq!(
                refusal(&with(turn(), "schema_type", kind)),
                invalid(
                    &format!(
                        r#"schema_type must be one of ["string", "chat_stream", "chat", "generate_stream", "generate"] (the response is streamed text), not {shown}"#
                    ),
                    "schema_type"
                )
            );
        }
    }

    #[test]
    fn a_missing_null_or_empty_id_is_refused_as_required() {
        for message in [
            without(turn(), "id"),
            with(turn(), "id", json!(null)),
            with(turn(), "id", json!("")),
        ] {
            assert_eq!(refusal(&message), invalid("id is required", "id"));
        }
    }

    #[test]
    fn an_id_that_is_not_a_string_is_refused() {
        for id in [json!(1), json!(false), json!(["m1"]), json!({})] {
            assert_eq!(
                refusal(&with(turn(), "id", id)),
                invalid("id must be a string", "id")
            );
        }
    }

    #[test]
    fn a_missing_null_or_empty_conversation_id_is_refused_as_required() {
        for message in [
            without(turn(), "conversation_id"),
            with(turn(), "conversation_id", json!(null)),
            with(turn(), "conversation_id", json!("")),
        ] {
            assert_eq!(
                refusal(&message),
                invalid("conversation_id is required", "conversation_id")
            );
        }
    }

    #[test]
    fn a_conversation_id_that_is_not_a_string_is_refused() {
        assert_eq!(
            refusal(&with(turn(), "conversation_id", json!(7))),
            invalid("conversation_id must be a string", "conversation_id")
        );
    }

    #[test]
    fn a_conversation_id_over_128_characters_is_refused_and_128_are_read() {
        assert_eq!(
            refusal(&with(turn(), "conversation_id", json!("c".repeat(129)))),
            invalid(
                "conversation_id must be at most 128 characters",
                "conversation_id"
            )
        );
        let wide = "é".repeat(128);
        let Inbound::UserMessage {
            conversation_id, ..
        } = read(&with(turn(), "conversation_id", json!(wide)))
        else {
            panic!("not a user message");
        };
        assert_eq!(conversation_id, wide, "characters are counted, not bytes");
    }

    #[test]
    fn content_without_a_list_of_messages_is_refused() {
        for content in [
            json!(null),
            json!("hello"),
            json!([{"role": "user", "content": "hello"}]),
            json!({}),
            json!({"messages": null}),
            json!({"messages": {"role": "user", "content": "hello"}}),
        ] {
            assert_eq!(
                refusal(&with(turn(), "content", content.clone())),
                bad_content(MISSING_MESSAGES, "content.messages"),
                "{content}"
            );
        }
        assert_eq!(
            refusal(&without(turn(), "content")),
            bad_content(MISSING_MESSAGES, "content.messages")
        );
    }

    #[test]
    fn messages_without_a_user_message_are_refused() {
        for messages in [
            json!([]),
            json!([{"role": "assistant", "content": "hi"}]),
            json!([{"role": "User", "content": "hi"}, {"role": 5}, "user", null]),
            json!([{"content": "hi"}]),
        ] {
            assert_eq!(
                refusal(&with(turn(), "content", json!({"messages": messages}))),
                bad_content("content.messages has no user message", "content.messages"),
                "{messages}"
            );
        }
    }

    #[test]
    fn a_user_message_whose_content_is_neither_text_nor_parts_is_refused() {
        for content in [json!(null), json!(5), json!({"type": "text", "text": "hi"})] {
            assert_eq!(
                refusal(&turn_with(content.clone())),
                bad_content(NOT_TEXT_OR_PARTS, "content.messages[].content"),
                "{content}"
            );
        }
        let no_content = with(turn(), "content", json!({"messages": [{"role": "user"}]}));
        assert_eq!(
            refusal(&no_content),
            bad_content(NOT_TEXT_OR_PARTS, "content.messages[].content")
        );
    }

    #[test]
    fn a_text_part_without_text_is_refused() {
        for part in [json!({"type": "text"}), json!({"type": "text", "text": 5})] {
            assert_eq!(
                refusal(&turn_with(json!([part]))),
                bad_content(
                    "a text part needs text",
                    "content.messages[].content[].text"
                )
            );
        }
    }

    #[test]
    fn an_image_part_without_a_url_is_refused() {
        for part in [
            json!({"type": "image_url"}),
            json!({"type": "image_url", "image_url": "s3://bucket/a.png"}),
            json!({"type": "image_url", "image_url": {}}),
            json!({"type": "image_url", "image_url": {"url": 5}}),
            json!({"type": "image_url", "url": "s3://bucket/a.png"}),
        ] {
            assert_eq!(
                refusal(&turn_with(json!([{"type": "text", "text": "see"}, part]))),
                bad_data("an image_url part needs image_url.url", "image_url.url")
            );
        }
    }

    #[test]
    fn an_inline_data_image_is_refused_pointing_to_the_upload() {
        let part = json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}});
        assert_eq!(
            refusal(&turn_with(json!([{"type": "text", "text": "look"}, part]))),
            bad_data(INLINE_DATA, "image_url.url")
        );
    }

    #[test]
    fn an_image_url_of_another_scheme_is_refused() {
        for url in [
            "ftp://host/a.png",
            "",
            "HTTPS://host/a.png",
            "/files/a.png",
            "s3:/b",
        ] {
            let part = json!({"type": "image_url", "image_url": {"url": url}});
            assert_eq!(
                refusal(&turn_with(json!([{"type": "text", "text": "look"}, part]))),
                bad_data(OTHER_SCHEME, "image_url.url"),
                "{url}"
            );
        }
    }

    #[test]
    fn an_audio_part_is_an_uploaded_file_by_url_never_inline_data() {
        let by_url = json!({"type": "input_audio", "input_audio": {"url": "s3://b/u/a.wav"}});
        let Inbound::UserMessage { content, .. } = read(&turn_with(json!([
            {"type": "text", "text": "listen"}, by_url
        ]))) else {
            unreachable!("a user message")
        };
        let UserContent::Blocks(blocks) = content else {
            unreachable!("blocks")
        };
        assert!(
            matches!(&blocks[1], ContentBlock::Audio(part) if part.source["value"] == "s3://b/u/a.wav"),
            "{blocks:?}"
        );
        let inline =
            json!({"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}});
        assert_eq!(
            refusal(&turn_with(json!([inline]))).details,
            "input_audio.data"
        );
        let nothing = json!({"type": "input_audio", "input_audio": {}});
        assert_eq!(
            refusal(&turn_with(json!([nothing]))).details,
            "input_audio.url"
        );
        let elsewhere = json!({"type": "input_audio", "input_audio": {"url": "ftp://x/a.wav"}});
        assert_eq!(
            refusal(&turn_with(json!([elsewhere]))).code,
            WsErrorCode::InvalidDataContent
        );
    }

    #[test]
    fn a_part_of_another_type_is_refused_quoting_the_type() {
        for (part, shown) in [
            (json!({"type": "input_video"}), r#""input_video""#),
            (json!({"type": "Text", "text": "hi"}), r#""Text""#),
            (json!({"type": ""}), r#""""#),
            (json!({"text": "hi"}), r#""""#),
            (json!({"type": 5, "text": "hi"}), r#""""#),
            (json!("hi"), r#""""#),
            (json!(null), r#""""#),
        ] {
            assert_eq!(
                refusal(&turn_with(json!([part.clone()]))),
                bad_data(
                    &format!("content parts must be text, image_url or input_audio, not {shown}"),
                    "content.messages[].content[].type"
                ),
                "{part}"
            );
        }
    }

    #[test]
    fn the_first_broken_part_is_the_one_named() {
        let audio = json!({"type": "audio"});
        let inline = json!({"type": "image_url", "image_url": {"url": "data:,"}});
        assert_eq!(
            refusal(&turn_with(json!([audio, inline]))).details,
            "content.messages[].content[].type"
        );
        assert_eq!(
            refusal(&turn_with(json!([inline, audio]))).details,
            "image_url.url"
        );
    }

    #[test]
    fn a_user_message_without_text_is_refused() {
        for content in [
            json!(""),
            json!(" \n\t "),
            json!([]),
            json!([{"type": "text", "text": " "}, {"type": "text", "text": ""}]),
            json!([{"type": "image_url", "image_url": {"url": "s3://bucket/a.png"}}]),
        ] {
            assert_eq!(
                refusal(&turn_with(content.clone())),
                bad_content("the user message has no text", "content.messages[].content"),
                "{content}"
            );
        }
    }

    #[test]
    fn a_user_message_over_10000_characters_is_refused_and_10000_are_read() {
        assert_eq!(
            refusal(&turn_with(json!("x".repeat(10_001)))),
            bad_content(
                "the user message is longer than 10000 characters",
                "content.messages[].content"
            )
        );
        let wide = "ü".repeat(10_000);
        assert_eq!(
            read(&turn_with(json!(wide))),
            user_message(vec![text(&wide)])
        );
    }

    #[test]
    fn text_parts_count_toward_the_limit_with_the_newlines_that_join_them() {
        let half = "x".repeat(5_000);
        let parts = json!([{"type": "text", "text": half}, {"type": "text", "text": half}]);
        assert_eq!(
            refusal(&turn_with(parts)).message,
            "the user message is longer than 10000 characters"
        );
    }

    #[test]
    fn an_interaction_answer_is_read_as_the_text_of_its_last_user_message() {
        assert_eq!(
            read(&answer()),
            Inbound::UserInteraction {
                id: "m2".to_owned(),
                conversation_id: "c1".to_owned(),
                parent_id: "p1".to_owned(),
                answer: "yes".to_owned(),
            }
        );
        let parts = json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "continue"},
            {"type": "image_url", "image_url": {"url": "s3://bucket/a.png"}},
            {"type": "text", "text": "please"}]}]});
        let Inbound::UserInteraction { answer, .. } = read(&with(answer(), "content", parts))
        else {
            panic!("not an interaction");
        };
        assert_eq!(answer, "continue\nplease");
    }

    #[test]
    fn an_interaction_without_a_parent_id_is_refused() {
        for message in [
            without(answer(), "parent_id"),
            with(answer(), "parent_id", json!(null)),
            with(answer(), "parent_id", json!("")),
        ] {
            assert_eq!(
                refusal(&message),
                invalid("parent_id is required", "parent_id")
            );
        }
        assert_eq!(
            refusal(&with(answer(), "parent_id", json!(3))),
            invalid("parent_id must be a string", "parent_id")
        );
    }

    #[test]
    fn an_interaction_is_checked_like_a_user_message() {
        assert_eq!(
            refusal(&with(answer(), "schema_type", json!("json"))).details,
            "schema_type"
        );
        assert_eq!(
            refusal(&without(answer(), "id")),
            invalid("id is required", "id")
        );
        assert_eq!(
            refusal(&with(answer(), "conversation_id", json!("c".repeat(129)))).details,
            "conversation_id"
        );
        assert_eq!(
            refusal(&with(answer(), "content", json!({"messages": []}))),
            bad_content("content.messages has no user message", "content.messages")
        );
        let inline = json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "here"},
            {"type": "image_url", "image_url": {"url": "data:,"}}]}]});
        assert_eq!(
            refusal(&with(answer(), "content", inline)),
            bad_data(INLINE_DATA, "image_url.url")
        );
        // An empty answer is read: it skips a prompt that is not required (the prompt decides).
        let blank = json!({"messages": [{"role": "user", "content": "  "}]});
        assert!(matches!(
            read(&with(answer(), "content", blank)),
            Inbound::UserInteraction { answer, .. } if answer.trim().is_empty()
        ));
        let blank_turn = turn_with(json!("  "));
        assert_eq!(
            refusal(&blank_turn),
            bad_content("the user message has no text", "content.messages[].content")
        );
    }

    #[test]
    fn a_chat_message_is_read_with_its_content_urls_as_sent() {
        let message = with(
            chat(),
            "content_urls",
            json!(["s3://bucket/a.pdf", "anything", ""]),
        );
        assert_eq!(
            read(&message),
            Inbound::Chat {
                message: "hi".to_owned(),
                session_id: "s1".to_owned(),
                content_urls: vec![
                    "s3://bucket/a.pdf".to_owned(),
                    "anything".to_owned(),
                    String::new()
                ],
            }
        );
    }

    #[test]
    fn a_chat_message_without_content_urls_has_none() {
        for message in [chat(), with(chat(), "content_urls", json!(null))] {
            assert_eq!(
                read(&message),
                Inbound::Chat {
                    message: "hi".to_owned(),
                    session_id: "s1".to_owned(),
                    content_urls: Vec::new(),
                }
            );
        }
    }

    #[test]
    fn a_blank_chat_message_is_read_but_an_empty_one_is_refused() {
        let Inbound::Chat { message, .. } = read(&with(chat(), "message", json!("  "))) else {
            panic!("not a chat message");
        };
        assert_eq!(message, "  ");
        for message in [
            without(chat(), "message"),
            with(chat(), "message", json!(null)),
            with(chat(), "message", json!("")),
        ] {
            assert_eq!(refusal(&message), invalid("message is required", "message"));
        }
    }

    #[test]
    fn a_chat_message_that_is_not_a_string_is_refused() {
        assert_eq!(
            refusal(&with(chat(), "message", json!(["hi"]))),
            invalid("message must be a string", "message")
        );
    }

    #[test]
    fn a_chat_message_over_10000_characters_is_refused_as_user_content() {
        assert_eq!(
            refusal(&with(chat(), "message", json!("x".repeat(10_001)))),
            bad_content("message is longer than 10000 characters", "message")
        );
        assert!(
            parse_inbound(&with(chat(), "message", json!("x".repeat(10_000))).to_string()).is_ok()
        );
    }

    #[test]
    fn a_missing_wrong_or_long_session_id_is_refused() {
        assert_eq!(
            refusal(&without(chat(), "session_id")),
            invalid("session_id is required", "session_id")
        );
        assert_eq!(
            refusal(&with(chat(), "session_id", json!(1))),
            invalid("session_id must be a string", "session_id")
        );
        assert_eq!(
            refusal(&with(chat(), "session_id", json!("s".repeat(129)))),
            invalid("session_id must be at most 128 characters", "session_id")
        );
    }

    #[test]
    fn content_urls_that_are_not_a_list_of_strings_are_refused() {
        for urls in [
            json!("s3://bucket/a.pdf"),
            json!(5),
            json!({"url": "s3://bucket/a.pdf"}),
            json!([5]),
            json!(["s3://bucket/a.pdf", null]),
        ] {
            assert_eq!(
                refusal(&with(chat(), "content_urls", urls.clone())),
                bad_data(CONTENT_URLS, "content_urls"),
                "{urls}"
            );
        }
    }

    #[test]
    fn a_chat_message_ignores_the_fields_of_the_other_types() {
        let mut message = chat();
        message["schema_type"] = json!(5);
        message["id"] = json!(5);
        message["conversation_id"] = json!(5);
        message["content"] = json!(5);
        assert!(matches!(read(&message), Inbound::Chat { .. }));
    }

    #[test]
    fn fields_are_checked_in_a_fixed_order_whatever_their_order_in_the_message() {
        // Each message breaks two rules, the later-checked field written first.
        let cases = [
            (
                r#"{"id": 5, "schema_type": 5, "type": "user_message"}"#,
                "schema_type",
            ),
            (
                r#"{"conversation_id": 5, "type": "user_message", "content": 5}"#,
                "id",
            ),
            (
                r#"{"content": 5, "conversation_id": "c", "type": "user_message", "id": ""}"#,
                "id",
            ),
            (
                &format!(
                    r#"{{"content": 5, "id": "m", "conversation_id": "{}", "type": "user_message"}}"#,
                    "c".repeat(129)
                ),
                "conversation_id",
            ),
            (
                r#"{"content": {"messages": []}, "parent_id": 5, "id": "m", "conversation_id": "c", "type": "user_interaction_message"}"#,
                "parent_id",
            ),
            (
                r#"{"parent_id": 5, "type": "user_interaction_message", "id": "m"}"#,
                "conversation_id",
            ),
            (
                r#"{"content_urls": 5, "session_id": 5, "type": "chat", "message": 5}"#,
                "message",
            ),
            (
                &format!(
                    r#"{{"session_id": 5, "type": "chat", "message": "{}"}}"#,
                    "x".repeat(10_001)
                ),
                "message",
            ),
            (
                r#"{"content_urls": 5, "type": "chat", "message": "hi"}"#,
                "session_id",
            ),
        ];
        for (raw, field) in cases {
            assert_eq!(parse_inbound(raw).unwrap_err().details, field, "{raw}");
        }
    }

    #[test]
    fn a_message_already_read_as_json_gets_the_same_answers_as_its_text() {
        for message in [
            chat(),
            turn(),
            answer(),
            json!([chat()]),
            without(chat(), "session_id"),
            with(turn(), "schema_type", json!({"b": 1, "a": 2})),
            turn_with(json!([{"type": "image_url", "image_url": {"url": "data:,"}}])),
        ] {
            assert_eq!(
                parse_inbound_value(message.clone()),
                parse_inbound(&message.to_string()),
                "{message}"
            );
        }
    }

    #[test]
    fn a_repeated_field_is_read_as_its_last_value() {
        let raw = r#"{"type": "chat", "message": 5, "session_id": "s", "message": "last"}"#;
        let Ok(Inbound::Chat { message, .. }) = parse_inbound(raw) else {
            panic!("not read");
        };
        assert_eq!(message, "last");
        let raw = r#"{"type": "telepathy", "message": "hi", "session_id": "s", "type": "chat"}"#;
        assert!(matches!(parse_inbound(raw), Ok(Inbound::Chat { .. })));
    }
}
