//! Server-side uploads, workspace files, and the attachments service's NATS endpoints.

use base64::Engine as _;
use serde_json::{Value, json};
use switchboard_system_tests::TestPlatform;

const PDF_HEAD: &[u8] = b"%PDF-1.7\n";

async fn server_upload(
    platform: &TestPlatform,
    token: &str,
    form: reqwest::multipart::Form,
) -> (u16, Value) {
    let response = platform
        .http
        .post(format!(
            "{}/api/v1/agent/attachments",
            platform.urls.attachments
        ))
        .bearer_auth(token)
        .multipart(form)
        .send()
        .await
        .unwrap();
    (
        response.status().as_u16(),
        response.json().await.unwrap_or(Value::Null),
    )
}

fn file_part(bytes: Vec<u8>, name: &str, mime: &str) -> reqwest::multipart::Part {
    reqwest::multipart::Part::bytes(bytes)
        .file_name(name.to_owned())
        .mime_str(mime)
        .unwrap()
}

fn pdf(size: usize) -> Vec<u8> {
    let mut bytes = PDF_HEAD.to_vec();
    bytes.extend((0..size - PDF_HEAD.len()).map(|i| (i * 7 % 251) as u8));
    bytes
}

#[tokio::test]
async fn a_multi_part_server_upload_is_stored_whole_and_answers_a_signed_url() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let bytes = pdf(9 * 1024 * 1024 + 123); // more than one 8 MiB part
    let form = reqwest::multipart::Form::new()
        .text("session_id", "thread-1")
        .part(
            "file",
            file_part(bytes.clone(), "../../report.pdf", "application/pdf"),
        );
    let (status, answer) = server_upload(&platform, &alice, form).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["bucket"], platform.s3.bucket.as_str());
    assert_eq!(answer["mime_type"], "application/pdf");
    assert!(
        answer["path"].as_str().unwrap().ends_with("/report.pdf"),
        "{answer}"
    );
    let fetched = platform
        .http
        .get(answer["url"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(fetched.status().as_u16(), 200);
    assert_eq!(fetched.bytes().await.unwrap().len(), bytes.len());

    // The same content again is the same file.
    let form = reqwest::multipart::Form::new()
        .part("file", file_part(bytes, "again.pdf", "application/pdf"));
    let (_, again) = server_upload(&platform, &alice, form).await;
    assert_eq!(again["path"], answer["path"], "dedup per owner");
}

#[tokio::test]
async fn server_uploads_refuse_wrong_bytes_unknown_types_and_oversized_files() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let form = reqwest::multipart::Form::new().part(
        "file",
        file_part(b"not a pdf".to_vec(), "a.pdf", "application/pdf"),
    );
    let (status, answer) = server_upload(&platform, &alice, form).await;
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (400, Some("file")),
        "{answer}"
    );
    let form = reqwest::multipart::Form::new().part(
        "file",
        file_part(b"MZ".to_vec(), "a.exe", "application/x-msdownload"),
    );
    let (status, answer) = server_upload(&platform, &alice, form).await;
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (400, Some("file_type")),
        "{answer}"
    );

    // 100 MB + 1 byte, streamed so the test does not hold it in memory.
    let chunk = bytes::Bytes::from(vec![b'a'; 1024 * 1024]);
    let mut chunks: Vec<bytes::Bytes> = vec![bytes::Bytes::from_static(b"plain text ")];
    chunks.extend(std::iter::repeat_n(chunk, 100));
    let body = reqwest::Body::wrap_stream(futures::stream::iter(
        chunks.into_iter().map(Ok::<_, std::io::Error>),
    ));
    let part = reqwest::multipart::Part::stream(body)
        .file_name("big.txt")
        .mime_str("text/plain")
        .unwrap();
    let (status, answer) = server_upload(
        &platform,
        &alice,
        reqwest::multipart::Form::new().part("file", part),
    )
    .await;
    assert_eq!(status, 413, "{answer}");
}

