//! One trace across the services, in OpenTelemetry's GenAI conventions: the four binaries export
//! OTLP/HTTP to a real receiver (oteltest's `HttpSink`, from PyPI, in the agents' venv), the
//! worker's model is a chat-completions stand-in that asks for a tool call, and the spans the
//! receiver got are read back and checked: who is whose parent, which service made them, and
//! the GenAI attributes.
//!
//! The client sends its own `traceparent` on the upload, the run and the history read, as an
//! instrumented client would, so the user's turn is one trace end to end.

use std::collections::{BTreeSet, HashMap};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use serde_json::{Value, json};
use switchboard_system_tests::{EVENTUAL, ProcessPlatform, free_port, read_sse};
use tokio::io::AsyncBufReadExt as _;

/// Starts oteltest's OTLP/HTTP receiver on the port given and prints every span it gets as one
/// JSON line: service, ids in hex, name, kind and attributes.
const RECEIVER: &str = r#"
import json, logging, sys
from oteltest.sink import HttpSink
from oteltest.sink.handler import RequestHandler

def plain(value):
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None

class Spans(RequestHandler):
    def handle_logs(self, request, headers):
        pass

    def handle_metrics(self, request, headers):
        pass

    def handle_trace(self, request, headers):
        for resource_spans in request.resource_spans:
            resource = {a.key: plain(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    print(json.dumps({
                        "service": resource.get("service.name", ""),
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_id": span.parent_span_id.hex(),
                        "name": span.name,
                        "kind": span.kind,
                        "start": span.start_time_unix_nano,
                        "attributes": {a.key: plain(a.value) for a in span.attributes},
                    }), flush=True)

HttpSink(Spans(), logging.getLogger("otlp-receiver"), port=int(sys.argv[1]), daemon=False).start()
"#;

/// One span as the receiver printed it.
#[derive(Debug, Clone)]
struct Span {
    service: String,
    trace_id: String,
    span_id: String,
    parent_id: String,
    name: String,
    start: u64,
    attributes: serde_json::Map<String, Value>,
}

impl Span {
    fn from_json(value: &Value) -> Option<Self> {
        let text = |key: &str| value[key].as_str().map(str::to_owned);
        Some(Self {
            service: text("service")?,
            trace_id: text("trace_id")?,
            span_id: text("span_id")?,
            parent_id: text("parent_id")?,
            name: text("name")?,
            start: value["start"].as_u64()?,
            attributes: value["attributes"].as_object()?.clone(),
        })
    }

    fn attr(&self, key: &str) -> &Value {
        self.attributes.get(key).unwrap_or(&Value::Null)
    }
}

/// The receiver's process and the spans it printed so far.
struct Receiver {
    _process: tokio::process::Child,
    spans: Arc<Mutex<Vec<Span>>>,
    endpoint: String,
}

impl Receiver {
    async fn start() -> Self {
        let python = std::env::var("SB_TEST_AGENTS_PYTHON").expect(
            "SB_TEST_AGENTS_PYTHON names the agents' venv python (scripts/test.sh sets it)",
        );
        let port = free_port().unwrap();
        let mut process = tokio::process::Command::new(python)
            .args(["-c", RECEIVER, &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("the OTLP receiver starts (is oteltest in the agents' venv?)");
        let stdout = process.stdout.take().unwrap();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let collected = Arc::clone(&spans);
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let parsed = serde_json::from_str::<Value>(&line)
                    .ok()
                    .and_then(|value| Span::from_json(&value));
                if let Some(span) = parsed {
                    collected.lock().unwrap().push(span);
                }
            }
        });
        // Listening once it takes a connection.
        let deadline = tokio::time::Instant::now() + EVENTUAL;
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the OTLP receiver never listened on {port}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self {
            _process: process,
            spans,
            endpoint: format!("http://127.0.0.1:{port}"),
        }
    }

    /// The spans of `trace_id`, once `done` holds for them; fails after [`EVENTUAL`] showing
    /// what came.
    async fn trace(&self, trace_id: &str, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let deadline = tokio::time::Instant::now() + EVENTUAL;
        loop {
            let spans: Vec<Span> = self
                .spans
                .lock()
                .unwrap()
                .iter()
                .filter(|span| span.trace_id == trace_id)
                .cloned()
                .collect();
            if done(&spans) {
                return spans;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the trace never had every span expected; it has:\n{}",
                tree(&spans)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// What the model stand-in was sent: each request's `traceparent`.
type Seen = Arc<Mutex<Vec<Option<String>>>>;

/// The fake model server's state: the `traceparent`s it was sent, and its own tracer, which
/// exports to the test's receiver as service `model` (a real provider's server span).
#[derive(Clone)]
struct Model {
    seen: Seen,
    provider: opentelemetry_sdk::trace::SdkTracerProvider,
}

impl Model {
    /// Off the async runtime: the exporter's blocking HTTP client may not be made on it.
    async fn start(endpoint: String) -> Self {
        let provider = tokio::task::spawn_blocking(move || {
            use opentelemetry_otlp::WithExportConfig as _;
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(format!("{endpoint}/v1/traces"))
                .build()
                .expect("an OTLP exporter");
            opentelemetry_sdk::trace::SdkTracerProvider::builder()
                .with_resource(
                    opentelemetry_sdk::Resource::builder()
                        .with_service_name("model")
                        .build(),
                )
                .with_batch_exporter(exporter)
                .build()
        })
        .await
        .unwrap();
        Self {
            seen: Arc::default(),
            provider,
        }
    }

    /// A server span for one request, continuing the caller's context, exported at once.
    async fn record(&self, headers: &HeaderMap) {
        use opentelemetry::propagation::TextMapPropagator as _;
        use opentelemetry::trace::{Span as _, SpanKind, Tracer as _, TracerProvider as _};
        struct Carrier<'a>(&'a HeaderMap);
        impl opentelemetry::propagation::Extractor for Carrier<'_> {
            fn get(&self, key: &str) -> Option<&str> {
                self.0.get(key).and_then(|v| v.to_str().ok())
            }
            fn keys(&self) -> Vec<&str> {
                self.0.keys().map(|k| k.as_str()).collect()
            }
        }
        let parent = opentelemetry_sdk::propagation::TraceContextPropagator::new()
            .extract(&Carrier(headers));
        let tracer = self.provider.tracer("fake-model");
        let mut span = tracer
            .span_builder("POST /v1/chat/completions")
            .with_kind(SpanKind::Server)
            .start_with_context(&tracer, &parent);
        span.set_attribute(opentelemetry::KeyValue::new(
            "gen_ai.operation.name",
            "chat",
        ));
        span.end();
        let provider = self.provider.clone();
        tokio::task::spawn_blocking(move || provider.force_flush())
            .await
            .unwrap()
            .expect("the model's span exported");
    }
}

/// A chat-completions stand-in: `model` says a word, calls `get_weather`, reports 31 input and
/// 12 output tokens.
async fn completions(
    State(model): State<Model>,
    headers: HeaderMap,
    _body: axum::Json<Value>,
) -> axum::response::Response {
    let traceparent = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    model.seen.lock().unwrap().push(traceparent);
    model.record(&headers).await;
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "c1", "object": "chat.completion.chunk", "model": "trace-model-2026",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let mut sse = chunk(
        json!({"role": "assistant", "content": "Checking."}),
        Value::Null,
    );
    sse += &chunk(
        json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}),
        Value::Null,
    );
    sse += &chunk(json!({}), json!("tool_calls"));
    sse += &format!(
        "data: {}\n\n",
        json!({"id": "c1", "object": "chat.completion.chunk", "choices": [],
            "usage": {"prompt_tokens": 31, "completion_tokens": 12, "total_tokens": 43}})
    );
    sse += "data: [DONE]\n\n";
    axum::response::Response::builder()
        .header("content-type", "text/event-stream")
        .body(axum::body::Body::from(sse))
        .unwrap()
}

/// The span tree of `spans`, one line per span: service, name, key attributes; children
/// indented under their parent, in start order.
fn tree(spans: &[Span]) -> String {
    let ids: BTreeSet<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    let mut children: HashMap<&str, Vec<&Span>> = HashMap::new();
    for span in spans {
        let parent = if ids.contains(span.parent_id.as_str()) {
            span.parent_id.as_str()
        } else {
            ""
        };
        children.entry(parent).or_default().push(span);
    }
    for list in children.values_mut() {
        list.sort_by_key(|s| s.start);
    }
    fn walk(out: &mut String, children: &HashMap<&str, Vec<&Span>>, parent: &str, depth: usize) {
        for span in children.get(parent).into_iter().flatten() {
            let keys: Vec<String> = span
                .attributes
                .iter()
                .filter(|(k, _)| {
                    k.starts_with("gen_ai.")
                        || ["http.route", "http.response.status_code"].contains(&k.as_str())
                })
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            out.push_str(&format!(
                "{}{} [{}] {}{}\n",
                "  ".repeat(depth),
                span.name,
                span.service,
                span.span_id,
                if keys.is_empty() {
                    String::new()
                } else {
                    format!(" {{{}}}", keys.join(", "))
                },
            ));
            walk(out, children, &span.span_id, depth + 1);
        }
    }
    let mut out = String::new();
    walk(&mut out, &children, "", 0);
    out
}

/// The ancestors of `span` in `spans`, nearest first.
fn ancestors<'a>(spans: &'a [Span], span: &Span) -> Vec<&'a Span> {
    let mut chain = Vec::new();
    let mut parent = span.parent_id.as_str();
    while let Some(found) = spans.iter().find(|s| s.span_id == parent) {
        chain.push(found);
        parent = found.parent_id.as_str();
    }
    chain
}

