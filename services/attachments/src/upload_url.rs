//! `POST /v2/files/upload-url`'s work, once the handler has parsed the request: per-owner dedup
//! by the declared SHA-256, else a new pending file and a presigned form for its bytes. The
//! owner's live file with the same content answers instead of a new one: a verified file as a
//! duplicate (nothing to upload), a pending one with a fresh form for the same key. A new file is
//! claimed by an insert that yields to a concurrent request for the same content
//! (`files_owner_sha256_live_key`), which is then answered like an earlier one: two clients
//! racing on one content always share one file.

use std::time::Duration;

use chrono::Utc;
use sqlx::PgPool;
use uuid::Uuid;

use crate::AppState;
use crate::policy::{SignedForm, Upload};
use crate::quota::{Quota, QuotaError};
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

/// The answer to `owner`'s `request` (see the module's doc): [`claim`], then a signed form
/// for a pending file.
pub(crate) async fn upload_url(
    state: &AppState,
    owner: &str,
    request: &UploadRequest,
) -> Result<UploadAnswer, UploadUrlError> {
    let db = Db {
        pool: &state.pool,
        quota: &state.quota,
        bucket: &state.bucket,
        upload_ttl: state.upload_ttl,
    };
    Ok(match claim(&db, owner, request).await? {
        Claimed::Verified { bucket, key } => UploadAnswer::Duplicate { bucket, key },
        Claimed::Pending { id, bucket, key } => UploadAnswer::Upload {
            form: sign_form(state, id, &bucket, request),
            bucket,
            key,
        },
    })
}

/// What [`claim`] needs: the pool, the quota and where new files go.
pub(crate) struct Db<'a> {
    pub(crate) pool: &'a PgPool,
    pub(crate) quota: &'a Quota,
    pub(crate) bucket: &'a str,
    pub(crate) upload_ttl: Duration,
}

/// The file a request is answered with, once PostgreSQL settled it.
#[derive(Debug)]
pub(crate) enum Claimed {
    /// The owner's verified file with the same content: nothing to upload.
    Verified { bucket: String, key: String },
    /// A pending file whose bytes are to come: the owner's earlier one with the same content
    /// (its expiry extended), or a new one.
    Pending {
        id: Uuid,
        bucket: String,
        key: String,
    },
}

/// All the PostgreSQL work of a request, on one connection (one check on acquire): the dedup
/// lookup, the quota and the insert of a new pending file in one statement, in a transaction
/// holding the owner's quota lock so that concurrent requests cannot overshoot the limits
/// ([`store::claim_upload`]); the owner's live file with the same content answers instead; then
/// the session's workspace entry.
pub(crate) async fn claim(
    db: &Db<'_>,
    owner: &str,
    request: &UploadRequest,
) -> Result<Claimed, UploadUrlError> {
    let expires_at = Utc::now()
        + chrono::Duration::from_std(db.upload_ttl).unwrap_or(chrono::Duration::minutes(5));
    let size = i64::try_from(request.file_size).unwrap_or(i64::MAX);
    let limits = db.quota.limits();
    let mut conn = db.pool.acquire().await?;
    for _ in 0..ATTEMPTS {
        let id = Uuid::now_v7();
        let key = crate::file_name::upload_key(owner, id, &request.file_name);
        let new = NewUpload {
            id,
            owner,
            bucket: db.bucket,
            key: &key,
            file_name: &request.file_name,
            content_type: request.file_type.mime,
            size,
            declared_sha256: request.content_hash.as_ref().map(|h| h.as_slice()),
            expires_at,
        };
        let claim = store::claim_upload(
            &mut conn,
            &new,
            limits.max_pending,
            limits.max_files,
            limits.max_bytes,
        )
        .await?;
        if let Some(existing) = claim.existing {
            if existing.size_bytes != size || existing.content_type != request.file_type.mime {
                return Err(UploadUrlError::HashConflict);
            }
            if let Some(session) = &request.session_id {
                store::add_to_workspace(&mut *conn, owner, session, existing.id, Source::Upload)
                    .await?;
            }
            if existing.status == FileStatus::Verified {
                return Ok(Claimed::Verified {
                    bucket: existing.bucket,
                    key: existing.object_key,
                });
            }
            // Pending: the same bytes may be sent again to the same key, with a fresh form.
            store::extend_pending(&mut *conn, existing.id, expires_at).await?;
            return Ok(Claimed::Pending {
                id: existing.id,
                bucket: existing.bucket,
                key: existing.object_key,
            });
        }
        if claim.inserted {
            if let Some(session) = &request.session_id {
                store::add_to_workspace(&mut *conn, owner, session, id, Source::Upload).await?;
            }
            tracing::info!(file.id = %id, "upload form signed");
            return Ok(Claimed::Pending {
                id,
                bucket: db.bucket.to_owned(),
                key,
            });
        }
        // Nothing inserted: the owner has no room for a new file (a duplicate above adds
        // nothing), or a concurrent request for the same content won the insert: answer with
        // its file.
        db.quota.judge(&claim.usage, Some(size))?;
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

/// The PostgreSQL work of `POST /v2/files/upload-url` alone ([`claim`], the function the
/// handler calls), without HTTP, the token, the rate limit or the signing: what the raw loop of
/// `crates/bench` (`pg-upload-loop`, BENCHMARKS.md section 3) runs, so that its "same work"
/// cannot drift from the service's.
pub struct UploadUrlWork {
    pool: PgPool,
    quota: Quota,
    bucket: String,
    upload_ttl: Duration,
}

impl UploadUrlWork {
    /// The service's pool ([`crate::connect_pool`]: the same settings), quota and bucket.
    pub async fn connect(config: &crate::Config) -> anyhow::Result<Self> {
        Ok(Self {
            pool: crate::connect_pool(config).await?,
            // The download rate plays no part in this work.
            quota: Quota::new(config.quota.clone(), &crate::Limits::default()),
            bucket: config.s3.bucket.clone(),
            upload_ttl: config.upload_ttl,
        })
    }

    /// The pool it works on.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// One request of `owner` for a file `file_name` of MIME type `file_type` and `file_size`
    /// bytes, declaring the SHA-256 `content_hash`, without a session: what the handler does
    /// in PostgreSQL for it (an error where the handler would answer 409, 429, 403 or 500).
    pub async fn run(
        &self,
        owner: &str,
        file_name: &str,
        file_type: &str,
        file_size: u64,
        content_hash: [u8; 32],
    ) -> anyhow::Result<()> {
        let request = UploadRequest {
            file_name: file_name.to_owned(),
            file_type: protocol::file_types::allowed(file_type)
                .ok_or_else(|| anyhow::anyhow!("{file_type:?} is not an allowed file type"))?,
            file_size,
            content_hash: Some(content_hash),
            session_id: None,
        };
        let db = Db {
            pool: &self.pool,
            quota: &self.quota,
            bucket: &self.bucket,
            upload_ttl: self.upload_ttl,
        };
        claim(&db, owner, &request).await?;
        Ok(())
    }
}
