//! NATS request/reply that keeps one trace across services.
//!
//! [`request`] is the caller's side: it sends the request in a client span and puts that span's
//! W3C trace context (`traceparent`) into the request's headers. [`adopt`] is the responder's
//! side: it makes the span that handles a request a child of the caller's. So a run's trace
//! goes on through every hop (runs -> attachments, worker -> history, ...) instead of starting
//! over at each responder. Retries stay with the callers: each attempt is one [`request`], one
//! client span.

use std::time::Duration;

use async_nats::client::RequestErrorKind;
use async_nats::{HeaderMap, Message};
use bytes::Bytes;
use tracing::Instrument as _;

use crate::nats::HeaderInjector;

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// Nothing listens on the subject (no replica of the responder is up).
    #[error("no service answers {subject}")]
    NoResponders {
        /// The request's subject.
        subject: String,
    },
    /// The responder did not answer within the timeout.
    #[error("{subject} did not answer within {timeout:?}")]
    TimedOut {
        /// The request's subject.
        subject: String,
        /// How long the caller waited.
        timeout: Duration,
    },
    /// The request could not be sent or its answer not received.
    #[error("request on {subject} failed: {source}")]
    Failed {
        /// The request's subject.
        subject: String,
        /// What NATS said.
        source: async_nats::RequestError,
    },
}

/// Sends `payload` on `subject` and waits at most `timeout` for the answer, in a client span
/// (`otel.name` `request <subject>`) whose trace context travels in the request's headers.
pub async fn request(
    client: &async_nats::Client,
    subject: String,
    payload: Bytes,
    timeout: Duration,
) -> Result<Message, RpcError> {
    let span = tracing::info_span!(
        "platform.rpc.request",
        otel.name = %format!("request {subject}"),
        otel.kind = "client",
        messaging.system = "nats",
        messaging.destination.name = %subject,
    );
    async move {
        let mut headers = HeaderMap::new();
        crate::telemetry::inject_current(&mut HeaderInjector(&mut headers));
        let request = async_nats::Request::new()
            .payload(payload)
            .headers(headers)
            .timeout(Some(timeout));
        // The whole call is bounded, sending included, as a `tokio::time::timeout` around
        // `Client::request` was before this helper.
        // The one place that sends a request (clippy.toml's disallowed-methods sends the others
        // here).
        #[expect(
            clippy::disallowed_methods,
            reason = "this is the helper the others use"
        )]
        let sent = client.send_request(subject.clone(), request);
        match tokio::time::timeout(timeout, sent).await {
            Ok(Ok(message)) => Ok(message),
            Err(_) => Err(RpcError::TimedOut { subject, timeout }),
            Ok(Err(err)) => Err(match err.kind() {
                RequestErrorKind::TimedOut => RpcError::TimedOut { subject, timeout },
                RequestErrorKind::NoResponders => RpcError::NoResponders { subject },
                _ => RpcError::Failed {
                    subject,
                    source: err,
                },
            }),
        }
    }
    .instrument(span)
    .await
}

/// Asks on `subject` until `decode` accepts an answer (`Ok(Some(_))`), for at most `within`: a
/// request that times out or finds no responder, or an answer `decode` says is not ready yet
/// (`Ok(None)`: history still behind, say), is asked again after a pause (20 ms, doubling to
/// 500 ms). An error of `decode` (an answer that cannot be read) ends the asking. `None` once
/// `within` is spent. Each attempt is one [`request`].
pub async fn request_until<T>(
    client: &async_nats::Client,
    subject: String,
    payload: Bytes,
    timeout: Duration,
    within: Duration,
    mut decode: impl FnMut(&[u8]) -> anyhow::Result<Option<T>>,
) -> anyhow::Result<Option<T>> {
    let give_up = tokio::time::Instant::now() + within;
    let mut pause = Duration::from_millis(20);
    loop {
        match request(client, subject.clone(), payload.clone(), timeout).await {
            Ok(reply) => {
                if let Some(answer) = decode(&reply.payload)? {
                    return Ok(Some(answer));
                }
            }
            Err(err) => tracing::debug!(error = %err, "no answer yet"),
        }
        if tokio::time::Instant::now() + pause >= give_up {
            return Ok(None);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// Makes `span`, the responder's span for `message`, a child of the caller's span (the trace
/// context in the request's headers); a request without one leaves `span` a root.
pub fn adopt(span: &tracing::Span, message: &Message) {
    crate::telemetry::adopt_message_parent(span, message);
}
