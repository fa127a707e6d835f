//! A thread's stream (`GET /api/v1/agent/threads/{threadId}/events`): several clients on one
//! conversation see every run live, a client joining mid-run gets the snapshot and the rest of
//! the run exactly once, a cut resumes by `Last-Event-ID` with nothing lost or repeated, and
//! another owner's thread is 404.

use futures::StreamExt as _;
use serde_json::Value;
use switchboard_system_tests::{EVENTUAL, SseFrame, TestPlatform, text_run};

/// A thread stream being read: frames arrive as the server sends them; the stream never ends
/// by itself.
struct ThreadStream {
    body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    parser: protocol::sse::SseParser,
    buffered: std::collections::VecDeque<SseFrame>,
}

impl ThreadStream {
    async fn open(
        platform: &TestPlatform,
        token: &str,
        thread: &str,
        last_event_id: Option<&str>,
    ) -> (u16, Option<Self>, Value) {
        let mut request = platform
            .http
            .get(format!(
                "{}/api/v1/agent/threads/{thread}/events",
                platform.urls.runs
            ))
            .bearer_auth(token);
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        if status != 200 {
            return (status, None, response.json().await.unwrap_or(Value::Null));
        }
        let stream = Self {
            body: response.bytes_stream().boxed(),
            parser: protocol::sse::SseParser::new(),
            buffered: std::collections::VecDeque::new(),
        };
        (status, Some(stream), Value::Null)
    }

    /// The next frame (heartbeats skipped); fails after [`EVENTUAL`].
    async fn next(&mut self) -> SseFrame {
        let deadline = tokio::time::Instant::now() + EVENTUAL;
        loop {
            if let Some(frame) = self.buffered.pop_front() {
                return frame;
            }
            let chunk = tokio::time::timeout_at(deadline, self.body.next())
                .await
                .expect("a thread stream frame within EVENTUAL")
                .expect("the thread stream stays open")
                .unwrap();
            for frame in self.parser.push(&chunk).unwrap() {
                if let protocol::sse::SseFrame::Event(event) = frame {
                    self.buffered.push_back(SseFrame {
                        id: event.id,
                        data: serde_json::from_str(&event.data).unwrap(),
                    });
                }
            }
        }
    }

    /// Frames up to and including the first that `last` accepts.
    async fn until(&mut self, last: impl Fn(&SseFrame) -> bool) -> Vec<SseFrame> {
        let mut frames = Vec::new();
        loop {
            let frame = self.next().await;
            let done = last(&frame);
            frames.push(frame);
            if done {
                return frames;
            }
        }
    }
}

fn terminal(frame: &SseFrame) -> bool {
    matches!(
        frame.data["type"].as_str(),
        Some("RUN_FINISHED" | "RUN_ERROR")
    )
}

fn of_type<'a>(frames: &'a [SseFrame], kind: &str) -> Vec<&'a SseFrame> {
    frames.iter().filter(|f| f.data["type"] == kind).collect()
}

/// `(taskId, seq)` of a run event's id.
fn position(frame: &SseFrame) -> (String, u64) {
    let id = frame.id.as_deref().expect("every frame has an id");
    let (task, seq) = id
        .split_once(':')
        .expect("a run event id is <taskId>:<seq>");
    (task.to_owned(), seq.parse().unwrap())
}

/// The frames of one run: ids of one task, numbered 1, 2, 3... without gap or repeat, from
/// `RUN_STARTED` to one terminal event.
fn assert_one_whole_run(frames: &[SseFrame]) {
    let task = position(&frames[0]).0;
    for (index, frame) in frames.iter().enumerate() {
        assert_eq!(
            position(frame),
            (task.clone(), index as u64 + 1),
            "{frames:#?}"
        );
    }
    assert_eq!(frames[0].data["type"], "RUN_STARTED");
    assert!(terminal(frames.last().unwrap()));
    assert_eq!(frames.iter().filter(|f| terminal(f)).count(), 1);
}

