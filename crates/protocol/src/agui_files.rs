//! File parts of AG-UI messages as a thread's history keeps them (the `s3://` content URLs a
//! run was admitted with), and their rewrite to links a client or an agent can fetch: used by
//! the worker (the conversation it sends a remote agent) and by history (a thread's snapshot for
//! a client joining it).

use serde_json::{Value, json};

/// A file part of a user message: where it is and its `s3://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRef {
    /// Index of the message.
    pub message: usize,
    /// Index of the part in the message's `content`.
    pub block: usize,
    /// Its `s3://` content URL.
    pub url: String,
}

/// The `s3://` file parts of the user messages of `messages`, in order.
pub fn file_refs(messages: &[Value]) -> Vec<FileRef> {
    let mut refs = Vec::new();
    for (m, message) in messages.iter().enumerate() {
        if message.get("role").and_then(Value::as_str) != Some("user") {
            continue;
        }
        let Some(Value::Array(blocks)) = message.get("content") else {
            continue;
        };
        for (b, block) in blocks.iter().enumerate() {
            if let Some(url) = file_url(block).filter(|u| u.starts_with("s3://")) {
                refs.push(FileRef {
                    message: m,
                    block: b,
                    url: url.to_owned(),
                });
            }
        }
    }
    refs
}

/// Replaces each of `refs` with its `signed` link as an AG-UI 1.0 part ([`with_url`]), or, for a
/// file gone (`None`), with a text part saying so ([`gone`]).
pub fn replace_files(messages: &mut [Value], refs: &[FileRef], signed: Vec<Option<String>>) {
    for (r, url) in refs.iter().zip(signed) {
        let block = &messages[r.message]["content"][r.block];
        let replacement = match url {
            Some(url) => with_url(block, &url),
            None => gone(block),
        };
        messages[r.message]["content"][r.block] = replacement;
    }
}

/// The URL of a file block: `binary`'s `url`, or an AG-UI 1.0 part's URL source.
pub fn file_url(block: &Value) -> Option<&str> {
    match block.get("type").and_then(Value::as_str)? {
        "binary" => block.get("url").and_then(Value::as_str),
        "image" | "document" | "audio" | "video" => {
            let source = block.get("source")?;
            (source.get("type").and_then(Value::as_str) == Some("url"))
                .then(|| source.get("value").and_then(Value::as_str))
                .flatten()
        }
        _ => None,
    }
}

/// `block` with its file URL replaced by `url`, as an AG-UI 1.0 part: a seed `binary` block
/// becomes an `image` (or `audio`, `video`) or `document` part whose source is the URL (what the
/// AG-UI SDKs' 1.0 models take; LangGraph's adapter refuses `binary`), the file name kept in
/// `metadata.filename`. The same block becomes the same part in every run of the thread.
pub fn with_url(block: &Value, url: &str) -> Value {
    if block.get("type").and_then(Value::as_str) != Some("binary") {
        let mut block = block.clone();
        block["source"]["value"] = json!(url);
        return block;
    }
    let mime = block
        .get("mimeType")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind = match mime.split('/').next() {
        Some("image") => "image",
        Some("audio") => "audio",
        Some("video") => "video",
        _ => "document",
    };
    let mut part = json!({"type": kind, "source": {"type": "url", "value": url}});
    if !mime.is_empty() {
        part["source"]["mimeType"] = json!(mime);
    }
    if let Some(name) = block.get("filename").and_then(Value::as_str) {
        part["metadata"] = json!({"filename": name});
    }
    part
}

/// A text part standing for a file that is no longer available.
pub fn gone(block: &Value) -> Value {
    let name = block
        .get("filename")
        .or_else(|| block.pointer("/metadata/filename"))
        .and_then(Value::as_str)
        .unwrap_or("a file");
    json!({"type": "text", "text": format!("[Attachment {name}: no longer available]")})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_blocks_are_found_and_rewritten_in_both_shapes() {
        let binary = json!({"type": "binary", "mimeType": "image/png", "url": "s3://b/u/a.png", "filename": "a.png"});
        let document = json!({"type": "document", "source": {"type": "url", "value": "s3://b/u/r.pdf", "mimeType": "application/pdf"}});
        let data = json!({"type": "image", "source": {"type": "data", "value": "AAAA"}});
        assert_eq!(file_url(&binary), Some("s3://b/u/a.png"));
        assert_eq!(file_url(&document), Some("s3://b/u/r.pdf"));
        assert_eq!(file_url(&data), None);
        assert_eq!(file_url(&json!({"type": "text", "text": "s3://x"})), None);
        assert_eq!(
            with_url(&binary, "https://l"),
            json!({"type": "image", "source": {"type": "url", "value": "https://l", "mimeType": "image/png"},
                   "metadata": {"filename": "a.png"}})
        );
        let pdf = json!({"type": "binary", "mimeType": "application/pdf", "url": "s3://b/u/r.pdf"});
        assert_eq!(with_url(&pdf, "https://l")["type"], "document");
        assert_eq!(
            with_url(&document, "https://l")["source"]["value"],
            "https://l"
        );
        assert_eq!(
            gone(&binary),
            json!({"type": "text", "text": "[Attachment a.png: no longer available]"})
        );
    }

    #[test]
    fn only_the_s3_files_of_user_messages_are_referenced_and_replaced() {
        let mut messages = vec![
            json!({"role": "user", "content": [
                {"type": "text", "text": "two files"},
                {"type": "image", "source": {"type": "url", "value": "s3://b/u/a.png", "mimeType": "image/png"}},
                {"type": "document", "source": {"type": "url", "value": "https://elsewhere/r.pdf"}},
                {"type": "binary", "mimeType": "application/pdf", "url": "s3://b/u/gone.pdf", "filename": "gone.pdf"}
            ]}),
            json!({"role": "assistant", "content": "s3://b/u/not-a-part"}),
        ];
        let refs = file_refs(&messages);
        assert_eq!(
            refs.iter()
                .map(|r| (r.message, r.block))
                .collect::<Vec<_>>(),
            [(0, 1), (0, 3)]
        );
        replace_files(
            &mut messages,
            &refs,
            vec![Some("https://l/a".to_owned()), None],
        );
        assert_eq!(messages[0]["content"][1]["source"]["value"], "https://l/a");
        assert_eq!(
            messages[0]["content"][3],
            json!({"type": "text", "text": "[Attachment gone.pdf: no longer available]"})
        );
        assert_eq!(
            messages[0]["content"][2]["source"]["value"],
            "https://elsewhere/r.pdf"
        );
    }
}
