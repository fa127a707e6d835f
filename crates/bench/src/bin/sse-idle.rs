//! What idle event streams cost one runs instance: `--streams` SSE clients of
//! `GET /api/v1/agent/runs/{runId}/events` on one run that publishes nothing, held for
//! `--hold-seconds` (past a heartbeat and past the readers' 30 s log re-read).
//!
//! Samples the runs process (`--runs-pid`: VmRSS, VmHWM, threads, open fds, CPU seconds from
//! `/proc`), nats-server's CPU (`--nats-pid`), the messages the runs instance's NATS connection
//! exchanged (`--monitor-url`'s `/connz`, the connection found by the runs process's local port)
//! and the JetStream consumers of the prefix's streams: before, after opening, during the hold
//! and after the streams ended. While holding, a fresh run streams events to a fresh SSE client
//! (the same measurement as `sse-latency`, `--probe-events` events at `--probe-rate` per second)
//! and is compared with the same probe before the streams were opened. At the end two events on
//! the idle run reach every held stream (fan-out latency, from the publish to each stream's
//! receipt): a live one (`RUN_STARTED`, as every token of a reply is), once every stream has it
//! or `--fanout-wait-seconds` passed, then the terminal one, which the service hands out only
//! once history has written the run, and which ends the streams.
//!
//! The held streams are read straight from their sockets (`--client raw`, [`RawSse`]: one task
//! and one small buffer each), so that 10,000 of them cost the two shared cores less than the
//! service they measure; `--client http` reads them with `reqwest` as earlier runs did.
//!
//! Prints one JSON line. Every phase is bounded in time.
//!
//! Usage: `sse-idle --url URL --token JWT --owner SUB --prefix P --runs-pid PID [--nats-url URL]
//! [--nats-pid PID] [--monitor-url URL] [--streams N] [--open-concurrency C] [--hold-seconds T]
//! [--probe-events N] [--probe-rate R] [--fanout-wait-seconds T] [--client raw|http] [--runs N]
//! [--stream run|thread]`.
//! `--runs N` spreads the streams over N runs (10,000 streams of 10,000 runs: one each), and
//! publishes the two events on every run, each stream's latency counted from its run's publish.
//! `--stream thread` (with one run and `--client raw`) holds streams of the run's thread
//! instead, the run made the thread's active one first (as the runs service's acceptance does):
//! what every tab of a conversation follows. Against `sse-bare` (the axum-only baseline) or
//! `sse-floor`: `--probe-events 0 --fanout-wait-seconds 2`.

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::{StreamExt as _, TryStreamExt as _};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

mod sse_common;

use sse_common::raw::{RawSse, events_request, thread_request};
use sse_common::{Bench, Frame, LatencySettings, Run, SseReader, measure_latency, micros, summary};

