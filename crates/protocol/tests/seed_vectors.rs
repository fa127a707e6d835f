//! Golden vectors: every JSON example of `agent-run-input-protocol.md` and
//! `agent-chat-messages-protocol.md`, extracted verbatim into `tests/vectors/`, parses into its
//! type and serialises back to the same JSON.
#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers fail loudly, naming the vector"
)]

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use switchboard_protocol::history::HistorySnapshotResponse;
use switchboard_protocol::metadata::AgentChatMessageMetadata;
use switchboard_protocol::run_input::{ContentBlock, Message, RunAgentInput, Tool, UserContent};
use switchboard_protocol::validate::{messages, parse_run_input};

fn vector(name: &str) -> String {
    let path = format!("{}/tests/vectors/{name}.json", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{path}: {err}"))
}

/// Parses `name` as `T` and checks that serialising gives back the same JSON value.
fn round_trip<T: DeserializeOwned + Serialize>(name: &str) -> T {
    let text = vector(name);
    let parsed: T = serde_json::from_str(&text).unwrap_or_else(|err| panic!("{name}: {err}"));
    let original: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        serde_json::to_value(&parsed).unwrap(),
        original,
        "{name} round-trips"
    );
    parsed
}

#[test]
fn the_tool_example_parses() {
    let tool: Tool = round_trip("run-input-01");
    assert_eq!(tool.name, "get_weather");
}

#[test]
fn the_three_request_examples_parse_and_are_valid() {
    for name in ["run-input-02", "run-input-03", "run-input-04"] {
        let _: RunAgentInput = round_trip(name);
        assert!(
            parse_run_input(vector(name).as_bytes()).is_ok(),
            "{name} is valid"
        );
    }
}

#[test]
fn the_multimodal_example_carries_a_binary_image_block() {
    let input: RunAgentInput = round_trip("run-input-03");
    let Some(Message::User(user)) = input.messages.first() else {
        panic!("first message is the user's")
    };
    let UserContent::Blocks(blocks) = &user.content else {
        panic!("blocks")
    };
    assert!(
        matches!(&blocks[1], ContentBlock::Binary(b) if b.mime() == "image/png" && b.url.is_some())
    );
}

#[test]
fn the_history_example_round_trips_field_for_field() {
    let history: HistorySnapshotResponse = round_trip("run-input-05");
    assert_eq!(history.messages.len(), 2);
}

#[test]
fn the_three_metadata_examples_parse_with_their_extra_fields() {
    let basic: AgentChatMessageMetadata = round_trip("chat-messages-01");
    assert_eq!(basic.run_id.as_deref(), Some("run_1773286460762"));
    let stage: AgentChatMessageMetadata = round_trip("chat-messages-02");
    assert_eq!(stage.latency_ms, Some(2610));
    let tool: AgentChatMessageMetadata = round_trip("chat-messages-03");
    assert_eq!(tool.tool_name.as_deref(), Some("calendar_create_event"));
    assert_eq!(tool.stage.as_deref(), Some("tool_execution"));
}

#[test]
fn the_chat_request_example_parses_but_its_thread_id_is_not_a_uuid() {
    let _: RunAgentInput = round_trip("chat-messages-04");
    let err = parse_run_input(vector("chat-messages-04").as_bytes())
        .err()
        .unwrap();
    assert_eq!(
        (err.field.as_str(), err.message.as_str()),
        ("/threadId", messages::THREAD_ID_UUID)
    );
}

#[test]
fn the_stored_attachment_metadata_example_parses() {
    let stored: AgentChatMessageMetadata = round_trip("chat-messages-05");
    let attachment = stored.user_message_attachments.unwrap();
    assert_eq!(
        (attachment.bucket.as_str(), attachment.path.as_str()),
        ("agent-files", "agent-inputs/u/t/r/img.jpg")
    );
}

#[test]
fn the_block_history_example_holds_a_user_message_with_a_resigned_binary_block() {
    let value: Value = serde_json::from_str(&vector("chat-messages-06")).unwrap();
    let message: Message = serde_json::from_value(value["messages"][0].clone()).unwrap();
    assert_eq!(
        serde_json::to_value(&message).unwrap(),
        value["messages"][0]
    );
}
