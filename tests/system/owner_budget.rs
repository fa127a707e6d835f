//! The bytes of runs one owner may start per day hold across runs replicas
//! (`SB_RUNS_OWNER_BYTES_PER_DAY`): past them every replica answers 403 `quota_exceeded` naming
//! the setting and when it resets, and another owner's runs are still accepted.

use serde_json::{Value, json};
use switchboard_system_tests::{Options, TestPlatform, text_run};

/// A run of about 20 KiB (most of it in `state`, which the runs service stores as sent).
fn big_run(n: usize) -> Value {
    let mut run = text_run(&uuid::Uuid::new_v4().to_string(), &format!("r{n}"), "hello");
    run["state"] = json!({"pad": "y".repeat(20 * 1024)});
    run
}

async fn post(
    platform: &TestPlatform,
    runs: &str,
    token: &str,
    body: &Value,
) -> (u16, Option<String>, Value) {
    let response = platform
        .http
        .post(format!("{runs}/api/v1/agent/runs"))
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let retry = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    (status, retry, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn an_owners_bytes_per_day_hold_across_runs_replicas_and_another_owner_is_unaffected() {
    let budget: u64 = 256 * 1024;
    let platform = TestPlatform::spawn_with(Options {
        runs_owner_bytes_per_day: budget,
        ..Default::default()
    })
    .await
    .unwrap();
    let (second, _stop) = platform.spawn_runs_replica().await.unwrap();
    let replicas = [platform.urls.runs.clone(), second];
    let alice = platform.infra.token("alice");
    let bob = platform.infra.token("bob");
    let size = serde_json::to_vec(&big_run(0)).unwrap().len() as u64;

    let mut accepted = 0u64;
    let mut refusal = None;
    for n in 0..100 {
        let (status, retry, body) = post(&platform, &replicas[n % 2], &alice, &big_run(n)).await;
        match status {
            202 => accepted += 1,
            403 => {
                refusal = Some((retry, body));
                break;
            }
            other => panic!("run {n}: {other} {body}"),
        }
    }
    let (retry, body) = refusal.expect("the budget was never met: 100 runs of ~20 KiB accepted");
    // Each replica leases the day's bytes in chunks; what it holds unspent is less than a run.
    let most = budget / size;
    assert!(
        accepted <= most && accepted + 3 >= most,
        "{accepted} runs of {size} bytes accepted under a budget of {budget}"
    );
    assert_eq!(body["error"]["code"], "quota_exceeded", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("SB_RUNS_OWNER_BYTES_PER_DAY") && message.contains("00:00 UTC"),
        "{message}"
    );
    let retry: u64 = retry.expect("Retry-After").parse().unwrap();
    assert!((1..=86_400).contains(&retry), "Retry-After {retry}");
    // Both replicas refuse the owner now; another owner is accepted on both.
    for runs in &replicas {
        let (status, _, body) = post(&platform, runs, &alice, &big_run(1000)).await;
        assert_eq!(status, 403, "{runs}: {body}");
        let (status, _, body) = post(&platform, runs, &bob, &big_run(1001)).await;
        assert_eq!(status, 202, "{runs}: {body}");
    }
}
