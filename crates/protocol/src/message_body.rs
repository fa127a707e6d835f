//! `MessageBody` and `MessageBodySchema` of the message body structure proposal: what agents
//! send and receive, and what they promise to send or accept.
//!
//! A [`MessageBody`] is an ordered list of [`Part`]s, each with an optional name (a POSIX
//! absolute path such as `/sources/1.json`, unique within the message), a media type and either
//! inline `content` or a `contentUrl`. A [`MessageBodySchema`] lists [`SchemaPart`]s whose name
//! and content type are globs (`*` within one path segment, `**` across segments, `{a,b}`
//! alternatives; the [`globset`] crate, compiled once when the schema is built). A message is
//! valid under a schema when every part matches some schema part and every `required` schema
//! part is matched by some part ([`MessageBodySchema::check`]).
//!
//! Guarantee: both types are parsed, not validated later. Their fields are private and every
//! way in (serde, [`MessageBody::new`], [`Part::inline`], [`SchemaPart::new`]) applies the rules,
//! so a value of either type is always well formed, and a refusal names the part index and the
//! rule that failed (`parts[2].name must start with "/"`).
//!
//! [`MessageBodySchema::compatible_with`] decides whether every message valid under an output
//! schema is valid under an input schema. It is sound (it never accepts a pair where some valid
//! output fails the input) and deliberately conservative: glob language containment is only
//! claimed in the easy cases listed on that method, so some compatible pairs are refused.
//!
//! Its work is bounded by construction, because the schemas may come from any caller (finding H2
//! of the security review: two schemas of 256 long brace patterns used to cost seconds of CPU).
//! A pattern's finite language is expanded once, when the pattern is compiled, and only up to
//! 64 words of 4 KiB together; pairs of schema parts are settled
//! without matching first (equal texts, universal patterns, a missing name), then the rest, the
//! cheaper field first; and every step is charged to a [`WorkMeter`] of at most
//! [`MAX_COMPATIBILITY_WORK`] units, past which the comparison stops
//! ([`MessageBodySchema::compatible_within`] says so; [`MessageBodySchema::compatible_with`]
//! reports what it could not prove). A glob's matcher is compiled on its first match, so a
//! schema parsed only to be compared pays for the matchers it is compared against, on the meter.
//!
//! Content types are matched by their media type alone (`type/subtype`, case-insensitively);
//! parameters such as `; charset=utf-8` are kept verbatim and never matched. Names are matched
//! case-sensitively. A schema part without a name matches only parts without a name (the main
//! content); a schema part without a content type accepts any content type.

use std::collections::HashSet;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::OnceLock;

use globset::{Glob, GlobBuilder, GlobMatcher};
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};

/// Most parts in one message.
pub const MAX_PARTS: usize = 256;
/// Longest part name, in bytes.
pub const MAX_NAME_BYTES: usize = 1024;
/// Longest content type (parameters included), in bytes.
pub const MAX_CONTENT_TYPE_BYTES: usize = 255;
/// Longest `contentUrl`, in bytes.
pub const MAX_CONTENT_URL_BYTES: usize = 8 * 1024;
/// Most parts in one schema.
pub const MAX_SCHEMA_PARTS: usize = 256;
/// Longest name or content-type pattern, in bytes.
pub const MAX_PATTERN_BYTES: usize = 1024;
/// Most literal strings a brace pattern is expanded to when proving containment; past that the
/// proof gives up (and says incompatible).
const MAX_EXPANSIONS: usize = 64;
/// Most bytes of those strings, all together (64 words of 64 bytes, or 4 of 1 KiB); past that
/// the proof gives up too. Bounds both the memory a compiled pattern keeps and the matching one
/// containment check does.
const MAX_EXPANSION_BYTES: usize = 4 * 1024;
/// Most units of work one [`MessageBodySchema::compatible_with`] does (a unit is about a byte
/// matched against a glob; see [`WorkMeter`] for what each step costs): ~30 ms of one core
/// whatever the schemas (measured: `cargo bench -p switchboard-protocol --bench compatibility`).
pub const MAX_COMPATIBILITY_WORK: u64 = 1 << 24;
/// Units charged for looking at one pair of schema parts (hashes and flags compared).
const PAIR_UNITS: u64 = 8;
/// Units charged per word matched against a glob, besides one per byte of the word.
const MATCH_UNITS: u64 = 32;
/// Units charged per byte of a glob whose matcher is compiled during a comparison (building the
/// regex costs ~0.25-0.7 us per pattern byte, measured).
const COMPILE_UNITS_PER_BYTE: u64 = 512;
/// Longest `type` or `subtype` of a media type (RFC 6838 `restricted-name`).
const MAX_MEDIA_NAME_BYTES: usize = 127;

// ---------------------------------------------------------------------------------------------
// Parts and bodies.
// ---------------------------------------------------------------------------------------------

/// Why a part was refused. The message names the field and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartError {
    /// The name is longer than [`MAX_NAME_BYTES`].
    #[error("name is longer than {MAX_NAME_BYTES} bytes")]
    NameTooLong,
    /// The name does not start with `/`.
    #[error("name must start with \"/\"")]
    NameNotAbsolute,
    /// The name holds a character outside `A-Z a-z 0-9 . - _ /`.
    #[error(
        "name must contain only A-Z, a-z, 0-9, \".\", \"-\", \"_\" and \"/\" (found {found:?})"
    )]
    NameCharacter {
        /// The first character that is not allowed.
        found: char,
    },
    /// The name holds `//`.
    #[error("name must not contain \"//\"")]
    NameEmptySegment,
    /// The name ends with `/`.
    #[error("name must not end with \"/\"")]
    NameTrailingSlash,
    /// The content type is longer than [`MAX_CONTENT_TYPE_BYTES`].
    #[error("contentType is longer than {MAX_CONTENT_TYPE_BYTES} bytes")]
    ContentTypeTooLong,
    /// The content type is not `type/subtype` (optionally followed by `;` and parameters).
    #[error(
        "contentType must be a media type of the form type/subtype, optionally followed by \";\" and parameters"
    )]
    ContentTypeForm,
    /// Both or neither of `content` and `contentUrl` were given.
    #[error("exactly one of content and contentUrl is required")]
    ContentChoice,
    /// The URL is longer than [`MAX_CONTENT_URL_BYTES`].
    #[error("contentUrl is longer than {MAX_CONTENT_URL_BYTES} bytes")]
    ContentUrlTooLong,
    /// The URL does not parse as an absolute URL.
    #[error("contentUrl must be an absolute URL")]
    ContentUrlForm,
}

impl PartError {
    /// The JSON field the rule is about (`name`, `contentType`, `contentUrl`), or `None` when
    /// the rule is about the part as a whole.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            PartError::NameTooLong
            | PartError::NameNotAbsolute
            | PartError::NameCharacter { .. }
            | PartError::NameEmptySegment
            | PartError::NameTrailingSlash => Some("name"),
            PartError::ContentTypeTooLong | PartError::ContentTypeForm => Some("contentType"),
            PartError::ContentUrlTooLong | PartError::ContentUrlForm => Some("contentUrl"),
            PartError::ContentChoice => None,
        }
    }
}

