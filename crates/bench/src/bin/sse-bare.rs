//! Baseline for `sse-idle`: a bare axum server whose every `GET /api/v1/agent/runs/{id}/events`
//! is a server-sent event stream, with the same 15 s heartbeat as the runs service; no auth. What
//! an idle SSE connection costs in axum + hyper alone, and, given NATS, the floor of fan-out:
//! every run event the log stores (its core NATS republish, `<prefix>.runs.live.>`) is decoded
//! and encoded once and written to every open stream (a `tokio::sync::broadcast`), each stream
//! ending after a terminal event, as the runs service's do. Nothing per stream but the channel.
//!
//! `GET /websocket` upgrades to a WebSocket that reads until the client closes it, with the runs
//! service's 4 KiB first read buffer: the baseline of `ws-idle`.
//!
//! Usage: `sse-bare ADDR [--nats-url URL --prefix PREFIX]` (e.g. `127.0.0.1:8099`); runs until
//! killed. Without `--nats-url` the streams only send heartbeats.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::get;
use futures::StreamExt as _;
use protocol::messaging::{Names, RunEventMessage};
use tokio::sync::broadcast;

/// One event as every stream writes it: its `seq`, its AG-UI JSON, whether it ends the run.
type Frame = Arc<(u64, String, bool)>;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = switchboard_bench::args!()?;
    let addr = args
        .positional()
        .unwrap_or_else(|| "127.0.0.1:8099".to_owned());
    let (frames, _) = broadcast::channel::<Frame>(64);
    if let Some(url) = args.get("nats-url", "BENCH_NATS_URL") {
        let prefix = args
            .get("prefix", "BENCH_PREFIX")
            .unwrap_or_else(|| "sb".to_owned());
        let names = Names::new(&prefix)?;
        let client = async_nats::connect(&url).await?;
        let mut live = client.subscribe(names.run_events_live_subjects()).await?;
        let frames = frames.clone();
        tokio::spawn(async move {
            while let Some(message) = live.next().await {
                if let Ok(RunEventMessage::V1(event)) = serde_json::from_slice(&message.payload) {
                    let json = serde_json::to_string(&event.event).unwrap_or_default();
                    let terminal = event.event.is_terminal();
                    let _ = frames.send(Arc::new((event.seq, json, terminal)));
                }
            }
        });
    }
    let app = Router::new()
        .route("/api/v1/agent/runs/{run_id}/events", get(events))
        .route("/websocket", get(websocket))
        .with_state(frames);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    axum::serve(listener, app).await?;
    Ok(())
}

async fn websocket(upgrade: axum::extract::ws::WebSocketUpgrade) -> axum::response::Response {
    // The runs service's first read buffer (the library's default is 128 KiB a socket).
    let upgrade = upgrade.read_buffer_size(4 * 1024);
    upgrade.on_upgrade(|mut socket| async move { while let Some(Ok(_)) = socket.recv().await {} })
}

async fn events(
    State(frames): State<broadcast::Sender<Frame>>,
) -> Sse<impl futures::Stream<Item = Result<Event, Infallible>>> {
    let stream =
        futures::stream::unfold((frames.subscribe(), false), |(mut rx, ended)| async move {
            if ended {
                return None;
            }
            loop {
                match rx.recv().await {
                    Ok(frame) => {
                        let (seq, json, terminal) = &*frame;
                        let event = Event::default().id(seq.to_string()).data(json);
                        return Some((Ok(event), (rx, *terminal)));
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        });
    Sse::new(stream).keep_alive(
        KeepAlive::new()
            .interval(Duration::from_secs(15))
            .text("heartbeat"),
    )
}
