//! An agent backed by an OpenAI-compatible chat-completions API (`POST {base}/chat/completions`
//! with `stream: true`).
//!
//! [`build_request`] maps the run to the request body, [`protocol::sse::SseParser`] splits the streamed body
//! into events and [`StreamDecoder`] maps their chunks to AG-UI events; [`OpenAiAgent`] only
//! sends the request and forwards the events to the run's sink. A tool call ends the agent's
//! turn: the client runs its tool and sends the result in its next run.

mod decoder;
mod request;

use protocol::usage::TokenUsage;
use std::collections::VecDeque;
use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::future::BoxFuture;
use futures::stream::{BoxStream, Stream, StreamExt as _};
use platform::config::{ConfigError, Env};
use protocol::agui::Event;
use protocol::run_input::{ContentBlock, Message, UserContent};
use protocol::sse::{SseFrame, SseParser};
use secrecy::{ExposeSecret as _, SecretString};
use serde_json::{Value, json};
use tracing::Instrument as _;

pub use self::decoder::StreamDecoder;
pub use self::request::{ChatMessage, ChatRequest};
use crate::agent::{Agent, ModelInput};
use crate::sink::EventSink;

/// Default of `SB_OPENAI_TIMEOUT_SECS`.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest part of an error answer's body kept in the error.
const MAX_ERROR_BODY_CHARS: usize = 500;

/// Settings of the OpenAI-compatible backend.
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// API base, up to and without `/chat/completions`, e.g. `https://api.openai.com/v1`
    /// (`SB_OPENAI_BASE_URL`).
    pub base_url: String,
    /// Model name sent in every request (`SB_OPENAI_MODEL`).
    pub model: String,
    /// Bearer token (`SB_OPENAI_API_KEY`).
    pub api_key: SecretString,
    /// Longest wait for the connection, for the response headers and between two reads of the
    /// stream (`SB_OPENAI_TIMEOUT_SECS`, default 120). A long answer that keeps streaming is
    /// never cut.
    pub request_timeout: Duration,
}

impl OpenAiConfig {
    /// Reads the settings; `None` when `SB_OPENAI_BASE_URL` is not set (the backend is off).
    pub fn from_env(env: &Env) -> Result<Option<Self>, ConfigError> {
        let Some(base_url) = env.optional::<String>("SB_OPENAI_BASE_URL")? else {
            return Ok(None);
        };
        let base_url = base_url.trim_end_matches('/').to_owned();
        check_base_url(&base_url).map_err(|reason| ConfigError::Invalid {
            name: "SB_OPENAI_BASE_URL".to_owned(),
            reason,
        })?;
        let seconds: u64 = env.or("SB_OPENAI_TIMEOUT_SECS", DEFAULT_TIMEOUT.as_secs())?;
        if seconds == 0 {
            return Err(ConfigError::Invalid {
                name: "SB_OPENAI_TIMEOUT_SECS".to_owned(),
                reason: "must be at least 1".to_owned(),
            });
        }
        Ok(Some(Self {
            base_url,
            model: env.required("SB_OPENAI_MODEL")?,
            api_key: env.secret("SB_OPENAI_API_KEY")?,
            request_timeout: Duration::from_secs(seconds),
        }))
    }
}

fn check_base_url(base_url: &str) -> Result<(), String> {
    let url = reqwest::Url::parse(base_url).map_err(|err| err.to_string())?;
    match url.scheme() {
        "http" | "https" => Ok(()),
        other => Err(format!("scheme {other:?} is not http or https")),
    }
}

/// The chat-completions agent. One HTTP client (and connection pool) for every run.
#[derive(Debug)]
pub struct OpenAiAgent {
    client: reqwest::Client,
    url: String,
    config: OpenAiConfig,
}

impl OpenAiAgent {
    /// The agent for `config`; fails on an unusable base URL or TLS setup.
    pub fn new(config: OpenAiConfig) -> anyhow::Result<Self> {
        let base_url = config.base_url.trim_end_matches('/');
        check_base_url(base_url)
            .map_err(|reason| anyhow::anyhow!("invalid model API base URL: {reason}"))?;
        let url = format!("{base_url}/chat/completions");
        let client = reqwest::Client::builder()
            .connect_timeout(config.request_timeout)
            .read_timeout(config.request_timeout)
            .build()
            .context("building the model API client failed")?;
        Ok(Self {
            client,
            url,
            config,
        })
    }

