//! The caller's threads, most recent first, cursor-paginated.

use serde_json::{Value, json};
use switchboard_system_tests::{TestPlatform, text_run};

async fn threads(platform: &TestPlatform, token: &str, query: &[(&str, &str)]) -> (u16, Value) {
    let response = platform
        .http
        .get(format!("{}/api/v1/agent/threads", platform.urls.history))
        .bearer_auth(token)
        .query(query)
        .send()
        .await
        .unwrap();
    (
        response.status().as_u16(),
        response.json().await.unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn threads_are_listed_most_recent_first_page_by_page_and_only_to_their_owner() {
    let platform = TestPlatform::spawn().await.unwrap();
    let api = platform.api();
    let alice = platform.infra.token("alice");
    let mut ids = Vec::new();
    for i in 0..3 {
        let thread = uuid::Uuid::new_v4().to_string();
        api.post_run(&alice, &text_run(&thread, &format!("r{i}"), "hi"))
            .await
            .unwrap();
        api.wait_for_history(&alice, &thread, |h| {
            h["messages"].as_array().is_some_and(|m| m.len() == 2)
        })
        .await
        .unwrap();
        ids.push(thread);
    }
    let (status, first) = threads(&platform, &alice, &[("limit", "2")]).await;
    assert_eq!(status, 200, "{first}");
    let listed = |page: &Value| -> Vec<String> {
        page["threads"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["threadId"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        listed(&first),
        [ids[2].clone(), ids[1].clone()],
        "most recent first"
    );
    assert_eq!(first["threads"][0]["messageCount"], 2);
    let cursor = first["nextCursor"].as_str().unwrap().to_owned();
    let (_, second) = threads(&platform, &alice, &[("limit", "2"), ("cursor", &cursor)]).await;
    assert_eq!(listed(&second), [ids[0].clone()]);
    assert_eq!(second["nextCursor"], Value::Null, "the last page says so");

    let bob = platform.infra.token("bob");
    assert_eq!(
        threads(&platform, &bob, &[]).await.1,
        json!({"threads": [], "nextCursor": null})
    );
    let (status, body) = threads(&platform, &alice, &[("cursor", "zz")]).await;
    assert_eq!(
        (status, body["error"]["field"].as_str()),
        (400, Some("cursor"))
    );
    let (status, body) = threads(&platform, &alice, &[("limit", "0")]).await;
    assert_eq!(
        (status, body["error"]["field"].as_str()),
        (400, Some("limit"))
    );
}
