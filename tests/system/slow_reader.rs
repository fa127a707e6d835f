//! A client that stops reading its event stream while the run goes on: its reader falls behind
//! its run's live channel (`switchboard_stream_readers_detached_total`), and once the client
//! reads again it gets the rest from the run's log, to the run's end, at once: not at the next
//! periodic recheck (ten minutes here), which is all that used to rescue it.

use std::time::Duration;

use serde_json::Value;
use switchboard_system_tests::{TestPlatform, read_sse, streamed_text, text_run};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The body of a chunked HTTP/1.1 response, de-chunked; `None` until the last chunk arrived.
fn dechunk(raw: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    let mut rest = raw;
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
        let size =
            usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).ok()?.trim(), 16).ok()?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        if rest.len() < size + 2 {
            return None;
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

#[tokio::test]
async fn a_client_that_stops_reading_gets_the_rest_from_the_log_once_it_reads_again() {
    let platform = TestPlatform::spawn().await.unwrap();
    // The replica the slow client reads from; its periodic re-read is ten minutes away.
    let (replica, _stop) = platform
        .spawn_runs_replica_with(|config| config.stream_recheck = Duration::from_secs(600))
        .await
        .unwrap();
    let alice = platform.infra.token("alice");
    let http = &platform.http;
    // The process's metrics recorder is installed on first use: use it before counting.
    let scrape = http.get(format!("{replica}/metrics")).send().await.unwrap();
    assert_eq!(scrape.status(), 200);

    // A reply of ~2,000 events (the echo of as many words), ~250 KiB as SSE: more than the
    // replica's send buffer and the reader's queue of 64 events hold.
    let thread = uuid::Uuid::new_v4().to_string();
    let run_id = "slow-reader";
    let text = "a ".repeat(2_000);
    let accepted = http
        .post(format!("{}/api/v1/agent/runs", platform.urls.runs))
        .bearer_auth(&alice)
        .json(&text_run(&thread, run_id, text.trim_end()))
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 202);

    // The slow client: a 4 KiB receive buffer; it reads the response head, then nothing.
    let address = replica
        .trim_start_matches("http://")
        .parse::<std::net::SocketAddr>()
        .unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(address).await.unwrap();
    let request = format!(
        "GET /api/v1/agent/runs/{run_id}/events HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer \
         {alice}\r\nAccept: text/event-stream\r\n\r\n",
        address
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(stream.read_u8().await.unwrap());
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );

    // The run ends while the client reads nothing (its status, asked of the first replica).
    platform
        .api()
        .wait_for_status_within(&alice, run_id, "completed", Duration::from_secs(120))
        .await
        .unwrap();

    // Now it reads: the stream must end within seconds.
    let mut raw = Vec::new();
    let mut buffer = vec![0_u8; 64 * 1024];
    let body = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let n = stream.read(&mut buffer).await.unwrap();
            assert!(n > 0, "the server closed the stream before its end");
            raw.extend_from_slice(&buffer[..n]);
            if let Some(body) = dechunk(&raw) {
                return body;
            }
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the stream did not end within 30 s of the client reading again ({} bytes read)",
            raw.len()
        )
    });

    let mut parser = protocol::sse::SseParser::new();
    let mut events: Vec<(u64, Value)> = Vec::new();
    for frame in parser.push(&body).unwrap() {
        if let protocol::sse::SseFrame::Event(event) = frame {
            events.push((
                event.id.unwrap().parse().unwrap(),
                serde_json::from_str(&event.data).unwrap(),
            ));
        }
    }
    assert!(
        events.windows(2).all(|pair| pair[0].0 < pair[1].0),
        "ids in order, none repeated"
    );
    assert_eq!(
        events.last().map(|(_, e)| e["type"].clone()),
        Some("RUN_FINISHED".into())
    );
    // What it got (live, then from the log, compacted) says what the run said.
    let log = read_sse(
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
    assert_eq!(
        streamed_text(events.iter().map(|(_, e)| e)),
        streamed_text(log.iter().map(|f| &f.data)),
        "the same reply"
    );
    assert!(
        events.len() < log.len(),
        "part of it came from the log, compacted ({} events of {})",
        events.len(),
        log.len()
    );
    // It left the live feed for its full queue, and the replica counted it.
    let metrics = http
        .get(format!("{replica}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let detached: f64 = metrics
        .lines()
        .find_map(|line| {
            line.strip_prefix("switchboard_stream_readers_detached_total{reason=\"queue_full\"} ")
        })
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0);
    assert!(detached >= 1.0, "no reader left the live feed: {metrics}");
    eprintln!(
        "{} events read of {} in the log, {} bytes; readers detached so far: {detached}",
        events.len(),
        log.len(),
        body.len()
    );
}
