//! Presigned uploads against the real S3 server: the POST policy is enforced by S3 itself,
//! dedup is per owner and only trusts verified bytes, downloads are signed, delete is idempotent.

use std::time::Duration;

use platform::service::Service as _;
use secrecy::ExposeSecret;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use switchboard_system_tests::{EVENTUAL, TestPlatform, download_link};

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR-not-a-real-image-but-a-png-signature";

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

async fn upload_url(platform: &TestPlatform, token: &str, body: &Value) -> (u16, Value) {
    let response = platform
        .http
        .post(format!("{}/v2/files/upload-url", platform.urls.attachments))
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .unwrap();
    (
        response.status().as_u16(),
        response.json().await.unwrap_or(Value::Null),
    )
}

/// POSTs the form to S3 exactly as the seed's JavaScript does: every field, then the file.
async fn post_form(platform: &TestPlatform, url: &str, fields: &Value, bytes: &[u8]) -> u16 {
    let mut form = reqwest::multipart::Form::new();
    for (name, value) in fields.as_object().unwrap() {
        form = form.text(name.clone(), value.as_str().unwrap().to_owned());
    }
    form = form.part(
        "file",
        reqwest::multipart::Part::bytes(bytes.to_vec()).file_name("upload"),
    );
    platform
        .http
        .post(url)
        .multipart(form)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn download_url(platform: &TestPlatform, token: &str, content_url: &str) -> (u16, Value) {
    let response = platform
        .http
        .get(format!(
            "{}/v2/files/download-url",
            platform.urls.attachments
        ))
        .bearer_auth(token)
        .query(&[("content_url", content_url)])
        .send()
        .await
        .unwrap();
    (
        response.status().as_u16(),
        response.json().await.unwrap_or(Value::Null),
    )
}

/// Polls until the file can be downloaded (the verifier has checked it), or fails.
async fn wait_verified(platform: &TestPlatform, token: &str, content_url: &str) -> Value {
    let deadline = tokio::time::Instant::now() + EVENTUAL;
    loop {
        let (status, body) = download_url(platform, token, content_url).await;
        if status == 200 {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{content_url} never verified: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn request(name: &str, mime: &str, bytes: &[u8]) -> Value {
    json!({"file_name": name, "file_type": mime, "file_size": bytes.len(), "content_hash": sha256_hex(bytes)})
}

#[tokio::test]
async fn a_presigned_upload_is_verified_downloadable_and_deduplicated_for_its_owner_only() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let bytes = b"quarterly numbers\n1,2,3\n";
    let (status, form) = upload_url(
        &platform,
        &alice,
        &request("../reports/báo cáo.txt", "text/plain", bytes),
    )
    .await;
    assert_eq!(status, 200, "{form}");
    assert_eq!(
        (
            form["is_duplicate"].as_bool(),
            form["upload_required"].as_bool()
        ),
        (Some(false), Some(true))
    );
    let content_url = form["content_url"].as_str().unwrap().to_owned();
    assert!(
        content_url.starts_with(&format!("s3://{}/uploads/", platform.s3.bucket)),
        "{content_url}"
    );
    assert!(
        !content_url.contains("..") && !content_url.contains("reports"),
        "path parts stripped: {content_url}"
    );
    for field in [
        "key",
        "policy",
        "x-amz-algorithm",
        "x-amz-credential",
        "x-amz-date",
        "x-amz-signature",
    ] {
        assert!(form["fields"][field].is_string(), "field {field} in {form}");
    }
    let status = post_form(
        &platform,
        form["url"].as_str().unwrap(),
        &form["fields"],
        bytes,
    )
    .await;
    assert!(
        (200..300).contains(&status),
        "S3 accepted the upload: {status}"
    );

    let download = wait_verified(&platform, &alice, &content_url).await;
    assert_eq!(download["file_name"], "báo cáo.txt");
    let fetched = platform
        .http
        .get(download["url"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(fetched.status().as_u16(), 200);
    assert!(
        fetched.headers()["content-disposition"]
            .to_str()
            .unwrap()
            .starts_with("inline")
    );
    assert_eq!(fetched.bytes().await.unwrap().as_ref(), bytes);

    let (_, again) = upload_url(&platform, &alice, &request("copy.txt", "text/plain", bytes)).await;
    assert_eq!(
        (
            again["is_duplicate"].as_bool(),
            again["upload_required"].as_bool(),
            again["content_url"].as_str()
        ),
        (Some(true), Some(false), Some(content_url.as_str())),
        "the owner's verified file answers the second request: {again}"
    );
    let bob = platform.infra.token("bob");
    let (_, bobs) = upload_url(&platform, &bob, &request("same.txt", "text/plain", bytes)).await;
    assert_eq!(
        bobs["is_duplicate"], false,
        "dedup never crosses owners: {bobs}"
    );
    assert_ne!(bobs["content_url"], json!(content_url));
    let (status, _) = download_url(&platform, &bob, &content_url).await;
    assert_eq!(status, 404, "another user's content_url is not found");
}

#[tokio::test]
async fn two_concurrent_requests_for_the_same_new_content_share_one_file() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let body = request("a.png", "image/png", PNG);
    let answers =
        futures::future::join_all((0..8).map(|_| upload_url(&platform, &alice, &body))).await;
    let first = answers[0].1["content_url"].clone();
    for (status, answer) in &answers {
        assert_eq!((*status, &answer["content_url"]), (200, &first), "{answer}");
    }
}

#[tokio::test]
async fn the_s3_server_refuses_uploads_that_break_the_policy() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let bytes = b"exactly these bytes";
    let (_, form) = upload_url(&platform, &alice, &request("a.txt", "text/plain", bytes)).await;
    let url = form["url"].as_str().unwrap().to_owned();
    let fields = form["fields"].clone();
    let with = |name: &str, value: &str| {
        let mut changed = fields.clone();
        changed[name] = json!(value);
        changed
    };
    let mut tampered_policy = fields["policy"].as_str().unwrap().to_owned();
    tampered_policy.replace_range(
        10..11,
        if &tampered_policy[10..11] == "A" {
            "B"
        } else {
            "A"
        },
    );
    let cases = [
        (
            "too big",
            fields.clone(),
            b"exactly these bytes and more".to_vec(),
        ),
        (
            "other bytes, same size",
            fields.clone(),
            b"EXACTLY THESE BYTES".to_vec(),
        ),
        (
            "other key",
            with("key", "uploads/someone-else/x.txt"),
            bytes.to_vec(),
        ),
        (
            "other type",
            with("Content-Type", "text/html"),
            bytes.to_vec(),
        ),
        (
            "tampered policy",
            with("policy", &tampered_policy),
            bytes.to_vec(),
        ),
        (
            "forged signature",
            with("x-amz-signature", &"0".repeat(64)),
            bytes.to_vec(),
        ),
    ];
    for (what, fields, body) in cases {
        let status = post_form(&platform, &url, &fields, &body).await;
        assert!(
            (400..500).contains(&status),
            "{what}: S3 refused with 4xx, got {status}"
        );
    }

    // An expired form: signed with the service's real credentials, ten minutes ago, for one second.
    let signer = attachments::policy::Signer {
        access_key: platform.s3.access_key.clone(),
        secret_key: platform.s3.secret_key.clone(),
        region: platform.s3.region.clone(),
        public_endpoint: platform.s3.endpoint.clone().unwrap(),
        download_base: platform.urls.attachments.clone(),
    };
    let key = fields["key"].as_str().unwrap();
    let upload = attachments::policy::Upload {
        bucket: &platform.s3.bucket,
        key,
        content_type: "text/plain",
        size: bytes.len() as u64,
        sha256: None,
    };
    let expired = signer.sign(
        &upload,
        chrono::Utc::now() - chrono::Duration::minutes(10),
        Duration::from_secs(1),
    );
    let status = post_form(
        &platform,
        &expired.url,
        &Value::Object(expired.fields.clone()),
        bytes,
    )
    .await;
    assert!(
        (400..500).contains(&status),
        "expired: S3 refused with 4xx, got {status}"
    );
    let fresh = signer.sign(&upload, chrono::Utc::now(), Duration::from_secs(60));
    let status = post_form(&platform, &fresh.url, &Value::Object(fresh.fields), bytes).await;
    assert!(
        (200..300).contains(&status),
        "the same form signed now is accepted: {status}"
    );
}

#[tokio::test]
async fn bytes_that_are_not_the_declared_type_are_quarantined_and_refused_to_runs() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let not_a_png = b"<html><script>alert(1)</script></html>";
    let (_, form) = upload_url(
        &platform,
        &alice,
        &request("cat.png", "image/png", not_a_png),
    )
    .await;
    let status = post_form(
        &platform,
        form["url"].as_str().unwrap(),
        &form["fields"],
        not_a_png,
    )
    .await;
    assert!(
        (200..300).contains(&status),
        "S3 stores it: the hash and size are right"
    );
    let content_url = form["content_url"].as_str().unwrap();
    let thread = uuid::Uuid::new_v4().to_string();
    let mut run = switchboard_system_tests::text_run(&thread, "q", "");
    run["messages"][0]["content"] =
        json!([{"type": "binary", "mimeType": "image/png", "url": content_url}]);
    let (status, answer) = platform.api().post_run(&alice, &run).await.unwrap();
    assert_eq!(status, 422, "{answer}");
    assert_eq!(
        answer["error"]["message"],
        "file failed verification and is quarantined"
    );
    let (status, _) = download_url(&platform, &alice, content_url).await;
    assert_eq!(status, 404, "a quarantined file is not handed out");
    let (_, again) = upload_url(
        &platform,
        &alice,
        &request("cat.png", "image/png", not_a_png),
    )
    .await;
    assert_eq!(
        again["is_duplicate"], false,
        "a quarantined file is never a dedup answer: {again}"
    );
}

#[tokio::test]
async fn delete_removes_the_object_is_idempotent_and_only_touches_the_owners_file() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let bob = platform.infra.token("bob");
    let (_, form) = upload_url(&platform, &alice, &request("a.png", "image/png", PNG)).await;
    post_form(
        &platform,
        form["url"].as_str().unwrap(),
        &form["fields"],
        PNG,
    )
    .await;
    let content_url = form["content_url"].as_str().unwrap().to_owned();
    let download = wait_verified(&platform, &alice, &content_url).await;
    let delete = |token: String| {
        let request = platform
            .http
            .delete(format!("{}/v2/files/delete", platform.urls.attachments))
            .bearer_auth(token)
            .query(&[("content_url", content_url.clone())]);
        async move { request.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(
        delete(bob.clone()).await,
        204,
        "bob's delete changes nothing and reveals nothing"
    );
    assert_eq!(
        download_url(&platform, &alice, &content_url).await.0,
        200,
        "alice's file is still there"
    );
    assert_eq!(delete(alice.clone()).await, 204);
    assert_eq!(delete(alice.clone()).await, 204, "deleting again is fine");
    assert_eq!(download_url(&platform, &alice, &content_url).await.0, 404);
    let stale = platform
        .http
        .get(download["url"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(stale.status().as_u16(), 404, "the object is gone from S3");
}

#[tokio::test]
async fn upload_url_refuses_bad_fields_naming_each() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let cases = [
        (
            json!({"file_type": "text/plain", "file_size": 1}),
            "file_name",
        ),
        (
            json!({"file_name": "a.exe", "file_type": "application/x-msdownload", "file_size": 1}),
            "file_type",
        ),
        (
            json!({"file_name": "a.txt", "file_type": "text/plain", "file_size": 104_857_601}),
            "file_size",
        ),
        (
            json!({"file_name": "a.txt", "file_type": "text/plain", "file_size": 1, "content_hash": "abc"}),
            "content_hash",
        ),
    ];
    for (body, field) in cases {
        let (status, answer) = upload_url(&platform, &alice, &body).await;
        assert_eq!(
            (status, answer["error"]["field"].as_str()),
            (400, Some(field)),
            "{answer}"
        );
    }
    let (status, _) = upload_url(&platform, "", &request("a.txt", "text/plain", b"x")).await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn history_signs_a_fresh_url_for_a_user_attachment_on_every_read_and_null_once_deleted() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let (_, form) = upload_url(&platform, &alice, &request("cat.png", "image/png", PNG)).await;
    post_form(
        &platform,
        form["url"].as_str().unwrap(),
        &form["fields"],
        PNG,
    )
    .await;
    let content_url = form["content_url"].as_str().unwrap().to_owned();
    let thread = uuid::Uuid::new_v4().to_string();
    let mut run = switchboard_system_tests::text_run(&thread, "pic", "");
    run["messages"][0]["content"] = json!([{"type": "text", "text": "look"},
        {"type": "binary", "mimeType": "image/png", "url": content_url}]);
    let (status, answer) = platform.api().post_run(&alice, &run).await.unwrap();
    assert_eq!(status, 202, "{answer}");
    let history = platform
        .api()
        .wait_for_history(&alice, &thread, |h| {
            h["messages"].as_array().is_some_and(|m| m.len() == 2)
        })
        .await
        .unwrap();
    let url = history["messages"][0]["url"]
        .as_str()
        .expect("a signed url")
        .to_owned();
    let fetched = platform.http.get(&url).send().await.unwrap();
    assert_eq!(
        fetched.bytes().await.unwrap().as_ref(),
        PNG,
        "the url serves the attachment"
    );

    platform
        .http
        .delete(format!("{}/v2/files/delete", platform.urls.attachments))
        .bearer_auth(&alice)
        .query(&[("content_url", content_url.as_str())])
        .send()
        .await
        .unwrap();
    let (_, after) = platform
        .api()
        .history(&alice, &[("threadId", &thread)])
        .await
        .unwrap();
    assert_eq!(
        after["messages"][0]["url"],
        Value::Null,
        "a deleted attachment has no url: {after}"
    );
}

#[tokio::test]
async fn an_upload_never_completed_is_forgotten_after_its_form_expires() {
    let options = switchboard_system_tests::Options {
        upload_ttl: Duration::from_secs(1),
        ..Default::default()
    };
    let platform = TestPlatform::spawn_with(options).await.unwrap();
    let alice = platform.infra.token("alice");
    let body = request("never.txt", "text/plain", b"never sent");
    let (_, first) = upload_url(&platform, &alice, &body).await;
    let key = first["content_url"]
        .as_str()
        .unwrap()
        .trim_start_matches("s3://")
        .split_once('/')
        .unwrap()
        .1
        .to_owned();
    let db = sqlx::PgPool::connect(platform.attachments_db.expose_secret())
        .await
        .unwrap();
    let count = || {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM attachments.files WHERE object_key = $1")
            .bind(&key)
            .fetch_one(&db)
    };
    assert_eq!(
        count().await.unwrap(),
        1,
        "a pending record while the form is valid"
    );
    // The background sweeper forgets it once the form has expired and no object arrived.
    let deadline = tokio::time::Instant::now() + EVENTUAL;
    while count().await.unwrap() != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the expired upload was never cleaned up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, again) = upload_url(&platform, &alice, &body).await;
    assert_ne!(
        again["content_url"], first["content_url"],
        "a new request gets a new file"
    );
}

#[tokio::test]
async fn a_verified_file_cannot_be_overwritten_by_posting_its_form_again() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    // No declared hash: the form pins only the size and the type.
    let original = b"the original bytes!\n";
    let forged = b"a forged replacement";
    assert_eq!(original.len(), forged.len());
    let body =
        json!({"file_name": "a.txt", "file_type": "text/plain", "file_size": original.len()});
    let (status, form) = upload_url(&platform, &alice, &body).await;
    assert_eq!(status, 200, "{form}");
    let url = form["url"].as_str().unwrap();
    assert_eq!(
        post_form(&platform, url, &form["fields"], original).await / 100,
        2
    );
    let content_url = form["content_url"].as_str().unwrap();
    wait_verified(&platform, &alice, content_url).await;
    // The form is still valid: S3 takes the post, but it lands where nothing reads.
    assert_eq!(
        post_form(&platform, url, &form["fields"], forged).await / 100,
        2
    );
    let (_, download) = download_url(&platform, &alice, content_url).await;
    let got = platform
        .http
        .get(download["url"].as_str().unwrap())
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(got.as_ref(), original, "the verified file is unchanged");
}

#[tokio::test]
async fn one_owner_is_bounded_in_upload_rate_unfinished_uploads_files_and_bytes() {
    let platform = TestPlatform::spawn_with(switchboard_system_tests::Options {
        quota: attachments::quota::QuotaConfig {
            uploads_per_minute: 1,
            uploads_burst: 6,
            max_pending: 2,
            max_files: 3,
            max_bytes: 100,
        },
        ..Default::default()
    })
    .await
    .unwrap();
    let (alice, bob) = (platform.infra.token("alice"), platform.infra.token("bob"));
    let file = |n: u8| format!("file {n} of ten bytes").as_bytes()[..10].to_vec();
    let ask = |token: &str, n: u8| {
        let body =
            json!({"file_name": format!("{n}.txt"), "file_type": "text/plain", "file_size": 10});
        let token = token.to_owned();
        let platform = &platform;
        async move { upload_url(platform, &token, &body).await }
    };
    let (status, a) = ask(&alice, 1).await;
    assert_eq!(status, 200, "{a}");
    let (status, b) = ask(&alice, 2).await;
    assert_eq!(status, 200, "{b}");
    // Two forms not used yet: a third waits for them.
    let (status, refused) = ask(&alice, 3).await;
    assert_eq!(
        (status, &refused["error"]["code"]),
        (429, &json!("rate_limited")),
        "{refused}"
    );
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("waiting for their bytes")
    );
    // Another owner is not held up.
    let (status, _) = ask(&bob, 1).await;
    assert_eq!(status, 200);
    // Uploaded and verified at once on first use: no longer unfinished.
    for (n, form) in [(1, &a), (2, &b)] {
        let url = form["url"].as_str().unwrap();
        assert_eq!(
            post_form(&platform, url, &form["fields"], &file(n)).await / 100,
            2
        );
        let (status, got) =
            download_url(&platform, &alice, form["content_url"].as_str().unwrap()).await;
        assert_eq!(status, 200, "verified on first use: {got}");
    }
    let (status, c) = ask(&alice, 3).await;
    assert_eq!(status, 200, "{c}");
    // Three files held: a fourth is over the quota.
    let (status, full) = ask(&alice, 4).await;
    assert_eq!(
        (status, &full["error"]["code"]),
        (403, &json!("quota_exceeded")),
        "{full}"
    );
    assert!(
        full["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 3 files")
    );
    // Bytes: one file larger than the owner's room.
    let body = json!({"file_name": "big.txt", "file_type": "text/plain", "file_size": 101});
    let (status, full) = upload_url(&platform, &bob, &body).await;
    assert_eq!(
        (status, &full["error"]["code"]),
        (403, &json!("quota_exceeded")),
        "{full}"
    );
    assert!(
        full["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 100 bytes")
    );
    // The rate: six asks in a burst, then wait.
    let (_, _) = ask(&alice, 5).await;
    let response = platform
        .http
        .post(format!("{}/v2/files/upload-url", platform.urls.attachments))
        .bearer_auth(&alice)
        .json(&json!({"file_name": "6.txt", "file_type": "text/plain", "file_size": 10}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    let retry: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1, "{retry}");
}

/// `POST /api/v1/agent/attachments` on the attachments service at `base` as `token`.
async fn server_upload(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    (name, mime, bytes): (&str, &str, &[u8]),
) -> Value {
    let part = reqwest::multipart::Part::bytes(bytes.to_vec())
        .file_name(name.to_owned())
        .mime_str(mime)
        .unwrap();
    let response = http
        .post(format!("{base}/api/v1/agent/attachments"))
        .bearer_auth(token)
        .multipart(reqwest::multipart::Form::new().part("file", part))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200, "{name} is stored");
    response.json().await.unwrap()
}

/// GETs `url` without credentials: the status, the headers and the body.
async fn fetch(http: &reqwest::Client, url: &str) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
    let response = http.get(url).send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (status, headers, response.bytes().await.unwrap().to_vec())
}

