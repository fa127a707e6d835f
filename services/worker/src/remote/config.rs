//! The remote agents file (`SB_WORKER_AGENTS_FILE`): a TOML list of `[[agents]]`, each an AG-UI
//! endpoint this worker relays runs to. Read once at start; anything wrong in it stops the
//! worker with the file's name and the line of the mistake.
//!
//! ```toml
//! [[agents]]
//! name = "research"                               # what forwardedProps.agent names
//! url = "https://research.internal/agent"         # takes RunAgentInput, answers SSE
//! description = "Finds and summarises sources."
//! default = true                                  # runs that name no agent go here
//! headers = { Authorization = "Bearer ${RESEARCH_TOKEN}" }
//! owner_header = "X-Switchboard-Owner"            # the run's owner, only if named
//! files = "urls"                                  # or "text"
//! max_concurrency = 8                             # runs at once on this replica
//! connect_timeout_secs = 10
//! first_event_timeout_secs = 60
//! idle_timeout_secs = 300
//! run_timeout_secs = 1800
//! max_event_bytes = 786432
//! retries = 2
//! input_schema = { parts = [{ contentType = "text/{plain,markdown}" }, { name = "/attachments/*" }] }
//! output_schema = '{"parts": [{"contentType": "text/markdown"}]}'
//! ```

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use protocol::agents::valid_agent_name;
use protocol::message_body::MessageBodySchema;
use reqwest::header::{HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::json;
use toml::Spanned;

/// How the user's files reach a remote agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FilesMode {
    /// As AG-UI `binary` parts whose `url` is a short-lived signed download link (default).
    Urls,
    /// As text parts holding the extracted content (for agents that cannot fetch a URL).
    Text,
}

/// The time limits of one remote run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// To open the connection.
    pub connect: Duration,
    /// From the request to the agent's first event.
    pub first_event: Duration,
    /// Between two events.
    pub idle: Duration,
    /// The whole run.
    pub run: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(10),
            first_event: Duration::from_secs(60),
            idle: Duration::from_secs(300),
            run: Duration::from_secs(1800),
        }
    }
}

/// Largest bound an agent may set, and the default: an event is published to JetStream, whose
/// messages are at most 1 MiB with the envelope (a framework's state snapshot may carry the
/// whole conversation, so the default is this largest bound).
pub const MAX_EVENT_BYTES: usize = 768 * 1024;
/// Default bound on one event's data.
pub const DEFAULT_MAX_EVENT_BYTES: usize = MAX_EVENT_BYTES;
/// Default tries after a failed connection (before any event).
pub const DEFAULT_RETRIES: u32 = 2;
/// Headers the relay sets itself; the file may not.
const RESERVED_HEADERS: &[&str] = &[
    "accept",
    "content-type",
    "content-length",
    "host",
    "transfer-encoding",
    "traceparent",
    "tracestate",
];

/// One configured remote agent, checked.
#[derive(Debug, Clone)]
pub struct RemoteAgentConfig {
    /// Its name (`forwardedProps.agent`).
    pub name: String,
    /// Its AG-UI endpoint.
    pub url: url::Url,
    /// For people.
    pub description: String,
    /// Whether runs that name no agent go to it.
    pub default: bool,
    /// Headers sent with every request, environment variables expanded.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The header that carries the run's owner, if the agent is to know it.
    pub owner_header: Option<HeaderName>,
    /// What it accepts.
    pub input_schema: MessageBodySchema,
    /// What it promises to produce.
    pub output_schema: MessageBodySchema,
    /// How files reach it.
    pub files: FilesMode,
    /// Runs at once on this replica (`None`: the replica's concurrency).
    pub max_concurrency: Option<usize>,
    /// Time limits.
    pub timeouts: Timeouts,
    /// Largest event data accepted.
    pub max_event_bytes: usize,
    /// Tries again after a failed connection, before any event.
    pub retries: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    agents: Vec<Spanned<RawAgent>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    name: Spanned<String>,
    url: Spanned<String>,
    description: String,
    default: Option<Spanned<bool>>,
    #[serde(default)]
    headers: BTreeMap<String, Spanned<String>>,
    owner_header: Option<Spanned<String>>,
    input_schema: Option<Spanned<serde_json::Value>>,
    output_schema: Option<Spanned<serde_json::Value>>,
    files: Option<FilesMode>,
    max_concurrency: Option<Spanned<usize>>,
    connect_timeout_secs: Option<Spanned<f64>>,
    first_event_timeout_secs: Option<Spanned<f64>>,
    idle_timeout_secs: Option<Spanned<f64>>,
    run_timeout_secs: Option<Spanned<f64>>,
    max_event_bytes: Option<Spanned<usize>>,
    retries: Option<Spanned<u32>>,
}

