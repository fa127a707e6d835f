//! Fuzz target: an untrusted `multipart/form-data` upload body, as the attachments service's
//! `POST /api/v1/agent/attachments` reads it.
//! Run: `RUSTC_BOOTSTRAP=1 cargo fuzz run multipart -- -max_total_time=60` (see docs/testing.md).
//!
//! A PARSER-LEVEL target: the service's form reader (`receive` in
//! `services/attachments/src/server_upload.rs`, and `base_name` / `key_name` for the file name)
//! is private, so this drives the same parser, `multer` 3.1.0 (what axum 0.8's `Multipart`
//! runs: `multer::parse_boundary` on the Content-Type, then `multer::Multipart::new`), and
//! reproduces the service's rules on top of it: `session_id` at most 512 bytes read and 1 to
//! 128 characters, `file_type` at most 255 bytes, at most 8 unknown fields, the first `file`
//! part ends the form and its type must be allowed (`file_types::allowed`, public).
//!
//! Input: byte 0 picks the chunk size (1 to 64 bytes) of a second, chunked read, and with bit
//! 0x40 set the first line of the rest is the request's Content-Type (the boundary comes from
//! `parse_boundary`; else it is `B0UNDARY`). Properties: never panics; the service model's
//! outcome and every field the parser yields (name, file name, content type, bytes) are the
//! same whether the body arrives whole or in small chunks; no field's bytes contain the
//! delimiter `\r\n--boundary`; an accepted form obeys the field caps above.
#![no_main]

use std::convert::Infallible;

use bytes::Bytes;
use futures::executor::block_on;
use libfuzzer_sys::fuzz_target;
use multer::{Field, Multipart};
use switchboard_protocol::file_types;

const FIXED_BOUNDARY: &str = "B0UNDARY";
/// The service's caps (`server_upload.rs`: MAX_SESSION_ID_BYTES, MAX_FILE_TYPE_BYTES,
/// MAX_SKIPPED_FIELDS; the 128-character session id of `receive`).
const MAX_SESSION_ID_BYTES: usize = 512;
const MAX_SESSION_ID_CHARS: usize = 128;
const MAX_FILE_TYPE_BYTES: usize = 255;
const MAX_SKIPPED_FIELDS: usize = 8;
/// Bytes of the file the service keeps to check its type.
const HEAD_BYTES: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(mode & 0x3F) + 1;
    let (boundary, body) = if mode & 0x40 != 0 {
        let (line, body) = match rest.iter().position(|b| *b == b'\n') {
            Some(end) => (&rest[..end], &rest[end + 1..]),
            None => (rest, &[][..]),
        };
        let Ok(header) = std::str::from_utf8(line) else {
            return;
        };
        match multer::parse_boundary(header) {
            Ok(boundary) => (boundary, body),
            Err(_) => return,
        }
    } else {
        (FIXED_BOUNDARY.to_owned(), rest)
    };

    let whole = block_on(service(form(body, body.len().max(1), &boundary)));
    let chunked = block_on(service(form(body, chunk, &boundary)));
    assert_eq!(whole, chunked, "the service's outcome depends on chunking");
    if let Outcome::Stored {
        session_id,
        declared_type,
        skipped,
        ..
    } = &whole
    {
        if let Some(id) = session_id {
            assert!(id.len() <= MAX_SESSION_ID_BYTES);
            assert!(!id.is_empty() && id.chars().count() <= MAX_SESSION_ID_CHARS);
        }
        if let Some(kind) = declared_type {
            assert!(kind.len() <= MAX_FILE_TYPE_BYTES);
        }
        assert!(*skipped <= MAX_SKIPPED_FIELDS);
    }

    let delimiter = format!("\r\n--{boundary}");
    let all_whole = block_on(all_fields(form(body, body.len().max(1), &boundary)));
    let all_chunked = block_on(all_fields(form(body, chunk, &boundary)));
    assert_eq!(all_whole, all_chunked, "the parsed fields depend on chunking");
    for field in &all_whole.0 {
        assert!(
            !contains(&field.data, delimiter.as_bytes()),
            "field {:?} holds the delimiter",
            field.name
        );
        assert!(field.data.len() <= body.len());
    }
});

