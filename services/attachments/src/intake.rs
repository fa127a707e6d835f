//! File intake: the one place a file record is created. Files arrive four ways, and each goes
//! through here for the per-owner quota (files, bytes, unfinished uploads), the SHA-256 dedup,
//! the insert and the concurrent-insert race:
//!
//! - a presigned form, its bytes still to come: `POST /v2/files/upload-url`
//!   ([`crate::upload_url`]) and a large generated file ([`crate::generated`]), both
//!   [`Intake::claim`];
//! - bytes already stored by the service: the server upload ([`crate::server_upload`]) and a
//!   small generated file sent inline ([`crate::generated`]), both [`Intake::keep_stored`].
//!
//! The quota is judged and the file inserted in one transaction holding the owner's advisory
//! lock ([`store::claim_upload`], [`store::insert_within_quota`]): concurrent requests of one
//! owner cannot together overshoot a limit. The owner's live file with the same content answers
//! instead of a new one, and an insert that loses the race to a concurrent request for the same
//! content (`files_owner_sha256_live_key`) is answered with that request's file: two clients
//! racing on one content always share one file.

use std::time::Duration;

use chrono::{DateTime, Utc};
use protocol::file_types::FileType;
use sqlx::PgPool;
use uuid::Uuid;

use crate::quota::{Quota, QuotaError};
use crate::store::{self, FileRow, FileStatus, NewUpload, Source};

/// How often a new file is tried when concurrent requests for the same content keep winning.
const ATTEMPTS: usize = 3;

/// What file intake needs: the pool, the quota and where new files go.
pub(crate) struct Intake<'a> {
    pub(crate) pool: &'a PgPool,
    pub(crate) quota: &'a Quota,
    pub(crate) bucket: &'a str,
    /// Validity of upload forms (a pending file expires with its form).
    pub(crate) upload_ttl: Duration,
}

/// A file whose bytes are to come through a presigned form.
#[derive(Debug)]
pub(crate) struct Presigned<'r> {
    /// The plain file name (see [`crate::file_name::base_name`]).
    pub(crate) file_name: &'r str,
    /// Its allowed type.
    pub(crate) file_type: &'static FileType,
    /// Its exact size in bytes.
    pub(crate) size: u64,
    /// The SHA-256 the stored bytes must have, when declared: the owner's live file with it
    /// answers instead of a new one.
    pub(crate) sha256: Option<[u8; 32]>,
    /// The session whose workspace the file joins.
    pub(crate) session_id: Option<&'r str>,
    /// Who makes it: an upload of the owner, or a file an agent generated (its key and its
    /// workspace entry say so).
    pub(crate) source: Source,
}

/// The file a presigned request is answered with, once PostgreSQL settled it.
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

/// Why no file was claimed (the edge picks the status or the message).
#[derive(Debug, thiserror::Error)]
pub(crate) enum IntakeError {
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

impl From<sqlx::Error> for IntakeError {
    fn from(err: sqlx::Error) -> Self {
        IntakeError::Failed(err.into())
    }
}

impl Intake<'_> {
    /// Is there room for one more file of `owner` of `size` bytes (`None`: not known yet)?
    /// Only an early refusal, before any work (see [`Quota::room`]): the insert is judged again.
    pub(crate) async fn room(
        &self,
        owner: &str,
        size: Option<i64>,
        pending: bool,
    ) -> anyhow::Result<Result<(), QuotaError>> {
        self.quota.room(self.pool, owner, size, pending).await
    }

    /// When a pending file claimed now expires.
    pub(crate) fn expires_at(&self) -> DateTime<Utc> {
        Utc::now()
            + chrono::Duration::from_std(self.upload_ttl).unwrap_or(chrono::Duration::minutes(5))
    }