/// The error code and field of a refusal.
fn refusal(body: &[u8]) -> (Value, Value) {
    let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    (
        body["error"]["code"].clone(),
        body["error"]["field"].clone(),
    )
}

/// A text of one header, `None` when it is absent.
fn header<'h>(headers: &'h reqwest::header::HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn every_download_is_served_with_nosniff_and_only_safe_types_inline() {
    const SVG: &[u8] =
        br#"<svg xmlns="http://www.w3.org/2000/svg"><script>alert(document.domain)</script></svg>"#;
    const TEXT: &[u8] = b"plain words <b>not markup</b>\n";
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    // Name, type, bytes, disposition, sandboxed.
    let files = [
        ("dot.png", "image/png", PNG, "inline", false),
        ("notes.txt", "text/plain", TEXT, "inline", true),
        ("logo.svg", "image/svg+xml", SVG, "attachment", true),
    ];
    let mut links = Vec::new();
    for (name, mime, bytes, disposition, sandboxed) in files {
        let stored = server_upload(
            &platform.http,
            &platform.urls.attachments,
            &alice,
            (name, mime, bytes),
        )
        .await;
        let content_url = format!(
            "s3://{}/{}",
            stored["bucket"].as_str().unwrap(),
            stored["path"].as_str().unwrap()
        );
        let (status, download) = download_url(&platform, &alice, &content_url).await;
        assert_eq!(status, 200, "{download}");
        let url = download["url"].as_str().unwrap().to_owned();
        let (_, expires) = download_link(&platform.urls.attachments, &url)
            .unwrap_or_else(|| panic!("a download link of the service, not of S3: {url}"));
        let left = expires - chrono::Utc::now().timestamp();
        assert!((299..=300).contains(&left), "valid for 300 s: {url}");

        let (status, headers, body) = fetch(&platform.http, &url).await;
        assert_eq!(status, 200, "{name}: {}", String::from_utf8_lossy(&body));
        assert_eq!(body, bytes, "{name}: exactly the uploaded bytes");
        assert_eq!(header(&headers, "content-type"), Some(mime), "{name}");
        assert_eq!(
            header(&headers, "x-content-type-options"),
            Some("nosniff"),
            "{name}"
        );
        let length = bytes.len().to_string();
        assert_eq!(header(&headers, "content-length"), Some(length.as_str()));
        let shown = header(&headers, "content-disposition").unwrap_or_default();
        assert!(
            shown.starts_with(&format!("{disposition}; filename=\"{name}\"")),
            "{name} is {disposition}: {shown}"
        );
        assert_eq!(
            header(&headers, "content-security-policy"),
            sandboxed.then_some("sandbox"),
            "{name}: sandboxed unless a raster image"
        );
        let max_age = header(&headers, "cache-control")
            .and_then(|c| c.strip_prefix("private, max-age="))
            .and_then(|secs| secs.parse::<i64>().ok());
        assert!(
            max_age.is_some_and(|secs| (298..=300).contains(&secs)),
            "{name}: private, cached at most until the link expires: {headers:?}"
        );

        let head = platform.http.head(&url).send().await.unwrap();
        assert_eq!(
            (
                head.status().as_u16(),
                header(head.headers(), "x-content-type-options"),
                header(head.headers(), "content-length")
            ),
            (200, Some("nosniff"), Some(length.as_str())),
            "{name}: HEAD answers the same headers"
        );
        assert!(head.bytes().await.unwrap().is_empty(), "HEAD has no body");
        links.push((content_url, url));
    }

    let (png_url, text_url) = (&links[0].1, &links[1].1);
    let signature = png_url.rsplit_once("signature=").unwrap().1;
    let flipped = format!(
        "{}{}",
        if signature.starts_with('0') { "1" } else { "0" },
        &signature[1..]
    );
    let (png_id, expires) = download_link(&platform.urls.attachments, png_url).unwrap();
    let (text_id, _) = download_link(&platform.urls.attachments, text_url).unwrap();
    let cases = [
        ("a tampered signature", png_url.replace(signature, &flipped)),
        (
            "a changed expires",
            png_url.replace(
                &format!("expires={expires}"),
                &format!("expires={}", expires + 60),
            ),
        ),
        (
            "another file's id with the first file's signature",
            png_url.replace(&png_id.to_string(), &text_id.to_string()),
        ),
        (
            "no signature",
            png_url.split("&signature=").next().unwrap().to_owned(),
        ),
    ];
    for (what, url) in cases {
        assert_ne!(&url, png_url, "{what}: the link was changed");
        let (status, headers, body) = fetch(&platform.http, &url).await;
        assert_eq!(
            (status, refusal(&body)),
            (403, (json!("unauthorized"), json!("signature"))),
            "{what}: {}",
            String::from_utf8_lossy(&body)
        );
        assert_eq!(header(&headers, "content-type"), Some("application/json"));
    }

    // A deleted file's link, still signed and unexpired, finds nothing.
    platform
        .http
        .delete(format!("{}/v2/files/delete", platform.urls.attachments))
        .bearer_auth(&alice)
        .query(&[("content_url", links[1].0.as_str())])
        .send()
        .await
        .unwrap();
    let (status, _, body) = fetch(&platform.http, text_url).await;
    assert_eq!(
        (status, refusal(&body).0),
        (404, json!("not_found")),
        "a deleted file"
    );

    // An expired link: the attachments service alone, with links that live one second.
    let infra = test_support::Infra::from_env();
    let app = attachments::Application::build(attachments::Config {
        addr: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        auth: infra.auth(),
        database_url: infra.fresh_database().await.unwrap(),
        migrate_on_start: true,
        s3: infra.fresh_s3(),
        nats: infra.fresh_nats(),
        supabase_jwt_secret: None,
        public_endpoint: None,
        public_url: None,
        upload_ttl: Duration::from_secs(60),
        download_ttl: Duration::from_secs(1),
        sweep_every: Duration::from_secs(1),
        cors_allowed_origins: Vec::new(),
        quota: attachments::quota::QuotaConfig::default(),
        limits: attachments::Limits::default(),
    })
    .await
    .unwrap();
    let base = format!("http://127.0.0.1:{}", app.port());
    let stop = tokio_util::sync::CancellationToken::new();
    let _stop_on_drop = stop.clone().drop_guard();
    tokio::spawn(app.run(stop));
    let stored = server_upload(
        &platform.http,
        &base,
        &infra.token("alice"),
        ("dot.png", "image/png", PNG),
    )
    .await;
    let url = stored["url"].as_str().unwrap();
    assert!(download_link(&base, url).is_some(), "{url}");
    let deadline = tokio::time::Instant::now() + EVENTUAL;
    let (status, body) = loop {
        let (status, _, body) = fetch(&platform.http, url).await;
        if status != 200 || tokio::time::Instant::now() > deadline {
            break (status, body);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        (status, refusal(&body)),
        (403, (json!("unauthorized"), json!("expires"))),
        "an expired link: {}",
        String::from_utf8_lossy(&body)
    );
}
