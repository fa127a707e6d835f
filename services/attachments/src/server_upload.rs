//! `POST /api/v1/agent/attachments`: the file comes through us, streamed to S3 with bounded
//! memory (one part buffer) while it is hashed and its type checked, then recorded as verified.

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{ChecksumAlgorithm, CompletedMultipartUpload, CompletedPart};
use axum::extract::multipart::Field;
use chrono::Utc;
use protocol::file_types::{self, FileType};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::AppState;
use crate::file_name::{MAX_FILE_NAME_CHARS, base_name, upload_key};
use crate::form::{BoundedForm, FormError, FormErrors, FramingTooLong};
use crate::intake::Intake;
use crate::quota::QuotaError;
use crate::store::{self, FileRow, FileStatus, NewUpload, Source};

/// Bytes sent to S3 per part (S3's minimum part size is 5 MiB).
pub(crate) const PART_BYTES: usize = 8 * 1024 * 1024;
/// Bytes kept from the start of the file to check its type.
const HEAD_BYTES: usize = 4096;

/// Why an upload was refused (the HTTP layer picks the status).
#[derive(Debug, thiserror::Error)]
pub(crate) enum UploadError {
    /// The form is not what the endpoint takes (400), naming the field.
    #[error("{message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    /// Larger than the limit (413).
    #[error("file exceeds the 100 MB limit")]
    TooLarge,
    /// A part's headers, or the preamble, longer than the form allows (413).
    #[error(transparent)]
    FramingTooLong(#[from] FramingTooLong),
    /// The owner has no room for another file, or uploads too fast (429 or 403).
    #[error(transparent)]
    Quota(#[from] QuotaError),
    /// The same bytes are being uploaded with a presigned form, not verified yet (409).
    #[error("the same content is waiting for a presigned upload")]
    InProgress,
    /// S3, PostgreSQL or the stream failed (500).
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

impl From<sqlx::Error> for UploadError {
    fn from(err: sqlx::Error) -> Self {
        UploadError::Failed(err.into())
    }
}

impl From<aws_sdk_s3::Error> for UploadError {
    fn from(err: aws_sdk_s3::Error) -> Self {
        UploadError::Failed(err.into())
    }
}

/// The whole upload of `owner`'s `form`, at most `max_bytes`: room for one more file (an early
/// refusal, before any byte is stored), the file streamed to S3 ([`receive`]), then the file
/// recorded verified by intake ([`Intake::keep_stored`]: only if the owner still has room for it
/// and its bytes, judged and recorded atomically per owner; else the object goes again); in the
/// form's session's workspace when it names one. When the owner already has these bytes, their
/// earlier file answers, which must be verified: one object per content.
pub(crate) async fn upload(
    state: &AppState,
    owner: &str,
    form: BoundedForm,
    max_bytes: u64,
) -> Result<FileRow, UploadError> {
    let intake = Intake {
        pool: &state.pool,
        quota: &state.quota,
        bucket: &state.bucket,
        upload_ttl: state.upload_ttl,
    };
    intake.room(owner, None, false).await??;
    let id = Uuid::now_v7();
    let stored = receive(
        &state.s3,
        &state.bucket,
        |name| upload_key(owner, id, name),
        form,
        max_bytes,
    )
    .await?;
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
    let file = intake
        .keep_stored(&state.s3, &upload, &stored.sha256)
        .await??
        .filter(|f| f.status == FileStatus::Verified)
        .ok_or(UploadError::InProgress)?;
    if let Some(session) = &stored.session_id {
        store::add_to_workspace(&state.pool, owner, session, file.id, Source::Upload).await?;
    }
    tracing::info!(file.id = %file.id, size = stored.size, "file uploaded through the service");
    Ok(file)
}

fn invalid(field: &'static str, message: impl Into<String>) -> UploadError {
    UploadError::Invalid {
        field,
        message: message.into(),
    }
}

/// The refusal for a form that could not be read while reading `field`.
fn unreadable(field: &'static str, err: FormError) -> UploadError {
    match err {
        FormError::TooLong(refused) => refused.into(),
        FormError::Malformed(message) => invalid(field, message),
    }
}

/// What was stored.
pub(crate) struct Stored {
    pub(crate) key: String,
    pub(crate) file_name: String,
    pub(crate) file_type: &'static FileType,
    pub(crate) size: u64,
    pub(crate) sha256: [u8; 32],
    pub(crate) session_id: Option<String>,
}

/// Reads the form: optional `session_id` and `file_type` fields, then the `file` part, which
/// is streamed to `bucket`/`key`. On any refusal nothing is left in S3.
pub(crate) async fn receive(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    key_for: impl Fn(&str) -> String,
    mut form: BoundedForm,
    max_bytes: u64,
) -> Result<Stored, UploadError> {
    let mut session_id = None;
    let mut declared_type = None;
    let mut skipped = 0;
    let errors = form.errors();
    while let Some(field) = form.next_field().await.map_err(|e| unreadable("file", e))? {
        match field.name().unwrap_or_default() {
            "session_id" => {
                let value = small_text(field, &errors, "session_id", MAX_SESSION_ID_BYTES).await?;
                if value.is_empty() || value.chars().count() > 128 {
                    return Err(invalid(
                        "session_id",
                        "session_id must be 1 to 128 characters",
                    ));
                }
                session_id = Some(value);
            }
            "file_type" => {
                declared_type =
                    Some(small_text(field, &errors, "file_type", MAX_FILE_TYPE_BYTES).await?);
            }
            "file" => {
                let file_name = field
                    .file_name()
                    .and_then(base_name)
                    .ok_or_else(|| invalid("file", "the file part needs a file name"))?;
                if file_name.chars().count() > MAX_FILE_NAME_CHARS {
                    return Err(invalid("file", "file name must be at most 255 characters"));
                }
                let mime = declared_type
                    .clone()
                    .or_else(|| field.content_type().map(str::to_owned))
                    .unwrap_or_default();
                let file_type = file_types::allowed(&mime).ok_or_else(|| {
                    invalid(
                        "file_type",
                        format!("file_type {mime:?} is not a supported type"),
                    )
                })?;
                let key = key_for(&file_name);
                // Nothing is read after the file: its data need not be followed.
                errors.last_part();
                let (size, sha256) =
                    stream_to_s3(s3, bucket, &key, file_type, (field, &errors), max_bytes).await?;
                return Ok(Stored {
                    key,
                    file_name,
                    file_type,
                    size,
                    sha256,
                    session_id,
                });
            }
            other => {
                // Unknown fields are skipped (their bytes drained, never kept), but only a few.
                skipped += 1;
                if skipped > MAX_SKIPPED_FIELDS {
                    return Err(invalid(
                        "file",
                        format!(
                            "the form has more than {MAX_SKIPPED_FIELDS} fields besides file, file_type and session_id (last: {other:?})"
                        ),
                    ));
                }
            }
        }
    }
    Err(invalid("file", "the form has no file part"))
}

/// Most bytes of a `session_id` field (128 characters of up to 4 bytes).
const MAX_SESSION_ID_BYTES: usize = 512;
/// Most bytes of a `file_type` field.
const MAX_FILE_TYPE_BYTES: usize = 255;
/// Most unknown fields a form may carry.
const MAX_SKIPPED_FIELDS: usize = 8;

/// A text field, refused as soon as it grows past `max` bytes: never buffered beyond that.
async fn small_text(
    mut field: Field<'_>,
    errors: &FormErrors,
    name: &'static str,
    max: usize,
) -> Result<String, UploadError> {
    let mut bytes = Vec::new();
    while let Some(chunk) = field
        .chunk()
        .await
        .map_err(|e| unreadable(name, errors.of(&e)))?
    {
        if bytes.len() + chunk.len() > max {
            return Err(invalid(name, format!("{name} must be at most {max} bytes")));
        }
        bytes.extend_from_slice(&chunk);
    }
    String::from_utf8(bytes).map_err(|_| invalid(name, format!("{name} must be UTF-8 text")))
}

/// Streams `field` to S3: one `PutObject` for a small file, a multipart upload otherwise.
async fn stream_to_s3(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    file_type: &'static FileType,
    (mut field, errors): (Field<'_>, &FormErrors),
    max_bytes: u64,
) -> Result<(u64, [u8; 32]), UploadError> {
    let mut hasher = Sha256::new();
    let mut head = Vec::with_capacity(HEAD_BYTES);
    let mut buffer: Vec<u8> = Vec::with_capacity(PART_BYTES);
    let mut size: u64 = 0;
    let mut multipart: Option<S3Multipart> = None;
    let outcome: Result<(), UploadError> = async {
        while let Some(chunk) = field
            .chunk()
            .await
            .map_err(|e| unreadable("file", errors.of(&e)))?
        {
            size += chunk.len() as u64;
            if size > max_bytes {
                return Err(UploadError::TooLarge);
            }
            hasher.update(&chunk);
            let room = HEAD_BYTES - head.len();
            head.extend_from_slice(&chunk[..room.min(chunk.len())]);
            let mut rest = &chunk[..];
            while !rest.is_empty() {
                let take = (PART_BYTES - buffer.len()).min(rest.len());
                buffer.extend_from_slice(&rest[..take]);
                rest = &rest[take..];
                if buffer.len() == PART_BYTES {
                    let upload = match &mut multipart {
                        Some(upload) => upload,
                        None => multipart
                            .insert(S3Multipart::start(s3, bucket, key, file_type.mime).await?),
                    };
                    upload.part(std::mem::take(&mut buffer)).await?;
                    buffer.reserve(PART_BYTES);
                }
            }
        }
        if size == 0 {
            return Err(invalid("file", "the file is empty"));
        }
        if !file_type.matches(&head) {
            return Err(invalid(
                "file",
                format!("the file's bytes are not {}", file_type.mime),
            ));
        }
        Ok(())
    }
    .await;
    if let Err(err) = outcome {
        if let Some(upload) = multipart {
            upload.abort().await;
        }
        return Err(err);
    }
    match multipart {
        Some(mut upload) => {
            if !buffer.is_empty() {
                upload.part(buffer).await?;
            }
            upload.complete().await?;
        }
        None => {
            s3.put_object()
                .bucket(bucket)
                .key(key)
                .content_type(file_type.mime)
                .checksum_algorithm(ChecksumAlgorithm::Sha256)
                .body(ByteStream::from(buffer))
                .send()
                .await
                .map_err(|e| anyhow::Error::from(aws_sdk_s3::Error::from(e)))?;
        }
    }
    Ok((size, hasher.finalize().into()))
}

/// An S3 multipart upload in progress. Completed ([`S3Multipart::complete`]) or aborted
/// ([`S3Multipart::abort`]) by the upload; one that is dropped before either (the request's
/// future dropped mid-way, or completing it failed) aborts itself (see its `Drop`).
struct S3Multipart {
    s3: aws_sdk_s3::Client,
    bucket: String,
    key: String,
    /// Set from creation until the upload is completed or aborted.
    upload_id: Option<String>,
    parts: Vec<CompletedPart>,
}

impl S3Multipart {
    async fn start(
        s3: &aws_sdk_s3::Client,
        bucket: &str,
        key: &str,
        mime: &str,
    ) -> anyhow::Result<Self> {
        let created = s3
            .create_multipart_upload()
            .bucket(bucket)
            .key(key)
            .content_type(mime)
            .send()
            .await
            .map_err(aws_sdk_s3::Error::from)?;
        Ok(Self {
            s3: s3.clone(),
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            upload_id: Some(created.upload_id().unwrap_or_default().to_owned()),
            parts: Vec::new(),
        })
    }

    /// The upload's id (empty once it is completed or aborted).
    fn id(&self) -> &str {
        self.upload_id.as_deref().unwrap_or_default()
    }

    async fn part(&mut self, bytes: Vec<u8>) -> anyhow::Result<()> {
        let number = i32::try_from(self.parts.len() + 1)?;
        let uploaded = self
            .s3
            .upload_part()
            .bucket(&self.bucket)
            .key(&self.key)
            .upload_id(self.id())
            .part_number(number)
            .body(ByteStream::from(bytes))
            .send()
            .await
            .map_err(aws_sdk_s3::Error::from)?;
        self.parts.push(
            CompletedPart::builder()
                .part_number(number)
                .set_e_tag(uploaded.e_tag().map(str::to_owned))
                .build(),
        );
        Ok(())
    }

    /// Completes the upload; should that fail, dropping `self` aborts it.
    async fn complete(mut self) -> anyhow::Result<()> {
        self.s3
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(&self.key)
            .upload_id(self.id())
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(std::mem::take(&mut self.parts)))
                    .build(),
            )
            .send()
            .await
            .map_err(aws_sdk_s3::Error::from)?;
        self.upload_id = None;
        Ok(())
    }

    /// Aborts the upload and waits for S3's answer.
    async fn abort(mut self) {
        if let Some(upload_id) = self.upload_id.take() {
            abort(&self.s3, &self.bucket, &self.key, &upload_id).await;
        }
    }
}

impl Drop for S3Multipart {
    /// Aborts an upload neither completed nor aborted, in a task of its own (a drop cannot
    /// wait): the future of a request can be dropped at any await, and the parts sent so far
    /// would otherwise stay in S3, billed and counted by no quota (review finding L3). Outside a
    /// Tokio runtime nothing can be spawned: then, as when the process dies mid-upload, the
    /// bucket's `AbortIncompleteMultipartUpload` lifecycle rule removes it
    /// (`deploy/k8s/infra/s3/README.md`).
    fn drop(&mut self) {
        let Some(upload_id) = self.upload_id.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                upload_id,
                "a multipart upload dropped outside a runtime is left to the bucket's lifecycle rule"
            );
            return;
        };
        let (s3, bucket, key) = (
            self.s3.clone(),
            std::mem::take(&mut self.bucket),
            std::mem::take(&mut self.key),
        );
        runtime.spawn(async move { abort(&s3, &bucket, &key, &upload_id).await });
    }
}

