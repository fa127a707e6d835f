//! The WebSocket as clients come back to it: a run continued after an answer or a timeout keeps
//! the user message's id as `parent_id`; a reconnect naming the prompt it last saw, or the
//! conversation (the NeMo Agent Toolkit UI's `?conversation_id=`), is shown the waiting prompt
//! again and its answer completes the run; a conversation with an active run is shown that run;
//! a client without headers authenticates with its first message's `security.token`; a prompt
//! that is not required can be skipped; and the chat-messages document's `POST
//! /api/v1/agent/run`.

use serde_json::{Value, json};
use switchboard_system_tests::{
    EVENTUAL, TestPlatform, WsClient, text_run, ws_done as is_done, ws_reply_text as reply_text,
};

/// A seed `user_message` (`schema_type` as given: `string` is the seed's, `chat_stream` the
/// NeMo UI's).
fn user_message(id: &str, conversation: &str, text: &str, schema_type: &str) -> Value {
    json!({
        "type": "user_message", "schema_type": schema_type, "id": id,
        "conversation_id": conversation,
        "content": {"messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]},
        "timestamp": "2025-01-13T10:00:00Z"
    })
}

/// A `user_interaction_message` answering `parent_id` (a prompt's id, or, as the NeMo UI
/// sends, the prompt's own `parent_id`).
fn answer(id: &str, conversation: &str, parent_id: &str, text: &str, schema_type: &str) -> Value {
    json!({
        "type": "user_interaction_message", "schema_type": schema_type, "id": id,
        "thread_id": conversation, "parent_id": parent_id, "conversation_id": conversation,
        "content": {"messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]},
        "timestamp": "2025-01-13T10:00:04Z"
    })
}

fn is_prompt(message: &Value) -> bool {
    message["type"] == "system_interaction_message"
}

/// The NeMo UI's end of a response: the toolkit's `complete`.
fn is_complete(message: &Value) -> bool {
    message["type"] == "system_response_message" && message["status"] == "complete"
        || message["type"] == "error_message"
}

fn conversation() -> String {
    format!("c-{}", uuid::Uuid::now_v7())
}

#[tokio::test]
async fn a_run_continued_after_an_answer_or_a_timeout_answers_the_same_user_message() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let c = conversation();
    let mut ws = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();

    ws.send(&user_message("m1", &c, "/ask text Why?", "string"))
        .await
        .unwrap();
    let asked = ws.until(is_prompt).await.unwrap();
    let prompt = asked.last().unwrap();
    assert_eq!(prompt["parent_id"], "m1");
    ws.send(&answer(
        "a1",
        &c,
        prompt["id"].as_str().unwrap(),
        "because",
        "string",
    ))
    .await
    .unwrap();
    let answered = ws.until(is_done).await.unwrap();
    assert_eq!(reply_text(&answered), "You answered: because");
    for message in &answered {
        assert_eq!(message["parent_id"], "m1", "{message}");
    }

    // Not answered in time: the timeout's error and the agent's reply, under the question's
    // user message too.
    ws.send(&user_message(
        "m2",
        &c,
        "/ask text:1 Still there?",
        "string",
    ))
    .await
    .unwrap();
    let asked = ws.until(is_prompt).await.unwrap();
    assert_eq!(asked.last().unwrap()["parent_id"], "m2");
    let timed_out = ws
        .until(|m| m["type"] == "system_response_message" && m["status"] == "completed")
        .await
        .unwrap();
    assert!(
        timed_out.iter().any(|m| m["type"] == "error_message"),
        "{timed_out:#?}"
    );
    assert_eq!(
        reply_text(&timed_out),
        "No answer came in time to: Still there?"
    );
    for message in &timed_out {
        assert_eq!(message["parent_id"], "m2", "{message}");
    }
}

#[tokio::test]
async fn a_client_back_with_the_prompts_id_is_shown_the_prompt_again_and_its_answer_completes() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let c = conversation();
    let mut ws = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();
    ws.send(&user_message(
        "m1",
        &c,
        "/ask radio:300 Notify how?",
        "string",
    ))
    .await
    .unwrap();
    let prompt = ws.until(is_prompt).await.unwrap().pop().unwrap();
    let prompt_id = prompt["id"].as_str().unwrap().to_owned();
    ws.close().await.unwrap();

    let mut back = WsClient::connect(
        &platform.urls.runs,
        &alice,
        &format!("?last_message_id={prompt_id}"),
    )
    .await
    .unwrap();
    let again = back.next().await.unwrap();
    assert_eq!(again["type"], "system_interaction_message");
    assert_eq!(again["id"], prompt_id);
    assert_eq!(again["parent_id"], "m1");
    assert_eq!(again["content"]["input_type"], "radio");
    let left = again["content"]["timeout"].as_u64().unwrap();
    assert!((1..=300).contains(&left), "the time it has left: {left}");
    back.send(&answer("a1", &c, &prompt_id, "sms", "string"))
        .await
        .unwrap();
    let answered = back.until(is_done).await.unwrap();
    assert_eq!(reply_text(&answered), "You answered: sms");

    // Once answered, the same id brings the run that continued it.
    let mut later = WsClient::connect(
        &platform.urls.runs,
        &alice,
        &format!("?last_message_id={prompt_id}"),
    )
    .await
    .unwrap();
    let replayed = later.until(is_done).await.unwrap();
    assert!(replayed.iter().all(|m| !is_prompt(m)), "{replayed:#?}");
    assert_eq!(reply_text(&replayed), "You answered: sms");

    // An id that is no message of the caller's: refused at the upgrade.
    let bob = platform.infra.token("bob");
    for query in [
        format!("?last_message_id={prompt_id}"),
        "?last_message_id=nope".to_owned(),
    ] {
        let refused = WsClient::connect(&platform.urls.runs, &bob, &query).await;
        assert!(refused.is_err(), "{query}");
    }
}

