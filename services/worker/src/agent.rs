//! Agent backends. The built-in [`EchoAgent`] is deterministic: tests and the quick start use it.

use std::time::Duration;

use futures::future::BoxFuture;
use protocol::agents::AgentCard;
use protocol::agui::Event;
use protocol::interaction::{DEFAULT_PROMPT_ERROR, InputType, Prompt, PromptOption, PromptOutcome};
use protocol::message_body::MessageBodySchema;
use protocol::messaging::RunTaskV1;
use protocol::run_input::Message;
use protocol::tools::build_tools_prompt;
use protocol::ui_schema::{UI_HINTS_EVENT, UiHints, UiHintsEvent, UiStatus};
use serde_json::json;
use tracing::Instrument as _;

use crate::attachments::AttachmentContent;
use crate::sink::EventSink;

/// What the worker gives an agent: the task, the prompt it built for it, and the content of
/// the user message's files.
pub struct ModelInput<'a> {
    /// The accepted task.
    pub task: &'a RunTaskV1,
    /// System prompt: the tools block of `build_tools_prompt` (empty without tools).
    pub system_prompt: String,
    /// The user message's files (`task.attachments`, at most 3), read and extracted, or why
    /// they could not be.
    pub attachments: Vec<AttachmentContent>,
    /// Where the task is in the RUNS stream (what history's read-your-writes answers wait for).
    pub runs_seq: u64,
}

/// A run an agent ended on purpose with a code and a message safe to show (a remote agent that
/// misbehaved, say): the run ends `RUN_ERROR` with them, not the generic `agent_error`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code}: {message}")]
pub struct AgentFailure {
    /// The `RUN_ERROR` code.
    pub code: &'static str,
    /// The `RUN_ERROR` message.
    pub message: String,
}

impl<'a> ModelInput<'a> {
    /// Builds the model input of `task`.
    pub fn new(task: &'a RunTaskV1) -> Self {
        let tools = task.input.tools.as_deref().unwrap_or_default();
        Self {
            task,
            system_prompt: build_tools_prompt(tools),
            attachments: Vec::new(),
            runs_seq: 0,
        }
    }

    /// The same input, its task at `runs_seq` in the RUNS stream.
    #[must_use]
    pub fn at_runs_seq(mut self, runs_seq: u64) -> Self {
        self.runs_seq = runs_seq;
        self
    }

    /// The same input with the content of the user message's files.
    #[must_use]
    pub fn with_attachments(mut self, attachments: Vec<AttachmentContent>) -> Self {
        self.attachments = attachments;
        self
    }

    /// The attachments as OpenAI content parts for the user message: a text part per file
    /// (its text, or a header naming it, or why it is missing), followed by an `image_url`
    /// part (a `data:` URL) for an image.
    pub fn attachment_parts(&self) -> Vec<serde_json::Value> {
        let mut parts = Vec::with_capacity(self.attachments.len() * 2);
        for attachment in &self.attachments {
            let name = attachment.file.name();
            match &attachment.content {
                Ok(extracted) => {
                    parts.push(serde_json::json!({
                        "type": "text",
                        "text": extract::as_prompt_text(name, extracted),
                    }));
                    if let Some(url) = extracted.data_url() {
                        parts.push(serde_json::json!({
                            "type": "image_url",
                            "image_url": {"url": url},
                        }));
                    }
                }
                Err(reason) => {
                    let missing = extract::Extracted::Unsupported {
                        reason: reason.clone(),
                    };
                    parts.push(serde_json::json!({
                        "type": "text",
                        "text": extract::as_prompt_text(name, &missing),
                    }));
                }
            }
        }
        parts
    }

    /// One line per attachment saying what the agent received (the built-in agent's answer).
    pub fn describe_attachments(&self) -> Vec<String> {
        self.attachments.iter().map(describe).collect()
    }

    /// The text of the user's new message (the last user message of the input).
    pub fn user_text(&self) -> String {
        self.task
            .input
            .messages
            .iter()
            .rev()
            .find_map(|m| match m {
                Message::User(user) => Some(user.content.text()),
                _ => None,
            })
            .unwrap_or_default()
    }
}

