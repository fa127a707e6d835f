//! A scripted AG-UI agent server of our own, for the worker's remote-agent tests and benchmarks.
//!
//! [`FakeAgent::spawn`] serves, on `127.0.0.1:<port 0>`, one behaviour per path (healthy,
//! failing, slow, silent, malformed, out of order: see [`PATHS`]), each answering the
//! `RunAgentInput` it is POSTed the way the AG-UI python encoder frames events
//! (`data: <json>\n\n`, `content-type: text/event-stream`). It records, per path, what a test
//! asserts on: how many requests came, the last body and headers, and whether the client
//! closed a stream before its end, detected on the server side (hyper drops a response body
//! whose connection the client closed, and [`PathStats::closed`] counts those drops). A
//! script that misbehaves and then "hangs" stays silent until the client leaves, so the only
//! way a client can end such a run early is by noticing the misbehaviour itself.

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::bail;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::Response;
use futures::stream::{self, BoxStream, Stream, StreamExt as _};
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

/// The limit `/oversized-event` exceeds by one byte unless its query says `?limit=N`: configure
/// the agent with `max_event_bytes` equal to it.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 64 * 1024;

/// The message `/agent-error` sends in its `RUN_ERROR`.
pub const AGENT_ERROR_MESSAGE: &str = "the fake agent failed on purpose";

/// Every scripted path and what it answers (`threadId`/`runId` are the request's):
///
/// | path | behaviour |
/// |---|---|
/// | `/ok` | `RUN_STARTED`, a text message echoing the last user message's text in (up to) three `TEXT_MESSAGE_CONTENT`s, `RUN_FINISHED`; one write; `?input_tokens=N&output_tokens=M`: the `RUN_FINISHED` reports that usage (model `fake-model`) |
/// | `/burst?events=N` | like `/ok` with N one-byte `TEXT_MESSAGE_CONTENT`s (default 1,000), written in batches as fast as the client reads |
/// | `/slow?chunks=N&interval_ms=M` | a text message of N chunks (default 200) M ms apart (default 100), then `RUN_FINISHED` |
/// | `/status-500` | HTTP 500 with a JSON body |
/// | `/not-sse` | 200 `text/html` |
/// | `/no-headers` | no response at all until the client leaves |
/// | `/no-first-event` | 200 `text/event-stream` headers, then silence |
/// | `/idle` | `RUN_STARTED` and `TEXT_MESSAGE_START`, then silence |
/// | `/endless?interval_ms=M` | `RUN_STARTED`, `TEXT_MESSAGE_START`, then a content event every M ms (default 100) for ever |
/// | `/ends-early` | `RUN_STARTED`, a text start and two contents, then the stream ends (no `RUN_FINISHED`) |
/// | `/malformed-json` | `RUN_STARTED`, an event whose data is not JSON, then silence |
/// | `/unknown-type` | `RUN_STARTED`, an event of type `NOT_AN_AGUI_EVENT`, then silence |
/// | `/content-before-start` | `RUN_STARTED`, a `TEXT_MESSAGE_CONTENT` with no start, then silence |
/// | `/after-finished` | a complete run, `RUN_FINISHED`, then a `TEXT_MESSAGE_START`; the stream ends |
/// | `/finished-open-message` | `RUN_STARTED`, a text start and content, `RUN_FINISHED`; the stream ends |
/// | `/finished-open-tool-call` | `RUN_STARTED`, a tool call start and args, `RUN_FINISHED`; the stream ends |
/// | `/oversized-event?limit=N` | `RUN_STARTED`, a text start, a content event whose data is N+1 bytes (default [`DEFAULT_MAX_EVENT_BYTES`]), then silence |
/// | `/agent-error` | `RUN_STARTED`, `RUN_ERROR` with [`AGENT_ERROR_MESSAGE`]; the stream ends |
///
/// Any other path answers 404 (and is recorded too).
pub const PATHS: &[&str] = &[
    "/ok",
    "/burst",
    "/slow",
    "/status-500",
    "/not-sse",
    "/no-headers",
    "/no-first-event",
    "/idle",
    "/endless",
    "/ends-early",
    "/malformed-json",
    "/unknown-type",
    "/content-before-start",
    "/after-finished",
    "/finished-open-message",
    "/finished-open-tool-call",
    "/oversized-event",
    "/agent-error",
];

