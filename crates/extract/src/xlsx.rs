//! XLSX: each worksheet, in workbook order, under a `--- Sheet: name ---` header, its rows as
//! CSV lines (see `sheet.rs`), read by calamine's `Xlsx`.
//!
//! calamine opens an archive with no bound of its own: it inflates whole parts, keeps every
//! shared string (reserving first as many as the table's `uniqueCount` declares), and copies the
//! fonts, fills, borders and number format code into every cell style. So it never sees the
//! upload. [`repackage`] copies the parts it reads into a new, uncompressed archive through the
//! bounded [`Package`] reader (at most `max_decompressed_bytes` inflated in all, however the zip
//! headers lie), and on the way:
//! - writes the package relationships itself (`xl/workbook.xml` is the workbook), and, when the
//!   workbook or its relationships are missing, a workbook of the numbered worksheets;
//! - keeps at most [`MAX_SHARED_STRINGS`] shared strings (a 50 MiB table of `<si/>` lists 10
//!   million), drops `uniqueCount`, and ends a table the cap cut after its last whole string;
//! - keeps of the styles only the number formats (codes of at most [`MAX_FORMAT_CODE`] bytes)
//!   and, for at most [`MAX_STYLES`] cell styles, which one each uses: all calamine needs to
//!   tell dates from numbers;
//! - leaves out everything else (theme, drawings, images, pivot caches).
//!
//! What calamine keeps is then a few times those parts' bytes at most. Worksheets are read a
//! cell at a time with its streaming `worksheet_cells_reader`, never as a `Range`: a sheet whose
//! cells (or `<dimension>`) span 16384 columns by a million rows costs what its XML does. Text
//! stops at `max_text_chars`, and the deadline is checked every 256 cells.

use std::fmt::Write as _;
use std::io::{Cursor, Write as _};

use calamine::{Data, Reader as _, Xlsx, XlsxCellReader, XlsxError};
use quick_xml::escape::escape;
use quick_xml::events::{BytesStart, Event};
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

use crate::ole::index;
use crate::ooxml::{Package, Part, attr, local, local_end, numbered, walk};
use crate::sheet::{Line, shown};
use crate::sink::Sink;
use crate::{ExtractError, Extracted, Limits};

const FORMAT: &str = "XLSX";

/// Most shared strings kept; cells showing a later one show nothing and the text is marked
/// truncated. (Each takes a `String` in calamine: 24 bytes, plus its text.)
const MAX_SHARED_STRINGS: usize = 1_000_000;

/// Most cell styles and number formats kept (Excel allows about 64 000 cell styles).
const MAX_STYLES: usize = 65_536;

/// Longest number format code kept (Excel allows 255 characters); calamine copies a style's code
/// into each cell style that uses it.
const MAX_FORMAT_CODE: usize = 255;

const WORKBOOK: &str = "xl/workbook.xml";
const WORKBOOK_RELS: &str = "xl/_rels/workbook.xml.rels";
const SHARED_STRINGS: &str = "xl/sharedStrings.xml";
const STYLES: &str = "xl/styles.xml";
const WORKSHEETS: &str = "xl/worksheets/";

/// The package relationships: the workbook is `xl/workbook.xml`.
const PACKAGE_RELS: &str = r#"<Relationships><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" Target="xl/workbook.xml"/></Relationships>"#;

/// Text of an XLSX: each worksheet under a `--- Sheet: name ---` header, rows as CSV lines.
pub(crate) fn extract(bytes: &[u8], limits: &Limits) -> Result<Extracted, ExtractError> {
    let mut sink = Sink::new(limits);
    let (archive, as_written) = repackage(bytes, limits, &mut sink, true)?;
    let mut workbook = match Xlsx::new(Cursor::new(archive)) {
        Ok(workbook) => workbook,
        // A workbook calamine cannot follow (a sheet of a type it does not know, such as an
        // Excel 4 macro sheet, a relationship that is not there, broken XML): its worksheets
        // are read by number, as when there is no workbook.
        Err(error) if as_written => {
            let (archive, _) = repackage(bytes, limits, &mut sink, false)?;
            Xlsx::new(Cursor::new(archive)).map_err(|_| ExtractError::corrupt(FORMAT, error))?
        }
        Err(error) => return Err(ExtractError::corrupt(FORMAT, error)),
    };
    let is_1904 = workbook.has_1904_epoch();
    let names = crate::sheet::worksheets(&workbook);
    for name in names {
        if sink.done() {
            break;
        }
        let cells = match workbook.worksheet_cells_reader(&name) {
            // Not in the package, or past the decompression cap.
            Err(XlsxError::WorksheetNotFound(_)) => continue,
            cells => cells,
        };
        if !sink.section(&format!("--- Sheet: {name} ---")) {
            break;
        }
        let more = match cells {
            Ok(mut cells) => rows(&mut cells, is_1904, &mut sink),
            // No `<sheetData>`: no rows.
            Err(XlsxError::NotAWorksheet(_) | XlsxError::XmlEof(_)) => true,
            // Broken XML before the rows.
            Err(_) => {
                sink.mark_incomplete();
                true
            }
        };
        if !more {
            break;
        }
    }
    sink.finish()
}

