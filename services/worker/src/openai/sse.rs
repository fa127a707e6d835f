//! A small incremental parser of `text/event-stream` bodies: bytes in, the `data` of each
//! complete event out. Lines and events are bounded so a broken or hostile server cannot make
//! the worker buffer without limit.

/// Longest line, and longest event `data`, accepted.
pub const MAX_LINE_BYTES: usize = 1024 * 1024;

/// Splits a byte stream into server-sent events.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes not yet ended by a newline.
    buffer: Vec<u8>,
    /// Where to resume looking for a newline in `buffer`.
    scanned: usize,
    /// `data` lines of the event being read, joined with `\n`.
    data: Option<String>,
}

impl SseParser {
    /// An empty parser.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds `bytes` and returns the data of every event they complete, in order.
    pub fn push(&mut self, bytes: &[u8]) -> anyhow::Result<Vec<String>> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        let mut start = 0;
        while let Some(offset) = self.buffer[self.scanned..].iter().position(|&b| b == b'\n') {
            let end = self.scanned + offset;
            let line = std::str::from_utf8(&self.buffer[start..end])
                .map_err(|_| anyhow::anyhow!("model stream line is not UTF-8"))?;
            let line = line.strip_suffix('\r').unwrap_or(line).to_owned();
            start = end + 1;
            self.scanned = start;
            if let Some(data) = self.line(&line)? {
                events.push(data);
            }
        }
        self.buffer.drain(..start);
        // What is left has no newline: the next search starts after it.
        self.scanned = self.buffer.len();
        if self.buffer.len() > MAX_LINE_BYTES {
            anyhow::bail!("model stream line longer than {MAX_LINE_BYTES} bytes");
        }
        Ok(events)
    }

    /// The end of the body: a last event not followed by a blank line is still delivered.
    pub fn finish(&mut self) -> anyhow::Result<Option<String>> {
        if !self.buffer.is_empty() {
            let rest = std::mem::take(&mut self.buffer);
            self.scanned = 0;
            let line = String::from_utf8(rest)
                .map_err(|_| anyhow::anyhow!("model stream line is not UTF-8"))?;
            let line = line.strip_suffix('\r').unwrap_or(&line).to_owned();
            if let Some(data) = self.line(&line)? {
                return Ok(Some(data));
            }
        }
        Ok(self.data.take())
    }

    /// One complete line; returns the event's data when the line ends the event.
    fn line(&mut self, line: &str) -> anyhow::Result<Option<String>> {
        if line.is_empty() {
            return Ok(self.data.take());
        }
        if line.starts_with(':') {
            return Ok(None); // comment, e.g. a keep-alive
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        if field != "data" {
            return Ok(None); // `event`, `id`, `retry`: not used by chat completions
        }
        let value = value.strip_prefix(' ').unwrap_or(value);
        match &mut self.data {
            Some(data) => {
                if data.len() + 1 + value.len() > MAX_LINE_BYTES {
                    anyhow::bail!("model stream event longer than {MAX_LINE_BYTES} bytes");
                }
                data.push('\n');
                data.push_str(value);
            }
            None => self.data = Some(value.to_owned()),
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &str = ": keep-alive\r\n\r\ndata: {\"a\":\"é😀\"}\r\n\r\nevent: x\ndata:{\"b\":1}\n\ndata: [DONE]\n\n";

    fn all(parser: &mut SseParser, chunks: &[&[u8]]) -> Vec<String> {
        let mut out = Vec::new();
        for chunk in chunks {
            out.extend(parser.push(chunk).unwrap());
        }
        out.extend(parser.finish().unwrap());
        out
    }

    #[test]
    fn events_are_the_same_whatever_the_chunking() {
        let expected = vec![
            "{\"a\":\"é😀\"}".to_owned(),
            "{\"b\":1}".to_owned(),
            "[DONE]".to_owned(),
        ];
        let whole = all(&mut SseParser::new(), &[BODY.as_bytes()]);
        assert_eq!(whole, expected);
        let bytes: Vec<&[u8]> = BODY.as_bytes().chunks(1).collect();
        assert_eq!(all(&mut SseParser::new(), &bytes), expected);
        let threes: Vec<&[u8]> = BODY.as_bytes().chunks(3).collect();
        assert_eq!(all(&mut SseParser::new(), &threes), expected);
    }

    #[test]
    fn multi_line_data_is_joined_and_a_last_unterminated_event_is_kept() {
        let out = all(&mut SseParser::new(), &[b"data: a\ndata: b\n\ndata: c"]);
        assert_eq!(out, vec!["a\nb".to_owned(), "c".to_owned()]);
    }

    #[test]
    fn an_overlong_line_is_an_error() {
        let mut parser = SseParser::new();
        let big = vec![b'x'; MAX_LINE_BYTES / 2 + 1];
        assert!(parser.push(&big).is_ok());
        let err = parser.push(&big).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("longer than")));
    }
}
