//! What `sse-latency` and `sse-idle` share: creating a run without the HTTP API (a `RunTask`
//! published onto the RUNS stream exactly as the runs service publishes it), publishing a run's
//! events exactly as the worker does (`services/worker/src/sink.rs`), reading a
//! `GET /api/v1/agent/runs/{runId}/events` stream, and the latency measurement both use.
//!
//! Every instant is taken from one monotonic clock ([`Instant`]) in one process: the publisher,
//! the core NATS baseline subscriber and the SSE readers all run in the benchmark process.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream;
use chrono::Utc;
use futures::StreamExt as _;
use protocol::agui::Event;
use protocol::messaging::{Names, RunEventMessage, RunTask};
use protocol::validate::parse_run_input;
use serde_json::{Value, json};
use switchboard_bench::{Args, DEFAULT_TEXT, run_body};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub mod raw;

/// Connections and settings shared by the benchmarks.
pub struct Bench {
    pub names: Names,
    pub nats_url: String,
    /// The "worker": publishes tasks and events, awaiting JetStream's acks.
    pub js: jetstream::Context,
    pub http: reqwest::Client,
    /// Base URL of the runs service, e.g. `http://127.0.0.1:8082`.
    pub base_url: String,
    pub token: String,
    /// The token's `sub`: the owner of every run.
    pub owner: String,
}

impl Bench {
    /// Reads `--url --token --owner --prefix --nats-url` (or `BENCH_RUNS_URL`, `BENCH_TOKEN`,
    /// `BENCH_OWNER`, `BENCH_NATS_PREFIX`, `SB_NATS_URL`) and connects.
    pub async fn connect(args: &Args, name: &str) -> anyhow::Result<Self> {
        let prefix = args
            .get("prefix", "BENCH_NATS_PREFIX")
            .context("--prefix is required (the runs service's SB_NATS_PREFIX)")?;
        let nats_url = args
            .get("nats-url", "SB_NATS_URL")
            .unwrap_or_else(|| "nats://127.0.0.1:4222".to_owned());
        let names = Names::new(&prefix)?;
        let config = platform::nats::NatsConfig {
            url: nats_url.clone(),
            names: names.clone(),
            limits: platform::nats::StreamLimits::default(),
            credentials: platform::nats_auth::NatsCredentials::default(),
        };
        let (_client, js) = platform::nats::connect(&config, name).await?;
        let http = reqwest::Client::builder()
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(0)
            .build()?;
        Ok(Self {
            names,
            nats_url,
            js,
            http,
            base_url: args
                .get("url", "BENCH_RUNS_URL")
                .context("--url is required (the runs service's base URL)")?
                .trim_end_matches('/')
                .to_owned(),
            token: args
                .get("token", "BENCH_TOKEN")
                .context("--token is required (a bearer token)")?,
            owner: args
                .get("owner", "BENCH_OWNER")
                .context("--owner is required (the token's sub)")?,
        })
    }

    /// Creates a run as the runs service would on `POST /api/v1/agent/runs`: its `RunTask` on
    /// the RUNS stream (nobody consumes it: the benchmark plays the worker).
    pub async fn create_run(&self, run_id: String) -> anyhow::Result<Run> {
        let body = run_body(&Uuid::new_v4().to_string(), &run_id, DEFAULT_TEXT);
        let input = parse_run_input(body.as_bytes())
            .map_err(|v| anyhow::anyhow!("benchmark body is invalid: {}", v.message))?;
        let task_id = Uuid::now_v7();
        let run = Run {
            task_id,
            owner: self.owner.clone(),
            thread_id: input.thread_id.clone(),
            run_id: input.run_id.clone(),
            subject: self.names.run_event_subject(task_id),
        };
        // Built from JSON and checked by the protocol's own type, so fields added to the task
        // later (all optional) do not break the benchmark.
        let task: RunTask = serde_json::from_value(json!({
            "v": "1",
            "task_id": task_id,
            "owner": self.owner,
            "accepted_at": Utc::now(),
            "input": serde_json::to_value(&input)?,
        }))
        .context("RunTask from JSON")?;
        let RunTask::V1(task) = task;
        platform::nats::publish_run(&self.js, &self.names, &task)
            .await
            .context("publish run task")?;
        Ok(run)
    }

