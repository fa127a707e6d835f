//! Baseline for `sse-idle`: a bare axum server whose every `GET /api/v1/agent/runs/{id}/events`
//! is a server-sent event stream that never sends an event, only the same 15 s heartbeat as the
//! runs service; no auth, no NATS. What an idle SSE connection costs in axum + hyper alone.
//!
//! Usage: `sse-bare ADDR` (e.g. `127.0.0.1:8099`); runs until killed.

use std::convert::Infallible;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::get;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = switchboard_bench::args!()?;
    let addr = args
        .positional()
        .unwrap_or_else(|| "127.0.0.1:8099".to_owned());
    let app = Router::new().route(
        "/api/v1/agent/runs/{run_id}/events",
        get(|| async {
            Sse::new(futures::stream::pending::<Result<Event, Infallible>>()).keep_alive(
                KeepAlive::new()
                    .interval(Duration::from_secs(15))
                    .text("heartbeat"),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    axum::serve(listener, app).await?;
    Ok(())
}
