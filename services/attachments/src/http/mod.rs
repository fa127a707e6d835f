//! HTTP routes of the attachments service: thin handlers that extract, call and wrap.

pub(crate) mod openapi;

use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, Query, RawQuery, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use platform::auth::Owner;
use platform::http::ErrorResponse;
use platform::openapi::{Endpoint, Verb};
use protocol::file_types;
use protocol::files::parse_file_url;
use protocol::{ErrorCode, ErrorEnvelope};
use serde::Deserialize;
use serde_json::Value;
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::AppState;
use crate::download::LinkError;
use crate::file_name::{MAX_FILE_NAME_CHARS, base_name};
use crate::form::{BoundedForm, FramingTooLong};
use crate::http::openapi::{
    DownloadUrl, ServerUpload, ServerUploadForm, UploadUrl, UploadUrlRequest, Workspace,
    WorkspaceFile,
};
use crate::quota::QuotaError;
use crate::server_upload::UploadError;
use crate::store::{self, FileStatus};
use crate::upload_url::{UploadAnswer, UploadRequest, UploadUrlError};

/// Largest file accepted, in bytes (100 MB).
pub(crate) const MAX_FILE_BYTES: u64 = 100 * 1024 * 1024;
/// Largest multipart form accepted: the file plus room for the other fields and boundaries.
const MAX_FORM_BYTES: usize = 100 * 1024 * 1024 + 64 * 1024;
/// Longest session id accepted, in characters.
const MAX_SESSION_ID_CHARS: usize = 128;

/// Every route of the service: the router is built from this table, and the system tests
/// compare it with the OpenAPI document the service serves ([`crate::http::openapi`]).
pub(crate) fn endpoints() -> Vec<Endpoint<AppState>> {
    vec![
        Endpoint::new(Verb::Post, "/v2/files/upload-url", upload_url),
        Endpoint::new(Verb::Get, "/v2/files/download-url", download_url),
        // `GET` answers HEAD too (same headers, no body).
        Endpoint::new(Verb::Get, "/v2/files/content/{fileId}", content),
        Endpoint::new(Verb::Delete, "/v2/files/delete", delete_file),
        Endpoint::new(Verb::Get, "/v2/files", workspace),
        Endpoint::new(Verb::Post, "/api/v1/agent/attachments", server_upload)
            .map(|handler| handler.layer(DefaultBodyLimit::max(MAX_FORM_BYTES))),
        Endpoint::new(Verb::Get, "/openapi.json", crate::http::openapi::serve),
    ]
}

pub(crate) fn router(state: AppState) -> Router {
    platform::openapi::router(endpoints()).with_state(state)
}