    /// Opens the run's event stream; returns once the response head (200) arrived.
    pub async fn open_events(&self, run: &Run) -> anyhow::Result<reqwest::Response> {
        let url = format!("{}/api/v1/agent/runs/{}/events", self.base_url, run.run_id);
        let response = self
            .http
            .get(url)
            .bearer_auth(&self.token)
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .send()
            .await
            .context("GET events")?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            anyhow::bail!("GET events answered {status}: {body}");
        }
        Ok(response)
    }

    /// Makes `run` its thread's active run as the runs service's acceptance does (the thread's
    /// lock, its task marked in the RUNS stream): a thread stream opened then follows its events.
    pub async fn lock_thread(&self, run: &Run) -> anyhow::Result<()> {
        let locks = self
            .js
            .get_key_value(self.names.thread_locks_bucket())
            .await
            .context("the thread locks bucket")?;
        let lock = platform::lifecycle::ThreadLock {
            task_id: run.task_id,
            run_key: String::new(),
            status_key: String::new(),
            published: true,
            claimed_at: Utc::now(),
        };
        let key = protocol::messaging::thread_lock_key(&run.owner, &run.thread_id);
        locks.put(key, serde_json::to_vec(&lock)?.into()).await?;
        Ok(())
    }

    /// Publishes event `seq` of `run` as the worker does and waits for JetStream's ack.
    pub async fn publish_event(&self, run: &Run, seq: u64, event: Event) -> anyhow::Result<()> {
        let payload = run.event_payload(seq, event)?;
        let headers = platform::nats::publish_headers(&format!("{}:{seq}", run.task_id));
        self.js
            .publish_with_headers(run.subject.clone(), headers, payload.into())
            .await?
            .await?;
        Ok(())
    }
}

/// A run the benchmark created.
#[derive(Clone)]
pub struct Run {
    pub task_id: Uuid,
    pub owner: String,
    pub thread_id: String,
    pub run_id: String,
    /// Subject of its events.
    pub subject: String,
}

impl Run {
    /// Event `seq` of a run of `total` events, shaped like an assistant's streamed answer:
    /// RUN_STARTED, TEXT_MESSAGE_START, TEXT_MESSAGE_CONTENT..., TEXT_MESSAGE_END, RUN_FINISHED.
    pub fn event(&self, seq: u64, total: u64) -> Event {
        let message_id = format!("msg-{}", self.run_id);
        match seq {
            1 => Event::RunStarted {
                thread_id: self.thread_id.clone(),
                run_id: self.run_id.clone(),
                input: None,
            },
            2 => Event::TextMessageStart {
                message_id,
                role: "assistant".to_owned(),
            },
            s if s == total => self.finished(),
            s if s + 1 == total => Event::TextMessageEnd { message_id },
            s => Event::TextMessageContent {
                message_id,
                delta: format!(" token{s} of the answer,"),
            },
        }
    }
}

impl Run {
    /// The message the worker publishes for event `seq`: a `RunEventMessage::V1` (built from
    /// JSON and checked by the protocol's own type, like the task).
    pub fn event_payload(&self, seq: u64, event: Event) -> anyhow::Result<Vec<u8>> {
        let message: RunEventMessage = serde_json::from_value(json!({
            "v": "1",
            "task_id": self.task_id,
            "owner": self.owner,
            "thread_id": self.thread_id,
            "run_id": self.run_id,
            "seq": seq,
            "emitted_at": Utc::now(),
            "event": serde_json::to_value(&event)?,
        }))
        .context("RunEventMessage from JSON")?;
        Ok(serde_json::to_vec(&message)?)
    }

