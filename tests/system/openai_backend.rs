//! The worker's OpenAI-compatible backend end to end: a chat-completions server (a stand-in for
//! the model provider, which this machine cannot reach) streams text and a tool call; the run's
//! AG-UI events, the request the model got, and what history kept.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use serde_json::{Value, json};
use switchboard_system_tests::{Options, TestPlatform, text_run};

type Seen = Arc<Mutex<Vec<(Option<String>, Value)>>>;

/// Answers every request with a streamed reply: two text chunks, then a call of `get_weather`
/// with its arguments in three fragments, then `[DONE]`.
async fn completions(
    State(seen): State<Seen>,
    headers: HeaderMap,
    body: axum::Json<Value>,
) -> axum::response::Response {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let wants_usage = body.0["stream_options"]["include_usage"] == true;
    seen.lock().unwrap().push((auth, body.0));
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "c1", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let mut sse = String::new();
    sse += &chunk(
        json!({"role": "assistant", "content": "Let me "}),
        Value::Null,
    );
    sse += &chunk(json!({"content": "check."}), Value::Null);
    sse += &chunk(
        json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"ci"}}]}),
        Value::Null,
    );
    sse += &chunk(
        json!({"tool_calls": [{"index": 0, "function": {"arguments": "ty\":\"Pa"}}]}),
        Value::Null,
    );
    sse += &chunk(
        json!({"tool_calls": [{"index": 0, "function": {"arguments": "ris\"}"}}]}),
        Value::Null,
    );
    sse += &chunk(json!({}), json!("tool_calls"));
    // Asked with `stream_options.include_usage`, the last chunk reports the tokens.
    if wants_usage {
        sse += &format!(
            "data: {}\n\n",
            json!({"id": "c1", "object": "chat.completion.chunk", "choices": [],
                   "usage": {"prompt_tokens": 31, "completion_tokens": 12, "total_tokens": 43,
                             "prompt_tokens_details": {"cached_tokens": 8},
                             "completion_tokens_details": {"reasoning_tokens": 4}}})
        );
    }
    sse += "data: [DONE]\n\n";
    axum::response::Response::builder()
        .header("content-type", "text/event-stream")
        .body(axum::body::Body::from(sse))
        .unwrap()
}

#[tokio::test]
async fn a_run_on_the_openai_backend_streams_text_and_a_client_tool_call() {
    let seen: Seen = Arc::default();
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(completions))
        .with_state(Arc::clone(&seen));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let platform = TestPlatform::spawn_with(Options {
        openai: Some(worker::openai::OpenAiConfig {
            base_url,
            model: "test-model".to_owned(),
            api_key: secrecy::SecretString::from("sk-test"),
            request_timeout: Duration::from_secs(10),
        }),
        ..Options::default()
    })
    .await
    .unwrap();
    let alice = platform.infra.token("alice");
    let thread = uuid::Uuid::new_v4().to_string();
    let mut body = text_run(&thread, "weather", "What is the weather in Paris?");
    body["tools"] = json!([{"name": "get_weather", "description": "Current weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    // Streamed: a 200 with the run's events (`stream_run` fails on any other answer).
    let events = platform.api().stream_run(&alice, &body).await.unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "RUN_STARTED",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END",
            "TOOL_CALL_START",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_END",
            "RUN_FINISHED"
        ]
    );
    let args: String = events
        .iter()
        .filter(|e| e["type"] == "TOOL_CALL_ARGS")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(args, r#"{"city":"Paris"}"#);
    assert_eq!(events[5]["toolCallName"], "get_weather");
    assert_eq!(events[5]["parentMessageId"], events[1]["messageId"]);

    // The tokens the model reported, on the terminal event and on the run's status.
    let usage = json!([{"provider": "openai", "model": "test-model", "inputTokens": 31,
        "outputTokens": 12, "totalTokens": 43, "reasoningTokens": 4, "cachedInputTokens": 8}]);
    assert_eq!(events.last().unwrap()["usage"], usage);
    let status = platform
        .api()
        .wait_for_status(&alice, "weather", "completed")
        .await
        .unwrap();
    assert_eq!(status["usage"], usage);

    // What the model was sent: the key, the model, the tools block and the tools, the question.
    let (auth, request) = seen.lock().unwrap().first().cloned().unwrap();
    assert_eq!(auth.as_deref(), Some("Bearer sk-test"));
    assert_eq!(
        (&request["model"], &request["stream"]),
        (&json!("test-model"), &json!(true))
    );
    assert_eq!(request["tools"][0]["function"]["name"], "get_weather");
    let messages = request["messages"].as_array().unwrap();
    assert_eq!(messages[0]["role"], "system");
    assert!(
        messages[0]["content"]
            .as_str()
            .unwrap()
            .contains("get_weather")
    );
    assert_eq!(messages.last().unwrap()["role"], "user");

    // History keeps the reply and the call on it.
    let history = platform
        .api()
        .wait_for_history(&alice, &thread, |h| {
            h["messages"][1]["content"] == "Let me check."
        })
        .await
        .unwrap();
    assert_eq!(history["messages"].as_array().unwrap().len(), 2);
    // Polled until history has applied the call's end (it lags the stream).
    let reply_id = events[1]["messageId"].as_str().unwrap().to_owned();
    let mut metadata = Value::Null;
    for _ in 0..200 {
        metadata = platform.message_metadata(&thread, &reply_id).await.unwrap();
        if metadata["tool_calls"][0]["arguments"]
            .as_str()
            .is_some_and(|a| !a.is_empty())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        metadata["tool_calls"],
        json!([{"id": "call_1", "name": "get_weather", "arguments": r#"{"city":"Paris"}"#}])
    );
}