#[tokio::test]
async fn the_nemo_ui_back_on_a_conversation_is_shown_its_waiting_prompt_or_its_running_reply() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let c = conversation();
    let mut ws = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();
    ws.send(&user_message(
        "m1",
        &c,
        "/ask binary_choice Continue?",
        "chat_stream",
    ))
    .await
    .unwrap();
    ws.until(is_prompt).await.unwrap();
    ws.close().await.unwrap();

    // A reload: the UI reconnects with the conversation and is asked again.
    let query = format!("?conversation_id={c}");
    let mut back = WsClient::connect(&platform.urls.runs, &alice, &query)
        .await
        .unwrap();
    let again = back.next().await.unwrap();
    assert_eq!(again["type"], "system_interaction_message");
    assert_eq!(again["parent_id"], "m1");
    assert_eq!(again["content"]["input_type"], "binary_choice");
    // The UI answers with the prompt's parent_id (the user message's) and its schema type.
    back.send(&answer("a1", &c, "m1", "continue", "chat_stream"))
        .await
        .unwrap();
    let answered = back.until(is_complete).await.unwrap();
    assert_eq!(
        answered.last().unwrap()["status"],
        "complete",
        "{answered:#?}"
    );
    assert_eq!(reply_text(&answered), "You answered: continue");
    assert!(
        answered.iter().all(|m| m["parent_id"] == "m1"),
        "{answered:#?}"
    );

    // A reload while a reply streams: the reply from its start, to its end.
    let words = "one two three four five six";
    back.send(&user_message(
        "m2",
        &c,
        &format!("/slow {words}"),
        "chat_stream",
    ))
    .await
    .unwrap();
    let first = back
        .until(|m| m["type"] == "system_response_message")
        .await
        .unwrap();
    assert!(!first.is_empty());
    let mut reloaded = WsClient::connect(&platform.urls.runs, &alice, &query)
        .await
        .unwrap();
    let streamed = reloaded.until(is_complete).await.unwrap();
    assert_eq!(reply_text(&streamed), format!("You said: /slow {words}"));
    assert!(
        streamed.iter().all(|m| m["parent_id"] == "m2"),
        "{streamed:#?}"
    );

    // An idle conversation: nothing is sent; the socket serves new turns.
    let mut idle = WsClient::connect(&platform.urls.runs, &alice, &query)
        .await
        .unwrap();
    back.until(is_complete).await.unwrap();
    idle.send(&user_message("m3", &c, "and now?", "chat_stream"))
        .await
        .unwrap();
    let turn = idle.until(is_complete).await.unwrap();
    assert_eq!(reply_text(&turn), "You said: and now?");
    assert!(turn.iter().all(|m| m["parent_id"] == "m3"), "{turn:#?}");
}

/// A WebSocket opened without any token (a client that cannot set headers).
struct Anonymous(
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
);

impl Anonymous {
    async fn connect(runs_url: &str) -> Self {
        let url = format!("{}/websocket", runs_url.replacen("http", "ws", 1));
        Self(tokio_tungstenite::connect_async(url).await.unwrap().0)
    }

    async fn send(&mut self, message: &Value) {
        use futures::SinkExt as _;
        self.0
            .send(tokio_tungstenite::tungstenite::Message::text(
                message.to_string(),
            ))
            .await
            .unwrap();
    }

    /// The next JSON message, or `None` once the server closed the connection.
    async fn next(&mut self) -> Option<Value> {
        use futures::StreamExt as _;
        loop {
            let frame = tokio::time::timeout(EVENTUAL, self.0.next())
                .await
                .expect("an answer in time");
            match frame {
                Some(Ok(tokio_tungstenite::tungstenite::Message::Text(text))) => {
                    return Some(serde_json::from_str(text.as_str()).unwrap());
                }
                Some(Ok(tokio_tungstenite::tungstenite::Message::Close(_)))
                | None
                | Some(Err(_)) => {
                    return None;
                }
                Some(Ok(_)) => {}
            }
        }
    }
}

