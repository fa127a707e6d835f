//! Agents that declare what they accept and produce, in the terms of `message_body`.
//!
//! Every agent backend has an [`AgentCard`]: a name, a description, and two
//! [`MessageBodySchema`]s. The worker registers the cards of the agents it runs in the
//! `<PREFIX>_AGENTS` KV bucket; the runs service lists them (`GET /api/v1/agents`), picks a run's
//! agent (`forwardedProps.agent`, else the default card), and refuses a new user message that
//! does not fit the agent's input schema. The worker checks what the agent produced against its
//! output schema before the run finishes.
//!
//! The two bodies are built the same way on every transport:
//! - **input** ([`input_body`]): each text block of the new user message is an unnamed
//!   `text/plain` part (a string content is one such part); each admitted file is a part named
//!   `/attachments/<file name>` with its verified MIME type and `s3://` URL;
//! - **output** ([`OutputCollector`]): each text message the agent streamed is an unnamed
//!   `text/markdown` part; each tool call is `/tool_calls/<id>` (`application/json`, the name and
//!   the arguments); each file the agent made is `/files/<file name>` with its `s3://` URL.
//!
//! File names and ids become path segments: characters outside `A-Z a-z 0-9 . - _` are replaced
//! by `_`, a leading dot too, and a repeated name gets `-2`, `-3`, ... before its extension.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::agui::Event;
use crate::files::ATTACHMENTS_EVENT;
use crate::message_body::{MessageBody, MessageBodyError, MessageBodySchema, Part};
use crate::metadata::AttachedFile;
use crate::run_input::{ContentBlock, Message, RunAgentInput, UserContent};

/// The `forwardedProps` field naming the agent a run is for.
pub const AGENT_PROP: &str = "agent";
/// Longest agent name.
pub const MAX_AGENT_NAME_CHARS: usize = 64;
/// Content type of the user's text in an input body.
pub const INPUT_TEXT_TYPE: &str = "text/plain";
/// Content type of the agent's text in an output body.
pub const OUTPUT_TEXT_TYPE: &str = "text/markdown";

/// What an agent is and what it takes and gives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCard {
    /// Unique name, `[a-z0-9-]`, at most [`MAX_AGENT_NAME_CHARS`].
    pub name: String,
    /// What it does, for people.
    pub description: String,
    /// The messages it accepts (the new user message, as [`input_body`] builds it).
    pub input_schema: MessageBodySchema,
    /// The messages it promises to produce (as [`OutputCollector`] builds them).
    pub output_schema: MessageBodySchema,
    /// Whether runs that name no agent go to this one.
    #[serde(default)]
    pub default: bool,
}

/// KV key of an agent's card.
pub fn agent_key(name: &str) -> String {
    format!("agent.{name}")
}

/// Whether `name` can name an agent: 1 to [`MAX_AGENT_NAME_CHARS`] of `a-z 0-9 -`.
pub fn valid_agent_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_AGENT_NAME_CHARS
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The agent a run asks for in `forwardedProps.agent`: `Ok(None)` when it names none,
/// `Err(message)` when the field is not a valid agent name.
pub fn requested_agent(input: &RunAgentInput) -> Result<Option<&str>, String> {
    match input
        .forwarded_props
        .as_ref()
        .and_then(|props| props.get(AGENT_PROP))
    {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(name)) if valid_agent_name(name) => Ok(Some(name)),
        Some(_) => Err(format!(
            "forwardedProps.agent must be an agent name (1 to {MAX_AGENT_NAME_CHARS} characters of a-z, 0-9 and -)"
        )),
    }
}

/// A file name or id as one path segment (see the module doc).
pub fn path_segment(raw: &str) -> String {
    let mut segment: String = raw
        .chars()
        .take(200)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if segment.is_empty() {
        segment.push('_');
    }
    if segment.starts_with('.') {
        segment.replace_range(0..1, "_");
    }
    segment
}

/// Names parts under a folder, each once.
#[derive(Debug, Default)]
struct Namer {
    used: HashSet<String>,
}