    /// The settings the agent was built with.
    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    /// Sends `body` and returns the answer's events as they stream in. Message ids start with
    /// `message_prefix`. A non-2xx answer is an error naming the status, with the start of the
    /// body; errors in the stream end it with an `Err` after the events decoded before them.
    pub async fn stream_events(
        &self,
        message_prefix: &str,
        body: &Value,
    ) -> anyhow::Result<BoxStream<'static, anyhow::Result<Event>>> {
        self.stream_events_counted(message_prefix, body, UsageSlot::default())
            .await
    }

    /// [`Self::stream_events`], keeping the usage the model reports (its last chunk's
    /// `usage`, asked for with `stream_options.include_usage`) in `usage`.
    pub async fn stream_events_counted(
        &self,
        message_prefix: &str,
        body: &Value,
        usage: UsageSlot,
    ) -> anyhow::Result<BoxStream<'static, anyhow::Result<Event>>> {
        // The model call continues the run's trace where the provider takes W3C context.
        let mut headers = reqwest::header::HeaderMap::new();
        platform::telemetry::inject_current_http(&mut headers);
        let request = self
            .client
            .post(&self.url)
            .bearer_auth(self.config.api_key.expose_secret())
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .headers(headers)
            .json(body)
            .send();
        let response = tokio::time::timeout(self.config.request_timeout, request)
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "model API did not answer within {:?}",
                    self.config.request_timeout
                )
            })?
            .context("model API request failed")?;
        let status = response.status();
        if !status.is_success() {
            let body = error_body(response).await;
            anyhow::bail!("model API answered {status}: {body}");
        }
        Ok(decode_counted(
            response.bytes_stream(),
            message_prefix,
            usage,
        ))
    }
}