struct Settings {
    streams: usize,
    open_concurrency: usize,
    hold: Duration,
    probe: LatencySettings,
    runs_pid: u32,
    nats_pid: Option<u32>,
    nats_port: u16,
    monitor_url: Option<String>,
    /// How long the held streams may take to receive each fanned-out event.
    fanout_wait: Duration,
    /// Held streams read from their sockets (`raw`) or with `reqwest` (`http`).
    raw: bool,
    /// Runs the streams are spread over (one each with `--runs` equal to `--streams`).
    runs: usize,
    /// The streams are of the run's thread (`--stream thread`: `GET
    /// /api/v1/agent/threads/{threadId}/events`), the run made the thread's active one first.
    thread: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = switchboard_bench::args!()?;
    let bench = Bench::connect(&args, "bench-sse-idle").await?;
    let probe_events = args.parsed("probe-events", "BENCH_PROBE_EVENTS", 600_u64)?;
    let probe_rate = args.parsed("probe-rate", "BENCH_PROBE_RATE", 20.0_f64)?;
    let nats_port = bench
        .nats_url
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .unwrap_or(4222);
    let settings = Settings {
        streams: args.parsed("streams", "BENCH_STREAMS", 10_000_usize)?,
        open_concurrency: args
            .parsed("open-concurrency", "BENCH_OPEN_CONCURRENCY", 64_usize)?
            .max(1),
        hold: Duration::from_secs_f64(args.parsed("hold-seconds", "BENCH_HOLD_SECONDS", 45.0)?),
        probe: LatencySettings {
            runs: 1,
            events: probe_events,
            rate: probe_rate,
            warmup: 5,
            max_time: Duration::from_secs_f64(probe_events as f64 / probe_rate.max(0.1) + 30.0),
        },
        runs_pid: args
            .parsed("runs-pid", "BENCH_RUNS_PID", 0_u32)
            .ok()
            .filter(|&p| p > 0)
            .context("--runs-pid is required (the runs process to sample)")?,
        nats_pid: args.parsed("nats-pid", "BENCH_NATS_PID", 0_u32)?.into(),
        nats_port,
        monitor_url: args.get("monitor-url", "BENCH_NATS_MONITOR_URL"),
        fanout_wait: Duration::from_secs_f64(args.parsed(
            "fanout-wait-seconds",
            "BENCH_FANOUT_WAIT_SECONDS",
            60.0,
        )?),
        runs: args.parsed("runs", "BENCH_RUNS", 1_usize)?.max(1),
        thread: match args.get("stream", "BENCH_STREAM").as_deref() {
            None | Some("run") => false,
            Some("thread") => true,
            Some(other) => anyhow::bail!("--stream is run or thread, not {other}"),
        },
        raw: match args.get("client", "BENCH_CLIENT").as_deref() {
            None | Some("raw") => true,
            Some("http") => false,
            Some(other) => anyhow::bail!("--client is raw or http, not {other}"),
        },
    };
    anyhow::ensure!(
        !settings.thread || (settings.raw && settings.runs == 1),
        "--stream thread goes with --client raw and one run"
    );
    let settings = Settings {
        nats_pid: settings.nats_pid.filter(|&p| p > 0),
        ..settings
    };
    let result = run(&bench, &settings).await?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{result}")?;
    out.flush()?;
    Ok(())
}

