//! The reference web client (`web/`) end to end: its production build served by the gateway
//! of `scripts/gateway.sh` on one origin with the API, driven in Debian's headless Chromium by
//! `web/e2e/run.mjs` (playwright-core) against the four services; a second browser context on the
//! same conversation (another tab or device) follows it through the thread stream. Needs `node`,
//! `/usr/bin/chromium`, `web/node_modules` and `web/dist` (`scripts/test.sh` installs and
//! builds them); without them this test fails. Saves its screenshots to `.data/screenshots/`
//! (`$SB_DATA_DIR/screenshots`), and refreshes the copies `docs/web-client.md` shows (`docs/screenshots/`) only
//! when asked (`SB_REFRESH_SCREENSHOTS=1`): a test run leaves the working tree as it found it.

use std::path::Path;
use std::time::Duration;

use chrono::{Duration as Days, Utc};
use serde_json::{Value, json};
use switchboard_system_tests::gateway::{Gateway, Upstreams, workspace_root};
use switchboard_system_tests::{
    DriverReport, Options, TestPlatform, free_port, require_browser_driver, run_node_driver,
};

/// How long the driver may take (about a minute on 2 cores; prompts, timeouts and slow
/// replies wait on the server's own clock).
const DRIVER_TIMEOUT: Duration = Duration::from_secs(360);
/// The thread whose messages span several days (the oldest of the fixture threads).
const DAYS_THREAD: &str = "web-e2e-days";
/// Older threads, so the thread list has a second page (it shows 20 at a time).
const FILLER_THREADS: usize = 24;

/// Every check of the driver, by name: each must have run and passed.
const STEPS: &[&str] = &[
    "first render is timed over several page loads",
    "a pasted token signs in; a wrong one is refused with a message",
    "the sign-in link's fragment signs in and leaves the address and persistent storage clean",
    "keyboard: skip link, labelled controls, landmarks",
    "a message gets its reply streamed token by token",
    "a tool call is shown as a step with its arguments, result and card",
    "a uiSchema card is rendered as UiSchemaRenderer 2.0 describes",
    "a file the agent made is shown as a files block whose link works",
    "type, size and count errors are told clearly",
    "a PDF and an image upload (SHA-256 in the page, presigned POST with progress) and are read by the agent",
    "the same file again is answered as a duplicate and not uploaded",
    "a user's file chip opens a fresh download link",
    "a text prompt counts down and its answer continues the run",
    "a binary_choice prompt counts down and its answer continues the run",
    "a radio prompt counts down and its answer continues the run",
    "a checkbox prompt counts down and its answer continues the run",
    "a dropdown prompt counts down and its answer continues the run",
    "a prompt that times out shows its error and the run continues",
    "stop cancels a run mid-reply",
    "a network drop mid-reply is resumed from the last event",
    "a reload mid-reply shows what came and resumes after the last event",
    "a second tab on the conversation shows a run started in the first as it streams, and neither shows it twice",
    "the second tab's thread stream resumes after a drop with Last-Event-ID, nothing twice",
    "a question asked in one tab is shown in the other, which can answer it",
    "history after a reload shows the same conversation with working file links",
    "the thread list is most recent first and pages; a new thread starts empty",
    "a conversation loads day by day backwards",
    "two new conversations are listed with their first message as their title",
    "a search lists only the conversation with the word, the match highlighted, and opens it at that message",
    "a conversation renamed in the list shows its new title, also after a reload",
    "a conversation deleted after its confirmation is gone from the list, also after a reload, and left when open",
    "a search of only punctuation, or too long, shows the server's message in place",
    "a reply asked again streams in place of the old one, which stays as a previous version, also after a reload",
    "a conversation branched from a message opens as a new conversation holding the messages up to it",
    "on a phone: no sideways scrolling, a drawer for the threads, prompts usable",
];

