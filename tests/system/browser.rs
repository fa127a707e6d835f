//! The seed's own browser flow: the JavaScript of `file-attachments.md` (SHA-256 in the page,
//! the upload-url call, a FormData POST of every field then the file to S3) run in headless
//! Chromium against the running services. Needs `node`, `/usr/bin/chromium` and
//! `tests/browser/node_modules` (`scripts/test.sh` installs both); without them this test fails.

use std::time::Duration;

use axum::response::Html;
use serde_json::Value;
use switchboard_system_tests::gateway::workspace_root;
use switchboard_system_tests::{
    DriverReport, Options, TestPlatform, require_browser_driver, run_node_driver,
};
use tokio::net::TcpListener;

/// The page, served as it is in the tree.
const PAGE: &str = include_str!("../browser/upload.html");
/// How long the driver gives the page (launch, two tries, verification in between).
const DRIVER_TIMEOUT: Duration = Duration::from_secs(60);

/// Serves the page on 127.0.0.1 (port 0) until the test ends; returns its origin.
async fn serve_page() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    let app =
        axum::Router::new().route("/upload.html", axum::routing::get(|| async { Html(PAGE) }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    origin
}

#[tokio::test]
async fn the_seeds_javascript_uploads_from_headless_chromium_and_the_second_try_is_a_duplicate() {
    let root = workspace_root();
    require_browser_driver("tests/browser");

    let origin = serve_page().await;
    let platform = TestPlatform::spawn_with(Options {
        cors_allowed_origins: vec![origin.clone()],
        ..Options::default()
    })
    .await
    .unwrap();
    let alice = platform.infra.token("alice");
    let page_url = reqwest::Url::parse_with_params(
        &format!("{origin}/upload.html"),
        [
            ("base", platform.urls.attachments.as_str()),
            ("token", alice.as_str()),
        ],
    )
    .unwrap();

    let mut driver = tokio::process::Command::new("node");
    driver
        .arg("tests/browser/driver.mjs")
        .arg(page_url.as_str())
        .arg(DRIVER_TIMEOUT.as_millis().to_string())
        .current_dir(&root);
    let DriverReport {
        status,
        report,
        stderr,
    } = run_node_driver(driver, DRIVER_TIMEOUT + Duration::from_secs(30)).await;
    assert!(
        status.success() && report["ok"] == true,
        "the browser flow failed ({status}): {report:#}\nstderr: {stderr}"
    );

    // The same checks as the driver's, on what it reports, so this test states them too.
    let (first, second) = (&report["page"]["first"], &report["page"]["second"]);
    assert_eq!(first["upload_required"], true, "{report:#}");
    assert_eq!(first["is_duplicate"], false, "{report:#}");
    let s3_posts = report["s3_posts"].as_array().unwrap();
    assert_eq!(s3_posts.len(), 1, "{report:#}");
    assert_eq!(s3_posts[0]["url"], first["url"], "{report:#}");
    let s3_status = s3_posts[0]["status"].as_u64().unwrap();
    assert!((200..300).contains(&s3_status), "S3 answered {s3_status}");
    assert_eq!(second["is_duplicate"], true, "{report:#}");
    assert_eq!(second["upload_required"], false, "{report:#}");
    assert_eq!(second["url"], Value::Null, "{report:#}");
    let content_url = first["content_url"].as_str().unwrap();
    assert_eq!(second["content_url"], content_url, "{report:#}");

    // The API allows the page's origin and no other.
    for (from, allowed) in [(origin.as_str(), true), ("http://127.0.0.1:9", false)] {
        let preflight = platform
            .http
            .request(
                reqwest::Method::OPTIONS,
                format!("{}/v2/files/upload-url", platform.urls.attachments),
            )
            .header("Origin", from)
            .header("Access-Control-Request-Method", "POST")
            .header(
                "Access-Control-Request-Headers",
                "authorization,content-type",
            )
            .send()
            .await
            .unwrap();
        let allow_origin = preflight.headers().get("access-control-allow-origin");
        assert_eq!(
            allow_origin.and_then(|v| v.to_str().ok()),
            allowed.then_some(from),
            "preflight from {from}"
        );
    }

    // Independently of the browser: the file is there, verified, with the page's bytes.
    let download = platform
        .http
        .get(format!(
            "{}/v2/files/download-url",
            platform.urls.attachments
        ))
        .bearer_auth(&alice)
        .query(&[("content_url", content_url)])
        .send()
        .await
        .unwrap();
    assert_eq!(download.status().as_u16(), 200);
    let download: Value = download.json().await.unwrap();
    assert_eq!(download["file_name"], "browser-upload.txt");
    let fetched = platform
        .http
        .get(download["url"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(fetched.status().as_u16(), 200);
    let page_text = report["page"]["file"]["text"].as_str().unwrap();
    assert_eq!(
        fetched.bytes().await.unwrap().as_ref(),
        page_text.as_bytes(),
        "S3 holds exactly the bytes the page made"
    );

    eprintln!(
        "browser flow: {} uploaded {content_url} (S3 {s3_status}), second try is_duplicate=true",
        report["browser"].as_str().unwrap_or("chromium")
    );
}
