//! A stand-in for an OpenAI-compatible model provider (this machine cannot reach one): every
//! chat completion streams "Hello." and, when asked with `stream_options.include_usage`, reports
//! 31 prompt tokens (8 of them cached) and 12 completion tokens (4 of them reasoning).

use serde_json::{Value, json};

async fn completions(body: axum::Json<Value>) -> axum::response::Response {
    let mut sse = String::new();
    let mut chunks = vec![
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hello."}, "finish_reason": null}]}),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
    ];
    if body.0["stream_options"]["include_usage"] == true {
        chunks.push(json!({"choices": [], "usage": {
            "prompt_tokens": 31, "completion_tokens": 12, "total_tokens": 43,
            "prompt_tokens_details": {"cached_tokens": 8},
            "completion_tokens_details": {"reasoning_tokens": 4}}}));
    }
    for chunk in chunks {
        sse += &format!("data: {chunk}\n\n");
    }
    sse += "data: [DONE]\n\n";
    axum::response::Response::builder()
        .header("content-type", "text/event-stream")
        .body(axum::body::Body::from(sse))
        .unwrap_or_default()
}

/// Serves the fake model on a free loopback port until the test ends; its base URL
/// (`http://127.0.0.1:<port>/v1`, what `SB_OPENAI_BASE_URL` takes).
pub async fn spawn() -> anyhow::Result<String> {
    let app = axum::Router::new().route("/v1/chat/completions", axum::routing::post(completions));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base_url = format!("http://{}/v1", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(base_url)
}
