//! Thread administration served by runs: `PATCH /api/v1/agent/threads/{threadId}` renames a
//! thread, `DELETE` erases it, `DELETE /api/v1/agent/me` erases the caller (or, for an admin,
//! `?owner=`). Every path under `/api/v1/agent/threads/` is routed to this service (it serves the
//! thread stream), but threads are history's: the handler checks the request here, at the edge,
//! and asks history over NATS (`<prefix>.history.thread-rename`, `thread-erase`, `owner-erase`),
//! which acts on that owner's thread only. Another owner's thread is not found, exactly like a
//! missing one: the owner is part of the question.
//!
//! An erasure cancels what still runs first: history names the runs that have not ended, this
//! service cancels them (it owns cancel) and asks again until they have ended, for at most
//! [`CANCEL_WAIT`]; then it asks history to erase anyway (a run that ends later has its last
//! events dropped as they come). Once a thread is gone, every replica's streams of it end
//! (`<prefix>.threads.erased`).

use std::collections::HashSet;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::stream::Stream;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use platform::auth::{Identity, Owner};
use protocol::ErrorEnvelope;
use protocol::erase::{EraseReply, OwnerEraseRequest, ThreadEraseRequest};
use protocol::messaging::{Names, thread_lock_key};
use protocol::threads::{
    ThreadForkReply, ThreadForkRequest, ThreadRenameReply, ThreadRenameRequest, ThreadSummary,
    parse_title,
};
use protocol::validate::{Violation, ViolationKind};
use serde_json::Value;

use crate::AppState;
use crate::http::openapi::{Erasing, ForkRequest, Me, RenameRequest};
use crate::http::{ApiError, read_json_body_within};

/// How long a rename waits for history's answer.
const RENAME_TIMEOUT: Duration = Duration::from_secs(5);
/// Most bytes of a rename's body (a title is at most 200 characters).
const MAX_BODY_BYTES: usize = 16 * 1024;
/// Longest thread id accepted in a path.
const MAX_THREAD_ID_CHARS: usize = 128;

/// How long an erasure waits for the runs it cancelled to end before it erases anyway.
const CANCEL_WAIT: Duration = Duration::from_secs(10);
/// How long one erasure request to history may take (a thread's files go with it).
const ERASE_TIMEOUT: Duration = Duration::from_secs(40);
/// The longest pause between two asks while runs end.
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// Asks history to rename and erase threads, and to erase owners.
pub(crate) struct ThreadAdmin {
    client: async_nats::Client,
    names: Names,
    /// The RUNS stream: an erasure tells history how far runs were accepted.
    runs: Stream,
}

/// What an erasure is of.
enum Target<'a> {
    Thread(&'a str),
    Owner,
}

impl ThreadAdmin {
    pub(crate) fn new(client: async_nats::Client, names: Names, runs: Stream) -> Self {
        Self {
            client,
            names,
            runs,
        }
    }

    /// Asks history to fork the owner's thread at `message_id` into `new_thread_id`.
    #[tracing::instrument(name = "runs.thread_admin.fork", skip_all)]
    async fn fork(
        &self,
        owner: &str,
        thread_id: &str,
        message_id: &str,
        new_thread_id: &str,
    ) -> anyhow::Result<ThreadForkReply> {
        let request = ThreadForkRequest::V1 {
            owner: owner.to_owned(),
            thread_id: thread_id.to_owned(),
            message_id: message_id.to_owned(),
            new_thread_id: new_thread_id.to_owned(),
        };
        let reply = platform::rpc::request(
            &self.client,
            self.names.history_thread_fork_subject(),
            serde_json::to_vec(&request)?.into(),
            RENAME_TIMEOUT * 2,
        )
        .await
        .context("history did not answer a fork")?;
        Ok(serde_json::from_slice(&reply.payload)?)
    }

