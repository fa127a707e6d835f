//! File references and the attachments service's request/reply contract.
//!
//! A run may point at a file in three ways: `s3://bucket/key` (a `content_url`), a presigned
//! URL of our S3 server (`https://host/bucket/key?X-Amz-...`, path style), or a Supabase-style
//! signed URL (`https://host/storage/v1/object/sign/{bucket}/{path}?token=<jwt>`). Each is
//! parsed into bucket and path; none is authorization by itself: the attachments service
//! resolves it to a file the caller owns and that is verified, or says why not.

use serde::{Deserialize, Serialize};
use ts_rs::TS;

/// Most files one message may carry.
pub const MAX_FILES_PER_MESSAGE: usize = 3;
/// Longest URL accepted as a file reference.
pub const MAX_FILE_URL_LEN: usize = 2048;

/// Where a reference points, parsed from its URL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRef {
    /// Bucket name.
    pub bucket: String,
    /// Object path (key) inside the bucket.
    pub path: String,
    /// The Supabase signed-URL token, when the URL had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// Why a URL is not a file reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileRefError {
    /// Not a URL of a supported form.
    #[error("url must be an s3:// content_url or a signed URL issued by the attachments service")]
    Unsupported,
    /// Longer than [`MAX_FILE_URL_LEN`].
    #[error("url must be at most {MAX_FILE_URL_LEN} characters")]
    TooLong,
}

/// Parses `s3://bucket/key`, a Supabase signed URL or a path-style S3 URL into a [`FileRef`].
pub fn parse_file_url(raw: &str) -> Result<FileRef, FileRefError> {
    if raw.len() > MAX_FILE_URL_LEN {
        return Err(FileRefError::TooLong);
    }
    // The URL parser silently resolves dot segments (also percent-encoded ones); a reference
    // that needs resolving is refused rather than reinterpreted.
    let lowered = raw.to_ascii_lowercase();
    if lowered.contains("%2e")
        || lowered.contains("/../")
        || lowered.contains("/./")
        || lowered.ends_with("/..")
    {
        return Err(FileRefError::Unsupported);
    }
    let url = url::Url::parse(raw).map_err(|_| FileRefError::Unsupported)?;
    let segments: Vec<String> = match url.scheme() {
        "s3" => {
            let bucket = url.host_str().ok_or(FileRefError::Unsupported)?.to_owned();
            std::iter::once(bucket)
                .chain(decoded_segments(&url)?)
                .collect()
        }
        "http" | "https" => decoded_segments(&url)?,
        _ => return Err(FileRefError::Unsupported),
    };
    let (segments, token) = match segments.as_slice() {
        [storage, v1, object, sign, rest @ ..]
            if url.scheme() != "s3"
                && storage == "storage"
                && v1 == "v1"
                && object == "object"
                && sign == "sign" =>
        {
            let token = url
                .query_pairs()
                .find(|(k, _)| k == "token")
                .map(|(_, v)| v.into_owned());
            (rest.to_vec(), Some(token.ok_or(FileRefError::Unsupported)?))
        }
        _ => (segments, None),
    };
    let [bucket, path @ ..] = segments.as_slice() else {
        return Err(FileRefError::Unsupported);
    };
    let path = path.join("/");
    // Decoding may bring back what the URL syntax kept apart: a `/` in the bucket (`%2F`), or
    // control characters (`%00`, `%0A`) in either; neither names an object of ours.
    if bucket.is_empty()
        || bucket.contains('/')
        || bucket.chars().any(char::is_control)
        || path.chars().any(char::is_control)
        || path.is_empty()
        || path
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err(FileRefError::Unsupported);
    }
    Ok(FileRef {
        bucket: bucket.clone(),
        path,
        token,
    })
}

fn decoded_segments(url: &url::Url) -> Result<Vec<String>, FileRefError> {
    url.path_segments()
        .map(|segments| {
            segments
                .filter(|s| !s.is_empty())
                .map(|s| {
                    percent_encoding::percent_decode_str(s)
                        .decode_utf8()
                        .map(|d| d.into_owned())
                        .map_err(|_| FileRefError::Unsupported)
                })
                .collect()
        })
        .unwrap_or(Ok(Vec::new()))
}

