//! Verification of stored uploads: a declared hash is a claim, not a fact. A file becomes usable
//! only once its stored object has the declared size, its SHA-256 is known (S3's checksum where
//! the upload carried one, otherwise by reading the object once) and matches any declared hash,
//! and its leading bytes look like its declared type. Anything else quarantines it.

use aws_sdk_s3::types::ChecksumMode;
use base64::Engine as _;
use chrono::Utc;
use futures::StreamExt as _;
use protocol::file_types;
use sha2::{Digest, Sha256};
use sqlx::PgPool;

use crate::store::{self, FileRow};

/// Bytes read from the start of an object to check its type.
const HEAD_BYTES: usize = 4096;

/// What verifying a pending file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Verified now.
    Verified,
    /// Quarantined now, with the reason.
    Quarantined(String),
    /// No object yet and the upload window is still open.
    Waiting,
    /// No object and the window closed: the record was removed.
    Expired,
}

/// Verifies one pending file against its uploaded object: the bytes at its staging key are
/// judged, and verified bytes are copied to the file's own key (which no form can write) before
/// the file is marked verified; the staged copy is then removed. A pending file of an earlier
/// release, uploaded straight to its own key, is judged there.
///
/// Two verifiers may meet on one file (the sweeper and a first download, or two replicas): the
/// one that loses finds the staged object gone mid-way (`NoSuchKey`) and looks again, finding
/// the file at its own key.
pub(crate) async fn verify(
    s3: &aws_sdk_s3::Client,
    pool: &PgPool,
    file: &FileRow,
) -> anyhow::Result<Verdict> {
    match verify_once(s3, pool, file).await {
        Err(err) if staged_object_gone(&err) => verify_once(s3, pool, file).await,
        verdict => verdict,
    }
}

/// Whether `err` is S3 saying the object is not there (any operation's `NoSuchKey`).
fn staged_object_gone(err: &anyhow::Error) -> bool {
    use aws_sdk_s3::error::ProvideErrorMetadata as _;
    err.chain().any(|cause| {
        cause.downcast_ref::<aws_sdk_s3::Error>().is_some_and(|e| {
            e.code() == Some("NoSuchKey") || matches!(e, aws_sdk_s3::Error::NoSuchKey(_))
        })
    })
}

async fn verify_once(
    s3: &aws_sdk_s3::Client,
    pool: &PgPool,
    file: &FileRow,
) -> anyhow::Result<Verdict> {
    let staging = store::staging_key(file.id);
    let mut found = None;
    for key in [staging.as_str(), file.object_key.as_str()] {
        let head = s3
            .head_object()
            .bucket(&file.bucket)
            .key(key)
            .checksum_mode(ChecksumMode::Enabled)
            .send()
            .await;
        match head {
            Ok(head) => {
                found = Some((key, head));
                break;
            }
            Err(err) if err.as_service_error().is_some_and(|e| e.is_not_found()) => {}
            Err(err) => return Err(aws_sdk_s3::Error::from(err).into()),
        }
    }
    let Some((key, head)) = found else {
        if file.expires_at.is_some_and(|at| at < Utc::now()) {
            store::delete(pool, file.id).await?;
            return Ok(Verdict::Expired);
        }
        return Ok(Verdict::Waiting);
    };
    match judge(s3, file, key, head.content_length(), head.checksum_sha256()).await? {
        Ok(sha256) => {
            if key == staging {
                s3.copy_object()
                    .bucket(&file.bucket)
                    .key(&file.object_key)
                    .copy_source(format!("{}/{staging}", file.bucket))
                    .content_type(&file.content_type)
                    .metadata_directive(aws_sdk_s3::types::MetadataDirective::Replace)
                    .send()
                    .await
                    .map_err(aws_sdk_s3::Error::from)?;
            }
            store::mark_verified(pool, file.id, &sha256).await?;
            if key == staging {
                // Best effort: a staged copy left behind is never read again.
                let removed = s3
                    .delete_object()
                    .bucket(&file.bucket)
                    .key(&staging)
                    .send()
                    .await;
                if let Err(err) = removed {
                    tracing::warn!(file.id = %file.id, error = %aws_sdk_s3::error::DisplayErrorContext(err), "staged upload not removed");
                }
            }
            tracing::info!(file.id = %file.id, "upload verified");
            Ok(Verdict::Verified)
        }
        Err(problem) => {
            store::mark_quarantined(pool, file.id, &problem).await?;
            tracing::warn!(file.id = %file.id, problem, "upload quarantined");
            Ok(Verdict::Quarantined(problem))
        }
    }
}

