//! One thread-day bigger than any answer may be (finding H4 of the security review): every day
//! endpoint answers a page of it (at most `limit` messages and 4 MiB of messages), says so
//! (`hasMore`, a cursor), and following the cursor yields the whole day once, in order, while
//! another owner is answered; and the AG-UI route stores only so much of what a client resends.

use serde_json::{Value, json};
use switchboard_system_tests::{TestPlatform, read_sse, streamed_text};

/// Most bytes of messages in one answer (the server's `DAY_PAGE_BYTES`).
const PAGE_BYTES: usize = 4 * 1024 * 1024;
/// What the envelope around them may add (scope, thread, day, `hasMore`, the cursor).
const ENVELOPE: usize = 1024;
/// Most messages in one answer, and the default.
const PAGE_MESSAGES: usize = 200;
/// The thread-day of the fixture and the day before it.
const BIG_DAY: &str = "2026-03-15";
const DAY_BEFORE: &str = "2026-03-14";
/// Messages of the big day: every 20th is a 400 KB assistant message (10.4 MB in all).
const BIG_DAY_MESSAGES: usize = 520;
const BIG_MESSAGE_BYTES: usize = 400_000;

/// One day endpoint: its path, thread parameter, `hasMore` and cursor fields.
struct Shape {
    path: &'static str,
    thread: &'static str,
    has_more: &'static str,
    cursor: &'static str,
}

const SHAPES: [Shape; 4] = [
    Shape {
        path: "/api/v1/agent/history",
        thread: "threadId",
        has_more: "hasMore",
        cursor: "nextCursor",
    },
    Shape {
        path: "/api/v1/agent/history/blocks",
        thread: "threadId",
        has_more: "hasMore",
        cursor: "nextCursor",
    },
    Shape {
        path: "/api/v1/agent/history/bodies",
        thread: "threadId",
        has_more: "hasMore",
        cursor: "nextCursor",
    },
    Shape {
        path: "/v2/history",
        thread: "session_id",
        has_more: "has_more",
        cursor: "next_cursor",
    },
];

/// `GET` a history path: status, the body's size in bytes, the body.
async fn get(
    platform: &TestPlatform,
    token: &str,
    path: &str,
    query: &[(&str, &str)],
) -> (u16, usize, Value) {
    let response = platform
        .http
        .get(format!("{}{path}", platform.urls.history))
        .bearer_auth(token)
        .query(query)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let bytes = response.bytes().await.unwrap();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, bytes.len(), body)
}

/// The `seq`s of an answer's messages.
fn seqs(body: &Value) -> Vec<i64> {
    body["messages"]
        .as_array()
        .map(|m| m.iter().filter_map(|m| m["seq"].as_i64()).collect())
        .unwrap_or_default()
}

/// Three messages the day before, then [`BIG_DAY_MESSAGES`] on the big day (`seq` 4 on).
async fn grow_one_day(platform: &TestPlatform, owner: &str, thread: &str) {
    let mut rows: Vec<(String, &str, String, String, Value)> = (0..3)
        .map(|i| {
            (
                format!("before-{i}"),
                "user",
                format!("the day before, {i}"),
                format!("{DAY_BEFORE}T09:00:0{i}Z"),
                json!({}),
            )
        })
        .collect();
    for i in 0..BIG_DAY_MESSAGES {
        let at = format!(
            "{BIG_DAY}T{:02}:{:02}:{:02}Z",
            8 + i / 3600,
            (i / 60) % 60,
            i % 60
        );
        let (role, content, metadata) = if i % 20 == 19 {
            let content = format!("{i:07} ").repeat(BIG_MESSAGE_BYTES / 8);
            ("assistant", content, json!({}))
        } else {
            match i % 3 {
                0 => ("user", format!("question {i}"), json!({})),
                1 => ("assistant", format!("answer {i}"), json!({})),
                _ => ("tool", format!("result {i}"), json!({"tool_call_id": "c1"})),
            }
        };
        rows.push((format!("day-{i}"), role, content, at, metadata));
    }
    let borrowed: Vec<(&str, &str, &str, &str, Value)> = rows
        .iter()
        .map(|(id, role, content, at, metadata)| {
            (
                id.as_str(),
                *role,
                content.as_str(),
                at.as_str(),
                metadata.clone(),
            )
        })
        .collect();
    platform
        .insert_history(owner, thread, &borrowed)
        .await
        .unwrap();
}

