//! The request/reply endpoints on NATS (queue group `attachments`, one replica answers):
//! resolve a URL or `content_url` to a verified file the caller owns, sign download URLs in
//! bulk, keep a file the agent generated (inline, or through a presigned upload when large), and
//! erase an owner's files ([`crate::erase`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use futures::StreamExt;
use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode};
use protocol::file_types;
use protocol::files::{
    FileRef, GeneratedUpload, GeneratedUploadOutcome, GeneratedUploadReply,
    MAX_GENERATED_FILE_BYTES, MAX_GENERATED_INLINE_BYTES, MAX_SIGN_BATCH, RefusalReason,
    RegisterGenerated, RegisterOutcome, RegisterReply, ResolveOutcome, ResolveReply,
    ResolveRequest, ResolvedFile, SignReply, SignRequest, parse_file_url,
};
use protocol::messaging::{ATTACHMENTS_QUEUE, Names};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::file_name::generated_key;
use crate::policy::{Signer, Upload};
use crate::store::{self, FileRow, FileStatus, NewUpload, Source};

/// Requests answered at once by one replica.
const CONCURRENCY: usize = 64;

pub(crate) struct Resolver {
    pub(crate) pool: PgPool,
    pub(crate) s3: aws_sdk_s3::Client,
    /// Secret Supabase-style signed-URL tokens are verified with, when configured.
    pub(crate) supabase_secret: Option<SecretString>,
    /// Credentials and public endpoint download URLs are signed for.
    pub(crate) signer: Arc<Signer>,
    /// Bucket generated files go to.
    pub(crate) bucket: String,
    /// Validity of signed download URLs.
    pub(crate) download_ttl: Duration,
    /// Validity of upload forms for large generated files.
    pub(crate) upload_ttl: Duration,
    /// The owners' storage quotas (generated files count like uploads).
    pub(crate) quota: Arc<crate::quota::Quota>,
    /// Verifies a pending file a run refers to, once at a time.
    pub(crate) verifier: Arc<crate::verify::Verifier>,
}

#[derive(Deserialize)]
struct SupabaseClaims {
    url: String,
}

/// The verified row each reference names (`None`: no reference, or no such row), in order.
fn match_rows<'a>(refs: &[Option<FileRef>], rows: &'a [FileRow]) -> Vec<Option<&'a FileRow>> {
    let by_object: HashMap<(&str, &str), &FileRow> = rows
        .iter()
        .filter(|row| row.status == FileStatus::Verified)
        .map(|row| ((row.bucket.as_str(), row.object_key.as_str()), row))
        .collect();
    refs.iter()
        .map(|file| {
            let file = file.as_ref()?;
            by_object
                .get(&(file.bucket.as_str(), file.path.as_str()))
                .copied()
        })
        .collect()
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
fn valid_session(session_id: &str) -> bool {
    !session_id.is_empty() && session_id.chars().count() <= 128
}

