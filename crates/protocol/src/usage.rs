//! Token usage of a run: AG-UI's `TokenUsage` entries (one per provider and model), as the
//! run's terminal event (`RUN_FINISHED` / `RUN_ERROR` `usage`), its status record and its
//! WebSocket end carry them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Tokens one model used in a run (AG-UI `TokenUsage`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenUsage {
    /// Who served the model (`openai` for the OpenAI-compatible backend, or what a remote agent
    /// reported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Prompt tokens.
    #[serde(default)]
    pub input_tokens: u64,
    /// Completion tokens.
    #[serde(default)]
    pub output_tokens: u64,
    /// Both.
    #[serde(default)]
    pub total_tokens: u64,
    /// Of the output, reasoning tokens, where the model reports them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
    /// Of the input, tokens read from the provider's cache, where the model reports them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_tokens: Option<u64>,
}

impl TokenUsage {
    /// The usage an OpenAI-compatible chat completion reports (`usage` of its last chunk with
    /// `stream_options.include_usage`), for `model`; `None` when `usage` is not an object.
    pub fn from_openai(model: &str, usage: &Value) -> Option<Self> {
        let count = |pointer: &str| usage.pointer(pointer).and_then(Value::as_u64);
        usage.as_object()?;
        let input_tokens = count("/prompt_tokens").unwrap_or(0);
        let output_tokens = count("/completion_tokens").unwrap_or(0);
        Some(Self {
            provider: Some("openai".to_owned()),
            model: Some(model.to_owned()),
            input_tokens,
            output_tokens,
            total_tokens: count("/total_tokens").unwrap_or(input_tokens + output_tokens),
            reasoning_tokens: count("/completion_tokens_details/reasoning_tokens"),
            cached_input_tokens: count("/prompt_tokens_details/cached_tokens"),
        })
    }
}

/// Where a run's time went, in milliseconds from its acceptance (what its user waited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunTimings {
    /// Until a worker started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_ms: Option<i64>,
    /// Until its first output: a text message's first content or a tool call's start (none when
    /// it had none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_to_first_token_ms: Option<i64>,
    /// Until it ended.
    pub duration_ms: i64,
}

impl RunTimings {
    /// The timings of a run accepted at `accepted`, started at `started`, first output at
    /// `first_output` and ended at `ended`.
    pub fn of(
        accepted: chrono::DateTime<chrono::Utc>,
        started: Option<chrono::DateTime<chrono::Utc>>,
        first_output: Option<chrono::DateTime<chrono::Utc>>,
        ended: chrono::DateTime<chrono::Utc>,
    ) -> Self {
        let since = |at: chrono::DateTime<chrono::Utc>| (at - accepted).num_milliseconds().max(0);
        Self {
            queued_ms: started.map(since),
            time_to_first_token_ms: first_output.map(since),
            duration_ms: since(ended),
        }
    }
}

/// All tokens of a run's entries.
pub fn total_tokens(usage: &[TokenUsage]) -> u64 {
    usage
        .iter()
        .map(|u| {
            u.total_tokens
                .max(u.input_tokens.saturating_add(u.output_tokens))
        })
        .fold(0, u64::saturating_add)
}

/// Adds `entry` to `usage`: into the entry of the same provider and model, or as a new one.
pub fn add(usage: &mut Vec<TokenUsage>, entry: TokenUsage) {
    let sum = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    };
    match usage
        .iter_mut()
        .find(|u| u.provider == entry.provider && u.model == entry.model)
    {
        Some(known) => {
            known.input_tokens += entry.input_tokens;
            known.output_tokens += entry.output_tokens;
            known.total_tokens += entry.total_tokens;
            known.reasoning_tokens = sum(known.reasoning_tokens, entry.reasoning_tokens);
            known.cached_input_tokens = sum(known.cached_input_tokens, entry.cached_input_tokens);
        }
        None => usage.push(entry),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_openai_usage_object_becomes_a_token_usage_and_same_models_add_up() {
        let reported = json!({"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18,
            "prompt_tokens_details": {"cached_tokens": 3},
            "completion_tokens_details": {"reasoning_tokens": 2}});
        let entry = TokenUsage::from_openai("gpt-x", &reported).unwrap();
        assert_eq!(
            serde_json::to_value(&entry).unwrap(),
            json!({"provider": "openai", "model": "gpt-x", "inputTokens": 11, "outputTokens": 7,
                   "totalTokens": 18, "reasoningTokens": 2, "cachedInputTokens": 3})
        );
        assert_eq!(TokenUsage::from_openai("gpt-x", &Value::Null), None);
        let mut usage = Vec::new();
        add(&mut usage, entry.clone());
        add(&mut usage, entry);
        add(
            &mut usage,
            TokenUsage {
                model: Some("other".to_owned()),
                input_tokens: 1,
                ..TokenUsage::default()
            },
        );
        assert_eq!(usage.len(), 2);
        assert_eq!((usage[0].input_tokens, usage[0].total_tokens), (22, 36));
        assert_eq!(usage[0].cached_input_tokens, Some(6));
    }
}
