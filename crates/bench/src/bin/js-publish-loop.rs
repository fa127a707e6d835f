//! Baseline (b): the JetStream publishes of the runs service, without the service.
//!
//! Connects with `platform::nats::connect`, makes sure the streams of `--prefix` exist, then
//! publishes `--count` `RunTask::V1` messages (serialized with serde_json, the same subject,
//! headers and message-id scheme as the runs service) with `--concurrency` in flight, awaiting
//! every ack. Stops after `--count` messages or `--max-seconds`, whichever comes first, and
//! prints one JSON line: throughput and per-publish (publish + ack) latency percentiles.
//! With `--rate R` (per second) the publishes start on a schedule of slots `1/R` apart (still
//! at most `--concurrency` in flight; one that falls behind does not catch up in a burst), like
//! the paced wrk runs of `scripts/bench-runs.sh`; the latency is measured from the slot's send.
//!
//! The publish is the one the runs service makes for a new run, by the same function
//! (`platform::nats::publish_run`: the RUNS queue subject, the run key as message id, the trace
//! headers). Every run has a fresh threadId and runId, so none is a duplicate.
//!
//! Usage: `js-publish-loop --prefix P [--nats-url URL] [--count N] [--concurrency K]
//! [--max-seconds T] [--rate R] [--owner SUB] [--text TEXT]` (`SB_NATS_URL`, `BENCH_TEXT` as
//! fallbacks).
//!
//! `js-publish-loop --prefix P --mode register-agent` instead registers the worker's built-in
//! echo agent as the default agent of the prefix, as a worker does at start (so the runs service
//! under test chooses an agent and checks every run's input against its schema, as it does in a
//! deployment), and prints its name. With `--keep-registered-secs N` it then registers the card
//! again every 15 s for N seconds, as a running worker does (a card not registered again leaves
//! the catalog after a minute).
//!
//! `js-publish-loop --prefix P --mode cleanup` instead deletes every stream of the prefix (the
//! RUNS and RUN_EVENTS streams and the KV buckets, which are streams too: what a benchmark left
//! behind on the shared NATS server) and prints what it deleted.

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream;
use futures::StreamExt as _;
use platform::nats::NatsConfig;
use protocol::messaging::{Names, RunTask};
use serde_json::json;
use switchboard_bench::{DEFAULT_TEXT, Tally, accepted_run, print_line};
use uuid::Uuid;

struct Settings {
    names: Names,
    count: u64,
    concurrency: usize,
    max_time: Duration,
    /// Publishes started per second; `None`: as fast as the acks come back.
    rate: Option<f64>,
    owner: String,
    text: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = switchboard_bench::args!()?;
    let prefix = args
        .get("prefix", "BENCH_NATS_PREFIX")
        .context("--prefix is required (the NATS prefix whose RUNS stream to publish to)")?;
    let url = args
        .get("nats-url", "SB_NATS_URL")
        .unwrap_or_else(|| "nats://127.0.0.1:4222".to_owned());
    let settings = Settings {
        names: Names::new(&prefix)?,
        count: args.parsed("count", "BENCH_COUNT", 10_000_u64)?,
        concurrency: args
            .parsed("concurrency", "BENCH_CONCURRENCY", 16_usize)?
            .max(1),
        max_time: Duration::from_secs_f64(args.parsed("max-seconds", "BENCH_MAX_SECONDS", 60.0)?),
        rate: Some(args.parsed("rate", "BENCH_RATE", 0.0_f64)?).filter(|r| *r > 0.0),
        owner: args
            .get("owner", "BENCH_OWNER")
            .unwrap_or_else(|| "bench".to_owned()),
        text: args
            .get("text", "BENCH_TEXT")
            .unwrap_or_else(|| DEFAULT_TEXT.to_owned()),
    };
    let config = NatsConfig {
        url,
        names: settings.names.clone(),
        // The stream limits the runs service under test was given (`SB_NATS_*`).
        limits: platform::config::Env::from_process().nats()?.limits,
        credentials: platform::nats_auth::NatsCredentials::default(),
    };
    let (_client, js) = platform::nats::connect(&config, "bench-js-publish-loop").await?;
    match args
        .get("mode", "BENCH_MODE")
        .unwrap_or_else(|| "publish".to_owned())
        .as_str()
    {
        "publish" => {}
        "cleanup" => return switchboard_bench::cleanup(&js, &settings.names).await,
        "register-agent" => {
            let keep = args.parsed(
                "keep-registered-secs",
                "BENCH_KEEP_REGISTERED_SECS",
                0.0_f64,
            )?;
            return register_agent(&js, &config, Duration::from_secs_f64(keep.max(0.0))).await;
        }
        other => anyhow::bail!("--mode {other:?}: use publish, register-agent or cleanup"),
    }
    platform::nats::ensure_streams(&js, &config).await?;

