//! The worker's relay to a remote AG-UI agent: what it adds to every event's latency, and how
//! many events a second one worker relays (`scripts/bench-relay.sh`, `BENCHMARKS.md` section 10).
//!
//! Every `TEXT_MESSAGE_CONTENT` the bench agent sends carries its send time in its `delta`
//! (`t=<unix epoch microseconds>;`); a reader's latency of an event is its arrival (the SSE
//! chunk's, on the same machine's clock) minus that time. Modes:
//!
//! - `--mode agent [--port P | --addr HOST:PORT] [--events N] [--interval-ms I]
//!   [--max-seconds T]`: a minimal AG-UI agent. Every `POST /agent` (or `/`) of a
//!   `RunAgentInput` is answered with an event stream: `RUN_STARTED`, `TEXT_MESSAGE_START`,
//!   N `TEXT_MESSAGE_CONTENT` paced every I ms (0: as fast as the connection takes them),
//!   `TEXT_MESSAGE_END`, `RUN_FINISHED`. A request's `forwardedProps.relayBench`
//!   (`{"events": N, "intervalMs": I}`) overrides both for that run. `GET /healthz` answers
//!   200. Exits after T seconds (default 3600).
//! - `--mode direct --url AGENT_URL [--runs-count K] [--events N] [--interval-ms I]
//!   [--warmup W] [--max-seconds T] [--label L]`: reads the agent's stream itself (K runs, one
//!   after the other): the latency and rate without the relay.
//! - `--mode relayed --runs RUNS_BASE_URL --token JWT [--runs-count K] [--concurrency C]
//!   [--agent NAME] [--events N] [--interval-ms I] [--warmup W] [--max-seconds T] [--label L]`:
//!   K runs through the runs service (`POST /api/v1/agent/runs` with
//!   `Accept: text/event-stream`, C at a time, each on a new thread), the relayed events read
//!   from the same response.
//! - `--mode publish --prefix P [--nats-url URL] [--events N] [--max-seconds T]`: the worker's
//!   JetStream work per event alone: N run events of one run published on `P`'s RUN_EVENTS
//!   stream one after the other exactly as the worker's `EventSink` does
//!   (`platform::nats::publish_idempotent`, msg-id `<task>:<seq>`, ack awaited before the next).
//!   Use a prefix no service runs on; `js-publish-loop --mode cleanup` deletes its streams.
//! - `--mode observe --prefix P [--nats-url URL] [--pids NAME=PID,...] [--clk-tck 100]
//!   [--min-events E] [--every-ms 200] [--quiet-seconds 3] [--max-seconds T]`: watches the
//!   prefix's RUN_EVENTS stream and history's consumer of it every 200 ms, with the CPU time of
//!   the named processes, until at least E events have come and then none for 3 s, with history
//!   caught up. Prints the events
//!   published a second while the stream grew, the cores each process used meanwhile, and how
//!   far and how long history was behind and the rate at which it applied events then.
//!
//! `--events` and `--interval-ms` of `direct` and `relayed` are sent as
//! `forwardedProps.relayBench` (absent: the agent's own settings). The first W content events of
//! every run (default 10) are not counted in the latency. Each reading mode prints one JSON line:
//! the latency percentiles in ms (`latency`), the content events a second of each run from its
//! first to its last content event (`events_per_s`: min, median, max over the runs), the time
//! from the request to the first content event (`first_content`) and from the last content
//! event to `RUN_FINISHED` (`finished_after_last_content`), and what went wrong (missing events,
//! runs that did not finish). Bounded by `--max-seconds` (default 300).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse as _, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt as _;
use futures::StreamExt as _;
use serde_json::{Value, json};
use switchboard_bench::{Args, DEFAULT_TEXT, print_line};
use uuid::Uuid;

