//! DOCX and PPTX (and the parts of an XLSX, see `xlsx.rs`): zip archives of XML parts, read
//! with a cap on entries and on the total bytes decompressed.
//!
//! The cap counts the bytes actually inflated (a `take` on the decompressing reader),
//! never the sizes the zip headers declare, which a bomb sets to anything. Memory per
//! file is then the input, at most one part of `max_decompressed_bytes` at a time as
//! text, and what is kept from it: the text (`max_text_chars`).

use std::io::{Cursor, Read};

use quick_xml::Reader;
use quick_xml::escape::resolve_predefined_entity;
use quick_xml::events::{BytesRef, BytesStart, Event};
use zip::ZipArchive;

use crate::sink::Sink;
use crate::{ExtractError, Extracted, Limits};

/// An Office archive, and how many more bytes may be decompressed from it.
pub(crate) struct Package<'a> {
    format: &'static str,
    zip: ZipArchive<Cursor<&'a [u8]>>,
    budget: u64,
}

/// One part, and whether the decompression cap cut it.
pub(crate) struct Part<T = String> {
    /// The part as text (decoded by [`into_text`]), or its bytes.
    pub(crate) xml: T,
    pub(crate) cut: bool,
}

impl<'a> Package<'a> {
    pub(crate) fn open(
        format: &'static str,
        bytes: &'a [u8],
        limits: &Limits,
    ) -> Result<Self, ExtractError> {
        let zip = ZipArchive::new(Cursor::new(bytes))
            .map_err(|e| ExtractError::corrupt(format, format!("not a valid zip archive ({e})")))?;
        if zip.len() > limits.max_zip_entries {
            return Err(ExtractError::corrupt(
                format,
                format!(
                    "the archive lists {} entries, over the limit of {}",
                    zip.len(),
                    limits.max_zip_entries
                ),
            ));
        }
        Ok(Self {
            format,
            zip,
            budget: u64::try_from(limits.max_decompressed_bytes).unwrap_or(u64::MAX),
        })
    }

    pub(crate) fn names(&self) -> Vec<String> {
        self.zip
            .file_names()
            .filter_map(|n| n.ok().map(std::borrow::Cow::into_owned))
            .collect()
    }

    /// The part `name` as text (`None` if absent), decompressing at most the remaining budget.
    pub(crate) fn part(&mut self, name: &str) -> Result<Option<Part>, ExtractError> {
        Ok(self.bytes(name)?.map(|part| Part {
            xml: into_text(part.xml),
            cut: part.cut,
        }))
    }

    /// The bytes of the part `name` (`None` if absent), decompressing at most the remaining
    /// budget.
    pub(crate) fn bytes(&mut self, name: &str) -> Result<Option<Part<Vec<u8>>>, ExtractError> {
        let format = self.format;
        let mut file = match self.zip.by_name(name) {
            Ok(file) => file,
            Err(zip::result::ZipError::FileNotFound) => return Ok(None),
            Err(e) => return Err(ExtractError::corrupt(format, format!("{name}: {e}"))),
        };
        // The declared size only sizes the buffer, never beyond the budget: it may lie.
        let declared = usize::try_from(file.size().min(self.budget.saturating_add(1)))
            .unwrap_or(0)
            .min(MAX_PREALLOCATION);
        let mut data = Vec::with_capacity(declared);
        (&mut file)
            .take(self.budget.saturating_add(1))
            .read_to_end(&mut data)
            .map_err(|e| ExtractError::corrupt(format, format!("{name}: {e}")))?;
        let read = u64::try_from(data.len()).unwrap_or(u64::MAX);
        let cut = read > self.budget;
        if cut {
            data.truncate(usize::try_from(self.budget).unwrap_or(usize::MAX));
            self.budget = 0;
        } else {
            self.budget -= read;
        }
        Ok(Some(Part { xml: data, cut }))
    }

    /// Like [`Self::part`], but a missing part is an error.
    fn required(&mut self, name: &str) -> Result<Part, ExtractError> {
        self.part(name)?
            .ok_or_else(|| ExtractError::corrupt(self.format, format!("missing {name}")))
    }
}

/// A buffer declared bigger than this grows as it is filled instead.
const MAX_PREALLOCATION: usize = 16 * 1024 * 1024;

