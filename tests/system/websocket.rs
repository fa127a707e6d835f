//! The WebSocket schema of `websocket-message-schema.md` against the running services: one
//! conformance check per message type and per error code (field sets golden-checked against the
//! seed's examples), human-in-the-loop prompts of every `input_type` with answer, timeout and
//! answer-after-reconnect, and the prompts shared with AG-UI's interrupts.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use switchboard_system_tests::{
    Options, TestPlatform, WsClient, read_sse, streamed_text, ws_done as is_done,
    ws_reply_text as response_text,
};

fn keys(value: &Value) -> BTreeSet<String> {
    value
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

/// The seed's server examples (the fields every message of that type has).
fn seed(kind: &str) -> Value {
    match kind {
        "system_intermediate_message" => {
            json!({"type": "system_intermediate_message", "id": "step_789",
            "thread_id": "thread_456", "parent_id": "id from user message", "intermediate_parent_id": "default",
            "conversation_id": "string", "content": {"name": "n", "payload": "p"}, "status": "in_progress",
            "timestamp": "2025-01-13T10:00:01Z"})
        }
        "system_response_message" => json!({"type": "system_response_message", "id": "token_001",
            "thread_id": "thread_456", "parent_id": "id from user message", "conversation_id": "string",
            "content": {"text": "t"}, "status": "in_progress", "timestamp": "2025-01-13T10:00:02Z"}),
        "error_message" => {
            json!({"type": "error_message", "id": "token_001", "thread_id": "thread_456",
            "parent_id": "id from user message", "conversation_id": "string",
            "content": {"code": "workflow_error", "message": "m", "details": "d"}, "status": "in_progress",
            "timestamp": "2025-01-13T10:00:02Z"})
        }
        "system_interaction_message" => {
            json!({"type": "system_interaction_message", "id": "interaction_303",
            "thread_id": "thread_456", "parent_id": "id from user message", "conversation_id": "string",
            "content": {}, "status": "in_progress", "timestamp": "2025-01-13T10:00:03Z"})
        }
        "observability_trace_message" => {
            json!({"type": "observability_trace_message", "id": "trace_001",
            "parent_id": "id from user message", "conversation_id": "string",
            "content": {"observability_trace_id": "019a9f4d-072a-77b0-aff1-262550329c13"},
            "timestamp": "2025-01-20T10:00:00Z"})
        }
        other => panic!("no seed example for {other}"),
    }
}

/// The seed's interaction content fields per input type.
fn seed_prompt_keys(input_type: &str) -> BTreeSet<String> {
    let fields: &[&str] = if input_type == "text" {
        &[
            "input_type",
            "text",
            "placeholder",
            "required",
            "timeout",
            "error",
        ]
    } else {
        &[
            "input_type",
            "text",
            "options",
            "required",
            "timeout",
            "error",
        ]
    };
    fields.iter().map(|f| (*f).to_owned()).collect()
}

fn assert_seed_shape(message: &Value) {
    let kind = message["type"].as_str().unwrap();
    let example = seed(kind);
    assert_eq!(keys(message), keys(&example), "{kind}: {message}");
    if kind != "system_interaction_message" {
        assert_eq!(
            keys(&message["content"]),
            keys(&example["content"]),
            "{kind} content: {message}"
        );
    }
    if let Some(status) = message.get("status") {
        assert!(
            ["in_progress", "completed", "failed"].contains(&status.as_str().unwrap()),
            "{message}"
        );
    }
    let at = message["timestamp"].as_str().unwrap();
    assert!(
        chrono::DateTime::parse_from_rfc3339(at).is_ok(),
        "ISO-8601: {at}"
    );
}

fn user_message(id: &str, conversation: &str, text: &str) -> Value {
    // The seed's example, with our ids and text.
    json!({
        "type": "user_message", "schema_type": "string", "id": id, "conversation_id": conversation,
        "content": {"messages": [
            {"role": "user", "content": [{"type": "text", "text": "Hello, how are you?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "im good"}]},
            {"role": "user", "content": [{"type": "text", "text": text}]}
        ]},
        "timestamp": "2025-01-13T10:00:00Z", "user": {"name": "string", "email": "string"},
        "schema_version": "string"
    })
}

fn interaction(id: &str, conversation: &str, prompt: &str, answer: &str) -> Value {
    json!({
        "type": "user_interaction_message", "id": id, "thread_id": conversation, "parent_id": prompt,
        "conversation_id": conversation,
        "content": {"messages": [{"role": "user", "content": [{"type": "text", "text": answer}]}]},
        "timestamp": "2025-01-13T10:00:04Z"
    })
}

#[tokio::test]
async fn every_server_message_type_has_the_seeds_fields_and_the_trace_id_is_real() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let mut ws = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();
    let conversation = format!("c-{}", uuid::Uuid::now_v7());

    ws.send(&user_message("m1", &conversation, "solve this question"))
        .await
        .unwrap();
    let first = ws.until(is_done).await.unwrap();
    for message in &first {
        assert_seed_shape(message);
        assert_eq!(
            (&message["conversation_id"], &message["parent_id"]),
            (&json!(conversation), &json!("m1"))
        );
    }
    assert_eq!(first[0]["type"], "observability_trace_message", "{first:?}");
    let trace = first[0]["content"]["observability_trace_id"]
        .as_str()
        .unwrap();
    assert!(
        trace.len() == 32
            && trace.chars().all(|c| c.is_ascii_hexdigit())
            && trace != "0".repeat(32),
        "an OTel trace id: {trace}"
    );
    assert_eq!(response_text(&first), "You said: solve this question");
    let ids: Vec<&str> = first.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert!(
        ids.iter().all(|id| id.starts_with("m1:")),
        "ids are <runId>:<seq>: {ids:?}"
    );

    ws.send(&user_message("m2", &conversation, "/tool lookup {\"q\":1}"))
        .await
        .unwrap();
    let tools = ws.until(is_done).await.unwrap();
    let steps: Vec<&Value> = tools
        .iter()
        .filter(|m| m["type"] == "system_intermediate_message")
        .collect();
    assert!(
        steps.len() >= 3,
        "call started, call complete, result: {tools:?}"
    );
    for step in &steps {
        assert_seed_shape(step);
        assert_eq!(step["content"]["name"], "lookup");
    }
    assert_eq!(steps.last().unwrap()["status"], "completed");

    ws.send(&user_message("m3", &conversation, "/fail"))
        .await
        .unwrap();
    let failed = ws.until(is_done).await.unwrap();
    let error = failed.last().unwrap();
    assert_seed_shape(error);
    assert_eq!(error["content"]["code"], "workflow_error");

    ws.send(&user_message(
        "m4",
        &conversation,
        "/ask radio Please select your preferred notification method:",
    ))
    .await
    .unwrap();
    let asked = ws
        .until(|m| m["type"] == "system_interaction_message")
        .await
        .unwrap();
    let prompt = asked.last().unwrap();
    assert_seed_shape(prompt);
    assert_eq!(keys(&prompt["content"]), seed_prompt_keys("radio"));
    ws.send(&interaction(
        "m5",
        &conversation,
        prompt["id"].as_str().unwrap(),
        "SMS",
    ))
    .await
    .unwrap();
    let answered = ws.until(is_done).await.unwrap();
    assert_eq!(response_text(&answered), "You answered: sms");
    ws.close().await.unwrap();
}

#[tokio::test]
async fn every_input_type_is_asked_with_the_seeds_content_and_answered() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let mut ws = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();
    let conversation = format!("c-{}", uuid::Uuid::now_v7());
    for (i, (input_type, answer, expected)) in [
        ("text", "my own words", "You answered: my own words"),
        ("binary_choice", "continue", "You answered: continue"),
        ("radio", "email", "You answered: email"),
        (
            "checkbox",
            "email, push",
            r#"You answered: ["email","push"]"#,
        ),
        ("dropdown", "Push Notification", "You answered: push"),
    ]
    .into_iter()
    .enumerate()
    {
        ws.send(&user_message(
            &format!("ask-{i}"),
            &conversation,
            &format!("/ask {input_type} Pick one"),
        ))
        .await
        .unwrap();
        let asked = ws
            .until(|m| m["type"] == "system_interaction_message")
            .await
            .unwrap();
        assert!(
            !asked.iter().any(is_done),
            "the response is not completed while a question is pending: {asked:?}"
        );
        let prompt = asked.last().unwrap();
        assert_eq!(prompt["content"]["input_type"], input_type);
        assert_eq!(
            keys(&prompt["content"]),
            seed_prompt_keys(input_type),
            "{prompt}"
        );
        assert_eq!(prompt["content"]["timeout"], Value::Null);
        assert_eq!(
            prompt["content"]["error"],
            "This prompt is no longer available."
        );
        if input_type != "text" {
            for option in prompt["content"]["options"].as_array().unwrap() {
                assert!(
                    ["id", "label", "value"]
                        .iter()
                        .all(|k| option.get(*k).is_some()),
                    "{option}"
                );
            }
        }
        // A wrong answer to a choice is refused, naming the options; the prompt stays open.
        if input_type == "radio" {
            let bad = interaction("bad", &conversation, prompt["id"].as_str().unwrap(), "fax");
            ws.send(&bad).await.unwrap();
            let refused = ws.next().await.unwrap();
            assert_eq!(
                refused["content"]["code"], "invalid_user_message_content",
                "{refused}"
            );
            assert!(
                refused["content"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("email, sms, push")
            );
        }
        let reply = interaction(
            &format!("answer-{i}"),
            &conversation,
            prompt["id"].as_str().unwrap(),
            answer,
        );
        ws.send(&reply).await.unwrap();
        let answered = ws.until(is_done).await.unwrap();
        assert_eq!(response_text(&answered), expected, "{input_type}");
    }
}

#[tokio::test]
async fn each_error_code_is_answered_with_an_error_message_naming_the_problem() {
    let platform = TestPlatform::spawn_with(Options {
        rate_per_minute: 1,
        rate_burst: 2,
        ..Options::default()
    })
    .await
    .unwrap();
    let alice = platform.infra.token("alice");
    let mut ws = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();
    let conversation = "errors";
    let mut expect = async |message: Value, code: &str| {
        ws.send(&message).await.unwrap();
        let answer = ws.until(|m| m["type"] == "error_message").await.unwrap();
        let error = answer.last().unwrap().clone();
        assert_seed_shape(&error);
        assert_eq!(error["content"]["code"], code, "{message} -> {error}");
        assert!(!error["content"]["message"].as_str().unwrap().is_empty());
        error
    };
    let error = expect(
        json!({"type": "user_message", "conversation_id": conversation}),
        "invalid_message",
    )
    .await;
    assert_eq!(error["content"]["details"], "id");
    expect(
        json!({"type": "telepathy", "id": "x"}),
        "invalid_message_type",
    )
    .await;
    expect(
        json!({"type": "system_response_message", "id": "x"}),
        "invalid_message_type",
    )
    .await;
    let mut empty = user_message("e1", conversation, "x");
    empty["content"]["messages"] = json!([{"role": "assistant", "content": "only me"}]);
    expect(empty, "invalid_user_message_content").await;
    let mut data = user_message("e2", conversation, "x");
    data["content"]["messages"][2]["content"] = json!([{"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,%%%"}}]);
    expect(data, "invalid_data_content").await;
    let mut not_owned = user_message("e3", conversation, "x");
    not_owned["content"]["messages"][2]["content"] = json!([{"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "s3://someone/else.png"}}]);
    expect(not_owned, "invalid_data_content").await;
    expect(user_message("e4", conversation, "/fail"), "workflow_error").await;
    // The burst of 2 is spent (e4 and one of the refused ones never started a run): a refusal
    // we cannot attribute to the client is unknown_error.
    expect(user_message("e5", conversation, "hi"), "unknown_error").await;
    // Not JSON at all.
    let mut raw = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();
    raw.send_text("{not json").await.unwrap();
    let error = raw.next().await.unwrap();
    assert_eq!(
        (&error["type"], &error["content"]["code"]),
        (&json!("error_message"), &json!("invalid_message"))
    );
    // Unauthenticated upgrades are refused before any message.
    let anonymous = WsClient::connect(&platform.urls.runs, "not-a-token", "").await;
    assert!(anonymous.is_err());
}

#[tokio::test]
async fn a_prompt_times_out_for_the_agent_and_the_client_and_a_late_answer_is_refused() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let mut ws = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();
    let conversation = format!("c-{}", uuid::Uuid::now_v7());
    ws.send(&user_message(
        "q1",
        &conversation,
        "/ask binary_choice:1 Should I continue or cancel?",
    ))
    .await
    .unwrap();
    let asked = ws
        .until(|m| m["type"] == "system_interaction_message")
        .await
        .unwrap();
    let prompt = asked.last().unwrap().clone();
    assert_eq!(prompt["content"]["timeout"], 1);
    // The server enforces the timeout: the client gets the prompt's error, the agent the timeout.
    let after = ws.until(is_done_after_timeout).await.unwrap();
    let error = after.iter().find(|m| m["type"] == "error_message").unwrap();
    assert_eq!(
        (
            &error["content"]["code"],
            &error["content"]["message"],
            &error["content"]["details"],
            &error["parent_id"]
        ),
        (
            &json!("workflow_error"),
            &json!("This prompt is no longer available."),
            &json!("TimeoutError"),
            &prompt["id"]
        )
    );
    assert_eq!(
        response_text(&after),
        "No answer came in time to: Should I continue or cancel?"
    );
    ws.send(&interaction(
        "late",
        &conversation,
        prompt["id"].as_str().unwrap(),
        "continue",
    ))
    .await
    .unwrap();
    let late = ws.next().await.unwrap();
    assert_eq!(
        (&late["content"]["code"], &late["content"]["message"]),
        (
            &json!("workflow_error"),
            &json!("This prompt is no longer available.")
        )
    );
}

fn is_done_after_timeout(m: &Value) -> bool {
    m["type"] == "system_response_message" && m["status"] == "completed"
}

#[tokio::test]
async fn a_client_that_reconnects_gets_what_it_missed_and_the_pending_prompt_with_its_time_left() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let conversation = format!("c-{}", uuid::Uuid::now_v7());
    let mut ws = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();
    ws.send(&user_message(
        "r1",
        &conversation,
        "/ask dropdown:120 Which one?",
    ))
    .await
    .unwrap();
    let seen = ws
        .until(|m| m["type"] == "system_response_message")
        .await
        .unwrap();
    let last_seen = seen.last().unwrap()["id"].as_str().unwrap().to_owned();
    ws.close().await.unwrap();
    // Refresh: reconnect naming the last message received.
    let mut again = WsClient::connect(
        &platform.urls.runs,
        &alice,
        &format!("?last_message_id={last_seen}"),
    )
    .await
    .unwrap();
    let missed = again
        .until(|m| m["type"] == "system_interaction_message")
        .await
        .unwrap();
    assert!(
        missed.iter().all(|m| m["id"] != last_seen.as_str()),
        "nothing repeated: {missed:?}"
    );
    let prompt = missed.last().unwrap();
    let left = prompt["content"]["timeout"].as_u64().unwrap();
    assert!(
        (1..=120).contains(&left),
        "time left, not the full timeout reset: {left}"
    );
    again
        .send(&interaction(
            "r2",
            &conversation,
            prompt["id"].as_str().unwrap(),
            "sms",
        ))
        .await
        .unwrap();
    let answered = again.until(is_done).await.unwrap();
    assert_eq!(response_text(&answered), "You answered: sms");
    // A reconnect cursor that names nobody's run is an error, not a silent empty stream.
    let mut wrong = WsClient::connect(&platform.urls.runs, &alice, "?last_message_id=nope:3")
        .await
        .unwrap();
    assert_eq!(
        wrong.next().await.unwrap()["content"]["code"],
        "invalid_message"
    );
}

async fn agui_turn(platform: &TestPlatform, token: &str, body: &Value) -> (u16, Vec<Value>, Value) {
    let response = platform
        .http
        .post(format!("{}/api/v1/agent/ag-ui", platform.urls.runs))
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    if status != 200 {
        return (
            status,
            Vec::new(),
            response.json().await.unwrap_or_default(),
        );
    }
    let frames = read_sse(response, None).await.unwrap();
    (
        status,
        frames.into_iter().map(|f| f.data).collect(),
        Value::Null,
    )
}

fn agui_body(thread: &str, run: &str, messages: Value, resume: Option<Value>) -> Value {
    let mut body = json!({"threadId": thread, "runId": run, "state": {}, "messages": messages,
                          "tools": [], "context": [], "forwardedProps": {}});
    if let Some(resume) = resume {
        body["resume"] = resume;
    }
    body
}

/// Asks over the AG-UI route (`/ask ...` as run `run`): the run's events and the interrupt's id.
async fn agui_ask(
    platform: &TestPlatform,
    token: &str,
    thread: &str,
    run: &str,
    ask: &Value,
) -> (Vec<Value>, String) {
    let (status, events, body) =
        agui_turn(platform, token, &agui_body(thread, run, ask.clone(), None)).await;
    assert_eq!(status, 200, "{body}");
    let prompt_id = events.last().unwrap()["outcome"]["interrupts"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    (events, prompt_id)
}

#[tokio::test]
async fn agui_interrupts_share_the_prompt_store_with_the_websocket_both_ways() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let thread = format!("t-{}", uuid::Uuid::now_v7());
    let ask = json!([{"id": "u1", "role": "user", "content": "/ask radio:60 Notify how?"}]);
    let (status, events, _) = agui_turn(
        &platform,
        &alice,
        &agui_body(&thread, "a1", ask.clone(), None),
    )
    .await;
    assert_eq!(status, 200);
    let finished = events.last().unwrap();
    assert_eq!(finished["type"], "RUN_FINISHED");
    assert_eq!(finished["outcome"]["type"], "interrupt");
    let interrupt = &finished["outcome"]["interrupts"][0];
    assert_eq!(
        interrupt["responseSchema"]["enum"],
        json!(["email", "sms", "push"])
    );
    assert!(interrupt["expiresAt"].as_str().is_some());
    let prompt_id = interrupt["id"].as_str().unwrap().to_owned();
    // "Refresh": the AG-UI client reads the run again and finds the interrupt.
    let again = platform
        .http
        .get(format!(
            "{}/api/v1/agent/runs/a1/events",
            platform.urls.runs
        ))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    let replay = read_sse(again, None).await.unwrap();
    assert_eq!(
        replay.last().unwrap().data["outcome"]["interrupts"][0]["id"],
        json!(prompt_id)
    );
    // Answered over the WebSocket instead.
    let mut ws = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();
    ws.send(&interaction("w1", &thread, &prompt_id, "push"))
        .await
        .unwrap();
    let answered = ws.until(is_done).await.unwrap();
    assert_eq!(response_text(&answered), "You answered: push");
    // The AG-UI answer to the same interrupt now conflicts; a wrong payload is named.
    let resume = json!([{"interruptId": prompt_id, "status": "resolved", "payload": "sms"}]);
    let (status, _, body) = agui_turn(
        &platform,
        &alice,
        &agui_body(&thread, "a2", ask.clone(), Some(resume)),
    )
    .await;
    assert_eq!(
        (status, &body["error"]["field"]),
        (409, &json!("/resume/0/interruptId")),
        "{body}"
    );

    // The other way round: asked over the WebSocket, answered with AG-UI's resume.
    ws.send(&user_message("w2", &thread, "/ask checkbox:60 Which ones?"))
        .await
        .unwrap();
    let asked = ws
        .until(|m| m["type"] == "system_interaction_message")
        .await
        .unwrap();
    let ws_prompt = asked.last().unwrap()["id"].as_str().unwrap().to_owned();
    let wrong = json!([{"interruptId": ws_prompt, "status": "resolved", "payload": ["fax"]}]);
    let (status, _, body) = agui_turn(
        &platform,
        &alice,
        &agui_body(&thread, "a3", ask.clone(), Some(wrong)),
    )
    .await;
    assert_eq!(
        (status, &body["error"]["field"]),
        (422, &json!("/resume/0/payload")),
        "{body}"
    );
    let right =
        json!([{"interruptId": ws_prompt, "status": "resolved", "payload": ["sms", "email"]}]);
    let (status, events, body) = agui_turn(
        &platform,
        &alice,
        &agui_body(&thread, "a4", ask, Some(right)),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let text = streamed_text(&events);
    assert_eq!(text, r#"You answered: ["sms","email"]"#);
    // The WebSocket that asked sees the continuation too.
    let continued = ws.until(is_done).await.unwrap();
    assert_eq!(
        response_text(&continued),
        r#"You answered: ["sms","email"]"#
    );
}

#[tokio::test]
async fn an_agui_interrupt_past_its_expiry_is_refused_and_the_agent_was_told() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let thread = format!("t-{}", uuid::Uuid::now_v7());
    let ask = json!([{"id": "u1", "role": "user", "content": "/ask text:1 Your name?"}]);
    let (_, prompt_id) = agui_ask(&platform, &alice, &thread, "x1", &ask).await;
    // The continuation the server starts at the deadline tells the agent.
    let timeout_run = format!("{prompt_id}-timeout");
    platform
        .api()
        .wait_for_status(&alice, &timeout_run, "completed")
        .await
        .unwrap();
    let response = platform
        .http
        .get(format!(
            "{}/api/v1/agent/runs/{timeout_run}/events",
            platform.urls.runs
        ))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    let told: Vec<Value> = read_sse(response, None)
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.data)
        .collect();
    assert!(
        told.iter()
            .any(|e| e["type"] == "CUSTOM" && e["name"] == "interaction_timeout"),
        "{told:?}"
    );
    let resume = json!([{"interruptId": prompt_id, "status": "resolved", "payload": "Ada"}]);
    let (status, _, body) = agui_turn(
        &platform,
        &alice,
        &agui_body(&thread, "x2", ask, Some(resume)),
    )
    .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (410, &json!("expired")),
        "{body}"
    );
    assert_eq!(
        body["error"]["message"],
        "This prompt is no longer available."
    );
}

#[tokio::test]
async fn an_answer_on_a_refused_run_leaves_the_prompt_open() {
    let platform = TestPlatform::spawn_with(Options {
        rate_per_minute: 1,
        rate_burst: 1,
        ..Options::default()
    })
    .await
    .unwrap();
    let alice = platform.infra.token("alice");
    let thread = format!("t-{}", uuid::Uuid::now_v7());
    let ask = json!([{"id": "u1", "role": "user", "content": "/ask radio:120 Notify how?"}]);
    let (_, prompt_id) = agui_ask(&platform, &alice, &thread, "q1", &ask).await;
    // The burst is spent: the answering run is refused before the prompt is touched.
    let resume = json!([{"interruptId": prompt_id, "status": "resolved", "payload": "sms"}]);
    let (status, _, body) = agui_turn(
        &platform,
        &alice,
        &agui_body(&thread, "q2", ask, Some(resume)),
    )
    .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (429, &json!("rate_limited")),
        "{body}"
    );
    let client = async_nats::connect(&platform.infra.nats_url).await.unwrap();
    let kv = async_nats::jetstream::new(client)
        .get_key_value(platform.nats.names.prompts_bucket())
        .await
        .unwrap();
    let stored = kv
        .get(protocol::interaction::prompt_key(&prompt_id))
        .await
        .unwrap()
        .unwrap();
    let record: Value = serde_json::from_slice(&stored).unwrap();
    assert_eq!(record["status"], "pending", "{record}");
}

#[tokio::test]
async fn inline_and_foreign_images_and_unknown_schema_types_are_refused_naming_why() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let mut ws = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();
    let conversation = format!("c-{}", uuid::Uuid::now_v7());
    let with_image = |id: &str, url: &str| {
        json!({
            "type": "user_message", "schema_type": "string", "id": id, "conversation_id": conversation,
            "content": {"messages": [{"role": "user", "content": [
                {"type": "text", "text": "what is in this picture?"},
                {"type": "image_url", "image_url": {"url": url}}]}]},
            "timestamp": "2025-01-13T10:00:00Z"
        })
    };
    // An inline image: refused by the parser, saying to upload it first.
    ws.send(&with_image("inline", "data:image/png;base64,iVBORw0KGgo="))
        .await
        .unwrap();
    let refused = ws.next().await.unwrap();
    assert_eq!(refused["type"], "error_message", "{refused}");
    assert_eq!(refused["content"]["code"], "invalid_data_content");
    assert!(
        refused["content"]["message"]
            .as_str()
            .unwrap()
            .contains("upload"),
        "{refused}"
    );
    // A public https image: never fetched; admission says which URLs are accepted.
    ws.send(&with_image("public", "https://example.com/cat.png"))
        .await
        .unwrap();
    let refused = ws.next().await.unwrap();
    assert_eq!(refused["content"]["code"], "invalid_data_content");
    assert!(
        refused["content"]["message"]
            .as_str()
            .unwrap()
            .contains("s3:// content_url"),
        "{refused}"
    );
    // A response schema the server does not have.
    let mut typed = user_message("typed", &conversation, "hi");
    typed["schema_type"] = json!("json_schema");
    ws.send(&typed).await.unwrap();
    let refused = ws.next().await.unwrap();
    assert_eq!(
        (&refused["content"]["code"], &refused["content"]["details"]),
        (&json!("invalid_message"), &json!("schema_type"))
    );
    // Nothing was started for them, and the connection still works.
    for run in ["inline", "public", "typed"] {
        let (status, _) = platform
            .api()
            .get_runs(&alice, &format!("/api/v1/agent/runs/{run}"))
            .await
            .unwrap();
        assert_eq!(status, 404, "no run {run}");
    }
    ws.send(&user_message("fine", &conversation, "still here"))
        .await
        .unwrap();
    let answered = ws.until(is_done).await.unwrap();
    assert_eq!(response_text(&answered), "You said: still here");
}
