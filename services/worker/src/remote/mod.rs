//! Agents served elsewhere over AG-UI (LangGraph, Pydantic AI, CrewAI, ... behind their AG-UI
//! adapters), configured in the agents file ([`config`]). For each run the relay POSTs one
//! `RunAgentInput` to the agent: the run's ids, the thread's earlier messages from history (such
//! a server keeps nothing between requests), the new user message with its files (signed links
//! or extracted text), tools, context, the thread's last state, forwarded props, `resume` when
//! the run continues an interrupt, and a `traceparent`. Every event it answers is checked
//! ([`verify`]) and published into the run's own log, so every transport, history and resume
//! treat it like any other run. A misbehaving agent ends the run with a `RUN_ERROR` whose code
//! names what went wrong ([`codes`]); the worker goes on.

pub mod config;
pub mod interrupt;
pub mod verify;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use futures::future::BoxFuture;
use protocol::agents::AgentCard;
use protocol::files::{SignReply, SignRequest};
use protocol::messaging::{Names, RunTaskV1, ThreadMessagesReply, ThreadMessagesRequest};
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::agent::{Agent, AgentFailure, ModelInput};
use crate::sink::{Cancelled, EventSink};
pub use config::{FilesMode, RemoteAgentConfig};
use protocol::agui_files::{FileRef, file_refs, gone, replace_files};
use verify::{End, ProtocolError, Verifier};

/// The `RUN_ERROR` codes of a remote run that went wrong.
pub mod codes {
    /// The agent could not be reached, or answered a status that is not 2xx.
    pub const UNAVAILABLE: &str = "agent_unavailable";
    /// A connect, first-event, idle or whole-run time limit passed.
    pub const TIMEOUT: &str = "agent_timeout";
    /// The agent's answer broke the AG-UI protocol.
    pub const PROTOCOL: &str = "agent_protocol_error";
    /// The agent reported an error itself (`RUN_ERROR`).
    pub const AGENT: &str = "agent_error";
    /// The thread's earlier messages could not be read from history.
    pub const HISTORY: &str = "history_unavailable";
}

/// Most earlier messages of the thread sent to an agent.
const HISTORY_LIMIT: u32 = 200;
/// How long the relay waits for history to catch up with the thread's earlier runs.
const HISTORY_WAIT: Duration = Duration::from_secs(10);
/// One NATS request's timeout (history, attachments).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// After `RUN_FINISHED`, how long the relay waits for the agent to close its stream (an event
/// then is a protocol error).
const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// Largest thread record kept (a JetStream message is at most 1 MiB).
const MAX_RECORD_BYTES: usize = 900 * 1024;

/// What the relay keeps of a thread between runs (`<PREFIX>_THREAD_STATE`, key
/// [`thread_key`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ThreadRecord {
    /// The agent that wrote it.
    pub agent: String,
    /// The thread's last state, as the agent left it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<Value>,
    /// The interrupts the agent's last run stopped on (answered with the next run's `resume`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interrupts: Vec<Value>,
}

/// Key of a thread's record.
pub fn thread_key(owner: &str, thread_id: &str) -> String {
    protocol::messaging::thread_state_key(owner, thread_id)
}

/// What the relay needs of NATS.
#[derive(Clone)]
pub struct RelayContext {
    /// For history's and attachments' request/reply endpoints.
    pub client: async_nats::Client,
    /// Subjects.
    pub names: Names,
    /// Threads' records.
    pub threads: platform::nats::JsonKv,
}

/// One configured remote agent.
pub struct RemoteAgent {
    config: RemoteAgentConfig,
    http: reqwest::Client,
    context: RelayContext,
    slots: Option<Arc<Semaphore>>,
}