    /// RUN_FINISHED of this run (built from JSON, so optional fields added to the event later
    /// do not break the benchmark).
    pub fn finished(&self) -> Event {
        serde_json::from_value(json!({
            "type": "RUN_FINISHED",
            "threadId": self.thread_id,
            "runId": self.run_id,
        }))
        .unwrap_or(Event::RunError {
            message: "run finished".to_owned(),
            code: None,
            usage: None,
        })
    }
}

/// One server-sent event frame.
pub enum Frame {
    /// An event: its run's seq (its `id`, or the `<seq>` of a thread stream's `<taskId>:<seq>`)
    /// and whether its `data` was a JSON object.
    Event { id: u64, json: bool },
    /// A comment (the service's heartbeat).
    Comment,
}

/// Reads SSE frames from a streaming response (with `protocol::sse`, the parser the tests and
/// the worker use).
pub struct SseReader {
    response: reqwest::Response,
    parser: protocol::sse::SseParser,
}

impl SseReader {
    pub fn new(response: reqwest::Response) -> Self {
        Self {
            response,
            parser: protocol::sse::SseParser::new(),
        }
    }

    /// The frames completed by the next chunk and the instant the chunk arrived; `None` at the
    /// end of the stream.
    pub async fn next(&mut self) -> anyhow::Result<Option<(Instant, Vec<Frame>)>> {
        let Some(chunk) = self.response.chunk().await? else {
            return Ok(None);
        };
        let at = Instant::now();
        Ok(Some((at, frames(self.parser.push(&chunk)?))))
    }
}

/// What the benchmarks keep of parsed frames.
fn frames(parsed: Vec<protocol::sse::SseFrame>) -> Vec<Frame> {
    parsed
        .into_iter()
        .filter_map(|frame| match frame {
            protocol::sse::SseFrame::Comment => Some(Frame::Comment),
            protocol::sse::SseFrame::Event(event) => Some(Frame::Event {
                // A run stream's ids are its seqs, a thread stream's `<taskId>:<seq>`.
                id: event.id?.rsplit(':').next()?.parse().ok()?,
                // Checked without building it: a measuring client's work delays its next read.
                json: event.data.starts_with('{')
                    && serde_json::from_str::<&serde_json::value::RawValue>(&event.data).is_ok(),
            }),
        })
        .collect()
}

/// Signed microseconds from `from` to `to`.
pub fn micros(from: Instant, to: Instant) -> i64 {
    if to >= from {
        i64::try_from((to - from).as_micros()).unwrap_or(i64::MAX)
    } else {
        -i64::try_from((from - to).as_micros()).unwrap_or(i64::MAX)
    }
}