/// What the fake agent recorded for one path (the query is not part of the path).
#[derive(Debug, Clone, Default)]
pub struct PathStats {
    /// Requests received.
    pub requests: usize,
    /// Responses the client closed before their end (streams dropped unfinished).
    pub closed: usize,
    /// Responses sent to their end.
    pub completed: usize,
    /// The last request's body as JSON (`None` before any request, or when it was not JSON).
    pub last_body: Option<Value>,
    /// The last request's headers.
    pub last_headers: Option<HeaderMap>,
    /// When the last request arrived.
    pub last_request_at: Option<Instant>,
    /// When a client last closed a response early.
    pub last_closed_at: Option<Instant>,
}

impl PathStats {
    /// The last request's header `name` as text, if it had one.
    pub fn header(&self, name: &str) -> Option<String> {
        self.last_headers
            .as_ref()?
            .get(name)?
            .to_str()
            .ok()
            .map(str::to_owned)
    }
}

/// A running fake agent; stops serving (and ends every open stream) when dropped.
pub struct FakeAgent {
    base: String,
    shared: Arc<Shared>,
    _stop: DropGuard,
}

struct Shared {
    stats: Mutex<HashMap<String, PathStats>>,
    changed: Notify,
    shutdown: CancellationToken,
}

impl Shared {
    fn update(&self, path: &str, change: impl FnOnce(&mut PathStats)) {
        {
            let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
            change(stats.entry(path.to_owned()).or_default());
        }
        self.changed.notify_waiters();
    }

    fn get(&self, path: &str) -> PathStats {
        self.stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(path)
            .cloned()
            .unwrap_or_default()
    }
}

