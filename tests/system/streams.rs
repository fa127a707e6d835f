//! The run's event log as clients read it: AG-UI over SSE on `POST /api/v1/agent/runs`,
//! `GET /api/v1/agent/runs/{runId}/events` with `Last-Event-ID` resume on another replica, the
//! answer for a cursor older than retention, and the AG-UI conversation route.

use serde_json::{Value, json};
use switchboard_system_tests::{
    Options, SseFrame, TestPlatform, WsClient, read_sse, streamed_text, text_run,
};

fn thread() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// The AG-UI event order rules a client verifier checks: `RUN_STARTED` first, every message and
/// tool call started before its content and ended once, exactly one terminal event, last.
fn assert_agui_order(events: &[Value]) {
    assert_eq!(
        events.first().map(|e| &e["type"]),
        Some(&json!("RUN_STARTED")),
        "{events:?}"
    );
    let mut open = std::collections::HashSet::new();
    for (i, event) in events.iter().enumerate() {
        let kind = event["type"].as_str().unwrap();
        let terminal = matches!(kind, "RUN_FINISHED" | "RUN_ERROR");
        assert_eq!(
            terminal,
            i == events.len() - 1,
            "terminal event only last: {events:?}"
        );
        match kind {
            "TEXT_MESSAGE_START" => assert!(open.insert(event["messageId"].to_string())),
            "TEXT_MESSAGE_CONTENT" => assert!(open.contains(&event["messageId"].to_string())),
            "TEXT_MESSAGE_END" => assert!(open.remove(&event["messageId"].to_string())),
            "TOOL_CALL_START" => assert!(open.insert(event["toolCallId"].to_string())),
            "TOOL_CALL_ARGS" => assert!(open.contains(&event["toolCallId"].to_string())),
            "TOOL_CALL_END" => assert!(open.remove(&event["toolCallId"].to_string())),
            _ => {}
        }
    }
    assert!(open.is_empty(), "everything started was ended: {open:?}");
}

fn ids(frames: &[SseFrame]) -> Vec<u64> {
    frames
        .iter()
        .map(|f| f.id.as_deref().unwrap().parse().unwrap())
        .collect()
}

#[tokio::test]
async fn posting_a_run_with_accept_event_stream_streams_its_events_in_agui_order() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let thread = thread();
    let response = platform
        .http
        .post(format!("{}/api/v1/agent/runs", platform.urls.runs))
        .bearer_auth(&alice)
        .header("accept", "text/event-stream")
        .json(&text_run(&thread, "sse-run", "hello there"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let frames = read_sse(response, None).await.unwrap();
    let events: Vec<Value> = frames.iter().map(|f| f.data.clone()).collect();
    assert_agui_order(&events);
    assert_eq!(ids(&frames), (1..=frames.len() as u64).collect::<Vec<_>>());
    let text = streamed_text(&events);
    assert_eq!(text, "You said: hello there");
    assert_eq!(
        events.last().unwrap(),
        &json!({"type": "RUN_FINISHED", "threadId": thread, "runId": "sse-run"})
    );
}

#[tokio::test]
async fn a_stream_cut_mid_run_resumes_on_another_replica_with_nothing_lost_or_repeated() {
    let platform = TestPlatform::spawn().await.unwrap();
    let (replica, _stop) = platform.spawn_runs_replica().await.unwrap();
    let alice = platform.infra.token("alice");
    let thread = thread();
    let words: Vec<String> = (0..12).map(|i| format!("w{i}")).collect();
    let (status, _) = platform
        .api()
        .post_run(
            &alice,
            &text_run(&thread, "cut", &format!("/slow {}", words.join(" "))),
        )
        .await
        .unwrap();
    assert_eq!(status, 202);
    // First replica: read a few events of the running run, then hang up.
    let first = platform
        .http
        .get(format!(
            "{}/api/v1/agent/runs/cut/events",
            platform.urls.runs
        ))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    let before = read_sse(first, Some(4)).await.unwrap();
    assert_eq!(ids(&before), [1, 2, 3, 4]);
    let cursor = before.last().unwrap().id.clone().unwrap();
    // Second replica: resume after the last event received (every event as stored: the
    // halves are compared event by event; compacted resumes are tests/system/replay.rs's).
    let second = platform
        .http
        .get(format!(
            "{replica}/api/v1/agent/runs/cut/events?compact=false"
        ))
        .bearer_auth(&alice)
        .header("last-event-id", &cursor)
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), 200);
    let after = read_sse(second, None).await.unwrap();
    let mut joined = before.clone();
    joined.extend(after);
    assert_eq!(
        ids(&joined),
        (1..=joined.len() as u64).collect::<Vec<_>>(),
        "no gap, no repeat"
    );
    let events: Vec<Value> = joined.iter().map(|f| f.data.clone()).collect();
    assert_agui_order(&events);
    // The whole log, read afresh once the run ended, is exactly what the two halves gave.
    let whole = platform
        .http
        .get(format!(
            "{replica}/api/v1/agent/runs/cut/events?compact=false"
        ))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(read_sse(whole, None).await.unwrap(), joined);
}

