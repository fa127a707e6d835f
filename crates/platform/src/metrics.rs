//! Prometheus metrics: one recorder per process (the `metrics` facade and its Prometheus
//! exporter), `/metrics` on every service's port, and the HTTP layer that counts requests by
//! route and status with latency histograms. Services record their own with the `metrics`
//! macros; the names are listed in docs/fleet.md ("Metrics").
//!
//! The worker's model calls follow OpenTelemetry's GenAI conventions, in Prometheus spelling:
//! `gen_ai_client_token_usage{gen_ai_token_type="input"|"output", gen_ai_operation_name,
//! gen_ai_provider_name, gen_ai_request_model}` (tokens per call, as the model reported them),
//! `gen_ai_client_operation_duration_seconds` (a call, request to the stream's end) and
//! `switchboard_model_time_to_first_token_seconds` (request to the first streamed text or
//! tool-call chunk, as the worker sees it: the model's time to first token plus the network;
//! not the server-side `gen_ai.server.time_to_first_token`), with the same labels but the token
//! type.

use std::collections::HashMap;
use std::sync::{OnceLock, RwLock};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Latency buckets (seconds) of every `*_seconds` histogram: 1 ms to 60 s.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Buckets of `gen_ai_client_token_usage` (tokens): OpenTelemetry's advice, 1 to 4^12.
const TOKEN_BUCKETS: &[f64] = &[
    1.0,
    4.0,
    16.0,
    64.0,
    256.0,
    1024.0,
    4096.0,
    16384.0,
    65536.0,
    262_144.0,
    1_048_576.0,
    4_194_304.0,
    16_777_216.0,
];

/// Buckets (seconds) of the model-call histograms: OpenTelemetry's advice for GenAI durations,
/// 10 ms doubling up to 5.5 minutes (a streamed answer can outlast [`BUCKETS`]' 60 s).
const MODEL_BUCKETS: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92, 163.84,
    327.68,
];

/// The process's recorder, installed on first use. Several services in one process (the
/// system tests) share it.
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        // Fails only for an empty bucket list; then histograms are rendered as summaries.
        // A full name wins over the suffix (the exporter tries full names first).
        let model = |name: &str| Matcher::Full(name.to_owned());
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), BUCKETS)
            .and_then(|b| {
                b.set_buckets_for_metric(model("gen_ai_client_token_usage"), TOKEN_BUCKETS)
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    model("gen_ai_client_operation_duration_seconds"),
                    MODEL_BUCKETS,
                )
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    model("switchboard_model_time_to_first_token_seconds"),
                    MODEL_BUCKETS,
                )
            })
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
/// the raw path, and a method outside HTTP's standard ones is `other`, so the label set stays
/// bounded whatever clients send. The handles are registered once per label set and kept
/// ([`RouteMetrics`]): a request records into them without allocating.
pub async fn track(request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().cloned();
    let method = method_label(request.method());
    let started = Instant::now();
    let response = next.run(request).await;
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    RouteMetrics::record(route, method, response.status().as_u16(), started.elapsed());
    response
}

/// The `method` label: the standard methods by name, anything else `other`.
fn method_label(method: &Method) -> &'static str {
    const STANDARD: [Method; 9] = [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
        Method::HEAD,
        Method::OPTIONS,
        Method::CONNECT,
        Method::TRACE,
    ];
    STANDARD
        .iter()
        .find(|standard| *standard == method)
        .map_or("other", Method::as_str)
}

/// The HTTP metric handles of one route, by method (and status).
#[derive(Default)]
struct RouteMetrics {
    duration: Vec<(&'static str, metrics::Histogram)>,
    requests: Vec<(&'static str, u16, metrics::Counter)>,
}

impl RouteMetrics {
    fn record(route: &str, method: &'static str, status: u16, took: Duration) {
        static ROUTES: OnceLock<RwLock<HashMap<String, RouteMetrics>>> = OnceLock::new();
        let routes = ROUTES.get_or_init(RwLock::default);
        if let Ok(known) = routes.read()
            && let Some(handles) = known.get(route)
            && handles.try_record(method, status, took)
        {
            return;
        }
        // First time for this label set: register its handles, then record.
        let Ok(mut known) = routes.write() else {
            return;
        };
        let handles = known.entry(route.to_owned()).or_default();
        if !handles.duration.iter().any(|(m, _)| *m == method) {
            let histogram = metrics::histogram!(
                "http_request_duration_seconds",
                "route" => route.to_owned(),
                "method" => method
            );
            handles.duration.push((method, histogram));
        }
        if !handles
            .requests
            .iter()
            .any(|(m, s, _)| *m == method && *s == status)
        {
            let counter = metrics::counter!(
                "http_requests_total",
                "route" => route.to_owned(),
                "method" => method,
                "status" => status.to_string()
            );
            handles.requests.push((method, status, counter));
        }
        handles.try_record(method, status, took);
    }

    /// Records into the handles of `(method, status)`; `false` if they are not registered yet.
    fn try_record(&self, method: &'static str, status: u16, took: Duration) -> bool {
        let duration = self.duration.iter().find(|(m, _)| *m == method);
        let requests = self
            .requests
            .iter()
            .find(|(m, s, _)| *m == method && *s == status);
        let (Some((_, duration)), Some((_, _, requests))) = (duration, requests) else {
            return false;
        };
        duration.record(took.as_secs_f64());
        requests.increment(1);
        true
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_histograms_have_their_own_buckets() {
        let handle = handle();
        let labels = [("gen_ai_request_model", "bucket-test-model")];
        metrics::histogram!("gen_ai_client_token_usage", &labels).record(300.0);
        metrics::histogram!("gen_ai_client_operation_duration_seconds", &labels).record(90.0);
        let text = handle.render();
        let has = |name: &str, le: &str| {
            text.lines().any(|line| {
                line.starts_with(name)
                    && line.contains("bucket-test-model")
                    && line.contains(&format!("le=\"{le}\""))
            })
        };
        assert!(
            has("gen_ai_client_token_usage_bucket", "1024"),
            "token buckets:\n{text}"
        );
        assert!(
            has("gen_ai_client_operation_duration_seconds_bucket", "163.84"),
            "model call buckets beyond 60 s:\n{text}"
        );
    }

    #[test]
    fn a_non_standard_method_is_labelled_other() {
        assert_eq!(method_label(&Method::POST), "POST");
        assert_eq!(method_label(&Method::OPTIONS), "OPTIONS");
        let custom = Method::from_bytes(b"BREW").unwrap();
        assert_eq!(method_label(&custom), "other");
    }

    #[test]
    fn each_request_is_counted_under_its_route_method_and_status() {
        let handle = handle();
        let route = "/test/metrics/{id}";
        for status in [202, 202, 409] {
            RouteMetrics::record(route, "POST", status, Duration::from_millis(3));
        }
        let text = handle.render();
        let count = |status: &str| {
            text.lines()
                .find(|line| {
                    line.starts_with("http_requests_total")
                        && line.contains(route)
                        && line.contains(&format!("status=\"{status}\""))
                })
                .and_then(|line| line.rsplit(' ').next())
                .map(str::to_owned)
        };
        assert_eq!(count("202").as_deref(), Some("2"));
        assert_eq!(count("409").as_deref(), Some("1"));
        assert!(
            text.lines().any(
                |line| line.starts_with("http_request_duration_seconds_count")
                    && line.contains(route)
                    && line.ends_with(" 3")
            ),
            "three durations recorded:\n{text}"
        );
    }
}
