//! `GET /websocket`: the WebSocket message schema of `websocket-message-schema.md` (and the
//! `chat` message of `file-attachments.md`) over the same runs, event log and prompts as the
//! HTTP routes.
//!
//! Authentication: `Authorization: Bearer <token>`, or, for browsers (which cannot set headers
//! on a WebSocket), the subprotocols `bearer, <token>` (the server selects `bearer`). Every
//! server message id is `<runId>:<seq>` of the event it comes from (a prompt's id is the prompt
//! id), so a client that reconnects with `?last_message_id=<id>` gets exactly what it missed,
//! then the rest live, and a prompt still pending with the time it has left.

use std::time::Duration;

use axum::extract::ws::{Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use futures::{SinkExt, StreamExt};
use platform::auth::Owner;
use platform::http::ErrorResponse;
use protocol::ErrorCode;
use protocol::interaction::{PromptRecord, PromptStatus, prompt_key};
use protocol::messaging::RunEventV1;
use protocol::run_input::{ContentBlock, RunAgentInput, UserContent};
use protocol::ws::{
    Inbound, MAX_WS_MESSAGE_BYTES, WsError, WsErrorCode, WsMapper, WsMessage, WsType, parse_inbound,
};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::AppState;
use crate::events::FollowError;
use crate::prompts::{self, PromptError, Reply};
use crate::start::{Answer, StartError, start_run};

/// Server messages queued per connection before the slowest reader holds its runs back.
const OUTBOX: usize = 1024;
/// How often a connection is pinged.
const PING: Duration = Duration::from_secs(20);
/// How often, once a prompt is closed (seen by a KV watch), the connection looks for the run
/// that continues it, published moments later (at most 50 looks).
const CONTINUATION_LOOK: Duration = Duration::from_millis(300);

#[derive(Debug, Deserialize)]
pub(crate) struct WsQuery {
    /// `<runId>:<seq>` of the last message received before a reconnect.
    last_message_id: Option<String>,
}

/// Upgrades an authenticated request.
pub(crate) async fn websocket(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<WsQuery>, axum::extract::rejection::QueryRejection>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let Ok(Query(query)) = query else {
        return bad_cursor();
    };
    let protocols: Vec<String> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_owned())
        .collect();
    let header_token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let owner = match (header_token, protocols.as_slice()) {
        (Some(value), _) => state.auth.verify_header(Some(value)),
        (None, [bearer, token, ..]) if bearer == "bearer" => state.auth.verify(token),
        (None, _) => state.auth.verify_header(None),
    };
    let owner = match owner {
        Ok(owner) => owner,
        Err(_) => {
            return ErrorResponse::new(
                StatusCode::UNAUTHORIZED,
                ErrorCode::Unauthorized,
                "a valid bearer token is required (Authorization header or the subprotocols bearer, <token>)",
            )
            .with_header(header::WWW_AUTHENTICATE, "Bearer")
            .into_response();
        }
    };
    let resume_from = match query.last_message_id.as_deref().map(parse_message_id) {
        None => None,
        Some(Some(at)) => Some(at),
        Some(None) => return bad_cursor(),
    };
    let Some(permit) = state.streams.acquire(owner.as_str(), "websocket") else {
        return ErrorResponse::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::RateLimited,
            "too many open event streams and WebSockets; close one first",
        )
        .into_response();
    };
    let upgrade = upgrade.max_message_size(MAX_WS_MESSAGE_BYTES);
    let upgrade = if protocols.first().is_some_and(|p| p == "bearer") {
        upgrade.protocols(["bearer"])
    } else {
        upgrade
    };
    upgrade.on_upgrade(move |socket| async move {
        Session::run(state, owner, socket, resume_from).await;
        drop(permit); // the connection's slot, held until it closes
    })
}

fn bad_cursor() -> Response {
    ErrorResponse::with_field(
        StatusCode::BAD_REQUEST,
        ErrorCode::InvalidRequest,
        "last_message_id must be <runId>:<seq>",
        "last_message_id",
    )
    .into_response()
}

/// `<runId>:<seq>` (the run id may itself contain colons).
fn parse_message_id(raw: &str) -> Option<(String, u64)> {
    let (run, seq) = raw.rsplit_once(':')?;
    (!run.is_empty()).then_some(())?;
    Some((run.to_owned(), seq.parse().ok()?))
}

