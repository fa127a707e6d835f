//! `MessageBody` and `MessageBodySchema`: the four examples of the message body structure
//! proposal as golden vectors (schemas and messages, written as its text describes them), the
//! refusals of invalid bodies and schemas with their exact messages, golden `compatible_with`
//! cases, and property tests: `compatible_with` is sound on generated schemas and messages,
//! names are accepted exactly when the rules say so, and valid bodies round-trip.
#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers fail loudly, naming the vector"
)]

use std::cell::Cell;
use std::collections::HashSet;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};
use switchboard_protocol::message_body::{
    Incompatibility, MAX_NAME_BYTES, MAX_PARTS, MessageBody, MessageBodySchema, Part, SchemaPart,
    Violation, check_name,
};

fn vector(name: &str) -> String {
    let path = format!(
        "{}/tests/vectors/message-body-{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{path}: {err}"))
}

/// Parses vector `name` and checks that pretty-printing it gives back the file byte for byte.
fn golden<T: serde::de::DeserializeOwned + serde::Serialize>(name: &str) -> T {
    let text = vector(name);
    let parsed: T = serde_json::from_str(&text).unwrap_or_else(|err| panic!("{name}: {err}"));
    let written = serde_json::to_string_pretty(&parsed).unwrap() + "\n";
    assert_eq!(written, text, "{name} round-trips byte for byte");
    parsed
}

fn schema(name: &str) -> MessageBodySchema {
    golden(&format!("{name}-schema"))
}

fn message(name: &str) -> MessageBody {
    golden(&format!("{name}-message"))
}

fn body(value: Value) -> MessageBody {
    serde_json::from_value(value).unwrap()
}

fn body_error(value: Value) -> String {
    match serde_json::from_value::<MessageBody>(value) {
        Ok(body) => panic!("expected a refusal, got {body:?}"),
        Err(err) => err.to_string(),
    }
}

fn schema_of(value: Value) -> MessageBodySchema {
    serde_json::from_value(value).unwrap()
}

const EXAMPLES: [&str; 4] = ["chat", "multimodal", "software", "researcher"];

// ---------------------------------------------------------------------------------------------
// Golden vectors of the proposal's examples.
// ---------------------------------------------------------------------------------------------

#[test]
fn every_example_message_is_valid_under_its_own_schema() {
    for name in EXAMPLES {
        let schema = schema(name);
        let message = message(name);
        assert_eq!(schema.check(&message), Ok(()), "{name}");
    }
}

#[test]
fn the_chat_schema_requires_one_unnamed_markdown_or_plain_text_part() {
    let chat = schema("chat");
    let plain = body(json!({"parts": [{"contentType": "text/plain", "content": "hi"}]}));
    assert_eq!(chat.check(&plain), Ok(()));
    let empty = body(json!({"parts": []}));
    assert_eq!(
        chat.check(&empty),
        Err(vec![Violation::MissingRequired {
            schema_part_index: 0,
            name: None,
            content_type: Some("text/{markdown,plain}".to_owned()),
        }])
    );
    let with_image = body(json!({"parts": [
        {"contentType": "text/markdown", "content": "look"},
        {"contentType": "image/png", "contentUrl": "https://example.com/a.png"}
    ]}));
    let violations = chat.check(&with_image).unwrap_err();
    assert_eq!(
        violations,
        vec![Violation::UnmatchedPart {
            part_index: 1,
            name: None,
            content_type: "image/png".to_owned(),
        }]
    );
    assert_eq!(
        violations[0].to_string(),
        "parts[1] (unnamed, contentType \"image/png\") matches no schema part"
    );
    assert_eq!(
        serde_json::to_value(&violations[0]).unwrap(),
        json!({"kind": "unmatchedPart",
            "message": "parts[1] (unnamed, contentType \"image/png\") matches no schema part",
            "partIndex": 1, "contentType": "image/png"})
    );
}

