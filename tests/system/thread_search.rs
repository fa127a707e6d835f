//! Conversations people can manage (issue 28): search over the owner's threads
//! (`GET /api/v1/agent/threads?q=`), titles from the first user message, and renames through
//! the runs service (`PATCH /api/v1/agent/threads/{threadId}`).

use serde_json::{Value, json};
use switchboard_system_tests::{TestPlatform, text_run};

async fn threads(platform: &TestPlatform, token: &str, query: &[(&str, &str)]) -> (u16, Value) {
    platform
        .api()
        .get_history(token, "/api/v1/agent/threads", query)
        .await
        .unwrap()
}

async fn search(platform: &TestPlatform, token: &str, q: &str) -> Vec<Value> {
    let (status, body) = threads(platform, token, &[("q", q)]).await;
    assert_eq!(status, 200, "search {q}: {body}");
    body["threads"].as_array().cloned().unwrap_or_default()
}

fn ids(found: &[Value]) -> Vec<&str> {
    found
        .iter()
        .map(|t| t["threadId"].as_str().unwrap_or_default())
        .collect()
}

async fn rename(
    platform: &TestPlatform,
    token: Option<&str>,
    thread: &str,
    body: &Value,
) -> (u16, Value) {
    let mut request = platform
        .http
        .patch(format!(
            "{}/api/v1/agent/threads/{thread}",
            platform.urls.runs
        ))
        .json(body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    (
        response.status().as_u16(),
        response.json().await.unwrap_or(Value::Null),
    )
}

fn field(body: &Value) -> Option<&str> {
    body["error"]["field"].as_str()
}

#[tokio::test]
async fn search_finds_threads_by_english_chinese_and_vietnamese_phrases_of_the_seeds_only_for_their_owner()
 {
    let platform = TestPlatform::spawn().await.unwrap();
    let (alice, bob) = (platform.infra.token("alice"), platform.infra.token("bob"));
    let thread = || uuid::Uuid::new_v4().to_string();
    let (english, chinese, vietnamese, other) = (thread(), thread(), thread(), thread());
    let none = json!({});
    // The seeds' own example messages (websocket-message-schema.md,
    // agent-run-input-protocol.md, file-attachments.md), on chosen days.
    platform
        .insert_history(
            "alice",
            &english,
            &[
                (
                    "en-1",
                    "user",
                    "Hello, how are you?",
                    "2026-03-14T09:00:00Z",
                    none.clone(),
                ),
                (
                    "en-2",
                    "assistant",
                    "im good",
                    "2026-03-14T09:00:05Z",
                    none.clone(),
                ),
            ],
        )
        .await
        .unwrap();
    platform
        .insert_history(
            "alice",
            &chinese,
            &[
                (
                    "zh-1",
                    "user",
                    "帮我查一下北京今天的天气",
                    "2026-03-15T10:00:00Z",
                    none.clone(),
                ),
                (
                    "zh-2",
                    "assistant",
                    "北京今天晴,25°C",
                    "2026-03-15T10:00:03Z",
                    none.clone(),
                ),
            ],
        )
        .await
        .unwrap();
    platform
        .insert_history(
            "alice",
            &vietnamese,
            &[
                (
                    "vi-1",
                    "user",
                    "Phân tích file này cho tôi",
                    "2026-03-16T23:30:00Z",
                    none.clone(),
                ),
                (
                    "vi-2",
                    "assistant",
                    "Đây là kết quả phân tích...",
                    "2026-03-17T00:00:10Z",
                    none.clone(),
                ),
            ],
        )
        .await
        .unwrap();
    platform
        .insert_history(
            "alice",
            &other,
            &[(
                "o-1",
                "user",
                "how do I <search> & find?",
                "2026-03-18T08:00:00Z",
                none.clone(),
            )],
        )
        .await
        .unwrap();
    // Bob says all of it too, in one thread.
    let bobs = thread();
    platform
        .insert_history(
            "bob",
            &bobs,
            &[(
                "b-1",
                "user",
                "Hello, how are you? 帮我查一下北京今天的天气 Phân tích file này cho tôi",
                "2026-03-14T09:00:00Z",
                none.clone(),
            )],
        )
        .await
        .unwrap();

    let found = search(&platform, &alice, "how are you").await;
    assert_eq!(ids(&found), [english.as_str()], "{found:?}");
    assert_eq!(found[0]["messageId"], "en-1");
    assert_eq!(found[0]["day"], "2026-03-14");
    assert_eq!(found[0]["snippet"], "Hello, <mark>how are you</mark>?");
    assert!(found[0]["updatedAt"].is_string());
    assert!(
        found[0].get("title").is_some(),
        "every result has a title field"
    );

    let found = search(&platform, &alice, "北京今天的天气").await;
    assert_eq!(ids(&found), [chinese.as_str()], "{found:?}");
    assert_eq!(found[0]["messageId"], "zh-1");
    assert_eq!(found[0]["day"], "2026-03-15");
    assert_eq!(found[0]["snippet"], "帮我查一下<mark>北京今天的天气</mark>");
    // Two characters, inside a "word" of a language without spaces: found all the same.
    let found = search(&platform, &alice, "天气").await;
    assert_eq!(ids(&found), [chinese.as_str()], "{found:?}");

    let found = search(&platform, &alice, "Phân tích file").await;
    assert_eq!(ids(&found), [vietnamese.as_str()], "{found:?}");
    assert_eq!(found[0]["messageId"], "vi-1");
    assert_eq!(found[0]["day"], "2026-03-16", "the UTC day of the message");
    assert_eq!(
        found[0]["snippet"],
        "<mark>Phân tích file</mark> này cho tôi"
    );
    // Words in another order are found by full text, case ignored.
    let found = search(&platform, &alice, "TÔI cho").await;
    assert_eq!(ids(&found), [vietnamese.as_str()], "{found:?}");

    // Markup in a message comes back escaped, the match marked.
    let found = search(&platform, &alice, "search").await;
    assert_eq!(ids(&found), [other.as_str()]);
    assert_eq!(
        found[0]["snippet"],
        "how do I &lt;<mark>search</mark>&gt; &amp; find?"
    );

    // Never another owner's: bob's thread holds every phrase, alice's results never show it.
    for q in ["how are you", "北京今天的天气", "Phân tích file", "天气"] {
        let found = search(&platform, &alice, q).await;
        assert!(!ids(&found).contains(&bobs.as_str()), "{q}: {found:?}");
        let found = search(&platform, &bob, q).await;
        assert_eq!(ids(&found), [bobs.as_str()], "{q}: bob finds his own only");
    }
    assert_eq!(
        search(&platform, &bob, "im good").await,
        Vec::<Value>::new()
    );

    // Page by page: "how" is in two of alice's threads.
    let (status, first) = threads(&platform, &alice, &[("q", "how"), ("limit", "1")]).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["threads"].as_array().map(Vec::len), Some(1));
    let cursor = first["nextCursor"].as_str().unwrap().to_owned();
    let (status, second) = threads(
        &platform,
        &alice,
        &[("q", "how"), ("limit", "1"), ("cursor", &cursor)],
    )
    .await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["nextCursor"], Value::Null, "the last page says so");
    let mut both = ids(first["threads"].as_array().unwrap());
    both.extend(ids(second["threads"].as_array().unwrap()));
    both.sort_unstable();
    let mut want = [english.as_str(), other.as_str()];
    want.sort_unstable();
    assert_eq!(both, want);
    // A cursor is good for its own query only.
    let (status, body) = threads(&platform, &alice, &[("q", "you"), ("cursor", &cursor)]).await;
    assert_eq!((status, field(&body)), (400, Some("cursor")), "{body}");
}