async fn run(bench: &Bench, settings: &Settings) -> anyhow::Result<Value> {
    let mut samples = Vec::new();
    let start = Instant::now();
    samples.push(sample(bench, settings, "start", start).await);

    let probe_before = probe(bench, settings, "probe-before").await?;
    samples.push(sample(bench, settings, "before", start).await);

    // ---------------------------------------------------------------- open the idle streams
    let idle_runs: Vec<Run> = futures::stream::iter(0..settings.runs)
        .map(|_| bench.create_run(format!("idle-{}", uuid::Uuid::new_v4())))
        .buffered(64)
        .try_collect()
        .await?;
    let requests = futures::stream::iter(&idle_runs)
        .then(|run| async move {
            if settings.thread {
                bench.lock_thread(run).await?;
                thread_request(bench, run).await
            } else {
                events_request(bench, run).await
            }
        })
        .try_collect::<Vec<_>>()
        .await?;
    if settings.runs > 1 {
        // History learns of each run from the RUNS stream; the runs service asks it before it
        // opens a run's stream. The last run created answering is the sign it has them all.
        let last = idle_runs.last().context("no runs")?;
        let known_by = Instant::now() + Duration::from_secs(180);
        while let Err(err) = bench.open_events(last).await {
            anyhow::ensure!(
                Instant::now() < known_by,
                "runs not known within 180 s: {err:#}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let cancel = CancellationToken::new();
    let opening = Instant::now();
    let open_deadline = opening + Duration::from_secs(180);
    let mut open_latency = Vec::with_capacity(settings.streams);
    let mut open_errors = 0_u64;
    let mut first_error = None;
    let mut holders = Vec::with_capacity(settings.streams);
    let live_seen = Arc::new(AtomicUsize::new(0));
    {
        let (runs, requests, raw) = (&idle_runs, &requests, settings.raw);
        let mut opens = futures::stream::iter(0..settings.streams)
            .take_while(|_| std::future::ready(Instant::now() < open_deadline))
            .map(|i| async move {
                let run_index = i % runs.len();
                let (run, (address, request)) = (&runs[run_index], &requests[run_index]);
                let began = Instant::now();
                let open = async {
                    if raw {
                        RawSse::open(*address, request).await.map(Reader::Raw)
                    } else {
                        bench
                            .open_events(run)
                            .await
                            .map(|r| Reader::Http(SseReader::new(r)))
                    }
                };
                let response = tokio::time::timeout(Duration::from_secs(30), open).await;
                (run_index, began.elapsed(), response)
            })
            .buffer_unordered(settings.open_concurrency);
        while let Some((run_index, took, response)) = opens.next().await {
            match response {
                Ok(Ok(reader)) => {
                    open_latency.push(i64::try_from(took.as_micros()).unwrap_or(i64::MAX));
                    let held = hold(reader, Arc::clone(&live_seen), cancel.clone());
                    holders.push((run_index, tokio::spawn(held)));
                }
                Ok(Err(err)) => {
                    open_errors += 1;
                    first_error.get_or_insert_with(|| format!("{err:#}"));
                }
                Err(_) => {
                    open_errors += 1;
                    first_error.get_or_insert_with(|| "no response head within 30 s".to_owned());
                }
            }
        }
    }
    let open_seconds = opening.elapsed().as_secs_f64();
    let opened = holders.len();
    let held_since = Instant::now();
    samples.push(sample(bench, settings, "opened", start).await);

    // ---------------------------------------------------------------- hold, probe meanwhile
    let stop_sampling = CancellationToken::new();
    let timeline = {
        let stop = stop_sampling.clone();
        let pid = settings.runs_pid;
        tokio::spawn(async move {
            let mut points = Vec::new();
            loop {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(2)) => {}
                    () = stop.cancelled() => break,
                }
                let stats = proc_stats(pid);
                points.push(json!({
                    "t_s": round(held_since.elapsed().as_secs_f64()),
                    "rss_kib": stats["rss_kib"],
                    "cpu_s": stats["cpu_s"],
                }));
            }
            points
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let probe_during = probe(bench, settings, "probe-during").await?;
    let rest = settings.hold.saturating_sub(held_since.elapsed());
    tokio::time::sleep(rest).await;
    let alive = holders.iter().filter(|(_, h)| !h.is_finished()).count();
    let held_seconds = held_since.elapsed().as_secs_f64();
    samples.push(sample(bench, settings, "held", start).await);
    stop_sampling.cancel();
    let timeline = timeline.await.unwrap_or_default();

    // ---------------------------------------------------------------- fan-out, then close
    // A live event on each run, once every stream has it (or the wait is over) the terminal one;
    // each stream's latency from its run's publish.
    let live_sent = Instant::now();
    let live_starts = publish_each(bench, &idle_runs, 1).await?;
    let live_acked = Instant::now();
    let live_deadline = live_sent + settings.fanout_wait;
    while live_seen.load(Ordering::Relaxed) < opened && Instant::now() < live_deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let sent = Instant::now();
    let starts = publish_each(bench, &idle_runs, 2).await?;
    let acked = Instant::now();
    let cancel_later = cancel.clone();
    let fanout_wait = settings.fanout_wait;
    tokio::spawn(async move {
        tokio::time::sleep(fanout_wait).await;
        cancel_later.cancel();
    });
    let mut fanout = Vec::with_capacity(opened);
    let mut fanout_live = Vec::with_capacity(opened);
    let mut heartbeats = Vec::with_capacity(opened);
    let mut ended_by_server = 0_u64;
    let mut read_errors = 0_u64;
    let mut last_arrival = sent;
    let mut last_live_arrival = live_sent;
    for (run_index, holder) in holders {
        let held = holder.await?;
        if let Some(at) = held.live_at {
            fanout_live.push(micros(live_starts[run_index], at));
            last_live_arrival = last_live_arrival.max(at);
        }
        if let Some(at) = held.end_at {
            fanout.push(micros(starts[run_index], at));
            last_arrival = last_arrival.max(at);
        }
        heartbeats.push(held.heartbeats);
        ended_by_server += u64::from(held.ended);
        read_errors += u64::from(held.error);
    }
    cancel.cancel();
    let fanout_received = fanout.len();
    let fanout_live_received = fanout_live.len();
    tokio::time::sleep(Duration::from_secs(5)).await;
    samples.push(sample(bench, settings, "closed", start).await);
    heartbeats.sort_unstable();
    let heartbeat_at = |q: f64| {
        heartbeats
            .get(((heartbeats.len() as f64 - 1.0) * q).round().max(0.0) as usize)
            .copied()
            .unwrap_or(0)
    };

    Ok(json!({
        "target": "sse-idle",
        "streams_goal": settings.streams,
        "streams_opened": opened,
        "open_errors": open_errors,
        "first_error": first_error,
        "open_seconds": open_seconds,
        "open_concurrency": settings.open_concurrency,
        "open_latency": summary(open_latency),
        "held_seconds": held_seconds,
        "alive_at_end_of_hold": alive,
        "heartbeats_per_stream": {
            "min": heartbeat_at(0.0), "p50": heartbeat_at(0.5), "max": heartbeat_at(1.0),
        },
        "read_errors": read_errors,
        "client": if settings.raw { "raw" } else { "http" },
        "runs": settings.runs,
        "thread": settings.thread,
        "fanout_live": {
            "received": fanout_live_received,
            "publish_to_ack_ms": micros(live_sent, live_acked) as f64 / 1000.0,
            "last_arrival_ms": micros(live_sent, last_live_arrival) as f64 / 1000.0,
            "latency": summary(fanout_live),
        },
        "fanout": {
            "received": fanout_received,
            "publish_to_ack_ms": micros(sent, acked) as f64 / 1000.0,
            "last_arrival_ms": micros(sent, last_arrival) as f64 / 1000.0,
            "latency": summary(fanout),
            "ended_by_server": ended_by_server,
        },
        "probe_before": probe_before,
        "probe_during": probe_during,
        "samples": samples,
        "timeline": timeline,
    }))
}

/// A fresh run's latency (`--probe-events 0`: none, e.g. against `sse-bare`).
async fn probe(bench: &Bench, settings: &Settings, tag: &str) -> anyhow::Result<Value> {
    if settings.probe.events == 0 {
        return Ok(json!({"skipped": true}));
    }
    measure_latency(bench, &settings.probe, tag).await
}

/// Publishes event `seq` of every run (`RUN_STARTED`, or `RUN_FINISHED` for 2), 256 at a time,
/// each awaiting its ack; returns when each publish began, by run.
async fn publish_each(bench: &Bench, runs: &[Run], seq: u64) -> anyhow::Result<Vec<Instant>> {
    let mut starts = vec![Instant::now(); runs.len()];
    let mut publishes = futures::stream::iter(runs.iter().enumerate())
        .map(|(i, run)| async move {
            let event = if seq == 1 {
                run.event(1, 3)
            } else {
                run.finished()
            };
            let began = Instant::now();
            bench
                .publish_event(run, seq, event)
                .await
                .map(|()| (i, began))
        })
        .buffer_unordered(256);
    while let Some(published) = publishes.next().await {
        let (i, began) = published?;
        starts[i] = began;
    }
    Ok(starts)
}

/// A held stream, read from its socket or with `reqwest`.
enum Reader {
    Raw(RawSse),
    Http(SseReader),
}

impl Reader {
    async fn next(&mut self) -> anyhow::Result<Option<(Instant, Vec<Frame>)>> {
        match self {
            Self::Raw(reader) => reader.next().await,
            Self::Http(reader) => reader.next().await,
        }
    }
}

/// What one held stream saw.
struct Held {
    heartbeats: u64,
    /// Arrival of the live event (id 1) and of the terminal one (id 2).
    live_at: Option<Instant>,
    end_at: Option<Instant>,
    /// The server ended the stream.
    ended: bool,
    error: bool,
}

async fn hold(mut reader: Reader, live_seen: Arc<AtomicUsize>, cancel: CancellationToken) -> Held {
    let mut held = Held {
        heartbeats: 0,
        live_at: None,
        end_at: None,
        ended: false,
        error: false,
    };
    loop {
        tokio::select! {
            next = reader.next() => match next {
                Ok(Some((at, frames))) => {
                    for frame in frames {
                        match frame {
                            Frame::Comment => held.heartbeats += 1,
                            Frame::Event { id: 1, .. } => {
                                if held.live_at.is_none() {
                                    held.live_at = Some(at);
                                    live_seen.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            Frame::Event { id: 2, .. } => {
                                held.end_at.get_or_insert(at);
                            }
                            // A thread stream's snapshot (its run's event 0).
                            Frame::Event { .. } => {}
                        }
                    }
                }
                Ok(None) => {
                    held.ended = true;
                    break;
                }
                Err(_) => {
                    held.error = true;
                    break;
                }
            },
            () = cancel.cancelled() => break,
        }
    }
    held
}

fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// One sample of everything the benchmark watches.
async fn sample(bench: &Bench, settings: &Settings, label: &str, start: Instant) -> Value {
    let mut value = json!({
        "label": label,
        "t_s": round(start.elapsed().as_secs_f64()),
        "runs": proc_stats(settings.runs_pid),
        "nats_server_cpu_s": settings.nats_pid.map(|pid| proc_stats(pid)["cpu_s"].clone()),
        "consumers": consumers(bench).await.unwrap_or_else(|err| json!(format!("{err:#}"))),
    });
    if let Some(url) = &settings.monitor_url {
        value["runs_nats_connection"] = runs_connection(bench, url, settings)
            .await
            .unwrap_or_else(|err| json!(format!("{err:#}")));
    }
    value
}

/// VmRSS, VmHWM (KiB), threads, open fds and CPU seconds of a process.
fn proc_stats(pid: u32) -> Value {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| dir.count())
        .ok();
    json!({
        "rss_kib": field("VmRSS:"),
        "hwm_kib": field("VmHWM:"),
        "rss_anon_kib": field("RssAnon:"),
        "threads": field("Threads:"),
        "fds": fds,
        "cpu_s": cpu_seconds(pid),
    })
}

/// User + system CPU seconds of a process.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(") ")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the command name: state is field 3 of stat, utime 14 and stime 15.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// JetStream consumers of every stream of the prefix (KV buckets included).
async fn consumers(bench: &Bench) -> anyhow::Result<Value> {
    let runs_stream = bench.names.runs_stream();
    let stem = runs_stream
        .strip_suffix("RUNS")
        .context("unexpected RUNS stream name")?
        .to_owned();
    let kv_stem = format!("KV_{stem}");
    let names: Vec<String> = bench.js.stream_names().try_collect().await?;
    let mut per_stream = serde_json::Map::new();
    let mut total = 0_usize;
    for name in names {
        if name.starts_with(&stem) || name.starts_with(&kv_stem) {
            let mut stream = bench.js.get_stream(&name).await?;
            let count = stream.info().await?.state.consumer_count;
            total += count;
            per_stream.insert(name, json!(count));
        }
    }
    Ok(json!({"total": total, "per_stream": per_stream}))
}

/// Messages and bytes the runs process's NATS connection exchanged, from `/connz`.
async fn runs_connection(bench: &Bench, url: &str, settings: &Settings) -> anyhow::Result<Value> {
    let ports = local_ports_to(settings.runs_pid, settings.nats_port)?;
    let connz: Value = bench
        .http
        .get(format!("{}/connz?limit=100000", url.trim_end_matches('/')))
        .send()
        .await?
        .json()
        .await?;
    let connections = connz["connections"]
        .as_array()
        .context("connz has no connections")?;
    let mine: Vec<&Value> = connections
        .iter()
        .filter(|c| {
            c["port"]
                .as_u64()
                .is_some_and(|p| ports.contains(&(p as u16)))
        })
        .collect();
    anyhow::ensure!(!mine.is_empty(), "no NATS connection of the runs process");
    let sum = |key: &str| mine.iter().filter_map(|c| c[key].as_u64()).sum::<u64>();
    Ok(json!({
        "connections": mine.len(),
        "in_msgs": sum("in_msgs"),
        "out_msgs": sum("out_msgs"),
        "in_bytes": sum("in_bytes"),
        "out_bytes": sum("out_bytes"),
        "subscriptions": sum("subscriptions"),
    }))
}

/// Local ports of the TCP connections of `pid` to `remote_port` (from `/proc`).
fn local_ports_to(pid: u32, remote_port: u16) -> anyhow::Result<Vec<u16>> {
    let mut inodes = std::collections::HashSet::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let Ok(target) = std::fs::read_link(entry?.path()) else {
            continue;
        };
        if let Some(inode) = target
            .to_str()
            .and_then(|t| t.strip_prefix("socket:["))
            .and_then(|t| t.strip_suffix(']'))
        {
            inodes.insert(inode.to_owned());
        }
    }
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(remote), Some(inode)) =
                (fields.get(1), fields.get(2), fields.get(9))
            else {
                continue;
            };
            let port = |addr: &str| {
                addr.rsplit_once(':')
                    .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
            };
            if port(remote) == Some(remote_port)
                && inodes.contains(*inode)
                && let Some(local) = port(local)
            {
                ports.push(local);
            }
        }
    }
    Ok(ports)
}
