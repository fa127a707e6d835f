//! The durable pull consumer of accepted runs, and the run lifecycle around each agent call.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::jetstream::{self, AckKind, consumer::pull};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use platform::lifecycle::Claim;
use protocol::agui::Event;
use protocol::interaction::{
    DEFAULT_PROMPT_ERROR, INTERACTION_TIMEOUT_EVENT, Prompt, PromptOutcome, PromptRecord,
    PromptStatus,
};
use protocol::messaging::{Names, RunEventMessage, RunStatus, RunTask, RunTaskV1, WORKER_CONSUMER};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use crate::agent::ModelInput;
use crate::attachments::AttachmentReader;
use crate::registry::AgentSet;
use crate::sink::EventSink;
use crate::store::{RunEnd, RunStore, Started};

/// How soon a run waiting for its thread (policy `enqueue`) is offered again.
const THREAD_BUSY_DELAY: Duration = Duration::from_millis(250);
/// How soon a run whose owner has their share of this replica running is offered again.
const OWNER_BUSY_DELAY: Duration = Duration::from_millis(500);
/// How long one pull waits for a run before it is renewed.
const PULL_WAIT: Duration = Duration::from_secs(5);

/// How much this replica runs at once, and the fleet in all.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Capacity {
    /// Runs at once on this replica.
    pub(crate) concurrency: usize,
    /// Runs of one owner at once on this replica.
    pub(crate) max_runs_per_owner: usize,
    /// Runs handed out and not acknowledged across the fleet (`max_ack_pending`).
    pub(crate) fleet_max_in_flight: i64,
    /// How long a shutdown waits for the running runs to finish.
    pub(crate) drain: Duration,
    /// How long a run may go without a heartbeat before JetStream offers it again.
    pub(crate) ack_wait: Duration,
    /// Bytes of run events per owner per UTC day, fleet-wide.
    pub(crate) owner_event_bytes_per_day: u64,
    /// Prompts waiting for an answer per owner, fleet-wide.
    pub(crate) max_pending_prompts_per_owner: usize,
}

/// Cancellation tokens of the runs this replica is running, by task id.
type Running = Arc<Mutex<HashMap<Uuid, CancellationToken>>>;

/// Pulls accepted runs and takes each through its lifecycle (see [`RunConsumer::run`]).
pub(crate) struct RunConsumer {
    js: jetstream::Context,
    client: async_nats::Client,
    names: Names,
    /// The run lifecycle's KV records: status, thread locks, prompts.
    store: RunStore,
    consumer: jetstream::consumer::Consumer<pull::Config>,
    /// The RUN_EVENTS stream (read when ending a lost run).
    events: jetstream::stream::Stream,
    agents: Arc<AgentSet>,
    /// Reads the user message's files; `None` without S3 settings.
    reader: Option<AttachmentReader>,
    capacity: Capacity,
    /// Runs in progress on this replica, by owner (the per-owner share).
    owners: Arc<Mutex<HashMap<String, usize>>>,
    /// How often a long run's progress is reported (a third of the consumer's ack wait).
    heartbeat: Duration,
    running: Running,
    /// Each owner's bytes of run events per day, shared by the workers.
    event_budget: Arc<platform::budget::DailyBudget>,
}

/// A run of one owner counted in; counted out when dropped.
struct OwnerSlot {
    owners: Arc<Mutex<HashMap<String, usize>>>,
    owner: String,
}

impl Drop for OwnerSlot {
    fn drop(&mut self) {
        if let Ok(mut owners) = self.owners.lock()
            && let Some(count) = owners.get_mut(&self.owner)
        {
            *count = count.saturating_sub(1);
            if *count == 0 {
                owners.remove(&self.owner);
            }
        }
    }
}

