//! One owner cannot stall a runs replica for everyone (findings H2 and L6 of the security review),
//! against the compiled binaries, each service its own process as deployed:
//! - worst-case `POST /api/v1/agents/compatibility` requests (the review's reproduction body,
//!   and the most matching a pair can force) sent at once are each answered, computed or refused
//!   naming the limit, while another owner's run is accepted and completes;
//! - past the lookup burst, status, cancel, events and WebSocket reconnects answer 429 with
//!   `Retry-After` and the error envelope naming the budget, for that owner only.

use std::time::Duration;

use futures::future::join_all;
use serde_json::{Value, json};
use switchboard_system_tests::{ProcessPlatform, read_sse, text_run};

/// How long one worst-case request may take to be answered. Generous for a debug build on a
/// busy machine; without the bound, the review's request took seconds of CPU in a release
/// build (minutes in a debug one) on the async runtime.
const ANSWERED_WITHIN: Duration = Duration::from_secs(60);

/// The review's reproduction: 256 required output parts whose name and content type are ~430
/// literal characters with six `{a,b}` groups, against 256 required input parts that match none
/// of them. 252,709 bytes of JSON, under the 256 KiB body limit.
fn review_body() -> String {
    let groups = "{a,b}".repeat(6);
    let from: Vec<Value> = (0..256)
        .map(|_| {
            json!({"name": format!("/{groups}{}", "x".repeat(430)),
                "contentType": format!("{groups}/{}", "y".repeat(400)), "required": true})
        })
        .collect();
    let to: Vec<Value> = (0..256)
        .map(|_| json!({"name": "/n", "contentType": "n/n", "required": true}))
        .collect();
    let body = json!({"from": {"parts": from}, "to": {"parts": to}}).to_string();
    assert!(
        body.len() > 250_000 && body.len() <= 256 * 1024,
        "{}",
        body.len()
    );
    body
}

/// The most matching a pair can force within the expansion limits (64 words of 64 bytes per
/// pattern): every word of an output name matched by the input's name pattern, the content
/// type failing on the 33rd word, for 128 x 128 pairs: ~150 M units of work unbounded.
fn matching_body() -> String {
    let groups = "{a,b}".repeat(6);
    let from: Vec<Value> = (0..128)
        .map(|_| {
            json!({"name": format!("/{groups}{}", "x".repeat(57)),
                "contentType": format!("{groups}/{}", "y".repeat(57)), "required": true})
        })
        .collect();
    let to: Vec<Value> = (0..128)
        .map(|_| {
            json!({"name": format!("/{}{}", "[ab]".repeat(6), "x".repeat(57)),
                "contentType": format!("a{}/{}", "[ab]".repeat(5), "y".repeat(57))})
        })
        .collect();
    json!({"from": {"parts": from}, "to": {"parts": to}}).to_string()
}

/// What one request was answered: status, `Retry-After`, body.
async fn post_compatibility(
    http: &reqwest::Client,
    runs: &str,
    token: &str,
    body: String,
) -> (u16, Option<String>, Value) {
    let response = http
        .post(format!("{runs}/api/v1/agents/compatibility"))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .timeout(ANSWERED_WITHIN)
        .body(body)
        .send()
        .await
        .unwrap_or_else(|err| panic!("a worst-case request was not answered: {err:?}"));
    answer(response).await
}

