//! The multipart form of a server upload, its framing bounded before the parser holds it.
//!
//! multer (behind axum's `Multipart`) keeps every byte of a part's header section until the
//! blank line that ends it, and searches its whole buffer again at every chunk: a part whose
//! headers never end would be held up to the 100 MB body limit and scanned quadratically, and
//! the preamble before the first boundary likewise. [`BoundedForm`] reads the body through an
//! [`Envelope`], which follows the framing exactly as multer does (the first `--boundary`, then
//! for each part `--` for the end, or transport padding, CRLF, header lines up to CRLF CRLF,
//! data up to CRLF `--boundary`), and refuses the request once any stretch that is not part data
//! (the preamble, or one part's header section) passes its limit
//! (`SB_ATTACHMENTS_MAX_PART_HEADER_BYTES`, [`DEFAULT_PART_HEADER_BYTES`] unset). Part data is
//! bounded where it is read: the file by the size limit, text fields by their own. The refusal
//! (413, [`FramingTooLong`]) comes while the client is still sending: the handler answers and
//! the connection is closed without reading the rest of the body.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::body::Body;
use axum::extract::multipart::{Field, MultipartError};
use axum::extract::{FromRef, FromRequest, Multipart, Request};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use platform::http::ErrorResponse;
use protocol::ErrorCode;

/// Most bytes of one part's header section (from the boundary line to the blank line that ends
/// the headers), and of the preamble before the first boundary, by default
/// (`SB_ATTACHMENTS_MAX_PART_HEADER_BYTES`, [`crate::Limits`]).
pub(crate) const DEFAULT_PART_HEADER_BYTES: usize = 16 * 1024;

/// A stretch of multipart framing longer than the limit it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "a multipart part's headers (or the preamble before the first part) are longer than {0} bytes"
)]
pub(crate) struct FramingTooLong(pub(crate) usize);

/// A substring matcher fed one byte at a time (Knuth-Morris-Pratt), so that a needle split
/// across chunks is found and nothing is buffered.
struct Needle {
    bytes: Vec<u8>,
    /// For each prefix length, the longest proper prefix of the needle that is also its suffix.
    fail: Vec<usize>,
}

impl Needle {
    fn new(bytes: Vec<u8>) -> Self {
        let mut fail = vec![0; bytes.len()];
        let mut k = 0;
        for (i, &byte) in bytes.iter().enumerate().skip(1) {
            while k > 0 && bytes.get(k) != Some(&byte) {
                k = fail.get(k - 1).copied().unwrap_or(0);
            }
            if bytes.get(k) == Some(&byte) {
                k += 1;
            }
            if let Some(slot) = fail.get_mut(i) {
                *slot = k;
            }
        }
        Self { bytes, fail }
    }

    /// Advances `matched` (how much of the needle the latest bytes are) by `byte`; true when
    /// the whole needle was just seen (`matched` then starts over).
    fn step(&self, matched: &mut usize, byte: u8) -> bool {
        while *matched > 0 && self.bytes.get(*matched) != Some(&byte) {
            *matched = self.fail.get(*matched - 1).copied().unwrap_or(0);
        }
        if self.bytes.get(*matched) == Some(&byte) {
            *matched += 1;
        }
        if *matched == self.bytes.len() {
            *matched = 0;
            true
        } else {
            false
        }
    }
}

/// Where in the form the next byte is (multer's stages, in the same order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Before the first `--boundary` (multer finds it anywhere).
    Preamble,
    /// Just after a boundary: `--` ends the form, anything else begins a part.
    AfterBoundary,
    /// One `-` after a boundary.
    Dash,
    /// Transport padding (spaces and tabs) before the CRLF that begins the headers.
    Padding,
    /// The CR of that CRLF.
    Lf,
    /// The header lines, up to the blank line (CRLF CRLF).
    Headers,
    /// The part's data, up to CRLF `--boundary`.
    Data,
    /// Framing multer is about to refuse: counted like headers meanwhile.
    Broken,
    /// After the closing boundary, which multer reads no further than.
    Done,
}

