//! The gateway (`scripts/gateway.sh`, nginx from `deploy/routes.tsv`): every public path
//! reaches its service on one origin, streams flow unbuffered, the WebSocket upgrades, and
//! nothing else of the services (health, metrics) is exposed.

use serde_json::json;
use switchboard_system_tests::gateway::{Gateway, Upstreams, workspace_root};
use switchboard_system_tests::{
    Options, TestPlatform, WsClient, free_port, read_sse, text_run, ws_done, ws_reply_text,
};

#[tokio::test]
async fn every_route_of_the_table_reaches_its_service_through_the_gateway_and_nothing_else_does() {
    let port = free_port().unwrap();
    let origin = format!("http://127.0.0.1:{port}");
    let platform = TestPlatform::spawn_with(Options {
        attachments_public_url: Some(origin.clone()),
        ..Options::default()
    })
    .await
    .unwrap();
    let gateway = Gateway::start(port, &Upstreams::single(&platform.urls), None)
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let alice = platform.infra.token("alice");

    let table = std::fs::read_to_string(workspace_root().join("deploy/routes.tsv")).unwrap();
    let mut routes = 0;
    for line in table
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
    {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (path, service) = (fields[1], fields[2]);
        // A prefix ending in "/" is only what is under it: ask for a route there (a thread's
        // stream).
        let path = if path.ends_with('/') {
            format!("{path}t1/events")
        } else {
            path.to_owned()
        };
        let response = http
            .get(format!("{}{path}", gateway.url))
            .bearer_auth(&alice)
            .send()
            .await
            .unwrap();
        let status = response.status();
        // Our services set x-request-id on every answer; nginx's own errors have none.
        assert!(
            response.headers().contains_key("x-request-id"),
            "{path}: answered by the gateway itself ({status}), not {service}"
        );
        let body = response.text().await.unwrap();
        assert!(
            !body.contains("no such route"),
            "{path} reached a service that does not serve it: {status} {body}"
        );
        routes += 1;
    }
    assert!(routes >= 10, "the table has the public routes");

    // Not public: health, readiness and metrics stay on the services' own ports.
    for path in ["/healthz", "/readyz", "/metrics", "/v1/chat/completions"] {
        let response = http
            .get(format!("{}{path}", gateway.url))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 404, "{path} is exposed");
        assert!(
            !response.headers().contains_key("x-request-id"),
            "{path} reached a service"
        );
    }

    // A run's events stream through the gateway as they happen, and resume there.
    let thread = uuid::Uuid::new_v4().to_string();
    let accepted = http
        .post(format!("{}/api/v1/agent/runs", gateway.url))
        .bearer_auth(&alice)
        .json(&text_run(&thread, "gw-1", "/slow through the gateway"))
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 202);
    let events = http
        .get(format!("{}/api/v1/agent/runs/gw-1/events", gateway.url))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(events.headers()["content-type"], "text/event-stream");
    // The first three events arrive while the run is still streaming (200 ms a word): nothing
    // waits for the response to end.
    let first = read_sse(events, Some(3)).await.unwrap();
    assert_eq!(first.len(), 3);
    let resumed = http
        .get(format!("{}/api/v1/agent/runs/gw-1/events", gateway.url))
        .bearer_auth(&alice)
        .header("Last-Event-ID", "3")
        .send()
        .await
        .unwrap();
    let rest = read_sse(resumed, None).await.unwrap();
    assert_eq!(rest.first().and_then(|f| f.id.as_deref()), Some("4"));
    assert_eq!(rest.last().unwrap().data["type"], "RUN_FINISHED");

    // The WebSocket upgrades through the gateway and a message gets its whole answer.
    let mut ws = WsClient::connect(&gateway.url, &alice, "").await.unwrap();
    let conversation = uuid::Uuid::new_v4().to_string();
    ws.send(&json!({
        "type": "user_message", "schema_type": "string", "id": "gw-ws-1",
        "conversation_id": conversation,
        "content": {"messages": [{"role": "user", "content": [{"type": "text", "text": "hello gateway"}]}]},
        "timestamp": "2025-01-13T10:00:00Z", "user": {"name": "string", "email": "string"},
        "schema_version": "string"
    }))
    .await
    .unwrap();
    let answer = ws.until(ws_done).await.unwrap();
    assert!(
        ws_reply_text(&answer).contains("hello gateway"),
        "{answer:?}"
    );
    ws.close().await.unwrap();
}
