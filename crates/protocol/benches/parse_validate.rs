//! Parse + validate of `RunAgentInput`, in process (`cargo bench -p switchboard-protocol --bench
//! parse_validate`). See `BENCHMARKS.md`.
//!
//! Two payloads:
//! - `max`: the largest valid body, within 64 bytes of the 256 KiB limit: 200 messages, the first
//!   the user's with exactly 10,000 characters of text (non-ASCII and escapes included), then a
//!   system message and assistant / tool-call / tool-result turns filling the rest, plus tools,
//!   state and forwarded props.
//! - `minimal`: one user message saying "hi".
//!
//! Besides `parse_run_input` (what the runs service calls), the parts are measured on their own:
//! typed deserialization alone, the rule checks alone, and parsing into a `serde_json::Value`
//! (what the bare axum baseline does).

use divan::Bencher;
use divan::counter::BytesCount;
use serde_json::{Value, json};
use switchboard_protocol::RunAgentInput;
use switchboard_protocol::run_input::{Message, UserContent};
use switchboard_protocol::validate::{MAX_MESSAGES, MAX_PAYLOAD_BYTES, MAX_USER_TEXT_CHARS};
use switchboard_protocol::validate::{parse_run_input, validate_run_input};

fn main() {
    divan::main();
}

const PAYLOADS: &[&str] = &["minimal", "max"];

/// Size the `max` payload is built to: just under the limit.
const MAX_TARGET_BYTES: usize = MAX_PAYLOAD_BYTES - 64;

const THREAD_ID: &str = "550e8400-e29b-41d4-a716-446655440000";

fn minimal_payload() -> Vec<u8> {
    json!({
        "threadId": THREAD_ID,
        "runId": "run-001",
        "messages": [{"id": "msg-001", "role": "user", "content": "hi"}],
    })
    .to_string()
    .into_bytes()
}

/// Exactly [`MAX_USER_TEXT_CHARS`] characters, with multi-byte characters, a quote and newlines.
fn user_text() -> String {
    let sentence = "Please review the attached design, compare it with the \u{201c}previous\u{201d} \
                    version and list every change that touches \"billing\".\n\u{c9}tat: \u{4f60}\u{597d} \u{2014} ok. ";
    sentence.chars().cycle().take(MAX_USER_TEXT_CHARS).collect()
}

/// `len` bytes of ASCII prose that JSON does not escape.
fn filler(len: usize) -> String {
    const WORDS: &str = "the agent looked up the order history and found three shipments that \
                         were delayed by the carrier; it drafted a reply and asked for approval ";
    WORDS.chars().cycle().take(len).collect()
}

/// The 199 messages after the user's, each with `fill` bytes of content, the last one with
/// `extra` more.
fn other_messages(fill: usize, extra: usize) -> Vec<Value> {
    let mut messages = vec![json!({
        "id": "msg-001",
        "role": "system",
        "content": format!("You are a careful support agent. {}", filler(fill)),
    })];
    let mut turn = 0;
    while messages.len() < MAX_MESSAGES - 1 {
        let call_id = format!("call-{turn:03}");
        let arguments =
            json!({"orderId": format!("ord-{turn:05}"), "include": ["shipments", "refunds"]});
        let batch = [
            json!({
                "id": format!("asst-{turn:03}-a"),
                "role": "assistant",
                "content": filler(fill),
                "toolCalls": [{
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "lookup_order", "arguments": arguments.to_string()},
                }],
            }),
            json!({
                "id": format!("tool-{turn:03}"),
                "role": "tool",
                "toolCallId": call_id,
                "content": filler(fill),
            }),
            json!({
                "id": format!("asst-{turn:03}-b"),
                "role": "assistant",
                "content": filler(fill),
            }),
        ];
        messages.extend(batch);
        turn += 1;
    }
    messages.truncate(MAX_MESSAGES - 1);
    if let Some(last) = messages.last_mut() {
        let content = format!("{}{}", filler(fill), filler(extra));
        last["content"] = Value::String(content);
    }
    messages
}

