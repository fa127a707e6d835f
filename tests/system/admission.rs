//! Attachment admission: a run's files must resolve, through the attachments service over
//! NATS, to verified files the caller owns.

use jsonwebtoken::{EncodingKey, Header, encode};
use serde_json::{Value, json};
use switchboard_system_tests::{SUPABASE_SECRET, TestPlatform, text_run};

fn with_blocks(thread: &str, run_id: &str, blocks: Value) -> Value {
    let mut body = text_run(thread, run_id, "");
    body["messages"][0]["content"] = blocks;
    body
}

fn supabase_url(bucket: &str, path: &str, secret: &str, expires_in: i64) -> String {
    let now = chrono::Utc::now().timestamp();
    let claims = json!({"url": format!("{bucket}/{path}"), "iat": now, "exp": now + expires_in});
    let token = encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap();
    format!("https://project.supabase.co/storage/v1/object/sign/{bucket}/{path}?token={token}")
}

fn thread() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[tokio::test]
async fn an_owned_verified_image_is_admitted_and_its_storage_location_kept_as_metadata() {
    let platform = TestPlatform::spawn().await.unwrap();
    platform
        .insert_file(
            "alice",
            "agent-files",
            "agent-inputs/u/t/r/img.jpg",
            "image/jpeg",
            "verified",
        )
        .await
        .unwrap();
    let alice = platform.infra.token("alice");
    let thread = thread();
    let url = supabase_url(
        "agent-files",
        "agent-inputs/u/t/r/img.jpg",
        SUPABASE_SECRET,
        300,
    );
    let body = with_blocks(
        &thread,
        "img-run",
        json!([{"type": "text", "text": "帮我看看这张图"}, {"type": "binary", "mimeType": "image/jpeg", "url": url}]),
    );
    let (status, accepted) = platform.api().post_run(&alice, &body).await.unwrap();
    assert_eq!(status, 202, "{accepted}");
    platform
        .api()
        .wait_for_status(&alice, "img-run", "completed")
        .await
        .unwrap();
    platform
        .api()
        .wait_for_history(&alice, &thread, |h| {
            h["messages"].as_array().is_some_and(|m| m.len() == 2)
        })
        .await
        .unwrap();
    let metadata = platform
        .message_metadata(&thread, "img-run-user")
        .await
        .unwrap();
    assert_eq!(
        metadata["user_message_attachments"],
        json!({"bucket": "agent-files", "path": "agent-inputs/u/t/r/img.jpg", "mime_type": "image/jpeg"}),
        "the seed's stored metadata: {metadata}"
    );
    assert_eq!(metadata["run_id"], "img-run");
}

#[tokio::test]
async fn content_urls_and_presigned_urls_resolve_by_bucket_and_key_and_up_to_three_files_are_kept()
{
    let platform = TestPlatform::spawn().await.unwrap();
    for key in ["u/a.png", "u/b.png", "u/c.pdf"] {
        let mime = if key.ends_with(".pdf") {
            "application/pdf"
        } else {
            "image/png"
        };
        platform
            .insert_file("alice", "files", key, mime, "verified")
            .await
            .unwrap();
    }
    let alice = platform.infra.token("alice");
    let thread = thread();
    let body = with_blocks(
        &thread,
        "three",
        json!([
            {"type": "binary", "mimeType": "image/png", "url": "s3://files/u/a.png"},
            {"type": "image", "source": {"type": "url", "value": "http://127.0.0.1:9/files/u/b.png?X-Amz-Signature=x"}},
            {"type": "document", "source": {"type": "url", "value": "s3://files/u/c.pdf"}}
        ]),
    );
    let (status, accepted) = platform.api().post_run(&alice, &body).await.unwrap();
    assert_eq!(status, 202, "{accepted}");
    platform
        .api()
        .wait_for_status(&alice, "three", "completed")
        .await
        .unwrap();
    let metadata = platform
        .message_metadata(&thread, "three-user")
        .await
        .unwrap();
    let paths: Vec<&str> = metadata["user_message_attachment_list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["u/a.png", "u/b.png", "u/c.pdf"]);
}

#[tokio::test]
async fn every_unusable_file_reference_is_refused_naming_the_block_and_why() {
    let platform = TestPlatform::spawn().await.unwrap();
    platform
        .insert_file("bob", "files", "bob/secret.png", "image/png", "verified")
        .await
        .unwrap();
    platform
        .insert_file("alice", "files", "a/pending.png", "image/png", "pending")
        .await
        .unwrap();
    platform
        .insert_file("alice", "files", "a/bad.png", "image/png", "quarantined")
        .await
        .unwrap();
    platform
        .insert_file("alice", "files", "a/doc.pdf", "application/pdf", "verified")
        .await
        .unwrap();
    platform
        .insert_file("alice", "files", "a/ok.png", "image/png", "verified")
        .await
        .unwrap();
    let alice = platform.infra.token("alice");
    let image = |url: &str| json!({"type": "binary", "mimeType": "image/png", "url": url});
    let cases = [
        (
            image("s3://files/bob/secret.png"),
            "/messages/0/content/1/url",
            "url does not point to a file you own",
        ),
        (
            image("s3://files/a/missing.png"),
            "/messages/0/content/1/url",
            "url does not point to a file you own",
        ),
        (
            image("s3://files/a/pending.png"),
            "/messages/0/content/1/url",
            "file upload has not been verified yet",
        ),
        (
            image("s3://files/a/bad.png"),
            "/messages/0/content/1/url",
            "file failed verification and is quarantined",
        ),
        (
            image("s3://files/a/doc.pdf"),
            "/messages/0/content/1/mimeType",
            "binary content requires image mimeType",
        ),
        (
            image("ftp://files/a/ok.png"),
            "/messages/0/content/1/url",
            "url must be an s3:// content_url or a signed URL issued by the attachments service",
        ),
        (
            image(&supabase_url("files", "a/ok.png", "some-other-secret", 300)),
            "/messages/0/content/1/url",
            "url signature is invalid or expired",
        ),
        (
            image(&supabase_url("files", "a/ok.png", SUPABASE_SECRET, -600)),
            "/messages/0/content/1/url",
            "url signature is invalid or expired",
        ),
    ];
    for (i, (block, field, message)) in cases.into_iter().enumerate() {
        let body = with_blocks(
            &thread(),
            &format!("r{i}"),
            json!([{"type": "text", "text": "see"}, block]),
        );
        let (status, answer) = platform.api().post_run(&alice, &body).await.unwrap();
        assert_eq!(status, 422, "case {i}: {answer}");
        assert_eq!(
            answer["error"],
            json!({"code": "invalid_request", "message": message, "field": field}),
            "case {i}"
        );
    }
    let four = with_blocks(
        &thread(),
        "four",
        Value::Array(vec![image("s3://files/a/ok.png"); 4]),
    );
    let (status, answer) = platform.api().post_run(&alice, &four).await.unwrap();
    assert_eq!(status, 422);
    assert_eq!(
        answer["error"]["message"],
        "a message may carry at most 3 files"
    );
}
