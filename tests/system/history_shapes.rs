//! The three history shapes of the seeds, tool calls and `ui_hints` persisted from a real run,
//! and the golden examples of `agent-run-input-protocol.md`, `agent-chat-messages-protocol.md`
//! and `file-attachments.md`.

use serde_json::{Value, json};
use switchboard_system_tests::{TestPlatform, text_run};

const BLOCKS: &str = "/api/v1/agent/history/blocks";
const SESSION: &str = "/v2/history";

fn thread() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[tokio::test]
async fn the_file_attachments_example_comes_back_in_the_session_shape() {
    let platform = TestPlatform::spawn().await.unwrap();
    let session = "abc-123";
    let upload = json!({
        "run_id": "r1", "message_id": "m1", "stage": "input",
        "user_message_attachments": {"bucket": "bucket", "path": "uploads/user123/file456/bao-cao.pdf",
                                     "mime_type": "application/pdf"},
        "user_message_attachment_list": [{"bucket": "bucket", "path": "uploads/user123/file456/bao-cao.pdf",
            "mime_type": "application/pdf", "file_name": "bao-cao.pdf", "size_bytes": 2097152}]
    });
    let generated = json!({"attachments": [
        {"path": "/report.md", "filename": "report.md", "icon_type": "md", "source": "generated"}
    ]});
    platform
        .insert_history(
            "alice",
            session,
            &[
                (
                    "m1",
                    "user",
                    "Phân tích file này cho tôi",
                    "2026-03-15T10:00:00Z",
                    upload,
                ),
                (
                    "m2",
                    "assistant",
                    "Đây là kết quả phân tích...",
                    "2026-03-15T10:00:05Z",
                    json!({}),
                ),
                (
                    "m3",
                    "assistant",
                    "Tôi đã tạo xong báo cáo phân tích:",
                    "2026-03-15T10:00:09Z",
                    generated,
                ),
            ],
        )
        .await
        .unwrap();
    let alice = platform.infra.token("alice");
    let (status, body) = platform
        .api()
        .get_history(&alice, SESSION, &[("session_id", session)])
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (
            &body["scope"],
            &body["session_id"],
            &body["day"],
            &body["has_more"]
        ),
        (
            &json!("history_day"),
            &json!(session),
            &json!("2026-03-15"),
            &json!(false)
        )
    );
    let messages = body["messages"].as_array().unwrap();
    // The seed's fields, verbatim; `id`, `seq` and `timestamp` are ours, on top.
    let seed_fields = |m: &Value| {
        let mut m = m.clone();
        for extra in ["id", "seq", "timestamp"] {
            m.as_object_mut().unwrap().remove(extra);
        }
        m
    };
    assert_eq!(
        messages.iter().map(seed_fields).collect::<Vec<_>>(),
        [
            json!({"role": "user", "content": [
                {"type": "text", "text": "Phân tích file này cho tôi"},
                {"type": "attachment", "path": "s3://bucket/uploads/user123/file456/bao-cao.pdf",
                 "filename": "bao-cao.pdf", "icon_type": "pdf", "source": "upload",
                 "url": "uploads/user123/file456/bao-cao.pdf", "file_size": 2097152,
                 "content_type": "application/pdf"}
            ]}),
            json!({"role": "assistant", "content": [{"type": "text", "text": "Đây là kết quả phân tích..."}],
                   "tool_calls": [], "attachments": []}),
            json!({"role": "assistant", "content": [{"type": "text", "text": "Tôi đã tạo xong báo cáo phân tích:"}],
                   "tool_calls": [],
                   "attachments": [{"path": "/report.md", "filename": "report.md", "icon_type": "md", "source": "generated"}]}),
        ]
    );
    assert_eq!(
        (messages[0]["id"].as_str(), messages[2]["seq"].as_i64()),
        (Some("m1"), Some(3))
    );
}

