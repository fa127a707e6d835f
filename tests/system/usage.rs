//! What runs cost, end to end: a model server (`fake_model`, a stand-in for the provider, which
//! this machine cannot reach) reports the tokens of every call; the run's terminal event, its status and
//! `GET /api/v1/agent/usage` show them with the run's times, and a token budget one owner spent
//! refuses that owner's next run on every runs replica while another owner goes on.

use std::time::Duration;

use serde_json::{Value, json};
use switchboard_system_tests::{Options, TestPlatform, stream_run, text_run};

async fn get_usage(platform: &TestPlatform, token: &str, query: &str) -> (u16, Value) {
    let response = platform
        .http
        .get(format!(
            "{}/api/v1/agent/usage?{query}",
            platform.urls.history
        ))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Polls the owner's usage until it counts `runs` runs (history writes them as it reads the
/// events), or fails after a minute.
async fn usage_with_runs(platform: &TestPlatform, token: &str, query: &str, runs: i64) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = get_usage(platform, token, query).await;
        assert_eq!(status, 200, "{body}");
        if body["total"]["runs"] == runs {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "usage never counted {runs} runs: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn usage_is_shown_on_the_run_and_by_day_thread_and_agent_and_a_spent_budget_refuses_the_next_run_everywhere()
 {
    let platform = TestPlatform::spawn_with(Options {
        openai: Some(worker::openai::OpenAiConfig {
            base_url: switchboard_system_tests::fake_model::spawn().await.unwrap(),
            model: "test-model".to_owned(),
            api_key: secrecy::SecretString::from("sk-test"),
            request_timeout: Duration::from_secs(10),
        }),
        // Every owner 40 tokens a day (one run of 43 spends it); bob unbounded.
        token_budgets: platform::tokens::TokenBudgets::new(
            platform::tokens::TokenLimits {
                per_day: Some(40),
                per_month: Some(1_000_000),
            },
            Some(r#"{"bob": {"perDay": null, "perMonth": null}}"#),
        )
        .unwrap(),
        ..Options::default()
    })
    .await
    .unwrap();
    let (replica, _stop) = platform.spawn_runs_replica().await.unwrap();
    let (alice, bob) = (platform.infra.token("alice"), platform.infra.token("bob"));
    let thread = uuid::Uuid::new_v4().to_string();

    // Alice's run: the tokens on its terminal event and its status, with its times.
    let events = platform
        .api()
        .stream_run(&alice, &text_run(&thread, "first", "Hi"))
        .await
        .unwrap();
    let usage = json!([{"provider": "openai", "model": "test-model", "inputTokens": 31,
        "outputTokens": 12, "totalTokens": 43, "reasoningTokens": 4, "cachedInputTokens": 8}]);
    let last = events.last().unwrap();
    assert_eq!(
        (&last["type"], &last["usage"]),
        (&json!("RUN_FINISHED"), &usage)
    );
    let status = platform
        .api()
        .wait_for_status(&alice, "first", "completed")
        .await
        .unwrap();
    assert_eq!(status["usage"], usage);
    let timings = &status["timings"];
    let (queued, first, total) = (
        timings["queuedMs"].as_i64().unwrap(),
        timings["timeToFirstTokenMs"].as_i64().unwrap(),
        timings["durationMs"].as_i64().unwrap(),
    );
    assert!(
        0 <= queued && queued <= first && first <= total,
        "{timings}"
    );

    // Her budget of the day is spent: her next run is refused by either replica, naming the
    // budget and when it resets; bob's run goes on.
    for runs in [&platform.urls.runs, &replica] {
        let response = platform
            .http
            .post(format!("{runs}/api/v1/agent/runs"))
            .bearer_auth(&alice)
            .json(&text_run(&thread, "second", "Again"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 429, "{runs}");
        let retry_after: u64 = response.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=86_400).contains(&retry_after), "{retry_after}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "budget_exceeded", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("per day (40 tokens, SB_RUNS_OWNER_TOKENS_PER_DAY)")
                && message.contains("43 used"),
            "{message}"
        );
    }
    let bobs = stream_run(
        &platform.http,
        &replica,
        &bob,
        &text_run(&uuid::Uuid::new_v4().to_string(), "bobs", "Hi"),
    )
    .await
    .unwrap();
    assert_eq!(bobs.last().unwrap()["type"], "RUN_FINISHED");
    // A refused run left nothing behind: alice has one run.
    let (code, _) = platform
        .api()
        .get_runs(&alice, "/api/v1/agent/runs/second")
        .await
        .unwrap();
    assert_eq!(code, 404);

    // Her usage, by day: one run, its tokens by model, its times.
    let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
    let by_day = usage_with_runs(&platform, &alice, "groupBy=day", 1).await;
    assert_eq!(by_day["owner"], "alice");
    assert_eq!(by_day["total"]["totalTokens"], 43);
    let group = &by_day["groups"][0];
    assert_eq!((&group["key"], &group["runs"]), (&json!(today), &json!(1)));
    assert_eq!(
        group["models"],
        json!([{"provider": "openai", "model": "test-model", "runs": 1, "inputTokens": 31,
                "outputTokens": 12, "totalTokens": 43, "reasoningTokens": 4,
                "cachedInputTokens": 8}])
    );
    assert!(group["timeToFirstTokenMs"]["avg"].as_f64().unwrap() >= 0.0);
    assert!(
        group["durationMs"]["p50"].as_f64().unwrap()
            >= group["timeToFirstTokenMs"]["p50"].as_f64().unwrap()
    );
    let by_thread = usage_with_runs(&platform, &alice, "groupBy=thread", 1).await;
    assert_eq!(by_thread["groups"][0]["key"], thread);
    let by_agent = usage_with_runs(&platform, &alice, "groupBy=agent", 1).await;
    assert_eq!(by_agent["groups"].as_array().unwrap().len(), 1);
    // A window that ended before the run has none of it.
    let (_, before) = get_usage(&platform, &alice, "from=2020-01-01&to=2020-01-02").await;
    assert_eq!(before["total"]["runs"], 0);

    // Bob's usage is his: alice may not read it; an admin reads every owner's.
    let (code, body) = get_usage(&platform, &alice, "owner=bob").await;
    assert_eq!((code, &body["error"]["code"]), (403, &json!("forbidden")));
    let admin = platform
        .infra
        .token_with_scope("ops", "openid switchboard:admin");
    let everyone = usage_with_runs(&platform, &admin, "owner=*&groupBy=owner", 2).await;
    let owners: Vec<(&str, i64)> = everyone["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["key"].as_str().unwrap(),
                g["totalTokens"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(owners.len(), 2, "{everyone}");
    assert!(owners.contains(&("alice", 43)) && owners.contains(&("bob", 43)));
    let (code, body) = get_usage(&platform, &admin, "owner=bob").await;
    assert_eq!((code, &body["total"]["runs"]), (200, &json!(1)));

    // Bad parameters name themselves.
    for (query, field) in [
        ("groupBy=week", "groupBy"),
        ("from=yesterday", "from"),
        ("from=2026-01-01&to=2025-01-01", "from"),
        ("groupBy=owner", "groupBy"),
    ] {
        let (code, body) = get_usage(&platform, &alice, query).await;
        assert_eq!(
            (code, &body["error"]["field"]),
            (400, &json!(field)),
            "{query}"
        );
    }
    let (code, _) = platform
        .http
        .get(format!("{}/api/v1/agent/usage", platform.urls.history))
        .send()
        .await
        .map(|r| (r.status().as_u16(), ()))
        .unwrap();
    assert_eq!(code, 401);
}
