//! JSON logs through `tracing`, and OpenTelemetry traces exported over OTLP when configured.
//!
//! A tracer provider is always installed, so spans carry real W3C trace ids (propagated in NATS
//! and HTTP headers and shown to clients) even when nothing is exported. Traces take the
//! INFO spans of our own crates whatever `RUST_LOG` says: that filter is the logs' only, so quiet
//! logs do not cut a trace into pieces.

use std::str::FromStr;

use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::{Layer as _, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// How logs are written to stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object per line (deployments).
    Json,
    /// Human-readable lines (local debugging).
    Pretty,
}

impl FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "json" => Ok(Self::Json),
            "pretty" => Ok(Self::Pretty),
            other => Err(format!("{other:?} is not a log format; use json or pretty")),
        }
    }
}

/// Telemetry settings.
#[derive(Debug, Clone)]
pub struct TelemetryConfig {
    /// `service.name` of every span.
    pub service: &'static str,
    /// Log line format.
    pub log_format: LogFormat,
    /// OTLP/HTTP endpoint; traces are exported only when set.
    pub otlp_endpoint: Option<String>,
}

/// Flushes and stops telemetry when the process ends.
#[derive(Debug)]
pub struct TelemetryGuard {
    provider: SdkTracerProvider,
}

impl TelemetryGuard {
    /// Flushes pending spans. Call last, after everything else has stopped.
    pub fn shutdown(self) {
        if let Err(err) = self.provider.shutdown() {
            tracing::warn!(error = %err, "telemetry did not flush cleanly");
        }
    }
}

/// Installs the global subscriber and tracer provider. Call once, from `main`.
pub fn init(config: &TelemetryConfig) -> anyhow::Result<TelemetryGuard> {
    let resource = Resource::builder()
        .with_service_name(config.service)
        .build();
    let mut builder = SdkTracerProvider::builder().with_resource(resource);
    if let Some(endpoint) = &config.otlp_endpoint {
        use opentelemetry_otlp::WithExportConfig;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
            .build()?;
        builder = builder.with_batch_exporter(exporter);
    }
    let provider = builder.build();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    opentelemetry::global::set_tracer_provider(provider.clone());
    // Spans (and the events in them) of the `switchboard_*` crates at INFO, of others at WARN.
    let traced = Targets::new()
        .with_target("switchboard", LevelFilter::INFO)
        .with_default(LevelFilter::WARN);
    // Nothing here reads OpenTelemetry's active context (trace ids and propagation go through
    // the span, `OpenTelemetrySpanExt`), and the busy/idle times of a span are not exported
    // anywhere we look: both would cost two clock reads and a lock on every enter and exit, which
    // an event stream's span sees once per event (section 21 of BENCHMARKS.md).
    let otel = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer(config.service))
        .with_context_activation(false)
        .with_tracked_inactivity(false)
        .with_filter(traced);
    let logged = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(otel);
    match config.log_format {
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_filter(logged),
            )
            .try_init()?,
        LogFormat::Pretty => registry
            .with(tracing_subscriber::fmt::layer().with_filter(logged))
            .try_init()?,
    }
    Ok(TelemetryGuard { provider })
}

/// The W3C trace id of the current span, if it has one.
pub fn current_trace_id() -> Option<String> {
    use opentelemetry::trace::TraceContextExt;
    let context = tracing::Span::current().context();
    let span = context.span();
    let span_context = span.span_context();
    span_context
        .is_valid()
        .then(|| span_context.trace_id().to_string())
}

/// Writes the current span's trace context into `carrier` (for NATS headers).
pub fn inject_current(carrier: &mut dyn Injector) {
    let context = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&context, carrier));
}

/// Makes `span` a child of the trace context found in `carrier`.
pub fn adopt_parent(span: &tracing::Span, carrier: &dyn Extractor) {
    let parent = opentelemetry::global::get_text_map_propagator(|p| p.extract(carrier));
    if let Err(err) = span.set_parent(parent) {
        tracing::debug!(error = %err, "span parent not set");
    }
}

/// Writes the current span's trace context into the headers of an outgoing HTTP request (to a
/// model API, a remote agent).
pub fn inject_current_http(headers: &mut axum::http::HeaderMap) {
    inject_current(&mut HttpInjector(headers));
}

/// Makes `span` a child of the trace context an incoming HTTP request carries, if any.
pub fn adopt_http_parent(span: &tracing::Span, headers: &axum::http::HeaderMap) {
    adopt_parent(span, &HttpExtractor(headers));
}

/// Writes trace context into HTTP headers.
struct HttpInjector<'a>(&'a mut axum::http::HeaderMap);

impl Injector for HttpInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            axum::http::HeaderName::from_bytes(key.as_bytes()),
            axum::http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// Reads trace context from HTTP headers.
struct HttpExtractor<'a>(&'a axum::http::HeaderMap);

impl Extractor for HttpExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(axum::http::HeaderName::as_str).collect()
    }
}

/// Makes `span` a child of the trace context in `message`'s NATS headers, if it has any.
pub fn adopt_message_parent(span: &tracing::Span, message: &async_nats::Message) {
    if let Some(headers) = &message.headers {
        adopt_parent(span, &crate::nats::HeaderExtractor(headers));
    }
}