#[tokio::test]
async fn a_cursor_past_retention_gets_410_and_bad_cursors_and_strangers_are_refused() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let thread = thread();
    let (status, accepted) = platform
        .api()
        .post_run(&alice, &text_run(&thread, "old", "hi"))
        .await
        .unwrap();
    assert_eq!(status, 202);
    platform
        .api()
        .wait_for_status(&alice, "old", "completed")
        .await
        .unwrap();
    let url = format!("{}/api/v1/agent/runs/old/events", platform.urls.runs);
    let get = |cursor: Option<&str>, token: &str| {
        let mut request = platform.http.get(&url).bearer_auth(token);
        if let Some(cursor) = cursor {
            request = request.header("last-event-id", cursor);
        }
        request.send()
    };
    let (response, bob) = (
        get(Some("x1"), &alice).await.unwrap(),
        platform.infra.token("bob"),
    );
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["field"], "Last-Event-ID");
    assert_eq!(
        get(None, &bob).await.unwrap().status(),
        404,
        "another owner's run"
    );
    assert_eq!(
        platform.http.get(&url).send().await.unwrap().status(),
        401,
        "no token"
    );
    // Retention drops a run's events: purge them as the stream's max_age would.
    let client = async_nats::connect(&platform.infra.nats_url).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let mut stream = js
        .get_stream(platform.nats.names.run_events_stream())
        .await
        .unwrap();
    let task = accepted["taskId"].as_str().unwrap();
    stream
        .purge()
        .filter(platform.nats.names.run_event_subject(task.parse().unwrap()))
        .await
        .unwrap();
    let _ = stream.info().await.unwrap();
    for cursor in [None, Some("2")] {
        let response = get(cursor, &alice).await.unwrap();
        assert_eq!(response.status(), 410, "cursor {cursor:?}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "expired");
    }
}

