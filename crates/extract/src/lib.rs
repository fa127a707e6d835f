//! Turns the bytes of an uploaded attachment into a content block for the agent:
//! PDF, DOCX, XLSX, PPTX, the legacy binary DOC, XLS and PPT, CSV, TXT and SVG (the text
//! of its `<title>`, `<desc>` and `<text>` elements, see `svg.rs`) become text; PNG, JPEG,
//! GIF and WebP (and BMP, converted to PNG) become a base64 vision block; everything else
//! is reported as unsupported with a reason the agent can be told.
//!
//! Everything is bounded: the input size, the characters of text kept (a text file is
//! decoded only up to them), the bytes of an image, the pixels an image declares (a BMP
//! is refused before decoding when it would not fit [`Limits::max_decoded_image_bytes`]),
//! the bytes decompressed from an Office archive (counted as they are inflated, whatever
//! the zip headers declare), the cell grids a legacy .xls expands to (counted from its
//! records before it is read), and the time spent (a deadline is checked inside every
//! page/row/slide/record/XML loop; when it passes, the text read so far is returned with
//! `truncated = true`).
//!
//! What this crate cannot bound from inside is a third-party parser that neither stops
//! nor lets go of memory: lopdf loads a whole PDF and expands object streams, arrays and
//! content streams into objects (a 49 KB PDF can ask for 3 GB), and calamine parses a
//! whole .xls workbook, formula text included, when it opens it. So the worker never
//! calls [`extract`] itself: it runs the `switchboard-extract` helper ([`isolate`]), a
//! process per file under an address-space limit, killed at its deadline.
//!
//! [`extract`] is synchronous and CPU-bound.

pub mod bombs;
mod doc;
pub mod isolate;
mod ole;
mod ooxml;
mod pdf;
mod ppt;
mod sheet;
mod sink;
mod svg;
mod vision;
mod xls;
mod xlsx;

use std::fmt::Write as _;
use std::time::Duration;

use sink::Sink;

/// Bounds on one extraction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest input accepted at all (default 100 MiB).
    pub max_input_bytes: usize,
    /// Characters of text kept; the rest is dropped and `truncated` set (default 100 000).
    pub max_text_chars: usize,
    /// Largest image sent as a vision block, after any conversion (default 20 MiB).
    pub max_image_bytes: usize,
    /// Most pixels an image may declare in its header (default 8192 x 8192); PNG, GIF and
    /// BMP headers are read, JPEG and WebP are passed on unread.
    pub max_image_pixels: u64,
    /// Most memory one decoded image may take (BMP, converted to PNG), as width x
    /// height x 4 bytes from its header, checked before decoding (default 64 MiB).
    pub max_decoded_image_bytes: u64,
    /// Bytes decompressed from an Office (zip) file in total, and from each stream or
    /// page of a PDF; reading stops there (default 50 MiB). A legacy .xls file's cell
    /// grids may take 4 times this once read (counted before reading; a file over it is
    /// not read).
    pub max_decompressed_bytes: usize,
    /// Most entries an Office (zip) file may list (default 10 000).
    pub max_zip_entries: usize,
    /// Time allowed for one file; text loops stop when it has passed (default 10 s).
    pub timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_input_bytes: 100 * 1024 * 1024,
            max_text_chars: 100_000,
            max_image_bytes: 20 * 1024 * 1024,
            max_image_pixels: 8192 * 8192,
            max_decoded_image_bytes: 64 * 1024 * 1024,
            max_decompressed_bytes: 50 * 1024 * 1024,
            max_zip_entries: 10_000,
            timeout: Duration::from_secs(10),
        }
    }
}

/// What an attachment becomes for the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Extracted {
    /// Text of a PDF, DOCX, XLSX, PPTX, DOC, XLS, PPT, CSV, TXT or SVG file. `truncated`
    /// is set when the text, decompression or time limit cut it short.
    Text { text: String, truncated: bool },
    /// A vision block: `data_base64` is the standard (padded) base64 of an image of
    /// type `mime_type` (PNG, JPEG, GIF or WebP).
    Image {
        mime_type: String,
        data_base64: String,
    },
    /// Nothing the agent can read (unknown types, Word 6/95 files, an .xls too large to
    /// read, BMP without the `bmp` feature).
    Unsupported { reason: String },
}

impl Extracted {
    /// The `data:` URL of an image block (for an OpenAI `image_url` part), else `None`.
    pub fn data_url(&self) -> Option<String> {
        match self {
            Self::Image {
                mime_type,
                data_base64,
            } => Some(format!("data:{mime_type};base64,{data_base64}")),
            _ => None,
        }
    }
}

