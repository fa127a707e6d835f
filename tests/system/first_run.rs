//! The first run, end to end: accepted by runs, processed by the worker, kept by history.

use serde_json::{Value, json};
use switchboard_system_tests::{Api, ProcessPlatform, TestPlatform, text_run};

fn message_count(body: &Value) -> usize {
    body["messages"].as_array().map_or(0, Vec::len)
}

/// True once the assistant reply is complete (the run reached RUN_FINISHED in history).
fn reply_complete(expected_reply: &str) -> impl Fn(&Value) -> bool + '_ {
    move |body| message_count(body) >= 2 && body["messages"][1]["content"] == expected_reply
}

async fn run_and_check(api: &Api<'_>, token: &str) {
    let thread_id = uuid::Uuid::new_v4().to_string();
    let (status, accepted) = api
        .post_run(token, &text_run(&thread_id, "run-001", "hello platform"))
        .await
        .unwrap();
    assert_eq!(status, 202, "acceptance answer: {accepted}");
    assert_eq!(accepted["threadId"], thread_id.as_str());
    assert_eq!(accepted["runId"], "run-001");
    let task_id = accepted["taskId"].as_str().unwrap_or_default();
    assert!(
        uuid::Uuid::parse_str(task_id).is_ok(),
        "taskId is a UUID: {accepted}"
    );
    assert!(
        accepted["created"]
            .as_str()
            .is_some_and(|c| chrono::DateTime::parse_from_rfc3339(c).is_ok()),
        "created is ISO-8601: {accepted}"
    );

    let history = api
        .wait_for_history(
            token,
            &thread_id,
            reply_complete("You said: hello platform"),
        )
        .await
        .unwrap();
    assert_eq!(history["scope"], "history_day");
    assert_eq!(history["threadId"], thread_id.as_str());
    assert_eq!(history["hasMore"], false);
    assert_eq!(
        message_count(&history),
        2,
        "exactly the user message and the reply: {history}"
    );
    let user = &history["messages"][0];
    assert_eq!(
        (
            user["role"].as_str(),
            user["seq"].as_i64(),
            user["content"].as_str()
        ),
        (Some("user"), Some(1), Some("hello platform"))
    );
    assert_eq!(user["id"], "run-001-user");
    assert_eq!(user["url"], Value::Null);
    let reply = &history["messages"][1];
    assert_eq!(
        (reply["role"].as_str(), reply["seq"].as_i64()),
        (Some("assistant"), Some(2))
    );
    assert_eq!(reply["uiSchema"], Value::Null);
    let day = history["day"].as_str().unwrap_or_default();
    assert!(
        reply["timestamp"]
            .as_str()
            .is_some_and(|t| t.starts_with(day)),
        "the reply's timestamp is on the snapshot's day: {history}"
    );
}

#[tokio::test]
async fn a_text_run_is_accepted_processed_and_kept_in_history() {
    let platform = TestPlatform::spawn().await.unwrap();
    let token = platform.infra.token("alice");
    run_and_check(&platform.api(), &token).await;
}

#[tokio::test]
async fn the_compiled_binaries_run_a_conversation_and_stop_cleanly_on_sigterm() {
    let mut platform = ProcessPlatform::spawn().await.unwrap();
    let token = platform.infra.token("alice");
    run_and_check(&platform.api(), &token).await;
    let statuses = platform.terminate().unwrap();
    for (service, code) in statuses {
        assert_eq!(code, Some(0), "{service} exits 0 after SIGTERM");
    }
}