/// One connection.
#[derive(Clone)]
struct Session {
    state: AppState,
    owner: Owner,
    out: mpsc::Sender<WsMessage>,
    /// Runs this connection started (and streams itself): a prompt's continuation started
    /// here is not followed a second time.
    started: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

impl Session {
    async fn run(
        state: AppState,
        owner: Owner,
        socket: WebSocket,
        resume_from: Option<(String, u64)>,
    ) {
        let (mut sink, mut inbound) = socket.split();
        let (out, mut outbox) = mpsc::channel::<WsMessage>(OUTBOX);
        let writer = tokio::spawn(async move {
            // A ping every PING keeps proxies from closing a quiet connection.
            let mut ping = tokio::time::interval(PING);
            ping.tick().await;
            loop {
                let frame = tokio::select! {
                    message = outbox.recv() => match message {
                        Some(message) => match serde_json::to_string(&message) {
                            Ok(text) => Message::Text(Utf8Bytes::from(text)),
                            Err(_) => continue,
                        },
                        None => break,
                    },
                    _ = ping.tick() => Message::Ping(bytes::Bytes::new()),
                };
                if sink.send(frame).await.is_err() {
                    break;
                }
            }
            let _ = sink.close().await;
        });
        let session = Session {
            state: state.clone(),
            owner,
            out,
            started: std::sync::Arc::default(),
        };
        if let Some((run_id, seq)) = resume_from {
            session.reconnect(&run_id, seq).await;
        }
        let shutdown = state.shutdown.clone();
        loop {
            let frame = tokio::select! {
                () = shutdown.cancelled() => break,
                frame = inbound.next() => frame,
            };
            match frame {
                Some(Ok(Message::Text(text))) => session.handle(text.as_str()).await,
                Some(Ok(Message::Binary(_))) => {
                    session
                        .error(
                            WsError::new(
                                WsErrorCode::InvalidMessage,
                                "messages must be JSON text frames",
                                "frame",
                            ),
                            None,
                            None,
                        )
                        .await;
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {} // ping/pong: answered by the library
            }
        }
        drop(session);
        let _ = writer.await;
    }

    async fn send(&self, message: WsMessage) {
        let _ = self.out.send(message).await;
    }

    async fn error(&self, error: WsError, conversation_id: Option<&str>, parent_id: Option<&str>) {
        let id = format!("error-{}", uuid::Uuid::now_v7());
        self.send(error.to_message(id, conversation_id, parent_id, Utc::now()))
            .await;
    }

    async fn handle(&self, raw: &str) {
        match parse_inbound(raw) {
            Err(error) => {
                // Name the conversation and message when they can be read.
                let value: Value = serde_json::from_str(raw).unwrap_or_default();
                let conversation = value
                    .get("conversation_id")
                    .or_else(|| value.get("session_id"))
                    .and_then(Value::as_str);
                let parent = value.get("id").and_then(Value::as_str);
                self.error(error, conversation, parent).await;
            }
            Ok(Inbound::UserMessage {
                id,
                conversation_id,
                content,
            }) => {
                let input = RunAgentInput::turn(&conversation_id, &id, &id, content);
                self.start(input, None, &conversation_id, &id).await;
            }
            Ok(Inbound::UserInteraction {
                id,
                conversation_id,
                parent_id,
                answer,
            }) => {
                self.mark_started(&id);
                let input = RunAgentInput::turn(
                    &conversation_id,
                    &id,
                    &id,
                    UserContent::Text(answer.clone()),
                );
                let answer = Answer {
                    prompt_id: parent_id,
                    reply: Reply::Answer(Value::String(answer)),
                };
                self.start(input, Some(answer), &conversation_id, &id).await;
            }
            Ok(Inbound::Chat {
                message,
                session_id,
                content_urls,
            }) => {
                let id = uuid::Uuid::now_v7().to_string();
                let input = chat_input(&session_id, &id, &message, &content_urls);
                self.start(input, None, &session_id, &id).await;
            }
        }
    }

    fn mark_started(&self, run_id: &str) {
        if let Ok(mut started) = self.started.lock() {
            started.insert(run_id.to_owned());
        }
    }

    fn started_here(&self, run_id: &str) -> bool {
        self.started.lock().is_ok_and(|s| s.contains(run_id))
    }

    /// Accepts a run and streams it to this connection.
    async fn start(
        &self,
        input: RunAgentInput,
        answer: Option<Answer>,
        conversation_id: &str,
        parent_id: &str,
    ) {
        if let Err(violation) = protocol::validate::validate_conversation(&input) {
            let error = WsError::new(
                WsErrorCode::InvalidUserMessageContent,
                violation.message,
                violation.field,
            );
            self.error(error, Some(conversation_id), Some(parent_id))
                .await;
            return;
        }
        let span = tracing::info_span!("runs.ws.turn", conversation.id = %conversation_id);
        let answered = answer.as_ref().map(|a| a.prompt_id.clone());
        let accepted = start_run(&self.state, &self.owner, input, true, answer)
            .instrument(span.clone())
            .await;
        let accepted = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                // An answer that cannot be taken is about the prompt it names.
                let about = answered.as_deref().unwrap_or(parent_id);
                self.error(api_error(err), Some(conversation_id), Some(about))
                    .await;
                return;
            }
        };
        let trace_id = span.in_scope(platform::telemetry::current_trace_id);
        let Ok(task_id) = uuid::Uuid::try_parse(&accepted.task_id) else {
            return;
        };
        let session = self.clone();
        let mapper = WsMapper::new(conversation_id, parent_id, trace_id);
        tokio::spawn(async move { session.forward(task_id, 0, mapper, false).await });
    }