async fn answer(response: reqwest::Response) -> (u16, Option<String>, Value) {
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    (
        status,
        retry_after,
        response.json().await.unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn worst_case_compatibility_requests_are_each_answered_while_another_owners_run_completes() {
    let platform = ProcessPlatform::spawn().await.unwrap();
    let (alice, bob) = (platform.infra.token("alice"), platform.infra.token("bob"));
    let runs = platform.urls.runs.clone();
    // Twelve at once, six of each: more than the per-owner burst of ten.
    let (review, matching) = (review_body(), matching_body());
    let attacks = join_all((0..12).map(|i| {
        let body = if i % 2 == 0 {
            review.clone()
        } else {
            matching.clone()
        };
        let (http, runs, alice) = (platform.http.clone(), runs.clone(), alice.clone());
        async move {
            (
                i % 2 == 0,
                post_compatibility(&http, &runs, &alice, body).await,
            )
        }
    }));
    let other_owner = async {
        // Once the attack is under way.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let thread = uuid::Uuid::new_v4().to_string();
        let (status, body) = platform
            .api()
            .post_run(&bob, &text_run(&thread, "meanwhile", "hello"))
            .await
            .unwrap();
        assert_eq!(
            status, 202,
            "bob's run is accepted during the attack: {body}"
        );
        platform
            .api()
            .wait_for_status(&bob, "meanwhile", "completed")
            .await
            .unwrap()
    };
    let (answers, bobs_run) = tokio::join!(attacks, other_owner);
    assert_eq!(bobs_run["status"], "completed");

    let (mut computed, mut refused, mut throttled) = (0, 0, 0);
    for (is_review, (status, retry_after, body)) in answers {
        match status {
            200 => {
                assert!(is_review, "the matching case is over the limit: {body}");
                assert_eq!(body["compatible"], false);
                assert_eq!(
                    body["incompatibilities"].as_array().map(Vec::len),
                    Some(512),
                    "every part of the review's pair reported"
                );
                computed += 1;
            }
            422 => {
                assert!(!is_review, "the review's case is computed: {body}");
                let message = body["error"]["message"].as_str().unwrap_or_default();
                assert!(
                    message.contains("more than 16777216 units of work"),
                    "the refusal names the limit: {body}"
                );
                refused += 1;
            }
            429 => {
                assert!(retry_after.is_some(), "429 without Retry-After: {body}");
                let message = body["error"]["message"].as_str().unwrap_or_default();
                assert!(
                    message.contains("too many compatibility checks: at most 30 a minute"),
                    "the 429 names the budget: {body}"
                );
                throttled += 1;
            }
            other => panic!("a worst-case request answered {other}: {body}"),
        }
    }
    assert!(
        computed >= 1 && refused >= 1,
        "{computed} computed, {refused} refused"
    );
    assert!(
        throttled >= 1,
        "twelve at once are over the burst of ten: {throttled} throttled"
    );
}

/// The status of a WebSocket upgrade, its `Retry-After` and its error body, if refused.
async fn websocket_refusal(
    runs: &str,
    token: &str,
    query: &str,
) -> Option<(u16, Option<String>, Value)> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    let url = format!("{}/websocket{query}", runs.replacen("http", "ws", 1));
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    match tokio_tungstenite::connect_async(request).await {
        Ok(_) => None,
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => Some((
            response.status().as_u16(),
            response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            response
                .body()
                .as_deref()
                .and_then(|body| serde_json::from_slice(body).ok())
                .unwrap_or(Value::Null),
        )),
        Err(err) => panic!("the WebSocket failed otherwise: {err}"),
    }
}

#[tokio::test]
async fn past_the_lookup_burst_status_cancel_events_and_reconnects_answer_429_for_that_owner_only()
{
    let platform = ProcessPlatform::spawn_with_env(&[
        ("SB_RUNS_LOOKUP_RATE_PER_MINUTE", "1"),
        ("SB_RUNS_LOOKUP_RATE_BURST", "5"),
    ])
    .await
    .unwrap();
    let (alice, bob) = (platform.infra.token("alice"), platform.infra.token("bob"));
    let runs = &platform.urls.runs;
    let http = &platform.http;

    // Bob's run, followed on the stream its POST answers (no lookup).
    let thread = uuid::Uuid::new_v4().to_string();
    let response = http
        .post(format!("{runs}/api/v1/agent/runs"))
        .bearer_auth(&bob)
        .header("accept", "text/event-stream")
        .json(&text_run(&thread, "bobs", "hello"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let events = read_sse(response, None).await.unwrap();
    assert_eq!(
        events.last().map(|e| e.data["type"].clone()),
        Some(json!("RUN_FINISHED"))
    );

    // Alice spends her burst looking up a run that does not exist.
    for _ in 0..5 {
        let (status, body) = platform
            .api()
            .get_runs(&alice, "/api/v1/agent/runs/nope")
            .await
            .unwrap();
        assert_eq!(status, 404, "within the burst: {body}");
    }
    let named = |body: &Value| {
        body["error"]["code"] == "rate_limited"
            && body["error"]["message"].as_str().is_some_and(|m| {
                m.contains("too many run lookups") && m.contains("SB_RUNS_LOOKUP_RATE_PER_MINUTE")
            })
    };
    let status = http
        .get(format!("{runs}/api/v1/agent/runs/nope"))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    let cancel = http
        .post(format!("{runs}/api/v1/agent/runs/nope/cancel"))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    let events = http
        .get(format!("{runs}/api/v1/agent/runs/nope/events"))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    for (what, response) in [("status", status), ("cancel", cancel), ("events", events)] {
        let (code, retry_after, body) = answer(response).await;
        assert_eq!(code, 429, "{what} past the burst: {body}");
        let secs: u64 = retry_after
            .as_deref()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{what}: 429 without a Retry-After in seconds"));
        assert!(
            (1..=60).contains(&secs),
            "{what}: Retry-After {secs} s, want the time to the next lookup (one a minute)"
        );
        assert!(
            named(&body),
            "{what}: the envelope names the budget: {body}"
        );
    }
    let (code, retry_after, body) = websocket_refusal(runs, &alice, "?last_message_id=nope:1")
        .await
        .expect("a reconnect past the burst is refused");
    assert_eq!(code, 429, "{body}");
    assert!(retry_after.is_some(), "reconnect: 429 without Retry-After");
    assert!(
        named(&body),
        "reconnect: the envelope names the budget: {body}"
    );
    // A WebSocket that reconnects to nothing is not a lookup: Alice may still connect.
    assert!(websocket_refusal(runs, &alice, "").await.is_none());

    // Bob is not affected: his status, cancel, events and reconnect are answered.
    let (code, body) = platform
        .api()
        .get_runs(&bob, "/api/v1/agent/runs/bobs")
        .await
        .unwrap();
    assert_eq!(
        (code, &body["status"]),
        (200, &json!("completed")),
        "{body}"
    );
    let (code, body) = platform.api().cancel_run(&bob, "bobs").await.unwrap();
    assert_eq!(code, 202, "{body}");
    let response = http
        .get(format!("{runs}/api/v1/agent/runs/bobs/events"))
        .bearer_auth(&bob)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        websocket_refusal(runs, &bob, "?last_message_id=bobs:1")
            .await
            .is_none(),
        "bob reconnects"
    );
}
