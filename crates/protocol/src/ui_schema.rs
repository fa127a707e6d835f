//! `ui_hints` (what an agent says about how its output should look) and their compilation into
//! the `UiSchemaRenderer` 2.0 structure of `agent-run-input-protocol.md`.
//!
//! An agent attaches hints to one of its messages with the AG-UI event
//! `CUSTOM {"name": "ui_hints", "value": {"messageId": "...", "hints": UiHints}}`. History keeps
//! the validated hints in the message's metadata (`ui_hints`) and compiles them on every read,
//! so a better compiler improves old messages too.
//!
//! Compilation (every part optional; no hints, no schema):
//!
//! ```text
//! root: stack (appearance "card")
//!   title  -> {"type": "text", "content": title, "role": "title"}
//!   status -> {"type": "badge", "label": badge or STATUS, "status": status}
//!   body   -> {"type": "text", "content": body, "role": "body"}
//!   fields -> {"type": "keyValue", "items": [{"label", "value"}]}
//!   items  -> {"type": "list", "items": [{"type": "text", "content": item, "role": "body"}]}
//!   links  -> {"type": "link", "label", "href"} (http and https only)
//! ```

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use ts_rs::TS;

/// Event name of a `CUSTOM` event carrying [`UiHintsEvent`].
pub const UI_HINTS_EVENT: &str = "ui_hints";
/// Largest serialized hints kept, in bytes.
pub const MAX_UI_HINTS_BYTES: usize = 16 * 1024;
/// Longest title or badge, in characters.
const MAX_LABEL_CHARS: usize = 200;
/// Longest body, field value or item, in characters.
const MAX_TEXT_CHARS: usize = 4000;
/// Most fields, items or links.
const MAX_ENTRIES: usize = 50;
/// Locale when the hints name none.
pub const DEFAULT_LOCALE: &str = "en-US";

/// The value of a `CUSTOM ui_hints` event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[serde(rename_all = "camelCase")]
#[ts(export_to = "UiHintsEvent.ts")]
pub struct UiHintsEvent {
    /// The message (assistant or tool) the hints belong to.
    pub message_id: String,
    /// The hints.
    pub hints: UiHints,
}

/// How an agent would like a message shown.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, TS, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[ts(export_to = "UiHints.ts")]
pub struct UiHints {
    /// Heading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub title: Option<String>,
    /// Outcome; shown as a badge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub status: Option<UiStatus>,
    /// Badge label; the upper-cased status when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub badge: Option<String>,
    /// Main text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub body: Option<String>,
    /// Label/value pairs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<UiField>,
    /// Bullet items.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<String>,
    /// Links (http or https).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<UiLink>,
    /// BCP 47 locale, e.g. `zh-CN`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub locale: Option<String>,
    /// Theme.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub theme: Option<UiTheme>,
}

/// A label/value pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[ts(export_to = "UiField.ts")]
pub struct UiField {
    /// Label.
    pub label: String,
    /// Value.
    pub value: String,
}

/// A link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[ts(export_to = "UiLink.ts")]
pub struct UiLink {
    /// Label.
    pub label: String,
    /// `http://` or `https://` URL.
    pub href: String,
}

/// `UiSchemaRenderer.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
#[ts(export_to = "UiStatus.ts")]
pub enum UiStatus {
    /// Informational.
    Info,
    /// Succeeded.
    Success,
    /// Needs attention.
    Warning,
    /// Failed.
    Error,
    /// Still going.
    Pending,
}

impl UiStatus {
    fn as_str(self) -> &'static str {
        match self {
            UiStatus::Info => "info",
            UiStatus::Success => "success",
            UiStatus::Warning => "warning",
            UiStatus::Error => "error",
            UiStatus::Pending => "pending",
        }
    }
}

/// `UiSchemaRenderer.theme`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
#[ts(export_to = "UiTheme.ts")]
pub enum UiTheme {
    /// The client's default.
    Default,
    /// Light.
    Light,
    /// Dark.
    Dark,
}