/// Creates the durable consumer, or updates it when its settings changed (a changed ack wait
/// or capacity is applied, not silently ignored).
async fn reconcile_consumer(
    stream: &jetstream::stream::Stream,
    wanted: pull::Config,
) -> anyhow::Result<jetstream::consumer::Consumer<pull::Config>> {
    match stream.get_consumer::<pull::Config>(WORKER_CONSUMER).await {
        Ok(mut existing) => {
            let current = existing.info().await?.config.clone();
            if current.ack_wait != wanted.ack_wait
                || current.max_ack_pending != wanted.max_ack_pending
            {
                tracing::info!("worker consumer settings changed; updating");
                return Ok(stream.update_consumer(wanted).await?);
            }
            Ok(existing)
        }
        Err(_) => Ok(stream.create_consumer(wanted).await?),
    }
}

/// A cancel on `subject` (`<prefix>.runs.cancel.<task>`): stops that run if this replica runs
/// it (every replica hears every cancel).
fn stop_cancelled(running: &Running, subject: &str) {
    let Some(task_id) = subject
        .rsplit('.')
        .next()
        .and_then(|id| Uuid::try_parse(id).ok())
    else {
        return;
    };
    let token = running
        .lock()
        .ok()
        .and_then(|map| map.get(&task_id).cloned());
    if let Some(token) = token {
        tracing::info!(task.id = %task_id, "cancel received, stopping the agent");
        token.cancel();
    }
}

/// Ends the run failed with `message` (safe to show) and `code`.
async fn fail(sink: &mut EventSink, message: String, code: &str) -> anyhow::Result<RunEnd> {
    let usage = sink.usage();
    sink.finish(Event::RunError {
        message: message.clone(),
        code: Some(code.to_owned()),
        usage: (!usage.is_empty()).then(|| usage.clone()),
    })
    .await?;
    Ok(RunEnd::new(RunStatus::Failed, Some(message))
        .with_usage(usage)
        .with_times(sink.times()))
}

/// Why an agent's finished output breaks its card's output schema, if it does.
fn output_violation(
    result: &anyhow::Result<()>,
    sink: &EventSink,
    card: &protocol::agents::AgentCard,
) -> Option<String> {
    match (result, sink.output()) {
        (Ok(()), Ok(body)) => card.output_schema.check(&body).err().map(|violations| {
            violations
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        }),
        (Ok(()), Err(err)) => Some(err.to_string()),
        (Err(_), _) => None,
    }
}

/// The record of the prompt `task`'s agent asked at `now`: pending, answerable until its
/// timeout, and answering the run's last user message (the run itself when it has none). Its
/// id comes from the task, so a redelivered run asks the same prompt, not a second one.
fn pending_prompt(task: &RunTaskV1, prompt: Prompt, now: DateTime<Utc>) -> PromptRecord {
    // A run continuing after a prompt answers the same user message as the run that asked.
    let parent_id = task
        .resumed
        .as_ref()
        .and_then(|resumed| resumed.parent_id.clone())
        .or_else(|| {
            task.input
                .messages
                .iter()
                .rev()
                .find(|m| matches!(m, protocol::run_input::Message::User(_)))
                .map(|m| m.id().to_owned())
        })
        .unwrap_or_else(|| task.input.run_id.clone());
    PromptRecord {
        prompt_id: format!("{}-prompt", task.task_id),
        task_id: task.task_id,
        owner: task.owner.clone(),
        thread_id: task.input.thread_id.clone(),
        run_id: task.input.run_id.clone(),
        parent_id,
        expires_at: prompt
            .timeout
            .map(|secs| now + chrono::Duration::seconds(i64::try_from(secs).unwrap_or(i64::MAX))),
        prompt,
        created_at: now,
        status: PromptStatus::Pending,
        answer: None,
        continuation_run_id: None,
        agent: task.agent.clone(),
    }
}

/// How often the consumer's lag is read for `/metrics`.
const LAG_EVERY: Duration = Duration::from_secs(5);

/// The `outcome` label of `switchboard_runs_finished_total`.
fn outcome_label(status: RunStatus) -> &'static str {
    match status {
        RunStatus::Completed => "completed",
        RunStatus::Cancelled => "cancelled",
        RunStatus::Queued | RunStatus::Running | RunStatus::Failed => "failed",
    }
}