/// Why a message body was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageBodyError {
    /// More than [`MAX_PARTS`] parts.
    #[error("parts has {count} entries; at most {MAX_PARTS} are allowed")]
    TooManyParts {
        /// How many parts there were.
        count: usize,
    },
    /// Part `index` breaks a rule.
    #[error("parts[{index}]{}{error}", if error.field().is_some() { "." } else { ": " })]
    Part {
        /// Index of the part in `parts`.
        index: usize,
        /// The rule.
        error: PartError,
    },
    /// Part `index` repeats the name of an earlier part.
    #[error("parts[{index}].name {name:?} is not unique")]
    DuplicateName {
        /// Index of the second part with the name.
        index: usize,
        /// The name.
        name: String,
    },
}

/// Checks a part name: a POSIX absolute path of `A-Z a-z 0-9 . - _ /`, without `//`, not
/// ending in `/`, at most [`MAX_NAME_BYTES`] long.
pub fn check_name(name: &str) -> Result<(), PartError> {
    if name.len() > MAX_NAME_BYTES {
        return Err(PartError::NameTooLong);
    }
    if !name.starts_with('/') {
        return Err(PartError::NameNotAbsolute);
    }
    if let Some(found) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/')))
    {
        return Err(PartError::NameCharacter { found });
    }
    if name.contains("//") {
        return Err(PartError::NameEmptySegment);
    }
    if name.ends_with('/') {
        return Err(PartError::NameTrailingSlash);
    }
    Ok(())
}

/// A character of RFC 6838's `restricted-name` (the first one must also be alphanumeric).
fn is_restricted_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '!' | '#' | '$' | '&' | '-' | '^' | '_' | '.' | '+')
}

/// Length in bytes of the `restricted-name` at the start of `text`, if there is a valid one.
fn restricted_name_len(text: &str) -> Option<usize> {
    let len = text
        .find(|c| !is_restricted_name_char(c))
        .unwrap_or(text.len());
    let starts_alphanumeric = text
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric());
    (starts_alphanumeric && len <= MAX_MEDIA_NAME_BYTES).then_some(len)
}

/// The `type/subtype` of a content type: everything before parameters or whitespace.
fn media_type(content_type: &str) -> &str {
    content_type
        .find(|c| !(is_restricted_name_char(c) || c == '/'))
        .map_or(content_type, |end| &content_type[..end])
}

/// Checks a content type: `type/subtype` (RFC 6838 restricted names), optionally followed by
/// optional whitespace, `;` and parameters of printable ASCII, which are kept but not parsed.
pub fn check_content_type(content_type: &str) -> Result<(), PartError> {
    if content_type.len() > MAX_CONTENT_TYPE_BYTES {
        return Err(PartError::ContentTypeTooLong);
    }
    let type_len = restricted_name_len(content_type).ok_or(PartError::ContentTypeForm)?;
    let rest = content_type[type_len..]
        .strip_prefix('/')
        .ok_or(PartError::ContentTypeForm)?;
    let subtype_len = restricted_name_len(rest).ok_or(PartError::ContentTypeForm)?;
    let parameters = &rest[subtype_len..];
    let well_formed = parameters.is_empty()
        || (parameters.trim_start_matches([' ', '\t']).starts_with(';')
            && parameters
                .chars()
                .all(|c| c == '\t' || (' '..='~').contains(&c)));
    if well_formed {
        Ok(())
    } else {
        Err(PartError::ContentTypeForm)
    }
}

/// Where a part's bytes are. Exactly one of the two, by construction.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Content {
    Inline(String),
    Remote(String),
}

/// One part of a message: roughly a file, blob or object.
///
/// JSON: `{"name"?, "contentType", "content" | "contentUrl"}`; `name` is omitted when absent.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawPart")]
pub struct Part {
    name: Option<String>,
    content_type: String,
    content: Content,
}

/// A part as it arrives, before the rules.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawPart {
    #[serde(default)]
    name: Option<String>,
    content_type: String,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    content_url: Option<String>,
}

impl TryFrom<RawPart> for Part {
    type Error = PartError;

    fn try_from(raw: RawPart) -> Result<Self, Self::Error> {
        Part::build(raw.name, raw.content_type, raw.content, raw.content_url)
    }
}

/// A part as it is written.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PartOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    content_type: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_url: Option<&'a str>,
}

impl Serialize for Part {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        PartOut {
            name: self.name(),
            content_type: &self.content_type,
            content: self.content(),
            content_url: self.content_url(),
        }
        .serialize(serializer)
    }
}

impl Part {
    /// A part whose content is carried inline.
    pub fn inline(
        name: Option<String>,
        content_type: impl Into<String>,
        content: impl Into<String>,
    ) -> Result<Self, PartError> {
        Part::build(name, content_type.into(), Some(content.into()), None)
    }

    /// A part whose content is stored elsewhere (an S3-like store) and referenced by URL.
    pub fn remote(
        name: Option<String>,
        content_type: impl Into<String>,
        content_url: impl Into<String>,
    ) -> Result<Self, PartError> {
        Part::build(name, content_type.into(), None, Some(content_url.into()))
    }

    fn build(
        name: Option<String>,
        content_type: String,
        content: Option<String>,
        content_url: Option<String>,
    ) -> Result<Self, PartError> {
        if let Some(name) = &name {
            check_name(name)?;
        }
        check_content_type(&content_type)?;
        let content = match (content, content_url) {
            (Some(content), None) => Content::Inline(content),
            (None, Some(url)) => {
                if url.len() > MAX_CONTENT_URL_BYTES {
                    return Err(PartError::ContentUrlTooLong);
                }
                if url::Url::parse(&url).is_err() {
                    return Err(PartError::ContentUrlForm);
                }
                Content::Remote(url)
            }
            _ => return Err(PartError::ContentChoice),
        };
        Ok(Part {
            name,
            content_type,
            content,
        })
    }

    /// The name (an absolute path), or `None` for main content.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The content type as given, parameters included.
    pub fn content_type(&self) -> &str {
        &self.content_type
    }

    /// The `type/subtype` of the content type, without parameters: what schema content-type
    /// patterns are matched against.
    pub fn media_type(&self) -> &str {
        media_type(&self.content_type)
    }

    /// The inline content, if the part carries it.
    pub fn content(&self) -> Option<&str> {
        match &self.content {
            Content::Inline(content) => Some(content),
            Content::Remote(_) => None,
        }
    }

    /// The content URL, if the content is stored elsewhere.
    pub fn content_url(&self) -> Option<&str> {
        match &self.content {
            Content::Inline(_) => None,
            Content::Remote(url) => Some(url),
        }
    }
}

/// A message: an ordered list of parts with unique names.
///
/// JSON: `{"parts": [Part, ...]}`. Deserializing applies every rule of [`MessageBody::new`] and
/// [`Part`], so any JSON entry point refuses an invalid body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawMessageBody")]
pub struct MessageBody {
    parts: Vec<Part>,
}

/// A body as it arrives, before the rules.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMessageBody {
    parts: Vec<RawPart>,
}