/// Follows the framing of a `multipart/form-data` body chunk by chunk (see the module doc).
pub(crate) struct Envelope {
    /// `--boundary`: the first boundary.
    first: Needle,
    /// CRLF `--boundary`: the end of a part's data.
    delimiter: Needle,
    /// CRLF CRLF: the end of a part's headers.
    blank_line: Needle,
    stage: Stage,
    /// Progress of the needle the stage looks for.
    matched: usize,
    /// Bytes of the current stretch of framing.
    framing: usize,
    limit: usize,
}

impl Envelope {
    /// The framing of a form with `boundary`, stretches of at most `limit` bytes.
    pub(crate) fn new(boundary: &str, limit: usize) -> Self {
        let first = format!("--{boundary}").into_bytes();
        let delimiter = [b"\r\n".as_slice(), &first].concat();
        Self {
            first: Needle::new(first),
            delimiter: Needle::new(delimiter),
            blank_line: Needle::new(b"\r\n\r\n".to_vec()),
            stage: Stage::Preamble,
            matched: 0,
            framing: 0,
            limit,
        }
    }

    /// Follows `chunk`, the next bytes of the body.
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Result<(), FramingTooLong> {
        let mut rest = chunk;
        while let Some((&byte, after)) = rest.split_first() {
            match self.stage {
                Stage::Done => return Ok(()),
                Stage::Data => {
                    if self.matched == 0 {
                        // No delimiter begins before the next CR: skip to it.
                        match rest.iter().position(|&b| b == b'\r') {
                            Some(0) => {}
                            Some(at) => {
                                rest = rest.get(at..).unwrap_or_default();
                                continue;
                            }
                            None => return Ok(()),
                        }
                    }
                    if self.delimiter.step(&mut self.matched, byte) {
                        self.stage = Stage::AfterBoundary;
                        self.framing = 0;
                    }
                }
                stage => {
                    self.framing += 1;
                    if self.framing > self.limit {
                        return Err(FramingTooLong(self.limit));
                    }
                    self.stage = self.after(stage, byte);
                }
            }
            rest = after;
        }
        Ok(())
    }

    /// The stage after `byte` in a stage of framing.
    fn after(&mut self, stage: Stage, byte: u8) -> Stage {
        let padding = |byte| match byte {
            b' ' | b'\t' => Stage::Padding,
            b'\r' => Stage::Lf,
            _ => Stage::Broken,
        };
        match stage {
            Stage::Preamble if self.first.step(&mut self.matched, byte) => {
                self.framing = 0;
                Stage::AfterBoundary
            }
            Stage::AfterBoundary if byte == b'-' => Stage::Dash,
            Stage::AfterBoundary | Stage::Padding => padding(byte),
            Stage::Dash if byte == b'-' => Stage::Done,
            Stage::Dash => Stage::Broken,
            Stage::Lf if byte == b'\n' => {
                self.matched = 0;
                Stage::Headers
            }
            Stage::Lf => Stage::Broken,
            Stage::Headers if self.blank_line.step(&mut self.matched, byte) => Stage::Data,
            other => other,
        }
    }
}

/// The `boundary` parameter of a `multipart/form-data` content type.
fn boundary(content_type: &str) -> Option<String> {
    let (essence, params) = content_type.split_once(';')?;
    if !essence.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params
        .split(';')
        .find_map(|param| {
            let (name, value) = param.split_once('=')?;
            name.trim()
                .eq_ignore_ascii_case("boundary")
                .then(|| value.trim().trim_matches('"').to_owned())
        })
        .filter(|boundary| !boundary.is_empty())
}

/// What the body's reader and the handler share.
#[derive(Debug)]
struct Shared {
    /// The most bytes of a stretch of framing.
    limit: usize,
    /// The framing was too long: the form's read error is [`FramingTooLong`].
    refused: AtomicBool,
    /// The handler reads no part after the current one: its data is not followed.
    last_part: AtomicBool,
}

/// A `multipart/form-data` request whose framing is bounded (see the module doc).
pub(crate) struct BoundedForm {
    form: Multipart,
    shared: Arc<Shared>,
}

/// How a read of the form failed.
#[derive(Debug)]
pub(crate) enum FormError {
    /// The framing was too long (413).
    TooLong(FramingTooLong),
    /// The body is not a well-formed form, or could not be read (400), in multer's words.
    Malformed(String),
}

/// Reads failures of one form, telling a refused framing from other errors.
#[derive(Clone)]
pub(crate) struct FormErrors(Arc<Shared>);

