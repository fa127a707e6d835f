//! Crashes: a service killed mid-run loses nothing and duplicates nothing.

use serde_json::Value;
use switchboard_system_tests::{ProcessPlatform, text_run};

#[tokio::test]
async fn history_killed_mid_run_and_restarted_keeps_every_message_once_in_order() {
    let mut platform = ProcessPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let thread = uuid::Uuid::new_v4().to_string();
    let words: Vec<String> = (0..25).map(|i| format!("w{i}")).collect();
    let text = format!("/slow {}", words.join(" "));
    let (status, _) = platform
        .api()
        .post_run(&alice, &text_run(&thread, "crash", &text))
        .await
        .unwrap();
    assert_eq!(status, 202);
    // Wait until history has written part of the reply, then kill it hard.
    platform
        .api()
        .wait_for_history(&alice, &thread, |h| {
            h["messages"][1]["content"]
                .as_str()
                .is_some_and(|c| c.len() > "You said: /slow w0".len())
        })
        .await
        .unwrap();
    platform.kill("history").unwrap();
    // The run goes on without history.
    platform
        .api()
        .wait_for_status(&alice, "crash", "completed")
        .await
        .unwrap();
    platform.restart("history").await.unwrap();
    let expected = format!("You said: {text}");
    let history = platform
        .api()
        .wait_for_history(&alice, &thread, |h| {
            h["messages"][1]["content"] == expected.as_str()
        })
        .await
        .unwrap();
    let messages = history["messages"].as_array().unwrap();
    assert_eq!(
        messages.len(),
        2,
        "one user message and one reply, nothing twice: {history}"
    );
    let seqs: Vec<i64> = messages
        .iter()
        .map(|m| m["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, [1, 2]);
    assert_eq!(messages[0]["content"], Value::String(text));
}

#[tokio::test]
async fn a_worker_killed_mid_run_ends_the_run_failed_after_its_events_with_nothing_repeated() {
    let mut platform = ProcessPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let thread = uuid::Uuid::new_v4().to_string();
    let words: Vec<String> = (0..40).map(|i| format!("w{i}")).collect();
    let (status, _) = platform
        .api()
        .post_run(
            &alice,
            &text_run(&thread, "lost", &format!("/slow {}", words.join(" "))),
        )
        .await
        .unwrap();
    assert_eq!(status, 202);
    // Read the stream until the reply is under way, then kill the worker hard.
    let response = platform
        .http
        .get(format!(
            "{}/api/v1/agent/runs/lost/events",
            platform.urls.runs
        ))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    let before = switchboard_system_tests::read_sse(response, Some(5))
        .await
        .unwrap();
    platform.kill("worker").unwrap();
    platform.restart("worker").await.unwrap();
    let status = platform
        .api()
        .wait_for_status(&alice, "lost", "failed")
        .await
        .unwrap();
    assert!(
        status["error"]
            .as_str()
            .is_some_and(|e| e.contains("stopped")),
        "{status}"
    );
    // The log (every event as stored): what the first worker published, then one RUN_ERROR;
    // no event twice.
    let response = platform
        .http
        .get(format!(
            "{}/api/v1/agent/runs/lost/events?compact=false",
            platform.urls.runs
        ))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    let log = switchboard_system_tests::read_sse(response, None)
        .await
        .unwrap();
    assert_eq!(
        &log[..5],
        &before[..],
        "the events seen before the kill are the log's first"
    );
    let seqs: Vec<u64> = log
        .iter()
        .map(|f| f.id.as_deref().unwrap().parse().unwrap())
        .collect();
    assert_eq!(seqs, (1..=log.len() as u64).collect::<Vec<_>>());
    let last = &log.last().unwrap().data;
    assert_eq!(
        (&last["type"], &last["code"]),
        (&Value::from("RUN_ERROR"), &Value::from("worker_lost"))
    );
    let starts = log
        .iter()
        .filter(|f| f.data["type"] == "RUN_STARTED")
        .count();
    assert_eq!(starts, 1, "the agent was not run a second time");
    // History holds the partial reply once: exactly the text the log streamed.
    let streamed = switchboard_system_tests::streamed_text(log.iter().map(|f| &f.data));
    let full = format!("You said: /slow {}", words.join(" "));
    assert!(
        streamed.starts_with("You said: /slow") && streamed.len() < full.len(),
        "a partial reply: {streamed}"
    );
    let history = platform
        .api()
        .wait_for_history(&alice, &thread, |h| {
            h["messages"][1]["content"] == streamed.as_str()
        })
        .await
        .unwrap();
    assert_eq!(
        history["messages"].as_array().unwrap().len(),
        2,
        "{history}"
    );
}
