//! Human-in-the-loop prompts: what an agent asks (`system_interaction_message` content of
//! `websocket-message-schema.md`), the stored prompt both transports answer (the WebSocket's
//! `user_interaction_message` and AG-UI 1.0's `resume`), and the AG-UI `Interrupt` it becomes.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use uuid::Uuid;

/// The seed's default `error` of a prompt.
pub const DEFAULT_PROMPT_ERROR: &str = "This prompt is no longer available.";
/// `Interrupt.reason` of a human-in-the-loop prompt.
pub const INTERRUPT_REASON: &str = "human_input";
/// `CUSTOM` event the worker emits when a prompt timed out, before the agent goes on.
pub const INTERACTION_TIMEOUT_EVENT: &str = "interaction_timeout";
/// Longest prompt timeout, in seconds (one day).
pub const MAX_PROMPT_TIMEOUT_SECS: u64 = 86_400;

/// `input_type` of a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputType {
    /// Free text.
    Text,
    /// Two options (yes/no, continue/cancel).
    BinaryChoice,
    /// One of several options.
    Radio,
    /// Any number of options.
    Checkbox,
    /// One of several options, as a list.
    Dropdown,
}

/// One option of a choice prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptOption {
    /// Option id.
    pub id: String,
    /// What the user sees.
    pub label: String,
    /// What the agent gets.
    pub value: String,
    /// Longer explanation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A prompt, as the seed's `system_interaction_message` content carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prompt {
    /// Kind of answer wanted.
    pub input_type: InputType,
    /// The question.
    pub text: String,
    /// Hint in an empty text field (text prompts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placeholder: Option<String>,
    /// The options (choice prompts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<PromptOption>,
    /// Whether an answer is required.
    pub required: bool,
    /// Seconds the user has to answer; `null` for no limit.
    pub timeout: Option<u64>,
    /// What the client shows when the prompt is no longer answerable.
    pub error: String,
}

impl Prompt {
    /// Checks what the agent asked: a question, options for choice prompts (two for a binary
    /// choice), none for text, distinct option ids and values, a bounded timeout.
    pub fn validate(&self) -> Result<(), String> {
        if self.text.trim().is_empty() || self.text.chars().count() > 4000 {
            return Err("text must be 1 to 4000 characters".to_owned());
        }
        match self.input_type {
            InputType::Text if !self.options.is_empty() => {
                return Err("a text prompt has no options".to_owned());
            }
            InputType::BinaryChoice if self.options.len() != 2 => {
                return Err("a binary_choice prompt has exactly two options".to_owned());
            }
            InputType::Radio | InputType::Checkbox | InputType::Dropdown
                if self.options.is_empty() || self.options.len() > 50 =>
            {
                return Err("a choice prompt has 1 to 50 options".to_owned());
            }
            _ => {}
        }
        let mut seen = std::collections::HashSet::new();
        for option in &self.options {
            if !seen.insert(&option.id) || !seen.insert(&option.value) && option.value != option.id
            {
                return Err("option ids and values must be distinct".to_owned());
            }
        }
        if self
            .timeout
            .is_some_and(|t| t == 0 || t > MAX_PROMPT_TIMEOUT_SECS)
        {
            return Err(format!(
                "timeout must be 1 to {MAX_PROMPT_TIMEOUT_SECS} seconds"
            ));
        }
        Ok(())
    }

