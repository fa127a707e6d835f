//! Files an agent makes, kept in its run's session workspace by the attachments service.
//!
//! A small file goes inline over NATS ([`RegisterGenerated`]) when the request fits the
//! server's payload limit; a larger one (up to the product's 100 MB per file) asks for a
//! presigned POST form ([`GeneratedUpload`]), goes straight to S3 with it, and is then
//! resolved, which verifies the stored bytes (size, SHA-256, type) on the spot. Either way a
//! file is only shown to the user once the attachments service has it verified, and a
//! refusal comes back to the agent as [`AttachError::Refused`] rather than failing the run.

use std::sync::OnceLock;
use std::time::Duration;

use base64::Engine as _;
use protocol::files::{
    GeneratedUpload, GeneratedUploadOutcome, GeneratedUploadReply, MAX_GENERATED_FILE_BYTES,
    MAX_GENERATED_INLINE_BYTES, RefusalReason, RegisterGenerated, RegisterOutcome, RegisterReply,
    ResolveOutcome, ResolveReply, ResolveRequest,
};
use protocol::messaging::Names;
use sha2::{Digest as _, Sha256};

/// Time allowed for one request to the attachments service (a resolve of a large file reads
/// it when S3 kept no checksum).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Time allowed for the upload of one file to S3.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(300);
/// Resolves tried while a just-uploaded object is not visible yet.
const RESOLVE_ATTEMPTS: u32 = 5;
/// Longest file name an agent may give.
const MAX_FILE_NAME_CHARS: usize = 255;

/// Why a generated file was not kept.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// Refused, with a reason safe to show the user (type not allowed, too large, too many
    /// files, bytes that failed verification, ...).
    #[error("{0}")]
    Refused(String),
    /// The attachments service or S3 failed or did not answer in time (the cause is logged,
    /// never shown).
    #[error("the file storage is unavailable")]
    Unavailable(#[source] anyhow::Error),
}

fn unavailable(err: impl Into<anyhow::Error>) -> AttachError {
    AttachError::Unavailable(err.into())
}

/// A name an agent may give a file: 1 to 255 characters, no path, no control characters, no
/// `..` (the workspace path is `/<name>`), no surrounding blanks.
pub(crate) fn check_file_name(file_name: &str) -> Result<(), AttachError> {
    let ok = !file_name.is_empty()
        && file_name.chars().count() <= MAX_FILE_NAME_CHARS
        && file_name.trim() == file_name
        && !file_name.contains(['/', '\\'])
        && !file_name.contains("..")
        && !file_name.chars().any(char::is_control);
    if ok {
        Ok(())
    } else {
        Err(AttachError::Refused(
            "a file name must be 1 to 255 characters without a path, control characters or .."
                .to_owned(),
        ))
    }
}

/// The HTTP client uploads go through (one per process: it holds the connection pool).
fn http() -> Result<&'static reqwest::Client, AttachError> {
    static HTTP: OnceLock<reqwest::Client> = OnceLock::new();
    if let Some(client) = HTTP.get() {
        return Ok(client);
    }
    let client = reqwest::Client::builder().build().map_err(unavailable)?;
    Ok(HTTP.get_or_init(|| client))
}

/// Registers the files of one run: its owner's, in its thread's workspace.
#[derive(Debug, Clone)]
pub(crate) struct Registrar {
    client: async_nats::Client,
    register_subject: String,
    upload_subject: String,
    resolve_subject: String,
    owner: String,
    session_id: String,
}

impl Registrar {
    pub(crate) fn new(
        client: async_nats::Client,
        names: &Names,
        owner: &str,
        session_id: &str,
    ) -> Self {
        Self {
            client,
            register_subject: names.attachments_register_subject(),
            upload_subject: names.attachments_generated_upload_subject(),
            resolve_subject: names.attachments_resolve_subject(),
            owner: owner.to_owned(),
            session_id: session_id.to_owned(),
        }
    }

    /// Stores `bytes` as `file_name` of type `content_type`; answers its verified file's
    /// `content_url`.
    #[tracing::instrument(name = "worker.generated.register", skip_all, fields(bytes = bytes.len()))]
    pub(crate) async fn register(
        &self,
        file_name: &str,
        content_type: &str,
        bytes: Vec<u8>,
    ) -> Result<String, AttachError> {
        check_file_name(file_name)?;
        if bytes.is_empty()
            || u64::try_from(bytes.len()).unwrap_or(u64::MAX) > MAX_GENERATED_FILE_BYTES
        {
            return Err(AttachError::Refused(
                "a generated file must be 1 byte to 100 MB".to_owned(),
            ));
        }
        if bytes.len() <= MAX_GENERATED_INLINE_BYTES {
            let request = RegisterGenerated::V1 {
                owner: self.owner.clone(),
                session_id: self.session_id.clone(),
                file_name: file_name.to_owned(),
                content_type: content_type.to_owned(),
                content_base64: base64::engine::general_purpose::STANDARD.encode(&bytes),
            };
            let payload = serde_json::to_vec(&request).map_err(unavailable)?;
            // Near the inline limit the base64 request can outgrow the server's payload limit.
            if payload.len() <= self.client.server_info().max_payload {
                return self.inline(payload).await;
            }
        }
        self.upload(file_name, content_type, bytes).await
    }

