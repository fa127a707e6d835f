//! The bytes of runs one owner may start per day hold across runs replicas
//! (`SB_RUNS_OWNER_BYTES_PER_DAY`): past them every replica answers 403 `quota_exceeded` naming
//! the setting and when it resets, and another owner's runs are still accepted.

use std::collections::HashMap;

use protocol::messaging::RunTask;
use serde_json::{Value, json};
use switchboard_system_tests::cluster::Fleet;
use switchboard_system_tests::{Options, TestPlatform, read_sse, text_run};

/// A run of about 20 KiB (most of it in `state`, which the runs service stores as sent), on a
/// new thread. The run id has a fixed width (`r0042`), so every such run stores the same bytes
/// but for the digits of its acceptance time.
fn big_run(n: usize) -> Value {
    let mut run = text_run(
        &uuid::Uuid::new_v4().to_string(),
        &format!("r{n:04}"),
        "hello",
    );
    run["state"] = json!({"pad": "y".repeat(20 * 1024)});
    run
}

async fn post(
    http: &reqwest::Client,
    runs: &str,
    token: &str,
    body: &Value,
) -> (u16, Option<String>, Value) {
    let response = http
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
        let (status, retry, body) =
            post(&platform.http, &replicas[n % 2], &alice, &big_run(n)).await;
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
        let (status, _, body) = post(&platform.http, runs, &alice, &big_run(1000)).await;
        assert_eq!(status, 403, "{runs}: {body}");
        let (status, _, body) = post(&platform.http, runs, &bob, &big_run(1001)).await;
        assert_eq!(status, 202, "{runs}: {body}");
    }
}

/// The bytes each task in the fleet's RUNS stream takes, by task id: exactly what the budget
/// charged for it (the runs service spends the length of the payload it publishes).
async fn stored_task_bytes(fleet: &Fleet) -> HashMap<String, u64> {
    let js = async_nats::jetstream::new(fleet.nats.admin().await.unwrap());
    let mut stream = js.get_stream(fleet.nats.names.runs_stream()).await.unwrap();
    let state = stream.info().await.unwrap().state.clone();
    let mut sizes = HashMap::new();
    if state.messages == 0 {
        return sizes;
    }
    for seq in state.first_sequence..=state.last_sequence {
        let message = stream.get_raw_message(seq).await.unwrap();
        let RunTask::V1(task) = serde_json::from_slice(&message.payload).unwrap();
        sizes.insert(task.task_id.to_string(), message.payload.len() as u64);
    }
    sizes
}

/// Checks a refusal of the day's bytes: 403 `quota_exceeded`, `Retry-After` within the day, the
/// message naming the budget, its setting and when it resets.
fn assert_refused_for_the_day(
    what: &str,
    budget: u64,
    (status, retry, body): &(u16, Option<String>, Value),
) {
    assert_eq!(*status, 403, "{what}: {body}");
    assert_eq!(body["error"]["code"], "quota_exceeded", "{what}: {body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("SB_RUNS_OWNER_BYTES_PER_DAY")
            && message.contains(&format!("({budget} bytes"))
            && message.contains("00:00 UTC"),
        "{what}: {message}"
    );
    let retry: u64 = retry
        .as_deref()
        .unwrap_or_else(|| panic!("{what}: no Retry-After"))
        .parse()
        .unwrap();
    assert!((1..=86_400).contains(&retry), "{what}: Retry-After {retry}");
}

