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

use std::collections::BTreeSet;

use serde_json::{Value, json};
use switchboard_system_tests::fake_agent::FakeAgent;

/// The metric names the PromQL `expressions` use (`switchboard_*` and `http_*`), a histogram's
/// `_bucket`, `_sum` and `_count` series as the histogram.
/// `expr` without what names labels, not metrics: label matchers (`{...}`) and grouping
/// clauses (`by (...)`, `without (...)`).
fn without_labels(expr: &str) -> String {
    let mut out = String::with_capacity(expr.len());
    let mut rest = expr;
    while !rest.is_empty() {
        let skip_to = if rest.starts_with('{') {
            Some('}')
        } else if ["by (", "by(", "without (", "without("]
            .iter()
            .any(|clause| rest.starts_with(clause))
        {
            Some(')')
        } else {
            None
        };
        match skip_to.and_then(|end| rest.find(end)) {
            Some(at) => rest = &rest[at + 1..],
            None => {
                let mut chars = rest.chars();
                out.extend(chars.next());
                rest = chars.as_str();
            }
        }
    }
    out
}

fn metric_names<'a>(expressions: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for expr in expressions {
        let expr = without_labels(expr);
        let expr = expr.as_str();
        for prefix in ["switchboard_", "http_", "gen_ai_"] {
            for (at, _) in expr.match_indices(prefix) {
                let before = expr[..at].chars().next_back();
                if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                    continue;
                }
                let name: String = expr[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                names.insert(histogram_base(&name).to_owned());
            }
        }
    }
    names
}

fn histogram_base(name: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name)
}

/// Every `expr` of the dashboard's JSON model (panels and their targets, at any depth).
fn dashboard_expressions(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", Value::String(expr)) => out.push(expr.clone()),
                    _ => dashboard_expressions(value, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| dashboard_expressions(v, out)),
        _ => {}
    }
}

/// Every rule's `expr` of the PrometheusRule: its value on the `expr:` line, or the block
/// indented below it (`expr: |`).
fn rule_expressions(yaml: &str) -> Vec<String> {
    let indent = |line: &str| line.len() - line.trim_start().len();
    let mut out = Vec::new();
    let mut lines = yaml.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(value) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        let mut expr = value.trim().trim_start_matches(['|', '>', '-']).to_owned();
        while let Some(next) = lines.next_if(|l| l.trim().is_empty() || indent(l) > indent(line)) {
            expr.push('\n');
            expr.push_str(next.trim());
        }
        out.push(expr);
    }
    out
}

/// The metric names of a scrape, a histogram's series as the histogram.
fn scraped_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| line.split(['{', ' ']).next())
        .map(|name| histogram_base(name).to_owned())
        .collect()
}

/// The streams of a prefix of our own (not [`ProcessPlatform`]'s), removed when dropped.
struct OwnPrefix(protocol::messaging::Names);

impl Drop for OwnPrefix {
    fn drop(&mut self) {
        test_support::remove_nats_prefix_blocking(
            test_support::Infra::from_env().nats_url,
            self.0.clone(),
        );
    }
}

