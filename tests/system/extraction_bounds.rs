//! Issue 14: hostile files cannot take the worker down. Decompression bombs uploaded through
//! the attachments service and sent with `/v2/chat` are refused with a reason the agent
//! passes on, the run finishes, and another user's run on the same platform is read and
//! answered normally. The worker extracts in `switchboard-extract` helper processes (built
//! with the workspace's binaries), one of which dies at its memory limit here.

use serde_json::{Value, json};
use switchboard_system_tests::{TestPlatform, read_sse, streamed_text, upload_file as upload};

/// A 1 KiB BMP declaring 9000x9000 8-bit pixels, RLE8-compressed to only the end-of-bitmap
/// marker: 243 MB of RGB for a decoder that trusts it.
fn rle8_bmp_bomb() -> Vec<u8> {
    let palette: Vec<u8> = (0..=255u8).flat_map(|i| [i, i, i, 0]).collect();
    let offset = 14 + 40 + palette.len() as u32;
    let mut out = b"BM".to_vec();
    for word in [offset + 2, 0, offset, 40, 9000, 9000] {
        out.extend_from_slice(&u32::to_le_bytes(word));
    }
    out.extend_from_slice(&1u16.to_le_bytes()); // planes
    out.extend_from_slice(&8u16.to_le_bytes()); // bits per pixel
    for word in [1, 2, 2835, 2835, 256, 0] {
        out.extend_from_slice(&u32::to_le_bytes(word)); // BI_RLE8, data size, ..., colours
    }
    out.extend_from_slice(&palette);
    out.extend_from_slice(&[0, 1]); // end of bitmap
    out
}

/// A PDF of about `size` bytes, nearly all one array of `0`s: lopdf loads it as millions of
/// objects, about 60 times the file in memory.
fn array_pdf_bomb(size: usize) -> Vec<u8> {
    let mut array = b"[".to_vec();
    while array.len() + 2 < size {
        array.extend_from_slice(b"0 ");
    }
    array.push(b']');
    let objects: [&[u8]; 5] = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 /MediaBox [0 0 612 792] >>",
        b"<< /Type /Page /Parent 2 0 R /Contents 4 0 R >>",
        b"<< /Length 5 >>\nstream\nBT ET\nendstream",
        &array,
    ];
    let mut pdf = b"%PDF-1.5\n".to_vec();
    let mut offsets = Vec::new();
    for (i, object) in objects.iter().enumerate() {
        offsets.push(pdf.len());
        pdf.extend_from_slice(format!("{} 0 obj\n", i + 1).as_bytes());
        pdf.extend_from_slice(object);
        pdf.extend_from_slice(b"\nendobj\n");
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

/// Sends `/v2/chat` with `urls` and returns the run's events.
async fn chat(platform: &TestPlatform, token: &str, session: &str, urls: &[&str]) -> Vec<Value> {
    let response = platform
        .http
        .post(format!("{}/v2/chat", platform.urls.runs))
        .bearer_auth(token)
        .header("accept", "text/event-stream")
        .json(&json!({"message": "describe", "session_id": session, "content_urls": urls}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    read_sse(response, None)
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.data)
        .collect()
}

fn session() -> String {
    format!("s-{}", uuid::Uuid::new_v4())
}

#[tokio::test]
async fn bombs_are_refused_with_a_reason_and_another_users_run_is_unaffected() {
    let platform = TestPlatform::spawn().await.unwrap();
    let (alice, bob) = (platform.infra.token("alice"), platform.infra.token("bob"));
    let (alice_session, bob_session) = (session(), session());
    let bmp = upload(
        &platform,
        &alice,
        &alice_session,
        rle8_bmp_bomb(),
        "bomb.bmp",
        "image/bmp",
    )
    .await;
    let pdf = upload(
        &platform,
        &alice,
        &alice_session,
        array_pdf_bomb(12 * 1000 * 1000),
        "array.pdf",
        "application/pdf",
    )
    .await;
    let csv = upload(
        &platform,
        &bob,
        &bob_session,
        b"fruit,count\nmango,17\n".to_vec(),
        "fruit.csv",
        "text/csv",
    )
    .await;

    // Both users' runs at once, on the same worker.
    let (alice_files, bob_files) = ([bmp.as_str(), pdf.as_str()], [csv.as_str()]);
    let (alice_events, bob_events) = tokio::join!(
        chat(&platform, &alice, &alice_session, &alice_files),
        chat(&platform, &bob, &bob_session, &bob_files),
    );

    assert_eq!(
        alice_events.last().map(|e| &e["type"]),
        Some(&json!("RUN_FINISHED")),
        "{alice_events:?}"
    );
    let text = streamed_text(&alice_events);
    assert!(
        text.contains(
            "Attachment bomb.bmp (image/bmp): not readable (could not read bomb.bmp: the image declares 9000x9000 pixels, over the 67-megapixel limit)"
        ),
        "the BMP is refused from its header: {text}"
    );
    assert!(
        text.contains(
            "Attachment array.pdf (application/pdf): not readable (could not read array.pdf: it needs more than the 384 MiB of memory a file may use to be read)"
        ),
        "the PDF's helper died at its memory limit, and the agent says so: {text}"
    );

    assert_eq!(
        bob_events.last().map(|e| &e["type"]),
        Some(&json!("RUN_FINISHED")),
        "{bob_events:?}"
    );
    let text = streamed_text(&bob_events);
    assert!(
        text.contains("Attachment fruit.csv (text/csv): 21 characters of text"),
        "bob's file is read as usual: {text}"
    );

    // The worker is still there for the next run.
    let again = chat(&platform, &bob, &bob_session, &[&csv]).await;
    assert_eq!(
        again.last().map(|e| &e["type"]),
        Some(&json!("RUN_FINISHED")),
        "{again:?}"
    );
}
