//! Threads as people manage them (issue 28): the title a thread gets from its first user
//! message, the rules of a title someone gives it, and the request/reply on which the runs
//! service (which serves `PATCH /api/v1/agent/threads/{threadId}`, every path under
//! `/api/v1/agent/threads/` being routed to it) asks history to rename a thread.
//!
//! A derived title is one clean line: runs of whitespace and control characters (newlines
//! included) become one space, and a text longer than [`AUTO_TITLE_CHARS`] is cut at the last word
//! boundary within it (on a character boundary when it has no space, as Chinese text has not).
//! The same cut is made in SQL by `migrations/history/0008_thread_search.sql` for the threads
//! created before titles existed.

use serde::{Deserialize, Serialize};

/// Most characters of a title derived from a message.
pub const AUTO_TITLE_CHARS: usize = 80;
/// Most characters of a title someone gives a thread (after trimming).
pub const MAX_TITLE_CHARS: usize = 200;

/// The title a thread gets from its first user message: its text as one clean line, cut to at
/// most [`AUTO_TITLE_CHARS`] characters, at a word boundary where there is one; the first file's
/// name when the text has nothing to show; `None` when neither has.
pub fn derived_title(text: &str, first_file: Option<&str>) -> Option<String> {
    one_line(text)
        .map(|line| cut_at_word(&line, AUTO_TITLE_CHARS))
        .or_else(|| first_file.and_then(one_line))
        .map(|name| cut_at_word(&name, AUTO_TITLE_CHARS))
}

/// `text` as one line: runs of whitespace and control characters made one space, trimmed;
/// `None` when nothing is left.
fn one_line(text: &str) -> Option<String> {
    let mut line = String::with_capacity(text.len().min(4 * AUTO_TITLE_CHARS));
    let mut space = false;
    for c in text.chars() {
        if c.is_whitespace() || c.is_control() {
            space = !line.is_empty();
        } else {
            if space {
                line.push(' ');
                space = false;
            }
            line.push(c);
        }
    }
    (!line.is_empty()).then_some(line)
}

/// `line` (one line, trimmed) cut to at most `max` characters: at its last space within them
/// when it has one, else exactly there.
fn cut_at_word(line: &str, max: usize) -> String {
    let Some((end, _)) = line.char_indices().nth(max) else {
        return line.to_owned(); // `max` characters or fewer
    };
    // A space right after the cut ends a word too, hence the room for one more character.
    let room = line[end..]
        .chars()
        .next()
        .map_or(end, |c| end + c.len_utf8());
    match line[..room].rfind(' ') {
        Some(space) if space > 0 => line[..space].to_owned(),
        _ => line[..end].to_owned(),
    }
}

/// Why a title someone gave is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TitleError {
    /// Empty, or only whitespace.
    #[error("title must not be empty")]
    Empty,
    /// Longer than [`MAX_TITLE_CHARS`] after trimming.
    #[error("title must be at most 200 characters")]
    TooLong,
    /// Holds a control character (a newline, a tab, ...): a title is one line.
    #[error("title must be one line without control characters")]
    Control,
}

/// A title someone gave a thread, trimmed: 1 to [`MAX_TITLE_CHARS`] characters, none of them a
/// control character.
pub fn parse_title(raw: &str) -> Result<String, TitleError> {
    let title = raw.trim();
    if title.is_empty() {
        return Err(TitleError::Empty);
    }
    if title.chars().any(char::is_control) {
        return Err(TitleError::Control);
    }
    if title.chars().count() > MAX_TITLE_CHARS {
        return Err(TitleError::TooLong);
    }
    Ok(title.to_owned())
}

/// A thread as `GET /api/v1/agent/threads` lists it (and the rename answers it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ThreadSummary {
    /// The thread.
    pub thread_id: String,
    /// Its title: given by its owner, else derived from its first user message; `null` while
    /// it has no user message with text or a file.
    pub title: Option<String>,
    /// How many messages it holds.
    pub message_count: i64,
    /// When its first message was written (RFC 3339, UTC).
    pub created_at: String,
    /// When its latest message was written (RFC 3339, UTC).
    pub updated_at: String,
}

/// Request on [`crate::messaging::Names::history_thread_rename_subject`]: give the owner's
/// thread a title. Versioned by `v`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum ThreadRenameRequest {
    /// Version 1.
    #[serde(rename = "1")]
    V1 {
        /// The caller's `sub`: another owner's thread is never renamed (nor found).
        owner: String,
        /// The thread.
        thread_id: String,
        /// The new title, already checked by [`parse_title`].
        title: String,
    },
}

/// Answer to a [`ThreadRenameRequest`]. Versioned by `v`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum ThreadRenameReply {
    /// Version 1.
    #[serde(rename = "1")]
    V1 {
        /// The thread renamed, as the list shows it; `None`: the owner has no such thread.
        thread: Option<ThreadSummary>,
    },
    /// The title broke a rule of [`parse_title`] (a caller that did not check it).
    #[serde(rename = "1-refused")]
    Refused {
        /// Why, in [`TitleError`]'s words.
        message: String,
    },
}