fn text(frames: &[SseFrame]) -> String {
    switchboard_system_tests::streamed_text(frames.iter().map(|f| &f.data))
}

#[tokio::test]
async fn clients_on_one_thread_see_every_run_live_and_a_joiner_gets_the_snapshot_then_the_rest_once()
 {
    let platform = TestPlatform::spawn().await.unwrap();
    let api = platform.api();
    let alice = platform.infra.token("alice");
    let thread = uuid::Uuid::new_v4().to_string();

    // An earlier run, ended: what a snapshot holds.
    let (status, _) = api
        .post_run(&alice, &text_run(&thread, "first", "hello from the phone"))
        .await
        .unwrap();
    assert_eq!(status, 202);
    api.wait_for_status(&alice, "first", "completed")
        .await
        .unwrap();

    // The laptop opens the thread: a snapshot of it, nothing running.
    let (status, laptop, _) = ThreadStream::open(&platform, &alice, &thread, None).await;
    assert_eq!(status, 200);
    let mut laptop = laptop.unwrap();
    let snapshot = laptop.next().await;
    assert_eq!(snapshot.id.as_deref(), Some("0"));
    assert_eq!(snapshot.data["type"], "MESSAGES_SNAPSHOT");
    let messages = snapshot.data["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[0]["id"], "first-user");
    assert_eq!(messages[0]["content"], "hello from the phone");
    assert_eq!(messages[1]["role"], "assistant");
    assert_eq!(messages[1]["content"], "You said: hello from the phone");

    // The phone starts a run: the laptop sees it live, the question first.
    let (status, _) = api
        .post_run(
            &alice,
            &text_run(&thread, "second", "and a second question"),
        )
        .await
        .unwrap();
    assert_eq!(status, 202);
    let second = laptop.until(terminal).await;
    assert_one_whole_run(&second);
    let input = &second[0].data["input"];
    assert_eq!(input["runId"], "second");
    assert_eq!(input["messages"][0]["id"], "second-user");
    assert_eq!(input["messages"][0]["content"], "and a second question");
    assert_eq!(text(&second), "You said: and a second question");
    assert_eq!(second.last().unwrap().data["type"], "RUN_FINISHED");

    // A slow run; a tablet joins once its reply has begun.
    let words = "one two three four five six seven eight";
    let (status, _) = api
        .post_run(
            &alice,
            &text_run(&thread, "third", &format!("/slow {words}")),
        )
        .await
        .unwrap();
    assert_eq!(status, 202);
    let begun = laptop
        .until(|f| f.data["type"] == "TEXT_MESSAGE_CONTENT")
        .await;
    let (status, tablet, _) = ThreadStream::open(&platform, &alice, &thread, None).await;
    assert_eq!(status, 200);
    let mut tablet = tablet.unwrap();
    let snapshot = tablet.next().await;
    assert_eq!(snapshot.data["type"], "MESSAGES_SNAPSHOT");
    let (third_task, _) = position(&begun[0]);
    assert_eq!(
        snapshot.id.as_deref(),
        Some(format!("{third_task}:0").as_str()),
        "the snapshot is taken before the open run"
    );
    let ids: Vec<&Value> = snapshot.data["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["id"])
        .collect();
    assert_eq!(ids.len(), 4, "two runs, before the open one: {ids:?}");
    assert_eq!(ids[0], "first-user");
    assert_eq!(ids[2], "second-user");
    let tablet_third = tablet.until(terminal).await;
    assert_one_whole_run(&tablet_third);
    let mut laptop_third = begun;
    laptop_third.extend(laptop.until(terminal).await);
    assert_eq!(
        tablet_third, laptop_third,
        "the joiner got the whole run once"
    );

    // A phone cut off mid-run resumes with Last-Event-ID: the rest, nothing twice.
    let (status, _) = api
        .post_run(
            &alice,
            &text_run(&thread, "fourth", &format!("/slow {words}")),
        )
        .await
        .unwrap();
    assert_eq!(status, 202);
    let (_, phone, _) = ThreadStream::open(&platform, &alice, &thread, None).await;
    let mut phone = phone.unwrap();
    assert_eq!(phone.next().await.data["type"], "MESSAGES_SNAPSHOT");
    let mut seen = phone
        .until(|f| f.data["type"] == "TEXT_MESSAGE_CONTENT")
        .await;
    drop(phone);
    let cursor = seen.last().unwrap().id.clone().unwrap();
    let (status, resumed, _) = ThreadStream::open(&platform, &alice, &thread, Some(&cursor)).await;
    assert_eq!(status, 200);
    seen.extend(resumed.unwrap().until(terminal).await);
    assert_one_whole_run(&seen);
    let laptop_fourth = laptop.until(terminal).await;
    assert_eq!(
        seen, laptop_fourth,
        "resumed: nothing lost, nothing repeated"
    );
    assert_eq!(text(&seen), format!("You said: /slow {words}"));

    // The cursor of a run seen to its end, once the thread is idle: a fresh snapshot.
    let end = seen.last().unwrap().id.clone().unwrap();
    let (status, again, _) = ThreadStream::open(&platform, &alice, &thread, Some(&end)).await;
    assert_eq!(status, 200);
    let snapshot = again.unwrap().next().await;
    assert_eq!(snapshot.data["type"], "MESSAGES_SNAPSHOT");
    assert_eq!(snapshot.data["messages"].as_array().unwrap().len(), 8);
    assert!(of_type(&laptop_fourth, "MESSAGES_SNAPSHOT").is_empty());
}

#[tokio::test]
async fn another_owners_thread_and_a_cursor_that_is_not_this_threads_are_refused() {
    let platform = TestPlatform::spawn().await.unwrap();
    let api = platform.api();
    let (alice, bob) = (platform.infra.token("alice"), platform.infra.token("bob"));
    let thread = uuid::Uuid::new_v4().to_string();
    let (status, _) = api
        .post_run(&alice, &text_run(&thread, "r1", "mine"))
        .await
        .unwrap();
    assert_eq!(status, 202);
    api.wait_for_status(&alice, "r1", "completed")
        .await
        .unwrap();

    let (status, _, body) = ThreadStream::open(&platform, &bob, &thread, None).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "not_found");

    // A cursor of alice's run on bob's thread of the same id: not his.
    let (_, stream, _) = ThreadStream::open(&platform, &alice, &thread, None).await;
    let snapshot = stream.unwrap().next().await;
    assert_eq!(snapshot.data["messages"].as_array().unwrap().len(), 2);
    let (status, _) = api
        .post_run(&bob, &text_run(&thread, "b1", "his"))
        .await
        .unwrap();
    assert_eq!(status, 202);
    api.wait_for_status(&bob, "b1", "completed").await.unwrap();
    let (_, stream, _) = ThreadStream::open(&platform, &alice, &thread, Some("0")).await;
    let alice_frames = stream.unwrap().next().await;
    assert_eq!(alice_frames.data["messages"][0]["content"], "mine");
    let (_, alice_run) = api.get_runs(&alice, "/api/v1/agent/runs/r1").await.unwrap();
    let alice_task = alice_run["taskId"].as_str().unwrap();
    let (status, _, body) =
        ThreadStream::open(&platform, &bob, &thread, Some(&format!("{alice_task}:1"))).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["field"], "Last-Event-ID");

    for bad in ["12", "not-a-cursor", "x:1"] {
        let (status, _, body) = ThreadStream::open(&platform, &alice, &thread, Some(bad)).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    let (status, _, _) = ThreadStream::open(&platform, &alice, &"t".repeat(129), None).await;
    assert_eq!(status, 400);
    let response = platform
        .http
        .get(format!(
            "{}/api/v1/agent/threads/{thread}/events",
            platform.urls.runs
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 401);
}

#[tokio::test]
async fn a_client_joining_while_a_prompt_waits_gets_the_question_and_then_the_answered_run() {
    let platform = TestPlatform::spawn().await.unwrap();
    let api = platform.api();
    let alice = platform.infra.token("alice");
    let thread = uuid::Uuid::new_v4().to_string();
    let (status, _) = api
        .post_run(&alice, &text_run(&thread, "asks", "/ask text:120 Why so?"))
        .await
        .unwrap();
    assert_eq!(status, 202);
    api.wait_for_status(&alice, "asks", "completed")
        .await
        .unwrap();

    // A second device opens the thread: the conversation so far, then the question.
    let (status, stream, _) = ThreadStream::open(&platform, &alice, &thread, None).await;
    assert_eq!(status, 200);
    let mut stream = stream.unwrap();
    let snapshot = stream.next().await;
    assert_eq!(snapshot.data["type"], "MESSAGES_SNAPSHOT");
    assert_eq!(snapshot.data["messages"][0]["id"], "asks-user");
    let question = stream.next().await;
    assert_eq!(question.data["type"], "RUN_FINISHED");
    assert_eq!(question.data["outcome"]["type"], "interrupt");
    let interrupt = &question.data["outcome"]["interrupts"][0];
    assert_eq!(interrupt["message"], "Why so?");
    let prompt_id = interrupt["id"].as_str().unwrap().to_owned();

    // Reloaded with the question's id: nothing again, the prompt still waits.
    let cursor = question.id.clone().unwrap();
    let (status, reloaded, _) = ThreadStream::open(&platform, &alice, &thread, Some(&cursor)).await;
    assert_eq!(status, 200);
    let mut reloaded = reloaded.unwrap();

    // Answered (AG-UI resume on this thread): both see the continuing run live.
    let mut answer = text_run(&thread, "answers", "");
    answer["messages"] = text_run(&thread, "asks", "/ask text:120 Why so?")["messages"].clone();
    answer["resume"] =
        serde_json::json!([{"interruptId": prompt_id, "status": "resolved", "payload": "because"}]);
    let response = platform
        .http
        .post(format!("{}/api/v1/agent/ag-ui", platform.urls.runs))
        .bearer_auth(&alice)
        .json(&answer)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let continued = stream.until(terminal).await;
    assert_one_whole_run(&continued);
    assert_eq!(text(&continued), "You answered: because");
    let after_reload = reloaded.until(terminal).await;
    assert_eq!(
        after_reload, continued,
        "the reloaded client: the continuation, nothing else"
    );
}

#[tokio::test]
async fn the_snapshot_gives_each_file_of_the_thread_as_a_fresh_link_that_serves_it() {
    use base64::Engine as _;
    let platform = TestPlatform::spawn().await.unwrap();
    let api = platform.api();
    let alice = platform.infra.token("alice");
    let thread = uuid::Uuid::new_v4().to_string();
    let png = base64::engine::general_purpose::STANDARD
        .decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==")
        .unwrap();
    let content_url = switchboard_system_tests::upload_file(
        &platform,
        &alice,
        "",
        png.clone(),
        "dot.png",
        "image/png",
    )
    .await;
    let mut run = text_run(&thread, "with-file", "look at this");
    run["messages"][0]["content"] = serde_json::json!([
        {"type": "text", "text": "look at this"},
        {"type": "image", "source": {"type": "url", "value": content_url}}
    ]);
    let (status, body) = api.post_run(&alice, &run).await.unwrap();
    assert_eq!(status, 202, "{body}");
    api.wait_for_status(&alice, "with-file", "completed")
        .await
        .unwrap();

    let (_, stream, _) = ThreadStream::open(&platform, &alice, &thread, None).await;
    let snapshot = stream.unwrap().next().await;
    let part = &snapshot.data["messages"][0]["content"][1];
    assert_eq!(part["type"], "image", "{snapshot:?}");
    let link = part["source"]["value"].as_str().unwrap();
    assert!(
        link.starts_with("http"),
        "a link a client can fetch: {link}"
    );
    let fetched = platform.http.get(link).send().await.unwrap();
    assert_eq!(fetched.status().as_u16(), 200);
    assert_eq!(fetched.bytes().await.unwrap().as_ref(), png.as_slice());
}
