//! What counting each owner's active runs costs (`platform::owner_set`, issue 25): the runs
//! service enters a run into its owner's set before it publishes the run, the worker takes it out
//! as the run ends. This measures those two operations against the `OWNER_BUDGETS` bucket of a
//! fresh prefix, beside (b) the publish every accepted run makes anyway (`publish_run`, the same
//! function as the runs service's), in one run with the same concurrency:
//!
//! - `enter`: one `OwnerSet::enter` per run, `--owners` owners taking turns, each owner holding
//!   at most `--active` runs (the oldest leaves first, as runs end);
//! - `leave`: the matching `OwnerSet::leave`;
//! - `publish`: one `publish_run` of the same run.
//!
//! Prints one JSON line per operation: throughput and per-operation latency percentiles.
//!
//! Usage: `owner-set-cost --prefix P [--nats-url URL] [--count N] [--concurrency K]
//! [--owners O] [--active A]` (`SB_NATS_URL` as fallback). Bounded by `--count` (default
//! 20,000 runs per operation). The prefix's streams are deleted at the end.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use futures::StreamExt as _;
use platform::nats::NatsConfig;
use platform::owner_set::OwnerSet;
use protocol::messaging::Names;
use serde_json::json;
use switchboard_bench::{DEFAULT_TEXT, Tally, accepted_run, print_line};
use tokio::sync::Mutex;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = switchboard_bench::args!()?;
    let prefix = args
        .get("prefix", "BENCH_NATS_PREFIX")
        .context("--prefix is required (a fresh NATS prefix)")?;
    let url = args
        .get("nats-url", "SB_NATS_URL")
        .unwrap_or_else(|| "nats://127.0.0.1:4222".to_owned());
    let count: u64 = args.parsed("count", "BENCH_COUNT", 20_000)?;
    let concurrency: usize = args.parsed("concurrency", "BENCH_CONCURRENCY", 16)?;
    let owners: usize = args.parsed("owners", "BENCH_OWNERS", 1_000)?;
    let active: usize = args.parsed("active", "BENCH_ACTIVE", 10)?;
    let names = Names::new(&prefix).map_err(anyhow::Error::msg)?;
    let config = NatsConfig {
        url,
        names: names.clone(),
        limits: platform::config::Env::from_process().nats()?.limits,
        credentials: platform::nats_auth::NatsCredentials::default(),
    };
    let (_client, js) = platform::nats::connect(&config, "bench").await?;
    platform::nats::ensure_streams(&js, &config).await?;
    let buckets = platform::lifecycle::ensure_run_buckets(&js, &config).await?;
    let set = OwnerSet::active_runs(buckets.owner_budgets.clone());
    let owner = |n: u64| format!("owner-{}", n % owners as u64);

    // The runs each owner holds, oldest first, so `enter` finds sets of about `active` runs.
    let held: Arc<Vec<Mutex<VecDeque<String>>>> =
        Arc::new((0..owners).map(|_| Mutex::new(VecDeque::new())).collect());
    let mut entered = Vec::new();
    let started = Instant::now();
    let enters = futures::stream::iter(0..count)
        .map(|n| {
            let (set, held) = (set.clone(), Arc::clone(&held));
            let owner = owner(n);
            async move {
                let task = uuid::Uuid::now_v7().to_string();
                let slot = &held[(n % owners as u64) as usize];
                // The owner's oldest run ended meanwhile (not timed: the worker's part).
                let ended = {
                    let mut runs = slot.lock().await;
                    if runs.len() >= active {
                        runs.pop_front()
                    } else {
                        None
                    }
                };
                if let Some(ended) = ended {
                    set.leave(&owner, &ended).await?;
                }
                let at = Instant::now();
                set.enter(&owner, &task, chrono::Utc::now(), active + 1)
                    .await?
                    .map_err(|full| anyhow::anyhow!("set full at {}", full.max))?;
                let took = at.elapsed();
                slot.lock().await.push_back(task.clone());
                Ok::<_, anyhow::Error>((took, (owner, task)))
            }
        })
        .buffer_unordered(concurrency)
        .inspect(|result| {
            if let Ok((_, pair)) = result {
                entered.push(pair.clone());
            }
        });
    let tally = Tally::drain(enters, started).await?;
    report("enter", &tally, count, concurrency, owners, active)?;

    let started = Instant::now();
    let leaves = futures::stream::iter(entered)
        .map(|(owner, task)| {
            let set = set.clone();
            async move {
                let at = Instant::now();
                set.leave(&owner, &task).await?;
                Ok::<_, anyhow::Error>((at.elapsed(), ()))
            }
        })
        .buffer_unordered(concurrency);
    let tally = Tally::drain(leaves, started).await?;
    report("leave", &tally, count, concurrency, owners, active)?;

    let started = Instant::now();
    let publishes = futures::stream::iter(0..count)
        .map(|n| {
            let (js, names) = (js.clone(), names.clone());
            let owner = owner(n);
            async move {
                let task = accepted_run(&owner, &uuid::Uuid::new_v4().to_string(), DEFAULT_TEXT)?;
                let at = Instant::now();
                platform::nats::publish_run(&js, &names, &task).await?;
                Ok::<_, anyhow::Error>((at.elapsed(), ()))
            }
        })
        .buffer_unordered(concurrency);
    let tally = Tally::drain(publishes, started).await?;
    report("publish", &tally, count, concurrency, owners, active)?;

    switchboard_bench::cleanup(&js, &names).await?;
    Ok(())
}

fn report<T>(
    operation: &str,
    tally: &Tally<T>,
    count: u64,
    concurrency: usize,
    owners: usize,
    active: usize,
) -> anyhow::Result<()> {
    let mut fields = tally.fields();
    fields.insert("per_second".to_owned(), json!(tally.rate()));
    print_line(
        json!({"operation": operation, "count": count, "concurrency": concurrency,
               "owners": owners, "active": active}),
        fields,
    )
}