#[test]
fn a_named_part_does_not_match_a_schema_part_for_main_content() {
    let chat = schema("chat");
    let named = body(json!({"parts": [
        {"contentType": "text/markdown", "content": "hi"},
        {"name": "/notes.md", "contentType": "text/markdown", "content": "n"}
    ]}));
    assert_eq!(
        chat.check(&named),
        Err(vec![Violation::UnmatchedPart {
            part_index: 1,
            name: Some("/notes.md".to_owned()),
            content_type: "text/markdown".to_owned(),
        }])
    );
}

#[test]
fn the_multimodal_schema_needs_text_and_takes_any_image() {
    let multimodal = schema("multimodal");
    let image_only = body(json!({"parts": [
        {"contentType": "image/jpeg", "contentUrl": "https://example.com/a.jpg"}
    ]}));
    let violations = multimodal.check(&image_only).unwrap_err();
    assert_eq!(
        violations,
        vec![Violation::MissingRequired {
            schema_part_index: 0,
            name: None,
            content_type: Some("text/{markdown,plain}".to_owned()),
        }]
    );
    assert_eq!(
        violations[0].to_string(),
        "schema part 0 (unnamed, contentType \"text/{markdown,plain}\") is required but no part matches it"
    );
    assert_eq!(
        serde_json::to_value(&violations[0]).unwrap(),
        json!({"kind": "missingRequired", "message": violations[0].to_string(),
            "schemaPartIndex": 0, "contentType": "text/{markdown,plain}"})
    );
    let two_images = body(json!({"parts": [
        {"contentType": "text/plain", "content": "two"},
        {"contentType": "image/jpeg", "contentUrl": "https://example.com/a.jpg"},
        {"contentType": "IMAGE/WebP", "contentUrl": "https://example.com/b.webp"}
    ]}));
    assert_eq!(multimodal.check(&two_images), Ok(()));
}

#[test]
fn the_software_schema_takes_files_of_any_type_at_any_depth_but_needs_a_summary() {
    let software = schema("software");
    let files_only = body(json!({"parts": [
        {"name": "/a/b/c/d.txt", "contentType": "text/plain", "content": ""}
    ]}));
    assert_eq!(
        software.check(&files_only),
        Err(vec![Violation::MissingRequired {
            schema_part_index: 0,
            name: None,
            content_type: Some("text/markdown".to_owned()),
        }])
    );
    let summary_only =
        body(json!({"parts": [{"contentType": "text/markdown", "content": "nothing to do"}]}));
    assert_eq!(software.check(&summary_only), Ok(()));
}

#[test]
fn the_researcher_schema_takes_sources_one_level_under_sources_as_json_or_uri_lists() {
    let researcher = schema("researcher");
    let bad = body(json!({"parts": [
        {"name": "/sources/1/urls/5", "contentType": "text/uri-list", "content": "https://example.org\n"},
        {"name": "/sources/2.html", "contentType": "text/html", "content": "<p>"},
        {"name": "/sources/3.json", "contentType": "application/json", "content": "{}"}
    ]}));
    assert_eq!(
        researcher.check(&bad),
        Err(vec![
            Violation::UnmatchedPart {
                part_index: 0,
                name: Some("/sources/1/urls/5".to_owned()),
                content_type: "text/uri-list".to_owned(),
            },
            Violation::UnmatchedPart {
                part_index: 1,
                name: Some("/sources/2.html".to_owned()),
                content_type: "text/html".to_owned(),
            },
            Violation::MissingRequired {
                schema_part_index: 0,
                name: None,
                content_type: Some("text/markdown".to_owned()),
            },
        ])
    );
}

#[test]
fn list_finds_the_sources_of_the_researcher_example() {
    let research = message("researcher");
    let names: Vec<_> = research.list("/sources/*").filter_map(Part::name).collect();
    assert_eq!(names, ["/sources/1.json", "/sources/2"]);
    assert_eq!(research.list("/**").count(), 2);
    assert_eq!(research.list("/sources/{2,3}").count(), 1);
    assert_eq!(research.list("/sources").count(), 0);
    assert_eq!(
        research.list("/sources/[").count(),
        0,
        "an invalid pattern matches nothing"
    );
    let software = message("software");
    assert_eq!(software.list("/src/**/*.{rs,toml}").count(), 1);
    assert_eq!(software.list("/**/*.{rs,toml}").count(), 2);
    assert_eq!(
        software.get("/Cargo.toml").map(Part::content_type),
        Some("application/toml")
    );
}

