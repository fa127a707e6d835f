//! HTTP routes of the runs service: thin handlers that extract, call and wrap.

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::{BodyExt, Limited};
use platform::auth::Owner;
use platform::http::ErrorResponse;
use protocol::ErrorCode;
use protocol::validate::{MAX_PAYLOAD_BYTES, Violation, ViolationKind, messages, parse_run_input};

use crate::AppState;
use crate::accept::AcceptError;

pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/api/v1/agent/runs", post(create_run))
        .with_state(state)
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
    /// 503: NATS did not acknowledge.
    Unavailable(anyhow::Error),
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
            ApiError::Unavailable(err) => ErrorResponse::unavailable(&err),
        }
        .into_response()
    }
}

/// `POST /api/v1/agent/runs`: validate, publish, answer 202 after the JetStream ack.
async fn create_run(
    State(state): State<AppState>,
    owner: Owner,
    headers: HeaderMap,
    body: Body,
) -> Result<impl IntoResponse, ApiError> {
    if !is_json(&headers) {
        return Err(ApiError::NotJson);
    }
    // Never buffer more than the limit: the body is read through a bounded adapter.
    let bytes = Limited::new(body, MAX_PAYLOAD_BYTES)
        .collect()
        .await
        .map_err(|_| ApiError::TooLarge)?
        .to_bytes();
    let input = parse_run_input(&bytes).map_err(ApiError::Invalid)?;
    let accepted = state
        .accept
        .accept(owner.as_str(), input)
        .await
        .map_err(|err| match err {
            AcceptError::Conflict => ApiError::Conflict,
            AcceptError::Unavailable(e) => ApiError::Unavailable(e),
        })?;
    Ok((StatusCode::ACCEPTED, axum::Json(accepted)))
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
}
