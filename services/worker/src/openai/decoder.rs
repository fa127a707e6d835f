//! Turns chat-completions stream chunks into AG-UI events.

use std::collections::BTreeMap;

use protocol::agui::Event;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// One `data` object of the stream, as far as it is used. Decoding is lenient: a field of an
/// unexpected type (servers differ) counts as absent instead of failing the chunk.
#[derive(Debug, Default, Deserialize)]
struct Chunk {
    #[serde(default)]
    error: Option<Value>,
    #[serde(default, deserialize_with = "lenient")]
    choices: Option<Vec<Choice>>,
}

/// A choice of a chunk (`n` = 1: the first is the answer).
#[derive(Debug, Default, Deserialize)]
struct Choice {
    #[serde(default, deserialize_with = "lenient")]
    delta: Option<Delta>,
    #[serde(default, deserialize_with = "lenient")]
    finish_reason: Option<String>,
}

/// What a chunk adds to the answer.
#[derive(Debug, Default, Deserialize)]
struct Delta {
    #[serde(default, deserialize_with = "lenient")]
    content: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    refusal: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    tool_calls: Option<Vec<CallDelta>>,
}

/// A fragment of a tool call: its index, and its id and name the first time.
#[derive(Debug, Default, Deserialize)]
struct CallDelta {
    #[serde(default, deserialize_with = "lenient")]
    index: Option<u64>,
    #[serde(default, deserialize_with = "lenient")]
    id: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    function: Option<FunctionDelta>,
}

/// The function part of a tool call fragment; `arguments` is a JSON string (some servers send
/// the object itself).
#[derive(Debug, Default, Deserialize)]
struct FunctionDelta {
    #[serde(default, deserialize_with = "lenient")]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<Value>,
}

/// A field as `T`, or absent when it has another shape.
fn lenient<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: DeserializeOwned,
{
    let value = Value::deserialize(deserializer)?;
    Ok(serde_json::from_value(value).ok())
}

/// Longest part of a model error message kept in the error.
const MAX_ERROR_CHARS: usize = 500;

/// Maps the `data` objects of a streamed chat completion to AG-UI events, in order.
///
/// Text deltas become one assistant message (`<prefix>-msg-<n>`), closed before the first tool
/// call and at the end; tool calls keep the model's ids (the client answers with them) and are
/// all ended when the model gives a `finish_reason` (or at [`Self::finish`]).
#[derive(Debug)]
pub struct StreamDecoder {
    prefix: String,
    text_messages: usize,
    open_text: Option<String>,
    last_text: Option<String>,
    calls: BTreeMap<u64, ToolCallState>,
    finish_reason: Option<String>,
    done: bool,
}

#[derive(Debug, Default)]
struct ToolCallState {
    id: Option<String>,
    name: Option<String>,
    started: bool,
    ended: bool,
    /// Argument fragments received before the name, sent once the call starts.
    pending_args: String,
}