#[test]
fn parts_expose_their_fields_and_media_type() {
    let software = message("software");
    let main = software.get("/src/main.rs").unwrap();
    assert_eq!(main.content_type(), "text/x-rust; charset=utf-8");
    assert_eq!(main.media_type(), "text/x-rust");
    assert!(main.content().is_some() && main.content_url().is_none());
    let logo = software.get("/assets/logo.png").unwrap();
    assert_eq!(
        logo.content_url(),
        Some("https://storage.example.com/runs/43/logo.png")
    );
    assert_eq!(logo.content(), None);
    assert_eq!(software.parts()[0].name(), None);
}

// ---------------------------------------------------------------------------------------------
// Refusals.
// ---------------------------------------------------------------------------------------------

fn text_part(name: &str) -> Value {
    json!({"name": name, "contentType": "text/plain", "content": "x"})
}

#[test]
fn deserializing_refuses_bad_names_naming_the_part_and_the_rule() {
    let cases = [
        ("a/b", "parts[2].name must start with \"/\""),
        ("", "parts[2].name must start with \"/\""),
        ("/a//b", "parts[2].name must not contain \"//\""),
        ("/a/", "parts[2].name must not end with \"/\""),
        ("/", "parts[2].name must not end with \"/\""),
        (
            "/a b",
            "parts[2].name must contain only A-Z, a-z, 0-9, \".\", \"-\", \"_\" and \"/\" (found ' ')",
        ),
        (
            "/caf\u{e9}",
            "parts[2].name must contain only A-Z, a-z, 0-9, \".\", \"-\", \"_\" and \"/\" (found '\u{e9}')",
        ),
    ];
    for (name, expected) in cases {
        let error = body_error(json!({"parts": [
            {"contentType": "text/plain", "content": "main"},
            text_part("/ok"),
            text_part(name)
        ]}));
        assert!(error.starts_with(expected), "{name:?}: {error}");
    }
    let longest = format!("/{}", "a".repeat(MAX_NAME_BYTES - 1));
    assert!(serde_json::from_value::<MessageBody>(json!({"parts": [text_part(&longest)]})).is_ok());
    let error = body_error(json!({"parts": [text_part(&format!("{longest}a"))]}));
    assert!(
        error.starts_with("parts[0].name is longer than 1024 bytes"),
        "{error}"
    );
}

#[test]
fn deserializing_refuses_duplicate_names() {
    let error = body_error(json!({"parts": [
        text_part("/a"), text_part("/b"), text_part("/a/b"), text_part("/a")
    ]}));
    assert!(
        error.starts_with("parts[3].name \"/a\" is not unique"),
        "{error}"
    );
    // Unnamed parts may repeat.
    body(json!({"parts": [
        {"contentType": "text/plain", "content": "1"}, {"contentType": "text/plain", "content": "2"}
    ]}));
}

#[test]
fn deserializing_refuses_anything_but_exactly_one_of_content_and_content_url() {
    for part in [
        json!({"contentType": "text/plain"}),
        json!({"contentType": "text/plain", "content": "x", "contentUrl": "https://example.com/x"}),
    ] {
        let error = body_error(json!({"parts": [text_part("/a"), part]}));
        assert!(
            error.starts_with("parts[1]: exactly one of content and contentUrl is required"),
            "{error}"
        );
    }
    let error = body_error(json!({"parts": [
        {"contentType": "text/plain", "contentUrl": "not a url"}
    ]}));
    assert!(
        error.starts_with("parts[0].contentUrl must be an absolute URL"),
        "{error}"
    );
}

