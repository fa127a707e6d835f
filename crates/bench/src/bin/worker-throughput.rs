//! Worker fleet throughput (issue 10): publishes `--runs` accepted runs of the built-in agent's
//! `/slow` command (about 1 s each: 5 words, 200 ms apart) straight onto the RUNS stream of
//! `--prefix`, and counts their terminal events on the live event subjects until every run has
//! ended or `--max-seconds` passed. The workers (`scripts/bench-workers.sh` starts 1, 2, 3
//! replicas) do the rest. Prints one JSON line: runs ended, seconds from the first publish to
//! the last end, runs per second.
//!
//! Usage: `worker-throughput --prefix P [--nats-url URL] [--runs N] [--max-seconds T]`.
//!
//! `--flood N` measures fairness instead: owner `flooder` publishes N long runs (`/slow` of 25
//! words, about 5 s each), then owner `other` one short run; prints how long `other`'s run
//! waited from its publish to its `RUN_STARTED` (the workers' per-owner cap decides it).

use std::collections::HashSet;
use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt as _;
use platform::nats::{NatsConfig, StreamLimits};
use protocol::messaging::{Names, RunEventMessage};
use switchboard_bench::accepted_run;
use uuid::Uuid;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = switchboard_bench::args!()?;
    let prefix = args
        .get("prefix", "BENCH_NATS_PREFIX")
        .context("--prefix is required (the workers' SB_NATS_PREFIX)")?;
    let config = NatsConfig {
        url: args
            .get("nats-url", "SB_NATS_URL")
            .unwrap_or_else(|| "nats://127.0.0.1:4222".to_owned()),
        names: Names::new(&prefix)?,
        limits: StreamLimits::default(),
        credentials: platform::nats_auth::NatsCredentials::default(),
    };
    let runs: usize = args.parsed("runs", "BENCH_RUNS", 60)?;
    let max_time = Duration::from_secs(args.parsed("max-seconds", "BENCH_MAX_SECONDS", 120)?);
    let (client, js) = platform::nats::connect(&config, "bench-worker-throughput").await?;
    // The workers made the streams (with the script's limits). Listen before publishing, so no end is missed.
    let mut events = client.subscribe(config.names.run_events_subjects()).await?;
    if let Some(flood) = args.get("flood", "BENCH_FLOOD") {
        let flood: usize = flood.parse().context("--flood is a number of runs")?;
        let long = format!("/slow {}", vec!["w"; 25].join(" "));
        for i in 0..flood {
            publish(&js, &config.names, "flooder", &format!("flood-{i}"), &long).await?;
        }
        let published = Instant::now();
        let other = publish(&js, &config.names, "other", "other-0", "/slow a").await?;
        let deadline = tokio::time::Instant::now() + max_time;
        let waited = loop {
            let Ok(Some(message)) = tokio::time::timeout_at(deadline, events.next()).await else {
                anyhow::bail!("the other owner's run never started");
            };
            if let Ok(RunEventMessage::V1(event)) = serde_json::from_slice(&message.payload)
                && event.task_id == other
            {
                break published.elapsed();
            }
        };
        let line = serde_json::json!({
            "target": "worker-fairness",
            "flood": flood,
            "other_waited_seconds": (waited.as_secs_f64() * 1000.0).round() / 1000.0,
        });
        writeln!(std::io::stdout().lock(), "{line}")?;
        return Ok(());
    }
    let started = Instant::now();
    let mut tasks = HashSet::new();
    for i in 0..runs {
        let owner = format!("owner-{}", i % 8);
        tasks.insert(
            publish(
                &js,
                &config.names,
                &owner,
                &format!("bench-{i}"),
                "/slow a b c",
            )
            .await?,
        );
    }
    let mut ended = 0;
    let mut last_end = started.elapsed();
    let deadline = tokio::time::Instant::now() + max_time;
    while ended < runs {
        let Ok(Some(message)) = tokio::time::timeout_at(deadline, events.next()).await else {
            break;
        };
        if let Ok(RunEventMessage::V1(event)) = serde_json::from_slice(&message.payload)
            && event.event.is_terminal()
            && tasks.contains(&event.task_id)
        {
            ended += 1;
            last_end = started.elapsed();
        }
    }
    let seconds = last_end.as_secs_f64();
    let line = serde_json::json!({
        "target": "worker-throughput",
        "runs": runs,
        "ended": ended,
        "seconds": (seconds * 100.0).round() / 100.0,
        "runs_per_second": ((ended as f64 / seconds.max(0.001)) * 100.0).round() / 100.0,
    });
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    Ok(())
}

/// Publishes an accepted run of `owner` saying `text` on a thread of its own; its task id.
async fn publish(
    js: &async_nats::jetstream::Context,
    names: &Names,
    owner: &str,
    run_id: &str,
    text: &str,
) -> anyhow::Result<Uuid> {
    let task = accepted_run(owner, run_id, text)?;
    anyhow::ensure!(
        matches!(
            platform::nats::publish_run(js, names, &task).await?,
            platform::nats::Published::New(_)
        ),
        "a benchmark run was taken for a duplicate"
    );
    Ok(task.task_id)
}
