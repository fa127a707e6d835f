//! Parsing and validation of `RunAgentInput`, as pure functions.
//!
//! Limits and messages are those of `agent-run-input-protocol.md`, verbatim. Characters are
//! counted as Unicode scalar values (what `str::chars` yields), so "你好" is two characters and
//! an emoji made of one code point is one.

use serde_json::Value;

use crate::run_input::{ContentBlock, Message, RunAgentInput, UserContent};

/// Largest accepted body of `POST /api/v1/agent/runs`, counted on the raw bytes.
pub const MAX_PAYLOAD_BYTES: usize = 256 * 1024;
/// Longest accepted `runId`, in characters.
pub const MAX_RUN_ID_CHARS: usize = 128;
/// Most messages accepted in one run.
pub const MAX_MESSAGES: usize = 200;
/// Longest accepted user text, in characters.
pub const MAX_USER_TEXT_CHARS: usize = 10_000;

/// The seed's error strings, verbatim.
pub mod messages {
    /// Body larger than [`super::MAX_PAYLOAD_BYTES`].
    pub const PAYLOAD_TOO_LARGE: &str = "RunAgentInput payload exceeds size limit";
    /// `threadId` is not a UUID.
    pub const THREAD_ID_UUID: &str = "threadId must be a valid UUID";
    /// `runId` longer than [`super::MAX_RUN_ID_CHARS`].
    pub const RUN_ID_LENGTH: &str = "runId exceeds length limit";
    /// More than [`super::MAX_MESSAGES`] messages.
    pub const MESSAGES_LIMIT: &str = "RunAgentInput.messages exceeds limit";
    /// User text longer than [`super::MAX_USER_TEXT_CHARS`].
    pub const USER_TEXT_LIMIT: &str = "RunAgentInput user message text exceeds limit";
    /// Not exactly one user message.
    pub const EXACTLY_ONE_USER: &str =
        "RunAgentInput.messages must contain exactly one user message";
    /// The user message is not the first one.
    pub const FIRST_IS_USER: &str = "RunAgentInput.messages[0].role must be user";
    /// A resent conversation's `threadId` is empty or too long (not a seed rule).
    pub const THREAD_ID_LENGTH: &str = "threadId must be 1 to 128 characters";
    /// A resent conversation does not end with a new turn (not a seed rule).
    pub const LAST_IS_NEW_TURN: &str =
        "RunAgentInput.messages must end with the new user message or a tool result";
    /// A binary block whose MIME type is not `image/*`.
    pub const BINARY_IMAGE_MIME: &str = "binary content requires image mimeType";
    /// A binary block without a URL.
    pub const BINARY_URL: &str = "binary content requires url";
    /// A binary block carrying inline data.
    pub const BINARY_DATA: &str = "binary content data is not allowed";
}

/// A broken rule: the seed's message and the offending field as a JSON pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which rule, by kind.
    pub kind: ViolationKind,
    /// The offending field as a JSON pointer (`""` for the whole body).
    pub field: String,
    /// Safe, precise message.
    pub message: String,
}

/// The kind of a [`Violation`], so the HTTP layer can pick a status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViolationKind {
    /// The body is larger than [`MAX_PAYLOAD_BYTES`].
    TooLarge,
    /// The body is not JSON, or not the right shape.
    Malformed,
    /// The body is well-formed but breaks a rule of the seed.
    Rule,
}

impl Violation {
    fn rule(field: impl Into<String>, message: &str) -> Self {
        Self {
            kind: ViolationKind::Rule,
            field: field.into(),
            message: message.to_owned(),
        }
    }
}

/// Parses a raw body (bounded) into a [`RunAgentInput`] without checking rules.
fn parse_unchecked(body: &[u8]) -> Result<RunAgentInput, Violation> {
    if body.len() > MAX_PAYLOAD_BYTES {
        return Err(Violation {
            kind: ViolationKind::TooLarge,
            field: String::new(),
            message: messages::PAYLOAD_TOO_LARGE.to_owned(),
        });
    }
    // The common case, a well-formed body, without tracking the path (serde_path_to_error
    // allocates every key it passes); a malformed one is read again to name its field.
    if let Ok(input) = serde_json::from_slice(body) {
        return Ok(input);
    }
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let input: RunAgentInput =
        serde_path_to_error::deserialize(&mut deserializer).map_err(|err| Violation {
            kind: ViolationKind::Malformed,
            field: json_pointer(err.path()),
            message: format!("RunAgentInput is malformed: {}", err.inner()),
        })?;
    deserializer.end().map_err(|err| Violation {
        kind: ViolationKind::Malformed,
        field: String::new(),
        message: format!("RunAgentInput is malformed: {err}"),
    })?;
    Ok(input)
}

