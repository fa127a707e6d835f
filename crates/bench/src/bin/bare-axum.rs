//! Baseline (a): bare axum handlers on the same machine, for the runs and attachments benchmarks.
//!
//! - `POST /api/v1/agent/runs` reads the body under the same 256 KiB limit, parses it as
//!   `serde_json::Value` and answers 202 with a `TaskAcceptedResponse`-shaped JSON.
//! - `POST /v2/files/upload-url` reads the body under axum's default 2 MB limit (what the
//!   attachments handler's `Bytes` extractor has), parses it as `serde_json::Value` and answers
//!   200 with a JSON of the attachments answer's shape and size (`url`, `fields` with the same
//!   names, `content_url`, `is_duplicate`, `upload_required`), filled with placeholders: no
//!   database lookup or insert, no policy, no signature.
//!
//! No auth, no typed validation, no NATS, no database, no tracing layers: what is left is the
//! cost of HTTP + JSON on this machine.
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
use serde_json::{Value, json};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = switchboard_bench::args!()?;
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
    let router = Router::new()
        .route("/api/v1/agent/runs", post(create_run))
        .route("/v2/files/upload-url", post(upload_url));
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

/// Length of the placeholder `policy` field: about what the attachments service's base64 policy
/// document is for the benchmark body (bucket `bench-<time>`, a declared SHA-256).
const POLICY_PLACEHOLDER_CHARS: usize = 760;

/// `POST /v2/files/upload-url` without the work: a same-shaped answer, nothing looked up, stored
/// or signed.
async fn upload_url(body: axum::body::Bytes) -> Response {
    let Ok(value) = serde_json::from_slice::<Value>(&body) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let field = |name: &str| value.get(name).and_then(Value::as_str).unwrap_or_default();
    let key = format!(
        "uploads/{}/{}/{}",
        "0".repeat(32),
        uuid::Uuid::now_v7(),
        field("file_name")
    );
    let now = chrono::Utc::now();
    let answer = json!({
        "url": "http://127.0.0.1:9000/bench",
        "fields": {
            "key": key,
            "Content-Type": field("file_type"),
            "x-amz-checksum-algorithm": "SHA256",
            "x-amz-checksum-sha256": "A".repeat(44),
            "x-amz-algorithm": "AWS4-HMAC-SHA256",
            "x-amz-credential": format!("switchboard-local/{}/us-east-1/s3/aws4_request", now.format("%Y%m%d")),
            "x-amz-date": now.format("%Y%m%dT%H%M%SZ").to_string(),
            "policy": "A".repeat(POLICY_PLACEHOLDER_CHARS),
            "x-amz-signature": "0".repeat(64),
        },
        "content_url": format!("s3://bench/{key}"),
        "is_duplicate": false,
        "upload_required": true,
    });
    (StatusCode::OK, axum::Json(answer)).into_response()
}