/// Most content events one run of the agent sends, whatever a request asks.
const MAX_EVENTS: u64 = 1_000_000;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = switchboard_bench::args!()?;
    let mode = args.get("mode", "BENCH_MODE").context(
        "--mode is required: agent, direct, relayed, publish or observe (--help: usage)",
    )?;
    match mode.as_str() {
        "agent" => agent(&args).await,
        "direct" | "relayed" => read(&args, &mode).await,
        "publish" => publish(&args).await,
        "observe" => observe(&args).await,
        other => anyhow::bail!("--mode {other:?}: use agent, direct, relayed, publish or observe"),
    }
}

/// Now, as microseconds since the Unix epoch (the clock both processes share).
fn epoch_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

// ------------------------------------------------------------------------------------- agent

/// What one run of the agent sends.
#[derive(Debug, Clone, Copy)]
struct Pace {
    events: u64,
    interval: Duration,
}

impl Pace {
    /// `forwardedProps.relayBench` of a request over the agent's own settings.
    fn of(input: &Value, default: Pace) -> Pace {
        let props = input.pointer("/forwardedProps/relayBench");
        let events = props
            .and_then(|p| p.get("events"))
            .and_then(Value::as_u64)
            .unwrap_or(default.events);
        let interval = props
            .and_then(|p| p.get("intervalMs"))
            .and_then(Value::as_f64)
            .filter(|ms| ms.is_finite() && *ms >= 0.0 && *ms <= 60_000.0)
            .map_or(default.interval, |ms| Duration::from_secs_f64(ms / 1000.0));
        Pace {
            events: events.min(MAX_EVENTS),
            interval,
        }
    }
}

async fn agent(args: &Args) -> anyhow::Result<()> {
    let addr = match (
        args.get("addr", "BENCH_AGENT_ADDR"),
        args.get("port", "BENCH_AGENT_PORT"),
    ) {
        (Some(addr), _) => addr,
        (None, Some(port)) => format!("127.0.0.1:{port}"),
        (None, None) => "127.0.0.1:8097".to_owned(),
    };
    let pace = Pace {
        events: args
            .parsed("events", "BENCH_EVENTS", 200_u64)?
            .min(MAX_EVENTS),
        interval: Duration::from_secs_f64(
            args.parsed("interval-ms", "BENCH_INTERVAL_MS", 10.0_f64)?
                .max(0.0)
                / 1000.0,
        ),
    };
    let lifetime =
        Duration::from_secs_f64(args.parsed("max-seconds", "BENCH_MAX_SECONDS", 3600.0)?);
    let app = Router::new()
        .route("/agent", post(agent_run))
        .route("/", post(agent_run))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(Arc::new(pace));
    // Like the services and the AG-UI servers of the Python SDKs (asyncio sets TCP_NODELAY):
    // without it, the small writes of a paced stream wait on the reader's delayed ACK.
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?
        .tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
    print_line(
        json!({"target": "relay-bench", "mode": "agent", "addr": addr}),
        serde_json::Map::new(),
    )?;
    // Bounded: the server stops by itself; streams still open are cut.
    tokio::select! {
        served = axum::serve(listener, app) => served?,
        () = tokio::time::sleep(lifetime) => {}
    }
    Ok(())
}

