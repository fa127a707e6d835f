//! DOCX, PPTX and XLSX: zip archives of XML parts, read with a cap on entries and
//! on the total bytes decompressed.
//!
//! The cap counts the bytes actually inflated (a `take` on the decompressing reader),
//! never the sizes the zip headers declare, which a bomb sets to anything. Memory per
//! file is then the input, at most one part of `max_decompressed_bytes` at a time as
//! text, and what is kept from it: the text (`max_text_chars`) and, for XLSX, the shared
//! strings (packed: one string plus 4 bytes per entry, at most [`MAX_SHARED_STRINGS`]).

use std::collections::HashMap;
use std::io::{Cursor, Read};

use quick_xml::Reader;
use quick_xml::escape::resolve_predefined_entity;
use quick_xml::events::{BytesRef, BytesStart, Event};
use zip::ZipArchive;

use crate::sink::Sink;
use crate::{ExtractError, Extracted, Limits};

/// An Office archive, and how many more bytes may be decompressed from it.
struct Package<'a> {
    format: &'static str,
    zip: ZipArchive<Cursor<&'a [u8]>>,
    budget: u64,
}

/// One XML part as text, and whether the decompression cap cut it.
struct Part {
    xml: String,
    cut: bool,
}

impl<'a> Package<'a> {
    fn open(format: &'static str, bytes: &'a [u8], limits: &Limits) -> Result<Self, ExtractError> {
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

    fn names(&self) -> Vec<String> {
        self.zip
            .file_names()
            .filter_map(|n| n.ok().map(std::borrow::Cow::into_owned))
            .collect()
    }

    /// The part `name` (`None` if absent), decompressing at most the remaining budget.
    fn part(&mut self, name: &str) -> Result<Option<Part>, ExtractError> {
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
        Ok(Some(Part {
            xml: into_text(data),
            cut,
        }))
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
fn attr(e: &BytesStart<'_>, key: &str) -> Option<String> {
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

/// Walks `part`'s XML, calling `on` for each event, until the end, `on` returns
/// `false`, or the sink is done. A parse error is corruption, unless the part was cut
/// by the decompression cap (then it is where the cut fell) or text was already read
/// (then that text is kept, marked truncated).
fn walk(
    format: &'static str,
    part: &Part,
    sink: &mut Sink,
    mut on: impl FnMut(&mut Sink, Event<'_>) -> bool,
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
                if !on(sink, event) {
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
    walk(format, part, sink, |sink, event| match event {
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
fn numbered(name: &str, prefix: &str) -> Option<u32> {
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

/// Most shared strings kept; cells showing a later one show nothing and the text is
/// marked truncated. (A 50 MiB table of `<si/>` lists 10 million; a `Vec<String>` of
/// them took 240 MB.)
const MAX_SHARED_STRINGS: usize = 1_000_000;

/// The shared strings, packed: all of them in one string, and where each ends.
#[derive(Default)]
pub(crate) struct SharedStrings {
    text: String,
    ends: Vec<u32>,
}

impl SharedStrings {
    /// Adds a string; `false` when the table is full (by count or by the 4 GiB that
    /// the offsets can address).
    pub(crate) fn push(&mut self, s: &str) -> bool {
        if self.ends.len() >= MAX_SHARED_STRINGS {
            return false;
        }
        let Ok(end) = u32::try_from(self.text.len() + s.len()) else {
            return false;
        };
        self.text.push_str(s);
        self.ends.push(end);
        true
    }

    pub(crate) fn get(&self, i: usize) -> Option<&str> {
        let end = usize::try_from(*self.ends.get(i)?).ok()?;
        let start = match i.checked_sub(1) {
            Some(prev) => usize::try_from(self.ends[prev]).ok()?,
            None => 0,
        };
        self.text.get(start..end)
    }
}

/// The shared strings table (`xl/sharedStrings.xml`): each `<si>`'s text, without
/// phonetic runs (`<rPh>`).
fn shared_strings(pkg: &mut Package<'_>, sink: &mut Sink) -> Result<SharedStrings, ExtractError> {
    let Some(part) = pkg.part("xl/sharedStrings.xml")? else {
        return Ok(SharedStrings::default());
    };
    let mut strings = SharedStrings::default();
    let mut full = false;
    let mut current = String::new();
    let (mut in_t, mut in_rph) = (0u32, 0u32);
    // The sink only bounds the time here: strings count as text when a cell shows them.
    walk("XLSX", &part, sink, |_, event| {
        match event {
            Event::Start(e) => match local(&e) {
                "t" => in_t += 1,
                "rPh" => in_rph += 1,
                "si" => current.clear(),
                _ => {}
            },
            Event::End(e) => match local_end(&e.name()) {
                "t" => in_t = in_t.saturating_sub(1),
                "rPh" => in_rph = in_rph.saturating_sub(1),
                "si" => {
                    full |= !strings.push(&current);
                    current.clear();
                }
                _ => {}
            },
            Event::Empty(e) if local(&e) == "si" => full |= !strings.push(""),
            Event::Text(t) if in_t > 0 && in_rph == 0 => current.push_str(&t.xml10_content()),
            Event::CData(t) if in_t > 0 && in_rph == 0 => current.push_str(&t.xml10_content()),
            Event::GeneralRef(r) if in_t > 0 && in_rph == 0 => {
                if let Some(s) = resolve_ref(&r) {
                    current.push_str(&s);
                }
            }
            _ => {}
        }
        !full
    })?;
    if full {
        sink.mark_incomplete();
    }
    Ok(strings)
}

/// Most cell styles read from `xl/styles.xml` (a workbook has a few hundred at most).
const MAX_STYLES: usize = 65_536;

/// Which cell styles (a cell's `s`: an index into `cellXfs` of `xl/styles.xml`) show a number
/// as a date or time: the built-in date and time formats, and custom format codes with date or
/// time parts. Without it, a date comes out as its serial number (45292 for 2024-01-01).
fn date_styles(pkg: &mut Package<'_>, sink: &mut Sink) -> Result<Vec<bool>, ExtractError> {
    let Some(part) = pkg.part("xl/styles.xml")? else {
        return Ok(Vec::new());
    };
    let mut custom: HashMap<u32, bool> = HashMap::new();
    let mut styles = Vec::new();
    let mut in_cell_xfs = false;
    walk("XLSX", &part, sink, |_, event| {
        match event {
            Event::Start(e) if local(&e) == "cellXfs" => in_cell_xfs = true,
            Event::End(e) if local_end(&e.name()) == "cellXfs" => in_cell_xfs = false,
            Event::Start(e) | Event::Empty(e) => match local(&e) {
                "numFmt" => {
                    if let (Some(id), Some(code)) = (
                        attr(&e, "numFmtId").and_then(|v| v.parse().ok()),
                        attr(&e, "formatCode"),
                    ) {
                        custom.insert(id, is_date_format(&code));
                    }
                }
                "xf" if in_cell_xfs => {
                    let id: u32 = attr(&e, "numFmtId")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    let builtin = matches!(id, 14..=22 | 27..=36 | 45..=47 | 50..=58);
                    styles.push(builtin || custom.get(&id).copied().unwrap_or(false));
                }
                _ => {}
            },
            _ => {}
        }
        styles.len() < MAX_STYLES
    })?;
    Ok(styles)
}

/// Whether a number format code shows a date or time: a `y`, `m`, `d`, `h` or `s` outside
/// quoted text, escapes and `[...]` sections (colours, conditions, locales).
fn is_date_format(code: &str) -> bool {
    let (mut quoted, mut bracket, mut escaped) = (false, false, false);
    for c in code.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => quoted = !quoted,
            '[' if !quoted => bracket = true,
            ']' if !quoted => bracket = false,
            'y' | 'Y' | 'm' | 'M' | 'd' | 'D' | 'h' | 'H' | 's' | 'S' if !quoted && !bracket => {
                return true;
            }
            _ => {}
        }
    }
    false
}

/// A serial date of the 1900 date system as `YYYY-MM-DD`, `HH:MM:SS` (under one day) or both;
/// `None` for a serial no date has.
pub(crate) fn serial_date(serial: f64) -> Option<String> {
    if !serial.is_finite() || !(0.0..2_958_466.0).contains(&serial) {
        return None; // past 9999-12-31
    }
    #[expect(
        clippy::cast_possible_truncation,
        reason = "checked to be within 0..2958466"
    )]
    let days = serial.trunc() as i64;
    #[expect(
        clippy::cast_possible_truncation,
        reason = "a fraction of a day in seconds"
    )]
    let seconds = ((serial - serial.trunc()) * 86_400.0).round() as i64;
    let (hours, minutes, secs) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    let time = format!("{hours:02}:{minutes:02}:{secs:02}");
    if days == 0 {
        return Some(time);
    }
    // Excel counts a 29 February 1900 that never was: serials from 61 are a day ahead.
    let date = if days == 60 {
        "1900-02-29".to_owned()
    } else {
        let epoch_1970 = if days > 60 {
            days - 25_569
        } else {
            days - 25_568
        };
        let (y, m, d) = civil_from_days(epoch_1970);
        format!("{y:04}-{m:02}-{d:02}")
    };
    Some(if seconds == 0 {
        date
    } else {
        format!("{date} {time}")
    })
}

/// The proleptic Gregorian date of a day count from 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Sheets in workbook order: (name, part path). Falls back to
/// `xl/worksheets/sheetN.xml` in numeric order when the workbook cannot be read.
fn sheets(pkg: &mut Package<'_>, sink: &mut Sink) -> Result<Vec<(String, String)>, ExtractError> {
    let mut targets = HashMap::new();
    if let Some(rels) = pkg.part("xl/_rels/workbook.xml.rels")? {
        walk("XLSX", &rels, sink, |_, event| {
            if let Event::Start(e) | Event::Empty(e) = event
                && local(&e) == "Relationship"
                && let (Some(id), Some(target)) = (attr(&e, "Id"), attr(&e, "Target"))
            {
                let path = match target.strip_prefix('/') {
                    Some(absolute) => absolute.to_owned(),
                    None => format!("xl/{target}"),
                };
                targets.insert(id, path);
            }
            true
        })?;
    }
    let mut sheets = Vec::new();
    if let Some(workbook) = pkg.part("xl/workbook.xml")? {
        walk("XLSX", &workbook, sink, |_, event| {
            if let Event::Start(e) | Event::Empty(e) = event
                && local(&e) == "sheet"
            {
                let id = e
                    .attributes()
                    .with_checks(false)
                    .flatten()
                    .find(|a| a.key.0.ends_with(":id"))
                    .map(|a| a.value.to_string());
                if let Some(path) = id.and_then(|id| targets.get(&id)) {
                    let name = attr(&e, "name").unwrap_or_default();
                    sheets.push((name, path.clone()));
                }
            }
            true
        })?;
    }
    if sheets.is_empty() {
        let mut numbered_sheets: Vec<(u32, String)> = pkg
            .names()
            .into_iter()
            .filter_map(|n| numbered(&n, "xl/worksheets/sheet").map(|i| (i, n)))
            .collect();
        numbered_sheets.sort();
        sheets = numbered_sheets
            .into_iter()
            .map(|(i, n)| (format!("Sheet{i}"), n))
            .collect();
    }
    Ok(sheets)
}

/// Zero-based column of a cell reference such as `BC12`.
fn column(reference: &str) -> Option<usize> {
    let letters = reference
        .bytes()
        .take_while(u8::is_ascii_alphabetic)
        .collect::<Vec<_>>();
    if letters.is_empty() || letters.len() > 3 {
        return None;
    }
    let n = letters.iter().fold(0usize, |n, b| {
        n * 26 + usize::from(b.to_ascii_uppercase() - b'A') + 1
    });
    Some(n - 1)
}

/// A CSV field: quoted when it holds a comma, quote or line break.
pub(crate) fn csv_field(value: &str, out: &mut String) {
    if value.contains([',', '"', '\n', '\r']) {
        out.push('"');
        out.push_str(&value.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(value);
    }
}

/// One worksheet's rows as CSV lines (empty rows skipped; gaps between cells kept).
fn sheet_rows(
    part: &Part,
    shared: &SharedStrings,
    dates: &[bool],
    sink: &mut Sink,
) -> Result<(), ExtractError> {
    let mut line = String::new();
    let mut col = 0usize;
    let mut row_has_value = false;
    let mut cell_type = String::new();
    let mut cell_col: Option<usize> = None;
    let mut cell_is_date = false;
    let mut value = String::new();
    let mut date = String::new();
    let (mut in_v, mut in_t, mut in_cell) = (false, false, false);
    walk("XLSX", part, sink, |sink, event| {
        match event {
            Event::Start(e) => match local(&e) {
                "row" => {
                    line.clear();
                    col = 0;
                    row_has_value = false;
                }
                "c" => {
                    in_cell = true;
                    cell_type = attr(&e, "t").unwrap_or_default();
                    cell_col = attr(&e, "r").as_deref().and_then(column);
                    cell_is_date = attr(&e, "s")
                        .and_then(|s| s.parse::<usize>().ok())
                        .and_then(|s| dates.get(s).copied())
                        .unwrap_or(false);
                    value.clear();
                }
                "v" => in_v = in_cell,
                "t" => in_t = in_cell,
                _ => {}
            },
            Event::End(e) => match local_end(&e.name()) {
                "v" => in_v = false,
                "t" => in_t = false,
                "c" => {
                    in_cell = false;
                    let shown = match cell_type.as_str() {
                        "s" => value
                            .trim()
                            .parse::<usize>()
                            .ok()
                            .and_then(|i| shared.get(i))
                            .unwrap_or(""),
                        "b" if value.trim() == "1" => "TRUE",
                        "b" if value.trim() == "0" => "FALSE",
                        "" | "n" if cell_is_date => match value.trim().parse::<f64>() {
                            Ok(serial) => {
                                date = serial_date(serial).unwrap_or_else(|| value.clone());
                                date.as_str()
                            }
                            Err(_) => value.as_str(),
                        },
                        _ => value.as_str(),
                    };
                    // Cells past what the text can still hold are dropped: the row
                    // would be cut there anyway, and a row of a million cells must
                    // not become one 50 MiB line first.
                    if !shown.is_empty() && line.len() <= sink.room_bytes() {
                        let at = cell_col.unwrap_or(col).max(col);
                        // Pad skipped columns, but never by more than the text room left.
                        // One comma per skipped column, plus the separator after the
                        // previous cell (capped so a stray far-right cell cannot fill
                        // the text with commas).
                        let gap = at.saturating_sub(col).min(MAX_COLUMN_GAP);
                        for _ in 0..gap + usize::from(col > 0) {
                            line.push(',');
                        }
                        csv_field(shown, &mut line);
                        col = at + 1;
                        row_has_value = true;
                    }
                }
                "row" if row_has_value => {
                    line.push('\n');
                    return sink.push(&line);
                }
                _ => {}
            },
            Event::Text(t) if in_v || in_t => value.push_str(&t.xml10_content()),
            Event::CData(t) if in_v || in_t => value.push_str(&t.xml10_content()),
            Event::GeneralRef(r) if in_v || in_t => {
                if let Some(s) = resolve_ref(&r) {
                    value.push_str(&s);
                }
            }
            _ => {}
        }
        true
    })
}

/// Most empty columns padded before one cell.
pub(crate) const MAX_COLUMN_GAP: usize = 1_000;

/// Text of an XLSX: each sheet, in workbook order, under a `--- Sheet: name ---`
/// header, its rows as CSV lines (cached values; dates appear as serial numbers).
pub(crate) fn xlsx(bytes: &[u8], limits: &Limits) -> Result<Extracted, ExtractError> {
    let mut pkg = Package::open("XLSX", bytes, limits)?;
    let mut sink = Sink::new(limits);
    let shared = shared_strings(&mut pkg, &mut sink)?;
    let dates = date_styles(&mut pkg, &mut sink)?;
    let sheets = sheets(&mut pkg, &mut sink)?;
    for (name, path) in sheets {
        if sink.done() {
            break;
        }
        let Some(part) = pkg.part(&path)? else {
            continue;
        };
        if !sink.section(&format!("--- Sheet: {name} ---")) {
            break;
        }
        sheet_rows(&part, &shared, &dates, &mut sink)?;
        if part.cut {
            break;
        }
    }
    sink.finish()
}