/// Aborts the multipart upload `upload_id` of `bucket`/`key`; a failure is logged.
async fn abort(s3: &aws_sdk_s3::Client, bucket: &str, key: &str, upload_id: &str) {
    let aborted = s3
        .abort_multipart_upload()
        .bucket(bucket)
        .key(key)
        .upload_id(upload_id)
        .send()
        .await;
    match aborted {
        Ok(_) => tracing::debug!(upload_id, "multipart upload aborted"),
        Err(err) => {
            tracing::warn!(error = %aws_sdk_s3::error::DisplayErrorContext(err), "cannot abort a multipart upload");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::StreamExt as _;

    use super::*;

    /// A form that begins with `head` and never ends: 64 KiB chunks for as long as anyone
    /// reads, counted in `pulled`.
    fn endless(head: String, pulled: Arc<AtomicUsize>) -> BoundedForm {
        // Each chunk arrives after a pause, as from a network (a stream that is always ready
        // is read ahead by the multipart parser up to the body limit).
        let endless = futures::stream::unfold((), |()| async {
            tokio::task::yield_now().await;
            Some((vec![b'a'; 64 * 1024], ()))
        });
        let body = futures::stream::once(async move { head.into_bytes() })
            .chain(endless)
            .map(move |chunk| {
                pulled.fetch_add(chunk.len(), Ordering::Relaxed);
                Ok::<_, std::io::Error>(chunk)
            });
        let request = axum::http::Request::builder()
            .header("content-type", "multipart/form-data; boundary=B")
            .body(axum::body::Body::from_stream(body))
            .unwrap();
        futures::executor::block_on(BoundedForm::bounded(
            request,
            crate::form::DEFAULT_PART_HEADER_BYTES,
        ))
        .unwrap_or_else(|_| panic!("a multipart request"))
    }

    /// A form whose `field` never ends.
    fn endless_field(field: &str) -> BoundedForm {
        let head = format!("--B\r\nContent-Disposition: form-data; name=\"{field}\"\r\n\r\n");
        endless(head, Arc::default())
    }

    fn s3() -> aws_sdk_s3::Client {
        let config = aws_sdk_s3::Config::builder()
            .behavior_version_latest()
            .region(aws_sdk_s3::config::Region::new("us-east-1"))
            .build();
        aws_sdk_s3::Client::from_conf(config)
    }

    #[tokio::test]
    async fn part_headers_that_never_end_are_refused_after_16_kib_not_at_the_body_limit() {
        let heads = [
            "--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\nX-Pad: ",
            // The second part's headers, after a well-formed first part.
            "--B\r\nContent-Disposition: form-data; name=\"session_id\"\r\n\r\nt\r\n--B\r\nX-Pad: ",
            // No boundary at all: a preamble.
            "",
        ];
        for head in heads {
            let pulled = Arc::new(AtomicUsize::new(0));
            let form = endless(head.to_owned(), Arc::clone(&pulled));
            let read = tokio::time::timeout(
                std::time::Duration::from_secs(20),
                receive(&s3(), "b", |_| "k".to_owned(), form, 1024),
            )
            .await
            .expect("refused while reading");
            assert!(
                matches!(read, Err(UploadError::FramingTooLong(_))),
                "{head:?}: {:?}",
                read.err()
            );
            // The chunk that crossed 16 KiB is the last one read.
            let pulled = pulled.load(Ordering::Relaxed);
            assert!(
                pulled <= head.len() + 64 * 1024,
                "{head:?}: read {pulled} bytes"
            );
        }
    }

    #[tokio::test]
    async fn text_fields_are_refused_while_they_are_read_not_after() {
        for (field, max) in [("session_id", 512), ("file_type", 255)] {
            // Were the field read whole, this would never return: the guard turns a hang into
            // a failure instead of holding the test run.
            let read = tokio::time::timeout(
                std::time::Duration::from_secs(20),
                receive(&s3(), "b", |_| "k".to_owned(), endless_field(field), 1024),
            )
            .await
            .expect("refused while reading");
            let Err(UploadError::Invalid {
                field: named,
                message,
            }) = read
            else {
                panic!("{field} refused");
            };
            assert_eq!(named, field, "{message}");
            assert_eq!(message, format!("{field} must be at most {max} bytes"));
        }
    }

    /// The parts S3 holds for the multipart upload `upload_id` of `bucket`/`key`; none once it
    /// was aborted (S3 answers `NoSuchUpload`; s3s-fs lists no parts).
    async fn parts(s3: &aws_sdk_s3::Client, bucket: &str, key: &str, upload_id: &str) -> usize {
        match s3
            .list_parts()
            .bucket(bucket)
            .key(key)
            .upload_id(upload_id)
            .send()
            .await
        {
            Ok(listed) => listed.parts().len(),
            Err(err) => {
                let err = aws_sdk_s3::Error::from(err);
                assert!(
                    matches!(err, aws_sdk_s3::Error::NoSuchUpload(_)),
                    "ListParts failed: {err:?}"
                );
                0
            }
        }
    }

    #[tokio::test]
    async fn a_multipart_upload_whose_future_is_dropped_mid_way_is_aborted() {
        let (s3, bucket) = crate::verify::tests::local_s3().await;
        let (started, upload_id) = tokio::sync::oneshot::channel();
        // An upload whose request goes away after its first part (its task is cancelled).
        let request = {
            let (s3, bucket) = (s3.clone(), bucket.clone());
            tokio::spawn(async move {
                let mut upload = S3Multipart::start(&s3, &bucket, "k", "text/plain")
                    .await
                    .unwrap();
                upload.part(vec![b'a'; PART_BYTES]).await.unwrap();
                started.send(upload.id().to_owned()).unwrap();
                std::future::pending::<()>().await;
                upload.complete().await
            })
        };
        let upload_id = upload_id.await.unwrap();
        assert_eq!(parts(&s3, &bucket, "k", &upload_id).await, 1);
        request.abort();
        assert!(request.await.unwrap_err().is_cancelled());
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
        while parts(&s3, &bucket, "k", &upload_id).await != 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the dropped upload's part is still in S3"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}