/// Three runs replicas on a 3-node NATS cluster hold one owner to the same budget as one
/// replica: the runs an owner got accepted, spread round-robin over the replicas, add up to
/// no more than `SB_RUNS_OWNER_BYTES_PER_DAY`, and to no less than the budget minus what the
/// replicas still hold leased (less than a lease each). Once spent, every replica, and the
/// gateway, refuse the owner; another owner's runs are accepted and complete.
#[tokio::test]
async fn an_owners_bytes_per_day_hold_fleet_wide_with_three_runs_replicas() {
    const REPLICAS: usize = 3;
    let budget: u64 = 1024 * 1024;
    // What a replica leases of an owner's day at a time: a thirty-second of the budget, 64 KiB
    // to 8 MiB (services/runs/src/budget.rs); 64 KiB here.
    let lease = (budget / 32).clamp(64 * 1024, 8 * 1024 * 1024).min(budget);
    let fleet = Fleet::start(
        REPLICAS,
        &[("SB_RUNS_OWNER_BYTES_PER_DAY", &budget.to_string())],
    )
    .await
    .unwrap();
    let http = reqwest::Client::new();
    let replicas: Vec<String> = (0..REPLICAS)
        .map(|replica| fleet.replica_url("runs", replica).unwrap())
        .collect();
    let alice = fleet.infra.token("alice");
    let bob = fleet.infra.token("bob");

    // Alice's runs go round-robin to each replica's own port (so which replica took each run is
    // known), until one refuses; then on to the replicas that have not refused yet, each spending
    // what it still holds leased, until every one has refused.
    let mut accepted: Vec<(usize, String)> = Vec::new();
    let mut accepted_before_first_refusal = None;
    let mut refused = [false; REPLICAS];
    let mut posted = 0;
    while refused.contains(&false) {
        let replica = posted % REPLICAS;
        posted += 1;
        assert!(
            posted < 400,
            "the budget of {budget} bytes was never spent: {} runs of ~20 KiB accepted",
            accepted.len()
        );
        if refused[replica] {
            continue;
        }
        let answer = post(&http, &replicas[replica], &alice, &big_run(posted)).await;
        match answer.0 {
            202 => {
                let task = answer.2["taskId"].as_str().expect("a task id").to_owned();
                accepted.push((replica, task));
            }
            403 => {
                assert_refused_for_the_day(&format!("runs replica {replica}"), budget, &answer);
                accepted_before_first_refusal.get_or_insert(accepted.len());
                refused[replica] = true;
            }
            other => panic!("run {posted} on replica {replica}: {other} {}", answer.2),
        }
    }
    let first_refusal = accepted_before_first_refusal.expect("a refusal ended the loop");

    // The bytes the budget charged: each accepted run's task as the RUNS stream holds it.
    let sizes = stored_task_bytes(&fleet).await;
    let charged = |task: &String| {
        *sizes
            .get(task)
            .unwrap_or_else(|| panic!("accepted task {task} is not in the RUNS stream"))
    };
    let mut per_replica = [0u64; REPLICAS];
    for (replica, task) in &accepted {
        per_replica[*replica] += charged(task);
    }
    let total: u64 = per_replica.iter().sum();
    let at_first_refusal: u64 = accepted[..first_refusal]
        .iter()
        .map(|(_, task)| charged(task))
        .sum();
    let largest = accepted
        .iter()
        .map(|(_, task)| charged(task))
        .max()
        .unwrap();
    let report = format!(
        "budget {budget}, lease {lease}, {} runs accepted ({first_refusal} before the first \
         refusal, {at_first_refusal} bytes), bytes per replica {per_replica:?}, total {total}, \
         largest run {largest}",
        accepted.len()
    );
    println!("{report}");
    // Never more than the budget, fleet-wide.
    assert!(total <= budget, "over budget: {report}");
    // Every replica took some of it (the runs did reach three different replicas).
    assert!(per_replica.iter().all(|&bytes| bytes > 0), "{report}");
    // At the first refusal the day is all leased (the refusing replica got the rest and it was
    // less than the run); unspent is what the replicas hold, less than a lease each.
    assert!(
        at_first_refusal + REPLICAS as u64 * lease > budget,
        "less than the budget minus a lease per replica at the first refusal: {report}"
    );
    // Once every replica has refused, each holds less than the run it refused: one of these
    // runs, give or take the 0 to 9 digits of a second's fraction in its acceptance time.
    assert!(
        total + REPLICAS as u64 * (largest + 16) > budget,
        "less than the budget minus a run per replica once every replica refused: {report}"
    );

    // Spent: every replica refuses Alice again, and so does the gateway; Bob is accepted on
    // every replica and through the gateway, and his runs complete.
    let gateway = fleet.gateway.url.clone();
    let mut bobs = Vec::new();
    for (index, runs) in replicas.iter().chain([&gateway]).enumerate() {
        let answer = post(&http, runs, &alice, &big_run(1000 + index)).await;
        assert_refused_for_the_day(&format!("spent, {runs}"), budget, &answer);
        let run = big_run(2000 + index);
        let (status, _, body) = post(&http, runs, &bob, &run).await;
        assert_eq!(status, 202, "bob on {runs}: {body}");
        bobs.push(run["runId"].as_str().unwrap().to_owned());
    }
    for run in bobs {
        let response = http
            .get(format!("{gateway}/api/v1/agent/runs/{run}/events"))
            .bearer_auth(&bob)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "events of bob's {run}");
        let events = read_sse(response, None).await.unwrap();
        assert_eq!(
            events.last().map(|event| &event.data["type"]),
            Some(&json!("RUN_FINISHED")),
            "bob's {run}: {:?}",
            events.iter().map(|e| &e.data["type"]).collect::<Vec<_>>()
        );
    }
}

