//! An event stream read straight from its socket, for measuring clients that must cost less than
//! the service they measure: the `GET` written by hand, the answer's head parsed with `httparse`,
//! its chunked body decoded here and its frames parsed with `protocol::sse` (as [`SseReader`]
//! does). One task and one socket per stream, nothing else: a `reqwest` stream is two tasks (the
//! connection's and the reader's) and hyper's buffers, which on two shared cores is most of what
//! a fan-out to 10,000 streams measures.
//!
//! [`SseReader`]: super::SseReader

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::{Bench, Frame, Run, frames};

/// The runs service's address and a `GET` of `run`'s event stream, as a client sends it.
pub async fn events_request(bench: &Bench, run: &Run) -> anyhow::Result<(SocketAddr, String)> {
    stream_request(bench, &format!("/api/v1/agent/runs/{}/events", run.run_id)).await
}

/// [`events_request`] for the stream of `run`'s thread.
pub async fn thread_request(bench: &Bench, run: &Run) -> anyhow::Result<(SocketAddr, String)> {
    stream_request(
        bench,
        &format!("/api/v1/agent/threads/{}/events", run.thread_id),
    )
    .await
}

/// The runs service's address and a `GET` of the event stream at `path`.
async fn stream_request(bench: &Bench, path: &str) -> anyhow::Result<(SocketAddr, String)> {
    let authority = bench
        .base_url
        .strip_prefix("http://")
        .context("the runs URL is not http://")?;
    let address = tokio::net::lookup_host(authority)
        .await?
        .next()
        .context("the runs URL has no address")?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nAuthorization: Bearer {}\r\nAccept: \
         text/event-stream\r\n\r\n",
        bench.token
    );
    Ok((address, request))
}

/// A `200` event stream with a chunked body, read from its socket.
pub struct RawSse {
    socket: TcpStream,
    chunked: Chunked,
    parser: protocol::sse::SseParser,
    /// Body bytes that came with the head.
    early: Vec<u8>,
}

impl RawSse {
    /// Sends the request and reads the answer's head (within 30 s); anything but a `200` with a
    /// chunked body is an error naming the status.
    pub async fn open(address: SocketAddr, request: &str) -> anyhow::Result<Self> {
        let mut socket = TcpStream::connect(address).await?;
        socket.set_nodelay(true)?;
        socket.write_all(request.as_bytes()).await?;
        let mut head = Vec::with_capacity(512);
        let mut buffer = [0_u8; 1024];
        let (status, chunked, length) = loop {
            let n = tokio::time::timeout(Duration::from_secs(30), socket.read(&mut buffer))
                .await
                .context("no response head within 30 s")??;
            anyhow::ensure!(n > 0, "the server closed the connection before its answer");
            head.extend_from_slice(&buffer[..n]);
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut response = httparse::Response::new(&mut headers);
            match response.parse(&head).context("malformed response head")? {
                httparse::Status::Complete(length) => {
                    let chunked = response.headers.iter().any(|h| {
                        h.name.eq_ignore_ascii_case("transfer-encoding")
                            && h.value.eq_ignore_ascii_case(b"chunked")
                    });
                    break (response.code.unwrap_or(0), chunked, length);
                }
                httparse::Status::Partial => {
                    anyhow::ensure!(head.len() < 16 * 1024, "response head over 16 KiB");
                }
            }
        };
        let early = head.split_off(length);
        if status != 200 {
            anyhow::bail!(
                "GET events answered {status}: {}",
                String::from_utf8_lossy(&early)
            );
        }
        anyhow::ensure!(chunked, "the event stream's body is not chunked");
        Ok(Self {
            socket,
            chunked: Chunked::default(),
            parser: protocol::sse::SseParser::new(),
            early,
        })
    }

