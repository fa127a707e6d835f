//! Agents that declare their input and output (`message-body-structure-proposal.md`): the
//! catalog, a run refused by its agent's input schema, an agent that breaks its output schema,
//! the compatibility of two agents, and history in the `MessageBody` form.

use serde_json::{Value, json};
use switchboard_system_tests::{TestPlatform, read_sse, text_run};

fn thread() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A run for `agent` (none: the default) with a text block and an image block.
fn run_with_image(thread: &str, run: &str, agent: Option<&str>, url: &str) -> Value {
    let mut body = text_run(thread, run, "");
    body["messages"][0]["content"] = json!([
        {"type": "text", "text": "what is this?"},
        {"type": "binary", "mimeType": "image/png", "url": url}
    ]);
    if let Some(agent) = agent {
        body["forwardedProps"] = json!({"agent": agent});
    }
    body
}

async fn post_json(platform: &TestPlatform, token: &str, path: &str, body: &Value) -> (u16, Value) {
    let response = platform
        .http
        .post(format!("{}{path}", platform.urls.runs))
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn the_agents_are_listed_with_their_schemas_and_the_default() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let (status, body) = platform
        .api()
        .get_runs(&alice, "/api/v1/agents")
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let names: Vec<&str> = body["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["echo", "echo-text"], "{body}");
    assert_eq!(body["default"], "echo");
    let echo = &body["agents"][0];
    assert_eq!(
        echo["inputSchema"]["parts"][0],
        json!({"contentType": "text/{plain,markdown}"})
    );
    assert_eq!(
        echo["outputSchema"]["parts"][2],
        json!({"name": "/files/*"})
    );
    let (status, _) = platform
        .api()
        .get_runs("not-a-token", "/api/v1/agents")
        .await
        .unwrap();
    assert_eq!(status, 401);
}

#[tokio::test]
async fn an_agent_refuses_an_input_its_schema_does_not_allow_naming_the_part() {
    let platform = TestPlatform::spawn().await.unwrap();
    let (bucket, key) = (platform.s3.bucket.clone(), "uploads/a/1/dot.png");
    platform
        .insert_file("alice", &bucket, key, "image/png", "verified")
        .await
        .unwrap();
    let alice = platform.infra.token("alice");
    let url = format!("s3://{bucket}/{key}");
    let thread = thread();
    // The text-only agent's input schema has no part for files: 422, naming the block.
    let (status, body) = platform
        .api()
        .post_run(
            &alice,
            &run_with_image(&thread, "r1", Some("echo-text"), &url),
        )
        .await
        .unwrap();
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["field"], "/messages/0/content/1", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("\"echo-text\"") && message.contains("/attachments/dot.png"),
        "names the agent and the part: {message}"
    );
    // The default agent takes it.
    let (status, body) = platform
        .api()
        .post_run(&alice, &run_with_image(&thread, "r2", None, &url))
        .await
        .unwrap();
    assert_eq!(status, 202, "{body}");
    // An agent nobody runs, and a name of the wrong form.
    for (agent, expected) in [
        (json!("nobody"), "known: echo, echo-text"),
        (json!(42), "agent name"),
    ] {
        let mut run = text_run(&thread, "r3", "hi");
        run["forwardedProps"] = json!({"agent": agent});
        let (status, body) = platform.api().post_run(&alice, &run).await.unwrap();
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["error"]["field"], "/forwardedProps/agent");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains(expected),
            "{body}"
        );
    }
    // The seed's own rules still come first, with their messages.
    let mut run = run_with_image(&thread, "r4", Some("echo-text"), &url);
    run["messages"][0]["content"][1]["mimeType"] = json!("application/pdf");
    let (status, body) = platform.api().post_run(&alice, &run).await.unwrap();
    assert_eq!(status, 422);
    assert_eq!(
        body["error"]["message"],
        "binary content requires image mimeType"
    );
}

