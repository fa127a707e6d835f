//! Publishes a run's events in order, each with its per-run sequence number.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use chrono::{DateTime, Utc};
use platform::budget::{DailyBudget, Exhausted};
use platform::tokens::TokenLedger;
use protocol::agents::OutputCollector;
use protocol::agui::Event;
use protocol::files::{
    ATTACHMENTS_EVENT, GeneratedAttachments, GeneratedFile, MAX_GENERATED_ATTACHMENTS,
};
use protocol::message_body::{MessageBody, MessageBodyError};
use protocol::messaging::{Names, RunEventMessage, RunEventV1, RunTaskV1};
use protocol::metadata::{AgentMetadata, MESSAGE_METADATA_EVENT};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::agent::AgentFailure;
use crate::generated::{AttachError, Registrar};

/// The run's log could not be written (NATS did not take an event within the publish retries):
/// not the agent's failure. The run is left to end as lost, not ended here.
#[derive(Debug, thiserror::Error)]
#[error("the run's event log could not be written: {0}")]
pub struct LogUnavailable(String);

/// The run was cancelled by its owner; returned by [`EventSink::emit`] and [`EventSink::pause`].
#[derive(Debug, thiserror::Error)]
#[error("run cancelled")]
pub struct Cancelled;

/// The refusal of a run whose owner's events of the day are spent: names the budget, its
/// setting and when it resets.
fn event_budget_refusal(exhausted: &Exhausted) -> String {
    format!(
        "the bytes of run events your runs may produce per day ({} bytes, {}) are spent; the \
         budget resets at 00:00 UTC, in {} s",
        exhausted.per_day,
        crate::EVENT_BYTES_VAR,
        exhausted.resets_in.as_secs().max(1)
    )
}

/// Where an agent writes its events. Every event is acknowledged by JetStream before the next,
/// and the sequence number advances only after the ack, so the log never has a gap.
pub struct EventSink {
    js: jetstream::Context,
    /// The RUN_EVENTS stream's name.
    stream: String,
    subject: String,
    template: RunEventV1,
    cancel: CancellationToken,
    /// The human-in-the-loop prompt the agent stopped on, if any.
    ask: Option<protocol::interaction::Prompt>,
    /// What the agent produced, as a `MessageBody` (checked against its output schema).
    output: OutputCollector,
    /// The run's `result` for its `RUN_FINISHED`, if the agent gave one.
    result: Option<serde_json::Value>,
    /// Keeps the files the agent makes in the thread's workspace.
    registrar: Registrar,
    /// The files attached so far, by the agent message they belong to.
    attached: Vec<(String, Vec<GeneratedFile>)>,
    /// The owner's bytes of run events per day (none: unbounded); terminal events are free.
    budget: Option<Arc<DailyBudget>>,
    /// This writer's id in its messages' ids: a retry of its own publish is a duplicate,
    /// another writer's message at the same `seq` is not.
    writer: Uuid,
    /// Stream sequence of the log's last message this writer knows (0: none): the next
    /// publish is stored only if the log still ends there ([`platform::nats::publish_fenced`]).
    stream_seq: u64,
    /// The tokens the agent's models used so far, one entry per model.
    usage: Vec<protocol::usage::TokenUsage>,
    /// Where the run's tokens are charged to its owner as it ends (none: not charged).
    tokens: Option<Arc<TokenLedger>>,
    /// When the run's `RUN_STARTED` and its first output were published.
    times: RunTimes,
}

/// When a run started and first showed output (a text message's content or a tool call).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RunTimes {
    /// `RUN_STARTED` published.
    pub(crate) started_at: Option<DateTime<Utc>>,
    /// The first output published.
    pub(crate) first_output_at: Option<DateTime<Utc>>,
}

impl EventSink {
    pub(crate) fn new(
        js: jetstream::Context,
        names: &Names,
        task: &RunTaskV1,
        cancel: CancellationToken,
    ) -> Self {
        let registrar = Registrar::new(js.client(), names, &task.owner, &task.input.thread_id);
        Self {
            js,
            stream: names.run_events_stream(),
            subject: names.run_event_subject(task.task_id),
            template: RunEventV1 {
                task_id: task.task_id,
                owner: task.owner.clone(),
                thread_id: task.input.thread_id.clone(),
                run_id: task.input.run_id.clone(),
                seq: 0,
                emitted_at: Utc::now(),
                event: Event::RunStarted {
                    thread_id: String::new(),
                    run_id: String::new(),
                    input: None,
                },
            },
            cancel,
            ask: None,
            output: OutputCollector::default(),
            result: None,
            registrar,
            attached: Vec::new(),
            budget: None,
            writer: Uuid::new_v4(),
            stream_seq: 0,
            usage: Vec::new(),
            tokens: None,
            times: RunTimes::default(),
        }
    }

    /// Records tokens a model call used (summed per provider and model); the run's terminal
    /// event and status carry the total.
    pub fn add_usage(&mut self, entry: protocol::usage::TokenUsage) {
        protocol::usage::add(&mut self.usage, entry);
    }