fn max_payload_with(fill: usize, extra: usize) -> Vec<u8> {
    let mut messages = vec![json!({"id": "msg-user", "role": "user", "content": user_text()})];
    messages.extend(other_messages(fill, extra));
    json!({
        "threadId": THREAD_ID,
        "runId": "run-max-size-0001",
        "state": {"step": 3, "locale": "fr-FR"},
        "messages": messages,
        "tools": [{
            "name": "lookup_order",
            "description": "Looks up an order by id",
            "parameters": {
                "type": "object",
                "properties": {"orderId": {"type": "string"}, "include": {"type": "array"}},
                "required": ["orderId"],
            },
        }],
        "context": [{"description": "customer tier", "value": "gold"}],
        "forwardedProps": {"channel": "web"},
    })
    .to_string()
    .into_bytes()
}

/// The largest valid payload: content padding is ASCII, so size grows by one byte per byte of
/// padding and the target is hit exactly.
fn max_payload() -> Vec<u8> {
    let bare = max_payload_with(0, 0).len();
    let fill = MAX_TARGET_BYTES.saturating_sub(bare) / (MAX_MESSAGES - 1);
    let filled = max_payload_with(fill, 0).len();
    let payload = max_payload_with(fill, MAX_TARGET_BYTES.saturating_sub(filled));
    check_max_payload(&payload);
    payload
}

/// Setup assertions, not timing ones: the payload is as large as allowed and valid.
fn check_max_payload(payload: &[u8]) {
    assert!(
        payload.len() <= MAX_PAYLOAD_BYTES && payload.len() > MAX_PAYLOAD_BYTES - 1024,
        "max payload is {} bytes, want just under {MAX_PAYLOAD_BYTES}",
        payload.len()
    );
    let input = match parse_run_input(payload) {
        Ok(input) => input,
        Err(violation) => unreachable!("max payload is invalid: {violation:?}"),
    };
    assert_eq!(input.messages.len(), MAX_MESSAGES);
    let Some(Message::User(user)) = input.messages.first() else {
        unreachable!("messages[0] is not the user message");
    };
    assert!(matches!(user.content, UserContent::Text(_)));
    assert_eq!(user.content.text().chars().count(), MAX_USER_TEXT_CHARS);
}

fn payload(name: &str) -> Vec<u8> {
    let payload = match name {
        "max" => max_payload(),
        _ => minimal_payload(),
    };
    assert!(
        parse_run_input(&payload).is_ok(),
        "{name} payload is invalid"
    );
    payload
}

/// What the runs service calls: size check, typed parse with error paths, every rule.
#[divan::bench(args = PAYLOADS)]
fn parse_run_input_full(bencher: Bencher, name: &str) {
    let payload = payload(name);
    bencher
        .counter(BytesCount::of_slice(&payload))
        .bench(|| parse_run_input(divan::black_box(&payload)));
}

/// Typed deserialization alone (no `serde_path_to_error`, no rules).
#[divan::bench(args = PAYLOADS)]
fn serde_typed_only(bencher: Bencher, name: &str) {
    let payload = payload(name);
    bencher
        .counter(BytesCount::of_slice(&payload))
        .bench(|| serde_json::from_slice::<RunAgentInput>(divan::black_box(&payload)));
}

/// The rule checks alone, on an already parsed input (no byte counter: nothing is read).
#[divan::bench(args = PAYLOADS)]
fn validate_only(bencher: Bencher, name: &str) {
    let payload = payload(name);
    let Ok(input) = parse_run_input(&payload) else {
        unreachable!("checked in payload()");
    };
    bencher.bench(|| validate_run_input(divan::black_box(&input)));
}

/// Untyped parse into `serde_json::Value`: what the bare axum baseline does per request.
#[divan::bench(args = PAYLOADS)]
fn serde_value_only(bencher: Bencher, name: &str) {
    let payload = payload(name);
    bencher
        .counter(BytesCount::of_slice(&payload))
        .bench(|| serde_json::from_slice::<Value>(divan::black_box(&payload)));
}
