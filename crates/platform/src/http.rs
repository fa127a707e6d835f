//! The HTTP edge every service shares: the error answer, health routes and the server loop.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::ListenerExt as _;
use futures::future::BoxFuture;
use protocol::{ErrorCode, ErrorEnvelope};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

/// An error answer: a status and the shared JSON envelope. Boxed, so `Result<T, ErrorResponse>`
/// stays small on the happy path.
#[derive(Debug)]
pub struct ErrorResponse(Box<ErrorParts>);

#[derive(Debug)]
struct ErrorParts {
    status: StatusCode,
    envelope: ErrorEnvelope,
    header: Option<(HeaderName, HeaderValue)>,
}

impl ErrorResponse {
    /// An answer without a field.
    pub fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        Self(Box::new(ErrorParts {
            status,
            envelope: ErrorEnvelope::new(code, message),
            header: None,
        }))
    }

    /// An answer naming the offending field.
    pub fn with_field(
        status: StatusCode,
        code: ErrorCode,
        message: impl Into<String>,
        field: impl Into<String>,
    ) -> Self {
        Self(Box::new(ErrorParts {
            status,
            envelope: ErrorEnvelope::with_field(code, message, field),
            header: None,
        }))
    }

    /// 404 for a resource that does not exist or is not the caller's.
    pub fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
            format!("{what} not found"),
        )
    }

    /// 500, logged once with its cause chain, answered opaquely.
    pub fn internal(err: &anyhow::Error) -> Self {
        tracing::error!(error = format!("{err:#}"), "request failed");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            "internal error",
        )
    }

    /// 503 when a dependency is down, logged once, answered opaquely.
    pub fn unavailable(err: &anyhow::Error) -> Self {
        tracing::error!(error = format!("{err:#}"), "dependency unavailable");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Unavailable,
            "a dependency is unavailable, retry later",
        )
    }

    /// Adds a header to the answer.
    pub fn with_header(mut self, name: HeaderName, value: &'static str) -> Self {
        self.0.header = Some((name, HeaderValue::from_static(value)));
        self
    }

    /// Adds `Retry-After: <secs>` (at least 1) to a 429 or 503.
    pub fn retry_after(mut self, wait: std::time::Duration) -> Self {
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        self.0.header = Some((
            axum::http::header::RETRY_AFTER,
            HeaderValue::from(secs.max(1)),
        ));
        self
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.0.status
    }
}

impl IntoResponse for ErrorResponse {
    fn into_response(self) -> Response {
        let ErrorParts {
            status,
            envelope,
            header,
        } = *self.0;
        let mut response = (status, axum::Json(envelope)).into_response();
        if let Some((name, value)) = header {
            response.headers_mut().insert(name, value);
        }
        response
    }
}

/// One readiness check: a dependency's name and a probe that says whether it is reachable.
pub type Probe = Arc<dyn Fn() -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// The paths [`health_routes`] serves, each to `GET`: `/metrics`, `/healthz`, `/readyz`.
pub const HEALTH_PATHS: [&str; 3] = ["/metrics", "/healthz", "/readyz"];

/// `/healthz` (the process is alive), `/readyz` (every probe passes) and `/metrics`
/// (Prometheus), unauthenticated: for the kubelet and the scraper on the service's own port;
/// the gateway and the Ingress route none of them.
pub fn health_routes(probes: Vec<(&'static str, Probe)>) -> Router {
    let probes = Arc::new(probes);
    crate::metrics::handle();
    let [metrics, healthz, readyz] = HEALTH_PATHS;
    Router::new()
        .route(metrics, get(metrics_text))
        .route(healthz, get(alive))
        .route(readyz, get(ready).with_state(probes))
}

/// The body of `/healthz`.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct Alive {
    /// Always `ok`.
    pub status: String,
}

/// The body of `/readyz`.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct Readiness {
    /// `ready` when every probe passed, else `not_ready`.
    pub status: String,
    /// Each dependency's outcome: `ok`, `unreachable` or `timeout`.
    pub checks: std::collections::BTreeMap<String, String>,
}

/// The process is alive.
#[utoipa::path(get, path = "/healthz", tag = "health", security(()),
    responses((status = 200, description = "The process is alive.", body = Alive)))]
async fn alive() -> axum::Json<Alive> {
    axum::Json(Alive {
        status: "ok".to_owned(),
    })
}

/// The service's metrics in the Prometheus text format.
#[utoipa::path(get, path = "/metrics", tag = "health", security(()),
    responses((status = 200, description = "Prometheus text exposition.", content_type = "text/plain", body = String)))]
async fn metrics_text() -> Response {
    crate::metrics::render().await
}

/// Whether every dependency (database, NATS, S3, as the service has them) is reachable; used
/// as the kubelet's readiness probe.
#[utoipa::path(get, path = "/readyz", tag = "health", security(()),
    responses(
        (status = 200, description = "Every dependency is reachable.", body = Readiness),
        (status = 503, description = "A dependency is unreachable; `checks` names it.", body = Readiness),
    ))]
