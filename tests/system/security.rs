//! Security: another owner gets nothing of alice's through any endpoint, transport or NATS
//! request, and changes nothing of hers (the cross-tenant matrix); the attachments service
//! refuses download links, and the S3 server itself presigned GETs and upload forms, that were
//! forged, re-pointed, extended or used after their expiry; every service refuses every kind of
//! bad bearer token.
//!
//! Each matrix test lets alice create one of everything, records her state, lets bob use every
//! endpoint with her ids, and checks three things per cell: the status and error code bob gets,
//! that no answer carries anything of alice's that bob did not send himself (her texts, file
//! names, bytes, ids, keys, signed URLs), and that alice's state is exactly what it was.

use std::time::Duration;

use base64::Engine as _;
use jsonwebtoken::{Algorithm, EncodingKey};
use platform::service::Service as _;
use protocol::files::{
    RefusalReason, ResolveOutcome, ResolveReply, ResolveRequest, SignReply, SignRequest,
};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use switchboard_system_tests::{EVENTUAL, TestPlatform, WsClient, read_sse, streamed_text};
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

/// A PNG signature and header: enough for the verifier's type check.
const PNG_HEAD: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
/// The admission refusal for a file that is not the caller's.
const NOT_YOURS: &str = "url does not point to a file you own";

fn unique(label: &str) -> String {
    format!("{label}-{}", uuid::Uuid::new_v4().simple())
}

/// A thread id for `POST /api/v1/agent/runs`, which takes UUIDs only.
fn thread_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// One HTTP exchange as text: what was sent (so echoes of the caller's own input are told
/// apart from leaks) and what came back.
struct Exchange {
    sent: String,
    status: u16,
    body: String,
}

impl Exchange {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// Sends `request` and reads the whole answer (an event stream until the server ends it).
async fn exchange(request: reqwest::RequestBuilder) -> Exchange {
    let (client, request) = request.build_split();
    let request = request.expect("a well-formed request");
    let mut sent = format!("{} {}", request.method(), request.url().path());
    for (name, value) in request.url().query_pairs() {
        sent.push_str(&format!(" {name}={value}"));
    }
    for (name, value) in request.headers() {
        sent.push_str(&format!(" {name}: {}", value.to_str().unwrap_or_default()));
    }
    if let Some(body) = request.body().and_then(reqwest::Body::as_bytes) {
        sent.push(' ');
        sent.push_str(&String::from_utf8_lossy(body));
    }
    let response = client.execute(request).await.unwrap();
    let status = response.status().as_u16();
    let body = tokio::time::timeout(EVENTUAL, response.text())
        .await
        .expect("the answer ends in time")
        .unwrap();
    Exchange { sent, status, body }
}

/// Everything alice made.
struct Alice {
    token: String,
    /// A thread whose run finished, its user message carrying the image.
    thread: String,
    run: String,
    task: String,
    /// A thread whose run stopped on a question, and the question's prompt id.
    ask_thread: String,
    ask_run: String,
    ask_task: String,
    prompt: String,
    /// A session (thread) with a chat about the note; its workspace holds both files.
    session: String,
    /// The image, uploaded through upload-url and the presigned POST.
    image_url: String,
    image_key: String,
    image_bytes: Vec<u8>,
    /// The note, uploaded through the service (`POST /api/v1/agent/attachments`).
    note_url: String,
    note_key: String,
    note_bytes: Vec<u8>,
    /// A presigned download URL of the image.
    signed_url: String,
    /// Strings of hers that must never reach another owner who did not send them.
    markers: Vec<String>,
}

async fn upload_url(platform: &TestPlatform, token: &str, body: &Value) -> Value {
    let response = platform
        .http
        .post(format!("{}/v2/files/upload-url", platform.urls.attachments))
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200, "upload-url answers a form");
    response.json().await.unwrap()
}

