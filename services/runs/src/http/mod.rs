//! HTTP routes of the runs service: thin handlers that extract, call and wrap.

pub(crate) mod openapi;
pub(crate) mod thread_admin;
pub(crate) mod ws;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use platform::auth::Owner;
use platform::http::ErrorResponse;
use platform::openapi::{Endpoint, Verb};
use protocol::ErrorCode;
use protocol::ErrorEnvelope;
use protocol::TaskAcceptedResponse;
use protocol::message_body::TooMuchWork;
use protocol::run_input::RunAgentInput;
use protocol::run_input::RunStatusResponse;
use protocol::validate::{
    MAX_PAYLOAD_BYTES, Violation, ViolationKind, messages, parse_conversation_input,
    parse_run_input,
};

use crate::AppState;
use crate::agents::ChooseError;
use crate::compatibility::CheckError;
use crate::events::{FollowError, Replay};
use crate::http::openapi::{AgentEntry, AgentList, CompatibilityAnswer};
use crate::limit::{Refusal, StreamPermit, Throttled};
use crate::prompts::{PromptError, Reply};
use crate::start::{Answer, StartError, start_run};
use crate::status::status_response;
use crate::thread::{Cursor, ThreadError};

/// How often an idle event stream sends a comment.
const HEARTBEAT: Duration = Duration::from_secs(15);

/// Longest run id accepted in a path.
const MAX_PATH_ID_CHARS: usize = 128;

/// Every route of the service: the router is built from this table, and the system tests
/// compare it with the OpenAPI document the service serves ([`crate::openapi`]).
pub(crate) fn endpoints() -> Vec<Endpoint<AppState>> {
    use crate::http::thread_admin::{erase_me, erase_thread, fork_thread, rename_thread, whoami};
    vec![
        Endpoint::new(Verb::Post, "/api/v1/agent/runs", create_run),
        // The chat-messages document's path for the same contract.
        Endpoint::new(Verb::Post, "/api/v1/agent/run", create_run_alias),
        Endpoint::new(Verb::Get, "/api/v1/agent/runs/{runId}", run_status),
        Endpoint::new(Verb::Post, "/api/v1/agent/runs/{runId}/cancel", cancel_run),
        Endpoint::new(Verb::Get, "/api/v1/agent/runs/{runId}/events", run_events),
        Endpoint::new(
            Verb::Get,
            "/api/v1/agent/threads/{threadId}/events",
            thread_events,
        ),
        Endpoint::new(
            Verb::Patch,
            "/api/v1/agent/threads/{threadId}",
            rename_thread,
        ),
        Endpoint::new(
            Verb::Delete,
            "/api/v1/agent/threads/{threadId}",
            erase_thread,
        ),
        Endpoint::new(
            Verb::Post,
            "/api/v1/agent/threads/{threadId}/fork",
            fork_thread,
        ),
        Endpoint::new(Verb::Get, "/api/v1/agent/me", whoami),
        Endpoint::new(Verb::Delete, "/api/v1/agent/me", erase_me),
        Endpoint::new(Verb::Post, "/api/v1/agent/ag-ui", ag_ui_run),
        Endpoint::new(Verb::Post, "/v2/chat", chat),
        Endpoint::new(Verb::Get, "/api/v1/agents", list_agents),
        Endpoint::new(Verb::Post, "/api/v1/agents/compatibility", compatibility),
        Endpoint::new(Verb::Get, "/websocket", crate::http::ws::websocket),
        Endpoint::new(Verb::Get, "/openapi.json", crate::http::openapi::serve),
    ]
}

pub(crate) fn router(state: AppState) -> Router {
    platform::openapi::router(endpoints()).with_state(state)
}

