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
//!
//! **What was judged is what is kept.** The upload form stays valid after the bytes arrive, so
//! the staged object can be replaced while it is being judged (review finding L1). A pass pins
//! the version it found (its ETag, from the HEAD): it reads that version only (`If-Match`, and
//! the ETag of what was read must be the same), and copies it to the file's own key only if the
//! staged object is still that version (`x-amz-copy-source-if-match`). Should the object change
//! in between, nothing is recorded and the new bytes are judged afresh ([`verify`]).

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

/// Passes [`verify`] makes over a file whose staged object vanished or changed under it before
/// it gives up for now.
const PASSES: usize = 3;

/// Verifies one pending file against its uploaded object: the bytes at its staging key are
/// judged, and verified bytes are copied to the file's own key (which no form can write) before
/// the file is marked verified; the staged copy is then removed. A pending file of an earlier
/// release, uploaded straight to its own key, is judged there.
///
/// Callers hold the file's lease ([`Verifier`]). Should the staged object vanish mid-way
/// (`NoSuchKey`: a verifier of an earlier release, or one whose lease ran out, moved it), it
/// looks again, finding the file at its own key. Should it be replaced mid-way (the owner posted
/// the still-valid form again: [`ObjectChanged`]), nothing was recorded or copied, and it looks
/// again, judging the new bytes: a file is only ever recorded with the SHA-256 and type of the
/// bytes that were copied. After [`PASSES`] passes that each saw the object change, it gives up
/// with an error: the file stays pending, its lease is released, and a later verification (the
/// sweeper's) judges whatever is there by then.
async fn verify(s3: &aws_sdk_s3::Client, pool: &PgPool, file: &FileRow) -> anyhow::Result<Verdict> {
    let mut passes = 1;
    let verdict = loop {
        match verify_once(s3, pool, file).await {
            Err(err) if passes < PASSES && (staged_object_gone(&err) || changed(&err)) => {
                passes += 1;
            }
            verdict => break verdict,
        }
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

/// The object being verified is no longer the version that was found (and judged): it was
/// replaced after the HEAD.
#[derive(Debug, thiserror::Error)]
#[error("the object at {key} changed while it was verified")]
pub(crate) struct ObjectChanged {
    /// Its key.
    key: String,
}

/// Whether `err` is, or was caused by, [`ObjectChanged`].
fn changed(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| cause.is::<ObjectChanged>())
}

/// Whether S3 refused a request because its precondition (`If-Match`, or the copy source's)
/// no longer holds: 412 `PreconditionFailed`.
fn precondition_failed<E, R>(err: &aws_sdk_s3::error::SdkError<E, R>) -> bool
where
    E: aws_sdk_s3::error::ProvideErrorMetadata,
{
    err.as_service_error()
        .and_then(aws_sdk_s3::error::ProvideErrorMetadata::code)
        == Some("PreconditionFailed")
}

/// One look at a pending file's bytes: [`look`], [`judge`], [`settle`].
async fn verify_once(
    s3: &aws_sdk_s3::Client,
    pool: &PgPool,
    file: &FileRow,
) -> anyhow::Result<Verdict> {
    let Some(found) = look(s3, file).await? else {
        if file.expires_at.is_some_and(|at| at < Utc::now()) {
            store::delete(pool, file.id).await?;
            return Ok(Verdict::Expired);
        }
        return Ok(Verdict::Waiting);
    };
    let judged = judge(s3, file, &found).await?;
    settle(s3, pool, file, &found, judged).await
}

/// One version of a file's uploaded object, as a HEAD found it.
#[derive(Debug, Clone)]
struct Found {
    /// Where: the file's staging key, or (an earlier release's upload) its own key.
    key: String,
    /// The version: its ETag, which every later request about it is conditioned on.
    e_tag: String,
    /// Its size in bytes.
    size: Option<i64>,
    /// S3's SHA-256 checksum of it, if the upload carried one.
    checksum_sha256: Option<String>,
}

/// The file's uploaded object, at its staging key or else its own key, if there is one.
async fn look(s3: &aws_sdk_s3::Client, file: &FileRow) -> anyhow::Result<Option<Found>> {
    let staging = store::staging_key(file.id);
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
                let e_tag = head
                    .e_tag()
                    .ok_or_else(|| anyhow::anyhow!("S3 gave no ETag for {key}"))?;
                return Ok(Some(Found {
                    key: key.to_owned(),
                    e_tag: e_tag.to_owned(),
                    size: head.content_length(),
                    checksum_sha256: head.checksum_sha256().map(str::to_owned),
                }));
            }
            Err(err) if err.as_service_error().is_some_and(|e| e.is_not_found()) => {}
            Err(err) => return Err(aws_sdk_s3::Error::from(err).into()),
        }
    }
    Ok(None)
}

