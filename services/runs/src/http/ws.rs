//! `GET /websocket`: the WebSocket message schema of `websocket-message-schema.md` (and the
//! `chat` message of `file-attachments.md`) over the same runs, event log and prompts as the
//! HTTP routes.
//!
//! Authentication: `Authorization: Bearer <token>`, or, for browsers (which cannot set headers
//! on a WebSocket), the subprotocols `bearer, <token>` (the server selects `bearer`), or, for a
//! client that can do neither, the seed's `security.token` (or `api_key`) in its first message,
//! sent within 10 s; without a valid one the socket gets an `error_message` and is closed
//! unserved. Every server message id is `<runId>:<seq>` of the event it comes from (a prompt's
//! id is the prompt id), so a client that reconnects with `?last_message_id=<id>` gets exactly
//! what it missed, then the rest live, and a prompt still pending with the time it has left; a
//! prompt's id there shows the prompt again while it waits, then the run that continues it.
//! `?conversation_id=<id>` (the NeMo UI's reconnect) shows the conversation's waiting prompt
//! again, or its active run from the start. A run continued after an answer or a timeout keeps
//! the original user message's id as every message's `parent_id`.
//!
//! Two dialects, per connection: a client whose latest `user_message` names one of the NeMo
//! Agent Toolkit's schema types (its UI sends `chat_stream`) gets the toolkit's wire values
//! (`complete`, and the end of the response after a failed or refused turn), any other the
//! seed's ([`WsDialect`]); the writer applies it to every message. An answer may name its prompt
//! by the prompt's id or, as the NeMo UI does, by the prompt's own `parent_id`: the connection
//! remembers the prompts it sent.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
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
use protocol::ErrorEnvelope;
use protocol::interaction::{PromptRecord, PromptStatus, prompt_key};
use protocol::messaging::RunEventV1;
use protocol::run_input::{ContentBlock, RunAgentInput, UserContent};
use protocol::ws::{
    Inbound, MAX_WS_MESSAGE_BYTES, WsDialect, WsError, WsErrorCode, WsMapper, WsMessage, WsType,
    parse_inbound,
};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::AppState;
use crate::events::FollowError;
use crate::limit::StreamPermit;
use crate::prompts::{self, PromptError, Reply};
use crate::start::{Answer, StartError, start_run};
use crate::thread::Open;

/// Server messages queued per connection before the slowest reader holds its runs back.
const OUTBOX: usize = 1024;
/// How often a connection is pinged.
const PING: Duration = Duration::from_secs(20);
/// The socket's first read buffer: it grows for a larger frame (up to the message limit). The
/// library's default, 128 KiB allocated per socket up front, made an idle WebSocket cost 149 KiB
/// (17.5 KiB now; BENCHMARKS.md section 16); a client's messages are small.
const WS_READ_BUFFER_BYTES: usize = 4 * 1024;
/// How often, once a prompt is closed (seen by a KV watch), the connection looks for the run
/// that continues it, published moments later (at most 50 looks).
const CONTINUATION_LOOK: Duration = Duration::from_millis(300);
/// Prompts a connection remembers having sent, to read an answer that names one by its
/// `parent_id` (a client answers the prompt it is shown, one of the last few).
const PROMPTS_KEPT: usize = 64;

#[derive(Debug, Deserialize)]
pub(crate) struct WsQuery {
    /// `<runId>:<seq>` of the last message received before a reconnect.
    last_message_id: Option<String>,
    /// The NeMo Agent Toolkit UI's reconnect parameter: a socket opened with it speaks the
    /// toolkit's dialect from its first message (a reloaded UI answers a waiting prompt before it
    /// sends any `schema_type`).
    conversation_id: Option<String>,
}