impl TryFrom<RawMessageBody> for MessageBody {
    type Error = MessageBodyError;

    fn try_from(raw: RawMessageBody) -> Result<Self, Self::Error> {
        if raw.parts.len() > MAX_PARTS {
            return Err(MessageBodyError::TooManyParts {
                count: raw.parts.len(),
            });
        }
        let parts = raw
            .parts
            .into_iter()
            .enumerate()
            .map(|(index, part)| {
                Part::try_from(part).map_err(|error| MessageBodyError::Part { index, error })
            })
            .collect::<Result<Vec<_>, _>>()?;
        MessageBody::new(parts)
    }
}

impl MessageBody {
    /// A message of these parts: at most [`MAX_PARTS`], names unique.
    pub fn new(parts: Vec<Part>) -> Result<Self, MessageBodyError> {
        if parts.len() > MAX_PARTS {
            return Err(MessageBodyError::TooManyParts { count: parts.len() });
        }
        let mut seen = HashSet::new();
        for (index, part) in parts.iter().enumerate() {
            if let Some(name) = part.name()
                && !seen.insert(name)
            {
                return Err(MessageBodyError::DuplicateName {
                    index,
                    name: name.to_owned(),
                });
            }
        }
        Ok(MessageBody { parts })
    }

    /// The parts, in order.
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// The parts, in order, by value.
    pub fn into_parts(self) -> Vec<Part> {
        self.parts
    }

    /// The part with this exact name.
    pub fn get(&self, name: &str) -> Option<&Part> {
        self.parts.iter().find(|part| part.name() == Some(name))
    }

    /// The named parts whose name matches the glob `pattern` (same syntax as schema names:
    /// `*` within a segment, `**` across segments, `{a,b}`), in order; `list("/sources/*")`.
    ///
    /// Unnamed parts never match. An invalid pattern (unclosed `[` or `{`, empty, longer than
    /// [`MAX_PATTERN_BYTES`]) matches nothing, so the iterator is empty; use
    /// [`SchemaPart::new`] to find out why a pattern is refused.
    pub fn list(&self, pattern: &str) -> impl Iterator<Item = &Part> {
        let matcher = Pattern::compile(pattern, PatternField::Name).ok();
        self.parts.iter().filter(move |part| {
            matches!((&matcher, part.name()), (Some(pattern), Some(name)) if pattern.is_match(name))
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Schemas.
// ---------------------------------------------------------------------------------------------

/// Which field of a schema part a pattern is for; they compile differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PatternField {
    /// Names: case-sensitive.
    Name,
    /// Media types: case-insensitive, as RFC 6838 says.
    ContentType,
}

impl PatternField {
    fn json_name(self) -> &'static str {
        match self {
            PatternField::Name => "name",
            PatternField::ContentType => "contentType",
        }
    }
}

/// Why a pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} pattern {pattern:?} is invalid: {reason}")]
pub struct PatternError {
    /// `name` or `contentType`.
    pub field: &'static str,
    /// The pattern as given.
    pub pattern: String,
    /// What is wrong with it.
    pub reason: String,
}

/// A glob, its matcher (compiled on first use) and, when it is small and finite, its language.
/// Two patterns of the same field are equal when their text is, which also makes their
/// languages equal.
#[derive(Clone)]
struct Pattern {
    text: String,
    /// A hash of `text`: two patterns are compared without reading their texts, unless equal.
    text_hash: u64,
    glob: Glob,
    /// Compiled on the first match: building the regex of a 1 KiB pattern costs ~0.3 ms, which
    /// a schema parsed only to be compared should not pay for every pattern it holds.
    matcher: OnceLock<GlobMatcher>,
    /// Every string the pattern matches, when that is a small finite set ([`finite_language`]),
    /// expanded once here rather than at every containment check.
    words: Option<Vec<String>>,
    /// Bytes of `words`, all together.
    language_bytes: usize,
}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The compiled matcher's own Debug is pages of automaton; the text says it all.
        f.debug_tuple("Pattern").field(&self.text).finish()
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for Pattern {}

impl Pattern {
    fn compile(text: &str, field: PatternField) -> Result<Self, PatternError> {
        let refuse = |reason: String| PatternError {
            field: field.json_name(),
            pattern: text.to_owned(),
            reason,
        };
        if text.is_empty() {
            return Err(refuse("must not be empty".to_owned()));
        }
        if text.len() > MAX_PATTERN_BYTES {
            return Err(refuse(format!("is longer than {MAX_PATTERN_BYTES} bytes")));
        }
        let glob = GlobBuilder::new(text)
            // `*` stays within one path segment (or one side of `type/subtype`).
            .literal_separator(true)
            .backslash_escape(true)
            .case_insensitive(field == PatternField::ContentType)
            .build()
            .map_err(|err| refuse(err.kind().to_string()))?;
        let mut hasher = std::hash::DefaultHasher::new();
        text.hash(&mut hasher);
        let words = finite_language(text);
        Ok(Pattern {
            text: text.to_owned(),
            text_hash: hasher.finish(),
            glob,
            matcher: OnceLock::new(),
            language_bytes: words
                .as_ref()
                .map_or(0, |words| words.iter().map(String::len).sum()),
            words,
        })
    }

    fn is_match(&self, candidate: &str) -> bool {
        self.matcher
            .get_or_init(|| self.glob.compile_matcher())
            .is_match(candidate)
    }

    /// The matcher, its compilation charged to `meter` when it is not compiled yet.
    fn matcher(&self, meter: &mut WorkMeter) -> Result<&GlobMatcher, TooMuchWork> {
        if let Some(matcher) = self.matcher.get() {
            return Ok(matcher);
        }
        let bytes = u64::try_from(self.text.len()).unwrap_or(u64::MAX);
        meter.charge(bytes.saturating_mul(COMPILE_UNITS_PER_BYTE))?;
        Ok(self.matcher.get_or_init(|| self.glob.compile_matcher()))
    }

    fn same_text(&self, other: &Pattern) -> bool {
        self.text_hash == other.text_hash && self.text == other.text
    }

    /// Whether every string this pattern matches is matched by `other` too (both of the same
    /// field), as far as can be said without matching: the texts are equal, or this pattern's
    /// finite language is to be matched against `other`, or it cannot be proven.
    fn within<'a>(&'a self, other: &'a Pattern) -> Field<'a> {
        if self.same_text(other) {
            Field::Yes
        } else if self.words.is_some() {
            Field::Match {
                narrow: self,
                wide: other,
            }
        } else {
            Field::No
        }
    }

    /// Whether `other` matches every word of this pattern's finite language, each match charged
    /// to `meter`. `false` means "not proven", not "no".
    fn words_within(&self, other: &Pattern, meter: &mut WorkMeter) -> Result<bool, TooMuchWork> {
        let Some(words) = &self.words else {
            return Ok(false);
        };
        let matcher = other.matcher(meter)?;
        for word in words {
            let bytes = u64::try_from(word.len()).unwrap_or(u64::MAX);
            meter.charge(bytes.saturating_add(MATCH_UNITS))?;
            if !matcher.is_match(word) {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// Counts the work of a schema comparison against a limit: [`MessageBodySchema::compatible_within`]
/// stops at the first step that would go past it.
///
/// What is charged, in units of one to two nanoseconds of one core: 8 per pair of schema parts
/// looked at; per word of a finite pattern matched against a glob, its length in bytes plus 32;
/// per glob compiled during the comparison (the first time it is matched), 512 per byte of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkMeter {
    spent: u64,
    limit: u64,
}

impl WorkMeter {
    /// A meter that allows `limit` units.
    pub fn new(limit: u64) -> Self {
        Self { spent: 0, limit }
    }

    /// The units spent so far; never more than the limit.
    pub fn spent(&self) -> u64 {
        self.spent
    }

    /// The limit it was made with.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    fn charge(&mut self, units: u64) -> Result<(), TooMuchWork> {
        match self.spent.checked_add(units) {
            Some(spent) if spent <= self.limit => {
                self.spent = spent;
                Ok(())
            }
            _ => Err(TooMuchWork { limit: self.limit }),
        }
    }
}

impl Default for WorkMeter {
    /// A meter of [`MAX_COMPATIBILITY_WORK`] units.
    fn default() -> Self {
        Self::new(MAX_COMPATIBILITY_WORK)
    }
}

/// A comparison stopped because it needed more work than its [`WorkMeter`] allows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "comparing these schemas needs more than {limit} units of work, the limit of one comparison; \
     use fewer or shorter patterns, or fewer {{a,b}} alternatives"
)]
pub struct TooMuchWork {
    /// The meter's limit.
    pub limit: u64,
}

/// Name patterns that match every valid name (a valid name is `/` followed by non-empty
/// segments joined by `/`).
const UNIVERSAL_NAME_PATTERNS: [&str; 4] = ["**", "/**", "**/*", "/**/*"];
/// Content-type patterns that match every valid media type (exactly one `/`, between two
/// non-empty names without `/`).
const UNIVERSAL_CONTENT_TYPE_PATTERNS: [&str; 4] = ["**", "*/*", "**/*", "*/**"];

/// A glob metacharacter of `globset` (`,` only inside braces, but refused anywhere here).
fn is_glob_meta(c: char) -> bool {
    matches!(c, '*' | '?' | '[' | ']' | '{' | '}' | ',' | '\\')
}

/// The exact set of strings a pattern matches, when it is made of literal characters and
/// non-nested `{a,b}` groups of literal, non-empty alternatives, with at most
/// [`MAX_EXPANSIONS`] strings of [`MAX_EXPANSION_BYTES`] together. `None` for anything else
/// (`*`, `?`, classes, escapes, nesting, too many or too long words). Never builds more than
/// that many bytes.
fn finite_language(pattern: &str) -> Option<Vec<String>> {
    let mut words = vec![String::new()];
    // Bytes of `words`, all together.
    let mut total = 0usize;
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c == '{' {
            let mut alternatives = Vec::new();
            let mut current = String::new();
            let mut closed = false;
            for c in chars.by_ref() {
                match c {
                    '}' => {
                        alternatives.push(std::mem::take(&mut current));
                        closed = true;
                        break;
                    }
                    ',' => alternatives.push(std::mem::take(&mut current)),
                    c if is_glob_meta(c) => return None,
                    c => current.push(c),
                }
            }
            if !closed || alternatives.iter().any(String::is_empty) {
                return None;
            }
            if words.len().saturating_mul(alternatives.len()) > MAX_EXPANSIONS {
                return None;
            }
            // Each word is followed by each alternative.
            let alternative_bytes: usize = alternatives.iter().map(String::len).sum();
            total = total
                .saturating_mul(alternatives.len())
                .saturating_add(words.len().saturating_mul(alternative_bytes));
            if total > MAX_EXPANSION_BYTES {
                return None;
            }
            words = words
                .iter()
                .flat_map(|word| alternatives.iter().map(move |alt| format!("{word}{alt}")))
                .collect();
        } else if is_glob_meta(c) {
            return None;
        } else {
            total = total.saturating_add(words.len().saturating_mul(c.len_utf8()));
            if total > MAX_EXPANSION_BYTES {
                return None;
            }
            for word in &mut words {
                word.push(c);
            }
        }
    }
    Some(words)
}

/// One entry of a schema: which names and content types it accepts, and whether some part must
/// match it.
///
/// JSON: `{"name"?, "contentType"?, "required"?}`; `required` defaults to `false` and is only
/// written when `true`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawSchemaPart")]
pub struct SchemaPart {
    name: Option<Pattern>,
    content_type: Option<Pattern>,
    required: bool,
}

/// A schema part as it arrives, before the patterns are compiled.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawSchemaPart {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    content_type: Option<String>,
    #[serde(default)]
    required: bool,
}