/// Errors of the runs API; each variant's doc names its status.
#[derive(Debug)]
pub(crate) enum ApiError {
    /// 413: the body is over the size limit.
    TooLarge,
    /// 415: the body is not JSON.
    NotJson,
    /// 400 (malformed) or 422 (a seed rule is broken), naming the field.
    Invalid(Violation),
    /// 409: the run was accepted before with a different body.
    Conflict,
    /// 409: another run is still active on the thread (policy `reject`).
    ThreadBusy,
    /// 429: the owner started too many runs; retry after the duration.
    RateLimited(Duration),
    /// 403: the owner's bytes of runs for the day are spent.
    OverBudget(crate::budget::Exhausted),
    TokensSpent(platform::tokens::OverBudget),
    KeptFull(platform::kept::OverKept),
    TooManyActive(platform::owner_set::Full),
    /// 404: no such run for this owner.
    NotFound,
    /// 403 `forbidden`: the caller may not do this; names the field that asked for it.
    Forbidden(&'static str, &'static str),
    /// 404: no message and no run of this owner on this thread.
    NoThread,
    /// 409: the owner has a thread with the id a fork asked for.
    ThreadExists,
    /// 400: a thread stream's `Last-Event-ID` that is not one of its event ids (or names
    /// another thread's run).
    BadThreadCursor,
    /// 410: the events after the client's position are no longer retained.
    Expired(u64),
    /// 400: a `Last-Event-ID` that is not an event id of this API.
    BadCursor,
    /// 400: a `Last-Event-ID` past the run's last event (`after`, `last`).
    PastEnd(u64, u64),
    /// 429: the owner holds as many open streams as allowed.
    TooManyStreams,
    /// 429 (with `Retry-After`): the owner spent a per-owner request budget (run lookups,
    /// compatibility checks); the message names it.
    Throttled(Throttled),
    /// 422: two schemas whose comparison needs more work than one request may do, naming the
    /// limit.
    TooComplex(TooMuchWork),
    /// 409/410/422/503: an answer to a prompt (`resume`) that cannot be taken, naming the field.
    Prompt(PromptError, String),
    /// 400: a path id that cannot be a run id.
    BadId,
    /// 500: something failed on our side.
    Internal(anyhow::Error),
    /// 503: NATS did not acknowledge.
    Unavailable(anyhow::Error),
}

impl From<StartError> for ApiError {
    fn from(err: StartError) -> Self {
        match err {
            StartError::RateLimited(wait) => ApiError::RateLimited(wait),
            StartError::Refused(violation) => ApiError::Invalid(violation),
            StartError::Prompt(err, field) => ApiError::Prompt(err, field),
            StartError::Conflict => ApiError::Conflict,
            StartError::ThreadBusy => ApiError::ThreadBusy,
            StartError::OverBudget(exhausted) => ApiError::OverBudget(exhausted),
            StartError::TokensSpent(over) => ApiError::TokensSpent(over),
            StartError::KeptFull(over) => ApiError::KeptFull(over),
            StartError::TooManyActive(full) => ApiError::TooManyActive(full),
            StartError::Unavailable(err) => ApiError::Unavailable(err),
        }
    }
}

impl From<Throttled> for ApiError {
    fn from(refused: Throttled) -> Self {
        ApiError::Throttled(refused)
    }
}

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Throttled(refused) => ApiError::Throttled(refused),
            Refusal::Unavailable(err) => ApiError::Unavailable(err),
        }
    }
}