/// The default input schema: text and files.
pub fn default_input_schema() -> Result<MessageBodySchema, serde_json::Error> {
    schema(json!({"parts": [
        {"contentType": "text/{plain,markdown}"},
        {"name": "/attachments/*"}
    ]}))
}

/// The default output schema: markdown, tool calls and files, none required (an agent may
/// answer with a tool call only, or stop on a question).
pub fn default_output_schema() -> Result<MessageBodySchema, serde_json::Error> {
    schema(json!({"parts": [
        {"contentType": "text/markdown"},
        {"name": "/tool_calls/*", "contentType": "application/json"},
        {"name": "/files/*"}
    ]}))
}

fn schema(value: serde_json::Value) -> Result<MessageBodySchema, serde_json::Error> {
    serde_json::from_value(value)
}

/// Reads and checks the agents file at `path`; `reserved` are names taken by built-in agents.
/// `env` looks up the variables header values name.
pub fn load(
    path: &Path,
    reserved: &[&str],
    env: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<Vec<RemoteAgentConfig>> {
    let source = std::fs::read_to_string(path)
        .map_err(|err| anyhow::anyhow!("cannot read the agents file {}: {err}", path.display()))?;
    parse(&source, reserved, env)
        .map_err(|err| anyhow::anyhow!("agents file {}: {err}", path.display()))
}

/// A mistake in the file, at a line.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct FileError {
    /// 1-based line.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// Parses and checks the text of an agents file.
pub fn parse(
    source: &str,
    reserved: &[&str],
    env: impl Fn(&str) -> Option<String>,
) -> Result<Vec<RemoteAgentConfig>, FileError> {
    let line_of = |span: std::ops::Range<usize>| {
        source[..span.start.min(source.len())]
            .bytes()
            .filter(|&b| b == b'\n')
            .count()
            + 1
    };
    let at = |span: std::ops::Range<usize>, message: String| FileError {
        line: line_of(span),
        message,
    };
    let raw: RawFile = toml::from_str(source).map_err(|err| FileError {
        line: err.span().map_or(1, line_of),
        message: err.message().trim().to_owned(),
    })?;
    let literal = |err: serde_json::Error| FileError {
        line: 1,
        message: format!("a default schema does not build: {err}"),
    };
    let default_input = default_input_schema().map_err(literal)?;
    let default_output = default_output_schema().map_err(literal)?;
    let mut agents: Vec<RemoteAgentConfig> = Vec::with_capacity(raw.agents.len());
    let mut default_line: Option<usize> = None;
    for table in raw.agents {
        let table_span = table.span();
        let raw = table.into_inner();
        let name = raw.name.get_ref();
        if !valid_agent_name(name) {
            return Err(at(
                raw.name.span(),
                format!("name {name:?} must be 1 to 64 of a-z, 0-9 and -"),
            ));
        }
        if reserved.contains(&name.as_str()) {
            return Err(at(
                raw.name.span(),
                format!("name {name:?} is a built-in agent's"),
            ));
        }
        if let Some(earlier) = agents.iter().find(|a| &a.name == name) {
            return Err(at(
                raw.name.span(),
                format!("two agents are named {:?}", earlier.name),
            ));
        }
        let url = url::Url::parse(raw.url.get_ref())
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
            .ok_or_else(|| {
                at(
                    raw.url.span(),
                    format!(
                        "url {:?} must be an absolute http(s) URL",
                        raw.url.get_ref()
                    ),
                )
            })?;
        let is_default = raw.default.as_ref().is_some_and(|d| *d.get_ref());
        if let Some(spanned) = raw.default.as_ref().filter(|_| is_default) {
            if let Some(line) = default_line {
                return Err(at(
                    spanned.span(),
                    format!("a second default agent (the first is on line {line})"),
                ));
            }
            default_line = Some(line_of(spanned.span()));
        }
        let mut headers = Vec::with_capacity(raw.headers.len());
        for (key, value) in &raw.headers {
            let name = HeaderName::from_bytes(key.as_bytes())
                .map_err(|_| at(value.span(), format!("header name {key:?} is not valid")))?;
            if RESERVED_HEADERS.contains(&name.as_str()) {
                return Err(at(
                    value.span(),
                    format!("header {key:?} is set by the relay itself"),
                ));
            }
            let expanded = expand(value.get_ref(), &env).map_err(|m| at(value.span(), m))?;
            let value = HeaderValue::from_str(&expanded)
                .map_err(|_| at(value.span(), format!("header {key:?} has an invalid value")))?;
            headers.push((name, value));
        }
        let owner_header = match &raw.owner_header {
            None => None,
            Some(spanned) => Some(
                HeaderName::from_bytes(spanned.get_ref().as_bytes())
                    .ok()
                    .filter(|name| !RESERVED_HEADERS.contains(&name.as_str()))
                    .ok_or_else(|| {
                        at(
                            spanned.span(),
                            format!(
                                "owner_header {:?} is not a usable header",
                                spanned.get_ref()
                            ),
                        )
                    })?,
            ),
        };
        let body_schema = |field: &str, value: &Option<Spanned<serde_json::Value>>| {
            let Some(spanned) = value else {
                return Ok(None);
            };
            let parsed = match spanned.get_ref() {
                serde_json::Value::String(text) => serde_json::from_str(text),
                other => serde_json::from_value(other.clone()),
            };
            parsed.map(Some).map_err(|err| {
                at(
                    spanned.span(),
                    format!("{field} is not a MessageBodySchema: {err}"),
                )
            })
        };
        let secs = |field: &str, value: &Option<Spanned<f64>>, default: Duration| {
            let Some(spanned) = value else {
                return Ok(default);
            };
            let secs = *spanned.get_ref();
            if !(secs.is_finite() && secs > 0.0 && secs <= 86_400.0) {
                return Err(at(
                    spanned.span(),
                    format!("{field} must be more than 0 and at most 86400"),
                ));
            }
            Ok(Duration::from_secs_f64(secs))
        };
        let defaults = Timeouts::default();
        let timeouts = Timeouts {
            connect: secs(
                "connect_timeout_secs",
                &raw.connect_timeout_secs,
                defaults.connect,
            )?,
            first_event: secs(
                "first_event_timeout_secs",
                &raw.first_event_timeout_secs,
                defaults.first_event,
            )?,
            idle: secs("idle_timeout_secs", &raw.idle_timeout_secs, defaults.idle)?,
            run: secs("run_timeout_secs", &raw.run_timeout_secs, defaults.run)?,
        };
        let max_concurrency = match &raw.max_concurrency {
            Some(spanned) if *spanned.get_ref() == 0 => {
                return Err(at(
                    spanned.span(),
                    "max_concurrency must be at least 1".to_owned(),
                ));
            }
            other => other.as_ref().map(|s| *s.get_ref()),
        };
        let max_event_bytes = match &raw.max_event_bytes {
            Some(spanned) if !(1024..=MAX_EVENT_BYTES).contains(spanned.get_ref()) => {
                return Err(at(
                    spanned.span(),
                    format!("max_event_bytes must be from 1024 to {MAX_EVENT_BYTES}"),
                ));
            }
            other => other
                .as_ref()
                .map_or(DEFAULT_MAX_EVENT_BYTES, |s| *s.get_ref()),
        };
        let retries = match &raw.retries {
            Some(spanned) if *spanned.get_ref() > 10 => {
                return Err(at(spanned.span(), "retries must be at most 10".to_owned()));
            }
            other => other.as_ref().map_or(DEFAULT_RETRIES, |s| *s.get_ref()),
        };
        if raw.description.trim().is_empty() {
            return Err(at(table_span, "description must not be empty".to_owned()));
        }
        agents.push(RemoteAgentConfig {
            name: name.clone(),
            url,
            description: raw.description.clone(),
            default: is_default,
            headers,
            owner_header,
            input_schema: body_schema("input_schema", &raw.input_schema)?
                .unwrap_or_else(|| default_input.clone()),
            output_schema: body_schema("output_schema", &raw.output_schema)?
                .unwrap_or_else(|| default_output.clone()),
            files: raw.files.unwrap_or(FilesMode::Urls),
            max_concurrency,
            timeouts,
            max_event_bytes,
            retries,
        });
    }
    Ok(agents)
}

/// `value` with every `${NAME}` replaced by that environment variable.
fn expand(value: &str, env: &impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unterminated ${{ in {value:?}"))?;
        let name = &after[..end];
        let valid = !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid {
            return Err(format!("${{{name}}} is not an environment variable name"));
        }
        let found = env(name).ok_or_else(|| format!("environment variable {name} is not set"))?;
        out.push_str(&found);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "TOKEN").then(|| "s3cret".to_owned())
    }

    fn error(source: &str) -> String {
        parse(source, &["echo"], env).unwrap_err().to_string()
    }

    const GOOD: &str = r#"
[[agents]]
name = "research"
url = "https://research.internal/agent"
description = "Finds sources."
default = true
headers = { Authorization = "Bearer ${TOKEN}", "X-Team" = "blue" }
owner_header = "X-Switchboard-Owner"
files = "text"
max_concurrency = 3
first_event_timeout_secs = 0.5
input_schema = { parts = [{ contentType = "text/plain", required = true }] }

[[agents]]
name = "plain"
url = "http://127.0.0.1:9000/"
description = "Defaults."
output_schema = '{"parts": [{"contentType": "text/markdown", "required": true}]}'
"#;

    #[test]
    fn a_good_file_gives_every_setting_and_the_defaults() {
        let agents = parse(GOOD, &["echo"], env).unwrap();
        assert_eq!(agents.len(), 2);
        let research = &agents[0];
        assert_eq!(research.name, "research");
        assert_eq!(research.url.as_str(), "https://research.internal/agent");
        assert!(research.default);
        assert_eq!(
            research
                .headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.to_str().unwrap()))
                .collect::<Vec<_>>(),
            [("authorization", "Bearer s3cret"), ("x-team", "blue")]
        );
        assert_eq!(
            research.owner_header.as_ref().map(HeaderName::as_str),
            Some("x-switchboard-owner")
        );
        assert_eq!(research.files, FilesMode::Text);
        assert_eq!(research.max_concurrency, Some(3));
        assert_eq!(research.timeouts.first_event, Duration::from_millis(500));
        assert_eq!(research.timeouts.idle, Timeouts::default().idle);
        assert_eq!(
            serde_json::to_value(&research.input_schema).unwrap(),
            json!({"parts": [{"contentType": "text/plain", "required": true}]})
        );
        assert_eq!(research.output_schema, default_output_schema().unwrap());
        let plain = &agents[1];
        assert!(!plain.default);
        assert_eq!(plain.files, FilesMode::Urls);
        assert_eq!(plain.input_schema, default_input_schema().unwrap());
        assert_eq!(plain.max_event_bytes, DEFAULT_MAX_EVENT_BYTES);
        assert_eq!(plain.retries, DEFAULT_RETRIES);
        assert_eq!(
            serde_json::to_value(&plain.output_schema).unwrap(),
            json!({"parts": [{"contentType": "text/markdown", "required": true}]})
        );
    }

    #[test]
    fn the_default_schemas_build() {
        assert!(default_input_schema().is_ok());
        assert!(default_output_schema().is_ok());
    }

    #[test]
    fn an_empty_file_has_no_agents() {
        assert!(parse("", &[], env).unwrap().is_empty());
    }

    #[test]
    fn each_mistake_names_its_line() {
        let one = |extra: &str| {
            format!("[[agents]]\nname = \"a\"\nurl = \"http://h/\"\ndescription = \"d\"\n{extra}\n")
        };
        assert_eq!(error("[[agents]\nname = 1"), error("[[agents]\nname = 1"));
        assert!(
            error("[[agents]\nname = 1").starts_with("line 1:"),
            "{}",
            error("[[agents]\n")
        );
        let unknown = error(&one("colour = \"red\""));
        assert!(
            unknown.starts_with("line 5:") && unknown.contains("colour"),
            "{unknown}"
        );
        let ftp = error("[[agents]]\nname = \"a\"\nurl = \"ftp://h/\"\ndescription = \"d\"\n");
        assert!(
            ftp.starts_with("line 3:") && ftp.contains("http(s)"),
            "{ftp}"
        );
        let two_defaults = error(&format!(
            "{}{}",
            one("default = true"),
            one("default = true").replace("\"a\"", "\"b\"")
        ));
        assert!(
            two_defaults.starts_with("line 10:") && two_defaults.contains("line 5"),
            "{two_defaults}"
        );
        let twice = error(&format!("{}{}", one(""), one("")));
        assert!(
            twice.starts_with("line 7:") && twice.contains("two agents"),
            "{twice}"
        );
        let builtin =
            error("[[agents]]\nname = \"echo\"\nurl = \"http://h/\"\ndescription = \"d\"\n");
        assert!(
            builtin.starts_with("line 2:") && builtin.contains("built-in"),
            "{builtin}"
        );
        let bad_name =
            error("[[agents]]\nname = \"Big Name\"\nurl = \"http://h/\"\ndescription = \"d\"\n");
        assert!(bad_name.starts_with("line 2:"), "{bad_name}");
        let missing = error("[[agents]]\nname = \"a\"\ndescription = \"d\"\n");
        assert!(missing.contains("url"), "{missing}");
        let unset = error(&one("headers = { X = \"${NOPE}\" }"));
        assert!(
            unset.starts_with("line 5:") && unset.contains("NOPE"),
            "{unset}"
        );
        let reserved = error(&one("headers = { Accept = \"x\" }"));
        assert!(reserved.contains("set by the relay"), "{reserved}");
        let zero = error(&one("idle_timeout_secs = 0"));
        assert!(
            zero.starts_with("line 5:") && zero.contains("idle_timeout_secs"),
            "{zero}"
        );
        let schema = error(&one("input_schema = '{\"parts\": 3}'"));
        assert!(
            schema.starts_with("line 5:") && schema.contains("input_schema"),
            "{schema}"
        );
        let files = error(&one("files = \"bytes\""));
        assert!(files.starts_with("line 5:"), "{files}");
        let big = error(&one("max_event_bytes = 10000000"));
        assert!(big.contains("max_event_bytes"), "{big}");
    }

    #[test]
    fn variables_expand_and_bad_references_are_refused() {
        assert_eq!(expand("a ${TOKEN} b", &env).unwrap(), "a s3cret b");
        assert_eq!(expand("plain", &env).unwrap(), "plain");
        assert!(expand("${TOKEN", &env).is_err());
        assert!(expand("${}", &env).is_err());
        assert!(expand("${1X}", &env).is_err());
        assert!(expand("${MISSING}", &env).is_err());
    }
}