#[test]
fn deserializing_refuses_content_types_that_are_not_type_slash_subtype() {
    for content_type in [
        "",
        "text",
        "text/",
        "/plain",
        "text/plain/x",
        "text plain",
        "*/*",
    ] {
        let error = body_error(json!({"parts": [{"contentType": content_type, "content": ""}]}));
        assert!(
            error.starts_with("parts[0].contentType must be a media type of the form type/subtype"),
            "{content_type:?}: {error}"
        );
    }
    let long = format!("text/{}", "x".repeat(251));
    let error = body_error(json!({"parts": [{"contentType": long, "content": ""}]}));
    assert!(
        error.starts_with("parts[0].contentType is longer than 255 bytes"),
        "{error}"
    );
    body(
        json!({"parts": [{"contentType": "application/vnd.api+json; charset=utf-8", "content": ""}]}),
    );
}

#[test]
fn deserializing_refuses_too_many_parts_and_unknown_fields() {
    let parts: Vec<Value> = (0..=MAX_PARTS)
        .map(|i| json!({"contentType": "text/plain", "content": i.to_string()}))
        .collect();
    let error = body_error(json!({ "parts": parts }));
    assert!(
        error.starts_with("parts has 257 entries; at most 256 are allowed"),
        "{error}"
    );
    let error = body_error(
        json!({"parts": [{"contentType": "text/plain", "content": "", "contentURL": "x"}]}),
    );
    assert!(error.contains("unknown field `contentURL`"), "{error}");
    let error = body_error(json!({"parts": [], "extra": 1}));
    assert!(error.contains("unknown field `extra`"), "{error}");
}

#[test]
fn constructors_apply_the_same_rules() {
    assert!(Part::inline(None, "text/plain", "hi").is_ok());
    assert!(
        Part::remote(
            Some("/a.png".to_owned()),
            "image/png",
            "https://example.com/a.png"
        )
        .is_ok()
    );
    let error = Part::inline(Some("a".to_owned()), "text/plain", "hi").unwrap_err();
    assert_eq!(error.to_string(), "name must start with \"/\"");
    assert_eq!(error.field(), Some("name"));
    let a = Part::inline(Some("/a".to_owned()), "text/plain", "1").unwrap();
    let error = MessageBody::new(vec![a.clone(), a]).unwrap_err();
    assert_eq!(error.to_string(), "parts[1].name \"/a\" is not unique");
    assert!(check_name("/a/b.c").is_ok());
}

#[test]
fn deserializing_a_schema_refuses_invalid_patterns_naming_the_schema_part() {
    let error = serde_json::from_value::<MessageBodySchema>(json!({"parts": [
        {"name": "/a"}, {"name": "/a/[b"}
    ]}))
    .unwrap_err()
    .to_string();
    assert!(
        error.starts_with("parts[1].name pattern \"/a/[b\" is invalid: "),
        "{error}"
    );
    let error =
        serde_json::from_value::<MessageBodySchema>(json!({"parts": [{"contentType": ""}]}))
            .unwrap_err()
            .to_string();
    assert!(
        error.starts_with("parts[0].contentType pattern \"\" is invalid: must not be empty"),
        "{error}"
    );
    let error = serde_json::from_value::<MessageBodySchema>(
        json!({"parts": [{"name": "/a", "required": "yes"}]}),
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("invalid type"), "{error}");
}

#[test]
fn schema_parts_expose_their_patterns_and_required_defaults_to_false() {
    let researcher = schema("researcher");
    let sources = &researcher.parts()[1];
    assert_eq!(sources.name(), Some("/sources/*"));
    assert_eq!(
        sources.content_type(),
        Some("{application/json,text/uri-list}")
    );
    assert!(!sources.required());
    let part = SchemaPart::new(None, None, true).unwrap();
    assert_eq!(
        serde_json::to_value(&part).unwrap(),
        json!({"required": true})
    );
}

// ---------------------------------------------------------------------------------------------
// compatible_with, golden.
// ---------------------------------------------------------------------------------------------

#[test]
fn chat_output_can_feed_a_multimodal_input() {
    assert_eq!(
        schema("chat").compatible_with(&schema("multimodal")),
        Ok(())
    );
}