/// Percentiles (nearest rank) of signed microsecond samples, in milliseconds.
pub fn summary(mut values: Vec<i64>) -> Value {
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

/// Settings of one latency measurement.
pub struct LatencySettings {
    /// Runs streaming at the same time, one SSE client each.
    pub runs: usize,
    /// Events per run (at least 4).
    pub events: u64,
    /// Events per second, all runs together.
    pub rate: f64,
    /// The first `warmup` events of every run are not counted.
    pub warmup: u64,
    /// Upper bound of the whole measurement.
    pub max_time: Duration,
}

/// Creates `runs` runs, opens one SSE client per run and a core NATS subscriber on the events'
/// subjects (the baseline), then publishes every run's events as the worker does, paced to
/// `rate` in total, and returns the latencies as JSON.
pub async fn measure_latency(
    bench: &Bench,
    settings: &LatencySettings,
    tag: &str,
) -> anyhow::Result<Value> {
    let started = Instant::now();
    let deadline = started + settings.max_time;
    let total = settings.events.max(4);

    // Baseline: a core NATS subscription on its own connection, like the runs service's hub.
    let baseline_client = async_nats::connect(&bench.nats_url).await?;
    let mut subscription = baseline_client
        .subscribe(bench.names.run_events_subjects())
        .await?;
    baseline_client.flush().await?;
    let stop_baseline = CancellationToken::new();
    let stop = stop_baseline.clone();
    let baseline = tokio::spawn(async move {
        let mut seen: HashMap<(Uuid, u64), Instant> = HashMap::new();
        loop {
            tokio::select! {
                message = subscription.next() => {
                    let Some(message) = message else { break };
                    let at = Instant::now();
                    if let Ok(RunEventMessage::V1(event)) =
                        serde_json::from_slice::<RunEventMessage>(&message.payload)
                    {
                        seen.entry((event.task_id, event.seq)).or_insert(at);
                    }
                }
                () = stop.cancelled() => break,
            }
        }
        seen
    });

    let nonce = Uuid::new_v4().simple().to_string();
    let mut runs = Vec::with_capacity(settings.runs);
    for i in 0..settings.runs {
        runs.push(
            bench
                .create_run(format!("{tag}-{}-{i}", &nonce[..8]))
                .await?,
        );
    }

    // One SSE client per run; each records the arrival of every event id.
    let opened = Instant::now();
    let responses =
        futures::future::try_join_all(runs.iter().map(|run| bench.open_events(run))).await?;
    let open_ms = opened.elapsed().as_secs_f64() * 1000.0;
    let mut readers = Vec::with_capacity(runs.len());
    for response in responses {
        readers.push(tokio::spawn(read_events(
            SseReader::new(response),
            total,
            deadline + Duration::from_secs(10),
        )));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The worker: one task per run, every event acknowledged before the next, staggered so the
    // total rate is steady.
    let period = Duration::from_secs_f64(settings.runs as f64 / settings.rate.max(0.001));
    let begin = tokio::time::Instant::now() + Duration::from_millis(50);
    let mut publishers = Vec::with_capacity(runs.len());
    for (k, run) in runs.iter().enumerate() {
        let offset = period.mul_f64(k as f64 / settings.runs as f64);
        let run = run.clone();
        let js = bench.js.clone();
        let names = bench.names.clone();
        publishers.push(tokio::spawn(async move {
            let worker = Worker { js, names };
            worker
                .publish_run(&run, total, begin + offset, period, deadline)
                .await
        }));
    }
    let mut sent = Vec::with_capacity(runs.len());
    let mut publish_errors = 0_u64;
    let mut first_error = None;
    for publisher in publishers {
        match publisher.await? {
            Ok(times) => sent.push(times),
            Err((times, err)) => {
                publish_errors += 1;
                first_error.get_or_insert_with(|| format!("{err:#}"));
                sent.push(times);
            }
        }
    }
    let publish_seconds = begin.elapsed().as_secs_f64();
    let mut received = Vec::with_capacity(runs.len());
    for reader in readers {
        received.push(reader.await?);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop_baseline.cancel();
    let baseline = baseline.await?;

    let mut sse_after_send = Vec::new();
    let mut sse_after_ack = Vec::new();
    let mut nats_after_send = Vec::new();
    let mut nats_after_ack = Vec::new();
    let mut added = Vec::new();
    let mut ack = Vec::new();
    let mut missing_sse = 0_u64;
    let mut missing_nats = 0_u64;
    let mut published = 0_u64;
    let mut order_errors = 0_u64;
    let mut bad_data = 0_u64;
    for ((run, times), got) in runs.iter().zip(&sent).zip(&received) {
        order_errors += got.order_errors;
        bad_data += got.bad_data;
        for (i, &(send, acked)) in times.iter().enumerate() {
            let seq = i as u64 + 1;
            published += 1;
            let sse = got.at.get(i).copied().flatten();
            let nats = baseline.get(&(run.task_id, seq)).copied();
            missing_sse += u64::from(sse.is_none());
            missing_nats += u64::from(nats.is_none());
            if seq <= settings.warmup {
                continue;
            }
            ack.push(micros(send, acked));
            if let Some(sse) = sse {
                sse_after_send.push(micros(send, sse));
                sse_after_ack.push(micros(acked, sse));
            }
            if let Some(nats) = nats {
                nats_after_send.push(micros(send, nats));
                nats_after_ack.push(micros(acked, nats));
            }
            if let (Some(sse), Some(nats)) = (sse, nats) {
                added.push(micros(nats, sse));
            }
        }
    }
    Ok(json!({
        "runs": settings.runs,
        "events_per_run": total,
        "rate_goal_per_s": settings.rate,
        "published": published,
        "publish_seconds": publish_seconds,
        "rate_per_s": published as f64 / publish_seconds.max(1e-9),
        "warmup_events_per_run": settings.warmup,
        "publish_errors": publish_errors,
        "first_error": first_error,
        "missing_sse": missing_sse,
        "missing_nats": missing_nats,
        "order_errors": order_errors,
        "bad_data": bad_data,
        "open_all_streams_ms": open_ms,
        "publish_to_ack": summary(ack),
        "sse_after_publish": summary(sse_after_send),
        "sse_after_ack": summary(sse_after_ack),
        "nats_after_publish": summary(nats_after_send),
        "nats_after_ack": summary(nats_after_ack),
        "sse_minus_nats": summary(added),
    }))
}

/// What one SSE client saw.
pub struct Received {
    /// Arrival of event `seq` at index `seq - 1`.
    pub at: Vec<Option<Instant>>,
    /// Events that did not come as seq 1, 2, 3, ... (duplicates, gaps, reordering).
    pub order_errors: u64,
    /// Events whose data was not a JSON object.
    pub bad_data: u64,
}

async fn read_events(mut reader: SseReader, total: u64, deadline: Instant) -> Received {
    let mut got = Received {
        at: vec![None; usize::try_from(total).unwrap_or(0)],
        order_errors: 0,
        bad_data: 0,
    };
    let mut last = 0_u64;
    let until = tokio::time::Instant::from_std(deadline);
    while last < total {
        let next = tokio::time::timeout_at(until, reader.next()).await;
        let Ok(Ok(Some((at, frames)))) = next else {
            break;
        };
        for frame in frames {
            if let Frame::Event { id, json } = frame {
                if id != last + 1 {
                    got.order_errors += 1;
                }
                last = last.max(id);
                got.bad_data += u64::from(!json);
                if let Some(slot) = usize::try_from(id)
                    .ok()
                    .and_then(|i| i.checked_sub(1))
                    .and_then(|i| got.at.get_mut(i))
                {
                    slot.get_or_insert(at);
                }
            }
        }
    }
    got
}

/// Publishes like the worker's `EventSink`.
struct Worker {
    js: jetstream::Context,
    names: Names,
}

type Times = Vec<(Instant, Instant)>;

impl Worker {
    /// Publishes events 1..=total of `run`, one per `period` from `start`; returns when each
    /// publish started and when its ack came back.
    async fn publish_run(
        &self,
        run: &Run,
        total: u64,
        start: tokio::time::Instant,
        period: Duration,
        deadline: Instant,
    ) -> Result<Times, (Times, anyhow::Error)> {
        let mut interval = tokio::time::interval_at(start, period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let subject = self.names.run_event_subject(run.task_id);
        let mut times = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
        for seq in 1..=total {
            interval.tick().await;
            if Instant::now() >= deadline {
                return Err((times, anyhow::anyhow!("time limit reached at seq {seq}")));
            }
            let payload = match run.event_payload(seq, run.event(seq, total)) {
                Ok(payload) => payload,
                Err(err) => return Err((times, err)),
            };
            let headers = platform::nats::publish_headers(&format!("{}:{seq}", run.task_id));
            let sent = Instant::now();
            let acked = async {
                self.js
                    .publish_with_headers(subject.clone(), headers, payload.into())
                    .await?
                    .await?;
                anyhow::Ok(())
            }
            .await;
            if let Err(err) = acked {
                return Err((times, err));
            }
            times.push((sent, Instant::now()));
        }
        Ok(times)
    }
}