/// Posts `fields` and the file to S3 as a browser does; the status and S3's answer.
async fn post_form(
    http: &reqwest::Client,
    url: &str,
    fields: &serde_json::Map<String, Value>,
    bytes: &[u8],
) -> (u16, String) {
    let mut form = reqwest::multipart::Form::new();
    for (name, value) in fields {
        form = form.text(name.clone(), value.as_str().unwrap().to_owned());
    }
    form = form.part(
        "file",
        reqwest::multipart::Part::bytes(bytes.to_vec()).file_name("upload"),
    );
    let response = http.post(url).multipart(form).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// `POST /api/v1/agent/attachments` as the owner of `token`; the answer.
async fn server_upload(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    session: Option<&str>,
    (name, mime, bytes): (&str, &str, &[u8]),
) -> (u16, Value) {
    let mut form = reqwest::multipart::Form::new();
    if let Some(session) = session {
        form = form.text("session_id", session.to_owned());
    }
    let part = reqwest::multipart::Part::bytes(bytes.to_vec())
        .file_name(name.to_owned())
        .mime_str(mime)
        .unwrap();
    let response = http
        .post(format!("{base}/api/v1/agent/attachments"))
        .bearer_auth(token)
        .multipart(form.part("file", part))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
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
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Polls until the file is verified and downloadable; its download-url answer.
async fn wait_verified(platform: &TestPlatform, token: &str, content_url: &str) -> Value {
    let deadline = tokio::time::Instant::now() + EVENTUAL;
    loop {
        let (status, body) = download_url(platform, token, content_url).await;
        if status == 200 {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{content_url} was never verified: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn agui_body(thread: &str, run: &str, messages: Value, resume: Option<Value>) -> Value {
    let mut body = json!({"threadId": thread, "runId": run, "state": {}, "messages": messages,
                          "tools": [], "context": [], "forwardedProps": {}});
    if let Some(resume) = resume {
        body["resume"] = resume;
    }
    body
}

/// A run whose user message is `blocks`.
fn run_with_blocks(thread: &str, run: &str, blocks: Value) -> Value {
    let mut body = switchboard_system_tests::text_run(thread, run, "");
    body["messages"][0]["content"] = blocks;
    body
}

/// A Supabase-style signed URL for `bucket/path`, with a token valid for the test platform.
fn supabase_url(bucket: &str, path: &str) -> String {
    let now = chrono::Utc::now().timestamp();
    let claims = json!({"url": format!("{bucket}/{path}"), "iat": now, "exp": now + 300});
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &claims,
        &EncodingKey::from_secret(switchboard_system_tests::SUPABASE_SECRET.as_bytes()),
    )
    .unwrap();
    format!("https://project.supabase.co/storage/v1/object/sign/{bucket}/{path}?token={token}")
}

/// Alice creates one of everything: two uploads (presigned and through the service), a
/// finished run carrying the image, a run stopped on a question (AG-UI), a chat about the note
/// in a session whose workspace holds both files, and a signed download URL.
async fn alice_creates_one_of_everything(platform: &TestPlatform) -> Alice {
    let token = platform.infra.token("alice");
    let api = platform.api();
    let text = unique("alicetext");
    let name = unique("alicefile");
    let contents = unique("alicebytes");
    let session = unique("alice-session");

    let image_bytes = [PNG_HEAD, contents.as_bytes()].concat();
    let form = upload_url(
        platform,
        &token,
        &json!({"file_name": format!("{name}.png"), "file_type": "image/png",
                "file_size": image_bytes.len(), "content_hash": sha256_hex(&image_bytes),
                "session_id": session}),
    )
    .await;
    let (status, answer) = post_form(
        &platform.http,
        form["url"].as_str().unwrap(),
        form["fields"].as_object().unwrap(),
        &image_bytes,
    )
    .await;
    assert!(
        (200..300).contains(&status),
        "S3 took alice's image: {answer}"
    );
    let image_url = form["content_url"].as_str().unwrap().to_owned();
    let signed_url = wait_verified(platform, &token, &image_url).await["url"]
        .as_str()
        .unwrap()
        .to_owned();

    let note_bytes = format!("{contents} private notes\n").into_bytes();
    let (status, note) = server_upload(
        &platform.http,
        &platform.urls.attachments,
        &token,
        Some(&session),
        (&format!("{name}.txt"), "text/plain", &note_bytes),
    )
    .await;
    assert_eq!(status, 200, "alice's note is stored: {note}");
    let note_key = note["path"].as_str().unwrap().to_owned();
    let note_url = format!("s3://{}/{note_key}", note["bucket"].as_str().unwrap());

    let thread = thread_id();
    let run = unique("alice-run");
    let body = run_with_blocks(
        &thread,
        &run,
        json!([{"type": "text", "text": format!("{text} look at this")},
               {"type": "binary", "mimeType": "image/png", "url": image_url}]),
    );
    let (status, accepted) = api.post_run(&token, &body).await.unwrap();
    assert_eq!(status, 202, "alice's run is accepted: {accepted}");
    let task = accepted["taskId"].as_str().unwrap().to_owned();
    api.wait_for_status(&token, &run, "completed")
        .await
        .unwrap();
    api.wait_for_history(&token, &thread, |h| {
        h["messages"].as_array().is_some_and(|m| m.len() == 2)
    })
    .await
    .unwrap();

    let ask_thread = unique("alice-ask-thread");
    let ask_run = unique("alice-ask-run");
    let ask = json!([{"id": format!("{ask_run}-user"), "role": "user",
                      "content": format!("/ask radio:120 Which channel for {text}?")}]);
    let response = platform
        .http
        .post(format!("{}/api/v1/agent/ag-ui", platform.urls.runs))
        .bearer_auth(&token)
        .json(&agui_body(&ask_thread, &ask_run, ask, None))
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status().as_u16(),
        200,
        "alice's question run streams"
    );
    let events = read_sse(response, None).await.unwrap();
    let finished = &events.last().unwrap().data;
    assert_eq!(finished["outcome"]["type"], "interrupt", "{finished}");
    let prompt = finished["outcome"]["interrupts"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, status) = api
        .get_runs(&token, &format!("/api/v1/agent/runs/{ask_run}"))
        .await
        .unwrap();
    let ask_task = status["taskId"].as_str().unwrap().to_owned();

    let response = platform
        .http
        .post(format!("{}/v2/chat", platform.urls.runs))
        .bearer_auth(&token)
        .json(
            &json!({"message": format!("{text} summarise my notes"), "session_id": session,
                      "content_urls": [note_url]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200, "alice's chat streams");
    let chat = read_sse(response, None).await.unwrap();
    assert_eq!(chat.last().unwrap().data["type"], "RUN_FINISHED");

    let image_key = image_url
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('/'))
        .map(|(_, key)| key.to_owned())
        .unwrap();
    let signed_base = signed_url.split('?').next().unwrap().to_owned();
    let markers = vec![
        text,
        name,
        contents,
        session.clone(),
        thread.clone(),
        run.clone(),
        task.clone(),
        ask_thread.clone(),
        ask_run.clone(),
        ask_task.clone(),
        prompt.clone(),
        image_url.clone(),
        image_key.clone(),
        note_url.clone(),
        note_key.clone(),
        signed_base,
        sha256_hex(&image_bytes),
    ];
    Alice {
        token,
        thread,
        run,
        task,
        ask_thread,
        ask_run,
        ask_task,
        prompt,
        session,
        image_url,
        image_key,
        image_bytes,
        note_url,
        note_key,
        note_bytes,
        signed_url,
        markers,
    }
}

/// A signed URL without its signature and expiry, which change on every read.
fn unsigned(value: Value) -> Value {
    match value {
        Value::String(s) if s.contains("X-Amz-Signature") || s.contains("/v2/files/content/") => {
            Value::String(s.split('?').next().unwrap_or_default().to_owned())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(unsigned).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, unsigned(v))).collect())
        }
        other => other,
    }
}

/// What alice sees of everything she made, read as alice (signed URLs without their
/// signatures); her files are checked to download byte for byte on the way.
async fn alice_state(platform: &TestPlatform, alice: &Alice) -> Value {
    let api = platform.api();
    let token = &alice.token;
    let mut state = serde_json::Map::new();
    for run in [&alice.run, &alice.ask_run] {
        let (status, body) = api
            .get_runs(token, &format!("/api/v1/agent/runs/{run}"))
            .await
            .unwrap();
        state.insert(format!("status {run}"), json!([status, body]));
    }
    for (path, param) in [
        ("/api/v1/agent/history", "threadId"),
        ("/api/v1/agent/history/blocks", "threadId"),
        ("/api/v1/agent/history/bodies", "threadId"),
        ("/v2/history", "session_id"),
    ] {
        for thread in [&alice.thread, &alice.ask_thread, &alice.session] {
            let (status, body) = api
                .get_history(token, path, &[(param, thread)])
                .await
                .unwrap();
            state.insert(format!("{path} {thread}"), json!([status, body]));
        }
    }
    let (status, threads) = api
        .get_history(token, "/api/v1/agent/threads", &[])
        .await
        .unwrap();
    // Only the threads made by `alice_creates_one_of_everything`: a test may start more.
    let fixture = [&alice.thread, &alice.ask_thread, &alice.session];
    let threads: Vec<&Value> = threads["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| fixture.iter().any(|id| t["threadId"] == id.as_str()))
        .collect();
    assert_eq!(threads.len(), 3, "alice lists her threads");
    state.insert("threads".into(), json!([status, threads]));
    let workspace: Value = platform
        .http
        .get(format!("{}/v2/files", platform.urls.attachments))
        .bearer_auth(token)
        .query(&[("session_id", &alice.session)])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    state.insert("workspace".into(), workspace);
    for (url, bytes) in [
        (&alice.image_url, &alice.image_bytes),
        (&alice.note_url, &alice.note_bytes),
    ] {
        let (status, download) = download_url(platform, token, url).await;
        assert_eq!(status, 200, "alice can still download {url}: {download}");
        let fetched = platform
            .http
            .get(download["url"].as_str().unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(
            fetched.bytes().await.unwrap().as_ref(),
            bytes.as_slice(),
            "{url} still holds alice's bytes"
        );
        state.insert(format!("download {url}"), download);
    }
    let client = async_nats::connect(&platform.infra.nats_url).await.unwrap();
    let prompts = async_nats::jetstream::new(client)
        .get_key_value(platform.nats.names.prompts_bucket())
        .await
        .unwrap();
    let record: Value = serde_json::from_slice(
        &prompts
            .get(protocol::interaction::prompt_key(&alice.prompt))
            .await
            .unwrap()
            .expect("alice's prompt is stored"),
    )
    .unwrap();
    assert_eq!(
        record["status"], "pending",
        "alice's prompt is still open: {record}"
    );
    state.insert("prompt".into(), record);
    unsigned(Value::Object(state))
}

/// Bob, probing alice's resources.
struct Bob<'a> {
    platform: &'a TestPlatform,
    token: String,
    markers: Vec<String>,
    /// What bob already holds of his own making (named like alice's things), excused in answers.
    known: String,
}

impl<'a> Bob<'a> {
    fn new(platform: &'a TestPlatform, alice: &Alice) -> Self {
        Self {
            platform,
            token: platform.infra.token("bob"),
            markers: alice.markers.clone(),
            known: String::new(),
        }
    }

    /// Fails if `answer` carries anything of alice's that is not in what bob `sent`.
    fn assert_nothing_of_alice(&self, cell: &str, sent: &str, answer: &str) {
        for marker in &self.markers {
            let sent_or_known =
                sent.contains(marker.as_str()) || self.known.contains(marker.as_str());
            assert!(
                !answer.contains(marker.as_str()) || sent_or_known,
                "{cell}: bob's answer reveals alice's {marker:?}: {answer}"
            );
        }
    }

    /// Sends `request` as bob; expects `status` (and the envelope's `code`, when given) and an
    /// answer with nothing of alice's in it.
    async fn expect(
        &mut self,
        cell: &str,
        request: reqwest::RequestBuilder,
        status: u16,
        code: Option<&str>,
    ) -> Exchange {
        let answer = exchange(request.bearer_auth(&self.token)).await;
        assert_eq!(
            answer.status, status,
            "{cell}: bob expected {status}, got {}: {}",
            answer.status, answer.body
        );
        if let Some(code) = code {
            assert_eq!(
                answer.json()["error"]["code"],
                code,
                "{cell}: {}",
                answer.body
            );
        }
        self.assert_nothing_of_alice(cell, &answer.sent, &answer.body);
        answer
    }

    fn runs(&self, path: &str) -> String {
        format!("{}{path}", self.platform.urls.runs)
    }

    fn history(&self, path: &str) -> String {
        format!("{}{path}", self.platform.urls.history)
    }

    fn files(&self, path: &str) -> String {
        format!("{}{path}", self.platform.urls.attachments)
    }

    /// Bob's run `body` on `POST /api/v1/agent/runs` (or the AG-UI route) is refused as
    /// naming a file that is not his, and no run of that id exists for him afterwards.
    async fn run_refused_for_alices_file(&mut self, cell: &str, path: &str, body: &Value) {
        let request = self.platform.http.post(self.runs(path)).json(body);
        let answer = self
            .expect(cell, request, 422, Some("invalid_request"))
            .await;
        assert_eq!(answer.json()["error"]["message"], NOT_YOURS, "{cell}");
        let run = body["runId"].as_str().unwrap();
        let request = self
            .platform
            .http
            .get(self.runs(&format!("/api/v1/agent/runs/{run}")));
        self.expect(
            &format!("{cell}: nothing started"),
            request,
            404,
            Some("not_found"),
        )
        .await;
    }

    /// Sends `message` on a fresh WebSocket; the first server message must be an error with
    /// `code` (and details, when given) revealing nothing of alice's.
    async fn ws_refused(&mut self, cell: &str, query: &str, message: Option<&Value>, code: &str) {
        let mut ws = WsClient::connect(&self.platform.urls.runs, &self.token, query)
            .await
            .unwrap();
        let mut sent = query.to_owned();
        if let Some(message) = message {
            ws.send(message).await.unwrap();
            sent.push_str(&message.to_string());
        }
        let answer = ws.next().await.unwrap();
        assert_eq!(
            (&answer["type"], &answer["content"]["code"]),
            (&json!("error_message"), &json!(code)),
            "{cell}: {answer}"
        );
        self.assert_nothing_of_alice(cell, &sent, &answer.to_string());
        ws.close().await.ok();
    }
}

#[tokio::test]
async fn another_owner_can_neither_see_cancel_stream_nor_answer_alices_runs_and_prompts() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = alice_creates_one_of_everything(&platform).await;
    let before = alice_state(&platform, &alice).await;
    let mut bob = Bob::new(&platform, &alice);
    let http = platform.http.clone();

    // A run of alice's under way while bob tries to cancel it, and to start a run on its
    // thread id: under the reject policy (the test platform's) a busy thread answers 409, which
    // must not tell bob that alice's thread of that id is busy.
    let slow_thread = thread_id();
    let slow_run = unique("alice-slow-run");
    let words = vec!["word"; 20].join(" ");
    let (status, _) = platform
        .api()
        .post_run(
            &alice.token,
            &switchboard_system_tests::text_run(&slow_thread, &slow_run, &format!("/slow {words}")),
        )
        .await
        .unwrap();
    assert_eq!(status, 202);
    let request = http.post(bob.runs(&format!("/api/v1/agent/runs/{slow_run}/cancel")));
    bob.expect(
        "cancel of alice's running run",
        request,
        404,
        Some("not_found"),
    )
    .await;
    let body = switchboard_system_tests::text_run(&slow_thread, &unique("bob-run"), "hello");
    let request = http.post(bob.runs("/api/v1/agent/runs")).json(&body);
    bob.expect("a run on alice's busy thread id", request, 202, None)
        .await;
    let (_, slow) = platform
        .api()
        .get_runs(&alice.token, &format!("/api/v1/agent/runs/{slow_run}"))
        .await
        .unwrap();
    assert!(
        slow["status"] == "running" || slow["status"] == "queued",
        "alice's run was still under way while bob tried: {slow}"
    );
    for run in [&alice.run, &alice.ask_run, &alice.task] {
        let request = http.post(bob.runs(&format!("/api/v1/agent/runs/{run}/cancel")));
        bob.expect(&format!("cancel {run}"), request, 404, Some("not_found"))
            .await;
    }
    for id in [
        &slow_run,
        &alice.run,
        &alice.ask_run,
        &alice.task,
        &alice.ask_task,
        &alice.prompt,
    ] {
        let request = http.get(bob.runs(&format!("/api/v1/agent/runs/{id}")));
        bob.expect(&format!("status of {id}"), request, 404, Some("not_found"))
            .await;
    }
    for (run, cursor) in [
        (&alice.run, None),
        (&alice.run, Some("1")),
        (&alice.ask_run, Some("0")),
        (&alice.ask_run, Some("2")),
        (&slow_run, Some("1")),
        (&alice.task, Some("1")),
    ] {
        let mut request = http.get(bob.runs(&format!("/api/v1/agent/runs/{run}/events")));
        if let Some(cursor) = cursor {
            request = request.header("last-event-id", cursor);
        }
        bob.expect(
            &format!("events of {run} after {cursor:?}"),
            request,
            404,
            Some("not_found"),
        )
        .await;
    }

    // The WebSocket: a reconnect cursor in alice's runs, and an answer to her prompt.
    for id in [&alice.run, &alice.ask_run, &alice.task, &slow_run] {
        bob.ws_refused(
            &format!("websocket last_message_id {id}:1"),
            &format!("?last_message_id={id}:1"),
            None,
            "invalid_message",
        )
        .await;
    }
    for conversation in [&alice.ask_thread, &unique("bob-thread")] {
        let answer = json!({
            "type": "user_interaction_message", "id": unique("bob-answer"),
            "thread_id": conversation, "parent_id": alice.prompt, "conversation_id": conversation,
            "content": {"messages": [{"role": "user", "content": [{"type": "text", "text": "sms"}]}]},
            "timestamp": "2025-01-13T10:00:04Z"
        });
        bob.ws_refused(
            &format!("websocket answer to alice's prompt on {conversation}"),
            "",
            Some(&answer),
            "invalid_message",
        )
        .await;
        let request = http.get(bob.runs(&format!(
            "/api/v1/agent/runs/{}",
            answer["id"].as_str().unwrap()
        )));
        bob.expect(
            "websocket answer started nothing",
            request,
            404,
            Some("not_found"),
        )
        .await;
    }

    // AG-UI's resume of alice's interrupt, resolved or cancelled, on her thread id or his own.
    for (thread, reply) in [
        (
            alice.ask_thread.clone(),
            json!({"status": "resolved", "payload": "sms"}),
        ),
        (alice.ask_thread.clone(), json!({"status": "cancelled"})),
        (
            unique("bob-thread"),
            json!({"status": "resolved", "payload": "sms"}),
        ),
    ] {
        let mut resume = reply.clone();
        resume["interruptId"] = json!(alice.prompt);
        let run = unique("bob-resume");
        let body = agui_body(
            &thread,
            &run,
            json!([{"id": format!("{run}-user"), "role": "user", "content": "sms"}]),
            Some(json!([resume])),
        );
        let request = http.post(bob.runs("/api/v1/agent/ag-ui")).json(&body);
        let cell = format!("ag-ui resume {reply} of alice's prompt on {thread}");
        let answer = bob
            .expect(&cell, request, 422, Some("invalid_request"))
            .await;
        assert_eq!(
            answer.json()["error"]["field"],
            "/resume/0/interruptId",
            "{cell}"
        );
    }

    // Bob's cancel changed nothing: alice's run ran to its end.
    let slow = platform
        .api()
        .wait_for_status(&alice.token, &slow_run, "completed")
        .await
        .unwrap();
    assert_eq!(
        slow["cancelRequested"], false,
        "bob's cancel reached nothing: {slow}"
    );
    assert_eq!(
        alice_state(&platform, &alice).await,
        before,
        "alice's state is unchanged"
    );

    // Bob may reuse alice's thread and run ids: they name his own thread and run.
    let body = switchboard_system_tests::text_run(&alice.thread, &alice.run, "bob's own words");
    let request = http
        .post(bob.runs("/api/v1/agent/runs"))
        .header("accept", "text/event-stream")
        .json(&body);
    let answer = bob
        .expect("a run on alice's thread and run ids", request, 200, None)
        .await;
    // From here on, bob's own thread and run carry these names.
    bob.known = format!("{} {}", alice.thread, alice.run);
    let events: Vec<Value> = answer
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str(d.trim()).ok())
        .collect();
    assert_eq!(streamed_text(&events), "You said: bob's own words");
    let request = http.get(bob.runs(&format!("/api/v1/agent/runs/{}", alice.run)));
    let status = bob
        .expect(
            "status of bob's run with alice's run id",
            request,
            200,
            None,
        )
        .await;
    assert_ne!(status.json()["taskId"], json!(alice.task), "bob's own run");
    let request = http.get(bob.runs(&format!("/api/v1/agent/runs/{}/events", alice.run)));
    bob.expect(
        "events of bob's run with alice's run id",
        request,
        200,
        None,
    )
    .await;
    let request = http
        .get(bob.history("/api/v1/agent/history"))
        .query(&[("threadId", &alice.thread)]);
    let history = bob
        .expect("bob's thread with alice's thread id", request, 200, None)
        .await;
    let texts: Vec<Value> = history.json()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].clone())
        .collect();
    assert_eq!(
        texts,
        [json!("bob's own words"), json!("You said: bob's own words")],
        "only bob's messages"
    );
    assert_eq!(
        alice_state(&platform, &alice).await,
        before,
        "alice's state is unchanged"
    );

    // Alice's prompt is still hers to answer.
    let resume = json!([{"interruptId": alice.prompt, "status": "resolved", "payload": "sms"}]);
    let run = unique("alice-answer");
    let body = agui_body(
        &alice.ask_thread,
        &run,
        json!([{"id": format!("{run}-user"), "role": "user", "content": "sms"}]),
        Some(resume),
    );
    let response = http
        .post(format!("{}/api/v1/agent/ag-ui", platform.urls.runs))
        .bearer_auth(&alice.token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status().as_u16(),
        200,
        "alice answers her own prompt"
    );
    let events = read_sse(response, None).await.unwrap();
    assert_eq!(
        streamed_text(events.iter().map(|f| &f.data)),
        "You answered: sms"
    );
}