/// Follows one endpoint's cursor through the big day (pages of at most `limit`, when given),
/// checking every page's bounds; the pages' `seq`s, first answer first.
async fn walk_day(
    platform: &TestPlatform,
    token: &str,
    shape: &Shape,
    thread: &str,
    limit: Option<&str>,
) -> Vec<Vec<i64>> {
    let most = limit.map_or(PAGE_MESSAGES, |l| l.parse().unwrap());
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut query = vec![(shape.thread, thread)];
        if let Some(limit) = limit {
            query.push(("limit", limit));
        }
        if let Some(cursor) = &cursor {
            query.push(("cursor", cursor.as_str()));
        }
        let (status, bytes, body) = get(platform, token, shape.path, &query).await;
        let page = pages.len();
        assert_eq!(status, 200, "{} page {page}: {body}", shape.path);
        assert!(
            bytes <= PAGE_BYTES + ENVELOPE,
            "{} page {page} is {bytes} bytes, more than the {PAGE_BYTES}-byte bound",
            shape.path
        );
        assert_eq!(body["day"], BIG_DAY, "{} page {page}", shape.path);
        let shown = seqs(&body);
        assert!(
            !shown.is_empty() && shown.len() <= most,
            "{} page {page} has {} messages, 1 to {most} expected",
            shape.path,
            shown.len()
        );
        assert!(
            shown.windows(2).all(|w| w[0] < w[1]),
            "{} page {page} is in seq order",
            shape.path
        );
        assert_eq!(
            body[shape.has_more], true,
            "{} page {page}: earlier messages (this day's or the day before's) exist",
            shape.path
        );
        pages.push(shown);
        match body[shape.cursor].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
        assert!(pages.len() < 100, "{} never ends its day", shape.path);
    }
    pages
}

