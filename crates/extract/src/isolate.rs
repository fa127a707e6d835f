//! Extraction in a disposable process: the wire format between the worker and the
//! `switchboard-extract` helper binary, and the helper's side of it.
//!
//! Why a process: the parsers this crate drives (lopdf, image, zip) cannot be
//! interrupted, and some of them turn a small hostile file into gigabytes (lopdf expands
//! object streams and whole arrays into `Object`s while loading). The in-crate bounds
//! (text, image and decompression caps, the cooperative deadline) cover what the crate
//! controls; a process covers the rest: the worker kills it at its deadline, and it runs
//! under an address-space limit it sets on itself before reading the file (`RLIMIT_AS`,
//! plus `RLIMIT_CPU` and the parent-death signal in case the worker itself dies). A file
//! that would need more simply ends that process, never the worker.
//!
//! One helper process reads one request from its standard input and writes one reply to
//! its standard output:
//!
//! - request: `SBX1`, the MIME type and file name (each a u64 length, then UTF-8), the
//!   [`Limits`] (eight u64s), the memory limit in bytes (0: none), the file's size, then
//!   exactly that many bytes of file;
//! - reply: `SBX1`, a tag (0 text, 1 image, 2 unsupported, 3 error), its fields (strings
//!   as above, `truncated` as one byte), then the helper's peak RSS in KiB (u64).
//!
//! Integers are little-endian. The helper is built from this crate, so both sides always
//! agree; the magic catches a stale binary from another build.

use std::io::{self, Read, Write};
use std::time::Duration;

use crate::{ExtractError, Extracted, Limits};

/// File name of the helper binary (built from this crate's `src/main.rs`).
pub const HELPER: &str = "switchboard-extract";

const MAGIC: &[u8; 4] = b"SBX1";

/// Longest MIME type or file name accepted in a request.
const MAX_NAME_BYTES: u64 = 64 * 1024;

/// Why a request or reply could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Reading or writing the pipe failed (the other side went away).
    #[error("the extraction pipe broke: {0}")]
    Io(#[from] io::Error),
    /// The bytes are not a message of this format (a stale or foreign helper binary).
    #[error("malformed extraction message: {0}")]
    Malformed(&'static str),
}

/// What the worker asks the helper to extract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The file's declared MIME type.
    pub mime_type: String,
    /// The file's name (its extension is a fallback for the type).
    pub file_name: String,
    /// The bounds of the extraction itself.
    pub limits: Limits,
    /// Address space the helper allows itself before reading the file (`RLIMIT_AS`);
    /// 0 sets none.
    pub memory_bytes: u64,
    /// Bytes of file that follow the header.
    pub size: u64,
}

fn put_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(&n.to_le_bytes());
}

fn put_usize(out: &mut Vec<u8>, n: usize) {
    put_u64(out, u64::try_from(n).unwrap_or(u64::MAX));
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_usize(out, s.len());
    out.extend_from_slice(s.as_bytes());
}

fn get_u64(r: &mut impl Read) -> Result<u64, WireError> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn get_usize(r: &mut impl Read) -> Result<usize, WireError> {
    usize::try_from(get_u64(r)?).map_err(|_| WireError::Malformed("number out of range"))
}

fn get_string(r: &mut impl Read, max: u64) -> Result<String, WireError> {
    let len = get_u64(r)?;
    if len > max {
        return Err(WireError::Malformed("string too long"));
    }
    let mut bytes = Vec::new();
    r.take(len).read_to_end(&mut bytes)?;
    if u64::try_from(bytes.len()).ok() != Some(len) {
        return Err(WireError::Malformed("message cut short"));
    }
    String::from_utf8(bytes).map_err(|_| WireError::Malformed("string is not UTF-8"))
}

fn get_magic(r: &mut impl Read) -> Result<(), WireError> {
    let mut magic = [0u8; 4];
    r.read_exact(&mut magic)?;
    if &magic == MAGIC {
        Ok(())
    } else {
        Err(WireError::Malformed(
            "bad magic (a helper from another build?)",
        ))
    }
}

impl Request {
    /// The request's header; the file's `size` bytes follow it on the pipe.
    pub fn header(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        put_str(&mut out, &self.mime_type);
        put_str(&mut out, &self.file_name);
        let l = &self.limits;
        put_usize(&mut out, l.max_input_bytes);
        put_usize(&mut out, l.max_text_chars);
        put_usize(&mut out, l.max_image_bytes);
        put_u64(&mut out, l.max_image_pixels);
        put_u64(&mut out, l.max_decoded_image_bytes);
        put_usize(&mut out, l.max_decompressed_bytes);
        put_usize(&mut out, l.max_zip_entries);
        put_u64(
            &mut out,
            u64::try_from(l.timeout.as_millis()).unwrap_or(u64::MAX),
        );
        put_u64(&mut out, self.memory_bytes);
        put_u64(&mut out, self.size);
        out
    }