#[tokio::test]
async fn another_owner_can_neither_read_use_list_deduplicate_nor_delete_alices_files() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = alice_creates_one_of_everything(&platform).await;
    let before = alice_state(&platform, &alice).await;
    let mut bob = Bob::new(&platform, &alice);
    let http = platform.http.clone();
    let bucket = platform.s3.bucket.clone();
    let supabase = supabase_url(&bucket, &alice.image_key);
    let references = [
        ("content_url", alice.image_url.clone()),
        ("note content_url", alice.note_url.clone()),
        ("download link", alice.signed_url.clone()),
        ("Supabase signed URL", supabase.clone()),
    ];

    for (form, url) in &references {
        let request = http
            .get(bob.files("/v2/files/download-url"))
            .query(&[("content_url", url)]);
        bob.expect(
            &format!("download-url of alice's {form}"),
            request,
            404,
            Some("not_found"),
        )
        .await;
    }
    for (form, url) in &references {
        // Idempotent delete: 204 whether or not there was anything of the caller's.
        let request = http
            .delete(bob.files("/v2/files/delete"))
            .query(&[("content_url", url)]);
        bob.expect(&format!("delete of alice's {form}"), request, 204, None)
            .await;
    }
    let files = format!("{}/v2/files", platform.urls.attachments);
    let listing = |session: &str| http.get(&files).query(&[("session_id", session)]);
    let answer = bob
        .expect(
            "alice's session's workspace",
            listing(&alice.session),
            200,
            None,
        )
        .await;
    assert_eq!(
        answer.json()["files"],
        json!([]),
        "bob's session of that name is empty"
    );

    // Dedup never answers with alice's file, nor says she has that content (a 409 for the
    // same hash with another size would).
    let same = json!({"file_name": "mine.png", "file_type": "image/png",
                      "file_size": alice.image_bytes.len(),
                      "content_hash": sha256_hex(&alice.image_bytes), "session_id": alice.session});
    let upload_url_endpoint = format!("{}/v2/files/upload-url", platform.urls.attachments);
    for (what, patch) in [
        (
            "another size",
            json!({"file_size": alice.image_bytes.len() + 1}),
        ),
        ("another type", json!({"file_type": "image/gif"})),
    ] {
        // Each asked by an owner of its own: an owner's own pending upload of that hash would
        // rightly conflict.
        let mut body = same.clone();
        for (k, v) in patch.as_object().unwrap() {
            body[k] = v.clone();
        }
        let stranger = platform.infra.token(&unique("stranger"));
        let answer = exchange(
            http.post(&upload_url_endpoint)
                .bearer_auth(&stranger)
                .json(&body),
        )
        .await;
        let cell = format!("upload-url with alice's content_hash and {what}");
        assert_eq!(answer.status, 200, "{cell}: {}", answer.body);
        assert_eq!(answer.json()["is_duplicate"], false, "{cell}");
        bob.assert_nothing_of_alice(&cell, &answer.sent, &answer.body);
    }
    let request = http.post(bob.files("/v2/files/upload-url")).json(&same);
    let answer = bob
        .expect("upload-url with alice's content_hash", request, 200, None)
        .await;
    let answer = answer.json();
    assert_eq!(
        (&answer["is_duplicate"], &answer["upload_required"]),
        (&json!(false), &json!(true)),
        "{answer}"
    );
    // The same bytes through the service, into a session named like hers: his own copy.
    let (status, answer) = server_upload(
        &http,
        &platform.urls.attachments,
        &bob.token,
        Some(&alice.session),
        ("copy.txt", "text/plain", &alice.note_bytes),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let sent = format!(
        "{} {}",
        alice.session,
        String::from_utf8_lossy(&alice.note_bytes)
    );
    bob.assert_nothing_of_alice("server upload of alice's bytes", &sent, &answer.to_string());
    assert_ne!(answer["path"], json!(alice.note_key), "bob's own object");

    // Runs, AG-UI parts, chat and the WebSocket with alice's files.
    for (form, url) in &references {
        let body = run_with_blocks(
            &thread_id(),
            &unique("bob-run"),
            json!([{"type": "text", "text": "see"},
                   {"type": "binary", "mimeType": "image/png", "url": url}]),
        );
        bob.run_refused_for_alices_file(
            &format!("binary block with alice's {form}"),
            "/api/v1/agent/runs",
            &body,
        )
        .await;
    }
    for (part, url) in [("image", &alice.signed_url), ("document", &alice.note_url)] {
        let run = unique("bob-run");
        let body = agui_body(
            &unique("bob-thread"),
            &run,
            json!([{"id": format!("{run}-user"), "role": "user", "content": [
                {"type": "text", "text": "see"},
                {"type": part, "source": {"type": "url", "value": url}}]}]),
            None,
        );
        bob.run_refused_for_alices_file(
            &format!("AG-UI {part} part with alice's file"),
            "/api/v1/agent/ag-ui",
            &body,
        )
        .await;
    }
    for (form, url) in &references {
        for session in [alice.session.clone(), unique("bob-session")] {
            let body = json!({"message": "describe", "session_id": session, "content_urls": [url]});
            let request = http.post(bob.runs("/v2/chat")).json(&body);
            let cell = format!("/v2/chat with alice's {form} in session {session}");
            let answer = bob
                .expect(&cell, request, 422, Some("invalid_request"))
                .await;
            assert_eq!(answer.json()["error"]["message"], NOT_YOURS, "{cell}");
            let answer = bob
                .expect(&format!("{cell}: workspace"), listing(&session), 200, None)
                .await;
            assert!(
                !answer.body.contains(&alice.image_key) && !answer.body.contains(&alice.note_key),
                "{cell}: alice's file joined no session of bob's: {}",
                answer.body
            );
        }
    }
    for (form, url) in &references {
        let message = json!({
            "type": "user_message", "schema_type": "string", "id": unique("bob-ws"),
            "conversation_id": unique("bob-thread"),
            "content": {"messages": [{"role": "user", "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": url}}]}]},
            "timestamp": "2025-01-13T10:00:00Z"
        });
        bob.ws_refused(
            &format!("websocket image_url of alice's {form}"),
            "",
            Some(&message),
            "invalid_data_content",
        )
        .await;
        let chat = json!({"type": "chat", "message": "describe", "session_id": alice.session,
                          "content_urls": [url]});
        bob.ws_refused(
            &format!("websocket chat with alice's {form}"),
            "",
            Some(&chat),
            "invalid_data_content",
        )
        .await;
    }

    // The attachments service's NATS endpoints, asked directly for bob (as the worker, which
    // may call both).
    let (client, _) = platform::nats::connect(&platform.nats, "worker")
        .await
        .unwrap();
    let names = &platform.nats.names;
    for (form, url) in &references {
        for session_id in [None, Some(alice.session.clone())] {
            let request = ResolveRequest::V1 {
                owner: "bob".to_owned(),
                url: url.clone(),
                session_id: session_id.clone(),
            };
            let reply = client
                .request(
                    names.attachments_resolve_subject(),
                    serde_json::to_vec(&request).unwrap().into(),
                )
                .await
                .unwrap();
            let text = String::from_utf8_lossy(&reply.payload).into_owned();
            bob.assert_nothing_of_alice(&format!("NATS resolve of alice's {form}"), url, &text);
            let ResolveReply::V1(outcome) = serde_json::from_slice(&reply.payload).unwrap();
            assert_eq!(
                outcome,
                ResolveOutcome::Refused {
                    reason: RefusalReason::NotFound
                },
                "NATS resolve of alice's {form} for bob (session {session_id:?})"
            );
        }
    }
    let urls: Vec<String> = references.iter().map(|(_, url)| url.clone()).collect();
    let request = SignRequest::V1 {
        owner: "bob".to_owned(),
        urls: urls.clone(),
    };
    let reply = client
        .request(
            names.attachments_sign_subject(),
            serde_json::to_vec(&request).unwrap().into(),
        )
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&reply.payload).into_owned();
    bob.assert_nothing_of_alice("NATS sign of alice's files", &urls.join(" "), &text);
    let SignReply::V1 { urls: signed, .. } = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(
        signed,
        vec![None; urls.len()],
        "nothing of alice's is signed for bob"
    );
    let answer = bob
        .expect(
            "alice's session's workspace afterwards",
            listing(&alice.session),
            200,
            None,
        )
        .await;
    assert!(
        !answer.body.contains(&alice.image_key) && !answer.body.contains(&alice.note_key),
        "no resolve put alice's files in bob's session: {}",
        answer.body
    );

    assert_eq!(
        alice_state(&platform, &alice).await,
        before,
        "alice's state is unchanged"
    );
}