#[tokio::test]
async fn a_thread_day_past_the_bounds_is_answered_in_bounded_pages_that_cover_it_once() {
    let platform = TestPlatform::spawn().await.unwrap();
    let (alice, bob) = (platform.infra.token("alice"), platform.infra.token("bob"));
    let thread = "big-day";
    grow_one_day(&platform, "alice", thread).await;
    platform
        .insert_history(
            "bob",
            "bobs-thread",
            &[(
                "b1",
                "user",
                "bob's question",
                "2026-03-15T12:00:00Z",
                json!({}),
            )],
        )
        .await
        .unwrap();
    let whole_day: Vec<i64> = (4..4 + i64::try_from(BIG_DAY_MESSAGES).unwrap()).collect();

    for shape in &SHAPES {
        let pages = walk_day(&platform, &alice, shape, thread, None).await;
        // The first answer starts at the newest end of the day: a client that ignores the
        // cursor sees the day's latest messages.
        assert_eq!(
            pages[0].last(),
            whole_day.last(),
            "{}: the first page ends with the day's last message",
            shape.path
        );
        assert!(
            pages.len() >= 3,
            "{}: 10.4 MB cannot fit in {} pages of 4 MiB",
            shape.path,
            pages.len()
        );
        let followed: Vec<i64> = pages.iter().rev().flatten().copied().collect();
        assert_eq!(
            followed, whole_day,
            "{}: following the cursor yields every message of the day exactly once, in order",
            shape.path
        );
        // The earlier day is still reached with `before`, and it is the last.
        let (status, _, body) = get(
            &platform,
            &alice,
            shape.path,
            &[(shape.thread, thread), ("before", BIG_DAY)],
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(body["day"], DAY_BEFORE, "{}", shape.path);
        assert_eq!(seqs(&body), [1, 2, 3], "{}", shape.path);
        assert_eq!(body[shape.has_more], false, "{}", shape.path);
        assert!(
            body.get(shape.cursor).is_none(),
            "{}: a whole day has no cursor",
            shape.path
        );

        // A smaller limit: pages of at most that many, the same day once.
        let pages = walk_day(&platform, &alice, shape, thread, Some("50")).await;
        let followed: Vec<i64> = pages.iter().rev().flatten().copied().collect();
        assert_eq!(followed, whole_day, "{} with limit=50", shape.path);

        // Bad parameters are refused, naming the parameter.
        for (name, value) in [
            ("limit", "0"),
            ("limit", "201"),
            ("limit", "ten"),
            ("cursor", "not-a-cursor"),
            ("cursor", ""),
        ] {
            let (status, _, body) = get(
                &platform,
                &alice,
                shape.path,
                &[(shape.thread, thread), (name, value)],
            )
            .await;
            assert_eq!(status, 400, "{} {name}={value}: {body}", shape.path);
            assert_eq!(
                body["error"]["field"], name,
                "{} {name}={value}",
                shape.path
            );
        }
        // A cursor belongs to its thread.
        let (_, _, first) = get(&platform, &alice, shape.path, &[(shape.thread, thread)]).await;
        let cursor = first[shape.cursor].as_str().unwrap().to_owned();
        let (status, _, body) = get(
            &platform,
            &bob,
            shape.path,
            &[(shape.thread, "bobs-thread"), ("cursor", &cursor)],
        )
        .await;
        assert_eq!(status, 400, "{}: {body}", shape.path);
        assert_eq!(body["error"]["field"], "cursor");
        let (status, _, _) = get(&platform, &bob, shape.path, &[("cursor", &cursor)]).await;
        assert_eq!(
            status, 404,
            "{}: another owner's cursor finds nothing",
            shape.path
        );
    }

    // Another owner is answered while the big day is read from every endpoint at once.
    let readers = SHAPES.iter().flat_map(|shape| {
        let (platform, alice) = (&platform, &alice);
        (0..3).map(move |_| async move {
            let (status, bytes, _) =
                get(platform, alice, shape.path, &[(shape.thread, thread)]).await;
            assert_eq!(status, 200);
            assert!(bytes <= PAGE_BYTES + ENVELOPE);
        })
    });
    let other = async {
        let (status, _, body) = get(
            &platform,
            &bob,
            "/api/v1/agent/history",
            &[("threadId", "bobs-thread")],
        )
        .await;
        (status, body)
    };
    let (_, (status, body)) = tokio::join!(futures::future::join_all(readers), other);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["messages"][0]["content"], "bob's question");
    // Answered while alice's day is read (no time bound: a loaded machine is slow, not wrong).
}

/// Posts one AG-UI turn with `messages` and returns the reply it streamed.
async fn agui_turn(platform: &TestPlatform, token: &str, thread: &str, messages: Value) -> String {
    let body = json!({"threadId": thread, "runId": uuid::Uuid::new_v4().to_string(),
                      "state": {}, "messages": messages, "tools": [], "context": [],
                      "forwardedProps": {}});
    let response = platform
        .http
        .post(format!("{}/api/v1/agent/ag-ui", platform.urls.runs))
        .bearer_auth(token)
        .header("accept", "text/event-stream")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let frames = read_sse(response, None).await.unwrap();
    streamed_text(frames.iter().map(|f| &f.data))
}

/// The thread's stored messages once the reply to `now` is written: `(id, role, content)`.
async fn stored(
    platform: &TestPlatform,
    token: &str,
    thread: &str,
) -> Vec<(String, String, String)> {
    let history = platform
        .api()
        .wait_for_history(token, thread, |h| {
            h["messages"]
                .as_array()
                .and_then(|m| m.last())
                .is_some_and(|m| m["content"] == "You said: now")
        })
        .await
        .unwrap();
    history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let text = |k: &str| m[k].as_str().unwrap_or_default().to_owned();
            (text("id"), text("role"), text("content"))
        })
        .collect()
}