/// Decompressed bytes as text without a copy when they are UTF-8 (or UTF-8 cut inside a
/// character by the cap); other bytes are replaced, which copies.
fn into_text(data: Vec<u8>) -> String {
    match String::from_utf8(data) {
        Ok(text) => text,
        Err(e) if e.utf8_error().error_len().is_none() => {
            let valid = e.utf8_error().valid_up_to();
            let mut bytes = e.into_bytes();
            bytes.truncate(valid);
            String::from_utf8(bytes).unwrap_or_default()
        }
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

/// Local name (without prefix) of an element.
pub(crate) fn local<'e>(e: &'e BytesStart<'_>) -> &'e str {
    let name = e.name().0;
    name.rsplit_once(':').map_or(name, |(_, l)| l)
}

pub(crate) fn local_end<'e>(name: &'e quick_xml::name::QName<'_>) -> &'e str {
    name.0.rsplit_once(':').map_or(name.0, |(_, l)| l)
}

/// Value of attribute `key` (qualified name as written, e.g. `r:id`), unescaped.
pub(crate) fn attr(e: &BytesStart<'_>, key: &str) -> Option<String> {
    e.attributes()
        .with_checks(false)
        .flatten()
        .find(|a| a.key.0 == key)
        .map(|a| {
            a.normalized_value(quick_xml::XmlVersion::Implicit1_0)
                .map_or_else(|_| a.value.to_string(), |v| v.into_owned())
        })
}

/// The text an entity or character reference stands for.
pub(crate) fn resolve_ref(r: &BytesRef<'_>) -> Option<String> {
    if let Ok(Some(c)) = r.resolve_char_ref() {
        return Some(c.to_string());
    }
    resolve_predefined_entity(&r.xml10_content()).map(str::to_owned)
}

/// Walks `part`'s XML, calling `on` for each event (with the byte offset where it ends),
/// until the end, `on` returns `false`, or the sink is done. A parse error is corruption,
/// unless the part was cut by the decompression cap (then it is where the cut fell) or text
/// was already read (then that text is kept, marked truncated).
pub(crate) fn walk(
    format: &'static str,
    part: &Part,
    sink: &mut Sink,
    mut on: impl FnMut(&mut Sink, Event<'_>, usize) -> bool,
) -> Result<(), ExtractError> {
    if part.cut {
        sink.mark_incomplete();
    }
    let mut reader = Reader::from_str(&part.xml);
    let mut events = 0u32;
    loop {
        events = events.wrapping_add(1);
        // Checking the clock every 256 events keeps the deadline cheap.
        if events.is_multiple_of(256) && sink.done() {
            return Ok(());
        }
        match reader.read_event() {
            Ok(Event::Eof) => return Ok(()),
            Ok(event) => {
                let end = usize::try_from(reader.buffer_position()).unwrap_or(usize::MAX);
                if !on(sink, event, end) {
                    return Ok(());
                }
            }
            Err(_) if part.cut || sink.has_text() => {
                sink.mark_incomplete();
                return Ok(());
            }
            Err(e) => {
                return Err(ExtractError::corrupt(
                    format,
                    format!("malformed XML at byte {} ({e})", reader.buffer_position()),
                ));
            }
        }
    }
}

/// Text runs (`<w:t>` / `<a:t>`) of a WordprocessingML or DrawingML part, a line per
/// paragraph.
fn paragraphs(format: &'static str, part: &Part, sink: &mut Sink) -> Result<(), ExtractError> {
    let mut in_text = 0u32;
    walk(format, part, sink, |sink, event, _| match event {
        Event::Start(e) => {
            if local(&e) == "t" {
                in_text += 1;
            }
            true
        }
        Event::End(e) => match local_end(&e.name()) {
            "t" => {
                in_text = in_text.saturating_sub(1);
                true
            }
            "p" => sink.newline(),
            _ => true,
        },
        Event::Empty(e) => match local(&e) {
            "tab" => sink.push("\t"),
            "br" | "cr" => sink.push("\n"),
            "p" => sink.newline(),
            _ => true,
        },
        Event::Text(t) if in_text > 0 => sink.push(&t.xml10_content()),
        Event::CData(t) if in_text > 0 => sink.push(&t.xml10_content()),
        Event::GeneralRef(r) if in_text > 0 => resolve_ref(&r).is_none_or(|s| sink.push(&s)),
        _ => true,
    })
}

/// Text of a DOCX: the body (`word/document.xml`), a line per paragraph.
pub(crate) fn docx(bytes: &[u8], limits: &Limits) -> Result<Extracted, ExtractError> {
    let mut pkg = Package::open("DOCX", bytes, limits)?;
    let mut sink = Sink::new(limits);
    let part = pkg.required("word/document.xml")?;
    paragraphs("DOCX", &part, &mut sink)?;
    sink.finish()
}

/// Number `n` of an entry named `{prefix}{n}.xml`.
pub(crate) fn numbered(name: &str, prefix: &str) -> Option<u32> {
    name.strip_prefix(prefix)?
        .strip_suffix(".xml")?
        .parse()
        .ok()
}

/// Text of a PPTX: each slide (`ppt/slides/slideN.xml`, in numeric order) under a
/// `--- Slide N ---` header.
pub(crate) fn pptx(bytes: &[u8], limits: &Limits) -> Result<Extracted, ExtractError> {
    let mut pkg = Package::open("PPTX", bytes, limits)?;
    let mut slides: Vec<(u32, String)> = pkg
        .names()
        .into_iter()
        .filter_map(|n| numbered(&n, "ppt/slides/slide").map(|i| (i, n)))
        .collect();
    slides.sort();
    let mut sink = Sink::new(limits);
    for (i, name) in slides {
        if sink.done() {
            break;
        }
        let Some(part) = pkg.part(&name)? else {
            continue;
        };
        if !sink.section(&format!("--- Slide {i} ---")) {
            break;
        }
        paragraphs("PPTX", &part, &mut sink)?;
        if part.cut {
            break;
        }
    }
    sink.finish()
}
