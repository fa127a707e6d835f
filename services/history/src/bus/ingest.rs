//! The two durable consumers that write history: accepted runs (user messages) and run
//! events (the agent's messages). Each acks only after its transaction commits; every handler is
//! idempotent, so redelivery after a crash or restart writes nothing twice.

use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, AckKind, consumer::pull, stream::Stream};
use futures::StreamExt;
use protocol::messaging::{
    HISTORY_EVENTS_CONSUMER, HISTORY_RUNS_CONSUMER, Names, RunEventMessage, RunTask,
};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::store::{self, Outcome};

/// Delay before a message whose prerequisite is not written yet comes back.
const NOT_YET_DELAY: Duration = Duration::from_millis(100);
/// Delay before a message that failed on a database error comes back.
const RETRY_DELAY: Duration = Duration::from_secs(1);

/// A durable pull consumer of one of the two streams.
pub(crate) type PullConsumer = jetstream::consumer::Consumer<pull::Config>;

pub(crate) struct Ingest {
    runs: PullConsumer,
    events: PullConsumer,
    /// The two streams, from which a message of an erased run is removed as it is dropped.
    runs_stream: Stream,
    events_stream: Stream,
    pool: PgPool,
}

async fn durable(
    js: &jetstream::Context,
    stream: String,
    name: &str,
) -> anyhow::Result<PullConsumer> {
    // Retried while a cluster settles (a consumer's creation waits for the stream's leader, and
    // right after a cluster starts, or under load, that can take longer than one request's wait).
    let stream = &stream;
    platform::nats::settled(&format!("consumer {name}"), || {
        durable_once(js, stream, name)
    })
    .await
}

async fn durable_once(
    js: &jetstream::Context,
    stream: &str,
    name: &str,
) -> anyhow::Result<PullConsumer> {
    js.get_stream(stream)
        .await
        .with_context(|| format!("stream {stream} missing"))?
        .get_or_create_consumer(
            name,
            pull::Config {
                durable_name: Some(name.to_owned()),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                ..Default::default()
            },
        )
        .await
        .with_context(|| format!("cannot create consumer {name}"))
}

impl Ingest {
    pub(crate) async fn new(
        js: &jetstream::Context,
        names: &Names,
        pool: PgPool,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            runs: durable(js, names.runs_stream(), HISTORY_RUNS_CONSUMER).await?,
            events: durable(js, names.run_events_stream(), HISTORY_EVENTS_CONSUMER).await?,
            runs_stream: js.get_stream(names.runs_stream()).await?,
            events_stream: js.get_stream(names.run_events_stream()).await?,
            pool,
        })
    }

    /// The RUNS consumer (its ack floor tells how far runs are written).
    pub(crate) fn runs_consumer(&self) -> PullConsumer {
        self.runs.clone()
    }

    /// Consumes both streams until `shutdown`; what an owner keeps is written to
    /// `owner_budgets` as each run ends (`platform::kept`).
    pub(crate) async fn run(
        self,
        owner_budgets: platform::nats::JsonKv,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        let owner_budgets = &owner_budgets;
        let lag = [
            (self.runs.clone(), HISTORY_RUNS_CONSUMER),
            (self.events.clone(), HISTORY_EVENTS_CONSUMER),
        ]
        .map(|(consumer, name)| {
            platform::metrics::watch_consumer_lag(
                consumer,
                name,
                Duration::from_secs(5),
                shutdown.clone(),
            )
        });
        let pool = &self.pool;
        // A run's acceptance and its end are spans of the run's trace (its messages carry the
        // context); the events between are not (one span per streamed delta would bury it).
        let runs = consume(
            &self.runs,
            &self.runs_stream,
            shutdown.clone(),
            |message, seq| async move {
                match serde_json::from_slice::<RunTask>(&message.payload) {
                    Ok(RunTask::V1(task)) => {
                        let span =
                            tracing::info_span!("history.ingest.run", task.id = %task.task_id);
                        platform::telemetry::adopt_message_parent(&span, &message);
                        Handled::from(
                            store::record_accepted_run(pool, &task, seq)
                                .instrument(span)
                                .await,
                        )
                    }
                    Err(err) => Handled::Undecodable(err),
                }
            },
        );
        let events = consume(
            &self.events,
            &self.events_stream,
            shutdown,
            |message, _| async move {
                match serde_json::from_slice::<RunEventMessage>(&message.payload) {
                    Ok(RunEventMessage::V1(event)) if event.event.is_terminal() => {
                        let span =
                            tracing::info_span!("history.ingest.run_end", task.id = %event.task_id);
                        platform::telemetry::adopt_message_parent(&span, &message);
                        let applied = store::apply_event(pool, &event).instrument(span).await;
                        if let Ok(Outcome::Ended { kept }) = applied {
                            let kept = u64::try_from(kept).unwrap_or(0);
                            platform::kept::report(owner_budgets, &event.owner, kept).await;
                        }
                        Handled::from(applied)
                    }
                    Ok(RunEventMessage::V1(event)) => {
                        Handled::from(store::apply_event(pool, &event).await)
                    }
                    Err(err) => Handled::Undecodable(err),
                }
            },
        );
        let (runs, events) = tokio::join!(runs, events);
        lag.iter().for_each(tokio::task::JoinHandle::abort);
        runs.and(events)
    }
}