#[tokio::test]
async fn the_agui_route_stores_only_a_bounded_part_of_what_a_client_resends() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    const MESSAGE_BYTES: usize = 32 * 1024;
    const RUN_BYTES: usize = 128 * 1024;
    const RUN_MESSAGES: usize = 64;

    // Five 45 KB assistant messages the server never made (225 KB, under the body limit).
    let thread = "resent-large";
    let mut earlier = Vec::new();
    for i in 0..5 {
        earlier.push(json!({"id": format!("q{i}"), "role": "user", "content": format!("q{i}")}));
        earlier.push(json!({"id": format!("a{i}"), "role": "assistant",
                            "content": format!("{i}").repeat(45_000)}));
    }
    let mut messages = earlier.clone();
    messages.push(json!({"id": "now", "role": "user", "content": "now"}));
    let reply = agui_turn(&platform, &alice, thread, Value::Array(messages)).await;
    assert_eq!(reply, "You said: now", "the run itself is not affected");
    let kept = stored(&platform, &alice, thread).await;
    assert!(
        kept.iter().any(|(id, _, _)| id == "now"),
        "the new turn is stored"
    );
    let resent: Vec<_> = kept
        .iter()
        .filter(|(id, _, _)| earlier.iter().any(|e| e["id"] == id.as_str()))
        .collect();
    let sent_ids: Vec<&str> = earlier.iter().map(|e| e["id"].as_str().unwrap()).collect();
    let kept_ids: Vec<&str> = resent.iter().map(|(id, _, _)| id.as_str()).collect();
    assert!(
        !kept_ids.is_empty() && kept_ids.len() < sent_ids.len(),
        "some, not all, of the resent messages are stored: {kept_ids:?}"
    );
    assert!(
        sent_ids.ends_with(&kept_ids),
        "what is stored is the newest part of what was resent, in order: {kept_ids:?}"
    );
    let bytes: usize = resent.iter().map(|(_, _, content)| content.len()).sum();
    assert!(
        bytes <= RUN_BYTES,
        "{bytes} bytes of resent messages stored in one run"
    );
    for (id, role, content) in &resent {
        let sent = earlier.iter().find(|e| e["id"] == id.as_str()).unwrap()["content"]
            .as_str()
            .unwrap();
        if role == "assistant" {
            assert_eq!(
                content.len(),
                MESSAGE_BYTES,
                "{id} is cut to the per-message bound"
            );
            assert!(
                sent.starts_with(content.as_str()),
                "{id} keeps its beginning"
            );
        } else {
            assert_eq!(content, sent, "{id}: a user message is kept whole");
        }
    }

    // Many small resent messages: at most so many per run.
    let thread = "resent-many";
    let earlier: Vec<Value> = (0..150)
        .map(|i| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            json!({"id": format!("m{i:03}"), "role": role, "content": format!("m{i:03}")})
        })
        .collect();
    let mut messages = earlier.clone();
    messages.push(json!({"id": "now", "role": "user", "content": "now"}));
    let reply = agui_turn(&platform, &alice, thread, Value::Array(messages)).await;
    assert_eq!(reply, "You said: now");
    let kept = stored(&platform, &alice, thread).await;
    let kept_ids: Vec<&str> = kept
        .iter()
        .map(|(id, _, _)| id.as_str())
        .filter(|id| id.starts_with('m') && id.len() == 4)
        .collect();
    let sent_ids: Vec<&str> = earlier.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(
        kept_ids.len(),
        RUN_MESSAGES,
        "at most {RUN_MESSAGES} resent messages a run"
    );
    assert!(sent_ids.ends_with(&kept_ids), "the newest ones, in order");
}