/// Why hints were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UiHintsError(pub String);

fn bounded(what: &str, text: &str, max: usize) -> Result<(), UiHintsError> {
    if text.chars().count() > max {
        return Err(UiHintsError(format!(
            "{what} is longer than {max} characters"
        )));
    }
    Ok(())
}

impl UiHints {
    /// Checks the bounds: texts, entry counts, link schemes and the locale's form.
    pub fn validate(&self) -> Result<(), UiHintsError> {
        for (what, text) in [("title", &self.title), ("badge", &self.badge)] {
            if let Some(text) = text {
                bounded(what, text, MAX_LABEL_CHARS)?;
            }
        }
        if let Some(body) = &self.body {
            bounded("body", body, MAX_TEXT_CHARS)?;
        }
        if self.fields.len() > MAX_ENTRIES
            || self.items.len() > MAX_ENTRIES
            || self.links.len() > MAX_ENTRIES
        {
            return Err(UiHintsError(format!(
                "fields, items and links take at most {MAX_ENTRIES} entries each"
            )));
        }
        for field in &self.fields {
            bounded("fields[].label", &field.label, MAX_LABEL_CHARS)?;
            bounded("fields[].value", &field.value, MAX_TEXT_CHARS)?;
        }
        for item in &self.items {
            bounded("items[]", item, MAX_TEXT_CHARS)?;
        }
        for link in &self.links {
            bounded("links[].label", &link.label, MAX_LABEL_CHARS)?;
            bounded("links[].href", &link.href, MAX_TEXT_CHARS)?;
            if !(link.href.starts_with("https://") || link.href.starts_with("http://")) {
                return Err(UiHintsError(
                    "links[].href must be an http(s) URL".to_owned(),
                ));
            }
        }
        if let Some(locale) = &self.locale {
            let well_formed = !locale.is_empty()
                && locale.len() <= 35
                && locale.split('-').all(|part| {
                    !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric())
                });
            if !well_formed {
                return Err(UiHintsError(
                    "locale must be a BCP 47 tag such as zh-CN".to_owned(),
                ));
            }
        }
        Ok(())
    }

    /// Parses and validates hints from an event value.
    pub fn parse_event(value: &Value) -> Result<UiHintsEvent, UiHintsError> {
        let size = serde_json::to_vec(value)
            .map(|v| v.len())
            .unwrap_or(usize::MAX);
        if size > MAX_UI_HINTS_BYTES {
            return Err(UiHintsError(format!(
                "ui_hints are larger than {MAX_UI_HINTS_BYTES} bytes"
            )));
        }
        let event: UiHintsEvent =
            serde_json::from_value(value.clone()).map_err(|err| UiHintsError(err.to_string()))?;
        event.hints.validate()?;
        Ok(event)
    }

    /// Compiles the hints into a `UiSchemaRenderer` (version 2.0); `None` when they say nothing.
    pub fn compile(&self) -> Option<Value> {
        let mut children = Vec::new();
        if let Some(title) = &self.title {
            children.push(json!({"type": "text", "content": title, "role": "title"}));
        }
        if let Some(status) = self.status {
            let label = self
                .badge
                .clone()
                .unwrap_or_else(|| status.as_str().to_uppercase());
            children.push(json!({"type": "badge", "label": label, "status": status.as_str()}));
        }
        if let Some(body) = &self.body {
            children.push(json!({"type": "text", "content": body, "role": "body"}));
        }
        if !self.fields.is_empty() {
            let items: Vec<Value> = self
                .fields
                .iter()
                .map(|f| json!({"label": f.label, "value": f.value}))
                .collect();
            children.push(json!({"type": "keyValue", "items": items}));
        }
        if !self.items.is_empty() {
            let items: Vec<Value> = self
                .items
                .iter()
                .map(|item| json!({"type": "text", "content": item, "role": "body"}))
                .collect();
            children.push(json!({"type": "list", "items": items}));
        }
        for link in &self.links {
            children.push(json!({"type": "link", "label": link.label, "href": link.href}));
        }
        if children.is_empty() {
            return None;
        }
        let mut renderer = Map::new();
        renderer.insert("version".into(), json!("2.0"));
        renderer.insert(
            "locale".into(),
            json!(self.locale.as_deref().unwrap_or(DEFAULT_LOCALE)),
        );
        renderer.insert(
            "status".into(),
            json!(self.status.unwrap_or(UiStatus::Info).as_str()),
        );
        let theme = match self.theme.unwrap_or(UiTheme::Default) {
            UiTheme::Default => "default",
            UiTheme::Light => "light",
            UiTheme::Dark => "dark",
        };
        renderer.insert("theme".into(), json!(theme));
        renderer.insert(
            "root".into(),
            json!({"type": "stack", "appearance": "card", "children": children}),
        );
        Some(Value::Object(renderer))
    }
}