enum Handled {
    Done(Outcome),
    Failed(sqlx::Error),
    Undecodable(serde_json::Error),
}

impl From<sqlx::Result<Outcome>> for Handled {
    fn from(result: sqlx::Result<Outcome>) -> Self {
        match result {
            Ok(applied) => Handled::Done(applied),
            Err(err) => Handled::Failed(err),
        }
    }
}

/// Processes one consumer's messages in order, one at a time, until shutdown; `handle` gets
/// each message's payload and stream sequence. A message of an erased run is removed from
/// `stream` as it is dropped.
async fn consume<F, Fut>(
    consumer: &PullConsumer,
    stream: &Stream,
    shutdown: CancellationToken,
    handle: F,
) -> anyhow::Result<()>
where
    F: Fn(async_nats::Message, u64) -> Fut,
    Fut: std::future::Future<Output = Handled>,
{
    let name = consumer.cached_info().name.clone();
    let mut messages = std::pin::pin!(
        consumer
            .messages()
            .await
            .with_context(|| format!("cannot pull from {name}"))?
            .take_until(shutdown.cancelled_owned())
    );
    while let Some(message) = messages.next().await {
        let message = match message {
            Ok(message) => message,
            Err(err) => {
                tracing::warn!(consumer = %name, error = %err, "pull failed");
                continue;
            }
        };
        let seq = message.info().map_or(0, |info| info.stream_sequence);
        let ack = match handle(message.message.clone(), seq).await {
            Handled::Done(Outcome::Written | Outcome::Ended { .. } | Outcome::Duplicate) => {
                message.ack().await
            }
            Handled::Done(Outcome::Erased) => match crate::erase::delete_message(stream, seq).await
            {
                Ok(()) => message.ack().await,
                Err(err) => {
                    tracing::warn!(consumer = %name, error = format!("{err:#}"), "cannot remove an erased run's message, will retry");
                    message.ack_with(AckKind::Nak(Some(RETRY_DELAY))).await
                }
            },
            Handled::Done(Outcome::NotYet) => {
                message.ack_with(AckKind::Nak(Some(NOT_YET_DELAY))).await
            }
            Handled::Failed(err) => {
                tracing::warn!(consumer = %name, error = %err, "cannot persist, will retry");
                message.ack_with(AckKind::Nak(Some(RETRY_DELAY))).await
            }
            Handled::Undecodable(err) => {
                tracing::error!(consumer = %name, subject = %message.subject, error = %err, "undecodable message dropped");
                message.ack_with(AckKind::Term).await
            }
        };
        if let Err(err) = ack {
            tracing::warn!(consumer = %name, error = %err, "cannot acknowledge");
        }
    }
    tracing::info!(consumer = %name, "consumer stopped");
    Ok(())
}