impl From<CheckError> for ApiError {
    fn from(err: CheckError) -> Self {
        match err {
            CheckError::Throttled(refused) => ApiError::Throttled(refused),
            CheckError::Invalid(violation) => ApiError::Invalid(violation),
            CheckError::TooMuchWork(limit) => ApiError::TooComplex(limit),
            CheckError::Internal(err) => ApiError::Internal(err),
            CheckError::Unavailable(err) => ApiError::Unavailable(err),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::TooLarge => ErrorResponse::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::PayloadTooLarge,
                messages::PAYLOAD_TOO_LARGE,
            ),
            ApiError::NotJson => ErrorResponse::with_field(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ErrorCode::UnsupportedMediaType,
                "Content-Type must be application/json",
                "Content-Type",
            ),
            ApiError::Invalid(v) => {
                let status = match v.kind {
                    ViolationKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
                    ViolationKind::Malformed => StatusCode::BAD_REQUEST,
                    ViolationKind::Rule => StatusCode::UNPROCESSABLE_ENTITY,
                };
                ErrorResponse::with_field(status, ErrorCode::InvalidRequest, v.message, v.field)
            }
            ApiError::Conflict => ErrorResponse::with_field(
                StatusCode::CONFLICT,
                ErrorCode::Conflict,
                "this runId was already accepted on this thread with a different body",
                "/runId",
            ),
            ApiError::ThreadBusy => ErrorResponse::with_field(
                StatusCode::CONFLICT,
                ErrorCode::Conflict,
                "another run is still active on this thread",
                "/threadId",
            ),
            ApiError::RateLimited(wait) => {
                let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
                let mut response = ErrorResponse::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    ErrorCode::RateLimited,
                    format!("too many runs started; retry in {secs} s"),
                )
                .into_response();
                if let Ok(value) = HeaderValue::from_str(&secs.max(1).to_string()) {
                    response.headers_mut().insert(header::RETRY_AFTER, value);
                }
                return response;
            }
            ApiError::OverBudget(exhausted) => {
                let secs = exhausted.resets_in.as_secs().max(1);
                let mut response = ErrorResponse::new(
                    StatusCode::FORBIDDEN,
                    ErrorCode::QuotaExceeded,
                    crate::budget::refusal(&exhausted),
                )
                .into_response();
                if let Ok(value) = HeaderValue::from_str(&secs.to_string()) {
                    response.headers_mut().insert(header::RETRY_AFTER, value);
                }
                return response;
            }
            ApiError::TokensSpent(over) => {
                let mut response = ErrorResponse::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    ErrorCode::BudgetExceeded,
                    crate::budget::tokens_refusal(&over),
                )
                .into_response();
                let secs = over.resets_in.as_secs().max(1).to_string();
                if let Ok(value) = HeaderValue::from_str(&secs) {
                    response.headers_mut().insert(header::RETRY_AFTER, value);
                }
                return response;
            }
            ApiError::KeptFull(over) => ErrorResponse::new(
                StatusCode::FORBIDDEN,
                ErrorCode::QuotaExceeded,
                crate::budget::kept_refusal(&over),
            ),
            ApiError::TooManyActive(full) => {
                return ErrorResponse::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    ErrorCode::RateLimited,
                    crate::budget::active_refusal(&full),
                )
                .retry_after(crate::budget::ACTIVE_RETRY_AFTER)
                .into_response();
            }
            ApiError::NotFound => ErrorResponse::not_found("run"),
            ApiError::Forbidden(field, message) => ErrorResponse::with_field(
                StatusCode::FORBIDDEN,
                ErrorCode::Forbidden,
                message,
                field,
            ),
            ApiError::NoThread => ErrorResponse::not_found("thread"),
            ApiError::ThreadExists => ErrorResponse::with_field(
                StatusCode::CONFLICT,
                ErrorCode::Conflict,
                "you have a thread with this id already",
                "/threadId",
            ),
            ApiError::BadThreadCursor => ErrorResponse::with_field(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidRequest,
                "Last-Event-ID must be the id of an event of this thread's stream (<taskId>:<seq>, or 0)",
                "Last-Event-ID",
            ),
            ApiError::Expired(after) => ErrorResponse::with_field(
                StatusCode::GONE,
                ErrorCode::Expired,
                format!(
                    "the events of this run after {after} are no longer retained; read the thread's history instead"
                ),
                "Last-Event-ID",
            ),
            ApiError::Prompt(err, field) => {
                let (status, code) = match &err {
                    PromptError::NotFound | PromptError::BadAnswer(_) => {
                        (StatusCode::UNPROCESSABLE_ENTITY, ErrorCode::InvalidRequest)
                    }
                    PromptError::Closed(_) => (StatusCode::CONFLICT, ErrorCode::Conflict),
                    PromptError::Expired(_) => (StatusCode::GONE, ErrorCode::Expired),
                    PromptError::Nats(e) => {
                        return ErrorResponse::unavailable(&anyhow::anyhow!("{e:#}"))
                            .into_response();
                    }
                };
                ErrorResponse::with_field(status, code, err.to_string(), field)
            }
            ApiError::Throttled(refused) => ErrorResponse::new(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::RateLimited,
                refused.to_string(),
            )
            .retry_after(refused.wait),
            ApiError::TooComplex(limit) => ErrorResponse::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorCode::InvalidRequest,
                limit.to_string(),
            ),
            ApiError::TooManyStreams => ErrorResponse::new(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::RateLimited,
                "too many open event streams; close one first",
            ),
            ApiError::BadCursor => ErrorResponse::with_field(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidRequest,
                "Last-Event-ID must be the id of an event this stream sent (a non-negative integer)",
                "Last-Event-ID",
            ),
            ApiError::PastEnd(after, last) => ErrorResponse::with_field(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidRequest,
                format!("Last-Event-ID {after} is past the last event of this run ({last})"),
                "Last-Event-ID",
            ),
            ApiError::BadId => ErrorResponse::with_field(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidRequest,
                "runId exceeds length limit",
                "runId",
            ),
            ApiError::Unavailable(err) => ErrorResponse::unavailable(&err),
            ApiError::Internal(err) => ErrorResponse::internal(&err),
        }
        .into_response()
    }
}

