//! Runs relayed to real AG-UI agents: `tests/agents/serve.py`'s scripted Pydantic AI and
//! LangGraph agents behind `SB_WORKER_AGENTS_FILE` ([`AgentServer`]). The catalog lists them;
//! their streamed text, backend tool calls, reasoning and state reach the run's own stream; a
//! thread's earlier messages (from history) and last state (kept by the worker) reach the agent
//! with the next run; a file reaches it as a signed download link it fetches; its interrupt
//! becomes a WebSocket prompt whose answer resumes it; a cancel closes its request.
//! Each scenario runs against both frameworks at once on one platform, unless only one
//! framework has the behaviour.

use std::time::Duration;

use serde_json::{Value, json};
use sha2::Digest as _;
use switchboard_system_tests::agent_server::{AgentEntry, AgentServer, AgentsFile};
use switchboard_system_tests::{
    Options, TestPlatform, WsClient, read_sse, streamed_text, text_run, upload_file, ws_done,
    ws_reply_text,
};

const FRAMEWORKS: [&str; 2] = ["pydantic", "langgraph"];

/// How soon the agent must see its request closed after a cancel.
const CLOSE_WITHIN: Duration = Duration::from_secs(5);

/// A 1x1 PNG.
const PNG_BASE64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

fn description(framework: &str) -> String {
    match framework {
        "pydantic" => "Pydantic AI's scripted agent (AGUIAdapter).".to_owned(),
        _ => "LangGraph's scripted agent (ag-ui-langgraph).".to_owned(),
    }
}

/// Agent servers of `frameworks` (each configured under its framework's name, `default` the
/// one runs without an agent go to) and a platform relaying to them.
struct Fixture {
    platform: TestPlatform,
    token: String,
    servers: Vec<AgentServer>,
    _file: AgentsFile,
}

impl Fixture {
    async fn start(frameworks: &[&str], default: Option<&str>) -> Self {
        let servers =
            futures::future::try_join_all(frameworks.iter().map(|f| AgentServer::spawn(f)))
                .await
                .unwrap();
        let entries: Vec<AgentEntry> = servers
            .iter()
            .map(|server| AgentEntry {
                description: description(server.framework()),
                default: default == Some(server.framework()),
                ..AgentEntry::new(server.framework(), &server.url())
            })
            .collect();
        let file = AgentsFile::write(&entries).unwrap();
        let platform = TestPlatform::spawn_with(Options {
            agents_file: Some(file.path().to_owned()),
            // A thread's next run may be posted the moment the last one's stream ended.
            active_run_policy: runs::ActiveRunPolicy::Enqueue,
            ..Options::default()
        })
        .await
        .unwrap();
        let token = platform.infra.token("alice");
        Self {
            platform,
            token,
            servers,
            _file: file,
        }
    }

    fn server(&self, framework: &str) -> &AgentServer {
        self.servers
            .iter()
            .find(|s| s.framework() == framework)
            .unwrap()
    }

    /// Posts `body` with `Accept: text/event-stream` and reads the run's events to its end.
    async fn stream(&self, body: &Value) -> Vec<Value> {
        let response = self
            .platform
            .http
            .post(format!("{}/api/v1/agent/runs", self.platform.urls.runs))
            .bearer_auth(&self.token)
            .header("accept", "text/event-stream")
            .json(body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        if status != 200 {
            let text = response.text().await.unwrap_or_default();
            panic!("the run {} was answered {status}: {text}", body["runId"]);
        }
        data(read_sse(response, None).await.unwrap())
    }

    /// `GET /api/v1/agent/runs/{run}/events?compact=false`: the first `limit` events as the log
    /// stores them, or all of them.
    async fn events(&self, run: &str, limit: Option<usize>) -> Vec<Value> {
        let response = self
            .platform
            .http
            .get(format!(
                "{}/api/v1/agent/runs/{run}/events?compact=false",
                self.platform.urls.runs
            ))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "events of {run}");
        data(read_sse(response, limit).await.unwrap())
    }
}

fn data(frames: Vec<switchboard_system_tests::SseFrame>) -> Vec<Value> {
    frames.into_iter().map(|f| f.data).collect()
}

