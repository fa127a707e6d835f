//! HTTP routes of the attachments service: thin handlers that extract, call and wrap.

use axum::Router;
use axum::extract::{DefaultBodyLimit, Multipart, Path, Query, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use chrono::Utc;
use platform::auth::Owner;
use platform::http::ErrorResponse;
use protocol::ErrorCode;
use protocol::file_types;
use protocol::files::parse_file_url;
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::AppState;
use crate::policy::Upload;
use crate::quota::QuotaError;
use crate::store::{self, NewUpload};

/// Largest file accepted, in bytes (100 MB).
pub(crate) const MAX_FILE_BYTES: u64 = 100 * 1024 * 1024;
/// Largest multipart form accepted: the file plus room for the other fields and boundaries.
const MAX_FORM_BYTES: usize = 100 * 1024 * 1024 + 64 * 1024;
/// Longest file name accepted, in characters.
const MAX_FILE_NAME_CHARS: usize = 255;
/// Longest session id accepted, in characters.
const MAX_SESSION_ID_CHARS: usize = 128;

pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/v2/files/upload-url", post(upload_url))
        .route("/v2/files/download-url", get(download_url))
        // `get` answers HEAD too (same headers, no body).
        .route("/v2/files/content/{file_id}", get(content))
        .route("/v2/files/delete", delete(delete_file))
        .route("/v2/files", get(workspace))
        .route(
            "/api/v1/agent/attachments",
            post(server_upload).layer(DefaultBodyLimit::max(MAX_FORM_BYTES)),
        )
        .with_state(state)
}

fn invalid(field: &str, message: impl Into<String>) -> ErrorResponse {
    ErrorResponse::with_field(
        StatusCode::BAD_REQUEST,
        ErrorCode::InvalidRequest,
        message,
        field,
    )
}

fn internal(err: impl Into<anyhow::Error>) -> ErrorResponse {
    ErrorResponse::internal(&err.into())
}

/// The answer to a quota refusal: 429 (with `Retry-After` for the rate) or 403.
fn over_quota(err: QuotaError) -> ErrorResponse {
    let message = err.to_string();
    match err {
        QuotaError::RateLimited(wait) => ErrorResponse::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::RateLimited,
            message,
        )
        .retry_after(wait),
        QuotaError::TooManyPending(_) => ErrorResponse::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::RateLimited,
            message,
        ),
        QuotaError::Full(_) => {
            ErrorResponse::new(StatusCode::FORBIDDEN, ErrorCode::QuotaExceeded, message)
        }
    }
}

/// Checks that `owner` has room for one more file (see [`crate::quota`]).
async fn check_room(
    state: &AppState,
    owner: &str,
    size: Option<i64>,
    pending: bool,
) -> Result<(), ErrorResponse> {
    state
        .quota
        .room(&state.pool, owner, size, pending)
        .await
        .map_err(internal)?
        .map_err(over_quota)
}

/// A validated `POST /v2/files/upload-url` body.
struct UploadRequest {
    file_name: String,
    file_type: &'static file_types::FileType,
    file_size: u64,
    content_hash: Option<[u8; 32]>,
    session_id: Option<String>,
}

