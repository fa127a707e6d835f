//! The request/reply loop of history's NATS endpoints: requests of one subject, in the service's
//! queue group (one replica answers each), a bounded number at once, until shutdown.

use futures::StreamExt;
use protocol::messaging::{HISTORY_QUEUE, Names};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

/// Requests answered at once per replica, per endpoint.
const CONCURRENCY: usize = 32;

/// Answers every request on `subject` with what `answer` makes of it. An undecodable request or
/// an `Err` gets no answer (logged): the caller times out, and never waits on a wrong answer. A
/// request whose reply subject is not the inbox of a service allowed to call the endpoint
/// ([`platform::nats_auth::reply_from_caller`]) is not answered either. Each request is handled
/// in a span made by `span`, a child of the caller's ([`platform::rpc::adopt`]).
pub(crate) async fn serve<Req, Rep, F, Fut>(
    client: async_nats::Client,
    names: &Names,
    subject: String,
    shutdown: CancellationToken,
    span: fn() -> tracing::Span,
    answer: F,
) -> anyhow::Result<()>
where
    Req: DeserializeOwned,
    Rep: Serialize,
    F: Fn(Req) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Rep>>,
{
    let requests = client
        .queue_subscribe(subject.clone(), HISTORY_QUEUE.to_owned())
        .await?;
    requests
        .take_until(shutdown.cancelled_owned())
        .for_each_concurrent(CONCURRENCY, |message| {
            let (client, answer, subject) = (&client, &answer, &subject);
            let span = span();
            platform::rpc::adopt(&span, &message);
            async move {
                let Some(reply) = message.reply else {
                    return;
                };
                if !platform::nats_auth::reply_from_caller(names, subject, &reply) {
                    metrics::counter!("switchboard_nats_requests_refused_total", "endpoint" => subject.clone())
                        .increment(1);
                    tracing::warn!(%subject, reply = %reply, "request whose reply is no caller's inbox ignored");
                    return;
                }
                let Ok(request) = serde_json::from_slice::<Req>(&message.payload) else {
                    tracing::warn!(%subject, "undecodable request ignored");
                    return;
                };
                let reply_body = match answer(request).await {
                    Ok(body) => body,
                    Err(err) => {
                        tracing::warn!(%subject, error = format!("{err:#}"), "request not answered");
                        return;
                    }
                };
                if let Ok(payload) = serde_json::to_vec(&reply_body)
                    && let Err(err) = client.publish(reply, payload.into()).await
                {
                    tracing::warn!(%subject, error = %err, "cannot answer a request");
                }
            }
            .instrument(span)
        })
        .await;
    Ok(())
}