impl Agent for OpenAiAgent {
    fn card(&self) -> anyhow::Result<protocol::agents::AgentCard> {
        let schema = |value: Value| {
            serde_json::from_value::<protocol::message_body::MessageBodySchema>(value)
        };
        Ok(protocol::agents::AgentCard {
            name: "openai".to_owned(),
            description: "An OpenAI-compatible chat-completions model: text, images, documents as text, tool calls.".to_owned(),
            input_schema: schema(json!({"parts": [
                {"contentType": "text/{plain,markdown}"},
                {"name": "/attachments/*"}
            ]}))?,
            output_schema: schema(json!({"parts": [
                {"contentType": "text/markdown"},
                {"name": "/tool_calls/*", "contentType": "application/json"}
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
            // Content parts for the last user message: extracted attachment text, image data
            // URLs, or notes on files that could not be read.
            let extra_user_parts = input.attachment_parts();
            let body = build_request(input, &self.config.model, &extra_user_parts);
            let prefix = input.task.task_id.to_string();
            tracing::debug!(model = %self.config.model, "calling the model API");
            let model = self.config.model.as_str();
            let span = chat_span(model);
            let usage = UsageSlot::default();
            let started = Instant::now();
            let mut first_token = None;
            let result = async {
                let streamed = self.stream_events_counted(&prefix, &body, usage.clone());
                let mut events = until_cancelled(sink, streamed).await??;
                while let Some(event) = until_cancelled(sink, events.next()).await? {
                    let event = event?;
                    if first_token.is_none() && is_first_token(&event) {
                        first_token = Some(started.elapsed());
                    }
                    sink.emit(event).await?;
                }
                anyhow::Ok(())
            }
            .instrument(span.clone())
            .await;
            // What the model reported counts whether the run goes on or not.
            let reported = usage
                .lock()
                .map(|mut slot| std::mem::take(&mut *slot))
                .unwrap_or_default();
            let entry = reported
                .usage
                .and_then(|u| TokenUsage::from_openai(model, &u));
            record_chat(
                &span,
                model,
                ChatOutcome {
                    took: started.elapsed(),
                    first_token,
                    usage: entry.as_ref(),
                    response_model: reported.model.as_deref(),
                    failed: result.is_err(),
                },
            );
            if let Some(entry) = entry {
                sink.add_usage(entry);
            }
            result
        })
    }
}

/// The client span of one model call, `chat {model}` in OpenTelemetry's GenAI conventions;
/// the response model, the tokens and the outcome are recorded when known ([`record_chat`]).
fn chat_span(model: &str) -> tracing::Span {
    tracing::info_span!(
        "worker.model.chat",
        otel.name = %format!("chat {model}"),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = "openai",
        gen_ai.request.model = %model,
        gen_ai.response.model = tracing::field::Empty,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
    )
}

/// Whether `event` is the model's first output: text, or the start of a tool call.
fn is_first_token(event: &Event) -> bool {
    matches!(
        event,
        Event::TextMessageContent { .. } | Event::ToolCallStart { .. }
    )
}

/// How a model call went, for its span and the GenAI metrics.
struct ChatOutcome<'a> {
    /// Request to the stream's end.
    took: Duration,
    /// Request to the first text or tool call, if any came.
    first_token: Option<Duration>,
    /// The tokens the model reported, if it did.
    usage: Option<&'a TokenUsage>,
    /// The model that answered, if the stream named it.
    response_model: Option<&'a str>,
    /// Whether the call failed (or the run was cancelled during it).
    failed: bool,
}

/// Records `outcome` on the call's span and in `gen_ai_client_token_usage`,
/// `gen_ai_client_operation_duration_seconds` and
/// `switchboard_model_time_to_first_token_seconds` (named in [`platform::metrics`]).
fn record_chat(span: &tracing::Span, model: &str, outcome: ChatOutcome<'_>) {
    let labels = [
        ("gen_ai_operation_name", "chat".to_owned()),
        ("gen_ai_provider_name", "openai".to_owned()),
        ("gen_ai_request_model", model.to_owned()),
    ];
    if let Some(response_model) = outcome.response_model {
        span.record("gen_ai.response.model", response_model);
    }
    if let Some(usage) = outcome.usage {
        // As i64: OpenTelemetry's integer attribute (a u64 would be exported as a string).
        let int = |tokens: u64| i64::try_from(tokens).unwrap_or(i64::MAX);
        span.record("gen_ai.usage.input_tokens", int(usage.input_tokens));
        span.record("gen_ai.usage.output_tokens", int(usage.output_tokens));
        for (kind, tokens) in [
            ("input", usage.input_tokens),
            ("output", usage.output_tokens),
        ] {
            let mut labels = labels.to_vec();
            labels.push(("gen_ai_token_type", kind.to_owned()));
            #[expect(clippy::cast_precision_loss, reason = "a histogram sample is an f64")]
            metrics::histogram!("gen_ai_client_token_usage", &labels).record(tokens as f64);
        }
    }
    if outcome.failed {
        span.record("otel.status_code", "error");
    }
    metrics::histogram!("gen_ai_client_operation_duration_seconds", &labels)
        .record(outcome.took.as_secs_f64());
    if let Some(first_token) = outcome.first_token {
        metrics::histogram!("switchboard_model_time_to_first_token_seconds", &labels)
            .record(first_token.as_secs_f64());
    }
}

/// Awaits `future` unless the run is cancelled first (dropping the request, which closes the
/// connection to the model).
async fn until_cancelled<F: Future>(sink: &EventSink, future: F) -> anyhow::Result<F::Output> {
    let mut future = std::pin::pin!(future);
    loop {
        tokio::select! {
            output = &mut future => return Ok(output),
            paused = sink.pause(Duration::from_secs(3600)) => paused?,
        }
    }
}

/// At most 4 KiB of an error answer's body, cut to 500 characters.
async fn error_body(response: reqwest::Response) -> String {
    let mut bytes = Vec::new();
    let mut body = response.bytes_stream();
    while let Some(Ok(chunk)) = body.next().await {
        bytes.extend_from_slice(&chunk);
        if bytes.len() >= 4096 {
            break;
        }
    }
    decoder::truncate(String::from_utf8_lossy(&bytes).trim(), MAX_ERROR_BODY_CHARS)
}

/// Decodes a `text/event-stream` body of chat-completion chunks into AG-UI events. The stream
/// ends after `[DONE]`, or with an `Err` (after the events decoded before it) when the body
/// fails, is malformed, carries an error object or ends before the answer is complete.
pub fn decode_sse_stream<S, B, E>(
    body: S,
    message_prefix: &str,
) -> BoxStream<'static, anyhow::Result<Event>>
where
    S: Stream<Item = Result<B, E>> + Send + 'static,
    B: AsRef<[u8]>,
    E: std::error::Error + Send + Sync + 'static,
{
    decode_counted(body, message_prefix, UsageSlot::default())
}

/// What a model stream reports besides its events.
#[derive(Debug, Default)]
pub struct StreamReport {
    /// The `usage` of the chunk that carried it (the last, with `stream_options.include_usage`).
    pub usage: Option<Value>,
    /// The model that answered, as the first chunk naming one said.
    pub model: Option<String>,
}

/// Where a model stream leaves what it reports besides its events.
pub type UsageSlot = std::sync::Arc<std::sync::Mutex<StreamReport>>;

/// [`decode_sse_stream`], keeping a chunk's `usage` in `usage`.
fn decode_counted<S, B, E>(
    body: S,
    message_prefix: &str,
    usage: UsageSlot,
) -> BoxStream<'static, anyhow::Result<Event>>
where
    S: Stream<Item = Result<B, E>> + Send + 'static,
    B: AsRef<[u8]>,
    E: std::error::Error + Send + Sync + 'static,
{
    let state = EventStream {
        usage,
        model_seen: false,
        body: Box::pin(body),
        parser: SseParser::new(),
        decoder: StreamDecoder::new(message_prefix),
        pending: VecDeque::new(),
        error: None,
        ended: false,
    };
    futures::stream::unfold(state, |mut state| async move {
        state.next_event().await.map(|item| (item, state))
    })
    .boxed()
}

struct EventStream<S> {
    /// The usage and the model the stream reported, for the caller.
    usage: UsageSlot,
    /// Whether a chunk named the model already.
    model_seen: bool,
    body: std::pin::Pin<Box<S>>,
    parser: SseParser,
    decoder: StreamDecoder,
    pending: VecDeque<Event>,
    error: Option<anyhow::Error>,
    ended: bool,
}

impl<S, B, E> EventStream<S>
where
    S: Stream<Item = Result<B, E>>,
    B: AsRef<[u8]>,
    E: std::error::Error + Send + Sync + 'static,
{
    async fn next_event(&mut self) -> Option<anyhow::Result<Event>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(Ok(event));
            }
            if let Some(error) = self.error.take() {
                return Some(Err(error));
            }
            if self.ended {
                return None;
            }
            if let Err(error) = self.advance().await {
                self.ended = true;
                self.error = Some(error);
            }
        }
    }

