//! `/metrics` of every service binary: requests by route and status with latency histograms,
//! runs accepted, started and finished, runs in flight, consumer lag, open streams and the
//! verification queue, in the Prometheus text format.

use std::time::Duration;

use switchboard_system_tests::{EVENTUAL, ProcessPlatform, WsClient, text_run};

/// The value of the sample `name` whose labels include every `labels` pair.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
        (metric == name
            && labels
                .iter()
                .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
        .then(|| value.parse().ok())
        .flatten()
    })
}

async fn scrape(http: &reqwest::Client, base: &str) -> String {
    let response = http.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200, "{base}/metrics");
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    response.text().await.unwrap()
}

/// Scrapes `base` until `check` holds, or fails after [`EVENTUAL`] showing the last scrape.
async fn until(http: &reqwest::Client, base: &str, what: &str, check: impl Fn(&str) -> bool) {
    let deadline = tokio::time::Instant::now() + EVENTUAL;
    loop {
        let text = scrape(http, base).await;
        if check(&text) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} never showed in {base}/metrics:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn every_service_serves_prometheus_metrics_of_its_requests_runs_streams_and_queues() {
    let platform = ProcessPlatform::spawn().await.unwrap();
    let http = &platform.http;
    let api = platform.api();
    let alice = platform.infra.token("alice");
    let thread = uuid::Uuid::new_v4().to_string();

    let (status, _) = api
        .post_run(&alice, &text_run(&thread, "metrics-1", "hello"))
        .await
        .unwrap();
    assert_eq!(status, 202);
    let (status, _) = api
        .post_run(&alice, &text_run(&thread, "metrics-1", "hello"))
        .await
        .unwrap();
    assert_eq!(status, 202, "a retry");
    api.wait_for_history(&alice, &thread, |body| {
        body["messages"].as_array().is_some_and(|m| m.len() == 2)
    })
    .await
    .unwrap();

    let runs = scrape(http, &platform.urls.runs).await;
    let route = [("route", "/api/v1/agent/runs"), ("method", "POST")];
    assert_eq!(
        sample(
            &runs,
            "http_requests_total",
            &[route[0], route[1], ("status", "202")]
        ),
        Some(2.0),
        "{runs}"
    );
    assert_eq!(
        sample(&runs, "switchboard_runs_accepted_total", &[]),
        Some(1.0),
        "{runs}"
    );
    assert_eq!(
        sample(&runs, "switchboard_runs_retries_recognised_total", &[]),
        Some(1.0),
        "{runs}"
    );
    assert_eq!(
        sample(&runs, "http_request_duration_seconds_count", &route),
        Some(2.0),
        "{runs}"
    );
    assert_eq!(
        sample(
            &runs,
            "http_request_duration_seconds_bucket",
            &[route[0], ("le", "+Inf")]
        ),
        Some(2.0),
        "{runs}"
    );
    // An unknown path is one bounded label, not its raw path.
    let _ = http
        .get(format!(
            "{}/no/such/{}",
            platform.urls.runs,
            uuid::Uuid::new_v4()
        ))
        .send()
        .await;
    let runs = scrape(http, &platform.urls.runs).await;
    assert!(
        sample(
            &runs,
            "http_requests_total",
            &[("route", "unmatched"), ("status", "404")]
        )
        .is_some(),
        "{runs}"
    );
    assert!(!runs.contains("/no/such/"), "raw paths never become labels");

    until(http, &platform.urls.worker, "the finished run", |text| {
        sample(text, "switchboard_runs_started_total", &[]) == Some(1.0)
            && sample(
                text,
                "switchboard_runs_finished_total",
                &[("outcome", "completed")],
            ) == Some(1.0)
            && sample(text, "switchboard_runs_in_flight", &[]) == Some(0.0)
            && sample(
                text,
                "switchboard_consumer_pending_messages",
                &[("consumer", "worker")],
            ) == Some(0.0)
            && sample(
                text,
                "switchboard_consumer_ack_pending",
                &[("consumer", "worker")],
            ) == Some(0.0)
    })
    .await;

    let history = scrape(http, &platform.urls.history).await;
    let reads = [("route", "/api/v1/agent/history"), ("status", "200")];
    assert!(
        sample(&history, "http_requests_total", &reads).is_some_and(|n| n >= 1.0),
        "{history}"
    );
    until(
        http,
        &platform.urls.history,
        "history's consumers",
        |text| {
            ["history-runs", "history-events"].iter().all(|consumer| {
                sample(
                    text,
                    "switchboard_consumer_pending_messages",
                    &[("consumer", consumer)],
                ) == Some(0.0)
            })
        },
    )
    .await;

    until(
        http,
        &platform.urls.attachments,
        "the verification queue",
        |text| sample(text, "switchboard_verification_queue_depth", &[]) == Some(0.0),
    )
    .await;

    // An open WebSocket is counted while it is open, and not after.
    let ws = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();
    until(http, &platform.urls.runs, "the open WebSocket", |text| {
        sample(
            text,
            "switchboard_open_streams",
            &[("transport", "websocket")],
        ) == Some(1.0)
    })
    .await;
    ws.close().await.unwrap();
    until(http, &platform.urls.runs, "the closed WebSocket", |text| {
        sample(
            text,
            "switchboard_open_streams",
            &[("transport", "websocket")],
        ) == Some(0.0)
    })
    .await;
}