fn thread() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A run of `text` (or of content blocks) for the agent `agent`; `state` is `{}`, as the
/// seeds' clients send it.
fn run_for(agent: &str, thread: &str, run: &str, content: Value) -> Value {
    let mut body = text_run(thread, run, "");
    body["messages"][0]["content"] = content;
    body["forwardedProps"] = json!({"agent": agent});
    body
}

fn kinds(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or("?"))
        .collect()
}

fn count(events: &[Value], kind: &str) -> usize {
    events.iter().filter(|e| e["type"] == kind).count()
}

fn position(events: &[Value], kind: &str) -> usize {
    events
        .iter()
        .position(|e| e["type"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {:?}", kinds(events)))
}

/// The run started once (the worker's `RUN_STARTED`) and finished once, last, without error.
fn assert_finished(framework: &str, events: &[Value]) {
    let types = kinds(events);
    assert_eq!(
        (
            types.first().copied(),
            types.last().copied(),
            count(events, "RUN_STARTED"),
            count(events, "RUN_FINISHED"),
            count(events, "RUN_ERROR"),
        ),
        (Some("RUN_STARTED"), Some("RUN_FINISHED"), 1, 1, 0),
        "{framework}: one RUN_STARTED first, one RUN_FINISHED last: {events:?}"
    );
}

#[tokio::test]
async fn the_catalog_lists_the_agents_and_a_thread_reaches_the_agent_with_its_earlier_messages() {
    let fx = Fixture::start(&FRAMEWORKS, None).await;
    let (status, catalog) = fx
        .platform
        .api()
        .get_runs(&fx.token, "/api/v1/agents")
        .await
        .unwrap();
    assert_eq!(status, 200, "{catalog}");
    for framework in FRAMEWORKS {
        let listed = catalog["agents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == framework);
        assert_eq!(
            listed.map(|a| &a["description"]),
            Some(&json!(description(framework))),
            "{framework} is listed with its description: {catalog}"
        );
    }

    let fx = &fx;
    futures::future::join_all(FRAMEWORKS.map(|framework| async move {
        let thread = thread();
        let first = format!("{framework}-hello-1");
        let events = fx
            .stream(&run_for(framework, &thread, &first, json!("hello")))
            .await;
        assert_finished(framework, &events);
        assert_eq!(
            streamed_text(&events),
            "You said: hello (1 messages)",
            "{framework}: {events:?}"
        );
        assert!(
            count(&events, "TEXT_MESSAGE_CONTENT") >= 2,
            "{framework}: the reply arrived in parts: {:?}",
            kinds(&events)
        );

        // The client sends only its new message: the agent gets the thread's earlier two
        // from history.
        let second = format!("{framework}-hello-2");
        let events = fx
            .stream(&run_for(framework, &thread, &second, json!("hello")))
            .await;
        assert_finished(framework, &events);
        assert_eq!(
            streamed_text(&events),
            "You said: hello (3 messages)",
            "{framework}: the earlier messages reached the agent: {events:?}"
        );
        let server = fx.server(framework);
        assert_eq!(
            (server.requests(&first), server.requests(&second)),
            (1, 1),
            "{framework}: one request per run; log:\n{}",
            server.log()
        );

        let history = fx
            .platform
            .api()
            .wait_for_history(&fx.token, &thread, |h| {
                h["messages"].as_array().is_some_and(|m| m.len() >= 4)
                    && h["messages"][3]["content"] == "You said: hello (3 messages)"
            })
            .await
            .unwrap();
        let messages: Vec<(&str, &str)> = history["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["role"].as_str().unwrap_or("?"),
                    m["content"].as_str().unwrap_or("?"),
                )
            })
            .collect();
        assert_eq!(
            messages,
            [
                ("user", "hello"),
                ("assistant", "You said: hello (1 messages)"),
                ("user", "hello"),
                ("assistant", "You said: hello (3 messages)"),
            ],
            "{framework}: {history}"
        );
    }))
    .await;
}

#[tokio::test]
async fn a_backend_tool_call_is_relayed_with_its_result_and_the_answer_that_uses_it() {
    let fx = Fixture::start(&FRAMEWORKS, None).await;
    let fx = &fx;
    futures::future::join_all(FRAMEWORKS.map(|framework| async move {
        let run = format!("{framework}-tool");
        let events = fx
            .stream(&run_for(framework, &thread(), &run, json!("/tool x")))
            .await;
        assert_finished(framework, &events);
        let (start, args, end, result) = (
            position(&events, "TOOL_CALL_START"),
            position(&events, "TOOL_CALL_ARGS"),
            position(&events, "TOOL_CALL_END"),
            position(&events, "TOOL_CALL_RESULT"),
        );
        let answer = position(&events, "TEXT_MESSAGE_CONTENT");
        assert!(
            start < args && args < end && end < result && result < answer,
            "{framework}: start, args, end, result, then the answer: {:?}",
            kinds(&events)
        );
        let call = events[start]["toolCallId"].clone();
        assert_eq!(events[start]["toolCallName"], "lookup", "{framework}");
        let arguments: String = events
            .iter()
            .filter(|e| e["type"] == "TOOL_CALL_ARGS")
            .inspect(|e| assert_eq!(e["toolCallId"], call, "{framework}: {e}"))
            .filter_map(|e| e["delta"].as_str())
            .collect();
        assert_eq!(
            serde_json::from_str::<Value>(&arguments).unwrap(),
            json!({"query": "x"}),
            "{framework}"
        );
        assert_eq!(events[end]["toolCallId"], call, "{framework}");
        assert_eq!(events[result]["toolCallId"], call, "{framework}");
        let content: Value =
            serde_json::from_str(events[result]["content"].as_str().unwrap()).unwrap();
        assert_eq!(
            content,
            json!({"query": "x", "answer": "result for x", "length": 1}),
            "{framework}"
        );
        assert_eq!(
            streamed_text(&events),
            r#"Lookup result: {"answer":"result for x","length":1,"query":"x"}"#,
            "{framework}"
        );
    }))
    .await;
}

#[tokio::test]
async fn the_state_an_agent_left_reaches_the_next_run_of_the_thread_when_the_client_sends_none() {
    let fx = Fixture::start(&FRAMEWORKS, None).await;
    let fx = &fx;
    futures::future::join_all(FRAMEWORKS.map(|framework| async move {
        let thread = thread();
        let first = run_for(
            framework,
            &thread,
            &format!("{framework}-remember-1"),
            json!("/remember a"),
        );
        assert_eq!(first["state"], json!({}));
        let events = fx.stream(&first).await;
        assert_finished(framework, &events);
        assert_eq!(
            streamed_text(&events),
            "Notes: a",
            "{framework}: {events:?}"
        );

        let second = run_for(
            framework,
            &thread,
            &format!("{framework}-remember-2"),
            json!("/remember b"),
        );
        let events = fx.stream(&second).await;
        assert_finished(framework, &events);
        assert_eq!(
            streamed_text(&events),
            "Notes: a, b",
            "{framework}: the first run's state reached the second: {events:?}"
        );
        assert!(
            events
                .iter()
                .any(|e| e["type"] == "STATE_SNAPSHOT"
                    && e["snapshot"]["notes"] == json!(["a", "b"])),
            "{framework}: the new state is relayed: {:?}",
            kinds(&events)
        );
    }))
    .await;
}

#[tokio::test]
async fn an_agents_reasoning_passes_through_to_the_runs_event_stream() {
    let fx = Fixture::start(&FRAMEWORKS, None).await;
    let fx = &fx;
    futures::future::join_all(FRAMEWORKS.map(|framework| async move {
        let run = format!("{framework}-think");
        let streamed = fx
            .stream(&run_for(framework, &thread(), &run, json!("/think x")))
            .await;
        assert_finished(framework, &streamed);
        // Read again, as a client that reconnects does.
        let events = fx.events(&run, None).await;
        assert_eq!(
            events, streamed,
            "{framework}: the log is what was streamed"
        );
        let mut reasoning: Vec<&str> = kinds(&events)
            .into_iter()
            .filter(|k| k.starts_with("REASONING_"))
            .collect();
        reasoning.dedup();
        assert_eq!(
            reasoning,
            [
                "REASONING_START",
                "REASONING_MESSAGE_START",
                "REASONING_MESSAGE_CONTENT",
                "REASONING_MESSAGE_END",
                "REASONING_END"
            ],
            "{framework}: {:?}",
            kinds(&events)
        );
        let thought: String = events
            .iter()
            .filter(|e| e["type"] == "REASONING_MESSAGE_CONTENT")
            .filter_map(|e| e["delta"].as_str())
            .collect();
        assert_eq!(thought, "Thinking about x", "{framework}");
        assert!(
            position(&events, "REASONING_END") < position(&events, "TEXT_MESSAGE_START"),
            "{framework}: reasoning, then the answer: {:?}",
            kinds(&events)
        );
        assert_eq!(streamed_text(&events), "Thought about x", "{framework}");
    }))
    .await;
}

#[tokio::test]
async fn an_agent_fetches_an_uploaded_file_from_the_signed_link_it_is_given() {
    use base64::Engine as _;
    let fx = &Fixture::start(&FRAMEWORKS, None).await;
    let png = base64::engine::general_purpose::STANDARD
        .decode(PNG_BASE64)
        .unwrap();
    let expected = format!(
        "File: {} bytes, sha256 {}",
        png.len(),
        hex::encode(sha2::Sha256::digest(&png))
    );
    let content_url = upload_file(&fx.platform, &fx.token, "", png, "dot.png", "image/png").await;
    let (content_url, expected) = (&content_url, &expected);
    futures::future::join_all(FRAMEWORKS.map(|framework| async move {
        let run = format!("{framework}-file");
        let content = json!([
            {"type": "text", "text": "/file"},
            {"type": "binary", "mimeType": "image/png", "url": content_url, "filename": "dot.png"}
        ]);
        let events = fx
            .stream(&run_for(framework, &thread(), &run, content))
            .await;
        assert_finished(framework, &events);
        assert_eq!(
            &streamed_text(&events),
            expected,
            "{framework}: the agent read the uploaded bytes; stderr:\n{}",
            fx.server(framework).stderr()
        );
    }))
    .await;
}

/// A WebSocket turn of the seed's shape with one user message.
fn ws_user_message(id: &str, conversation: &str, text: &str) -> Value {
    json!({
        "type": "user_message", "schema_type": "string", "id": id, "conversation_id": conversation,
        "content": {"messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]},
        "timestamp": "2025-01-13T10:00:00Z"
    })
}

/// The WebSocket answer `answer` to the prompt `prompt`.
fn ws_answer(id: &str, conversation: &str, prompt: &str, answer: &str) -> Value {
    json!({
        "type": "user_interaction_message", "id": id, "thread_id": conversation,
        "parent_id": prompt, "conversation_id": conversation,
        "content": {"messages": [{"role": "user", "content": [{"type": "text", "text": answer}]}]},
        "timestamp": "2025-01-13T10:00:04Z"
    })
}

/// Asks `question` of the default agent over the WebSocket: the socket and the prompt.
async fn ws_ask(fx: &Fixture, conversation: &str, run: &str, question: &str) -> (WsClient, Value) {
    let mut ws = WsClient::connect(&fx.platform.urls.runs, &fx.token, "")
        .await
        .unwrap();
    ws.send(&ws_user_message(run, conversation, question))
        .await
        .unwrap();
    let asked = ws
        .until(|m| m["type"] == "system_interaction_message" || ws_done(m))
        .await
        .unwrap();
    let prompt = asked.last().unwrap().clone();
    assert_eq!(
        prompt["type"], "system_interaction_message",
        "the agent's interrupt is asked: {asked:?}"
    );
    (ws, prompt)
}

#[tokio::test]
async fn a_langgraph_question_is_answered_over_the_websocket_and_the_graph_resumes_with_it() {
    let fx = Fixture::start(&["langgraph"], Some("langgraph")).await;
    let conversation = format!("c-{}", uuid::Uuid::now_v7());
    let (mut ws, prompt) = ws_ask(&fx, &conversation, "lg-ask", "/ask What colour?").await;
    assert_eq!(
        (&prompt["content"]["input_type"], &prompt["content"]["text"]),
        (&json!("text"), &json!("What colour?")),
        "{prompt}"
    );
    ws.send(&ws_answer(
        "lg-answer",
        &conversation,
        prompt["id"].as_str().unwrap(),
        "blue",
    ))
    .await
    .unwrap();
    let answered = ws.until(ws_done).await.unwrap();
    assert_eq!(
        ws_reply_text(&answered),
        "You answered: blue",
        "{answered:?}"
    );
    let server = fx.server("langgraph");
    assert_eq!(server.requests("lg-ask"), 1, "{}", server.log());
    assert_eq!(
        server
            .log()
            .lines()
            .filter(|l| l.starts_with("request "))
            .count(),
        2,
        "the question's run and its continuation: {}",
        server.log()
    );
    ws.close().await.unwrap();
}

#[tokio::test]
async fn a_pydantic_ai_tool_approval_is_a_binary_choice_whose_answer_approves_or_denies_the_call() {
    let fx = Fixture::start(&["pydantic"], Some("pydantic")).await;
    let server = fx.server("pydantic");
    for (run, answer, expected) in [
        ("pa-approve", "approve", "You answered: approved"),
        ("pa-deny", "deny", "You cancelled: "),
    ] {
        // Each on a conversation of its own.
        let conversation = format!("c-{}", uuid::Uuid::now_v7());
        let (mut ws, prompt) = ws_ask(&fx, &conversation, run, "/ask What colour?").await;
        assert_eq!(
            prompt["content"]["input_type"], "binary_choice",
            "{run}: {prompt}"
        );
        let options: Vec<&str> = prompt["content"]["options"]
            .as_array()
            .map(|o| o.iter().filter_map(|o| o["value"].as_str()).collect())
            .unwrap_or_default();
        assert_eq!(options, ["approve", "deny"], "{run}: {prompt}");
        ws.send(&ws_answer(
            &format!("{run}-answer"),
            &conversation,
            prompt["id"].as_str().unwrap(),
            answer,
        ))
        .await
        .unwrap();
        let answered = ws.until(ws_done).await.unwrap();
        let reply = ws_reply_text(&answered);
        assert!(
            reply.starts_with(expected),
            "{run}: answered {answer:?}, the agent said {reply:?}, expected {expected:?}...: \
             {answered:?}"
        );
        assert_eq!(
            (
                server.requests(run),
                server.requests(&format!("{run}-answer"))
            ),
            (1, 1),
            "{run}: the question's run and its continuation; log:\n{}",
            server.log()
        );
        ws.close().await.unwrap();
    }
}

#[tokio::test]
async fn cancelling_a_streaming_remote_run_ends_it_cancelled_and_closes_the_agents_request() {
    let fx = Fixture::start(&FRAMEWORKS, None).await;
    let fx = &fx;
    futures::future::join_all(FRAMEWORKS.map(|framework| async move {
        let api = fx.platform.api();
        let run = format!("{framework}-slow");
        let (status, body) = api
            .post_run(
                &fx.token,
                &run_for(framework, &thread(), &run, json!("/slow")),
            )
            .await
            .unwrap();
        assert_eq!(status, 202, "{framework}: {body}");
        // Under way: a few of its 100 chunks (100 ms apart) have arrived.
        let before = fx.events(&run, Some(6)).await;
        assert!(
            count(&before, "TEXT_MESSAGE_CONTENT") >= 2,
            "{framework}: {:?}",
            kinds(&before)
        );

        let (status, body) = api.cancel_run(&fx.token, &run).await.unwrap();
        assert_eq!(status, 202, "{framework}: {body}");
        let server = fx.server(framework);
        server.wait_closed(&run, CLOSE_WITHIN).await.unwrap();

        let events = fx.events(&run, None).await;
        let last = events.last().unwrap();
        assert_eq!(
            (&last["type"], &last["code"]),
            (&json!("RUN_ERROR"), &json!("cancelled")),
            "{framework}: {:?}",
            kinds(&events)
        );
        assert_eq!(count(&events, "RUN_FINISHED"), 0, "{framework}");
        let text = streamed_text(&events);
        assert!(
            text.starts_with("chunk 0 chunk 1 ") && !text.contains("chunk 99"),
            "{framework}: part of the stream, not all of it: {text}"
        );
        api.wait_for_status(&fx.token, &run, "cancelled")
            .await
            .unwrap();
        assert_eq!(
            server.requests(&run),
            1,
            "{framework}: the agent was called once; log:\n{}",
            server.log()
        );
    }))
    .await;
}
