//! The production-shaped topology: a 3-node NATS cluster with a user per service, replicas of
//! every service, the gateway in front. What it must survive, and who may say what on its bus.

use std::time::Duration;

use serde_json::{Value, json};
use switchboard_system_tests::cluster::Fleet;
use switchboard_system_tests::{EVENTUAL, text_run};

/// Posts `body` through the gateway until an answer other than a gateway/connection failure
/// (a replica gone mid-request); the run's id makes retries safe.
async fn post_run(
    http: &reqwest::Client,
    gateway: &str,
    token: &str,
    body: &Value,
) -> (u16, Value) {
    let deadline = tokio::time::Instant::now() + EVENTUAL;
    loop {
        let sent = http
            .post(format!("{gateway}/api/v1/agent/runs"))
            .bearer_auth(token)
            .json(body)
            .send()
            .await;
        if let Ok(response) = sent {
            let status = response.status().as_u16();
            if !matches!(status, 502..=504) {
                return (status, response.json().await.unwrap_or(Value::Null));
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the gateway never took the run"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The history of `thread` once it holds `count` messages, the last one finished.
async fn history(http: &reqwest::Client, gateway: &str, token: &str, thread: &str) -> Value {
    let response = http
        .get(format!("{gateway}/api/v1/agent/history"))
        .bearer_auth(token)
        .query(&[("threadId", thread)])
        .send()
        .await
        .unwrap();
    response.json().await.unwrap_or(Value::Null)
}

#[tokio::test]
async fn each_service_speaks_on_the_bus_only_as_itself_and_a_run_still_goes_end_to_end() {
    let fleet = Fleet::start(1, &[]).await.unwrap();
    let http = reqwest::Client::new();
    let alice = fleet.infra.token("alice");
    let thread = uuid::Uuid::new_v4().to_string();
    let (status, _) = post_run(
        &http,
        &fleet.gateway.url,
        &alice,
        &text_run(&thread, "perm-1", "hello cluster"),
    )
    .await;
    assert_eq!(status, 202);
    let deadline = tokio::time::Instant::now() + EVENTUAL;
    loop {
        let body = history(&http, &fleet.gateway.url, &alice, &thread).await;
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        if messages.len() == 2
            && messages[1]["content"]
                .as_str()
                .is_some_and(|c| c.contains("hello cluster"))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run never reached history: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The same request to the attachments service's resolve endpoint: answered for runs,
    // refused by the server for history (which has no business resolving files).
    let names = &fleet.nats.names;
    let request = serde_json::to_vec(&json!({"owner": "alice", "urls": []})).unwrap();
    let runs = fleet.nats.connect_as("runs").await.unwrap();
    let answered = tokio::time::timeout(
        Duration::from_secs(5),
        runs.request(names.attachments_resolve_subject(), request.clone().into()),
    )
    .await
    .expect("runs got an answer in time");
    assert!(answered.is_ok(), "runs may resolve: {answered:?}");

    let (errors_tx, mut errors) = tokio::sync::mpsc::unbounded_channel();
    let history_user = async_nats::ConnectOptions::with_user_and_password(
        "history".into(),
        "history-test-password".into(),
    )
    .custom_inbox_prefix(platform::nats_auth::inbox_prefix("history"))
    .event_callback(move |event| {
        let errors_tx = errors_tx.clone();
        async move {
            if let async_nats::Event::ServerError(err) = event {
                let _ = errors_tx.send(err.to_string());
            }
        }
    })
    .connect(fleet.nats.urls())
    .await
    .unwrap();
    let refused = tokio::time::timeout(
        Duration::from_secs(3),
        history_user.request(names.attachments_resolve_subject(), request.into()),
    )
    .await;
    assert!(
        !matches!(refused, Ok(Ok(_))),
        "history got an answer from resolve: {refused:?}"
    );
    let error = tokio::time::timeout(Duration::from_secs(5), errors.recv())
        .await
        .expect("the server reported the violation")
        .unwrap();
    assert!(
        error.to_lowercase().contains("permissions violation"),
        "{error}"
    );

    // No user but admin may delete a stream.
    let js = async_nats::jetstream::new(fleet.nats.connect_as("worker").await.unwrap());
    let deleted = tokio::time::timeout(
        Duration::from_secs(5),
        js.delete_stream(names.runs_stream()),
    )
    .await;
    assert!(
        !matches!(deleted, Ok(Ok(_))),
        "the worker deleted the runs stream"
    );
    let admin = async_nats::jetstream::new(fleet.nats.admin().await.unwrap());
    assert!(
        admin.get_stream(names.runs_stream()).await.is_ok(),
        "the stream is still there"
    );
}
