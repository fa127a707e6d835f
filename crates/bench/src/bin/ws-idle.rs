//! What idle WebSockets cost a server: `--sockets` clients of `GET /websocket` (the runs
//! service's NeMo-style socket, or `sse-bare`'s bare axum one), each authenticated by its upgrade
//! request's `Authorization` header and sending nothing, held for `--hold-seconds`. Samples the
//! server process (`--pid`: VmRSS from `/proc`) before opening and at the end of the hold.
//!
//! Prints one JSON line: sockets opened (and errors, the first error), alive at the end, RSS
//! before and holding, KiB per socket. Every phase is bounded in time.
//!
//! Usage: `ws-idle --url URL --token JWT --pid PID [--sockets N] [--open-concurrency C]
//! [--hold-seconds T]`.

use std::io::Write as _;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = switchboard_bench::args!()?;
    let url = args
        .get("url", "BENCH_URL")
        .ok_or_else(|| anyhow::anyhow!("--url is required (--help: usage)"))?;
    let token = args
        .get("token", "BENCH_TOKEN")
        .ok_or_else(|| anyhow::anyhow!("--token is required (--help: usage)"))?;
    let pid: u32 = args.parsed("pid", "BENCH_PID", 0)?;
    anyhow::ensure!(pid > 0, "--pid is required (--help: usage)");
    let sockets: usize = args.parsed("sockets", "BENCH_STREAMS", 10_000)?;
    let concurrency: usize = args.parsed("open-concurrency", "BENCH_OPEN_CONCURRENCY", 64)?;
    let hold = Duration::from_secs(args.parsed("hold-seconds", "BENCH_HOLD_SECONDS", 45_u64)?);
    let ws_url = format!(
        "{}/websocket",
        url.replacen("http://", "ws://", 1)
            .replacen("https://", "wss://", 1)
    );

    let before = rss_kib(pid);
    let cancel = CancellationToken::new();
    let opening = Instant::now();
    let deadline = opening + Duration::from_secs(180);
    let mut held = Vec::with_capacity(sockets);
    let (mut errors, mut first_error) = (0_u64, None);
    {
        let (ws_url, token) = (&ws_url, &token);
        let mut opens = futures::stream::iter(0..sockets)
            .take_while(|_| std::future::ready(Instant::now() < deadline))
            .map(|_| async move {
                let mut request = ws_url.as_str().into_client_request()?;
                request
                    .headers_mut()
                    .insert("authorization", format!("Bearer {token}").parse()?);
                let connect = tokio_tungstenite::connect_async(request);
                let (socket, _) = tokio::time::timeout(Duration::from_secs(30), connect)
                    .await
                    .map_err(|_| anyhow::anyhow!("no upgrade within 30 s"))??;
                anyhow::Ok(socket)
            })
            .buffer_unordered(concurrency);
        while let Some(opened) = opens.next().await {
            match opened {
                Ok(socket) => {
                    let cancel = cancel.clone();
                    held.push(tokio::spawn(async move {
                        let (_write, mut read) = socket.split();
                        // Alive: the server has not closed it by the end of the hold.
                        tokio::select! {
                            () = cancel.cancelled() => true,
                            _ = async { while let Some(Ok(_)) = read.next().await {} } => false,
                        }
                    }));
                }
                Err(err) => {
                    errors += 1;
                    first_error.get_or_insert_with(|| format!("{err:#}"));
                }
            }
        }
    }
    let open_seconds = opening.elapsed().as_secs_f64();
    let opened = held.len();
    tokio::time::sleep(hold).await;
    let holding = rss_kib(pid);
    cancel.cancel();
    let mut alive = 0;
    for socket in held {
        alive += usize::from(socket.await.unwrap_or(false));
    }
    let line = json!({
        "sockets_opened": opened,
        "open_errors": errors,
        "first_error": first_error,
        "open_seconds": (open_seconds * 10.0).round() / 10.0,
        "alive_at_end_of_hold": alive,
        "hold_seconds": hold.as_secs(),
        "rss_before_kib": before,
        "rss_holding_kib": holding,
        "kib_per_socket": match (before, holding) {
            (Some(before), Some(holding)) if opened > 0 =>
                Some(((holding as f64 - before as f64) / opened as f64 * 10.0).round() / 10.0),
            _ => None,
        },
    });
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    Ok(())
}

/// VmRSS of `pid` in KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}
