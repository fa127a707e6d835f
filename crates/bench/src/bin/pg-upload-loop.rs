//! Baseline for `POST /v2/files/upload-url`: the PostgreSQL work of the attachments service's
//! requests, without the service.
//!
//! Reads the attachments service's settings from the environment (`SB_ATTACHMENTS_*`, the
//! service's `Config::from_env`: its database URL, quotas, bucket and upload TTL) and opens its
//! pool with its own constructor (`attachments::connect_pool`: the same size and
//! options). Then runs `--count` requests' PostgreSQL work with `--concurrency` in flight,
//! through `UploadUrlWork::run`: the very function the handler calls for it (the dedup lookup,
//! the quota, the insert of a pending file, committed), so the statements, their SQL text and
//! their transactions are the service's. Left out: HTTP, the token, the per-owner rate limit
//! (in memory), the form's signature and the JSON answer.
//!
//! Every request is a new upload like those of `scripts/bench/upload_url.lua`: a PDF of
//! `--file-size` bytes, named `bench-<nonce>-<n>.pdf`, declaring a SHA-256 no earlier request
//! declared; request n is made by owner `<owner-prefix>-<(n mod owners) + 1>`. Stops after
//! `--count` requests or `--max-seconds`, whichever comes first, and prints one JSON line:
//! requests, seconds, throughput, latency percentiles, errors, and the CPU time the pool's
//! PostgreSQL backends used during the loop (read from `/proc`: PostgreSQL on this machine).
//!
//! Usage: `pg-upload-loop --owner-prefix P [--owners N] [--count N] [--concurrency K]
//! [--max-seconds T] [--file-size BYTES] [--clock-ticks HZ]`.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use attachments::{Config, UploadUrlWork};
use futures::StreamExt as _;
use platform::config::Env;
use serde_json::json;
use sqlx::PgPool;
use switchboard_bench::{Tally, print_line};
use uuid::Uuid;

struct Settings {
    owner_prefix: String,
    owners: u64,
    count: u64,
    concurrency: usize,
    max_time: Duration,
    file_size: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = switchboard_bench::args!()?;
    let settings = Settings {
        owner_prefix: args
            .get("owner-prefix", "BENCH_OWNER_PREFIX")
            .context("--owner-prefix is required (the owners are <prefix>-1 ... <prefix>-N)")?,
        owners: args.parsed("owners", "BENCH_OWNERS", 64_u64)?.max(1),
        count: args.parsed("count", "BENCH_COUNT", 1_000_000_u64)?,
        concurrency: args
            .parsed("concurrency", "BENCH_CONCURRENCY", 16_usize)?
            .max(1),
        max_time: Duration::from_secs_f64(args.parsed("max-seconds", "BENCH_MAX_SECONDS", 15.0)?),
        file_size: args.parsed("file-size", "BENCH_FILE_SIZE", 1_048_576_u64)?,
    };
    let clock_ticks: f64 = args.parsed("clock-ticks", "BENCH_CLOCK_TICKS", 100.0)?;
    let config = Config::from_env(&Env::from_process())?;
    let work = UploadUrlWork::connect(&config).await?;

    // Every connection of the pool opened (as under the service's load) and its backend known,
    // so that the backends' CPU time is counted from here to the end of the loop.
    let backends = backend_pids(work.pool()).await?;
    let cpu_before = cpu_seconds(&backends, clock_ticks);
    let tally = run(&work, &settings).await?;
    let cpu_after = cpu_seconds(&backends, clock_ticks);
    work.pool().close().await;

    let line = json!({
        "target": "pg-upload-loop",
        "requests": tally.done,
        "concurrency": settings.concurrency,
        "owners": settings.owners,
        "pool_connections": work.pool().options().get_max_connections(),
        "rps": tally.rate(),
        "pg_backends": backends.len(),
        "pg_cpu_s": cpu_before.zip(cpu_after).map(|(before, after)| after - before),
    });
    print_line(line, tally.fields())?;
    anyhow::ensure!(tally.done > 0, "no request's work was done");
    Ok(())
}

/// The backend process ids of every connection the pool may hold, opening them all.
async fn backend_pids(pool: &PgPool) -> anyhow::Result<Vec<i32>> {
    let mut held = Vec::new();
    let mut pids = Vec::new();
    for _ in 0..pool.options().get_max_connections() {
        let mut conn = pool
            .acquire()
            .await
            .context("cannot open a pool connection")?;
        pids.push(
            sqlx::query_scalar::<_, i32>("SELECT pg_backend_pid()")
                .fetch_one(&mut *conn)
                .await?,
        );
        held.push(conn);
    }
    Ok(pids)
}

/// User + system CPU seconds of these processes (`/proc/<pid>/stat`); `None` when one of them
/// cannot be read (PostgreSQL on another machine).
fn cpu_seconds(pids: &[i32], clock_ticks: f64) -> Option<f64> {
    let mut ticks = 0_u64;
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After the ")" that ends the command name: state is field 3, utime 14, stime 15.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let utime: u64 = fields.get(11)?.parse().ok()?;
        let stime: u64 = fields.get(12)?.parse().ok()?;
        ticks += utime + stime;
    }
    Some(ticks as f64 / clock_ticks)
}

async fn run(work: &UploadUrlWork, settings: &Settings) -> anyhow::Result<Tally<()>> {
    // A random nonce keeps the hashes and names unique across invocations on one database.
    let nonce = *Uuid::new_v4().as_bytes();
    let started = Instant::now();
    let deadline = started + settings.max_time;
    let results = futures::stream::iter(0..settings.count)
        .take_while(|_| std::future::ready(Instant::now() < deadline))
        .map(|n| one(work, settings, &nonce, n))
        .buffer_unordered(settings.concurrency);
    Tally::drain(results, started).await
}

/// Request `n`: a new upload of its owner; returns how long its PostgreSQL work took.
async fn one(
    work: &UploadUrlWork,
    settings: &Settings,
    nonce: &[u8; 16],
    n: u64,
) -> anyhow::Result<(Duration, ())> {
    let owner = format!("{}-{}", settings.owner_prefix, n % settings.owners + 1);
    // nonce (16 bytes), then n (8 bytes), then zeros: unique per invocation and request.
    let mut hash = [0_u8; 32];
    hash[..16].copy_from_slice(nonce);
    hash[16..24].copy_from_slice(&n.to_be_bytes());
    let file_name = format!("bench-{}-{n}.pdf", hex_prefix(nonce));
    let started = Instant::now();
    work.run(
        &owner,
        &file_name,
        "application/pdf",
        settings.file_size,
        hash,
    )
    .await?;
    Ok((started.elapsed(), ()))
}

/// The first 4 bytes of `bytes` as 8 hex digits.
fn hex_prefix(bytes: &[u8; 16]) -> String {
    bytes[..4].iter().map(|b| format!("{b:02x}")).collect()
}
