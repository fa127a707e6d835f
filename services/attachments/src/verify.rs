//! Verification of stored uploads: a declared hash is a claim, not a fact. A file becomes usable
//! only once its stored object has the declared size, its SHA-256 is known (S3's checksum where
//! the upload carried one, otherwise by reading the object once) and matches any declared hash,
//! and its leading bytes look like its declared type. Anything else quarantines it.
//!
//! **Once at a time.** Reading a 100 MB object and hashing it is the most expensive thing this
//! service does, and `download-url`, admission and the sweeper all ask for it. So one pending
//! file is verified by one verifier at a time, fleet-wide: in a process, the callers of
//! [`Verifier::verify`] for one file share a single verification (run in a task of its own, so
//! a caller that goes away does not abandon the others); across replicas, a verifier first takes
//! the file's lease in PostgreSQL (`files.verifying_until`, [`LEASE`]), and a replica that finds
//! it taken waits up to [`LEASE_WAIT`] for that verifier's outcome, then answers "not verified
//! yet" ([`Verdict::InProgress`]). Each pass that looked at the object is counted in
//! `switchboard_attachments_verifications_total` (by `outcome`) and the bytes it read in
//! `switchboard_attachments_verification_read_bytes_total`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use aws_sdk_s3::types::ChecksumMode;
use base64::Engine as _;
use chrono::Utc;
use futures::StreamExt as _;
use protocol::file_types;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use tokio::sync::watch;
use uuid::Uuid;

use crate::store::{self, FileRow, FileStatus, VerificationClaim};

/// Bytes read from the start of an object to check its type.
const HEAD_BYTES: usize = 4096;
/// How long a verifier holds a file before another may take it over: far longer than reading
/// and hashing 100 MB takes, so only a verifier that died loses its lease.
pub(crate) const LEASE: Duration = Duration::from_secs(60);
/// How long a caller waits for another replica's verification of the same file before it
/// answers "not verified yet" (within the 5 s runs gives `attachments.resolve`).
pub(crate) const LEASE_WAIT: Duration = Duration::from_secs(3);
/// How often a waiting caller looks whether the other replica is done.
const LEASE_POLL: Duration = Duration::from_millis(100);

/// What verifying a pending file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Verified (now, or by another verifier meanwhile).
    Verified,
    /// Quarantined, with the reason.
    Quarantined(String),
    /// No object yet and the upload window is still open.
    Waiting,
    /// No object and the window closed: the record was removed (or it is gone).
    Expired,
    /// Another replica is verifying it and was not done within [`LEASE_WAIT`].
    InProgress,
}

impl Verdict {
    /// The `outcome` label of the verification metric.
    fn label(&self) -> &'static str {
        match self {
            Verdict::Verified => "verified",
            Verdict::Quarantined(_) => "quarantined",
            Verdict::Waiting => "waiting",
            Verdict::Expired => "expired",
            Verdict::InProgress => "in_progress",
        }
    }
}

/// What the callers of one verification get: the verdict, or the failure (shared, so cloned).
type Outcome = Result<Verdict, Arc<anyhow::Error>>;

/// Verifies pending files, each once at a time (see the module doc).
pub(crate) struct Verifier {
    s3: aws_sdk_s3::Client,
    pool: PgPool,
    /// The verifications this process is running, by file id; each caller of one watches it.
    flights: Mutex<HashMap<Uuid, watch::Receiver<Option<Outcome>>>>,
}

impl Verifier {
    pub(crate) fn new(s3: aws_sdk_s3::Client, pool: PgPool) -> Arc<Self> {
        Arc::new(Self {
            s3,
            pool,
            flights: Mutex::new(HashMap::new()),
        })
    }