/// Parses a raw body into a [`RunAgentInput`] and checks every rule of the seed.
pub fn parse_run_input(body: &[u8]) -> Result<RunAgentInput, Violation> {
    let input = parse_unchecked(body)?;
    validate_run_input(&input)?;
    Ok(input)
}

/// Parses the body of an AG-UI client that resends its whole conversation every turn and
/// checks [`validate_conversation`].
pub fn parse_conversation_input(body: &[u8]) -> Result<RunAgentInput, Violation> {
    let input = parse_unchecked(body)?;
    validate_conversation(&input)?;
    Ok(input)
}

/// The rules of a resent conversation (AG-UI's `HttpAgent`): any `threadId` of 1 to 128
/// characters, the seed's `runId` and message-count limits, every user message within the text
/// limit with valid blocks, and a new turn at the end (a user message or a tool result).
pub fn validate_conversation(input: &RunAgentInput) -> Result<(), Violation> {
    let thread_chars = input.thread_id.chars().count();
    if thread_chars == 0 || thread_chars > MAX_RUN_ID_CHARS {
        return Err(Violation::rule("/threadId", messages::THREAD_ID_LENGTH));
    }
    if input.run_id.chars().count() > MAX_RUN_ID_CHARS {
        return Err(Violation::rule("/runId", messages::RUN_ID_LENGTH));
    }
    if input.messages.len() > MAX_MESSAGES {
        return Err(Violation::rule("/messages", messages::MESSAGES_LIMIT));
    }
    // A run that answers an interrupt (`resume`) may follow the agent's own last message.
    let resuming = input
        .extra
        .get("resume")
        .and_then(serde_json::Value::as_array)
        .is_some_and(|entries| !entries.is_empty());
    if !resuming
        && !matches!(
            input.messages.last(),
            Some(Message::User(_) | Message::Tool(_))
        )
    {
        return Err(Violation::rule("/messages", messages::LAST_IS_NEW_TURN));
    }
    for (at, message) in input.messages.iter().enumerate() {
        let Message::User(user) = message else {
            continue;
        };
        if user.content.text().chars().count() > MAX_USER_TEXT_CHARS {
            return Err(Violation::rule(
                format!("/messages/{at}/content"),
                messages::USER_TEXT_LIMIT,
            ));
        }
        if let UserContent::Blocks(blocks) = &user.content {
            for (index, block) in blocks.iter().enumerate() {
                validate_block(block, &format!("/messages/{at}/content/{index}"))?;
            }
        }
    }
    Ok(())
}

/// Checks the rules of the seed on an already parsed input, in the seed's order.
pub fn validate_run_input(input: &RunAgentInput) -> Result<(), Violation> {
    if !is_uuid(&input.thread_id) {
        return Err(Violation::rule("/threadId", messages::THREAD_ID_UUID));
    }
    if input.run_id.chars().count() > MAX_RUN_ID_CHARS {
        return Err(Violation::rule("/runId", messages::RUN_ID_LENGTH));
    }
    if input.messages.len() > MAX_MESSAGES {
        return Err(Violation::rule("/messages", messages::MESSAGES_LIMIT));
    }
    // The table lists the text limit before exactly-one and user-first: a body that breaks
    // several rules is told the first of them in the table.
    let mut users = 0;
    for (at, message) in input.messages.iter().enumerate() {
        if let Message::User(user) = message {
            users += 1;
            if user.content.text().chars().count() > MAX_USER_TEXT_CHARS {
                return Err(Violation::rule(
                    format!("/messages/{at}/content"),
                    messages::USER_TEXT_LIMIT,
                ));
            }
        }
    }
    if users != 1 {
        return Err(Violation::rule("/messages", messages::EXACTLY_ONE_USER));
    }
    let Some(Message::User(user)) = input.messages.first() else {
        return Err(Violation::rule("/messages/0/role", messages::FIRST_IS_USER));
    };
    if let UserContent::Blocks(blocks) = &user.content {
        for (index, block) in blocks.iter().enumerate() {
            validate_block(block, &format!("/messages/0/content/{index}"))?;
        }
    }
    Ok(())
}