#[tokio::test]
async fn another_owner_sees_nothing_of_alices_history_in_any_shape() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = alice_creates_one_of_everything(&platform).await;
    let before = alice_state(&platform, &alice).await;
    let mut bob = Bob::new(&platform, &alice);
    let http = platform.http.clone();
    let tomorrow = (chrono::Utc::now() + chrono::Duration::days(1))
        .format("%Y-%m-%d")
        .to_string();

    for (path, param) in [
        ("/api/v1/agent/history", "threadId"),
        ("/api/v1/agent/history/blocks", "threadId"),
        ("/api/v1/agent/history/bodies", "threadId"),
        ("/v2/history", "session_id"),
    ] {
        for thread in [&alice.thread, &alice.ask_thread, &alice.session] {
            let request = http.get(bob.history(path)).query(&[(param, thread)]);
            bob.expect(
                &format!("{path} of {thread}"),
                request,
                404,
                Some("not_found"),
            )
            .await;
            let request = http.get(bob.history(path)).query(&[
                (param, thread.as_str()),
                ("before", tomorrow.as_str()),
                ("tz", "Europe/Berlin"),
            ]);
            bob.expect(
                &format!("{path} of {thread} before {tomorrow}"),
                request,
                404,
                Some("not_found"),
            )
            .await;
        }
        // Without a thread: the caller's latest thread, and bob has none.
        let request = http.get(bob.history(path)).query(&[("before", &tomorrow)]);
        let answer = bob
            .expect(
                &format!("{path} of bob's latest thread"),
                request,
                200,
                None,
            )
            .await;
        assert_eq!(
            answer.json()["messages"],
            json!([]),
            "{path}: {}",
            answer.body
        );
    }
    let request = http.get(bob.history("/api/v1/agent/threads"));
    let answer = bob.expect("bob's thread list", request, 200, None).await;
    assert_eq!(answer.json()["threads"], json!([]), "{}", answer.body);
    // A page cursor of alice's lists bob's threads after that point, never hers.
    let (_, page) = platform
        .api()
        .get_history(&alice.token, "/api/v1/agent/threads", &[("limit", "1")])
        .await
        .unwrap();
    let cursor = page["nextCursor"]
        .as_str()
        .expect("alice has a second page")
        .to_owned();
    let request = http
        .get(bob.history("/api/v1/agent/threads"))
        .query(&[("limit", "1"), ("cursor", cursor.as_str())]);
    let answer = bob
        .expect("bob's thread list after alice's cursor", request, 200, None)
        .await;
    assert_eq!(answer.json()["threads"], json!([]), "{}", answer.body);

    // The progress endpoint takes a task id from its caller (runs); it answers a number only.
    let (client, _) = platform::nats::connect(&platform.nats, "runs")
        .await
        .unwrap();
    let request = protocol::messaging::ProgressRequest::V1 {
        task_id: alice.task.parse().unwrap(),
    };
    let reply = client
        .request(
            platform.nats.names.history_progress_subject(),
            serde_json::to_vec(&request).unwrap().into(),
        )
        .await
        .unwrap();
    let reply: Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(
        reply
            .as_object()
            .map(|o| o.keys().cloned().collect::<Vec<_>>()),
        Some(vec!["v".to_owned(), "written_seq".to_owned()]),
        "{reply}"
    );

    assert_eq!(
        alice_state(&platform, &alice).await,
        before,
        "alice's state is unchanged"
    );
}