    /// All the PostgreSQL work of a presigned request, on one connection (one check on
    /// acquire): the dedup lookup, the quota and the insert of a new pending file in one
    /// statement, in a transaction holding the owner's quota lock so that concurrent requests
    /// cannot overshoot the limits ([`store::claim_upload`]); the owner's live file with the same
    /// content answers instead; then the session's workspace entry.
    pub(crate) async fn claim(
        &self,
        owner: &str,
        request: &Presigned<'_>,
    ) -> Result<Claimed, IntakeError> {
        let expires_at = self.expires_at();
        let size = i64::try_from(request.size).unwrap_or(i64::MAX);
        let limits = self.quota.limits();
        let mut conn = self.pool.acquire().await?;
        for _ in 0..ATTEMPTS {
            let id = Uuid::now_v7();
            let key = match request.source {
                Source::Upload => crate::file_name::upload_key(owner, id, request.file_name),
                Source::Generated => crate::file_name::generated_key(owner, id, request.file_name),
            };
            let new = NewUpload {
                id,
                owner,
                bucket: self.bucket,
                key: &key,
                file_name: request.file_name,
                content_type: request.file_type.mime,
                size,
                declared_sha256: request.sha256.as_ref().map(|h| h.as_slice()),
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
                    return Err(IntakeError::HashConflict);
                }
                if let Some(session) = request.session_id {
                    store::add_to_workspace(
                        &mut *conn,
                        owner,
                        session,
                        existing.id,
                        request.source,
                    )
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
                if let Some(session) = request.session_id {
                    store::add_to_workspace(&mut *conn, owner, session, id, request.source).await?;
                }
                match request.source {
                    Source::Upload => tracing::info!(file.id = %id, "upload form signed"),
                    Source::Generated => {
                        tracing::info!(file.id = %id, "generated file upload form signed")
                    }
                }
                return Ok(Claimed::Pending {
                    id,
                    bucket: self.bucket.to_owned(),
                    key,
                });
            }
            // Nothing inserted: the owner has no room for a new file (a duplicate above adds
            // nothing), or a concurrent request for the same content won the insert: answer
            // with its file.
            self.quota.judge(&claim.usage, Some(size))?;
        }
        Err(match request.source {
            Source::Upload => anyhow::anyhow!("upload-url did not settle after concurrent inserts"),
            Source::Generated => {
                anyhow::anyhow!("generated upload did not settle after concurrent inserts")
            }
        }
        .into())
    }

    /// Records bytes the service already stored at `upload.key` in `s3` as a verified file with
    /// their `sha256`, if the owner still has room for it, judged and recorded atomically per
    /// owner ([`Quota::insert`]). When the owner already has these bytes (or a concurrent request
    /// recorded them first), their earlier file answers and the new object goes: one object per
    /// content. When nothing is recorded, or recording failed, the object goes too: no object
    /// is left that no file names.
    ///
    /// `Ok(Ok(file))`: the file these bytes are now, `None` if it is gone already; `Ok(Err)`:
    /// no room.
    pub(crate) async fn keep_stored(
        &self,
        s3: &aws_sdk_s3::Client,
        upload: &NewUpload<'_>,
        sha256: &[u8; 32],
    ) -> anyhow::Result<Result<Option<FileRow>, QuotaError>> {
        let inserted = match self
            .quota
            .insert(self.pool, upload, Some(sha256.as_slice()))
            .await
        {
            Ok(inserted) => inserted,
            Err(failed) => {
                // Not recorded: the object would be one no file names.
                if let Err(err) = delete_object(s3, upload).await {
                    tracing::warn!(error = %err, "object of an unrecorded upload not removed");
                }
                return Err(failed);
            }
        };
        Ok(Ok(match inserted {
            Ok(true) => {
                store::find_owned(self.pool, upload.owner, upload.bucket, upload.key).await?
            }
            Ok(false) => {
                // The owner already has this content: keep one object.
                delete_object(s3, upload).await?;
                store::find_by_hash(self.pool, upload.owner, sha256).await?
            }
            Err(refused) => {
                delete_object(s3, upload).await?;
                return Ok(Err(refused));
            }
        }))
    }
}

/// Deletes the object of `upload`, which no file names.
async fn delete_object(s3: &aws_sdk_s3::Client, upload: &NewUpload<'_>) -> anyhow::Result<()> {
    s3.delete_object()
        .bucket(upload.bucket)
        .key(upload.key)
        .send()
        .await
        .map_err(aws_sdk_s3::Error::from)?;
    Ok(())
}