    /// Checks an answer and normalises it: the text for a text prompt, the chosen option's
    /// `value` for single-choice prompts, the list of values for a checkbox. An option may be
    /// named by id, value or label; a checkbox answer is a JSON array or a comma-separated
    /// list. A prompt with `required: false` may be skipped with an empty answer (or `null`):
    /// `""` for text, `null` for a single choice, `[]` for a checkbox.
    pub fn check_answer(&self, answer: &Value) -> Result<Value, String> {
        let find = |wanted: &str| {
            let wanted = wanted.trim();
            self.options
                .iter()
                .find(|o| o.id == wanted || o.value == wanted || o.label == wanted)
                .map(|o| Value::String(o.value.clone()))
                .ok_or_else(|| {
                    let values: Vec<&str> = self.options.iter().map(|o| o.value.as_str()).collect();
                    format!("answer must be one of: {}", values.join(", "))
                })
        };
        // A prompt that is not required may be skipped: no answer (an empty one, or null).
        let skipped = match answer {
            Value::Null => true,
            Value::String(text) => text.trim().is_empty(),
            Value::Array(items) => items.is_empty(),
            _ => false,
        };
        if skipped && !self.required {
            return Ok(match self.input_type {
                InputType::Text => Value::String(String::new()),
                InputType::Checkbox => Value::Array(Vec::new()),
                _ => Value::Null,
            });
        }
        match self.input_type {
            InputType::Text => {
                let text = answer.as_str().ok_or("answer must be text")?;
                if self.required && text.trim().is_empty() {
                    return Err("an answer is required".to_owned());
                }
                if text.chars().count() > 10_000 {
                    return Err("answer must be at most 10000 characters".to_owned());
                }
                Ok(Value::String(text.to_owned()))
            }
            InputType::BinaryChoice | InputType::Radio | InputType::Dropdown => {
                find(answer.as_str().ok_or("answer must be one option")?)
            }
            InputType::Checkbox => {
                let picked: Vec<String> = match answer {
                    Value::Array(items) => items
                        .iter()
                        .map(|v| {
                            v.as_str()
                                .map(str::to_owned)
                                .ok_or("answer must be options")
                        })
                        .collect::<Result<_, _>>()?,
                    Value::String(list) => list
                        .split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .collect(),
                    _ => return Err("answer must be a list of options".to_owned()),
                };
                if self.required && picked.is_empty() {
                    return Err("pick at least one option".to_owned());
                }
                let values = picked
                    .iter()
                    .map(|p| find(p))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Value::Array(values))
            }
        }
    }

    /// JSON Schema of a valid answer (AG-UI's `Interrupt.responseSchema`).
    pub fn response_schema(&self) -> Value {
        let values: Vec<&str> = self.options.iter().map(|o| o.value.as_str()).collect();
        match self.input_type {
            InputType::Text => json!({"type": "string"}),
            InputType::Checkbox => {
                json!({"type": "array", "items": {"type": "string", "enum": values}, "uniqueItems": true})
            }
            _ => json!({"type": "string", "enum": values}),
        }
    }
}

/// Where a stored prompt stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptStatus {
    /// Waiting for an answer.
    Pending,
    /// Answered (from either transport).
    Answered,
    /// Not answered in time; the agent got a timeout error.
    TimedOut,
    /// Abandoned by the user (`resume` with status `cancelled`).
    Cancelled,
}

/// A prompt as stored in the prompts bucket (key [`prompt_key`]): one store for every
/// transport.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptRecord {
    /// The prompt's id (the interrupt id, the interaction message id).
    pub prompt_id: String,
    /// The task that asked.
    pub task_id: Uuid,
    /// The run's owner.
    pub owner: String,
    /// Thread (conversation) id.
    pub thread_id: String,
    /// Run id of the asking run.
    pub run_id: String,
    /// The user message the run answered (WebSocket `parent_id`).
    pub parent_id: String,
    /// The question.
    pub prompt: Prompt,
    /// When it was asked.
    pub created_at: DateTime<Utc>,
    /// When it stops being answerable (`None`: never).
    pub expires_at: Option<DateTime<Utc>>,
    /// Where it stands.
    pub status: PromptStatus,
    /// The normalised answer, once answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<Value>,
    /// Run id of the run that continues after the answer or the timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuation_run_id: Option<String>,
    /// The agent that asked; the continuation goes to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

impl PromptRecord {
    /// Whether the prompt can no longer be answered at `now`.
    pub fn expired(&self, now: DateTime<Utc>) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }

    /// Whole seconds left to answer at `now` (`None`: no limit); at least 1 while answerable.
    pub fn remaining_secs(&self, now: DateTime<Utc>) -> Option<u64> {
        self.expires_at.map(|at| {
            let ms = (at - now).num_milliseconds().max(0);
            u64::try_from(ms).unwrap_or(0).div_ceil(1000)
        })
    }

    /// The prompt with `timeout` set to the time left at `now`, for a client that (re)connects.
    pub fn prompt_at(&self, now: DateTime<Utc>) -> Prompt {
        Prompt {
            timeout: self.remaining_secs(now),
            ..self.prompt.clone()
        }
    }

    /// AG-UI 1.0's `Interrupt` for this prompt.
    pub fn interrupt(&self) -> Value {
        let mut interrupt = json!({
            "id": self.prompt_id,
            "reason": INTERRUPT_REASON,
            "message": self.prompt.text,
            "responseSchema": self.prompt.response_schema(),
            "metadata": {"prompt": self.prompt},
        });
        if let Some(at) = self.expires_at {
            interrupt["expiresAt"] = json!(at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
        }
        interrupt
    }
}

/// The continuation a run gets after a prompt: what the user answered, or why not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum PromptOutcome {
    /// Answered with this (normalised) value.
    Resolved {
        /// The answer.
        payload: Value,
    },
    /// Not answered in time.
    TimedOut,
    /// Abandoned.
    Cancelled,
}

/// KV key of a prompt.
pub fn prompt_key(prompt_id: &str) -> String {
    format!("prompt.{}", crate::messaging::short_digest(prompt_id))
}

/// KV key (in the prompts bucket) of the last prompt asked on `(owner, threadId)`: where a
/// client joining the thread finds the question that may still wait for it.
pub fn thread_prompt_key(owner: &str, thread_id: &str) -> String {
    format!("thread.{}", crate::messaging::digest(&[owner, thread_id]))
}

