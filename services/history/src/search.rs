//! Search over an owner's conversations (`GET /api/v1/agent/threads?q=`): the pure parts. A
//! query is checked and turned into what the store matches ([`SearchQuery`]); the best message
//! of each thread found is shown as a [`snippet`] with its matches highlighted.
//!
//! A message matches when it holds the query's words (PostgreSQL full text, `simple`
//! configuration: no stemming and no stop words, the seeds speak several languages) or its
//! terms, in order, as parts of its text (a trigram index: Chinese has no spaces between its
//! words, so a phrase of it is a part of one long "word"). Case is ignored. A snippet is the
//! text around the first match, HTML-escaped, each match wrapped in `<mark>`…`</mark>`, with `…`
//! where the message goes on: a client may set it as HTML as it is.

/// Most characters of a query (after trimming).
pub(crate) const MAX_QUERY_CHARS: usize = 256;
/// Characters of a snippet (the marks and escapes aside).
const SNIPPET_CHARS: usize = 160;
/// Characters shown before the first match.
const SNIPPET_LEAD: usize = 40;
/// Most results a cursor may skip: past it a search says "refine the query" by ending.
pub(crate) const MAX_OFFSET: i64 = 1_000;

/// Why a query is refused (each names `q`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum QueryError {
    /// Empty or only whitespace.
    #[error("q must not be empty")]
    Empty,
    /// Longer than [`MAX_QUERY_CHARS`].
    #[error("q must be at most 256 characters")]
    TooLong,
    /// Nothing to look for: only punctuation, symbols and whitespace.
    #[error("q must contain a letter or a digit")]
    NoTerms,
}

/// A checked query and the patterns the store matches with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SearchQuery {
    /// The query, trimmed: its words make the full-text query.
    pub(crate) words: String,
    /// Its terms (runs of letters and digits), lowercased: what a snippet highlights when the
    /// whole query is not in the text.
    pub(crate) terms: Vec<String>,
    /// `%term%term%`: the terms in order, anything between (`ILIKE`, escaped).
    pub(crate) loose: String,
    /// `%query%`: the whole query (`ILIKE`, escaped).
    pub(crate) phrase: String,
}

impl SearchQuery {
    /// Checks `raw`: 1 to [`MAX_QUERY_CHARS`] characters once trimmed, at least one of them a
    /// letter or digit.
    pub(crate) fn parse(raw: &str) -> Result<Self, QueryError> {
        let words = raw.trim();
        if words.is_empty() {
            return Err(QueryError::Empty);
        }
        if words.chars().count() > MAX_QUERY_CHARS {
            return Err(QueryError::TooLong);
        }
        let terms: Vec<String> = words
            .split(|c: char| !c.is_alphanumeric())
            .filter(|term| !term.is_empty())
            .map(str::to_lowercase)
            .collect();
        if terms.is_empty() {
            return Err(QueryError::NoTerms);
        }
        let loose = terms.iter().fold(String::from("%"), |mut pattern, term| {
            pattern.push_str(&like_escape(term));
            pattern.push('%');
            pattern
        });
        Ok(Self {
            phrase: format!("%{}%", like_escape(words)),
            words: words.to_owned(),
            terms,
            loose,
        })
    }

    /// Whether a term has three characters or more: the loose pattern then has a trigram for
    /// the trigram index to look up (see [`crate::store::search_threads_short`]).
    pub(crate) fn has_trigram(&self) -> bool {
        self.terms.iter().any(|term| term.chars().count() >= 3)
    }

    /// A short fingerprint of the query: a cursor is good for the query it was made for only.
    pub(crate) fn fingerprint(&self) -> String {
        let mut digest = protocol::messaging::short_digest(&self.words);
        digest.truncate(16);
        digest
    }
}

/// `text` as a literal inside an `ILIKE` pattern (the default escape, `\`).
fn like_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '\\' | '%' | '_') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// `text` case-folded (each character lowercased), with the byte offset in `text` of the
/// character each folded byte comes from, and `text.len()` at the end.
fn folded(text: &str) -> (String, Vec<usize>) {
    let mut folded = String::with_capacity(text.len());
    let mut origin = Vec::with_capacity(text.len() + 1);
    for (at, c) in text.char_indices() {
        for lower in c.to_lowercase() {
            folded.push(lower);
            origin.extend(std::iter::repeat_n(at, lower.len_utf8()));
        }
    }
    origin.push(text.len());
    (folded, origin)
}

/// Where `needles` occur in `text`, ignoring case: byte ranges of `text`, in order, none
/// overlapping (an earlier or longer match wins).
fn matches(text: &str, needles: &[String]) -> Vec<(usize, usize)> {
    let (haystack, origin) = folded(text);
    let mut found = Vec::new();
    for needle in needles.iter().filter(|n| !n.is_empty()) {
        let mut from = 0;
        while let Some(at) = haystack[from..].find(needle.as_str()) {
            let start = from + at;
            let end = start + needle.len();
            // The end maps to the character after the match (the text's end for the last).
            let (s, e) = (origin[start], origin[end]);
            if e > s {
                found.push((s, e));
            }
            from = end;
        }
    }
    found.sort_by_key(|&(start, end)| (start, std::cmp::Reverse(end)));
    let mut kept: Vec<(usize, usize)> = Vec::with_capacity(found.len());
    for (start, end) in found {
        if kept.last().is_none_or(|&(_, last_end)| start >= last_end) {
            kept.push((start, end));
        }
    }
    kept
}

