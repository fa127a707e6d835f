//! `POST /v2/files/upload-url`'s work, once the handler has parsed the request: per-owner dedup
//! by the declared SHA-256, else a new pending file and a presigned form for its bytes. The
//! owner's live file with the same content answers instead of a new one: a verified file as a
//! duplicate (nothing to upload), a pending one with a fresh form for the same key. A new file is
//! claimed by an insert that yields to a concurrent request for the same content
//! (`files_owner_sha256_live_key`), which is then answered like an earlier one: two clients
//! racing on one content always share one file.

use chrono::Utc;
use uuid::Uuid;

use crate::AppState;
use crate::policy::{SignedForm, Upload};
use crate::quota::QuotaError;
use crate::store::{self, FileStatus, NewUpload, Source};

/// How often a new file is tried when concurrent requests for the same content keep winning.
const ATTEMPTS: usize = 3;

/// A checked `POST /v2/files/upload-url` body.
#[derive(Debug)]
pub(crate) struct UploadRequest {
    /// The plain file name (see [`crate::file_name::base_name`]).
    pub(crate) file_name: String,
    /// Its allowed type.
    pub(crate) file_type: &'static protocol::file_types::FileType,
    /// Its exact size in bytes (positive, within the limit).
    pub(crate) file_size: u64,
    /// The SHA-256 the client declares, which the stored bytes must have.
    pub(crate) content_hash: Option<[u8; 32]>,
    /// The session (thread) whose workspace the file joins.
    pub(crate) session_id: Option<String>,
}

/// What the caller is told to do.
#[derive(Debug)]
pub(crate) enum UploadAnswer {
    /// Nothing: the caller already has these bytes, verified, at `bucket`/`key`.
    Duplicate {
        /// The file's bucket.
        bucket: String,
        /// Its object key.
        key: String,
    },
    /// Post the bytes with `form`; the file will be at `bucket`/`key`.
    Upload {
        /// The signed form (it posts to the file's staging key, see [`store::staging_key`]).
        form: SignedForm,
        /// The file's bucket.
        bucket: String,
        /// Its object key.
        key: String,
    },
}

/// Why no answer was made (the HTTP layer picks the status).
#[derive(Debug, thiserror::Error)]
pub(crate) enum UploadUrlError {
    /// 409: the owner's file with the declared hash has another size or type.
    #[error("the declared hash belongs to a file of another size or type")]
    HashConflict,
    /// 429 or 403: the owner has no room for another file.
    #[error(transparent)]
    Quota(#[from] QuotaError),
    /// 500: PostgreSQL failed, or concurrent requests never let this one settle.
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

impl From<sqlx::Error> for UploadUrlError {
    fn from(err: sqlx::Error) -> Self {
        UploadUrlError::Failed(err.into())
    }
}

/// The answer to `owner`'s `request` (see the module's doc).
pub(crate) async fn upload_url(
    state: &AppState,
    owner: &str,
    request: &UploadRequest,
) -> Result<UploadAnswer, UploadUrlError> {
    let expires_at = Utc::now()
        + chrono::Duration::from_std(state.upload_ttl).unwrap_or(chrono::Duration::minutes(5));
    let size = i64::try_from(request.file_size).unwrap_or(i64::MAX);
    for _ in 0..ATTEMPTS {
        if let Some(hash) = &request.content_hash
            && let Some(existing) = store::find_by_hash(&state.pool, owner, hash).await?
        {
            if existing.size_bytes != size || existing.content_type != request.file_type.mime {
                return Err(UploadUrlError::HashConflict);
            }
            if let Some(session) = &request.session_id {
                store::add_to_workspace(&state.pool, owner, session, existing.id, Source::Upload)
                    .await?;
            }
            if existing.status == FileStatus::Verified {
                return Ok(UploadAnswer::Duplicate {
                    bucket: existing.bucket,
                    key: existing.object_key,
                });
            }
            // Pending: the same bytes may be sent again to the same key, with a fresh form.
            store::extend_pending(&state.pool, existing.id, expires_at).await?;
            let form = sign_form(state, existing.id, &existing.bucket, request);
            return Ok(UploadAnswer::Upload {
                form,
                bucket: existing.bucket,
                key: existing.object_key,
            });
        }
        // A new file: the owner must have room for it (a duplicate above adds nothing).
        state
            .quota
            .room(&state.pool, owner, Some(size), true)
            .await??;
        let id = Uuid::now_v7();
        let key = crate::file_name::upload_key(owner, id, &request.file_name);
        let new = NewUpload {
            id,
            owner,
            bucket: &state.bucket,
            key: &key,
            file_name: &request.file_name,
            content_type: request.file_type.mime,
            size,
            declared_sha256: request.content_hash.as_ref().map(|h| h.as_slice()),
            expires_at,
        };
        if store::insert_file(&state.pool, &new, None).await? {
            if let Some(session) = &request.session_id {
                store::add_to_workspace(&state.pool, owner, session, id, Source::Upload).await?;
            }
            tracing::info!(file.id = %id, "upload form signed");
            return Ok(UploadAnswer::Upload {
                form: sign_form(state, id, &state.bucket, request),
                bucket: state.bucket.clone(),
                key,
            });
        }
        // A concurrent request for the same content won the insert: answer with its file.
    }
    Err(anyhow::anyhow!("upload-url did not settle after concurrent inserts").into())
}

/// The upload form of the pending file `id` in `bucket`: it posts to the file's staging key
/// (see [`store::staging_key`]), exactly the request's type, size and declared hash.
fn sign_form(state: &AppState, id: Uuid, bucket: &str, request: &UploadRequest) -> SignedForm {
    let staging = store::staging_key(id);
    state.signer.sign(
        &Upload {
            bucket,
            key: &staging,
            content_type: request.file_type.mime,
            size: request.file_size,
            sha256: request.content_hash,
        },
        Utc::now(),
        state.upload_ttl,
    )
}
