//! Peak memory of attachment extraction on hostile files (`BENCHMARKS.md` section 6,
//! `scripts/bench-extract.sh`).
//!
//! Makes one file of `extract::bombs` (`--bomb NAME`), gives each of `--copies N` files
//! its own copy of the bytes (as the worker downloads each file of each run), then
//! extracts them all at once, and prints one JSON line: the outcome of each copy, the
//! seconds, and the peak RSS (`VmHWM`) of this process and of the largest extraction
//! helper process.
//!
//! - `--mode inprocess`: `extract::extract` on a thread per copy, as the worker did before
//!   issue 14 (`spawn_blocking` per file, up to 3 files per run at once).
//! - `--mode isolated`: through the worker's own [`worker::attachments::Extractor`] (helper
//!   process per file, `--concurrency` at once, memory limit `--memory-mib`), with the
//!   helper found next to this binary. The file is written to a temporary file first and
//!   streamed from it into each helper, as the worker streams a download from S3, so this
//!   process holds no copy. A sampler also reads the RSS of this process and of all its
//!   helpers every 2 ms: `sampled_total_peak_mib` is the largest sum seen (what a
//!   container's memory limit counts), `helper_peak_rss_mib` the largest `VmHWM` a helper
//!   reported (a helper that died at its memory limit reports none).

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::Context as _;
use serde_json::json;
use switchboard_bench::peak_rss_kib;

fn outcome(result: &Result<extract::Extracted, String>) -> String {
    let text = match result {
        Ok(extract::Extracted::Text { text, truncated }) => {
            format!(
                "text: {} chars, truncated {truncated}",
                text.chars().count()
            )
        }
        Ok(extract::Extracted::Image { data_base64, .. }) => {
            format!("image: {} base64 bytes", data_base64.len())
        }
        Ok(extract::Extracted::Unsupported { reason }) => format!("unsupported: {reason}"),
        Err(reason) => format!("error: {reason}"),
    };
    text.chars().take(160).collect()
}

/// Resets this process's `VmHWM` to its current RSS (Linux 4.0+), so the peak measured
/// is the extraction's, not the bomb generator's.
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn rss_kib_of(pid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn rss_kib() -> Option<u64> {
    rss_kib_of("self")
}

/// RSS of this process plus that of every child process, KiB.
fn tree_rss_kib() -> u64 {
    let mut total = rss_kib().unwrap_or(0);
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return total;
    };
    for task in tasks.flatten() {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for pid in children.split_whitespace() {
            total += rss_kib_of(pid).unwrap_or(0);
        }
    }
    total
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = switchboard_bench::args!()?;
    let name = args
        .get("bomb", "BENCH_BOMB")
        .context("--bomb NAME is required")?;
    let mode = args
        .get("mode", "BENCH_MODE")
        .unwrap_or_else(|| "isolated".to_owned());
    let copies: usize = args.parsed("copies", "BENCH_COPIES", 1)?;
    let concurrency: usize = args.parsed("concurrency", "SB_WORKER_EXTRACT_CONCURRENCY", 2)?;
    let memory_mib: u64 = args.parsed("memory-mib", "SB_WORKER_EXTRACT_MEMORY_MIB", 0)?;
    let bomb = extract::bombs::by_name(&name)
        .with_context(|| format!("no bomb {name}; one of {:?}", extract::bombs::NAMES))?;
    let size = bomb.bytes.len();
    let limits = extract::Limits::default();

    let started;
    let mut children_peak_kib = 0u64;
    let mut sampled_peak_kib = 0u64;
    let results: Vec<Result<extract::Extracted, String>> = match mode.as_str() {
        "inprocess" => {
            let copies: Vec<Vec<u8>> = (0..copies).map(|_| bomb.bytes.clone()).collect();
            drop(bomb.bytes);
            let base = rss_kib();
            reset_peak();
            started = Instant::now();
            let tasks: Vec<_> = copies
                .into_iter()
                .map(|bytes| {
                    let (mime, file, limits) = (bomb.mime_type, bomb.file_name, limits.clone());
                    tokio::task::spawn_blocking(move || {
                        extract::extract(mime, file, &bytes, &limits).map_err(|e| e.to_string())
                    })
                })
                .collect();
            let mut results = Vec::new();
            for task in tasks {
                results.push(task.await.unwrap_or_else(|e| Err(format!("panicked: {e}"))));
            }
            eprintln!("rss before extraction (inputs held): {base:?} KiB");
            results
        }
        "isolated" => {
            let defaults = worker::attachments::ExtractionConfig::default();
            let config = worker::attachments::ExtractionConfig {
                concurrency,
                memory_mib: if memory_mib > 0 {
                    memory_mib
                } else {
                    defaults.memory_mib
                },
                ..defaults
            };
            let extractor = worker::attachments::Extractor::new(&config);
            let path = std::env::temp_dir().join(format!("extract-peak-{}", std::process::id()));
            std::fs::write(&path, &bomb.bytes)?;
            drop(bomb.bytes);
            let size = size as u64;
            reset_peak();
            let sampling = Arc::new(AtomicBool::new(true));
            let sampler = {
                let sampling = Arc::clone(&sampling);
                std::thread::spawn(move || {
                    let mut peak = 0;
                    while sampling.load(Ordering::Relaxed) {
                        peak = peak.max(tree_rss_kib());
                        std::thread::sleep(std::time::Duration::from_millis(2));
                    }
                    peak
                })
            };
            started = Instant::now();
            let runs = (0..copies).map(|_| {
                let extractor = extractor.clone();
                let path = path.clone();
                async move {
                    let deadline = tokio::time::Instant::now() + worker::attachments::FILE_TIMEOUT;
                    let Some(slot) = extractor.slot().await else {
                        anyhow::bail!("no extraction slot");
                    };
                    let file = tokio::fs::File::open(&path).await?;
                    Ok(extractor
                        .run(
                            &slot,
                            (bomb.mime_type, bomb.file_name),
                            size,
                            file,
                            deadline,
                        )
                        .await)
                }
            });
            let outcomes = futures::future::join_all(runs)
                .await
                .into_iter()
                .collect::<anyhow::Result<Vec<_>>>()?;
            sampling.store(false, Ordering::Relaxed);
            sampled_peak_kib = sampler.join().unwrap_or(0);
            let _ = std::fs::remove_file(&path);
            let mut results = Vec::new();
            for extraction in outcomes {
                children_peak_kib = children_peak_kib.max(extraction.helper_peak_kib.unwrap_or(0));
                results.push(extraction.content);
            }
            results
        }
        other => anyhow::bail!("--mode is inprocess or isolated, not {other}"),
    };
    let seconds = started.elapsed().as_secs_f64();
    let mut outcomes: Vec<String> = results.iter().map(outcome).collect();
    outcomes.dedup();
    let line = json!({
        "bomb": name,
        "mode": mode,
        "copies": copies,
        "concurrency": if mode == "isolated" { json!(concurrency) } else { json!(copies) },
        "file_bytes": size,
        "seconds": (seconds * 100.0).round() / 100.0,
        "peak_rss_mib": peak_rss_kib().map(|k| k / 1024),
        "helper_peak_rss_mib": children_peak_kib / 1024,
        "sampled_total_peak_mib": sampled_peak_kib / 1024,
        "outcomes": outcomes,
    });
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    Ok(())
}
