//! Excel 97-2003 (.xls, BIFF8 and the older BIFF versions calamine reads): each worksheet, in
//! workbook order, under a `--- Sheet: name ---` header, its rows as CSV lines, cell for cell as
//! the XLSX reader (`xlsx.rs`) shows them (see `sheet.rs`).
//!
//! The workbook is read by calamine, which parses the whole `Workbook` stream when it opens it
//! and keeps every sheet as a dense grid: one value per cell of the sheet's bounding box, after
//! reserving what the sheet's `DIMENSIONS` record declares. A few bytes can declare a cell at
//! row 65535 and another at column 255 (or a `DIMENSIONS` record of four billion rows), so before
//! calamine sees the file, [`grid_bytes`] walks the stream's records the way calamine does and
//! adds up what those grids, reservations and cells will take. A file over
//! [`GRID_PER_DECOMPRESSED_BYTE`] times `max_decompressed_bytes` (the cap on what an Office
//! file may expand to) is not read, with a reason naming its extent. What is left grows with
//! the stream, not with what it declares: cells, shared strings, and the text calamine makes of
//! every formula (a 7-byte reference to a sheet with a long name becomes a few hundred
//! characters, so up to ~100x the formula bytes); `max_input_bytes` and the helper's memory
//! limit bound that, as they bound lopdf (see the crate doc). The container is opened with the `cfb` crate first, which refuses sector chains
//! that loop (calamine's own container reader would follow them). Text stops at
//! `max_text_chars` and the deadline is checked for every row.

use std::io::Cursor;
use std::mem::size_of;

use calamine::{Data, Reader as _, Xls, XlsError};

use crate::ole::{Container, index, u16_at, u32_at};
use crate::sheet::{Line, shown};
use crate::sink::Sink;
use crate::{ExtractError, Extracted, Limits};

const FORMAT: &str = "XLS";

/// The cell grids of a workbook may take this many times `max_decompressed_bytes` once read
/// (200 MiB by default: a sheet of 60 000 rows by 10 columns takes about 70 MiB, and a
/// 10 MB workbook of such rows peaks at 90 MB read whole; BIFF8's largest sheet, 65 536 rows by
/// 256 columns, would take 1.3 GB and is refused).
const GRID_PER_DECOMPRESSED_BYTE: u64 = 4;

/// A BIFF record: its type and data (`CONTINUE` records are records of their own here).
struct Record<'s> {
    kind: u16,
    data: &'s [u8],
}

/// The records of `stream` from `at`, until one runs past the end.
fn records(stream: &[u8], mut at: usize) -> impl Iterator<Item = Record<'_>> {
    std::iter::from_fn(move || {
        let kind = u16_at(stream, at)?;
        let len = usize::from(u16_at(stream, at + 2)?);
        let data = stream.get(at + 4..at + 4 + len)?;
        at += 4 + len;
        Some(Record { kind, data })
    })
}

/// The bounding box of cells, by row and column.
#[derive(Default)]
struct Extent {
    rows: Option<(u32, u32)>,
    cols: Option<(u32, u32)>,
}

impl Extent {
    fn add(&mut self, row: u32, col: u32) {
        let widen = |span: &mut Option<(u32, u32)>, at: u32| {
            let (low, high) = span.get_or_insert((at, at));
            *low = (*low).min(at);
            *high = (*high).max(at);
        };
        widen(&mut self.rows, row);
        widen(&mut self.cols, col);
    }

    fn size(&self) -> (u64, u64) {
        let span = |s: Option<(u32, u32)>| s.map_or(0, |(l, h)| u64::from(h - l) + 1);
        (span(self.rows), span(self.cols))
    }

    fn cells(&self) -> u64 {
        let (rows, cols) = self.size();
        rows.saturating_mul(cols)
    }
}

/// Bytes of one `T`, as a `u64`.
fn bytes_of<T>() -> u64 {
    u64::try_from(size_of::<T>()).unwrap_or(u64::MAX)
}

/// The cells a `DIMENSIONS` record makes calamine reserve room for (its `parse_dimensions`,
/// with the wrapping arithmetic of a release build).
fn reserved(data: &[u8]) -> u64 {
    let (first_row, last_row, first_col, last_col) = match data.len() {
        10 => (
            u32::from(u16_at(data, 0).unwrap_or(0)),
            u32::from(u16_at(data, 2).unwrap_or(0)),
            u32::from(u16_at(data, 4).unwrap_or(0)),
            u32::from(u16_at(data, 6).unwrap_or(0)),
        ),
        14 | 16 => (
            u32_at(data, 0).unwrap_or(0),
            u32_at(data, 4).unwrap_or(0),
            u32::from(u16_at(data, 8).unwrap_or(0)),
            u32::from(u16_at(data, 10).unwrap_or(0)),
        ),
        _ => return 0,
    };
    let first_col = if first_col > 0xFF || last_col < first_col {
        0
    } else {
        first_col
    };
    if last_row == 0 || last_col == 0 {
        return 1;
    }
    let rows = (last_row - 1).wrapping_sub(first_row).wrapping_add(1);
    let cols = (last_col - 1).wrapping_sub(first_col).wrapping_add(1);
    u64::from(rows).saturating_mul(u64::from(cols))
}

