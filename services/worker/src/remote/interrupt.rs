//! An agent's AG-UI interrupt as a Switchboard prompt, and the prompt's outcome as the AG-UI
//! `resume` the agent gets with the thread's next run. Pure.

use chrono::{DateTime, Utc};
use protocol::interaction::{
    DEFAULT_PROMPT_ERROR, InputType, MAX_PROMPT_TIMEOUT_SECS, Prompt, PromptOption, PromptOutcome,
};
use serde_json::{Value, json};

use super::verify::ProtocolError;

/// The question asked when an interrupt carries no message.
const DEFAULT_QUESTION: &str = "The agent needs your input.";
/// The options of an approval prompt (their values are what the user's answer is).
const APPROVE: &str = "approve";
const DENY: &str = "deny";

/// Whether the interrupt asks for an approval: its `responseSchema` has a boolean `approved`
/// (Pydantic AI's tool approval, for one).
fn is_approval(interrupt: &Value) -> bool {
    interrupt
        .pointer("/responseSchema/properties/approved/type")
        .and_then(Value::as_str)
        == Some("boolean")
}

/// The interrupts of a `RUN_FINISHED` `outcome`, if it is `{"type": "interrupt", ...}`; each must
/// be an object with a string `id`.
pub fn interrupts(outcome: Option<&Value>) -> Result<Vec<Value>, ProtocolError> {
    let Some(outcome) = outcome else {
        return Ok(Vec::new());
    };
    if outcome.get("type").and_then(Value::as_str) != Some("interrupt") {
        return Ok(Vec::new());
    }
    let list = outcome
        .get("interrupts")
        .and_then(Value::as_array)
        .filter(|list| !list.is_empty())
        .ok_or_else(|| {
            ProtocolError("RUN_FINISHED outcome interrupt without interrupts".to_owned())
        })?;
    for interrupt in list {
        if interrupt
            .get("id")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            return Err(ProtocolError("an interrupt without a string id".to_owned()));
        }
    }
    Ok(list.clone())
}