/// Replaces the value of the query parameter `name` in a presigned URL, as text (the rest of
/// the URL byte for byte as signed).
fn with_param(url: &str, name: &str, value: &str) -> String {
    let start = url
        .find(&format!("{name}="))
        .expect("the parameter is there")
        + name.len()
        + 1;
    let end = url[start..].find('&').map_or(url.len(), |i| start + i);
    format!("{}{value}{}", &url[..start], &url[end..])
}

fn param<'u>(url: &'u str, name: &str) -> &'u str {
    let start = url
        .find(&format!("{name}="))
        .expect("the parameter is there")
        + name.len()
        + 1;
    let end = url[start..].find('&').map_or(url.len(), |i| start + i);
    &url[start..end]
}

/// The `<Code>` of an S3 error answer.
fn s3_code(body: &str) -> &str {
    body.split_once("<Code>")
        .and_then(|(_, rest)| rest.split_once("</Code>"))
        .map_or("", |(code, _)| code)
}

/// GETs `url` straight from the S3 server; the status, S3's error code and the body.
async fn fetch(http: &reqwest::Client, url: &str) -> (u16, String, Vec<u8>) {
    let response = http.get(url).send().await.unwrap();
    let status = response.status().as_u16();
    let body = response.bytes().await.unwrap().to_vec();
    let code = s3_code(&String::from_utf8_lossy(&body)).to_owned();
    (status, code, body)
}

/// HMAC-SHA256 (RFC 2104) over `sha2`, for presigning by hand below.
fn hmac_sha256(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|k| k ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .to_vec()
}

