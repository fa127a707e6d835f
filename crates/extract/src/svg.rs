//! SVG: the words a person sees or hears, not the XML.
//!
//! What reaches the agent is the text content of the drawing: each `<title>` (its accessible
//! name), `<desc>` (its description) and `<text>` (with its `<tspan>` / `<textPath>` runs) on a
//! line of its own, in document order, with white space collapsed as an SVG viewer collapses it.
//! Not the XML itself, because:
//!
//! - most of an SVG's bytes are geometry (path data, transforms, gradients): tokens that mean
//!   nothing to a language model and would spend the text budget before any word is reached;
//! - an SVG is active content (the attachments service serves it sandboxed, as an attachment):
//!   its `<script>`, `<style>`, `<foreignObject>` HTML and event-handler attributes are not
//!   something to relay to a model verbatim; none of them is read here;
//! - there is no rasterizer in this crate, so the drawing itself cannot be sent as a vision
//!   block (an SVG with no text says so: "no extractable text").
//!
//! Bounded like the Office readers: the file is at most `max_input_bytes` and is parsed in
//! place (no copy when it is UTF-8, which the attachments service checked on upload); the text
//! kept is at most `max_text_chars`; the deadline is checked every 256 XML events; no entity is
//! expanded beyond the predefined ones and character references (quick-xml reads no DTD).

use quick_xml::Reader;
use quick_xml::events::Event;

use crate::ooxml::{local, local_end, resolve_ref};
use crate::sink::Sink;
use crate::{ExtractError, Extracted, Limits};

/// Elements whose text is read.
fn is_text_element(name: &str) -> bool {
    matches!(name, "title" | "desc" | "text")
}

/// Elements whose contents are never read, even inside a text element.
fn is_skipped(name: &str) -> bool {
    matches!(name, "script" | "style" | "foreignObject" | "metadata")
}

/// Collapses white space runs to one space, as `xml:space="default"` renders text.
fn push_collapsed(line: &mut String, text: &str) {
    for c in text.chars() {
        if c.is_whitespace() {
            if !line.is_empty() && !line.ends_with(' ') {
                line.push(' ');
            }
        } else {
            line.push(c);
        }
    }
}

/// The text content of an SVG: `<title>`, `<desc>` and `<text>` elements, a line each.
pub(crate) fn extract(bytes: &[u8], limits: &Limits) -> Result<Extracted, ExtractError> {
    let xml = String::from_utf8_lossy(bytes);
    let mut reader = Reader::from_str(&xml);
    let mut sink = Sink::new(limits);
    // Depth inside text elements and inside skipped elements; the line being built.
    let (mut in_text, mut in_skipped) = (0u32, 0u32);
    let mut line = String::new();
    let mut events = 0u32;
    let flush = |line: &mut String, sink: &mut Sink| -> bool {
        let text = line.trim();
        let more = text.is_empty() || (sink.push(text) && sink.push("\n"));
        line.clear();
        more
    };
    loop {
        events = events.wrapping_add(1);
        if events.is_multiple_of(256) && sink.done() {
            break;
        }
        // Text past what the sink can still hold would only be cut: stop collecting it.
        let room = line.len() <= sink.room_bytes();
        let reading = in_text > 0 && in_skipped == 0 && room;
        match reader.read_event() {
            Ok(Event::Eof) => break,
            Ok(Event::Start(e)) => {
                let name = local(&e);
                if is_skipped(name) {
                    in_skipped += 1;
                } else if is_text_element(name) {
                    if in_text == 0 && !flush(&mut line, &mut sink) {
                        break;
                    }
                    in_text += 1;
                }
            }
            Ok(Event::End(e)) => {
                let qname = e.name();
                let name = local_end(&qname);
                if is_skipped(name) {
                    in_skipped = in_skipped.saturating_sub(1);
                } else if is_text_element(name) && in_text > 0 {
                    in_text -= 1;
                    if in_text == 0 && !flush(&mut line, &mut sink) {
                        break;
                    }
                }
            }
            Ok(Event::Text(t)) if reading => push_collapsed(&mut line, &t.xml10_content()),
            Ok(Event::CData(t)) if reading => push_collapsed(&mut line, &t.xml10_content()),
            Ok(Event::GeneralRef(r)) if reading => {
                if let Some(s) = resolve_ref(&r) {
                    push_collapsed(&mut line, &s);
                }
            }
            Ok(_) => {}
            Err(_) if sink.has_text() || !line.trim().is_empty() => {
                flush(&mut line, &mut sink);
                sink.mark_incomplete();
                break;
            }
            Err(e) => {
                return Err(ExtractError::corrupt(
                    "SVG",
                    format!("malformed XML at byte {} ({e})", reader.buffer_position()),
                ));
            }
        }
    }
    flush(&mut line, &mut sink);
    sink.finish()
}
