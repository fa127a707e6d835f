//! Remote agents that misbehave: every way an AG-UI agent behind `SB_WORKER_AGENTS_FILE` can
//! fail (refused, an error status, not SSE, malformed or out-of-order events, an oversized
//! event, silence, endless output, its own `RUN_ERROR`) ends its run with one `RUN_ERROR` of a
//! precise code within its timeout, the agent called once; a healthy run on the same worker
//! still succeeds. Then a cancel and a worker crash mid-stream. The agents are
//! [`FakeAgent`]'s scripted paths.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use switchboard_system_tests::fake_agent::{
    AGENT_ERROR_MESSAGE, DEFAULT_MAX_EVENT_BYTES, FakeAgent,
};
use switchboard_system_tests::{
    Options, ProcessPlatform, TestPlatform, free_port, read_sse, streamed_text, text_run,
};
use tokio::time::Instant;

/// How late past its timeout (or, without one, past the post) a failed run may end: the run's
/// way through runs, JetStream and the worker, on a loaded 2-core machine running other tests.
/// Generous on purpose (a bound that proves "never hangs", not a latency measurement: the
/// relay's timings are measured in BENCHMARKS.md).
const SLACK: Duration = Duration::from_secs(10);
/// How much earlier than its timeout a run may end (the worker's clock starts before the
/// agent sees the request).
const EARLY: Duration = Duration::from_millis(250);
/// How soon the worker must close its request to an agent it gave up on (generous, as SLACK).
const RELEASE: Duration = Duration::from_secs(10);

/// The worker's agents file, removed when dropped.
struct AgentsFile(PathBuf);

impl AgentsFile {
    fn write(toml: &str) -> Self {
        let path = std::env::temp_dir().join(format!("sb-agents-{}.toml", uuid::Uuid::new_v4()));
        std::fs::write(&path, toml).unwrap();
        Self(path)
    }
}

impl Drop for AgentsFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// One `[[agents]]` entry: short defaults, so a run the worker fails to end in time shows up
/// as a wrong code or a late end instead of hanging the test.
struct Agent {
    name: &'static str,
    url: String,
    first_event: f64,
    idle: f64,
    run: f64,
    retries: u32,
    extra: String,
}

impl Agent {
    fn new(name: &'static str, url: String) -> Self {
        Self {
            name,
            url,
            first_event: 5.0,
            idle: 5.0,
            run: 10.0,
            retries: 0,
            extra: String::new(),
        }
    }

    fn description(&self) -> String {
        format!("fake agent {}", self.name)
    }

    fn toml(&self) -> String {
        format!(
            "[[agents]]\nname = \"{}\"\nurl = \"{}\"\ndescription = \"{}\"\n\
             connect_timeout_secs = 1\nfirst_event_timeout_secs = {:?}\n\
             idle_timeout_secs = {:?}\nrun_timeout_secs = {:?}\nretries = {}\n{}\n",
            self.name,
            self.url,
            self.description(),
            self.first_event,
            self.idle,
            self.run,
            self.retries,
            self.extra
        )
    }
}

/// A failure mode: the agent, the fake agent's path behind it (`None`: nobody listens), the
/// code its run must end with, and the timeout that code comes from, if any.
struct Case {
    agent: Agent,
    path: Option<&'static str>,
    code: &'static str,
    timeout: Option<Duration>,
    /// Whether the script keeps its stream open after misbehaving, so only the worker can
    /// close it.
    hangs: bool,
}

fn case(name: &'static str, fake: &FakeAgent, code: &'static str) -> Case {
    let path = fake_path(name);
    Case {
        agent: Agent::new(name, fake.url(path)),
        path: Some(path),
        code,
        timeout: None,
        hangs: false,
    }
}