impl FakeAgent {
    /// Starts the server on a free port of 127.0.0.1.
    pub async fn spawn() -> anyhow::Result<Self> {
        let stop = CancellationToken::new();
        let shared = Arc::new(Shared {
            stats: Mutex::default(),
            changed: Notify::new(),
            shutdown: stop.clone(),
        });
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&shared));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let shutdown = stop.clone();
        tokio::spawn(async move {
            // Serving ends only when the agent is dropped; an accept error then is moot.
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await;
        });
        Ok(Self {
            base,
            shared,
            _stop: stop.drop_guard(),
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// The URL of `path` (with a query if it takes one, e.g. `/burst?events=10000`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Everything recorded for `path` (without its query).
    pub fn stats(&self, path: &str) -> PathStats {
        self.shared.get(path)
    }

    /// Requests `path` received.
    pub fn requests(&self, path: &str) -> usize {
        self.stats(path).requests
    }

    /// Responses of `path` the client closed before their end.
    pub fn closed(&self, path: &str) -> usize {
        self.stats(path).closed
    }

    /// The last JSON body `path` received.
    pub fn last_body(&self, path: &str) -> Option<Value> {
        self.stats(path).last_body
    }

    /// The headers of the last request `path` received.
    pub fn last_headers(&self, path: &str) -> Option<HeaderMap> {
        self.stats(path).last_headers
    }

    /// Header `name` of the last request `path` received, as text.
    pub fn last_header(&self, path: &str, name: &str) -> Option<String> {
        self.stats(path).header(name)
    }

    /// Waits until `path`'s stats satisfy `done` and returns them, or fails after `within`
    /// with the last stats seen. Woken by every change, so it never polls on a timer.
    pub async fn wait_for(
        &self,
        path: &str,
        within: Duration,
        done: impl Fn(&PathStats) -> bool,
    ) -> anyhow::Result<PathStats> {
        let deadline = Instant::now() + within;
        loop {
            let changed = self.shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let stats = self.stats(path);
            if done(&stats) {
                return Ok(stats);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                bail!(
                    "{path} of the fake agent did not reach the expected state within {within:?}: \
                     {} requests, {} closed early, {} completed",
                    stats.requests,
                    stats.closed,
                    stats.completed
                );
            }
        }
    }
}

/// Records a response's end when dropped: completed if [`Track::finish`] was called, closed
/// by the client otherwise.
struct Track {
    shared: Arc<Shared>,
    path: String,
    finished: bool,
}

impl Track {
    fn new(shared: &Arc<Shared>, path: &str) -> Self {
        Self {
            shared: Arc::clone(shared),
            path: path.to_owned(),
            finished: false,
        }
    }

    fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for Track {
    fn drop(&mut self) {
        let finished = self.finished || self.shared.shutdown.is_cancelled();
        self.shared.update(&self.path, |stats| {
            if finished {
                stats.completed += 1;
            } else {
                stats.closed += 1;
                stats.last_closed_at = Some(Instant::now());
            }
        });
    }
}

/// A response body that records, when hyper drops it, whether it was read to its end.
struct Tracked {
    inner: BoxStream<'static, Result<Bytes, Infallible>>,
    track: Track,
}

impl Stream for Tracked {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let next = self.inner.poll_next_unpin(cx);
        if let Poll::Ready(None) = next {
            self.track.finish();
        }
        next
    }
}

/// The client left, or the fake agent is stopping: a script ends.
struct Gone;

/// What a script writes its stream with.
struct Emitter {
    tx: mpsc::Sender<Bytes>,
    shutdown: CancellationToken,
}

impl Emitter {
    async fn event(&self, event: Value) -> Result<(), Gone> {
        self.data(event.to_string()).await
    }

    /// One event whose `data:` is `data` verbatim.
    async fn data(&self, data: String) -> Result<(), Gone> {
        self.tx
            .send(Bytes::from(format!("data: {data}\n\n")))
            .await
            .map_err(|_| Gone)
    }

    async fn pause(&self, duration: Duration) -> Result<(), Gone> {
        tokio::select! {
            () = tokio::time::sleep(duration) => Ok(()),
            () = self.tx.closed() => Err(Gone),
            () = self.shutdown.cancelled() => Err(Gone),
        }
    }

    /// Silence until the client leaves (or the fake agent stops).
    async fn hang(&self) -> Gone {
        tokio::select! {
            () = self.tx.closed() => Gone,
            () = self.shutdown.cancelled() => Gone,
        }
    }
}

/// The ids a reply carries: the request's thread and run, a fresh message id.
struct Ids {
    thread: String,
    run: String,
    message: String,
}

impl Ids {
    fn of(input: &Value) -> Self {
        let text = |key: &str, default: &str| input[key].as_str().unwrap_or(default).to_owned();
        Self {
            thread: text("threadId", "thread"),
            run: text("runId", "run"),
            message: uuid::Uuid::new_v4().to_string(),
        }
    }

    fn run_started(&self) -> Value {
        json!({"type": "RUN_STARTED", "threadId": self.thread, "runId": self.run})
    }

    fn run_finished(&self) -> Value {
        json!({"type": "RUN_FINISHED", "threadId": self.thread, "runId": self.run})
    }

    fn text_start(&self) -> Value {
        json!({"type": "TEXT_MESSAGE_START", "messageId": self.message, "role": "assistant"})
    }

    fn text_content(&self, delta: &str) -> Value {
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": self.message, "delta": delta})
    }

    fn text_end(&self) -> Value {
        json!({"type": "TEXT_MESSAGE_END", "messageId": self.message})
    }
}

/// `data: <json>\n\n` for each event, concatenated.
fn frames(events: &[Value]) -> String {
    events.iter().map(|e| format!("data: {e}\n\n")).collect()
}

/// The text of the last user message: its string content, or its text parts joined.
fn last_user_text(input: &Value) -> String {
    let Some(message) = input["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
    else {
        return String::new();
    };
    match &message["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter(|p| p["type"] == "text")
            .filter_map(|p| p["text"].as_str())
            .collect(),
        _ => String::new(),
    }
}

/// `text` in up to three non-empty pieces, cut at character boundaries.
fn thirds(text: &str) -> Vec<&str> {
    let chars: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
    let n = chars.len();
    let cut = |k: usize| chars.get(n * k / 3).copied().unwrap_or(text.len());
    let (a, b) = (cut(1), cut(2));
    [&text[..a], &text[a..b], &text[b..]]
        .into_iter()
        .filter(|piece| !piece.is_empty())
        .collect()
}

fn query_number(uri: &Uri, name: &str, default: u64) -> u64 {
    uri.query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == name)
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or(default)
}

fn response(status: StatusCode, content_type: &str, body: Body) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    response
}

/// A 200 `text/event-stream` whose end (or early close) is recorded for `path`.
fn event_stream(
    shared: &Arc<Shared>,
    path: &str,
    body: BoxStream<'static, Result<Bytes, Infallible>>,
) -> Response {
    let tracked = Tracked {
        inner: body,
        track: Track::new(shared, path),
    };
    let mut response = response(
        StatusCode::OK,
        "text/event-stream",
        Body::from_stream(tracked),
    );
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache"),
    );
    response
}

