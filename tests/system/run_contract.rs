//! The runs contract: status, cancel, idempotent and concurrent acceptance, the active-run
//! policy, rate limiting, body limits and the OpenAPI document.

use serde_json::{Value, json};
use switchboard_system_tests::{Options, TestPlatform, text_run};

fn new_thread() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[tokio::test]
async fn a_finished_run_reports_completed_by_run_id_and_only_to_its_owner() {
    let platform = TestPlatform::spawn().await.unwrap();
    let api = platform.api();
    let alice = platform.infra.token("alice");
    let (status, accepted) = api
        .post_run(&alice, &text_run(&new_thread(), "status-run", "hi"))
        .await
        .unwrap();
    assert_eq!(status, 202);
    let done = api
        .wait_for_status(&alice, "status-run", "completed")
        .await
        .unwrap();
    assert_eq!(done["taskId"], accepted["taskId"]);
    assert_eq!(done["cancelRequested"], false);
    let bob = platform.infra.token("bob");
    for id in ["status-run"] {
        let (status, body) = api
            .get_runs(&bob, &format!("/api/v1/agent/runs/{id}"))
            .await
            .unwrap();
        assert_eq!(status, 404, "bob cannot see alice's run {id}: {body}");
        let (status, _) = api.cancel_run(&bob, id).await.unwrap();
        assert_eq!(status, 404, "bob cannot cancel alice's run {id}");
    }
}

#[tokio::test]
async fn a_failing_agent_ends_the_run_failed_not_completed() {
    let platform = TestPlatform::spawn().await.unwrap();
    let api = platform.api();
    let alice = platform.infra.token("alice");
    let (status, _) = api
        .post_run(&alice, &text_run(&new_thread(), "fail-run", "/fail"))
        .await
        .unwrap();
    assert_eq!(status, 202);
    let failed = api
        .wait_for_status(&alice, "fail-run", "failed")
        .await
        .unwrap();
    assert_eq!(failed["error"], "the agent failed");
}

#[tokio::test]
async fn a_failed_run_whose_live_record_lags_is_answered_failed_with_its_error_from_history() {
    let platform = TestPlatform::spawn().await.unwrap();
    let api = platform.api();
    let alice = platform.infra.token("alice");
    let (status, accepted) = api
        .post_run(&alice, &text_run(&new_thread(), "lagging-run", "/fail"))
        .await
        .unwrap();
    assert_eq!(status, 202);
    api.wait_for_status(&alice, "lagging-run", "failed")
        .await
        .unwrap();
    // The live record as a KV replica that missed the end would still hold it (seen after a
    // partition): running, no error. History has the run's RUN_ERROR.
    let client = async_nats::connect(&platform.infra.nats_url).await.unwrap();
    let kv = async_nats::jetstream::new(client)
        .get_key_value(platform.nats.names.run_status_bucket())
        .await
        .unwrap();
    let task_id = uuid::Uuid::parse_str(accepted["taskId"].as_str().unwrap()).unwrap();
    let key = protocol::messaging::status_key("alice", "lagging-run", task_id);
    let mut record: Value = serde_json::from_slice(&kv.get(&key).await.unwrap().unwrap()).unwrap();
    assert_eq!(record["error"], "the agent failed", "{record}");
    record["status"] = json!("running");
    record.as_object_mut().unwrap().remove("error");
    kv.put(&key, serde_json::to_vec(&record).unwrap().into())
        .await
        .unwrap();
    // Running until history has written the end (it may be behind the events), then failed.
    let answer = api
        .wait_for_status(&alice, "lagging-run", "failed")
        .await
        .unwrap();
    assert_eq!(answer["error"], "the agent failed", "{answer}");
}

#[tokio::test]
async fn cancelling_a_running_run_stops_the_agent_and_ends_it_cancelled_idempotently() {
    let platform = TestPlatform::spawn().await.unwrap();
    let api = platform.api();
    let alice = platform.infra.token("alice");
    let thread = new_thread();
    let words = "w ".repeat(100);
    let (status, _) = api
        .post_run(
            &alice,
            &text_run(&thread, "slow-run", &format!("/slow {words}")),
        )
        .await
        .unwrap();
    assert_eq!(status, 202);
    api.wait_for_status(&alice, "slow-run", "running")
        .await
        .unwrap();
    let (status, body) = api.cancel_run(&alice, "slow-run").await.unwrap();
    assert_eq!(status, 202, "{body}");
    assert!(
        body["status"] == "cancelled" || body["cancelRequested"] == true,
        "the cancel is recorded: {body}"
    );
    let cancelled = api
        .wait_for_status(&alice, "slow-run", "cancelled")
        .await
        .unwrap();
    assert_eq!(cancelled["cancelRequested"], false);
    let (status, again) = api.cancel_run(&alice, "slow-run").await.unwrap();
    assert_eq!(
        (status, &again["status"]),
        (202, &json!("cancelled")),
        "a second cancel changes nothing"
    );

    // The agent stopped: history holds the user message and a reply cut short.
    let history = api
        .wait_for_history(&alice, &thread, |h| {
            h["messages"].as_array().is_some_and(|m| m.len() == 2)
        })
        .await
        .unwrap();
    let reply = history["messages"][1]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(
        reply.len() < words.len(),
        "the reply stopped early: {reply:?}"
    );
}