/// One worksheet's rows as CSV lines, a cell at a time; `false` when reading should stop.
/// Broken XML (or the end of a part the decompression cap cut) ends the sheet, keeping the text
/// read, marked truncated.
fn rows(cells: &mut XlsxCellReader<'_, Cursor<Vec<u8>>>, is_1904: bool, sink: &mut Sink) -> bool {
    let mut line = Line::default();
    let mut row = None;
    let mut count = 0u32;
    loop {
        count = count.wrapping_add(1);
        if count.is_multiple_of(256) && sink.done() {
            return false;
        }
        let cell = match cells.next_cell() {
            Ok(Some(cell)) => cell,
            Ok(None) => return line.end(sink),
            Err(
                XlsxError::Xml(_)
                | XlsxError::XmlEof(_)
                | XlsxError::Io(_)
                | XlsxError::Zip(_)
                | XlsxError::Encoding(_),
            ) => {
                sink.mark_incomplete();
                return line.end(sink);
            }
            // A cell calamine cannot read (a shared string past those kept, a value its type
            // does not allow, a malformed reference) is skipped; the XML around it was read.
            Err(_) => continue,
        };
        let (at_row, at_col) = cell.get_position();
        if row != Some(at_row) {
            if !line.end(sink) {
                return false;
            }
            row = Some(at_row);
        }
        let value = Data::from(cell.get_value().clone());
        line.cell(index(at_col), &shown(&value, is_1904), sink);
    }
}

/// Copies the parts of the XLSX `bytes` that calamine reads into a new archive, bounded (see
/// the module doc): the workbook and its relationships (or, unless `as_written`, or when either
/// is missing, a workbook listing `xl/worksheets/sheetN.xml` as `SheetN`), the shared strings,
/// the number formats, then the worksheets in numeric order until the cap. Returns the archive
/// and whether it holds the workbook as written.
fn repackage(
    bytes: &[u8],
    limits: &Limits,
    sink: &mut Sink,
    as_written: bool,
) -> Result<(Vec<u8>, bool), ExtractError> {
    let mut package = Package::open(FORMAT, bytes, limits)?;
    let mut worksheets: Vec<(Option<u32>, String)> = package
        .names()
        .into_iter()
        .filter(|name| {
            name.strip_prefix(WORKSHEETS)
                .is_some_and(|file| file.ends_with(".xml") && !file.contains('/'))
        })
        .map(|name| (numbered(&name, "xl/worksheets/sheet"), name))
        .collect();
    // Numbered sheets first, in their order.
    worksheets.sort_by(|(a, a_name), (b, b_name)| {
        (a.is_none(), a, a_name).cmp(&(b.is_none(), b, b_name))
    });

    let mut out = Archive::new();
    out.add("_rels/.rels", PACKAGE_RELS.as_bytes())?;
    // Whether the decompression cap cut a part: what follows it is not read.
    let mut cut = false;
    let written = if as_written {
        match (package.bytes(WORKBOOK_RELS)?, package.bytes(WORKBOOK)?) {
            (Some(rels), Some(workbook)) => Some((rels, workbook)),
            _ => None,
        }
    } else {
        None
    };
    let kept_as_written = written.is_some();
    if let Some((rels, workbook)) = written {
        cut |= rels.cut || workbook.cut;
        out.add(WORKBOOK_RELS, &rels.xml)?;
        out.add(WORKBOOK, &workbook.xml)?;
    } else {
        let (rels, workbook) = numbered_workbook(worksheets.iter().filter_map(|(n, _)| *n));
        out.add(WORKBOOK_RELS, rels.as_bytes())?;
        out.add(WORKBOOK, workbook.as_bytes())?;
    }
    if let Some(part) = package.part(SHARED_STRINGS)? {
        cut |= part.cut;
        let (xml, full) = capped_strings(part, sink)?;
        if full {
            sink.mark_incomplete();
        }
        out.add(SHARED_STRINGS, xml.as_bytes())?;
    }
    if let Some(part) = package.part(STYLES)? {
        cut |= part.cut;
        out.add(STYLES, number_formats(&part, sink)?.as_bytes())?;
    }
    for (_, name) in &worksheets {
        if cut || sink.done() {
            break;
        }
        if let Some(part) = package.bytes(name)? {
            cut |= part.cut;
            out.add(name, &part.xml)?;
        }
    }
    if cut {
        sink.mark_incomplete();
    }
    Ok((out.finish()?, kept_as_written))
}

/// A zip archive being written, its parts stored uncompressed.
struct Archive(ZipWriter<Cursor<Vec<u8>>>);

impl Archive {
    fn new() -> Self {
        Self(ZipWriter::new(Cursor::new(Vec::new())))
    }