#[tokio::test]
async fn an_agent_that_breaks_its_output_schema_ends_with_run_error() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let response = platform
        .http
        .post(format!("{}/api/v1/agent/runs", platform.urls.runs))
        .bearer_auth(&alice)
        .header("accept", "text/event-stream")
        .json(&text_run(&thread(), "silent", "/silent"))
        .send()
        .await
        .unwrap();
    let frames = read_sse(response, None).await.unwrap();
    let last = &frames.last().unwrap().data;
    assert_eq!(
        (&last["type"], &last["code"]),
        (&json!("RUN_ERROR"), &json!("output_schema_violation")),
        "{last}"
    );
    assert!(
        last["message"]
            .as_str()
            .unwrap()
            .contains("is required but no part matches it"),
        "{last}"
    );
    let (_, status) = platform
        .api()
        .get_runs(&alice, "/api/v1/agent/runs/silent")
        .await
        .unwrap();
    assert_eq!(status["status"], "failed");
}

#[tokio::test]
async fn the_compatibility_of_two_agents_or_two_schemas_is_answered_with_reasons() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let path = "/api/v1/agents/compatibility";
    // echo-text only ever says markdown text, which echo takes.
    let (status, body) = post_json(
        &platform,
        &alice,
        path,
        &json!({"from": "echo-text", "to": "echo"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"compatible": true, "incompatibilities": []}));
    // echo may make files and tool calls, which echo-text does not accept.
    let (status, body) = post_json(
        &platform,
        &alice,
        path,
        &json!({"from": "echo", "to": "echo-text"}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["compatible"], false);
    let reasons: Vec<&str> = body["incompatibilities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap_or_default())
        .collect();
    assert!(
        reasons.contains(&"/files/*") && reasons.contains(&"/tool_calls/*"),
        "{body}"
    );
    // Inline schemas.
    let researcher = json!({"parts": [{"contentType": "text/markdown", "required": true},
                                      {"name": "/sources/*", "contentType": "application/json"}]});
    let (_, body) = post_json(
        &platform,
        &alice,
        path,
        &json!({"from": researcher, "to": "echo"}),
    )
    .await;
    assert_eq!(body["compatible"], false, "{body}");
    let (_, body) = post_json(
        &platform,
        &alice,
        path,
        &json!({"from": researcher, "to": {"parts": [{"contentType": "text/*"}, {"name": "/**"}]}}),
    )
    .await;
    assert_eq!(body["compatible"], true, "{body}");
    // Unknown names and broken schemas name the side.
    let (status, body) = post_json(
        &platform,
        &alice,
        path,
        &json!({"from": "nobody", "to": "echo"}),
    )
    .await;
    assert_eq!((status, &body["error"]["field"]), (422, &json!("/from")));
    let (status, body) = post_json(
        &platform,
        &alice,
        path,
        &json!({"from": "echo", "to": {"parts": [{"name": "/a/[b"}]}}),
    )
    .await;
    assert_eq!(
        (status, &body["error"]["field"]),
        (422, &json!("/to")),
        "{body}"
    );
}

#[tokio::test]
async fn history_returns_each_message_as_a_message_body() {
    let platform = TestPlatform::spawn().await.unwrap();
    let (bucket, key) = (platform.s3.bucket.clone(), "uploads/a/2/dot.png");
    platform
        .insert_file("alice", &bucket, key, "image/png", "verified")
        .await
        .unwrap();
    let alice = platform.infra.token("alice");
    let thread = thread();
    let url = format!("s3://{bucket}/{key}");
    let response = platform
        .http
        .post(format!("{}/api/v1/agent/runs", platform.urls.runs))
        .bearer_auth(&alice)
        .header("accept", "text/event-stream")
        .json(&run_with_image(&thread, "b1", None, &url))
        .send()
        .await
        .unwrap();
    read_sse(response, None).await.unwrap();
    let (status, body) = platform
        .api()
        .get_history(
            &alice,
            "/api/v1/agent/history/bodies",
            &[("threadId", &thread)],
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let user = &body["messages"][0]["body"]["parts"];
    assert_eq!(
        user[0],
        json!({"contentType": "text/plain", "content": "what is this?"})
    );
    assert_eq!(
        (&user[1]["name"], &user[1]["contentType"]),
        (&json!("/attachments/dot.png"), &json!("image/png"))
    );
    assert!(
        switchboard_system_tests::download_link(
            &platform.urls.attachments,
            user[1]["contentUrl"].as_str().unwrap()
        )
        .is_some(),
        "a freshly signed download link: {user}"
    );
    let reply = &body["messages"][1]["body"]["parts"][0];
    assert_eq!(reply["contentType"], "text/markdown");
    assert!(
        reply["content"]
            .as_str()
            .unwrap()
            .starts_with("You said: what is this?"),
        "{reply}"
    );
}