    /// Asks history to erase `target` of `owner`.
    async fn ask_erase(
        &self,
        owner: &str,
        target: &Target<'_>,
        force: bool,
    ) -> anyhow::Result<EraseReply> {
        let runs_seq = self.runs.get_info().await?.state.last_sequence;
        let (subject, payload) = match target {
            Target::Thread(thread_id) => (
                self.names.history_thread_erase_subject(),
                serde_json::to_vec(&ThreadEraseRequest::V1 {
                    owner: owner.to_owned(),
                    thread_id: (*thread_id).to_owned(),
                    runs_seq,
                    force,
                })?,
            ),
            Target::Owner => (
                self.names.history_owner_erase_subject(),
                serde_json::to_vec(&OwnerEraseRequest::V1 {
                    owner: owner.to_owned(),
                    runs_seq,
                    force,
                })?,
            ),
        };
        let reply = platform::rpc::request(&self.client, subject, payload.into(), ERASE_TIMEOUT)
            .await
            .context("history did not answer an erasure")?;
        Ok(serde_json::from_slice(&reply.payload)?)
    }

    /// Erases `target` of `owner`: cancels the runs history names as not ended (each once), asks
    /// again until they have, and after [`CANCEL_WAIT`] erases regardless. History's answer:
    /// erased (`V1`) or `NotFound`.
    #[tracing::instrument(name = "runs.thread_admin.erase", skip_all)]
    async fn erase(
        &self,
        directory: &crate::status::RunDirectory,
        owner: &str,
        target: Target<'_>,
    ) -> anyhow::Result<EraseReply> {
        let deadline = tokio::time::Instant::now() + CANCEL_WAIT;
        let mut cancelled = HashSet::new();
        let mut pause = Duration::from_millis(50);
        loop {
            let force = tokio::time::Instant::now() >= deadline;
            match self.ask_erase(owner, &target, force).await? {
                EraseReply::Busy { runs } => {
                    for run in runs {
                        if cancelled.insert((run.thread_id.clone(), run.run_id.clone())) {
                            directory
                                .cancel_in(owner, &run.run_id, Some(&run.thread_id))
                                .await?;
                        }
                    }
                }
                EraseReply::Behind if force => {
                    anyhow::bail!("history has not written the latest runs yet")
                }
                EraseReply::Behind => {}
                done => {
                    if let (EraseReply::V1 { .. }, Target::Thread(thread_id)) = (&done, &target) {
                        self.client
                            .publish(
                                self.names.threads_erased_subject(),
                                thread_lock_key(owner, thread_id).into(),
                            )
                            .await?;
                    }
                    return Ok(done);
                }
            }
            // Waiting for cancelled runs to end (their worker writes the end): ask again soon.
            tokio::time::sleep(
                pause.min(deadline.saturating_duration_since(tokio::time::Instant::now())),
            )
            .await;
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }

    /// Gives the owner's thread `title` (checked); the thread as listed, `None` when the owner
    /// has no such thread.
    #[tracing::instrument(name = "runs.thread_admin.rename", skip_all)]
    async fn rename(
        &self,
        owner: &str,
        thread_id: &str,
        title: String,
    ) -> anyhow::Result<Option<ThreadSummary>> {
        let request = ThreadRenameRequest::V1 {
            owner: owner.to_owned(),
            thread_id: thread_id.to_owned(),
            title,
        };
        let reply = platform::rpc::request(
            &self.client,
            self.names.history_thread_rename_subject(),
            serde_json::to_vec(&request)?.into(),
            RENAME_TIMEOUT,
        )
        .await
        .context("history did not answer a thread rename")?;
        match serde_json::from_slice(&reply.payload)? {
            ThreadRenameReply::V1 { thread } => Ok(thread),
            ThreadRenameReply::Refused { message } => {
                anyhow::bail!("history refused a checked title: {message}")
            }
        }
    }
}

/// A 400 naming `field`.
fn malformed(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::Invalid(Violation {
        kind: ViolationKind::Malformed,
        field: field.to_owned(),
        message: message.into(),
    })
}

/// The title a rename's body gives: `{"title": "..."}` and nothing else, the title checked
/// by [`parse_title`] (400 naming `/title`, or the unknown field, or the body).
fn title_of(body: &[u8]) -> Result<String, ApiError> {
    let Ok(Value::Object(mut fields)) = serde_json::from_slice::<Value>(body) else {
        return Err(malformed(
            "",
            "the body must be a JSON object such as {\"title\": \"...\"}",
        ));
    };
    if let Some(unknown) = fields.keys().find(|key| *key != "title") {
        return Err(malformed(
            &format!("/{unknown}"),
            "only title can be changed",
        ));
    }
    match fields.remove("title") {
        Some(Value::String(raw)) => {
            parse_title(&raw).map_err(|err| malformed("/title", err.to_string()))
        }
        Some(_) => Err(malformed("/title", "title must be a string")),
        None => Err(malformed("/title", "title is required")),
    }
}

/// `PATCH /api/v1/agent/threads/{threadId}` with `{"title": "..."}`: renames the caller's
/// thread; answers it as `GET /api/v1/agent/threads` lists it.
#[utoipa::path(
    patch,
    path = "/api/v1/agent/threads/{threadId}",
    tag = "runs",
    params(("threadId" = String, Path, description = "The thread id, 1 to 128 characters.")),
    request_body(content = RenameRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The thread, renamed, as `GET /api/v1/agent/threads` lists it.", body = ThreadSummary),
        (status = 400, description = "Malformed: the body, a parameter or a header breaks its rule (`invalid_request`); `field` names it.", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
        (status = 404, description = "The caller has no such thread (`not_found`).", body = ErrorEnvelope),
        (status = 413, description = "The body is over the size limit (`payload_too_large`).", body = ErrorEnvelope),
        (status = 415, description = "The body is not `application/json` (`unsupported_media_type`).", body = ErrorEnvelope),
        (status = 503, description = "A dependency (NATS, the history service) did not answer (`unavailable`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn rename_thread(
    State(state): State<AppState>,
    owner: Owner,
    Path(thread_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::Json<ThreadSummary>, ApiError> {
    check_thread_id(&thread_id)?;
    let body = read_json_body_within(&headers, body, MAX_BODY_BYTES).await?;
    let title = title_of(&body)?;
    state
        .thread_admin
        .rename(owner.as_str(), &thread_id, title)
        .await
        .map_err(ApiError::Unavailable)?
        .map(axum::Json)
        .ok_or(ApiError::NoThread)
}

/// `DELETE /api/v1/agent/threads/{threadId}`: erases the caller's thread from every store
/// (cancelling its runs first); 204, or 404 when the caller has no such thread. Idempotent.
#[utoipa::path(
    delete,
    path = "/api/v1/agent/threads/{threadId}",
    tag = "runs",
    params(("threadId" = String, Path, description = "The thread id, 1 to 128 characters.")),
    responses(
        (status = 204, description = "Erased: nothing of the thread is left."),
        (status = 400, description = "Malformed: the body, a parameter or a header breaks its rule (`invalid_request`); `field` names it.", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
        (status = 404, description = "The caller has no such thread (`not_found`).", body = ErrorEnvelope),
        (status = 503, description = "A dependency (NATS, the history service) did not answer (`unavailable`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn erase_thread(
    State(state): State<AppState>,
    owner: Owner,
    Path(thread_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    check_thread_id(&thread_id)?;
    match state
        .thread_admin
        .erase(&state.runs, owner.as_str(), Target::Thread(&thread_id))
        .await
        .map_err(ApiError::Unavailable)?
    {
        EraseReply::NotFound => Err(ApiError::NoThread),
        _ => Ok(StatusCode::NO_CONTENT),
    }
}

/// What a fork's body asks: the last message the fork holds, and its id if the client chose
/// one.
#[derive(Debug, PartialEq, Eq)]
struct ForkBody {
    message_id: String,
    thread_id: Option<String>,
}

/// Longest message id a fork names.
const MAX_MESSAGE_ID_CHARS: usize = 256;

/// A fork's body: `{"messageId": "...", "threadId": "..."?}` and nothing else; 400 naming what
/// is wrong.
fn fork_body(body: &[u8]) -> Result<ForkBody, ApiError> {
    let Ok(Value::Object(mut fields)) = serde_json::from_slice::<Value>(body) else {
        return Err(malformed(
            "",
            "the body must be a JSON object such as {\"messageId\": \"...\"}",
        ));
    };
    if let Some(unknown) = fields
        .keys()
        .find(|key| *key != "messageId" && *key != "threadId")
    {
        return Err(malformed(
            &format!("/{unknown}"),
            "a fork takes messageId and, optionally, threadId",
        ));
    }
    let message_id = match fields.remove("messageId") {
        Some(Value::String(id)) if !id.is_empty() && id.chars().count() <= MAX_MESSAGE_ID_CHARS => {
            id
        }
        Some(_) => {
            return Err(malformed(
                "/messageId",
                "messageId must be a string of 1 to 256 characters",
            ));
        }
        None => return Err(malformed("/messageId", "messageId is required")),
    };
    let thread_id = match fields.remove("threadId") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) if !id.is_empty() && id.chars().count() <= MAX_THREAD_ID_CHARS => {
            Some(id)
        }
        Some(_) => {
            return Err(malformed(
                "/threadId",
                "threadId must be a string of 1 to 128 characters",
            ));
        }
    };
    Ok(ForkBody {
        message_id,
        thread_id,
    })
}

/// `POST /api/v1/agent/threads/{threadId}/fork` with `{"messageId": "..."}` (and the new
/// thread's `threadId` if the client chooses it): a new thread holding the caller's thread's
/// messages up to and with that message, and its files; 201 with the new thread as the list
/// shows it. 404: no such thread; 422 naming `/messageId`: the thread holds no such message;
/// 409 naming `/threadId`: the caller has a thread with that id already.
#[utoipa::path(
    post,
    path = "/api/v1/agent/threads/{threadId}/fork",
    tag = "runs",
    params(("threadId" = String, Path, description = "The thread id, 1 to 128 characters.")),
    request_body(content = ForkRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "The new thread, as `GET /api/v1/agent/threads` lists it.", body = ThreadSummary),
        (status = 400, description = "Malformed: the body, a parameter or a header breaks its rule (`invalid_request`); `field` names it.", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
        (status = 404, description = "The caller has no such thread (`not_found`).", body = ErrorEnvelope),
        (status = 409, description = "The caller has a thread with the `threadId` asked for (`conflict`).", body = ErrorEnvelope),
        (status = 413, description = "The body is over the size limit (`payload_too_large`).", body = ErrorEnvelope),
        (status = 415, description = "The body is not `application/json` (`unsupported_media_type`).", body = ErrorEnvelope),
        (status = 422, description = "The thread holds no message with this `messageId` (`invalid_request`).", body = ErrorEnvelope),
        (status = 503, description = "A dependency (NATS, the history service) did not answer (`unavailable`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn fork_thread(
    State(state): State<AppState>,
    owner: Owner,
    Path(thread_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    check_thread_id(&thread_id)?;
    let body = read_json_body_within(&headers, body, MAX_BODY_BYTES).await?;
    let fork = fork_body(&body)?;
    let new_thread_id = fork
        .thread_id
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    match state
        .thread_admin
        .fork(owner.as_str(), &thread_id, &fork.message_id, &new_thread_id)
        .await
        .map_err(ApiError::Unavailable)?
    {
        ThreadForkReply::V1 { thread } => {
            Ok((StatusCode::CREATED, axum::Json(thread)).into_response())
        }
        ThreadForkReply::NoThread => Err(ApiError::NoThread),
        ThreadForkReply::NoMessage => Err(ApiError::Invalid(Violation {
            kind: ViolationKind::Rule,
            field: "/messageId".to_owned(),
            message: "the thread holds no message with this id".to_owned(),
        })),
        ThreadForkReply::Exists => Err(ApiError::ThreadExists),
    }
}

/// The query of `DELETE /api/v1/agent/me`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MeQuery {
    /// Another owner to erase (admin scope only).
    owner: Option<String>,
}

/// `GET /api/v1/agent/me`: who the token says the caller is.
#[utoipa::path(
    get,
    path = "/api/v1/agent/me",
    tag = "runs",
    responses(
        (status = 200, description = "Who the token says the caller is.", body = Me),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn whoami(identity: Identity) -> axum::Json<Me> {
    axum::Json(Me {
        sub: identity.owner.as_str().to_owned(),
        admin: identity.admin,
    })
}

/// `DELETE /api/v1/agent/me`: erases the caller (an admin: `?owner=<sub>`) from every store:
/// every thread, every file, the owner's budgets. 204 once nothing is left; 202 with
/// `{"status": "erasing", "threadsErased": n}` when the request's time ran out first (call
/// again: it goes on where it stopped).
#[utoipa::path(
    delete,
    path = "/api/v1/agent/me",
    tag = "runs",
    params(("owner" = Option<String>, Query, description = "Another owner to erase (the `switchboard:admin` scope only).")),
    responses(
        (status = 204, description = "Nothing of the owner is left."),
        (status = 202, description = "The request's time ran out with threads left: call again.", body = Erasing),
        (status = 400, description = "Malformed: the body, a parameter or a header breaks its rule (`invalid_request`); `field` names it.", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
        (status = 403, description = "`owner` without the `switchboard:admin` scope (`forbidden`).", body = ErrorEnvelope),
        (status = 503, description = "A dependency (NATS, the history service) did not answer (`unavailable`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn erase_me(
    State(state): State<AppState>,
    identity: Identity,
    query: Result<Query<MeQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|err| malformed("owner", err.body_text()))?;
    let owner = match query.owner {
        None => identity.owner.as_str().to_owned(),
        Some(_) if !identity.admin => {
            return Err(ApiError::Forbidden(
                "owner",
                "erasing another owner needs the switchboard:admin scope",
            ));
        }
        Some(other) if other.is_empty() || other.chars().count() > 256 => {
            return Err(malformed("owner", "owner must be 1 to 256 characters"));
        }
        Some(other) => other,
    };
    match state
        .thread_admin
        .erase(&state.runs, &owner, Target::Owner)
        .await
        .map_err(ApiError::Unavailable)?
    {
        EraseReply::V1 {
            more: true,
            threads,
            ..
        } => Ok((
            StatusCode::ACCEPTED,
            axum::Json(Erasing {
                status: "erasing",
                threads_erased: threads,
            }),
        )
            .into_response()),
        _ => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}

/// A thread id in a path: 1 to 128 characters.
fn check_thread_id(thread_id: &str) -> Result<(), ApiError> {
    if thread_id.is_empty() || thread_id.chars().count() > MAX_THREAD_ID_CHARS {
        return Err(malformed(
            "threadId",
            "threadId must be 1 to 128 characters",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused_field(body: &str) -> Option<String> {
        match title_of(body.as_bytes()) {
            Err(ApiError::Invalid(violation)) => Some(violation.field),
            _ => None,
        }
    }

    #[test]
    fn a_fork_body_names_a_message_and_maybe_the_new_thread_or_what_is_wrong() {
        assert_eq!(
            fork_body(br#"{"messageId": "m1"}"#).ok(),
            Some(ForkBody {
                message_id: "m1".into(),
                thread_id: None
            })
        );
        assert_eq!(
            fork_body(br#"{"messageId": "m1", "threadId": "t2"}"#).ok(),
            Some(ForkBody {
                message_id: "m1".into(),
                thread_id: Some("t2".into())
            })
        );
        let field = |body: &str| match fork_body(body.as_bytes()) {
            Err(ApiError::Invalid(violation)) => Some(violation.field),
            _ => None,
        };
        assert_eq!(field("{}").as_deref(), Some("/messageId"));
        assert_eq!(field(r#"{"messageId": ""}"#).as_deref(), Some("/messageId"));
        assert_eq!(field(r#"{"messageId": 3}"#).as_deref(), Some("/messageId"));
        let long = format!(r#"{{"messageId": "m", "threadId": "{}"}}"#, "t".repeat(129));
        assert_eq!(field(&long).as_deref(), Some("/threadId"));
        assert_eq!(
            field(r#"{"messageId": "m", "at": 1}"#).as_deref(),
            Some("/at")
        );
        assert_eq!(field("[]").as_deref(), Some(""));
    }

    #[test]
    fn a_rename_body_gives_a_trimmed_title_or_names_what_is_wrong() {
        assert_eq!(
            title_of(br#"{"title": "  Trip to H\u00e0 N\u1ed9i "}"#).ok(),
            Some("Trip to Hà Nội".to_owned())
        );
        assert_eq!(
            refused_field(r#"{"title": "   "}"#).as_deref(),
            Some("/title")
        );
        assert_eq!(
            refused_field(r#"{"title": "a\nb"}"#).as_deref(),
            Some("/title")
        );
        assert_eq!(refused_field(r#"{"title": 7}"#).as_deref(), Some("/title"));
        assert_eq!(refused_field("{}").as_deref(), Some("/title"));
        let long = format!(r#"{{"title": "{}"}}"#, "x".repeat(201));
        assert_eq!(refused_field(&long).as_deref(), Some("/title"));
        assert_eq!(
            refused_field(r#"{"title": "a", "pinned": true}"#).as_deref(),
            Some("/pinned")
        );
        assert_eq!(refused_field("[]").as_deref(), Some(""));
        assert_eq!(refused_field("not json").as_deref(), Some(""));
    }
}
