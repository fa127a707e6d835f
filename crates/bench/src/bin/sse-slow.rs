//! Does a client that reads nothing slow the others down (issue 29)? Two passes over the same
//! runs instance, each a fresh run of `--events` events (`--delta-bytes` of text each, published
//! at `--rate` per second as the worker would) followed by `--streams` fast SSE clients:
//!
//! - `alone`: the fast clients only;
//! - `with_slow`: the same, plus `--slow` clients that send their request and then never read
//!   (a receive buffer of 4 KiB, so their sockets fill after a few events).
//!
//! For each pass: the fast clients' latency from publish start to receipt, per content event
//! (p50/p99/max over every client and event), and the runs service's
//! `switchboard_stream_live_events_skipped_total` (live events a reader fell behind its run's
//! channel by) before the pass and after its slow clients have read (a lapped reader counts what
//! it skipped when it runs again). After the second pass the slow clients start reading: how
//! many events each then gets, and whether the stream ends (it must: a reader that falls behind
//! catches up from the run's log).
//!
//! Prints one JSON line. Every phase is bounded in time.
//!
//! Usage: `sse-slow --url URL --token JWT --owner SUB --prefix P [--nats-url URL]
//! [--streams N] [--slow N] [--events N] [--rate R] [--delta-bytes B]`.

use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt as _;
use protocol::agui::Event;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

#[expect(
    dead_code,
    reason = "shared with sse-latency and sse-idle, which use other parts"
)]
mod sse_common;

use sse_common::{Bench, Frame, Run, SseReader, summary};

struct Settings {
    streams: usize,
    slow: usize,
    events: u64,
    rate: f64,
    delta_bytes: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = switchboard_bench::args!()?;
    let bench = Bench::connect(&args, "bench-sse-slow").await?;
    let settings = Settings {
        streams: args.parsed("streams", "BENCH_STREAMS", 1_000_usize)?,
        slow: args.parsed("slow", "BENCH_SLOW", 1_usize)?,
        events: args.parsed("events", "BENCH_EVENTS", 400_u64)?.max(5),
        rate: args.parsed("rate", "BENCH_RATE", 40.0_f64)?.max(1.0),
        delta_bytes: args.parsed("delta-bytes", "BENCH_DELTA_BYTES", 512_usize)?,
    };
    let alone = pass(&bench, &settings, 0).await?;
    let with_slow = pass(&bench, &settings, settings.slow).await?;
    let ratio = |key: &str| {
        let a = alone["fast"]["latency"][key].as_f64().unwrap_or(0.0);
        let b = with_slow["fast"]["latency"][key].as_f64().unwrap_or(0.0);
        (a > 0.0).then(|| (b / a * 100.0).round() / 100.0)
    };
    let result = json!({
        "target": "sse-slow",
        "streams": settings.streams,
        "slow": settings.slow,
        "events": settings.events,
        "rate": settings.rate,
        "delta_bytes": settings.delta_bytes,
        "alone": alone,
        "with_slow": with_slow,
        "p50_with_slow_over_alone": ratio("p50_ms"),
        "p99_with_slow_over_alone": ratio("p99_ms"),
    });
    let mut out = std::io::stdout().lock();
    writeln!(out, "{result}")?;
    out.flush()?;
    Ok(())
}

