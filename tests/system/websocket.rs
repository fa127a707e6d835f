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
            &json!("q1")
        )
    );
    // The error names the prompt by its id; its parent is the user message, like the reply's.
    assert_eq!(
        error["id"],
        json!(format!("{}-timeout", prompt["id"].as_str().unwrap()))
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

/// A `user_message` as the NeMo Agent Toolkit UI sends it (`components/Chat/Chat.tsx`,
/// `handleSend`, its chat history on): the schema type of its settings, a uuid, the
/// conversation's id, the conversation so far as text parts, a timestamp.
fn nemo_ui_message(schema_type: &str, id: &str, conversation: &str, text: &str) -> Value {
    json!({
        "type": "user_message", "schema_type": schema_type, "id": id,
        "conversation_id": conversation,
        "content": {"messages": [
            {"role": "user", "content": [{"type": "text", "text": "Hello"}]},
            {"role": "assistant", "content": [{"type": "text", "text": ""}]},
            {"role": "user", "content": [{"type": "text", "text": text}]}
        ]},
        "timestamp": "2026-07-01T09:30:00.123Z"
    })
}

/// The NeMo UI's answer to the prompt `prompt` (`handleUserInteraction`): no schema type, the
/// prompt's `thread_id` and `parent_id` (the user message's id, not the prompt's).
fn nemo_ui_answer(id: &str, prompt: &Value, answer: &str) -> Value {
    json!({
        "type": "user_interaction_message", "id": id,
        "conversation_id": prompt["conversation_id"], "thread_id": prompt["thread_id"],
        "parent_id": prompt["parent_id"],
        "content": {"messages": [{"role": "user", "content": [{"type": "text", "text": answer}]}]},
        "timestamp": "2026-07-01T09:30:05.456Z"
    })
}

/// The end of a response as the NeMo UI waits for it (`types/websocket.ts`,
/// `isSystemResponseComplete`).
fn is_complete(message: &Value) -> bool {
    message["type"] == "system_response_message" && message["status"] == "complete"
}

/// The statuses among `messages`.
fn statuses(messages: &[Value]) -> BTreeSet<String> {
    messages
        .iter()
        .filter_map(|m| m["status"].as_str())
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn a_nemo_ui_socket_gets_a_streamed_reply_that_ends_with_the_toolkits_complete() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let mut ws = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();
    let conversation = uuid::Uuid::new_v4().to_string();
    let id = uuid::Uuid::new_v4().to_string();
    ws.send(&nemo_ui_message(
        "chat_stream",
        &id,
        &conversation,
        "what can you do",
    ))
    .await
    .unwrap();
    let reply = ws.until(is_complete).await.unwrap();
    assert_eq!(response_text(&reply), "You said: what can you do");
    let tokens = reply
        .iter()
        .filter(|m| m["type"] == "system_response_message" && m["status"] == "in_progress")
        .count();
    assert!(tokens >= 2, "streamed, word by word: {reply:?}");
    assert_eq!(
        statuses(&reply),
        BTreeSet::from(["in_progress".to_owned(), "complete".to_owned()]),
        "only the toolkit's statuses: {reply:?}"
    );
    for message in &reply {
        assert_eq!(
            (&message["conversation_id"], &message["parent_id"]),
            (&json!(conversation), &json!(id)),
            "the UI keeps what names its conversation and message: {message}"
        );
    }

    // The other three schema types of the UI's settings are answered the same way.
    for (i, schema_type) in ["chat", "generate_stream", "generate"].iter().enumerate() {
        ws.send(&nemo_ui_message(
            schema_type,
            &format!("{id}-{i}"),
            &conversation,
            "again",
        ))
        .await
        .unwrap();
        let reply = ws.until(is_complete).await.unwrap();
        assert_eq!(response_text(&reply), "You said: again", "{schema_type}");
        assert!(
            !statuses(&reply).contains("completed"),
            "{schema_type}: {reply:?}"
        );
    }

    // A tool step ends `complete` too.
    ws.send(&nemo_ui_message(
        "chat_stream",
        "tool-turn",
        &conversation,
        "/tool lookup {\"q\":1}",
    ))
    .await
    .unwrap();
    let tools = ws.until(is_complete).await.unwrap();
    let steps: Vec<&Value> = tools
        .iter()
        .filter(|m| m["type"] == "system_intermediate_message")
        .collect();
    assert_eq!(steps.last().unwrap()["status"], "complete", "{tools:?}");

    // A failed run: the error (in_progress, as the toolkit sends it), then the end of the
    // response, without which the UI would go on "generating".
    ws.send(&nemo_ui_message(
        "chat_stream",
        "fail-turn",
        &conversation,
        "/fail",
    ))
    .await
    .unwrap();
    let failed = ws.until(is_complete).await.unwrap();
    let error = failed
        .iter()
        .find(|m| m["type"] == "error_message")
        .unwrap();
    assert_eq!(
        (&error["content"]["code"], &error["status"]),
        (&json!("workflow_error"), &json!("in_progress"))
    );
    assert_eq!(failed.last().unwrap()["parent_id"], "fail-turn");

    // A turn refused before any run starts ends the same way.
    let mut inline = nemo_ui_message("chat_stream", "refused-turn", &conversation, "look");
    inline["content"]["messages"][2]["content"] = json!([{"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]);
    ws.send(&inline).await.unwrap();
    let refused = ws.until(is_complete).await.unwrap();
    assert_eq!(
        refused
            .iter()
            .map(|m| (m["type"].as_str().unwrap(), m["status"].as_str().unwrap()))
            .collect::<Vec<_>>(),
        [
            ("error_message", "in_progress"),
            ("system_response_message", "complete")
        ],
        "{refused:?}"
    );
    assert_eq!(refused[0]["content"]["code"], "invalid_data_content");
    assert!(
        refused
            .iter()
            .all(|m| m["conversation_id"] == conversation.as_str()
                && m["parent_id"] == "refused-turn"),
        "{refused:?}"
    );
}

#[tokio::test]
async fn a_seed_socket_keeps_the_seeds_completed_and_the_dialect_is_per_socket() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let mut seed = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();
    let mut nemo = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();
    let conversation = format!("c-{}", uuid::Uuid::now_v7());
    let other = format!("c-{}", uuid::Uuid::now_v7());
    nemo.send(&nemo_ui_message("chat_stream", "n1", &other, "toolkit"))
        .await
        .unwrap();
    // Meanwhile, on another socket, the seed's schema type and none.
    seed.send(&user_message("s1", &conversation, "seed"))
        .await
        .unwrap();
    let reply = seed.until(is_done).await.unwrap();
    assert_eq!(response_text(&reply), "You said: seed");
    assert_eq!(reply.last().unwrap()["status"], "completed");
    assert!(!statuses(&reply).contains("complete"), "{reply:?}");
    let mut untyped = user_message("s2", &conversation, "untyped");
    untyped.as_object_mut().unwrap().remove("schema_type");
    seed.send(&untyped).await.unwrap();
    let reply = seed.until(is_done).await.unwrap();
    assert_eq!(reply.last().unwrap()["status"], "completed");
    seed.send(&user_message("s3", &conversation, "/fail"))
        .await
        .unwrap();
    let failed = seed.until(is_done).await.unwrap();
    assert_eq!(
        (
            &failed.last().unwrap()["type"],
            &failed.last().unwrap()["status"]
        ),
        (&json!("error_message"), &json!("failed")),
        "the seed's error ends the turn on its own"
    );

    let reply = nemo.until(is_complete).await.unwrap();
    assert_eq!(response_text(&reply), "You said: toolkit");
    // The latest user message decides: the same socket back on the seed's schema type.
    nemo.send(&user_message("n2", &other, "seed now"))
        .await
        .unwrap();
    let reply = nemo.until(is_done).await.unwrap();
    assert_eq!(
        (
            response_text(&reply).as_str(),
            &reply.last().unwrap()["status"]
        ),
        ("You said: seed now", &json!("completed"))
    );
}

#[tokio::test]
async fn a_prompt_answered_with_its_parent_id_as_the_nemo_ui_does_continues_the_run() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let mut ws = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();
    let conversation = uuid::Uuid::new_v4().to_string();
    let asking = uuid::Uuid::new_v4().to_string();
    ws.send(&nemo_ui_message(
        "chat_stream",
        &asking,
        &conversation,
        "/ask radio:120 Please select your preferred notification method:",
    ))
    .await
    .unwrap();
    let asked = ws
        .until(|m| m["type"] == "system_interaction_message")
        .await
        .unwrap();
    assert!(
        !asked.iter().any(is_complete),
        "not complete while a question waits: {asked:?}"
    );
    let prompt = asked.last().unwrap().clone();
    assert_eq!(
        (&prompt["parent_id"], &prompt["status"]),
        (&json!(asking), &json!("in_progress"))
    );
    assert_ne!(prompt["id"], prompt["parent_id"]);
    // The radio's Submit sends the chosen option's value, naming the user message.
    ws.send(&nemo_ui_answer("answer-1", &prompt, "sms"))
        .await
        .unwrap();
    let answered = ws.until(is_complete).await.unwrap();
    assert_eq!(response_text(&answered), "You answered: sms");
    assert!(
        answered.iter().all(|m| m["type"] != "error_message"),
        "{answered:?}"
    );
    // A second answer the same way finds the prompt answered.
    ws.send(&nemo_ui_answer("answer-2", &prompt, "email"))
        .await
        .unwrap();
    let again = ws.next().await.unwrap();
    assert_eq!(
        (
            &again["type"],
            &again["content"]["code"],
            &again["content"]["message"],
            &again["parent_id"]
        ),
        (
            &json!("error_message"),
            &json!("invalid_message"),
            &json!("this prompt was already answered"),
            &prompt["id"]
        ),
        "{again}"
    );

    // A seed client may name the prompt by its parent_id too.
    let mut seed = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();
    let thread = format!("c-{}", uuid::Uuid::now_v7());
    seed.send(&user_message("k1", &thread, "/ask binary_choice Go on?"))
        .await
        .unwrap();
    let asked = seed
        .until(|m| m["type"] == "system_interaction_message")
        .await
        .unwrap();
    assert_eq!(asked.last().unwrap()["parent_id"], "k1");
    seed.send(&interaction("k2", &thread, "k1", "continue"))
        .await
        .unwrap();
    let answered = seed.until(is_done).await.unwrap();
    assert_eq!(
        (
            response_text(&answered).as_str(),
            &answered.last().unwrap()["status"]
        ),
        ("You answered: continue", &json!("completed"))
    );
}

#[tokio::test]
async fn a_socket_opened_with_the_toolkits_conversation_id_speaks_the_toolkits_values_at_once() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let mut asking_socket = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();
    let conversation = uuid::Uuid::new_v4().to_string();
    let asking = uuid::Uuid::new_v4().to_string();
    asking_socket
        .send(&nemo_ui_message(
            "chat_stream",
            &asking,
            &conversation,
            "/ask text:120 Your name?",
        ))
        .await
        .unwrap();
    let asked = asking_socket
        .until(|m| m["type"] == "system_interaction_message")
        .await
        .unwrap();
    let prompt = asked.last().unwrap().clone();
    asking_socket.close().await.unwrap();
    // The UI reloaded: it reconnects with the toolkit's parameter and answers before it sends
    // any schema_type; the continuation ends with the toolkit's `complete`, not `completed`.
    let mut reloaded = WsClient::connect(
        &platform.urls.runs,
        &alice,
        &format!("?conversation_id={conversation}"),
    )
    .await
    .unwrap();
    let mut by_id = prompt.clone();
    by_id["parent_id"] = prompt["id"].clone();
    reloaded
        .send(&nemo_ui_answer("answer-1", &by_id, "Ada"))
        .await
        .unwrap();
    let answered = reloaded
        .until(|m| m["type"] == "system_response_message" && m["status"] != "in_progress")
        .await
        .unwrap();
    assert!(answered.last().is_some_and(is_complete), "{answered:?}");
    assert_eq!(response_text(&answered), "You answered: Ada");
}