/// One run: the events of [`Pace::of`] the request, as server-sent events.
async fn agent_run(State(default): State<Arc<Pace>>, body: axum::body::Bytes) -> Response {
    let Ok(input) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "the body is not JSON").into_response();
    };
    let pace = Pace::of(&input, *default);
    let text = |name: &str| {
        input
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let (thread_id, run_id) = (text("threadId"), text("runId"));
    let message_id = format!("relay-bench-{}", Uuid::new_v4().simple());
    let mut ticks = tokio::time::interval(pace.interval.max(Duration::from_nanos(1)));
    // Paced runs keep their spacing after a stall instead of catching up in a burst.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let total = pace.events + 4;
    let events = futures::stream::unfold((0_u64, ticks), move |(i, mut ticks)| {
        let (thread_id, run_id, message_id) =
            (thread_id.clone(), run_id.clone(), message_id.clone());
        async move {
            let event = match i {
                _ if i >= total => return None,
                0 => json!({"type": "RUN_STARTED", "threadId": thread_id, "runId": run_id}),
                1 => {
                    json!({"type": "TEXT_MESSAGE_START", "messageId": message_id, "role": "assistant"})
                }
                _ if i == total - 2 => json!({"type": "TEXT_MESSAGE_END", "messageId": message_id}),
                _ if i == total - 1 => {
                    json!({"type": "RUN_FINISHED", "threadId": thread_id, "runId": run_id})
                }
                _ => {
                    if pace.interval.is_zero() {
                        // As fast as the connection takes them, but let the server write.
                        if i % 64 == 0 {
                            tokio::task::yield_now().await;
                        }
                    } else {
                        ticks.tick().await;
                    }
                    // Stamped last, as the event leaves the agent.
                    json!({
                        "type": "TEXT_MESSAGE_CONTENT",
                        "messageId": message_id,
                        "delta": format!("t={};", epoch_micros()),
                    })
                }
            };
            let frame = Event::default().data(event.to_string());
            Some((Ok::<_, Infallible>(frame), (i + 1, ticks)))
        }
    });
    Sse::new(events).into_response()
}

// ------------------------------------------------------------------------------------- readers

/// What one run's stream gave its reader.
#[derive(Debug, Default)]
struct Reading {
    /// Per counted content event: arrival − send, in microseconds.
    latencies: Vec<i64>,
    /// Content events (send times) seen, counted or not.
    content: u64,
    /// Arrival of the first and the last content event.
    first: Option<Instant>,
    last: Option<Instant>,
    /// From the request to the first content event.
    first_after_request: Option<Duration>,
    /// From the last content event to `RUN_FINISHED`.
    end_after_last: Option<Duration>,
    /// `RUN_FINISHED` seen.
    finished: bool,
    /// `RUN_ERROR`'s message, or why the stream could not be read to its end.
    error: Option<String>,
    /// Content events whose delta carried no send time.
    unstamped: u64,
}

impl Reading {
    /// Content events a second, from the first to the last content event.
    fn rate(&self) -> Option<f64> {
        let (first, last) = (self.first?, self.last?);
        let secs = last.duration_since(first).as_secs_f64();
        (self.content > 1 && secs > 0.0).then(|| (self.content - 1) as f64 / secs)
    }
}

/// Reads one run's event stream to `RUN_FINISHED`, `RUN_ERROR`, its end or `deadline`.
async fn read_stream(
    mut response: reqwest::Response,
    requested: Instant,
    warmup: u64,
    deadline: tokio::time::Instant,
) -> Reading {
    let mut reading = Reading::default();
    let mut parser = protocol::sse::SseParser::new();
    loop {
        let chunk = match tokio::time::timeout_at(deadline, response.chunk()).await {
            Err(_) => {
                reading.error = Some("the stream did not end before --max-seconds".to_owned());
                return reading;
            }
            Ok(Err(err)) => {
                reading.error = Some(format!("the stream broke: {err}"));
                return reading;
            }
            Ok(Ok(None)) => {
                reading.error = Some("the stream ended before RUN_FINISHED".to_owned());
                return reading;
            }
            Ok(Ok(Some(chunk))) => chunk,
        };
        let (at, now) = (Instant::now(), epoch_micros());
        let frames = match parser.push(&chunk) {
            Ok(frames) => frames,
            Err(err) => {
                reading.error = Some(format!("unreadable stream: {err}"));
                return reading;
            }
        };
        for frame in frames {
            let protocol::sse::SseFrame::Event(event) = frame else {
                continue;
            };
            let Ok(event) = serde_json::from_str::<Value>(&event.data) else {
                continue;
            };
            match event.get("type").and_then(Value::as_str) {
                Some("TEXT_MESSAGE_CONTENT") => {
                    let delta = event.get("delta").and_then(Value::as_str).unwrap_or("");
                    let stamps: Vec<i64> = delta
                        .split(';')
                        .filter_map(|part| part.trim().strip_prefix("t="))
                        .filter_map(|t| t.parse().ok())
                        .collect();
                    reading.unstamped += u64::from(stamps.is_empty());
                    for sent in stamps {
                        reading.content += 1;
                        reading.first.get_or_insert(at);
                        reading.last = Some(at);
                        reading
                            .first_after_request
                            .get_or_insert_with(|| at.duration_since(requested));
                        if reading.content > warmup {
                            reading.latencies.push(now - sent);
                        }
                    }
                }
                Some("RUN_FINISHED") => {
                    reading.finished = true;
                    reading.end_after_last = reading.last.map(|last| at.duration_since(last));
                    return reading;
                }
                Some("RUN_ERROR") => {
                    let message = event.get("message").and_then(Value::as_str).unwrap_or("");
                    reading.error = Some(format!("RUN_ERROR: {message}"));
                    return reading;
                }
                _ => {}
            }
        }
    }
}