impl RemoteAgent {
    /// The agent of `config`, relaying through `context`.
    pub fn new(config: RemoteAgentConfig, context: RelayContext) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(config.timeouts.connect)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        let slots = config.max_concurrency.map(|n| Arc::new(Semaphore::new(n)));
        Ok(Self {
            config,
            http,
            context,
            slots,
        })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Whether runs that name no agent go to it.
    pub fn is_default(&self) -> bool {
        self.config.default
    }

    fn failure(&self, code: &'static str, message: String) -> anyhow::Error {
        AgentFailure {
            code,
            message: format!("the agent {:?} {message}", self.config.name),
        }
        .into()
    }

    async fn relay(&self, input: &ModelInput<'_>, sink: &mut EventSink) -> anyhow::Result<()> {
        let agent = self.config.name.clone();
        let _permit = match &self.slots {
            None => None,
            Some(slots) => tokio::select! {
                permit = Arc::clone(slots).acquire_owned() => Some(permit?),
                () = sink.cancelled() => return Err(Cancelled.into()),
            },
        };
        let in_flight = platform::metrics::GaugeGuard::new(metrics::gauge!(
            "switchboard_remote_agent_in_flight", "agent" => agent.clone()
        ));
        let result = self.relay_run(input, sink).await;
        drop(in_flight);
        let code = match &result {
            Ok(()) => "ok",
            Err(err) if err.is::<Cancelled>() => "cancelled",
            Err(err) => err
                .downcast_ref::<AgentFailure>()
                .map_or("error", |f| f.code),
        };
        metrics::counter!("switchboard_remote_agent_runs_total", "agent" => agent, "code" => code)
            .increment(1);
        result
    }

    async fn relay_run(&self, input: &ModelInput<'_>, sink: &mut EventSink) -> anyhow::Result<()> {
        let task = input.task;
        let key = thread_key(&task.owner, &task.input.thread_id);
        let record = self
            .context
            .threads
            .get::<ThreadRecord>(&key)
            .await?
            .map(|(record, _)| record)
            .filter(|record| record.agent == self.config.name)
            .unwrap_or_default();
        let state = match &task.input.state {
            Some(state) if !is_empty_state(state) => Some(state.clone()),
            _ => record.state.clone(),
        };
        let messages = self.messages(input, sink).await?;
        let mut body = json!({
            "threadId": task.input.thread_id,
            "runId": task.input.run_id,
            "state": state.clone().unwrap_or_else(|| json!({})),
            "messages": messages,
            "tools": task.input.tools.clone().unwrap_or_default(),
            "context": task.input.context.clone().unwrap_or_default(),
            "forwardedProps": task.input.forwarded_props.clone().unwrap_or_else(|| json!({})),
        });
        if let Some(parent) = &task.input.parent_run_id {
            body["parentRunId"] = json!(parent);
        }
        if let Some(resumed) = &task.resumed
            && !record.interrupts.is_empty()
        {
            body["resume"] = json!(interrupt::resume(&record.interrupts, &resumed.outcome));
        }
        let started = Instant::now();
        let deadline = started + self.config.timeouts.run;
        let response = self.connect(&body, &task.owner, sink, deadline).await?;
        let mut verifier = Verifier::new(state);
        let end = self
            .read(response, &mut verifier, sink, started, deadline)
            .await?;
        match end {
            End::Failed { message, usage } => {
                for entry in usage {
                    sink.add_usage(entry);
                }
                Err(AgentFailure {
                    code: codes::AGENT,
                    message,
                }
                .into())
            }
            End::Finished {
                result,
                outcome,
                usage,
            } => {
                for entry in usage {
                    sink.add_usage(entry);
                }
                let interrupts = interrupt::interrupts(outcome.as_ref())
                    .map_err(|err| self.failure(codes::PROTOCOL, format!("sent {err}")))?;
                if !interrupts.is_empty() {
                    let prompt = interrupt::prompt_of(&interrupts, chrono::Utc::now())
                        .map_err(|err| self.failure(codes::PROTOCOL, format!("sent {err}")))?;
                    sink.ask(prompt);
                }
                if let Some(result) = result {
                    sink.set_result(result);
                }
                let changed = verifier.changed_state().cloned();
                if changed.is_some() || !interrupts.is_empty() || !record.interrupts.is_empty() {
                    let mut next = ThreadRecord {
                        agent: self.config.name.clone(),
                        state: changed.or(record.state),
                        interrupts,
                    };
                    if serde_json::to_vec(&next).map_or(0, |bytes| bytes.len()) > MAX_RECORD_BYTES {
                        // The broker takes no message over 1 MiB: the thread's next run starts
                        // from the state its client sends (the interrupts are still kept).
                        tracing::warn!(agent = %self.config.name, "thread state too large to keep");
                        next.state = None;
                    }
                    self.context.threads.put(&key, &next).await?;
                }
                Ok(())
            }
        }
    }

