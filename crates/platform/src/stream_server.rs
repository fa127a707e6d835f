//! Event streams served without hyper's per-connection buffers.
//!
//! hyper keeps a read buffer (8-16 KB) and a write buffer (8 KB) for as long as an HTTP/1.1
//! connection lives, so an idle event stream held ~20 KiB in hyper alone (BENCHMARKS.md section
//! 19). A connection whose first request asks for an event stream (see [`stream_request`]) is
//! answered here instead:
//! - the request goes through the same router as every other (authentication, limits, tracing,
//!   metrics: nothing is skipped);
//! - the answer is written straight to the socket: the head once, then each body frame as it
//!   comes (chunked), and the connection closes at its end (`connection: close`);
//! - nothing is buffered between events, and a client that closes is noticed by the socket's
//!   readiness, without a read buffer.
//!
//! Every other connection (any other first request, or one this does not fully understand) goes
//! to hyper unchanged, with the bytes read so far put back in front of the socket ([`Rewind`]).

use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::{Body, HttpBody as _};
use axum::http::{HeaderName, HeaderValue, Method, Request, StatusCode, Version, header};
use bytes::{Buf as _, Bytes};
use futures::FutureExt as _;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

/// How many bytes of a connection's first request are read to sort it: a request head that does
/// not fit is hyper's to read (with the bytes put back).
const FIRST_READ: usize = 4096;
/// The most headers a stream request may carry here (more: hyper's).
const MAX_HEADERS: usize = 48;

/// The listener `axum::serve` accepts from: the connections that are not event streams, each
/// with what was read of it put back.
pub(crate) struct Sorted {
    connections: mpsc::Receiver<(Rewind, SocketAddr)>,
    local: SocketAddr,
    accepting: tokio::task::AbortHandle,
}

impl Drop for Sorted {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for Sorted {
    type Io = Rewind;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Rewind, SocketAddr) {
        match self.connections.recv().await {
            Some(connection) => connection,
            // The accepting task ended (only when this is dropped): nothing more to accept.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// Accepts from `listener`, answers the connections whose first request is an event stream with
/// `app` (each in a task of `streams`), and hands the others on through the returned listener.
/// A connection still waiting for its first request when `shutdown` is cancelled is closed.
pub(crate) fn sort(
    listener: TcpListener,
    app: Router,
    streams: TaskTracker,
    shutdown: CancellationToken,
) -> io::Result<Sorted> {
    let local = listener.local_addr()?;
    let (hand_on, connections) = mpsc::channel(64);
    let accepting = tokio::spawn(async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(err) => {
                    accept_failed(err).await;
                    continue;
                }
            };
            crate::http::no_delay(&tcp);
            let (app, hand_on, shutdown) = (app.clone(), hand_on.clone(), shutdown.clone());
            streams.spawn(async move {
                // Only the wait for the first request is cut short by `shutdown`: a stream being
                // answered ends as its body does (the router's bodies end on shutdown).
                let first = tokio::select! {
                    first = first_request(tcp) => first,
                    () = shutdown.cancelled() => return,
                };
                match first {
                    First::Stream(tcp, request) => answer_stream(tcp, app, request).await,
                    // Refused only once the server stopped accepting: the connection closes.
                    First::Other(io) => {
                        let _ = hand_on.send((io, peer)).await;
                    }
                    First::Closed => {}
                }
            });
        }
    })
    .abort_handle();
    Ok(Sorted {
        connections,
        local,
        accepting,
    })
}

/// As axum's own listener: a connection that failed before it was accepted is skipped; running
/// out of file descriptors waits a moment instead of spinning.
async fn accept_failed(err: io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        err.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %err, "accepting a connection failed");
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
}

/// A connection's first request, sorted.
enum First {
    /// An event stream request, for [`answer_stream`] (boxed: the task that answers it keeps
    /// this value's place for as long as the stream lives).
    Stream(TcpStream, Box<Request<Body>>),
    /// Anything else, for hyper, with the bytes read put back.
    Other(Rewind),
    /// The client closed (or the socket failed) before sending anything.
    Closed,
}

/// Reads the connection's first bytes and sorts the request they hold.
async fn first_request(tcp: TcpStream) -> First {
    let read = loop {
        // No buffer is held while the client is silent.
        if tcp.readable().await.is_err() {
            return First::Closed;
        }
        let mut read = Vec::with_capacity(FIRST_READ);
        match tcp.try_read_buf(&mut read) {
            Ok(0) => return First::Closed,
            Ok(_) => break read,
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return First::Closed,
        }
    };
    match stream_request(&read) {
        Some(request) => First::Stream(tcp, Box::new(request)),
        None => First::Other(Rewind {
            prefix: Bytes::from(read),
            tcp,
        }),
    }
}