/// An agent backend: turns a task into events on `sink`. Emits no terminal event itself; the
/// worker ends the run with `RUN_FINISHED` or `RUN_ERROR` from the result. Waits through
/// [`EventSink::pause`] so a cancel stops it promptly. Declares what it accepts and produces
/// ([`AgentCard`]); the worker checks its output against it before the run finishes.
pub trait Agent: Send + Sync + 'static {
    /// Its name, description and schemas (`default` is set by the worker).
    fn card(&self) -> anyhow::Result<AgentCard>;

    /// Whether it needs the user's files read and extracted before it runs (an agent given
    /// links to them does not).
    fn reads_attachments(&self) -> bool {
        true
    }

    /// Runs the agent, publishing its events.
    fn run<'a>(
        &'a self,
        input: &'a ModelInput<'a>,
        sink: &'a mut EventSink,
    ) -> BoxFuture<'a, anyhow::Result<()>>;
}

/// Deterministic agent. It answers `You said: <text>`, streamed word by word, except:
/// - `/tools` answers with the system prompt the worker built (the tools block);
/// - `/slow <text>` streams the same echo with a 200 ms pause between words (for cancel tests);
/// - `/fail` fails, so the run ends with `RUN_ERROR`;
/// - `/silent` says nothing, breaking its own output schema (a reply is required), so the
///   worker ends the run with `RUN_ERROR` `output_schema_violation`;
/// - `/ui <title>` echoes and attaches `ui_hints` (title, success badge, the echo as body);
/// - `/ask <input_type>[?][:<timeout secs>] <question>` asks the user (text, binary_choice,
///   radio, checkbox, dropdown; the seed's example options; `?`: not required, so it may be
///   skipped) and stops on the prompt; the run that continues answers `You answered:
///   <answer>`, `You skipped the question.`, or says the question timed out or was cancelled;
/// - `/meta <json object> <text>` echoes `<text>` and sets the object's fields (`stage` and
///   custom fields) on the reply's metadata;
/// - `/tool <name> <json arguments>` calls the tool: a client tool (one of the run's `tools`)
///   is called and the run ends, for the client to answer; any other name runs the built-in
///   backend tool, which returns its arguments, then a summary follows. Both the tool result
///   and the summary carry `ui_hints`;
/// - `/file <name> <text>` answers `Here is <name>.` and attaches a text file `<name>` holding
///   `<text>` (`text/csv` for `.csv`, else `text/plain`; a `.md` file shows the `md` icon),
///   registered inline ([`EventSink::attach`]);
/// - `/file-large <name> <KiB>` does the same with `<KiB>` KiB (1 to 102400) of repeated text,
///   which over 768 KiB goes through the presigned upload path.
///
/// A file the attachments service refuses (or cannot store) is reported in a second message,
/// `Could not attach <name>: <reason>`, and the run completes.
#[derive(Debug, Clone, Copy, Default)]
pub struct EchoAgent;

impl EchoAgent {
    /// The reply to a user text.
    pub fn reply(text: &str) -> String {
        format!("You said: {text}")
    }
}

/// A schema from its JSON form (the built-in agents' schemas are literals).
fn schema(value: serde_json::Value) -> anyhow::Result<MessageBodySchema> {
    Ok(serde_json::from_value(value)?)
}

/// The echo agent restricted to text: its input schema refuses files (for clients and tests
/// that need an agent whose schema says no).
#[derive(Debug, Clone, Copy, Default)]
pub struct TextOnlyEcho;

impl Agent for TextOnlyEcho {
    fn card(&self) -> anyhow::Result<AgentCard> {
        Ok(AgentCard {
            name: "echo-text".to_owned(),
            description: "The built-in echo agent for text only: refuses files.".to_owned(),
            input_schema: schema(
                json!({"parts": [{"contentType": "text/{plain,markdown}", "required": true}]}),
            )?,
            output_schema: schema(
                json!({"parts": [{"contentType": "text/markdown", "required": true}]}),
            )?,
            default: false,
        })
    }

    fn run<'a>(
        &'a self,
        input: &'a ModelInput<'a>,
        sink: &'a mut EventSink,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        EchoAgent.run(input, sink)
    }
}

