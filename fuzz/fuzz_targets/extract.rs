//! Fuzz target: untrusted attachment bytes through `extract::extract` (crate
//! `switchboard-extract`), for every MIME type it knows.
//! Run: `RUSTC_BOOTSTRAP=1 cargo fuzz run extract -- -max_total_time=60 -timeout=30`
//! (see docs/testing.md).
//!
//! Byte 0 picks the declared type: below 0x80 a MIME type of `TYPES`, from 0x80 on
//! `application/octet-stream` with a file name whose extension is the fallback (`EXTENSIONS`).
//! The rest is the file. Limits are small so that every cap is reached. Properties:
//! - `extract` never panics (a third-party panic its guard turns into `Corrupt` is printed,
//!   and is a crash too with `SWITCHBOARD_FUZZ_STRICT_PANICS=1`);
//! - text is at most `max_text_chars` characters; plain text is a prefix of the (lossy UTF-8)
//!   file, all of it when not `truncated`;
//! - an image block is standard base64 of at most `max_image_bytes` bytes, of a PNG, JPEG, GIF
//!   or WebP; PNG/JPEG/GIF/WebP pass through byte for byte under their sniffed type; BMP
//!   becomes a PNG;
//! - each kind yields only its variant (documents, SVG and legacy Office text, images image,
//!   unknown types unsupported); `TooLarge` names a size over its limit; `as_prompt_text` never panics.
#![no_main]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use extract::{ExtractError, Extracted, Limits, as_prompt_text, extract};
use libfuzzer_sys::fuzz_target;

const DOCX: &str = "application/vnd.openxmlformats-officedocument.wordprocessingml.document";
const XLSX: &str = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet";
const PPTX: &str = "application/vnd.openxmlformats-officedocument.presentationml.presentation";

/// What a declared type must come out as.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    Document,
    PlainText,
    Image,
    Bmp,
    Unsupported,
}

const TYPES: &[(&str, Expect)] = &[
    ("application/pdf", Expect::Document),
    (DOCX, Expect::Document),
    (XLSX, Expect::Document),
    (PPTX, Expect::Document),
    ("text/plain", Expect::PlainText),
    ("text/csv; charset=utf-8", Expect::PlainText),
    ("image/png", Expect::Image),
    ("image/jpeg", Expect::Image),
    ("image/gif", Expect::Image),
    ("image/webp", Expect::Image),
    ("image/bmp", Expect::Bmp),
    ("image/svg+xml", Expect::Document),
    ("application/msword", Expect::Document),
    ("application/vnd.ms-excel", Expect::Document),
    ("application/vnd.ms-powerpoint", Expect::Document),
    ("application/x-unknown", Expect::Unsupported),
];

const EXTENSIONS: &[(&str, Expect)] = &[
    ("pdf", Expect::Document),
    ("docx", Expect::Document),
    ("xlsx", Expect::Document),
    ("pptx", Expect::Document),
    ("txt", Expect::PlainText),
    ("csv", Expect::PlainText),
    ("md", Expect::PlainText),
    ("png", Expect::Image),
    ("jpg", Expect::Image),
    ("gif", Expect::Image),
    ("webp", Expect::Image),
    ("bmp", Expect::Bmp),
    ("svg", Expect::Document),
    ("doc", Expect::Document),
    ("xls", Expect::Document),
    ("ppt", Expect::Document),
    ("bin", Expect::Unsupported),
];

fn limits() -> Limits {
    Limits {
        max_input_bytes: 1024 * 1024,
        max_text_chars: 2_000,
        max_image_bytes: 16 * 1024,
        max_decompressed_bytes: 4 * 1024 * 1024,
        max_zip_entries: 256,
        timeout: Duration::from_secs(2),
        ..Limits::default()
    }
}

static PANICS_SHOWN: AtomicUsize = AtomicUsize::new(0);