    /// Sends the request, trying again (with backoff) while the connection fails, before any
    /// event; answers the response once its status and type are right.
    async fn connect(
        &self,
        body: &Value,
        owner: &str,
        sink: &EventSink,
        deadline: Instant,
    ) -> anyhow::Result<reqwest::Response> {
        let payload = serde_json::to_vec(body)?;
        let first_event = Instant::now() + self.config.timeouts.first_event;
        let mut tries = 0;
        loop {
            let mut headers = HeaderMap::new();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
            for (name, value) in &self.config.headers {
                headers.insert(name.clone(), value.clone());
            }
            if let Some(name) = &self.config.owner_header
                && let Ok(value) = HeaderValue::from_str(owner)
            {
                headers.insert(name.clone(), value);
            }
            platform::telemetry::inject_current_http(&mut headers);
            let send = self
                .http
                .post(self.config.url.clone())
                .headers(headers)
                .body(payload.clone())
                .send();
            let until = tokio::time::Instant::from_std(first_event.min(deadline));
            let outcome = tokio::select! {
                () = sink.cancelled() => return Err(Cancelled.into()),
                sent = tokio::time::timeout_at(until, send) => sent,
            };
            let err = match outcome {
                Err(_) => return Err(self.timed_out(first_event, deadline, true)),
                Ok(Ok(response)) => return self.check_response(response).await,
                Ok(Err(err)) => err,
            };
            if !err.is_connect() || tries >= self.config.retries {
                tracing::warn!(agent = %self.config.name, error = %err, "remote agent unreachable");
                return Err(if err.is_timeout() {
                    self.failure(
                        codes::TIMEOUT,
                        format!(
                            "could not be connected to within {}",
                            secs(self.config.timeouts.connect)
                        ),
                    )
                } else {
                    self.failure(codes::UNAVAILABLE, "could not be reached".to_owned())
                });
            }
            tries += 1;
            let backoff = Duration::from_millis(250 * 2u64.pow(tries.min(3)));
            tracing::debug!(agent = %self.config.name, tries, "remote agent unreachable, trying again");
            tokio::select! {
                () = sink.cancelled() => return Err(Cancelled.into()),
                () = tokio::time::sleep(backoff) => {}
            }
        }
    }

    async fn check_response(
        &self,
        response: reqwest::Response,
    ) -> anyhow::Result<reqwest::Response> {
        let status = response.status();
        if !status.is_success() {
            tracing::warn!(agent = %self.config.name, %status, "remote agent refused the run");
            return Err(self.failure(
                codes::UNAVAILABLE,
                format!("answered HTTP {}", status.as_u16()),
            ));
        }
        let kind = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        if !kind.to_ascii_lowercase().starts_with("text/event-stream") {
            let shown = if kind.is_empty() {
                "no content type".to_owned()
            } else {
                kind
            };
            return Err(self.failure(
                codes::PROTOCOL,
                format!("answered {shown}, not an event stream (text/event-stream)"),
            ));
        }
        Ok(response)
    }

