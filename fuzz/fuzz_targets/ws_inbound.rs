//! Fuzz target: one untrusted WebSocket message, `switchboard_protocol::ws::parse_inbound`.
//! Run: `RUSTC_BOOTSTRAP=1 cargo fuzz run ws_inbound -- -max_total_time=60` (see docs/testing.md).
//!
//! The bytes are read as UTF-8 when they are (a text frame), else converted lossily, so every
//! input reaches the parser. Properties: it never panics; whatever it accepts satisfies the
//! documented limits (`MAX_*` of `ws.rs`) and required fields; a refusal renders as an
//! `error_message` that serializes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchboard_protocol::run_input::{ContentBlock, UserContent};
use switchboard_protocol::ws::{
    Inbound, MAX_CONVERSATION_ID_CHARS, MAX_TEXT_CHARS, MAX_WS_MESSAGE_BYTES, parse_inbound,
};

fuzz_target!(|data: &[u8]| {
    let raw = String::from_utf8_lossy(data);
    check(&raw);
});

fn check(raw: &str) {
    match parse_inbound(raw) {
        Ok(inbound) => {
            assert!(raw.len() <= MAX_WS_MESSAGE_BYTES);
            accepted(&inbound);
        }
        Err(error) => {
            assert!(!error.message.is_empty());
            assert!(!error.details.is_empty());
            let message = error.to_message("err-1".to_owned(), None, None, Default::default());
            let json = serde_json::to_string(&message);
            assert!(json.is_ok(), "error_message does not serialize: {json:?}");
        }
    }
}

fn conversation_id_ok(id: &str) {
    assert!(!id.is_empty(), "empty conversation id accepted");
    assert!(
        id.chars().count() <= MAX_CONVERSATION_ID_CHARS,
        "conversation id of {} chars accepted",
        id.chars().count()
    );
}

fn text_ok(text: &str) {
    assert!(!text.trim().is_empty(), "blank text accepted: {text:?}");
    assert!(
        text.chars().count() <= MAX_TEXT_CHARS,
        "text of {} chars accepted",
        text.chars().count()
    );
}

/// Blocks a parsed user message may hold: text, and images by URL (never inline `data:`).
fn content_ok(content: &UserContent) {
    text_ok(&content.text());
    let UserContent::Blocks(blocks) = content else {
        panic!("parse_inbound builds blocks, got {content:?}");
    };
    for block in blocks {
        match block {
            ContentBlock::Text(_) => {}
            ContentBlock::Image(part) => {
                assert_eq!(part.source["type"], "url", "{part:?}");
                let url = part.source["value"].as_str().unwrap_or_default();
                assert!(
                    url.starts_with("https://")
                        || url.starts_with("http://")
                        || url.starts_with("s3://"),
                    "image URL accepted: {url:?}"
                );
            }
            other => panic!("unexpected block accepted: {other:?}"),
        }
    }
}

fn accepted(inbound: &Inbound) {
    match inbound {
        Inbound::UserMessage {
            id,
            conversation_id,
            content,
        } => {
            assert!(!id.is_empty(), "empty id accepted");
            conversation_id_ok(conversation_id);
            content_ok(content);
        }
        Inbound::UserInteraction {
            id,
            conversation_id,
            parent_id,
            answer,
        } => {
            assert!(!id.is_empty(), "empty id accepted");
            assert!(!parent_id.is_empty(), "empty parent_id accepted");
            conversation_id_ok(conversation_id);
            text_ok(answer);
        }
        Inbound::Chat {
            message,
            session_id,
            content_urls: _,
        } => {
            assert!(!message.is_empty(), "empty chat message accepted");
            assert!(message.chars().count() <= MAX_TEXT_CHARS);
            conversation_id_ok(session_id);
        }
    }
}