impl StreamDecoder {
    /// A decoder whose message ids start with `prefix` (the task id).
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            text_messages: 0,
            open_text: None,
            last_text: None,
            calls: BTreeMap::new(),
            finish_reason: None,
            done: false,
        }
    }

    /// The events of one chunk. An `{"error": ...}` chunk is an error.
    pub fn push(&mut self, chunk: &Value) -> anyhow::Result<Vec<Event>> {
        // Only an object is a chunk (serde would read an array as the struct's fields in order).
        let chunk = match chunk {
            Value::Object(_) => Chunk::deserialize(chunk).unwrap_or_default(),
            _ => Chunk::default(),
        };
        if let Some(error) = &chunk.error {
            anyhow::bail!("model API error: {}", describe_error(error));
        }
        let mut events = Vec::new();
        // With `n` = 1 there is one choice; chunks without one (usage) carry no events.
        let Some(choice) = chunk.choices.and_then(|choices| choices.into_iter().next()) else {
            return Ok(events);
        };
        if let Some(delta) = choice.delta {
            for text in [&delta.content, &delta.refusal].into_iter().flatten() {
                self.text(text, &mut events);
            }
            for call in delta.tool_calls.unwrap_or_default() {
                self.tool_call(call, &mut events);
            }
        }
        if let Some(reason) = choice.finish_reason {
            self.finish_reason = Some(reason);
            self.close(&mut events)?;
        }
        Ok(events)
    }

    /// The stream said `[DONE]`.
    pub fn mark_done(&mut self) {
        self.done = true;
    }

    /// The closing events at the end of the stream. A stream that ends with neither
    /// `[DONE]` nor a `finish_reason` was cut off: an error.
    pub fn finish(&mut self) -> anyhow::Result<Vec<Event>> {
        if !self.done && self.finish_reason.is_none() {
            anyhow::bail!("the model's stream ended before the answer was complete");
        }
        let mut events = Vec::new();
        self.close(&mut events)?;
        Ok(events)
    }

    /// The model's `finish_reason`, once given (`stop`, `tool_calls`, `length`, ...).
    pub fn finish_reason(&self) -> Option<&str> {
        self.finish_reason.as_deref()
    }

    /// Whether the model called at least one tool.
    pub fn called_tools(&self) -> bool {
        self.calls.values().any(|call| call.started)
    }

    fn text(&mut self, text: &str, events: &mut Vec<Event>) {
        if text.is_empty() {
            return;
        }
        let message_id = match &self.open_text {
            Some(id) => id.clone(),
            None => {
                self.text_messages += 1;
                let id = format!("{}-msg-{}", self.prefix, self.text_messages);
                events.push(Event::TextMessageStart {
                    message_id: id.clone(),
                    role: "assistant".to_owned(),
                });
                self.open_text = Some(id.clone());
                self.last_text = Some(id.clone());
                id
            }
        };
        events.push(Event::TextMessageContent {
            message_id,
            delta: text.to_owned(),
        });
    }

    fn close_text(&mut self, events: &mut Vec<Event>) {
        if let Some(message_id) = self.open_text.take() {
            events.push(Event::TextMessageEnd { message_id });
        }
    }

    fn tool_call(&mut self, call: CallDelta, events: &mut Vec<Event>) {
        self.close_text(events);
        let id = call.id.as_deref().filter(|id| !id.is_empty());
        let index = match call.index {
            Some(index) => index,
            // Without an index: a new id is a new call, anything else continues the last one.
            None => {
                let last = self.calls.iter().next_back();
                match (id, last) {
                    (_, None) => 0,
                    (Some(id), Some((&index, state))) if state.id.as_deref() != Some(id) => {
                        index + 1
                    }
                    (_, Some((&index, _))) => index,
                }
            }
        };
        let function = call.function.unwrap_or_default();
        let name = function.name.as_deref().filter(|name| !name.is_empty());
        let arguments = match &function.arguments {
            Some(Value::String(arguments)) => arguments.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(), // some servers send the object itself
        };
        let state = self.calls.entry(index).or_default();
        if state.ended {
            return;
        }
        if state.id.is_none()
            && let Some(id) = id
        {
            state.id = Some(id.to_owned());
        }
        if state.name.is_none()
            && let Some(name) = name
        {
            state.name = Some(name.to_owned());
        }
        state.pending_args.push_str(&arguments);
        if !state.started
            && let Some(name) = &state.name
        {
            let tool_call_id = state
                .id
                .get_or_insert_with(|| format!("{}-call-{index}", self.prefix))
                .clone();
            events.push(Event::ToolCallStart {
                tool_call_id,
                tool_call_name: name.clone(),
                parent_message_id: self.last_text.clone(),
            });
            state.started = true;
        }
        if state.started
            && !state.pending_args.is_empty()
            && let Some(tool_call_id) = &state.id
        {
            events.push(Event::ToolCallArgs {
                tool_call_id: tool_call_id.clone(),
                delta: std::mem::take(&mut state.pending_args),
            });
        }
    }

    /// Ends the text message and every open tool call.
    fn close(&mut self, events: &mut Vec<Event>) -> anyhow::Result<()> {
        self.close_text(events);
        for (index, state) in &mut self.calls {
            if state.ended {
                continue;
            }
            let (true, Some(tool_call_id)) = (state.started, &state.id) else {
                anyhow::bail!("the model sent tool call {index} without a function name");
            };
            events.push(Event::ToolCallEnd {
                tool_call_id: tool_call_id.clone(),
            });
            state.ended = true;
        }
        Ok(())
    }
}