fn init() {
    // libfuzzer-sys aborts on any panic, before unwinding; `extract` catches third-party
    // panics on purpose (its `guarded`), so let them unwind. A panic that escapes `extract`
    // (or an assertion below) still aborts, in libfuzzer-sys's `catch_unwind`.
    let strict = std::env::var_os("SWITCHBOARD_FUZZ_STRICT_PANICS").is_some();
    std::panic::set_hook(Box::new(move |info| {
        if strict {
            eprintln!("{info}");
            std::process::abort();
        }
        if PANICS_SHOWN.fetch_add(1, Ordering::Relaxed) < 20 {
            eprintln!("panic (a crash unless extract's guard catches it): {info}");
        }
    }));
}

fuzz_target!(init: init(), |data: &[u8]| {
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    let (mime, file_name, expect) = if selector < 0x80 {
        let (mime, expect) = TYPES[usize::from(selector) % TYPES.len()];
        (mime, "attachment".to_owned(), expect)
    } else {
        let (ext, expect) = EXTENSIONS[usize::from(selector) % EXTENSIONS.len()];
        ("application/octet-stream", format!("attachment.{ext}"), expect)
    };
    let limits = limits();
    let result = extract(mime, &file_name, bytes, &limits);
    match &result {
        Ok(extracted) => {
            let _ = as_prompt_text(&file_name, extracted);
            let _ = extracted.data_url();
            check_ok(extracted, expect, bytes, &limits);
        }
        Err(error) => {
            assert!(!error.to_string().is_empty());
            if let ExtractError::TooLarge { size, limit, .. } = error {
                assert!(size > limit, "{error}");
            }
            assert!(
                !matches!(expect, Expect::Unsupported),
                "{mime} {file_name}: unsupported types are not errors: {error}"
            );
        }
    }
});

fn check_ok(extracted: &Extracted, expect: Expect, bytes: &[u8], limits: &Limits) {
    match extracted {
        Extracted::Text { text, truncated } => {
            assert!(
                matches!(expect, Expect::Document | Expect::PlainText),
                "text for {expect:?}"
            );
            let chars = text.chars().count();
            assert!(chars <= limits.max_text_chars, "{chars} characters kept");
            let bom = bytes.starts_with(b"\xEF\xBB\xBF")
                || bytes.starts_with(&[0xFF, 0xFE])
                || bytes.starts_with(&[0xFE, 0xFF]);
            if expect == Expect::PlainText && !bom {
                let whole = String::from_utf8_lossy(bytes);
                assert!(whole.starts_with(text.as_str()), "text is not the file's start");
                if !truncated {
                    assert_eq!(text.as_str(), whole, "untruncated text is not the file");
                }
            }
        }
        Extracted::Image {
            mime_type,
            data_base64,
        } => {
            assert!(
                matches!(expect, Expect::Image | Expect::Bmp),
                "image for {expect:?}"
            );
            assert!(
                ["image/png", "image/jpeg", "image/gif", "image/webp"].contains(&mime_type.as_str()),
                "image type {mime_type}"
            );
            let decoded = STANDARD.decode(data_base64);
            assert!(decoded.is_ok(), "not standard base64: {decoded:?}");
            let decoded = decoded.unwrap_or_default();
            assert!(decoded.len() <= limits.max_image_bytes);
            if expect == Expect::Image {
                assert!(decoded == bytes, "an image did not pass through unchanged");
                assert_eq!(Some(mime_type.as_str()), sniff(bytes));
            } else {
                assert_eq!(mime_type, "image/png");
                assert!(decoded.starts_with(b"\x89PNG\r\n\x1a\n"));
            }
        }
        Extracted::Unsupported { reason } => {
            assert_eq!(expect, Expect::Unsupported, "unsupported: {reason}");
            assert!(!reason.is_empty());
        }
    }
}

/// The image signatures the crate documents (PNG, JPEG, GIF, WebP).
fn sniff(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}