impl Resolver {
    /// Resolves `url` for `owner`; a verified file joins the workspace of `session_id`, if
    /// given, as an upload (once: a file already there keeps its source).
    pub(crate) async fn resolve(
        &self,
        owner: &str,
        url: &str,
        session_id: Option<&str>,
    ) -> anyhow::Result<ResolveOutcome> {
        let refused = |reason| Ok(ResolveOutcome::Refused { reason });
        let file = match self.download_link(url).await? {
            // A download link this service made (what `download-url`, the server upload and
            // history hand out): its signature and expiry are checked, then it is the file
            // it names, which must still be the caller's (below).
            Some(Ok(file)) => file,
            Some(Err(reason)) => return refused(reason),
            None => {
                let Ok(file) = parse_file_url(url) else {
                    return refused(RefusalReason::BadUrl);
                };
                if !self.token_ok(&file) {
                    return refused(RefusalReason::BadSignature);
                }
                file
            }
        };
        let Some(mut row) = store::find_owned(&self.pool, owner, &file.bucket, &file.path).await?
        else {
            return refused(RefusalReason::NotFound);
        };
        if row.status == FileStatus::Pending {
            // Uploaded moments ago, perhaps: verify now rather than wait for the sweeper.
            // Shared with any other caller verifying it (see `crate::verify`).
            row.status = match self.verifier.verify(&row).await? {
                crate::verify::Verdict::Verified => FileStatus::Verified,
                crate::verify::Verdict::Quarantined(_) => FileStatus::Quarantined,
                crate::verify::Verdict::Waiting | crate::verify::Verdict::InProgress => {
                    FileStatus::Pending
                }
                crate::verify::Verdict::Expired => return refused(RefusalReason::NotFound),
            };
        }
        match row.status {
            FileStatus::Verified => {
                if let Some(session_id) = session_id.filter(|s| valid_session(s)) {
                    store::add_to_workspace(&self.pool, owner, session_id, row.id, Source::Upload)
                        .await?;
                }
                Ok(ResolveOutcome::Resolved(ResolvedFile {
                    bucket: file.bucket,
                    path: file.path,
                    mime_type: row.content_type,
                    file_name: row.file_name,
                    size_bytes: row.size_bytes,
                }))
            }
            FileStatus::Quarantined => refused(RefusalReason::Quarantined),
            FileStatus::Pending => refused(RefusalReason::NotVerified),
        }
    }

    /// The file a download link of this service names (`.../v2/files/content/{id}?expires=
    /// &signature=`): `None` when `url` is not such a link, a refusal when its signature is bad
    /// or it has expired or its file is gone.
    async fn download_link(
        &self,
        url: &str,
    ) -> anyhow::Result<Option<Result<FileRef, RefusalReason>>> {
        let marker = format!("{}/", crate::download::CONTENT_PATH);
        let Some((_, rest)) = url.split_once(&marker) else {
            return Ok(None);
        };
        let (id, query) = match rest.split_once('?') {
            Some((id, query)) => (id, Some(query)),
            None => (rest, None),
        };
        let link = match crate::download::check(&self.signer, id, query, SystemTime::now())? {
            Ok(link) => link,
            Err(_) => return Ok(Some(Err(RefusalReason::BadSignature))),
        };
        Ok(Some(
            match store::find_verified(&self.pool, link.file_id).await? {
                Some(row) => Ok(FileRef {
                    bucket: row.bucket,
                    path: row.object_key,
                    token: None,
                }),
                None => Err(RefusalReason::NotFound),
            },
        ))
    }

    /// A Supabase token must be valid for exactly this object when a secret is configured.
    fn token_ok(&self, file: &FileRef) -> bool {
        let (Some(token), Some(secret)) = (&file.token, &self.supabase_secret) else {
            return true;
        };
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp"]);
        validation.validate_aud = false;
        decode::<SupabaseClaims>(
            token,
            &DecodingKey::from_secret(secret.expose_secret().as_bytes()),
            &validation,
        )
        .is_ok_and(|data| data.claims.url == format!("{}/{}", file.bucket, file.path))
    }