    /// A reconnect: the run of `last_message_id` after `seq`, then what followed it.
    async fn reconnect(&self, run_id: &str, seq: u64) {
        let record = match self.state.runs.find(self.owner.as_str(), run_id).await {
            Ok(Some(record)) => record,
            Ok(None) => {
                let error = WsError::new(
                    WsErrorCode::InvalidMessage,
                    "last_message_id names no run of yours",
                    "last_message_id",
                );
                self.error(error, None, None).await;
                return;
            }
            Err(err) => {
                tracing::warn!(error = format!("{err:#}"), "reconnect lookup failed");
                self.error(
                    WsError::new(WsErrorCode::UnknownError, "please reconnect", "unavailable"),
                    None,
                    None,
                )
                .await;
                return;
            }
        };
        let task = self
            .state
            .runs
            .task(self.owner.as_str(), run_id)
            .await
            .ok()
            .flatten();
        let (parent, trace) = task.as_ref().map_or((run_id.to_owned(), None), |t| {
            (
                last_user_id(&t.input).unwrap_or_else(|| run_id.to_owned()),
                t.trace_id.clone(),
            )
        });
        let mapper = WsMapper::new(&record.thread_id, &parent, trace);
        let session = self.clone();
        let task_id = record.task_id;
        tokio::spawn(async move { session.forward(task_id, seq, mapper, true).await });
    }

    /// Streams one run's events after `after` as server messages; a run that stopped on a
    /// prompt is followed by the run that continues it, wherever the prompt is answered.
    async fn forward(self, task_id: uuid::Uuid, after: u64, mut mapper: WsMapper, replay: bool) {
        let events = match self.state.events.follow(task_id, after, false).await {
            Ok(events) => events,
            Err(FollowError::Expired { .. }) => {
                let error = WsError::new(
                    WsErrorCode::InvalidMessage,
                    "the events after last_message_id are no longer retained",
                    "last_message_id",
                );
                self.error(error, None, None).await;
                return;
            }
            // The client has the run's last event: nothing to replay.
            Err(FollowError::Ended { .. }) => return,
            Err(err @ FollowError::PastEnd { .. }) => {
                let error = WsError::new(
                    WsErrorCode::InvalidMessage,
                    err.to_string(),
                    "last_message_id",
                );
                self.error(error, None, None).await;
                return;
            }
            Err(FollowError::Nats(err)) => {
                tracing::warn!(error = format!("{err:#}"), "cannot follow run events");
                return;
            }
        };
        let mut events =
            std::pin::pin!(events.take_until(self.state.shutdown.clone().cancelled_owned()));
        let mut prompt: Option<String> = None;
        let mut last: Option<RunEventV1> = None;
        while let Some(event) = events.next().await {
            for message in mapper.map(&event, Utc::now()) {
                if message.kind == WsType::SystemInteractionMessage {
                    // Only a prompt still waiting is (re)sent, with the time it has left.
                    let pending =
                        prompts::pending(&self.state.buckets, self.owner.as_str(), &message.id)
                            .await
                            .ok()
                            .flatten();
                    if pending.is_none() && replay {
                        prompt = Some(message.id.clone());
                        continue;
                    }
                    prompt = Some(message.id.clone());
                }
                if self.out.send(message).await.is_err() {
                    return;
                }
            }
            last = Some(event);
        }
        let (Some(prompt_id), Some(last)) = (prompt, last) else {
            return;
        };
        // Wait for the prompt to be answered (here or elsewhere), time out or be cancelled,
        // then follow the run that continues the conversation.
        let Some(next_run) = self.continuation(&prompt_id).await else {
            return;
        };
        if self.started_here(&next_run) {
            return; // answered on this connection: that run is already streamed here
        }
        for _ in 0..50 {
            if let Ok(Some(record)) = self.state.runs.find(self.owner.as_str(), &next_run).await {
                let parent = if next_run.ends_with("-timeout") {
                    prompt_id.clone()
                } else {
                    next_run.clone()
                };
                let trace = self
                    .state
                    .runs
                    .task(self.owner.as_str(), &next_run)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|t| t.trace_id);
                let mapper = WsMapper::new(&last.thread_id, &parent, trace);
                Box::pin(self.forward(record.task_id, 0, mapper, false)).await;
                return;
            }
            tokio::time::sleep(CONTINUATION_LOOK).await;
        }
    }

    /// The run id that continues after the prompt, once it is closed: a KV watch on the
    /// prompt's record (its current value, then its changes), not a poll; `None` when the
    /// prompt is gone, the client left or the service stops.
    async fn continuation(&self, prompt_id: &str) -> Option<String> {
        let key = prompt_key(prompt_id);
        let prompts = &self.state.buckets.prompts;
        // A prompt that was never stored (or is gone) has no continuation to wait for.
        prompts.get::<PromptRecord>(&key).await.ok().flatten()?;
        let changes = prompts.watch_key::<PromptRecord>(&key).await.ok()?;
        let mut changes = std::pin::pin!(changes);
        loop {
            tokio::select! {
                () = self.out.closed() => return None,
                () = self.state.shutdown.cancelled() => return None,
                change = changes.next() => match change? {
                    Some(record) if record.status != PromptStatus::Pending => {
                        return record.continuation_run_id;
                    }
                    Some(_) => {}
                    None => return None, // deleted
                },
            }
        }
    }
}