    /// Reads the next piece of the body and queues its events.
    async fn advance(&mut self) -> anyhow::Result<()> {
        match self.body.next().await {
            Some(chunk) => {
                let chunk = chunk.context("reading the model's stream failed")?;
                for frame in self.parser.push(chunk.as_ref())? {
                    if let SseFrame::Event(event) = frame
                        && self.data(&event.data)?
                    {
                        return self.end();
                    }
                }
                Ok(())
            }
            None => {
                if let Some(SseFrame::Event(event)) = self.parser.finish()?
                    && self.data(&event.data)?
                {
                    return self.end();
                }
                self.end()
            }
        }
    }

    /// One event's data; true at `[DONE]`.
    fn data(&mut self, data: &str) -> anyhow::Result<bool> {
        if data.trim() == "[DONE]" {
            self.decoder.mark_done();
            return Ok(true);
        }
        let chunk: Value = serde_json::from_str(data).with_context(|| {
            format!(
                "malformed chunk in the model's stream: {}",
                decoder::truncate(data, 200)
            )
        })?;
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object())
            && let Ok(mut slot) = self.usage.lock()
        {
            slot.usage = Some(usage.clone());
        }
        if !self.model_seen
            && let Some(model) = chunk.get("model").and_then(Value::as_str)
            && let Ok(mut slot) = self.usage.lock()
        {
            self.model_seen = true;
            slot.model = Some(model.to_owned());
        }
        self.pending.extend(self.decoder.push(&chunk)?);
        Ok(false)
    }

    fn end(&mut self) -> anyhow::Result<()> {
        self.ended = true;
        self.pending.extend(self.decoder.finish()?);
        if let Some(reason) = self.decoder.finish_reason()
            && reason != "stop"
            && reason != "tool_calls"
        {
            tracing::warn!(finish_reason = reason, "the model's answer ended early");
        }
        Ok(())
    }
}