#[tokio::test]
async fn a_session_lists_its_uploads_and_generated_files_and_nothing_of_others() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let form = reqwest::multipart::Form::new()
        .text("session_id", "s-1")
        .part("file", file_part(pdf(2048), "spec.pdf", "application/pdf"));
    let (status, _) = server_upload(&platform, &alice, form).await;
    assert_eq!(status, 200);

    // The worker registers a generated file over NATS.
    let (client, _) = platform::nats::connect(&platform.nats, "worker")
        .await
        .unwrap();
    let request = json!({"v": "1", "owner": "alice", "session_id": "s-1", "file_name": "report.md",
        "content_type": "text/plain",
        "content_base64": base64::engine::general_purpose::STANDARD.encode("# Report\n")});
    let reply = client
        .request(
            platform.nats.names.attachments_register_subject(),
            serde_json::to_vec(&request).unwrap().into(),
        )
        .await
        .unwrap();
    let reply: Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(reply["outcome"], "registered", "{reply}");
    let generated_url = reply["content_url"].as_str().unwrap().to_owned();

    let list = |token: String, session: &'static str| {
        let request = platform
            .http
            .get(format!("{}/v2/files", platform.urls.attachments))
            .bearer_auth(token)
            .query(&[("session_id", session)]);
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let listing = list(alice.clone(), "s-1").await;
    let files = listing["files"].as_array().unwrap();
    let summary: Vec<(&str, &str, &str)> = files
        .iter()
        .map(|f| {
            (
                f["filename"].as_str().unwrap(),
                f["source"].as_str().unwrap(),
                f["icon_type"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("spec.pdf", "upload", "pdf"),
            ("report.md", "generated", "txt")
        ]
    );
    assert_eq!(files[1]["content_url"], generated_url.as_str());
    let bob = platform.infra.token("bob");
    assert_eq!(
        list(bob, "s-1").await["files"],
        json!([]),
        "bob's session s-1 is his own, and empty"
    );

    // Bulk signing answers only for the owner's verified files, in order.
    let request = json!({"v": "1", "owner": "alice", "urls": [generated_url, "s3://other/missing.txt", "garbage"]});
    let reply = client
        .request(
            platform.nats.names.attachments_sign_subject(),
            serde_json::to_vec(&request).unwrap().into(),
        )
        .await
        .unwrap();
    let reply: Value = serde_json::from_slice(&reply.payload).unwrap();
    let urls = reply["urls"].as_array().unwrap();
    assert_eq!(
        (urls.len(), urls[1].is_null(), urls[2].is_null()),
        (3, true, true),
        "{reply}"
    );
    let fetched = platform
        .http
        .get(urls[0].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(fetched.bytes().await.unwrap().as_ref(), b"# Report\n");
    let as_bob = json!({"v": "1", "owner": "bob", "urls": [generated_url]});
    let reply = client
        .request(
            platform.nats.names.attachments_sign_subject(),
            serde_json::to_vec(&as_bob).unwrap().into(),
        )
        .await
        .unwrap();
    let reply: Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(
        reply["urls"],
        json!([null]),
        "never signs another owner's file"
    );
}

/// A 1x1 PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

#[tokio::test]
async fn the_url_a_server_upload_answers_is_accepted_in_a_run_and_nobody_elses_is() {
    let platform = TestPlatform::spawn().await.unwrap();
    let (alice, bob) = (platform.infra.token("alice"), platform.infra.token("bob"));
    let png = base64::engine::general_purpose::STANDARD
        .decode(PNG)
        .unwrap();
    let form = reqwest::multipart::Form::new().part("file", file_part(png, "dot.png", "image/png"));
    let (status, answer) = server_upload(&platform, &alice, form).await;
    assert_eq!(status, 200, "{answer}");
    let url = answer["url"].as_str().unwrap().to_owned();
    // The seed's flow: the url of the upload goes into a binary block.
    let run = |run_id: &str, url: &str| {
        let mut body =
            switchboard_system_tests::text_run(&uuid::Uuid::new_v4().to_string(), run_id, "");
        body["messages"][0]["content"] = json!([
            {"type": "text", "text": "what is this?"},
            {"type": "binary", "mimeType": "image/png", "url": url}
        ]);
        body
    };
    let (status, accepted) = platform
        .api()
        .post_run(&alice, &run("r1", &url))
        .await
        .unwrap();
    assert_eq!(status, 202, "{accepted}");
    // The same link with a changed signature, and alice's link in bob's run.
    let forged = format!("{}0", &url[..url.len() - 1]);
    let forged = if forged == url {
        format!("{}1", &url[..url.len() - 1])
    } else {
        forged
    };
    let (status, refused) = platform
        .api()
        .post_run(&alice, &run("r2", &forged))
        .await
        .unwrap();
    assert_eq!(status, 422, "{refused}");
    assert_eq!(
        refused["error"]["message"],
        "url signature is invalid or expired"
    );
    let (status, refused) = platform
        .api()
        .post_run(&bob, &run("r3", &url))
        .await
        .unwrap();
    assert_eq!(status, 422, "{refused}");
    assert_eq!(
        refused["error"]["message"],
        "url does not point to a file you own"
    );
}