/// The screenshots the driver must leave in `.data/screenshots/` (desktop 1280x800, phone
/// 390x844).
const SCREENSHOTS: &[&str] = &[
    "desktop-signin",
    "desktop-streaming",
    "desktop-conversation",
    "desktop-upload",
    "desktop-prompt",
    "desktop-timeout",
    "desktop-reconnecting",
    "desktop-second-tab",
    "desktop-history",
    "desktop-days",
    "desktop-search",
    "desktop-rename",
    "desktop-delete-confirm",
    "desktop-search-error",
    "desktop-regenerate",
    "desktop-branch",
    "phone-threads",
    "phone-conversation",
    "phone-prompt",
];

/// Older conversations for alice: the days thread (its messages a day apart), then the fillers;
/// returns the days thread's days, newest first.
async fn seed_older_threads(platform: &TestPlatform) -> Vec<String> {
    let at = |days: i64, minute: usize| {
        (Utc::now() - Days::days(days))
            .date_naive()
            .and_hms_opt(12, u32::try_from(minute).unwrap(), 0)
            .unwrap()
            .and_utc()
            .to_rfc3339()
    };
    let days = [14_i64, 13, 12];
    let messages: Vec<(String, &str, String, String)> = days
        .iter()
        .enumerate()
        .flat_map(|(n, &day)| {
            [
                (
                    format!("days-{n}-q"),
                    "user",
                    format!("Question of day {n}"),
                    at(day, 0),
                ),
                (
                    format!("days-{n}-a"),
                    "assistant",
                    format!("You said: Question of day {n}"),
                    at(day, 1),
                ),
            ]
        })
        .collect();
    let rows: Vec<(&str, &str, &str, &str, Value)> = messages
        .iter()
        .map(|(id, role, text, at)| (id.as_str(), *role, text.as_str(), at.as_str(), json!({})))
        .collect();
    platform
        .insert_history("alice", DAYS_THREAD, &rows)
        .await
        .unwrap();
    // The fillers after it: a thread's place in the list is the time its row was written.
    for i in 0..FILLER_THREADS {
        platform
            .insert_history(
                "alice",
                &format!("web-e2e-filler-{i:02}"),
                &[(
                    format!("filler-{i}").as_str(),
                    "user",
                    format!("Filler conversation {i}").as_str(),
                    at(10, i).as_str(),
                    json!({}),
                )],
            )
            .await
            .unwrap();
    }
    // Newest first, as the conversation shows them from the bottom up.
    days.iter()
        .rev()
        .map(|&day| at(day, 0)[..10].to_owned())
        .collect()
}

fn is_png(path: &Path) -> bool {
    std::fs::read(path)
        .is_ok_and(|bytes| bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 2000)
}