#[tokio::test]
async fn the_agui_route_takes_a_resent_conversation_and_keeps_each_message_once() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let thread = "any-thread-id"; // AG-UI allows any string
    let route = format!("{}/api/v1/agent/ag-ui", platform.urls.runs);
    let post = |body: Value| {
        platform
            .http
            .post(&route)
            .bearer_auth(&alice)
            .header("accept", "text/event-stream")
            .json(&body)
            .send()
    };
    let turn = |run: &str, messages: Value| {
        json!({"threadId": thread, "runId": run, "state": {}, "messages": messages,
               "tools": [], "context": [], "forwardedProps": {}})
    };
    let first = read_sse(
        post(turn(
            "t1",
            json!([{"id": "u1", "role": "user", "content": "one"}]),
        ))
        .await
        .unwrap(),
        None,
    )
    .await
    .unwrap();
    let reply_id = first
        .iter()
        .find(|f| f.data["type"] == "TEXT_MESSAGE_START")
        .map(|f| f.data["messageId"].clone())
        .unwrap();
    let conversation = json!([
        {"id": "u1", "role": "user", "content": "one"},
        {"id": reply_id, "role": "assistant", "content": "You said: one"},
        {"id": "u2", "role": "user", "content": "two"}
    ]);
    let second = read_sse(post(turn("t2", conversation)).await.unwrap(), None)
        .await
        .unwrap();
    let text = streamed_text(second.iter().map(|f| &f.data));
    assert_eq!(text, "You said: two", "the new turn is the last message");
    let history = platform
        .api()
        .wait_for_history(&alice, thread, |h| {
            h["messages"]
                .as_array()
                .is_some_and(|m| m.len() >= 4 && m.last().unwrap()["content"] == "You said: two")
        })
        .await
        .unwrap();
    let kept: Vec<(&str, &str)> = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kept,
        [
            ("user", "one"),
            ("assistant", "You said: one"),
            ("user", "two"),
            ("assistant", "You said: two")
        ]
    );
    // The seed route still refuses a resent conversation, with the seed's message.
    let mut resent = text_run(&uuid::Uuid::new_v4().to_string(), "r", "a");
    resent["messages"] = json!([
        {"id": "a", "role": "user", "content": "a"},
        {"id": "b", "role": "user", "content": "b"}
    ]);
    let (status, body) = platform.api().post_run(&alice, &resent).await.unwrap();
    assert_eq!(
        (status, &body["error"]["field"]),
        (422, &json!("/messages"))
    );
    // The conversation route names what is wrong too.
    let response = post(turn(
        "t3",
        json!([{"id": "x", "role": "assistant", "content": "hi"}]),
    ))
    .await
    .unwrap();
    assert_eq!(response.status(), 422);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["field"], "/messages");
}

#[tokio::test]
async fn an_owner_may_hold_only_so_many_open_streams_and_a_closed_one_frees_its_place() {
    let platform = TestPlatform::spawn_with(Options {
        max_streams_per_owner: 2,
        ..Options::default()
    })
    .await
    .unwrap();
    let (alice, bob) = (platform.infra.token("alice"), platform.infra.token("bob"));
    let thread = thread();
    let (status, _) = platform
        .api()
        .post_run(
            &alice,
            &text_run(&thread, "held", "/slow a b c d e f g h i j k l m n o p"),
        )
        .await
        .unwrap();
    assert_eq!(status, 202);
    let open = |token: &str| {
        platform
            .http
            .get(format!(
                "{}/api/v1/agent/runs/held/events",
                platform.urls.runs
            ))
            .bearer_auth(token.to_owned())
            .send()
    };
    let first = open(&alice).await.unwrap();
    let socket = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    let third = open(&alice).await.unwrap();
    assert_eq!(
        third.status(),
        429,
        "a stream and a WebSocket are the two allowed"
    );
    let body: Value = third.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limited");
    assert_eq!(
        open(&bob).await.unwrap().status(),
        404,
        "per owner: bob is not limited by alice (and the run is not his)"
    );
    socket.close().await.unwrap();
    drop(first);
    // The places come back once the server sees the connections gone.
    let mut status = 0;
    for _ in 0..100 {
        let again = open(&alice).await.unwrap();
        status = again.status().as_u16();
        if status == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_resume_at_or_past_the_end_is_answered_at_once_never_a_hang() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let (status, _) = platform
        .api()
        .post_run(&alice, &text_run(&thread(), "ended", "hi"))
        .await
        .unwrap();
    assert_eq!(status, 202);
    let get = |run: &str, cursor: String| {
        let request = platform
            .http
            .get(format!(
                "{}/api/v1/agent/runs/{run}/events",
                platform.urls.runs
            ))
            .bearer_auth(&alice)
            .header("last-event-id", cursor);
        // A hang fails the test instead of holding it.
        tokio::time::timeout(std::time::Duration::from_secs(15), request.send())
    };
    let whole = read_sse(get("ended", "0".into()).await.unwrap().unwrap(), None)
        .await
        .unwrap();
    let last = ids(&whole).last().copied().unwrap();
    // What a browser's EventSource sends when it reconnects after the stream closed: 204, which
    // it does not retry.
    let response = get("ended", last.to_string()).await.unwrap().unwrap();
    assert_eq!(response.status(), 204, "the client has the terminal event");
    assert!(response.bytes().await.unwrap().is_empty());
    // Past the end: a clear 400 naming the header and the run's last event.
    let response = get("ended", (last + 1).to_string()).await.unwrap().unwrap();
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["field"], "Last-Event-ID");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("({last})")),
        "{body}"
    );
    // A running run: a cursor far ahead of anything it has sent is refused the same way.
    let (status, _) = platform
        .api()
        .post_run(&alice, &text_run(&thread(), "running", "/slow a b c d e f"))
        .await
        .unwrap();
    assert_eq!(status, 202);
    let response = get("running", "1000".into()).await.unwrap().unwrap();
    assert_eq!(response.status(), 400);
}

