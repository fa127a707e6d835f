//! Attachment admission: every file a user message points at must resolve, through the
//! attachments service over NATS, to a verified file the caller owns.
//!
//! Admitted URLs are rewritten to the internal `s3://bucket/path` form (signed URLs expire; the
//! task and the history keep the storage location and re-sign on read), and the message's
//! `metadata.user_message_attachments` is built from what the attachments service answered.

use std::time::Duration;

use futures::future::join_all;
use protocol::files::{
    MAX_FILES_PER_MESSAGE, ResolveOutcome, ResolveReply, ResolveRequest, ResolvedFile,
};
use protocol::metadata::AttachedFile;
use protocol::run_input::{ContentBlock, Message, RunAgentInput, UserContent};
use protocol::validate::messages;
use serde_json::Value;

/// Why a run's attachments were not admitted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AdmitError {
    /// A block cannot be used (422), naming the block's field.
    #[error("{message} ({field})")]
    Refused {
        /// JSON pointer of the offending URL.
        field: String,
        /// Safe, precise reason.
        message: String,
    },
    /// The attachments service did not answer (503).
    #[error("attachments service unavailable: {0:#}")]
    Unavailable(anyhow::Error),
}

/// Asks the attachments service about every file of a run.
pub(crate) struct Admission {
    client: async_nats::Client,
    subject: String,
    timeout: Duration,
}

/// Where a file reference sits in the user message.
struct Slot {
    index: usize,
    url: String,
    /// Field of the URL, relative to the block.
    url_field: &'static str,
    /// What the verified file must be (`image/`: binary and image blocks; `audio/`: audio
    /// blocks; `None`: a document, any allowed type).
    kind: Option<&'static str>,
}

impl Admission {
    pub(crate) fn new(client: async_nats::Client, subject: String, timeout: Duration) -> Self {
        Self {
            client,
            subject,
            timeout,
        }
    }

    /// Resolves every file of the (last) user message, rewrites their URLs to `s3://bucket/path`
    /// and returns their storage metadata, in block order.
    #[tracing::instrument(
        name = "runs.accept.admit",
        skip_all,
        fields(thread.id = %input.thread_id, run.id = %input.run_id)
    )]
    pub(crate) async fn admit(
        &self,
        owner: &str,
        input: &mut RunAgentInput,
    ) -> Result<Vec<AttachedFile>, AdmitError> {
        // The new user message: the only one on `/api/v1/agent/runs`, the last one in a
        // conversation resent by an AG-UI client.
        let Some(at) = input
            .messages
            .iter()
            .rposition(|m| matches!(m, Message::User(_)))
        else {
            return Ok(Vec::new());
        };
        let Some(Message::User(user)) = input.messages.get_mut(at) else {
            return Ok(Vec::new());
        };
        let UserContent::Blocks(blocks) = &mut user.content else {
            return Ok(Vec::new());
        };
        let slots: Vec<Slot> = blocks
            .iter()
            .enumerate()
            .filter_map(|(index, block)| slot(index, block))
            .collect();
        if slots.len() > MAX_FILES_PER_MESSAGE {
            return Err(AdmitError::Refused {
                field: format!("/messages/{at}/content"),
                message: format!("a message may carry at most {MAX_FILES_PER_MESSAGE} files"),
            });
        }
        let session = input.thread_id.clone();
        let answers = join_all(
            slots
                .iter()
                .map(|slot| self.resolve(owner, &slot.url, &session)),
        )
        .await;
        let mut admitted = Vec::with_capacity(slots.len());
        for (slot, answer) in slots.iter().zip(answers) {
            let field = format!("/messages/{at}/content/{}{}", slot.index, slot.url_field);
            let file = match answer? {
                ResolveOutcome::Resolved(file) => file,
                ResolveOutcome::Refused { reason } => {
                    return Err(AdmitError::Refused {
                        field,
                        message: reason.message().to_owned(),
                    });
                }
            };
            match slot.kind {
                Some(kind) if !file.mime_type.starts_with(kind) => {
                    return Err(AdmitError::Refused {
                        field: format!("/messages/{at}/content/{}/mimeType", slot.index),
                        message: if kind == "audio/" {
                            format!(
                                "audio content requires an audio file, not {}",
                                file.mime_type
                            )
                        } else {
                            messages::BINARY_IMAGE_MIME.to_owned()
                        },
                    });
                }
                _ => {}
            }
            rewrite(&mut blocks[slot.index], &file);
            admitted.push(AttachedFile {
                bucket: file.bucket,
                path: file.path,
                mime_type: file.mime_type,
                file_name: Some(file.file_name),
                size_bytes: Some(file.size_bytes),
            });
        }
        Ok(admitted)
    }

    /// Resolves one URL; a file that resolves joins the workspace of `session`.
    async fn resolve(
        &self,
        owner: &str,
        url: &str,
        session: &str,
    ) -> Result<ResolveOutcome, AdmitError> {
        let request = ResolveRequest::V1 {
            owner: owner.to_owned(),
            url: url.to_owned(),
            session_id: Some(session.to_owned()),
        };
        let payload =
            serde_json::to_vec(&request).map_err(|e| AdmitError::Unavailable(e.into()))?;
        let answer = platform::rpc::request(
            &self.client,
            self.subject.clone(),
            payload.into(),
            self.timeout,
        )
        .await
        .map_err(|e| AdmitError::Unavailable(e.into()))?;
        match serde_json::from_slice::<ResolveReply>(&answer.payload) {
            Ok(ResolveReply::V1(outcome)) => Ok(outcome),
            Err(err) => Err(AdmitError::Unavailable(anyhow::anyhow!(
                "undecodable resolve reply: {err}"
            ))),
        }
    }
}

fn slot(index: usize, block: &ContentBlock) -> Option<Slot> {
    match block {
        ContentBlock::Binary(binary) => Some(Slot {
            index,
            url: binary.url.clone().unwrap_or_default(),
            url_field: "/url",
            kind: Some("image/"),
        }),
        ContentBlock::Image(part) | ContentBlock::Document(part) | ContentBlock::Audio(part) => {
            Some(Slot {
                index,
                url: part
                    .source
                    .get("value")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                url_field: "/source/value",
                kind: match block {
                    ContentBlock::Image(_) => Some("image/"),
                    ContentBlock::Audio(_) => Some("audio/"),
                    _ => None,
                },
            })
        }
        ContentBlock::Text(_) => None,
    }
}

fn rewrite(block: &mut ContentBlock, file: &ResolvedFile) {
    let internal = format!("s3://{}/{}", file.bucket, file.path);
    match block {
        ContentBlock::Binary(binary) => {
            binary.url = Some(internal);
            binary.mime_type = Some(file.mime_type.clone());
        }
        ContentBlock::Image(part) | ContentBlock::Document(part) | ContentBlock::Audio(part) => {
            if let Some(source) = part.source.as_object_mut() {
                source.insert("value".to_owned(), Value::String(internal));
                source.insert("mimeType".to_owned(), Value::String(file.mime_type.clone()));
            }
        }
        ContentBlock::Text(_) => {}
    }
}