impl TryFrom<RawSchemaPart> for SchemaPart {
    type Error = PatternError;

    fn try_from(raw: RawSchemaPart) -> Result<Self, Self::Error> {
        SchemaPart::new(raw.name, raw.content_type, raw.required)
    }
}

/// A schema part as it is written.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SchemaPartOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_type: Option<&'a str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    required: bool,
}

impl Serialize for SchemaPart {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        SchemaPartOut {
            name: self.name(),
            content_type: self.content_type(),
            required: self.required,
        }
        .serialize(serializer)
    }
}

impl SchemaPart {
    /// A schema part; the patterns are compiled here, once.
    ///
    /// `name: None` describes unnamed parts (main content) only; `content_type: None` accepts
    /// any content type.
    pub fn new(
        name: Option<String>,
        content_type: Option<String>,
        required: bool,
    ) -> Result<Self, PatternError> {
        let name = name
            .map(|text| Pattern::compile(&text, PatternField::Name))
            .transpose()?;
        let content_type = content_type
            .map(|text| Pattern::compile(&text, PatternField::ContentType))
            .transpose()?;
        Ok(SchemaPart {
            name,
            content_type,
            required,
        })
    }

    /// The name pattern, or `None` for "unnamed parts only".
    pub fn name(&self) -> Option<&str> {
        self.name.as_ref().map(|pattern| pattern.text.as_str())
    }

    /// The content-type pattern, or `None` for "any content type".
    pub fn content_type(&self) -> Option<&str> {
        self.content_type
            .as_ref()
            .map(|pattern| pattern.text.as_str())
    }

    /// Whether every valid message must hold a part matching this one.
    pub fn required(&self) -> bool {
        self.required
    }

    /// Whether `part` matches: names (both absent, or the pattern matches the name) and
    /// content type (no pattern, or it matches the part's media type).
    pub fn matches(&self, part: &Part) -> bool {
        let name_matches = match (&self.name, part.name()) {
            (None, None) => true,
            (Some(pattern), Some(name)) => pattern.is_match(name),
            _ => false,
        };
        name_matches
            && self
                .content_type
                .as_ref()
                .is_none_or(|pattern| pattern.is_match(part.media_type()))
    }