    async fn request(&self, subject: &str, payload: Vec<u8>) -> Result<bytes::Bytes, AttachError> {
        let answer = platform::rpc::request(
            &self.client,
            subject.to_owned(),
            payload.into(),
            REQUEST_TIMEOUT,
        )
        .await
        .map_err(unavailable)?;
        Ok(answer.payload)
    }

    async fn inline(&self, payload: Vec<u8>) -> Result<String, AttachError> {
        let answer = self.request(&self.register_subject, payload).await?;
        match serde_json::from_slice(&answer).map_err(unavailable)? {
            RegisterReply::V1(RegisterOutcome::Registered { content_url }) => Ok(content_url),
            RegisterReply::V1(RegisterOutcome::Refused { message }) => {
                Err(AttachError::Refused(message))
            }
        }
    }

    /// The large path: a form for exactly these bytes, the upload, then verification.
    async fn upload(
        &self,
        file_name: &str,
        content_type: &str,
        bytes: Vec<u8>,
    ) -> Result<String, AttachError> {
        let request = GeneratedUpload::V1 {
            owner: self.owner.clone(),
            session_id: self.session_id.clone(),
            file_name: file_name.to_owned(),
            content_type: content_type.to_owned(),
            file_size: u64::try_from(bytes.len()).map_err(unavailable)?,
            sha256_hex: hex::encode(Sha256::digest(&bytes)),
        };
        let payload = serde_json::to_vec(&request).map_err(unavailable)?;
        let answer = self.request(&self.upload_subject, payload).await?;
        let GeneratedUploadReply::V1(outcome) =
            serde_json::from_slice(&answer).map_err(unavailable)?;
        let (url, fields, content_url) = match outcome {
            GeneratedUploadOutcome::Upload {
                url,
                fields,
                content_url,
            } => (url, fields, content_url),
            GeneratedUploadOutcome::Stored { content_url } => return Ok(content_url),
            GeneratedUploadOutcome::Refused { message } => {
                return Err(AttachError::Refused(message));
            }
        };
        // The policy's fields first, the file last, as S3's POST form requires.
        let mut form = reqwest::multipart::Form::new();
        for (name, value) in fields {
            let value = match value {
                serde_json::Value::String(text) => text,
                other => other.to_string(),
            };
            form = form.text(name, value);
        }
        let part = reqwest::multipart::Part::bytes(bytes)
            .file_name(file_name.to_owned())
            .mime_str(content_type)
            .map_err(|e| unavailable(e.without_url()))?;
        let response = http()?
            .post(&url)
            .multipart(form.part("file", part))
            .timeout(UPLOAD_TIMEOUT)
            .send()
            .await
            .map_err(|e| unavailable(e.without_url()))?;
        if !response.status().is_success() {
            return Err(unavailable(anyhow::anyhow!(
                "S3 answered the upload with {}",
                response.status()
            )));
        }
        self.verify(content_url).await
    }

    /// Resolves the uploaded file, which verifies it; answers its `content_url` once verified.
    async fn verify(&self, content_url: String) -> Result<String, AttachError> {
        let request = ResolveRequest::V1 {
            owner: self.owner.clone(),
            url: content_url.clone(),
            session_id: None,
        };
        let payload = serde_json::to_vec(&request).map_err(unavailable)?;
        for attempt in 1..=RESOLVE_ATTEMPTS {
            let answer = self.request(&self.resolve_subject, payload.clone()).await?;
            match serde_json::from_slice(&answer).map_err(unavailable)? {
                ResolveReply::V1(ResolveOutcome::Resolved(_)) => return Ok(content_url),
                ResolveReply::V1(ResolveOutcome::Refused {
                    reason: RefusalReason::NotVerified,
                }) if attempt < RESOLVE_ATTEMPTS => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                ResolveReply::V1(ResolveOutcome::Refused { reason }) => {
                    return Err(AttachError::Refused(reason.message().to_owned()));
                }
            }
        }
        Err(AttachError::Refused(
            RefusalReason::NotVerified.message().to_owned(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::check_file_name;

    #[test]
    fn file_names_are_plain_names_without_paths() {
        for good in ["notes.md", "báo cáo.txt", "a b.csv", &"x".repeat(255)] {
            assert!(check_file_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            " notes.md",
            "dir/notes.md",
            "..\\x.txt",
            "a..b.txt",
            "tab\tname.txt",
            &"x".repeat(256),
        ] {
            assert!(check_file_name(bad).is_err(), "{bad:?}");
        }
    }
}
