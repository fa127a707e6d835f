//! NATS and JetStream: connection, the streams every service relies on, and trace headers.

use std::time::Duration;

use anyhow::Context as _;
use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream};
use opentelemetry::propagation::{Extractor, Injector};
use protocol::messaging::{MSG_ID_HEADER, Names};

use crate::http::Probe;

/// NATS settings.
#[derive(Debug, Clone)]
pub struct NatsConfig {
    /// Server URL.
    pub url: String,
    /// Stream and subject names of this deployment.
    pub names: Names,
}

/// How long accepted runs are kept.
const RUNS_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long run events are kept for replay and resume.
const RUN_EVENTS_MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// Window in which JetStream drops a message whose `Nats-Msg-Id` it has already stored.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// Connects to NATS and returns the client and its JetStream context.
pub async fn connect(
    config: &NatsConfig,
    name: &str,
) -> anyhow::Result<(async_nats::Client, jetstream::Context)> {
    let client = async_nats::ConnectOptions::new()
        .name(name)
        .retry_on_initial_connect()
        .connection_timeout(Duration::from_secs(5))
        .connect(&config.url)
        .await
        .with_context(|| format!("cannot connect to NATS at {}", config.url))?;
    let js = jetstream::new(client.clone());
    Ok((client, js))
}

/// Creates the RUNS and RUN_EVENTS streams if they do not exist. Safe to call from every replica.
pub async fn ensure_streams(js: &jetstream::Context, names: &Names) -> anyhow::Result<()> {
    for (name, subjects, max_age) in [
        (names.runs_stream(), names.runs_subjects(), RUNS_MAX_AGE),
        (
            names.run_events_stream(),
            names.run_events_subjects(),
            RUN_EVENTS_MAX_AGE,
        ),
    ] {
        js.get_or_create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subjects],
            retention: stream::RetentionPolicy::Limits,
            storage: stream::StorageType::File,
            max_age,
            duplicate_window: DUPLICATE_WINDOW,
            ..Default::default()
        })
        .await
        .with_context(|| format!("cannot create stream {name}"))?;
    }
    Ok(())
}

/// Headers for a JetStream publish: the de-duplication id and the current trace context.
pub fn publish_headers(msg_id: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(MSG_ID_HEADER, msg_id);
    crate::telemetry::inject_current(&mut HeaderInjector(&mut headers));
    headers
}

/// Writes trace context into NATS headers.
pub struct HeaderInjector<'a>(pub &'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key, value.as_str());
    }
}

/// Reads trace context from NATS headers.
pub struct HeaderExtractor<'a>(pub &'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|v| v.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(k, _)| k.as_ref()).collect()
    }
}

/// Readiness probe: the server answers and JetStream is enabled.
pub fn probe(js: jetstream::Context) -> Probe {
    std::sync::Arc::new(move || {
        let js = js.clone();
        Box::pin(async move {
            js.query_account()
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    })
}
