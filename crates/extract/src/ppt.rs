//! PowerPoint 97-2003 (.ppt): the text of each slide, in slide order, under a
//! `--- Slide N ---` header (the PPTX reader's shape), read from the `PowerPoint Document`
//! stream ([MS-PPT]).
//!
//! The stream is a tree of records (an 8-byte header: version and instance, type, length;
//! version 0xF marks a container). Text is in `TextCharsAtom` (UTF-16LE) and `TextBytesAtom`
//! (one byte per character) records. Slide order and which text belongs to which slide come
//! from the document's own index: the `Current User` stream points at the last `UserEditAtom`,
//! whose chain of persist directories maps object ids to stream offsets; the document
//! container's slide list (`SlideListWithTextContainer`, instance 0) names each slide in order,
//! followed by the text of its placeholders; the slide's own container holds the text of its
//! other shapes (text boxes, tables), read depth first. Masters and notes are not read, as the
//! PPTX reader reads only `ppt/slides/slideN.xml`.
//!
//! A file whose index cannot be followed (a broken edit chain) still gives its text: every text
//! record of the stream outside masters and notes, in stream order, without slide headers.
//! Refused with a reason: files encrypted with a password. Bounded: record lengths are checked
//! against their container, containers are followed at most [`MAX_DEPTH`] deep, the edit chain
//! at most [`MAX_EDITS`] long, the persist directory and slide list are capped, text stops at
//! `max_text_chars`, and the deadline is checked every 256 records.
//!
//! [MS-PPT]: https://learn.microsoft.com/en-us/openspecs/office_file_formats/ms-ppt/

use std::collections::{HashMap, HashSet};

use crate::ole::{Container, index, u16_at, u32_at};
use crate::sink::Sink;
use crate::{ExtractError, Extracted, Limits};

const FORMAT: &str = "PPT";

const RT_DOCUMENT: u16 = 0x03E8;
const RT_SLIDE: u16 = 0x03EE;
const RT_NOTES: u16 = 0x03F0;
const RT_SLIDE_PERSIST_ATOM: u16 = 0x03F3;
const RT_MAIN_MASTER: u16 = 0x03F8;
const RT_TEXT_CHARS_ATOM: u16 = 0x0FA0;
const RT_TEXT_BYTES_ATOM: u16 = 0x0FA8;
const RT_SLIDE_LIST_WITH_TEXT: u16 = 0x0FF0;
const RT_USER_EDIT_ATOM: u16 = 0x0FF5;
const RT_CURRENT_USER_ATOM: u16 = 0x0FF6;
const RT_PERSIST_DIRECTORY_ATOM: u16 = 0x1772;
/// `CurrentUserAtom.headerToken` of an encrypted file.
const ENCRYPTED_TOKEN: u32 = 0xF3D1_C4DF;

/// Containers followed at most this deep.
const MAX_DEPTH: u32 = 64;
/// Edits (`UserEditAtom`s) followed at most.
const MAX_EDITS: usize = 4096;
/// Persist directory entries kept at most.
const MAX_PERSIST_ENTRIES: usize = 1_000_000;
/// Slides read at most.
const MAX_SLIDES: usize = 100_000;

fn corrupt(detail: impl ToString) -> ExtractError {
    ExtractError::corrupt(FORMAT, detail)
}

/// A record header.
#[derive(Debug, Clone, Copy)]
struct Header {
    container: bool,
    instance: u16,
    kind: u16,
    /// Where the record's data starts and ends in the stream.
    body: usize,
    end: usize,
}

/// The record at `at`, when its header and data lie within `..limit`.
fn header(stream: &[u8], at: usize, limit: usize) -> Option<Header> {
    let ver_instance = u16_at(stream, at)?;
    let kind = u16_at(stream, at + 2)?;
    let len = index(u32_at(stream, at + 4)?);
    let body = at + 8;
    let end = body.checked_add(len)?;
    (end <= limit.min(stream.len())).then_some(Header {
        container: ver_instance & 0x000F == 0x000F,
        instance: ver_instance >> 4,
        kind,
        body,
        end,
    })
}

/// Adds one character of a text atom: paragraph marks end a line, vertical tabs break one,
/// other control characters are dropped.
fn put(c: char, line: &mut String) {
    match c {
        '\r' | '\u{b}' => line.push('\n'),
        '\t' => line.push('\t'),
        c if c.is_control() => {}
        c => line.push(c),
    }
}

/// Reads text records into the sink, counting records for the deadline.
struct Reader<'s> {
    stream: &'s [u8],
    sink: Sink,
    records: u32,
}

impl Reader<'_> {
    /// Whether to stop, checking the deadline every 256 records.
    fn stop(&mut self) -> bool {
        self.records = self.records.wrapping_add(1);
        self.records.is_multiple_of(256) && self.sink.done()
    }

    /// One text atom, ending its line.
    fn text_atom(&mut self, record: Header) -> bool {
        let data = &self.stream[record.body..record.end];
        let mut line = String::new();
        let room = self.sink.room_bytes();
        if record.kind == RT_TEXT_CHARS_ATOM {
            let units = data
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]));
            for c in char::decode_utf16(units) {
                put(c.unwrap_or(char::REPLACEMENT_CHARACTER), &mut line);
                if line.len() > room {
                    break;
                }
            }
        } else {
            for &b in data {
                put(char::from(b), &mut line);
                if line.len() > room {
                    break;
                }
            }
        }
        self.sink.push(&line) && self.sink.newline()
    }

    /// The text records in `start..end`, depth first, skipping the containers `skip` names.
    /// `false` when reading should stop.
    fn walk(&mut self, start: usize, end: usize, depth: u32, skip: fn(Header) -> bool) -> bool {
        let mut at = start;
        while at < end {
            if self.stop() {
                return false;
            }
            let Some(record) = header(self.stream, at, end) else {
                // A record running past its container: the rest of it is not read.
                self.sink.mark_incomplete();
                return true;
            };
            if record.container {
                if !skip(record)
                    && depth < MAX_DEPTH
                    && !self.walk(record.body, record.end, depth + 1, skip)
                {
                    return false;
                }
            } else if matches!(record.kind, RT_TEXT_CHARS_ATOM | RT_TEXT_BYTES_ATOM)
                && !self.text_atom(record)
            {
                return false;
            }
            at = record.end;
        }
        true
    }
}