/// The part of `text` around its first match of `query` (the whole query, else its terms),
/// about [`SNIPPET_CHARS`] characters on one line, HTML-escaped, every match in it marked
/// `<mark>`…`</mark>`, `…` where the text goes on. Without a match (the full-text search
/// matched a form the text does not hold as typed), the text's beginning, unmarked.
pub(crate) fn snippet(text: &str, query: &SearchQuery) -> String {
    let whole = [query.words.to_lowercase()];
    let mut found = matches(text, &whole);
    if found.is_empty() {
        found = matches(text, &query.terms);
    }
    let first = found.first().map_or(0, |&(start, _)| start);
    // The window: up to SNIPPET_LEAD characters before the first match, SNIPPET_CHARS in all.
    let before: Vec<usize> = text[..first]
        .char_indices()
        .map(|(at, _)| at)
        .rev()
        .take(SNIPPET_LEAD)
        .collect();
    let start = before.last().copied().unwrap_or(first);
    let end = text[start..]
        .char_indices()
        .nth(SNIPPET_CHARS)
        .map_or(text.len(), |(at, _)| start + at);
    let mut out = String::with_capacity(end - start + 32);
    if start > 0 {
        out.push('…');
    }
    let mut at = start;
    for &(s, e) in found.iter().filter(|&&(s, _)| s >= start && s < end) {
        let e = e.min(end);
        push_text(&mut out, &text[at..s]);
        out.push_str("<mark>");
        push_text(&mut out, &text[s..e]);
        out.push_str("</mark>");
        at = e;
    }
    push_text(&mut out, &text[at..end]);
    while out.ends_with(' ') {
        out.pop();
    }
    if end < text.len() {
        out.push('…');
    }
    out
}

/// Appends `part` HTML-escaped, each run of whitespace and control characters one space (none
/// at the start).
fn push_text(out: &mut String, part: &str) {
    for c in part.chars() {
        if c.is_whitespace() || c.is_control() {
            if !out.is_empty() && !out.ends_with(' ') {
                out.push(' ');
            }
            continue;
        }
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(raw: &str) -> SearchQuery {
        SearchQuery::parse(raw).expect("a valid query")
    }

    #[test]
    fn a_query_is_checked_and_made_into_escaped_patterns() {
        assert_eq!(SearchQuery::parse(""), Err(QueryError::Empty));
        assert_eq!(SearchQuery::parse(" \t\n"), Err(QueryError::Empty));
        assert_eq!(SearchQuery::parse("?!… ,。"), Err(QueryError::NoTerms));
        assert_eq!(SearchQuery::parse("%_\\"), Err(QueryError::NoTerms));
        assert_eq!(
            SearchQuery::parse(&"天".repeat(257)),
            Err(QueryError::TooLong)
        );
        assert!(SearchQuery::parse(&format!("  {}  ", "天".repeat(256))).is_ok());
        let q = query("  Hello, 100%_sure\\ ");
        assert_eq!(q.words, "Hello, 100%_sure\\");
        assert_eq!(q.terms, ["hello", "100", "sure"]);
        assert_eq!(q.loose, "%hello%100%sure%");
        assert_eq!(q.phrase, "%Hello, 100\\%\\_sure\\\\%");
        let chinese = query("北京今天的天气");
        assert_eq!(chinese.terms, ["北京今天的天气"]);
        assert!(chinese.has_trigram());
        assert!(
            !query("天气 ok").has_trigram(),
            "no term of three characters"
        );
        assert_eq!(query("Phân tích").terms, ["phân", "tích"]);
        assert_eq!(
            QueryError::NoTerms.to_string(),
            "q must contain a letter or a digit"
        );
    }

    #[test]
    fn a_snippet_marks_the_whole_query_ignoring_case() {
        let q = query("how are you");
        assert_eq!(
            snippet("Hello, How are you?", &q),
            "Hello, <mark>How are you</mark>?"
        );
        let q = query("北京今天的天气");
        assert_eq!(
            snippet("帮我查一下北京今天的天气", &q),
            "帮我查一下<mark>北京今天的天气</mark>"
        );
        let q = query("phân tích");
        assert_eq!(
            snippet("Phân tích file này cho tôi", &q),
            "<mark>Phân tích</mark> file này cho tôi"
        );
    }

    #[test]
    fn a_snippet_marks_each_term_when_the_whole_query_is_not_there() {
        let q = query("weather beijing");
        assert_eq!(
            snippet("Beijing: the weather is fine", &q),
            "<mark>Beijing</mark>: the <mark>weather</mark> is fine"
        );
    }

    #[test]
    fn a_snippet_escapes_html_and_keeps_one_line() {
        let q = query("script");
        assert_eq!(
            snippet("<b>a\n\n&\t'x'</b> <script>\"", &q),
            "&lt;b&gt;a &amp; &#39;x&#39;&lt;/b&gt; &lt;<mark>script</mark>&gt;&quot;"
        );
    }

    #[test]
    fn a_long_text_is_cut_around_its_first_match() {
        let text = format!("{}needle{}", "a".repeat(500), "b".repeat(500));
        let shown = snippet(&text, &query("NEEDLE"));
        assert!(shown.starts_with(&format!("…{}<mark>needle</mark>", "a".repeat(40))));
        assert!(shown.ends_with(&format!("{}…", "b".repeat(160 - 40 - 6))));
        let unmatched = snippet(&"x".repeat(300), &query("zzz"));
        assert_eq!(unmatched, format!("{}…", "x".repeat(160)));
    }

    #[test]
    fn a_fold_that_changes_lengths_still_marks_the_right_characters() {
        // 'İ' lowercases to two characters: matches after it are still placed right.
        let q = query("istanbul");
        assert_eq!(snippet("İİ to Istanbul", &q), "İİ to <mark>Istanbul</mark>");
    }
}
