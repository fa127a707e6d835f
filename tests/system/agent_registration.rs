//! Registration follows the fleet: the agents a worker serves are in the catalog while it runs
//! (its cards registered again every 15 s, each kept a minute), an agent no worker serves any
//! more leaves it within a minute, and a run that names that agent is refused, never queued.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchboard_system_tests::{TestPlatform, free_port, text_run};

async fn agent_names(platform: &TestPlatform, token: &str) -> Vec<String> {
    let (status, body) = platform
        .api()
        .get_runs(token, "/api/v1/agents")
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    body["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Polls the catalog every 250 ms until `done` holds for its names, or fails after `within`.
async fn wait_for_catalog(
    platform: &TestPlatform,
    token: &str,
    within: Duration,
    what: &str,
    done: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let deadline = Instant::now() + within;
    loop {
        let names = agent_names(platform, token).await;
        if done(&names) {
            return names;
        }
        assert!(
            Instant::now() < deadline,
            "{what} within {within:?}: {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn an_agent_no_worker_serves_any_more_leaves_the_catalog_and_runs_naming_it_are_refused() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let dir = std::env::temp_dir().join(format!("sb-registration-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("agents.toml");
    // Nobody listens there: the agent is never called, only registered.
    let port = free_port().unwrap();
    std::fs::write(
        &file,
        format!(
            "[[agents]]\nname = \"short-lived\"\nurl = \"http://127.0.0.1:{port}/\"\n\
             description = \"Served by one worker replica only.\"\n"
        ),
    )
    .unwrap();
    let replica = platform
        .spawn_worker_replica_with(|config| config.agents_file = Some(file.clone()))
        .await
        .unwrap();
    let started = Instant::now();
    wait_for_catalog(
        &platform,
        &alice,
        Duration::from_secs(10),
        "the replica's agent listed",
        |names| names.iter().any(|n| n == "short-lived"),
    )
    .await;
    let (status, body) = platform
        .api()
        .get_runs(&alice, "/api/v1/agents")
        .await
        .unwrap();
    assert_eq!(status, 200);
    let card = body["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "short-lived")
        .unwrap();
    assert_eq!(card["description"], "Served by one worker replica only.");
    assert_eq!(
        card["inputSchema"],
        json!({"parts": [{"contentType": "text/{plain,markdown}"}, {"name": "/attachments/*"}]})
    );

    replica.cancel();
    let names = wait_for_catalog(
        &platform,
        &alice,
        Duration::from_secs(90),
        "the stopped replica's agent gone",
        |names| !names.iter().any(|n| n == "short-lived"),
    )
    .await;
    // The platform's own worker registered its agents when it started, more than a minute ago
    // by now: registered again since, they are still there.
    assert!(
        started.elapsed() > Duration::from_secs(60),
        "the card went before its minute was up: {:?}",
        started.elapsed()
    );
    assert_eq!(
        names,
        ["echo", "echo-text"],
        "the running worker's agents stay"
    );

    let thread = uuid::Uuid::new_v4().to_string();
    let mut run = text_run(&thread, "r1", "hello?");
    run["forwardedProps"] = json!({"agent": "short-lived"});
    let (status, body) = platform.api().post_run(&alice, &run).await.unwrap();
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["field"], "/forwardedProps/agent", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("short-lived")),
        "{body}"
    );
    let _: Value = body;
}

#[tokio::test]
async fn without_the_test_agents_only_the_configured_agents_are_offered_and_echo_is_refused() {
    let dir = std::env::temp_dir().join(format!("sb-no-test-agents-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("agents.toml");
    let port = free_port().unwrap();
    std::fs::write(
        &file,
        format!(
            "[[agents]]\nname = \"assistant\"\nurl = \"http://127.0.0.1:{port}/\"\n\
             description = \"The deployment's agent.\"\ndefault = true\n"
        ),
    )
    .unwrap();
    let platform = TestPlatform::spawn_with(switchboard_system_tests::Options {
        agents_file: Some(file),
        worker_test_agents: false,
        ..Default::default()
    })
    .await
    .unwrap();
    let alice = platform.infra.token("alice");
    let names = wait_for_catalog(
        &platform,
        &alice,
        Duration::from_secs(10),
        "the configured agent listed",
        |names| !names.is_empty(),
    )
    .await;
    assert_eq!(names, ["assistant"], "no test agent is offered");
    let (_, body) = platform
        .api()
        .get_runs(&alice, "/api/v1/agents")
        .await
        .unwrap();
    assert_eq!(body["default"], "assistant", "{body}");
    for agent in ["echo", "echo-text"] {
        let mut run = text_run(
            &uuid::Uuid::new_v4().to_string(),
            "r1",
            "/file-large a.txt 102400",
        );
        run["forwardedProps"] = json!({"agent": agent});
        let (status, body) = platform.api().post_run(&alice, &run).await.unwrap();
        assert_eq!(status, 422, "{agent}: {body}");
        assert_eq!(body["error"]["field"], "/forwardedProps/agent", "{body}");
    }
}
