//! Files an agent makes (issue 13): the built-in agent's `/file` and `/file-large` commands
//! register a file with the attachments service (inline, or through the presigned upload path
//! when large), the WebSocket client sees it as it happens, and history, the session's
//! workspace and the download URL all show the same verified file with `source: "generated"`.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use switchboard_system_tests::{
    TestPlatform, WsClient, ws_done as is_done, ws_reply_text as response_text,
};

fn user_message(id: &str, conversation: &str, text: &str) -> Value {
    json!({
        "type": "user_message", "id": id, "conversation_id": conversation,
        "content": {"messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}
    })
}

/// Sends `text` as a new turn and returns the files of the attachments message the client got
/// before `completed`, and everything it got.
async fn make_file(
    ws: &mut WsClient,
    id: &str,
    conversation: &str,
    text: &str,
) -> (Value, Vec<Value>) {
    ws.send(&user_message(id, conversation, text))
        .await
        .unwrap();
    let messages = ws.until(is_done).await.unwrap();
    let done = messages.len() - 1;
    assert_eq!(
        messages[done]["type"], "system_response_message",
        "{messages:?}"
    );
    let attachments: Vec<usize> = (0..messages.len())
        .filter(|&i| messages[i]["content"]["name"] == "attachments")
        .collect();
    let [at] = attachments.as_slice() else {
        panic!("one attachments message: {messages:?}");
    };
    let message = &messages[*at];
    assert!(*at < done, "the files come before completed: {messages:?}");
    assert_eq!(
        (&message["type"], &message["status"], &message["parent_id"]),
        (
            &json!("system_intermediate_message"),
            &json!("completed"),
            &json!(id)
        ),
        "{message}"
    );
    let files: Value =
        serde_json::from_str(message["content"]["payload"].as_str().unwrap()).unwrap();
    (files, messages)
}

/// The stored bytes of `content_url`, through `GET /v2/files/download-url`.
async fn download(platform: &TestPlatform, token: &str, content_url: &str) -> (Value, Vec<u8>) {
    let signed: Value = platform
        .http
        .get(format!(
            "{}/v2/files/download-url",
            platform.urls.attachments
        ))
        .bearer_auth(token)
        .query(&[("content_url", content_url)])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let url = signed["url"]
        .as_str()
        .unwrap_or_else(|| panic!("a download URL: {signed}"));
    let bytes = platform
        .http
        .get(url)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    (signed, bytes.to_vec())
}

/// The session's workspace file named `content_url`.
async fn workspace_file(
    platform: &TestPlatform,
    token: &str,
    session: &str,
    content_url: &str,
) -> Value {
    let listing: Value = platform
        .http
        .get(format!("{}/v2/files", platform.urls.attachments))
        .bearer_auth(token)
        .query(&[("session_id", session)])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    listing["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["content_url"] == content_url)
        .cloned()
        .unwrap_or_else(|| panic!("{content_url} is in the workspace: {listing}"))
}

/// The `attachments` of the session's last assistant message in `GET /v2/history`.
async fn history_attachments(platform: &TestPlatform, token: &str, session: &str) -> Value {
    let (status, history) = platform
        .api()
        .get_history(token, "/v2/history", &[("session_id", session)])
        .await
        .unwrap();
    assert_eq!(status, 200, "{history}");
    let assistant = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "assistant")
        .cloned()
        .unwrap_or_else(|| panic!("an assistant message: {history}"));
    assistant["attachments"].clone()
}

#[tokio::test]
async fn a_generated_file_reaches_the_websocket_history_workspace_and_download_as_generated() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let mut ws = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();
    let conversation = format!("c-{}", uuid::Uuid::now_v7());

    let (files, messages) =
        make_file(&mut ws, "m1", &conversation, "/file notes.md hello world").await;
    assert_eq!(response_text(&messages), "Here is notes.md.");
    let file = &files[0];
    assert_eq!(files.as_array().map(Vec::len), Some(1), "{files}");
    assert_eq!(
        (
            &file["path"],
            &file["filename"],
            &file["icon_type"],
            &file["source"]
        ),
        (
            &json!("/notes.md"),
            &json!("notes.md"),
            &json!("md"),
            &json!("generated")
        ),
        "{file}"
    );
    let content_url = file["content_url"].as_str().unwrap();
    assert!(content_url.starts_with("s3://"), "{content_url}");

    // The runs service sends the terminal event once history has written the run.
    assert_eq!(
        history_attachments(&platform, &alice, &conversation).await,
        files,
        "history shows the same files under the assistant message"
    );
    let listed = workspace_file(&platform, &alice, &conversation, content_url).await;
    assert_eq!(
        (&listed["filename"], &listed["source"], &listed["status"]),
        (&json!("notes.md"), &json!("generated"), &json!("verified")),
        "{listed}"
    );
    let (signed, bytes) = download(&platform, &alice, content_url).await;
    assert_eq!(bytes, b"hello world", "{signed}");

    // A file the attachments service refuses is told to the user; the run still completes.
    ws.send(&user_message("m2", &conversation, "/file empty.md"))
        .await
        .unwrap();
    let refused = ws.until(is_done).await.unwrap();
    assert!(
        !refused
            .iter()
            .any(|m| m["content"]["name"] == "attachments"),
        "no files shown: {refused:?}"
    );
    assert_eq!(
        response_text(&refused),
        "Here is empty.md.Could not attach empty.md: a generated file must be 1 byte to 100 MB"
    );
    ws.close().await.unwrap();
}

#[tokio::test]
async fn a_large_generated_file_goes_through_the_upload_path_and_is_verified() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let mut ws = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();
    let conversation = format!("c-{}", uuid::Uuid::now_v7());

    let (files, messages) =
        make_file(&mut ws, "big-1", &conversation, "/file-large big.txt 1024").await;
    assert_eq!(response_text(&messages), "Here is big.txt.");
    let file = &files[0];
    assert_eq!(
        (
            &file["path"],
            &file["filename"],
            &file["icon_type"],
            &file["source"]
        ),
        (
            &json!("/big.txt"),
            &json!("big.txt"),
            &json!("txt"),
            &json!("generated")
        ),
        "{file}"
    );
    let content_url = file["content_url"].as_str().unwrap();
    assert!(
        content_url.contains("/generated/"),
        "stored under generated/: {content_url}"
    );
    assert_eq!(
        history_attachments(&platform, &alice, &conversation).await,
        files
    );
    let size = 1024 * 1024;
    let listed = workspace_file(&platform, &alice, &conversation, content_url).await;
    assert_eq!(
        (&listed["source"], &listed["status"], &listed["file_size"]),
        (&json!("generated"), &json!("verified"), &json!(size)),
        "over 768 KiB, uploaded and verified: {listed}"
    );
    let (signed, bytes) = download(&platform, &alice, content_url).await;
    assert_eq!((bytes.len(), &signed["file_size"]), (size, &json!(size)));
    let expected: Vec<u8> = b"All work and no play makes a large generated file.\n"
        .iter()
        .copied()
        .cycle()
        .take(size)
        .collect();
    assert_eq!(
        hex::encode(Sha256::digest(&bytes)),
        hex::encode(Sha256::digest(&expected)),
        "the stored bytes are the ones the agent made"
    );
    ws.close().await.unwrap();
}
