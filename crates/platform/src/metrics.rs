//! Prometheus metrics: one recorder per process (the `metrics` facade and its Prometheus
//! exporter), `/metrics` on every service's port, and the HTTP layer that counts requests by
//! route and status with latency histograms. Services record their own with the `metrics`
//! macros; the names are listed in the README ("Metrics").

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Latency buckets (seconds) of every `*_seconds` histogram: 1 ms to 60 s.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The process's recorder, installed on first use. Several services in one process (the
/// system tests) share it.
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        // Fails only for an empty bucket list; then histograms are rendered as summaries.
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), BUCKETS)
            .unwrap_or_else(|_| PrometheusBuilder::new())
            .build_recorder();
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!("a metrics recorder was installed before; /metrics stays empty");
        }
        // Histograms keep their samples until upkeep folds them into buckets: bounded memory
        // whether or not anything scrapes.
        let upkeep = handle.clone();
        let started = std::thread::Builder::new()
            .name("metrics-upkeep".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(Duration::from_secs(5));
                    upkeep.run_upkeep();
                }
            });
        if let Err(err) = started {
            tracing::warn!(error = %err, "no metrics upkeep thread; /metrics does it per scrape");
        }
        handle
    })
}

/// `GET /metrics`: the Prometheus text format.
pub async fn render() -> Response {
    let handle = handle();
    handle.run_upkeep();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    )
        .into_response()
}

/// Middleware: `http_requests_total{route, method, status}` and
/// `http_request_duration_seconds{route, method}` (to the response head; a stream's life is
/// not its latency). `route` is the matched template (`/api/v1/agent/runs/{run_id}`), never
/// the raw path, so the label set stays bounded.
pub async fn track(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    let method = request.method().as_str().to_owned();
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::histogram!(
        "http_request_duration_seconds",
        "route" => route.clone(),
        "method" => method.clone()
    )
    .record(started.elapsed().as_secs_f64());
    metrics::counter!(
        "http_requests_total",
        "route" => route,
        "method" => method,
        "status" => status
    )
    .increment(1);
    response
}

/// A gauge that is incremented while the value lives: an open stream, a run in flight.
#[derive(Debug)]
pub struct GaugeGuard(metrics::Gauge);

impl GaugeGuard {
    /// Increments `gauge` until the guard is dropped.
    pub fn new(gauge: metrics::Gauge) -> Self {
        gauge.increment(1.0);
        Self(gauge)
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// Every `every`, until `shutdown`, sets `switchboard_consumer_pending_messages{consumer}`
/// (messages not yet delivered: the lag) and `switchboard_consumer_ack_pending{consumer}`
/// (delivered, not yet acknowledged) from the durable consumer's info.
pub fn watch_consumer_lag(
    consumer: async_nats::jetstream::consumer::Consumer<
        async_nats::jetstream::consumer::pull::Config,
    >,
    name: &'static str,
    every: Duration,
    shutdown: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut consumer = consumer;
        let pending = metrics::gauge!("switchboard_consumer_pending_messages", "consumer" => name);
        let ack_pending = metrics::gauge!("switchboard_consumer_ack_pending", "consumer" => name);
        loop {
            match consumer.info().await {
                #[expect(clippy::cast_precision_loss, reason = "a gauge is an f64")]
                Ok(info) => {
                    pending.set(info.num_pending as f64);
                    ack_pending.set(info.num_ack_pending as f64);
                }
                Err(err) => tracing::debug!(error = %err, consumer = name, "consumer info failed"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
        }
    })
}
