//! Benchmark tools for the runs and attachments services (see `BENCHMARKS.md`,
//! `scripts/bench-runs.sh` and `scripts/bench-attachments.sh`):
//!
//! - `bare-axum`: bare axum handlers that read the same bodies as `POST /api/v1/agent/runs`
//!   and `POST /v2/files/upload-url` and answer same-shaped JSON, without auth, validation,
//!   NATS or a database: the ceiling of HTTP + JSON on this machine.
//! - `js-publish-loop`: publishes the same `RunTask` messages the runs service publishes to the
//!   same JetStream stream, K in flight, awaiting every ack: the ceiling of JetStream.
//! - `s3-put`: one `PutObject` of a file, streamed from disk, to the S3 server the attachments
//!   service uses, with the same credentials: the ceiling of a server-side upload.
//! - `extract-peak`: peak memory of attachment extraction on the hostile files of
//!   `extract::bombs`, in process or through the worker's helper processes
//!   (`scripts/bench-extract.sh`, `BENCHMARKS.md` section 6).
//! - `broker-fill`: fills a RUNS stream with accepted runs in the service's layout or the one
//!   before issue 12, for the broker memory curve (`scripts/bench-broker.sh`, section 9).
//! - `pg-upload-loop`: the PostgreSQL work of one `upload-url` request, by the service's own
//!   function, as a raw loop (`scripts/bench-attachments.sh`, section 3).
//! - `relay-bench`: a bench AG-UI agent that stamps its events, and readers of its stream
//!   directly and relayed by the worker through the runs service, for the relay's added latency
//!   and events a second (`scripts/bench-relay.sh`, section 10).
//! - `sse-replay`: a long reply replayed from the start, as stored and compacted: bytes, events
//!   and time (`scripts/bench-replay.sh`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::{Stream, StreamExt as _};
use hdrhistogram::Histogram;

/// The user text of every benchmark run unless `BENCH_TEXT` says otherwise; the wrk script
/// (`scripts/bench/runs.lua`) uses the same default, and `scripts/bench-runs.sh` passes the
/// same `BENCH_TEXT` to both.
pub const DEFAULT_TEXT: &str =
    "Summarise the attached quarterly report in three bullet points and list the open risks.";

/// The body of one benchmark run, byte for byte what `scripts/bench/runs.lua` sends.
pub fn run_body(thread_id: &str, run_id: &str, text: &str) -> String {
    serde_json::json!({
        "threadId": thread_id,
        "runId": run_id,
        "messages": [{"id": "m1", "role": "user", "content": text}],
    })
    .to_string()
}

/// A run of `owner` saying `text` as the runs service would accept it (agent `echo`); the
/// service publishes it with `platform::nats::publish_run`.
pub fn accepted_run(
    owner: &str,
    run_id: &str,
    text: &str,
) -> anyhow::Result<protocol::messaging::RunTaskV1> {
    let body = run_body(&uuid::Uuid::new_v4().to_string(), run_id, text);
    let input = protocol::validate::parse_run_input(body.as_bytes())
        .map_err(|v| anyhow::anyhow!("benchmark body is invalid: {}", v.message))?;
    Ok(protocol::messaging::RunTaskV1 {
        task_id: uuid::Uuid::now_v7(),
        owner: owner.to_owned(),
        accepted_at: chrono::Utc::now(),
        input,
        attachments: Vec::new(),
        conversation: false,
        resumed: None,
        trace_id: None,
        agent: Some("echo".to_owned()),
    })
}

/// The peak resident set size of this process so far (`VmHWM` of `/proc/self/status`), in KiB;
/// `None` where `/proc` is not there.
pub fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

/// What a load loop did: operations done and failed, the first failure, the last success's
/// value (a message size) and the per-operation latency. The three loops (`js-publish-loop`,
/// `pg-upload-loop`, `broker-fill`) drain their work through [`Tally::drain`].
#[derive(Debug)]
pub struct Tally<T> {
    /// Operations that succeeded.
    pub done: u64,
    /// Operations that failed.
    pub errors: u64,
    /// The first failure, with its cause chain.
    pub first_error: Option<String>,
    /// What the last success returned besides its latency.
    pub last: Option<T>,
    /// From `started` (given to `drain`) to the last result.
    pub elapsed: Duration,
    /// Per-operation latency, in microseconds.
    latency: Histogram<u64>,
}