#[test]
fn multimodal_output_cannot_feed_a_chat_input_because_images_are_not_covered() {
    let problems = schema("multimodal")
        .compatible_with(&schema("chat"))
        .unwrap_err();
    assert_eq!(
        problems,
        vec![Incompatibility::NotCovered {
            output_part_index: 1,
            name: None,
            content_type: Some("image/*".to_owned()),
        }]
    );
    assert_eq!(
        problems[0].to_string(),
        "output schema part 1 (unnamed, contentType \"image/*\") is not provably accepted by any single input schema part"
    );
    assert_eq!(
        serde_json::to_value(&problems[0]).unwrap(),
        json!({"kind": "notCovered", "message": problems[0].to_string(),
            "outputPartIndex": 1, "contentType": "image/*"})
    );
}

#[test]
fn researcher_output_cannot_feed_a_chat_input_because_sources_are_not_covered() {
    // The write-up is text/markdown, which chat accepts; the sources are named parts.
    assert_eq!(
        schema("researcher").compatible_with(&schema("chat")),
        Err(vec![Incompatibility::NotCovered {
            output_part_index: 1,
            name: Some("/sources/*".to_owned()),
            content_type: Some("{application/json,text/uri-list}".to_owned()),
        }])
    );
}

#[test]
fn researcher_output_can_feed_a_software_input_whose_files_take_anything() {
    assert_eq!(
        schema("researcher").compatible_with(&schema("software")),
        Ok(())
    );
}

#[test]
fn software_output_cannot_feed_a_researcher_input() {
    assert_eq!(
        schema("software").compatible_with(&schema("researcher")),
        Err(vec![Incompatibility::NotCovered {
            output_part_index: 1,
            name: Some("/**".to_owned()),
            content_type: None,
        }])
    );
}

#[test]
fn chat_output_cannot_feed_an_input_that_only_takes_markdown() {
    // Chat may answer in text/plain; the researcher's input-side schema wants text/markdown.
    assert_eq!(
        schema("chat").compatible_with(&schema("researcher")),
        Err(vec![
            Incompatibility::NotCovered {
                output_part_index: 0,
                name: None,
                content_type: Some("text/{markdown,plain}".to_owned()),
            },
            Incompatibility::RequiredNotGuaranteed {
                input_part_index: 0,
                name: None,
                content_type: Some("text/markdown".to_owned()),
            },
        ])
    );
}

#[test]
fn every_example_is_compatible_with_itself() {
    for name in EXAMPLES {
        assert_eq!(
            schema(name).compatible_with(&schema(name)),
            Ok(()),
            "{name}"
        );
    }
}

#[test]
fn a_required_input_part_must_be_guaranteed_by_a_required_output_part() {
    let wants_attachment = schema_of(json!({"parts": [
        {"contentType": "*/*"},
        {"name": "/attachments/*", "required": true}
    ]}));
    let problems = schema("chat")
        .compatible_with(&wants_attachment)
        .unwrap_err();
    assert_eq!(
        problems,
        vec![Incompatibility::RequiredNotGuaranteed {
            input_part_index: 1,
            name: Some("/attachments/*".to_owned()),
            content_type: None,
        }]
    );
    assert_eq!(
        problems[0].to_string(),
        "input schema part 1 (name \"/attachments/*\", any contentType) is required but no required output schema part provably matches it"
    );
    // An optional output image does not guarantee a required input image.
    let wants_image = schema_of(json!({"parts": [
        {"contentType": "text/*"}, {"contentType": "image/*", "required": true}
    ]}));
    assert!(matches!(
        schema("multimodal")
            .compatible_with(&wants_image)
            .unwrap_err()[..],
        [Incompatibility::RequiredNotGuaranteed {
            input_part_index: 1,
            ..
        }]
    ));
}

#[test]
fn brace_alternatives_and_universal_patterns_are_proven_contained() {
    let any_text = schema_of(json!({"parts": [{"contentType": "text/*", "required": true}]}));
    assert_eq!(schema("chat").compatible_with(&any_text), Ok(()));
    let anything =
        schema_of(json!({"parts": [{"contentType": "*/*", "required": true}, {"name": "/**"}]}));
    for name in EXAMPLES {
        assert_eq!(schema(name).compatible_with(&anything), Ok(()), "{name}");
    }
    let literal_sources = schema_of(json!({"parts": [
        {"name": "/sources/{1,2}.json", "contentType": "application/json", "required": true}
    ]}));
    let sources_glob = schema_of(json!({"parts": [{"name": "/sources/*.json", "required": true}]}));
    assert_eq!(literal_sources.compatible_with(&sources_glob), Ok(()));
}