/// SigV4's URI encoding: everything but `A-Za-z0-9-._~` (and `/` when `keep_slash`).
fn aws_encode(raw: &str, keep_slash: bool) -> String {
    raw.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            b'/' if keep_slash => "/".to_owned(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A SigV4 presigned GET of `key` in the platform's bucket, straight on the S3 server, signed
/// with the platform's own credentials at `date` for `expires` seconds and pinning the response
/// Content-Type: what the AWS SDK presigner makes (path style, only `host` signed,
/// `UNSIGNED-PAYLOAD`), written out because downloads no longer use one.
fn presign_s3_get(
    s3: &platform::s3::S3Config,
    key: &str,
    date: chrono::DateTime<chrono::Utc>,
    expires: u64,
) -> String {
    use secrecy::ExposeSecret as _;
    let endpoint = s3.endpoint.as_deref().unwrap().trim_end_matches('/');
    let host = endpoint.split_once("://").unwrap().1;
    let (day, amz_date) = (
        date.format("%Y%m%d").to_string(),
        date.format("%Y%m%dT%H%M%SZ").to_string(),
    );
    let scope = format!("{day}/{}/s3/aws4_request", s3.region);
    // Sorted by name, byte order: the `X-Amz-*` names sort before `response-*`.
    let query = format!(
        "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={}&X-Amz-Date={amz_date}\
         &X-Amz-Expires={expires}&X-Amz-SignedHeaders=host&response-content-type=text%2Fplain",
        aws_encode(&format!("{}/{scope}", s3.access_key), false)
    );
    let path = format!(
        "/{}/{}",
        aws_encode(&s3.bucket, false),
        aws_encode(key, true)
    );
    let canonical = format!("GET\n{path}\n{query}\nhost:{host}\n\nhost\nUNSIGNED-PAYLOAD");
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        sha256_hex(canonical.as_bytes())
    );
    let secret = format!("AWS4{}", s3.secret_key.expose_secret());
    let signing_key = [day.as_str(), s3.region.as_str(), "s3", "aws4_request"]
        .iter()
        .fold(secret.into_bytes(), |key, part| {
            hmac_sha256(&key, part.as_bytes())
        });
    let signature = hex::encode(hmac_sha256(&signing_key, to_sign.as_bytes()));
    format!("{endpoint}{path}?{query}&X-Amz-Signature={signature}")
}

/// Alice's and bob's private notes, uploaded through the service: each object key and
/// download-url answer.
async fn alice_and_bob_notes(
    platform: &TestPlatform,
    alice: &str,
    bob: &str,
) -> [(String, Value); 2] {
    let upload = |token: String, bytes: &'static [u8]| async move {
        let (status, answer) = server_upload(
            &platform.http,
            &platform.urls.attachments,
            &token,
            None,
            ("private.txt", "text/plain", bytes),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        let key = answer["path"].as_str().unwrap().to_owned();
        let content_url = format!("s3://{}/{key}", answer["bucket"].as_str().unwrap());
        let (status, download) = download_url(platform, &token, &content_url).await;
        assert_eq!(status, 200, "{download}");
        (key, download)
    };
    [
        upload(alice.to_owned(), b"alice's private bytes\n").await,
        upload(bob.to_owned(), b"bob's private bytes\n").await,
    ]
}

#[tokio::test]
async fn the_s3_server_refuses_a_download_url_that_was_forged_re_pointed_or_extended() {
    let platform = TestPlatform::spawn().await.unwrap();
    let (alice, bob) = (platform.infra.token("alice"), platform.infra.token("bob"));
    let [(alice_key, _), (bob_key, _)] = alice_and_bob_notes(&platform, &alice, &bob).await;
    // Browsers download through the service now; S3 must still refuse anything not signed.
    let now = chrono::Utc::now();
    let alice_url = presign_s3_get(&platform.s3, &alice_key, now, 300);
    let bob_url = presign_s3_get(&platform.s3, &bob_key, now, 300);
    let (status, _, body) = fetch(&platform.http, &alice_url).await;
    assert_eq!(
        (status, body.as_slice()),
        (200, b"alice's private bytes\n".as_slice()),
        "the URL as signed works"
    );

    let signature = param(&alice_url, "X-Amz-Signature");
    let flipped = format!(
        "{}{}",
        if signature.starts_with('0') { "1" } else { "0" },
        &signature[1..]
    );
    let date = param(&alice_url, "X-Amz-Date");
    let later = chrono::NaiveDateTime::parse_from_str(date, "%Y%m%dT%H%M%SZ").unwrap()
        + chrono::Duration::minutes(10);
    let cases = [
        (
            "one character of the signature changed",
            with_param(&alice_url, "X-Amz-Signature", &flipped),
            403,
        ),
        (
            "alice's URL re-pointed at bob's object",
            alice_url.replacen(&alice_key, &bob_key, 1),
            403,
        ),
        (
            "bob's URL re-pointed at alice's object",
            bob_url.replacen(&bob_key, &alice_key, 1),
            403,
        ),
        (
            "X-Amz-Expires extended to a week",
            with_param(&alice_url, "X-Amz-Expires", "604800"),
            403,
        ),
        (
            "X-Amz-Date moved ten minutes later",
            with_param(
                &alice_url,
                "X-Amz-Date",
                &later.format("%Y%m%dT%H%M%SZ").to_string(),
            ),
            403,
        ),
        (
            "served as HTML instead",
            with_param(&alice_url, "response-content-type", "text%2Fhtml"),
            403,
        ),
        // Without a signature it is no presigned request at all: malformed.
        (
            "the signature removed",
            with_param(&alice_url, "X-Amz-Signature", ""),
            400,
        ),
        (
            "no signature at all",
            alice_url.split('?').next().unwrap().to_owned(),
            403,
        ),
    ];
    for (what, url, refused) in cases {
        assert_ne!(url, alice_url, "{what}: the URL was changed");
        let (status, code, body) = fetch(&platform.http, &url).await;
        assert_eq!(
            status, refused,
            "{what}: S3 refused with {refused}, got {status} {code}"
        );
        let body = String::from_utf8_lossy(&body);
        assert!(
            !body.contains("private bytes"),
            "{what}: no object's bytes in S3's refusal: {body}"
        );
    }
    let (status, _, body) = fetch(&platform.http, &bob_url).await;
    assert_eq!(
        (status, body.as_slice()),
        (200, b"bob's private bytes\n".as_slice()),
        "bob's URL still works"
    );
}

#[tokio::test]
async fn a_download_link_that_was_forged_re_pointed_or_extended_is_refused() {
    let platform = TestPlatform::spawn().await.unwrap();
    let (alice, bob) = (platform.infra.token("alice"), platform.infra.token("bob"));
    let [(_, alice_download), (_, bob_download)] =
        alice_and_bob_notes(&platform, &alice, &bob).await;
    let alice_url = alice_download["url"].as_str().unwrap().to_owned();
    let bob_url = bob_download["url"].as_str().unwrap().to_owned();
    let link = |url: &str| {
        switchboard_system_tests::download_link(&platform.urls.attachments, url)
            .unwrap_or_else(|| panic!("a download link of the service: {url}"))
    };
    let ((alice_id, expires), (bob_id, _)) = (link(&alice_url), link(&bob_url));
    let (status, _, body) = fetch(&platform.http, &alice_url).await;
    assert_eq!(
        (status, body.as_slice()),
        (200, b"alice's private bytes\n".as_slice()),
        "the link as signed works, without a bearer token"
    );

    let signature = param(&alice_url, "signature");
    let flipped = format!(
        "{}{}",
        if signature.starts_with('0') { "1" } else { "0" },
        &signature[1..]
    );
    let (alice_id, bob_id) = (alice_id.to_string(), bob_id.to_string());
    let cases = [
        (
            "one character of the signature changed",
            with_param(&alice_url, "signature", &flipped),
            "signature",
        ),
        (
            "alice's link re-pointed at bob's file",
            alice_url.replacen(&alice_id, &bob_id, 1),
            "signature",
        ),
        (
            "bob's link re-pointed at alice's file",
            bob_url.replacen(&bob_id, &alice_id, 1),
            "signature",
        ),
        (
            "expires extended by a week",
            with_param(&alice_url, "expires", &(expires + 604_800).to_string()),
            "signature",
        ),
        (
            "expires moved one second",
            with_param(&alice_url, "expires", &(expires + 1).to_string()),
            "signature",
        ),
        (
            "the signature emptied",
            with_param(&alice_url, "signature", ""),
            "signature",
        ),
        (
            "no query at all",
            alice_url.split('?').next().unwrap().to_owned(),
            "signature",
        ),
    ];
    for (what, url, field) in cases {
        assert_ne!(url, alice_url, "{what}: the link was changed");
        let response = platform.http.get(&url).send().await.unwrap();
        let status = response.status().as_u16();
        let body = response.text().await.unwrap();
        let answer: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        assert_eq!(
            (
                status,
                answer["error"]["code"].as_str(),
                answer["error"]["field"].as_str()
            ),
            (403, Some("unauthorized"), Some(field)),
            "{what}: refused: {body}"
        );
        assert!(
            !body.contains("private bytes"),
            "{what}: no file's bytes in the refusal: {body}"
        );
    }
    // Parameters the link does not sign change nothing about how it is served.
    let response = platform
        .http
        .get(format!("{alice_url}&response-content-type=text%2Fhtml"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/plain",
        "the verified type, whatever the query asks"
    );
    let (status, _, body) = fetch(&platform.http, &bob_url).await;
    assert_eq!(
        (status, body.as_slice()),
        (200, b"bob's private bytes\n".as_slice()),
        "bob's link still works"
    );
}

#[tokio::test]
async fn the_s3_server_refuses_an_upload_form_used_for_another_size_type_content_or_key() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let bob = platform.infra.token("bob");
    // Bob's object, which alice's form must not be able to overwrite.
    let bob_bytes = b"bob's private bytes\n";
    let (status, bobs) = server_upload(
        &platform.http,
        &platform.urls.attachments,
        &bob,
        None,
        ("bob.txt", "text/plain", bob_bytes),
    )
    .await;
    assert_eq!(status, 200, "{bobs}");
    let bob_key = bobs["path"].as_str().unwrap().to_owned();
    let bob_content_url = format!("s3://{}/{bob_key}", bobs["bucket"].as_str().unwrap());

    let bytes = b"exactly these nineteen";
    let form = upload_url(
        &platform,
        &alice,
        &json!({"file_name": "a.txt", "file_type": "text/plain", "file_size": bytes.len(),
                "content_hash": sha256_hex(bytes)}),
    )
    .await;
    let url = form["url"].as_str().unwrap();
    let fields = form["fields"].as_object().unwrap().clone();
    let with = |name: &str, value: &str| {
        let mut changed = fields.clone();
        changed.insert(name.to_owned(), json!(value));
        changed
    };
    let same_size_other_bytes = b"EXACTLY THESE NINETEEN";
    /// What was changed, the form's fields, the file, and S3's error code.
    type Case<'a> = (&'a str, serde_json::Map<String, Value>, &'a [u8], &'a str);
    let cases: [Case; 6] = [
        (
            "more bytes than declared",
            fields.clone(),
            b"exactly these nineteen and more",
            "EntityTooLarge",
        ),
        (
            "fewer bytes than declared",
            fields.clone(),
            b"exactly",
            "EntityTooSmall",
        ),
        (
            "other bytes than the declared hash",
            fields.clone(),
            same_size_other_bytes,
            "BadDigest",
        ),
        (
            "another Content-Type",
            with("Content-Type", "text/html"),
            bytes,
            "InvalidPolicyDocument",
        ),
        (
            "bob's key",
            with("key", &bob_key),
            bytes,
            "InvalidPolicyDocument",
        ),
        (
            "a key of its own choosing",
            with("key", "uploads/elsewhere/a.txt"),
            bytes,
            "InvalidPolicyDocument",
        ),
    ];
    for (what, fields, body, code) in cases {
        let (status, answer) = post_form(&platform.http, url, &fields, body).await;
        assert_eq!(
            (status, s3_code(&answer)),
            (400, code),
            "{what}: S3 refused the form: {answer}"
        );
    }
    let (_, download) = download_url(&platform, &bob, &bob_content_url).await;
    let (status, _, body) = fetch(&platform.http, download["url"].as_str().unwrap()).await;
    assert_eq!(
        (status, body.as_slice()),
        (200, bob_bytes.as_slice()),
        "bob's object is intact"
    );

    let (status, answer) = post_form(&platform.http, url, &fields, bytes).await;
    assert!(
        (200..300).contains(&status),
        "the form as signed works: {answer}"
    );
    wait_verified(&platform, &alice, form["content_url"].as_str().unwrap()).await;
}