#[tokio::test]
async fn the_web_client_streams_uploads_asks_resumes_and_reloads_through_the_gateway() {
    let root = workspace_root();
    require_browser_driver("web");

    assert!(
        root.join("web/dist/index.html").exists(),
        "web/dist is missing: run scripts/test.sh (or npm run build in web)"
    );

    let port = free_port().unwrap();
    let origin = format!("http://127.0.0.1:{port}");
    let platform = TestPlatform::spawn_with(Options {
        // Download links point at the gateway, the page's own origin.
        attachments_public_url: Some(origin.clone()),
        // As scripts/up.sh runs it: a run on a busy thread waits for the previous one.
        active_run_policy: runs::ActiveRunPolicy::Enqueue,
        ..Options::default()
    })
    .await
    .unwrap();
    let days = seed_older_threads(&platform).await;
    let gateway = Gateway::start(
        port,
        &Upstreams::single(&platform.urls),
        Some(&root.join("web/dist")),
    )
    .await
    .unwrap();
    assert_eq!(gateway.url, origin);

    let shots = std::env::var_os("SB_DATA_DIR")
        .map_or_else(|| root.join(".data"), std::path::PathBuf::from)
        .join("screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    for name in SCREENSHOTS {
        let _ = std::fs::remove_file(shots.join(format!("{name}.png")));
    }
    let alice = platform.infra.token("alice");
    let s3 = platform
        .s3
        .endpoint
        .clone()
        .expect("the test S3 server's endpoint");
    let mut driver = tokio::process::Command::new("node");
    driver
        .arg("web/e2e/run.mjs")
        .current_dir(&root)
        .env("SB_WEB_URL", &origin)
        .env("SB_TOKEN", &alice)
        .env("SB_S3_URL", &s3)
        .env("SB_SCREENSHOTS", &shots)
        .env("SB_DAYS_THREAD", DAYS_THREAD)
        .env("SB_DAYS", days.join(","));
    let DriverReport {
        status,
        report,
        stderr,
    } = run_node_driver(driver, DRIVER_TIMEOUT + Duration::from_secs(30)).await;
    assert!(
        status.success() && report["ok"] == true,
        "the web client's checks failed ({status}): {:#}\nsteps: {:#}\nstderr: {stderr}",
        report["failures"],
        report["steps"],
    );

    // Every check ran and passed, by name (a driver that skipped one does not pass).
    let steps = report["steps"].as_array().unwrap();
    for name in STEPS {
        let step = steps.iter().find(|s| s["name"] == *name);
        assert!(
            step.is_some_and(|s| s["ok"] == true),
            "check {name:?} did not pass: {step:?}"
        );
    }
    let facts = &report["facts"];
    // Streamed token by token: the reply grew in many steps.
    assert!(facts["streamSteps"].as_u64().unwrap() >= 6, "{facts:#}");
    // Both resumes asked for the events after one the client had, not from the start.
    for resume in ["dropResume", "reloadResume"] {
        let after: u64 = facts[resume]["lastEventId"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(after > 2, "{resume} resumed after event {after}: {facts:#}");
    }
    // The second tab saw the first tab's reply grow, and its thread stream resumed after an event
    // of the run it had (`<taskId>:<seq>`), not from a snapshot.
    assert!(
        facts["secondTab"]["streamSteps"].as_u64().unwrap() >= 4,
        "{facts:#}"
    );
    let cursor = facts["threadResume"]["lastEventId"].as_str().unwrap();
    let (task, seq) = cursor.split_once(':').unwrap();
    assert!(
        uuid::Uuid::try_parse(task).is_ok() && seq.parse::<u64>().unwrap() > 2,
        "{facts:#}"
    );
    // The image's bar moved with the upload and the PDF's went to S3 once.
    let phases = facts["uploadPhases"]["chart.png"].as_array().unwrap();
    assert!(phases.len() >= 6, "{phases:?}");
    assert_eq!(phases.last().unwrap(), "Uploaded", "{phases:?}");
    let pdf_posts = facts["s3Posts"]["pdf"].as_array().unwrap();
    assert_eq!(
        pdf_posts
            .iter()
            .filter(|p| p["status"]
                .as_u64()
                .is_some_and(|s| (200..300).contains(&s)))
            .count(),
        1,
        "{pdf_posts:?}"
    );
    for name in SCREENSHOTS {
        let path = shots.join(format!("{name}.png"));
        assert!(is_png(&path), "{} was not saved as a PNG", path.display());
    }
    if std::env::var_os("SB_REFRESH_SCREENSHOTS").is_some() {
        for name in SCREENSHOTS {
            let file = format!("{name}.png");
            std::fs::copy(shots.join(&file), root.join("docs/screenshots").join(&file)).unwrap();
        }
    }
    let render = &report["firstRender"];
    assert!(
        render["runs"].as_array().is_some_and(|r| !r.is_empty()),
        "{render:#}"
    );
    eprintln!(
        "web client: {} checks passed in Chromium {}; first contentful paint {} ms (median; {}..{}), threads shown {} ms (median; {}..{})",
        steps.len(),
        facts["browser"].as_str().unwrap_or("?"),
        render["firstContentfulPaintMs"]["median"],
        render["firstContentfulPaintMs"]["min"],
        render["firstContentfulPaintMs"]["max"],
        render["threadsShownMs"]["median"],
        render["threadsShownMs"]["min"],
        render["threadsShownMs"]["max"],
    );
}