fn find<'a>(spans: &'a [Span], what: &str, test: impl Fn(&Span) -> bool) -> &'a Span {
    spans
        .iter()
        .find(|s| test(s))
        .unwrap_or_else(|| panic!("no {what} span in the trace:\n{}", tree(spans)))
}

#[tokio::test]
async fn a_run_with_a_file_and_a_tool_call_is_one_trace_through_every_service() {
    let receiver = Receiver::start().await;
    let state = Model::start(receiver.endpoint.clone()).await;
    let seen = Arc::clone(&state.seen);
    let model = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(completions))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, model).await });
    let platform = ProcessPlatform::spawn_with_env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint),
        // Batches leave every 100 ms instead of 5 s.
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("SB_OPENAI_BASE_URL", &base_url),
        ("SB_OPENAI_MODEL", "trace-model"),
        ("SB_OPENAI_API_KEY", "sk-test"),
    ])
    .await
    .unwrap();
    let alice = platform.infra.token("alice");
    // The client's own span: every request of the turn carries it.
    let trace_id = uuid::Uuid::new_v4().simple().to_string();
    let client_span = uuid::Uuid::new_v4().simple().to_string()[..16].to_owned();
    let traceparent = format!("00-{trace_id}-{client_span}-01");

    // A file, uploaded.
    let part = reqwest::multipart::Part::bytes(b"city,temp\nParis,18\n".to_vec())
        .file_name("weather.csv")
        .mime_str("text/csv")
        .unwrap();
    let uploaded: Value = platform
        .http
        .post(format!(
            "{}/api/v1/agent/attachments",
            platform.urls.attachments
        ))
        .bearer_auth(&alice)
        .header("traceparent", &traceparent)
        .multipart(reqwest::multipart::Form::new().part("file", part))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let file_url = format!(
        "s3://{}/{}",
        uploaded["bucket"].as_str().unwrap(),
        uploaded["path"].as_str().unwrap()
    );

    // The run: the question with the file; the model answers with a call of the client's tool.
    let thread = uuid::Uuid::new_v4().to_string();
    let body = json!({
        "threadId": thread,
        "runId": "traced",
        "state": {},
        "messages": [{"id": "traced-user", "role": "user", "content": [
            {"type": "text", "text": "What is the weather in Paris?"},
            {"type": "document", "source": {"type": "url", "value": file_url}}
        ]}],
        "tools": [{"name": "get_weather", "description": "Current weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "context": [],
        "forwardedProps": {}
    });
    let response = platform
        .http
        .post(format!("{}/api/v1/agent/runs", platform.urls.runs))
        .bearer_auth(&alice)
        .header("traceparent", &traceparent)
        .header("accept", "text/event-stream")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let events: Vec<Value> = read_sse(response, None)
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.data)
        .collect();
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert!(kinds.contains(&"TOOL_CALL_START"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"RUN_FINISHED"), "{events:?}");

    // The conversation read back: history signs the file's link with the attachments service.
    let deadline = tokio::time::Instant::now() + EVENTUAL;
    loop {
        let history: Value = platform
            .http
            .get(format!("{}/api/v1/agent/history", platform.urls.history))
            .bearer_auth(&alice)
            .header("traceparent", &traceparent)
            .query(&[("threadId", thread.as_str())])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap_or(Value::Null);
        if history["messages"].as_array().is_some_and(|m| m.len() == 2) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "history never had the run: {history}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let spans = receiver
        .trace(&trace_id, |spans| {
            let services: BTreeSet<&str> = spans.iter().map(|s| s.service.as_str()).collect();
            ["runs", "attachments", "worker", "history"]
                .iter()
                .all(|s| services.contains(s))
                && spans.iter().any(|s| s.name == "chat trace-model")
                && spans.iter().any(|s| s.name == "attachments.sign.handle")
                && spans.iter().any(|s| s.name == "history.ingest.run_end")
                && services.contains("model")
        })
        .await;
    println!(
        "the run's trace {trace_id} (client span {client_span}):\n{}",
        tree(&spans)
    );

    // The worker's agent span continues the runs service's request span, which continues the
    // client's.
    let agent = find(&spans, "invoke_agent", |s| {
        s.attr("gen_ai.operation.name") == "invoke_agent"
    });
    assert_eq!(agent.service, "worker");
    assert_eq!(agent.name, "invoke_agent openai");
    assert_eq!(agent.attr("gen_ai.agent.name"), "openai");
    assert_eq!(agent.attr("gen_ai.conversation.id"), thread.as_str());
    let post = find(&spans, "POST /api/v1/agent/runs", |s| {
        s.name == "POST /api/v1/agent/runs"
    });
    assert_eq!(post.service, "runs");
    assert_eq!(
        post.parent_id, client_span,
        "the request continues the client's span"
    );
    assert!(
        ancestors(&spans, agent)
            .iter()
            .any(|s| s.span_id == post.span_id),
        "invoke_agent descends from the runs request:\n{}",
        tree(&spans)
    );

    // Admission asked the attachments service, from a runs span under the admission.
    let resolve = find(&spans, "attachments.resolve.handle", |s| {
        s.name == "attachments.resolve.handle"
    });
    assert_eq!(resolve.service, "attachments");
    let caller = ancestors(&spans, resolve);
    assert_eq!(
        caller.first().map(|s| s.service.as_str()),
        Some("runs"),
        "the resolve span's parent is a runs span"
    );
    assert!(
        caller.iter().any(|s| s.name == "runs.accept.admit"),
        "under runs.accept.admit:\n{}",
        tree(&spans)
    );

    // The model call: a child of the agent's span, in the GenAI conventions, with the tokens
    // the model reported; and the model got the call's context.
    let chat = find(&spans, "chat", |s| s.name == "chat trace-model");
    assert_eq!(chat.service, "worker");
    assert_eq!(
        chat.parent_id, agent.span_id,
        "chat is a child of invoke_agent"
    );
    assert_eq!(chat.attr("gen_ai.operation.name"), "chat");
    assert_eq!(chat.attr("gen_ai.provider.name"), "openai");
    assert_eq!(chat.attr("gen_ai.request.model"), "trace-model");
    assert_eq!(chat.attr("gen_ai.response.model"), "trace-model-2026");
    assert_eq!(chat.attr("gen_ai.usage.input_tokens"), 31);
    assert_eq!(chat.attr("gen_ai.usage.output_tokens"), 12);
    let sent = seen.lock().unwrap().clone();
    assert_eq!(
        sent,
        [Some(format!("00-{trace_id}-{}-01", chat.span_id))],
        "the model request carries the chat span's context"
    );
    // The model's server (the fake's own span, as a provider would report it) is a child of it.
    let served = find(&spans, "the model's server span", |s| s.service == "model");
    assert_eq!(served.name, "POST /v1/chat/completions");
    assert_eq!(
        served.parent_id, chat.span_id,
        "the model's span continues the chat span"
    );

    // History wrote the run from its messages, in the run's own trace: its acceptance under the
    // runs request that published it, its end under the worker's agent span.
    let recorded = find(&spans, "history.ingest.run", |s| {
        s.name == "history.ingest.run"
    });
    assert!(
        ancestors(&spans, recorded)
            .iter()
            .any(|s| s.span_id == post.span_id),
        "history's record of the run descends from the runs request:\n{}",
        tree(&spans)
    );
    let ended = find(&spans, "history.ingest.run_end", |s| {
        s.name == "history.ingest.run_end"
    });
    assert_eq!(ended.service, "history");
    assert!(
        ancestors(&spans, ended)
            .iter()
            .any(|s| s.span_id == agent.span_id),
        "history's record of the run's end descends from invoke_agent:\n{}",
        tree(&spans)
    );

    // History, reading the conversation, had the file's link signed by the attachments service.
    let sign = find(&spans, "attachments.sign.handle", |s| {
        s.name == "attachments.sign.handle"
    });
    assert!(
        ancestors(&spans, sign)
            .iter()
            .any(|s| s.service == "history" && s.name == "history.sign.urls"),
        "signing descends from history's:\n{}",
        tree(&spans)
    );
}

#[tokio::test]
async fn a_backend_tool_the_built_in_agent_runs_is_an_execute_tool_span() {
    let receiver = Receiver::start().await;
    let platform = ProcessPlatform::spawn_with_env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ])
    .await
    .unwrap();
    let alice = platform.infra.token("alice");
    let thread = uuid::Uuid::new_v4().to_string();
    let mut body = switchboard_system_tests::text_run(&thread, "tool", "/tool lookup {\"q\":1}");
    body["forwardedProps"] = json!({"agent": "echo"});
    let trace_id = uuid::Uuid::new_v4().simple().to_string();
    let response = platform
        .http
        .post(format!("{}/api/v1/agent/runs", platform.urls.runs))
        .bearer_auth(&alice)
        .header("traceparent", format!("00-{trace_id}-00f067aa0ba902b7-01"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let spans = receiver
        .trace(&trace_id, |spans| {
            spans.iter().any(|s| s.name == "execute_tool lookup")
                && spans.iter().any(|s| s.name == "invoke_agent echo")
        })
        .await;
    println!("the tool run's trace {trace_id}:\n{}", tree(&spans));
    let agent = find(&spans, "invoke_agent", |s| s.name == "invoke_agent echo");
    let tool = find(&spans, "execute_tool", |s| s.name == "execute_tool lookup");
    assert_eq!(tool.service, "worker");
    assert_eq!(
        tool.parent_id, agent.span_id,
        "the tool runs in the agent's span"
    );
    assert_eq!(tool.attr("gen_ai.operation.name"), "execute_tool");
    assert_eq!(tool.attr("gen_ai.tool.name"), "lookup");
    assert!(
        tool.attr("gen_ai.tool.call.id")
            .as_str()
            .is_some_and(|id| id.ends_with("-call-1")),
        "{:?}",
        tool.attributes
    );
}