/// One pass: a fresh run, `settings.streams` fast clients and `slow` slow ones.
async fn pass(bench: &Bench, settings: &Settings, slow: usize) -> anyhow::Result<Value> {
    let run = bench
        .create_run(format!("slow-{}", uuid::Uuid::new_v4()))
        .await?;
    let skipped_before = skipped(bench).await?;
    // Event 1 first, so every client opens a run that has begun.
    let started = Instant::now();
    bench
        .publish_event(&run, 1, run.event(1, settings.events))
        .await?;
    let mut slow_sockets = Vec::with_capacity(slow);
    for _ in 0..slow {
        slow_sockets.push(open_slow(bench, &run).await?);
    }
    let mut fast = Vec::with_capacity(settings.streams);
    {
        let mut opens = futures::stream::iter(0..settings.streams)
            .map(|_| bench.open_events(&run))
            .buffer_unordered(64);
        while let Some(response) = opens.next().await {
            fast.push(tokio::spawn(read_all(SseReader::new(response?))));
        }
    }
    // Publish the rest at the rate, noting when each publish began.
    let interval = Duration::from_secs_f64(1.0 / settings.rate);
    let mut published = vec![started; usize::try_from(settings.events + 1).unwrap_or(0)];
    let mut next = Instant::now();
    for seq in 2..=settings.events {
        tokio::time::sleep_until(next.into()).await;
        next += interval;
        let event = match run.event(seq, settings.events) {
            Event::TextMessageContent { message_id, .. } => Event::TextMessageContent {
                message_id,
                delta: format!("{seq:>8} ").repeat(settings.delta_bytes / 9 + 1),
            },
            other => other,
        };
        published[seq as usize] = Instant::now();
        bench.publish_event(&run, seq, event).await?;
    }
    let publish_seconds = started.elapsed().as_secs_f64();
    // The fast clients end with the run (its end waits for history to store it).
    let mut latencies = Vec::new();
    let (mut ended, mut incomplete) = (0_u64, 0_u64);
    for reader in fast {
        let arrivals = tokio::time::timeout(Duration::from_secs(120), reader)
            .await
            .context("a fast client did not end within 120 s")???;
        ended += u64::from(arrivals.ended);
        incomplete += u64::from(arrivals.ids.len() as u64 != settings.events);
        for (id, at) in arrivals.ids {
            // Content events only: not the first (before the clients opened), not the last two
            // (the end waits for history).
            if id >= 3 && id + 1 < settings.events {
                let latency = at.saturating_duration_since(published[id as usize]);
                latencies.push(i64::try_from(latency.as_micros()).unwrap_or(i64::MAX));
            }
        }
    }
    // The slow clients read now: everything, to the end.
    let mut slow_results = Vec::new();
    for socket in slow_sockets {
        slow_results.push(drain_slow(socket, settings.events).await);
    }
    let skipped_after = skipped(bench).await?;
    Ok(json!({
        "publish_seconds": (publish_seconds * 10.0).round() / 10.0,
        "fast": {
            "clients": settings.streams,
            "ended": ended,
            "incomplete": incomplete,
            "latency": summary(latencies),
        },
        "skipped_live_events": skipped_after - skipped_before,
        "slow": slow_results,
    }))
}

/// What a fast client saw.
struct Arrivals {
    ids: Vec<(u64, Instant)>,
    ended: bool,
}

async fn read_all(mut reader: SseReader) -> anyhow::Result<Arrivals> {
    let mut arrivals = Arrivals {
        ids: Vec::new(),
        ended: false,
    };
    while let Some((at, frames)) = reader.next().await? {
        for frame in frames {
            if let Frame::Event { id, .. } = frame {
                arrivals.ids.push((id, at));
            }
        }
    }
    arrivals.ended = true;
    Ok(arrivals)
}

/// A client that asks for the run's events over a socket with a 4 KiB receive buffer, reads the
/// response head and then nothing.
async fn open_slow(bench: &Bench, run: &Run) -> anyhow::Result<tokio::net::TcpStream> {
    let (address, request) = sse_common::raw::events_request(bench, run).await?;
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_recv_buffer_size(4096)?;
    let mut stream = socket.connect(address).await?;
    stream.write_all(request.as_bytes()).await?;
    // The head, and no more than it (a byte at a time: the body stays unread in the socket).
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let byte = tokio::time::timeout(Duration::from_secs(30), stream.read_u8())
            .await
            .context("no response head within 30 s")??;
        head.push(byte);
        anyhow::ensure!(head.len() < 8192, "response head too long");
    }
    let head = String::from_utf8_lossy(&head);
    anyhow::ensure!(head.starts_with("HTTP/1.1 200"), "slow client: {head}");
    Ok(stream)
}

/// Reads a slow client's stream to its end (chunked SSE, counted by its `id:` lines).
async fn drain_slow(stream: tokio::net::TcpStream, events: u64) -> Value {
    let started = Instant::now();
    let mut body = Vec::new();
    let mut stream = stream;
    let read = tokio::time::timeout(Duration::from_secs(60), async {
        let mut buffer = vec![0_u8; 64 * 1024];
        loop {
            let n = stream.read(&mut buffer).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(());
            }
            body.extend_from_slice(&buffer[..n]);
            // The chunked body's last chunk.
            if body.ends_with(b"\r\n0\r\n\r\n") {
                return Ok(());
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&body);
    let ids: Vec<u64> = text
        .lines()
        .filter_map(|line| line.strip_prefix("id:"))
        .filter_map(|id| id.trim().parse().ok())
        .collect();
    let in_order = ids.windows(2).all(|pair| pair[0] < pair[1]);
    json!({
        "events": ids.len(),
        "last_id": ids.last(),
        "all": ids.last() == Some(&events),
        "in_order": in_order,
        "ended": matches!(read, Ok(Ok(()))),
        "bytes": body.len(),
        "drain_ms": started.elapsed().as_millis(),
    })
}

/// The runs service's `switchboard_stream_live_events_skipped_total`.
async fn skipped(bench: &Bench) -> anyhow::Result<i64> {
    let text = bench
        .http
        .get(format!("{}/metrics", bench.base_url))
        .send()
        .await?
        .text()
        .await?;
    Ok(text
        .lines()
        .find_map(|line| line.strip_prefix("switchboard_stream_live_events_skipped_total "))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map_or(0, |value| value as i64))
}