#[test]
fn containment_between_two_different_wildcards_is_not_proven() {
    // Compatible in truth, refused: `image/*` is within `{image,text}/*`, `/a/*` within `/a/**`.
    let images = schema_of(json!({"parts": [{"contentType": "image/*"}]}));
    let images_or_text = schema_of(json!({"parts": [{"contentType": "{image,text}/*"}]}));
    assert!(images.compatible_with(&images_or_text).is_err());
    let shallow = schema_of(json!({"parts": [{"name": "/a/*"}]}));
    let deep = schema_of(json!({"parts": [{"name": "/a/**"}]}));
    assert!(shallow.compatible_with(&deep).is_err());
    // Covered only by the union of two input parts: refused as well.
    let both = schema_of(json!({"parts": [{"name": "/{a,b}"}]}));
    let split = schema_of(json!({"parts": [{"name": "/a"}, {"name": "/b"}]}));
    assert!(both.compatible_with(&split).is_err());
}

// ---------------------------------------------------------------------------------------------
// Properties.
// ---------------------------------------------------------------------------------------------

const NAME_PATTERNS: [Option<&str>; 13] = [
    None,
    Some("/a"),
    Some("/b"),
    Some("/a/x"),
    Some("/a/*"),
    Some("/a/**"),
    Some("/**"),
    Some("/{a,b}"),
    Some("/a/{x,y}"),
    Some("/*"),
    Some("/b/*"),
    Some("**"),
    Some("/{a,c}"),
];
const NAMES: [Option<&str>; 9] = [
    None,
    Some("/a"),
    Some("/b"),
    Some("/c"),
    Some("/a/x"),
    Some("/a/y"),
    Some("/a/x/y"),
    Some("/b/x"),
    Some("/b/y/z"),
];
const TYPE_PATTERNS: [Option<&str>; 8] = [
    None,
    Some("text/plain"),
    Some("text/*"),
    Some("image/png"),
    Some("*/*"),
    Some("text/{plain,markdown}"),
    Some("image/*"),
    Some("{text,image}/*"),
];
const TYPES: [&str; 6] = [
    "text/plain",
    "text/markdown",
    "image/png",
    "image/jpeg",
    "application/json",
    "TEXT/Plain; charset=utf-8",
];

fn schema_strategy() -> impl Strategy<Value = MessageBodySchema> {
    prop::collection::vec(
        (
            prop::sample::select(NAME_PATTERNS.to_vec()),
            prop::sample::select(TYPE_PATTERNS.to_vec()),
            prop::bool::weighted(0.4),
        ),
        0..4,
    )
    .prop_map(|parts| {
        let parts = parts
            .into_iter()
            .map(|(name, content_type, required)| {
                SchemaPart::new(
                    name.map(str::to_owned),
                    content_type.map(str::to_owned),
                    required,
                )
                .unwrap()
            })
            .collect();
        MessageBodySchema::new(parts).unwrap()
    })
}

/// Every concrete part of the pools (inline, no content), one per name and type.
fn all_parts() -> Vec<Part> {
    NAMES
        .iter()
        .flat_map(|name| {
            TYPES.iter().map(move |content_type| {
                Part::inline(name.map(str::to_owned), *content_type, "").unwrap()
            })
        })
        .collect()
}

/// Adds `part` unless a part of the same name is already there.
fn push_unique(parts: &mut Vec<Part>, part: &Part) {
    if part.name().is_none() || parts.iter().all(|p| p.name() != part.name()) {
        parts.push(part.clone());
    }
}