impl Agent for EchoAgent {
    fn card(&self) -> anyhow::Result<AgentCard> {
        Ok(AgentCard {
            name: "echo".to_owned(),
            description:
                "The built-in deterministic agent: echoes, describes files, asks, calls tools."
                    .to_owned(),
            input_schema: schema(json!({"parts": [
                {"contentType": "text/{plain,markdown}"},
                {"name": "/attachments/*"}
            ]}))?,
            output_schema: schema(json!({"parts": [
                {"contentType": "text/markdown", "required": true},
                {"name": "/tool_calls/*", "contentType": "application/json"},
                {"name": "/files/*"}
            ]}))?,
            default: false,
        })
    }

    fn run<'a>(
        &'a self,
        input: &'a ModelInput<'a>,
        sink: &'a mut EventSink,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let text = input.user_text();
            let trimmed = text.trim();
            if trimmed == "/fail" {
                anyhow::bail!("asked to fail");
            }
            if trimmed == "/silent" {
                return Ok(());
            }
            let reply_id = format!("{}-reply", input.task.task_id);
            if let Some(resumed) = &input.task.resumed {
                let reply = match &resumed.outcome {
                    PromptOutcome::Resolved { payload } if is_skip(payload) => {
                        "You skipped the question.".to_owned()
                    }
                    PromptOutcome::Resolved { payload } => {
                        let answer = match payload {
                            serde_json::Value::String(s) => s.clone(),
                            other => other.to_string(),
                        };
                        format!("You answered: {answer}")
                    }
                    PromptOutcome::TimedOut => {
                        format!("No answer came in time to: {}", resumed.prompt.text)
                    }
                    PromptOutcome::Cancelled => "You cancelled the question.".to_owned(),
                };
                return stream_text(sink, &reply_id, &reply, None).await;
            }
            if let Some(spec) = trimmed.strip_prefix("/ask ") {
                let prompt = demo_prompt(spec)?;
                stream_text(sink, &reply_id, "I need your input.", None).await?;
                sink.ask(prompt);
                return Ok(());
            }
            if let Some(call) = trimmed.strip_prefix("/tool ") {
                return call_tool(input, sink, &reply_id, call).await;
            }
            if let Some(spec) = trimmed.strip_prefix("/file-large ") {
                let (name, bytes) = large_file(spec)?;
                return make_file(input, sink, &reply_id, name, bytes).await;
            }
            if let Some(spec) = trimmed.strip_prefix("/file ") {
                let (name, text) = spec.trim().split_once(' ').unwrap_or((spec.trim(), ""));
                let bytes = text.trim().as_bytes().to_vec();
                return make_file(input, sink, &reply_id, name, bytes).await;
            }
            if let Some(spec) = trimmed.strip_prefix("/meta ") {
                let mut fields =
                    serde_json::Deserializer::from_str(spec).into_iter::<serde_json::Value>();
                let metadata = match fields.next() {
                    Some(Ok(serde_json::Value::Object(metadata))) => metadata,
                    _ => anyhow::bail!("/meta needs a JSON object first"),
                };
                let rest = spec[fields.byte_offset()..].trim();
                stream_text(sink, &reply_id, &Self::reply(rest), None).await?;
                return sink.annotate(&reply_id, metadata).await;
            }
            let (reply, pause) = if trimmed == "/tools" {
                (input.system_prompt.clone(), None)
            } else if text.starts_with("/slow") {
                (Self::reply(&text), Some(Duration::from_millis(200)))
            } else if trimmed.starts_with('/') || input.attachments.is_empty() {
                (Self::reply(&text), None)
            } else {
                // A plain message with files: the echo, then what was received of each.
                let lines = input.describe_attachments().join("\n");
                (format!("{}\n\n{lines}", Self::reply(&text)), None)
            };
            stream_text(sink, &reply_id, &reply, pause).await?;
            if let Some(title) = trimmed.strip_prefix("/ui ") {
                let hints = UiHints {
                    title: Some(title.to_owned()),
                    status: Some(UiStatus::Success),
                    body: Some(reply),
                    ..UiHints::default()
                };
                emit_hints(sink, &reply_id, hints).await?;
            }
            Ok(())
        })
    }
}