/// `POST /api/v1/agent/runs`: validate, publish, answer 202 after the JetStream ack; with
/// `Accept: text/event-stream`, answer with the run's event stream instead.
#[utoipa::path(
    post,
    path = "/api/v1/agent/runs",
    tag = "runs",
    request_body(content = RunAgentInput, content_type = "application/json", description = "The run: `RunAgentInput` of agent-run-input-protocol.md, exactly one user message."),
    responses(
        (status = 202, description = "Accepted, after JetStream acknowledged it (or the original answer to a retried request).", body = TaskAcceptedResponse),
        (status = 200, description = "With `Accept: text/event-stream`: the run's AG-UI events, as `GET .../events` streams them.", content_type = "text/event-stream", body = String),
        (status = 400, description = "Malformed: the body, a parameter or a header breaks its rule (`invalid_request`); `field` names it.", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
        (status = 403, description = "A per-owner budget is spent: bytes of runs for the day, kept runs, active runs (`forbidden`/`quota_exceeded`).", body = ErrorEnvelope),
        (status = 409, description = "The run was accepted before with another body, or another run is active on the thread (`conflict`).", body = ErrorEnvelope),
        (status = 413, description = "The body is over the size limit (`payload_too_large`).", body = ErrorEnvelope),
        (status = 415, description = "The body is not `application/json` (`unsupported_media_type`).", body = ErrorEnvelope),
        (status = 422, description = "A rule of the run input is broken (`invalid_request`); `field` names it.", body = ErrorEnvelope),
        (status = 429, description = "Too many runs started (`rate_limited`), or a token budget is spent (`budget_exceeded`); `Retry-After` says when to retry.", body = ErrorEnvelope),
        (status = 503, description = "A dependency (NATS, the history service) did not answer (`unavailable`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn create_run(
    State(state): State<AppState>,
    owner: Owner,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_json_body(&headers, body).await?;
    let input = parse_run_input(&bytes).map_err(ApiError::Invalid)?;
    let accepted = start_run(&state, &owner, input, false, None).await?;
    if platform::http::accepts_event_stream(&headers) {
        return stream_events(&state, &owner, &accepted).await;
    }
    Ok((StatusCode::ACCEPTED, axum::Json(accepted)).into_response())
}

/// `POST /api/v1/agent/run`: the same as `POST /api/v1/agent/runs`, at the path of
/// agent-chat-messages-protocol.md.
#[utoipa::path(
    post,
    path = "/api/v1/agent/run",
    tag = "runs",
    request_body(content = RunAgentInput, content_type = "application/json", description = "The run: `RunAgentInput` of agent-run-input-protocol.md, exactly one user message."),
    responses(
        (status = 202, description = "Accepted, after JetStream acknowledged it (or the original answer to a retried request).", body = TaskAcceptedResponse),
        (status = 200, description = "With `Accept: text/event-stream`: the run's AG-UI events, as `GET .../events` streams them.", content_type = "text/event-stream", body = String),
        (status = 400, description = "Malformed: the body, a parameter or a header breaks its rule (`invalid_request`); `field` names it.", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
        (status = 403, description = "A per-owner budget is spent: bytes of runs for the day, kept runs, active runs (`forbidden`/`quota_exceeded`).", body = ErrorEnvelope),
        (status = 409, description = "The run was accepted before with another body, or another run is active on the thread (`conflict`).", body = ErrorEnvelope),
        (status = 413, description = "The body is over the size limit (`payload_too_large`).", body = ErrorEnvelope),
        (status = 415, description = "The body is not `application/json` (`unsupported_media_type`).", body = ErrorEnvelope),
        (status = 422, description = "A rule of the run input is broken (`invalid_request`); `field` names it.", body = ErrorEnvelope),
        (status = 429, description = "Too many runs started (`rate_limited`), or a token budget is spent (`budget_exceeded`); `Retry-After` says when to retry.", body = ErrorEnvelope),
        (status = 503, description = "A dependency (NATS, the history service) did not answer (`unavailable`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn create_run_alias(
    state: State<AppState>,
    owner: Owner,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    create_run(state, owner, headers, body).await
}

/// `POST /api/v1/agent/ag-ui`: the route for AG-UI clients (`HttpAgent`), which resend the whole
/// conversation every turn. Any `threadId`, the new turn last; the server keeps the history and
/// recognises resent messages by id. Always answers with the run's event stream.
#[utoipa::path(
    post,
    path = "/api/v1/agent/ag-ui",
    tag = "runs",
    request_body(content = RunAgentInput, content_type = "application/json", description = "AG-UI `RunAgentInput`: the whole conversation, the new turn last; `resume` answers an interrupt."),
    responses(
        (status = 200, description = "Server-sent events: each `data:` is one AG-UI event (JSON), `id:` its event id.", content_type = "text/event-stream", body = String),
        (status = 400, description = "Malformed: the body, a parameter or a header breaks its rule (`invalid_request`); `field` names it.", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
        (status = 409, description = "The run id was used with another body, the thread is busy, or the prompt `resume` answers is closed (`conflict`).", body = ErrorEnvelope),
        (status = 410, description = "The prompt `resume` answers has expired (`expired`).", body = ErrorEnvelope),
        (status = 413, description = "The body is over the size limit (`payload_too_large`).", body = ErrorEnvelope),
        (status = 415, description = "The body is not `application/json` (`unsupported_media_type`).", body = ErrorEnvelope),
        (status = 422, description = "A rule of the input is broken, or `resume` does not fit its prompt (`invalid_request`); `field` names it.", body = ErrorEnvelope),
        (status = 429, description = "Too many runs started, or a budget is spent (`rate_limited`, `budget_exceeded`).", body = ErrorEnvelope),
        (status = 503, description = "A dependency (NATS, the history service) did not answer (`unavailable`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn ag_ui_run(
    State(state): State<AppState>,
    owner: Owner,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_json_body(&headers, body).await?;
    let input = parse_conversation_input(&bytes).map_err(ApiError::Invalid)?;
    let answer = resume(&input)?;
    let accepted = start_run(&state, &owner, input, true, answer).await?;
    stream_events(&state, &owner, &accepted).await
}

/// AG-UI 1.0 `resume`: the answer to the interrupt the thread's last run finished with. One
/// interrupt per run; its answer is checked against the prompt and closes it for every
/// transport.
fn resume(input: &RunAgentInput) -> Result<Option<Answer>, ApiError> {
    let Some(entries) = input
        .extra
        .get("resume")
        .and_then(serde_json::Value::as_array)
    else {
        return Ok(None);
    };
    let invalid = |field: &str, message: &str| {
        ApiError::Invalid(Violation {
            kind: ViolationKind::Rule,
            field: field.to_owned(),
            message: message.to_owned(),
        })
    };
    let entry = match entries.as_slice() {
        [] => return Ok(None),
        [entry] => entry,
        _ => return Err(invalid("/resume", "resume answers one interrupt per run")),
    };
    let interrupt_id = entry
        .get("interruptId")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| invalid("/resume/0/interruptId", "resume[0].interruptId is required"))?;
    let reply = match entry.get("status").and_then(serde_json::Value::as_str) {
        Some("resolved") => Reply::Answer(entry.get("payload").cloned().unwrap_or_default()),
        Some("cancelled") => Reply::Cancel,
        _ => {
            return Err(invalid(
                "/resume/0/status",
                "resume[0].status must be resolved or cancelled",
            ));
        }
    };
    Ok(Some(Answer {
        prompt_id: interrupt_id.to_owned(),
        reply,
    }))
}

/// `POST /v2/chat`: the REST form of the chat API of `file-attachments.md`
/// (`{"message", "session_id", "content_urls"}`), answered with the run's AG-UI event stream.
#[utoipa::path(
    post,
    path = "/v2/chat",
    tag = "runs",
    request_body(content = Object, content_type = "application/json", description = "The chat message of file-attachments.md: `message`, `session_id`, up to 3 `content_urls` of the caller's verified files."),
    responses(
        (status = 200, description = "Server-sent events: each `data:` is one AG-UI event (JSON), `id:` its event id.", content_type = "text/event-stream", body = String),
        (status = 400, description = "Malformed: the body, a parameter or a header breaks its rule (`invalid_request`); `field` names it.", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
        (status = 413, description = "The body is over the size limit (`payload_too_large`).", body = ErrorEnvelope),
        (status = 415, description = "The body is not `application/json` (`unsupported_media_type`).", body = ErrorEnvelope),
        (status = 422, description = "A rule of the chat message is broken (`invalid_request`); `field` names it.", body = ErrorEnvelope),
        (status = 429, description = "Too many runs started, or a budget is spent (`rate_limited`, `budget_exceeded`).", body = ErrorEnvelope),
        (status = 503, description = "A dependency (NATS, the history service) did not answer (`unavailable`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn chat(
    State(state): State<AppState>,
    owner: Owner,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_json_body(&headers, body).await?;
    let mut value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|err| {
        ApiError::Invalid(Violation {
            kind: ViolationKind::Malformed,
            field: String::new(),
            message: format!("the body is not JSON: {err}"),
        })
    })?;
    if let Some(object) = value.as_object_mut() {
        object.insert("type".to_owned(), "chat".into());
    }
    let inbound = protocol::ws::parse_inbound_value(value).map_err(|err| {
        ApiError::Invalid(Violation {
            kind: ViolationKind::Rule,
            field: err.details,
            message: err.message,
        })
    })?;
    let protocol::ws::Inbound::Chat {
        message,
        session_id,
        content_urls,
    } = inbound
    else {
        return Err(ApiError::Internal(anyhow::anyhow!(
            "chat body read as another message"
        )));
    };
    let id = uuid::Uuid::now_v7().to_string();
    let input = crate::http::ws::chat_input(&session_id, &id, &message, &content_urls);
    let accepted = start_run(&state, &owner, input, true, None).await?;
    stream_events(&state, &owner, &accepted).await
}

/// Reads a JSON body, never buffering more than the limit.
async fn read_json_body(headers: &HeaderMap, body: Body) -> Result<bytes::Bytes, ApiError> {
    read_json_body_within(headers, body, MAX_PAYLOAD_BYTES).await
}

/// A JSON body of at most `limit` bytes: 415 when it is not JSON, 413 when larger (never read
/// past the limit), 400 when it cannot be read.
pub(crate) async fn read_json_body_within(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<bytes::Bytes, ApiError> {
    if !is_json(headers) {
        return Err(ApiError::NotJson);
    }
    Ok(Limited::new(body, limit)
        .collect()
        .await
        .map_err(|err| {
            if err.is::<LengthLimitError>() {
                ApiError::TooLarge
            } else {
                ApiError::Invalid(Violation {
                    kind: ViolationKind::Malformed,
                    field: String::new(),
                    message: "the request body could not be read".to_owned(),
                })
            }
        })?
        .to_bytes())
}

/// `GET /api/v1/agents`: every agent a run can name in `forwardedProps.agent`, with its input
/// and output schemas, and the default one.
#[utoipa::path(
    get,
    path = "/api/v1/agents",
    tag = "runs",
    responses(
        (status = 200, description = "The agents and the default one.", body = AgentList),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
        (status = 503, description = "A dependency (NATS, the history service) did not answer (`unavailable`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn list_agents(
    State(state): State<AppState>,
    _owner: Owner,
) -> Result<axum::Json<AgentList>, ApiError> {
    let cards = state.agents.list().await.map_err(|err| match err {
        ChooseError::Unavailable(e) => ApiError::Unavailable(e),
        other => ApiError::Internal(other.into()),
    })?;
    let default = cards.iter().find(|c| c.default).map(|c| c.name.clone());
    let agents = cards
        .iter()
        .map(|card| AgentEntry {
            name: card.name.clone(),
            description: card.description.clone(),
            input_schema: card.input_schema.clone(),
            output_schema: card.output_schema.clone(),
        })
        .collect();
    Ok(axum::Json(AgentList { agents, default }))
}

/// `POST /api/v1/agents/compatibility` `{"from", "to"}`, each an agent name or an inline
/// `MessageBodySchema`: can every message valid under `from`'s output schema be fed to `to`'s
/// input schema? `{"compatible": true}`, or `false` with the reasons. Rate-limited per owner,
/// bounded in work and done off the async runtime ([`crate::compatibility`]).
#[utoipa::path(
    post,
    path = "/api/v1/agents/compatibility",
    tag = "runs",
    request_body(content = Object, content_type = "application/json", description = "`{\"from\", \"to\"}`, each an agent name or an inline `MessageBodySchema`."),
    responses(
        (status = 200, description = "Whether every output of `from` is a valid input of `to`, and why not.", body = CompatibilityAnswer),
        (status = 400, description = "Malformed: the body, a parameter or a header breaks its rule (`invalid_request`); `field` names it.", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
        (status = 413, description = "The body is over the size limit (`payload_too_large`).", body = ErrorEnvelope),
        (status = 415, description = "The body is not `application/json` (`unsupported_media_type`).", body = ErrorEnvelope),
        (status = 422, description = "A schema is invalid, or comparing them needs more work than one request may do (`invalid_request`); the message names the limit.", body = ErrorEnvelope),
        (status = 429, description = "The owner spent a per-owner request budget (`rate_limited`); `Retry-After` says when to retry.", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn compatibility(
    State(state): State<AppState>,
    owner: Owner,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::Json<CompatibilityAnswer>, ApiError> {
    state.compatibility.admit(owner.as_str()).await?;
    let bytes = read_json_body(&headers, body).await?;
    // A name may have been registered moments ago: read the catalog once before judging.
    let _ = state.agents.list().await;
    Ok(axum::Json(
        state.compatibility.answer(&state.agents, bytes).await?,
    ))
}

/// `GET /api/v1/agent/runs/{runId}/events`: the run's AG-UI events as server-sent events, from
/// the start or, with `Last-Event-ID`, exactly after the last event the client received, on
/// any replica.
#[utoipa::path(
    get,
    path = "/api/v1/agent/runs/{runId}/events",
    tag = "runs",
    params(("runId" = String, Path, description = "The client's run id, 1 to 128 characters."), ("Last-Event-ID" = Option<String>, Header, description = "Resume exactly after this event id."), ("compact" = Option<bool>, Query, description = "`false`: every event as stored; by default consecutive deltas read back from the log are joined.")),
    responses(
        (status = 200, description = "Server-sent events: each `data:` is one AG-UI event (JSON), `id:` its event id.", content_type = "text/event-stream", body = String),
        (status = 400, description = "A `Last-Event-ID` that is not an event id of this run, or past its end; a bad `compact` (`invalid_request`).", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
        (status = 404, description = "The caller has no such run (`not_found`).", body = ErrorEnvelope),
        (status = 410, description = "The events after `Last-Event-ID` are no longer retained (`expired`).", body = ErrorEnvelope),
        (status = 429, description = "The owner holds as many open streams as allowed, or spent its lookups (`rate_limited`).", body = ErrorEnvelope),
        (status = 503, description = "A dependency (NATS, the history service) did not answer (`unavailable`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn run_events(
    State(state): State<AppState>,
    owner: Owner,
    Path(run_id): Path<String>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    check_path_id(&run_id)?;
    let replay = replay_of(query.as_deref())?;
    state.lookups.check(owner.as_str()).await?;
    let after = match headers.get("last-event-id") {
        None => 0,
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or(ApiError::BadCursor)?,
    };
    let record = state
        .runs
        .find(owner.as_str(), &run_id)
        .await
        .map_err(ApiError::Unavailable)?
        .ok_or(ApiError::NotFound)?;
    follow(
        &state,
        &owner,
        record.task_id,
        after,
        record.status.is_terminal(),
        replay,
    )
    .await
}

/// How a run's stream replays what the log holds: compacted unless the query says
/// `compact=false` (every event as stored); 400 naming `compact` for another value.
fn replay_of(query: Option<&str>) -> Result<Replay, ApiError> {
    let mut replay = Replay::Compact;
    for pair in query.unwrap_or_default().split('&') {
        let Some(value) = pair.strip_prefix("compact=") else {
            continue;
        };
        replay = match value {
            "true" | "1" => Replay::Compact,
            "false" | "0" => Replay::Raw,
            _ => {
                return Err(ApiError::Invalid(Violation {
                    kind: ViolationKind::Malformed,
                    field: "compact".to_owned(),
                    message: "compact must be true or false".to_owned(),
                }));
            }
        };
    }
    Ok(replay)
}

/// `GET /api/v1/agent/threads/{threadId}/events`: the thread's stream (`crate::thread`): a
/// snapshot, the open run, then every later run of the thread, live, until the client leaves;
/// `Last-Event-ID` resumes.
#[utoipa::path(
    get,
    path = "/api/v1/agent/threads/{threadId}/events",
    tag = "runs",
    params(("threadId" = String, Path, description = "The thread id, 1 to 128 characters."), ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event of the thread.")),
    responses(
        (status = 200, description = "Server-sent events: a `MESSAGES_SNAPSHOT` (and `STATE_SNAPSHOT`), the active run or the waiting prompt, then every later run of the thread live.", content_type = "text/event-stream", body = String),
        (status = 400, description = "A bad thread id, or a `Last-Event-ID` that is not one of the thread's event ids (`invalid_request`).", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
        (status = 404, description = "The caller has no such thread (`not_found`).", body = ErrorEnvelope),
        (status = 429, description = "The owner holds as many open streams as allowed (`rate_limited`).", body = ErrorEnvelope),
        (status = 503, description = "A dependency (NATS, the history service) did not answer (`unavailable`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn thread_events(
    State(state): State<AppState>,
    owner: Owner,
    Path(thread_id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    if thread_id.is_empty() || thread_id.chars().count() > MAX_PATH_ID_CHARS {
        return Err(ApiError::Invalid(Violation {
            kind: ViolationKind::Malformed,
            field: "threadId".to_owned(),
            message: "threadId must be 1 to 128 characters".to_owned(),
        }));
    }
    state.lookups.check(owner.as_str()).await?;
    let cursor = match headers.get("last-event-id") {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(Cursor::parse)
                .ok_or(ApiError::BadThreadCursor)?,
        ),
    };
    let permit = state
        .streams
        .acquire(owner.as_str(), "sse")
        .ok_or(ApiError::TooManyStreams)?;
    let items = state
        .threads
        .open(owner.as_str(), &thread_id, cursor)
        .await
        .map_err(|err| match err {
            ThreadError::NotFound => ApiError::NoThread,
            ThreadError::ForeignCursor => ApiError::BadThreadCursor,
            ThreadError::Unavailable(err) => ApiError::Unavailable(err),
        })?;
    let frames = items
        .map(move |item| {
            let _held = &permit; // the owner's stream slot, released with the stream
            SseEvent::default()
                .id(item.cursor.id())
                .json_data(&item.event)
        })
        .take_until(state.shutdown.clone().cancelled_owned());
    Ok(Sse::new(frames)
        .keep_alive(KeepAlive::new().interval(HEARTBEAT).text("heartbeat"))
        .into_response())
}

/// The SSE answer for a run just accepted here: all of its events.
async fn stream_events(
    state: &AppState,
    owner: &Owner,
    accepted: &TaskAcceptedResponse,
) -> Result<Response, ApiError> {
    let task_id = uuid::Uuid::try_parse(&accepted.task_id)
        .map_err(|err| ApiError::Internal(anyhow::Error::new(err)))?;
    follow(state, owner, task_id, 0, false, Replay::Compact).await
}

/// The SSE answer with the events of `task_id` after `after` (`ended`: the run is over).
async fn follow(
    state: &AppState,
    owner: &Owner,
    task_id: uuid::Uuid,
    after: u64,
    ended: bool,
    replay: Replay,
) -> Result<Response, ApiError> {
    let permit = state
        .streams
        .acquire(owner.as_str(), "sse")
        .ok_or(ApiError::TooManyStreams)?;
    let events = match state
        .events
        .follow_with(task_id, after, ended, replay)
        .await
    {
        Ok(events) => events,
        // The client has the terminal event (a browser's EventSource reconnecting after the
        // stream closed): 204 is the status EventSource does not retry.
        Err(FollowError::Ended { .. }) => return Ok(StatusCode::NO_CONTENT.into_response()),
        Err(FollowError::PastEnd { after, last }) => return Err(ApiError::PastEnd(after, last)),
        Err(FollowError::Expired { after }) => return Err(ApiError::Expired(after)),
        Err(FollowError::Nats(e)) => return Err(ApiError::Unavailable(e)),
    };
    Ok(sse(events, permit, state.shutdown.clone()))
}

/// Server-sent events: `id` is the event's per-run `seq`, `data` the AG-UI event; a comment
/// every [`HEARTBEAT`] keeps proxies from closing an idle stream. Ends after the terminal event,
/// or when the service shuts down.
fn sse(
    events: impl futures::Stream<Item = std::sync::Arc<crate::events::SharedEvent>> + Send + 'static,
    permit: StreamPermit,
    shutdown: tokio_util::sync::CancellationToken,
) -> Response {
    let frames = events
        .map(move |event| {
            let _held = &permit; // the owner's stream slot, released with the stream
            // Encoded once for every client of the run on this replica.
            Ok::<_, std::convert::Infallible>(
                SseEvent::default()
                    .id(event.seq.to_string())
                    .data(event.json()),
            )
        })
        .take_until(shutdown.cancelled_owned());
    Sse::new(frames)
        .keep_alive(KeepAlive::new().interval(HEARTBEAT).text("heartbeat"))
        .into_response()
}

fn check_path_id(run_id: &str) -> Result<(), ApiError> {
    if run_id.is_empty() || run_id.chars().count() > MAX_PATH_ID_CHARS {
        return Err(ApiError::BadId);
    }
    Ok(())
}

/// `GET /api/v1/agent/runs/{runId}`: the caller's latest run with this run id.
#[utoipa::path(
    get,
    path = "/api/v1/agent/runs/{runId}",
    tag = "runs",
    params(("runId" = String, Path, description = "The client's run id, 1 to 128 characters.")),
    responses(
        (status = 200, description = "The caller's latest run with this run id.", body = RunStatusResponse),
        (status = 400, description = "The run id is not 1 to 128 characters (`invalid_request`).", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
        (status = 404, description = "The caller has no such run (`not_found`).", body = ErrorEnvelope),
        (status = 429, description = "The owner spent a per-owner request budget (`rate_limited`); `Retry-After` says when to retry.", body = ErrorEnvelope),
        (status = 503, description = "A dependency (NATS, the history service) did not answer (`unavailable`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn run_status(
    State(state): State<AppState>,
    owner: Owner,
    Path(run_id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    check_path_id(&run_id)?;
    state.lookups.check(owner.as_str()).await?;
    let record = state
        .runs
        .find(owner.as_str(), &run_id)
        .await
        .map_err(ApiError::Unavailable)?
        .ok_or(ApiError::NotFound)?;
    Ok(axum::Json(status_response(record)))
}

/// `POST /api/v1/agent/runs/{runId}/cancel`: idempotent; answers the run's status after the
/// request (already `cancelled` for a queued run, `cancelRequested` for a running one).
#[utoipa::path(
    post,
    path = "/api/v1/agent/runs/{runId}/cancel",
    tag = "runs",
    params(("runId" = String, Path, description = "The client's run id, 1 to 128 characters.")),
    responses(
        (status = 202, description = "The run after the request: `cancelled` when it was queued, `cancelRequested` while it runs; an ended run is left as it is.", body = RunStatusResponse),
        (status = 400, description = "The run id is not 1 to 128 characters (`invalid_request`).", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
        (status = 404, description = "The caller has no such run (`not_found`).", body = ErrorEnvelope),
        (status = 429, description = "The owner spent a per-owner request budget (`rate_limited`); `Retry-After` says when to retry.", body = ErrorEnvelope),
        (status = 503, description = "A dependency (NATS, the history service) did not answer (`unavailable`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn cancel_run(
    State(state): State<AppState>,
    owner: Owner,
    Path(run_id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    check_path_id(&run_id)?;
    state.lookups.check(owner.as_str()).await?;
    let record = state
        .runs
        .cancel(owner.as_str(), &run_id)
        .await
        .map_err(ApiError::Unavailable)?
        .ok_or(ApiError::NotFound)?;
    Ok((StatusCode::ACCEPTED, axum::Json(status_response(record))))
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
}