    fn add(&mut self, name: &str, data: &[u8]) -> Result<(), ExtractError> {
        let large = u64::try_from(data.len()).unwrap_or(u64::MAX) >= u64::from(u32::MAX);
        let options = SimpleFileOptions::default()
            .compression_method(CompressionMethod::Stored)
            .large_file(large);
        self.0
            .start_file(name, options)
            .and_then(|()| Ok(self.0.write_all(data)?))
            .map_err(|e| ExtractError::corrupt(FORMAT, format!("{name}: {e}")))
    }

    fn finish(self) -> Result<Vec<u8>, ExtractError> {
        self.0
            .finish()
            .map(Cursor::into_inner)
            .map_err(|e| ExtractError::corrupt(FORMAT, e))
    }
}

/// Workbook relationships and a workbook listing `xl/worksheets/sheetN.xml` as `SheetN` for
/// each `N` of `numbers`, in order.
fn numbered_workbook(numbers: impl Iterator<Item = u32>) -> (String, String) {
    let mut rels = String::from("<Relationships>");
    let mut workbook = String::from("<workbook><sheets>");
    for n in numbers {
        let _ = write!(
            rels,
            r#"<Relationship Id="rId{n}" Type="worksheet" Target="worksheets/sheet{n}.xml"/>"#
        );
        let _ = write!(
            workbook,
            r#"<sheet name="Sheet{n}" sheetId="{n}" r:id="rId{n}"/>"#
        );
    }
    rels.push_str("</Relationships>");
    workbook.push_str("</sheets></workbook>");
    (rels, workbook)
}

/// The shared strings as calamine may read them: the root without its `uniqueCount` (which
/// calamine reserves room for, whatever it says), and at most [`MAX_SHARED_STRINGS`] strings,
/// ending after the last whole one (where the decompression cap cut the part, or the deadline
/// fell). Also whether strings were dropped for the count. Broken XML is corrupt, as in
/// [`walk`].
fn capped_strings(part: Part, sink: &mut Sink) -> Result<(String, bool), ExtractError> {
    // Where the root's start tag ends, and where the last whole string ends.
    let (mut body, mut kept, mut strings) = (None, 0, 0usize);
    walk(FORMAT, &part, sink, |_, event, end| {
        match event {
            Event::Start(e) if body.is_none() && local(&e) == "sst" => {
                (body, kept) = (Some(end), end);
            }
            // An empty table, whatever it declares.
            Event::Empty(e) if body.is_none() && local(&e) == "sst" => return false,
            Event::End(e) if body.is_some() && local_end(&e.name()) == "si" => {
                (strings, kept) = (strings + 1, end);
            }
            Event::Empty(e) if body.is_some() && local(&e) == "si" => {
                (strings, kept) = (strings + 1, end);
            }
            _ => {}
        }
        strings < MAX_SHARED_STRINGS
    })?;
    let Some(body) = body else {
        return Ok(("<sst/>".to_owned(), false));
    };
    let mut xml = part.xml;
    xml.truncate(kept);
    xml.push_str("</sst>");
    xml.replace_range(..body, "<sst>");
    Ok((xml, strings >= MAX_SHARED_STRINGS))
}

/// The styles part cut down to what calamine needs to tell dates from numbers: the number
/// formats and, for each cell style (`<xf>` of `<cellXfs>`), the number format it uses, at most
/// [`MAX_STYLES`] of each. Fonts, fills and borders, which calamine would copy into every cell
/// style, are left out, and so are format codes over [`MAX_FORMAT_CODE`] bytes. Broken XML is
/// corrupt, as in [`walk`].
fn number_formats(part: &Part, sink: &mut Sink) -> Result<String, ExtractError> {
    let (mut formats, mut styles) = (String::new(), String::new());
    let (mut format_count, mut style_count) = (0usize, 0usize);
    let mut in_cell_xfs = false;
    let id = |e: &BytesStart<'_>| attr(e, "numFmtId").and_then(|v| v.trim().parse::<u32>().ok());
    walk(FORMAT, part, sink, |_, event, _| {
        match event {
            Event::Start(e) if local(&e) == "cellXfs" => in_cell_xfs = true,
            Event::End(e) if local_end(&e.name()) == "cellXfs" => in_cell_xfs = false,
            Event::Start(e) | Event::Empty(e) => match local(&e) {
                "numFmt" if format_count < MAX_STYLES => {
                    if let (Some(id), Some(code)) = (id(&e), attr(&e, "formatCode"))
                        && code.len() <= MAX_FORMAT_CODE
                    {
                        let code = escape(code.as_str());
                        let _ = write!(formats, r#"<numFmt numFmtId="{id}" formatCode="{code}"/>"#);
                        format_count += 1;
                    }
                }
                "xf" if in_cell_xfs => {
                    let _ = write!(styles, r#"<xf numFmtId="{}"/>"#, id(&e).unwrap_or(0));
                    style_count += 1;
                }
                _ => {}
            },
            _ => {}
        }
        style_count < MAX_STYLES
    })?;
    Ok(format!(
        "<styleSheet><numFmts>{formats}</numFmts><cellXfs>{styles}</cellXfs></styleSheet>"
    ))
}