/// The stored bytes' SHA-256 if they are what was declared, else the problem.
async fn judge(
    s3: &aws_sdk_s3::Client,
    file: &FileRow,
    key: &str,
    stored_size: Option<i64>,
    s3_checksum: Option<&str>,
) -> anyhow::Result<Result<Vec<u8>, String>> {
    if stored_size != Some(file.size_bytes) {
        return Ok(Err(format!(
            "stored size {} differs from the declared {}",
            stored_size.unwrap_or_default(),
            file.size_bytes
        )));
    }
    // A full-object SHA-256 checksum from S3 (not a multipart composite "...-N").
    let s3_sha = s3_checksum
        .filter(|c| !c.contains('-'))
        .and_then(|c| base64::engine::general_purpose::STANDARD.decode(c).ok())
        .filter(|d| d.len() == 32);
    let (sha256, head) = match s3_sha {
        Some(sha) => (sha, read(s3, file, key, Some(HEAD_BYTES)).await?.1),
        None => read(s3, file, key, None).await?,
    };
    if let Some(declared) = &file.declared_sha256
        && declared != &sha256
    {
        return Ok(Err(
            "stored bytes do not have the declared SHA-256".to_owned()
        ));
    }
    let matches = file_types::allowed(&file.content_type).is_some_and(|t| t.matches(&head));
    if !matches {
        return Ok(Err(format!("stored bytes are not {}", file.content_type)));
    }
    Ok(Ok(sha256))
}

/// Streams the object (or only its first `limit` bytes), returning its SHA-256 (of what was
/// read) and its first bytes. Memory stays bounded whatever the object's size.
async fn read(
    s3: &aws_sdk_s3::Client,
    file: &FileRow,
    key: &str,
    limit: Option<usize>,
) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let mut request = s3.get_object().bucket(&file.bucket).key(key);
    if let Some(limit) = limit {
        request = request.range(format!("bytes=0-{}", limit.saturating_sub(1)));
    }
    let mut body = request.send().await.map_err(aws_sdk_s3::Error::from)?.body;
    let mut hasher = Sha256::new();
    let mut head = Vec::with_capacity(HEAD_BYTES);
    while let Some(chunk) = body.try_next().await? {
        hasher.update(&chunk);
        let room = HEAD_BYTES - head.len();
        head.extend_from_slice(&chunk[..room.min(chunk.len())]);
    }
    Ok((hasher.finalize().to_vec(), head))
}

/// Uploads verified at once by the sweeper.
const SWEEP_CONCURRENCY: usize = 8;
/// Pending uploads a sweep takes on (the queue depth `/metrics` shows is capped by it).
const SWEEP_BATCH: i64 = 100;

/// Verifies pending uploads in the background (several at once) and forgets those never
/// completed. The per-owner cap on unfinished uploads bounds how many there can be.
pub(crate) async fn sweep(
    s3: aws_sdk_s3::Client,
    pool: PgPool,
    every: std::time::Duration,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let pending = match store::pending(&pool, SWEEP_BATCH).await {
            Ok(pending) => pending,
            Err(err) => {
                tracing::warn!(error = %err, "cannot list pending uploads");
                continue;
            }
        };
        #[expect(clippy::cast_precision_loss, reason = "a gauge is an f64; at most 100")]
        metrics::gauge!("switchboard_verification_queue_depth").set(pending.len() as f64);
        futures::stream::iter(pending)
            .for_each_concurrent(SWEEP_CONCURRENCY, |file| {
                let (s3, pool) = (&s3, &pool);
                async move {
                    if let Err(err) = verify(s3, pool, &file).await {
                        tracing::warn!(file.id = %file.id, error = format!("{err:#}"), "verification failed");
                    }
                }
            })
            .await;
    }
}