impl Namer {
    fn name(&mut self, folder: &str, raw: &str) -> String {
        let segment = path_segment(raw);
        let (stem, extension) = match segment.rsplit_once('.') {
            Some((stem, extension)) if !stem.is_empty() => {
                (stem.to_owned(), format!(".{extension}"))
            }
            _ => (segment.clone(), String::new()),
        };
        let mut name = format!("{folder}/{segment}");
        let mut n = 1;
        while !self.used.insert(name.clone()) {
            n += 1;
            name = format!("{folder}/{stem}-{n}{extension}");
        }
        name
    }
}

/// The new user message of `input` as a [`MessageBody`], with each part's JSON pointer in the
/// input (so a refusal names the block). `files` are the admitted files in block order, as
/// admission returned them; file blocks already carry their `s3://` URL.
pub fn input_body(
    input: &RunAgentInput,
    files: &[AttachedFile],
) -> Result<(MessageBody, Vec<String>), MessageBodyError> {
    let Some((at, user)) = input
        .messages
        .iter()
        .enumerate()
        .rev()
        .find_map(|(at, m)| match m {
            Message::User(user) => Some((at, user)),
            _ => None,
        })
    else {
        return Ok((MessageBody::new(Vec::new())?, Vec::new()));
    };
    let mut parts = Vec::new();
    let mut fields = Vec::new();
    let mut files = files.iter();
    let mut namer = Namer::default();
    match &user.content {
        UserContent::Text(text) => {
            let part = Part::inline(None, INPUT_TEXT_TYPE, text.clone())
                .map_err(|error| MessageBodyError::Part { index: 0, error })?;
            parts.push(part);
            fields.push(format!("/messages/{at}/content"));
        }
        UserContent::Blocks(blocks) => {
            for (index, block) in blocks.iter().enumerate() {
                let part = match block {
                    ContentBlock::Text(text) => {
                        Part::inline(None, INPUT_TEXT_TYPE, text.text.clone())
                    }
                    ContentBlock::Binary(_)
                    | ContentBlock::Image(_)
                    | ContentBlock::Document(_)
                    | ContentBlock::Audio(_) => {
                        let Some(file) = files.next() else {
                            continue; // not admitted: nothing the agent would get
                        };
                        Part::remote(
                            Some(namer.name("/attachments", file.name())),
                            file.mime_type.clone(),
                            file.content_url(),
                        )
                    }
                };
                let part = part.map_err(|error| MessageBodyError::Part {
                    index: parts.len(),
                    error,
                })?;
                parts.push(part);
                fields.push(format!("/messages/{at}/content/{index}"));
            }
        }
    }
    Ok((MessageBody::new(parts)?, fields))
}

/// Builds the output body of a run from the events its agent emits (see the module doc).
#[derive(Debug, Default)]
pub struct OutputCollector {
    /// Text messages in start order: (message id, text).
    texts: Vec<(String, String)>,
    /// Tool calls in start order: (id, name, arguments).
    tool_calls: Vec<(String, String, String)>,
    /// Files: (file name, content type, URL), by `content_url` once.
    files: Vec<(String, String, String)>,
}

impl OutputCollector {
    /// Takes in one event the agent emitted.
    pub fn observe(&mut self, event: &Event) {
        match event {
            Event::TextMessageStart { message_id, .. }
                if !self.texts.iter().any(|(id, _)| id == message_id) =>
            {
                self.texts.push((message_id.clone(), String::new()));
            }
            Event::TextMessageContent { message_id, delta } => {
                match self.texts.iter_mut().find(|(id, _)| id == message_id) {
                    Some((_, text)) => text.push_str(delta),
                    None => self.texts.push((message_id.clone(), delta.clone())),
                }
            }
            Event::ToolCallStart {
                tool_call_id,
                tool_call_name,
                ..
            } => {
                self.tool_calls
                    .push((tool_call_id.clone(), tool_call_name.clone(), String::new()))
            }
            Event::ToolCallArgs {
                tool_call_id,
                delta,
            } => {
                if let Some((_, _, args)) = self
                    .tool_calls
                    .iter_mut()
                    .find(|(id, ..)| id == tool_call_id)
                {
                    args.push_str(delta);
                }
            }
            Event::Custom { name, value } if name == ATTACHMENTS_EVENT => {
                let files = value.get("files").and_then(Value::as_array);
                for file in files.into_iter().flatten() {
                    let text = |key: &str| file.get(key).and_then(Value::as_str);
                    let (Some(file_name), Some(url)) = (text("filename"), text("content_url"))
                    else {
                        continue;
                    };
                    if self.files.iter().any(|(_, _, known)| known == url) {
                        continue;
                    }
                    let content_type = text("content_type").unwrap_or("application/octet-stream");
                    self.files.push((
                        file_name.to_owned(),
                        content_type.to_owned(),
                        url.to_owned(),
                    ));
                }
            }
            _ => {}
        }
    }