impl FormErrors {
    /// What `err`, from reading the form, means.
    pub(crate) fn of(&self, err: &MultipartError) -> FormError {
        if self.0.refused.load(Ordering::Acquire) {
            FormError::TooLong(FramingTooLong(self.0.limit))
        } else {
            FormError::Malformed(err.body_text())
        }
    }

    /// Says that no part is read after the current one, so its data (the file, up to 100 MB)
    /// need not be followed byte by byte: multer buffers none of it.
    pub(crate) fn last_part(&self) {
        self.0.last_part.store(true, Ordering::Release);
    }
}

impl BoundedForm {
    /// The next part, in order.
    pub(crate) async fn next_field(&mut self) -> Result<Option<Field<'_>>, FormError> {
        let errors = self.errors();
        self.form.next_field().await.map_err(|err| errors.of(&err))
    }

    /// How to read the failures of this form's parts.
    pub(crate) fn errors(&self) -> FormErrors {
        FormErrors(Arc::clone(&self.shared))
    }

    /// The form of a request body, its framing followed by an [`Envelope`] of `limit` bytes.
    pub(crate) async fn bounded(request: Request, limit: usize) -> Result<Self, Response> {
        let Some(boundary) = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .and_then(boundary)
        else {
            return Err(ErrorResponse::with_field(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidRequest,
                "the body must be multipart/form-data with a boundary",
                "file",
            )
            .into_response());
        };
        let shared = Arc::new(Shared {
            limit,
            refused: AtomicBool::new(false),
            last_part: AtomicBool::new(false),
        });
        let (parts, body) = request.into_parts();
        let mut envelope = Envelope::new(&boundary, limit);
        let reader = Arc::clone(&shared);
        let body = body.into_data_stream().map(move |chunk| {
            let chunk = chunk?;
            if !reader.last_part.load(Ordering::Acquire)
                && let Err(refused) = envelope.feed(&chunk)
            {
                reader.refused.store(true, Ordering::Release);
                return Err(axum::Error::new(refused));
            }
            Ok(chunk)
        });
        let request = Request::from_parts(parts, Body::from_stream(body));
        let form = Multipart::from_request(request, &())
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Self { form, shared })
    }
}

/// The limit of a [`BoundedForm`]'s stretches of framing, from the service's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PartHeaderLimit(pub(crate) usize);