/// Request to the attachments service: resolve `url` to a file `owner` may use. Versioned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum ResolveRequest {
    /// Version 1.
    #[serde(rename = "1")]
    V1 {
        /// Whose file it must be.
        owner: String,
        /// The URL or `content_url` from the run.
        url: String,
        /// The session (thread) of the message: a resolved file joins its workspace with
        /// `source: "upload"` (`file-attachments.md`'s `workspace_files`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session_id: Option<String>,
    },
}

/// Answer of the attachments service. Versioned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum ResolveReply {
    /// Version 1.
    #[serde(rename = "1")]
    V1(ResolveOutcome),
}

/// A resolved file, or why the reference cannot be used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ResolveOutcome {
    /// The caller owns this verified file.
    Resolved(ResolvedFile),
    /// The reference cannot be used.
    Refused {
        /// Why, by kind.
        reason: RefusalReason,
    },
}

/// A file a run may use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolvedFile {
    /// Bucket.
    pub bucket: String,
    /// Object path.
    pub path: String,
    /// The file's verified MIME type.
    pub mime_type: String,
    /// Original file name.
    pub file_name: String,
    /// Size in bytes.
    pub size_bytes: i64,
}

/// Why a file reference was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalReason {
    /// Not a supported URL form.
    BadUrl,
    /// A Supabase token that is invalid, expired or for another object.
    BadSignature,
    /// No such file for this owner (another owner's file is reported the same way).
    NotFound,
    /// The upload has not been verified yet.
    NotVerified,
    /// The stored bytes did not match the declared size, hash or type.
    Quarantined,
}

impl RefusalReason {
    /// A safe message for the client.
    pub fn message(self) -> &'static str {
        match self {
            RefusalReason::BadUrl => {
                "url must be an s3:// content_url or a signed URL issued by the attachments service"
            }
            RefusalReason::BadSignature => "url signature is invalid or expired",
            RefusalReason::NotFound => "url does not point to a file you own",
            RefusalReason::NotVerified => "file upload has not been verified yet",
            RefusalReason::Quarantined => "file failed verification and is quarantined",
        }
    }
}

/// Most URLs signed in one [`SignRequest`].
pub const MAX_SIGN_BATCH: usize = 200;
/// Largest generated file registered inline over NATS (NATS's default payload limit is 1 MiB).
pub const MAX_GENERATED_INLINE_BYTES: usize = 768 * 1024;

/// Request: fresh download URLs for files `owner` owns. Versioned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum SignRequest {
    /// Version 1.
    #[serde(rename = "1")]
    V1 {
        /// Whose files.
        owner: String,
        /// `content_url`s (or any form [`parse_file_url`] takes), at most [`MAX_SIGN_BATCH`].
        urls: Vec<String>,
    },
}

/// Answer to a [`SignRequest`], in request order: a URL, or `null` for a file that is not the
/// owner's, not verified, or gone. Versioned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum SignReply {
    /// Version 1.
    #[serde(rename = "1")]
    V1 {
        /// Signed URLs.
        urls: Vec<Option<String>>,
        /// Seconds they stay valid.
        expires_in: u64,
    },
}

/// Request from the worker: keep a file the agent generated in a session's workspace. Versioned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum RegisterGenerated {
    /// Version 1.
    #[serde(rename = "1")]
    V1 {
        /// The run's owner.
        owner: String,
        /// Session (thread) the file belongs to.
        session_id: String,
        /// File name as the agent called it.
        file_name: String,
        /// MIME type; must be an allowed type.
        content_type: String,
        /// The bytes, base64, at most [`MAX_GENERATED_INLINE_BYTES`] decoded.
        content_base64: String,
    },
}

/// Answer to [`RegisterGenerated`]. Versioned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum RegisterReply {
    /// Version 1.
    #[serde(rename = "1")]
    V1(RegisterOutcome),
}

/// The stored file, or why not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum RegisterOutcome {
    /// Stored and verified.
    Registered {
        /// `s3://bucket/key`.
        content_url: String,
    },
    /// Refused, with a safe reason.
    Refused {
        /// Why.
        message: String,
    },
}

/// Largest file an agent may make (the product's per-file limit, 100 MB).
pub const MAX_GENERATED_FILE_BYTES: u64 = 100 * 1024 * 1024;

