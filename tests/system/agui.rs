//! AG-UI's own client, `HttpAgent` from npm `@ag-ui/client`, unchanged, against the running
//! services: a two-turn conversation on the AG-UI route, the events it reports, and what the
//! server kept. Needs `node` and `tests/agui/node_modules` (`scripts/test.sh` installs both).

use std::time::Duration;

use serde_json::Value;
use switchboard_system_tests::TestPlatform;

fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Runs the HttpAgent driver with `env` and returns its report (fails on a driver error).
async fn drive(env: &[(&str, &str)]) -> Value {
    let root = workspace_root();
    assert!(
        root.join("tests/agui/node_modules/@ag-ui/client").exists(),
        "tests/agui/node_modules is missing: run scripts/test.sh (or npm ci in tests/agui)"
    );
    let mut command = tokio::process::Command::new("node");
    command
        .arg("tests/agui/driver.mjs")
        .current_dir(&root)
        .kill_on_drop(true);
    for (name, value) in env {
        command.env(name, value);
    }
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("the driver finished in time")
        .unwrap_or_else(|e| panic!("cannot run node (is Node.js installed?): {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "HttpAgent failed: {stderr}\n{stdout}"
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("the driver printed no JSON ({e}): {stdout}\n{stderr}"))
}

#[tokio::test]
async fn agui_http_agent_runs_a_two_turn_conversation_and_the_server_keeps_it_once() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let thread = format!("agui-{}", uuid::Uuid::new_v4());
    let runs = format!("{}/api/v1/agent/ag-ui", platform.urls.runs);
    let report = drive(&[
        ("SB_AGUI_URL", &runs),
        ("SB_TOKEN", &alice),
        ("SB_THREAD_ID", &thread),
        ("SB_TURNS", r#"["hello agent", "and again"]"#),
    ])
    .await;

    for (turn, text) in report["turns"]
        .as_array()
        .unwrap()
        .iter()
        .zip(["hello agent", "and again"])
    {
        let kinds: Vec<&str> = turn["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds.first(), Some(&"RUN_STARTED"), "{kinds:?}");
        assert_eq!(kinds.last(), Some(&"RUN_FINISHED"), "{kinds:?}");
        assert_eq!(
            kinds.iter().filter(|k| **k == "TEXT_MESSAGE_START").count(),
            1,
            "{kinds:?}"
        );
        // The client assembled the streamed reply into one new assistant message.
        let new = turn["newMessages"].as_array().unwrap();
        assert_eq!(new.len(), 1, "{new:?}");
        assert_eq!(new[0]["role"], "assistant");
        assert_eq!(new[0]["content"], format!("You said: {text}"));
    }
    let messages: Vec<(&str, &str)> = report["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    assert_eq!(
        messages,
        [
            ("user", "hello agent"),
            ("assistant", "You said: hello agent"),
            ("user", "and again"),
            ("assistant", "You said: and again"),
        ]
    );
    // The server kept the conversation once, though the client resent the first turn.
    let history = platform
        .api()
        .wait_for_history(&alice, &thread, |h| {
            h["messages"]
                .as_array()
                .is_some_and(|m| m.len() >= 4 && m[3]["content"] == "You said: and again")
        })
        .await
        .unwrap();
    let kept: Vec<(&str, &str)> = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    assert_eq!(kept, messages);
}

#[tokio::test]
async fn agui_http_agent_gets_an_interrupt_and_answers_it_with_its_own_resume() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let thread = format!("agui-{}", uuid::Uuid::new_v4());
    let runs = format!("{}/api/v1/agent/ag-ui", platform.urls.runs);
    let report = drive(&[
        ("SB_AGUI_URL", &runs),
        ("SB_TOKEN", &alice),
        ("SB_THREAD_ID", &thread),
        ("SB_TURNS", r#"["/ask radio:120 Notify how?"]"#),
        ("SB_ANSWER", "sms"),
    ])
    .await;
    // The client parsed our RUN_FINISHED as an interrupt outcome and holds it.
    let pending = report["pendingInterrupts"].as_array().unwrap();
    assert_eq!(pending.len(), 1, "{report:#}");
    assert_eq!(pending[0]["reason"], "human_input");
    assert_eq!(
        pending[0]["responseSchema"]["enum"],
        serde_json::json!(["email", "sms", "push"])
    );
    assert!(pending[0]["expiresAt"].as_str().is_some());
    // Its own resume answered it; the agent got the answer; nothing is pending any more.
    let resumed = &report["resumed"];
    assert_eq!(resumed["pendingAfter"], serde_json::json!([]));
    assert_eq!(
        resumed["newMessages"][0]["content"], "You answered: sms",
        "{resumed:#}"
    );
}
