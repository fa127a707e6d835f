//! The floor of fan-out on this machine, for `sse-idle`: what writing one event to every held
//! stream costs with nothing but the kernel's TCP. Every `GET` gets a chunked
//! `text/event-stream` head and its socket is kept; every run event the log stores (its core NATS
//! republish, `<prefix>.runs.live.>`) is encoded once as one chunk and written to every socket in
//! a loop, the sockets split between `--threads` threads (default: one per core): no task,
//! wake-up, HTTP library or allocation per stream. A terminal
//! event is followed by the last chunk and the sockets are closed. No heartbeats, no auth, no
//! routes: not a server, a measure of the kernel and the client.
//!
//! Usage: `sse-floor ADDR --nats-url URL --prefix PREFIX [--threads N]`; runs until killed.
//! Prints, for each event, how long the loop took to write it to every socket (stderr).

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context as _;
use futures::StreamExt as _;
use protocol::messaging::{Names, RunEventMessage};

const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
    cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n";

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = switchboard_bench::args!()?;
    let addr = args
        .positional()
        .unwrap_or_else(|| "127.0.0.1:8098".to_owned());
    let url = args
        .get("nats-url", "BENCH_NATS_URL")
        .context("--nats-url is required")?;
    let names = Names::new(
        &args
            .get("prefix", "BENCH_PREFIX")
            .context("--prefix is required")?,
    )?;
    let threads = args
        .parsed(
            "threads",
            "BENCH_FLOOR_THREADS",
            std::thread::available_parallelism().map_or(1, usize::from),
        )?
        .max(1);
    let sockets: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
    let listener = TcpListener::bind(&addr).with_context(|| format!("cannot listen on {addr}"))?;
    {
        let sockets = Arc::clone(&sockets);
        std::thread::spawn(move || {
            for socket in listener.incoming().flatten() {
                if let Ok(socket) = answer(socket) {
                    sockets
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(socket);
                }
            }
        });
    }
    let client = async_nats::connect(&url).await?;
    let mut live = client.subscribe(names.run_events_live_subjects()).await?;
    while let Some(message) = live.next().await {
        let Ok(RunEventMessage::V1(event)) = serde_json::from_slice(&message.payload) else {
            continue;
        };
        let frame = format!(
            "id: {}\ndata: {}\n\n",
            event.seq,
            serde_json::to_string(&event.event).unwrap_or_default()
        );
        let mut chunk = format!("{:x}\r\n{frame}\r\n", frame.len()).into_bytes();
        let terminal = event.event.is_terminal();
        if terminal {
            chunk.extend_from_slice(b"0\r\n\r\n");
        }
        let began = Instant::now();
        let mut sockets = sockets.lock().unwrap_or_else(|e| e.into_inner());
        // A socket whose kernel buffer is full (its client does not read) is counted out.
        let share = sockets.len().div_ceil(threads).max(1);
        let written: usize = std::thread::scope(|scope| {
            let writers: Vec<_> = sockets
                .chunks(share)
                .map(|part| {
                    let chunk = &chunk;
                    scope.spawn(move || {
                        let mut written = 0;
                        for mut socket in part {
                            written += usize::from(socket.write_all(chunk).is_ok());
                        }
                        written
                    })
                })
                .collect();
            writers.into_iter().map(|w| w.join().unwrap_or(0)).sum()
        });
        if terminal {
            sockets.clear();
        }
        eprintln!(
            "seq {}: written to {written} sockets by {threads} threads in {:.1} ms",
            event.seq,
            began.elapsed().as_secs_f64() * 1000.0
        );
    }
    Ok(())
}

/// Reads a request head and answers it with the stream's head; the socket is then non-blocking.
fn answer(mut socket: TcpStream) -> anyhow::Result<TcpStream> {
    socket.set_nodelay(true)?;
    socket.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    let mut head = Vec::new();
    let mut buffer = [0_u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = socket.read(&mut buffer)?;
        anyhow::ensure!(n > 0 && head.len() < 8192, "no request head");
        head.extend_from_slice(&buffer[..n]);
    }
    socket.write_all(HEAD)?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}
