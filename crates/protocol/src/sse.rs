//! The one incremental parser of `text/event-stream` bodies: bytes in, complete events out.
//! The worker reads model streams with it, the tests and benchmarks read the services' event
//! streams with it. Lines and events are bounded so a broken or hostile server cannot make the
//! reader buffer without limit; a frame is decoded only once whole, so a multi-byte character
//! split across chunks is never cut.

use thiserror::Error;

/// Longest line, and longest event `data`, accepted.
pub const MAX_LINE_BYTES: usize = 1024 * 1024;

/// One server-sent event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// Its `id` field, if it had one.
    pub id: Option<String>,
    /// Its `event` field (the type), if it had one.
    pub event: Option<String>,
    /// Its `data` lines, joined with `\n`.
    pub data: String,
}

/// What a stream carries: events, and comments (keep-alives).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseFrame {
    /// An event with data.
    Event(SseEvent),
    /// A comment line (`: ...`), such as a heartbeat.
    Comment,
}

/// Why a stream cannot be read.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SseError {
    /// A line or an event's data is longer than [`MAX_LINE_BYTES`].
    #[error("event stream line or event longer than {MAX_LINE_BYTES} bytes")]
    TooLong,
    /// A line is not UTF-8.
    #[error("event stream line is not UTF-8")]
    NotUtf8,
}

/// Splits a byte stream into server-sent events.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes not yet ended by a newline.
    buffer: Vec<u8>,
    /// Where to resume looking for a newline in `buffer`.
    scanned: usize,
    /// The event being read (fields seen so far); `data` stays `None` until a data line.
    pending: SseEvent,
    data: Option<String>,
}

impl SseParser {
    /// An empty parser.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds `bytes` and returns every frame they complete, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<SseFrame>, SseError> {
        self.buffer.extend_from_slice(bytes);
        let mut frames = Vec::new();
        let mut start = 0;
        while let Some(offset) = self.buffer[self.scanned..].iter().position(|&b| b == b'\n') {
            let end = self.scanned + offset;
            let line = std::str::from_utf8(&self.buffer[start..end])
                .map_err(|_| SseError::NotUtf8)?
                .to_owned();
            start = end + 1;
            self.scanned = start;
            if let Some(frame) = self.line(line.strip_suffix('\r').unwrap_or(&line))? {
                frames.push(frame);
            }
        }
        self.buffer.drain(..start);
        // What is left has no newline: the next search starts after it.
        self.scanned = self.buffer.len();
        if self.buffer.len() > MAX_LINE_BYTES {
            return Err(SseError::TooLong);
        }
        Ok(frames)
    }

    /// The end of the body: a last event not followed by a blank line is still delivered.
    pub fn finish(&mut self) -> Result<Option<SseFrame>, SseError> {
        let mut last = None;
        if !self.buffer.is_empty() {
            let rest = std::mem::take(&mut self.buffer);
            self.scanned = 0;
            let line = String::from_utf8(rest).map_err(|_| SseError::NotUtf8)?;
            last = self.line(line.strip_suffix('\r').unwrap_or(&line))?;
        }
        Ok(last.or_else(|| self.dispatch()))
    }

    /// One complete line; returns a frame when the line ends one.
    fn line(&mut self, line: &str) -> Result<Option<SseFrame>, SseError> {
        if line.is_empty() {
            return Ok(self.dispatch());
        }
        if line.starts_with(':') {
            return Ok(Some(SseFrame::Comment));
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "data" => match &mut self.data {
                Some(data) => {
                    if data.len() + 1 + value.len() > MAX_LINE_BYTES {
                        return Err(SseError::TooLong);
                    }
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            "id" => self.pending.id = Some(value.to_owned()),
            "event" => self.pending.event = Some(value.to_owned()),
            _ => {} // `retry` and unknown fields
        }
        Ok(None)
    }

    /// Ends the event being read: a frame if it had data (an event without data is not
    /// dispatched).
    fn dispatch(&mut self) -> Option<SseFrame> {
        let pending = std::mem::take(&mut self.pending);
        self.data
            .take()
            .map(|data| SseFrame::Event(SseEvent { data, ..pending }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &str = ": keep-alive\r\n\r\nid: 1\ndata: {\"a\":\"é😀\"}\r\n\r\nevent: x\ndata:{\"b\":1}\n\ndata: [DONE]\n\n";

    fn all(parser: &mut SseParser, chunks: &[&[u8]]) -> Vec<SseFrame> {
        let mut out = Vec::new();
        for chunk in chunks {
            out.extend(parser.push(chunk).unwrap());
        }
        out.extend(parser.finish().unwrap());
        out
    }

    fn event(id: Option<&str>, event: Option<&str>, data: &str) -> SseFrame {
        SseFrame::Event(SseEvent {
            id: id.map(str::to_owned),
            event: event.map(str::to_owned),
            data: data.to_owned(),
        })
    }

    #[test]
    fn events_are_the_same_whatever_the_chunking_even_inside_a_character() {
        let expected = vec![
            SseFrame::Comment,
            event(Some("1"), None, "{\"a\":\"é😀\"}"),
            event(None, Some("x"), "{\"b\":1}"),
            event(None, None, "[DONE]"),
        ];
        let whole = all(&mut SseParser::new(), &[BODY.as_bytes()]);
        assert_eq!(whole, expected);
        for size in [1, 2, 3, 5] {
            let chunks: Vec<&[u8]> = BODY.as_bytes().chunks(size).collect();
            assert_eq!(
                all(&mut SseParser::new(), &chunks),
                expected,
                "chunks of {size}"
            );
        }
    }

    #[test]
    fn multi_line_data_is_joined_and_a_last_unterminated_event_is_kept() {
        let out = all(&mut SseParser::new(), &[b"data: a\ndata: b\n\ndata: c"]);
        assert_eq!(out, vec![event(None, None, "a\nb"), event(None, None, "c")]);
    }

    #[test]
    fn an_event_without_data_is_not_dispatched() {
        let out = all(&mut SseParser::new(), &[b"id: 7\n\nevent: y\n\n"]);
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn an_overlong_line_and_bad_bytes_are_errors() {
        let mut parser = SseParser::new();
        let big = vec![b'x'; MAX_LINE_BYTES / 2 + 1];
        assert!(parser.push(&big).is_ok());
        assert_eq!(parser.push(&big), Err(SseError::TooLong));
        assert_eq!(
            SseParser::new().push(b"data: \xff\n\n"),
            Err(SseError::NotUtf8)
        );
    }
}