/// Percentiles (nearest rank) of microsecond samples, in milliseconds.
fn summary(mut values: Vec<i64>) -> Value {
    if values.is_empty() {
        return json!({"count": 0});
    }
    values.sort_unstable();
    let at = |q: f64| {
        let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
        values[rank - 1] as f64 / 1000.0
    };
    let mean = values.iter().map(|&v| v as f64).sum::<f64>() / values.len() as f64 / 1000.0;
    json!({
        "count": values.len(),
        "min_ms": at(0.0),
        "p50_ms": at(0.50),
        "p90_ms": at(0.90),
        "p99_ms": at(0.99),
        "max_ms": at(1.0),
        "mean_ms": mean,
    })
}

/// Min, median and max of `values`.
fn spread(mut values: Vec<f64>) -> Value {
    if values.is_empty() {
        return json!({"count": 0});
    }
    values.sort_by(f64::total_cmp);
    json!({
        "count": values.len(),
        "min": values[0],
        "median": values[(values.len() - 1) / 2],
        "max": values[values.len() - 1],
    })
}

/// What the `direct` and `relayed` modes share.
struct Reader {
    mode: String,
    http: reqwest::Client,
    /// The agent's URL, or the runs service's run endpoint.
    url: String,
    token: Option<String>,
    agent: Option<String>,
    events: Option<u64>,
    interval_ms: Option<f64>,
    warmup: u64,
    text: String,
}

impl Reader {
    /// The body of run `i`: a `RunAgentInput` on a new thread.
    fn body(&self, i: usize) -> String {
        let mut props = serde_json::Map::new();
        if let Some(agent) = &self.agent {
            props.insert("agent".to_owned(), json!(agent));
        }
        let mut pace = serde_json::Map::new();
        if let Some(events) = self.events {
            pace.insert("events".to_owned(), json!(events));
        }
        if let Some(ms) = self.interval_ms {
            pace.insert("intervalMs".to_owned(), json!(ms));
        }
        if !pace.is_empty() {
            props.insert("relayBench".to_owned(), Value::Object(pace));
        }
        let mut body = json!({
            "threadId": Uuid::new_v4().to_string(),
            "runId": format!("relay-bench-{}-{i}", &Uuid::new_v4().simple().to_string()[..8]),
            "messages": [{"id": "m1", "role": "user", "content": self.text}],
        });
        if !props.is_empty() {
            body["forwardedProps"] = Value::Object(props);
        }
        if self.mode == "direct" {
            // What the relay sends besides: the agent ignores it, but the request is the same size.
            body["state"] = json!({});
            body["tools"] = json!([]);
            body["context"] = json!([]);
        }
        body.to_string()
    }