    fn timed_out(
        &self,
        first_event: Instant,
        deadline: Instant,
        before_first: bool,
    ) -> anyhow::Error {
        let timeouts = &self.config.timeouts;
        let message = if Instant::now() >= deadline || deadline <= first_event && before_first {
            format!("did not finish the run within {}", secs(timeouts.run))
        } else if before_first {
            format!(
                "sent no event within {} (first event timeout)",
                secs(timeouts.first_event)
            )
        } else {
            format!("sent no event for {} (idle timeout)", secs(timeouts.idle))
        };
        self.failure(codes::TIMEOUT, message)
    }

    /// Reads the event stream to the agent's end, relaying each event.
    async fn read(
        &self,
        response: reqwest::Response,
        verifier: &mut Verifier,
        sink: &mut EventSink,
        started: Instant,
        deadline: Instant,
    ) -> anyhow::Result<End> {
        let agent = self.config.name.clone();
        let events_total =
            metrics::counter!("switchboard_remote_agent_events_total", "agent" => agent.clone());
        let mut body = response.bytes_stream();
        let mut parser = protocol::sse::SseParser::new();
        let first_event = started + self.config.timeouts.first_event;
        let mut seen_first = false;
        let mut end: Option<End> = None;
        let closed_early = || {
            self.failure(
                codes::PROTOCOL,
                "closed its event stream before RUN_FINISHED".to_owned(),
            )
        };
        loop {
            let until = if end.is_some() {
                Instant::now() + CLOSE_GRACE.min(self.config.timeouts.idle)
            } else if seen_first {
                Instant::now() + self.config.timeouts.idle
            } else {
                first_event
            };
            let until = tokio::time::Instant::from_std(until.min(deadline));
            let next = tokio::select! {
                () = sink.cancelled() => return Err(Cancelled.into()),
                next = tokio::time::timeout_at(until, body.next()) => next,
            };
            // The frames a chunk completes; at the end of the body, the last one (if any).
            let (frames, body_ended) = match next {
                Err(_) if end.is_some() => break, // finished; the agent left its stream open
                Err(_) => return Err(self.timed_out(first_event, deadline, !seen_first)),
                Ok(Some(Ok(bytes))) => (parser.push(&bytes), false),
                Ok(Some(Err(err))) => {
                    tracing::warn!(agent = %agent, error = %err, "remote agent stream broke");
                    if end.is_some() {
                        break;
                    }
                    return Err(closed_early());
                }
                Ok(None) => (parser.finish().map(|last| last.into_iter().collect()), true),
            };
            let frames = frames.map_err(|err| {
                self.failure(codes::PROTOCOL, format!("sent an unreadable stream: {err}"))
            })?;
            self.handle(
                frames,
                verifier,
                sink,
                &mut end,
                &mut seen_first,
                started,
                &events_total,
            )
            .await?;
            if body_ended {
                return end.ok_or_else(closed_early);
            }
        }
        end.ok_or_else(closed_early)
    }

    #[allow(clippy::too_many_arguments)]
    async fn handle(
        &self,
        frames: Vec<protocol::sse::SseFrame>,
        verifier: &mut Verifier,
        sink: &mut EventSink,
        end: &mut Option<End>,
        seen_first: &mut bool,
        started: Instant,
        events_total: &metrics::Counter,
    ) -> anyhow::Result<()> {
        for frame in frames {
            let protocol::sse::SseFrame::Event(event) = frame else {
                continue; // a comment: a keep-alive
            };
            if event.data.len() > self.config.max_event_bytes {
                return Err(self.failure(
                    codes::PROTOCOL,
                    format!(
                        "sent an event of {} bytes, over the {} byte limit",
                        event.data.len(),
                        self.config.max_event_bytes
                    ),
                ));
            }
            if !*seen_first {
                *seen_first = true;
                metrics::histogram!("switchboard_remote_agent_first_event_seconds", "agent" => self.config.name.clone())
                    .record(started.elapsed().as_secs_f64());
            }
            let value: Value = serde_json::from_str(&event.data).map_err(|err| {
                self.failure(
                    codes::PROTOCOL,
                    format!("sent an event that is not JSON: {err}"),
                )
            })?;
            let step = verifier.accept(value).map_err(|ProtocolError(why)| {
                self.failure(codes::PROTOCOL, format!("sent {why}"))
            })?;
            events_total.increment(1);
            for relayed in step.relay {
                sink.emit(relayed).await?;
            }
            if let Some(step_end) = step.end {
                *end = Some(step_end);
            }
        }
        Ok(())
    }

