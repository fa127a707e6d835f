//! JSON logs through `tracing`, and OpenTelemetry traces exported over OTLP when configured.
//!
//! A tracer provider is always installed, so spans carry real W3C trace ids (propagated in NATS
//! headers and shown to clients) even when nothing is exported.

use std::str::FromStr;

use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
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
    let otel = tracing_opentelemetry::layer().with_tracer(provider.tracer(config.service));
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter).with(otel);
    match config.log_format {
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false),
            )
            .try_init()?,
        LogFormat::Pretty => registry.with(tracing_subscriber::fmt::layer()).try_init()?,
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
