//! `POST /v2/files/upload-url`'s work, once the handler has parsed the request: per-owner dedup
//! by the declared SHA-256, else a new pending file and a presigned form for its bytes
//! ([`Intake::claim`]). The owner's live file with the same content answers instead of a new
//! one: a verified file as a duplicate (nothing to upload), a pending one with a fresh form for
//! the same key.

use std::time::Duration;

use chrono::Utc;
use sqlx::PgPool;
use uuid::Uuid;

use crate::AppState;
use crate::intake::{Claimed, Intake, Presigned};
use crate::policy::{SignedForm, Upload};
use crate::quota::Quota;
use crate::store::{self, Source};

// Why no answer was made (the HTTP layer picks the status): intake's refusals.
pub(crate) use crate::intake::IntakeError as UploadUrlError;

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

impl UploadRequest {
    /// The file intake is asked for: an upload of the owner.
    fn presigned(&self) -> Presigned<'_> {
        Presigned {
            file_name: &self.file_name,
            file_type: self.file_type,
            size: self.file_size,
            sha256: self.content_hash,
            session_id: self.session_id.as_deref(),
            source: Source::Upload,
        }
    }
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

/// The answer to `owner`'s `request` (see the module's doc): [`Intake::claim`], then a signed
/// form for a pending file.
pub(crate) async fn upload_url(
    state: &AppState,
    owner: &str,
    request: &UploadRequest,
) -> Result<UploadAnswer, UploadUrlError> {
    let intake = Intake {
        pool: &state.pool,
        quota: &state.quota,
        bucket: &state.bucket,
        upload_ttl: state.upload_ttl,
    };
    Ok(match intake.claim(owner, &request.presigned()).await? {
        Claimed::Verified { bucket, key } => UploadAnswer::Duplicate { bucket, key },
        Claimed::Pending { id, bucket, key } => UploadAnswer::Upload {
            form: sign_form(state, id, &bucket, request),
            bucket,
            key,
        },
    })
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

/// The PostgreSQL work of `POST /v2/files/upload-url` alone ([`Intake::claim`], the function the
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
            quota: Quota::new(config.quota.clone()),
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
        let intake = Intake {
            pool: &self.pool,
            quota: &self.quota,
            bucket: &self.bucket,
            upload_ttl: self.upload_ttl,
        };
        intake.claim(owner, &request.presigned()).await?;
        Ok(())
    }
}