#[tokio::test]
async fn cancelling_a_completed_run_leaves_it_completed() {
    let platform = TestPlatform::spawn().await.unwrap();
    let api = platform.api();
    let alice = platform.infra.token("alice");
    api.post_run(&alice, &text_run(&new_thread(), "done-run", "hi"))
        .await
        .unwrap();
    api.wait_for_status(&alice, "done-run", "completed")
        .await
        .unwrap();
    let (status, body) = api.cancel_run(&alice, "done-run").await.unwrap();
    assert_eq!((status, &body["status"]), (202, &json!("completed")));
}

#[tokio::test]
async fn under_the_reject_policy_a_second_run_on_a_busy_thread_is_refused_until_the_first_ends() {
    let platform = TestPlatform::spawn().await.unwrap();
    let api = platform.api();
    let alice = platform.infra.token("alice");
    let thread = new_thread();
    api.post_run(&alice, &text_run(&thread, "first", "/slow a b c d e f g h"))
        .await
        .unwrap();
    let (status, body) = api
        .post_run(&alice, &text_run(&thread, "second", "hi"))
        .await
        .unwrap();
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["field"], "/threadId");
    let (status, _) = api
        .post_run(&alice, &text_run(&new_thread(), "elsewhere", "hi"))
        .await
        .unwrap();
    assert_eq!(status, 202, "another thread is not blocked");
    api.wait_for_status(&alice, "first", "completed")
        .await
        .unwrap();
    let (status, body) = api
        .post_run(&alice, &text_run(&thread, "second", "hi"))
        .await
        .unwrap();
    assert_eq!(status, 202, "the thread is free again: {body}");
}

#[tokio::test]
async fn under_the_enqueue_policy_runs_on_one_thread_run_one_after_another_and_a_queued_one_can_be_cancelled()
 {
    let options = Options {
        active_run_policy: runs::ActiveRunPolicy::Enqueue,
        ..Options::default()
    };
    let platform = TestPlatform::spawn_with(options).await.unwrap();
    let api = platform.api();
    let alice = platform.infra.token("alice");
    let thread = new_thread();
    api.post_run(&alice, &text_run(&thread, "one", "/slow a b c d e f"))
        .await
        .unwrap();
    api.wait_for_status(&alice, "one", "running").await.unwrap();
    let (s2, _) = api
        .post_run(&alice, &text_run(&thread, "two", "second"))
        .await
        .unwrap();
    let (s3, _) = api
        .post_run(&alice, &text_run(&thread, "three", "third"))
        .await
        .unwrap();
    assert_eq!((s2, s3), (202, 202));
    let (_, queued) = api
        .get_runs(&alice, "/api/v1/agent/runs/two")
        .await
        .unwrap();
    assert_eq!(queued["status"], "queued", "two waits for one: {queued}");
    let (status, cancelled) = api.cancel_run(&alice, "three").await.unwrap();
    assert_eq!(
        (status, &cancelled["status"]),
        (202, &json!("cancelled")),
        "a queued run ends at once"
    );

    api.wait_for_status(&alice, "two", "completed")
        .await
        .unwrap();
    let history = api
        .wait_for_history(&alice, &thread, |h| {
            h["messages"]
                .as_array()
                .is_some_and(|m| m.iter().any(|m| m["content"] == "You said: second"))
        })
        .await
        .unwrap();
    let messages = history["messages"].as_array().unwrap();
    let by_role = |role: &str| -> Vec<&str> {
        messages
            .iter()
            .filter(|m| m["role"] == role)
            .map(|m| m["content"].as_str().unwrap_or_default())
            .collect()
    };
    assert_eq!(
        by_role("user"),
        ["/slow a b c d e f", "second", "third"],
        "every message sent is kept"
    );
    assert_eq!(
        by_role("assistant"),
        ["You said: /slow a b c d e f", "You said: second"],
        "one ran to the end before two; three never ran"
    );
    let (_, one) = api
        .get_runs(&alice, "/api/v1/agent/runs/one")
        .await
        .unwrap();
    let reply_two = messages
        .iter()
        .find(|m| m["content"] == "You said: second")
        .unwrap();
    let parse = |v: &Value| chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap()).unwrap();
    assert!(
        parse(&reply_two["timestamp"]) >= parse(&one["updatedAt"]),
        "two started after one ended: {reply_two} vs {one}"
    );
    assert_eq!(
        api.get_runs(&alice, "/api/v1/agent/runs/three")
            .await
            .unwrap()
            .1["status"],
        "cancelled"
    );
}

