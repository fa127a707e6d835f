//! Fuzz target: untrusted `MessageBody` and `MessageBodySchema` JSON
//! (`switchboard_protocol::message_body`), and the checks run on them.
//! Run: `RUSTC_BOOTSTRAP=1 cargo fuzz run message_body -- -max_total_time=60`
//! (see docs/testing.md).
//!
//! The input is split at `0xFF` bytes (never part of UTF-8 JSON) into up to three documents;
//! each is parsed as a body and as a schema. Properties:
//! - whatever is accepted re-serializes and parses back to an equal value;
//! - every accepted part passes `check_name` / `check_content_type`, has exactly one of
//!   `content` / `contentUrl`, names are unique, counts and pattern lengths within `MAX_*`;
//! - `check`, `compatible_with` and `list` never panic on accepted values, for every
//!   schema x body and schema x schema pair of the input;
//! - `check` agrees with `SchemaPart::matches` (Ok iff every part is matched and every
//!   required schema part matches some part);
//! - `compatible_with` is reflexive and sound: `out.compatible_with(in)` Ok and
//!   `out.check(body)` Ok imply `in.check(body)` Ok.
#![no_main]

use std::collections::HashSet;

use libfuzzer_sys::fuzz_target;
use switchboard_protocol::message_body::{
    MAX_PARTS, MAX_PATTERN_BYTES, MAX_SCHEMA_PARTS, MessageBody, MessageBodySchema, check_content_type,
    check_name,
};

fuzz_target!(|data: &[u8]| {
    let mut bodies = Vec::new();
    let mut schemas = Vec::new();
    for document in data.splitn(3, |b| *b == 0xFF) {
        if let Ok(body) = serde_json::from_slice::<MessageBody>(document) {
            body_ok(&body);
            bodies.push(body);
        }
        if let Ok(schema) = serde_json::from_slice::<MessageBodySchema>(document) {
            schema_ok(&schema);
            schemas.push(schema);
        }
    }
    for schema in &schemas {
        for body in &bodies {
            check_agrees_with_matches(schema, body);
            for part in schema.parts() {
                if let Some(pattern) = part.name() {
                    for listed in body.list(pattern) {
                        let name = listed.name();
                        assert!(name.is_some(), "list returned an unnamed part");
                    }
                }
            }
        }
        assert_eq!(
            schema.compatible_with(schema),
            Ok(()),
            "compatible_with is not reflexive for {schema:?}"
        );
    }
    for output in &schemas {
        for input in &schemas {
            if output.compatible_with(input).is_ok() {
                for body in &bodies {
                    if output.check(body).is_ok() {
                        assert_eq!(
                            input.check(body).map_err(|v| v.len()),
                            Ok(()),
                            "unsound: output {output:?} declared compatible with input {input:?}, \
                             body {body:?} valid under output but not input"
                        );
                    }
                }
            }
        }
    }
});

fn body_ok(body: &MessageBody) {
    assert!(body.parts().len() <= MAX_PARTS);
    let mut names = HashSet::new();
    for part in body.parts() {
        if let Some(name) = part.name() {
            assert_eq!(check_name(name), Ok(()), "accepted name {name:?}");
            assert!(names.insert(name), "duplicate name {name:?} accepted");
        }
        assert_eq!(check_content_type(part.content_type()), Ok(()));
        assert!(
            part.content().is_some() != part.content_url().is_some(),
            "a part must carry exactly one of content and contentUrl: {part:?}"
        );
        assert!(!part.media_type().is_empty());
    }
    let json = serde_json::to_vec(body).unwrap_or_default();
    let again = serde_json::from_slice::<MessageBody>(&json);
    assert_eq!(again.as_ref().ok(), Some(body), "round trip: {again:?}");
}

fn schema_ok(schema: &MessageBodySchema) {
    assert!(schema.parts().len() <= MAX_SCHEMA_PARTS);
    for part in schema.parts() {
        for pattern in [part.name(), part.content_type()].into_iter().flatten() {
            assert!(!pattern.is_empty() && pattern.len() <= MAX_PATTERN_BYTES);
        }
    }
    let json = serde_json::to_vec(schema).unwrap_or_default();
    let again = serde_json::from_slice::<MessageBodySchema>(&json);
    assert_eq!(again.as_ref().ok(), Some(schema), "round trip: {again:?}");
}

fn check_agrees_with_matches(schema: &MessageBodySchema, body: &MessageBody) {
    let every_part_matched = body
        .parts()
        .iter()
        .all(|part| schema.parts().iter().any(|s| s.matches(part)));
    let every_required_found = schema
        .parts()
        .iter()
        .filter(|s| s.required())
        .all(|s| body.parts().iter().any(|part| s.matches(part)));
    match schema.check(body) {
        Ok(()) => assert!(every_part_matched && every_required_found),
        Err(violations) => {
            assert!(!violations.is_empty());
            assert!(!(every_part_matched && every_required_found));
            for violation in &violations {
                assert!(!violation.to_string().is_empty());
                assert!(serde_json::to_string(violation).is_ok());
            }
        }
    }
}
