//! A runs replica that loses its NATS connection while a run it streams ends: the events
//! published meanwhile (the run's end among them) never reach it live, and no later live event
//! reveals the gap. When its client connects again it re-reads the run's log at once
//! (`reconnections` in services/runs/src/events.rs), so the open stream ends as the run did,
//! within seconds, not at the next periodic recheck (set to ten minutes here), with every event
//! once, in order.

use std::time::Duration;

use futures::StreamExt as _;
use serde_json::{Value, json};
use switchboard_system_tests::link::CuttableLink;
use switchboard_system_tests::{TestPlatform, text_run};

/// Reads the SSE frames of `body` until `stop` says so, or fails after `within`.
async fn read_until(
    body: &mut (impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    parser: &mut protocol::sse::SseParser,
    frames: &mut Vec<(u64, Value)>,
    within: Duration,
    stop: impl Fn(&[(u64, Value)]) -> bool,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + within;
    while !stop(frames) {
        let chunk = match tokio::time::timeout_at(deadline, body.next()).await {
            Err(_) => return Err(format!("stalled after {} events", frames.len())),
            Ok(None) => return Err(format!("ended after {} events", frames.len())),
            Ok(Some(chunk)) => chunk.map_err(|e| e.to_string())?,
        };
        for frame in parser.push(&chunk).map_err(|e| e.to_string())? {
            if let protocol::sse::SseFrame::Event(event) = frame {
                let id = event
                    .id
                    .as_deref()
                    .and_then(|id| id.parse().ok())
                    .ok_or("an event without a numeric id")?;
                frames.push((
                    id,
                    serde_json::from_str(&event.data).map_err(|e| e.to_string())?,
                ));
            }
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_replica_cut_off_from_nats_while_a_run_ends_ends_its_open_stream_once_reconnected() {
    let platform = TestPlatform::spawn().await.unwrap();
    let upstream = platform
        .nats
        .url
        .trim_start_matches("nats://")
        .parse()
        .unwrap();
    let link = CuttableLink::start(upstream).await.unwrap();
    // A second runs replica, on NATS through the link only; its periodic re-read of a stalled
    // stream is ten minutes away.
    let (replica, _stop) = platform
        .spawn_runs_replica_with(|config| {
            config.nats.url = link.nats_url();
            config.stream_recheck = Duration::from_secs(600);
        })
        .await
        .unwrap();
    let alice = platform.infra.token("alice");
    let http = &platform.http;

    // A run of about two seconds (a word every 200 ms), accepted by the first replica.
    let thread = uuid::Uuid::new_v4().to_string();
    let run_id = "cut-run";
    let accepted = http
        .post(format!("{}/api/v1/agent/runs", platform.urls.runs))
        .bearer_auth(&alice)
        .json(&text_run(
            &thread,
            run_id,
            "/slow one two three four five six seven eight nine ten",
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 202);

    // Followed on the replica behind the link, until the reply has begun.
    let response = http
        .get(format!(
            "{replica}/api/v1/agent/runs/{run_id}/events?compact=false"
        ))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let mut parser = protocol::sse::SseParser::new();
    let mut frames = Vec::new();
    read_until(
        &mut body,
        &mut parser,
        &mut frames,
        Duration::from_secs(30),
        |frames| {
            frames
                .iter()
                .any(|(_, e)| e["type"] == "TEXT_MESSAGE_CONTENT")
        },
    )
    .await
    .unwrap();

    // Cut: the replica's connection drops and it cannot connect again. The run ends meanwhile
    // (its status, asked of the first replica, says so).
    let connections_before = link.connections();
    link.cut();
    platform
        .api()
        .wait_for_status(&alice, run_id, "completed")
        .await
        .unwrap();
    let seen_while_cut = frames.len();

    // Restored: the replica connects again and its open stream ends as the run did.
    link.restore();
    let ended = read_until(
        &mut body,
        &mut parser,
        &mut frames,
        Duration::from_secs(30),
        |frames| {
            frames
                .last()
                .is_some_and(|(_, e)| e["type"] == "RUN_FINISHED")
        },
    )
    .await;
    assert!(
        link.connections() > connections_before,
        "the replica connected again"
    );
    ended.unwrap_or_else(|err| {
        panic!(
            "the open stream did not end within 30 s of the reconnect ({err}; {seen_while_cut} \
             events before the cut)"
        )
    });

    // Every event once, in order, as the run's log has them (read whole from the first replica).
    let ids: Vec<u64> = frames.iter().map(|(id, _)| *id).collect();
    let expected_ids: Vec<u64> = (1..=ids.len() as u64).collect();
    assert_eq!(ids, expected_ids, "ids in order, none lost or repeated");
    let log = switchboard_system_tests::read_sse(
        http.get(format!(
            "{}/api/v1/agent/runs/{run_id}/events?compact=false",
            platform.urls.runs
        ))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap(),
        None,
    )
    .await
    .unwrap();
    let streamed: Vec<&Value> = frames.iter().map(|(_, e)| e).collect();
    let logged: Vec<&Value> = log.iter().map(|f| &f.data).collect();
    assert_eq!(streamed, logged, "the stream is the run's log");
    assert!(
        seen_while_cut < frames.len(),
        "events came after the reconnect: {}",
        json!({"before": seen_while_cut, "all": frames.len()})
    );
    eprintln!(
        "{} events, {seen_while_cut} before the cut, the rest after the reconnect",
        frames.len()
    );
}