#[tokio::test]
async fn one_users_run_never_appears_in_another_users_history() {
    let platform = TestPlatform::spawn().await.unwrap();
    let api = platform.api();
    let alice = platform.infra.token("alice");
    let bob = platform.infra.token("bob");
    let thread_id = uuid::Uuid::new_v4().to_string();
    let (status, _) = api
        .post_run(
            &alice,
            &text_run(&thread_id, "secret-run", "alice's secret"),
        )
        .await
        .unwrap();
    assert_eq!(status, 202);
    api.wait_for_history(
        &alice,
        &thread_id,
        reply_complete("You said: alice's secret"),
    )
    .await
    .unwrap();

    let (status, body) = api
        .history(&bob, &[("threadId", &thread_id)])
        .await
        .unwrap();
    assert_eq!(status, 404, "another user's thread is not found: {body}");
    assert_eq!(body["error"]["code"], "not_found");
    let (status, body) = api.history(&bob, &[]).await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({"scope": "history_day", "threadId": null, "day": null, "hasMore": false, "messages": []}),
        "bob, who has no thread, sees an empty snapshot"
    );
}

#[tokio::test]
async fn the_same_run_sent_twice_is_accepted_once_and_a_changed_body_conflicts() {
    let platform = TestPlatform::spawn().await.unwrap();
    let api = platform.api();
    let token = platform.infra.token("alice");
    let thread_id = uuid::Uuid::new_v4().to_string();
    let body = text_run(&thread_id, "run-dup", "once");
    let (first_status, first) = api.post_run(&token, &body).await.unwrap();
    let (second_status, second) = api.post_run(&token, &body).await.unwrap();
    assert_eq!((first_status, second_status), (202, 202));
    assert_eq!(first, second, "a retried request gets the original answer");
    let (status, conflict) = api
        .post_run(&token, &text_run(&thread_id, "run-dup", "changed"))
        .await
        .unwrap();
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(conflict["error"]["field"], "/runId");
    let history = api
        .wait_for_history(&token, &thread_id, reply_complete("You said: once"))
        .await
        .unwrap();
    assert_eq!(
        message_count(&history),
        2,
        "one run, one user message, one reply: {history}"
    );
}

#[tokio::test]
async fn every_endpoint_refuses_a_missing_or_expired_token() {
    let platform = TestPlatform::spawn().await.unwrap();
    let api = platform.api();
    let thread_id = uuid::Uuid::new_v4().to_string();
    let expired = platform.infra.token_expiring("alice", -3600);
    for token in ["", "not-a-jwt", expired.as_str()] {
        let (status, body) = api
            .post_run(token, &text_run(&thread_id, "r", "x"))
            .await
            .unwrap();
        assert_eq!(status, 401, "runs refuses token {token:?}: {body}");
        assert_eq!(body["error"]["code"], "unauthorized");
        let (status, _) = api.history(token, &[]).await.unwrap();
        assert_eq!(status, 401, "history refuses token {token:?}");
    }
}

#[tokio::test]
async fn an_invalid_run_is_refused_with_the_seed_message_and_field() {
    let platform = TestPlatform::spawn().await.unwrap();
    let api = platform.api();
    let token = platform.infra.token("alice");
    let (status, body) = api
        .post_run(&token, &text_run("thread-123", "r1", "hi"))
        .await
        .unwrap();
    assert_eq!(status, 422);
    assert_eq!(
        body,
        json!({"error": {"code": "invalid_request", "message": "threadId must be a valid UUID", "field": "/threadId"}})
    );
}

#[tokio::test]
async fn every_service_reports_ready_with_its_dependencies() {
    let platform = TestPlatform::spawn().await.unwrap();
    for (base, deps) in [
        (&platform.urls.attachments, vec!["postgres", "s3"]),
        (&platform.urls.runs, vec!["nats"]),
        (&platform.urls.history, vec!["postgres", "nats"]),
        (&platform.urls.worker, vec!["nats"]),
    ] {
        let response = platform
            .http
            .get(format!("{base}/readyz"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200, "{base} is ready");
        let body: Value = response.json().await.unwrap();
        for dep in deps {
            assert_eq!(body["checks"][dep], "ok", "{base} checked {dep}: {body}");
        }
        let alive = platform
            .http
            .get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap();
        assert_eq!(alive.status().as_u16(), 200);
    }
}