#[tokio::test]
async fn an_owners_runs_that_pass_their_event_bytes_of_the_day_end_with_quota_exceeded() {
    let per_day = 1024 * 1024;
    let platform = TestPlatform::spawn_with(Options {
        worker_event_bytes_per_day: per_day,
        ..Default::default()
    })
    .await
    .unwrap();
    let (alice, bob) = (platform.infra.token("alice"), platform.infra.token("bob"));
    // A 10,000-character echo: about 2,000 words, each its own event of a few hundred bytes.
    let text = "word ".repeat(2000);
    let mut ended = Vec::new();
    for n in 0..4 {
        let body = text_run(&uuid::Uuid::new_v4().to_string(), &format!("a{n}"), &text);
        let events = platform.api().stream_run(&alice, &body).await.unwrap();
        let last = events.last().unwrap().clone();
        let error = last["type"] == "RUN_ERROR";
        ended.push((events.len(), last));
        if error {
            break;
        }
    }
    let (count, last) = ended.last().unwrap();
    assert_eq!(last["type"], "RUN_ERROR", "{ended:?}");
    assert_eq!(last["code"], "quota_exceeded", "{last}");
    let message = last["message"].as_str().unwrap();
    assert!(
        message.contains("SB_WORKER_OWNER_EVENT_BYTES_PER_DAY"),
        "{message}"
    );
    assert!(message.contains(&format!("({per_day} bytes")), "{message}");
    assert!(message.contains("00:00 UTC"), "{message}");
    assert!(ended.len() >= 2, "the first run fits in the day: {ended:?}");
    assert!(*count > 1, "it ended mid-run, after some of its events");

    // The next run of alice's ends at once; bob's runs are not affected.
    let body = text_run(&uuid::Uuid::new_v4().to_string(), "a-next", "hello");
    let events = platform.api().stream_run(&alice, &body).await.unwrap();
    assert_eq!(events.last().unwrap()["code"], "quota_exceeded");
    let body = text_run(&uuid::Uuid::new_v4().to_string(), "b1", &text);
    let events = platform.api().stream_run(&bob, &body).await.unwrap();
    assert_eq!(events.last().unwrap()["type"], "RUN_FINISHED");
    assert_eq!(
        switchboard_system_tests::streamed_text(&events),
        format!("You said: {text}")
    );
    let (status, record) = platform
        .api()
        .get_runs(&alice, "/api/v1/agent/runs/a-next")
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(record["status"], "failed", "{record}");
}

/// A run of the echo agent that streams a word every 200 ms for minutes: active until cancelled.
fn long_run(run: &str) -> Value {
    let words: Vec<String> = (0..1000).map(|i| format!("w{i}")).collect();
    text_run(
        &uuid::Uuid::new_v4().to_string(),
        run,
        &format!("/slow {}", words.join(" ")),
    )
}