/// `Attachment <name> (<type>): <what it became>`.
fn describe(attachment: &AttachmentContent) -> String {
    let file = &attachment.file;
    let head = format!("Attachment {} ({})", file.name(), file.mime_type);
    match &attachment.content {
        Ok(extract::Extracted::Text { text, truncated }) => {
            let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
            let mut start: String = flat.chars().take(60).collect();
            if start.len() < flat.len() {
                start.push('…');
            }
            let cut = if *truncated { " (truncated)" } else { "" };
            format!(
                "{head}: {} characters of text{cut}: \"{start}\"",
                text.chars().count()
            )
        }
        Ok(extract::Extracted::Image { data_base64, .. }) => {
            let padding = data_base64.bytes().rev().take_while(|&b| b == b'=').count();
            let bytes = (data_base64.len() / 4 * 3).saturating_sub(padding);
            format!("{head}: image, {bytes} bytes")
        }
        Ok(extract::Extracted::Unsupported { reason }) => {
            format!("{head}: not readable ({reason})")
        }
        Err(reason) => format!("{head}: not readable ({reason})"),
    }
}

/// Streams `text` as one assistant message, word by word.
async fn stream_text(
    sink: &mut EventSink,
    message_id: &str,
    text: &str,
    pause: Option<Duration>,
) -> anyhow::Result<()> {
    sink.emit(Event::TextMessageStart {
        message_id: message_id.to_owned(),
        role: "assistant".to_owned(),
    })
    .await?;
    for chunk in text.split_inclusive(' ') {
        if let Some(pause) = pause {
            sink.pause(pause).await?;
        }
        sink.emit(Event::TextMessageContent {
            message_id: message_id.to_owned(),
            delta: chunk.to_owned(),
        })
        .await?;
    }
    sink.emit(Event::TextMessageEnd {
        message_id: message_id.to_owned(),
    })
    .await
}

async fn emit_hints(sink: &mut EventSink, message_id: &str, hints: UiHints) -> anyhow::Result<()> {
    let value = serde_json::to_value(UiHintsEvent {
        message_id: message_id.to_owned(),
        hints,
    })?;
    sink.emit(Event::Custom {
        name: UI_HINTS_EVENT.to_owned(),
        value,
    })
    .await
}

/// Most KiB `/file-large` makes (the 100 MB per-file limit).
const MAX_LARGE_FILE_KIB: usize = 100 * 1024;

/// `/file-large <name> <KiB>`: the name and that many KiB of repeated text.
fn large_file(spec: &str) -> anyhow::Result<(&str, Vec<u8>)> {
    let usage = || {
        anyhow::anyhow!(
            "/file-large needs a file name and a size in KiB (1 to {MAX_LARGE_FILE_KIB})"
        )
    };
    let (name, kib) = spec.trim().split_once(' ').ok_or_else(usage)?;
    let kib: usize = kib.trim().parse().map_err(|_| usage())?;
    if kib == 0 || kib > MAX_LARGE_FILE_KIB {
        return Err(usage());
    }
    let line = b"All work and no play makes a large generated file.\n";
    let bytes = line.iter().copied().cycle().take(kib * 1024).collect();
    Ok((name, bytes))
}

/// Answers `Here is <name>.` and attaches `bytes` as the text file `name` to that answer; a
/// refusal is told in a second message and the run goes on.
async fn make_file(
    input: &ModelInput<'_>,
    sink: &mut EventSink,
    reply_id: &str,
    name: &str,
    bytes: Vec<u8>,
) -> anyhow::Result<()> {
    stream_text(sink, reply_id, &format!("Here is {name}."), None).await?;
    let content_type = if name.to_ascii_lowercase().ends_with(".csv") {
        "text/csv"
    } else {
        // Markdown too: `text/plain` is the allowed text type (the icon still says `md`).
        "text/plain"
    };
    match sink.attach(reply_id, name, content_type, bytes).await {
        Ok(_) => Ok(()),
        Err(err) if err.is::<crate::sink::Cancelled>() => Err(err),
        Err(err) => {
            let error_id = format!("{}-file-error", input.task.task_id);
            stream_text(
                sink,
                &error_id,
                &format!("Could not attach {name}: {err}"),
                None,
            )
            .await
        }
    }
}

