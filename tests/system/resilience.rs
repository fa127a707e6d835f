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
