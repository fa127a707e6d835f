//! Fills a RUNS stream with accepted runs, to measure what retained runs cost the broker
//! (`scripts/bench-broker.sh`, BENCHMARKS.md section 9).
//!
//! Makes sure the streams of `--prefix` exist exactly as the services make them
//! (`platform::nats::ensure_streams`, with the limits of `SB_NATS_*`), optionally sets the RUNS
//! stream's duplicate window (`--dedup-window-secs`), then publishes `--count` accepted runs with
//! `--concurrency` in flight, awaiting every ack, in one of three layouts:
//!
//! - `queue` (what the runs service does since issue 12): every run on the one RUNS queue
//!   subject with its run key as message id, published by the service's own
//!   `platform::nats::publish_run`;
//! - `per-run` (what it did before): every run on its own subject
//!   (`<prefix>.runs.accepted.<owner>.<runId>.<threadId>`, each a 128-bit hex digest), message id
//!   the three digests, `Nats-Expected-Last-Subject-Sequence: 0`;
//! - `per-thread` (a candidate): `--runs-per-thread` consecutive runs share one subject per
//!   `(owner, thread)`, message id per run;
//! - `started`: not the accepted run but what a worker leaves in the broker for each run it
//!   starts, by the platform's own functions: the thread's lock taken (`RunBuckets::claim_thread`)
//!   and released (`release_thread`), the status record created then replaced by the ended one
//!   (`run_status`), and `--events-per-run` events (4) on the run's own events subject with the
//!   worker's message ids (`<taskId>:<seq>`). The RUN_EVENTS stream's duplicate window is set
//!   with `--dedup-window-secs` too.
//!
//! Every message is a real `RunTask::V1` of a run parsed as the service parses it; `--text-bytes`
//! pads the user text so messages have the size of real conversations (2,200 B by default, the
//! size the issue measured). Stops after `--count` or `--max-seconds`; prints one JSON line with
//! the count, the rate and the publish-to-ack latency. `--mode cleanup` deletes the prefix's
//! streams instead.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream;
use futures::StreamExt as _;
use platform::lifecycle::Claim;
use platform::nats::NatsConfig;
use protocol::agui::Event;
use protocol::messaging::{
    Names, RunEventMessage, RunEventV1, RunStatus, RunStatusRecord, RunTask, RunTaskV1, digest,
    status_key,
};
use serde_json::json;
use switchboard_bench::{Tally, accepted_run, print_line};
use uuid::Uuid;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    Queue,
    PerRun,
    PerThread,
    Started,
}

struct Settings {
    names: Names,
    layout: Layout,
    count: u64,
    first: u64,
    runs_per_thread: u64,
    concurrency: usize,
    max_time: Duration,
    text: String,
    events_per_run: u64,
    buckets: Option<platform::lifecycle::RunBuckets>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = switchboard_bench::args!()?;
    let prefix = args
        .get("prefix", "BENCH_NATS_PREFIX")
        .context("--prefix is required")?;
    let url = args
        .get("nats-url", "SB_NATS_URL")
        .unwrap_or_else(|| "nats://127.0.0.1:4222".to_owned());
    let layout = match args
        .get("layout", "BENCH_LAYOUT")
        .unwrap_or_else(|| "queue".to_owned())
        .as_str()
    {
        "queue" => Layout::Queue,
        "per-run" => Layout::PerRun,
        "per-thread" => Layout::PerThread,
        "started" => Layout::Started,
        other => anyhow::bail!("--layout {other:?}: use queue, per-run, per-thread or started"),
    };
    let text_bytes: usize = args.parsed("text-bytes", "BENCH_TEXT_BYTES", 2_000)?;
    let mut settings = Settings {
        names: Names::new(&prefix)?,
        layout,
        count: args.parsed("count", "BENCH_COUNT", 100_000_u64)?,
        first: args.parsed("first", "BENCH_FIRST", 0_u64)?,
        runs_per_thread: args
            .parsed("runs-per-thread", "BENCH_RUNS_PER_THREAD", 10_u64)?
            .max(1),
        concurrency: args
            .parsed("concurrency", "BENCH_CONCURRENCY", 64_usize)?
            .max(1),
        max_time: Duration::from_secs_f64(args.parsed(
            "max-seconds",
            "BENCH_MAX_SECONDS",
            1800.0,
        )?),
        text: "x".repeat(text_bytes),
        events_per_run: args.parsed("events-per-run", "BENCH_EVENTS_PER_RUN", 4_u64)?,
        buckets: None,
    };
    let config = NatsConfig {
        url,
        names: settings.names.clone(),
        limits: platform::config::Env::from_process().nats()?.limits,
        credentials: platform::nats_auth::NatsCredentials::default(),
    };
    let (_client, js) = platform::nats::connect(&config, "bench-broker-fill").await?;
    if args.get("mode", "BENCH_MODE").as_deref() == Some("cleanup") {
        return switchboard_bench::cleanup(&js, &settings.names).await;
    }
    platform::nats::ensure_streams(&js, &config).await?;
    if settings.layout == Layout::Started {
        settings.buckets = Some(platform::lifecycle::ensure_run_buckets(&js, &config).await?);
    }
    if let Some(secs) = args.get("dedup-window-secs", "BENCH_DEDUP_WINDOW_SECS") {
        let secs: f64 = secs.parse().context("--dedup-window-secs")?;
        let mut streams = vec![settings.names.runs_stream()];
        if settings.layout == Layout::Started {
            streams.push(settings.names.run_events_stream());
        }
        for name in streams {
            let mut stream = js.get_stream(name).await?;
            let mut config = stream.info().await?.config.clone();
            config.duplicate_window = Duration::from_secs_f64(secs);
            js.update_stream(config).await?;
        }
    }