/// An event stream written by `script` in a task of its own, at the pace the client reads.
fn scripted<F, Fut>(shared: &Arc<Shared>, path: &str, script: F) -> Response
where
    F: FnOnce(Emitter) -> Fut,
    Fut: Future<Output = Result<(), Gone>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    let emitter = Emitter {
        tx,
        shutdown: shared.shutdown.clone(),
    };
    let script = script(emitter);
    tokio::spawn(async move {
        // `Gone` only says the client left first: nothing to do about it.
        let _ = script.await;
    });
    let body = stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (Ok(chunk), rx))
    });
    event_stream(shared, path, body.boxed())
}

/// Chunks of `events` one-byte contents each, and the run around them, as few writes as fit.
fn burst(ids: &Ids, events: usize) -> BoxStream<'static, Result<Bytes, Infallible>> {
    const BATCH: usize = 512;
    let head = Bytes::from(frames(&[ids.run_started(), ids.text_start()]));
    let one = frames(&[ids.text_content("x")]);
    let full = Bytes::from(one.repeat(BATCH));
    let rest = Bytes::from(one.repeat(events % BATCH));
    let tail = Bytes::from(frames(&[ids.text_end(), ids.run_finished()]));
    stream::iter(
        std::iter::once(head)
            .chain(std::iter::repeat_n(full, events / BATCH))
            .chain(std::iter::once(rest))
            .chain(std::iter::once(tail))
            .filter(|chunk| !chunk.is_empty())
            .map(Ok),
    )
    .boxed()
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let input = serde_json::from_slice::<Value>(&body).ok();
    // What the replies need, taken before the body moves into the record (no copy of it).
    let ids = Ids::of(input.as_ref().unwrap_or(&Value::Null));
    let echo = match (path.as_str(), &input) {
        ("/ok", Some(input)) => last_user_text(input),
        _ => String::new(),
    };
    shared.update(&path, |stats| {
        stats.requests += 1;
        stats.last_body = input;
        stats.last_headers = Some(headers);
        stats.last_request_at = Some(Instant::now());
    });
    let done = |status: StatusCode, content_type: &str, body: &'static str| {
        Track::new(&shared, &path).finish();
        response(status, content_type, Body::from(body))
    };
    match path.as_str() {
        "/ok" => {
            let mut events = vec![ids.run_started(), ids.text_start()];
            events.extend(
                thirds(&echo)
                    .into_iter()
                    .map(|piece| ids.text_content(piece)),
            );
            let mut finished = ids.run_finished();
            let (input, output) = (
                query_number(&uri, "input_tokens", 0),
                query_number(&uri, "output_tokens", 0),
            );
            if input + output > 0 {
                finished["usage"] = json!([{"model": "fake-model", "inputTokens": input,
                    "outputTokens": output, "totalTokens": input + output}]);
            }
            events.extend([ids.text_end(), finished]);
            let body = Bytes::from(frames(&events));
            event_stream(&shared, &path, stream::once(async { Ok(body) }).boxed())
        }
        "/burst" => {
            let events = usize::try_from(query_number(&uri, "events", 1_000)).unwrap_or(0);
            event_stream(&shared, &path, burst(&ids, events))
        }
        "/slow" => {
            let chunks = query_number(&uri, "chunks", 200);
            let interval = Duration::from_millis(query_number(&uri, "interval_ms", 100));
            scripted(&shared, &path, move |e: Emitter| async move {
                e.event(ids.run_started()).await?;
                e.event(ids.text_start()).await?;
                for i in 0..chunks {
                    e.pause(interval).await?;
                    e.event(ids.text_content(&format!("w{i} "))).await?;
                }
                e.event(ids.text_end()).await?;
                e.event(ids.run_finished()).await
            })
        }
        "/status-500" => done(
            StatusCode::INTERNAL_SERVER_ERROR,
            "application/json",
            r#"{"error":"the fake agent is down"}"#,
        ),
        "/not-sse" => done(
            StatusCode::OK,
            "text/html; charset=utf-8",
            "<!doctype html><html><body>not an event stream</body></html>",
        ),
        "/no-headers" => {
            // Dropped unfinished (counted as closed) when the client gives up first.
            let mut track = Track::new(&shared, &path);
            shared.shutdown.cancelled().await;
            track.finish();
            response(StatusCode::SERVICE_UNAVAILABLE, "text/plain", Body::empty())
        }
        "/no-first-event" => scripted(
            &shared,
            &path,
            |e: Emitter| async move { Err(e.hang().await) },
        ),
        "/idle" => scripted(&shared, &path, move |e: Emitter| async move {
            e.event(ids.run_started()).await?;
            e.event(ids.text_start()).await?;
            Err(e.hang().await)
        }),
        "/endless" => {
            let interval = Duration::from_millis(query_number(&uri, "interval_ms", 100));
            scripted(&shared, &path, move |e: Emitter| async move {
                e.event(ids.run_started()).await?;
                e.event(ids.text_start()).await?;
                loop {
                    e.pause(interval).await?;
                    e.event(ids.text_content("more ")).await?;
                }
            })
        }
        "/ends-early" => scripted(&shared, &path, move |e: Emitter| async move {
            e.event(ids.run_started()).await?;
            e.event(ids.text_start()).await?;
            e.event(ids.text_content("cut ")).await?;
            e.event(ids.text_content("short")).await
        }),
        "/malformed-json" => scripted(&shared, &path, move |e: Emitter| async move {
            e.event(ids.run_started()).await?;
            e.data(r#"{"type": "TEXT_MESSAGE_START", "messageId": "#.to_owned())
                .await?;
            Err(e.hang().await)
        }),
        "/unknown-type" => scripted(&shared, &path, move |e: Emitter| async move {
            e.event(ids.run_started()).await?;
            e.event(json!({"type": "NOT_AN_AGUI_EVENT", "value": 1}))
                .await?;
            Err(e.hang().await)
        }),
        "/content-before-start" => scripted(&shared, &path, move |e: Emitter| async move {
            e.event(ids.run_started()).await?;
            e.event(ids.text_content("too early")).await?;
            Err(e.hang().await)
        }),
        "/after-finished" => scripted(&shared, &path, move |e: Emitter| async move {
            e.event(ids.run_started()).await?;
            e.event(ids.text_start()).await?;
            e.event(ids.text_content("done")).await?;
            e.event(ids.text_end()).await?;
            e.event(ids.run_finished()).await?;
            e.event(json!({"type": "TEXT_MESSAGE_START", "messageId": "late", "role": "assistant"}))
                .await
        }),
        "/finished-open-message" => scripted(&shared, &path, move |e: Emitter| async move {
            e.event(ids.run_started()).await?;
            e.event(ids.text_start()).await?;
            e.event(ids.text_content("never ended")).await?;
            e.event(ids.run_finished()).await
        }),
        "/finished-open-tool-call" => scripted(&shared, &path, move |e: Emitter| async move {
            e.event(ids.run_started()).await?;
            e.event(json!({"type": "TOOL_CALL_START", "toolCallId": "call-open",
                "toolCallName": "lookup"}))
                .await?;
            e.event(json!({"type": "TOOL_CALL_ARGS", "toolCallId": "call-open",
                "delta": "{\"q\":"}))
                .await?;
            e.event(ids.run_finished()).await
        }),
        "/oversized-event" => {
            let limit = usize::try_from(query_number(&uri, "limit", 0)).unwrap_or(0);
            let limit = if limit == 0 {
                DEFAULT_MAX_EVENT_BYTES
            } else {
                limit
            };
            scripted(&shared, &path, move |e: Emitter| async move {
                e.event(ids.run_started()).await?;
                e.event(ids.text_start()).await?;
                e.data(oversized_data(&ids, limit)).await?;
                Err(e.hang().await)
            })
        }
        "/agent-error" => scripted(&shared, &path, move |e: Emitter| async move {
            e.event(ids.run_started()).await?;
            e.event(json!({"type": "RUN_ERROR", "message": AGENT_ERROR_MESSAGE,
                "code": "fake_failure"}))
                .await
        }),
        _ => done(
            StatusCode::NOT_FOUND,
            "application/json",
            r#"{"error":"no such script"}"#,
        ),
    }
}