/// Masters, notes, and the slide lists of masters and notes: not slide text.
fn not_slides(record: Header) -> bool {
    matches!(record.kind, RT_MAIN_MASTER | RT_NOTES)
        || (record.kind == RT_SLIDE_LIST_WITH_TEXT && record.instance != 0)
}

/// The persist directory: object id -> stream offset, newest edit first.
fn persist_directory(stream: &[u8], mut edit: usize) -> Option<(u32, HashMap<u32, usize>)> {
    let mut offsets = HashMap::new();
    let mut document = None;
    let mut seen = HashSet::new();
    while seen.len() < MAX_EDITS && seen.insert(edit) {
        let atom = header(stream, edit, stream.len())?;
        if atom.kind != RT_USER_EDIT_ATOM || atom.end - atom.body < 20 {
            return None;
        }
        let last_edit = index(u32_at(stream, atom.body + 8)?);
        let directory = index(u32_at(stream, atom.body + 12)?);
        document.get_or_insert(u32_at(stream, atom.body + 16)?);
        let dir = header(stream, directory, stream.len())?;
        if dir.kind != RT_PERSIST_DIRECTORY_ATOM {
            return None;
        }
        let mut at = dir.body;
        while at < dir.end && offsets.len() < MAX_PERSIST_ENTRIES {
            let entry = u32_at(stream, at)?;
            let (first, count) = (entry & 0x000F_FFFF, entry >> 20);
            if at + 4 + index(count) * 4 > dir.end {
                return None;
            }
            for n in 0..count {
                let offset = u32_at(stream, at + 4 + index(n) * 4)?;
                offsets.entry(first + n).or_insert(index(offset));
            }
            at += 4 + index(count) * 4;
        }
        if last_edit == 0 {
            break;
        }
        edit = last_edit;
    }
    Some((document?, offsets))
}

/// Each slide of the document's slide list, in order: its persist id and where the text of
/// its placeholders lies in the list (between its `SlidePersistAtom` and the next).
fn slide_list(stream: &[u8], document: Header) -> (Vec<(u32, usize, usize)>, bool) {
    let mut slides: Vec<(u32, usize, usize)> = Vec::new();
    let mut complete = true;
    let mut at = document.body;
    while let Some(record) = header(stream, at, document.end) {
        at = record.end;
        if record.kind != RT_SLIDE_LIST_WITH_TEXT || record.instance != 0 {
            continue;
        }
        let mut inner = record.body;
        while let Some(child) = header(stream, inner, record.end) {
            inner = child.end;
            if child.kind == RT_SLIDE_PERSIST_ATOM {
                if slides.len() >= MAX_SLIDES {
                    complete = false;
                    break;
                }
                if let Some(id) = u32_at(stream, child.body) {
                    slides.push((id, child.end, child.end));
                }
            } else if let Some(last) = slides.last_mut() {
                last.2 = child.end;
            }
        }
    }
    (slides, complete)
}

/// Text of a .ppt: each slide under a `--- Slide N ---` header.
pub(crate) fn extract(bytes: &[u8], limits: &Limits) -> Result<Extracted, ExtractError> {
    let mut file = Container::open(FORMAT, bytes)?;
    let stream = file.required("PowerPoint Document")?;
    let current = file.stream("Current User")?.unwrap_or_default();
    let mut edit = None;
    if let Some(atom) = header(&current, 0, current.len())
        && atom.kind == RT_CURRENT_USER_ATOM
    {
        if u32_at(&current, atom.body + 4) == Some(ENCRYPTED_TOKEN) {
            return Err(ExtractError::Protected { format: FORMAT });
        }
        edit = u32_at(&current, atom.body + 8).map(index);
    }
    let mut reader = Reader {
        stream: &stream,
        sink: Sink::new(limits),
        records: 0,
    };
    let indexed = edit
        .and_then(|edit| persist_directory(&stream, edit))
        .and_then(|(document, offsets)| {
            let at = *offsets.get(&document)?;
            let record = header(&stream, at, stream.len())?;
            (record.kind == RT_DOCUMENT).then_some((record, offsets))
        });
    let Some((document, offsets)) = indexed else {
        if header(&stream, 0, stream.len()).is_none() {
            return Err(corrupt("the PowerPoint Document stream holds no records"));
        }
        reader.walk(0, stream.len(), 0, not_slides);
        return reader.sink.finish();
    };
    let (slides, complete) = slide_list(&stream, document);
    if !complete {
        reader.sink.mark_incomplete();
    }
    for (n, (id, from, to)) in slides.into_iter().enumerate() {
        if reader.sink.done() || !reader.sink.section(&format!("--- Slide {} ---", n + 1)) {
            break;
        }
        if !reader.walk(from, to, 0, not_slides) {
            break;
        }
        let own = offsets
            .get(&id)
            .and_then(|&at| header(&stream, at, stream.len()))
            .filter(|record| record.kind == RT_SLIDE);
        if let Some(slide) = own
            && !reader.walk(slide.body, slide.end, 1, not_slides)
        {
            break;
        }
    }
    reader.sink.finish()
}