/// `/tool <name> <json arguments>`.
async fn call_tool(
    input: &ModelInput<'_>,
    sink: &mut EventSink,
    reply_id: &str,
    call: &str,
) -> anyhow::Result<()> {
    let (name, arguments) = call.trim().split_once(' ').unwrap_or((call.trim(), "{}"));
    let arguments = arguments.trim();
    let task_id = input.task.task_id;
    let tool_call_id = format!("{task_id}-call-1");
    stream_text(sink, reply_id, &format!("Calling {name}."), None).await?;
    sink.emit(Event::ToolCallStart {
        tool_call_id: tool_call_id.clone(),
        tool_call_name: name.to_owned(),
        parent_message_id: Some(reply_id.to_owned()),
    })
    .await?;
    // Arguments stream in pieces, as a model would send them.
    let chars: Vec<char> = arguments.chars().collect();
    for piece in chars.chunks(8) {
        sink.emit(Event::ToolCallArgs {
            tool_call_id: tool_call_id.clone(),
            delta: piece.iter().collect(),
        })
        .await?;
    }
    sink.emit(Event::ToolCallEnd {
        tool_call_id: tool_call_id.clone(),
    })
    .await?;
    let client_tool = input
        .task
        .input
        .tools
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|tool| tool.name == name);
    if client_tool {
        return Ok(()); // the client runs it and answers in its next run
    }
    // The backend tool runs here: `execute_tool {name}` in OpenTelemetry's GenAI conventions.
    let span = tracing::info_span!(
        "worker.tool.execute",
        otel.name = %format!("execute_tool {name}"),
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %name,
        gen_ai.tool.call.id = %tool_call_id,
        gen_ai.tool.type = "function",
    );
    let parsed: serde_json::Value =
        serde_json::from_str(arguments).unwrap_or(serde_json::Value::String(arguments.to_owned()));
    let result_id = format!("{task_id}-tool-1");
    sink.emit(Event::ToolCallResult {
        message_id: result_id.clone(),
        tool_call_id,
        content: serde_json::json!({"ok": true, "tool": name, "arguments": parsed}).to_string(),
    })
    .instrument(span)
    .await?;
    let done = UiHints {
        title: Some(format!("{name} done")),
        status: Some(UiStatus::Success),
        ..UiHints::default()
    };
    emit_hints(sink, &result_id, done.clone()).await?;
    let summary_id = format!("{task_id}-summary");
    stream_text(sink, &summary_id, &format!("{name} finished."), None).await?;
    emit_hints(sink, &summary_id, done).await
}

