//! Files an agent made during a run, kept in the session's workspace: sent inline when small
//! ([`Generated::register`]: the service stores the bytes), else through a presigned form
//! ([`Generated::upload`]: the worker posts them). Both go through file intake
//! ([`crate::intake`]) like an owner's uploads, and count against the same quota.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use protocol::file_types;
use protocol::files::{
    GeneratedUpload, GeneratedUploadOutcome, MAX_GENERATED_FILE_BYTES, MAX_GENERATED_INLINE_BYTES,
    RegisterGenerated, RegisterOutcome,
};
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

use crate::file_name::generated_key;
use crate::intake::{Claimed, Intake, IntakeError, Presigned};
use crate::policy::{Signer, Upload};
use crate::store::{self, NewUpload, Source};

/// What keeping generated files needs.
pub(crate) struct Generated {
    pub(crate) pool: PgPool,
    pub(crate) s3: aws_sdk_s3::Client,
    /// Credentials and public endpoint upload forms are signed for.
    pub(crate) signer: Arc<Signer>,
    /// Bucket generated files go to.
    pub(crate) bucket: String,
    /// Validity of upload forms for large generated files.
    pub(crate) upload_ttl: Duration,
    /// The owners' storage quotas (generated files count like uploads).
    pub(crate) quota: Arc<crate::quota::Quota>,
}