/// The message of an `error` object (or the object itself), at most 500 characters.
fn describe_error(error: &Value) -> String {
    let text = match error.get("message").and_then(Value::as_str) {
        Some(message) => message.to_owned(),
        None => match error {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        },
    };
    truncate(&text, MAX_ERROR_CHARS)
}

/// `text` cut to `max` characters, marked with `…` when cut.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn delta(delta: Value) -> Value {
        json!({"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
    }

    fn finish(reason: &str) -> Value {
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
    }

    fn decode(chunks: &[Value]) -> anyhow::Result<Vec<Event>> {
        let mut decoder = StreamDecoder::new("t");
        let mut events = Vec::new();
        for chunk in chunks {
            events.extend(decoder.push(chunk)?);
        }
        decoder.mark_done();
        events.extend(decoder.finish()?);
        Ok(events)
    }

    fn start(id: &str) -> Event {
        Event::TextMessageStart {
            message_id: id.to_owned(),
            role: "assistant".to_owned(),
        }
    }

    fn content(id: &str, delta: &str) -> Event {
        Event::TextMessageContent {
            message_id: id.to_owned(),
            delta: delta.to_owned(),
        }
    }

    fn end(id: &str) -> Event {
        Event::TextMessageEnd {
            message_id: id.to_owned(),
        }
    }

    fn args(id: &str, delta: &str) -> Event {
        Event::ToolCallArgs {
            tool_call_id: id.to_owned(),
            delta: delta.to_owned(),
        }
    }

    #[test]
    fn text_only_is_one_message() {
        let events = decode(&[
            delta(json!({"role": "assistant", "content": ""})),
            delta(json!({"content": "Hel"})),
            delta(json!({"content": "lo"})),
            finish("stop"),
        ])
        .unwrap();
        assert_eq!(
            events,
            vec![
                start("t-msg-1"),
                content("t-msg-1", "Hel"),
                content("t-msg-1", "lo"),
                end("t-msg-1")
            ]
        );
    }

    #[test]
    fn text_then_two_parallel_tool_calls_with_fragmented_arguments() {
        let mut decoder = StreamDecoder::new("t");
        let chunks = [
            delta(json!({"role": "assistant", "content": "Checking."})),
            delta(
                json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}),
            ),
            delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"loc"}}]})),
            delta(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "ation\":\"Paris\"}"}}]}),
            ),
            delta(
                json!({"tool_calls": [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{\"tz\":"}}]}),
            ),
            delta(json!({"tool_calls": [{"index": 1, "function": {"arguments": "\"CET\"}"}}]})),
        ];
        let mut events = Vec::new();
        for chunk in &chunks {
            events.extend(decoder.push(chunk).unwrap());
        }
        // Nothing ends before the finish reason.
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, Event::ToolCallEnd { .. }))
        );
        events.extend(decoder.push(&finish("tool_calls")).unwrap());
        decoder.mark_done();
        events.extend(decoder.finish().unwrap());
        assert_eq!(
            events,
            vec![
                start("t-msg-1"),
                content("t-msg-1", "Checking."),
                end("t-msg-1"),
                Event::ToolCallStart {
                    tool_call_id: "call_a".to_owned(),
                    tool_call_name: "get_weather".to_owned(),
                    parent_message_id: Some("t-msg-1".to_owned()),
                },
                args("call_a", "{\"loc"),
                args("call_a", "ation\":\"Paris\"}"),
                Event::ToolCallStart {
                    tool_call_id: "call_b".to_owned(),
                    tool_call_name: "get_time".to_owned(),
                    parent_message_id: Some("t-msg-1".to_owned()),
                },
                args("call_b", "{\"tz\":"),
                args("call_b", "\"CET\"}"),
                Event::ToolCallEnd {
                    tool_call_id: "call_a".to_owned()
                },
                Event::ToolCallEnd {
                    tool_call_id: "call_b".to_owned()
                },
            ]
        );
        assert!(decoder.called_tools());
        assert_eq!(decoder.finish_reason(), Some("tool_calls"));
    }

    #[test]
    fn a_tool_call_without_text_has_no_parent_and_is_ended_at_finish() {
        let mut decoder = StreamDecoder::new("t");
        let events = decoder
            .push(&delta(
                json!({"tool_calls": [{"index": 0, "id": "call_a", "function": {"name": "f", "arguments": "{}"}}]}),
            ))
            .unwrap();
        assert_eq!(
            events,
            vec![
                Event::ToolCallStart {
                    tool_call_id: "call_a".to_owned(),
                    tool_call_name: "f".to_owned(),
                    parent_message_id: None,
                },
                args("call_a", "{}"),
            ]
        );
        decoder.mark_done();
        assert_eq!(
            decoder.finish().unwrap(),
            vec![Event::ToolCallEnd {
                tool_call_id: "call_a".to_owned()
            }]
        );
    }

    #[test]
    fn empty_and_null_deltas_emit_nothing() {
        let events = decode(&[
            delta(json!({"role": "assistant"})),
            delta(json!({"content": ""})),
            delta(json!({"content": null})),
            delta(json!({})),
            json!({"choices": [], "usage": {"total_tokens": 3}}),
            delta(json!({"content": "ok"})),
            delta(json!({"content": ""})),
            finish("stop"),
        ])
        .unwrap();
        assert_eq!(
            events,
            vec![start("t-msg-1"), content("t-msg-1", "ok"), end("t-msg-1")]
        );
        // No content at all: no message at all.
        let nothing = decode(&[delta(json!({"content": ""})), finish("stop")]).unwrap();
        assert_eq!(nothing, Vec::<Event>::new());
    }

    #[test]
    fn fields_of_unexpected_types_count_as_absent_and_object_arguments_are_kept() {
        let events = decode(&[
            delta(json!({"content": 42, "tool_calls": null})),
            json!({"choices": "nope"}),
            json!([1, 2]),
            delta(json!({"content": "ok", "refusal": {"x": 1}})),
            delta(json!({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": {"a": 1}}}]})),
            finish("tool_calls"),
        ])
        .unwrap();
        assert_eq!(
            events,
            vec![
                start("t-msg-1"),
                content("t-msg-1", "ok"),
                end("t-msg-1"),
                Event::ToolCallStart {
                    tool_call_id: "c".to_owned(),
                    tool_call_name: "f".to_owned(),
                    parent_message_id: Some("t-msg-1".to_owned()),
                },
                args("c", "{\"a\":1}"),
                Event::ToolCallEnd {
                    tool_call_id: "c".to_owned()
                },
            ]
        );
    }

    #[test]
    fn an_error_object_is_an_error_with_its_message() {
        let err = decode(&[
            delta(json!({"content": "Hi"})),
            json!({"error": {"message": "Rate limit reached", "type": "rate_limit"}}),
        ])
        .err()
        .map(|e| e.to_string());
        assert_eq!(err.as_deref(), Some("model API error: Rate limit reached"));
        let long = "x".repeat(2000);
        let err = decode(&[json!({"error": long})])
            .err()
            .map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.chars().count() <= 520 && e.ends_with('…')));
    }

    #[test]
    fn a_stream_cut_off_before_finishing_is_an_error() {
        let mut decoder = StreamDecoder::new("t");
        decoder.push(&delta(json!({"content": "Hel"}))).unwrap();
        assert!(decoder.finish().is_err());
        // A finish reason without `[DONE]` is complete enough.
        let mut decoder = StreamDecoder::new("t");
        decoder.push(&delta(json!({"content": "Hel"}))).unwrap();
        assert_eq!(decoder.push(&finish("stop")).unwrap(), vec![end("t-msg-1")]);
        assert_eq!(decoder.finish().unwrap(), Vec::<Event>::new());
    }

    #[test]
    fn a_tool_call_that_never_got_a_name_is_an_error() {
        let err = decode(&[delta(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
        )]);
        assert!(err.is_err());
    }
}