/// Request from the worker: an upload form for a generated file too large for
/// [`RegisterGenerated`]'s inline bytes. The file is recorded pending with the declared size
/// and SHA-256 and joins the session's workspace as `generated`; it becomes usable once its
/// stored bytes are verified (a [`ResolveRequest`] for its `content_url` verifies it on the
/// spot). Versioned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum GeneratedUpload {
    /// Version 1.
    #[serde(rename = "1")]
    V1 {
        /// The run's owner.
        owner: String,
        /// Session (thread) the file belongs to.
        session_id: String,
        /// File name as the agent called it.
        file_name: String,
        /// MIME type; must be an allowed type.
        content_type: String,
        /// Exact size in bytes, 1 to [`MAX_GENERATED_FILE_BYTES`].
        file_size: u64,
        /// SHA-256 of the bytes, 64 hexadecimal characters; the stored bytes must match it.
        sha256_hex: String,
    },
}

/// Answer to [`GeneratedUpload`]. Versioned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum GeneratedUploadReply {
    /// Version 1.
    #[serde(rename = "1")]
    V1(GeneratedUploadOutcome),
}

/// Where to upload a generated file, or why not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum GeneratedUploadOutcome {
    /// A presigned POST form (as `POST /v2/files/upload-url` answers): send `fields` in order,
    /// then the bytes as the `file` part, to `url`.
    Upload {
        /// S3 endpoint to POST the multipart form to.
        url: String,
        /// Form fields, in order.
        fields: serde_json::Map<String, serde_json::Value>,
        /// `s3://bucket/key` of the file.
        content_url: String,
    },
    /// The owner already has these bytes verified: nothing to upload.
    Stored {
        /// `s3://bucket/key`.
        content_url: String,
    },
    /// Refused, with a safe reason.
    Refused {
        /// Why.
        message: String,
    },
}

/// Event name of a `CUSTOM` event carrying [`GeneratedAttachments`]: files an agent made, shown
/// under its message (`attachments` of the file-attachments history shape).
pub const ATTACHMENTS_EVENT: &str = "attachments";
/// Most files one message shows.
pub const MAX_GENERATED_ATTACHMENTS: usize = 20;

/// The value of a `CUSTOM attachments` event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[serde(rename_all = "camelCase")]
#[ts(export_to = "GeneratedAttachments.ts")]
pub struct GeneratedAttachments {
    /// The assistant message the files belong to.
    pub message_id: String,
    /// The files.
    pub files: Vec<GeneratedFile>,
}

/// A file an agent made, as the file-attachments seed shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[ts(export_to = "GeneratedFile.ts", optional_fields)]
pub struct GeneratedFile {
    /// Workspace path, e.g. `/report.md`.
    pub path: String,
    /// File name.
    pub filename: String,
    /// Icon kind (`pdf`, `md`, `image`, ...).
    pub icon_type: String,
    /// `generated` (made by the agent) or `upload`.
    pub source: String,
    /// `s3://bucket/key` of the stored bytes, when registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_url: Option<String>,
}

impl GeneratedFile {
    /// A file the agent made and registered at `content_url`: at the workspace root
    /// (`/<file_name>`), `source: "generated"`, with the icon of its type `mime`, except that a
    /// text file named `*.md` shows `md` as in `file-attachments.md`'s example (Markdown is
    /// stored as `text/plain`, the allowed text type).
    pub fn generated(file_name: &str, mime: &str, content_url: String) -> Self {
        let icon = crate::file_types::allowed(mime).map_or("file", |t| t.icon);
        let markdown = icon == "txt"
            && file_name
                .rsplit_once('.')
                .is_some_and(|(_, ext)| ext.eq_ignore_ascii_case("md"));
        Self {
            path: format!("/{file_name}"),
            filename: file_name.to_owned(),
            icon_type: if markdown { "md" } else { icon }.to_owned(),
            source: "generated".to_owned(),
            content_url: Some(content_url),
        }
    }
}