/// The chat-completions request body of a run: the system prompt (when not empty), then every
/// message of the run in OpenAI's format, then the run's tools (when it has some).
/// `extra_user_parts` (content parts such as `{"type":"text","text":...}` or
/// `{"type":"image_url",...}`) are appended to the last user message.
///
/// Attachments at `s3://` URLs are skipped: the model cannot fetch them. Developer messages are
/// sent as `system` messages, which every compatible server accepts; reasoning and activity
/// messages are not sent.
pub fn build_request(input: &ModelInput<'_>, model: &str, extra_user_parts: &[Value]) -> Value {
    let run = &input.task.input;
    let mut messages = Vec::with_capacity(run.messages.len() + 2);
    if !input.system_prompt.is_empty() {
        messages.push(ChatMessage::System {
            content: &input.system_prompt,
            name: None,
        });
    }
    let last_user = run
        .messages
        .iter()
        .rposition(|message| matches!(message, Message::User(_)));
    for (index, message) in run.messages.iter().enumerate() {
        let extra = if Some(index) == last_user {
            extra_user_parts
        } else {
            &[]
        };
        if let Some(message) = map_message(message, extra) {
            messages.push(message);
        }
    }
    if last_user.is_none() && !extra_user_parts.is_empty() {
        messages.push(ChatMessage::User {
            content: request::UserContent::Parts(extra_user_parts.to_vec()),
            name: None,
        });
    }
    let tools = run
        .tools
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|tool| request::ChatTool {
            kind: "function",
            function: request::FunctionSpec {
                name: &tool.name,
                description: &tool.description,
                parameters: &tool.parameters,
            },
        })
        .collect();
    let body = ChatRequest {
        model,
        stream: true,
        messages,
        tools,
        stream_options: request::StreamOptions {
            include_usage: true,
        },
    };
    // Plain structs of strings and JSON values: serializing cannot fail.
    serde_json::to_value(body).unwrap_or_default()
}

fn map_message<'a>(message: &'a Message, extra_parts: &[Value]) -> Option<ChatMessage<'a>> {
    Some(match message {
        Message::User(user) => ChatMessage::User {
            content: user_content(&user.content, extra_parts),
            name: user.name.as_deref(),
        },
        Message::Assistant(assistant) => {
            let tool_calls: Vec<request::ToolCall<'_>> = assistant
                .tool_calls
                .iter()
                .flatten()
                .map(|call| request::ToolCall {
                    id: &call.id,
                    kind: "function",
                    function: request::FunctionCall {
                        name: &call.function.name,
                        arguments: &call.function.arguments,
                    },
                })
                .collect();
            let content = match &assistant.content {
                Some(text) => Some(text.as_str()),
                None if tool_calls.is_empty() => Some(""),
                None => None,
            };
            ChatMessage::Assistant {
                content,
                tool_calls,
                name: assistant.name.as_deref(),
            }
        }
        Message::Tool(tool) => ChatMessage::Tool {
            tool_call_id: &tool.tool_call_id,
            content: match &tool.error {
                Some(error) if tool.content.is_empty() => format!("Error: {error}"),
                _ => tool.content.clone(),
            },
        },
        Message::System(text) | Message::Developer(text) => ChatMessage::System {
            content: &text.content,
            name: text.name.as_deref(),
        },
        Message::Reasoning(_) | Message::Activity(_) => return None,
    })
}

/// A user message's content: its text as is, or content parts when it has blocks or
/// `extra_parts`.
fn user_content(content: &UserContent, extra_parts: &[Value]) -> request::UserContent {
    let mut parts: Vec<Value> = match content {
        UserContent::Text(text) if extra_parts.is_empty() => {
            return request::UserContent::Text(text.clone());
        }
        UserContent::Text(text) if text.is_empty() => Vec::new(),
        UserContent::Text(text) => vec![json!({"type": "text", "text": text})],
        UserContent::Blocks(blocks) => blocks.iter().filter_map(block_part).collect(),
    };
    parts.extend(extra_parts.iter().cloned());
    if parts.is_empty() {
        request::UserContent::Text(String::new())
    } else {
        request::UserContent::Parts(parts)
    }
}

/// The content part of one block. Only text goes as it is: the model never gets a URL to fetch.
/// The files of the new user message reach it through `extra_parts` (read from S3 after
/// admission, images as `data:` URLs); a file block anywhere else (an earlier message of a
/// conversation an AG-UI client resent, which admission does not see) is left out with a note,
/// so the model host is never made to fetch an arbitrary or internal address.
fn block_part(block: &ContentBlock) -> Option<Value> {
    let source = match block {
        ContentBlock::Text(text) => return Some(json!({"type": "text", "text": text.text})),
        ContentBlock::Binary(binary) => binary.url.as_deref().unwrap_or_default(),
        ContentBlock::Image(part) | ContentBlock::Document(part) | ContentBlock::Audio(part) => {
            part.source
                .get("value")
                .and_then(Value::as_str)
                .unwrap_or_default()
        }
    };
    // `s3://` blocks are admitted files; their content comes with the turn that admitted them.
    if source
        .get(..5)
        .is_some_and(|p| p.eq_ignore_ascii_case("s3://"))
    {
        return None;
    }
    Some(json!({"type": "text", "text": UNADMITTED_FILE_NOTE}))
}