/// The prompt the user sees for `interrupts` (the first one's question; an agent that knows
/// Switchboard may put a whole prompt in `metadata.prompt`): a choice when its `responseSchema`
/// is a string `enum`, free text otherwise; its `expiresAt` becomes the timeout.
pub fn prompt_of(interrupts: &[Value], now: DateTime<Utc>) -> Result<Prompt, ProtocolError> {
    let first = interrupts
        .first()
        .ok_or_else(|| ProtocolError("no interrupt to ask".to_owned()))?;
    let timeout = match first.get("expiresAt").and_then(Value::as_str) {
        None => None,
        Some(at) => {
            let at = DateTime::parse_from_rfc3339(at).map_err(|_| {
                ProtocolError(format!(
                    "interrupt expiresAt {at:?} is not an RFC 3339 time"
                ))
            })?;
            let ms = (at.with_timezone(&Utc) - now).num_milliseconds().max(1000);
            Some(
                u64::try_from(ms)
                    .unwrap_or(1000)
                    .div_ceil(1000)
                    .min(MAX_PROMPT_TIMEOUT_SECS),
            )
        }
    };
    if let Some(own) = first.pointer("/metadata/prompt")
        && let Ok(mut prompt) = serde_json::from_value::<Prompt>(own.clone())
        && prompt.validate().is_ok()
    {
        prompt.timeout = timeout.or(prompt.timeout);
        return Ok(prompt);
    }
    let text = first
        .get("message")
        .and_then(Value::as_str)
        .filter(|m| !m.trim().is_empty())
        .unwrap_or(DEFAULT_QUESTION)
        .to_owned();
    let choices: Vec<String> = first
        .pointer("/responseSchema/enum")
        .and_then(Value::as_array)
        .map(|values| {
            values
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let distinct = {
        let mut sorted = choices.clone();
        sorted.sort();
        sorted.dedup();
        sorted.len() == choices.len()
    };
    let option = |value: &str, label: &str| PromptOption {
        id: value.to_owned(),
        label: label.to_owned(),
        value: value.to_owned(),
        description: None,
    };
    let (input_type, options) = if is_approval(first) {
        (
            InputType::BinaryChoice,
            vec![option(APPROVE, "Approve"), option(DENY, "Deny")],
        )
    } else if choices.len() >= 2 && distinct {
        let options = choices
            .iter()
            .map(|choice| option(choice, choice))
            .collect();
        let kind = if choices.len() == 2 {
            InputType::BinaryChoice
        } else {
            InputType::Radio
        };
        (kind, options)
    } else {
        (InputType::Text, Vec::new())
    };
    let prompt = Prompt {
        input_type,
        text,
        placeholder: None,
        options,
        required: true,
        timeout,
        error: DEFAULT_PROMPT_ERROR.to_owned(),
    };
    prompt
        .validate()
        .map_err(|reason| ProtocolError(format!("the interrupt cannot be asked: {reason}")))?;
    Ok(prompt)
}

/// The AG-UI `resume` answering every interrupt of `interrupts` with `outcome` (an approval's
/// `approve` / `deny` as `{"approved": true|false}`).
pub fn resume(interrupts: &[Value], outcome: &PromptOutcome) -> Vec<Value> {
    interrupts
        .iter()
        .filter_map(|interrupt| Some((interrupt, interrupt.get("id").and_then(Value::as_str)?)))
        .map(|(interrupt, id)| match outcome {
            PromptOutcome::Resolved { payload } => {
                let payload = match payload.as_str() {
                    Some(answer) if is_approval(interrupt) => {
                        json!({"approved": answer == APPROVE})
                    }
                    _ => payload.clone(),
                };
                json!({"interruptId": id, "status": "resolved", "payload": payload})
            }
            PromptOutcome::TimedOut | PromptOutcome::Cancelled => {
                json!({"interruptId": id, "status": "cancelled"})
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::from_timestamp(1_750_000_000, 0).unwrap()
    }

    #[test]
    fn only_an_interrupt_outcome_has_interrupts_and_each_needs_an_id() {
        assert!(interrupts(None).unwrap().is_empty());
        assert!(
            interrupts(Some(&json!({"type": "success"})))
                .unwrap()
                .is_empty()
        );
        let one = json!({"type": "interrupt", "interrupts": [{"id": "i1", "message": "Go?"}]});
        assert_eq!(interrupts(Some(&one)).unwrap().len(), 1);
        assert!(interrupts(Some(&json!({"type": "interrupt", "interrupts": []}))).is_err());
        assert!(
            interrupts(Some(
                &json!({"type": "interrupt", "interrupts": [{"message": "x"}]})
            ))
            .is_err()
        );
    }

    #[test]
    fn an_interrupt_becomes_a_text_or_choice_prompt_with_its_deadline() {
        let text = prompt_of(
            &[json!({"id": "i", "message": "Which city?", "expiresAt": "2025-06-15T15:07:30Z"})],
            now(),
        )
        .unwrap();
        assert_eq!(text.input_type, InputType::Text);
        assert_eq!(text.text, "Which city?");
        assert_eq!(text.timeout, Some(1_750_000_050 - 1_750_000_000));
        assert!(text.required);
        let choice = prompt_of(
            &[json!({"id": "i", "responseSchema": {"type": "string", "enum": ["a", "b", "c"]}})],
            now(),
        )
        .unwrap();
        assert_eq!(choice.input_type, InputType::Radio);
        assert_eq!(choice.text, DEFAULT_QUESTION);
        assert_eq!(choice.options.len(), 3);
        assert_eq!(choice.timeout, None);
        let yes_no = prompt_of(
            &[json!({"id": "i", "responseSchema": {"enum": ["yes", "no"]}})],
            now(),
        )
        .unwrap();
        assert_eq!(yes_no.input_type, InputType::BinaryChoice);
        assert!(prompt_of(&[json!({"id": "i", "expiresAt": "soon"})], now()).is_err());
        let own = json!({"input_type": "checkbox", "text": "Pick", "required": false, "timeout": 30,
            "error": "gone", "options": [{"id": "a", "label": "A", "value": "a"}, {"id": "b", "label": "B", "value": "b"}]});
        let kept = prompt_of(&[json!({"id": "i", "metadata": {"prompt": own}})], now()).unwrap();
        assert_eq!(kept.input_type, InputType::Checkbox);
        assert_eq!(kept.timeout, Some(30));
    }

    #[test]
    fn an_approval_is_a_binary_choice_answered_as_approved() {
        let approval = json!({"id": "int-c1", "reason": "tool_call", "message": "Approve ask?",
            "responseSchema": {"type": "object", "properties": {"approved": {"type": "boolean"}}, "required": ["approved"]}});
        let prompt = prompt_of(std::slice::from_ref(&approval), now()).unwrap();
        assert_eq!(prompt.input_type, InputType::BinaryChoice);
        assert_eq!(prompt.text, "Approve ask?");
        let values: Vec<&str> = prompt.options.iter().map(|o| o.value.as_str()).collect();
        assert_eq!(values, [APPROVE, DENY]);
        let yes = PromptOutcome::Resolved {
            payload: json!("approve"),
        };
        assert_eq!(
            resume(std::slice::from_ref(&approval), &yes),
            [json!({"interruptId": "int-c1", "status": "resolved", "payload": {"approved": true}})]
        );
        let no = PromptOutcome::Resolved {
            payload: json!("deny"),
        };
        assert_eq!(
            resume(&[approval], &no)[0]["payload"],
            json!({"approved": false})
        );
    }

    #[test]
    fn the_outcome_answers_every_interrupt() {
        let list = [json!({"id": "a"}), json!({"id": "b"})];
        let payload = json!("Paris");
        assert_eq!(
            resume(&list, &PromptOutcome::Resolved { payload }),
            [
                json!({"interruptId": "a", "status": "resolved", "payload": "Paris"}),
                json!({"interruptId": "b", "status": "resolved", "payload": "Paris"})
            ]
        );
        assert_eq!(
            resume(&list[..1], &PromptOutcome::TimedOut),
            [json!({"interruptId": "a", "status": "cancelled"})]
        );
    }
}