/// Messages valid under `out`: built from the picks, then every single extra part on top of
/// one part per required schema part. Only those `out.check` accepts are returned.
fn messages_from(out: &MessageBodySchema, picks: &[(usize, usize)]) -> Vec<MessageBody> {
    let pool = all_parts();
    let matching = |schema: &SchemaPart| -> Vec<&Part> {
        pool.iter().filter(|part| schema.matches(part)).collect()
    };
    let mut base = Vec::new();
    for (i, schema) in out.parts().iter().enumerate() {
        let candidates = matching(schema);
        if schema.required() && !candidates.is_empty() {
            let pick = picks.get(i).map_or(0, |pick| pick.1);
            push_unique(&mut base, candidates[pick % candidates.len()]);
        }
    }
    let mut messages = Vec::new();
    let mut picked = base.clone();
    if !out.parts().is_empty() {
        for (schema_pick, part_pick) in picks {
            let candidates = matching(&out.parts()[schema_pick % out.parts().len()]);
            if !candidates.is_empty() {
                push_unique(&mut picked, candidates[part_pick % candidates.len()]);
            }
        }
    }
    messages.push(picked);
    for part in pool
        .iter()
        .filter(|part| out.parts().iter().any(|s| s.matches(part)))
    {
        let mut parts = base.clone();
        push_unique(&mut parts, part);
        messages.push(parts);
    }
    messages
        .into_iter()
        .filter_map(|parts| MessageBody::new(parts).ok())
        .filter(|message| out.check(message).is_ok())
        .collect()
}

#[test]
fn messages_valid_under_an_output_schema_pass_every_input_schema_it_is_compatible_with() {
    let mut runner = TestRunner::new(Config {
        cases: 3000,
        ..Config::default()
    });
    let compatible_pairs = Cell::new(0_usize);
    let checked_messages = Cell::new(0_usize);
    let picks = prop::collection::vec((0..8_usize, 0..64_usize), 0..6);
    runner
        .run(
            &(schema_strategy(), schema_strategy(), picks),
            |(out, inp, picks)| {
                if out.compatible_with(&inp).is_ok() {
                    compatible_pairs.set(compatible_pairs.get() + 1);
                    for message in messages_from(&out, &picks) {
                        checked_messages.set(checked_messages.get() + 1);
                        prop_assert_eq!(
                            inp.check(&message),
                            Ok(()),
                            "out {} accepted {} but inp {} refused it",
                            serde_json::to_string(&out).unwrap(),
                            serde_json::to_string(&message).unwrap(),
                            serde_json::to_string(&inp).unwrap()
                        );
                    }
                }
                Ok(())
            },
        )
        .unwrap();
    // The property must actually be exercised, not vacuously true.
    assert!(
        compatible_pairs.get() > 300,
        "{} compatible pairs",
        compatible_pairs.get()
    );
    assert!(
        checked_messages.get() > 1000,
        "{} messages",
        checked_messages.get()
    );
}

/// The naming rule of the proposal, written independently of the code.
fn name_rule(name: &str) -> bool {
    name.starts_with('/')
        && !name.ends_with('/')
        && !name.contains("//")
        && name.len() <= MAX_NAME_BYTES
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/'))
}

fn valid_body() -> impl Strategy<Value = MessageBody> {
    let name = prop::option::weighted(0.7, "(/[a-zA-Z0-9._-]{1,6}){1,3}");
    let content_type = prop::sample::select(vec![
        "text/plain",
        "text/markdown; charset=utf-8",
        "application/vnd.api+json",
        "image/png",
    ]);
    let content = prop_oneof![
        ".{0,20}".prop_map(Ok),
        prop::sample::select(vec![
            "https://example.com/a.png",
            "s3://bucket/key",
            "urn:x:y"
        ])
        .prop_map(Err),
    ];
    prop::collection::vec((name, content_type, content), 0..8).prop_map(|parts| {
        let mut seen = HashSet::new();
        let parts = parts
            .into_iter()
            .filter(|(name, _, _)| name.as_ref().is_none_or(|name| seen.insert(name.clone())))
            .map(|(name, content_type, content)| match content {
                Ok(text) => Part::inline(name, content_type, text).unwrap(),
                Err(url) => Part::remote(name, content_type, url).unwrap(),
            })
            .collect();
        MessageBody::new(parts).unwrap()
    })
}