fn last_user_id(input: &RunAgentInput) -> Option<String> {
    input
        .messages
        .iter()
        .rev()
        .find(|m| matches!(m, protocol::run_input::Message::User(_)))
        .map(|m| m.id().to_owned())
}

/// The run of a `chat` message (`file-attachments.md`): the text and each `content_url` as a
/// document part, which admission resolves to the caller's verified file.
pub(crate) fn chat_input(
    session_id: &str,
    message_id: &str,
    message: &str,
    content_urls: &[String],
) -> RunAgentInput {
    let blocks = std::iter::once(ContentBlock::text(message))
        .chain(
            content_urls
                .iter()
                .map(|url| ContentBlock::document_at(url)),
        )
        .collect();
    RunAgentInput::turn(
        session_id,
        message_id,
        message_id,
        UserContent::Blocks(blocks),
    )
}

/// The WebSocket error for a refused run.
fn api_error(err: StartError) -> WsError {
    match err {
        StartError::Prompt(err, _) => match err {
            PromptError::NotFound => WsError::new(
                WsErrorCode::InvalidMessage,
                "parent_id names no prompt of this conversation",
                "parent_id",
            ),
            PromptError::Closed(_) => {
                WsError::new(WsErrorCode::InvalidMessage, err.to_string(), "parent_id")
            }
            PromptError::Expired(message) => {
                WsError::new(WsErrorCode::WorkflowError, message, "TimeoutError")
            }
            PromptError::BadAnswer(message) => WsError::new(
                WsErrorCode::InvalidUserMessageContent,
                message,
                "content.messages",
            ),
            PromptError::Nats(e) => {
                tracing::warn!(error = format!("{e:#}"), "prompt store failed");
                WsError::new(WsErrorCode::UnknownError, "please retry", "unavailable")
            }
        },
        StartError::Refused(v) => {
            let code = if v.field.contains("/content/") {
                WsErrorCode::InvalidDataContent
            } else {
                WsErrorCode::InvalidUserMessageContent
            };
            WsError::new(code, v.message, v.field)
        }
        StartError::Conflict | StartError::ThreadBusy => WsError::new(
            WsErrorCode::InvalidMessage,
            "this message id was already used differently, or the conversation is busy",
            "id",
        ),
        StartError::RateLimited(wait) => WsError::new(
            WsErrorCode::UnknownError,
            format!(
                "too many runs started; retry in {} s",
                wait.as_secs().max(1)
            ),
            "rate_limited",
        ),
        other => {
            tracing::warn!(error = ?other, "run not started");
            WsError::new(
                WsErrorCode::UnknownError,
                "the run could not be started; please retry",
                "unavailable",
            )
        }
    }
}