    async fn run(&self, i: usize, deadline: tokio::time::Instant) -> Reading {
        let mut request = self
            .http
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .body(self.body(i));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let requested = Instant::now();
        let response = match tokio::time::timeout_at(deadline, request.send()).await {
            Err(_) => return failed("no answer before --max-seconds".to_owned()),
            Ok(Err(err)) => return failed(format!("POST {}: {err}", self.url)),
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return failed(format!("POST {} answered {status}: {body}", self.url));
        }
        read_stream(response, requested, self.warmup, deadline).await
    }
}

/// `--name` (or `env`) parsed, if given.
fn optional<T>(args: &Args, name: &str, env: &str) -> anyhow::Result<Option<T>>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    args.get(name, env)
        .map(|raw| {
            raw.parse()
                .map_err(|err| anyhow::anyhow!("--{name} / {env} = {raw:?} is invalid: {err}"))
        })
        .transpose()
}

fn failed(error: String) -> Reading {
    Reading {
        error: Some(error),
        ..Reading::default()
    }
}

async fn read(args: &Args, mode: &str) -> anyhow::Result<()> {
    let url = if mode == "direct" {
        args.get("url", "BENCH_AGENT_URL")
            .context("--url is required (the agent's URL)")?
    } else {
        let base = args
            .get("runs", "BENCH_RUNS_URL")
            .context("--runs is required (the runs service's base URL)")?;
        format!("{}/api/v1/agent/runs", base.trim_end_matches('/'))
    };
    let token = args.get("token", "BENCH_TOKEN");
    anyhow::ensure!(
        mode == "direct" || token.is_some(),
        "--token is required (a bearer token for the runs service)"
    );
    let reader = Reader {
        mode: mode.to_owned(),
        http: reqwest::Client::builder()
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(10))
            .build()?,
        url,
        token,
        agent: args.get("agent", "BENCH_AGENT"),
        events: optional(args, "events", "BENCH_EVENTS")?,
        interval_ms: optional(args, "interval-ms", "BENCH_INTERVAL_MS")?,
        warmup: args.parsed("warmup", "BENCH_WARMUP", 10_u64)?,
        text: args
            .get("text", "BENCH_TEXT")
            .unwrap_or_else(|| DEFAULT_TEXT.to_owned()),
    };
    let count = args
        .parsed("runs-count", "BENCH_RUNS_COUNT", 1_usize)?
        .max(1);
    let concurrency = if mode == "direct" {
        1
    } else {
        args.parsed("concurrency", "BENCH_CONCURRENCY", 1_usize)?
            .max(1)
    };
    let max_time =
        Duration::from_secs_f64(args.parsed("max-seconds", "BENCH_MAX_SECONDS", 300.0)?);
    let deadline = tokio::time::Instant::now() + max_time;

    let started = Instant::now();
    let reader = &reader;
    let readings: Vec<Reading> = futures::stream::iter(0..count)
        .map(|i| reader.run(i, deadline))
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let seconds = started.elapsed().as_secs_f64();

    let expected = reader.events;
    let mut latencies = Vec::new();
    let mut rates = Vec::new();
    let mut firsts = Vec::new();
    let mut ends = Vec::new();
    let (mut content, mut unfinished, mut short, mut unstamped) = (0_u64, 0_u64, 0_u64, 0_u64);
    let mut first_error = None;
    let (mut earliest, mut latest) = (None::<Instant>, None::<Instant>);
    for reading in readings {
        content += reading.content;
        unstamped += reading.unstamped;
        unfinished += u64::from(!reading.finished);
        short += u64::from(expected.is_some_and(|n| reading.content < n));
        if let Some(err) = &reading.error {
            first_error.get_or_insert_with(|| err.clone());
        }
        if let Some(rate) = reading.rate() {
            rates.push(rate);
        }
        let micros = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
        firsts.extend(reading.first_after_request.map(micros));
        ends.extend(reading.end_after_last.map(micros));
        earliest = match (earliest, reading.first) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        latest = match (latest, reading.last) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        latencies.extend(reading.latencies);
    }
    let overall = match (earliest, latest) {
        (Some(a), Some(b)) if b > a && content > 1 => {
            json!((content - 1) as f64 / b.duration_since(a).as_secs_f64())
        }
        _ => Value::Null,
    };
    print_line(
        json!({
            "target": "relay-bench",
            "mode": mode,
            "label": args.get("label", "BENCH_LABEL"),
            "runs": count,
            "concurrency": concurrency,
            "events_per_run": expected,
            "interval_ms": reader.interval_ms,
            "warmup_per_run": reader.warmup,
            "content_events": content,
            "runs_unfinished": unfinished,
            "runs_short": short,
            "unstamped": unstamped,
            "first_error": first_error,
            "seconds": seconds,
            "latency": summary(latencies),
            "events_per_s": spread(rates),
            "events_per_s_all_runs": overall,
            "first_content": summary(firsts),
            "finished_after_last_content": summary(ends),
        }),
        serde_json::Map::new(),
    )?;
    anyhow::ensure!(
        unfinished == 0 && short == 0,
        "{unfinished} of {count} runs did not finish, {short} missed events: {}",
        first_error.unwrap_or_default()
    );
    Ok(())
}

