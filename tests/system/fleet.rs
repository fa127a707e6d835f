//! The worker fleet: capacity grows with replicas (each pulls only what it has room for), and
//! one owner's flood of runs does not hold every slot.

use serde_json::Value;
use switchboard_system_tests::{EVENTUAL, Options, TestPlatform, text_run};

fn thread() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A run of about `words` x 200 ms.
fn slow(words: usize) -> String {
    let words: Vec<String> = (0..words).map(|i| format!("w{i}")).collect();
    format!("/slow {}", words.join(" "))
}

async fn run_status(platform: &TestPlatform, token: &str, run: &str) -> String {
    let (_, body): (u16, Value) = platform
        .api()
        .get_runs(token, &format!("/api/v1/agent/runs/{run}"))
        .await
        .unwrap();
    body["status"].as_str().unwrap_or("unknown").to_owned()
}

#[tokio::test]
async fn a_second_worker_replica_adds_capacity() {
    let platform = TestPlatform::spawn_with(Options {
        worker_concurrency: 1,
        max_runs_per_owner: 1,
        ..Options::default()
    })
    .await
    .unwrap();
    let _second = platform.spawn_worker_replica().await.unwrap();
    let (alice, bob) = (platform.infra.token("alice"), platform.infra.token("bob"));
    for (token, run) in [(&alice, "a1"), (&bob, "b1")] {
        let (status, body) = platform
            .api()
            .post_run(token, &text_run(&thread(), run, &slow(20)))
            .await
            .unwrap();
        assert_eq!(status, 202, "{body}");
    }
    // One slot per replica: with two replicas both runs go on at the same time.
    let deadline = tokio::time::Instant::now() + EVENTUAL;
    loop {
        let (a, b) = (
            run_status(&platform, &alice, "a1").await,
            run_status(&platform, &bob, "b1").await,
        );
        if a == "running" && b == "running" {
            break;
        }
        assert!(
            a != "completed" && b != "completed",
            "one ran after the other: a1 {a}, b1 {b}"
        );
        assert!(tokio::time::Instant::now() < deadline, "a1 {a}, b1 {b}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn one_owner_flooding_long_runs_leaves_room_for_another_owner() {
    let platform = TestPlatform::spawn_with(Options {
        worker_concurrency: 2,
        max_runs_per_owner: 1,
        ..Options::default()
    })
    .await
    .unwrap();
    let (alice, bob) = (platform.infra.token("alice"), platform.infra.token("bob"));
    let floods = ["f1", "f2", "f3"];
    for run in floods {
        let (status, _) = platform
            .api()
            .post_run(&alice, &text_run(&thread(), run, &slow(15)))
            .await
            .unwrap();
        assert_eq!(status, 202);
    }
    platform
        .api()
        .wait_for_status(&alice, "f1", "running")
        .await
        .unwrap();
    let (status, _) = platform
        .api()
        .post_run(&bob, &text_run(&thread(), "quick", "hello"))
        .await
        .unwrap();
    assert_eq!(status, 202);
    platform
        .api()
        .wait_for_status(&bob, "quick", "completed")
        .await
        .unwrap();
    // Bob's run did not wait for Alice's flood: most of it is still to do.
    let mut unfinished = 0;
    for run in floods {
        if run_status(&platform, &alice, run).await != "completed" {
            unfinished += 1;
        }
    }
    assert!(unfinished >= 2, "only {unfinished} of alice's runs left");
}