/// Upgrades an authenticated request to the WebSocket of websocket-message-schema.md (and the
/// chat message of file-attachments.md). The token comes in `Authorization: Bearer`, in the
/// subprotocols `bearer, <token>`, or in the first message's `security.token` (or `api_key`)
/// within 10 s.
#[utoipa::path(
    get,
    path = "/websocket",
    tag = "runs",
    params(("last_message_id" = Option<String>, Query, description = "`<runId>:<seq>` of the last message received before a reconnect."), ("conversation_id" = Option<String>, Query, description = "The NeMo Agent Toolkit UI's reconnect parameter.")),
    responses(
        (status = 101, description = "Switching protocols: the socket speaks the messages of websocket-message-schema.md."),
        (status = 400, description = "A bad `last_message_id` (`invalid_request`).", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
        (status = 429, description = "The owner holds as many open streams as allowed (`rate_limited`).", body = ErrorEnvelope),
    ),
)]
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
    let verified = match (header_token, protocols.as_slice()) {
        (Some(value), _) => Some(state.auth.verify_header(Some(value))),
        (None, [bearer, token, ..]) if bearer == "bearer" => Some(state.auth.verify(token)),
        // A client that cannot set headers: its first message's `security.token` (or
        // `api_key`) decides, within FIRST_MESSAGE.
        (None, _) => None,
    };
    let owner = match verified {
        None => None,
        Some(Ok(owner)) => Some(owner),
        Some(Err(_)) => {
            return ErrorResponse::new(
                StatusCode::UNAUTHORIZED,
                ErrorCode::Unauthorized,
                "a valid bearer token is required (Authorization header, the subprotocols bearer, <token>, or security.token in the first message)",
            )
            .with_header(header::WWW_AUTHENTICATE, "Bearer")
            .into_response();
        }
    };
    let rejoin = match (query.last_message_id.as_deref(), &query.conversation_id) {
        (Some(raw), _) => match parse_message_id(raw) {
            Some((run_id, seq)) => Some(Rejoin::Run(run_id, seq)),
            None if !raw.is_empty() && raw.chars().count() <= MAX_PROMPT_ID_CHARS => {
                Some(Rejoin::Prompt(raw.to_owned()))
            }
            None => return bad_cursor(),
        },
        (None, Some(conversation)) => Some(Rejoin::Conversation(conversation.clone())),
        (None, None) => None,
    };
    // Known owner: refusals are the upgrade's answer. Otherwise they come as the socket's
    // first error message, once the first message has authenticated it.
    let permit = match &owner {
        Some(owner) => {
            let permit = match admit(&state, owner, rejoin.as_ref()).await {
                Ok(permit) => permit,
                Err(refused) => return refused.into_response(),
            };
            // An id that is no run's cursor must be one of the caller's prompts.
            if let Some(Rejoin::Prompt(prompt_id)) = &rejoin
                && matches!(
                    prompts::record(&state.buckets, owner.as_str(), prompt_id).await,
                    Ok(None)
                )
            {
                return bad_cursor();
            }
            Some(permit)
        }
        None => None,
    };
    let upgrade = upgrade
        .max_message_size(MAX_WS_MESSAGE_BYTES)
        .read_buffer_size(WS_READ_BUFFER_BYTES);
    let upgrade = if protocols.first().is_some_and(|p| p == "bearer") {
        upgrade.protocols(["bearer"])
    } else {
        upgrade
    };
    upgrade.on_upgrade(move |socket| {
        // Split before the task's future: a socket it captured would keep its whole size in the
        // future (a moved-out capture keeps its place) for as long as the connection lives.
        let (mut sink, mut inbound) = socket.split();
        async move {
            let dialect = if query.conversation_id.is_some() {
                WsDialect::Toolkit
            } else {
                WsDialect::default()
            };
            // A refusal names the conversation the socket was opened for (the NeMo UI drops an
            // error_message without one).
            let conversation = query.conversation_id.as_deref();
            let (owner, first, permit) = match (owner, permit) {
                (Some(owner), Some(permit)) => (owner, None, permit),
                _ => {
                    // Boxed, as every await of the socket's rare moments: a task is as large as
                    // its largest await, and the socket's lives as long as the socket.
                    let Some((owner, first)) =
                        Box::pin(first_message_owner(&state, &mut inbound)).await
                    else {
                        let error = WsError::new(
                            WsErrorCode::InvalidMessage,
                            "a valid token is required: Authorization header, the subprotocols bearer, <token>, or security.token (or api_key) in the first message",
                            "security.token",
                        );
                        Box::pin(refuse(&mut sink, error, dialect, conversation)).await;
                        return;
                    };
                    match Box::pin(admit(&state, &owner, rejoin.as_ref())).await {
                        Ok(permit) => (owner, Some(first), permit),
                        Err(refused) => {
                            let error = refused.into_ws_error();
                            Box::pin(refuse(&mut sink, error, dialect, conversation)).await;
                            return;
                        }
                    }
                }
            };
            // A task of its own: this one, as large as everything the opening awaited, ends
            // here instead of living as long as the connection.
            tokio::spawn(Session::run(
                state,
                owner,
                (sink, inbound),
                first,
                rejoin,
                dialect,
                permit,
            ));
        }
    })
}