    /// Whether every part matching `self` matches `wider`, as far as can be said without
    /// matching: names, then content types, each `Yes`, `No` or "match these words".
    fn verdicts_within<'a>(&'a self, wider: &'a SchemaPart) -> [Field<'a>; 2] {
        let names = match (&self.name, &wider.name) {
            (None, None) => Field::Yes,
            (Some(_), Some(wide)) if UNIVERSAL_NAME_PATTERNS.contains(&wide.text.as_str()) => {
                Field::Yes
            }
            (Some(narrow), Some(wide)) => narrow.within(wide),
            _ => Field::No,
        };
        let content_types = match (&self.content_type, &wider.content_type) {
            (_, None) => Field::Yes,
            (_, Some(wide)) if UNIVERSAL_CONTENT_TYPE_PATTERNS.contains(&wide.text.as_str()) => {
                Field::Yes
            }
            (Some(narrow), Some(wide)) => narrow.within(wide),
            (None, Some(_)) => Field::No,
        };
        [names, content_types]
    }

    /// Whether every part matching `self` matches `wider` without matching anything (equal
    /// texts, universal patterns, no content-type pattern on `wider`, both unnamed).
    fn settled_within(&self, wider: &SchemaPart) -> bool {
        self.verdicts_within(wider)
            .iter()
            .all(|field| matches!(field, Field::Yes))
    }

    /// Whether every part matching `self` provably matches `wider`: settled without matching
    /// when it can be; otherwise the field with fewer bytes to match first, and the other only
    /// if that one holds. Each match is charged to `meter`.
    fn provably_within(
        &self,
        wider: &SchemaPart,
        meter: &mut WorkMeter,
    ) -> Result<bool, TooMuchWork> {
        meter.charge(PAIR_UNITS)?;
        let mut fields = self.verdicts_within(wider);
        if fields.iter().any(|field| matches!(field, Field::No)) {
            return Ok(false);
        }
        fields.sort_by_key(Field::cost);
        for field in fields {
            if let Field::Match { narrow, wide } = field
                && !narrow.words_within(wide, meter)?
            {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// What can be said of one field of a pair of schema parts (the narrower one's pattern within
/// the wider one's) without matching anything.
#[derive(Debug, Clone, Copy)]
enum Field<'a> {
    /// Proven.
    Yes,
    /// Not provable.
    No,
    /// Provable only by matching `narrow`'s words against `wide`.
    Match {
        narrow: &'a Pattern,
        wide: &'a Pattern,
    },
}

impl Field<'_> {
    /// Bytes of words to match (0 when settled).
    fn cost(&self) -> usize {
        match self {
            Field::Match { narrow, .. } => narrow.language_bytes,
            Field::Yes | Field::No => 0,
        }
    }
}

/// `name "/a/*", contentType "text/*"`, `unnamed, any contentType`.
fn describe(name: Option<&str>, content_type: Option<&str>) -> String {
    let name = name.map_or_else(|| "unnamed".to_owned(), |name| format!("name {name:?}"));
    let content_type = content_type.map_or_else(
        || "any contentType".to_owned(),
        |content_type| format!("contentType {content_type:?}"),
    );
    format!("{name}, {content_type}")
}

/// Why a schema was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// More than [`MAX_SCHEMA_PARTS`] parts.
    #[error("parts has {count} entries; at most {MAX_SCHEMA_PARTS} are allowed")]
    TooManyParts {
        /// How many parts there were.
        count: usize,
    },
    /// A pattern of schema part `index` does not compile.
    #[error("parts[{index}].{error}")]
    Pattern {
        /// Index of the schema part.
        index: usize,
        /// The pattern and why.
        error: PatternError,
    },
}

/// What messages an agent sends or accepts.
///
/// JSON: `{"parts": [SchemaPart, ...]}`; patterns are compiled when it is deserialized.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawMessageBodySchema")]
pub struct MessageBodySchema {
    parts: Vec<SchemaPart>,
}

/// A schema as it arrives, before the patterns are compiled.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMessageBodySchema {
    parts: Vec<RawSchemaPart>,
}

impl TryFrom<RawMessageBodySchema> for MessageBodySchema {
    type Error = SchemaError;

    fn try_from(raw: RawMessageBodySchema) -> Result<Self, Self::Error> {
        if raw.parts.len() > MAX_SCHEMA_PARTS {
            return Err(SchemaError::TooManyParts {
                count: raw.parts.len(),
            });
        }
        let parts = raw
            .parts
            .into_iter()
            .enumerate()
            .map(|(index, part)| {
                SchemaPart::try_from(part).map_err(|error| SchemaError::Pattern { index, error })
            })
            .collect::<Result<Vec<_>, _>>()?;
        MessageBodySchema::new(parts)
    }
}

impl MessageBodySchema {
    /// A schema of these parts (at most [`MAX_SCHEMA_PARTS`]).
    pub fn new(parts: Vec<SchemaPart>) -> Result<Self, SchemaError> {
        if parts.len() > MAX_SCHEMA_PARTS {
            return Err(SchemaError::TooManyParts { count: parts.len() });
        }
        Ok(MessageBodySchema { parts })
    }

    /// The schema parts, in order.
    pub fn parts(&self) -> &[SchemaPart] {
        &self.parts
    }

    /// Checks `body`: every part matches at least one schema part, and every required schema
    /// part is matched by at least one part. Every violation is reported, parts first.
    pub fn check(&self, body: &MessageBody) -> Result<(), Vec<Violation>> {
        let mut violations = Vec::new();
        for (index, part) in body.parts().iter().enumerate() {
            if !self.parts.iter().any(|schema| schema.matches(part)) {
                violations.push(Violation::UnmatchedPart {
                    part_index: index,
                    name: part.name().map(str::to_owned),
                    content_type: part.content_type().to_owned(),
                });
            }
        }
        for (index, schema) in self.parts.iter().enumerate() {
            if schema.required && !body.parts().iter().any(|part| schema.matches(part)) {
                violations.push(Violation::MissingRequired {
                    schema_part_index: index,
                    name: schema.name().map(str::to_owned),
                    content_type: schema.content_type().map(str::to_owned),
                });
            }
        }
        if violations.is_empty() {
            Ok(())
        } else {
            Err(violations)
        }
    }

