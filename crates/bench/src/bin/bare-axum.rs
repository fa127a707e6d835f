//! Baseline (a): a bare axum handler for `POST /api/v1/agent/runs` on the same machine.
//!
//! It reads the body under the same 256 KiB limit, parses it as `serde_json::Value` and answers
//! 202 with a `TaskAcceptedResponse`-shaped JSON. No auth, no typed validation, no NATS, no
//! tracing layers: what is left is the cost of HTTP + JSON on this machine.
//!
//! Usage: `bare-axum [ADDR]` (or `BENCH_ADDR`; default `127.0.0.1:8090`). Stops on SIGTERM.

use std::net::SocketAddr;

use anyhow::Context as _;
use axum::Router;
use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use protocol::TaskAcceptedResponse;
use protocol::validate::MAX_PAYLOAD_BYTES;
use serde_json::Value;
use switchboard_bench::Args;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::from_process()?;
    let addr: SocketAddr = match args.positional() {
        Some(raw) => raw
            .parse()
            .with_context(|| format!("bad address {raw:?}"))?,
        None => args.parsed(
            "addr",
            "BENCH_ADDR",
            SocketAddr::from(([127, 0, 0, 1], 8090)),
        )?,
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let shutdown = platform::shutdown::on_signal();
    let router = Router::new().route("/api/v1/agent/runs", post(create_run));
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
        .context("bare axum server failed")
}

async fn create_run(body: Body) -> Response {
    let Ok(bytes) = axum::body::to_bytes(body, MAX_PAYLOAD_BYTES).await else {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    };
    let Ok(value) = serde_json::from_slice::<Value>(&bytes) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let field = |name: &str| {
        value
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let accepted = TaskAcceptedResponse {
        task_id: uuid::Uuid::now_v7().to_string(),
        thread_id: field("threadId"),
        run_id: field("runId"),
        created: chrono::Utc::now(),
    };
    (StatusCode::ACCEPTED, axum::Json(accepted)).into_response()
}