// ------------------------------------------------------------------------------------- publish

async fn publish(args: &Args) -> anyhow::Result<()> {
    let prefix = args
        .get("prefix", "BENCH_NATS_PREFIX")
        .context("--prefix is required (a NATS prefix no service runs on)")?;
    let names = protocol::messaging::Names::new(&prefix)?;
    let config = platform::nats::NatsConfig {
        url: args
            .get("nats-url", "SB_NATS_URL")
            .unwrap_or_else(|| "nats://127.0.0.1:4222".to_owned()),
        names: names.clone(),
        limits: platform::config::Env::from_process().nats()?.limits,
        credentials: platform::nats_auth::NatsCredentials::default(),
    };
    let events = args.parsed("events", "BENCH_EVENTS", 5_000_u64)?.max(1);
    let max_time =
        Duration::from_secs_f64(args.parsed("max-seconds", "BENCH_MAX_SECONDS", 120.0)?);
    let (_client, js) = platform::nats::connect(&config, "bench-relay-publish").await?;
    platform::nats::ensure_streams(&js, &config).await?;

    let task_id = Uuid::now_v7();
    let subject = names.run_event_subject(task_id);
    let (thread_id, run_id) = (Uuid::new_v4().to_string(), format!("relay-bench-{task_id}"));
    let message_id = format!("relay-bench-{}", Uuid::new_v4().simple());
    let mut latency = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let started = Instant::now();
    let mut published = 0_u64;
    let mut payload_bytes = 0_usize;
    for seq in 1..=events {
        if started.elapsed() > max_time {
            break;
        }
        // Built as the worker builds it: a RunEventMessage::V1 of a relayed content event.
        let message: protocol::messaging::RunEventMessage = serde_json::from_value(json!({
            "v": "1",
            "task_id": task_id,
            "owner": "bench",
            "thread_id": thread_id,
            "run_id": run_id,
            "seq": seq,
            "emitted_at": chrono::Utc::now(),
            "event": {
                "type": "TEXT_MESSAGE_CONTENT",
                "messageId": message_id,
                "delta": format!("t={};", epoch_micros()),
            },
        }))
        .context("RunEventMessage from JSON")?;
        let payload = serde_json::to_vec(&message)?;
        payload_bytes = payload.len();
        let headers = platform::nats::publish_headers(&format!("{task_id}:{seq}"));
        let sent = Instant::now();
        platform::nats::publish_idempotent(&js, &subject, headers, payload.into()).await?;
        let micros = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
        latency.saturating_record(micros.max(1));
        published += 1;
    }
    let seconds = started.elapsed().as_secs_f64();
    let ms = |micros: u64| json!(micros as f64 / 1000.0);
    print_line(
        json!({
            "target": "relay-bench",
            "mode": "publish",
            "label": args.get("label", "BENCH_LABEL"),
            "prefix": prefix,
            "published": published,
            "payload_bytes": payload_bytes,
            "seconds": seconds,
            "events_per_s": published as f64 / seconds.max(1e-9),
            "publish_to_ack": {
                "p50_ms": ms(latency.value_at_quantile(0.50)),
                "p90_ms": ms(latency.value_at_quantile(0.90)),
                "p99_ms": ms(latency.value_at_quantile(0.99)),
                "max_ms": ms(latency.max()),
                "mean_ms": latency.mean() / 1000.0,
            },
        }),
        serde_json::Map::new(),
    )?;
    anyhow::ensure!(
        published == events,
        "published {published} of {events} events within --max-seconds"
    );
    Ok(())
}

