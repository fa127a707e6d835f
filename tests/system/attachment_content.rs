//! The chat API's `content_urls` reach the agent as content: files uploaded through the
//! attachments service are read from S3 by the worker, extracted (PDF and CSV to text, PNG to
//! a vision image), and the built-in agent describes what it received.

use base64::Engine as _;
use serde_json::{Value, json};
use switchboard_system_tests::{
    TestPlatform, WsClient, read_sse, streamed_text, upload_file as upload,
};

const PDF_TEXT: &str = "Switchboard quarterly numbers 4217";
const CSV: &str = "fruit,count\nmango,17\nkiwi,3\n";
/// A 1x1 PNG.
const PNG_BASE64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

/// A one-page PDF showing `text` in Helvetica, with a correct cross-reference table.
fn pdf_with_text(text: &str) -> Vec<u8> {
    let content = format!("BT /F1 12 Tf 72 700 Td ({text}) Tj ET");
    let objects = [
        "<< /Type /Catalog /Pages 2 0 R >>".to_owned(),
        "<< /Type /Pages /Kids [3 0 R] /Count 1 /MediaBox [0 0 612 792] >>".to_owned(),
        "<< /Type /Page /Parent 2 0 R /Resources << /Font << /F1 4 0 R >> >> /Contents 5 0 R >>"
            .to_owned(),
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>"
            .to_owned(),
        format!(
            "<< /Length {} >>\nstream\n{content}\nendstream",
            content.len()
        ),
    ];
    let mut pdf = b"%PDF-1.4\n".to_vec();
    let mut offsets = Vec::new();
    for (i, object) in objects.iter().enumerate() {
        offsets.push(pdf.len());
        pdf.extend_from_slice(format!("{} 0 obj\n{object}\nendobj\n", i + 1).as_bytes());
    }
    let xref = pdf.len();
    let mut table = format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1);
    for offset in offsets {
        table.push_str(&format!("{offset:010} 00000 n \n"));
    }
    table.push_str(&format!(
        "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
        objects.len() + 1
    ));
    pdf.extend_from_slice(table.as_bytes());
    pdf
}

async fn chat(
    platform: &TestPlatform,
    token: &str,
    session: &str,
    urls: &[&str],
) -> reqwest::Response {
    platform
        .http
        .post(format!("{}/v2/chat", platform.urls.runs))
        .bearer_auth(token)
        .header("accept", "text/event-stream")
        .json(&json!({"message": "describe", "session_id": session, "content_urls": urls}))
        .send()
        .await
        .unwrap()
}

fn session() -> String {
    format!("s-{}", uuid::Uuid::new_v4())
}

#[tokio::test]
async fn the_agent_receives_pdf_and_csv_text_and_a_png_image_from_content_urls() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let session = session();
    let png = base64::engine::general_purpose::STANDARD
        .decode(PNG_BASE64)
        .unwrap();
    let pdf_url = upload(
        &platform,
        &alice,
        &session,
        pdf_with_text(PDF_TEXT),
        "report.pdf",
        "application/pdf",
    )
    .await;
    let csv_url = upload(
        &platform,
        &alice,
        &session,
        CSV.as_bytes().to_vec(),
        "fruit.csv",
        "text/csv",
    )
    .await;
    let png_url = upload(
        &platform,
        &alice,
        &session,
        png.clone(),
        "dot.png",
        "image/png",
    )
    .await;

    let response = chat(&platform, &alice, &session, &[&pdf_url, &csv_url, &png_url]).await;
    assert_eq!(response.status(), 200);
    let events: Vec<Value> = read_sse(response, None)
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.data)
        .collect();
    assert_eq!(
        events.last().map(|e| &e["type"]),
        Some(&json!("RUN_FINISHED")),
        "{events:?}"
    );
    let messages: std::collections::HashSet<&str> = events
        .iter()
        .filter(|e| e["type"] == "TEXT_MESSAGE_START")
        .map(|e| e["messageId"].as_str().unwrap())
        .collect();
    assert_eq!(messages.len(), 1, "one assistant message: {events:?}");
    let text = streamed_text(&events);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.first(), Some(&"You said: describe"), "{text}");
    let pdf_line = lines
        .iter()
        .find(|l| l.starts_with("Attachment report.pdf (application/pdf): "))
        .unwrap_or_else(|| panic!("no PDF line in {text}"));
    assert!(
        pdf_line.contains("characters of text") && pdf_line.contains(PDF_TEXT),
        "the PDF's text was extracted: {pdf_line}"
    );
    let csv_line = lines
        .iter()
        .find(|l| l.starts_with("Attachment fruit.csv (text/csv): "))
        .unwrap_or_else(|| panic!("no CSV line in {text}"));
    assert!(
        csv_line.contains(&format!("{} characters of text", CSV.len()))
            && csv_line.contains("fruit,count mango,17 kiwi,3"),
        "the CSV's text was read: {csv_line}"
    );
    assert!(
        lines.contains(
            &format!("Attachment dot.png (image/png): image, {} bytes", png.len()).as_str()
        ),
        "the PNG became an image block: {text}"
    );
    assert_eq!(lines.len(), 5, "echo, blank line, three files: {text}");
}