    let tally = run(&js, &settings).await?;
    let line = json!({
        "target": "js-publish-loop",
        "prefix": prefix,
        "count": tally.done,
        "concurrency": settings.concurrency,
        "goal_rate_per_s": settings.rate,
        "payload_bytes": tally.last.unwrap_or(0),
        "throughput_per_s": tally.rate(),
    });
    print_line(line, tally.fields())?;
    if tally.done == 0 {
        anyhow::bail!("no message was published and acknowledged");
    }
    Ok(())
}

/// Registers the worker's echo agent as the default, with the worker's own code, and again
/// every [`platform::lifecycle::AGENT_REFRESH`] for `keep`.
async fn register_agent(
    js: &jetstream::Context,
    config: &NatsConfig,
    keep: Duration,
) -> anyhow::Result<()> {
    let buckets = platform::lifecycle::ensure_run_buckets(js, config).await?;
    let agents = worker::registry::AgentSet::new(vec![Arc::new(worker::agent::EchoAgent)], "echo")?;
    agents.register(&buckets.agents).await?;
    let line =
        json!({"target": "register-agent", "prefix": config.names.prefix(), "agent": "echo"});
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    drop(out);
    let until = Instant::now() + keep;
    while Instant::now() + platform::lifecycle::AGENT_REFRESH < until {
        tokio::time::sleep(platform::lifecycle::AGENT_REFRESH).await;
        agents.register(&buckets.agents).await?;
    }
    Ok(())
}

/// Publishes the settings' runs; each result is a publish-to-ack latency and the message size.
async fn run(js: &jetstream::Context, settings: &Settings) -> anyhow::Result<Tally<usize>> {
    // A random nonce keeps run ids unique across invocations on the same prefix.
    let nonce = Uuid::new_v4().simple().to_string();
    let started = Instant::now();
    let deadline = started + settings.max_time;
    // As in the paced wrk runs: a publish that may start takes the next free send slot, at
    // the earliest now (the closure runs one call at a time, so a Cell is enough).
    let interval = settings
        .rate
        .map(|rate| Duration::from_secs_f64(1.0 / rate));
    let next_slot = std::cell::Cell::new(started);
    let results = futures::stream::iter(0..settings.count)
        .take_while(|_| std::future::ready(Instant::now() < deadline))
        .map(|i| {
            let slot = interval.map(|interval| {
                let slot = next_slot.get().max(Instant::now());
                next_slot.set(slot + interval);
                slot
            });
            let run_id = format!("bench-{}-{i}", &nonce[..12]);
            async move {
                if let Some(slot) = slot {
                    // Tokio's timer rounds a sleep up to its 1 ms tick: aim half a tick early so
                    // that sends are on their slots on average, not late by half a tick.
                    let aim = slot.checked_sub(Duration::from_micros(500)).unwrap_or(slot);
                    tokio::time::sleep_until(aim.into()).await;
                }
                publish_one(js, settings, run_id).await
            }
        })
        .buffer_unordered(settings.concurrency);
    Tally::drain(results, started).await
}

/// Builds one run exactly as a client would send it, parses it as the runs service does and
/// publishes its `RunTask` as the runs service does; returns the publish-to-ack latency and the
/// message size.
async fn publish_one(
    js: &jetstream::Context,
    settings: &Settings,
    run_id: String,
) -> anyhow::Result<(Duration, usize)> {
    let task = accepted_run(&settings.owner, &run_id, &settings.text)?;
    let bytes = serde_json::to_vec(&RunTask::V1(task.clone()))?.len();
    let sent = Instant::now();
    let published = platform::nats::publish_run(js, &settings.names, &task).await?;
    anyhow::ensure!(
        matches!(published, platform::nats::Published::New(_)),
        "JetStream took a benchmark run for a duplicate"
    );
    Ok((sent.elapsed(), bytes))
}