/// The request in `read` if it is a whole event stream request this module answers: a complete
/// HTTP/1.1 `GET` head and nothing after it, with an `Accept` naming `text/event-stream` and no
/// body, upgrade or expectation. `None` for everything else, which hyper then reads.
pub(crate) fn stream_request(read: &[u8]) -> Option<Request<Body>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut headers);
    let httparse::Status::Complete(head_len) = parsed.parse(read).ok()? else {
        return None;
    };
    if head_len != read.len() || parsed.method != Some("GET") || parsed.version != Some(1) {
        return None;
    }
    let mut request = Request::builder()
        .method(Method::GET)
        .uri(parsed.path?)
        .version(Version::HTTP_11);
    let mut wants_stream = false;
    for field in parsed.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes()).ok()?;
        if [
            header::CONTENT_LENGTH,
            header::TRANSFER_ENCODING,
            header::UPGRADE,
            header::EXPECT,
        ]
        .contains(&name)
        {
            return None;
        }
        let value = HeaderValue::from_bytes(field.value).ok()?;
        if name == header::ACCEPT && crate::http::names_event_stream(&value) {
            wants_stream = true;
        }
        request = request.header(name, value);
    }
    wants_stream
        .then(|| request.body(Body::empty()).ok())
        .flatten()
}

/// Answers `request` with `app` on `tcp`: the head, then the body's frames as they come, until the
/// body ends, fails, or the client closes. What is ready at once is written at once, in one
/// `writev`: the head with the first frames, a run's last event with the stream's end.
async fn answer_stream(mut tcp: TcpStream, app: Router, request: Box<Request<Body>>) {
    let Ok(response) = app.oneshot(*request).await;
    let (parts, mut body) = response.into_parts();
    let framing = Framing::of(parts.status, body.size_hint().exact());
    let mut head = Some(head(&parts, framing));
    // Not held while the stream waits: an idle stream keeps only its body and its socket.
    drop(parts);
    let mut batch = Batch::default();
    while !batch.ended {
        if head.is_none() {
            let frame = tokio::select! {
                frame = next_frame(&mut body) => frame,
                () = closed(&tcp) => return,
            };
            if batch.take(frame).is_err() {
                return;
            }
        }
        while !batch.ended && batch.frames.len() < BATCH_FRAMES {
            let Some(frame) = next_frame(&mut body).now_or_never() else {
                break;
            };
            if batch.take(frame).is_err() {
                return;
            }
        }
        if batch.write(&mut tcp, head.take(), framing).await.is_err() {
            return;
        }
    }
    // Dropped: the kernel sends what is left, then closes.
}

/// Most frames written in one `writev`.
const BATCH_FRAMES: usize = 16;

fn next_frame(
    body: &mut Body,
) -> impl std::future::Future<Output = Option<Result<http_body::Frame<Bytes>, axum::Error>>> + '_ {
    std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx))
}

/// The frames ready to be written together, and whether the body ended after them.
#[derive(Default)]
struct Batch {
    frames: Vec<Bytes>,
    ended: bool,
}

impl Batch {
    /// Takes a frame the body gave; `Err` when the body failed (the stream is then cut off
    /// without its last chunk, so the client sees it broken, not ended).
    fn take(
        &mut self,
        frame: Option<Result<http_body::Frame<Bytes>, axum::Error>>,
    ) -> Result<(), ()> {
        match frame {
            None => self.ended = true,
            Some(Ok(frame)) => {
                // Trailers and empty frames: nothing to send.
                if let Ok(data) = frame.into_data()
                    && !data.is_empty()
                {
                    self.frames.push(data);
                }
            }
            Some(Err(err)) => {
                tracing::debug!(error = %err, "an event stream's body failed");
                return Err(());
            }
        }
        Ok(())
    }