    /// Whether every message valid under `self` (an agent's output schema) is valid under
    /// `input` (another agent's input schema). Sound: `Ok` is a proof; `Err` lists what could
    /// not be proven, which is not always a real incompatibility.
    ///
    /// The proof: (1) every output schema part P is contained in one single input schema part
    /// Q, so any part matching P matches Q; (2) every required input schema part Q contains a
    /// required output schema part P, which every valid output matches. "P within Q" holds
    /// when both names are absent, or Q's name pattern is universal (`**`, `/**`, `**/*`,
    /// `/**/*`) or P's is provably within it; and Q has no content-type pattern, or a universal
    /// one (`**`, `*/*`, `**/*`, `*/**`), or P's is provably within it. A pattern is provably
    /// within another when the texts are equal, or when it is literal text with non-nested
    /// `{a,b}` groups (at most 64 expansions of 4 KiB together) and the other glob matches
    /// every expansion.
    ///
    /// Where it is conservative (refuses pairs that are compatible):
    /// - P covered only by a union of input parts: output `/{a,b}` against input parts `/a` and
    ///   `/b`, or output `*/*` against input parts `text/*` and `{image,application,...}/*`;
    /// - containment between two wildcard patterns that are not textually equal or universal
    ///   (`image/*` within `{image,text}/*`, `/a/*` within `/a/**`, `/a/*` within `/*/*`);
    /// - an output content type or name that is absent or wildcard against an input pattern
    ///   that only happens to cover every valid value (`[a-z]*/*`);
    /// - output patterns that match no valid value at all (`a/b` names without `/`), which
    ///   could never be produced and so never fail the input;
    /// - a required input part guaranteed only by a combination of output rules (e.g. two
    ///   output parts that are each optional but the output could not be empty otherwise);
    /// - a brace pattern of more than 64 words or 4 KiB of them, and any pair that needs more
    ///   than [`MAX_COMPATIBILITY_WORK`] units of matching: what was not proven by then is
    ///   reported ([`MessageBodySchema::compatible_within`] tells that case apart).
    ///
    /// Every pair of schema parts that can be settled without matching (equal texts, universal
    /// patterns) is settled first, so a schema is always compatible with itself within the
    /// limit, however large.
    pub fn compatible_with(&self, input: &MessageBodySchema) -> Result<(), Vec<Incompatibility>> {
        self.judge(input, &mut WorkMeter::default()).0
    }

    /// [`MessageBodySchema::compatible_with`], charging its work to `meter`: `Err` when the
    /// comparison would need more than the meter allows (it stops there, having spent at most
    /// the limit), else the answer. `meter.spent()` says what it cost.
    pub fn compatible_within(
        &self,
        input: &MessageBodySchema,
        meter: &mut WorkMeter,
    ) -> Result<Result<(), Vec<Incompatibility>>, TooMuchWork> {
        match self.judge(input, meter) {
            (_, Some(stopped)) => Err(stopped),
            (answer, None) => Ok(answer),
        }
    }

    /// The comparison: every output part covered by one input part, every required input part
    /// guaranteed by one required output part. When the meter runs out, what is not proven by
    /// then is reported as not proven (sound), with the refusal.
    fn judge(
        &self,
        input: &MessageBodySchema,
        meter: &mut WorkMeter,
    ) -> (Result<(), Vec<Incompatibility>>, Option<TooMuchWork>) {
        let mut covered = vec![false; self.parts.len()];
        let mut guaranteed: Vec<bool> = input.parts.iter().map(|part| !part.required).collect();
        let required: Vec<&SchemaPart> = self.parts.iter().filter(|part| part.required).collect();
        let stopped = prove(self, input, &required, meter, &mut covered, &mut guaranteed).err();
        let mut problems = Vec::new();
        for (index, output) in self.parts.iter().enumerate() {
            if !covered[index] {
                problems.push(Incompatibility::NotCovered {
                    output_part_index: index,
                    name: output.name().map(str::to_owned),
                    content_type: output.content_type().map(str::to_owned),
                });
            }
        }
        for (index, wanted) in input.parts.iter().enumerate() {
            if !guaranteed[index] {
                problems.push(Incompatibility::RequiredNotGuaranteed {
                    input_part_index: index,
                    name: wanted.name().map(str::to_owned),
                    content_type: wanted.content_type().map(str::to_owned),
                });
            }
        }
        let answer = if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        };
        (answer, stopped)
    }
}

// Settling every pair without matching fits in any comparison's budget, so a schema is always
// compatible with itself (two passes of 256 x 256 pairs).
const _: () = assert!(
    2 * (MAX_SCHEMA_PARTS as u64) * (MAX_SCHEMA_PARTS as u64) * PAIR_UNITS < MAX_COMPATIBILITY_WORK
);

/// Marks `covered[i]` for each output part within some input part and `guaranteed[j]` for each
/// required input part some required output part (`required`) is within: first every pair
/// settled without matching, then the pairs left, matching. Stops when `meter` runs out.
fn prove(
    output: &MessageBodySchema,
    input: &MessageBodySchema,
    required: &[&SchemaPart],
    meter: &mut WorkMeter,
    covered: &mut [bool],
    guaranteed: &mut [bool],
) -> Result<(), TooMuchWork> {
    for (narrow, done) in output.parts.iter().zip(covered.iter_mut()) {
        for wide in &input.parts {
            meter.charge(PAIR_UNITS)?;
            if narrow.settled_within(wide) {
                *done = true;
                break;
            }
        }
    }
    for (wide, done) in input.parts.iter().zip(guaranteed.iter_mut()) {
        if *done {
            continue;
        }
        for narrow in required {
            meter.charge(PAIR_UNITS)?;
            if narrow.settled_within(wide) {
                *done = true;
                break;
            }
        }
    }
    for (narrow, done) in output.parts.iter().zip(covered.iter_mut()) {
        if *done {
            continue;
        }
        for wide in &input.parts {
            if narrow.provably_within(wide, meter)? {
                *done = true;
                break;
            }
        }
    }
    for (wide, done) in input.parts.iter().zip(guaranteed.iter_mut()) {
        if *done {
            continue;
        }
        for narrow in required {
            if narrow.provably_within(wide, meter)? {
                *done = true;
                break;
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Findings.
// ---------------------------------------------------------------------------------------------

/// Why a message is not valid under a schema.
///
/// Serializes as `{"kind", "message", ...fields}` with camelCase fields, e.g.
/// `{"kind": "unmatchedPart", "message": "...", "partIndex": 1, "name": "/x",
/// "contentType": "image/png"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// A part matches no schema part.
    UnmatchedPart {
        /// Index of the part in the message.
        part_index: usize,
        /// Its name.
        name: Option<String>,
        /// Its content type.
        content_type: String,
    },
    /// A required schema part is matched by no part.
    MissingRequired {
        /// Index of the schema part.
        schema_part_index: usize,
        /// Its name pattern.
        name: Option<String>,
        /// Its content-type pattern.
        content_type: Option<String>,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::UnmatchedPart {
                part_index,
                name,
                content_type,
            } => write!(
                f,
                "parts[{part_index}] ({}) matches no schema part",
                describe(name.as_deref(), Some(content_type))
            ),
            Violation::MissingRequired {
                schema_part_index,
                name,
                content_type,
            } => write!(
                f,
                "schema part {schema_part_index} ({}) is required but no part matches it",
                describe(name.as_deref(), content_type.as_deref())
            ),
        }
    }
}

impl Serialize for Violation {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let (kind, index_field, index, name, content_type) = match self {
            Violation::UnmatchedPart {
                part_index,
                name,
                content_type,
            } => (
                "unmatchedPart",
                "partIndex",
                part_index,
                name,
                Some(content_type.as_str()),
            ),
            Violation::MissingRequired {
                schema_part_index,
                name,
                content_type,
            } => (
                "missingRequired",
                "schemaPartIndex",
                schema_part_index,
                name,
                content_type.as_deref(),
            ),
        };
        finding(
            serializer,
            kind,
            &self.to_string(),
            (index_field, *index),
            name.as_deref(),
            content_type,
        )
    }
}

/// Why an output schema could not be proven compatible with an input schema.
///
/// Serializes like [`Violation`]: `{"kind", "message", "outputPartIndex" | "inputPartIndex",
/// "name"?, "contentType"?}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incompatibility {
    /// No single input schema part provably accepts every part matching this output schema
    /// part.
    NotCovered {
        /// Index of the output schema part.
        output_part_index: usize,
        /// Its name pattern.
        name: Option<String>,
        /// Its content-type pattern.
        content_type: Option<String>,
    },
    /// No required output schema part provably matches this required input schema part.
    RequiredNotGuaranteed {
        /// Index of the input schema part.
        input_part_index: usize,
        /// Its name pattern.
        name: Option<String>,
        /// Its content-type pattern.
        content_type: Option<String>,
    },
}