/// Whether an answer is a skipped prompt's (`""`, `null`, `[]`).
fn is_skip(payload: &serde_json::Value) -> bool {
    match payload {
        serde_json::Value::Null => true,
        serde_json::Value::String(text) => text.is_empty(),
        serde_json::Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

/// The prompt of `/ask <input_type>[?][:<timeout secs>] <question>`, with the seed's options.
fn demo_prompt(spec: &str) -> anyhow::Result<Prompt> {
    let (kind, text) = spec
        .trim()
        .split_once(' ')
        .unwrap_or((spec.trim(), "Your input?"));
    let (kind, timeout) = match kind.split_once(':') {
        Some((kind, secs)) => (kind, Some(secs.parse::<u64>()?)),
        None => (kind, None),
    };
    let (kind, required) = match kind.strip_suffix('?') {
        Some(kind) => (kind, false),
        None => (kind, true),
    };
    let input_type: InputType = serde_json::from_value(serde_json::Value::String(kind.to_owned()))?;
    let option = |id: &str, label: &str| PromptOption {
        id: id.to_owned(),
        label: label.to_owned(),
        value: id.to_owned(),
        description: None,
    };
    let options = match input_type {
        InputType::Text => Vec::new(),
        InputType::BinaryChoice => vec![option("continue", "Continue"), option("cancel", "Cancel")],
        _ => vec![
            option("email", "Email"),
            option("sms", "SMS"),
            option("push", "Push Notification"),
        ],
    };
    Ok(Prompt {
        input_type,
        text: text.to_owned(),
        placeholder: (input_type == InputType::Text).then(|| "Ask anything.".to_owned()),
        options,
        required,
        timeout,
        error: DEFAULT_PROMPT_ERROR.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use extract::Extracted;
    use protocol::metadata::AttachedFile;
    use serde_json::json;

    use super::*;

    fn task() -> RunTaskV1 {
        serde_json::from_value(json!({
            "task_id": "0190c3a0-0000-7000-8000-000000000001",
            "owner": "user-1",
            "accepted_at": "2025-01-01T00:00:00Z",
            "input": {"threadId": "th", "runId": "r1",
                      "messages": [{"role": "user", "id": "u1", "content": "describe"}]},
        }))
        .unwrap()
    }

    fn attached(name: &str, mime: &str, content: Result<Extracted, String>) -> AttachmentContent {
        AttachmentContent {
            file: AttachedFile {
                bucket: "b".to_owned(),
                path: format!("u/{name}"),
                mime_type: mime.to_owned(),
                file_name: Some(name.to_owned()),
                size_bytes: Some(10),
            },
            content,
        }
    }

    fn sample() -> Vec<AttachmentContent> {
        vec![
            attached(
                "report.pdf",
                "application/pdf",
                Ok(Extracted::Text {
                    text: "--- Page 1 ---\nQuarterly   revenue grew\n".to_owned() + &"x".repeat(80),
                    truncated: false,
                }),
            ),
            attached(
                "cat.png",
                "image/png",
                Ok(Extracted::Image {
                    mime_type: "image/png".to_owned(),
                    data_base64: "AAECAw==".to_owned(), // 4 bytes
                }),
            ),
            attached(
                "x.doc",
                "application/msword",
                Ok(Extracted::Unsupported {
                    reason: "legacy binary Word (.doc) files cannot be read".to_owned(),
                }),
            ),
            attached(
                "gone.txt",
                "text/plain",
                Err("could not read gone.txt: timed out".to_owned()),
            ),
        ]
    }

    #[test]
    fn each_attachment_is_described_on_a_line() {
        let task = task();
        let input = ModelInput::new(&task).with_attachments(sample());
        let lines = input.describe_attachments();
        let start = format!(
            "--- Page 1 --- Quarterly revenue grew {}",
            "x".repeat(60 - 38)
        );
        assert_eq!(
            lines,
            [
                format!(
                    "Attachment report.pdf (application/pdf): 120 characters of text: \"{start}…\""
                ),
                "Attachment cat.png (image/png): image, 4 bytes".to_owned(),
                "Attachment x.doc (application/msword): not readable (legacy binary Word (.doc) files cannot be read)".to_owned(),
                "Attachment gone.txt (text/plain): not readable (could not read gone.txt: timed out)".to_owned(),
            ]
        );
    }

    #[test]
    fn file_large_makes_exactly_the_asked_kib_of_text_within_the_limit() {
        let (name, bytes) = large_file(" big.txt 1024 ").unwrap();
        assert_eq!((name, bytes.len()), ("big.txt", 1024 * 1024));
        assert!(std::str::from_utf8(&bytes).is_ok());
        for bad in ["big.txt", "big.txt 0", "big.txt 102401", "big.txt many"] {
            assert!(large_file(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn attachments_become_openai_content_parts() {
        let task = task();
        let plain = ModelInput::new(&task);
        assert!(plain.attachment_parts().is_empty());
        let input = ModelInput::new(&task).with_attachments(sample());
        let parts = input.attachment_parts();
        assert_eq!(parts.len(), 5, "{parts:?}");
        assert_eq!(parts[0]["type"], "text");
        let pdf = parts[0]["text"].as_str().unwrap();
        assert!(
            pdf.starts_with("[Attachment: report.pdf]\n--- Page 1 ---\nQuarterly")
                && pdf.ends_with("[End of attachment: report.pdf]"),
            "{pdf}"
        );
        assert_eq!(
            parts[1],
            json!({"type": "text", "text": "[Attachment: cat.png (image/png image, attached as an image)]"})
        );
        assert_eq!(
            parts[2],
            json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAECAw=="}})
        );
        assert_eq!(
            parts[3]["text"],
            "[Attachment: x.doc (content not included: legacy binary Word (.doc) files cannot be read)]"
        );
        assert_eq!(
            parts[4]["text"],
            "[Attachment: gone.txt (content not included: could not read gone.txt: timed out)]"
        );
    }
}