    /// The tokens used so far.
    pub(crate) fn usage(&self) -> Vec<protocol::usage::TokenUsage> {
        self.usage.clone()
    }

    /// When the run started and first showed output.
    pub(crate) fn times(&self) -> RunTimes {
        self.times
    }

    /// Charges the run's tokens to its owner in `ledger` as it ends (before its terminal event
    /// is published, so whoever sees the end finds the charge).
    pub(crate) fn with_tokens(mut self, ledger: Arc<TokenLedger>) -> Self {
        self.tokens = Some(ledger);
        self
    }

    /// Spends the bytes of every event but `RUN_STARTED` and the terminal one from the owner's
    /// `budget` of the day; past it the run ends with `RUN_ERROR` `quota_exceeded`.
    pub(crate) fn with_budget(mut self, budget: Arc<DailyBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Continues a log that already holds events up to `seq`, its last message at stream
    /// sequence `stream_seq`.
    pub(crate) fn after(mut self, seq: u64, stream_seq: u64) -> Self {
        self.template.seq = seq;
        self.stream_seq = stream_seq;
        self
    }

    /// Publishes `event` as the run's next event and waits for the ack; refuses with
    /// [`Cancelled`] once the run is cancelled. Cancellation is checked before publishing, never
    /// during, so an event is either stored with its number or not sent at all.
    pub async fn emit(&mut self, event: Event) -> anyhow::Result<()> {
        if self.cancel.is_cancelled() {
            return Err(Cancelled.into());
        }
        self.publish(event).await
    }

    /// Waits `duration` unless the run is cancelled first.
    pub async fn pause(&self, duration: Duration) -> anyhow::Result<()> {
        tokio::select! {
            () = tokio::time::sleep(duration) => Ok(()),
            () = self.cancel.cancelled() => Err(Cancelled.into()),
        }
    }

    /// Stops the run on a question for the user: once the agent returns, the run finishes with
    /// an AG-UI interrupt, and the answer (or the timeout) comes back as a new run on the
    /// thread whose task carries it ([`protocol::messaging::RunTaskV1::resumed`]).
    pub fn ask(&mut self, prompt: protocol::interaction::Prompt) {
        self.ask = Some(prompt);
    }

    /// Sets the `result` the run's `RUN_FINISHED` carries.
    pub fn set_result(&mut self, result: serde_json::Value) {
        self.result = Some(result);
    }

    /// The `result` the agent set, if any.
    pub(crate) fn take_result(&mut self) -> Option<serde_json::Value> {
        self.result.take()
    }

    /// Completes when the owner cancels the run.
    pub fn cancelled(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.cancel.cancelled()
    }

    /// The prompt the agent asked, if any.
    pub(crate) fn take_prompt(&mut self) -> Option<protocol::interaction::Prompt> {
        self.ask.take()
    }

    /// Sets fields of the metadata of the agent's message `message_id` (a message this run
    /// started): `stage` and custom fields, checked by [`AgentMetadata::new`] before anything
    /// is sent, so an agent learns at once that a field is refused.
    pub async fn annotate(
        &mut self,
        message_id: &str,
        metadata: serde_json::Map<String, serde_json::Value>,
    ) -> anyhow::Result<()> {
        let fields = AgentMetadata::new(message_id, metadata).map_err(anyhow::Error::msg)?;
        self.emit(Event::Custom {
            name: MESSAGE_METADATA_EVENT.to_owned(),
            value: fields.to_value(),
        })
        .await
    }

    /// Keeps a file the agent made, `file_name` (a plain name, no path) of the allowed type
    /// `content_type`, in the thread's workspace with `source: "generated"`, and shows it under
    /// the agent's message `message_id` (a message this run started) with a `CUSTOM
    /// attachments` event. History keeps an event's file list whole (a later event replaces the
    /// message's list), so each event carries every file of the message so far; a file of the
    /// same name replaces the earlier one. Small files go inline, larger ones (up to 100 MB)
    /// through a presigned upload that is verified before the file is shown
    /// ([`crate::generated`]). A refusal ([`AttachError::Refused`], also past
    /// [`MAX_GENERATED_ATTACHMENTS`] files on one message) or unavailable storage
    /// ([`AttachError::Unavailable`]) is returned for the agent to handle: the run goes on.
    pub async fn attach(
        &mut self,
        message_id: &str,
        file_name: &str,
        content_type: &str,
        bytes: Vec<u8>,
    ) -> anyhow::Result<GeneratedFile> {
        if self.cancel.is_cancelled() {
            return Err(Cancelled.into());
        }
        crate::generated::check_file_name(file_name)?;
        let index = match self.attached.iter().position(|(id, _)| id == message_id) {
            Some(index) => index,
            None => {
                self.attached.push((message_id.to_owned(), Vec::new()));
                self.attached.len() - 1
            }
        };
        let path = format!("/{file_name}");
        let known = &self.attached[index].1;
        if known.len() >= MAX_GENERATED_ATTACHMENTS && !known.iter().any(|f| f.path == path) {
            return Err(AttachError::Refused(format!(
                "a message may show at most {MAX_GENERATED_ATTACHMENTS} files"
            ))
            .into());
        }
        let content_url = match self
            .registrar
            .register(file_name, content_type, bytes)
            .await
        {
            Ok(url) => url,
            Err(err) => {
                if let AttachError::Unavailable(cause) = &err {
                    tracing::warn!(
                        task.id = %self.template.task_id,
                        error = format!("{cause:#}"),
                        "a generated file could not be stored"
                    );
                }
                return Err(err.into());
            }
        };
        let file = GeneratedFile::generated(file_name, content_type, content_url);
        let files = &mut self.attached[index].1;
        match files.iter_mut().find(|f| f.path == file.path) {
            Some(earlier) => *earlier = file.clone(),
            None => files.push(file.clone()),
        }
        let event = GeneratedAttachments {
            message_id: message_id.to_owned(),
            files: files.clone(),
        };
        let value = serde_json::to_value(&event)?;
        // What history and clients accept, checked before it is sent.
        GeneratedAttachments::parse_event(&value).map_err(AttachError::Refused)?;
        self.emit(Event::Custom {
            name: ATTACHMENTS_EVENT.to_owned(),
            value,
        })
        .await?;
        Ok(file)
    }

    /// Whether the owner cancelled the run.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// What the agent produced so far, as a `MessageBody`.
    pub(crate) fn output(&self) -> Result<MessageBody, MessageBodyError> {
        self.output.body()
    }

    /// Publishes a terminal event even after cancellation.
    pub(crate) async fn finish(&mut self, event: Event) -> anyhow::Result<()> {
        self.publish(event).await
    }

    /// The message id is `<task>:<seq>:<writer>`: a retried publish that was stored after all is
    /// not stored twice.
    async fn publish(&mut self, event: Event) -> anyhow::Result<()> {
        let seq = self.template.seq + 1;
        let message = RunEventMessage::V1(RunEventV1 {
            seq,
            emitted_at: Utc::now(),
            event,
            ..self.template.clone()
        });
        let payload = serde_json::to_vec(&message)?;
        let RunEventMessage::V1(stored) = &message;
        // A run's first and last events are free: a run refused for its owner's budget still
        // starts and ends in every client's eyes.
        if let Some(budget) = &self.budget
            && !stored.event.is_terminal()
            && !matches!(stored.event, Event::RunStarted { .. })
        {
            let spent = budget
                .spend(
                    &self.template.owner,
                    u64::try_from(payload.len()).unwrap_or(u64::MAX),
                    stored.emitted_at,
                )
                .await;
            match spent {
                Ok(Ok(())) => {}
                Ok(Err(exhausted)) => {
                    return Err(AgentFailure {
                        code: "quota_exceeded",
                        message: event_budget_refusal(&exhausted),
                    }
                    .into());
                }
                // The shared record cannot be reached (a NATS node lost, a leader election):
                // the run goes on. The budget bounds what an owner adds; it must not fail runs
                // while the bus recovers.
                Err(err) => {
                    tracing::warn!(
                        task.id = %self.template.task_id,
                        error = format!("{err:#}"),
                        "event budget not checked"
                    );
                }
            }
        }
        if stored.event.is_terminal()
            && let Some(ledger) = &self.tokens
        {
            let tokens = protocol::usage::total_tokens(&self.usage);
            // Like the event budget: NATS unreachable must not fail the run; the tokens of a
            // run that ends while it is go uncharged (logged).
            if let Err(err) = ledger
                .charge(&self.template.owner, tokens, stored.emitted_at)
                .await
            {
                tracing::warn!(
                    task.id = %self.template.task_id,
                    tokens,
                    error = format!("{err:#}"),
                    "run's tokens not charged"
                );
            }
        }
        // Fenced: if another worker ended this run meanwhile (this one was cut off long enough
        // to be taken for lost), nothing more of this writer is stored.
        let msg_id = format!("{}:{seq}:{}", self.template.task_id, self.writer.simple());
        self.stream_seq = platform::nats::publish_fenced(
            &self.js,
            &self.stream,
            &self.subject,
            &msg_id,
            self.stream_seq,
            payload.into(),
        )
        .await
        .map_err(|err| {
            if err.is::<platform::nats::Fenced>() {
                err
            } else {
                LogUnavailable(format!("{err:#}")).into()
            }
        })?;
        self.template.seq = seq;
        self.output.observe(&stored.event);
        match stored.event {
            Event::RunStarted { .. } => {
                self.times.started_at.get_or_insert(stored.emitted_at);
            }
            Event::TextMessageContent { .. } | Event::ToolCallStart { .. } => {
                self.times.first_output_at.get_or_insert(stored.emitted_at);
            }
            _ => {}
        }
        Ok(())
    }
}