/// Request on [`crate::messaging::Names::history_thread_fork_subject`]: a new thread of the
/// owner holding the messages of one of its threads up to (and with) one of them. Versioned by
/// `v`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum ThreadForkRequest {
    /// Version 1.
    #[serde(rename = "1")]
    V1 {
        /// The caller's `sub`: another owner's thread is never read (nor found).
        owner: String,
        /// The thread forked.
        thread_id: String,
        /// The last message the fork holds.
        message_id: String,
        /// The new thread's id (the caller's choice, or one it made).
        new_thread_id: String,
    },
}

/// Answer to a [`ThreadForkRequest`]. Versioned by `v`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "v")]
pub enum ThreadForkReply {
    /// Version 1: the new thread, as the list shows it.
    #[serde(rename = "1")]
    V1 {
        /// The fork.
        thread: ThreadSummary,
    },
    /// The owner has no such thread.
    #[serde(rename = "1-no-thread")]
    NoThread,
    /// The thread holds no message with that id.
    #[serde(rename = "1-no-message")]
    NoMessage,
    /// The owner has a thread with the new id already.
    #[serde(rename = "1-exists")]
    Exists,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_derived_title_is_one_clean_line_cut_at_a_word_within_80_characters() {
        assert_eq!(
            derived_title("  Hello,\n how are\tyou? \u{7}", None).as_deref(),
            Some("Hello, how are you?")
        );
        let long = "word ".repeat(30);
        let title = derived_title(&long, None).unwrap_or_default();
        assert_eq!(
            title,
            "word ".repeat(16).trim_end(),
            "80 characters end a word"
        );
        let long = format!("{} tail", "abcdefghi ".repeat(8).trim_end());
        // 79 characters then " tail": the cut falls inside "tail", so the word is left out.
        assert_eq!(
            derived_title(&long, None).as_deref(),
            Some("abcdefghi ".repeat(8).trim_end())
        );
    }

    #[test]
    fn text_without_spaces_is_cut_on_a_character_boundary() {
        let chinese = "帮我查一下北京今天的天气".repeat(10); // 120 characters, 3 bytes each
        let title = derived_title(&chinese, None).unwrap_or_default();
        assert_eq!(title.chars().count(), AUTO_TITLE_CHARS);
        assert!(chinese.starts_with(&title));
        assert_eq!(
            derived_title("Phân tích file này cho tôi", None).as_deref(),
            Some("Phân tích file này cho tôi")
        );
        let one_word = "x".repeat(100);
        assert_eq!(derived_title(&one_word, None), Some("x".repeat(80)));
    }

    #[test]
    fn a_message_of_files_only_is_titled_by_its_first_file() {
        assert_eq!(
            derived_title(" \n ", Some("report.pdf")).as_deref(),
            Some("report.pdf")
        );
        assert_eq!(
            derived_title("look", Some("report.pdf")).as_deref(),
            Some("look")
        );
        assert_eq!(derived_title("", None), None);
        assert_eq!(derived_title("\u{0}\u{1}", Some("")), None);
    }

    #[test]
    fn a_given_title_is_trimmed_and_checked() {
        assert_eq!(
            parse_title("  Trip to Hà Nội ").as_deref(),
            Ok("Trip to Hà Nội")
        );
        assert_eq!(parse_title(" \t "), Err(TitleError::Empty));
        assert_eq!(parse_title("a\nb"), Err(TitleError::Control));
        assert_eq!(parse_title("a\u{0}b"), Err(TitleError::Control));
        let longest = "天".repeat(MAX_TITLE_CHARS);
        assert_eq!(parse_title(&longest), Ok(longest.clone()));
        assert_eq!(
            parse_title(&format!("{longest}x")),
            Err(TitleError::TooLong)
        );
        assert_eq!(
            TitleError::TooLong.to_string(),
            "title must be at most 200 characters"
        );
    }

    #[test]
    fn the_rename_messages_keep_their_wire_form() {
        let request = ThreadRenameRequest::V1 {
            owner: "alice".into(),
            thread_id: "t".into(),
            title: "Trip".into(),
        };
        let text = serde_json::to_string(&request).unwrap_or_default();
        assert_eq!(
            text,
            r#"{"v":"1","owner":"alice","thread_id":"t","title":"Trip"}"#
        );
        let reply = ThreadRenameReply::V1 { thread: None };
        let text = serde_json::to_string(&reply).unwrap_or_default();
        assert_eq!(text, r#"{"v":"1","thread":null}"#);
        let back: Result<ThreadRenameReply, _> = serde_json::from_str(&text);
        assert_eq!(back.ok(), Some(reply));
    }
}