/// The fake agent's path named like the agent.
fn fake_path(name: &'static str) -> &'static str {
    switchboard_system_tests::fake_agent::PATHS
        .iter()
        .find(|p| p.strip_prefix('/') == Some(name))
        .copied()
        .unwrap_or_else(|| panic!("the fake agent has no /{name}"))
}

fn cases(fake: &FakeAgent) -> Vec<Case> {
    let refused = |name, retries| Case {
        agent: Agent {
            retries,
            ..Agent::new(
                name,
                format!("http://127.0.0.1:{}/refused", free_port().unwrap()),
            )
        },
        path: None,
        code: "agent_unavailable",
        timeout: None,
        hangs: false,
    };
    let protocol = |name| case(name, fake, "agent_protocol_error");
    let hanging = |mut c: Case| {
        c.hangs = true;
        c
    };
    let retried = |mut c: Case| {
        c.agent.retries = 1;
        c
    };
    let timeout = |mut c: Case, secs: f64, set: fn(&mut Agent, f64)| {
        set(&mut c.agent, secs);
        c.timeout = Some(Duration::from_secs_f64(secs));
        c.hangs = true;
        c
    };
    let mut oversized = hanging(protocol("oversized-event"));
    oversized.agent.extra = format!("max_event_bytes = {DEFAULT_MAX_EVENT_BYTES}");
    vec![
        refused("refused", 0),
        refused("refused-retried", 2),
        case("status-500", fake, "agent_unavailable"),
        protocol("not-sse"),
        hanging(protocol("malformed-json")),
        hanging(protocol("unknown-type")),
        hanging(protocol("content-before-start")),
        retried(protocol("after-finished")),
        protocol("finished-open-message"),
        protocol("finished-open-tool-call"),
        oversized,
        retried(protocol("ends-early")),
        retried(case("agent-error", fake, "agent_error")),
        timeout(case("no-headers", fake, "agent_timeout"), 1.0, |a, s| {
            a.first_event = s
        }),
        timeout(
            case("no-first-event", fake, "agent_timeout"),
            1.0,
            |a, s| a.first_event = s,
        ),
        timeout(case("idle", fake, "agent_timeout"), 1.5, |a, s| a.idle = s),
        timeout(case("endless", fake, "agent_timeout"), 2.0, |a, s| {
            a.run = s
        }),
    ]
}

/// A run of `text` for `agent`, posted with `Accept: text/event-stream`: its events, and when
/// the stream ended (right after the run's last event).
async fn run_agent(
    platform: &TestPlatform,
    token: &str,
    agent: &str,
    text: &str,
) -> anyhow::Result<(String, Vec<Value>, Instant)> {
    let thread = uuid::Uuid::new_v4().to_string();
    let mut body = text_run(&thread, &format!("run-{agent}"), text);
    body["forwardedProps"] = json!({"agent": agent});
    let response = platform
        .http
        .post(format!("{}/api/v1/agent/runs", platform.urls.runs))
        .bearer_auth(token)
        .header("accept", "text/event-stream")
        .json(&body)
        .send()
        .await?;
    anyhow::ensure!(
        response.status() == 200,
        "the run for {agent} was answered {}",
        response.status()
    );
    let events = read_sse(response, None).await?;
    Ok((
        thread,
        events.into_iter().map(|f| f.data).collect(),
        Instant::now(),
    ))
}

fn kinds(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or("?"))
        .collect()
}

