//! Property tests of `parse_run_input`: it never panics on any bytes, it agrees with a plain
//! model of the seed's rules on generated inputs, and what it accepts survives a round trip.

use proptest::prelude::*;
use serde_json::{Value, json};
use switchboard_protocol::validate::{
    MAX_MESSAGES, MAX_RUN_ID_CHARS, MAX_USER_TEXT_CHARS, ViolationKind, parse_run_input,
};

const ROLES: [&str; 7] = [
    "user",
    "assistant",
    "system",
    "developer",
    "tool",
    "reasoning",
    "activity",
];

fn message(role: &str, index: usize, text: &str) -> Value {
    let id = format!("m{index}");
    match role {
        "user" => json!({"id": id, "role": role, "content": text}),
        "assistant" => json!({"id": id, "role": role, "content": text,
            "toolCalls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}),
        "tool" => json!({"id": id, "role": role, "content": text, "toolCallId": "c"}),
        "system" | "developer" => json!({"id": id, "role": role, "content": text}),
        _ => json!({"id": id, "role": role, "content": text, "extra": {"kept": true}}),
    }
}

/// A generated input and whether the seed's rules accept it, decided independently of the code.
fn input() -> impl Strategy<Value = (Value, bool)> {
    let thread = prop_oneof![
        Just("550e8400-e29b-41d4-a716-446655440000".to_owned()),
        Just("thread-123".to_owned()),
        "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        ".{0,40}",
    ];
    let run_id = prop_oneof![".{0,20}", "[a-z你]{120,135}"];
    let roles = prop::collection::vec(prop::sample::select(ROLES.to_vec()), 0..8);
    let long = prop::bool::weighted(0.2);
    let many = prop::bool::weighted(0.05);
    (thread, run_id, roles, long, many, ".{0,30}").prop_map(|(thread, run_id, mut roles, long, many, text)| {
        if many {
            roles = std::iter::once("user").chain(std::iter::repeat_n("assistant", MAX_MESSAGES)).collect();
        }
        let user_text = if long { "字".repeat(MAX_USER_TEXT_CHARS + usize::from(text.len() % 2 == 0)) } else { text };
        let messages: Vec<Value> = roles
            .iter()
            .enumerate()
            .map(|(i, role)| message(role, i, if *role == "user" { &user_text } else { "x" }))
            .collect();
        let users = roles.iter().filter(|r| **r == "user").count();
        let accepted = thread.len() == 36
            && uuid_like(&thread)
            && run_id.chars().count() <= MAX_RUN_ID_CHARS
            && roles.len() <= MAX_MESSAGES
            && users == 1
            && roles.first() == Some(&"user")
            && user_text.chars().count() <= MAX_USER_TEXT_CHARS;
        (json!({"threadId": thread, "runId": run_id, "messages": messages, "state": {}, "x-extra": [1, 2]}), accepted)
    })
}

fn uuid_like(s: &str) -> bool {
    s.char_indices().all(|(i, c)| {
        if [8, 13, 18, 23].contains(&i) {
            c == '-'
        } else {
            c.is_ascii_hexdigit()
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    #[test]
    fn any_bytes_are_answered_without_panicking(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        if let Err(violation) = parse_run_input(&bytes) {
            prop_assert!(!violation.message.is_empty());
            prop_assert_ne!(violation.kind, ViolationKind::TooLarge);
        }
    }

    #[test]
    fn generated_inputs_are_judged_as_the_seed_rules_say((value, accepted) in input()) {
        let body = serde_json::to_vec(&value).unwrap();
        let result = parse_run_input(&body);
        prop_assert_eq!(result.is_ok(), accepted, "{:?}", result.as_ref().err());
        if let Ok(parsed) = result {
            // What is accepted round-trips unchanged, unknown fields included.
            prop_assert_eq!(serde_json::to_value(&parsed).unwrap(), value);
        } else if let Err(violation) = result {
            prop_assert_eq!(violation.kind, ViolationKind::Rule);
            prop_assert!(violation.field.starts_with('/'));
        }
    }
}
