//! Thread administration served by runs: `PATCH /api/v1/agent/threads/{threadId}` renames a
//! thread. Every path under `/api/v1/agent/threads/` is routed to this service (it serves the
//! thread stream), but threads are history's: the handler checks the request here, at the edge,
//! and asks history over NATS (`<prefix>.history.thread-rename`), which renames the thread of
//! that owner only and answers it as the thread list shows it. Another owner's thread is not
//! found, exactly like a missing one: the owner is part of the question.

use std::time::Duration;

use anyhow::Context as _;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use platform::auth::Owner;
use protocol::messaging::Names;
use protocol::threads::{ThreadRenameReply, ThreadRenameRequest, ThreadSummary, parse_title};
use protocol::validate::{Violation, ViolationKind};
use serde_json::Value;

use crate::AppState;
use crate::routes::ApiError;

/// How long a rename waits for history's answer.
const RENAME_TIMEOUT: Duration = Duration::from_secs(5);
/// Most bytes of a rename's body (a title is at most 200 characters).
const MAX_BODY_BYTES: usize = 16 * 1024;
/// Longest thread id accepted in a path.
const MAX_THREAD_ID_CHARS: usize = 128;

/// Asks history to rename threads.
pub(crate) struct ThreadAdmin {
    client: async_nats::Client,
    names: Names,
}

impl ThreadAdmin {
    pub(crate) fn new(client: async_nats::Client, names: Names) -> Self {
        Self { client, names }
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
pub(crate) async fn rename_thread(
    State(state): State<AppState>,
    owner: Owner,
    Path(thread_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::Json<ThreadSummary>, ApiError> {
    if thread_id.is_empty() || thread_id.chars().count() > MAX_THREAD_ID_CHARS {
        return Err(malformed(
            "threadId",
            "threadId must be 1 to 128 characters",
        ));
    }
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return Err(ApiError::NotJson);
    }
    let body = Limited::new(body, MAX_BODY_BYTES)
        .collect()
        .await
        .map_err(|err| {
            if err.is::<LengthLimitError>() {
                ApiError::TooLarge
            } else {
                malformed("", "the request body could not be read")
            }
        })?
        .to_bytes();
    let title = title_of(&body)?;
    state
        .thread_admin
        .rename(owner.as_str(), &thread_id, title)
        .await
        .map_err(ApiError::Unavailable)?
        .map(axum::Json)
        .ok_or(ApiError::NoThread)
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