    /// The frames completed by the next read and the instant it returned; `None` after the last
    /// chunk. A connection closed before the last chunk is an error.
    pub async fn next(&mut self) -> anyhow::Result<Option<(Instant, Vec<Frame>)>> {
        if self.chunked.state == State::Done {
            return Ok(None);
        }
        let mut body = Vec::new();
        let at = if self.early.is_empty() {
            let mut buffer = [0_u8; 2048];
            let n = self.socket.read(&mut buffer).await?;
            let at = Instant::now();
            anyhow::ensure!(n > 0, "the stream was cut before its last chunk");
            self.chunked.feed(&buffer[..n], &mut body)?;
            at
        } else {
            let early = std::mem::take(&mut self.early);
            self.chunked.feed(&early, &mut body)?;
            Instant::now()
        };
        Ok(Some((at, frames(self.parser.push(&body)?))))
    }
}

/// Where a chunked body's decoder is.
#[derive(Debug, Default, PartialEq, Eq)]
enum State {
    /// In a chunk's size (hex digits).
    #[default]
    Size,
    /// In a chunk extension, up to the size line's CR.
    Extension,
    /// After the size line's CR.
    SizeLf,
    /// In a chunk's data.
    Data,
    /// After a chunk's data: its CR, then its LF.
    DataCr,
    DataLf,
    /// After the last chunk's size line: the body's final CRLF (no trailers).
    LastCr,
    LastLf,
    Done,
}

/// An incremental decoder of a chunked body (RFC 9112, 7.1), without trailers.
#[derive(Debug, Default)]
struct Chunked {
    state: State,
    /// The current chunk's size, then what is left of it.
    size: usize,
}

impl Chunked {
    /// Decodes `input`, appending the body's bytes to `out`.
    fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> anyhow::Result<()> {
        while let Some((&byte, rest)) = input.split_first() {
            if self.state == State::Data {
                let n = self.size.min(input.len());
                out.extend_from_slice(&input[..n]);
                input = &input[n..];
                self.size -= n;
                if self.size == 0 {
                    self.state = State::DataCr;
                }
                continue;
            }
            input = rest;
            self.state = match (&self.state, byte) {
                (State::Size, b'\r') => State::SizeLf,
                (State::Size, b';') => State::Extension,
                (State::Size, digit) => {
                    let value = char::from(digit)
                        .to_digit(16)
                        .context("a chunk size that is not hex")?;
                    self.size = self
                        .size
                        .checked_mul(16)
                        .and_then(|size| size.checked_add(value as usize))
                        .context("a chunk size too large")?;
                    State::Size
                }
                (State::Extension, b'\r') => State::SizeLf,
                (State::Extension, _) => State::Extension,
                (State::SizeLf, b'\n') if self.size == 0 => State::LastCr,
                (State::SizeLf, b'\n') => State::Data,
                (State::DataCr, b'\r') => State::DataLf,
                (State::DataLf, b'\n') => State::Size,
                (State::LastCr, b'\r') => State::LastLf,
                (State::LastLf, b'\n') => State::Done,
                (State::Done, _) => anyhow::bail!("bytes after the last chunk"),
                (state, byte) => anyhow::bail!("chunked body: byte {byte:#04x} in {state:?}"),
            };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunked_body_split_anywhere_decodes_to_its_bytes() {
        let body = b"5;ext=1\r\nhello\r\n10\r\n, chunked world!\r\n0\r\n\r\n";
        for split in 0..body.len() {
            let mut chunked = Chunked::default();
            let mut out = Vec::new();
            chunked.feed(&body[..split], &mut out).unwrap();
            chunked.feed(&body[split..], &mut out).unwrap();
            assert_eq!(out, b"hello, chunked world!", "split at {split}");
            assert_eq!(chunked.state, State::Done);
        }
    }

    #[test]
    fn bytes_out_of_place_are_errors() {
        for body in [&b"x\r\n"[..], b"2\r\nabX", b"0\r\n\r\nmore", b"2\n"] {
            let mut chunked = Chunked::default();
            assert!(chunked.feed(body, &mut Vec::new()).is_err(), "{body:?}");
        }
    }
}