/// What calamine would hold for the workbook `stream` once read, in bytes, and the rows and
/// columns of its widest sheet: for every sheet, its `DIMENSIONS` reservations and cells, its
/// dense grid of values and of formulas, plus one more copy of the largest value grid (the one
/// `worksheet_range` hands out).
fn grid_bytes(stream: &[u8]) -> (u64, (u64, u64)) {
    let cell = bytes_of::<calamine::Cell<Data>>();
    let formula_cell = bytes_of::<calamine::Cell<String>>();
    let mut sheets = Vec::new();
    for record in records(stream, 0) {
        match record.kind {
            // BoundSheet8: the stream offset of the sheet's BOF.
            0x0085 => sheets.extend(u32_at(record.data, 0).map(index)),
            0x000A => break,
            _ => {}
        }
    }
    let (mut total, mut largest, mut extent_of_largest) = (0u64, 0u64, (0, 0));
    for at in sheets {
        let (mut values, mut formulas) = (Extent::default(), Extent::default());
        let (mut reserve, mut pushed, mut formula_count) = (0u64, 0u64, 0u64);
        let mut formula_at = (0u32, 0u32);
        let (mut seen_bof, mut depth) = (false, 0usize);
        let at_u16 = |data: &[u8], at: usize| u32::from(u16_at(data, at).unwrap_or(0));
        for record in records(stream, at) {
            if depth > 0 {
                match record.kind {
                    0x0809 => depth += 1,
                    0x000A => depth -= 1,
                    _ => {}
                }
                continue;
            }
            let data = record.data;
            match record.kind {
                0x0809 if seen_bof => depth += 1,
                0x0809 => seen_bof = true,
                0x000A => break,
                0x0200 => reserve = reserve.saturating_add(reserved(data)),
                0x0203 | 0x0204 | 0x00D6 | 0x0205 | 0x027E | 0x00FD if data.len() >= 4 => {
                    values.add(at_u16(data, 0), at_u16(data, 2));
                    pushed += 1;
                }
                0x0207 => {
                    values.add(formula_at.0, formula_at.1);
                    pushed += 1;
                }
                0x00BD if data.len() >= 6 => {
                    let (row, first) = (at_u16(data, 0), at_u16(data, 2));
                    let count = u32::try_from((data.len() - 6) / 6).unwrap_or(u32::MAX);
                    if count > 0 {
                        values.add(row, first);
                        values.add(row, first.saturating_add(count - 1));
                        pushed = pushed.saturating_add(u64::from(count));
                    }
                }
                0x0006 if data.len() >= 20 => {
                    formula_at = (at_u16(data, 0), at_u16(data, 2));
                    values.add(formula_at.0, formula_at.1);
                    formulas.add(formula_at.0, formula_at.1);
                    pushed += 1;
                    formula_count += 1;
                }
                _ => {}
            }
        }
        // The cells' vector holds what was reserved, or twice what was pushed past that as it
        // grew; the formulas' vector grows likewise.
        let capacity = if pushed <= reserve {
            reserve
        } else {
            pushed.saturating_mul(2)
        };
        let grid = values.cells().saturating_mul(bytes_of::<Data>());
        let sheet = capacity
            .saturating_mul(cell)
            .saturating_add(grid)
            .saturating_add(formula_count.saturating_mul(2 * formula_cell))
            .saturating_add(formulas.cells().saturating_mul(bytes_of::<String>()));
        total = total.saturating_add(sheet);
        if grid >= largest {
            largest = grid;
            extent_of_largest = values.size();
        }
    }
    (total.saturating_add(largest), extent_of_largest)
}

/// One sheet's rows as CSV lines; `false` when reading should stop.
fn sheet_rows(range: &calamine::Range<Data>, is_1904: bool, sink: &mut Sink) -> bool {
    let Some((_, first_col)) = range.start() else {
        return true;
    };
    let first_col = index(first_col);
    let mut line = Line::default();
    for row in range.rows() {
        if sink.done() {
            return false;
        }
        for (i, cell) in row.iter().enumerate() {
            line.cell(first_col + i, &shown(cell, is_1904), sink);
        }
        if !line.end(sink) {
            return false;
        }
    }
    true
}

/// Text of an .xls: each worksheet under a `--- Sheet: name ---` header, rows as CSV lines.
pub(crate) fn extract(bytes: &[u8], limits: &Limits) -> Result<Extracted, ExtractError> {
    {
        let mut file = Container::open(FORMAT, bytes)?;
        let stream = match file.stream("Workbook")? {
            Some(stream) => stream,
            None => file.required("Book")?,
        };
        let (need, (rows, cols)) = grid_bytes(&stream);
        let limit = u64::try_from(limits.max_decompressed_bytes)
            .unwrap_or(u64::MAX)
            .saturating_mul(GRID_PER_DECOMPRESSED_BYTE);
        if need > limit {
            return Ok(Extracted::Unsupported {
                reason: format!(
                    "its cells span up to {rows} rows by {cols} columns, which would take {need} bytes to read, over the {limit}-byte limit for a legacy .xls file; save it as .xlsx or CSV"
                ),
            });
        }
    }
    let mut workbook = Xls::new(Cursor::new(bytes)).map_err(|e| match e {
        XlsError::Password => ExtractError::Protected { format: FORMAT },
        e => ExtractError::corrupt(FORMAT, e),
    })?;
    let is_1904 = workbook.has_1904_epoch();
    let names = crate::sheet::worksheets(&workbook);
    let mut sink = Sink::new(limits);
    for name in names {
        if sink.done() {
            break;
        }
        let Ok(range) = workbook.worksheet_range(&name) else {
            continue;
        };
        if !sink.section(&format!("--- Sheet: {name} ---"))
            || !sheet_rows(&range, is_1904, &mut sink)
        {
            break;
        }
    }
    sink.finish()
}