    /// The messages the agent gets: the thread's earlier messages from history (as first sent),
    /// then the run's own messages history does not hold (by id: a client that resends the
    /// whole conversation, as AG-UI's `HttpAgent` does, adds only its new turn); a run that
    /// continues after a prompt gets the earlier messages only (the answer goes in `resume`).
    /// Files as signed links or extracted text.
    async fn messages(
        &self,
        input: &ModelInput<'_>,
        sink: &EventSink,
    ) -> anyhow::Result<Vec<Value>> {
        let task = input.task;
        let mut messages = self.history(task, input.runs_seq, sink).await?;
        if task.resumed.is_none() {
            let known: std::collections::HashSet<String> = messages
                .iter()
                .filter_map(|m| m.get("id").and_then(Value::as_str).map(str::to_owned))
                .collect();
            for message in &task.input.messages {
                if !known.contains(message.id()) {
                    messages.push(serde_json::to_value(message)?);
                }
            }
        }
        self.files(&mut messages, input).await;
        Ok(messages)
    }

    /// The thread's messages before this run, from history (waiting, within a bound, for it to
    /// write the thread's earlier runs).
    #[tracing::instrument(name = "worker.remote.history", skip_all)]
    async fn history(
        &self,
        task: &RunTaskV1,
        runs_seq: u64,
        sink: &EventSink,
    ) -> anyhow::Result<Vec<Value>> {
        let request = ThreadMessagesRequest::V1 {
            owner: task.owner.clone(),
            thread_id: task.input.thread_id.clone(),
            task_id: task.task_id,
            runs_seq,
            limit: HISTORY_LIMIT,
            signed_links: false,
        };
        let asked = platform::rpc::request_until(
            &self.context.client,
            self.context.names.history_thread_messages_subject(),
            serde_json::to_vec(&request)?.into(),
            REQUEST_TIMEOUT,
            HISTORY_WAIT,
            |payload| {
                Ok(match serde_json::from_slice(payload)? {
                    ThreadMessagesReply::V1 { messages, .. } => Some(messages),
                    ThreadMessagesReply::Behind => None,
                })
            },
        );
        // The owner's cancel stops the waiting too.
        let answered = tokio::select! {
            answered = asked => answered?,
            () = sink.cancelled() => return Err(Cancelled.into()),
        };
        answered.ok_or_else(|| {
            AgentFailure {
                code: codes::HISTORY,
                message: "the conversation's earlier messages could not be read".to_owned(),
            }
            .into()
        })
    }