#[tokio::test]
async fn a_users_files_come_back_as_freshly_signed_binary_blocks_until_deleted() {
    let platform = TestPlatform::spawn().await.unwrap();
    let (bucket, key) = (platform.s3.bucket.as_str(), "agent-inputs/u/t/r/img.jpg");
    platform
        .insert_file("alice", bucket, key, "image/jpeg", "verified")
        .await
        .unwrap();
    let alice = platform.infra.token("alice");
    let thread = thread();
    let mut body = text_run(&thread, "img", "");
    body["messages"][0]["content"] = json!([
        {"type": "text", "text": "帮我看看这张图"},
        {"type": "binary", "mimeType": "image/jpeg", "url": format!("s3://{bucket}/{key}")}
    ]);
    let (status, accepted) = platform.api().post_run(&alice, &body).await.unwrap();
    assert_eq!(status, 202, "{accepted}");
    platform
        .api()
        .wait_for_history(&alice, &thread, |h| {
            h["messages"][1]["content"]
                .as_str()
                .is_some_and(|c| c.contains("Attachment img.jpg") && c.ends_with(')'))
        })
        .await
        .unwrap();
    let (status, blocks) = platform
        .api()
        .get_history(&alice, BLOCKS, &[("threadId", &thread)])
        .await
        .unwrap();
    assert_eq!(status, 200, "{blocks}");
    let user = &blocks["messages"][0];
    assert_eq!(
        (&user["id"], &user["role"]),
        (&json!("img-user"), &json!("user"))
    );
    assert_eq!(
        user["content"][0],
        json!({"type": "text", "text": "帮我看看这张图"})
    );
    let binary = &user["content"][1];
    assert_eq!(binary["type"], "binary");
    assert_eq!(binary["mimeType"], "image/jpeg");
    let url = binary["url"].as_str().unwrap();
    assert!(
        switchboard_system_tests::download_link(&platform.urls.attachments, url).is_some(),
        "a download link of the attachments service: {url}"
    );
    assert_eq!(user["metadata"]["user_message_attachments"]["path"], key);
    let assistant = &blocks["messages"][1];
    let reply = assistant["content"][0]["text"].as_str().unwrap();
    assert!(
        reply.starts_with("You said: 帮我看看这张图") && reply.contains("Attachment img.jpg"),
        "the echo, then what the agent made of the file: {reply}"
    );
    assert_eq!(assistant["uiSchema"], Value::Null);
    // The session shape of the same message lists the file as an attachment block.
    let (_, session) = platform
        .api()
        .get_history(&alice, SESSION, &[("session_id", &thread)])
        .await
        .unwrap();
    assert_eq!(
        session["messages"][0]["content"][1],
        json!({"type": "attachment", "path": format!("s3://{bucket}/{key}"), "filename": "img.jpg",
               "icon_type": "image", "source": "upload", "url": key, "file_size": 1024,
               "content_type": "image/jpeg"})
    );
    // Deleted: the block stays (the message had a file) but its url is null.
    let response = platform
        .http
        .delete(format!("{}/v2/files/delete", platform.urls.attachments))
        .query(&[("content_url", format!("s3://{bucket}/{key}"))])
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    let (_, after) = platform
        .api()
        .get_history(&alice, BLOCKS, &[("threadId", &thread)])
        .await
        .unwrap();
    assert_eq!(after["messages"][0]["content"][1]["url"], Value::Null);
}

