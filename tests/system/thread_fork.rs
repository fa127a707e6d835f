//! Fork and regenerate (issue 28), through the AG-UI route and the history shapes: a fork is a
//! new thread holding the messages up to one of them (and its files), continued like any
//! thread; a run again on a user message whose reply the client dropped replaces that reply,
//! the old one kept as a previous version (`superseded_by`), the new one marked `regenerates`.

use serde_json::{Value, json};
use switchboard_system_tests::{TestPlatform, read_sse, text_run, upload_file};

/// One AG-UI run (`POST /api/v1/agent/ag-ui`) of `messages` on `thread`; its events.
async fn agui_run(
    platform: &TestPlatform,
    token: &str,
    thread: &str,
    run_id: &str,
    messages: Value,
) -> Vec<Value> {
    let mut body = text_run(thread, run_id, "");
    body["messages"] = messages;
    let response = platform
        .http
        .post(format!("{}/api/v1/agent/ag-ui", platform.urls.runs))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let events: Vec<Value> = read_sse(response, None)
        .await
        .unwrap()
        .into_iter()
        .map(|frame| frame.data)
        .collect();
    assert_eq!(events.last().unwrap()["type"], "RUN_FINISHED", "{events:?}");
    events
}

/// The assistant message a run's events made, as an AG-UI client keeps it.
fn reply(events: &[Value]) -> Value {
    let id = events
        .iter()
        .find(|e| e["type"] == "TEXT_MESSAGE_START")
        .and_then(|e| e["messageId"].as_str())
        .unwrap();
    let text: String = events
        .iter()
        .filter(|e| e["type"] == "TEXT_MESSAGE_CONTENT")
        .filter_map(|e| e["delta"].as_str())
        .collect();
    json!({"id": id, "role": "assistant", "content": text})
}

fn user(id: &str, text: &str) -> Value {
    json!({"id": id, "role": "user", "content": text})
}

/// The thread's messages in history's block shape (`GET /api/v1/agent/history/blocks`, which
/// carries each message's metadata) once it holds `count` and the last is complete: (id, role,
/// metadata).
async fn history(
    platform: &TestPlatform,
    token: &str,
    thread: &str,
    count: usize,
) -> Vec<(String, String, Value)> {
    let deadline = tokio::time::Instant::now() + switchboard_system_tests::EVENTUAL;
    let body = loop {
        let (status, body) = platform
            .api()
            .get_history(
                token,
                "/api/v1/agent/history/blocks",
                &[("threadId", thread)],
            )
            .await
            .unwrap();
        let messages = body["messages"].as_array().map_or(0, Vec::len);
        if status == 200 && messages == count {
            break body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{thread} never held {count} messages: {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap().to_owned(),
                m["role"].as_str().unwrap().to_owned(),
                m["metadata"].clone(),
            )
        })
        .collect()
}