impl fmt::Display for Incompatibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Incompatibility::NotCovered {
                output_part_index,
                name,
                content_type,
            } => write!(
                f,
                "output schema part {output_part_index} ({}) is not provably accepted by any single input schema part",
                describe(name.as_deref(), content_type.as_deref())
            ),
            Incompatibility::RequiredNotGuaranteed {
                input_part_index,
                name,
                content_type,
            } => write!(
                f,
                "input schema part {input_part_index} ({}) is required but no required output schema part provably matches it",
                describe(name.as_deref(), content_type.as_deref())
            ),
        }
    }
}

impl Serialize for Incompatibility {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let (kind, index_field, index, name, content_type) = match self {
            Incompatibility::NotCovered {
                output_part_index,
                name,
                content_type,
            } => (
                "notCovered",
                "outputPartIndex",
                output_part_index,
                name,
                content_type,
            ),
            Incompatibility::RequiredNotGuaranteed {
                input_part_index,
                name,
                content_type,
            } => (
                "requiredNotGuaranteed",
                "inputPartIndex",
                input_part_index,
                name,
                content_type,
            ),
        };
        finding(
            serializer,
            kind,
            &self.to_string(),
            (index_field, *index),
            name.as_deref(),
            content_type.as_deref(),
        )
    }
}