impl<T> Tally<T> {
    /// Awaits every result of `results` (each an operation's latency and value, or its error).
    pub async fn drain(
        results: impl Stream<Item = anyhow::Result<(Duration, T)>>,
        started: Instant,
    ) -> anyhow::Result<Self> {
        let mut tally = Self {
            done: 0,
            errors: 0,
            first_error: None,
            last: None,
            elapsed: Duration::ZERO,
            latency: Histogram::new_with_bounds(1, 60_000_000, 3)?,
        };
        let mut results = std::pin::pin!(results);
        while let Some(result) = results.next().await {
            tally.record(result);
        }
        tally.elapsed = started.elapsed();
        Ok(tally)
    }

    fn record(&mut self, result: anyhow::Result<(Duration, T)>) {
        match result {
            Ok((took, value)) => {
                self.done += 1;
                self.last = Some(value);
                let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
                self.latency.saturating_record(micros.max(1));
            }
            Err(err) => {
                self.errors += 1;
                self.first_error.get_or_insert_with(|| format!("{err:#}"));
            }
        }
    }

    /// Successes per second of `elapsed`.
    pub fn rate(&self) -> f64 {
        self.done as f64 / self.elapsed.as_secs_f64()
    }

    /// The result line's common fields: `seconds`, `errors`, `first_error` and the latency
    /// percentiles `p50_ms`, `p90_ms`, `p99_ms`, `max_ms`, `mean_ms`.
    pub fn fields(&self) -> serde_json::Map<String, serde_json::Value> {
        let ms = |micros: u64| serde_json::json!(micros as f64 / 1000.0);
        [
            ("seconds", serde_json::json!(self.elapsed.as_secs_f64())),
            ("errors", serde_json::json!(self.errors)),
            ("first_error", serde_json::json!(self.first_error)),
            ("p50_ms", ms(self.latency.value_at_quantile(0.50))),
            ("p90_ms", ms(self.latency.value_at_quantile(0.90))),
            ("p99_ms", ms(self.latency.value_at_quantile(0.99))),
            ("max_ms", ms(self.latency.max())),
            ("mean_ms", serde_json::json!(self.latency.mean() / 1000.0)),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect()
    }
}

/// Prints `line` (a JSON object) extended by `fields` as one line on standard output.
pub fn print_line(
    mut line: serde_json::Value,
    fields: serde_json::Map<String, serde_json::Value>,
) -> anyhow::Result<()> {
    use std::io::Write as _;
    if let Some(object) = line.as_object_mut() {
        object.extend(fields);
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// Deletes every stream of the prefix (`<P>_*`, and `KV_<P>_*` for KV buckets), what a
/// benchmark left on a shared NATS server, and prints one JSON line naming them.
pub async fn cleanup(
    js: &async_nats::jetstream::Context,
    names: &protocol::messaging::Names,
) -> anyhow::Result<()> {
    let runs_stream = names.runs_stream();
    let stem = runs_stream
        .strip_suffix("RUNS")
        .context("unexpected RUNS stream name")?;
    let kv_stem = format!("KV_{stem}");
    let streams: Vec<String> = futures::TryStreamExt::try_collect(js.stream_names()).await?;
    let mut deleted = Vec::new();
    for stream in streams {
        if (stream.starts_with(stem) || stream.starts_with(&kv_stem))
            && js.delete_stream(&stream).await.is_ok()
        {
            deleted.push(stream);
        }
    }
    let line =
        serde_json::json!({"target": "cleanup", "prefix": names.prefix(), "deleted": deleted});
    use std::io::Write as _;
    writeln!(std::io::stdout().lock(), "{line}")?;
    Ok(())
}

/// `--name value` pairs of the command line (a bare first argument is kept under `""`).
#[derive(Debug, Default)]
pub struct Args {
    values: HashMap<String, String>,
}

/// Parses the tool's command line with [`Args::from_process_or_help`], the tool's own source
/// giving the usage text: `let args = switchboard_bench::args!()?;` in a `src/bin/NAME.rs`.
#[macro_export]
macro_rules! args {
    () => {
        $crate::Args::from_process_or_help(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/bin/",
            env!("CARGO_BIN_NAME"),
            ".rs"
        )))
    };
}

/// The `//!` lines a source file starts with, without the marker: a bench tool's usage.
pub fn module_doc(source: &str) -> String {
    source
        .lines()
        .map_while(|line| line.strip_prefix("//!"))
        .map(|line| line.strip_prefix(' ').unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n")
}

impl Args {
    /// Parses `std::env::args()`; `--help` or `-h` anywhere prints the module documentation of
    /// `source` (the tool's own file, see [`args!`]) and exits.
    pub fn from_process_or_help(source: &str) -> anyhow::Result<Self> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        if args.iter().any(|a| a == "--help" || a == "-h") {
            use std::io::Write as _;
            let mut out = std::io::stdout().lock();
            writeln!(out, "{}", module_doc(source))?;
            out.flush()?;
            std::process::exit(0);
        }
        Self::parse(args)
    }

    /// Parses `--name value` pairs; a first argument without `--` is the positional one.
    pub fn parse(args: impl IntoIterator<Item = String>) -> anyhow::Result<Self> {
        let mut values = HashMap::new();
        let mut args = args.into_iter().peekable();
        if let Some(first) = args.next_if(|a| !a.starts_with("--")) {
            values.insert(String::new(), first);
        }
        while let Some(name) = args.next() {
            let key = name.strip_prefix("--").with_context(|| {
                format!("unexpected argument {name:?}; use --name value (--help: usage)")
            })?;
            let value = args
                .next()
                .with_context(|| format!("--{key} needs a value (--help: usage)"))?;
            values.insert(key.to_owned(), value);
        }
        Ok(Self { values })
    }

    /// `--name`, else the environment variable `env`, else `None`.
    pub fn get(&self, name: &str, env: &str) -> Option<String> {
        self.values
            .get(name)
            .cloned()
            .or_else(|| std::env::var(env).ok().filter(|v| !v.is_empty()))
    }

    /// The positional argument, if any.
    pub fn positional(&self) -> Option<String> {
        self.values.get("").cloned()
    }

    /// `--name` (or `env`) parsed, else `default`.
    pub fn parsed<T>(&self, name: &str, env: &str, default: T) -> anyhow::Result<T>
    where
        T: std::str::FromStr,
        T::Err: std::fmt::Display,
    {
        match self.get(name, env) {
            None => Ok(default),
            Some(raw) => raw
                .parse()
                .map_err(|err| anyhow::anyhow!("--{name} / {env} = {raw:?} is invalid: {err}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_benchmark_body_is_a_valid_run() {
        let body = run_body("550e8400-e29b-41d4-a716-446655440000", "r-1", DEFAULT_TEXT);
        assert!(protocol::validate::parse_run_input(body.as_bytes()).is_ok());
    }

    #[test]
    fn arguments_are_name_value_pairs_after_an_optional_positional_one() {
        let args =
            Args::parse(["127.0.0.1:1", "--count", "5"].map(String::from)).unwrap_or_default();
        assert_eq!(args.positional().as_deref(), Some("127.0.0.1:1"));
        assert_eq!(args.parsed("count", "BENCH_UNSET_VAR", 0_u64).ok(), Some(5));
        assert!(Args::parse(["--count"].map(String::from)).is_err());
    }

    #[test]
    fn the_usage_is_the_leading_module_documentation() {
        let source = "//! Tool: does a thing.\n//!\n//!   indented\nuse x;\n//! not this\n";
        assert_eq!(module_doc(source), "Tool: does a thing.\n\n  indented");
        assert_eq!(module_doc("fn main() {}"), "");
    }

    #[tokio::test]
    async fn a_tally_counts_successes_and_failures_and_keeps_the_first_error() {
        let results = futures::stream::iter([
            Ok((Duration::from_millis(2), 10_usize)),
            Err(anyhow::anyhow!("first")),
            Ok((Duration::from_millis(4), 20)),
            Err(anyhow::anyhow!("second")),
        ]);
        let tally = Tally::drain(results, Instant::now()).await.unwrap();
        assert_eq!((tally.done, tally.errors, tally.last), (2, 2, Some(20)));
        assert_eq!(tally.first_error.as_deref(), Some("first"));
        let fields = tally.fields();
        assert_eq!(fields["max_ms"].as_f64().map(f64::round), Some(4.0));
        assert_eq!(fields["p50_ms"].as_f64().map(f64::round), Some(2.0));
    }

    #[test]
    fn the_peak_rss_is_read_from_proc() {
        if std::path::Path::new("/proc/self/status").exists() {
            assert!(peak_rss_kib().is_some_and(|kib| kib > 0));
        }
    }
}