#[tokio::test]
async fn an_owners_runs_queued_or_running_are_capped_across_runs_replicas_until_one_ends() {
    let platform = TestPlatform::spawn_with(Options {
        max_active_per_owner: 2,
        ..Default::default()
    })
    .await
    .unwrap();
    let (second, _stop) = platform.spawn_runs_replica().await.unwrap();
    let replicas = [platform.urls.runs.clone(), second];
    let (alice, bob) = (platform.infra.token("alice"), platform.infra.token("bob"));

    // Two long runs, one through each replica: both accepted.
    for (n, runs) in replicas.iter().enumerate() {
        let (status, _, body) =
            post(&platform.http, runs, &alice, &long_run(&format!("a{n}"))).await;
        assert_eq!(status, 202, "{body}");
    }
    // A third is refused by either replica, naming the limit; bob is not limited by alice's.
    for runs in &replicas {
        let (status, retry, body) = post(&platform.http, runs, &alice, &long_run("a2")).await;
        assert_eq!((status, retry.as_deref()), (429, Some("10")), "{body}");
        assert_eq!(body["error"]["code"], "rate_limited");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("2 runs queued or running")
                && message.contains("SB_RUNS_MAX_ACTIVE_PER_OWNER"),
            "{message}"
        );
    }
    let (status, _, body) = post(&platform.http, &replicas[1], &bob, &long_run("b0")).await;
    assert_eq!(status, 202, "{body}");
    // The refused run was not kept.
    let (status, _) = platform
        .api()
        .get_runs(&alice, "/api/v1/agent/runs/a2")
        .await
        .unwrap();
    assert_eq!(status, 404);

    // One of hers ends (cancelled): the next is accepted, then she is at the limit again.
    let (status, _) = platform.api().cancel_run(&alice, "a0").await.unwrap();
    assert_eq!(status, 202);
    platform
        .api()
        .wait_for_status(&alice, "a0", "cancelled")
        .await
        .unwrap();
    let (status, _, body) = post(&platform.http, &replicas[1], &alice, &long_run("a3")).await;
    assert_eq!(status, 202, "{body}");
    let (status, _, _) = post(&platform.http, &replicas[0], &alice, &long_run("a4")).await;
    assert_eq!(status, 429);

    for (token, run) in [(&alice, "a1"), (&alice, "a3"), (&bob, "b0")] {
        platform.api().cancel_run(token, run).await.unwrap();
        platform
            .api()
            .wait_for_status(token, run, "cancelled")
            .await
            .unwrap();
    }
}

/// `token`'s run `run` on `thread` of the echo agent's `/ask`: its events, to its end.
async fn ask(platform: &TestPlatform, token: &str, thread: &str, run: &str) -> Vec<Value> {
    platform
        .api()
        .stream_run(token, &text_run(thread, run, "/ask text:120 Why so?"))
        .await
        .unwrap()
}