impl<S> FromRequest<S> for BoundedForm
where
    S: Send + Sync,
    PartHeaderLimit: FromRef<S>,
{
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let PartHeaderLimit(limit) = PartHeaderLimit::from_ref(state);
        Self::bounded(request, limit).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A form as browsers and reqwest send it: text fields, then a file whose bytes hold every
    /// near-miss of the framing (CRs, CRLFs, blank lines, `--`, the boundary without its CRLF).
    fn form(boundary: &str) -> Vec<u8> {
        let mut file = b"%PDF-1.7\r\n\r\n--\r\n-".to_vec();
        file.extend_from_slice(format!("x--{boundary}\r--{boundary}\n--{boundary}").as_bytes());
        file.extend((0..5000u32).map(|i| [b'\r', b'\n', b'-', b'a'][(i % 7 % 4) as usize]));
        let mut body = Vec::new();
        for (name, value) in [("session_id", "thread-1"), ("file_type", "application/pdf")] {
            body.extend_from_slice(
                format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n")
                    .as_bytes(),
            );
        }
        body.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.pdf\"\r\nContent-Type: application/pdf\r\n\r\n")
                .as_bytes(),
        );
        body.extend_from_slice(&file);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        body
    }

    fn follow(body: &[u8], chunk: usize, limit: usize) -> (Result<(), FramingTooLong>, Stage) {
        let mut envelope = Envelope::new("B-o-u-n-d", limit);
        let fed = body.chunks(chunk).try_for_each(|c| envelope.feed(c));
        (fed, envelope.stage)
    }

    #[test]
    fn a_well_formed_form_passes_however_it_is_split() {
        let body = form("B-o-u-n-d");
        for chunk in [1, 2, 3, 7, 64, 4096, body.len()] {
            assert_eq!(follow(&body, chunk, 200), (Ok(()), Stage::Done), "{chunk}");
        }
    }

    #[test]
    fn headers_or_a_preamble_longer_than_the_limit_are_refused_however_they_are_split() {
        let long = format!(
            "--B-o-u-n-d\r\nContent-Disposition: form-data; name=\"file\"\r\nX-Pad: {}",
            "a".repeat(300)
        );
        let preamble = "p".repeat(300) + "--B-o-u-n-d\r\n\r\n";
        for chunk in [1, 5, 64, 4096] {
            for body in [long.as_bytes(), preamble.as_bytes()] {
                assert_eq!(
                    follow(body, chunk, 200).0,
                    Err(FramingTooLong(200)),
                    "{chunk}"
                );
            }
        }
        // Just within the limit: the boundary line, the header and the blank line.
        let header = "X: ".to_owned() + &"a".repeat(200 - 2 - 3 - 4);
        let fits = format!("--B-o-u-n-d\r\n{header}\r\n\r\ndata\r\n--B-o-u-n-d--");
        assert_eq!(follow(fits.as_bytes(), 3, 200), (Ok(()), Stage::Done));
        let over = format!("--B-o-u-n-d\r\n{header}a\r\n\r\ndata");
        assert_eq!(follow(over.as_bytes(), 3, 200).0, Err(FramingTooLong(200)));
    }

    #[test]
    fn each_part_has_its_own_budget_and_data_has_none() {
        let part = |i: usize| {
            format!(
                "--B-o-u-n-d\r\nContent-Disposition: form-data; name=\"f{i}\"\r\n\r\n{}\r\n",
                "d".repeat(10_000)
            )
        };
        let body: String = (0..20).map(part).collect::<String>() + "--B-o-u-n-d--\r\n";
        assert_eq!(follow(body.as_bytes(), 100, 200), (Ok(()), Stage::Done));
    }

    #[test]
    fn framing_multer_refuses_is_counted_not_skipped() {
        // A part without the CRLF after its boundary line: multer fails it; meanwhile its
        // bytes count.
        let body = format!("--B-o-u-n-d{}", "x".repeat(300));
        assert_eq!(follow(body.as_bytes(), 16, 200).0, Err(FramingTooLong(200)));
    }

    /// A request of the form [`form`] makes, after a preamble of `preamble` bytes.
    fn request_after_preamble(preamble: usize) -> Request {
        let mut body = vec![b'p'; preamble];
        body.extend(form("B-o-u-n-d"));
        axum::http::Request::builder()
            .header("content-type", "multipart/form-data; boundary=B-o-u-n-d")
            .body(Body::from(body))
            .unwrap()
    }

    #[tokio::test]
    async fn the_extractor_bounds_the_framing_by_the_limit_of_the_state() {
        let mut form =
            BoundedForm::from_request(request_after_preamble(1500), &PartHeaderLimit(1024))
                .await
                .unwrap_or_else(|_| panic!("a multipart request"));
        let refused = form.next_field().await.map(|field| field.is_some());
        assert!(
            matches!(refused, Err(FormError::TooLong(FramingTooLong(1024)))),
            "{refused:?}"
        );
        let mut form =
            BoundedForm::from_request(request_after_preamble(1500), &PartHeaderLimit(2048))
                .await
                .unwrap_or_else(|_| panic!("a multipart request"));
        let field = form.next_field().await.unwrap().expect("the first part");
        assert_eq!(field.name(), Some("session_id"));
    }

    #[test]
    fn the_refusal_names_the_limit() {
        assert_eq!(
            FramingTooLong(4096).to_string(),
            "a multipart part's headers (or the preamble before the first part) are longer than 4096 bytes"
        );
    }

    #[test]
    fn the_boundary_is_read_from_the_content_type() {
        assert_eq!(
            boundary("multipart/form-data; boundary=----WebKitFormBoundaryx7"),
            Some("----WebKitFormBoundaryx7".to_owned())
        );
        assert_eq!(
            boundary("Multipart/Form-Data;charset=utf-8; BOUNDARY=\"a b\""),
            Some("a b".to_owned())
        );
        for bad in [
            "multipart/form-data",
            "multipart/form-data; boundary=",
            "multipart/mixed; boundary=x",
            "application/json",
        ] {
            assert_eq!(boundary(bad), None, "{bad}");
        }
    }
}
