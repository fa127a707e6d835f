//! What an .xls and an .xlsx sheet become once calamine has read their cells: a line of CSV per
//! row (empty rows skipped, gaps between cells kept, at most [`MAX_COLUMN_GAP`] empty columns
//! padded), `TRUE` / `FALSE`, dates and times as `YYYY-MM-DD`, `HH:MM:SS` or both, errors as
//! Excel shows them (`#DIV/0!`), cached formula values.

use std::borrow::Cow;

use calamine::Data;

use crate::sink::Sink;

/// Most empty columns padded before one cell.
pub(crate) const MAX_COLUMN_GAP: usize = 1_000;

/// Days from the 1900 date system's day 0 to the 1904 system's.
const DAYS_1900_TO_1904: f64 = 1462.0;

/// The names of the workbook's worksheets, in workbook order (chart and macro sheets left out).
pub(crate) fn worksheets<RS, R>(workbook: &R) -> Vec<String>
where
    RS: std::io::Read + std::io::Seek,
    R: calamine::Reader<RS>,
{
    workbook
        .sheets_metadata()
        .iter()
        .filter(|sheet| sheet.typ == calamine::SheetType::WorkSheet)
        .map(|sheet| sheet.name.clone())
        .collect()
}

/// A cell as text.
pub(crate) fn shown(cell: &Data, is_1904: bool) -> Cow<'_, str> {
    match cell {
        Data::Empty => Cow::Borrowed(""),
        Data::String(s) | Data::DateTimeIso(s) | Data::DurationIso(s) => Cow::Borrowed(s),
        Data::Float(f) => Cow::Owned(f.to_string()),
        Data::Int(i) => Cow::Owned(i.to_string()),
        Data::Bool(true) => Cow::Borrowed("TRUE"),
        Data::Bool(false) => Cow::Borrowed("FALSE"),
        Data::DateTime(date) => {
            let serial = date.as_f64();
            let in_1900 = if is_1904 {
                serial + DAYS_1900_TO_1904
            } else {
                serial
            };
            Cow::Owned(serial_date(in_1900).unwrap_or_else(|| serial.to_string()))
        }
        Data::Error(error) => Cow::Owned(error.to_string()),
    }
}

/// The CSV line of the row being read.
#[derive(Default)]
pub(crate) struct Line {
    text: String,
    /// The column after the last cell placed; 0 while the row has none.
    col: usize,
}

impl Line {
    /// Places `value` in column `col` (or right after the last cell, for a cell out of order),
    /// padding the columns skipped with commas. An empty value is no cell. Cells past what the
    /// text can still hold are dropped: the row would be cut there anyway, and a row of a
    /// million cells must not become one 50 MiB line first.
    pub(crate) fn cell(&mut self, col: usize, value: &str, sink: &Sink) {
        if value.is_empty() || self.text.len() > sink.room_bytes() {
            return;
        }
        let at = col.max(self.col);
        // One comma per skipped column (capped so a stray far-right cell cannot fill the text
        // with commas), plus the separator after the previous cell.
        let gap = at.saturating_sub(self.col).min(MAX_COLUMN_GAP);
        for _ in 0..gap + usize::from(self.col > 0) {
            self.text.push(',');
        }
        csv_field(value, &mut self.text);
        self.col = at + 1;
    }

    /// Ends the row: its line goes to the sink unless it holds no cell. Returns `false` when
    /// reading should stop.
    pub(crate) fn end(&mut self, sink: &mut Sink) -> bool {
        if self.col == 0 {
            return true;
        }
        self.text.push('\n');
        let more = sink.push(&self.text);
        self.text.clear();
        self.col = 0;
        more
    }
}

/// A CSV field: quoted when it holds a comma, quote or line break.
fn csv_field(value: &str, out: &mut String) {
    if value.contains([',', '"', '\n', '\r']) {
        out.push('"');
        out.push_str(&value.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(value);
    }
}

/// A serial date of the 1900 date system as `YYYY-MM-DD`, `HH:MM:SS` (under one day) or both;
/// `None` for a serial no date has.
fn serial_date(serial: f64) -> Option<String> {
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