fn interrupt_id(events: &[Value]) -> String {
    let last = events.last().unwrap();
    assert_eq!(
        (&last["type"], &last["outcome"]["type"]),
        (&json!("RUN_FINISHED"), &json!("interrupt")),
        "{last}"
    );
    last["outcome"]["interrupts"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn an_owners_prompts_waiting_for_an_answer_are_capped_and_an_answer_makes_room() {
    let platform = TestPlatform::spawn_with(Options {
        max_pending_prompts_per_owner: 2,
        ..Default::default()
    })
    .await
    .unwrap();
    let (alice, bob) = (platform.infra.token("alice"), platform.infra.token("bob"));
    let threads: Vec<String> = (0..3).map(|_| uuid::Uuid::new_v4().to_string()).collect();

    // Two questions wait for alice; a third run that asks fails, naming the limit.
    let first = interrupt_id(&ask(&platform, &alice, &threads[0], "ask0").await);
    interrupt_id(&ask(&platform, &alice, &threads[1], "ask1").await);
    let refused = ask(&platform, &alice, &threads[2], "ask2").await;
    let last = refused.last().unwrap();
    assert_eq!(
        (&last["type"], &last["code"]),
        (&json!("RUN_ERROR"), &json!("quota_exceeded")),
        "{last}"
    );
    let message = last["message"].as_str().unwrap();
    assert!(
        message.contains("2 questions")
            && message.contains("SB_WORKER_MAX_PENDING_PROMPTS_PER_OWNER"),
        "{message}"
    );
    // Bob is asked as usual.
    interrupt_id(&ask(&platform, &bob, &threads[0], "bob0").await);

    // Alice answers her first question: the continuation runs, and she may be asked again.
    let mut answer = text_run(&threads[0], "answer0", "");
    answer["messages"] = text_run(&threads[0], "ask0", "/ask text:120 Why so?")["messages"].clone();
    answer["resume"] = json!([{"interruptId": first, "status": "resolved", "payload": "because"}]);
    let response = platform
        .http
        .post(format!("{}/api/v1/agent/ag-ui", platform.urls.runs))
        .bearer_auth(&alice)
        .json(&answer)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let continued: Vec<Value> = read_sse(response, None)
        .await
        .unwrap()
        .into_iter()
        .map(|frame| frame.data)
        .collect();
    assert_eq!(
        continued.last().unwrap()["type"],
        "RUN_FINISHED",
        "{continued:?}"
    );
    interrupt_id(&ask(&platform, &alice, &threads[2], "ask3").await);
}

/// Posts `body` to `runs` again until it is accepted (what a replica read of an owner's
/// history may be a second old, `platform::kept::KEPT_CACHE_FOR`; a refused run leaves nothing
/// behind); the last answer.
async fn post_until_accepted(
    http: &reqwest::Client,
    runs: &str,
    token: &str,
    body: &Value,
) -> (u16, Option<String>, Value) {
    let deadline = tokio::time::Instant::now() + switchboard_system_tests::EVENTUAL;
    loop {
        let answer = post(http, runs, token, body).await;
        if answer.0 == 202 || tokio::time::Instant::now() >= deadline {
            return answer;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// What one owner keeps in history is bounded across the runs replicas
/// (`SB_RUNS_OWNER_HISTORY_BYTES`): once their ended runs keep that much, every replica refuses
/// their next run with 403 `quota_exceeded` naming the setting, another owner's runs go on, and
/// deleting the threads makes room again.
#[tokio::test]
async fn what_an_owner_keeps_in_history_is_bounded_across_runs_replicas_and_deleting_threads_frees_it()
 {
    let budget: u64 = 48 * 1024;
    let platform = TestPlatform::spawn_with(Options {
        runs_owner_history_bytes: budget,
        ..Default::default()
    })
    .await
    .unwrap();
    let (second, _stop) = platform.spawn_runs_replica().await.unwrap();
    let replicas = [platform.urls.runs.clone(), second];
    let (alice, bob) = (platform.infra.token("alice"), platform.infra.token("bob"));
    let http = &platform.http;
    // Runs of 8 KiB of text each (the most is 10,000 characters), on threads of their own, each followed to its end (history
    // has written the run when its stream ends).
    let run = |n: usize| {
        text_run(
            &uuid::Uuid::new_v4().to_string(),
            &format!("kept-run-{n}"),
            &format!("{n:04} {}", "k".repeat(8 * 1024)),
        )
    };
    let mut threads = Vec::new();
    let mut refused = None;
    for n in 0..40 {
        let body = run(n);
        let (status, _, answer) = post(http, &replicas[n % 2], &alice, &body).await;
        if status == 403 {
            refused = Some(answer);
            break;
        }
        assert_eq!(status, 202, "run {n}: {answer}");
        threads.push(body["threadId"].as_str().unwrap().to_owned());
        let response = http
            .get(format!(
                "{}/api/v1/agent/runs/kept-run-{n}/events",
                replicas[n % 2]
            ))
            .bearer_auth(&alice)
            .send()
            .await
            .unwrap();
        let events = read_sse(response, None).await.unwrap();
        assert_eq!(
            events.last().map(|event| &event.data["type"]),
            Some(&json!("RUN_FINISHED")),
            "run {n}"
        );
    }
    let refused = refused.expect("40 runs of 8 KiB and never refused");
    assert_eq!(refused["error"]["code"], "quota_exceeded", "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("SB_RUNS_OWNER_HISTORY_BYTES") && message.contains("delete threads"),
        "{message}"
    );
    // What it says she keeps is at least the budget, and no more than what her runs wrote: each
    // run keeps its 8 KiB message and the agent's reply, a few times 8 KiB at most.
    let kept: u64 = message
        .split_whitespace()
        .nth(3)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no byte count in {message}"));
    assert!(kept >= budget, "{kept} kept, under the {budget} budget");
    assert!(
        kept <= threads.len() as u64 * 4 * 9 * 1024,
        "{kept} kept for {} runs",
        threads.len()
    );
    // Every replica refuses her (one that read her sum before the last runs ended may take a
    // run or two more first); bob's runs are taken on both.
    let mut n = 100;
    for (index, runs) in replicas.iter().enumerate() {
        let deadline = tokio::time::Instant::now() + switchboard_system_tests::EVENTUAL;
        loop {
            n += 1;
            let body = run(n);
            let (status, _, answer) = post(http, runs, &alice, &body).await;
            if status == 403 {
                break;
            }
            assert_eq!(status, 202, "alice on {runs}: {answer}");
            threads.push(body["threadId"].as_str().unwrap().to_owned());
            assert!(
                tokio::time::Instant::now() < deadline,
                "{runs} never refused alice"
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        let (status, _, body) = post(http, runs, &bob, &run(200 + index)).await;
        assert_eq!(status, 202, "bob on {runs}: {body}");
    }
    // Her threads deleted, she keeps nothing, and both replicas take her runs again.
    for thread in &threads {
        let response = http
            .delete(format!("{}/api/v1/agent/threads/{thread}", replicas[0]))
            .bearer_auth(&alice)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 204, "delete {thread}");
    }
    for (index, runs) in replicas.iter().enumerate() {
        let (status, _, body) = post_until_accepted(http, runs, &alice, &run(300 + index)).await;
        assert_eq!(status, 202, "alice on {runs} after deleting: {body}");
    }
}

/// Runs of one owner that find the replica's lease of their day short at the same moment wait
/// for one renewal: without that each leased a chunk of the owner's day (16 requests at once,
/// 16 writes and 16 chunks held by one replica, which the owner's other replicas then lacked).
#[tokio::test]
async fn runs_of_one_owner_arriving_together_lease_a_chunk_of_the_day_once() {
    let bucket = switchboard_system_tests::OwnerBudgets::fresh()
        .await
        .unwrap();
    // 1 GiB a day: leased 8 MiB at a time, far more than the 16 runs below.
    let budget = std::sync::Arc::new(platform::budget::DailyBudget::new(
        "bytes",
        1 << 30,
        bucket.kv.clone(),
    ));
    const AT_ONCE: usize = 16;
    let now = chrono::Utc::now();
    let answers = futures::future::join_all((0..AT_ONCE).map(|_| {
        let budget = budget.clone();
        async move { budget.spend("alice", 4_096, now).await }
    }))
    .await;
    for answer in &answers {
        assert!(
            matches!(answer, Ok(Ok(()))),
            "every run is within the day's budget: {answer:?}"
        );
    }
    // Every lease is one write of the owner's day record: the bucket's stream holds nothing
    // else.
    let writes = bucket.writes().await.unwrap();
    assert_eq!(
        writes, 1,
        "{AT_ONCE} runs arriving together leased the owner's day {writes} times"
    );
}