    /// Reads a request's header (not the file).
    pub fn read_header(r: &mut impl Read) -> Result<Self, WireError> {
        get_magic(r)?;
        let mime_type = get_string(r, MAX_NAME_BYTES)?;
        let file_name = get_string(r, MAX_NAME_BYTES)?;
        let limits = Limits {
            max_input_bytes: get_usize(r)?,
            max_text_chars: get_usize(r)?,
            max_image_bytes: get_usize(r)?,
            max_image_pixels: get_u64(r)?,
            max_decoded_image_bytes: get_u64(r)?,
            max_decompressed_bytes: get_usize(r)?,
            max_zip_entries: get_usize(r)?,
            timeout: Duration::from_millis(get_u64(r)?),
        };
        Ok(Self {
            mime_type,
            file_name,
            limits,
            memory_bytes: get_u64(r)?,
            size: get_u64(r)?,
        })
    }
}

/// What the helper answers: the extraction's result (an error as the sentence users
/// see) and the helper's peak RSS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The content, or why there is none.
    pub result: Result<Extracted, String>,
    /// The helper's peak resident memory (`VmHWM`), KiB; 0 when unknown.
    pub peak_rss_kib: u64,
}

impl Reply {
    /// The reply as bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        match &self.result {
            Ok(Extracted::Text { text, truncated }) => {
                out.push(0);
                out.push(u8::from(*truncated));
                put_str(&mut out, text);
            }
            Ok(Extracted::Image {
                mime_type,
                data_base64,
            }) => {
                out.push(1);
                put_str(&mut out, mime_type);
                put_str(&mut out, data_base64);
            }
            Ok(Extracted::Unsupported { reason }) => {
                out.push(2);
                put_str(&mut out, reason);
            }
            Err(reason) => {
                out.push(3);
                put_str(&mut out, reason);
            }
        }
        put_u64(&mut out, self.peak_rss_kib);
        out
    }

    /// Reads a reply.
    pub fn decode(mut bytes: &[u8]) -> Result<Self, WireError> {
        let r = &mut bytes;
        get_magic(r)?;
        let mut tag = [0u8; 1];
        r.read_exact(&mut tag)?;
        let max = u64::MAX;
        let result = match tag[0] {
            0 => {
                let mut truncated = [0u8; 1];
                r.read_exact(&mut truncated)?;
                Ok(Extracted::Text {
                    truncated: truncated[0] != 0,
                    text: get_string(r, max)?,
                })
            }
            1 => Ok(Extracted::Image {
                mime_type: get_string(r, MAX_NAME_BYTES)?,
                data_base64: get_string(r, max)?,
            }),
            2 => Ok(Extracted::Unsupported {
                reason: get_string(r, max)?,
            }),
            3 => Err(get_string(r, max)?),
            _ => return Err(WireError::Malformed("unknown reply tag")),
        };
        let peak_rss_kib = get_u64(r)?;
        if !r.is_empty() {
            return Err(WireError::Malformed("bytes after the reply"));
        }
        Ok(Self {
            result,
            peak_rss_kib,
        })
    }

    /// The most bytes a reply under `limits` can take: the text at 4 bytes a character
    /// or the image in base64, plus the framing and a reason.
    pub fn max_len(limits: &Limits) -> usize {
        let text = limits.max_text_chars.saturating_mul(4);
        let image = limits.max_image_bytes.div_ceil(3).saturating_mul(4);
        text.max(image).saturating_add(64 * 1024)
    }
}

/// This process's peak resident memory (`VmHWM` of `/proc/self/status`), KiB.
pub fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The helper's side: reads one request from `input`, calls `confine` with it (to set
/// the process limits it asks for before the file is read), extracts the file and
/// writes the reply to `output`.
pub fn serve(
    input: &mut impl Read,
    output: &mut impl Write,
    confine: impl FnOnce(&Request) -> io::Result<()>,
) -> Result<(), WireError> {
    let request = Request::read_header(input)?;
    confine(&request)?;
    let result = if request.size > u64::try_from(request.limits.max_input_bytes).unwrap_or(0) {
        // Refused before reading: the worker stops sending when the pipe closes.
        Err(ExtractError::TooLarge {
            what: "the file",
            size: usize::try_from(request.size).unwrap_or(usize::MAX),
            limit: request.limits.max_input_bytes,
        }
        .to_string())
    } else {
        let size = usize::try_from(request.size)
            .map_err(|_| WireError::Malformed("file size out of range"))?;
        let mut bytes = Vec::with_capacity(size);
        input.take(request.size).read_to_end(&mut bytes)?;
        if bytes.len() != size {
            return Err(WireError::Malformed("the file was cut short"));
        }
        crate::extract(
            &request.mime_type,
            &request.file_name,
            &bytes,
            &request.limits,
        )
        .map_err(|e| e.to_string())
    };
    let reply = Reply {
        result,
        peak_rss_kib: peak_rss_kib().unwrap_or(0),
    };
    output.write_all(&reply.encode())?;
    output.flush()?;
    Ok(())
}