/// Errors of the attachments API; each variant's doc names its status. Its message is the one
/// the answer carries (a 5xx aside: logged with its cause chain, answered opaquely).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    /// 400: a parameter, the body or a form field breaks its rule; `field` names it (empty for
    /// the body as a whole).
    #[error("{message}")]
    Invalid {
        /// The offending parameter or field.
        field: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// 404: the caller has no such file (or it is not verified, or no longer there).
    #[error("file not found")]
    FileNotFound,
    /// 403: a download link whose signature is missing or bad, or that has expired.
    #[error(transparent)]
    Link(#[from] LinkError),
    /// 409: a file with the declared `content_hash` but another size or type is being uploaded.
    #[error("a file with this content_hash but another size or type is already being uploaded")]
    HashConflict,
    /// 409: the same content is being uploaded with a presigned form (a server upload).
    #[error(
        "this content is already being uploaded with a presigned form; retry once it completes"
    )]
    UploadInProgress,
    /// 413: the file is over [`MAX_FILE_BYTES`].
    #[error("file exceeds the 100 MB limit")]
    TooLarge,
    /// 413: a part's headers in a multipart form, or its preamble, are over the limit
    /// (`SB_ATTACHMENTS_MAX_PART_HEADER_BYTES`, [`crate::Limits`]).
    #[error(transparent)]
    FramingTooLong(#[from] FramingTooLong),
    /// 409 (with `Retry-After`): the file's bytes are being verified by another replica, which
    /// did not finish while this request waited.
    #[error("the file is still being verified; retry in a moment")]
    BeingVerified,
    /// 429 (uploads too fast, with `Retry-After`; too many unfinished) or 403 (storage full).
    #[error(transparent)]
    Quota(#[from] QuotaError),
    /// 503: a per-owner rate cannot be checked (NATS).
    #[error("{0:#}")]
    Unavailable(anyhow::Error),
    /// 500: something failed on our side.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl From<sqlx::Error> for ApiError {
    fn from(err: sqlx::Error) -> Self {
        ApiError::Internal(err.into())
    }
}

impl From<aws_sdk_s3::Error> for ApiError {
    fn from(err: aws_sdk_s3::Error) -> Self {
        ApiError::Internal(err.into())
    }
}

impl From<UploadError> for ApiError {
    fn from(err: UploadError) -> Self {
        match err {
            UploadError::Invalid { field, message } => ApiError::Invalid { field, message },
            UploadError::TooLarge => ApiError::TooLarge,
            UploadError::FramingTooLong(refused) => ApiError::FramingTooLong(refused),
            UploadError::Quota(refused) => ApiError::Quota(refused),
            UploadError::InProgress => ApiError::UploadInProgress,
            UploadError::Failed(err) => ApiError::Internal(err),
        }
    }
}

impl From<UploadUrlError> for ApiError {
    fn from(err: UploadUrlError) -> Self {
        match err {
            UploadUrlError::HashConflict => ApiError::HashConflict,
            UploadUrlError::Quota(refused) => ApiError::Quota(refused),
            UploadUrlError::Failed(err) => ApiError::Internal(err),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let message = self.to_string();
        let conflict = |field| {
            ErrorResponse::with_field(StatusCode::CONFLICT, ErrorCode::Conflict, &message, field)
        };
        match self {
            ApiError::Invalid { field, message } => ErrorResponse::with_field(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidRequest,
                message,
                field,
            ),
            ApiError::FileNotFound => ErrorResponse::not_found("file"),
            ApiError::Link(refused) => {
                let field = match refused {
                    LinkError::BadSignature => "signature",
                    LinkError::Expired => "expires",
                };
                ErrorResponse::with_field(
                    StatusCode::FORBIDDEN,
                    ErrorCode::Unauthorized,
                    &message,
                    field,
                )
            }
            ApiError::HashConflict => conflict("content_hash"),
            ApiError::UploadInProgress => conflict("file"),
            ApiError::TooLarge | ApiError::FramingTooLong(_) => ErrorResponse::with_field(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::PayloadTooLarge,
                &message,
                "file",
            ),
            ApiError::BeingVerified => {
                conflict("content_url").retry_after(std::time::Duration::from_secs(1))
            }
            ApiError::Quota(
                QuotaError::RateLimited(wait) | QuotaError::DownloadRateLimited { wait, .. },
            ) => ErrorResponse::new(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::RateLimited,
                &message,
            )
            .retry_after(wait),
            ApiError::Quota(QuotaError::TooManyPending(_)) => ErrorResponse::new(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::RateLimited,
                &message,
            ),
            ApiError::Quota(QuotaError::Full(_)) => {
                ErrorResponse::new(StatusCode::FORBIDDEN, ErrorCode::QuotaExceeded, &message)
            }
            ApiError::Unavailable(err) => ErrorResponse::unavailable(&err),
            ApiError::Internal(err) => ErrorResponse::internal(&err),
        }
        .into_response()
    }
}

/// A 400 naming `field`.
fn invalid(field: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::Invalid {
        field,
        message: message.into(),
    }
}

/// Parses and checks the body, naming the first offending field.
fn parse_upload_request(body: &[u8]) -> Result<UploadRequest, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| invalid("", format!("body must be a JSON object: {e}")))?;
    let Value::Object(map) = value else {
        return Err(invalid("", "body must be a JSON object"));
    };
    let raw_name = match map.get("file_name") {
        Some(Value::String(name)) => name,
        Some(_) => return Err(invalid("file_name", "file_name must be a string")),
        None => return Err(invalid("file_name", "file_name is required")),
    };
    if raw_name.chars().count() > MAX_FILE_NAME_CHARS {
        return Err(invalid(
            "file_name",
            "file_name must be at most 255 characters",
        ));
    }
    let file_name =
        base_name(raw_name).ok_or_else(|| invalid("file_name", "file_name must name a file"))?;
    let file_type = match map.get("file_type") {
        Some(Value::String(t)) => file_types::allowed(t).ok_or_else(|| {
            invalid(
                "file_type",
                format!("file_type {t:?} is not a supported type"),
            )
        })?,
        Some(_) => return Err(invalid("file_type", "file_type must be a string")),
        None => return Err(invalid("file_type", "file_type is required")),
    };
    let file_size = match map.get("file_size") {
        Some(Value::Number(n)) => n
            .as_u64()
            .filter(|n| *n > 0)
            .ok_or_else(|| invalid("file_size", "file_size must be a positive integer"))?,
        Some(_) => return Err(invalid("file_size", "file_size must be a positive integer")),
        None => return Err(invalid("file_size", "file_size is required")),
    };
    if file_size > MAX_FILE_BYTES {
        return Err(invalid("file_size", "file_size exceeds the 100 MB limit"));
    }
    let content_hash = match map.get("content_hash") {
        None | Some(Value::Null) => None,
        Some(Value::String(h)) => Some(parse_sha256(h).ok_or_else(|| {
            invalid(
                "content_hash",
                "content_hash must be 64 hexadecimal characters (SHA-256)",
            )
        })?),
        Some(_) => return Err(invalid("content_hash", "content_hash must be a string")),
    };
    let session_id = match map.get("session_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if !s.is_empty() && s.chars().count() <= MAX_SESSION_ID_CHARS => {
            Some(s.clone())
        }
        Some(_) => {
            return Err(invalid(
                "session_id",
                "session_id must be a string of 1 to 128 characters",
            ));
        }
    };
    Ok(UploadRequest {
        file_name,
        file_type,
        file_size,
        content_hash,
        session_id,
    })
}