    /// Fresh download URLs for the owner's verified files, `None` for anything else (a URL that
    /// does not parse, a file not the owner's, not verified, or gone), in request order: one
    /// query for the whole batch, then signing in memory.
    pub(crate) async fn sign(
        &self,
        owner: &str,
        urls: &[String],
    ) -> anyhow::Result<Vec<Option<String>>> {
        let refs: Vec<Option<FileRef>> = urls
            .iter()
            .take(MAX_SIGN_BATCH)
            .map(|url| parse_file_url(url).ok())
            .collect();
        let objects: Vec<(&str, &str)> = refs
            .iter()
            .flatten()
            .map(|f| (f.bucket.as_str(), f.path.as_str()))
            .collect();
        let rows = if objects.is_empty() {
            Vec::new()
        } else {
            store::find_verified_owned(&self.pool, owner, &objects).await?
        };
        crate::download::presign(
            &self.signer,
            match_rows(&refs, &rows),
            self.download_ttl,
            SystemTime::now(),
        )
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
        if let Err(full) = self
            .quota
            .room(&self.pool, &owner, Some(size), false)
            .await?
        {
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
            .body(bytes.clone().into())
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
            size: i64::try_from(bytes.len())?,
            declared_sha256: None,
            expires_at: chrono::Utc::now(),
        };
        // Checked and inserted under the owner's lock: concurrent registrations cannot pass the
        // quota together.
        let inserted = self
            .quota
            .insert(&self.pool, &upload, Some(&sha256))
            .await?;
        if !matches!(inserted, Ok(true)) {
            self.s3
                .delete_object()
                .bucket(&self.bucket)
                .key(&key)
                .send()
                .await
                .map_err(aws_sdk_s3::Error::from)?;
        }
        let file = match inserted {
            Ok(true) => store::find_owned(&self.pool, &owner, &self.bucket, &key).await?,
            Ok(false) => store::find_by_hash(&self.pool, &owner, &sha256).await?,
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
    pub(crate) async fn generated_upload(
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
        if let Err(full) = self
            .quota
            .room(&self.pool, &owner, Some(size), true)
            .await?
        {
            return refused(&full.to_string());
        }
        let expires_at = chrono::Utc::now()
            + chrono::Duration::from_std(self.upload_ttl).unwrap_or(chrono::Duration::minutes(5));
        for _ in 0..3 {
            if let Some(existing) = store::find_by_hash(&self.pool, &owner, &sha256).await? {
                if existing.size_bytes != size || existing.content_type != file_type.mime {
                    return refused(
                        "a file with this SHA-256 but another size or type is already stored",
                    );
                }
                store::add_to_workspace(
                    &self.pool,
                    &owner,
                    &session_id,
                    existing.id,
                    Source::Generated,
                )
                .await?;
                if existing.status == FileStatus::Verified {
                    return Ok(GeneratedUploadOutcome::Stored {
                        content_url: format!("s3://{}/{}", existing.bucket, existing.object_key),
                    });
                }
                store::extend_pending(&self.pool, existing.id, expires_at).await?;
                return Ok(self.upload_form(&existing, file_type.mime, file_size, sha256));
            }
            let id = Uuid::now_v7();
            let key = generated_key(&owner, id, &name);
            let upload = NewUpload {
                id,
                owner: &owner,
                bucket: &self.bucket,
                key: &key,
                file_name: &name,
                content_type: file_type.mime,
                size,
                declared_sha256: Some(&sha256),
                expires_at,
            };
            let inserted = match self.quota.insert(&self.pool, &upload, None).await? {
                Ok(inserted) => inserted,
                Err(full) => return refused(&full.to_string()),
            };
            if inserted
                && let Some(file) =
                    store::find_owned(&self.pool, &owner, &self.bucket, &key).await?
            {
                store::add_to_workspace(&self.pool, &owner, &session_id, id, Source::Generated)
                    .await?;
                tracing::info!(file.id = %id, "generated file upload form signed");
                return Ok(self.upload_form(&file, file_type.mime, file_size, sha256));
            }
            // A concurrent request for the same content won the insert: answer with its file.
        }
        anyhow::bail!("generated upload did not settle after concurrent inserts")
    }

    /// The presigned POST form for exactly these bytes of the pending `file` (to its staging
    /// key; the content URL names its final key).
    fn upload_form(
        &self,
        file: &store::FileRow,
        mime: &str,
        size: u64,
        sha256: [u8; 32],
    ) -> GeneratedUploadOutcome {
        let staging = store::staging_key(file.id);
        let form = self.signer.sign(
            &Upload {
                bucket: &file.bucket,
                key: &staging,
                content_type: mime,
                size,
                sha256: Some(sha256),
            },
            chrono::Utc::now(),
            self.upload_ttl,
        );
        GeneratedUploadOutcome::Upload {
            url: form.url,
            fields: form.fields,
            content_url: format!("s3://{}/{}", file.bucket, file.object_key),
        }
    }

    /// Answers the endpoints until `shutdown`.
    pub(crate) async fn serve(
        self,
        client: async_nats::Client,
        names: Names,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        let resolve_subject = names.attachments_resolve_subject();
        let sign_subject = names.attachments_sign_subject();
        let upload_subject = names.attachments_generated_upload_subject();
        let erase_subject = names.attachments_erase_subject();
        let link_subject = names.attachments_link_subject();
        let mut subscriptions = Vec::new();
        for subject in [
            &resolve_subject,
            &sign_subject,
            &upload_subject,
            &erase_subject,
            &link_subject,
            &names.attachments_register_subject(),
        ] {
            subscriptions.push(
                client
                    .queue_subscribe(subject.clone(), ATTACHMENTS_QUEUE.to_owned())
                    .await?,
            );
        }
        futures::stream::select_all(subscriptions)
            .take_until(shutdown.cancelled_owned())
            .for_each_concurrent(CONCURRENCY, |message| {
                let client = client.clone();
                let (this, names, resolve_subject, sign_subject, upload_subject, erase_subject) = (
                    &self,
                    &names,
                    &resolve_subject,
                    &sign_subject,
                    &upload_subject,
                    &erase_subject,
                );
                let link_subject = &link_subject;
                // The handler's span, a child of the caller's (runs admitting a run, history
                // signing links or erasing files, a worker storing a file).
                let span = if message.subject.as_str() == resolve_subject.as_str() {
                    tracing::info_span!("attachments.resolve.handle", otel.kind = "server")
                } else if message.subject.as_str() == sign_subject.as_str() {
                    tracing::info_span!("attachments.sign.handle", otel.kind = "server")
                } else if message.subject.as_str() == upload_subject.as_str() {
                    tracing::info_span!("attachments.generated_upload.handle", otel.kind = "server")
                } else if message.subject.as_str() == erase_subject.as_str() {
                    tracing::info_span!("attachments.erase.handle", otel.kind = "server")
                } else if message.subject.as_str() == link_subject.as_str() {
                    tracing::info_span!("attachments.link.handle", otel.kind = "server")
                } else {
                    tracing::info_span!("attachments.register.handle", otel.kind = "server")
                };
                platform::rpc::adopt(&span, &message);
                async move {
                    let Some(reply) = message.reply.clone() else {
                        return;
                    };
                    let subject = message.subject.as_str();
                    // Only a caller's inbox is answered (`nats_auth::reply_from_caller`): a
                    // message JetStream delivered here from a stream is not a request.
                    if !platform::nats_auth::reply_from_caller(names, subject, &reply) {
                        metrics::counter!("switchboard_nats_requests_refused_total", "endpoint" => subject.to_owned())
                            .increment(1);
                        tracing::warn!(subject, reply = %reply, "request whose reply is no caller's inbox ignored");
                        return;
                    }
                    let answer = if subject == resolve_subject.as_str() {
                        this.answer_resolve(&message.payload).await
                    } else if subject == sign_subject.as_str() {
                        this.answer_sign(&message.payload).await
                    } else if subject == upload_subject.as_str() {
                        this.answer_generated_upload(&message.payload).await
                    } else if subject == erase_subject.as_str() {
                        crate::erase::answer(&this.pool, &this.s3, &message.payload).await
                    } else if subject == link_subject.as_str() {
                        crate::link::answer(&this.pool, &message.payload).await
                    } else {
                        this.answer_register(&message.payload).await
                    };
                    match answer {
                        Ok(payload) => {
                            if let Err(err) = client.publish(reply, payload.into()).await {
                                tracing::warn!(error = %err, "cannot answer a request");
                            }
                        }
                        // No answer: the caller times out and reports the dependency unavailable.
                        Err(err) => {
                            tracing::error!(subject, error = format!("{err:#}"), "request failed")
                        }
                    }
                }
                .instrument(span)
            })
            .await;
        Ok(())
    }

    async fn answer_resolve(&self, payload: &[u8]) -> anyhow::Result<Vec<u8>> {
        let outcome = match serde_json::from_slice::<ResolveRequest>(payload) {
            Ok(ResolveRequest::V1 {
                owner,
                url,
                session_id,
            }) => self.resolve(&owner, &url, session_id.as_deref()).await?,
            Err(err) => {
                tracing::warn!(error = %err, "undecodable resolve request");
                ResolveOutcome::Refused {
                    reason: RefusalReason::BadUrl,
                }
            }
        };
        Ok(serde_json::to_vec(&ResolveReply::V1(outcome))?)
    }

    async fn answer_sign(&self, payload: &[u8]) -> anyhow::Result<Vec<u8>> {
        let SignRequest::V1 { owner, urls } = serde_json::from_slice(payload)?;
        let urls = self.sign(&owner, &urls).await?;
        Ok(serde_json::to_vec(&SignReply::V1 {
            urls,
            expires_in: self.download_ttl.as_secs(),
        })?)
    }

    async fn answer_register(&self, payload: &[u8]) -> anyhow::Result<Vec<u8>> {
        let outcome = match serde_json::from_slice::<RegisterGenerated>(payload) {
            Ok(request) => self.register(request).await?,
            Err(err) => RegisterOutcome::Refused {
                message: format!("undecodable request: {err}"),
            },
        };
        Ok(serde_json::to_vec(&RegisterReply::V1(outcome))?)
    }

    async fn answer_generated_upload(&self, payload: &[u8]) -> anyhow::Result<Vec<u8>> {
        let outcome = match serde_json::from_slice::<GeneratedUpload>(payload) {
            Ok(request) => self.generated_upload(request).await?,
            Err(err) => GeneratedUploadOutcome::Refused {
                message: format!("undecodable request: {err}"),
            },
        };
        Ok(serde_json::to_vec(&GeneratedUploadReply::V1(outcome))?)
    }
}

#[cfg(test)]
mod tests {
    use protocol::files::parse_file_url;
    use uuid::Uuid;

    use super::match_rows;
    use crate::store::{FileRow, FileStatus};

    fn row(bucket: &str, key: &str, status: FileStatus) -> FileRow {
        FileRow {
            id: Uuid::now_v7(),
            bucket: bucket.to_owned(),
            object_key: key.to_owned(),
            file_name: "f".to_owned(),
            content_type: "application/pdf".to_owned(),
            size_bytes: 1,
            declared_sha256: None,
            status,
            expires_at: None,
        }
    }

    #[test]
    fn rows_are_matched_in_request_order_with_duplicates_and_gaps() {
        let urls = [
            "s3://b/u/2.pdf",
            "not a url",
            "http://127.0.0.1:9000/b/u/1.pdf?X-Amz-Signature=old",
            "s3://b/u/missing.pdf",
            "s3://b/u/2.pdf",
            "s3://other/u/1.pdf",
            "s3://b/u/pending.pdf",
        ];
        let refs: Vec<_> = urls.iter().map(|u| parse_file_url(u).ok()).collect();
        // In no particular order, as the query returns them; a non-verified row never signs.
        let rows = [
            row("b", "u/1.pdf", FileStatus::Verified),
            row("b", "u/pending.pdf", FileStatus::Pending),
            row("b", "u/2.pdf", FileStatus::Verified),
        ];
        let keys: Vec<Option<&str>> = match_rows(&refs, &rows)
            .into_iter()
            .map(|r| r.map(|r| r.object_key.as_str()))
            .collect();
        assert_eq!(
            keys,
            [
                Some("u/2.pdf"),
                None,
                Some("u/1.pdf"),
                None,
                Some("u/2.pdf"),
                None,
                None
            ]
        );
    }
}
