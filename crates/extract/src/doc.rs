//! Word 97-2003 (.doc): the text of the main document, a line per paragraph, read from the
//! `WordDocument` stream through the piece table ([MS-DOC] 2.4.1, "Retrieving Text").
//!
//! The file information block (FIB) at the start of `WordDocument` gives the length of the
//! main document in characters (`ccpText`) and where the piece table (`Clx`) lies in the table
//! stream (`0Table` or `1Table`). Each piece maps a run of character positions to bytes of
//! `WordDocument`: one byte per character (Windows-1252) or two (UTF-16LE). Only the main
//! document is read, as the DOCX reader reads only `word/document.xml`: footnotes, headers,
//! comments and text boxes follow it in the character positions and are left out. Fields
//! show their result (a hyperlink's text, a date, a page number), not their code; pictures and
//! other object anchors are dropped; table cells end lines, as paragraphs do.
//!
//! Refused with a reason: files encrypted or obfuscated with a password, and Word 6/95 files
//! (a different FIB). Bounded: every offset is checked against its stream (which is at most
//! the file), the text is read piece by piece in chunks up to `max_text_chars`, and the
//! deadline is checked between chunks.
//!
//! [MS-DOC]: https://learn.microsoft.com/en-us/openspecs/office_file_formats/ms-doc/

use crate::ole::{Container, index, u16_at, u32_at};
use crate::sink::Sink;
use crate::{ExtractError, Extracted, Limits};

const FORMAT: &str = "DOC";

/// `wIdent` of a Word binary file.
const WORD_IDENT: u16 = 0xA5EC;
/// The lowest `nFib` of Word 97 (Word 6 is 101, Word 95 104).
const WORD_97_NFIB: u16 = 0x00C0;
/// `FibBase` flags.
const F_ENCRYPTED: u16 = 0x0100;
const F_WHICH_TBL_STM: u16 = 0x0200;
/// Index of `fcClx` among the FIB's (fc, lcb) pairs.
const CLX_PAIR: usize = 33;
/// Most nested fields tracked; deeper ones are shown as they come.
const MAX_FIELD_DEPTH: usize = 64;
/// Bytes decoded at a time.
const CHUNK: usize = 16 * 1024;

fn corrupt(detail: impl ToString) -> ExtractError {
    ExtractError::corrupt(FORMAT, detail)
}

/// What the FIB says about where the text is.
struct Fib {
    encrypted: bool,
    table: &'static str,
    ccp_text: u32,
    fc_clx: u32,
    lcb_clx: u32,
}

impl Fib {
    /// Reads the FIB, or says why the file is not a Word 97-2003 document.
    fn read(word: &[u8]) -> Result<Result<Self, String>, ExtractError> {
        let short = || corrupt("the file information block is cut short");
        if u16_at(word, 0).ok_or_else(short)? != WORD_IDENT {
            return Err(corrupt("the WordDocument stream is not a Word document"));
        }
        let n_fib = u16_at(word, 2).ok_or_else(short)?;
        if n_fib < WORD_97_NFIB {
            return Ok(Err(format!(
                "Word 6.0/95 and older .doc files (version {n_fib}) cannot be read; save it as .docx or PDF"
            )));
        }
        let flags = u16_at(word, 0x0A).ok_or_else(short)?;
        // FibBase (32 bytes), csw and fibRgW, cslw and fibRgLw, cbRgFcLcb and fibRgFcLcb.
        let csw = usize::from(u16_at(word, 0x20).ok_or_else(short)?);
        let rg_lw = 0x22 + csw * 2 + 2;
        let cslw = usize::from(u16_at(word, rg_lw - 2).ok_or_else(short)?);
        // ccpText is the fourth long of fibRgLw.
        let ccp_text = u32_at(word, rg_lw + 12).ok_or_else(short)?;
        let rg_fc_lcb = rg_lw + cslw * 4 + 2;
        let pairs = usize::from(u16_at(word, rg_fc_lcb - 2).ok_or_else(short)?);
        if cslw < 4 || pairs <= CLX_PAIR {
            return Err(corrupt(
                "the file information block has no piece table entry",
            ));
        }
        let clx = rg_fc_lcb + CLX_PAIR * 8;
        Ok(Ok(Self {
            encrypted: flags & F_ENCRYPTED != 0,
            table: if flags & F_WHICH_TBL_STM != 0 {
                "1Table"
            } else {
                "0Table"
            },
            ccp_text,
            fc_clx: u32_at(word, clx).ok_or_else(short)?,
            lcb_clx: u32_at(word, clx + 4).ok_or_else(short)?,
        }))
    }
}

/// The piece table's `PlcPcd`: `n + 1` character positions, then `n` 8-byte piece
/// descriptors.
struct Pieces<'t> {
    plc: &'t [u8],
    count: usize,
}

/// One piece: character positions `start..end`, at byte `offset` of `WordDocument`, one byte
/// per character when `compressed`, else two.
struct Piece {
    start: u32,
    end: u32,
    offset: usize,
    compressed: bool,
}