    /// Writes `head` (if any) and the frames in one `writev` (each a chunk when `framing` is
    /// chunked, with the last chunk after them once the body ended), and empties the batch.
    async fn write(
        &mut self,
        tcp: &mut TcpStream,
        head: Option<Vec<u8>>,
        framing: Framing,
    ) -> io::Result<()> {
        let chunked = framing == Framing::Chunked;
        let sizes: Vec<String> = if chunked {
            self.frames
                .iter()
                .map(|data| format!("{:x}\r\n", data.len()))
                .collect()
        } else {
            Vec::new()
        };
        let mut slices = Vec::with_capacity(2 + 3 * self.frames.len());
        if let Some(head) = &head {
            slices.push(IoSlice::new(head));
        }
        for (i, data) in self.frames.iter().enumerate() {
            if chunked {
                slices.push(IoSlice::new(sizes[i].as_bytes()));
            }
            slices.push(IoSlice::new(data));
            if chunked {
                slices.push(IoSlice::new(b"\r\n"));
            }
        }
        if chunked && self.ended {
            slices.push(IoSlice::new(b"0\r\n\r\n"));
        }
        let mut slices: &mut [IoSlice<'_>] = &mut slices;
        while !slices.is_empty() {
            let written = tcp.write_vectored(slices).await?;
            if written == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut slices, written);
        }
        // The next batch starts with no buffer: an idle stream holds none.
        self.frames = Vec::new();
        Ok(())
    }
}

/// How an answer's body is delimited.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Framing {
    /// `content-length` (the body's size is known).
    Length(u64),
    /// `transfer-encoding: chunked` (a stream).
    Chunked,
    /// No body (204, 304).
    Bodiless,
}

impl Framing {
    fn of(status: StatusCode, exact: Option<u64>) -> Self {
        if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
            Self::Bodiless
        } else if let Some(length) = exact {
            Self::Length(length)
        } else {
            Self::Chunked
        }
    }
}