    /// Replaces every `s3://` file reference in user messages: with a signed download link
    /// (`files = "urls"`), or, for the new message's files, with a text part of the extracted
    /// content (`files = "text"`). A file that is gone becomes a text part saying so.
    async fn files(&self, messages: &mut [Value], input: &ModelInput<'_>) {
        let refs = file_refs(messages);
        if refs.is_empty() {
            return;
        }
        let replacements: Vec<Value> = match self.config.files {
            FilesMode::Urls => {
                let urls = refs.iter().map(|r| r.url.clone()).collect();
                let signed = self.sign(&input.task.owner, urls).await;
                replace_files(messages, &refs, signed);
                return;
            }
            FilesMode::Text => refs
                .iter()
                .map(
                    |FileRef {
                         message,
                         block,
                         url,
                     }| {
                        let block = &messages[*message]["content"][*block];
                        let found = input.attachments.iter().find(|a| {
                            format!(
                                "s3://{}/{}",
                                a.file.bucket,
                                a.file.path.trim_start_matches('/')
                            ) == *url
                        });
                        match found {
                            Some(attachment) => {
                                let text = match &attachment.content {
                                    Ok(extracted) => {
                                        extract::as_prompt_text(attachment.file.name(), extracted)
                                    }
                                    Err(reason) => extract::as_prompt_text(
                                        attachment.file.name(),
                                        &extract::Extracted::Unsupported {
                                            reason: reason.clone(),
                                        },
                                    ),
                                };
                                json!({"type": "text", "text": text})
                            }
                            None => gone(block),
                        }
                    },
                )
                .collect(),
        };
        for (r, replacement) in refs.into_iter().zip(replacements) {
            messages[r.message]["content"][r.block] = replacement;
        }
    }

    /// Fresh download links for `urls` of `owner` (`None` for a file gone or not verified).
    #[tracing::instrument(name = "worker.remote.sign", skip_all, fields(count = urls.len()))]
    async fn sign(&self, owner: &str, urls: Vec<String>) -> Vec<Option<String>> {
        let count = urls.len();
        let request = SignRequest::V1 {
            owner: owner.to_owned(),
            urls,
        };
        let asked = async {
            let payload = serde_json::to_vec(&request)?;
            let reply = platform::rpc::request(
                &self.context.client,
                self.context.names.attachments_sign_subject(),
                payload.into(),
                REQUEST_TIMEOUT,
            )
            .await?;
            let SignReply::V1 { urls, .. } = serde_json::from_slice(&reply.payload)?;
            anyhow::Ok(urls)
        };
        match asked.await {
            Ok(urls) if urls.len() == count => urls,
            Ok(_) | Err(_) => {
                tracing::warn!(count, "attachment links not signed for a remote agent");
                vec![None; count]
            }
        }
    }
}

/// Whether a client's `state` says nothing (`{}` or `null`, what the seeds' clients send).
fn is_empty_state(state: &Value) -> bool {
    match state {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        _ => false,
    }
}

fn secs(duration: Duration) -> String {
    let secs = duration.as_secs_f64();
    if secs.fract() == 0.0 {
        format!("{secs:.0} s")
    } else {
        format!("{secs} s")
    }
}

impl Agent for RemoteAgent {
    fn card(&self) -> anyhow::Result<AgentCard> {
        Ok(AgentCard {
            name: self.config.name.clone(),
            description: self.config.description.clone(),
            input_schema: self.config.input_schema.clone(),
            output_schema: self.config.output_schema.clone(),
            default: false,
        })
    }

    fn reads_attachments(&self) -> bool {
        self.config.files == FilesMode::Text
    }

    fn run<'a>(
        &'a self,
        input: &'a ModelInput<'a>,
        sink: &'a mut EventSink,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(self.relay(input, sink))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_states_are_the_seed_clients_nothing() {
        assert!(is_empty_state(&json!({})));
        assert!(is_empty_state(&Value::Null));
        assert!(!is_empty_state(&json!({"a": 1})));
        assert!(!is_empty_state(&json!([])));
    }

    #[test]
    fn a_thread_key_depends_on_owner_and_thread() {
        assert_ne!(thread_key("a", "t"), thread_key("b", "t"));
        assert_eq!(thread_key("a", "t"), thread_key("a", "t"));
        assert!(thread_key("a", "t").starts_with("state."));
    }

    #[test]
    fn durations_read_as_seconds() {
        assert_eq!(secs(Duration::from_secs(5)), "5 s");
        assert_eq!(secs(Duration::from_millis(1500)), "1.5 s");
    }
}