async fn ready(State(probes): State<Arc<Vec<(&'static str, Probe)>>>) -> Response {
    readiness(&probes).await
}

/// The OpenAPI paths of [`health_routes`], merged into every service's document.
#[derive(utoipa::OpenApi)]
#[openapi(paths(alive, metrics_text, ready))]
pub struct HealthApi;

async fn readiness(probes: &[(&'static str, Probe)]) -> Response {
    let mut checks = serde_json::Map::new();
    let mut ready = true;
    for (name, probe) in probes {
        let outcome = tokio::time::timeout(Duration::from_secs(2), probe()).await;
        let status = match outcome {
            Ok(Ok(())) => "ok".to_owned(),
            Ok(Err(err)) => {
                ready = false;
                tracing::warn!(dependency = name, error = %err, "readiness probe failed");
                "unreachable".to_owned()
            }
            Err(_) => {
                ready = false;
                tracing::warn!(dependency = name, "readiness probe timed out");
                "timeout".to_owned()
            }
        };
        checks.insert((*name).to_owned(), serde_json::Value::String(status));
    }
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body =
        serde_json::json!({"status": if ready { "ready" } else { "not_ready" }, "checks": checks});
    (status, axum::Json(body)).into_response()
}

/// 404 in the shared envelope for every unknown route.
pub async fn fallback() -> ErrorResponse {
    ErrorResponse::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, "no such route")
}

/// The server span of a request, `platform.http.request` (`otel.name` `<method> <route>`), a
/// child of the trace context the client sent, if any. It names the path, never the query: a
/// download link's signature is in it. The route is the matched template, so span names stay
/// few whatever the ids in paths.
fn request_span(request: &axum::http::Request<axum::body::Body>) -> tracing::Span {
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(axum::extract::MatchedPath::as_str);
    let method = request.method();
    let span = tracing::info_span!(
        "platform.http.request",
        otel.name = %route.map_or_else(|| method.to_string(), |route| format!("{method} {route}")),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = %method,
        http.route = route,
        url.path = %request.uri().path(),
        http.response.status_code = tracing::field::Empty,
    );
    crate::telemetry::adopt_http_parent(&span, request.headers());
    span
}

/// Records the answer's status on the request's span; a 5xx marks it failed.
fn record_status(response: &Response, _latency: Duration, span: &tracing::Span) {
    let status = response.status();
    // As i64: OpenTelemetry's integer attribute (other integer types are exported as strings).
    span.record("http.response.status_code", i64::from(status.as_u16()));
    if status.is_server_error() {
        span.record("otel.status_code", "error");
    }
}

/// Serves `router` on `listener` until `shutdown` is cancelled, then drains in-flight requests.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_on(
        listener.tap_io(|tcp| no_delay(tcp)),
        layered(router),
        shutdown,
    )
    .await
}

/// As [`serve`], for a service of long-lived event streams: a connection whose first request asks
/// for one is answered without hyper's per-connection buffers (`crate::stream_server`), the
/// others by hyper as in [`serve`]. Returns once both have drained; the streams themselves must
/// end on `shutdown` (the router's bodies watch it).
pub async fn serve_event_streams(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = layered(router);
    let streams = tokio_util::task::TaskTracker::new();
    let sorted =
        crate::stream_server::sort(listener, app.clone(), streams.clone(), shutdown.clone())?;
    let served = serve_on(sorted, app, shutdown).await;
    streams.close();
    streams.wait().await;
    served
}

/// hyper's side of both: serves `app` on what `listener` accepts until `shutdown`, then drains.
async fn serve_on<L>(listener: L, app: Router, shutdown: CancellationToken) -> std::io::Result<()>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    // `into_make_service`: a connection gets a clone of the router (one `Arc`); serving a bare
    // `Router` rebuilds every route's service stack per connection (`with_state`), ~110 KiB that
    // a long-lived stream then holds (BENCHMARKS.md, section 5).
    axum::serve(listener, app.into_make_service())
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

/// Small writes (SSE events, WebSocket frames) go out at once, not after Nagle's delay.
pub(crate) fn no_delay(tcp: &tokio::net::TcpStream) {
    if let Err(err) = tcp.set_nodelay(true) {
        tracing::debug!(error = %err, "cannot set TCP_NODELAY");
    }
}

/// `router` with what every request goes through: the 404 fallback, metrics, request ids and the
/// request's span.
fn layered(router: Router) -> Router {
    let x_request_id = HeaderName::from_static("x-request-id");
    router
        .fallback(fallback)
        .layer(axum::middleware::from_fn(crate::metrics::track))
        .layer(PropagateRequestIdLayer::new(x_request_id.clone()))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_response(record_status),
        )
        .layer(SetRequestIdLayer::new(x_request_id, MakeRequestUuid))
}

/// Whether a request's `Accept` asks for an event stream (`text/event-stream`, in any of its
/// values, parameters aside).
pub fn accepts_event_stream(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get_all(axum::http::header::ACCEPT)
        .iter()
        .any(names_event_stream)
}

/// Whether one `Accept` value names `text/event-stream`.
pub(crate) fn names_event_stream(accept: &HeaderValue) -> bool {
    accept.to_str().is_ok_and(|accept| {
        accept.split(',').any(|media| {
            media
                .split(';')
                .next()
                .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/event-stream"))
        })
    })
}