/// What is wrong with the run of `case` (empty when nothing).
async fn check(
    case: &Case,
    fake: &FakeAgent,
    posted: Instant,
    outcome: anyhow::Result<(String, Vec<Value>, Instant)>,
) -> Vec<String> {
    let name = case.agent.name;
    let mut wrong = Vec::new();
    let (events, ended) = match outcome {
        Ok((_, events, ended)) => (events, ended),
        Err(error) => return vec![format!("{name}: no complete run: {error:#}")],
    };
    let last = events.last().cloned().unwrap_or(Value::Null);
    if (&last["type"], &last["code"]) != (&json!("RUN_ERROR"), &json!(case.code)) {
        wrong.push(format!(
            "{name}: ended {} {}, expected RUN_ERROR {}: {last}; events {:?}",
            last["type"],
            last["code"],
            case.code,
            kinds(&events)
        ));
    }
    if last["message"].as_str().is_none_or(str::is_empty) {
        wrong.push(format!("{name}: RUN_ERROR without a message: {last}"));
    }
    let starts = events.iter().filter(|e| e["type"] == "RUN_STARTED").count();
    let finishes = events
        .iter()
        .filter(|e| e["type"] == "RUN_FINISHED")
        .count();
    if events.first().map(|e| &e["type"]) != Some(&json!("RUN_STARTED"))
        || (starts, finishes) != (1, 0)
    {
        wrong.push(format!(
            "{name}: expected the worker's one RUN_STARTED first and no RUN_FINISHED: {:?}",
            kinds(&events)
        ));
    }
    let Some(path) = case.path else {
        let took = ended - posted;
        if took > SLACK {
            wrong.push(format!("{name}: ended {took:?} after it was posted"));
        }
        return wrong;
    };
    let stats = fake.stats(path);
    if stats.requests != 1 {
        wrong.push(format!(
            "{name}: the agent got {} requests, expected exactly one",
            stats.requests
        ));
    }
    let took = stats
        .last_request_at
        .map_or(ended - posted, |at| ended.saturating_duration_since(at));
    match case.timeout {
        Some(timeout) if took + EARLY < timeout || took > timeout + SLACK => wrong.push(format!(
            "{name}: ended {took:?} after the agent's request, expected {timeout:?} (+{SLACK:?})"
        )),
        None if took > SLACK => wrong.push(format!(
            "{name}: ended {took:?} after the agent's request, expected within {SLACK:?}"
        )),
        _ => {}
    }
    if case.hangs
        && let Err(error) = fake.wait_for(path, RELEASE, |s| s.closed == 1).await
    {
        wrong.push(format!(
            "{name}: the worker did not close its request to the agent: {error:#}"
        ));
    }
    match name {
        "status-500" if !last["message"].as_str().unwrap_or("").contains("500") => {
            wrong.push(format!(
                "{name}: the message does not name the status: {last}"
            ));
        }
        "agent-error"
            if !last["message"]
                .as_str()
                .unwrap_or("")
                .contains(AGENT_ERROR_MESSAGE) =>
        {
            wrong.push(format!(
                "{name}: the agent's message is not relayed: {last}"
            ));
        }
        _ => {}
    }
    wrong
}