fn validate_block(block: &ContentBlock, at: &str) -> Result<(), Violation> {
    match block {
        ContentBlock::Text(_) => Ok(()),
        // The seed's table order: image type, then url, then no data.
        ContentBlock::Binary(binary) => {
            if !binary.mime().starts_with("image/") {
                return Err(Violation::rule(
                    format!("{at}/mimeType"),
                    messages::BINARY_IMAGE_MIME,
                ));
            }
            if binary.url.as_deref().is_none_or(str::is_empty) {
                return Err(Violation::rule(format!("{at}/url"), messages::BINARY_URL));
            }
            if binary.data.is_some() {
                return Err(Violation::rule(format!("{at}/data"), messages::BINARY_DATA));
            }
            Ok(())
        }
        ContentBlock::Image(part) | ContentBlock::Document(part) | ContentBlock::Audio(part) => {
            let kind = part.source.get("type").and_then(Value::as_str);
            let value = part.source.get("value").and_then(Value::as_str);
            match (kind, value) {
                (Some("url"), Some(url)) if !url.is_empty() => Ok(()),
                (Some("data"), _) => Err(Violation::rule(
                    format!("{at}/source"),
                    messages::BINARY_DATA,
                )),
                _ => Err(Violation::rule(
                    format!("{at}/source"),
                    messages::BINARY_URL,
                )),
            }
        }
    }
}

/// A UUID in its canonical hyphenated form (any case).
fn is_uuid(value: &str) -> bool {
    value.len() == 36 && uuid::Uuid::try_parse(value).is_ok()
}

