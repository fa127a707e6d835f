//! `MessageBodySchema::compatible_with` on the worst inputs one request to
//! `POST /api/v1/agents/compatibility` can carry (`cargo bench -p switchboard-protocol --bench
//! compatibility`). Finding H2 of the security review (issue 25).
//!
//! Four pairs, each within the endpoint's 256 KiB body limit:
//! - `review`: the review's reproduction. 256 required output parts whose name and content type
//!   are ~430 literal characters with six `{a,b}` groups (64 words each), against 256 required
//!   input parts (`/n`, `n/n`) that match none of them.
//! - `late_failure`: 128 output parts of the same shape against 128 input parts whose name
//!   pattern matches all 64 words and whose content type matches the first 32 and fails on the
//!   33rd: the most matching per pair such a pattern can force.
//! - `matching`: the same with 64-byte words (64 of them: 4 KiB, the most a pattern is expanded
//!   to since the fix), so that every pair is matched: the worst case of the bounded code, which
//!   stops at `MAX_COMPATIBILITY_WORK`.
//! - `examples`: the proposal's researcher output against the software input (the common case).
//!
//! The parse (serde plus glob compilation; since the fix, expansion and no compilation) is
//! measured on its own, and `request` measures both as one request pays them.

use divan::Bencher;
use serde_json::{Value, json};
use switchboard_protocol::message_body::MessageBodySchema;
use switchboard_protocol::validate::MAX_PAYLOAD_BYTES;

fn main() {
    divan::main();
}

const PAIRS: &[&str] = &["review", "late_failure", "matching", "examples"];

/// `{a,b}` six times: 64 words.
fn groups() -> String {
    "{a,b}".repeat(6)
}

/// An output part whose name and content type are 64 words of `name_fill` + 7 and
/// `type_fill` + 7 bytes (the review's: 430 and 400).
fn output_part(name_fill: usize, type_fill: usize) -> Value {
    json!({
        "name": format!("/{}{}", groups(), "x".repeat(name_fill)),
        "contentType": format!("{}/{}", groups(), "y".repeat(type_fill)),
        "required": true,
    })
}

/// An input part whose name matches every word of [`output_part`]'s and whose content type
/// matches the first 32 words of its and not the 33rd.
fn late_failing_input_part(name_fill: usize, type_fill: usize) -> Value {
    json!({
        "name": format!("/{}{}", "[ab]".repeat(6), "x".repeat(name_fill)),
        "contentType": format!("a{}/{}", "[ab]".repeat(5), "y".repeat(type_fill)),
    })
}

fn schema(parts: Vec<Value>) -> Value {
    json!({ "parts": parts })
}

/// `(from, to)` of the named pair, as the JSON the endpoint receives.
fn pair(name: &str) -> (Value, Value) {
    match name {
        "review" => (
            schema((0..256).map(|_| output_part(430, 400)).collect()),
            schema(
                (0..256)
                    .map(|_| json!({"name": "/n", "contentType": "n/n", "required": true}))
                    .collect(),
            ),
        ),
        "late_failure" => (
            schema((0..128).map(|_| output_part(430, 400)).collect()),
            schema(
                (0..128)
                    .map(|_| late_failing_input_part(430, 400))
                    .collect(),
            ),
        ),
        "matching" => (
            schema((0..128).map(|_| output_part(57, 57)).collect()),
            schema((0..128).map(|_| late_failing_input_part(57, 57)).collect()),
        ),
        _ => (
            json!({"parts": [
                {"contentType": "text/markdown", "required": true},
                {"name": "/sources/*", "contentType": "{application/json,text/uri-list}"}
            ]}),
            json!({"parts": [
                {"contentType": "text/markdown", "required": true},
                {"name": "/**"}
            ]}),
        ),
    }
}

fn parsed(name: &str) -> (MessageBodySchema, MessageBodySchema) {
    let (from, to) = pair(name);
    let body = json!({"from": from, "to": to}).to_string();
    assert!(
        body.len() <= MAX_PAYLOAD_BYTES,
        "{name}: {} bytes is over the endpoint's limit",
        body.len()
    );
    match (serde_json::from_value(from), serde_json::from_value(to)) {
        (Ok(from), Ok(to)) => (from, to),
        _ => unreachable!("{name}: the schemas are valid"),
    }
}

/// The comparison alone, on schemas parsed once (globs compiled by the first sample stay
/// compiled since the fix).
#[divan::bench(args = PAIRS, sample_count = 5, sample_size = 1)]
fn compatible_with(bencher: Bencher, name: &str) {
    let (from, to) = parsed(name);
    bencher.bench(|| divan::black_box(&from).compatible_with(divan::black_box(&to)));
}

/// Parsing both schemas from the request's JSON (patterns compiled, languages expanded).
#[divan::bench(args = PAIRS, sample_count = 5, sample_size = 1)]
fn parse_schemas(bencher: Bencher, name: &str) {
    let (from, to) = pair(name);
    let (from, to) = (from.to_string(), to.to_string());
    bencher.bench(|| {
        (
            serde_json::from_str::<MessageBodySchema>(divan::black_box(&from)),
            serde_json::from_str::<MessageBodySchema>(divan::black_box(&to)),
        )
    });
}

/// What one request to the endpoint costs: both schemas parsed from JSON, then compared (every
/// glob compiled afresh, as for an inline schema).
#[divan::bench(args = PAIRS, sample_count = 5, sample_size = 1)]
fn request(bencher: Bencher, name: &str) {
    let (from, to) = pair(name);
    let (from, to) = (from.to_string(), to.to_string());
    bencher.bench(|| {
        let (Ok(from), Ok(to)) = (
            serde_json::from_str::<MessageBodySchema>(divan::black_box(&from)),
            serde_json::from_str::<MessageBodySchema>(divan::black_box(&to)),
        ) else {
            unreachable!("{name}: the schemas are valid");
        };
        from.compatible_with(&to)
    });
}