    /// The body so far.
    pub fn body(&self) -> Result<MessageBody, MessageBodyError> {
        let mut parts = Vec::new();
        let mut namer = Namer::default();
        let invalid = |index: usize, error| MessageBodyError::Part { index, error };
        for (_, text) in &self.texts {
            let part = Part::inline(None, OUTPUT_TEXT_TYPE, text.clone());
            parts.push(part.map_err(|e| invalid(parts.len(), e))?);
        }
        for (id, name, arguments) in &self.tool_calls {
            let arguments = serde_json::from_str::<Value>(arguments)
                .unwrap_or_else(|_| Value::String(arguments.clone()));
            let content = serde_json::json!({"name": name, "arguments": arguments}).to_string();
            let part = Part::inline(
                Some(namer.name("/tool_calls", id)),
                "application/json",
                content,
            );
            parts.push(part.map_err(|e| invalid(parts.len(), e))?);
        }
        for (file_name, content_type, url) in &self.files {
            let part = Part::remote(
                Some(namer.name("/files", file_name)),
                content_type.clone(),
                url.clone(),
            );
            parts.push(part.map_err(|e| invalid(parts.len(), e))?);
        }
        MessageBody::new(parts)
    }
}

/// A stored message, as history returns it in the `MessageBody` form: the same parts a run's
/// input or output had (see the module doc).
#[derive(Debug, Default)]
pub struct StoredMessage<'a> {
    /// `user`, `assistant` or `tool`.
    pub role: &'a str,
    /// Its text.
    pub text: &'a str,
    /// A user message's files: (file name, MIME type, URL).
    pub files: Vec<(String, String, String)>,
    /// An assistant message's tool calls: (id, name, arguments as streamed).
    pub tool_calls: Vec<(String, String, String)>,
    /// Files the agent made: (file name, content type, URL).
    pub generated: Vec<(String, String, String)>,
}

