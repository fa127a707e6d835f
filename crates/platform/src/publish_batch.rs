//! JetStream publishes of concurrent requests, sent to NATS together.
//!
//! A request that publishes by itself has the connection write its one message: the NATS
//! connection's task is woken by the publish and the scheduler runs it as soon as the request
//! waits for its ack. At thousands of runs a second the broker then reads and is woken once per
//! message, and spent twice the CPU per run of a loop publishing 16 at a time (BENCHMARKS.md
//! sections 21 and 22). A [`Batcher`] hands the publishes to one task, which lets the requests
//! that are ready run up to their own publish first (one [`tokio::task::yield_now`]) and then
//! sends all that came meanwhile, without waiting between them: the connection writes them in one
//! go and the broker reads them in one read. A request alone waits that one turn of the
//! scheduler longer; nothing waits on a timer.

use async_nats::HeaderMap;
use async_nats::jetstream::{self, context::PublishAckFuture, context::PublishError};
use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

/// The most publishes sent in one batch (and queued for the task before a request waits).
const BATCH: usize = 256;

/// Publishes to JetStream through one task that sends the publishes reaching it together.
/// Cheap to clone; the task ends with the last clone.
#[derive(Clone, Debug)]
pub struct Batcher {
    queue: mpsc::Sender<Queued>,
}

struct Queued {
    subject: async_nats::Subject,
    headers: HeaderMap,
    payload: Bytes,
    sent: oneshot::Sender<Result<PublishAckFuture, PublishError>>,
}

impl Batcher {
    /// Starts the task that publishes with `js` (on the current Tokio runtime).
    pub fn start(js: jetstream::Context) -> Self {
        let (queue, queued) = mpsc::channel(BATCH);
        tokio::spawn(send_batches(js, queued));
        Self { queue }
    }

    /// Publishes like [`jetstream::Context::publish_with_headers`] and waits for JetStream's
    /// ack, with the context's timeouts.
    pub async fn publish(
        &self,
        subject: async_nats::Subject,
        headers: HeaderMap,
        payload: Bytes,
    ) -> anyhow::Result<jetstream::publish::PublishAck> {
        let (sent, was_sent) = oneshot::channel();
        self.queue
            .send(Queued {
                subject,
                headers,
                payload,
                sent,
            })
            .await
            .map_err(stopped)?;
        let ack = was_sent.await.map_err(stopped)??;
        Ok(ack.await?)
    }
}

/// What a publish answers once the task is gone (its queue or its answer dropped).
fn stopped<E>(_: E) -> anyhow::Error {
    anyhow::anyhow!("the JetStream publisher has stopped")
}

/// The task: waits for a publish, lets the other ready requests queue theirs, sends them all.
async fn send_batches(js: jetstream::Context, mut queued: mpsc::Receiver<Queued>) {
    // The counters are registered once, with the process's recorder (installed on first use:
    // a service may build its acceptor before its metrics layer).
    crate::metrics::handle();
    let batches = metrics::counter!("switchboard_nats_publish_batches_total");
    let batched = metrics::counter!("switchboard_nats_batched_publishes_total");
    let mut batch = Vec::with_capacity(BATCH);
    while queued.recv_many(&mut batch, BATCH).await > 0 {
        tokio::task::yield_now().await;
        while batch.len() < BATCH
            && let Ok(more) = queued.try_recv()
        {
            batch.push(more);
        }
        batches.increment(1);
        batched.increment(u64::try_from(batch.len()).unwrap_or(u64::MAX));
        // Sent side by side: with room in the connection's queue each send is done at its first
        // poll (one pass, no wait between them); without (a reconnect), they wait out their
        // timeouts together rather than one after the other.
        futures::future::join_all(batch.drain(..).map(|publish| {
            let js = &js;
            async move {
                let sent = js
                    .publish_with_headers(publish.subject, publish.headers, publish.payload)
                    .await;
                // The request may have gone (its client left): the run is published regardless,
                // as it would have been had the request sent it itself.
                let _ = publish.sent.send(sent);
            }
        }))
        .await;
    }
}