/// Where a connection opened with `last_message_id` or `conversation_id` starts.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Rejoin {
    /// After event `seq` of the caller's run `run_id` (`<runId>:<seq>`).
    Run(String, u64),
    /// At a prompt the client was sent (its id): shown again while it waits, then the run
    /// that continues it.
    Prompt(String),
    /// A conversation (the NeMo UI's `?conversation_id=`): its waiting prompt again, or its
    /// active run from the start.
    Conversation(String),
}

/// Longest prompt id a `last_message_id` may name.
const MAX_PROMPT_ID_CHARS: usize = 256;
/// How long a socket opened without a token may take to send its first message.
const FIRST_MESSAGE: Duration = Duration::from_secs(10);

/// A connection's admission for `owner`: a reconnect is a lookup (the per-owner budget of
/// status requests), and every connection takes one of the owner's stream slots.
async fn admit(
    state: &AppState,
    owner: &Owner,
    rejoin: Option<&Rejoin>,
) -> Result<StreamPermit, Refused> {
    if rejoin.is_some() {
        state
            .lookups
            .check(owner.as_str())
            .await
            .map_err(|refusal| match refusal {
                crate::limit::Refusal::Throttled(refused) => Refused::Throttled(refused),
                crate::limit::Refusal::Unavailable(err) => Refused::Unavailable(err),
            })?;
    }
    state
        .streams
        .acquire(owner.as_str(), "websocket")
        .ok_or(Refused::TooManyStreams)
}

/// Why a connection is not admitted.
enum Refused {
    Throttled(crate::limit::Throttled),
    TooManyStreams,
    /// The owner's rate cannot be checked (NATS).
    Unavailable(anyhow::Error),
}

impl Refused {
    fn into_response(self) -> Response {
        match self {
            Refused::Throttled(refused) => crate::http::ApiError::from(refused).into_response(),
            Refused::TooManyStreams => ErrorResponse::new(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::RateLimited,
                "too many open event streams and WebSockets; close one first",
            )
            .into_response(),
            Refused::Unavailable(err) => crate::http::ApiError::Unavailable(err).into_response(),
        }
    }

    fn into_ws_error(self) -> WsError {
        match self {
            Refused::Throttled(refused) => WsError::new(
                WsErrorCode::UnknownError,
                refused.to_string(),
                "rate_limited",
            ),
            Refused::TooManyStreams => WsError::new(
                WsErrorCode::UnknownError,
                "too many open event streams and WebSockets; close one first",
                "rate_limited",
            ),
            Refused::Unavailable(err) => {
                tracing::warn!(
                    error = format!("{err:#}"),
                    "a reconnect's rate cannot be checked"
                );
                WsError::new(
                    WsErrorCode::UnknownError,
                    "the service is unavailable; retry shortly",
                    "unavailable",
                )
            }
        }
    }
}

/// The owner named by the first message's `security.token` (or `security.api_key`, or a
/// top-level `api_key`), and that message; `None` when it does not come in time, is not text,
/// or carries no valid token.
async fn first_message_owner(
    state: &AppState,
    inbound: &mut futures::stream::SplitStream<WebSocket>,
) -> Option<(Owner, String)> {
    let frame = tokio::time::timeout(FIRST_MESSAGE, inbound.next())
        .await
        .ok()??
        .ok()?;
    let Message::Text(text) = frame else {
        return None;
    };
    let value: Value = serde_json::from_str(text.as_str()).ok()?;
    let token = value
        .pointer("/security/token")
        .or_else(|| value.pointer("/security/api_key"))
        .or_else(|| value.get("api_key"))
        .and_then(Value::as_str)?;
    let owner = state.auth.verify(token).ok()?;
    Some((owner, text.as_str().to_owned()))
}