/// Writes a [`Violation`] or [`Incompatibility`] as one flat JSON object.
fn finding<S: Serializer>(
    serializer: S,
    kind: &str,
    message: &str,
    (index_field, index): (&'static str, usize),
    name: Option<&str>,
    content_type: Option<&str>,
) -> Result<S::Ok, S::Error> {
    let mut map = serializer.serialize_map(None)?;
    map.serialize_entry("kind", kind)?;
    map.serialize_entry("message", message)?;
    map.serialize_entry(index_field, &index)?;
    if let Some(name) = name {
        map.serialize_entry("name", name)?;
    }
    if let Some(content_type) = content_type {
        map.serialize_entry("contentType", content_type)?;
    }
    map.end()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name_pattern(text: &str) -> Pattern {
        Pattern::compile(text, PatternField::Name).unwrap()
    }

    fn type_pattern(text: &str) -> Pattern {
        Pattern::compile(text, PatternField::ContentType).unwrap()
    }

    #[test]
    fn universal_name_patterns_match_every_shape_of_name() {
        let names = ["/a", "/a.b", "/.", "/..", "/a/b", "/a/b/c.d", "/-/_/x"];
        for text in UNIVERSAL_NAME_PATTERNS {
            let pattern = name_pattern(text);
            for name in names {
                assert!(pattern.is_match(name), "{text} should match {name}");
            }
        }
    }

    #[test]
    fn universal_content_type_patterns_match_every_shape_of_media_type() {
        let types = ["text/plain", "a/b", "application/vnd.x+json", "X-Y/Z.1"];
        for text in UNIVERSAL_CONTENT_TYPE_PATTERNS {
            let pattern = type_pattern(text);
            for media_type in types {
                assert!(
                    pattern.is_match(media_type),
                    "{text} should match {media_type}"
                );
            }
        }
    }

    #[test]
    fn a_single_star_stays_within_one_segment() {
        assert!(name_pattern("/a/*").is_match("/a/b"));
        assert!(!name_pattern("/a/*").is_match("/a/b/c"));
        assert!(name_pattern("/a/**").is_match("/a/b/c"));
        assert!(!name_pattern("/a/**").is_match("/a"));
        assert!(!type_pattern("*").is_match("text/plain"));
        assert!(type_pattern("image/*").is_match("IMAGE/png"));
        assert!(!name_pattern("/A").is_match("/a"));
    }

    #[test]
    fn finite_patterns_expand_to_exactly_their_words() {
        assert_eq!(finite_language("/a"), Some(vec!["/a".to_owned()]));
        assert_eq!(
            finite_language("text/{markdown,plain}"),
            Some(vec!["text/markdown".to_owned(), "text/plain".to_owned()])
        );
        assert_eq!(
            finite_language("{application/json,text/uri-list}").map(|words| words.len()),
            Some(2)
        );
        assert_eq!(
            finite_language("/{a,b}/{c,d}").map(|words| words.len()),
            Some(4)
        );
        for wildcard in [
            "/a/*",
            "/a?",
            "/[ab]",
            "/{a,}",
            "/{a,{b,c}}",
            "/\\a",
            "/a,b",
            "/{a",
        ] {
            assert_eq!(finite_language(wildcard), None, "{wildcard}");
        }
    }

    #[test]
    fn every_expansion_is_matched_by_its_own_glob_and_nothing_else_in_a_small_alphabet() {
        // The soundness of containment rests on `finite_language` covering the glob's language.
        let patterns = ["/{a,b}/c", "/{ab,a}", "x{a,b}{c,d}y", "/a"];
        let alphabet = ['a', 'b', 'c', 'd', 'x', 'y', '/'];
        for text in patterns {
            let pattern = name_pattern(text);
            let words = finite_language(text).unwrap();
            let mut candidates = vec![String::new()];
            for _ in 0..5 {
                candidates = candidates
                    .iter()
                    .flat_map(|prefix| alphabet.iter().map(move |c| format!("{prefix}{c}")))
                    .chain(candidates.iter().cloned())
                    .collect::<HashSet<_>>()
                    .into_iter()
                    .collect();
            }
            for candidate in candidates {
                assert_eq!(
                    pattern.is_match(&candidate),
                    words.contains(&candidate),
                    "{text} on {candidate}"
                );
            }
        }
    }

    /// The review's reproduction (finding H2): 256 required output parts whose name and content
    /// type are ~430 literal characters with six `{a,b}` groups, against 256 required input
    /// parts that match none of them. About 253 KB of JSON, under the endpoint's 256 KiB.
    fn review_worst_case() -> (MessageBodySchema, MessageBodySchema) {
        let groups = "{a,b}".repeat(6);
        let output = serde_json::json!({"parts": (0..256).map(|_| serde_json::json!({
            "name": format!("/{groups}{}", "x".repeat(430)),
            "contentType": format!("{groups}/{}", "y".repeat(400)),
            "required": true,
        })).collect::<Vec<_>>()});
        let input = serde_json::json!({"parts": (0..256).map(|_| serde_json::json!({
            "name": "/n", "contentType": "n/n", "required": true,
        })).collect::<Vec<_>>()});
        (
            serde_json::from_value(output).unwrap(),
            serde_json::from_value(input).unwrap(),
        )
    }

    /// The most matching a pair can force within the expansion limits: 64 words of 64 bytes per
    /// pattern, every word of the name matched by the input's name pattern and the content type
    /// failing on the 33rd word, for 128 x 128 pairs.
    fn matching_worst_case() -> (MessageBodySchema, MessageBodySchema) {
        let groups = "{a,b}".repeat(6);
        let output = serde_json::json!({"parts": (0..128).map(|_| serde_json::json!({
            "name": format!("/{groups}{}", "x".repeat(57)),
            "contentType": format!("{groups}/{}", "y".repeat(57)),
            "required": true,
        })).collect::<Vec<_>>()});
        let input = serde_json::json!({"parts": (0..128).map(|_| serde_json::json!({
            "name": format!("/{}{}", "[ab]".repeat(6), "x".repeat(57)),
            "contentType": format!("a{}/{}", "[ab]".repeat(5), "y".repeat(57)),
        })).collect::<Vec<_>>()});
        (
            serde_json::from_value(output).unwrap(),
            serde_json::from_value(input).unwrap(),
        )
    }

    #[test]
    fn the_reviews_worst_case_is_answered_with_bounded_work() {
        let (output, input) = review_worst_case();
        // 64 words of ~430 bytes are over the expansion limit: nothing is expanded or matched.
        assert!(
            output
                .parts
                .iter()
                .all(|part| part.name.as_ref().is_some_and(|name| name.words.is_none())),
            "the review's patterns are not expanded"
        );
        let mut meter = WorkMeter::default();
        let answer = output
            .compatible_within(&input, &mut meter)
            .expect("answered within the limit");
        let problems = answer.unwrap_err();
        assert_eq!(problems.len(), 512, "every part reported");
        // Two passes of 256 x 256 pairs, settled without matching, and the same pairs again.
        assert!(
            meter.spent() <= 4 * 256 * 256 * PAIR_UNITS,
            "{} units spent, want at most {}",
            meter.spent(),
            4 * 256 * 256 * PAIR_UNITS
        );
        assert!(meter.spent() <= MAX_COMPATIBILITY_WORK);
    }

    #[test]
    fn a_comparison_that_needs_more_matching_than_the_limit_stops_at_the_limit() {
        let (output, input) = matching_worst_case();
        let mut meter = WorkMeter::default();
        assert_eq!(
            output.compatible_within(&input, &mut meter),
            Err(TooMuchWork {
                limit: MAX_COMPATIBILITY_WORK
            })
        );
        assert!(
            meter.spent() <= MAX_COMPATIBILITY_WORK,
            "{} units spent, over the limit",
            meter.spent()
        );
        // Unbounded, the same comparison would match 128 x 128 pairs x 97 words of 64 bytes.
        let unbounded = 128 * 128 * 97 * (64 + MATCH_UNITS);
        assert!(unbounded > 8 * MAX_COMPATIBILITY_WORK);
        // compatible_with stops at the same point and reports what it could not prove.
        let problems = output.compatible_with(&input).unwrap_err();
        assert_eq!(problems.len(), 128);
    }

    #[test]
    fn a_large_schema_is_compatible_with_itself_without_matching() {
        for (output, input) in [matching_worst_case(), review_worst_case()] {
            for schema in [&output, &input] {
                let mut meter = WorkMeter::default();
                assert_eq!(schema.compatible_within(schema, &mut meter), Ok(Ok(())));
                assert!(meter.spent() <= 2 * 256 * 256 * PAIR_UNITS);
                assert!(
                    schema
                        .parts
                        .iter()
                        .flat_map(|part| [&part.name, &part.content_type])
                        .flatten()
                        .all(|pattern| pattern.matcher.get().is_none()),
                    "no glob compiled"
                );
            }
        }
    }

    #[test]
    fn a_pair_settled_by_one_field_never_matches_the_other() {
        // The names cannot be proven (a wildcard output name): the content types, which would
        // take matching, are not looked at.
        let output = SchemaPart::new(
            Some("/a/*".to_owned()),
            Some("text/{plain,markdown}".to_owned()),
            true,
        )
        .unwrap();
        let input =
            SchemaPart::new(Some("/a/b".to_owned()), Some("text/*".to_owned()), true).unwrap();
        let mut meter = WorkMeter::default();
        assert!(!output.provably_within(&input, &mut meter).unwrap());
        assert_eq!(meter.spent(), PAIR_UNITS);
        assert!(input.content_type.as_ref().unwrap().matcher.get().is_none());
        // With the names settled, the content types are matched, the glob compiled on the meter.
        let input =
            SchemaPart::new(Some("/**".to_owned()), Some("text/*".to_owned()), true).unwrap();
        assert!(output.provably_within(&input, &mut meter).unwrap());
        let compile = 6 * COMPILE_UNITS_PER_BYTE;
        let words = ("text/plain".len() + "text/markdown".len()) as u64 + 2 * MATCH_UNITS;
        assert_eq!(meter.spent(), 2 * PAIR_UNITS + compile + words);
    }

    #[test]
    fn a_meter_refuses_the_step_that_would_pass_its_limit_and_keeps_what_was_spent() {
        let mut meter = WorkMeter::new(10);
        assert_eq!(meter.charge(6), Ok(()));
        assert_eq!(meter.charge(5), Err(TooMuchWork { limit: 10 }));
        assert_eq!(meter.spent(), 6);
        assert_eq!(meter.charge(4), Ok(()));
        assert_eq!(meter.charge(u64::MAX), Err(TooMuchWork { limit: 10 }));
        assert_eq!(meter.spent(), 10);
    }

    #[test]
    fn finite_languages_over_4_kib_are_not_expanded() {
        let at_limit = format!("/{}{}", "{a,b}".repeat(6), "x".repeat(63 - 6));
        let words = finite_language(&at_limit).unwrap();
        assert_eq!(
            words.iter().map(String::len).sum::<usize>(),
            MAX_EXPANSION_BYTES
        );
        assert_eq!(finite_language(&format!("{at_limit}x")), None);
        assert_eq!(
            finite_language(&format!("/{}", "x".repeat(MAX_EXPANSION_BYTES))),
            None
        );
        assert_eq!(
            finite_language(&format!("/{}{{{},b}}", "x".repeat(1000), "y".repeat(1000))),
            Some(vec![
                format!("/{}{}", "x".repeat(1000), "y".repeat(1000)),
                format!("/{}b", "x".repeat(1000)),
            ])
        );
        assert!(
            finite_language(&format!(
                "/{}{{{},{}}}",
                "x".repeat(1100),
                "y".repeat(1024),
                "z".repeat(1024)
            ))
            .is_none(),
            "4,250 bytes of words"
        );
    }

    #[test]
    fn media_type_drops_parameters() {
        assert_eq!(media_type("text/plain; charset=utf-8"), "text/plain");
        assert_eq!(media_type("text/plain"), "text/plain");
        assert!(check_content_type("text/plain ; charset=utf-8").is_ok());
        assert!(check_content_type("text/plain charset").is_err());
    }
}