#[tokio::test]
async fn every_misbehaving_remote_agent_ends_its_run_with_a_precise_error_and_a_healthy_one_still_answers()
 {
    let fake = FakeAgent::spawn().await.unwrap();
    let cases = cases(&fake);
    let ok = Agent {
        extra: "owner_header = \"X-Switchboard-Owner\"\n\
                headers = { \"X-Api-Key\" = \"${CARGO_PKG_NAME}\" }"
            .to_owned(),
        ..Agent::new("ok", fake.url("/ok"))
    };
    let toml: String = cases
        .iter()
        .map(|c| &c.agent)
        .chain([&ok])
        .map(Agent::toml)
        .collect();
    let file = AgentsFile::write(&toml);
    let platform = TestPlatform::spawn_with(Options {
        agents_file: Some(file.0.clone()),
        worker_concurrency: 32,
        max_runs_per_owner: 32,
        ..Options::default()
    })
    .await
    .unwrap();
    let alice = platform.infra.token("alice");

    // The catalog names every configured agent with its description.
    let (status, catalog) = platform
        .api()
        .get_runs(&alice, "/api/v1/agents")
        .await
        .unwrap();
    assert_eq!(status, 200, "{catalog}");
    for agent in cases.iter().map(|c| &c.agent).chain([&ok]) {
        let listed = catalog["agents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == agent.name);
        assert_eq!(
            listed.map(|a| &a["description"]),
            Some(&json!(agent.description())),
            "{} is listed with its description: {catalog}",
            agent.name
        );
    }

    // Every failure mode at once, each on its own run.
    let posted = Instant::now();
    let outcomes = futures::future::join_all(
        cases
            .iter()
            .map(|c| run_agent(&platform, &alice, c.agent.name, "hello")),
    )
    .await;
    let mut wrong = Vec::new();
    for (case, outcome) in cases.iter().zip(outcomes) {
        wrong.extend(check(case, &fake, posted, outcome).await);
    }
    assert!(
        wrong.is_empty(),
        "{} of {} failure modes misbehaved:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );

    // The same worker still runs a healthy agent, which echoes the question.
    let text = "What is the capital of France?";
    let (thread, events, _) = run_agent(&platform, &alice, "ok", text).await.unwrap();
    assert_eq!(
        kinds(&events),
        [
            "RUN_STARTED",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END",
            "RUN_FINISHED"
        ],
        "{events:?}"
    );
    assert_eq!(streamed_text(&events), text);
    let request = fake.stats("/ok");
    assert_eq!(request.requests, 1);
    let input = request.last_body.clone().unwrap();
    assert_eq!(
        (&input["threadId"], &input["runId"]),
        (&json!(thread), &json!("run-ok")),
        "the agent got the run's RunAgentInput: {input}"
    );
    assert_eq!(
        input["messages"]
            .as_array()
            .and_then(|m| m.last())
            .map(|m| &m["content"]),
        Some(&json!(text)),
        "{input}"
    );
    assert_eq!(
        request.header("accept").as_deref(),
        Some("text/event-stream")
    );
    assert_eq!(
        request.header("x-switchboard-owner").as_deref(),
        Some("alice")
    );
    assert_eq!(
        request.header("x-api-key").as_deref(),
        Some(env!("CARGO_PKG_NAME")),
        "the configured header, its ${{VAR}} expanded"
    );

    // No agent ever saw the user's token.
    for path in cases.iter().filter_map(|c| c.path).chain(["/ok"]) {
        assert_eq!(
            fake.last_header(path, "authorization"),
            None,
            "{path} got an Authorization header"
        );
    }
}

/// A one-agent file: `slow`, the fake agent's `/slow`.
fn slow_agent_file(fake: &FakeAgent) -> AgentsFile {
    // The stream lasts 20 s: no timeout may end it first.
    let slow = Agent {
        run: 60.0,
        ..Agent::new("slow", fake.url("/slow"))
    };
    AgentsFile::write(&slow.toml())
}

fn slow_run(thread: &str, run: &str) -> Value {
    let mut body = text_run(thread, run, "take your time");
    body["forwardedProps"] = json!({"agent": "slow"});
    body
}

async fn events_of(
    http: &reqwest::Client,
    runs: &str,
    token: &str,
    run: &str,
    limit: Option<usize>,
) -> Vec<Value> {
    let response = http
        .get(format!(
            "{runs}/api/v1/agent/runs/{run}/events?compact=false"
        ))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    read_sse(response, limit)
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.data)
        .collect()
}

#[tokio::test]
async fn cancelling_a_remote_run_mid_stream_ends_it_cancelled_and_closes_the_agents_request() {
    let fake = FakeAgent::spawn().await.unwrap();
    let file = slow_agent_file(&fake);
    let platform = TestPlatform::spawn_with(Options {
        agents_file: Some(file.0.clone()),
        ..Options::default()
    })
    .await
    .unwrap();
    let alice = platform.infra.token("alice");
    let thread = uuid::Uuid::new_v4().to_string();
    let (status, body) = platform
        .api()
        .post_run(&alice, &slow_run(&thread, "slow-cancel"))
        .await
        .unwrap();
    assert_eq!(status, 202, "{body}");
    // Under way: the start, the message's start and two of its 200 chunks have arrived.
    let before = events_of(
        &platform.http,
        &platform.urls.runs,
        &alice,
        "slow-cancel",
        Some(4),
    )
    .await;
    assert_eq!(
        kinds(&before),
        [
            "RUN_STARTED",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_CONTENT"
        ]
    );

    let (status, body) = platform
        .api()
        .cancel_run(&alice, "slow-cancel")
        .await
        .unwrap();
    assert_eq!(status, 202, "{body}");
    let cancelled_at = Instant::now();
    let closed = fake
        .wait_for("/slow", SLACK, |s| s.closed == 1)
        .await
        .unwrap();
    let took = closed
        .last_closed_at
        .unwrap()
        .saturating_duration_since(cancelled_at);
    assert!(
        took <= SLACK,
        "the worker closed the agent's request {took:?} after the cancel"
    );
    assert_eq!((closed.requests, closed.completed), (1, 0));

    let log = events_of(
        &platform.http,
        &platform.urls.runs,
        &alice,
        "slow-cancel",
        None,
    )
    .await;
    let last = log.last().unwrap();
    assert_eq!(
        (&last["type"], &last["code"]),
        (&json!("RUN_ERROR"), &json!("cancelled")),
        "{:?}",
        kinds(&log)
    );
    assert!(
        !log.iter().any(|e| e["type"] == "RUN_FINISHED"),
        "{:?}",
        kinds(&log)
    );
    platform
        .api()
        .wait_for_status(&alice, "slow-cancel", "cancelled")
        .await
        .unwrap();
    assert_eq!(fake.requests("/slow"), 1);
}

#[tokio::test]
async fn a_worker_killed_mid_remote_run_ends_it_worker_lost_without_calling_the_agent_again() {
    let fake = FakeAgent::spawn().await.unwrap();
    let file = slow_agent_file(&fake);
    let agents_file = file.0.to_string_lossy().into_owned();
    let mut platform = ProcessPlatform::spawn_with_env(&[("SB_WORKER_AGENTS_FILE", &agents_file)])
        .await
        .unwrap();
    let alice = platform.infra.token("alice");
    let thread = uuid::Uuid::new_v4().to_string();
    let (status, body) = platform
        .api()
        .post_run(&alice, &slow_run(&thread, "slow-lost"))
        .await
        .unwrap();
    assert_eq!(status, 202, "{body}");
    let before = events_of(
        &platform.http,
        &platform.urls.runs,
        &alice,
        "slow-lost",
        Some(4),
    )
    .await;
    assert_eq!(
        kinds(&before),
        [
            "RUN_STARTED",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_CONTENT"
        ]
    );

    platform.kill("worker").unwrap();
    // The dead worker's connection is closed by its kernel.
    fake.wait_for("/slow", Duration::from_secs(5), |s| s.closed == 1)
        .await
        .unwrap();
    platform.restart("worker").await.unwrap();
    let status = platform
        .api()
        .wait_for_status(&alice, "slow-lost", "failed")
        .await
        .unwrap();

    let log = events_of(
        &platform.http,
        &platform.urls.runs,
        &alice,
        "slow-lost",
        None,
    )
    .await;
    assert_eq!(
        &log[..4],
        &before[..],
        "the events seen before the kill come first"
    );
    let last = log.last().unwrap();
    assert_eq!(
        (&last["type"], &last["code"]),
        (&json!("RUN_ERROR"), &json!("worker_lost")),
        "{status}; {:?}",
        kinds(&log)
    );
    let starts = log.iter().filter(|e| e["type"] == "RUN_STARTED").count();
    assert_eq!(
        starts,
        1,
        "the run was not started a second time: {:?}",
        kinds(&log)
    );
    assert_eq!(
        fake.requests("/slow"),
        1,
        "the restarted worker did not call the agent again"
    );
}

#[tokio::test]
async fn the_usage_a_remote_agent_reports_is_the_runs_usage() {
    let fake = FakeAgent::spawn().await.unwrap();
    let counted = Agent::new("counted", fake.url("/ok?input_tokens=9&output_tokens=4"));
    let file = AgentsFile::write(&counted.toml());
    let platform = TestPlatform::spawn_with(Options {
        agents_file: Some(file.0.clone()),
        ..Options::default()
    })
    .await
    .unwrap();
    let alice = platform.infra.token("alice");
    let mut body = text_run(&uuid::Uuid::new_v4().to_string(), "counted-1", "hello");
    body["forwardedProps"] = json!({"agent": "counted"});
    let (status, answer) = platform.api().post_run(&alice, &body).await.unwrap();
    assert_eq!(status, 202, "{answer}");
    let events = events_of(
        &platform.http,
        &platform.urls.runs,
        &alice,
        "counted-1",
        None,
    )
    .await;
    let usage =
        json!([{"model": "fake-model", "inputTokens": 9, "outputTokens": 4, "totalTokens": 13}]);
    let last = events.last().unwrap();
    assert_eq!(last["type"], "RUN_FINISHED", "{events:?}");
    assert_eq!(last["usage"], usage);
    let status = platform
        .api()
        .wait_for_status(&alice, "counted-1", "completed")
        .await
        .unwrap();
    assert_eq!(status["usage"], usage);
}