impl<'t> Pieces<'t> {
    /// Finds the `Pcdt` in a `Clx`, skipping the `Prc` entries before it.
    fn find(clx: &'t [u8]) -> Result<Self, ExtractError> {
        let mut at = 0usize;
        loop {
            match clx.get(at) {
                Some(1) => {
                    let cb = u16_at(clx, at + 1).ok_or_else(|| corrupt("cut-short Prc"))?;
                    at += 3 + usize::from(cb);
                }
                Some(2) => {
                    let lcb = index(u32_at(clx, at + 1).ok_or_else(|| corrupt("cut-short Pcdt"))?);
                    let plc = clx
                        .get(at + 5..)
                        .and_then(|rest| rest.get(..lcb))
                        .ok_or_else(|| corrupt("the piece table is cut short"))?;
                    if lcb < 4 || !(lcb - 4).is_multiple_of(12) {
                        return Err(corrupt("the piece table has a wrong size"));
                    }
                    return Ok(Self {
                        plc,
                        count: (lcb - 4) / 12,
                    });
                }
                _ => return Err(corrupt("no piece table in the Clx")),
            }
        }
    }

    fn get(&self, i: usize) -> Option<Piece> {
        let start = u32_at(self.plc, i * 4)?;
        let end = u32_at(self.plc, (i + 1) * 4)?;
        let fc = u32_at(self.plc, (self.count + 1) * 4 + i * 8 + 2)?;
        let compressed = fc & 0x4000_0000 != 0;
        let fc = fc & 0x3FFF_FFFF;
        Some(Piece {
            start,
            end,
            offset: index(if compressed { fc / 2 } else { fc }),
            compressed,
        })
    }
}

/// Turns the document's characters into lines: paragraph, cell and page marks end a line,
/// field codes are hidden, anchors and other control characters dropped.
struct Text {
    pending: String,
    /// One entry per open field: `true` while in its code (before its separator).
    fields: Vec<bool>,
    /// Open fields past [`MAX_FIELD_DEPTH`].
    deeper: usize,
}

impl Text {
    fn flush(&mut self, sink: &mut Sink) -> bool {
        let more = self.pending.is_empty() || sink.push(&self.pending);
        self.pending.clear();
        more
    }

    /// Takes one character; `false` when reading should stop.
    fn put(&mut self, c: char, sink: &mut Sink) -> bool {
        match c {
            '\u{13}' => {
                if self.fields.len() < MAX_FIELD_DEPTH {
                    self.fields.push(true);
                } else {
                    self.deeper += 1;
                }
            }
            '\u{14}' if self.deeper == 0 => {
                if let Some(in_code) = self.fields.last_mut() {
                    *in_code = false;
                }
            }
            '\u{15}' => {
                if self.deeper > 0 {
                    self.deeper -= 1;
                } else {
                    self.fields.pop();
                }
            }
            _ if self.fields.iter().any(|in_code| *in_code) => {}
            // Paragraph, cell or row, page or section, and column marks.
            '\r' | '\u{7}' | '\u{c}' | '\u{e}' => {
                return self.flush(sink) && sink.newline();
            }
            '\u{b}' => self.pending.push('\n'),
            '\t' => self.pending.push('\t'),
            // Non-breaking hyphen.
            '\u{1e}' => self.pending.push('-'),
            c if c.is_control() => {}
            c => self.pending.push(c),
        }
        self.pending.len() < CHUNK || self.flush(sink)
    }
}

/// Text of a .doc: its main document, a line per paragraph.
pub(crate) fn extract(bytes: &[u8], limits: &Limits) -> Result<Extracted, ExtractError> {
    let mut file = Container::open(FORMAT, bytes)?;
    let word = file.required("WordDocument")?;
    let fib = match Fib::read(&word)? {
        Ok(fib) => fib,
        Err(reason) => return Ok(Extracted::Unsupported { reason }),
    };
    if fib.encrypted {
        return Err(ExtractError::Protected { format: FORMAT });
    }
    let table = file.required(fib.table)?;
    let clx = index(fib.fc_clx)
        .checked_add(index(fib.lcb_clx))
        .and_then(|end| table.get(index(fib.fc_clx)..end))
        .ok_or_else(|| corrupt("the piece table lies outside the table stream"))?;
    let pieces = Pieces::find(clx)?;
    let mut sink = Sink::new(limits);
    let mut text = Text {
        pending: String::new(),
        fields: Vec::new(),
        deeper: 0,
    };
    'pieces: for i in 0..pieces.count {
        let Some(piece) = pieces.get(i) else { break };
        if piece.start >= fib.ccp_text {
            break;
        }
        let chars = index(piece.end.min(fib.ccp_text).saturating_sub(piece.start));
        let width = if piece.compressed { 1 } else { 2 };
        let Some(run) = chars
            .checked_mul(width)
            .and_then(|len| piece.offset.checked_add(len))
            .and_then(|end| word.get(piece.offset..end))
        else {
            // A piece outside the stream: what was read is kept, marked incomplete.
            sink.mark_incomplete();
            continue;
        };
        if piece.compressed {
            for chunk in run.chunks(CHUNK) {
                let (decoded, _) = encoding_rs::WINDOWS_1252.decode_without_bom_handling(chunk);
                if sink.done() || !decoded.chars().all(|c| text.put(c, &mut sink)) {
                    break 'pieces;
                }
            }
        } else {
            let units = run
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]));
            let decoded =
                char::decode_utf16(units).map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER));
            for (n, c) in decoded.enumerate() {
                if (n % CHUNK == 0 && sink.done()) || !text.put(c, &mut sink) {
                    break 'pieces;
                }
            }
        }
    }
    text.flush(&mut sink);
    sink.finish()
}