#[tokio::test]
async fn tool_calls_tool_results_and_ui_hints_of_a_run_are_persisted_and_shown_in_every_shape() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let thread = thread();
    let body = text_run(
        &thread,
        "tool-run",
        r#"/tool calendar_create_event {"title":"standup","at":"09:00"}"#,
    );
    let (status, accepted) = platform.api().post_run(&alice, &body).await.unwrap();
    assert_eq!(status, 202, "{accepted}");
    let task = accepted["taskId"].as_str().unwrap().to_owned();
    let snapshot = platform
        .api()
        .wait_for_history(&alice, &thread, |h| {
            h["messages"]
                .as_array()
                .is_some_and(|m| m.len() == 4 && m[3]["uiSchema"].is_object())
        })
        .await
        .unwrap();
    let messages = snapshot["messages"].as_array().unwrap();
    let summary: Vec<(i64, &str, &str)> = messages
        .iter()
        .map(|m| {
            (
                m["seq"].as_i64().unwrap(),
                m["role"].as_str().unwrap(),
                m["id"].as_str().unwrap(),
            )
        })
        .collect();
    let (reply, result, done) = (
        format!("{task}-reply"),
        format!("{task}-tool-1"),
        format!("{task}-summary"),
    );
    assert_eq!(
        summary,
        [
            (1, "user", "tool-run-user"),
            (2, "assistant", reply.as_str()),
            (3, "tool", result.as_str()),
            (4, "assistant", done.as_str()),
        ]
    );
    assert_eq!(messages[1]["content"], "Calling calendar_create_event.");
    assert_eq!(messages[1]["uiSchema"], Value::Null);
    let tool_output: Value =
        serde_json::from_str(messages[2]["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        tool_output["arguments"],
        json!({"title": "standup", "at": "09:00"})
    );
    assert_eq!(
        messages[2]["uiSchema"]["root"]["children"][0]["content"],
        "calendar_create_event done"
    );
    assert_eq!(messages[2]["uiSchema"]["status"], "success");

    // Stored metadata: the seed's tool execution fields, and the call on the calling message.
    let call_id = format!("{task}-call-1");
    let tool_meta = platform.message_metadata(&thread, &result).await.unwrap();
    assert_eq!(
        (
            &tool_meta["run_id"],
            &tool_meta["stage"],
            &tool_meta["message_id"],
            &tool_meta["tool_name"],
            &tool_meta["tool_call_id"]
        ),
        (
            &json!("tool-run"),
            &json!("tool_execution"),
            &json!(result),
            &json!("calendar_create_event"),
            &json!(call_id)
        )
    );
    assert!(
        tool_meta["latency_ms"].as_i64().is_some_and(|ms| ms >= 0),
        "{tool_meta}"
    );
    let reply_meta = platform.message_metadata(&thread, &reply).await.unwrap();
    assert_eq!(
        reply_meta["tool_calls"],
        json!([{"id": call_id, "name": "calendar_create_event", "arguments": r#"{"title":"standup","at":"09:00"}"#}])
    );

    // Block form: AG-UI tool calls on the assistant message, the call id on the tool message.
    let (_, blocks) = platform
        .api()
        .get_history(&alice, BLOCKS, &[("threadId", &thread)])
        .await
        .unwrap();
    let calls = json!([{"id": call_id, "type": "function",
                        "function": {"name": "calendar_create_event", "arguments": r#"{"title":"standup","at":"09:00"}"#}}]);
    assert_eq!(blocks["messages"][1]["toolCalls"], calls);
    assert_eq!(blocks["messages"][2]["toolCallId"], json!(call_id));
    assert_eq!(
        blocks["messages"][2]["metadata"]["tool_name"],
        "calendar_create_event"
    );
    assert_eq!(blocks["messages"][3]["uiSchema"], messages[3]["uiSchema"]);
    // Session form: snake_case tool calls, `[]` on the summary that called none.
    let (_, session) = platform
        .api()
        .get_history(&alice, SESSION, &[("session_id", &thread)])
        .await
        .unwrap();
    assert_eq!(session["messages"][1]["tool_calls"], calls);
    assert_eq!(session["messages"][2]["tool_call_id"], json!(call_id));
    assert_eq!(session["messages"][3]["tool_calls"], json!([]));
}

#[tokio::test]
async fn every_shape_is_scoped_to_its_owner_and_names_the_bad_parameter() {
    let platform = TestPlatform::spawn().await.unwrap();
    platform
        .insert_history(
            "alice",
            "t-1",
            &[("m", "user", "hi", "2026-03-15T10:00:00Z", json!({}))],
        )
        .await
        .unwrap();
    let (alice, bob) = (platform.infra.token("alice"), platform.infra.token("bob"));
    for (path, param) in [(BLOCKS, "threadId"), (SESSION, "session_id")] {
        let (status, body) = platform
            .api()
            .get_history(&bob, path, &[(param, "t-1")])
            .await
            .unwrap();
        assert_eq!(status, 404, "{path}: {body}");
        let (status, body) = platform.api().get_history(&bob, path, &[]).await.unwrap();
        assert_eq!(
            (status, &body["messages"]),
            (200, &json!([])),
            "{path}: bob has no thread"
        );
        let (status, body) = platform.api().get_history(&alice, path, &[]).await.unwrap();
        assert_eq!(
            (status, body["messages"][0]["id"].as_str()),
            (200, Some("m")),
            "{path}"
        );
        let too_long = "x".repeat(129);
        let (status, body) = platform
            .api()
            .get_history(&alice, path, &[(param, too_long.as_str())])
            .await
            .unwrap();
        assert_eq!(
            (status, body["error"]["field"].as_str()),
            (400, Some(param)),
            "{path}: {body}"
        );
        let (status, body) = platform
            .api()
            .get_history(&alice, path, &[(param, "t-1"), ("before", "15-03-2026")])
            .await
            .unwrap();
        assert_eq!(
            (status, body["error"]["field"].as_str()),
            (400, Some("before")),
            "{path}: {body}"
        );
        let response = platform
            .http
            .get(format!("{}{path}", platform.urls.history))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 401, "{path} without a token");
    }
}

/// Posts a run with `Accept: text/event-stream` and reads it to its terminal event.
async fn run_to_end(
    platform: &TestPlatform,
    token: &str,
    thread: &str,
    run: &str,
    text: &str,
) -> Value {
    let response = platform
        .http
        .post(format!("{}/api/v1/agent/runs", platform.urls.runs))
        .bearer_auth(token)
        .header("accept", "text/event-stream")
        .json(&text_run(thread, run, text))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let frames = switchboard_system_tests::read_sse(response, None)
        .await
        .unwrap();
    frames.last().unwrap().data.clone()
}

#[tokio::test]
async fn an_agent_sets_its_stage_and_own_fields_and_every_agent_message_has_its_latency() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let thread = thread();
    let end = run_to_end(
        &platform,
        &alice,
        &thread,
        "meta",
        r#"/meta {"stage": "intent", "intent": "greeting", "confidence": 0.9} hello"#,
    )
    .await;
    assert_eq!(end["type"], "RUN_FINISHED", "{end}");
    // The platform's own fields cannot be set: the agent is told, the run fails.
    let end = run_to_end(
        &platform,
        &alice,
        &thread,
        "forged",
        r#"/meta {"run_id": "someone-else"} hi"#,
    )
    .await;
    assert_eq!(end["type"], "RUN_ERROR", "{end}");
    let end = run_to_end(
        &platform,
        &alice,
        &thread,
        "tool",
        r#"/tool lookup {"q": 1}"#,
    )
    .await;
    assert_eq!(end["type"], "RUN_FINISHED", "{end}");
    // Read at once: the terminal event came after history wrote the runs.
    let (status, body) = platform
        .api()
        .get_history(&alice, BLOCKS, &[("threadId", &thread)])
        .await
        .unwrap();
    assert_eq!(status, 200);
    let messages = body["messages"].as_array().unwrap();
    let reply = messages
        .iter()
        .find(|m| m["metadata"]["run_id"] == "meta" && m["role"] == "assistant")
        .unwrap();
    let meta = &reply["metadata"];
    assert_eq!(
        (&meta["stage"], &meta["intent"], &meta["confidence"]),
        (&json!("intent"), &json!("greeting"), &json!(0.9)),
        "{meta}"
    );
    assert_eq!(meta["message_id"], reply["id"]);
    assert!(
        messages
            .iter()
            .all(|m| m["metadata"]["run_id"] != "someone-else"),
        "nothing forged"
    );
    for message in messages.iter().filter(|m| m["role"] != "user") {
        assert!(
            message["metadata"]["latency_ms"].is_i64(),
            "every agent message has latency_ms: {message}"
        );
    }
}