impl StoredMessage<'_> {
    /// The message as a [`MessageBody`]: text first (`text/plain` for the user and tool
    /// results, `text/markdown` for the agent; none when empty), then `/attachments/*`,
    /// `/tool_calls/*` and `/files/*`.
    pub fn body(&self) -> Result<MessageBody, MessageBodyError> {
        let mut parts = Vec::new();
        let mut namer = Namer::default();
        let invalid = |index: usize, error| MessageBodyError::Part { index, error };
        if !self.text.is_empty() {
            let kind = if self.role == "assistant" {
                OUTPUT_TEXT_TYPE
            } else {
                INPUT_TEXT_TYPE
            };
            parts.push(Part::inline(None, kind, self.text).map_err(|e| invalid(0, e))?);
        }
        let named = [("/attachments", &self.files), ("/files", &self.generated)];
        for (id, name, arguments) in &self.tool_calls {
            let arguments = serde_json::from_str::<Value>(arguments)
                .unwrap_or_else(|_| Value::String(arguments.clone()));
            let content = serde_json::json!({"name": name, "arguments": arguments}).to_string();
            let part = Part::inline(
                Some(namer.name("/tool_calls", id)),
                "application/json",
                content,
            );
            parts.push(part.map_err(|e| invalid(parts.len(), e))?);
        }
        for (folder, files) in named {
            for (file_name, content_type, url) in files {
                let part = Part::remote(
                    Some(namer.name(folder, file_name)),
                    content_type.clone(),
                    url.clone(),
                );
                parts.push(part.map_err(|e| invalid(parts.len(), e))?);
            }
        }
        MessageBody::new(parts)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema(value: Value) -> MessageBodySchema {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_user_message_becomes_text_parts_and_named_attachments_in_block_order() {
        let input: RunAgentInput = serde_json::from_value(json!({
            "threadId": "t", "runId": "r", "state": {}, "tools": [], "context": [],
            "forwardedProps": {"agent": "echo"},
            "messages": [{"id": "u", "role": "user", "content": [
                {"type": "text", "text": "look"},
                {"type": "binary", "mimeType": "image/png", "url": "s3://b/k/a b.png"},
                {"type": "document", "source": {"type": "url", "value": "s3://b/k/a b.png"}}
            ]}]
        }))
        .unwrap();
        let file = |path: &str, mime: &str| AttachedFile {
            bucket: "b".into(),
            path: path.into(),
            mime_type: mime.into(),
            file_name: Some("a b.png".into()),
            size_bytes: Some(3),
        };
        let files = [
            file("k/a b.png", "image/png"),
            file("k/a b.png", "image/png"),
        ];
        let (body, fields) = input_body(&input, &files).unwrap();
        let parts: Vec<_> = body
            .parts()
            .iter()
            .map(|p| (p.name(), p.content_type(), p.content(), p.content_url()))
            .collect();
        assert_eq!(
            parts,
            [
                (None, "text/plain", Some("look"), None),
                (
                    Some("/attachments/a_b.png"),
                    "image/png",
                    None,
                    Some("s3://b/k/a b.png")
                ),
                (
                    Some("/attachments/a_b-2.png"),
                    "image/png",
                    None,
                    Some("s3://b/k/a b.png")
                ),
            ]
        );
        assert_eq!(
            fields,
            [
                "/messages/0/content/0",
                "/messages/0/content/1",
                "/messages/0/content/2"
            ]
        );
        assert_eq!(requested_agent(&input), Ok(Some("echo")));
        let text_only = schema(json!({"parts": [{"contentType": "text/plain", "required": true}]}));
        let refused = text_only.check(&body).unwrap_err();
        assert_eq!(refused.len(), 2, "{refused:?}");
    }

    #[test]
    fn what_an_agent_streams_becomes_its_output_body() {
        let mut out = OutputCollector::default();
        for event in [
            json!({"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"}),
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "Here "}),
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "it is."}),
            json!({"type": "TOOL_CALL_START", "toolCallId": "c:1", "toolCallName": "lookup"}),
            json!({"type": "TOOL_CALL_ARGS", "toolCallId": "c:1", "delta": "{\"q\":"}),
            json!({"type": "TOOL_CALL_ARGS", "toolCallId": "c:1", "delta": "1}"}),
            json!({"type": "CUSTOM", "name": "attachments", "value": {"messageId": "m1", "files": [
                {"path": "/report.md", "filename": "report.md", "icon_type": "md", "source": "generated",
                 "content_url": "s3://b/generated/report.md"}]}}),
        ] {
            out.observe(&serde_json::from_value(event).unwrap());
        }
        let body = serde_json::to_value(out.body().unwrap()).unwrap();
        assert_eq!(
            body,
            json!({"parts": [
                {"contentType": "text/markdown", "content": "Here it is."},
                {"name": "/tool_calls/c_1", "contentType": "application/json",
                 "content": "{\"name\":\"lookup\",\"arguments\":{\"q\":1}}"},
                {"name": "/files/report.md", "contentType": "application/octet-stream",
                 "contentUrl": "s3://b/generated/report.md"}
            ]})
        );
    }

    #[test]
    fn agent_names_are_checked() {
        assert!(valid_agent_name("echo-text"));
        for bad in ["", "Echo", "echo text", &"a".repeat(65)] {
            assert!(!valid_agent_name(bad), "{bad:?}");
        }
        assert_eq!(path_segment(".env"), "_env");
        assert_eq!(path_segment("résumé.pdf"), "r_sum_.pdf");
    }
}