/// A JSON part built from arbitrary keys and values, mostly invalid.
fn loose_part() -> impl Strategy<Value = Value> {
    let key = prop::sample::select(vec![
        "name",
        "contentType",
        "content",
        "contentUrl",
        "required",
        "other",
    ]);
    let value = prop_oneof![
        "(/[a-z.]{0,3}){0,3}/?".prop_map(Value::from),
        prop::sample::select(vec![
            "text/plain",
            "image/*",
            "*/*",
            "text",
            "https://a.b/c",
            "{a,"
        ])
        .prop_map(Value::from),
        ".{0,8}".prop_map(Value::from),
        any::<bool>().prop_map(Value::from),
        Just(Value::Null),
    ];
    prop::collection::btree_map(key, value, 0..5)
        .prop_map(|map| Value::Object(map.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    #[test]
    fn a_name_is_accepted_exactly_when_the_naming_rule_says_so(
        name in prop_oneof![
            "(/[a-zA-Z0-9._-]{0,4}){1,4}",
            "[/a-z.]{0,8}",
            ".{0,10}",
            "(/[a-z]{1,3}){1,3}/?",
        ]
    ) {
        let value = json!({"parts": [{"name": name, "contentType": "text/plain", "content": ""}]});
        let accepted = serde_json::from_value::<MessageBody>(value).is_ok();
        prop_assert_eq!(accepted, name_rule(&name), "{:?}", name);
        prop_assert_eq!(check_name(&name).is_ok(), name_rule(&name));
    }

    #[test]
    fn valid_bodies_round_trip_through_json(body in valid_body()) {
        let text = serde_json::to_string(&body).unwrap();
        let parsed: MessageBody = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(&parsed, &body);
        prop_assert_eq!(serde_json::to_string(&parsed).unwrap(), text);
    }

    #[test]
    fn whatever_json_is_accepted_as_a_body_keeps_the_rules(
        parts in prop::collection::vec(loose_part(), 0..5)
    ) {
        let value = json!({ "parts": parts });
        if let Ok(body) = serde_json::from_value::<MessageBody>(value.clone()) {
            let mut seen = HashSet::new();
            for part in body.parts() {
                prop_assert!(part.content().is_some() != part.content_url().is_some());
                if let Some(name) = part.name() {
                    prop_assert!(name_rule(name), "{:?}", name);
                    prop_assert!(seen.insert(name), "{:?} repeated", name);
                }
            }
            let again: MessageBody = serde_json::from_str(&serde_json::to_string(&body).unwrap()).unwrap();
            prop_assert_eq!(again, body);
        }
        if let Ok(schema) = serde_json::from_value::<MessageBodySchema>(value) {
            let again: MessageBodySchema = serde_json::from_str(&serde_json::to_string(&schema).unwrap()).unwrap();
            prop_assert_eq!(&again, &schema);
            prop_assert_eq!(schema.compatible_with(&schema), Ok(()));
        }
    }

    #[test]
    fn any_bytes_are_answered_without_panicking(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = serde_json::from_slice::<MessageBody>(&bytes);
        let _ = serde_json::from_slice::<MessageBodySchema>(&bytes);
    }

    #[test]
    fn every_schema_is_compatible_with_itself(schema in schema_strategy()) {
        prop_assert_eq!(schema.compatible_with(&schema), Ok(()));
    }

    #[test]
    fn list_returns_the_parts_a_schema_part_with_that_name_pattern_matches(
        body in valid_body(),
        pattern in prop::sample::select(vec!["/**", "/*", "/*/*", "/{a,b}*", "/[a-m]*/**", "**"]),
    ) {
        let schema = SchemaPart::new(Some(pattern.to_owned()), None, false).unwrap();
        let listed: Vec<&Part> = body.list(pattern).collect();
        let expected: Vec<&Part> = body.parts().iter().filter(|part| schema.matches(part)).collect();
        prop_assert_eq!(listed, expected);
    }
}