/// What the model reads in place of a file block the server did not admit.
const UNADMITTED_FILE_NOTE: &str =
    "[a file was left out: only files uploaded to and verified by this service are passed on]";

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::{Arc, Mutex};

    use axum::Router;
    use axum::body::Body;
    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode, header};
    use axum::response::{IntoResponse, Response};
    use axum::routing::post;
    use futures::TryStreamExt as _;
    use protocol::messaging::RunTaskV1;

    use super::*;

    fn task(messages: Value, tools: Option<Value>) -> RunTaskV1 {
        let mut input = json!({"threadId": "th", "runId": "r1", "messages": messages});
        if let Some(tools) = tools {
            input["tools"] = tools;
        }
        serde_json::from_value(json!({
            "task_id": "0190c3a0-0000-7000-8000-000000000001",
            "owner": "user-1",
            "accepted_at": "2025-01-01T00:00:00Z",
            "input": input,
        }))
        .unwrap()
    }

    fn weather_tool() -> Value {
        json!([{
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}
        }])
    }

    fn config(base_url: &str) -> OpenAiConfig {
        OpenAiConfig {
            base_url: base_url.to_owned(),
            model: "gpt-test".to_owned(),
            api_key: SecretString::from("sk-test"),
            request_timeout: Duration::from_secs(10),
        }
    }

    #[test]
    fn the_system_prompt_comes_first_and_tools_are_functions() {
        let task = task(
            json!([{"role": "user", "id": "u1", "content": "Weather in Paris?"}]),
            Some(weather_tool()),
        );
        let input = ModelInput::new(&task);
        assert!(!input.system_prompt.is_empty());
        let body = build_request(&input, "gpt-test", &[]);
        assert_eq!(body["model"], "gpt-test");
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"], json!({"include_usage": true}));
        assert_eq!(
            body["messages"],
            json!([
                {"role": "system", "content": input.system_prompt},
                {"role": "user", "content": "Weather in Paris?"},
            ])
        );
        assert_eq!(
            body["tools"],
            json!([{
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Weather of a city",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}
                }
            }])
        );
    }

    #[test]
    fn without_tools_there_is_no_system_message_and_no_tools_field() {
        let task = task(json!([{"role": "user", "id": "u1", "content": "Hi"}]), None);
        let body = build_request(&ModelInput::new(&task), "m", &[]);
        assert_eq!(body["messages"], json!([{"role": "user", "content": "Hi"}]));
        assert!(body.get("tools").is_none());
    }

    #[test]
    fn no_url_or_inline_data_of_a_file_block_reaches_the_model() {
        let task = task(
            json!([{"role": "user", "id": "u1", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "binary", "mimeType": "image/png", "url": "https://cdn.example/a.png"},
                {"type": "binary", "mimeType": "image/png", "url": "s3://bucket/files/b.png"},
                {"type": "image", "source": {"type": "url", "value": "S3://bucket/c.png"}},
                {"type": "image", "source": {"type": "data", "value": "AAAA", "mimeType": "image/jpeg"}},
            ]}]),
            None,
        );
        let body = build_request(&ModelInput::new(&task), "m", &[]);
        let note = json!({"type": "text", "text": UNADMITTED_FILE_NOTE});
        assert_eq!(
            body["messages"][0]["content"],
            json!([{"type": "text", "text": "What is this?"}, note, note]),
            "no URL and no inline data reaches the model; admitted s3:// files come as extra parts"
        );
        let request = body.to_string();
        assert!(
            !request.contains("cdn.example") && !request.contains("AAAA"),
            "{request}"
        );
    }

    #[test]
    fn extra_parts_go_to_the_last_user_message_and_history_is_mapped() {
        let task = task(
            json!([
                {"role": "developer", "id": "d1", "content": "Be brief."},
                {"role": "user", "id": "u1", "content": "Weather?"},
                {"role": "assistant", "id": "a1", "toolCalls": [{
                    "id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}
                }]},
                {"role": "tool", "id": "t1", "toolCallId": "call_1", "content": "18C"},
                {"role": "assistant", "id": "a2", "content": "It is 18C."},
                {"role": "user", "id": "u2", "content": "And this file?"},
            ]),
            None,
        );
        let extra = [json!({"type": "text", "text": "file.txt: hello"})];
        let body = build_request(&ModelInput::new(&task), "m", &extra);
        assert_eq!(
            body["messages"],
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": null, "tool_calls": [{
                    "id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}
                }]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
                {"role": "assistant", "content": "It is 18C."},
                {"role": "user", "content": [
                    {"type": "text", "text": "And this file?"},
                    {"type": "text", "text": "file.txt: hello"},
                ]},
            ])
        );
    }

    #[test]
    fn config_is_off_without_a_base_url_and_names_what_is_missing() {
        assert!(
            OpenAiConfig::from_env(&Env::from_pairs([("X", "1")]))
                .unwrap()
                .is_none()
        );
        let err = OpenAiConfig::from_env(&Env::from_pairs([(
            "SB_OPENAI_BASE_URL",
            "https://api.openai.com/v1",
        )]))
        .err()
        .map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("SB_OPENAI_MODEL")));
        let err = OpenAiConfig::from_env(&Env::from_pairs([
            ("SB_OPENAI_BASE_URL", "https://api.openai.com/v1"),
            ("SB_OPENAI_MODEL", "gpt-4o-mini"),
        ]))
        .err()
        .map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("SB_OPENAI_API_KEY")));
        let err = OpenAiConfig::from_env(&Env::from_pairs([("SB_OPENAI_BASE_URL", "ftp://x")]))
            .err()
            .map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("SB_OPENAI_BASE_URL")));
        let config = OpenAiConfig::from_env(&Env::from_pairs([
            ("SB_OPENAI_BASE_URL", "https://api.openai.com/v1/"),
            ("SB_OPENAI_MODEL", "gpt-4o-mini"),
            ("SB_OPENAI_API_KEY", "sk-1"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(config.base_url, "https://api.openai.com/v1");
        assert_eq!(config.model, "gpt-4o-mini");
        assert_eq!(config.api_key.expose_secret(), "sk-1");
        assert_eq!(config.request_timeout, DEFAULT_TIMEOUT);
    }

    /// What the fake server saw: the Authorization header and the body.
    type Seen = Arc<Mutex<Vec<(Option<String>, Value)>>>;

    const SSE: &str = concat!(
        ": keep-alive\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Voilà \"}}]}\r\n\r\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"☀️ Paris\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"city\\\":\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"Paris\\\"}\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: [DONE]\n\n",
    );

    async fn chat(State(seen): State<Seen>, headers: HeaderMap, body: String) -> Response {
        let auth = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body: Value = serde_json::from_str(&body).unwrap();
        let model = body["model"].as_str().unwrap_or_default().to_owned();
        seen.lock().unwrap().push((auth, body));
        if model == "refused" {
            return (StatusCode::UNAUTHORIZED, "no ".repeat(1000)).into_response();
        }
        // Awkward pieces: 7 bytes, splitting lines, `\r\n` pairs and multi-byte characters.
        let pieces: Vec<Result<Vec<u8>, Infallible>> =
            SSE.as_bytes().chunks(7).map(|c| Ok(c.to_vec())).collect();
        let stream = futures::stream::iter(pieces).then(|piece| async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            piece
        });
        Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream")
            .body(Body::from_stream(stream))
            .unwrap()
    }

    async fn fake_server() -> (String, Seen) {
        let seen = Seen::default();
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (format!("http://{addr}/v1/"), seen)
    }

    #[tokio::test]
    async fn streams_and_decodes_a_chat_completion_from_a_server() {
        let (base_url, seen) = fake_server().await;
        let agent = OpenAiAgent::new(config(&base_url)).unwrap();
        let task = task(
            json!([{"role": "user", "id": "u1", "content": "Weather in Paris?"}]),
            Some(weather_tool()),
        );
        let body = build_request(&ModelInput::new(&task), "gpt-test", &[]);
        let events: Vec<Event> = agent
            .stream_events("t1", &body)
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        assert_eq!(
            events,
            vec![
                Event::TextMessageStart {
                    message_id: "t1-msg-1".to_owned(),
                    role: "assistant".to_owned()
                },
                Event::TextMessageContent {
                    message_id: "t1-msg-1".to_owned(),
                    delta: "Voilà ".to_owned()
                },
                Event::TextMessageContent {
                    message_id: "t1-msg-1".to_owned(),
                    delta: "☀️ Paris".to_owned()
                },
                Event::TextMessageEnd {
                    message_id: "t1-msg-1".to_owned()
                },
                Event::ToolCallStart {
                    tool_call_id: "call_1".to_owned(),
                    tool_call_name: "get_weather".to_owned(),
                    parent_message_id: Some("t1-msg-1".to_owned()),
                },
                Event::ToolCallArgs {
                    tool_call_id: "call_1".to_owned(),
                    delta: "{\"city\":".to_owned()
                },
                Event::ToolCallArgs {
                    tool_call_id: "call_1".to_owned(),
                    delta: "\"Paris\"}".to_owned()
                },
                Event::ToolCallEnd {
                    tool_call_id: "call_1".to_owned()
                },
            ]
        );
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].0.as_deref(), Some("Bearer sk-test"));
        assert_eq!(seen[0].1, body);
        assert_eq!(seen[0].1["tools"][0]["function"]["name"], "get_weather");
    }

    #[test]
    fn attachment_content_goes_into_the_last_user_message() {
        let task = task(
            json!([{"role": "user", "id": "u1", "content": "What is in these?"}]),
            None,
        );
        let file = |name: &str, mime: &str| protocol::metadata::AttachedFile {
            bucket: "b".to_owned(),
            path: format!("u/{name}"),
            mime_type: mime.to_owned(),
            file_name: Some(name.to_owned()),
            size_bytes: None,
        };
        let input = ModelInput::new(&task).with_attachments(vec![
            crate::attachments::AttachmentContent {
                file: file("a.txt", "text/plain"),
                content: Ok(extract::Extracted::Text {
                    text: "hello".to_owned(),
                    truncated: false,
                }),
            },
            crate::attachments::AttachmentContent {
                file: file("b.png", "image/png"),
                content: Ok(extract::Extracted::Image {
                    mime_type: "image/png".to_owned(),
                    data_base64: "iVBO".to_owned(),
                }),
            },
        ]);
        let body = build_request(&input, "m", &input.attachment_parts());
        assert_eq!(
            body["messages"],
            json!([{"role": "user", "content": [
                {"type": "text", "text": "What is in these?"},
                {"type": "text", "text": "[Attachment: a.txt]\nhello\n[End of attachment: a.txt]"},
                {"type": "text", "text": "[Attachment: b.png (image/png image, attached as an image)]"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
            ]}])
        );
    }

    #[tokio::test]
    async fn a_non_2xx_answer_is_an_error_naming_the_status() {
        let (base_url, seen) = fake_server().await;
        let agent = OpenAiAgent::new(config(&base_url)).unwrap();
        let body = json!({"model": "refused", "stream": true, "messages": []});
        let err = match agent.stream_events("t1", &body).await {
            Ok(_) => panic!("a 401 must fail"),
            Err(err) => err.to_string(),
        };
        assert!(err.contains("401"), "{err}");
        assert!(err.contains("no no"), "{err}");
        assert!(
            err.chars().count() < 600,
            "body not truncated: {}",
            err.len()
        );
        assert_eq!(seen.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_stream_cut_off_yields_its_events_then_an_error() {
        let pieces: Vec<Result<&'static [u8], std::io::Error>> = vec![
            Ok(b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\nda"),
            Ok(b"ta: {\"choices\":[{\"delta\":{\"content\":\"!\"}}]}\n\n"),
        ];
        let items: Vec<anyhow::Result<Event>> =
            decode_sse_stream(futures::stream::iter(pieces), "t")
                .collect()
                .await;
        assert_eq!(items.len(), 4);
        assert!(items[..3].iter().all(Result::is_ok));
        let err = items[3].as_ref().err().map(ToString::to_string);
        assert!(err.is_some_and(|e| e.contains("ended before")));
    }

    #[tokio::test]
    async fn a_malformed_chunk_is_an_error() {
        let pieces: Vec<Result<&'static [u8], std::io::Error>> =
            vec![Ok(b"data: {not json\n\ndata: [DONE]\n\n")];
        let items: Vec<anyhow::Result<Event>> =
            decode_sse_stream(futures::stream::iter(pieces), "t")
                .collect()
                .await;
        assert_eq!(items.len(), 1);
        assert!(
            items[0]
                .as_ref()
                .is_err_and(|e| e.to_string().contains("malformed"))
        );
    }
}