#[tokio::test]
async fn a_thread_is_titled_by_its_first_user_message_and_renamed_by_its_owner_only() {
    let platform = TestPlatform::spawn().await.unwrap();
    let api = platform.api();
    let (alice, bob) = (platform.infra.token("alice"), platform.infra.token("bob"));
    let thread = uuid::Uuid::new_v4().to_string();
    for (run, text, count) in [
        ("r1", "帮我查一下北京今天的天气", 2),
        ("r2", "北京天气怎么样?", 4),
    ] {
        let (status, body) = api
            .post_run(&alice, &text_run(&thread, run, text))
            .await
            .unwrap();
        assert_eq!(status, 202, "{body}");
        api.wait_for_history(&alice, &thread, |h| {
            h["messages"].as_array().is_some_and(|m| m.len() == count)
        })
        .await
        .unwrap();
    }
    let (status, list) = threads(&platform, &alice, &[]).await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["threads"][0]["threadId"], thread.as_str());
    assert_eq!(
        list["threads"][0]["title"], "帮我查一下北京今天的天气",
        "the first user message titles the thread, later ones do not"
    );

    let (status, renamed) = rename(
        &platform,
        Some(&alice),
        &thread,
        &json!({"title": "  Beijing weather "}),
    )
    .await;
    assert_eq!(status, 200, "{renamed}");
    let (_, list) = threads(&platform, &alice, &[]).await;
    assert_eq!(
        renamed, list["threads"][0],
        "the rename answers the thread as listed"
    );
    assert_eq!(renamed["title"], "Beijing weather");
    assert_eq!(renamed["messageCount"], 4);
    let found = search(&platform, &alice, "北京天气怎么样").await;
    assert_eq!(ids(&found), [thread.as_str()]);
    assert_eq!(
        found[0]["title"], "Beijing weather",
        "search shows the new title"
    );

    // Another owner's thread is not found, exactly like a missing one.
    let (status, body) = rename(&platform, Some(&bob), &thread, &json!({"title": "mine"})).await;
    assert_eq!(status, 404, "{body}");
    let missing = uuid::Uuid::new_v4().to_string();
    let (status, _) = rename(&platform, Some(&alice), &missing, &json!({"title": "x"})).await;
    assert_eq!(status, 404);
    let (_, list) = threads(&platform, &alice, &[]).await;
    assert_eq!(
        list["threads"][0]["title"], "Beijing weather",
        "bob renamed nothing"
    );

    // Bad titles name the field.
    for bad in [
        json!({"title": "   "}),
        json!({"title": "x".repeat(201)}),
        json!({"title": "two\nlines"}),
        json!({"title": 42}),
        json!({}),
    ] {
        let (status, body) = rename(&platform, Some(&alice), &thread, &bad).await;
        assert_eq!(
            (status, field(&body)),
            (400, Some("/title")),
            "{bad}: {body}"
        );
    }
    let longest = "天".repeat(200);
    let (status, body) = rename(&platform, Some(&alice), &thread, &json!({"title": longest})).await;
    assert_eq!(
        (status, body["title"].as_str()),
        (200, Some(longest.as_str()))
    );
    let (status, _) = rename(&platform, None, &thread, &json!({"title": "x"})).await;
    assert_eq!(status, 401, "no token");
    let response = platform
        .http
        .patch(format!(
            "{}/api/v1/agent/threads/{thread}",
            platform.urls.runs
        ))
        .bearer_auth(&alice)
        .body(r#"{"title": "x"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status().as_u16(),
        415,
        "a body that is not said to be JSON"
    );
}

