//! Audio parts (AG-UI 1.0 `audio`, the WebSocket's `input_audio` by URL): an uploaded audio
//! file is admitted like an image where the agent's input schema takes files, checked to be
//! audio, and reaches the agent; inline audio and an audio part naming another kind of file
//! are refused, naming the field.

use serde_json::{Value, json};
use switchboard_system_tests::{
    TestPlatform, WsClient, read_sse, streamed_text, upload_file, ws_done, ws_reply_text,
};

/// A short, valid WAV file: a 44-byte header and 100 samples of silence (8 kHz, 8-bit mono).
fn wav() -> Vec<u8> {
    let samples = 100u32;
    let mut bytes = Vec::new();
    bytes.extend_from_slice(b"RIFF");
    bytes.extend_from_slice(&(36 + samples).to_le_bytes());
    bytes.extend_from_slice(b"WAVEfmt ");
    bytes.extend_from_slice(&16u32.to_le_bytes());
    bytes.extend_from_slice(&1u16.to_le_bytes()); // PCM
    bytes.extend_from_slice(&1u16.to_le_bytes()); // mono
    bytes.extend_from_slice(&8000u32.to_le_bytes());
    bytes.extend_from_slice(&8000u32.to_le_bytes());
    bytes.extend_from_slice(&1u16.to_le_bytes());
    bytes.extend_from_slice(&8u16.to_le_bytes());
    bytes.extend_from_slice(b"data");
    bytes.extend_from_slice(&samples.to_le_bytes());
    bytes.extend(std::iter::repeat_n(128u8, samples as usize));
    bytes
}

fn run_with(thread: &str, run: &str, parts: Value, agent: Option<&str>) -> Value {
    let mut body = json!({
        "threadId": thread, "runId": run, "state": {},
        "messages": [{"id": format!("{run}-user"), "role": "user", "content": parts}],
        "tools": [], "context": [], "forwardedProps": {}
    });
    if let Some(agent) = agent {
        body["forwardedProps"] = json!({"agent": agent});
    }
    body
}

async fn post(platform: &TestPlatform, token: &str, body: &Value) -> (u16, Value, String) {
    let response = platform
        .http
        .post(format!("{}/api/v1/agent/runs", platform.urls.runs))
        .bearer_auth(token)
        .header("accept", "text/event-stream")
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    if status != 200 {
        return (
            status,
            response.json().await.unwrap_or(Value::Null),
            String::new(),
        );
    }
    let frames = read_sse(response, None).await.unwrap();
    let events: Vec<&Value> = frames.iter().map(|f| &f.data).collect();
    (status, Value::Null, streamed_text(events))
}

#[tokio::test]
async fn an_uploaded_audio_file_reaches_the_agent_and_a_wrong_or_inline_one_is_refused() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let audio = upload_file(&platform, &alice, "", wav(), "hello.wav", "audio/wav").await;
    let pdf = upload_file(
        &platform,
        &alice,
        "",
        b"%PDF-1.4\n%%EOF\n".to_vec(),
        "notes.pdf",
        "application/pdf",
    )
    .await;
    let thread = uuid::Uuid::new_v4().to_string();
    let audio_part = |url: &str| json!({"type": "audio", "source": {"type": "url", "value": url}});

    // The echo agent takes files: it is told what the audio file is.
    let body = run_with(
        &thread,
        "a1",
        json!([{"type": "text", "text": "listen to this"}, audio_part(&audio)]),
        None,
    );
    let (status, refused, reply) = post(&platform, &alice, &body).await;
    assert_eq!(status, 200, "{refused}");
    assert!(reply.starts_with("You said: listen to this"), "{reply}");
    assert!(
        reply.contains("Attachment hello.wav (audio/wav): not readable (audio is not transcribed"),
        "{reply}"
    );

    // An audio part naming a PDF: refused at admission, naming the block.
    let body = run_with(
        &uuid::Uuid::new_v4().to_string(),
        "a2",
        json!([{"type": "text", "text": "listen"}, audio_part(&pdf)]),
        None,
    );
    let (status, refused, _) = post(&platform, &alice, &body).await;
    assert_eq!(status, 422, "{refused}");
    assert_eq!(refused["error"]["field"], "/messages/0/content/1/mimeType");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("audio content requires an audio file, not application/pdf"),
        "{refused}"
    );
    // An image part naming the audio file: the seed's image rule.
    let body = run_with(
        &uuid::Uuid::new_v4().to_string(),
        "a3",
        json!([{"type": "text", "text": "look"},
               {"type": "image", "source": {"type": "url", "value": audio}}]),
        None,
    );
    let (status, refused, _) = post(&platform, &alice, &body).await;
    assert_eq!(status, 422, "{refused}");
    assert_eq!(
        refused["error"]["message"],
        "binary content requires image mimeType"
    );
    // Inline audio: refused before any lookup.
    let body = run_with(
        &uuid::Uuid::new_v4().to_string(),
        "a4",
        json!([{"type": "text", "text": "listen"},
               {"type": "audio", "source": {"type": "data", "value": "UklGRg==", "mimeType": "audio/wav"}}]),
        None,
    );
    let (status, refused, _) = post(&platform, &alice, &body).await;
    assert_eq!(status, 422, "{refused}");
    assert_eq!(refused["error"]["field"], "/messages/0/content/1/source");
    // An agent whose input schema takes no files refuses it like any file.
    let body = run_with(
        &uuid::Uuid::new_v4().to_string(),
        "a5",
        json!([{"type": "text", "text": "listen"}, audio_part(&audio)]),
        Some("echo-text"),
    );
    let (status, refused, _) = post(&platform, &alice, &body).await;
    assert_eq!(status, 422, "{refused}");
    // Another owner's audio file is not found for bob.
    let bob = platform.infra.token("bob");
    let body = run_with(
        &uuid::Uuid::new_v4().to_string(),
        "b1",
        json!([{"type": "text", "text": "listen"}, audio_part(&audio)]),
        None,
    );
    let (status, refused, _) = post(&platform, &bob, &body).await;
    assert_eq!(status, 422, "{refused}");

    // The WebSocket's input_audio, by the uploaded file's URL.
    let mut ws = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();
    ws.send(&json!({
        "type": "user_message", "id": "w1", "conversation_id": format!("c-{thread}"),
        "content": {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "hear this"},
            {"type": "input_audio", "input_audio": {"url": audio}}
        ]}]}
    }))
    .await
    .unwrap();
    let answered = ws.until(ws_done).await.unwrap();
    let text = ws_reply_text(&answered);
    assert!(text.contains("Attachment hello.wav (audio/wav)"), "{text}");
}