enum Processed {
    /// The run ended (or had ended before): ack.
    Done,
    /// Its worker is still running it: offer again after an ack wait.
    StillRunning,
    /// Another run holds the thread: offer again later.
    ThreadBusy,
}

impl RunConsumer {
    /// Opens the lifecycle buckets, registers the agents' cards and creates (or updates) the
    /// durable consumer of the RUNS stream.
    pub(crate) async fn new(
        client: async_nats::Client,
        js: jetstream::Context,
        nats: &platform::nats::NatsConfig,
        buckets: platform::lifecycle::RunBuckets,
        agents: Arc<AgentSet>,
        reader: Option<AttachmentReader>,
        capacity: Capacity,
    ) -> anyhow::Result<Self> {
        let ack_wait = capacity.ack_wait;
        let names = nats.names.clone();
        let event_budget = Arc::new(platform::budget::DailyBudget::new(
            "events",
            capacity.owner_event_bytes_per_day,
            buckets.owner_budgets.clone(),
        ));
        let store = RunStore::new(buckets, capacity.max_pending_prompts_per_owner);
        store
            .register_agents(&agents)
            .await
            .context("cannot register the agents")?;
        let stream = js.get_stream(names.runs_stream()).await?;
        let events = js.get_stream(names.run_events_stream()).await?;
        let wanted = pull::Config {
            durable_name: Some(WORKER_CONSUMER.to_owned()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait,
            max_ack_pending: capacity.fleet_max_in_flight,
            ..Default::default()
        };
        // Retried while a cluster settles (right after it starts, or under load, a consumer's
        // creation can outwait one request).
        let consumer = platform::nats::settled("the worker consumer", || {
            reconcile_consumer(&stream, wanted.clone())
        })
        .await
        .context("cannot create or update the worker consumer")?;
        Ok(Self {
            js,
            client,
            names,
            store,
            consumer,
            events,
            agents,
            reader,
            capacity,
            owners: Arc::default(),
            heartbeat: ack_wait / 3,
            running: Arc::default(),
            event_budget,
        })
    }

    /// Consumes runs until `shutdown`, then lets the running ones finish within the drain.
    pub(crate) async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        // Subscribe to cancels before pulling, so no cancel of a run we start can be missed.
        let cancels = self
            .client
            .subscribe(self.names.run_cancel_subjects())
            .await
            .context("cannot subscribe to run cancels")?;
        let sweeper = tokio::spawn(crate::deadlines::sweep(
            self.js.clone(),
            self.names.clone(),
            self.store.clone(),
            shutdown.clone(),
        ));
        // Cards expire unless registered again (platform::lifecycle::AGENT_CARD_TTL): an agent no
        // worker serves any more leaves the catalog within a minute.
        let refresher = {
            let (store, agents, shutdown) = (
                self.store.clone(),
                Arc::clone(&self.agents),
                shutdown.clone(),
            );
            tokio::spawn(async move {
                let mut every = tokio::time::interval(platform::lifecycle::AGENT_REFRESH);
                every.tick().await;
                loop {
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        _ = every.tick() => {}
                    }
                    if let Err(err) = store.register_agents(&agents).await {
                        tracing::warn!(
                            error = format!("{err:#}"),
                            "agent cards not registered again"
                        );
                    }
                }
            })
        };
        let lag = platform::metrics::watch_consumer_lag(
            self.consumer.clone(),
            WORKER_CONSUMER,
            LAG_EVERY,
            shutdown.clone(),
        );
        let running = Arc::clone(&self.running);
        let listener = tokio::spawn(
            cancels
                .take_until(shutdown.clone().cancelled_owned())
                .for_each(move |message| {
                    stop_cancelled(&running, &message.subject);
                    futures::future::ready(())
                }),
        );
        // One pull loop per slot: a replica asks for a run only when it has room for it, so
        // the fleet's capacity grows with its replicas. On shutdown the loops stop pulling and
        // finish what they run, for at most the drain window; a run still going then is left
        // unacknowledged, and JetStream gives it to another replica after the ack wait (which
        // ends it `worker_lost`: docs/fleet.md, "Drain").
        let pulls = futures::future::join_all(
            (0..self.capacity.concurrency).map(|_| self.pull_loop(shutdown.clone())),
        );
        let drained = async {
            shutdown.cancelled().await;
            tokio::time::sleep(self.capacity.drain).await;
        };
        tokio::select! {
            _ = pulls => {}
            () = drained => {
                let left = self.running.lock().map_or(0, |running| running.len());
                tracing::warn!(runs = left, "drain window over; stopping with runs unfinished");
            }
        }
        listener.abort();
        refresher.abort();
        sweeper.abort();
        lag.abort();
        tracing::info!("worker consumer stopped");
        Ok(())
    }

    /// Pulls one run at a time and processes it, until `shutdown`; a run being processed is
    /// finished first (the drain).
    async fn pull_loop(&self, shutdown: CancellationToken) {
        while !shutdown.is_cancelled() {
            let batch = self
                .consumer
                .batch()
                .max_messages(1)
                .expires(PULL_WAIT)
                .messages();
            let mut batch = tokio::select! {
                () = shutdown.cancelled() => return,
                batch = batch => match batch {
                    Ok(batch) => batch,
                    Err(err) => {
                        tracing::warn!(error = %err, "pull from the runs stream failed");
                        tokio::select! {
                            () = shutdown.cancelled() => return,
                            () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                        }
                    }
                },
            };
            loop {
                let next = tokio::select! {
                    () = shutdown.cancelled() => return,
                    next = batch.next() => next,
                };
                match next {
                    Some(Ok(message)) => self.handle(message).await,
                    Some(Err(err)) => {
                        tracing::warn!(error = %err, "pull from the runs stream failed");
                        break;
                    }
                    None => break,
                }
            }
        }
    }

    /// Counts a run of `owner` in, unless the owner has their share of this replica running.
    fn enter_owner(&self, owner: &str) -> Option<OwnerSlot> {
        let mut owners = self.owners.lock().ok()?;
        let count = owners.entry(owner.to_owned()).or_default();
        if *count >= self.capacity.max_runs_per_owner {
            return None;
        }
        *count += 1;
        Some(OwnerSlot {
            owners: Arc::clone(&self.owners),
            owner: owner.to_owned(),
        })
    }

    async fn handle(&self, message: jetstream::Message) {
        let task = match serde_json::from_slice::<RunTask>(&message.payload) {
            Ok(RunTask::V1(task)) => task,
            Err(err) => {
                tracing::error!(
                    error = %err,
                    subject = %message.subject,
                    "undecodable run task dropped",
                );
                if let Err(err) = message.ack_with(AckKind::Term).await {
                    tracing::warn!(error = %err, "cannot terminate an undecodable task");
                }
                return;
            }
        };
        // One owner's flood of runs waits its turn without holding a slot: offered again soon.
        let Some(_slot) = self.enter_owner(&task.owner) else {
            // Backed off by how often it came back (0.5 s .. 10 s), so a flood of one owner's
            // runs does not circle through the fleet many times a second.
            let delivered = message.info().map_or(1, |info| info.delivered).clamp(1, 20);
            let delay = OWNER_BUSY_DELAY * u32::try_from(delivered).unwrap_or(20);
            if let Err(err) = message.ack_with(AckKind::Nak(Some(delay))).await {
                tracing::warn!(task.id = %task.task_id, error = %err, "cannot put back a run");
            }
            return;
        };
        // GenAI conventions: `invoke_agent {agent}`, the thread as the conversation.
        let agent = self.agents.get(task.agent.as_deref()).map_or_else(
            || task.agent.clone().unwrap_or_default(),
            |(_, card)| card.name.clone(),
        );
        let span = tracing::info_span!(
            "worker.run.process",
            otel.name = %format!("invoke_agent {agent}"),
            gen_ai.operation.name = "invoke_agent",
            gen_ai.agent.name = %agent,
            gen_ai.conversation.id = %task.input.thread_id,
            task.id = %task.task_id,
            run.id = %task.input.run_id,
        );
        if let Some(headers) = &message.headers {
            platform::telemetry::adopt_parent(&span, &platform::nats::HeaderExtractor(headers));
        }
        // Progress heartbeats while the run goes on, so a long run is never redelivered while
        // its worker is alive, and a dead worker's run is redelivered within ACK_WAIT.
        let processed = {
            let runs_seq = message.info().map_or(0, |info| info.stream_sequence);
            let work = std::pin::pin!(self.process(&task, runs_seq).instrument(span));
            let mut work = work;
            let mut beat = tokio::time::interval(self.heartbeat);
            beat.tick().await;
            loop {
                tokio::select! {
                    outcome = &mut work => break outcome,
                    _ = beat.tick() => {
                        if let Err(err) = message.ack_with(AckKind::Progress).await {
                            tracing::warn!(
                                task.id = %task.task_id,
                                error = %err,
                                "progress heartbeat failed",
                            );
                        }
                        self.beat(&task).await;
                    }
                }
            }
        };
        let ack = match processed {
            Ok(Processed::Done) => message.ack().await,
            Ok(Processed::ThreadBusy) => {
                message
                    .ack_with(AckKind::Nak(Some(THREAD_BUSY_DELAY)))
                    .await
            }
            Ok(Processed::StillRunning) => {
                message
                    .ack_with(AckKind::Nak(Some(self.heartbeat * 3)))
                    .await
            }
            Err(err) => {
                tracing::warn!(
                    task.id = %task.task_id,
                    error = format!("{err:#}"),
                    "run not completed, will be redelivered",
                );
                message
                    .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                    .await
            }
        };
        if let Err(err) = ack {
            tracing::warn!(task.id = %task.task_id, error = %err, "cannot acknowledge run task");
        }
    }

    /// One run: claim its thread, mark it running, run the agent between `RUN_STARTED` and a
    /// terminal event, record the outcome, release the thread. Fails only when NATS does.
    async fn process(&self, task: &RunTaskV1, runs_seq: u64) -> anyhow::Result<Processed> {
        let record = self.store.status_of(task).await?;
        let alive_at = record.as_ref().and_then(|r| r.alive_at);
        let status = record.map(|r| r.status);
        if matches!(status, Some(RunStatus::Completed | RunStatus::Failed)) {
            return Ok(Processed::Done); // finished before a redelivery
        }
        if status != Some(RunStatus::Cancelled) {
            let claim = self.store.claim_thread(task).await?;
            if claim != Claim::Claimed {
                return Ok(Processed::ThreadBusy);
            }
        }
        if status == Some(RunStatus::Running) && self.still_running(task.task_id, alive_at) {
            // Redelivered while its worker (this replica or another) is still at it: NATS did
            // not hear the progress in time (a node lost, a slow link). Not lost; look again
            // after an ack wait.
            return Ok(Processed::StillRunning);
        }
        if status == Some(RunStatus::Running) {
            // A worker was running this task and stopped without finishing it (it died, or lost
            // NATS). Running the agent again would repeat what it already streamed: the run
            // ends failed, after the events it has, deterministically.
            let end = self.end_lost_run(task).await?;
            metrics::counter!("switchboard_runs_finished_total", "outcome" => "worker_lost")
                .increment(1);
            self.store.finish(task, &end).await?;
            self.store.release_thread(task).await?;
            return Ok(Processed::Done);
        }
        let token = CancellationToken::new();
        if let Ok(mut running) = self.running.lock() {
            running.insert(task.task_id, token.clone());
        }
        metrics::counter!("switchboard_runs_started_total").increment(1);
        let in_flight =
            platform::metrics::GaugeGuard::new(metrics::gauge!("switchboard_runs_in_flight"));
        let outcome = self.run_agent(task, runs_seq, token).await;
        drop(in_flight);
        if let Ok(mut running) = self.running.lock() {
            running.remove(&task.task_id);
        }
        let end = outcome?;
        metrics::counter!("switchboard_runs_finished_total", "outcome" => outcome_label(end.status))
            .increment(1);
        self.store.finish(task, &end).await?;
        self.store.release_thread(task).await?;
        Ok(Processed::Done)
    }

    async fn run_agent(
        &self,
        task: &RunTaskV1,
        runs_seq: u64,
        token: CancellationToken,
    ) -> anyhow::Result<RunEnd> {
        // A cancel that reached the run before its worker did stops the agent before it starts.
        if self.store.mark_running(task).await? == Started::Cancelled {
            token.cancel();
        }
        let mut sink = EventSink::new(self.js.clone(), &self.names, task, token.clone())
            .with_budget(Arc::clone(&self.event_budget))
            .with_tokens(self.store.token_ledger());
        sink.finish(Event::RunStarted {
            thread_id: task.input.thread_id.clone(),
            run_id: task.input.run_id.clone(),
            input: Some(task.input.started_input()),
        })
        .await?;
        if let Some(resumed) = &task.resumed
            && resumed.outcome == PromptOutcome::TimedOut
        {
            // Every client shows the prompt's error; then the agent learns of the timeout.
            sink.finish(Event::Custom {
                name: INTERACTION_TIMEOUT_EVENT.to_owned(),
                value: serde_json::json!({
                    "promptId": resumed.prompt_id,
                    "error": resumed.prompt.error,
                }),
            })
            .await?;
        }
        let Some((agent, card)) = self.agents.get(task.agent.as_deref()) else {
            let message = format!(
                "this worker runs no agent named {:?}",
                task.agent.as_deref().unwrap_or_default()
            );
            return fail(&mut sink, message, "unknown_agent").await;
        };
        let attachments = if agent.reads_attachments() {
            self.read_attachments(task, &token).await
        } else {
            Vec::new()
        };
        let input = ModelInput::new(task)
            .with_attachments(attachments)
            .at_runs_seq(runs_seq);
        let result = if token.is_cancelled() {
            Err(crate::sink::Cancelled.into())
        } else {
            agent.run(&input, &mut sink).await
        };
        // An agent that broke its own output schema ends the run as failed, naming the rule.
        if let Some(why) = output_violation(&result, &sink, card) {
            let message = format!("the agent {:?} broke its output schema: {why}", card.name);
            tracing::warn!(agent = %card.name, "agent output refused by its schema");
            return fail(&mut sink, message, "output_schema_violation").await;
        }
        match result {
            Ok(()) => {
                let outcome = match sink.take_prompt() {
                    None => None,
                    Some(prompt) => match self.store_prompt(task, prompt).await {
                        Ok(outcome) => Some(outcome),
                        // The owner has the most prompts waiting: the run fails, saying so.
                        Err(err) => match err.downcast::<crate::agent::AgentFailure>() {
                            Ok(failure) => {
                                return fail(&mut sink, failure.message, failure.code).await;
                            }
                            Err(err) => return Err(err),
                        },
                    },
                };
                let result = sink.take_result();
                let usage = sink.usage();
                sink.finish(Event::RunFinished {
                    thread_id: task.input.thread_id.clone(),
                    run_id: task.input.run_id.clone(),
                    result,
                    outcome,
                    usage: (!usage.is_empty()).then(|| usage.clone()),
                })
                .await?;
                tracing::info!("run finished");
                Ok(RunEnd::new(RunStatus::Completed, None)
                    .with_usage(usage)
                    .with_times(sink.times()))
            }
            Err(_) if token.is_cancelled() => {
                // A cancelled run reports what it had used.
                let usage = sink.usage();
                sink.finish(Event::RunError {
                    message: "run cancelled".to_owned(),
                    code: Some("cancelled".to_owned()),
                    usage: (!usage.is_empty()).then(|| usage.clone()),
                })
                .await?;
                tracing::info!("run cancelled");
                Ok(RunEnd::new(RunStatus::Cancelled, None)
                    .with_usage(usage)
                    .with_times(sink.times()))
            }
            // The log cannot take events (this worker was cut off: a fence, or NATS gone for
            // longer than the publish retries): nothing this worker writes would be stored, so
            // the run is left to be ended as lost rather than as the agent's failure.
            Err(err)
                if err.is::<platform::nats::Fenced>()
                    || err.is::<crate::sink::LogUnavailable>() =>
            {
                Err(err)
            }
            Err(err) => match err.downcast::<crate::agent::AgentFailure>() {
                Ok(failure) => {
                    tracing::warn!(agent = %card.name, code = failure.code, error = %failure.message, "agent failed");
                    fail(&mut sink, failure.message, failure.code).await
                }
                Err(err) => {
                    tracing::warn!(error = format!("{err:#}"), "agent failed");
                    fail(&mut sink, "the agent failed".to_owned(), "agent_error").await
                }
            },
        }
    }

    /// The user message's files, read (bounded per file) before the agent runs; a cancel
    /// stops waiting.
    async fn read_attachments(
        &self,
        task: &RunTaskV1,
        token: &CancellationToken,
    ) -> Vec<crate::attachments::AttachmentContent> {
        if task.attachments.is_empty() {
            return Vec::new();
        }
        let read = crate::attachments::read_all(self.reader.as_ref(), &task.attachments);
        tokio::select! {
            read = read => read,
            () = token.cancelled() => Vec::new(),
        }
    }

    /// Stores the prompt the agent asked (pending, with its deadline) and returns the AG-UI
    /// outcome that finishes the run. Idempotent: a redelivered run finds its prompt stored.
    async fn store_prompt(
        &self,
        task: &RunTaskV1,
        mut prompt: Prompt,
    ) -> anyhow::Result<serde_json::Value> {
        if prompt.error.trim().is_empty() {
            prompt.error = DEFAULT_PROMPT_ERROR.to_owned();
        }
        if let Err(reason) = prompt.validate() {
            anyhow::bail!("the agent asked an invalid prompt: {reason}");
        }
        let record = self
            .store
            .save_prompt(pending_prompt(task, prompt, Utc::now()))
            .await?;
        if record.expires_at.is_some() && record.status == PromptStatus::Pending {
            self.store.set_deadline(&record).await?;
        }
        tracing::info!(prompt.id = %record.prompt_id, "run stopped on a prompt");
        Ok(serde_json::json!({"type": "interrupt", "interrupts": [record.interrupt()]}))
    }

    /// Ends a run whose worker stopped mid-run: after the last event in its log, a `RUN_ERROR`
    /// (`worker_lost`) unless the log already ends with a terminal event.
    async fn end_lost_run(&self, task: &RunTaskV1) -> anyhow::Result<RunEnd> {
        let subject = self.names.run_event_subject(task.task_id);
        let last = match self.events.get_last_raw_message_by_subject(&subject).await {
            Ok(message) => match serde_json::from_slice::<RunEventMessage>(&message.payload) {
                Ok(RunEventMessage::V1(event)) => Some((event, message.sequence)),
                Err(err) => anyhow::bail!("undecodable last event of a lost run: {err}"),
            },
            Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => None,
            Err(err) => return Err(err.into()),
        };
        if let Some((last, _)) = &last {
            match &last.event {
                Event::RunFinished { .. } => return Ok(RunEnd::new(RunStatus::Completed, None)),
                Event::RunError { code, message, .. } => {
                    let status = if code.as_deref() == Some("cancelled") {
                        RunStatus::Cancelled
                    } else {
                        RunStatus::Failed
                    };
                    return Ok(RunEnd::new(status, Some(message.clone())));
                }
                _ => {}
            }
        }
        let mut sink = EventSink::new(self.js.clone(), &self.names, task, CancellationToken::new())
            .after(
                last.as_ref().map_or(0, |(event, _)| event.seq),
                last.as_ref().map_or(0, |(_, stream_seq)| *stream_seq),
            );
        let message = "the worker running this run stopped before it finished".to_owned();
        sink.finish(Event::RunError {
            message: message.clone(),
            code: Some("worker_lost".to_owned()),
            usage: None,
        })
        .await?;
        tracing::warn!(task.id = %task.task_id, "run lost by its worker ended as failed");
        Ok(RunEnd::new(RunStatus::Failed, Some(message)))
    }

    /// Whether the run `task_id` is alive: this replica runs it, or its worker's last
    /// heartbeat is younger than an ack wait.
    fn still_running(&self, task_id: Uuid, alive_at: Option<DateTime<Utc>>) -> bool {
        let here = self
            .running
            .lock()
            .is_ok_and(|running| running.contains_key(&task_id));
        let ack_wait = chrono::Duration::from_std(self.heartbeat * 3).unwrap_or_default();
        here || alive_at.is_some_and(|at| Utc::now() - at < ack_wait)
    }

    /// Records that the run of `task` is alive on this replica (see [`Self::still_running`]);
    /// a heartbeat that fails is only logged: the next one may make it.
    async fn beat(&self, task: &RunTaskV1) {
        if let Err(err) = self.store.heartbeat(task).await {
            tracing::warn!(
                task.id = %task.task_id,
                error = format!("{err:#}"),
                "heartbeat not recorded",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn task(messages: serde_json::Value) -> RunTaskV1 {
        serde_json::from_value(json!({
            "task_id": "0190c3a0-0000-7000-8000-000000000001",
            "owner": "user-1",
            "accepted_at": "2025-01-01T00:00:00Z",
            "input": {"threadId": "th", "runId": "r1", "messages": messages},
            "agent": "echo",
        }))
        .unwrap()
    }

    fn prompt(timeout: Option<u64>) -> Prompt {
        serde_json::from_value(json!({
            "input_type": "text", "text": "Which file?", "required": true,
            "timeout": timeout, "error": "too late",
        }))
        .unwrap()
    }

    fn now() -> DateTime<Utc> {
        DateTime::from_timestamp(1_750_000_000, 0).unwrap()
    }

    #[test]
    fn a_prompt_is_pending_under_an_id_of_its_task_and_answers_the_last_user_message() {
        let task = task(json!([
            {"role": "user", "id": "u1", "content": "first"},
            {"role": "assistant", "id": "a1", "content": "ok"},
            {"role": "user", "id": "u2", "content": "second"},
            {"role": "assistant", "id": "a2", "content": "ok"},
        ]));
        let record = pending_prompt(&task, prompt(Some(90)), now());
        assert_eq!(record.prompt_id, format!("{}-prompt", task.task_id));
        assert_eq!(record.task_id, task.task_id);
        assert_eq!(record.owner, "user-1");
        assert_eq!(record.thread_id, "th");
        assert_eq!(record.run_id, "r1");
        assert_eq!(
            record.parent_id, "u2",
            "the last user message is the parent"
        );
        assert_eq!(record.status, PromptStatus::Pending);
        assert_eq!(record.created_at, now());
        assert_eq!(
            record.expires_at,
            Some(now() + chrono::Duration::seconds(90))
        );
        assert_eq!(record.agent.as_deref(), Some("echo"));
        assert_eq!(record.answer, None);
        assert_eq!(record.continuation_run_id, None);
    }

    #[test]
    fn a_prompt_without_a_timeout_never_expires_and_without_a_user_message_answers_the_run() {
        let record = pending_prompt(&task(json!([])), prompt(None), now());
        assert_eq!(record.expires_at, None);
        assert_eq!(
            record.parent_id, "r1",
            "the run id stands in for a missing user message"
        );
    }
}