/// The text of the last assistant message of a history answer, whatever its shape.
fn last_reply(history: &Value) -> String {
    let message = history["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "assistant"))
        .cloned()
        .unwrap_or(Value::Null);
    match &message["content"] {
        Value::String(text) => text.clone(),
        Value::Array(blocks) => blocks.iter().filter_map(|b| b["text"].as_str()).collect(),
        _ => String::new(),
    }
}

#[tokio::test]
async fn once_a_client_has_the_terminal_event_every_history_endpoint_has_the_whole_reply() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let long: Vec<String> = (0..60).map(|i| format!("word{i}")).collect();
    let long = long.join(" ");
    for round in 0..3 {
        // Over SSE.
        let thread = thread();
        let response = platform
            .http
            .post(format!("{}/api/v1/agent/runs", platform.urls.runs))
            .bearer_auth(&alice)
            .header("accept", "text/event-stream")
            .json(&text_run(&thread, &format!("h{round}"), &long))
            .send()
            .await
            .unwrap();
        let frames = read_sse(response, None).await.unwrap();
        assert_eq!(frames.last().unwrap().data["type"], "RUN_FINISHED");
        let streamed = streamed_text(frames.iter().map(|f| &f.data));
        assert_eq!(streamed, format!("You said: {long}"));
        // Read at once, no waiting: every shape has the whole reply.
        for (path, param) in [
            ("/api/v1/agent/history", "threadId"),
            ("/api/v1/agent/history/blocks", "threadId"),
            ("/v2/history", "session_id"),
        ] {
            let (status, body) = platform
                .api()
                .get_history(&alice, path, &[(param, &thread)])
                .await
                .unwrap();
            assert_eq!(status, 200, "{path}");
            assert_eq!(last_reply(&body), streamed, "{path}, round {round}");
        }
        // Over the WebSocket: `completed`, then history.
        let conversation = format!("c-{}", uuid::Uuid::now_v7());
        let mut ws = WsClient::connect(&platform.urls.runs, &alice, "")
            .await
            .unwrap();
        ws.send(&json!({
            "type": "user_message", "id": format!("m{round}"), "conversation_id": conversation,
            "content": {"messages": [{"role": "user", "content": [{"type": "text", "text": long}]}]},
            "timestamp": "2025-01-13T10:00:00Z"
        }))
        .await
        .unwrap();
        ws.until(|m| m["type"] == "system_response_message" && m["status"] == "completed")
            .await
            .unwrap();
        let (_, body) = platform
            .api()
            .get_history(&alice, "/v2/history", &[("session_id", &conversation)])
            .await
            .unwrap();
        assert_eq!(last_reply(&body), format!("You said: {long}"), "WebSocket");
    }
}