/// The last prompt asked on a thread ([`thread_prompt_key`]): which prompt, and the run that
/// asked it (its events end with the question).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadPrompt {
    /// The prompt's id ([`prompt_key`] finds its record, and whether it still waits).
    pub prompt_id: String,
    /// The task that asked.
    pub task_id: Uuid,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_that_is_not_required_may_be_skipped_and_one_that_is_may_not() {
        for (input_type, skipped) in [
            ("text", json!("")),
            ("binary_choice", Value::Null),
            ("radio", Value::Null),
            ("dropdown", Value::Null),
            ("checkbox", json!([])),
        ] {
            let mut prompt = radio();
            prompt.input_type = serde_json::from_value(json!(input_type)).unwrap();
            prompt.required = false;
            for empty in [json!(""), json!("  "), Value::Null, json!([])] {
                assert_eq!(
                    prompt.check_answer(&empty),
                    Ok(skipped.clone()),
                    "{input_type} {empty}"
                );
            }
            prompt.required = true;
            assert!(
                prompt.check_answer(&json!("")).is_err(),
                "{input_type}: required"
            );
        }
    }

    fn radio() -> Prompt {
        serde_json::from_value(json!({
            "input_type": "radio",
            "text": "Please select your preferred notification method:",
            "options": [
                {"id": "email", "label": "Email", "value": "email", "description": "Receive notifications via email"},
                {"id": "sms", "label": "SMS", "value": "sms", "description": "Receive notifications via SMS"}
            ],
            "required": true,
            "timeout": null,
            "error": "This prompt is no longer available."
        }))
        .unwrap()
    }

    #[test]
    fn the_seed_prompt_round_trips_and_validates() {
        let prompt = radio();
        assert_eq!(prompt.validate(), Ok(()));
        let back = serde_json::to_value(&prompt).unwrap();
        assert_eq!(
            back["timeout"],
            Value::Null,
            "timeout stays present as null"
        );
        assert_eq!(
            back["options"][0]["description"],
            "Receive notifications via email"
        );
    }

    #[test]
    fn answers_are_checked_and_normalised_per_input_type() {
        let prompt = radio();
        assert_eq!(prompt.check_answer(&json!("SMS")), Ok(json!("sms")));
        assert!(
            prompt
                .check_answer(&json!("fax"))
                .unwrap_err()
                .contains("email, sms")
        );
        let checkbox = Prompt {
            input_type: InputType::Checkbox,
            ..radio()
        };
        assert_eq!(
            checkbox.check_answer(&json!("email, sms")),
            Ok(json!(["email", "sms"]))
        );
        assert_eq!(
            checkbox.check_answer(&json!(["Email"])),
            Ok(json!(["email"]))
        );
        assert!(checkbox.check_answer(&json!("")).is_err(), "required");
        let text = Prompt {
            input_type: InputType::Text,
            options: Vec::new(),
            ..radio()
        };
        assert_eq!(text.check_answer(&json!("hi")), Ok(json!("hi")));
        assert!(text.check_answer(&json!(" ")).is_err());
        assert!(text.check_answer(&json!(3)).is_err());
    }

    #[test]
    fn bad_prompts_are_refused() {
        let binary = Prompt {
            input_type: InputType::BinaryChoice,
            ..radio()
        };
        assert_eq!(binary.validate(), Ok(()));
        let mut three = binary.clone();
        three.options.push(PromptOption {
            id: "x".into(),
            label: "X".into(),
            value: "x".into(),
            description: None,
        });
        assert!(three.validate().is_err());
        let forever = Prompt {
            timeout: Some(MAX_PROMPT_TIMEOUT_SECS + 1),
            ..radio()
        };
        assert!(forever.validate().is_err());
    }

    #[test]
    fn the_interrupt_carries_the_schema_and_expiry() {
        let record = PromptRecord {
            prompt_id: "p1".into(),
            task_id: Uuid::nil(),
            owner: "alice".into(),
            thread_id: "t".into(),
            run_id: "r".into(),
            parent_id: "m".into(),
            prompt: radio(),
            created_at: Utc::now(),
            expires_at: DateTime::from_timestamp(2_000_000_000, 0),
            status: PromptStatus::Pending,
            answer: None,
            continuation_run_id: None,
            agent: None,
        };
        let interrupt = record.interrupt();
        assert_eq!(interrupt["id"], "p1");
        assert_eq!(interrupt["responseSchema"]["enum"], json!(["email", "sms"]));
        assert_eq!(interrupt["expiresAt"], "2033-05-18T03:33:20.000Z");
        let now = DateTime::from_timestamp(2_000_000_000 - 90, 500_000_000).unwrap();
        assert_eq!(record.remaining_secs(now), Some(90));
        assert_eq!(record.prompt_at(now).timeout, Some(90));
    }
}