/// The answer's head: its status line, its headers (less the ones about the connection and the
/// framing, which are this module's), `date`, the framing and `connection: close`.
fn head(parts: &axum::http::response::Parts, framing: Framing) -> Vec<u8> {
    let mut head = Vec::with_capacity(512);
    let status = parts.status;
    head.extend_from_slice(b"HTTP/1.1 ");
    head.extend_from_slice(status.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    head.extend_from_slice(b"\r\n");
    for (name, value) in &parts.headers {
        if [
            header::CONNECTION,
            header::TRANSFER_ENCODING,
            header::CONTENT_LENGTH,
        ]
        .contains(name)
            || name.as_str() == "keep-alive"
        {
            continue;
        }
        field(&mut head, name.as_str(), value.as_bytes());
    }
    if !parts.headers.contains_key(header::DATE) {
        let now = httpdate::fmt_http_date(std::time::SystemTime::now());
        field(&mut head, "date", now.as_bytes());
    }
    match framing {
        Framing::Chunked => field(&mut head, "transfer-encoding", b"chunked"),
        Framing::Length(length) => {
            field(&mut head, "content-length", length.to_string().as_bytes());
        }
        Framing::Bodiless => {}
    }
    field(&mut head, "connection", b"close");
    head.extend_from_slice(b"\r\n");
    head
}

fn field(head: &mut Vec<u8>, name: &str, value: &[u8]) {
    head.extend_from_slice(name.as_bytes());
    head.extend_from_slice(b": ");
    head.extend_from_slice(value);
    head.extend_from_slice(b"\r\n");
}

/// Resolves once the client has closed the connection (or sent anything more: a stream request is
/// the connection's only one, so more bytes end it too).
async fn closed(tcp: &TcpStream) {
    let mut probe = [0_u8; 64];
    loop {
        if tcp.readable().await.is_err() {
            return;
        }
        match tcp.try_read(&mut probe) {
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
            _ => return,
        }
    }
}

/// A connection handed to hyper, with the bytes read to sort it put back in front.
pub(crate) struct Rewind {
    prefix: Bytes,
    tcp: TcpStream,
}

impl AsyncRead for Rewind {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix[..n]);
            this.prefix.advance(n);
            if this.prefix.is_empty() {
                // Frees the first read's buffer (an emptied `Bytes` would keep it).
                this.prefix = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::time::Duration;

    use axum::response::sse::{Event, Sse};
    use axum::routing::{get, post};
    use futures::StreamExt as _;
    use tokio::io::AsyncReadExt as _;

    use super::*;

    const STREAM: &str = "GET /events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n";

    fn parses(request: &str) -> bool {
        stream_request(request.as_bytes()).is_some()
    }

    #[test]
    fn only_a_whole_plain_event_stream_get_is_taken_from_hyper() {
        assert!(parses(STREAM));
        assert!(parses(
            "GET /e?x=1 HTTP/1.1\r\nAccept: application/json, Text/Event-Stream;q=0.9\r\n\r\n"
        ));
        // Not a stream, not whole, not plain: hyper's.
        assert!(!parses(
            "GET /events HTTP/1.1\r\nAccept: application/json\r\n\r\n"
        ));
        assert!(!parses("GET /events HTTP/1.1\r\n\r\n"));
        assert!(!parses(&STREAM[..STREAM.len() - 2]));
        assert!(!parses(&format!("{STREAM}GET / HTTP/1.1\r\n\r\n")));
        assert!(!parses(&STREAM.replace("GET", "POST")));
        assert!(!parses(&STREAM.replace("HTTP/1.1", "HTTP/1.0")));
        for extra in [
            "Content-Length: 0",
            "Transfer-Encoding: chunked",
            "Upgrade: websocket",
            "Expect: 100-continue",
        ] {
            let request = STREAM.replace("Host: x", &format!("Host: x\r\n{extra}"));
            assert!(!parses(&request), "{extra}");
        }
        let crowded: String = (0..MAX_HEADERS).map(|i| format!("X-{i}: y\r\n")).collect();
        assert!(!parses(&STREAM.replace("Host: x\r\n", &crowded)));
    }

    #[test]
    fn the_request_taken_keeps_its_path_query_and_headers() {
        let request = stream_request(
            b"GET /a/b?c=d HTTP/1.1\r\nAuthorization: Bearer t\r\nAccept: text/event-stream\r\n\r\n",
        )
        .expect("a stream request");
        assert_eq!(request.uri(), "/a/b?c=d");
        assert_eq!(request.version(), Version::HTTP_11);
        assert_eq!(request.headers()["authorization"], "Bearer t");
    }

    /// A server of `router` through [`crate::http::serve_event_streams`], stopped by `shutdown`.
    struct Server {
        addr: SocketAddr,
        shutdown: CancellationToken,
        serving: tokio::task::JoinHandle<io::Result<()>>,
    }

    impl Server {
        async fn start(router: Router, shutdown: CancellationToken) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("address");
            let serving = tokio::spawn(crate::http::serve_event_streams(
                listener,
                router,
                shutdown.clone(),
            ));
            Self {
                addr,
                shutdown,
                serving,
            }
        }

        /// Cancels `shutdown` and waits for serving to return.
        async fn stop(self) {
            self.shutdown.cancel();
            tokio::time::timeout(Duration::from_secs(10), self.serving)
                .await
                .expect("serving returns")
                .expect("joined")
                .expect("served");
        }
    }

    /// The address of a server of `router` (stopped with the test's runtime).
    async fn server(router: Router) -> SocketAddr {
        Server::start(router, CancellationToken::new()).await.addr
    }

    /// A connection that asked for [`STREAM`] and read up to its first event (`data: hi`); what
    /// it read.
    async fn open_stream(addr: SocketAddr) -> (TcpStream, Vec<u8>) {
        let mut tcp = TcpStream::connect(addr).await.expect("connect");
        tcp.write_all(STREAM.as_bytes()).await.expect("write");
        let mut read = Vec::new();
        while !String::from_utf8_lossy(&read).contains("data: hi") {
            let mut buf = [0_u8; 1024];
            let n = tcp.read(&mut buf).await.expect("read");
            assert_ne!(n, 0, "closed before the first event");
            read.extend_from_slice(&buf[..n]);
        }
        (tcp, read)
    }

    async fn exchange(addr: SocketAddr, request: &str) -> String {
        let mut tcp = TcpStream::connect(addr).await.expect("connect");
        tcp.write_all(request.as_bytes()).await.expect("write");
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(10), tcp.read_to_string(&mut answer))
            .await
            .expect("the connection closes")
            .expect("read");
        answer
    }

    fn three_events() -> Sse<impl futures::Stream<Item = Result<Event, Infallible>>> {
        Sse::new(futures::stream::iter(
            ["one", "two", "three"].map(|data| Ok(Event::default().data(data))),
        ))
    }

    #[tokio::test]
    async fn an_event_stream_is_written_chunked_and_closed_at_its_end() {
        let addr = server(Router::new().route("/events", get(|| async { three_events() }))).await;
        let answer = exchange(addr, STREAM).await;
        let (head, body) = answer.split_once("\r\n\r\n").expect("a head");
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        for field in [
            "content-type: text/event-stream",
            "transfer-encoding: chunked",
            "connection: close",
            "x-request-id: ",
            "date: ",
        ] {
            assert!(head.contains(field), "{field} missing from {head}");
        }
        // Each event one chunk (its size in hex), then the last, empty chunk.
        let chunks: String = ["one", "two", "three"]
            .map(|data| format!("data: {data}\n\n"))
            .iter()
            .map(|event| format!("{:x}\r\n{event}\r\n", event.len()))
            .collect();
        assert_eq!(body, format!("{chunks}0\r\n\r\n"));
    }

    #[tokio::test]
    async fn a_stream_request_answered_with_a_known_length_is_sent_with_it() {
        let addr = server(Router::new()).await;
        let answer = exchange(addr, STREAM).await;
        let (head, body) = answer.split_once("\r\n\r\n").expect("a head");
        assert!(head.starts_with("HTTP/1.1 404 Not Found\r\n"), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        assert!(!head.contains("transfer-encoding"), "{head}");
        assert!(body.contains("no such route"), "{body}");
    }

    /// Sends on its channel when dropped: the stream it is part of has ended.
    struct Dropped(Option<tokio::sync::oneshot::Sender<()>>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            if let Some(sender) = self.0.take() {
                let _ = sender.send(());
            }
        }
    }

    #[tokio::test]
    async fn a_client_that_closes_ends_its_idle_stream() {
        let (ended, on_end) = tokio::sync::oneshot::channel();
        let guard = std::sync::Mutex::new(Some(Dropped(Some(ended))));
        let guard = std::sync::Arc::new(guard);
        let router = Router::new().route(
            "/events",
            get(move || {
                let dropped = guard.lock().expect("lock").take();
                async move {
                    // One event, then nothing: an idle stream holding `dropped`.
                    let events = futures::stream::once(async {
                        Ok::<_, Infallible>(Event::default().data("hi"))
                    })
                    .chain(futures::stream::pending())
                    .map(move |event| {
                        let _held = &dropped;
                        event
                    });
                    Sse::new(events)
                }
            }),
        );
        let (tcp, _) = open_stream(server(router).await).await;
        drop(tcp);
        tokio::time::timeout(Duration::from_secs(10), on_end)
            .await
            .expect("the stream ends when its client closes")
            .expect("the guard was dropped");
    }

    #[tokio::test]
    async fn other_connections_are_hyper_s_with_their_first_bytes_put_back() {
        let router = Router::new()
            .route("/plain", get(|| async { "plain" }))
            .route("/echo", post(|body: String| async move { body }));
        let addr = server(router).await;
        // Two requests on one connection (hyper keeps it alive), the second a POST with a body.
        let answer = exchange(
            addr,
            "GET /plain HTTP/1.1\r\nHost: x\r\n\r\n\
             POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
        )
        .await;
        assert_eq!(answer.matches("HTTP/1.1 200 OK").count(), 2, "{answer}");
        assert!(answer.contains("\r\n\r\nplain"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nhello"), "{answer}");
        // A stream request with a body is hyper's too, and still answered.
        let answer = exchange(
            addr,
            "POST /echo HTTP/1.1\r\nAccept: text/event-stream\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
        )
        .await;
        assert!(
            answer.starts_with("HTTP/1.1 200 OK") && answer.ends_with("hi"),
            "{answer}"
        );
    }

    #[tokio::test]
    async fn a_stream_answered_when_shutdown_begins_ends_as_its_body_does() {
        let shutdown = CancellationToken::new();
        // As the runs service's streams: one event, then nothing until shutdown ends the body.
        let ends = shutdown.clone();
        let router = Router::new().route(
            "/events",
            get(move || {
                let ends = ends.clone();
                async move {
                    let first = futures::stream::once(async {
                        Ok::<_, Infallible>(Event::default().data("hi"))
                    });
                    Sse::new(
                        first
                            .chain(futures::stream::pending())
                            .take_until(ends.cancelled_owned()),
                    )
                }
            }),
        );
        let server = Server::start(router, shutdown.clone()).await;
        let (mut tcp, mut answer) = open_stream(server.addr).await;
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut answer))
            .await
            .expect("the stream ends")
            .expect("read");
        assert!(
            String::from_utf8_lossy(&answer).ends_with("\r\n0\r\n\r\n"),
            "ended with its last chunk, not cut off: {}",
            String::from_utf8_lossy(&answer)
        );
        server.stop().await;
    }

    #[tokio::test]
    async fn shutdown_closes_a_connection_that_never_sent_a_request_and_serving_returns() {
        let server = Server::start(Router::new(), CancellationToken::new()).await;
        let mut silent = TcpStream::connect(server.addr).await.expect("connect");
        // The connection is accepted once a request on another one is answered.
        assert!(
            exchange(server.addr, STREAM)
                .await
                .starts_with("HTTP/1.1 404")
        );
        server.stop().await;
        let mut buf = [0_u8; 8];
        assert_eq!(silent.read(&mut buf).await.expect("read"), 0, "closed");
    }
}