impl GeneratedAttachments {
    /// Parses and checks an event value: at most [`MAX_GENERATED_ATTACHMENTS`] files, absolute
    /// workspace paths, bounded names, a known source.
    pub fn parse_event(value: &serde_json::Value) -> Result<Self, String> {
        let event: Self = serde_json::from_value(value.clone()).map_err(|err| err.to_string())?;
        if event.files.len() > MAX_GENERATED_ATTACHMENTS {
            return Err(format!(
                "at most {MAX_GENERATED_ATTACHMENTS} files per message"
            ));
        }
        for file in &event.files {
            if !file.path.starts_with('/') || file.path.len() > 1024 || file.path.contains("..") {
                return Err("files[].path must be an absolute workspace path".to_owned());
            }
            if file.filename.is_empty() || file.filename.chars().count() > 255 {
                return Err("files[].filename must be 1 to 255 characters".to_owned());
            }
            if file.icon_type.is_empty()
                || file.icon_type.len() > 32
                || !file
                    .icon_type
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-')
            {
                return Err("files[].icon_type must be a short word such as pdf".to_owned());
            }
            if !matches!(file.source.as_str(), "generated" | "upload") {
                return Err("files[].source must be generated or upload".to_owned());
            }
            if let Some(url) = &file.content_url
                && parse_file_url(url).is_err()
            {
                return Err("files[].content_url must be an s3:// URL".to_owned());
            }
        }
        Ok(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(bucket: &str, path: &str, token: Option<&str>) -> Result<FileRef, FileRefError> {
        Ok(FileRef {
            bucket: bucket.to_owned(),
            path: path.to_owned(),
            token: token.map(str::to_owned),
        })
    }

    #[test]
    fn the_seed_supabase_url_parses_into_bucket_path_and_token() {
        let url = "https://xxx.supabase.co/storage/v1/object/sign/agent-files/agent-inputs/u/t/r/img.jpg?token=xxx";
        assert_eq!(
            parse_file_url(url),
            file("agent-files", "agent-inputs/u/t/r/img.jpg", Some("xxx"))
        );
    }

    #[test]
    fn a_content_url_parses_into_bucket_and_key() {
        let url = "s3://bucket/uploads/user123/file456/bao-cao.pdf";
        assert_eq!(
            parse_file_url(url),
            file("bucket", "uploads/user123/file456/bao-cao.pdf", None)
        );
    }

    #[test]
    fn a_path_style_presigned_url_parses_and_decodes_its_key() {
        let url = "http://127.0.0.1:59000/switchboard/uploads/a%20b.png?X-Amz-Signature=abc";
        assert_eq!(
            parse_file_url(url),
            file("switchboard", "uploads/a b.png", None)
        );
    }

    #[test]
    fn traversal_other_schemes_and_missing_parts_are_refused() {
        for url in [
            "s3://bucket/uploads/%2E%2E/secret",
            "s3://bucket",
            "file:///etc/passwd",
            "https://x.supabase.co/storage/v1/object/sign/agent-files/a.png",
            "not a url",
            // Found by the file_url fuzz target: decoding brought back what the syntax hid.
            "s3://b/k%00ey",
            "s3://b/a%0Ab",
            "https://h/a%2F../x",
        ] {
            assert!(parse_file_url(url).is_err(), "{url}");
        }
        assert_eq!(
            parse_file_url(&format!("s3://b/{}", "k".repeat(3000))),
            Err(FileRefError::TooLong)
        );
    }

    #[test]
    fn a_generated_file_is_shown_as_the_seed_shows_report_md() {
        let url = "s3://b/generated/o/i/report.md".to_owned();
        let file = GeneratedFile::generated("report.md", "text/plain", url.clone());
        let value = serde_json::to_value(&file).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"path": "/report.md", "filename": "report.md", "icon_type": "md",
                               "source": "generated", "content_url": url})
        );
        let icons: Vec<String> = [
            ("data.csv", "text/csv"),
            ("notes.txt", "text/plain"),
            ("chart.png", "image/png"),
            ("x.md", "application/pdf"),
        ]
        .iter()
        .map(|(name, mime)| GeneratedFile::generated(name, mime, url.clone()).icon_type)
        .collect();
        assert_eq!(icons, ["csv", "txt", "image", "pdf"]);
        let event = serde_json::json!({"messageId": "m", "files": [value]});
        assert!(GeneratedAttachments::parse_event(&event).is_ok());
    }
}
