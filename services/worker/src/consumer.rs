//! The durable pull consumer of accepted runs.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, AckKind, consumer::pull};
use futures::StreamExt;
use protocol::agui::Event;
use protocol::messaging::{Names, RunTask, RunTaskV1, WORKER_CONSUMER};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::agent::Agent;
use crate::sink::EventSink;

/// How long a run may go without an ack before JetStream redelivers it.
const ACK_WAIT: Duration = Duration::from_secs(60);

pub(crate) struct RunConsumer {
    js: jetstream::Context,
    names: Names,
    consumer: jetstream::consumer::Consumer<pull::Config>,
    agent: Arc<dyn Agent>,
    concurrency: usize,
}

impl RunConsumer {
    pub(crate) async fn new(
        js: jetstream::Context,
        names: Names,
        agent: Arc<dyn Agent>,
        concurrency: usize,
    ) -> anyhow::Result<Self> {
        let stream = js.get_stream(names.runs_stream()).await?;
        let consumer = stream
            .get_or_create_consumer(
                WORKER_CONSUMER,
                pull::Config {
                    durable_name: Some(WORKER_CONSUMER.to_owned()),
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    ack_wait: ACK_WAIT,
                    max_ack_pending: i64::try_from(concurrency).unwrap_or(i64::MAX),
                    ..Default::default()
                },
            )
            .await
            .context("cannot create the worker consumer")?;
        Ok(Self {
            js,
            names,
            consumer,
            agent,
            concurrency,
        })
    }

    pub(crate) async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let messages = self
            .consumer
            .messages()
            .await
            .context("cannot pull from the worker consumer")?
            .take_until(shutdown.cancelled_owned());
        messages
            .for_each_concurrent(self.concurrency, |message| async {
                match message {
                    Ok(message) => self.handle(message).await,
                    Err(err) => tracing::warn!(error = %err, "pull from the runs stream failed"),
                }
            })
            .await;
        tracing::info!("worker consumer stopped");
        Ok(())
    }

    async fn handle(&self, message: jetstream::Message) {
        let task = match serde_json::from_slice::<RunTask>(&message.payload) {
            Ok(RunTask::V1(task)) => task,
            Err(err) => {
                tracing::error!(error = %err, subject = %message.subject, "undecodable run task dropped");
                if let Err(err) = message.ack_with(AckKind::Term).await {
                    tracing::warn!(error = %err, "cannot terminate an undecodable task");
                }
                return;
            }
        };
        let span = tracing::info_span!("worker.run.process", task.id = %task.task_id, run.id = %task.input.run_id);
        if let Some(headers) = &message.headers {
            platform::telemetry::adopt_parent(&span, &platform::nats::HeaderExtractor(headers));
        }
        let outcome = self.process(&task).instrument(span).await;
        let ack = match outcome {
            Ok(()) => message.ack().await,
            Err(err) => {
                tracing::warn!(task.id = %task.task_id, error = format!("{err:#}"), "run not completed, will be redelivered");
                message
                    .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                    .await
            }
        };
        if let Err(err) = ack {
            tracing::warn!(task.id = %task.task_id, error = %err, "cannot acknowledge run task");
        }
    }

    /// Runs the agent between `RUN_STARTED` and a terminal event. Fails only when events cannot
    /// be published; an agent failure ends the run with `RUN_ERROR`.
    async fn process(&self, task: &RunTaskV1) -> anyhow::Result<()> {
        let mut sink = EventSink::new(self.js.clone(), &self.names, task);
        let (thread_id, run_id) = (task.input.thread_id.clone(), task.input.run_id.clone());
        sink.emit(Event::RunStarted {
            thread_id: thread_id.clone(),
            run_id: run_id.clone(),
        })
        .await?;
        match self.agent.run(task, &mut sink).await {
            Ok(()) => {
                sink.emit(Event::RunFinished {
                    thread_id,
                    run_id,
                    result: None,
                })
                .await?;
                tracing::info!("run finished");
            }
            Err(err) => {
                tracing::warn!(error = format!("{err:#}"), "agent failed");
                sink.emit(Event::RunError {
                    message: "the agent failed".to_owned(),
                    code: Some("agent_error".to_owned()),
                })
                .await?;
            }
        }
        Ok(())
    }
}