#[tokio::test]
async fn a_client_without_headers_authenticates_with_its_first_messages_security_token() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let c = conversation();

    let mut socket = Anonymous::connect(&platform.urls.runs).await;
    let mut first = user_message("m1", &c, "hello without headers", "string");
    first["security"] = json!({"api_key": "", "token": alice});
    socket.send(&first).await;
    let mut got = Vec::new();
    while let Some(message) = socket.next().await {
        let done = is_done(&message);
        got.push(message);
        if done {
            break;
        }
    }
    assert_eq!(reply_text(&got), "You said: hello without headers");
    // The second message needs no token: the connection is alice's.
    socket
        .send(&user_message("m2", &c, "again", "string"))
        .await;
    let mut again = Vec::new();
    while let Some(message) = socket.next().await {
        let done = is_done(&message);
        again.push(message);
        if done {
            break;
        }
    }
    assert_eq!(reply_text(&again), "You said: again");
    // The run is alice's.
    let (status, _) = platform
        .api()
        .get_runs(&alice, "/api/v1/agent/runs/m1")
        .await
        .unwrap();
    assert_eq!(status, 200);

    // A wrong token, or none: an error, then the connection is closed unserved.
    for security in [json!({"token": "not-a-token"}), json!({})] {
        let mut socket = Anonymous::connect(&platform.urls.runs).await;
        let mut message = user_message("x1", &c, "let me in", "string");
        message["security"] = security.clone();
        socket.send(&message).await;
        let refusal = socket.next().await.expect("an error before the close");
        assert_eq!(refusal["type"], "error_message", "{security}: {refusal}");
        assert_eq!(refusal["content"]["details"], "security.token");
        assert_eq!(socket.next().await, None, "{security}: closed");
    }
    let (status, _) = platform
        .api()
        .get_runs(&alice, "/api/v1/agent/runs/x1")
        .await
        .unwrap();
    assert_eq!(status, 404, "nothing was started");
}

#[tokio::test]
async fn a_prompt_that_is_not_required_can_be_skipped_and_one_that_is_cannot() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let c = conversation();
    let mut ws = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();

    ws.send(&user_message("m1", &c, "/ask radio Pick one", "string"))
        .await
        .unwrap();
    let required = ws.until(is_prompt).await.unwrap().pop().unwrap();
    assert_eq!(required["content"]["required"], true);
    ws.send(&answer(
        "a1",
        &c,
        required["id"].as_str().unwrap(),
        "",
        "string",
    ))
    .await
    .unwrap();
    let refused = ws.next().await.unwrap();
    assert_eq!(refused["type"], "error_message", "{refused}");

    ws.send(&user_message(
        "m2",
        &c,
        "/ask radio? Pick one if you like",
        "string",
    ))
    .await
    .unwrap();
    let optional = ws.until(is_prompt).await.unwrap().pop().unwrap();
    assert_eq!(optional["content"]["required"], false);
    ws.send(&answer(
        "a2",
        &c,
        optional["id"].as_str().unwrap(),
        "",
        "string",
    ))
    .await
    .unwrap();
    let skipped = ws.until(is_done).await.unwrap();
    assert_eq!(reply_text(&skipped), "You skipped the question.");
    assert!(
        skipped.iter().all(|m| m["parent_id"] == "m2"),
        "{skipped:#?}"
    );
}

#[tokio::test]
async fn post_api_v1_agent_run_serves_the_same_contract_as_runs() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let thread = uuid::Uuid::new_v4().to_string();
    let post = |path: &'static str, body: Value| {
        let request = platform
            .http
            .post(format!("{}{path}", platform.urls.runs))
            .bearer_auth(&alice)
            .json(&body);
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    let (status, accepted) = post("/api/v1/agent/run", text_run(&thread, "r1", "hi")).await;
    assert_eq!(status, 202, "{accepted}");
    assert_eq!(accepted["runId"], "r1");
    // A retry on the other path is the same run.
    let (status, again) = post("/api/v1/agent/runs", text_run(&thread, "r1", "hi")).await;
    assert_eq!(status, 202);
    assert_eq!(again["taskId"], accepted["taskId"]);
    // The seed's rules, the same refusals.
    let mut bad = text_run(&thread, "r2", "hi");
    bad["threadId"] = json!("not-a-uuid");
    let (status, refused) = post("/api/v1/agent/run", bad.clone()).await;
    let (status_runs, refused_runs) = post("/api/v1/agent/runs", bad).await;
    assert_eq!((status, &refused), (status_runs, &refused_runs));
    assert_eq!(status, 422, "{refused}");
}