/// Parses and checks the body, naming the first offending field.
fn parse_upload_request(body: &[u8]) -> Result<UploadRequest, ErrorResponse> {
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

/// The last path component of a client's file name, without control characters.
pub(crate) fn base_name(raw: &str) -> Option<String> {
    let last = raw.rsplit(['/', '\\']).next().unwrap_or_default();
    let clean: String = last.chars().filter(|c| !c.is_control()).collect();
    let clean = clean.trim();
    (!clean.is_empty() && clean != "." && clean != "..").then(|| clean.to_owned())
}

/// A storage-safe rendering of a file name: ASCII letters, digits, `.`, `-`, `_`; never raw.
pub(crate) fn key_name(file_name: &str) -> String {
    let mut safe: String = file_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    safe = safe.trim_matches('.').chars().take(100).collect();
    if safe.is_empty() {
        "file".to_owned()
    } else {
        safe
    }
}

fn parse_sha256(hex_digest: &str) -> Option<[u8; 32]> {
    let bytes = hex::decode(hex_digest).ok()?;
    bytes.try_into().ok()
}

fn content_url(bucket: &str, key: &str) -> String {
    format!("s3://{bucket}/{key}")
}

/// `POST /v2/files/upload-url`: a presigned POST form for a new file, or the caller's existing
/// verified file with the same content (`is_duplicate`).
async fn upload_url(
    State(state): State<AppState>,
    owner: Owner,
    body: axum::body::Bytes,
) -> Result<Response, ErrorResponse> {
    let request = parse_upload_request(&body)?;
    let owner = owner.as_str();
    state.quota.rate(owner).map_err(over_quota)?;
    let now = Utc::now();
    let expires_at =
        now + chrono::Duration::from_std(state.upload_ttl).unwrap_or(chrono::Duration::minutes(5));
    let size = i64::try_from(request.file_size).unwrap_or(i64::MAX);
    for _ in 0..3 {
        if let Some(hash) = &request.content_hash
            && let Some(existing) = store::find_by_hash(&state.pool, owner, hash)
                .await
                .map_err(internal)?
        {
            if existing.size_bytes != size || existing.content_type != request.file_type.mime {
                return Err(ErrorResponse::with_field(
                    StatusCode::CONFLICT,
                    ErrorCode::Conflict,
                    "a file with this content_hash but another size or type is already being uploaded",
                    "content_hash",
                ));
            }
            if let Some(session) = &request.session_id {
                store::add_to_workspace(&state.pool, owner, session, existing.id, "upload")
                    .await
                    .map_err(internal)?;
            }
            if existing.status == "verified" {
                return Ok(axum::Json(json!({
                    "url": null,
                    "fields": null,
                    "content_url": content_url(&existing.bucket, &existing.object_key),
                    "is_duplicate": true,
                    "upload_required": false,
                }))
                .into_response());
            }
            // Pending: the same bytes may be sent again to the same key, with a fresh form.
            store::extend_pending(&state.pool, existing.id, expires_at)
                .await
                .map_err(internal)?;
            return Ok(form_answer(
                &state,
                existing.id,
                &existing.bucket,
                &existing.object_key,
                request.file_type.mime,
                request.file_size,
                request.content_hash,
            ));
        }
        // A new file: the owner must have room for it (a duplicate above adds nothing).
        check_room(&state, owner, Some(size), true).await?;
        let id = Uuid::now_v7();
        let key = crate::server_upload::object_key(owner, id, &request.file_name);
        let inserted = store::insert_file(
            &state.pool,
            &NewUpload {
                id,
                owner,
                bucket: &state.bucket,
                key: &key,
                file_name: &request.file_name,
                content_type: request.file_type.mime,
                size,
                declared_sha256: request.content_hash.as_ref().map(|h| h.as_slice()),
                expires_at,
            },
            None,
        )
        .await
        .map_err(internal)?;
        if inserted {
            if let Some(session) = &request.session_id {
                store::add_to_workspace(&state.pool, owner, session, id, "upload")
                    .await
                    .map_err(internal)?;
            }
            tracing::info!(file.id = %id, "upload form signed");
            return Ok(form_answer(
                &state,
                id,
                &state.bucket,
                &key,
                request.file_type.mime,
                request.file_size,
                request.content_hash,
            ));
        }
        // A concurrent request for the same content won the insert: answer with its file.
    }
    Err(internal(anyhow::anyhow!(
        "upload-url did not settle after concurrent inserts"
    )))
}

/// The upload form of the pending file `id`: it posts to the file's staging key (see
/// [`store::staging_key`]); the answer's `content_url` names the final `bucket`/`key`.
fn form_answer(
    state: &AppState,
    id: Uuid,
    bucket: &str,
    key: &str,
    mime: &str,
    size: u64,
    sha256: Option<[u8; 32]>,
) -> Response {
    let staging = store::staging_key(id);
    let form = state.signer.sign(
        &Upload {
            bucket,
            key: &staging,
            content_type: mime,
            size,
            sha256,
        },
        Utc::now(),
        state.upload_ttl,
    );
    axum::Json(json!({
        "url": form.url,
        "fields": Value::Object(form.fields),
        "content_url": content_url(bucket, key),
        "is_duplicate": false,
        "upload_required": true,
    }))
    .into_response()
}

#[derive(Debug, Deserialize)]
struct ContentUrlQuery {
    content_url: Option<String>,
}

/// The caller's file named by `content_url` (any form `parse_file_url` accepts).
async fn owned_file(
    state: &AppState,
    owner: &str,
    raw: Option<&str>,
) -> Result<Option<store::FileRow>, ErrorResponse> {
    let raw = raw.ok_or_else(|| invalid("content_url", "content_url is required"))?;
    let file = parse_file_url(raw).map_err(|e| invalid("content_url", e.to_string()))?;
    store::find_owned(&state.pool, owner, &file.bucket, &file.path)
        .await
        .map_err(internal)
}

/// `GET /v2/files/download-url?content_url=...`: a freshly signed, short-lived download link.
async fn download_url(
    State(state): State<AppState>,
    owner: Owner,
    Query(query): Query<ContentUrlQuery>,
) -> Result<axum::Json<Value>, ErrorResponse> {
    let mut file = owned_file(&state, owner.as_str(), query.content_url.as_deref())
        .await?
        .ok_or_else(|| ErrorResponse::not_found("file"))?;
    if file.status == "pending" {
        // Uploaded moments ago, perhaps: verify now rather than wait for the sweeper.
        let verdict = crate::verify::verify(&state.s3, &state.pool, &file)
            .await
            .map_err(internal)?;
        if verdict == crate::verify::Verdict::Verified {
            file.status = "verified".to_owned();
        }
    }
    if file.status != "verified" {
        return Err(ErrorResponse::not_found("file"));
    }
    let url = crate::download::sign(&state.signer, &file, state.download_ttl).map_err(internal)?;
    Ok(axum::Json(json!({
        "url": url,
        "expires_in": state.download_ttl.as_secs(),
        "content_type": file.content_type,
        "file_name": file.file_name,
        "file_size": file.size_bytes,
    })))
}

/// `GET /v2/files/content/{fileId}?expires=&signature=`: the bytes behind a download link, with
/// the headers of [`crate::download`]. The link is the credential (no bearer token): 403 for a
/// bad, missing or expired signature, 404 for a file that is not (or no longer) verified.
async fn content(
    State(state): State<AppState>,
    Path(file_id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ErrorResponse> {
    let now = std::time::SystemTime::now();
    let link = crate::download::check(&state.signer, &file_id, query.as_deref(), now)
        .map_err(internal)?
        .map_err(|refused| {
            let field = match refused {
                crate::download::LinkError::BadSignature => "signature",
                crate::download::LinkError::Expired => "expires",
            };
            ErrorResponse::with_field(
                StatusCode::FORBIDDEN,
                ErrorCode::Unauthorized,
                refused.to_string(),
                field,
            )
        })?;
    let file = store::find_verified(&state.pool, link.file_id)
        .await
        .map_err(internal)?
        .ok_or_else(|| ErrorResponse::not_found("file"))?;
    crate::download::serve(&state.s3, &file, link, now)
        .await
        .map_err(internal)?
        .ok_or_else(|| ErrorResponse::not_found("file"))
}

/// `DELETE /v2/files/delete?content_url=...`: removes the caller's file and its object.
/// Idempotent: a file that is not there (any more, or not the caller's) answers 204 as well.
async fn delete_file(
    State(state): State<AppState>,
    owner: Owner,
    Query(query): Query<ContentUrlQuery>,
) -> Result<StatusCode, ErrorResponse> {
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
                .map_err(|e| internal(aws_sdk_s3::Error::from(e)))?;
        }
        store::delete(&state.pool, file.id)
            .await
            .map_err(internal)?;
        tracing::info!(file.id = %file.id, "file deleted");
    }
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_parts_are_stripped_from_file_names_and_keys_are_safe() {
        assert_eq!(base_name("../../etc/passwd").as_deref(), Some("passwd"));
        assert_eq!(
            base_name("C:\\Users\\me\\báo cáo.pdf").as_deref(),
            Some("báo cáo.pdf")
        );
        assert_eq!(base_name("dir/"), None);
        assert_eq!(key_name("báo cáo (1).pdf"), "b_o_c_o__1_.pdf");
        assert_eq!(key_name("..."), "file");
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
/// the file is streamed to S3 while hashed and checked; answers `{bucket, path, mime_type, url}`.
async fn server_upload(
    State(state): State<AppState>,
    owner: Owner,
    form: Multipart,
) -> Result<axum::Json<Value>, ErrorResponse> {
    use crate::server_upload::{UploadError, object_key, receive};
    let owner = owner.as_str();
    state.quota.rate(owner).map_err(over_quota)?;
    check_room(&state, owner, None, false).await?;
    let id = Uuid::now_v7();
    let stored = receive(
        &state.s3,
        &state.bucket,
        |name| object_key(owner, id, name),
        form,
        MAX_FILE_BYTES,
    )
    .await
    .map_err(|err| match err {
        UploadError::Invalid { field, message } => invalid(field, message),
        UploadError::TooLarge => ErrorResponse::with_field(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::PayloadTooLarge,
            "file exceeds the 100 MB limit",
            "file",
        ),
        UploadError::Failed(e) => internal(e),
    })?;
    // Its size is known now: over the byte quota, the object goes again.
    let size = i64::try_from(stored.size).unwrap_or(i64::MAX);
    if let Err(refused) = state
        .quota
        .room(&state.pool, owner, Some(size), false)
        .await
        .map_err(internal)?
    {
        state
            .s3
            .delete_object()
            .bucket(&state.bucket)
            .key(&stored.key)
            .send()
            .await
            .map_err(|e| internal(aws_sdk_s3::Error::from(e)))?;
        return Err(over_quota(refused));
    }
    let upload = NewUpload {
        id,
        owner,
        bucket: &state.bucket,
        key: &stored.key,
        file_name: &stored.file_name,
        content_type: stored.file_type.mime,
        size: i64::try_from(stored.size).unwrap_or(i64::MAX),
        declared_sha256: None,
        expires_at: Utc::now(),
    };
    let file = if store::insert_file(&state.pool, &upload, Some(&stored.sha256))
        .await
        .map_err(internal)?
    {
        store::find_owned(&state.pool, owner, &state.bucket, &stored.key)
            .await
            .map_err(internal)?
    } else {
        // The owner already has this content: keep one object.
        state
            .s3
            .delete_object()
            .bucket(&state.bucket)
            .key(&stored.key)
            .send()
            .await
            .map_err(|e| internal(aws_sdk_s3::Error::from(e)))?;
        store::find_by_hash(&state.pool, owner, &stored.sha256)
            .await
            .map_err(internal)?
    };
    let file = file.filter(|f| f.status == "verified").ok_or_else(|| {
        ErrorResponse::with_field(
            StatusCode::CONFLICT,
            ErrorCode::Conflict,
            "this content is already being uploaded with a presigned form; retry once it completes",
            "file",
        )
    })?;
    if let Some(session) = &stored.session_id {
        store::add_to_workspace(&state.pool, owner, session, file.id, "upload")
            .await
            .map_err(internal)?;
    }
    let url = crate::download::sign(&state.signer, &file, state.download_ttl).map_err(internal)?;
    tracing::info!(file.id = %file.id, size = stored.size, "file uploaded through the service");
    Ok(axum::Json(json!({
        "bucket": file.bucket,
        "path": file.object_key,
        "mime_type": file.content_type,
        "url": url,
    })))
}

#[derive(Debug, Deserialize)]
struct WorkspaceQuery {
    session_id: Option<String>,
}

/// `GET /v2/files?session_id=...`: the files of one of the caller's sessions, uploads and
/// generated ones, oldest first.
async fn workspace(
    State(state): State<AppState>,
    owner: Owner,
    Query(query): Query<WorkspaceQuery>,
) -> Result<axum::Json<Value>, ErrorResponse> {
    let session = query
        .session_id
        .filter(|s| !s.is_empty() && s.chars().count() <= MAX_SESSION_ID_CHARS)
        .ok_or_else(|| {
            invalid(
                "session_id",
                "session_id must be a string of 1 to 128 characters",
            )
        })?;
    let rows = store::workspace(&state.pool, owner.as_str(), &session)
        .await
        .map_err(internal)?;
    let files: Vec<Value> = rows
        .into_iter()
        .map(|row| {
            let icon = file_types::allowed(&row.content_type).map_or("file", |t| t.icon);
            json!({
                "content_url": content_url(&row.bucket, &row.object_key),
                "path": row.object_key,
                "filename": row.file_name,
                "icon_type": icon,
                "source": row.source,
                "file_size": row.size_bytes,
                "content_type": row.content_type,
                "status": row.status,
                "created_at": row.created_at,
            })
        })
        .collect();
    Ok(axum::Json(json!({"session_id": session, "files": files})))
}
