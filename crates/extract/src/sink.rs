//! Collects extracted text up to a character limit and a deadline.

use std::time::{Duration, Instant};

use crate::{ExtractError, Extracted, Limits};

/// Text collected so far, and whether a limit cut it short.
pub(crate) struct Sink {
    text: String,
    chars: usize,
    max_chars: usize,
    timeout: Duration,
    /// `None` when `now + timeout` overflows: no deadline.
    deadline: Option<Instant>,
    /// The character limit was reached.
    full: bool,
    timed_out: bool,
    /// The input was cut short (e.g. by the decompression cap); reading goes on.
    incomplete: bool,
}

impl Sink {
    pub(crate) fn new(limits: &Limits) -> Self {
        Self {
            text: String::new(),
            chars: 0,
            max_chars: limits.max_text_chars,
            timeout: limits.timeout,
            deadline: Instant::now().checked_add(limits.timeout),
            full: false,
            timed_out: false,
            incomplete: false,
        }
    }

    /// Whether to stop reading: the text is full or the deadline has passed (which
    /// this checks, and records).
    pub(crate) fn done(&mut self) -> bool {
        if self.full || self.timed_out {
            return true;
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            self.timed_out = true;
        }
        self.timed_out
    }

    /// Marks the text as incomplete because the input was cut short by a limit other
    /// than characters or time. Reading what there is goes on.
    pub(crate) fn mark_incomplete(&mut self) {
        self.incomplete = true;
    }

    /// Appends `s`, or as much of it as fits. Returns `false` when reading should stop.
    pub(crate) fn push(&mut self, s: &str) -> bool {
        if self.done() {
            return false;
        }
        let room = self.max_chars - self.chars;
        // A string of at most `room` bytes has at most `room` characters.
        if s.len() <= room {
            self.chars += s.chars().count();
            self.text.push_str(s);
            return true;
        }
        let count = s.chars().count();
        if count <= room {
            self.chars += count;
            self.text.push_str(s);
            return true;
        }
        let end = s.char_indices().nth(room).map_or(s.len(), |(i, _)| i);
        self.text.push_str(&s[..end]);
        self.chars = self.max_chars;
        self.full = true;
        false
    }

    /// Bytes of text that can still be kept at most (4 per character left): anything
    /// collected beyond this before a push would only be cut.
    pub(crate) fn room_bytes(&self) -> usize {
        (self.max_chars - self.chars).saturating_mul(4)
    }

    /// Whether any non-blank text was collected.
    pub(crate) fn has_text(&self) -> bool {
        !self.text.trim().is_empty()
    }

    /// Appends a newline unless the text is empty or already ends with one.
    pub(crate) fn newline(&mut self) -> bool {
        if self.text.is_empty() || self.text.ends_with('\n') {
            return !self.done();
        }
        self.push("\n")
    }

    /// Starts a section (a page, slide or sheet): a blank line after any earlier text,
    /// then `header` on its own line.
    pub(crate) fn section(&mut self, header: &str) -> bool {
        if !self.text.is_empty()
            && (!self.newline() || (!self.text.ends_with("\n\n") && !self.push("\n")))
        {
            return false;
        }
        self.push(header) && self.push("\n")
    }

    /// The text, or `TimedOut` when the deadline passed before any text was read.
    pub(crate) fn finish(self) -> Result<Extracted, ExtractError> {
        if self.timed_out && !self.has_text() {
            return Err(ExtractError::TimedOut(self.timeout));
        }
        Ok(Extracted::Text {
            text: self.text,
            truncated: self.full || self.timed_out || self.incomplete,
        })
    }
}