/// Why a file could not be extracted.
#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    /// The file (or an image after conversion) is over a size limit.
    #[error("{what} is {size} bytes, over the {limit}-byte limit")]
    TooLarge {
        what: &'static str,
        size: usize,
        limit: usize,
    },
    /// The file does not parse as the type it claims.
    #[error("corrupt or unreadable {format} file: {detail}")]
    Corrupt {
        format: &'static str,
        detail: String,
    },
    /// A PDF that needs a password to read.
    #[error("the PDF is encrypted and needs a password to read")]
    Encrypted,
    /// A legacy Office file (DOC, XLS, PPT) encrypted with a password.
    #[error("the {format} file is protected with a password and cannot be read without it")]
    Protected { format: &'static str },
    /// The time limit passed before any text was extracted.
    #[error("extraction timed out after {0:?} before any text was read")]
    TimedOut(Duration),
    /// An image whose header declares more pixels than may be sent, or decoded.
    #[error("the image declares {width}x{height} pixels, {why}")]
    ImageTooLarge {
        width: u32,
        height: u32,
        /// Which limit it breaks, e.g. `over the 67-megapixel limit`.
        why: String,
    },
}

impl ExtractError {
    fn corrupt(format: &'static str, detail: impl ToString) -> Self {
        Self::Corrupt {
            format,
            detail: detail.to_string(),
        }
    }
}

const DOCX: &str = "application/vnd.openxmlformats-officedocument.wordprocessingml.document";
const XLSX: &str = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet";
const PPTX: &str = "application/vnd.openxmlformats-officedocument.presentationml.presentation";

/// The kinds of file this crate tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pdf,
    Docx,
    Xlsx,
    Pptx,
    Text,
    Image(&'static str),
    Bmp,
    Svg,
    Doc,
    Xls,
    Ppt,
}

fn kind_of_mime(mime: &str) -> Option<Kind> {
    let bare = mime.split(';').next().unwrap_or_default().trim();
    let bare = bare.to_ascii_lowercase();
    Some(match bare.as_str() {
        "application/pdf" => Kind::Pdf,
        DOCX => Kind::Docx,
        XLSX => Kind::Xlsx,
        PPTX => Kind::Pptx,
        "text/plain" | "text/csv" => Kind::Text,
        "image/png" => Kind::Image("image/png"),
        "image/jpeg" | "image/jpg" => Kind::Image("image/jpeg"),
        "image/gif" => Kind::Image("image/gif"),
        "image/webp" => Kind::Image("image/webp"),
        "image/bmp" => Kind::Bmp,
        "image/svg+xml" => Kind::Svg,
        "application/msword" => Kind::Doc,
        "application/vnd.ms-excel" => Kind::Xls,
        "application/vnd.ms-powerpoint" => Kind::Ppt,
        _ => return None,
    })
}

fn kind_of_name(file_name: &str) -> Option<Kind> {
    let ext = file_name.rsplit_once('.')?.1.to_ascii_lowercase();
    Some(match ext.as_str() {
        "pdf" => Kind::Pdf,
        "docx" => Kind::Docx,
        "xlsx" => Kind::Xlsx,
        "pptx" => Kind::Pptx,
        "txt" | "csv" | "md" => Kind::Text,
        "png" => Kind::Image("image/png"),
        "jpg" | "jpeg" => Kind::Image("image/jpeg"),
        "gif" => Kind::Image("image/gif"),
        "webp" => Kind::Image("image/webp"),
        "bmp" => Kind::Bmp,
        "svg" => Kind::Svg,
        "doc" => Kind::Doc,
        "xls" => Kind::Xls,
        "ppt" => Kind::Ppt,
        _ => return None,
    })
}

/// Extracts `bytes`, declared as `mime_type` (parameters ignored), into a content block.
///
/// The type is taken from `mime_type`; `file_name`'s extension is only a fallback for
/// a MIME type this crate does not know (such as `application/octet-stream`).
/// CPU-bound and synchronous, but bounded by `limits` (including `limits.timeout`).
pub fn extract(
    mime_type: &str,
    file_name: &str,
    bytes: &[u8],
    limits: &Limits,
) -> Result<Extracted, ExtractError> {
    if bytes.len() > limits.max_input_bytes {
        return Err(ExtractError::TooLarge {
            what: "the file",
            size: bytes.len(),
            limit: limits.max_input_bytes,
        });
    }
    let Some(kind) = kind_of_mime(mime_type).or_else(|| kind_of_name(file_name)) else {
        return Ok(Extracted::Unsupported {
            reason: format!("files of type {mime_type:?} cannot be read"),
        });
    };
    match kind {
        Kind::Pdf => guarded("PDF", || pdf::extract(bytes, limits)),
        Kind::Docx => guarded("DOCX", || ooxml::docx(bytes, limits)),
        Kind::Xlsx => guarded("XLSX", || xlsx::extract(bytes, limits)),
        Kind::Pptx => guarded("PPTX", || ooxml::pptx(bytes, limits)),
        Kind::Text => {
            let mut sink = Sink::new(limits);
            sink.push(&decode_text(bytes, limits.max_text_chars));
            sink.finish()
        }
        Kind::Image(mime) => vision::passthrough(mime, bytes, limits),
        #[cfg(feature = "bmp")]
        Kind::Bmp => guarded("BMP", || vision::bmp_to_png(bytes, limits)),
        #[cfg(not(feature = "bmp"))]
        Kind::Bmp => Ok(Extracted::Unsupported {
            reason: "BMP images cannot be sent to the model; convert it to PNG or JPEG".into(),
        }),
        Kind::Svg => guarded("SVG", || svg::extract(bytes, limits)),
        Kind::Doc => guarded("DOC", || doc::extract(bytes, limits)),
        Kind::Xls => guarded("XLS", || xls::extract(bytes, limits)),
        Kind::Ppt => guarded("PPT", || ppt::extract(bytes, limits)),
    }
}