/// A valid `TEXT_MESSAGE_CONTENT` whose JSON is exactly `limit + 1` bytes.
fn oversized_data(ids: &Ids, limit: usize) -> String {
    let empty = ids.text_content("").to_string();
    let pad = (limit + 1).saturating_sub(empty.len());
    ids.text_content(&"x".repeat(pad)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn post(agent: &FakeAgent, path: &str, body: &Value) -> reqwest::Response {
        reqwest::Client::new()
            .post(agent.url(path))
            .header("accept", "text/event-stream")
            .json(body)
            .send()
            .await
            .unwrap()
    }

    fn events(text: &str) -> Vec<Value> {
        text.split("\n\n")
            .filter(|frame| !frame.is_empty())
            .map(|frame| serde_json::from_str(frame.strip_prefix("data: ").unwrap()).unwrap())
            .collect()
    }

    fn input(text: &str) -> Value {
        json!({"threadId": "t1", "runId": "r1", "state": {}, "tools": [], "context": [],
            "forwardedProps": {}, "messages": [
                {"id": "u0", "role": "user", "content": "earlier"},
                {"id": "a0", "role": "assistant", "content": "reply"},
                {"id": "u1", "role": "user", "content": text}]})
    }

    #[tokio::test]
    async fn ok_echoes_the_last_user_message_in_three_pieces_with_the_request_ids() {
        let agent = FakeAgent::spawn().await.unwrap();
        let response = post(&agent, "/ok", &input("héllo wörld")).await;
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        let events = events(&response.text().await.unwrap());
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "RUN_STARTED",
                "TEXT_MESSAGE_START",
                "TEXT_MESSAGE_CONTENT",
                "TEXT_MESSAGE_CONTENT",
                "TEXT_MESSAGE_CONTENT",
                "TEXT_MESSAGE_END",
                "RUN_FINISHED"
            ]
        );
        assert_eq!(
            (&events[0]["threadId"], &events[0]["runId"]),
            (&json!("t1"), &json!("r1"))
        );
        assert_eq!(crate::streamed_text(&events), "héllo wörld");
        let stats = agent
            .wait_for("/ok", Duration::from_secs(5), |s| s.completed == 1)
            .await
            .unwrap();
        assert_eq!((stats.requests, stats.closed), (1, 0));
        assert_eq!(stats.last_body.as_ref().unwrap()["runId"], "r1");
        assert_eq!(stats.header("accept").as_deref(), Some("text/event-stream"));
    }

    #[tokio::test]
    async fn burst_streams_as_many_content_events_as_asked() {
        let agent = FakeAgent::spawn().await.unwrap();
        let response = post(&agent, "/burst?events=1300", &input("x")).await;
        let events = events(&response.text().await.unwrap());
        let contents = events
            .iter()
            .filter(|e| e["type"] == "TEXT_MESSAGE_CONTENT")
            .count();
        assert_eq!((contents, events.len()), (1300, 1304));
        assert_eq!(agent.requests("/burst"), 1);
    }

    #[tokio::test]
    async fn an_oversized_event_is_one_byte_over_the_limit() {
        let agent = FakeAgent::spawn().await.unwrap();
        let mut response = post(&agent, "/oversized-event?limit=1000", &input("x")).await;
        let mut text = String::new();
        while text.matches("\n\n").count() < 3 {
            let chunk = response.chunk().await.unwrap().unwrap();
            text.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        let third = text.split("\n\n").nth(2).unwrap();
        let data = third.strip_prefix("data: ").unwrap();
        assert_eq!(data.len(), 1001);
        assert_eq!(
            serde_json::from_str::<Value>(data).unwrap()["type"],
            "TEXT_MESSAGE_CONTENT"
        );
    }

    #[tokio::test]
    async fn a_client_closing_a_slow_stream_is_seen_by_the_server() {
        let agent = FakeAgent::spawn().await.unwrap();
        let mut response = post(&agent, "/slow?interval_ms=20", &input("x")).await;
        let first = response.chunk().await.unwrap().unwrap();
        assert!(first.starts_with(b"data: "), "{first:?}");
        drop(response);
        let stats = agent
            .wait_for("/slow", Duration::from_secs(5), |s| s.closed == 1)
            .await
            .unwrap();
        assert_eq!((stats.requests, stats.completed), (1, 0));
    }

    #[tokio::test]
    async fn a_client_giving_up_on_silence_is_seen_by_the_server() {
        let agent = FakeAgent::spawn().await.unwrap();
        for path in ["/no-first-event", "/no-headers"] {
            let request = reqwest::Client::new()
                .post(agent.url(path))
                .json(&input("x"))
                .send();
            let mut request = Box::pin(request);
            let sent = tokio::time::timeout(Duration::from_millis(300), &mut request).await;
            if let Ok(response) = sent {
                assert_eq!(response.unwrap().status(), 200, "{path}");
            }
            drop(request);
            agent
                .wait_for(path, Duration::from_secs(5), |s| s.closed == 1)
                .await
                .unwrap();
        }
    }

    #[test]
    fn thirds_cut_at_characters_and_skip_empty_pieces() {
        assert_eq!(thirds("abcdef"), ["ab", "cd", "ef"]);
        assert_eq!(thirds("ab"), ["a", "b"]);
        assert_eq!(thirds("é"), ["é"]);
        assert!(thirds("").is_empty());
    }
}
