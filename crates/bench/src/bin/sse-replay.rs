//! Replay of a long reply from the start (`GET /api/v1/agent/runs/{runId}/events` with no
//! `Last-Event-ID`), as the log holds it (`?compact=false`) and compacted (the default): bytes on
//! the wire, events, and the time from the request to the stream's end, in one process, the two
//! alternating `--repeat` times each.
//!
//! Plays the worker: creates one run by publishing its `RunTask` onto the RUNS stream, publishes
//! `--events` events (RUN_STARTED, TEXT_MESSAGE_START, TEXT_MESSAGE_CONTENT..., TEXT_MESSAGE_END,
//! RUN_FINISHED) exactly as the worker's `EventSink` does, waits until history has written the
//! run (a stream hands out a run's end only then), then replays. Fails unless both replays
//! reconstruct the same text. Prints one JSON line.
//!
//! Usage: `sse-replay --url http://127.0.0.1:PORT --token JWT --owner SUB --prefix P
//! [--nats-url URL] [--events N] [--repeat K]`.

use std::io::Write as _;
use std::time::Instant;

use serde_json::{Value, json};

#[expect(
    dead_code,
    reason = "shared with sse-latency and sse-idle, which use other parts"
)]
mod sse_common;

use sse_common::Bench;

/// What one replay received.
struct Replayed {
    bytes: usize,
    events: usize,
    millis: f64,
    text: String,
}

async fn replay(bench: &Bench, run_id: &str, query: &str) -> anyhow::Result<Replayed> {
    let started = Instant::now();
    let mut response = bench
        .http
        .get(format!(
            "{}/api/v1/agent/runs/{run_id}/events{query}",
            bench.base_url
        ))
        .bearer_auth(&bench.token)
        .send()
        .await?;
    anyhow::ensure!(
        response.status().is_success(),
        "replay answered {}",
        response.status()
    );
    let mut parser = protocol::sse::SseParser::new();
    let (mut bytes, mut events, mut text) = (0, 0, String::new());
    while let Some(chunk) = response.chunk().await? {
        bytes += chunk.len();
        for frame in parser.push(&chunk)? {
            if let protocol::sse::SseFrame::Event(event) = frame {
                events += 1;
                let data: Value = serde_json::from_str(&event.data)?;
                if data["type"] == "TEXT_MESSAGE_CONTENT" {
                    text.push_str(data["delta"].as_str().unwrap_or_default());
                }
            }
        }
    }
    Ok(Replayed {
        bytes,
        events,
        millis: started.elapsed().as_secs_f64() * 1000.0,
        text,
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = switchboard_bench::args!()?;
    let bench = Bench::connect(&args, "bench-sse-replay").await?;
    let total: u64 = args.parsed("events", "BENCH_EVENTS", 10_000_u64)?.max(5);
    let repeat: usize = args.parsed("repeat", "BENCH_REPEAT", 3_usize)?.max(1);
    let run = bench
        .create_run(format!("replay-{}", uuid::Uuid::new_v4()))
        .await?;
    for seq in 1..=total {
        bench
            .publish_event(&run, seq, run.event(seq, total))
            .await?;
    }
    // A stream hands out a run's end only once history has written the run: wait for that
    // first, so the replays measure the replay, not history catching up.
    let written = Instant::now();
    loop {
        let status: Value = bench
            .http
            .get(format!(
                "{}/api/v1/agent/runs/{}",
                bench.base_url, run.run_id
            ))
            .bearer_auth(&bench.token)
            .send()
            .await?
            .json()
            .await?;
        if status["status"] == "completed" {
            break;
        }
        anyhow::ensure!(
            written.elapsed() < std::time::Duration::from_secs(300),
            "history did not write the run within 300 s: {status}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let history_ms = written.elapsed().as_millis();
    let (mut raw, mut compact) = (Vec::new(), Vec::new());
    for _ in 0..repeat {
        raw.push(replay(&bench, &run.run_id, "?compact=false").await?);
        compact.push(replay(&bench, &run.run_id, "").await?);
    }
    let expected = &raw[0].text;
    anyhow::ensure!(
        raw.iter().chain(&compact).all(|r| &r.text == expected),
        "a replay reconstructed another text"
    );
    let summary = |replays: &[Replayed]| {
        json!({
            "bytes": replays[0].bytes,
            "events": replays[0].events,
            "ms": replays.iter().map(|r| (r.millis * 10.0).round() / 10.0).collect::<Vec<_>>(),
            "ms_median": (median(replays.iter().map(|r| r.millis).collect()) * 10.0).round() / 10.0,
        })
    };
    let result = json!({
        "target": "sse-replay",
        "events_published": total,
        "history_caught_up_ms": history_ms,
        "text_bytes": expected.len(),
        "raw": summary(&raw),
        "compact": summary(&compact),
        "bytes_ratio": (raw[0].bytes as f64 / compact[0].bytes as f64 * 10.0).round() / 10.0,
        "time_ratio": (median(raw.iter().map(|r| r.millis).collect())
            / median(compact.iter().map(|r| r.millis).collect()) * 100.0).round() / 100.0,
    });
    let mut out = std::io::stdout().lock();
    writeln!(out, "{result}")?;
    out.flush()?;
    Ok(())
}