    let started = Instant::now();
    let deadline = started + settings.max_time;
    let results = futures::stream::iter(settings.first..settings.first + settings.count)
        .take_while(|_| std::future::ready(Instant::now() < deadline))
        .map(|i| publish_one(&js, &settings, i))
        .buffer_unordered(settings.concurrency);
    let tally = Tally::drain(results, started).await?;
    let line = json!({
        "target": "broker-fill",
        "layout": args.get("layout", "BENCH_LAYOUT").unwrap_or_else(|| "queue".to_owned()),
        "prefix": prefix,
        "published": tally.done,
        "payload_bytes": tally.last.unwrap_or(0),
        "rate_per_s": tally.rate(),
    });
    let errors = tally.errors;
    print_line(line, tally.fields())?;
    anyhow::ensure!(errors == 0, "{errors} publishes failed");
    Ok(())
}

/// Publishes run number `i` in the settings' layout; returns the publish-to-ack latency and the
/// message size.
async fn publish_one(
    js: &jetstream::Context,
    settings: &Settings,
    i: u64,
) -> anyhow::Result<(Duration, usize)> {
    let owner = format!("owner-{}", i % 1000);
    let mut task = accepted_run(&owner, &format!("run-{i}"), "-")?;
    // Thread ids are fixed per i / runs_per_thread, so the per-thread layout shares them.
    let thread = Uuid::from_u64_pair(0x5b, i / settings.runs_per_thread).to_string();
    task.input.thread_id.clone_from(&thread);
    if let Some(protocol::run_input::Message::User(user)) = task.input.messages.first_mut() {
        user.content = protocol::run_input::UserContent::Text(settings.text.clone());
    }
    let run_id = task.input.run_id.clone();
    if settings.layout == Layout::Started {
        return start_one(js, settings, &task).await;
    }
    let size = serde_json::to_vec(&RunTask::V1(task.clone()))?.len();
    let sent = Instant::now();
    if settings.layout == Layout::Queue {
        let published = platform::nats::publish_run(js, &settings.names, &task).await?;
        anyhow::ensure!(
            matches!(published, platform::nats::Published::New(_)),
            "JetStream took a benchmark run for a duplicate"
        );
        return Ok((sent.elapsed(), size));
    }
    let short = |part: &str| digest(&[part])[..32].to_owned();
    let (subject, msg_id, expect_empty) = if settings.layout == Layout::PerRun {
        let ids = format!("{}.{}.{}", short(&owner), short(&run_id), short(&thread));
        let subject = format!("{}.runs.accepted.{ids}", settings.names.prefix());
        (subject, ids, true)
    } else {
        let token = digest(&[&owner, &thread])[..32].to_owned();
        let subject = format!("{}.runs.accepted.{token}", settings.names.prefix());
        (subject, digest(&[&owner, &thread, &run_id]), false)
    };
    let mut headers = platform::nats::publish_headers(&msg_id);
    if expect_empty {
        headers.insert("Nats-Expected-Last-Subject-Sequence", "0");
    }
    let payload = serde_json::to_vec(&RunTask::V1(task))?;
    let ack = js
        .publish_with_headers(subject, headers, payload.into())
        .await?
        .await?;
    anyhow::ensure!(
        !ack.duplicate,
        "JetStream took a benchmark run for a duplicate"
    );
    Ok((sent.elapsed(), size))
}

/// What a worker leaves in the broker for one run it starts and ends (the `started` layout):
/// returns the time it took and the bytes of its events.
async fn start_one(
    js: &jetstream::Context,
    settings: &Settings,
    task: &RunTaskV1,
) -> anyhow::Result<(Duration, usize)> {
    let buckets = settings
        .buckets
        .as_ref()
        .context("the started layout opens the run buckets first")?;
    let started = Instant::now();
    let claim = buckets.claim_thread(task, true).await?;
    anyhow::ensure!(
        claim == Claim::Claimed,
        "thread of run {} busy",
        task.input.run_id
    );
    let key = status_key(&task.owner, &task.input.run_id, task.task_id);
    let mut record = RunStatusRecord::running(task, chrono::Utc::now());
    buckets.run_status.create(&key, &record).await?;
    let subject = settings.names.run_event_subject(task.task_id);
    let mut bytes = 0;
    for seq in 1..=settings.events_per_run {
        let event = RunEventMessage::V1(RunEventV1 {
            task_id: task.task_id,
            owner: task.owner.clone(),
            thread_id: task.input.thread_id.clone(),
            run_id: task.input.run_id.clone(),
            seq,
            emitted_at: chrono::Utc::now(),
            event: Event::RunStarted {
                thread_id: task.input.thread_id.clone(),
                run_id: task.input.run_id.clone(),
                input: None,
            },
        });
        let payload = serde_json::to_vec(&event)?;
        bytes += payload.len();
        let headers = platform::nats::publish_headers(&format!("{}:{seq}", task.task_id));
        let ack = js
            .publish_with_headers(subject.clone(), headers, payload.into())
            .await?
            .await?;
        anyhow::ensure!(
            !ack.duplicate,
            "JetStream took a benchmark event for a duplicate"
        );
    }
    record.status = RunStatus::Completed;
    record.updated_at = chrono::Utc::now();
    buckets.run_status.put(&key, &record).await?;
    buckets
        .release_thread(&task.owner, &task.input.thread_id, task.task_id)
        .await?;
    Ok((started.elapsed(), bytes))
}