/// The agents file of the worker, removed when dropped.
struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test]
async fn every_metric_the_dashboard_and_the_alerts_use_is_exported() {
    let root = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/k8s/components/monitoring"
    );
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{root}/dashboards/switchboard.json")).unwrap(),
    )
    .unwrap();
    let mut expressions = Vec::new();
    dashboard_expressions(&dashboard, &mut expressions);
    let alerts = std::fs::read_to_string(format!("{root}/alerts.yaml")).unwrap();
    let rules = rule_expressions(&alerts);
    assert!(
        rules.len() >= 4 && expressions.len() >= 10,
        "{rules:?} {expressions:?}"
    );
    expressions.extend(rules);
    let wanted = metric_names(expressions.iter().map(String::as_str));
    assert!(
        wanted.contains("switchboard_runs_finished_total")
            && wanted.contains("http_request_duration_seconds")
            && wanted.contains("gen_ai_client_token_usage"),
        "{wanted:?}"
    );

    // A healthy remote agent (its runs, first event and in-flight metrics) next to the model.
    let fake = FakeAgent::spawn().await.unwrap();
    let agents =
        TempFile(std::env::temp_dir().join(format!("sb-agents-{}.toml", uuid::Uuid::new_v4())));
    std::fs::write(
        &agents.0,
        format!(
            "[[agents]]\nname = \"fake-ok\"\nurl = \"{}\"\ndescription = \"fake agent ok\"\n",
            fake.url("/ok")
        ),
    )
    .unwrap();
    let prefix = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let names = OwnPrefix(protocol::messaging::Names::new(&prefix).unwrap());
    let agents_file = agents.0.to_string_lossy().into_owned();
    // The default agent on a model (its token and duration metrics on the dashboard).
    let model = switchboard_system_tests::fake_model::spawn().await.unwrap();
    let platform = ProcessPlatform::spawn_with_env(&[
        ("SB_WORKER_AGENTS_FILE", &agents_file),
        ("SB_NATS_PREFIX", &prefix),
        ("SB_OPENAI_BASE_URL", &model),
        ("SB_OPENAI_MODEL", "dashboard-model"),
        ("SB_OPENAI_API_KEY", "sk-test"),
    ])
    .await
    .unwrap();
    let http = &platform.http;
    let alice = platform.infra.token("alice");

    // A run and its retry (accepted, retries recognised, started, finished, in flight).
    let thread = uuid::Uuid::new_v4().to_string();
    for _ in 0..2 {
        let (status, body) = platform
            .api()
            .post_run(&alice, &text_run(&thread, "dashboard-1", "hello"))
            .await
            .unwrap();
        assert_eq!(status, 202, "{body}");
    }
    // A remote agent's run followed over SSE (an open stream while it lasts).
    let mut body = text_run(&uuid::Uuid::new_v4().to_string(), "dashboard-2", "hi");
    body["forwardedProps"] = json!({"agent": "fake-ok"});
    let events = platform.api().stream_run(&alice, &body).await.unwrap();
    assert_eq!(
        events.last().map(|event| event["type"].clone()),
        Some(json!("RUN_FINISHED")),
        "{events:?}"
    );
    // Requests on history's and attachments' NATS endpoints whose reply is no caller's inbox.
    let nats = async_nats::connect(&platform.infra.nats_url).await.unwrap();
    for subject in [
        names.0.history_progress_subject(),
        names.0.attachments_resolve_subject(),
    ] {
        nats.publish_with_reply(subject, "not-an-inbox.metrics".to_owned(), "{}".into())
            .await
            .unwrap();
    }
    nats.flush().await.unwrap();

    let services = [
        &platform.urls.runs,
        &platform.urls.history,
        &platform.urls.attachments,
        &platform.urls.worker,
    ];
    let deadline = tokio::time::Instant::now() + EVENTUAL;
    loop {
        let mut scraped = BTreeSet::new();
        for base in services {
            scraped.extend(scraped_names(&scrape(http, base).await));
        }
        let missing: Vec<_> = wanted.difference(&scraped).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dashboard or the alerts use metrics no service exports: {missing:?}\n\
             exported: {scraped:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
fn label_names_in_matchers_and_groupings_are_not_taken_for_metrics() {
    let names = metric_names([
        "histogram_quantile(0.5, sum by (le, gen_ai_request_model) \
         (rate(gen_ai_client_operation_duration_seconds_bucket{gen_ai_token_type=\"input\"}[5m])))",
        "sum without (gen_ai_token_type) (switchboard_runs_in_flight)",
    ]);
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        [
            "gen_ai_client_operation_duration_seconds",
            "switchboard_runs_in_flight"
        ]
    );
}
