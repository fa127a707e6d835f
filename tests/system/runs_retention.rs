//! Retention that follows consumption: an ended run's task leaves the RUNS stream once its
//! events' age has passed (history deletes it), while a run still running stays; the ended run
//! is still answered (status, history) from what history kept. The events' age is 2 s here
//! (so the run-status records, kept as long, expire too: statuses come from history).

use std::time::Duration;

use async_nats::jetstream::stream::RawMessageErrorKind;
use serde_json::Value;
use switchboard_system_tests::{EVENTUAL, Options, TestPlatform, text_run};

/// Whether the RUNS stream still holds the message at `seq`.
async fn holds(stream: &async_nats::jetstream::stream::Stream, seq: u64) -> bool {
    match stream.get_raw_message(seq).await {
        Ok(_) => true,
        Err(err) if err.kind() == RawMessageErrorKind::NoMessageFound => false,
        Err(err) => panic!("cannot read RUNS at {seq}: {err}"),
    }
}

#[tokio::test]
async fn an_ended_run_leaves_the_runs_stream_after_its_events_age_and_a_running_one_stays() {
    let platform = TestPlatform::spawn_with(Options {
        events_max_age: Some(Duration::from_secs(2)),
        history_runs_sweep: Duration::from_secs(1),
        ..Default::default()
    })
    .await
    .unwrap();
    let js =
        async_nats::jetstream::new(async_nats::connect(&platform.infra.nats_url).await.unwrap());
    let runs = js
        .get_stream(platform.nats.names.runs_stream())
        .await
        .unwrap();
    let alice = platform.infra.token("alice");
    let api = platform.api();

    // A run that streams for minutes, then one that ends at once: their tasks follow.
    // About 20 s (a word every 200 ms).
    let words: Vec<String> = (0..100).map(|i| format!("w{i}")).collect();
    let long = text_run(
        &uuid::Uuid::new_v4().to_string(),
        "long",
        &format!("/slow {}", words.join(" ")),
    );
    let (status, _) = api.post_run(&alice, &long).await.unwrap();
    assert_eq!(status, 202);
    let long_seq = runs.get_info().await.unwrap().state.last_sequence;
    let short = text_run(&uuid::Uuid::new_v4().to_string(), "short", "hello");
    let events: Vec<Value> = api.stream_run(&alice, &short).await.unwrap();
    assert_eq!(events.last().unwrap()["type"], "RUN_FINISHED");
    let short_seq = runs.get_info().await.unwrap().state.last_sequence;
    assert!(short_seq > long_seq);
    assert!(holds(&runs, short_seq).await && holds(&runs, long_seq).await);

    // History deletes the ended run's task once the events' age (2 s here) has passed.
    let deadline = tokio::time::Instant::now() + EVENTUAL * 3;
    while holds(&runs, short_seq).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the ended run was never deleted from RUNS"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A running run stays (it could leave only two seconds after its end).
    let (_, long_status) = api
        .get_runs(&alice, "/api/v1/agent/runs/long")
        .await
        .unwrap();
    if long_status["status"] == "running" {
        assert!(holds(&runs, long_seq).await, "a running run stays");
    }

    // The ended run is still answered from history.
    let status = api
        .wait_for_status(&alice, "short", "completed")
        .await
        .unwrap();
    assert_eq!(status["runId"], "short");
    let thread = short["threadId"].as_str().unwrap();
    api.wait_for_history(&alice, thread, |h| {
        h["messages"].as_array().is_some_and(|m| m.len() == 2)
    })
    .await
    .unwrap();

    // Once ended, the long one goes too.
    let deadline = tokio::time::Instant::now() + EVENTUAL * 4;
    while holds(&runs, long_seq).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the long run was never deleted from RUNS once it ended"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    api.wait_for_status(&alice, "long", "completed")
        .await
        .unwrap();
}