#[tokio::test]
async fn a_signed_url_or_upload_form_past_its_expiry_is_refused_by_s3_and_cannot_be_extended() {
    // The attachments service alone, with lifetimes of a few seconds.
    let infra = test_support::Infra::from_env();
    let ttl = Duration::from_secs(3);
    let s3 = infra.fresh_s3();
    let app = attachments::Application::build(attachments::Config {
        addr: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        auth: infra.auth(),
        database_url: infra.fresh_database().await.unwrap(),
        migrate_on_start: true,
        s3: s3.clone(),
        nats: infra.fresh_nats(),
        supabase_jwt_secret: None,
        public_endpoint: None,
        public_url: None,
        upload_ttl: ttl,
        download_ttl: ttl,
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
    let http = reqwest::Client::new();
    let alice = infra.token("alice");

    let bytes = b"alice's expiring bytes\n";
    let (status, answer) =
        server_upload(&http, &base, &alice, None, ("a.txt", "text/plain", bytes)).await;
    assert_eq!(status, 200, "{answer}");
    let url = answer["url"].as_str().unwrap().to_owned();
    let (_, expires) = switchboard_system_tests::download_link(&base, &url)
        .unwrap_or_else(|| panic!("a download link of the service: {url}"));
    let left = expires - chrono::Utc::now().timestamp();
    assert!(
        (2..=3).contains(&left),
        "the link lives for the configured 3 s: {url}"
    );
    let (status, _, body) = fetch(&http, &url).await;
    assert_eq!(
        (status, body.as_slice()),
        (200, bytes.as_slice()),
        "valid while fresh"
    );
    let form = http
        .post(format!("{base}/v2/files/upload-url"))
        .bearer_auth(&alice)
        .json(&json!({"file_name": "b.txt", "file_type": "text/plain", "file_size": bytes.len()}))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();

    // The link stops working at its expiry, and its expiry cannot be moved.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let (status, body) = loop {
        let (status, _, body) = fetch(&http, &url).await;
        if status != 200 || tokio::time::Instant::now() > deadline {
            break (
                status,
                serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null),
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        (status, &body["error"]["code"], &body["error"]["field"]),
        (403, &json!("unauthorized"), &json!("expires")),
        "an expired link: {body}"
    );
    let later = (chrono::Utc::now().timestamp() + 3600).to_string();
    let (status, _, body) = fetch(&http, &with_param(&url, "expires", &later)).await;
    assert_eq!(
        status,
        403,
        "an expiry moved later breaks the signature: {}",
        String::from_utf8_lossy(&body)
    );

    // S3 refuses a presigned GET past its expiry just the same, and its expiry cannot be moved.
    let key = answer["path"].as_str().unwrap();
    let fresh = presign_s3_get(&s3, key, chrono::Utc::now(), 60);
    assert_eq!(fetch(&http, &fresh).await.0, 200, "a fresh presigned GET");
    let signed = chrono::Utc::now() - chrono::Duration::minutes(10);
    let stale = presign_s3_get(&s3, key, signed, 3);
    let (status, code, _) = fetch(&http, &stale).await;
    assert_eq!(
        (status, code.as_str()),
        (403, "AccessDenied"),
        "an expired presigned GET"
    );
    let now = chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string();
    let credential =
        param(&stale, "X-Amz-Credential").replacen(&param(&stale, "X-Amz-Date")[..8], &now[..8], 1);
    for (what, extended) in [
        (
            "X-Amz-Expires raised",
            with_param(&stale, "X-Amz-Expires", "3600"),
        ),
        (
            "X-Amz-Date moved to now",
            with_param(
                &with_param(&stale, "X-Amz-Date", &now),
                "X-Amz-Credential",
                &credential,
            ),
        ),
    ] {
        let (status, code, _) = fetch(&http, &extended).await;
        assert_eq!(status, 403, "{what}: S3 refused, got {status} {code}");
    }

    // The upload form stops working at its policy's expiration, which cannot be moved.
    let fields = form["fields"].as_object().unwrap().clone();
    let engine = base64::engine::general_purpose::STANDARD;
    let mut policy: Value =
        serde_json::from_slice(&engine.decode(fields["policy"].as_str().unwrap()).unwrap())
            .unwrap();
    let expiration: chrono::DateTime<chrono::Utc> =
        policy["expiration"].as_str().unwrap().parse().unwrap();
    assert!(
        expiration <= chrono::Utc::now() + chrono::Duration::seconds(4),
        "the form lives for the configured 3 s: {policy}"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while chrono::Utc::now() <= expiration + chrono::Duration::milliseconds(500) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the form never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let s3 = form["url"].as_str().unwrap();
    let (status, answer) = post_form(&http, s3, &fields, bytes).await;
    assert_eq!(
        (status, s3_code(&answer)),
        (403, "AccessDenied"),
        "an expired form: {answer}"
    );
    policy["expiration"] = json!(
        (chrono::Utc::now() + chrono::Duration::hours(1))
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    );
    let mut extended = fields.clone();
    extended.insert("policy".into(), json!(engine.encode(policy.to_string())));
    let (status, answer) = post_form(&http, s3, &extended, bytes).await;
    assert_eq!(
        status, 403,
        "an expiration moved later breaks the signature: {answer}"
    );
}

/// A JWT with any header and claims, HMAC-SHA256-signed with `secret` (or unsigned).
fn forge(header: &Value, claims: &Value, secret: Option<&str>) -> String {
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let signing_input = format!(
        "{}.{}",
        engine.encode(header.to_string()),
        engine.encode(claims.to_string())
    );
    let signature = secret.map_or(String::new(), |secret| {
        jsonwebtoken::crypto::sign(
            signing_input.as_bytes(),
            &EncodingKey::from_secret(secret.as_bytes()),
            Algorithm::HS256,
        )
        .unwrap()
    });
    format!("{signing_input}.{signature}")
}

/// Every kind of token no service may accept, named.
fn bad_tokens(secret: &str) -> Vec<(&'static str, String)> {
    let now = chrono::Utc::now().timestamp();
    let hs256 = json!({"alg": "HS256", "typ": "JWT"});
    let valid = json!({"sub": "alice", "iat": now, "exp": now + 3600});
    let claims = |patch: Value| {
        let mut claims = valid.clone();
        for (k, v) in patch.as_object().unwrap() {
            if v.is_null() {
                claims.as_object_mut().unwrap().remove(k);
            } else {
                claims[k] = v.clone();
            }
        }
        claims
    };
    let hs512 = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(Algorithm::HS512),
        &valid,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap();
    vec![
        (
            "unsigned, alg none",
            forge(&json!({"alg": "none", "typ": "JWT"}), &valid, None),
        ),
        ("alg none with the right signature", {
            let signed = forge(&hs256, &valid, Some(secret));
            let signature = signed.rsplit('.').next().unwrap().to_owned();
            let unsigned = forge(&json!({"alg": "none", "typ": "JWT"}), &valid, None);
            format!("{unsigned}{signature}")
        }),
        (
            "HS256 signed with another secret",
            forge(&hs256, &valid, Some("another-secret-0123456789abcdef0123")),
        ),
        (
            "RS256 declared, signed with the HS256 secret",
            forge(&json!({"alg": "RS256", "typ": "JWT"}), &valid, Some(secret)),
        ),
        ("HS512 with the right secret", hs512),
        (
            "expired a minute ago",
            forge(&hs256, &claims(json!({"exp": now - 60})), Some(secret)),
        ),
        (
            "not valid for ten minutes (nbf)",
            forge(&hs256, &claims(json!({"nbf": now + 600})), Some(secret)),
        ),
        (
            "without sub",
            forge(&hs256, &claims(json!({"sub": null})), Some(secret)),
        ),
        (
            "with an empty sub",
            forge(&hs256, &claims(json!({"sub": ""})), Some(secret)),
        ),
        (
            "with a sub of 300 characters",
            forge(
                &hs256,
                &claims(json!({"sub": "a".repeat(300)})),
                Some(secret),
            ),
        ),
        (
            "with a control character in sub",
            forge(&hs256, &claims(json!({"sub": "alice\nbob"})), Some(secret)),
        ),
        (
            "without exp",
            forge(&hs256, &claims(json!({"exp": null})), Some(secret)),
        ),
        ("with a tampered payload", {
            let signed = forge(&hs256, &valid, Some(secret));
            let mut parts: Vec<String> = signed.split('.').map(str::to_owned).collect();
            parts[1] = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(claims(json!({"sub": "bob"})).to_string());
            parts.join(".")
        }),
        ("not a JWT", "not-a-jwt".to_owned()),
    ]
}

/// The status of a WebSocket upgrade with `token` in the `Authorization` header or, for
/// browsers, in the subprotocols `bearer, <token>`; and its `WWW-Authenticate`.
async fn upgrade(runs: &str, token: &str, as_subprotocol: bool) -> (u16, Option<String>) {
    let url = format!("{}/websocket", runs.replacen("http", "ws", 1));
    let mut request = url.into_client_request().unwrap();
    let (name, value) = if as_subprotocol {
        ("sec-websocket-protocol", format!("bearer, {token}"))
    } else {
        ("authorization", format!("Bearer {token}"))
    };
    request.headers_mut().insert(name, value.parse().unwrap());
    let response = match tokio_tungstenite::connect_async(request).await {
        Ok((_, response)) => response.map(|_| None),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => *response,
        Err(other) => panic!("the upgrade neither succeeded nor was answered: {other}"),
    };
    let challenge = response
        .headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    (response.status().as_u16(), challenge)
}

#[tokio::test]
async fn every_service_refuses_unsigned_forged_confused_expired_early_and_subless_tokens() {
    let platform = TestPlatform::spawn().await.unwrap();
    let endpoints = [
        format!("{}/api/v1/agent/runs/x", platform.urls.runs),
        format!("{}/api/v1/agent/history", platform.urls.history),
        format!("{}/v2/files?session_id=x", platform.urls.attachments),
    ];
    // The harness is sound: a good token gets past authentication everywhere.
    let good = platform.infra.token("alice");
    for (url, want) in endpoints.iter().zip([404, 200, 200]) {
        let response = platform
            .http
            .get(url)
            .bearer_auth(&good)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), want, "{url} with a good token");
    }
    for as_subprotocol in [false, true] {
        assert_eq!(
            upgrade(&platform.urls.runs, &good, as_subprotocol).await.0,
            101,
            "the WebSocket upgrade with a good token (subprotocol: {as_subprotocol})"
        );
    }
    for (what, token) in bad_tokens(&platform.infra.jwt_secret) {
        for url in &endpoints {
            let response = platform
                .http
                .get(url)
                .bearer_auth(&token)
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let challenge = response
                .headers()
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body: Value = response.json().await.unwrap_or(Value::Null);
            assert_eq!(
                (status, challenge.as_deref(), &body["error"]["code"]),
                (401, Some("Bearer"), &json!("unauthorized")),
                "{url} with a token {what}: {body}"
            );
        }
        for as_subprotocol in [false, true] {
            let (status, _) = upgrade(&platform.urls.runs, &token, as_subprotocol).await;
            assert_eq!(
                status, 401,
                "the WebSocket upgrade with a token {what} (subprotocol: {as_subprotocol})"
            );
        }
    }
}

#[tokio::test]
async fn a_refused_websocket_upgrade_says_how_to_authenticate() {
    let platform = TestPlatform::spawn().await.unwrap();
    for as_subprotocol in [false, true] {
        assert_eq!(
            upgrade(&platform.urls.runs, "not-a-jwt", as_subprotocol).await,
            (401, Some("Bearer".to_owned())),
            "RFC 9110 15.5.2: a 401 carries a challenge (subprotocol: {as_subprotocol})"
        );
    }
}

#[tokio::test]
async fn the_worker_is_not_dumpable_so_its_extraction_helpers_cannot_read_its_secrets() {
    // In-process: building the worker makes this process non-dumpable, as it makes the worker
    // binary (its /proc/<pid>/environ and memory closed to same-user processes).
    let _platform = TestPlatform::spawn().await.unwrap();
    assert_eq!(
        rustix::process::dumpable_behavior().unwrap(),
        rustix::process::DumpableBehavior::NotDumpable
    );
}

/// The security review's M2: a service may write a stream and create a push consumer on it,
/// and JetStream delivers a stored message to any subject, with a `$JS.ACK` reply subject of
/// its own. Delivered to `attachments.register`, such a message used to register a file in any
/// owner's workspace; an endpoint now answers only replies addressed to its callers' inboxes.
#[tokio::test]
async fn a_message_jetstream_delivers_to_an_endpoint_is_not_served_as_a_request() {
    use async_nats::jetstream::{consumer, stream};
    let platform = TestPlatform::spawn().await.unwrap();
    let names = &platform.nats.names;
    let client = async_nats::connect(&platform.infra.nats_url).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let pwn = format!("{}.pwn", names.prefix());
    js.create_stream(stream::Config {
        name: format!("{}_PWN", names.prefix().to_uppercase()),
        subjects: vec![format!("{pwn}.>")],
        max_bytes: 1024 * 1024,
        ..Default::default()
    })
    .await
    .unwrap();
    let register = json!({"v": "1", "owner": "victim", "session_id": "s1",
        "file_name": "invoice.txt", "content_type": "text/plain",
        "content_base64": base64::engine::general_purpose::STANDARD.encode("pay me")});
    js.publish(format!("{pwn}.x"), register.to_string().into())
        .await
        .unwrap()
        .await
        .unwrap();
    let stream = js
        .get_stream(format!("{}_PWN", names.prefix().to_uppercase()))
        .await
        .unwrap();
    let mut delivery = stream
        .create_consumer(consumer::push::Config {
            durable_name: Some("pwn".to_owned()),
            deliver_subject: names.attachments_register_subject(),
            deliver_group: Some(protocol::messaging::ATTACHMENTS_QUEUE.to_owned()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(1),
            max_deliver: 3,
            ..Default::default()
        })
        .await
        .unwrap();
    // Delivered to the attachments service twice: the first delivery was long handled (a
    // served request acknowledges it: its reply subject is the ack), and nothing acknowledged it.
    let deadline = tokio::time::Instant::now() + EVENTUAL;
    let info = loop {
        let info = delivery.info().await.unwrap().clone();
        if info.num_redelivered >= 1 || tokio::time::Instant::now() > deadline {
            break info;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(info.num_redelivered >= 1, "delivered again: {info:?}");
    assert_eq!(
        info.ack_floor.stream_sequence, 0,
        "never answered: {info:?}"
    );
    let victim = platform.infra.token("victim");
    let workspace: Value = platform
        .http
        .get(format!("{}/v2/files", platform.urls.attachments))
        .bearer_auth(&victim)
        .query(&[("session_id", "s1")])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(workspace["files"], json!([]), "{workspace}");
}