#[tokio::test]
async fn concurrent_duplicates_produce_one_task_and_one_jetstream_message() {
    let platform = TestPlatform::spawn().await.unwrap();
    let api = platform.api();
    let alice = platform.infra.token("alice");
    let body = text_run(&new_thread(), "dup", "once");
    let answers = futures::future::join_all((0..20).map(|_| api.post_run(&alice, &body))).await;
    let first = answers[0].as_ref().unwrap().1.clone();
    for answer in &answers {
        let (status, accepted) = answer.as_ref().unwrap();
        assert_eq!(
            (*status, accepted),
            (202, &first),
            "every duplicate gets the one task"
        );
    }
    let (client, js) = platform::nats::connect(&platform.nats, "test")
        .await
        .unwrap();
    let mut stream = js
        .get_stream(platform.nats.names.runs_stream())
        .await
        .unwrap();
    assert_eq!(
        stream.info().await.unwrap().state.messages,
        1,
        "one message in RUNS"
    );
    drop(client);
}

#[tokio::test]
async fn a_user_over_the_rate_limit_gets_429_with_retry_after_and_others_are_not_affected() {
    let options = Options {
        rate_per_minute: 1,
        rate_burst: 2,
        ..Options::default()
    };
    let platform = TestPlatform::spawn_with(options).await.unwrap();
    let api = platform.api();
    let alice = platform.infra.token("alice");
    for run in ["r1", "r2"] {
        let (status, _) = api
            .post_run(&alice, &text_run(&new_thread(), run, "hi"))
            .await
            .unwrap();
        assert_eq!(status, 202);
    }
    let response = platform
        .http
        .post(format!("{}/api/v1/agent/runs", platform.urls.runs))
        .bearer_auth(&alice)
        .json(&text_run(&new_thread(), "r3", "hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 429);
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (1..=60).contains(&retry_after),
        "Retry-After is a wait in seconds: {retry_after}"
    );
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limited");
    let bob = platform.infra.token("bob");
    let (status, _) = api
        .post_run(&bob, &text_run(&new_thread(), "r1", "hi"))
        .await
        .unwrap();
    assert_eq!(status, 202, "bob has his own budget");
}

#[tokio::test]
async fn bodies_that_are_too_large_not_json_or_malformed_get_precise_errors() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let url = format!("{}/api/v1/agent/runs", platform.urls.runs);
    let send = |body: Vec<u8>, content_type: &'static str| {
        platform
            .http
            .post(&url)
            .bearer_auth(&alice)
            .header("content-type", content_type)
            .body(body)
            .send()
    };
    let big = send(vec![b' '; 256 * 1024 + 1], "application/json")
        .await
        .unwrap();
    assert_eq!(big.status().as_u16(), 413);
    let big: Value = big.json().await.unwrap();
    assert_eq!(
        big["error"]["message"],
        "RunAgentInput payload exceeds size limit"
    );

    let text = send(b"{}".to_vec(), "text/plain").await.unwrap();
    assert_eq!(text.status().as_u16(), 415);

    let broken = send(b"{\"threadId\": ".to_vec(), "application/json")
        .await
        .unwrap();
    assert_eq!(broken.status().as_u16(), 400);

    let wrong_type = send(
        serde_json::to_vec(&json!({"threadId": new_thread(), "runId": "r", "messages": "nope"}))
            .unwrap(),
        "application/json",
    )
    .await
    .unwrap();
    assert_eq!(wrong_type.status().as_u16(), 400);
    let wrong_type: Value = wrong_type.json().await.unwrap();
    assert_eq!(wrong_type["error"]["field"], "/messages");
}

#[tokio::test]
async fn the_worker_gives_the_agent_the_seed_tools_block() {
    let platform = TestPlatform::spawn().await.unwrap();
    let api = platform.api();
    let alice = platform.infra.token("alice");
    let thread = new_thread();
    let mut body = text_run(&thread, "tools-run", "/tools");
    body["tools"] = json!([{"name": "get_weather", "description": "Get current weather for a location",
        "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "City name"}},
                       "required": ["location"]}}]);
    api.post_run(&alice, &body).await.unwrap();
    api.wait_for_status(&alice, "tools-run", "completed")
        .await
        .unwrap();
    let history = api
        .wait_for_history(&alice, &thread, |h| {
            h["messages"][1]["content"]
                .as_str()
                .is_some_and(|c| c.ends_with("<!-- TOOLS_END -->"))
        })
        .await
        .unwrap();
    assert_eq!(
        history["messages"][1]["content"],
        "<!-- TOOLS_START -->\n- get_weather: Get current weather for a location\n- args_schema: {\"type\":\"object\",\"properties\":{\"location\":{\"type\":\"string\",\"description\":\"City name\"}},\"required\":[\"location\"]}\nNote: tool arguments must strictly match args_schema.\n<!-- TOOLS_END -->"
    );
}

#[tokio::test]
async fn the_service_serves_its_openapi_document() {
    let platform = TestPlatform::spawn().await.unwrap();
    let doc: Value = platform
        .http
        .get(format!("{}/openapi.json", platform.urls.runs))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    for path in [
        "/api/v1/agent/runs",
        "/api/v1/agent/runs/{runId}",
        "/api/v1/agent/runs/{runId}/cancel",
        "/api/v1/agent/threads/{threadId}/fork",
        "/api/v1/agent/me",
    ] {
        assert!(doc["paths"][path].is_object(), "documents {path}");
    }
}