/// Compiles stored hints (a message's `metadata.ui_hints`); `None` when absent or unusable.
pub fn compile_stored(hints: Option<&UiHints>) -> Option<Value> {
    let hints = hints?;
    hints.validate().ok()?;
    hints.compile()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_example_compiles_field_for_field() {
        let hints = UiHints {
            title: Some("日程已创建".into()),
            status: Some(UiStatus::Success),
            body: Some("您的会议日程创建成功".into()),
            locale: Some("zh-CN".into()),
            ..UiHints::default()
        };
        let seed = json!({
            "version": "2.0",
            "locale": "zh-CN",
            "status": "success",
            "theme": "default",
            "root": {
                "type": "stack",
                "appearance": "card",
                "children": [
                    {"type": "text", "content": "日程已创建", "role": "title"},
                    {"type": "badge", "label": "SUCCESS", "status": "success"},
                    {"type": "text", "content": "您的会议日程创建成功", "role": "body"}
                ]
            }
        });
        assert_eq!(hints.compile(), Some(seed));
    }

    #[test]
    fn empty_hints_compile_to_nothing() {
        assert_eq!(UiHints::default().compile(), None);
        assert_eq!(compile_stored(None), None);
        assert_eq!(compile_stored(Some(&UiHints::default())), None);
    }

    #[test]
    fn fields_items_links_and_defaults_compile() {
        let hints: UiHints = serde_json::from_value(json!({
            "title": "Report", "fields": [{"label": "Rows", "value": "12"}],
            "items": ["a"], "links": [{"label": "Open", "href": "https://example.com/r"}],
            "theme": "dark"
        }))
        .unwrap();
        let compiled = hints.compile().unwrap();
        assert_eq!(compiled["locale"], "en-US");
        assert_eq!(compiled["status"], "info");
        assert_eq!(compiled["theme"], "dark");
        let kinds: Vec<&str> = compiled["root"]["children"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["text", "keyValue", "list", "link"]);
    }

    #[test]
    fn bad_hints_are_refused_with_the_reason() {
        let cases = [
            (
                json!({"messageId": "m", "hints": {"colour": "red"}}),
                "unknown field",
            ),
            (
                json!({"messageId": "m", "hints": {"status": "great"}}),
                "unknown variant",
            ),
            (
                json!({"messageId": "m", "hints": {"links": [{"label": "x", "href": "javascript:alert(1)"}]}}),
                "http(s)",
            ),
            (
                json!({"messageId": "m", "hints": {"title": "t".repeat(201)}}),
                "title is longer",
            ),
            (
                json!({"messageId": "m", "hints": {"locale": "zh CN"}}),
                "BCP 47",
            ),
            (
                json!({"messageId": "m", "hints": {"body": "b".repeat(20_000)}}),
                "larger than",
            ),
            (json!({"hints": {}}), "messageId"),
        ];
        for (value, expected) in cases {
            let err = UiHints::parse_event(&value).unwrap_err();
            assert!(err.0.contains(expected), "{value}: {err}");
        }
    }
}