/// The body as a stream of `chunk`-byte pieces.
fn form(body: &[u8], chunk: usize, boundary: &str) -> Multipart<'static> {
    let pieces: Vec<Result<Bytes, Infallible>> = body
        .chunks(chunk)
        .map(|piece| Ok(Bytes::copy_from_slice(piece)))
        .collect();
    Multipart::new(futures::stream::iter(pieces), boundary)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// What the service's `receive` would end with (S3 left out: the file's bytes are kept).
#[derive(Debug, PartialEq)]
enum Outcome {
    Stored {
        session_id: Option<String>,
        declared_type: Option<String>,
        file_name: String,
        mime: String,
        file: Vec<u8>,
        skipped: usize,
    },
    /// Refused, naming the field (the service's 400 `field`).
    Refused(&'static str),
}

/// `small_text` of the service: refused as soon as the field grows past `max` bytes.
async fn small_text(field: &mut Field<'_>, max: usize) -> Result<String, ()> {
    let mut bytes = Vec::new();
    while let Some(chunk) = field.chunk().await.map_err(|_| ())? {
        if bytes.len() + chunk.len() > max {
            return Err(());
        }
        bytes.extend_from_slice(&chunk);
    }
    String::from_utf8(bytes).map_err(|_| ())
}

/// The loop of the service's `receive`, with the same rules and order.
async fn service(mut form: Multipart<'static>) -> Outcome {
    let mut session_id = None;
    let mut declared_type = None;
    let mut skipped = 0;
    loop {
        let mut field = match form.next_field().await {
            Ok(Some(field)) => field,
            Ok(None) => return Outcome::Refused("file"),
            Err(_) => return Outcome::Refused("file"),
        };
        let name = field.name().unwrap_or_default().to_owned();
        match name.as_str() {
            "session_id" => {
                let Ok(value) = small_text(&mut field, MAX_SESSION_ID_BYTES).await else {
                    return Outcome::Refused("session_id");
                };
                if value.is_empty() || value.chars().count() > MAX_SESSION_ID_CHARS {
                    return Outcome::Refused("session_id");
                }
                session_id = Some(value);
            }
            "file_type" => {
                let Ok(value) = small_text(&mut field, MAX_FILE_TYPE_BYTES).await else {
                    return Outcome::Refused("file_type");
                };
                declared_type = Some(value);
            }
            "file" => {
                // The service takes `base_name` of it (private; not reproduced).
                let Some(file_name) = field.file_name().map(str::to_owned) else {
                    return Outcome::Refused("file");
                };
                let mime = declared_type
                    .clone()
                    .or_else(|| field.content_type().map(|m| m.to_string()))
                    .unwrap_or_default();
                let Some(file_type) = file_types::allowed(&mime) else {
                    return Outcome::Refused("file_type");
                };
                let mut file = Vec::new();
                loop {
                    match field.chunk().await {
                        Ok(Some(chunk)) => file.extend_from_slice(&chunk),
                        Ok(None) => break,
                        Err(_) => return Outcome::Refused("file"),
                    }
                }
                let _ = file_type.matches(&file[..file.len().min(HEAD_BYTES)]);
                return Outcome::Stored {
                    session_id,
                    declared_type,
                    file_name,
                    mime,
                    file,
                    skipped,
                };
            }
            _ => {
                // Skipped unread (the parser drains it), but only a few.
                skipped += 1;
                if skipped > MAX_SKIPPED_FIELDS {
                    return Outcome::Refused("file");
                }
            }
        }
    }
}

#[derive(Debug, PartialEq)]
struct Parsed {
    name: Option<String>,
    file_name: Option<String>,
    content_type: Option<String>,
    headers: usize,
    data: Vec<u8>,
}

/// Every field, read whole, and whether the parser ended with an error.
async fn all_fields(mut form: Multipart<'static>) -> (Vec<Parsed>, bool) {
    let mut fields = Vec::new();
    loop {
        let mut field = match form.next_field().await {
            Ok(Some(field)) => field,
            Ok(None) => return (fields, false),
            Err(_) => return (fields, true),
        };
        let mut parsed = Parsed {
            name: field.name().map(str::to_owned),
            file_name: field.file_name().map(str::to_owned),
            content_type: field.content_type().map(|m| m.to_string()),
            headers: field.headers().len(),
            data: Vec::new(),
        };
        loop {
            match field.chunk().await {
                Ok(Some(chunk)) => parsed.data.extend_from_slice(&chunk),
                Ok(None) => break,
                Err(_) => {
                    fields.push(parsed);
                    return (fields, true);
                }
            }
        }
        fields.push(parsed);
    }
}