fn json_pointer(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut pointer = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => pointer.push_str(&format!("/{index}")),
            Segment::Map { key } => {
                pointer.push('/');
                pointer.push_str(&key.replace('~', "~0").replace('/', "~1"));
            }
            Segment::Enum { .. } | Segment::Unknown => {}
        }
    }
    pointer
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(value: &Value) -> Vec<u8> {
        serde_json::to_vec(value).unwrap_or_default()
    }

    fn valid() -> Value {
        json!({
            "threadId": "550e8400-e29b-41d4-a716-446655440000",
            "runId": "run-001",
            "messages": [{"id": "msg-001", "role": "user", "content": "hi"}]
        })
    }

    fn violation(value: &Value) -> Violation {
        match parse_run_input(&body(value)) {
            Ok(_) => Violation::rule("", "unexpectedly valid"),
            Err(v) => v,
        }
    }

    #[test]
    fn a_body_breaking_several_rules_is_told_the_first_in_the_seeds_table() {
        let long = "x".repeat(MAX_USER_TEXT_CHARS + 1);
        // Text over the limit, two user messages, an assistant first: the text rule comes first.
        let mut body = valid();
        body["messages"] = json!([
            {"id": "a", "role": "assistant", "content": "before"},
            {"id": "u1", "role": "user", "content": long},
            {"id": "u2", "role": "user", "content": "again"}
        ]);
        assert_eq!(
            violation(&body),
            Violation::rule("/messages/1/content", messages::USER_TEXT_LIMIT)
        );
        // Then exactly one user message, before user-first.
        body["messages"][1]["content"] = json!("short");
        assert_eq!(
            violation(&body),
            Violation::rule("/messages", messages::EXACTLY_ONE_USER)
        );
        // Then the thread id before everything about messages.
        body["threadId"] = json!("not-a-uuid");
        assert_eq!(
            violation(&body),
            Violation::rule("/threadId", messages::THREAD_ID_UUID)
        );
    }

    #[test]
    fn a_minimal_text_run_is_valid() {
        assert!(parse_run_input(&body(&valid())).is_ok());
    }

    #[test]
    fn a_thread_id_that_is_not_a_uuid_is_refused_with_the_seed_message() {
        let mut input = valid();
        input["threadId"] = json!("thread-123");
        assert_eq!(
            violation(&input),
            Violation::rule("/threadId", messages::THREAD_ID_UUID)
        );
    }

    #[test]
    fn a_run_id_of_129_characters_is_refused_and_128_accepted() {
        let mut input = valid();
        input["runId"] = json!("é".repeat(128));
        assert!(parse_run_input(&body(&input)).is_ok());
        input["runId"] = json!("é".repeat(129));
        assert_eq!(
            violation(&input),
            Violation::rule("/runId", messages::RUN_ID_LENGTH)
        );
    }

    #[test]
    fn a_second_user_message_is_refused() {
        let mut input = valid();
        input["messages"]
            .as_array_mut()
            .unwrap()
            .push(json!({"id": "m2", "role": "user", "content": "again"}));
        assert_eq!(
            violation(&input),
            Violation::rule("/messages", messages::EXACTLY_ONE_USER)
        );
    }

    #[test]
    fn a_user_message_that_is_not_first_is_refused() {
        let mut input = valid();
        input["messages"] = json!([
            {"id": "s", "role": "system", "content": "be nice"},
            {"id": "u", "role": "user", "content": "hi"}
        ]);
        assert_eq!(
            violation(&input),
            Violation::rule("/messages/0/role", messages::FIRST_IS_USER)
        );
    }

    /// One failing vector per rule of the seed: (what, body change, field, exact message).
    #[test]
    fn every_rule_has_a_failing_vector_with_its_exact_message() {
        let user_blocks = |blocks: Value| json!([{"id": "u", "role": "user", "content": blocks}]);
        type Change = Box<dyn Fn(&mut Value)>;
        let cases: Vec<(&str, Change, &str, &str)> = vec![
            (
                "thread id",
                Box::new(|v| v["threadId"] = json!("not-a-uuid")),
                "/threadId",
                messages::THREAD_ID_UUID,
            ),
            (
                "run id",
                Box::new(|v| v["runId"] = json!("r".repeat(129))),
                "/runId",
                messages::RUN_ID_LENGTH,
            ),
            (
                "201 messages",
                Box::new(|v| {
                    let mut m = vec![json!({"id": "u", "role": "user", "content": "hi"})];
                    m.extend((0..200).map(
                        |i| json!({"id": format!("a{i}"), "role": "assistant", "content": "x"}),
                    ));
                    v["messages"] = json!(m);
                }),
                "/messages",
                messages::MESSAGES_LIMIT,
            ),
            (
                "no user",
                Box::new(|v| v["messages"] = json!([])),
                "/messages",
                messages::EXACTLY_ONE_USER,
            ),
            (
                "user second",
                Box::new(|v| {
                    v["messages"] = json!([{"id": "a", "role": "assistant", "content": "x"},
                                           {"id": "u", "role": "user", "content": "hi"}])
                }),
                "/messages/0/role",
                messages::FIRST_IS_USER,
            ),
            (
                "long text",
                Box::new(|v| v["messages"][0]["content"] = json!("字".repeat(10_001))),
                "/messages/0/content",
                messages::USER_TEXT_LIMIT,
            ),
            (
                "long text in blocks",
                Box::new(move |v| {
                    v["messages"] = user_blocks(json!([{"type": "text", "text": "a".repeat(5_000)},
                                                       {"type": "text", "text": "b".repeat(5_000)}]))
                }),
                "/messages/0/content",
                messages::USER_TEXT_LIMIT,
            ),
            (
                "binary not image",
                Box::new(move |v| {
                    v["messages"] = user_blocks(
                        json!([{"type": "binary", "mimeType": "application/pdf", "url": "https://x/y"}]),
                    )
                }),
                "/messages/0/content/0/mimeType",
                messages::BINARY_IMAGE_MIME,
            ),
            (
                "binary without url",
                Box::new(move |v| {
                    v["messages"] =
                        user_blocks(json!([{"type": "binary", "mimeType": "image/png"}]))
                }),
                "/messages/0/content/0/url",
                messages::BINARY_URL,
            ),
            (
                "binary with data",
                Box::new(move |v| {
                    v["messages"] = user_blocks(json!([{"type": "text", "text": "see"},
                        {"type": "binary", "mimeType": "image/png", "url": "https://x/y", "data": "aGk="}]))
                }),
                "/messages/0/content/1/data",
                messages::BINARY_DATA,
            ),
            (
                "binary without mimeType",
                Box::new(move |v| {
                    v["messages"] = user_blocks(json!([{"type": "binary", "url": "https://x/y"}]))
                }),
                "/messages/0/content/0/mimeType",
                messages::BINARY_IMAGE_MIME,
            ),
            (
                "binary with a null data field",
                Box::new(move |v| {
                    v["messages"] = user_blocks(
                        json!([{"type": "binary", "mimeType": "image/png", "url": "https://x/y", "data": null}]),
                    )
                }),
                "/messages/0/content/0/data",
                messages::BINARY_DATA,
            ),
            (
                "binary with data and no url: the rules in the seed's order",
                Box::new(move |v| {
                    v["messages"] = user_blocks(
                        json!([{"type": "binary", "mimeType": "image/png", "data": "aGk="}]),
                    )
                }),
                "/messages/0/content/0/url",
                messages::BINARY_URL,
            ),
            (
                "image part with inline data",
                Box::new(move |v| {
                    v["messages"] = user_blocks(
                        json!([{"type": "image", "source": {"type": "data", "value": "aGk=", "mimeType": "image/png"}}]),
                    )
                }),
                "/messages/0/content/0/source",
                messages::BINARY_DATA,
            ),
        ];
        for (what, change, field, message) in cases {
            let mut input = valid();
            change(&mut input);
            assert_eq!(violation(&input), Violation::rule(field, message), "{what}");
        }
    }

    #[test]
    fn every_role_of_the_seed_and_agui_url_parts_are_accepted() {
        let mut input = valid();
        input["messages"] = json!([
            {"id": "u", "role": "user", "content": [
                {"type": "text", "text": "look"},
                {"type": "image", "source": {"type": "url", "value": "https://x/y.png", "mimeType": "image/png"}},
                {"type": "document", "source": {"type": "url", "value": "https://x/y.pdf"}}]},
            {"id": "a", "role": "assistant", "toolCalls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"id": "t", "role": "tool", "content": "42", "toolCallId": "c"},
            {"id": "s", "role": "system", "content": "be brief"},
            {"id": "d", "role": "developer", "content": "debug"},
            {"id": "r", "role": "reasoning", "content": "thinking"},
            {"id": "p", "role": "activity", "activityType": "progress", "content": {"pct": 50}}
        ]);
        let parsed = parse_run_input(&body(&input));
        assert!(parsed.is_ok(), "{parsed:?}");
        assert_eq!(serde_json::to_value(parsed.ok()).unwrap_or_default(), input);
    }

    /// An AG-UI `audio` part is taken like an image part (a URL source; admission checks the
    /// file is the caller's verified audio); inline audio is refused like inline data, and a
    /// seed `binary` block stays image-only (the seed's message).
    #[test]
    fn audio_parts_are_taken_by_url_and_refused_inline() {
        let mut input = valid();
        input["messages"][0]["content"] = json!([
            {"type": "text", "text": "listen"},
            {"type": "audio", "source": {"type": "url", "value": "s3://b/k.wav", "mimeType": "audio/wav"}}
        ]);
        assert!(parse_run_input(&body(&input)).is_ok());
        input["messages"][0]["content"][1]["source"] = json!({"type": "data", "value": "UklGRg=="});
        assert_eq!(
            violation(&input),
            Violation::rule("/messages/0/content/1/source", messages::BINARY_DATA)
        );
        input["messages"][0]["content"] = json!([
            {"type": "binary", "mimeType": "audio/mpeg", "url": "https://x/y.mp3"}
        ]);
        assert_eq!(
            violation(&input),
            Violation::rule(
                "/messages/0/content/0/mimeType",
                messages::BINARY_IMAGE_MIME
            )
        );
    }

    #[test]
    fn a_body_over_256_kib_is_refused_before_parsing() {
        let oversized = vec![b' '; MAX_PAYLOAD_BYTES + 1];
        let err = parse_run_input(&oversized).err();
        assert_eq!(err.map(|v| v.kind), Some(ViolationKind::TooLarge));
    }

    #[test]
    fn a_wrong_type_names_the_field_as_a_json_pointer() {
        let mut input = valid();
        input["runId"] = json!(5);
        let v = violation(&input);
        assert_eq!(
            (v.kind, v.field.as_str()),
            (ViolationKind::Malformed, "/runId")
        );
    }

    #[test]
    fn unknown_fields_survive_a_round_trip_and_absent_options_stay_absent() {
        let mut input = valid();
        input["x-custom"] = json!({"keep": true});
        let parsed = parse_run_input(&body(&input)).ok();
        let back = parsed.map(|p| serde_json::to_value(p).unwrap_or_default());
        assert_eq!(back, Some(input));
    }
}
