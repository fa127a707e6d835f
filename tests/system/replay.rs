//! Compact replay (issue 29): a run's events read back from the log come compacted (the deltas
//! of one message joined into one event, numbered with the last one's id), so a client replaying
//! a long reply gets the same text in a few events, and a resume from any id, even one inside a
//! compacted event's span, continues exactly. `?compact=false` reads every event as stored.

use serde_json::Value;
use switchboard_system_tests::{SseFrame, TestPlatform, read_sse, text_run};

const WORDS: usize = 2_000;

async fn replay(
    platform: &TestPlatform,
    token: &str,
    query: &str,
    after: Option<u64>,
) -> Vec<SseFrame> {
    let mut request = platform
        .http
        .get(format!(
            "{}/api/v1/agent/runs/long/events{query}",
            platform.urls.runs
        ))
        .bearer_auth(token);
    if let Some(after) = after {
        request = request.header("Last-Event-ID", after.to_string());
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    read_sse(response, None).await.unwrap()
}

fn text(frames: &[SseFrame]) -> String {
    frames
        .iter()
        .filter(|f| f.data["type"] == "TEXT_MESSAGE_CONTENT")
        .filter_map(|f| f.data["delta"].as_str())
        .collect()
}

fn ids(frames: &[SseFrame]) -> Vec<u64> {
    frames
        .iter()
        .map(|f| f.id.as_deref().unwrap().parse().unwrap())
        .collect()
}

fn bytes(frames: &[SseFrame]) -> usize {
    frames.iter().map(|f| f.data.to_string().len()).sum()
}

#[tokio::test]
async fn a_replayed_reply_comes_compacted_with_the_same_text_and_resumes_exactly() {
    let platform = TestPlatform::spawn().await.unwrap();
    let api = platform.api();
    let alice = platform.infra.token("alice");
    let thread = uuid::Uuid::new_v4().to_string();
    // One event per word (the echo agent streams word by word), within the 10,000 characters a
    // user message may have.
    let words: Vec<String> = (0..WORDS).map(|i| (i % 1000).to_string()).collect();
    let live: Vec<Value> = api
        .stream_run(&alice, &text_run(&thread, "long", &words.join(" ")))
        .await
        .unwrap();
    assert_eq!(live.last().unwrap()["type"], "RUN_FINISHED");
    let said: String = live
        .iter()
        .filter(|e| e["type"] == "TEXT_MESSAGE_CONTENT")
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert!(said.ends_with(" 998 999"), "{said}");

    // Every event as stored, then compacted: the same text, the same last id, far fewer events
    // and bytes.
    let raw = replay(&platform, &alice, "?compact=false", None).await;
    let compact = replay(&platform, &alice, "", None).await;
    assert!(raw.len() > WORDS, "{} raw events", raw.len());
    assert_eq!(text(&raw), said);
    assert_eq!(text(&compact), said);
    assert_eq!(ids(&compact).last(), ids(&raw).last());
    assert!(
        ids(&compact).windows(2).all(|w| w[0] < w[1]),
        "ids still increase: {:?}",
        ids(&compact)
    );
    let types = |frames: &[SseFrame]| -> Vec<String> {
        let mut kinds: Vec<String> = frames
            .iter()
            .map(|f| f.data["type"].as_str().unwrap().to_owned())
            .collect();
        kinds.dedup();
        kinds
    };
    assert_eq!(
        types(&compact),
        types(&raw),
        "the same kinds, in the same order"
    );
    assert!(compact.len() < 10, "{} compacted events", compact.len());
    assert!(
        bytes(&compact) * 10 < bytes(&raw),
        "{} bytes compacted, {} raw",
        bytes(&compact),
        bytes(&raw)
    );

    // A resume from inside the reply (an id the compacted stream never sent) continues exactly.
    let middle = ids(&raw)[raw.len() / 2];
    let before: Vec<SseFrame> = raw
        .iter()
        .filter(|f| f.id.as_deref().unwrap().parse::<u64>().unwrap() <= middle)
        .cloned()
        .collect();
    let resumed = replay(&platform, &alice, "", Some(middle)).await;
    assert!(resumed.len() < 10, "{} events resumed", resumed.len());
    assert_eq!(format!("{}{}", text(&before), text(&resumed)), said);
    assert!(ids(&resumed)[0] > middle, "{:?}", ids(&resumed));

    let response = platform
        .http
        .get(format!(
            "{}/api/v1/agent/runs/long/events?compact=maybe",
            platform.urls.runs
        ))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["field"], "compact");
}