/// Sends `error` (about `conversation_id`, if the socket was opened for one) and closes a
/// connection that will not be served.
async fn refuse(
    sink: &mut futures::stream::SplitSink<WebSocket, Message>,
    error: WsError,
    dialect: WsDialect,
    conversation_id: Option<&str>,
) {
    let message = error.to_message(
        format!("error-{}", uuid::Uuid::now_v7()),
        conversation_id,
        None,
        Utc::now(),
    );
    if let Ok(text) = message.to_json(dialect) {
        let _ = sink.send(Message::Text(Utf8Bytes::from(text))).await;
    }
    let _ = sink.close().await;
}

fn bad_cursor() -> Response {
    ErrorResponse::with_field(
        StatusCode::BAD_REQUEST,
        ErrorCode::InvalidRequest,
        "last_message_id must be the id of a message you were sent (<runId>:<seq>, or a prompt's id)",
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
    /// Boxed: a channel allocates its first 32 slots up front, which for messages held inline
    /// was several KiB per idle socket.
    out: mpsc::Sender<Box<WsMessage>>,
    /// Runs this connection started (and streams itself): a prompt's continuation started
    /// here is not followed a second time.
    started: Arc<Mutex<std::collections::HashSet<String>>>,
    /// What its client asked for and was asked, shared with the writer.
    client: Arc<Mutex<Client>>,
}

/// What a connection's client speaks and what it was asked.
#[derive(Debug, Default)]
struct Client {
    /// The wire values of its messages: its latest `user_message`'s `schema_type`.
    dialect: WsDialect,
    /// The last [`PROMPTS_KEPT`] prompts sent to it, oldest first, as (`parent_id`, prompt id).
    prompts: VecDeque<(String, String)>,
}

impl Client {
    /// Notes a message about to be written to the client; the dialect to write it in.
    fn sending(&mut self, message: &WsMessage) -> WsDialect {
        if message.kind == WsType::SystemInteractionMessage
            && let Some(parent) = &message.parent_id
            && !self.prompts.iter().any(|(_, id)| *id == message.id)
        {
            if self.prompts.len() == PROMPTS_KEPT {
                self.prompts.pop_front();
            }
            self.prompts.push_back((parent.clone(), message.id.clone()));
        }
        self.dialect
    }

    /// The prompt an answer's `parent_id` names: the prompt's own id, or the `parent_id` of a
    /// prompt sent to this client (the latest such), which the NeMo UI sends. `None`: neither
    /// was sent here; the id is then taken as a prompt's id (one asked elsewhere, e.g. AG-UI).
    fn prompt_named(&self, parent_id: &str) -> Option<String> {
        if self.prompts.iter().any(|(_, id)| id == parent_id) {
            return Some(parent_id.to_owned());
        }
        self.prompts
            .iter()
            .rev()
            .find(|(parent, _)| parent == parent_id)
            .map(|(_, id)| id.clone())
    }
}

impl Session {
    async fn run(
        state: AppState,
        owner: Owner,
        (mut sink, mut inbound): (
            futures::stream::SplitSink<WebSocket, Message>,
            futures::stream::SplitStream<WebSocket>,
        ),
        first: Option<String>,
        rejoin: Option<Rejoin>,
        dialect: WsDialect,
        permit: StreamPermit,
    ) {
        let (out, mut outbox) = mpsc::channel::<Box<WsMessage>>(OUTBOX);
        let client = Arc::new(Mutex::new(Client {
            dialect,
            ..Client::default()
        }));
        let told = Arc::clone(&client);
        let writer = tokio::spawn(async move {
            // A ping every PING keeps proxies from closing a quiet connection.
            let mut ping = tokio::time::interval(PING);
            ping.tick().await;
            loop {
                let frame = tokio::select! {
                    message = outbox.recv() => match message {
                        Some(message) => {
                            // Noted before it is written, so an answer to a prompt finds it.
                            let dialect = told
                                .lock()
                                .map(|mut client| client.sending(&message))
                                .unwrap_or_default();
                            match message.to_json(dialect) {
                                Ok(text) => Message::Text(Utf8Bytes::from(text)),
                                Err(_) => continue,
                            }
                        }
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
            started: Arc::default(),
            client,
        };
        // Boxed: the task waits at the loop below for as long as the socket is open, and is as
        // large as its largest await; handling a message is rare and may be large.
        match rejoin {
            Some(Rejoin::Run(run_id, seq)) => Box::pin(session.reconnect(&run_id, seq)).await,
            Some(Rejoin::Prompt(prompt_id)) => Box::pin(session.rejoin_prompt(&prompt_id)).await,
            Some(Rejoin::Conversation(thread_id)) => {
                Box::pin(session.rejoin_conversation(&thread_id)).await;
            }
            None => {}
        }
        if let Some(first) = first {
            Box::pin(session.handle(&first)).await;
        }
        let shutdown = state.shutdown.clone();
        loop {
            let frame = tokio::select! {
                () = shutdown.cancelled() => break,
                frame = inbound.next() => frame,
            };
            match frame {
                Some(Ok(Message::Text(text))) => Box::pin(session.handle(text.as_str())).await,
                Some(Ok(Message::Binary(_))) => {
                    let error = WsError::new(
                        WsErrorCode::InvalidMessage,
                        "messages must be JSON text frames",
                        "frame",
                    );
                    Box::pin(session.error(error, None, None)).await;
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {} // ping/pong: answered by the library
            }
        }
        drop(session);
        let _ = writer.await;
        drop(permit); // the connection's slot, held until it closes
    }

    async fn send(&self, message: WsMessage) {
        let _ = self.out.send(Box::new(message)).await;
    }

    async fn error(&self, error: WsError, conversation_id: Option<&str>, parent_id: Option<&str>) {
        let id = format!("error-{}", uuid::Uuid::now_v7());
        self.send(error.to_message(id, conversation_id, parent_id, Utc::now()))
            .await;
    }

    /// Refuses a `user_message`: the error, then, for a client that waits for the end of the
    /// response whatever happened (the toolkit's), that end: no run will answer this turn.
    async fn refuse_turn(
        &self,
        error: WsError,
        conversation_id: Option<&str>,
        parent_id: Option<&str>,
    ) {
        let id = format!("error-{}", uuid::Uuid::now_v7());
        let now = Utc::now();
        self.send(error.to_message(id.clone(), conversation_id, parent_id, now))
            .await;
        if let (Some(conversation_id), Some(parent_id)) = (conversation_id, parent_id)
            && self.dialect().ends_failed_turns()
        {
            self.send(WsMessage::response_end(id, conversation_id, parent_id, now))
                .await;
        }
    }

    fn dialect(&self) -> WsDialect {
        self.client
            .lock()
            .map(|client| client.dialect)
            .unwrap_or_default()
    }

    /// The prompt an answer's `parent_id` names ([`Client::prompt_named`]).
    fn prompt_named(&self, parent_id: &str) -> String {
        self.client
            .lock()
            .ok()
            .and_then(|client| client.prompt_named(parent_id))
            .unwrap_or_else(|| parent_id.to_owned())
    }

    async fn handle(&self, raw: &str) {
        let value: Value = serde_json::from_str(raw).unwrap_or_default();
        // Decided before the message is read, so a refusal is in the client's values too.
        if let Some(dialect) = WsDialect::requested_by(&value)
            && let Ok(mut client) = self.client.lock()
        {
            client.dialect = dialect;
        }
        match parse_inbound(raw) {
            Err(error) => {
                // Name the conversation and message when they can be read.
                let conversation = value
                    .get("conversation_id")
                    .or_else(|| value.get("session_id"))
                    .and_then(Value::as_str);
                let parent = value.get("id").and_then(Value::as_str);
                if value.get("type").and_then(Value::as_str) == Some("user_message") {
                    self.refuse_turn(error, conversation, parent).await;
                } else {
                    self.error(error, conversation, parent).await;
                }
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
                let prompt_id = self.prompt_named(&parent_id);
                // The continuing run answers the user message the prompt was about.
                let asked_about =
                    prompts::record(&self.state.buckets, self.owner.as_str(), &prompt_id)
                        .await
                        .ok()
                        .flatten()
                        .map_or_else(|| id.clone(), |record| record.parent_id);
                let answer = Answer {
                    prompt_id,
                    reply: Reply::Answer(Value::String(answer)),
                };
                self.start(input, Some(answer), &conversation_id, &asked_about)
                    .await;
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
        let turn = answer.is_none();
        if let Err(violation) = protocol::validate::validate_conversation(&input) {
            let error = WsError::new(
                WsErrorCode::InvalidUserMessageContent,
                violation.message,
                violation.field,
            );
            if turn {
                self.refuse_turn(error, Some(conversation_id), Some(parent_id))
                    .await;
            } else {
                self.error(error, Some(conversation_id), Some(parent_id))
                    .await;
            }
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
                match answered {
                    // An answer that cannot be taken is about the prompt it names.
                    Some(prompt) => {
                        self.error(api_error(err), Some(conversation_id), Some(&prompt))
                            .await;
                    }
                    None => {
                        self.refuse_turn(api_error(err), Some(conversation_id), Some(parent_id))
                            .await;
                    }
                }
                return;
            }
        };
        let trace_id = span.in_scope(platform::telemetry::current_trace_id);
        let Ok(task_id) = uuid::Uuid::try_parse(&accepted.task_id) else {
            return;
        };
        let session = self.clone();
        let mapper = WsMapper::new(conversation_id, parent_id, trace_id).in_dialect(self.dialect());
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
        let mapper = WsMapper::new(&record.thread_id, &parent, trace).in_dialect(self.dialect());
        let session = self.clone();
        let task_id = record.task_id;
        tokio::spawn(async move { session.forward(task_id, seq, mapper, true).await });
    }

    /// A reconnect whose last message was a prompt: the prompt again while it waits (with the
    /// time it has left), then the run that continues it, wherever it is answered; the
    /// continuation at once if it was answered meanwhile.
    async fn rejoin_prompt(&self, prompt_id: &str) {
        let record =
            match prompts::record(&self.state.buckets, self.owner.as_str(), prompt_id).await {
                Ok(Some(record)) => record,
                Ok(None) => {
                    let error = WsError::new(
                        WsErrorCode::InvalidMessage,
                        "last_message_id names no message of yours",
                        "last_message_id",
                    );
                    self.error(error, None, None).await;
                    return;
                }
                Err(err) => {
                    tracing::warn!(error = format!("{err:#}"), "reconnect lookup failed");
                    self.unavailable().await;
                    return;
                }
            };
        self.replay_prompt(&record).await;
    }

    /// The asking run's last event (the question: re-sent only while it waits), then what
    /// continues it.
    async fn replay_prompt(&self, record: &PromptRecord) {
        let last = match self.state.events.last_event(record.task_id).await {
            Ok(last) => last.map_or(0, |event| event.seq),
            Err(err) => {
                tracing::warn!(error = format!("{err:#}"), "reconnect lookup failed");
                self.unavailable().await;
                return;
            }
        };
        let mapper =
            WsMapper::new(&record.thread_id, &record.parent_id, None).in_dialect(self.dialect());
        let session = self.clone();
        let task_id = record.task_id;
        tokio::spawn(async move {
            session
                .forward(task_id, last.saturating_sub(1), mapper, true)
                .await;
        });
    }

    /// A client back on a conversation (`?conversation_id=`): the prompt that waits there, or
    /// the conversation's active run from its first event; nothing when it is idle.
    async fn rejoin_conversation(&self, thread_id: &str) {
        let owner = self.owner.as_str();
        let open = match self.state.threads.open_run(owner, thread_id).await {
            Ok(open) => open,
            Err(err) => {
                tracing::warn!(error = format!("{err:#}"), "conversation lookup failed");
                self.unavailable().await;
                return;
            }
        };
        match open {
            None => {}
            Some(Open::Prompt(_)) => {
                if let Ok(Some(record)) = self.state.threads.pending_prompt(owner, thread_id).await
                {
                    self.replay_prompt(&record).await;
                }
            }
            Some(Open::Active(task_id)) => {
                // The user message it answers, from its RUN_STARTED.
                let started = self.state.events.first_event(task_id).await.ok().flatten();
                let parent = started
                    .as_ref()
                    .and_then(|event| match &event.event {
                        protocol::agui::Event::RunStarted {
                            input: Some(input), ..
                        } => input
                            .pointer("/messages/0/id")
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                        _ => None,
                    })
                    .or_else(|| started.as_ref().map(|event| event.run_id.clone()))
                    .unwrap_or_default();
                let mapper = WsMapper::new(thread_id, &parent, None).in_dialect(self.dialect());
                let session = self.clone();
                tokio::spawn(async move { session.forward(task_id, 0, mapper, true).await });
            }
        }
    }

    async fn unavailable(&self) {
        self.error(
            WsError::new(WsErrorCode::UnknownError, "please reconnect", "unavailable"),
            None,
            None,
        )
        .await;
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
                if self.out.send(Box::new(message)).await.is_err() {
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
                // The continuing run answers the same user message.
                let parent = mapper.parent_id().to_owned();
                let trace = self
                    .state
                    .runs
                    .task(self.owner.as_str(), &next_run)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|t| t.trace_id);
                let mapper =
                    WsMapper::new(&last.thread_id, &parent, trace).in_dialect(self.dialect());
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
        StartError::OverBudget(exhausted) => WsError::new(
            WsErrorCode::UnknownError,
            crate::budget::refusal(&exhausted),
            "quota_exceeded",
        ),
        StartError::TooManyActive(full) => WsError::new(
            WsErrorCode::UnknownError,
            crate::budget::active_refusal(&full),
            "rate_limited",
        ),
        StartError::KeptFull(over) => WsError::new(
            WsErrorCode::UnknownError,
            crate::budget::kept_refusal(&over),
            "quota_exceeded",
        ),
        StartError::TokensSpent(over) => WsError::new(
            WsErrorCode::UnknownError,
            crate::budget::tokens_refusal(&over),
            "budget_exceeded",
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn prompt(id: &str, parent: &str) -> WsMessage {
        WsMessage {
            kind: WsType::SystemInteractionMessage,
            id: id.to_owned(),
            thread_id: Some(Some("c1".to_owned())),
            parent_id: Some(parent.to_owned()),
            intermediate_parent_id: None,
            conversation_id: Some("c1".to_owned()),
            content: json!({"input_type": "text", "text": "Why?"}),
            status: Some(protocol::ws::WsStatus::InProgress),
            timestamp: "2025-01-13T10:00:03.000Z".to_owned(),
        }
    }

    #[test]
    fn an_answer_names_a_prompt_sent_here_by_its_id_or_its_parent_id() {
        let mut client = Client::default();
        client.sending(&prompt("p1", "m1"));
        assert_eq!(client.prompt_named("p1").as_deref(), Some("p1"));
        assert_eq!(client.prompt_named("m1").as_deref(), Some("p1"));
        // The run that continues asks again about the same user message: the latest is meant.
        client.sending(&prompt("p2", "m1"));
        assert_eq!(client.prompt_named("m1").as_deref(), Some("p2"));
        assert_eq!(
            client.prompt_named("p1").as_deref(),
            Some("p1"),
            "a prompt's own id is always itself"
        );
        assert_eq!(client.prompt_named("elsewhere"), None);
    }

    #[test]
    fn a_prompt_sent_again_is_remembered_once_and_only_the_last_ones_are_kept() {
        let mut client = Client::default();
        client.sending(&prompt("p1", "m1"));
        client.sending(&prompt("p1", "m1"));
        assert_eq!(client.prompts.len(), 1);
        for i in 0..PROMPTS_KEPT + 1 {
            client.sending(&prompt(&format!("q{i}"), &format!("u{i}")));
        }
        assert_eq!(client.prompts.len(), PROMPTS_KEPT);
        assert_eq!(client.prompt_named("m1"), None, "the oldest is forgotten");
        assert_eq!(
            client.prompt_named(&format!("u{PROMPTS_KEPT}")),
            Some(format!("q{PROMPTS_KEPT}"))
        );
    }

    #[test]
    fn only_prompts_are_remembered_and_every_message_gets_the_clients_dialect() {
        let mut client = Client {
            dialect: WsDialect::Toolkit,
            ..Client::default()
        };
        let mut reply = prompt("r1:3", "m1");
        reply.kind = WsType::SystemResponseMessage;
        assert_eq!(client.sending(&reply), WsDialect::Toolkit);
        assert_eq!(client.prompt_named("m1"), None);
    }
}