    /// Verifies pending `file`: joins this process's verification of it if one is running,
    /// else starts one (which takes the file's lease, or waits for whoever holds it).
    pub(crate) async fn verify(self: &Arc<Self>, file: &FileRow) -> anyhow::Result<Verdict> {
        let mut outcome = {
            let mut flights = self.flights.lock().unwrap_or_else(PoisonError::into_inner);
            match flights.get(&file.id) {
                Some(running) => running.clone(),
                None => {
                    let (done, outcome) = watch::channel(None);
                    flights.insert(file.id, outcome.clone());
                    let (verifier, file) = (Arc::clone(self), file.clone());
                    tokio::spawn(async move {
                        let result = verifier.verify_leased(&file).await.map_err(Arc::new);
                        done.send_replace(Some(result));
                        verifier
                            .flights
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .remove(&file.id);
                    });
                    outcome
                }
            }
        };
        let shared = outcome
            .wait_for(Option::is_some)
            .await
            .map_err(|_| anyhow::anyhow!("the verification of file {} was abandoned", file.id))?
            .clone();
        match shared {
            Some(Ok(verdict)) => Ok(verdict),
            Some(Err(err)) => Err(anyhow::anyhow!("{err:#}")),
            None => Err(anyhow::anyhow!(
                "the verification of file {} has no outcome",
                file.id
            )),
        }
    }

    /// One verification of `file` under its lease: taken (then the object is judged), or held
    /// by another verifier (then its outcome is awaited up to [`LEASE_WAIT`]).
    async fn verify_leased(&self, file: &FileRow) -> anyhow::Result<Verdict> {
        let deadline = tokio::time::Instant::now() + LEASE_WAIT;
        let row = loop {
            match store::claim_verification(&self.pool, file.id, LEASE).await? {
                VerificationClaim::Claimed(row) => break row,
                VerificationClaim::Settled(FileStatus::Quarantined, problem) => {
                    return Ok(Verdict::Quarantined(problem.unwrap_or_default()));
                }
                VerificationClaim::Settled(_, _) => return Ok(Verdict::Verified),
                VerificationClaim::Gone => return Ok(Verdict::Expired),
                VerificationClaim::Leased if tokio::time::Instant::now() >= deadline => {
                    return Ok(Verdict::InProgress);
                }
                VerificationClaim::Leased => tokio::time::sleep(LEASE_POLL).await,
            }
        };
        let verdict = verify(&self.s3, &self.pool, &row).await;
        match &verdict {
            Ok(Verdict::Verified | Verdict::Quarantined(_) | Verdict::Expired) => {}
            // Nothing to judge yet, or it failed: the next verifier need not wait for the lease.
            Ok(Verdict::Waiting | Verdict::InProgress) | Err(_) => {
                if let Err(err) = store::release_verification(&self.pool, row.id).await {
                    tracing::warn!(file.id = %row.id, error = %err, "verification lease not released");
                }
            }
        }
        verdict
    }
}

/// Verifies one pending file against its uploaded object: the bytes at its staging key are
/// judged, and verified bytes are copied to the file's own key (which no form can write) before
/// the file is marked verified; the staged copy is then removed. A pending file of an earlier
/// release, uploaded straight to its own key, is judged there.
///
/// Callers hold the file's lease ([`Verifier`]). Should the staged object vanish mid-way
/// (`NoSuchKey`: a verifier of an earlier release, or one whose lease ran out, moved it), it
/// looks again, finding the file at its own key.
async fn verify(s3: &aws_sdk_s3::Client, pool: &PgPool, file: &FileRow) -> anyhow::Result<Verdict> {
    let verdict = match verify_once(s3, pool, file).await {
        Err(err) if staged_object_gone(&err) => verify_once(s3, pool, file).await,
        verdict => verdict,
    };
    if let Ok(verdict) = &verdict {
        metrics::counter!("switchboard_attachments_verifications_total", "outcome" => verdict.label())
            .increment(1);
    }
    verdict
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
        metrics::counter!("switchboard_attachments_verification_read_bytes_total")
            .increment(chunk.len() as u64);
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
    verifier: Arc<Verifier>,
    every: Duration,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let pending = match store::pending(&verifier.pool, SWEEP_BATCH).await {
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
                let verifier = &verifier;
                async move {
                    if let Err(err) = verifier.verify(&file).await {
                        tracing::warn!(file.id = %file.id, error = format!("{err:#}"), "verification failed");
                    }
                }
            })
            .await;
    }
}