// ------------------------------------------------------------------------------------- observe

/// One look at the prefix's RUN_EVENTS stream, its history consumer and the watched processes.
struct Sample {
    at: Instant,
    /// The stream's last sequence: every event the worker published.
    published: u64,
    /// What history has acknowledged (its consumer's ack floor).
    applied: u64,
    /// Events history has not acknowledged yet.
    behind: u64,
    /// CPU ticks (user + system) of each watched process.
    ticks: Vec<Option<u64>>,
}

/// CPU ticks (user + system) of process `pid` so far (`/proc/PID/stat`).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name's ")": utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

async fn observe(args: &Args) -> anyhow::Result<()> {
    let prefix = args
        .get("prefix", "BENCH_NATS_PREFIX")
        .context("--prefix is required (the NATS prefix of the services under test)")?;
    let names = protocol::messaging::Names::new(&prefix)?;
    let url = args
        .get("nats-url", "SB_NATS_URL")
        .unwrap_or_else(|| "nats://127.0.0.1:4222".to_owned());
    let every = Duration::from_secs_f64(args.parsed("every-ms", "BENCH_EVERY_MS", 200.0)? / 1000.0);
    let quiet =
        Duration::from_secs_f64(args.parsed("quiet-seconds", "BENCH_QUIET_SECONDS", 3.0)?);
    let max_time =
        Duration::from_secs_f64(args.parsed("max-seconds", "BENCH_MAX_SECONDS", 600.0)?);
    let tck = args.parsed("clk-tck", "BENCH_CLK_TCK", 100.0_f64)?;
    let at_least = args.parsed("min-events", "BENCH_MIN_EVENTS", 1_u64)?;
    let mut watched: Vec<(String, u32)> = Vec::new();
    for pair in args
        .get("pids", "BENCH_PIDS")
        .unwrap_or_default()
        .split(',')
    {
        if let Some((name, pid)) = pair.split_once('=')
            && let Ok(pid) = pid.trim().parse()
        {
            watched.push((name.trim().to_owned(), pid));
        }
    }
    let client = async_nats::connect(&url).await?;
    let js = async_nats::jetstream::new(client);
    let stream = js.get_stream(names.run_events_stream()).await?;
    let look = || async {
        let info = stream.get_info().await?;
        let consumer = stream
            .consumer_info(protocol::messaging::HISTORY_EVENTS_CONSUMER)
            .await?;
        anyhow::Ok(Sample {
            at: Instant::now(),
            published: info.state.last_sequence,
            applied: consumer.ack_floor.stream_sequence,
            behind: consumer.num_pending + consumer.num_ack_pending as u64,
            ticks: watched.iter().map(|(_, pid)| cpu_ticks(*pid)).collect(),
        })
    };
    print_line(
        json!({"target": "relay-bench", "mode": "observe", "observing": names.run_events_stream()}),
        serde_json::Map::new(),
    )?;
    let started = Instant::now();
    let mut samples = vec![look().await?];
    let mut last_growth: Option<Instant> = None;
    loop {
        tokio::time::sleep(every).await;
        let sample = look().await?;
        let previous = samples.last().map_or(0, |s| s.published);
        if sample.published > previous {
            last_growth = Some(sample.at);
        }
        // A run's end may be held back while history catches up: a pause is not the end.
        let enough = sample.published - samples.first().map_or(0, |s| s.published) >= at_least;
        let done =
            enough && last_growth.is_some_and(|t| sample.behind == 0 && t.elapsed() >= quiet);
        samples.push(sample);
        if done || started.elapsed() >= max_time {
            break;
        }
    }

    // Relaying: the intervals in which the stream grew. Behind: those in which history had
    // events to apply at their start.
    let (mut relay_secs, mut relay_events, mut behind_secs, mut behind_applied) =
        (0.0_f64, 0_u64, 0.0_f64, 0_u64);
    let mut relay_ticks = vec![0_u64; watched.len()];
    let mut max_behind = 0_u64;
    for pair in samples.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let secs = b.at.duration_since(a.at).as_secs_f64();
        max_behind = max_behind.max(b.behind);
        if b.published > a.published {
            relay_secs += secs;
            relay_events += b.published - a.published;
            for (i, slot) in relay_ticks.iter_mut().enumerate() {
                if let (Some(Some(x)), Some(Some(y))) = (a.ticks.get(i), b.ticks.get(i)) {
                    *slot += y.saturating_sub(*x);
                }
            }
        }
        if a.behind > 0 {
            behind_secs += secs;
            behind_applied += b.applied.saturating_sub(a.applied);
        }
    }
    let cores: serde_json::Map<String, Value> = watched
        .iter()
        .zip(&relay_ticks)
        .map(|((name, _), ticks)| {
            let cores = *ticks as f64 / tck / relay_secs.max(1e-9);
            (name.clone(), json!((cores * 100.0).round() / 100.0))
        })
        .collect();
    let total: f64 =
        relay_ticks.iter().map(|&t| t as f64 / tck).sum::<f64>() / relay_secs.max(1e-9);
    let (first, last) = (samples.first(), samples.last());
    print_line(
        json!({
            "target": "relay-bench",
            "mode": "observe",
            "label": args.get("label", "BENCH_LABEL"),
            "seconds": started.elapsed().as_secs_f64(),
            "samples": samples.len(),
            "published": last.map_or(0, |s| s.published) - first.map_or(0, |s| s.published),
            "relaying_seconds": relay_secs,
            "relayed_per_s": relay_events as f64 / relay_secs.max(1e-9),
            "history_behind_max": max_behind,
            "history_behind_seconds": behind_secs,
            "history_applied_per_s": behind_applied as f64 / behind_secs.max(1e-9),
            "drained": last.is_some_and(|s| s.behind == 0),
            "cores_while_relaying": cores,
            "cores_while_relaying_total": (total * 100.0).round() / 100.0,
        }),
        serde_json::Map::new(),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_may_set_the_pace_within_bounds() {
        let default = Pace {
            events: 5,
            interval: Duration::from_millis(10),
        };
        let asked = Pace::of(
            &json!({"forwardedProps": {"relayBench": {"events": 7, "intervalMs": 0}}}),
            default,
        );
        assert_eq!((asked.events, asked.interval), (7, Duration::ZERO));
        let none = Pace::of(&json!({"forwardedProps": {}}), default);
        assert_eq!((none.events, none.interval), (5, Duration::from_millis(10)));
        let huge = Pace::of(
            &json!({"forwardedProps": {"relayBench": {"events": u64::MAX, "intervalMs": -1}}}),
            default,
        );
        assert_eq!((huge.events, huge.interval), (MAX_EVENTS, default.interval));
    }

    #[test]
    fn percentiles_are_nearest_rank_in_milliseconds() {
        let values = (1..=100).map(|ms| ms * 1000).collect();
        let out = summary(values);
        assert_eq!(out["p50_ms"], json!(50.0));
        assert_eq!(out["p99_ms"], json!(99.0));
        assert_eq!(out["max_ms"], json!(100.0));
        assert_eq!(summary(Vec::new()), json!({"count": 0}));
        assert_eq!(spread(vec![3.0, 1.0, 2.0])["median"], json!(2.0));
    }
}