/// The type and plain file name of a file an agent made, or why it is refused.
fn generated_file(
    content_type: &str,
    file_name: &str,
    session_id: &str,
) -> Result<(&'static file_types::FileType, String), &'static str> {
    let file_type =
        file_types::allowed(content_type).ok_or("content_type is not a supported type")?;
    let name = crate::file_name::base_name(file_name)
        .filter(|n| n.chars().count() <= crate::file_name::MAX_FILE_NAME_CHARS)
        .ok_or("file_name must name a file of at most 255 characters")?;
    if !valid_session(session_id) {
        return Err("session_id must be 1 to 128 characters");
    }
    Ok((file_type, name))
}

/// A session id as `file-attachments.md` allows it: 1 to 128 characters.
pub(crate) fn valid_session(session_id: &str) -> bool {
    !session_id.is_empty() && session_id.chars().count() <= 128
}

impl Generated {
    fn intake(&self) -> Intake<'_> {
        Intake {
            pool: &self.pool,
            quota: &self.quota,
            bucket: &self.bucket,
            upload_ttl: self.upload_ttl,
        }
    }

    /// Stores a file the agent generated and puts it in the session's workspace.
    pub(crate) async fn register(
        &self,
        request: RegisterGenerated,
    ) -> anyhow::Result<RegisterOutcome> {
        let RegisterGenerated::V1 {
            owner,
            session_id,
            file_name,
            content_type,
            content_base64,
        } = request;
        let refused = |message: &str| {
            Ok(RegisterOutcome::Refused {
                message: message.to_owned(),
            })
        };
        let (file_type, name) = match generated_file(&content_type, &file_name, &session_id) {
            Ok(checked) => checked,
            Err(message) => return refused(message),
        };
        let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(content_base64.as_bytes())
        else {
            return refused("content_base64 is not base64");
        };
        if bytes.is_empty() || bytes.len() > MAX_GENERATED_INLINE_BYTES {
            return refused("generated file must be 1 byte to 768 KiB");
        }
        if !file_type.matches(&bytes[..bytes.len().min(4096)]) {
            return refused("the bytes are not of the declared content_type");
        }
        let size = i64::try_from(bytes.len())?;
        let intake = self.intake();
        if let Err(full) = intake.room(&owner, Some(size), false).await? {
            return refused(&full.to_string());
        }
        let sha256: [u8; 32] = Sha256::digest(&bytes).into();
        let id = Uuid::now_v7();
        let key = generated_key(&owner, id, &name);
        self.s3
            .put_object()
            .bucket(&self.bucket)
            .key(&key)
            .content_type(file_type.mime)
            .body(bytes.into())
            .send()
            .await
            .map_err(aws_sdk_s3::Error::from)?;
        let upload = NewUpload {
            id,
            owner: &owner,
            bucket: &self.bucket,
            key: &key,
            file_name: &name,
            content_type: file_type.mime,
            size,
            declared_sha256: None,
            expires_at: chrono::Utc::now(),
        };
        // Checked and inserted under the owner's lock: concurrent registrations cannot pass the
        // quota together.
        let file = match intake.keep_stored(&self.s3, &upload, &sha256).await? {
            Ok(file) => file,
            Err(full) => return refused(&full.to_string()),
        };
        let Some(file) = file else {
            return refused("the same content is being uploaded; retry");
        };
        store::add_to_workspace(&self.pool, &owner, &session_id, file.id, Source::Generated)
            .await?;
        Ok(RegisterOutcome::Registered {
            content_url: format!("s3://{}/{}", file.bucket, file.object_key),
        })
    }

    /// Records a generated file too large to send inline as pending, with its declared size and
    /// SHA-256, in the session's workspace, and answers the presigned form its bytes go up
    /// with. The owner's live file with the same SHA-256 is reused (as `upload-url` does): a
    /// verified one needs no upload, a pending one gets a fresh form for its key.
    pub(crate) async fn upload(
        &self,
        request: GeneratedUpload,
    ) -> anyhow::Result<GeneratedUploadOutcome> {
        let GeneratedUpload::V1 {
            owner,
            session_id,
            file_name,
            content_type,
            file_size,
            sha256_hex,
        } = request;
        let refused = |message: &str| {
            Ok(GeneratedUploadOutcome::Refused {
                message: message.to_owned(),
            })
        };
        let (file_type, name) = match generated_file(&content_type, &file_name, &session_id) {
            Ok(checked) => checked,
            Err(message) => return refused(message),
        };
        if file_size == 0 || file_size > MAX_GENERATED_FILE_BYTES {
            return refused("generated file must be 1 byte to 100 MB");
        }
        let Some(sha256) = hex::decode(&sha256_hex)
            .ok()
            .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
        else {
            return refused("sha256_hex must be 64 hexadecimal characters");
        };
        let size = i64::try_from(file_size)?;
        let intake = self.intake();
        if let Err(full) = intake.room(&owner, Some(size), true).await? {
            return refused(&full.to_string());
        }
        let presigned = Presigned {
            file_name: &name,
            file_type,
            size: file_size,
            sha256: Some(sha256),
            session_id: Some(&session_id),
            source: Source::Generated,
        };
        let (id, bucket, key) = match intake.claim(&owner, &presigned).await {
            Ok(Claimed::Verified { bucket, key }) => {
                return Ok(GeneratedUploadOutcome::Stored {
                    content_url: format!("s3://{bucket}/{key}"),
                });
            }
            Ok(Claimed::Pending { id, bucket, key }) => (id, bucket, key),
            Err(IntakeError::HashConflict) => {
                return refused(
                    "a file with this SHA-256 but another size or type is already stored",
                );
            }
            Err(IntakeError::Quota(full)) => return refused(&full.to_string()),
            Err(IntakeError::Failed(err)) => return Err(err),
        };
        // The presigned POST form for exactly these bytes of the pending file (to its staging
        // key; the content URL names its final key).
        let staging = store::staging_key(id);
        let form = self.signer.sign(
            &Upload {
                bucket: &bucket,
                key: &staging,
                content_type: file_type.mime,
                size: file_size,
                sha256: Some(sha256),
            },
            chrono::Utc::now(),
            self.upload_ttl,
        );
        Ok(GeneratedUploadOutcome::Upload {
            url: form.url,
            fields: form.fields,
            content_url: format!("s3://{bucket}/{key}"),
        })
    }
}
