//! Latency from the worker publishing a run event to an SSE client of the runs service
//! receiving it (`GET /api/v1/agent/runs/{runId}/events`).
//!
//! Plays the worker: creates `--runs` runs by publishing their `RunTask` onto the RUNS stream
//! (as the runs service does; no worker consumes them), opens one SSE client per run, then
//! publishes `--events` events per run (RUN_STARTED, TEXT_MESSAGE_START, TEXT_MESSAGE_CONTENT...,
//! TEXT_MESSAGE_END, RUN_FINISHED) exactly as the worker's `EventSink` does: JetStream publish
//! with msg-id `<task>:<seq>`, each ack awaited before the run's next event, paced so that all
//! runs together publish `--rate` events per second. A core NATS subscriber on the events'
//! subjects, on its own connection in the same process, is the baseline: what NATS alone costs.
//!
//! Prints one JSON line: percentiles of SSE arrival − publish start, SSE arrival − ack, the
//! same two for the baseline subscriber, and SSE − baseline per event (what the service adds).
//! The first `--warmup` events of every run are not counted. Bounded by `--max-seconds`.
//!
//! Usage: `sse-latency --url http://127.0.0.1:PORT --token JWT --owner SUB --prefix P
//! [--nats-url URL] [--runs K] [--events N] [--rate R] [--warmup W] [--max-seconds T]
//! [--label NAME]`.

use std::io::Write as _;
use std::time::Duration;

use serde_json::json;

#[expect(dead_code, reason = "shared with sse-idle, which uses other parts")]
mod sse_common;

use sse_common::{Bench, LatencySettings, measure_latency};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = switchboard_bench::args!()?;
    let bench = Bench::connect(&args, "bench-sse-latency").await?;
    let settings = LatencySettings {
        runs: args.parsed("runs", "BENCH_RUNS", 1_usize)?.max(1),
        events: args.parsed("events", "BENCH_EVENTS", 200_u64)?,
        rate: args.parsed("rate", "BENCH_RATE", 200.0_f64)?,
        warmup: args.parsed("warmup", "BENCH_WARMUP", 10_u64)?,
        max_time: Duration::from_secs_f64(args.parsed(
            "max-seconds",
            "BENCH_MAX_SECONDS",
            120.0,
        )?),
    };
    let label = args
        .get("label", "BENCH_LABEL")
        .unwrap_or_else(|| format!("{}x{}", settings.runs, settings.events));
    let mut result = measure_latency(&bench, &settings, "lat").await?;
    if let Some(object) = result.as_object_mut() {
        object.insert("target".to_owned(), json!("sse-latency"));
        object.insert("label".to_owned(), json!(label));
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{result}")?;
    out.flush()?;
    let missing = result["missing_sse"].as_u64().unwrap_or(u64::MAX);
    let errors = result["publish_errors"].as_u64().unwrap_or(u64::MAX);
    anyhow::ensure!(
        missing == 0 && errors == 0,
        "{missing} events never reached their SSE client, {errors} publishers failed"
    );
    Ok(())
}