fn parse_sha256(hex_digest: &str) -> Option<[u8; 32]> {
    let bytes = hex::decode(hex_digest).ok()?;
    bytes.try_into().ok()
}

fn content_url(bucket: &str, key: &str) -> String {
    format!("s3://{bucket}/{key}")
}

/// `POST /v2/files/upload-url`: a presigned POST form for a new file, or the caller's existing
/// verified file with the same content (`is_duplicate`); see [`crate::upload_url`].
#[utoipa::path(
    post,
    path = "/v2/files/upload-url",
    tag = "files",
    request_body(content = UploadUrlRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "A presigned POST form for the file, or the caller's verified file with the same content (`is_duplicate`, no upload needed).", body = UploadUrl),
        (status = 400, description = "The body or one of its fields breaks its rule (`invalid_request`); `field` names it.", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
        (status = 403, description = "The caller's storage is full (`quota_exceeded`).", body = ErrorEnvelope),
        (status = 409, description = "A file with this `content_hash` but another size or type is being uploaded, or the same content is being verified (`conflict`).", body = ErrorEnvelope),
        (status = 429, description = "Uploads too fast (with `Retry-After`), or too many unfinished (`rate_limited`).", body = ErrorEnvelope),
        (status = 503, description = "A per-owner rate cannot be checked (`unavailable`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn upload_url(
    State(state): State<AppState>,
    owner: Owner,
    body: axum::body::Bytes,
) -> Result<axum::Json<UploadUrl>, ApiError> {
    let request = parse_upload_request(&body)?;
    let owner = owner.as_str();
    state
        .rates
        .upload(owner)
        .await
        .map_err(ApiError::Unavailable)??;
    let answer = match crate::upload_url::upload_url(&state, owner, &request).await? {
        UploadAnswer::Duplicate { bucket, key } => UploadUrl {
            url: None,
            fields: None,
            content_url: content_url(&bucket, &key),
            is_duplicate: true,
            upload_required: false,
        },
        UploadAnswer::Upload { form, bucket, key } => UploadUrl {
            url: Some(form.url),
            fields: Some(form.fields),
            content_url: content_url(&bucket, &key),
            is_duplicate: false,
            upload_required: true,
        },
    };
    Ok(axum::Json(answer))
}

#[derive(Debug, Deserialize)]
pub(crate) struct ContentUrlQuery {
    content_url: Option<String>,
}

/// The caller's file named by `content_url` (any form `parse_file_url` accepts).
async fn owned_file(
    state: &AppState,
    owner: &str,
    raw: Option<&str>,
) -> Result<Option<store::FileRow>, ApiError> {
    let raw = raw.ok_or_else(|| invalid("content_url", "content_url is required"))?;
    let file = parse_file_url(raw).map_err(|e| invalid("content_url", e.to_string()))?;
    Ok(store::find_owned(&state.pool, owner, &file.bucket, &file.path).await?)
}

/// `GET /v2/files/download-url?content_url=...`: a freshly signed, short-lived download link.
/// Rate-limited per owner; a pending file is verified first, once however many ask at once.
#[utoipa::path(
    get,
    path = "/v2/files/download-url",
    tag = "files",
    params(("content_url" = Option<String>, Query, description = "The file: `s3://bucket/key`, or any URL form of it this platform issued.")),
    responses(
        (status = 200, description = "A freshly signed, short-lived download link.", body = DownloadUrl),
        (status = 400, description = "`content_url` is missing or not a file URL (`invalid_request`).", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
        (status = 404, description = "The caller has no such verified file (`not_found`).", body = ErrorEnvelope),
        (status = 409, description = "The file is still being verified; retry after `Retry-After` (`conflict`).", body = ErrorEnvelope),
        (status = 429, description = "Downloads too fast (`rate_limited`); `Retry-After` says when to retry.", body = ErrorEnvelope),
        (status = 503, description = "A per-owner rate cannot be checked (`unavailable`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn download_url(
    State(state): State<AppState>,
    owner: Owner,
    Query(query): Query<ContentUrlQuery>,
) -> Result<axum::Json<DownloadUrl>, ApiError> {
    state
        .rates
        .download(owner.as_str())
        .await
        .map_err(ApiError::Unavailable)??;
    let mut file = owned_file(&state, owner.as_str(), query.content_url.as_deref())
        .await?
        .ok_or(ApiError::FileNotFound)?;
    if file.status == FileStatus::Pending {
        // Uploaded moments ago, perhaps: verify now rather than wait for the sweeper, sharing
        // the verification with everyone else who asks (see `crate::verify`).
        match state.verifier.verify(&file).await? {
            crate::verify::Verdict::Verified => file.status = FileStatus::Verified,
            crate::verify::Verdict::InProgress => return Err(ApiError::BeingVerified),
            _ => {}
        }
    }
    if file.status != FileStatus::Verified {
        return Err(ApiError::FileNotFound);
    }
    let url = crate::download::sign(&state.signer, &file, state.download_ttl)?;
    Ok(axum::Json(DownloadUrl {
        url,
        expires_in: state.download_ttl.as_secs(),
        content_type: file.content_type,
        file_name: file.file_name,
        file_size: file.size_bytes,
    }))
}

/// `GET /v2/files/content/{fileId}?expires=&signature=`: the bytes behind a download link, with
/// the headers of [`crate::download`]. The link is the credential (no bearer token): 403 for a
/// bad, missing or expired signature, 404 for a file that is not (or no longer) verified.
#[utoipa::path(
    get,
    path = "/v2/files/content/{fileId}",
    tag = "files",
    security(()),
    params(("fileId" = String, Path, description = "The file's id, from the link."), ("expires" = Option<u64>, Query, description = "When the link expires (Unix seconds)."), ("signature" = Option<String>, Query, description = "The link's signature.")),
    responses(
        (status = 200, description = "The file's bytes, with its content type and a `Content-Disposition`; `Range` requests are answered 206.", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 403, description = "The signature is missing or bad, or the link expired (`unauthorized`); `field` names `signature` or `expires`.", body = ErrorEnvelope),
        (status = 404, description = "The file is not (or no longer) verified (`not_found`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn content(
    State(state): State<AppState>,
    Path(file_id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let now = std::time::SystemTime::now();
    let link = crate::download::check(&state.signer, &file_id, query.as_deref(), now)??;
    let file = store::find_verified(&state.pool, link.file_id)
        .await?
        .ok_or(ApiError::FileNotFound)?;
    crate::download::serve(&state.s3, &file, link, now)
        .await?
        .ok_or(ApiError::FileNotFound)
}

/// `DELETE /v2/files/delete?content_url=...`: removes the caller's file and its object.
/// Idempotent: a file that is not there (any more, or not the caller's) answers 204 as well.
#[utoipa::path(
    delete,
    path = "/v2/files/delete",
    tag = "files",
    params(("content_url" = Option<String>, Query, description = "The file: `s3://bucket/key`, or any URL form of it this platform issued.")),
    responses(
        (status = 204, description = "The file is gone (or was never the caller's): idempotent."),
        (status = 400, description = "`content_url` is missing or not a file URL (`invalid_request`).", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn delete_file(
    State(state): State<AppState>,
    owner: Owner,
    Query(query): Query<ContentUrlQuery>,
) -> Result<StatusCode, ApiError> {
    if let Some(file) = owned_file(&state, owner.as_str(), query.content_url.as_deref()).await? {
        // Its object, and a staged upload if one is still there.
        for key in [file.object_key.clone(), store::staging_key(file.id)] {
            state
                .s3
                .delete_object()
                .bucket(&file.bucket)
                .key(key)
                .send()
                .await
                .map_err(aws_sdk_s3::Error::from)?;
        }
        store::delete(&state.pool, file.id).await?;
        tracing::info!(file.id = %file.id, "file deleted");
    }
    Ok(StatusCode::NO_CONTENT)
}

/// The CORS policy for browser clients on `origins`, or none when the list is empty.
pub(crate) fn cors_layer(origins: &[String]) -> anyhow::Result<Option<CorsLayer>> {
    if origins.is_empty() {
        return Ok(None);
    }
    let origins = origins
        .iter()
        .map(|origin| {
            origin
                .parse::<HeaderValue>()
                .with_context(|| format!("invalid CORS origin {origin:?}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(origins))
            .allow_methods([Method::GET, Method::POST, Method::DELETE])
            .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
            .max_age(Duration::from_secs(600)),
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Status, `Retry-After`, and envelope of an error's answer.
    async fn answer(err: ApiError) -> (StatusCode, Option<String>, ErrorEnvelope) {
        let response = err.into_response();
        let status = response.status();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap_or_default();
        let envelope = serde_json::from_slice(&bytes).expect("an error envelope");
        (status, retry_after, envelope)
    }

    #[tokio::test]
    async fn each_error_answers_with_its_status_code_and_field() {
        use std::time::Duration;
        let cases = [
            (ApiError::FileNotFound, 404, ErrorCode::NotFound, None),
            (
                ApiError::Link(LinkError::BadSignature),
                403,
                ErrorCode::Unauthorized,
                Some("signature"),
            ),
            (
                ApiError::Link(LinkError::Expired),
                403,
                ErrorCode::Unauthorized,
                Some("expires"),
            ),
            (
                ApiError::HashConflict,
                409,
                ErrorCode::Conflict,
                Some("content_hash"),
            ),
            (
                ApiError::UploadInProgress,
                409,
                ErrorCode::Conflict,
                Some("file"),
            ),
            (
                ApiError::TooLarge,
                413,
                ErrorCode::PayloadTooLarge,
                Some("file"),
            ),
            (
                ApiError::FramingTooLong(FramingTooLong(16 * 1024)),
                413,
                ErrorCode::PayloadTooLarge,
                Some("file"),
            ),
            (
                ApiError::BeingVerified,
                409,
                ErrorCode::Conflict,
                Some("content_url"),
            ),
            (
                ApiError::Quota(QuotaError::TooManyPending(20)),
                429,
                ErrorCode::RateLimited,
                None,
            ),
            (
                ApiError::Quota(QuotaError::Full("at most 1 files".to_owned())),
                403,
                ErrorCode::QuotaExceeded,
                None,
            ),
            (
                ApiError::Internal(anyhow::anyhow!("secret cause")),
                500,
                ErrorCode::Internal,
                None,
            ),
        ];
        for (err, status, code, field) in cases {
            let message = err.to_string();
            let (got, _, envelope) = answer(err).await;
            assert_eq!(got.as_u16(), status, "{message}");
            assert_eq!(envelope.error.code, code, "{message}");
            assert_eq!(envelope.error.field.as_deref(), field, "{message}");
            if status != 500 {
                assert_eq!(envelope.error.message, message);
            } else {
                assert_eq!(
                    envelope.error.message, "internal error",
                    "the cause is never shown"
                );
            }
        }
        let rate = ApiError::Quota(QuotaError::RateLimited(Duration::from_millis(2500)));
        let (status, retry_after, _) = answer(rate).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            retry_after.as_deref(),
            Some("3"),
            "rounded up to whole seconds"
        );
        let downloads = ApiError::Quota(QuotaError::DownloadRateLimited {
            wait: Duration::from_millis(400),
            per_minute: crate::quota::DOWNLOADS_PER_MINUTE,
            burst: crate::quota::DOWNLOADS_BURST,
        });
        let (status, retry_after, envelope) = answer(downloads).await;
        assert_eq!(
            (status, retry_after.as_deref()),
            (StatusCode::TOO_MANY_REQUESTS, Some("1"))
        );
        assert_eq!(
            envelope.error.message,
            "too many download-url requests (at most 120 a minute per owner, bursts of 60); retry in 1 s",
            "names the budget"
        );
        let (_, retry_after, _) = answer(ApiError::BeingVerified).await;
        assert_eq!(retry_after.as_deref(), Some("1"));
    }

    #[test]
    fn each_field_rule_names_its_field() {
        let cases = [
            (
                json!({"file_type": "text/plain", "file_size": 1}),
                "file_name",
            ),
            (
                json!({"file_name": "a".repeat(256), "file_type": "text/plain", "file_size": 1}),
                "file_name",
            ),
            (
                json!({"file_name": "a.exe", "file_type": "application/x-msdownload", "file_size": 1}),
                "file_type",
            ),
            (
                json!({"file_name": "a.txt", "file_type": "text/plain", "file_size": 0}),
                "file_size",
            ),
            (
                json!({"file_name": "a.txt", "file_type": "text/plain", "file_size": 104_857_601}),
                "file_size",
            ),
            (
                json!({"file_name": "a.txt", "file_type": "text/plain", "file_size": 1, "content_hash": "xyz"}),
                "content_hash",
            ),
        ];
        for (body, field) in cases {
            let err = parse_upload_request(&serde_json::to_vec(&body).unwrap()).err();
            let response = err.map(IntoResponse::into_response);
            assert_eq!(
                response.map(|r| r.status()),
                Some(StatusCode::BAD_REQUEST),
                "{field}"
            );
        }
        let ok = parse_upload_request(
            br#"{"file_name": "x/a.txt", "file_type": "text/plain", "file_size": 104857600}"#,
        );
        assert!(ok.is_ok_and(|r| r.file_name == "a.txt"));
    }
}

/// `POST /api/v1/agent/attachments` (multipart: `file`, optional `file_type`, `session_id`):
/// the file is streamed to S3 while hashed and checked (see [`crate::server_upload`]); answers
/// `{bucket, path, mime_type, url}`.
#[utoipa::path(
    post,
    path = "/api/v1/agent/attachments",
    tag = "files",
    request_body(content = ServerUploadForm, content_type = "multipart/form-data"),
    responses(
        (status = 200, description = "The file, stored and verified, with a signed download URL.", body = ServerUpload),
        (status = 400, description = "A form field breaks its rule (`invalid_request`); `field` names it.", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
        (status = 403, description = "The caller's storage is full (`quota_exceeded`).", body = ErrorEnvelope),
        (status = 409, description = "The same content is being uploaded with a presigned form (`conflict`).", body = ErrorEnvelope),
        (status = 413, description = "The file is over 100 MB, or a part's headers are over the limit (`payload_too_large`).", body = ErrorEnvelope),
        (status = 429, description = "Uploads too fast, or too many unfinished (`rate_limited`).", body = ErrorEnvelope),
        (status = 503, description = "A per-owner rate cannot be checked (`unavailable`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn server_upload(
    State(state): State<AppState>,
    owner: Owner,
    form: BoundedForm,
) -> Result<axum::Json<ServerUpload>, ApiError> {
    let owner = owner.as_str();
    state
        .rates
        .upload(owner)
        .await
        .map_err(ApiError::Unavailable)??;
    let file = crate::server_upload::upload(&state, owner, form, MAX_FILE_BYTES).await?;
    let url = crate::download::sign(&state.signer, &file, state.download_ttl)?;
    Ok(axum::Json(ServerUpload {
        bucket: file.bucket,
        path: file.object_key,
        mime_type: file.content_type,
        url,
    }))
}

#[derive(Debug, Deserialize)]
pub(crate) struct WorkspaceQuery {
    session_id: Option<String>,
}

/// `GET /v2/files?session_id=...`: the files of one of the caller's sessions, uploads and
/// generated ones, oldest first.
#[utoipa::path(
    get,
    path = "/v2/files",
    tag = "files",
    params(("session_id" = String, Query, description = "The session (thread), 1 to 128 characters.")),
    responses(
        (status = 200, description = "The session's workspace: its files, oldest first.", body = Workspace),
        (status = 400, description = "`session_id` is not 1 to 128 characters (`invalid_request`).", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn workspace(
    State(state): State<AppState>,
    owner: Owner,
    Query(query): Query<WorkspaceQuery>,
) -> Result<axum::Json<Workspace>, ApiError> {
    let session = query
        .session_id
        .filter(|s| !s.is_empty() && s.chars().count() <= MAX_SESSION_ID_CHARS)
        .ok_or_else(|| {
            invalid(
                "session_id",
                "session_id must be a string of 1 to 128 characters",
            )
        })?;
    let rows = store::workspace(&state.pool, owner.as_str(), &session).await?;
    let files = rows
        .into_iter()
        .map(|row| {
            let icon = file_types::allowed(&row.content_type).map_or("file", |t| t.icon);
            WorkspaceFile {
                content_url: content_url(&row.bucket, &row.object_key),
                path: row.object_key,
                filename: row.file_name,
                icon_type: icon.to_owned(),
                source: row.source.as_str().to_owned(),
                file_size: row.size_bytes,
                content_type: row.content_type,
                status: row.status.as_str().to_owned(),
                created_at: row.created_at,
            }
        })
        .collect();
    Ok(axum::Json(Workspace {
        session_id: session,
        files,
    }))
}
