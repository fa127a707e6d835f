//! Day snapshots: the latest day with messages, `before`, time zones, and the seed's shape.

use serde_json::{Value, json};
use switchboard_system_tests::TestPlatform;

/// Writes a thread's messages (no metadata) straight into history's tables.
async fn fixture(
    platform: &TestPlatform,
    owner: &str,
    thread: &str,
    messages: &[(&str, &str, &str, &str)],
) {
    let with_metadata: Vec<_> = messages
        .iter()
        .map(|&(id, role, content, at)| (id, role, content, at, json!({})))
        .collect();
    platform
        .insert_history(owner, thread, &with_metadata)
        .await
        .unwrap();
}

#[tokio::test]
async fn the_seed_example_with_its_ui_schema_comes_back_field_for_field_and_day_by_day() {
    let platform = TestPlatform::spawn().await.unwrap();
    let thread = "550e8400-e29b-41d4-a716-446655440000";
    // The agent's hints as the worker stored them; the seed's uiSchema is what they compile to.
    let hints = json!({"ui_hints": {"title": "日程已创建", "status": "success",
                                     "body": "您的会议日程创建成功", "locale": "zh-CN"}});
    platform
        .insert_history(
            "alice",
            thread,
            &[
                (
                    "msg-000",
                    "user",
                    "昨天的问题",
                    "2026-03-14T09:00:00Z",
                    json!({}),
                ),
                (
                    "msg-001",
                    "user",
                    "帮我创建一个日程",
                    "2026-03-15T10:00:00Z",
                    json!({}),
                ),
                (
                    "msg-002",
                    "assistant",
                    "好的,我来帮您创建日程。",
                    "2026-03-15T10:00:05Z",
                    hints,
                ),
            ],
        )
        .await
        .unwrap();
    let alice = platform.infra.token("alice");
    let (status, body) = platform
        .api()
        .history(&alice, &[("threadId", thread)])
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({
            "scope": "history_day",
            "threadId": thread,
            "day": "2026-03-15",
            "hasMore": true,
            "messages": [
                {"id": "msg-001", "seq": 2, "role": "user", "content": "帮我创建一个日程",
                 "url": null, "timestamp": "2026-03-15T10:00:00Z"},
                {"id": "msg-002", "seq": 3, "role": "assistant", "content": "好的,我来帮您创建日程。",
                 "uiSchema": {
                    "version": "2.0",
                    "locale": "zh-CN",
                    "status": "success",
                    "theme": "default",
                    "root": {
                        "type": "stack",
                        "appearance": "card",
                        "children": [
                            {"type": "text", "content": "日程已创建", "role": "title"},
                            {"type": "badge", "label": "SUCCESS", "status": "success"},
                            {"type": "text", "content": "您的会议日程创建成功", "role": "body"}
                        ]
                    }
                 },
                 "timestamp": "2026-03-15T10:00:05Z"}
            ]
        })
    );
    let (_, earlier) = platform
        .api()
        .history(&alice, &[("threadId", thread), ("before", "2026-03-15")])
        .await
        .unwrap();
    assert_eq!(
        (earlier["day"].as_str(), earlier["hasMore"].as_bool()),
        (Some("2026-03-14"), Some(false))
    );
    let (_, none) = platform
        .api()
        .history(&alice, &[("threadId", thread), ("before", "2026-03-14")])
        .await
        .unwrap();
    assert_eq!(
        (&none["day"], &none["messages"]),
        (&Value::Null, &json!([])),
        "nothing strictly earlier"
    );
}

#[tokio::test]
async fn day_boundaries_follow_the_callers_time_zone() {
    let platform = TestPlatform::spawn().await.unwrap();
    let thread = "tz-thread";
    fixture(
        &platform,
        "alice",
        thread,
        &[
            (
                "late",
                "user",
                "late evening in New York",
                "2026-03-15T23:30:00Z",
            ),
            (
                "early",
                "assistant",
                "just after midnight UTC",
                "2026-03-16T00:30:00Z",
            ),
        ],
    )
    .await;
    let alice = platform.infra.token("alice");
    let day_of = |tz: Option<&'static str>| {
        let api = platform.api();
        let alice = alice.clone();
        async move {
            let mut query = vec![("threadId", thread)];
            if let Some(tz) = tz {
                query.push(("tz", tz));
            }
            let (status, body) = api.history(&alice, &query).await.unwrap();
            assert_eq!(status, 200, "{body}");
            let ids: Vec<String> = body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["id"].as_str().unwrap().to_owned())
                .collect();
            (
                body["day"].as_str().unwrap().to_owned(),
                ids,
                body["hasMore"].as_bool().unwrap(),
            )
        }
    };
    assert_eq!(
        day_of(None).await,
        ("2026-03-16".to_owned(), vec!["early".to_owned()], true)
    );
    assert_eq!(
        day_of(Some("America/New_York")).await,
        (
            "2026-03-15".to_owned(),
            vec!["late".to_owned(), "early".to_owned()],
            false
        )
    );
    assert_eq!(
        day_of(Some("Asia/Tokyo")).await,
        (
            "2026-03-16".to_owned(),
            vec!["late".to_owned(), "early".to_owned()],
            false
        )
    );
    let (status, body) = platform
        .api()
        .history(&alice, &[("threadId", thread), ("tz", "Mars/Olympus")])
        .await
        .unwrap();
    assert_eq!((status, body["error"]["field"].as_str()), (400, Some("tz")));
    let (status, body) = platform
        .api()
        .history(&alice, &[("threadId", thread), ("before", "2026-3-1")])
        .await
        .unwrap();
    assert_eq!(
        (status, body["error"]["field"].as_str()),
        (400, Some("before"))
    );
}