/// Acts on the judgement of `found`: verified bytes at the staging key are copied to the file's
/// own key, provided the staged object is still `found`'s version (else [`ObjectChanged`], and
/// nothing was copied or recorded), then the file is marked verified with the SHA-256 judged,
/// and the staged object removed; bytes that failed quarantine the file.
async fn settle(
    s3: &aws_sdk_s3::Client,
    pool: &PgPool,
    file: &FileRow,
    found: &Found,
    judged: Result<Vec<u8>, String>,
) -> anyhow::Result<Verdict> {
    let staged = found.key == store::staging_key(file.id);
    match judged {
        Ok(sha256) => {
            if staged {
                let copied = s3
                    .copy_object()
                    .bucket(&file.bucket)
                    .key(&file.object_key)
                    .copy_source(format!("{}/{}", file.bucket, found.key))
                    .copy_source_if_match(&found.e_tag)
                    .content_type(&file.content_type)
                    .metadata_directive(aws_sdk_s3::types::MetadataDirective::Replace)
                    .send()
                    .await;
                match copied {
                    Ok(_) => {}
                    Err(err) if precondition_failed(&err) => {
                        return Err(ObjectChanged {
                            key: found.key.clone(),
                        }
                        .into());
                    }
                    Err(err) => return Err(aws_sdk_s3::Error::from(err).into()),
                }
            }
            store::mark_verified(pool, file.id, &sha256).await?;
            if staged {
                // Best effort: a staged copy left behind is never read again (nor are bytes
                // posted since the copy: the file is verified now).
                let removed = s3
                    .delete_object()
                    .bucket(&file.bucket)
                    .key(&found.key)
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

/// The SHA-256 of `found`'s bytes if they are what was declared, else the problem. Reads only
/// that version of the object ([`ObjectChanged`] if it was replaced since).
async fn judge(
    s3: &aws_sdk_s3::Client,
    file: &FileRow,
    found: &Found,
) -> anyhow::Result<Result<Vec<u8>, String>> {
    if found.size != Some(file.size_bytes) {
        return Ok(Err(format!(
            "stored size {} differs from the declared {}",
            found.size.unwrap_or_default(),
            file.size_bytes
        )));
    }
    // A full-object SHA-256 checksum from S3 (not a multipart composite "...-N").
    let s3_sha = found
        .checksum_sha256
        .as_deref()
        .filter(|c| !c.contains('-'))
        .and_then(|c| base64::engine::general_purpose::STANDARD.decode(c).ok())
        .filter(|d| d.len() == 32);
    let (sha256, head) = match s3_sha {
        Some(sha) => (sha, read(s3, file, found, Some(HEAD_BYTES)).await?.1),
        None => read(s3, file, found, None).await?,
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

/// Streams `found`'s version of the object (or only its first `limit` bytes), returning its
/// SHA-256 (of what was read) and its first bytes; [`ObjectChanged`] if the object is another
/// version now (S3 refuses the `If-Match`; a server that ignores it, like s3s-fs, answers
/// another ETag). Memory stays bounded whatever the object's size.
async fn read(
    s3: &aws_sdk_s3::Client,
    file: &FileRow,
    found: &Found,
    limit: Option<usize>,
) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let mut request = s3
        .get_object()
        .bucket(&file.bucket)
        .key(&found.key)
        .if_match(&found.e_tag);
    if let Some(limit) = limit {
        request = request.range(format!("bytes=0-{}", limit.saturating_sub(1)));
    }
    let changed = || ObjectChanged {
        key: found.key.clone(),
    };
    let object = match request.send().await {
        Ok(object) => object,
        Err(err) if precondition_failed(&err) => return Err(changed().into()),
        Err(err) => return Err(aws_sdk_s3::Error::from(err).into()),
    };
    if object.e_tag() != Some(found.e_tag.as_str()) {
        return Err(changed().into());
    }
    let mut body = object.body;
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

/// Tests against the local PostgreSQL and S3 of `scripts/infra.sh` (the `SB_TEST_*` variables,
/// with the same defaults as the system tests' `test-support`).
#[cfg(test)]
pub(crate) mod tests {
    use secrecy::SecretString;
    use sqlx::Connection as _;

    use super::*;
    use crate::store::NewUpload;

    /// `SB_TEST_<name>`, or `default`.
    fn var(name: &str, default: &str) -> String {
        std::env::var(format!("SB_TEST_{name}")).unwrap_or_else(|_| default.to_owned())
    }

    /// A client of the local S3 server and a new bucket of its own.
    pub(crate) async fn local_s3() -> (aws_sdk_s3::Client, String) {
        let config = platform::s3::S3Config {
            endpoint: Some(var("S3_ENDPOINT", "http://127.0.0.1:59000")),
            region: "us-east-1".to_owned(),
            access_key: var("S3_ACCESS_KEY", "switchboard-local"),
            secret_key: SecretString::from(var("S3_SECRET_KEY", "switchboard-local-secret-key")),
            bucket: format!("sbt-{}", &Uuid::new_v4().simple().to_string()[..16]),
        };
        let s3 = platform::s3::client(&config);
        platform::s3::ensure_bucket(&s3, &config.bucket)
            .await
            .expect("the local S3 server (scripts/infra.sh)");
        (s3, config.bucket)
    }

    /// A new database on the local PostgreSQL, migrated as the service migrates its own.
    pub(crate) async fn local_pool() -> PgPool {
        let admin_url = var(
            "DATABASE_URL",
            "postgres://switchboard:switchboard-local@127.0.0.1:55432/switchboard",
        );
        let name = format!("sbt_{}", Uuid::new_v4().simple());
        let mut admin = sqlx::PgConnection::connect(&admin_url)
            .await
            .expect("the local PostgreSQL (scripts/infra.sh)");
        // `name` is hex digits after a fixed prefix.
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .unwrap();
        let base = admin_url.rsplit_once('/').unwrap().0;
        let url = SecretString::from(format!("{base}/{name}"));
        platform::db::connect(&url, crate::SCHEMA, &crate::MIGRATOR, 2, true)
            .await
            .unwrap()
    }

    /// The invariant finding L1 is about: a verified file's recorded SHA-256 is that of the
    /// bytes at its own key; a file not verified has nothing there. Returns its status.
    async fn assert_recorded_as_stored(
        pool: &PgPool,
        s3: &aws_sdk_s3::Client,
        file: &FileRow,
    ) -> String {
        let (status, recorded): (String, Option<Vec<u8>>) =
            sqlx::query_as("SELECT status, sha256 FROM files WHERE id = $1")
                .bind(file.id)
                .fetch_one(pool)
                .await
                .unwrap();
        let stored = s3
            .get_object()
            .bucket(&file.bucket)
            .key(&file.object_key)
            .send()
            .await;
        if status == "verified" {
            let stored = stored.unwrap().body.collect().await.unwrap().into_bytes();
            assert_eq!(
                recorded.as_deref(),
                Some(Sha256::digest(&stored).as_slice()),
                "the recorded SHA-256 is not that of the stored bytes {stored:?}"
            );
        } else {
            assert!(stored.is_err(), "a {status} file has bytes at its own key");
        }
        status
    }

    #[tokio::test]
    async fn staged_bytes_replaced_after_they_were_read_or_judged_are_judged_again_before_they_are_kept()
     {
        let pool = local_pool().await;
        let (s3, bucket) = local_s3().await;
        // Of one size, as the form requires.
        let (one, two): (&[u8], &[u8]) = (b"the bytes judged", b"bytes posted now");
        let id = Uuid::now_v7();
        let key = format!("uploads/owner/{id}/a.txt");
        let upload = NewUpload {
            id,
            owner: "alice",
            bucket: &bucket,
            key: &key,
            file_name: "a.txt",
            content_type: "text/plain",
            size: i64::try_from(one.len()).unwrap(),
            declared_sha256: None,
            expires_at: Utc::now() + chrono::Duration::minutes(5),
        };
        let recorded =
            store::insert_within_quota(&pool, &upload, None, i64::MAX, i64::MAX, i64::MAX)
                .await
                .unwrap();
        assert!(recorded.inserted);
        let file = store::find_owned(&pool, "alice", &bucket, &key)
            .await
            .unwrap()
            .unwrap();
        // The owner posting the still-valid form again.
        let post = |bytes: &[u8]| {
            s3.put_object()
                .bucket(&bucket)
                .key(store::staging_key(id))
                .body(bytes.to_vec().into())
                .send()
        };
        post(one).await.unwrap();

        // Replaced after the HEAD, before the read: the read is of the version found or none.
        let found = look(&s3, &file).await.unwrap().expect("the staged object");
        post(two).await.unwrap();
        let read = judge(&s3, &file, &found).await;
        assert!(
            read.as_ref().is_err_and(changed),
            "read another version: {read:?}"
        );

        // Replaced after the judging, before the copy: nothing copied, nothing recorded.
        let found = look(&s3, &file).await.unwrap().expect("the staged object");
        let judged = judge(&s3, &file, &found).await.unwrap();
        assert_eq!(
            judged,
            Ok(Sha256::digest(two).to_vec()),
            "judged the bytes there"
        );
        post(one).await.unwrap();
        let settled = settle(&s3, &pool, &file, &found, judged).await;
        let status = assert_recorded_as_stored(&pool, &s3, &file).await;
        assert!(
            settled.as_ref().is_err_and(changed),
            "kept bytes other than those judged: {settled:?}"
        );
        assert_eq!(status, "pending");

        // A verification judges what is there now, and records that.
        assert_eq!(verify(&s3, &pool, &file).await.unwrap(), Verdict::Verified);
        assert_eq!(
            assert_recorded_as_stored(&pool, &s3, &file).await,
            "verified"
        );
        let kept = s3
            .get_object()
            .bucket(&bucket)
            .key(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(
            kept.body.collect().await.unwrap().into_bytes().as_ref(),
            one
        );
    }
}
