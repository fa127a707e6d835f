//! PDF text, page by page, with `lopdf`.

use lopdf::{Document, LoadOptions};

use crate::sink::Sink;
use crate::{ExtractError, Extracted, Limits};

/// Text of a PDF: each page under a `--- Page N ---` header. Pages whose text cannot
/// be read are skipped; a PDF none of whose pages can be read is corrupt.
pub(crate) fn extract(bytes: &[u8], limits: &Limits) -> Result<Extracted, ExtractError> {
    let mut sink = Sink::new(limits);
    let options = LoadOptions {
        max_decompressed_size: Some(limits.max_decompressed_bytes),
        ..LoadOptions::default()
    };
    let doc = Document::load_mem_with_options(bytes, options).map_err(|e| match e {
        lopdf::Error::InvalidPassword | lopdf::Error::Decryption(_) => ExtractError::Encrypted,
        e => ExtractError::corrupt("PDF", e),
    })?;
    // lopdf opens a PDF with an empty user password itself; one that is still
    // encrypted after loading needs a real password.
    if doc.is_encrypted() && !doc.was_encrypted() {
        return Err(ExtractError::Encrypted);
    }
    let pages = doc.get_pages();
    let mut failed = 0usize;
    let mut last_error = None;
    for &number in pages.keys() {
        if sink.done() {
            break;
        }
        match doc.extract_text_with_limit(&[number], limits.max_decompressed_bytes) {
            Ok(text) => {
                if !sink.section(&format!("--- Page {number} ---")) {
                    break;
                }
                if !sink.push(text.trim_end()) {
                    break;
                }
            }
            Err(e) => {
                failed += 1;
                last_error = Some(e);
            }
        }
    }
    if let Some(e) = last_error
        && failed == pages.len()
    {
        return Err(ExtractError::corrupt(
            "PDF",
            format!("no page could be read ({e})"),
        ));
    }
    sink.finish()
}