#[tokio::test]
async fn a_fourth_file_and_another_owners_file_are_refused_before_any_run() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let bob = platform.infra.token("bob");
    let session = session();
    let mine = upload(
        &platform,
        &alice,
        &session,
        b"alice's notes\n".to_vec(),
        "notes.txt",
        "text/plain",
    )
    .await;
    let response = chat(&platform, &alice, &session, &[&mine, &mine, &mine, &mine]).await;
    assert_eq!(response.status(), 422);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(
        (
            answer["error"]["field"].as_str(),
            answer["error"]["message"].as_str()
        ),
        (
            Some("/messages/0/content"),
            Some("a message may carry at most 3 files")
        ),
        "{answer}"
    );

    let theirs = upload(
        &platform,
        &bob,
        &session,
        b"bob's secret\n".to_vec(),
        "secret.txt",
        "text/plain",
    )
    .await;
    let response = chat(&platform, &alice, &session, &[&theirs]).await;
    assert_eq!(response.status(), 422);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(
        answer["error"]["message"], "url does not point to a file you own",
        "{answer}"
    );
    assert!(
        answer["error"]["field"]
            .as_str()
            .is_some_and(|f| f.starts_with("/messages/0/content/1/")),
        "the refused block is named: {answer}"
    );

    // Alice's own file in the same request shape is accepted and read.
    let response = chat(&platform, &alice, &session, &[&mine]).await;
    assert_eq!(response.status(), 200);
    let frames = read_sse(response, None).await.unwrap();
    let text = streamed_text(frames.iter().map(|f| &f.data));
    assert!(
        text.contains(
            "Attachment notes.txt (text/plain): 14 characters of text: \"alice's notes\""
        ),
        "{text}"
    );
}

#[tokio::test]
async fn a_chat_over_the_websocket_streams_the_reply_and_its_files_join_the_session() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let session = session();
    // The document's client asks for the upload with no session_id.
    let csv_url = upload(
        &platform,
        &alice,
        "",
        CSV.as_bytes().to_vec(),
        "fruit.csv",
        "text/csv",
    )
    .await;
    let mut ws = WsClient::connect(&platform.urls.runs, &alice, "")
        .await
        .unwrap();
    ws.send(
        &json!({"type": "chat", "message": "describe", "session_id": session,
                    "content_urls": [csv_url]}),
    )
    .await
    .unwrap();
    let messages = ws
        .until(|m| m["type"] == "system_response_message" && m["status"] == "completed")
        .await
        .unwrap();
    assert!(
        messages.iter().all(|m| m["type"] != "error_message"),
        "{messages:?}"
    );
    let text: String = messages
        .iter()
        .filter(|m| m["type"] == "system_response_message")
        .filter_map(|m| m["content"]["text"].as_str())
        .collect();
    assert!(
        text.starts_with("You said: describe") && text.contains("Attachment fruit.csv (text/csv)"),
        "{text}"
    );
    // The file sent in the chat is now part of the session's workspace, as an upload.
    let response = platform
        .http
        .get(format!("{}/v2/files", platform.urls.attachments))
        .query(&[("session_id", &session)])
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let listing: Value = response.json().await.unwrap();
    let files = listing["files"].as_array().unwrap();
    assert_eq!(
        files
            .iter()
            .map(|f| (
                f["content_url"].as_str().unwrap(),
                f["source"].as_str().unwrap()
            ))
            .collect::<Vec<_>>(),
        [(csv_url.as_str(), "upload")],
        "{listing}"
    );
}