#[tokio::test]
async fn a_bad_search_names_its_parameter() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    let long = "a".repeat(257);
    for (query, name) in [
        (vec![("q", "")], "q"),
        (vec![("q", "   ")], "q"),
        (vec![("q", long.as_str())], "q"),
        (vec![("q", "?!… ,。")], "q"),
        (vec![("q", "hello"), ("limit", "0")], "limit"),
        (vec![("q", "hello"), ("limit", "51")], "limit"),
        (vec![("q", "hello"), ("limit", "ten")], "limit"),
        (vec![("q", "hello"), ("cursor", "zz")], "cursor"),
    ] {
        let (status, body) = threads(&platform, &alice, &query).await;
        assert_eq!(
            (status, field(&body)),
            (400, Some(name)),
            "{query:?}: {body}"
        );
        assert_eq!(body["error"]["code"], "invalid_request", "{body}");
    }
    let longest = "a".repeat(256);
    let (status, body) = threads(&platform, &alice, &[("q", &longest), ("limit", "50")]).await;
    assert_eq!(
        (status, body["threads"].clone()),
        (200, json!([])),
        "{body}"
    );
    let response = platform
        .http
        .get(format!("{}/api/v1/agent/threads", platform.urls.history))
        .query(&[("q", "hello")])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 401, "no token");
}
