//! The user message's files as content for the agent: each is read from S3 (bounded in size
//! and time) and extracted to text or a vision image by `extract`. A file that cannot be read
//! never fails the run: the agent is told why instead.

use std::time::Duration;

use aws_sdk_s3::error::DisplayErrorContext;
use extract::{Extracted, Limits};
use protocol::metadata::AttachedFile;

/// Files read per message; admission already refuses more.
pub const MAX_FILES: usize = 3;

/// Largest file read at all (the upload limit).
pub const MAX_FILE_BYTES: u64 = 100 * 1024 * 1024;

/// Time allowed for one file: download and extraction together.
pub const FILE_TIMEOUT: Duration = Duration::from_secs(15);

/// One attached file and what it became for the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachmentContent {
    /// The file, as admission resolved it.
    pub file: AttachedFile,
    /// Its content, or why it could not be read (safe to show users, e.g.
    /// `could not read report.pdf: timed out`).
    pub content: Result<Extracted, String>,
}

/// Reads attachments from the deployment's bucket.
#[derive(Debug, Clone)]
pub struct AttachmentReader {
    client: aws_sdk_s3::Client,
    bucket: String,
    limits: Limits,
    max_bytes: u64,
    timeout: Duration,
}

impl AttachmentReader {
    /// A reader of `config`'s bucket with the default limits.
    pub fn new(config: &platform::s3::S3Config) -> Self {
        Self {
            client: platform::s3::client(config),
            bucket: config.bucket.clone(),
            limits: Limits::default(),
            max_bytes: MAX_FILE_BYTES,
            timeout: FILE_TIMEOUT,
        }
    }

    /// The same reader with other bounds (tests).
    #[must_use]
    pub fn with_bounds(mut self, max_bytes: u64, timeout: Duration) -> Self {
        self.max_bytes = max_bytes;
        self.timeout = timeout;
        self
    }

    /// Reads one file: download then extraction, under the per-file timeout.
    async fn read(&self, file: &AttachedFile) -> Result<Extracted, String> {
        let name = file.name();
        match tokio::time::timeout(self.timeout, self.fetch_and_extract(file)).await {
            Ok(result) => result.map_err(|reason| format!("could not read {name}: {reason}")),
            Err(_) => Err(format!("could not read {name}: timed out")),
        }
    }

    async fn fetch_and_extract(&self, file: &AttachedFile) -> Result<Extracted, String> {
        // Defence in depth: admission only resolves files of our bucket.
        if file.bucket != self.bucket {
            return Err("the file is not in this deployment's storage".to_owned());
        }
        let too_large =
            |size: u64| format!("it is {size} bytes, over the {} limit", mib(self.max_bytes));
        if let Some(size) = file.size_bytes.and_then(|s| u64::try_from(s).ok())
            && size > self.max_bytes
        {
            return Err(too_large(size));
        }
        let object = self
            .client
            .get_object()
            .bucket(&file.bucket)
            .key(&file.path)
            .send()
            .await
            .map_err(|err| {
                if err
                    .as_service_error()
                    .is_some_and(aws_sdk_s3::operation::get_object::GetObjectError::is_no_such_key)
                {
                    return "the file no longer exists".to_owned();
                }
                tracing::warn!(bucket = %file.bucket, key = %file.path, error = %DisplayErrorContext(&err), "cannot download an attachment");
                "the file storage is unavailable".to_owned()
            })?;
        if let Some(size) = object.content_length().and_then(|s| u64::try_from(s).ok())
            && size > self.max_bytes
        {
            return Err(too_large(size));
        }
        let capacity = object
            .content_length()
            .and_then(|s| usize::try_from(s).ok())
            .unwrap_or(0)
            .min(usize::try_from(self.max_bytes).unwrap_or(usize::MAX));
        let mut bytes = Vec::with_capacity(capacity);
        let mut body = object.body;
        loop {
            match body.try_next().await {
                Ok(Some(chunk)) => {
                    let total = bytes.len() as u64 + chunk.len() as u64;
                    if total > self.max_bytes {
                        return Err(too_large(total));
                    }
                    bytes.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(err) => {
                    tracing::warn!(bucket = %file.bucket, key = %file.path, error = %err, "attachment download broke off");
                    return Err("the download broke off".to_owned());
                }
            }
        }
        let (mime_type, file_name) = (file.mime_type.clone(), file.name().to_owned());
        let limits = self.limits.clone();
        tokio::task::spawn_blocking(move || {
            extract::extract(&mime_type, &file_name, &bytes, &limits)
        })
        .await
        .map_err(|err| {
            tracing::error!(error = %err, "attachment extraction failed");
            "the file could not be processed".to_owned()
        })?
        .map_err(|err| err.to_string())
    }
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes / (1024 * 1024))
}

/// The content of the first [`MAX_FILES`] files, read concurrently. Without a reader (no S3
/// configured) every file is described as unavailable.
pub async fn read_all(
    reader: Option<&AttachmentReader>,
    files: &[AttachedFile],
) -> Vec<AttachmentContent> {
    let reads = files.iter().take(MAX_FILES).map(|file| async move {
        let content = match reader {
            Some(reader) => reader.read(file).await,
            None => Err(format!(
                "could not read {}: file storage is not configured for the agent",
                file.name()
            )),
        };
        AttachmentContent {
            file: file.clone(),
            content,
        }
    });
    futures::future::join_all(reads).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(bucket: &str, size: Option<i64>) -> AttachedFile {
        AttachedFile {
            bucket: bucket.to_owned(),
            path: "u/report.pdf".to_owned(),
            mime_type: "application/pdf".to_owned(),
            file_name: Some("report.pdf".to_owned()),
            size_bytes: size,
        }
    }

    fn reader() -> AttachmentReader {
        // Nothing listens on port 9: a request would fail, so the checks below must refuse first.
        AttachmentReader::new(&platform::s3::S3Config {
            endpoint: Some("http://127.0.0.1:9".to_owned()),
            region: "us-east-1".to_owned(),
            access_key: "k".to_owned(),
            secret_key: secrecy::SecretString::from("s"),
            bucket: "mine".to_owned(),
        })
    }

    #[tokio::test]
    async fn without_storage_every_file_is_unavailable_and_at_most_three_are_read() {
        let files = vec![file("mine", None); 5];
        let read = read_all(None, &files).await;
        assert_eq!(read.len(), MAX_FILES);
        assert_eq!(
            read[0].content,
            Err(
                "could not read report.pdf: file storage is not configured for the agent"
                    .to_owned()
            )
        );
    }

    #[tokio::test]
    async fn other_buckets_and_oversized_files_are_refused_before_any_download() {
        let reader = reader();
        let read = read_all(
            Some(&reader),
            &[
                file("theirs", Some(10)),
                file("mine", Some(100 * 1024 * 1024 + 1)),
            ],
        )
        .await;
        assert_eq!(
            read[0].content,
            Err(
                "could not read report.pdf: the file is not in this deployment's storage"
                    .to_owned()
            )
        );
        assert_eq!(
            read[1].content,
            Err(
                "could not read report.pdf: it is 104857601 bytes, over the 100 MiB limit"
                    .to_owned()
            )
        );
    }

    #[tokio::test]
    async fn unreachable_storage_is_a_note_not_a_failure() {
        let reader = reader().with_bounds(MAX_FILE_BYTES, Duration::from_secs(10));
        let read = read_all(Some(&reader), &[file("mine", Some(10))]).await;
        let note = read[0].content.clone().unwrap_err();
        assert!(
            note == "could not read report.pdf: the file storage is unavailable"
                || note == "could not read report.pdf: timed out",
            "{note}"
        );
    }
}