async fn fork(platform: &TestPlatform, token: &str, thread: &str, body: Value) -> (u16, Value) {
    let response = platform
        .http
        .post(format!(
            "{}/api/v1/agent/threads/{thread}/fork",
            platform.urls.runs
        ))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The first event a client joining the thread gets: its `MESSAGES_SNAPSHOT`'s message ids.
async fn snapshot_ids(platform: &TestPlatform, token: &str, thread: &str) -> Vec<String> {
    let response = platform
        .http
        .get(format!(
            "{}/api/v1/agent/threads/{thread}/events",
            platform.urls.runs
        ))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let frames = read_sse(response, Some(1)).await.unwrap();
    assert_eq!(frames[0].data["type"], "MESSAGES_SNAPSHOT");
    frames[0].data["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_fork_holds_the_thread_up_to_a_message_with_its_files_and_goes_on_by_itself() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let bob = platform.infra.token("bob");
    let thread = uuid::Uuid::new_v4().to_string();
    let file = upload_file(
        &platform,
        &alice,
        &thread,
        b"notes of the first turn".to_vec(),
        "notes.txt",
        "text/plain",
    )
    .await;

    // Two turns through the AG-UI route, the client resending its conversation.
    let u1 = user("u1", "Where is Hà Nội?");
    let first = agui_run(&platform, &alice, &thread, "r1", json!([u1])).await;
    let a1 = reply(&first);
    let u2 = user("u2", "And Huế?");
    let second = agui_run(&platform, &alice, &thread, "r2", json!([u1, a1, u2])).await;
    let a2 = reply(&second);
    history(&platform, &alice, &thread, 4).await;

    // Forked at the first reply: two messages, the original's title, its file.
    let (status, forked) = fork(&platform, &alice, &thread, json!({"messageId": a1["id"]})).await;
    assert_eq!(status, 201, "{forked}");
    let fork_id = forked["threadId"].as_str().unwrap().to_owned();
    assert_ne!(fork_id, thread);
    assert_eq!(forked["messageCount"], 2);
    assert_eq!(forked["title"], "Where is Hà Nội?");
    let copied = history(&platform, &alice, &fork_id, 2).await;
    assert_eq!(
        copied
            .iter()
            .map(|(id, role, _)| (id.as_str(), role.as_str()))
            .collect::<Vec<_>>(),
        [("u1", "user"), (a1["id"].as_str().unwrap(), "assistant")]
    );
    assert!(
        copied
            .iter()
            .all(|(_, _, m)| m["forked_from"]["threadId"] == thread.as_str())
    );

    // The fork goes on by itself (a client resending the fork's conversation); the original
    // does not change.
    let u3 = user("u3", "And Đà Nẵng?");
    let third = agui_run(&platform, &alice, &fork_id, "f1", json!([u1, a1, u3])).await;
    assert!(!reply(&third)["content"].as_str().unwrap().is_empty());
    history(&platform, &alice, &fork_id, 4).await;
    let original = history(&platform, &alice, &thread, 4).await;
    assert_eq!(original[3].0, a2["id"].as_str().unwrap());
    assert_eq!(
        snapshot_ids(&platform, &alice, &fork_id).await,
        [
            "u1".to_owned(),
            a1["id"].as_str().unwrap().to_owned(),
            "u3".to_owned(),
            reply(&third)["id"].as_str().unwrap().to_owned()
        ]
    );

    // The file is the fork's too: erasing the original leaves it to the fork.
    let response = platform
        .http
        .delete(format!(
            "{}/api/v1/agent/threads/{thread}",
            platform.urls.runs
        ))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 204);
    let s3 = platform::s3::client(&platform.s3);
    let key = file.trim_start_matches("s3://").split_once('/').unwrap().1;
    assert!(
        s3.head_object()
            .bucket(&platform.s3.bucket)
            .key(key)
            .send()
            .await
            .is_ok(),
        "the fork's file stays"
    );
    history(&platform, &alice, &fork_id, 4).await;

    // Bad forks: another owner's thread, a message the thread does not hold, a taken id.
    let (status, body) = fork(&platform, &bob, &fork_id, json!({"messageId": "u1"})).await;
    assert_eq!((status, &body["error"]["code"]), (404, &json!("not_found")));
    let (status, body) = fork(&platform, &alice, &fork_id, json!({"messageId": "nope"})).await;
    assert_eq!(
        (status, &body["error"]["field"]),
        (422, &json!("/messageId")),
        "{body}"
    );
    let (status, body) = fork(
        &platform,
        &alice,
        &fork_id,
        json!({"messageId": "u1", "threadId": fork_id}),
    )
    .await;
    assert_eq!(
        (status, &body["error"]["field"]),
        (409, &json!("/threadId")),
        "{body}"
    );
    let (status, body) = fork(&platform, &alice, &fork_id, json!({"message": "u1"})).await;
    assert_eq!(
        (status, &body["error"]["field"]),
        (400, &json!("/message")),
        "{body}"
    );
    let (status, body) = fork(
        &platform,
        &alice,
        &fork_id,
        json!({"messageId": "u1", "threadId": "mine"}),
    )
    .await;
    assert_eq!((status, &body["threadId"]), (201, &json!("mine")), "{body}");
}

#[tokio::test]
async fn a_reply_asked_again_replaces_the_old_one_which_stays_as_a_previous_version() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let thread = uuid::Uuid::new_v4().to_string();

    // AG-UI: a turn, then the same turn again without its reply (the client's "regenerate").
    let u1 = user("u1", "Xin chào, bạn khỏe không?");
    let first = agui_run(&platform, &alice, &thread, "r1", json!([u1])).await;
    let old = reply(&first);
    history(&platform, &alice, &thread, 2).await;
    let again = agui_run(&platform, &alice, &thread, "r1-again", json!([u1])).await;
    let new = reply(&again);
    assert_ne!(old["id"], new["id"]);

    // History keeps both, in order, each marked; the user message once.
    let messages = history(&platform, &alice, &thread, 3).await;
    let ids: Vec<&str> = messages.iter().map(|(id, _, _)| id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "u1",
            old["id"].as_str().unwrap(),
            new["id"].as_str().unwrap()
        ]
    );
    assert_eq!(
        messages[1].2["superseded_by"], "r1-again",
        "{:?}",
        messages[1]
    );
    assert_eq!(messages[2].2["regenerates"], "u1", "{:?}", messages[2]);
    assert!(messages[2].2.get("superseded_by").is_none());
    // A client joining the thread sees the conversation as it stands: the new reply only.
    assert_eq!(
        snapshot_ids(&platform, &alice, &thread).await,
        ["u1".to_owned(), new["id"].as_str().unwrap().to_owned()]
    );

    // A fork at the new reply holds the conversation as it stands (the old reply left out), and
    // is the owner's most recent thread; a fork at the old one holds that one, no longer
    // marked.
    let (status, forked) = fork(&platform, &alice, &thread, json!({"messageId": new["id"]})).await;
    assert_eq!(
        (status, &forked["messageCount"]),
        (201, &json!(2)),
        "{forked}"
    );
    let fork_id = forked["threadId"].as_str().unwrap();
    let copied = history(&platform, &alice, fork_id, 2).await;
    assert_eq!(copied[1].0, new["id"].as_str().unwrap());
    let (_, listed) = platform
        .api()
        .get_history(&alice, "/api/v1/agent/threads", &[])
        .await
        .unwrap();
    assert_eq!(listed["threads"][0]["threadId"], fork_id, "{listed}");
    let (status, forked) = fork(&platform, &alice, &thread, json!({"messageId": old["id"]})).await;
    assert_eq!(
        (status, &forked["messageCount"]),
        (201, &json!(2)),
        "{forked}"
    );
    let copied = history(&platform, &alice, forked["threadId"].as_str().unwrap(), 2).await;
    assert_eq!(copied[1].0, old["id"].as_str().unwrap());
    assert!(
        copied[1].2.get("superseded_by").is_none(),
        "{:?}",
        copied[1]
    );

    // The conversation goes on from the new reply; resending it supersedes nothing.
    let u2 = user("u2", "Cảm ơn");
    agui_run(&platform, &alice, &thread, "r2", json!([u1, new, u2])).await;
    let messages = history(&platform, &alice, &thread, 5).await;
    assert_eq!(
        messages
            .iter()
            .filter(|(_, _, m)| m.get("superseded_by").is_some())
            .count(),
        1,
        "{messages:?}"
    );

    // The same through the runs API: a run again on the last user message.
    let api = platform.api();
    let thread2 = uuid::Uuid::new_v4().to_string();
    let run = text_run(&thread2, "p1", "hello");
    api.stream_run(&alice, &run).await.unwrap();
    let mut retry = text_run(&thread2, "p1-again", "hello");
    retry["messages"][0]["id"] = run["messages"][0]["id"].clone();
    let events = api.stream_run(&alice, &retry).await.unwrap();
    assert_eq!(events.last().unwrap()["type"], "RUN_FINISHED");
    let messages = history(&platform, &alice, &thread2, 3).await;
    assert_eq!(messages[0].1, "user", "the user message is kept once");
    assert_eq!(messages[1].2["superseded_by"], "p1-again");
    assert_eq!(messages[2].2["regenerates"], "p1-user");
}