/// Runs a parser, turning a panic inside a third-party crate into a `Corrupt` error.
fn guarded(
    format: &'static str,
    f: impl FnOnce() -> Result<Extracted, ExtractError>,
) -> Result<Extracted, ExtractError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(ExtractError::corrupt(
            format,
            "the parser failed on malformed input",
        ))
    })
}

/// The start of a text file as a string: UTF-16 when it has a UTF-16 byte order mark, UTF-8
/// when it is UTF-8, otherwise in the legacy encoding `chardetng` detects from its bytes
/// (Windows-1252 from Excel, Shift_JIS, ...), with any byte order mark removed.
/// Only the first `4 * (max_chars + 1)` bytes are decoded: a character takes at most 4
/// bytes in both encodings (and an invalid byte becomes one replacement character), so
/// when the file goes on past them the string has more than `max_chars` characters, the
/// sink cuts it and marks it truncated, and a character split at the cut lies beyond.
fn decode_text(bytes: &[u8], max_chars: usize) -> String {
    let keep = max_chars.saturating_add(1).saturating_mul(4);
    let prefix = |rest: &[u8]| rest.len().min(keep);
    let utf16 = |rest: &[u8], unit: fn([u8; 2]) -> u16| {
        let units = rest.chunks_exact(2).map(|c| unit([c[0], c[1]]));
        char::decode_utf16(units)
            .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect()
    };
    if let Some(rest) = bytes.strip_prefix(&[0xFF, 0xFE]) {
        return utf16(&rest[..prefix(rest)], u16::from_le_bytes);
    }
    if let Some(rest) = bytes.strip_prefix(&[0xFE, 0xFF]) {
        return utf16(&rest[..prefix(rest)], u16::from_be_bytes);
    }
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let kept = &bytes[..prefix(bytes)];
    match std::str::from_utf8(kept) {
        Ok(text) => text.to_owned(),
        // Cut inside a character at `keep`: still UTF-8 (the sink cuts further anyway).
        Err(err) if err.error_len().is_none() => String::from_utf8_lossy(kept).into_owned(),
        // Not UTF-8: a legacy encoding (Windows-1252 from Excel, Shift_JIS, ...), detected
        // from the bytes themselves; each byte decodes to one character or fewer, so the
        // cap above still holds.
        Err(_) => {
            let mut detector =
                chardetng::EncodingDetector::new(chardetng::Iso2022JpDetection::Deny);
            detector.feed(kept, kept.len() == bytes.len());
            let encoding = detector.guess(None, chardetng::Utf8Detection::Allow);
            encoding.decode_without_bom_handling(kept).0.into_owned()
        }
    }
}

/// The text the agent sees for an attachment: a header naming the file, then the
/// text (for a text block), or a note that the image follows, or why it is missing.
pub fn as_prompt_text(file_name: &str, extracted: &Extracted) -> String {
    let name = clean_name(file_name);
    match extracted {
        Extracted::Text { text, truncated } => {
            let mut out = format!("[Attachment: {name}]\n");
            let body = text.trim_end();
            if body.trim_start().is_empty() {
                out.push_str("(no extractable text)\n");
            } else {
                out.push_str(body);
                out.push('\n');
            }
            if *truncated {
                out.push_str("[... truncated: only the beginning of the file is included]\n");
            }
            let _ = write!(out, "[End of attachment: {name}]");
            out
        }
        Extracted::Image { mime_type, .. } => {
            format!("[Attachment: {name} ({mime_type} image, attached as an image)]")
        }
        Extracted::Unsupported { reason } => {
            format!("[Attachment: {name} (content not included: {reason})]")
        }
    }
}

/// A file name safe to put in a header line: no control characters or brackets, at
/// most 200 characters.
fn clean_name(file_name: &str) -> String {
    let name: String = file_name
        .chars()
        .map(|c| match c {
            c if c.is_control() => ' ',
            '[' => '(',
            ']' => ')',
            c => c,
        })
        .take(200)
        .collect();
    let name = name.trim();
    if name.is_empty() {
        "unnamed file".into()
    } else {
        name.into()
    }
}

#[cfg(test)]
mod tests;
