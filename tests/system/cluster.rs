//! The production-shaped topology: a 3-node NATS cluster with a user per service, replicas of
//! every service, the gateway in front. What it must survive, and who may say what on its bus.

use std::time::Duration;

use serde_json::{Value, json};
use switchboard_system_tests::cluster::{Fleet, SERVICES};
use switchboard_system_tests::{EVENTUAL, text_run};

/// Posts `body` through the gateway until an answer other than a gateway/connection failure
/// (a replica gone mid-request); the run's id makes retries safe.
async fn post_run(
    http: &reqwest::Client,
    gateway: &str,
    token: &str,
    body: &Value,
) -> (u16, Value) {
    let deadline = tokio::time::Instant::now() + EVENTUAL;
    loop {
        let sent = http
            .post(format!("{gateway}/api/v1/agent/runs"))
            .bearer_auth(token)
            .json(body)
            .send()
            .await;
        let last = match sent {
            Ok(response) => {
                let status = response.status().as_u16();
                let answer = response.text().await.unwrap_or_default();
                if !matches!(status, 502..=504) {
                    return (status, serde_json::from_str(&answer).unwrap_or(Value::Null));
                }
                format!("{status} {answer}")
            }
            Err(err) => format!("{err:#}"),
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "the gateway never took the run {}: the last answer was {last}",
            body["runId"]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The history of `thread` once it holds `count` messages, the last one finished.
async fn history(http: &reqwest::Client, gateway: &str, token: &str, thread: &str) -> Value {
    let response = http
        .get(format!("{gateway}/api/v1/agent/history"))
        .bearer_auth(token)
        .query(&[("threadId", thread)])
        .send()
        .await
        .unwrap();
    response.json().await.unwrap_or(Value::Null)
}

#[tokio::test]
async fn each_service_speaks_on_the_bus_only_as_itself_and_a_run_still_goes_end_to_end() {
    let fleet = Fleet::start(1, &[]).await.unwrap();
    let http = reqwest::Client::new();
    let alice = fleet.infra.token("alice");
    let thread = uuid::Uuid::new_v4().to_string();
    let (status, _) = post_run(
        &http,
        &fleet.gateway.url,
        &alice,
        &text_run(&thread, "perm-1", "hello cluster"),
    )
    .await;
    assert_eq!(status, 202);
    let deadline = tokio::time::Instant::now() + EVENTUAL;
    loop {
        let body = history(&http, &fleet.gateway.url, &alice, &thread).await;
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        if messages.len() == 2
            && messages[1]["content"]
                .as_str()
                .is_some_and(|c| c.contains("hello cluster"))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run never reached history: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The same request to the attachments service's resolve endpoint: answered for runs,
    // refused by the server for history (which has no business resolving files).
    let names = &fleet.nats.names;
    let request = serde_json::to_vec(&json!({"owner": "alice", "urls": []})).unwrap();
    let runs = fleet.nats.connect_as("runs").await.unwrap();
    let answered = tokio::time::timeout(
        Duration::from_secs(5),
        runs.request(names.attachments_resolve_subject(), request.clone().into()),
    )
    .await
    .expect("runs got an answer in time");
    assert!(answered.is_ok(), "runs may resolve: {answered:?}");

    let (errors_tx, mut errors) = tokio::sync::mpsc::unbounded_channel();
    let history_user = async_nats::ConnectOptions::with_user_and_password(
        "history".into(),
        "history-test-password".into(),
    )
    .custom_inbox_prefix(platform::nats_auth::inbox_prefix("history"))
    .event_callback(move |event| {
        let errors_tx = errors_tx.clone();
        async move {
            if let async_nats::Event::ServerError(err) = event {
                let _ = errors_tx.send(err.to_string());
            }
        }
    })
    .connect(fleet.nats.urls())
    .await
    .unwrap();
    let refused = tokio::time::timeout(
        Duration::from_secs(3),
        history_user.request(names.attachments_resolve_subject(), request.into()),
    )
    .await;
    assert!(
        !matches!(refused, Ok(Ok(_))),
        "history got an answer from resolve: {refused:?}"
    );
    let error = tokio::time::timeout(Duration::from_secs(5), errors.recv())
        .await
        .expect("the server reported the violation")
        .unwrap();
    assert!(
        error.to_lowercase().contains("permissions violation"),
        "{error}"
    );

    // No user but admin may delete a stream.
    let js = async_nats::jetstream::new(fleet.nats.connect_as("worker").await.unwrap());
    let deleted = tokio::time::timeout(
        Duration::from_secs(5),
        js.delete_stream(names.runs_stream()),
    )
    .await;
    assert!(
        !matches!(deleted, Ok(Ok(_))),
        "the worker deleted the runs stream"
    );
    let admin = async_nats::jetstream::new(fleet.nats.admin().await.unwrap());
    assert!(
        admin.get_stream(names.runs_stream()).await.is_ok(),
        "the stream is still there"
    );

    // Nor change one: runs may not add history's inbox to the runs stream's subjects (to keep
    // history's replies: signed links) nor shorten its age (to empty it), and may not delete
    // history's durable consumer. The admin's `nats-setup` made them; the users only use them.
    let runs_js = async_nats::jetstream::new(runs);
    let mut before = admin.get_stream(names.runs_stream()).await.unwrap();
    let before = before.info().await.unwrap().config.clone();
    let mut capture = before.clone();
    capture.subjects.push("_INBOX_history.>".to_owned());
    capture.max_age = Duration::from_secs(1);
    let updated =
        tokio::time::timeout(Duration::from_secs(5), runs_js.update_stream(capture)).await;
    assert!(
        !matches!(updated, Ok(Ok(_))),
        "runs changed the runs stream: {updated:?}"
    );
    let events = runs_js.get_stream(names.run_events_stream()).await.unwrap();
    let deleted = tokio::time::timeout(
        Duration::from_secs(5),
        events.delete_consumer(protocol::messaging::HISTORY_EVENTS_CONSUMER),
    )
    .await;
    assert!(
        !matches!(deleted, Ok(Ok(_))),
        "runs deleted history's consumer"
    );
    // Nor change it: JetStream's create is create-or-update, and a durable of history's with
    // another filter would starve history of events.
    let mut hijack = events
        .consumer_info(protocol::messaging::HISTORY_EVENTS_CONSUMER)
        .await
        .unwrap()
        .config
        .clone();
    hijack.filter_subject = format!("{}.nothing", names.prefix());
    let changed = tokio::time::timeout(
        Duration::from_secs(5),
        events.create_consumer(async_nats::jetstream::consumer::pull::Config {
            durable_name: hijack.durable_name.clone(),
            filter_subject: hijack.filter_subject.clone(),
            ack_policy: hijack.ack_policy,
            ack_wait: hijack.ack_wait,
            ..Default::default()
        }),
    )
    .await;
    assert!(
        !matches!(changed, Ok(Ok(_))),
        "runs changed history's consumer"
    );
    let mut after = admin.get_stream(names.runs_stream()).await.unwrap();
    assert_eq!(
        after.info().await.unwrap().config,
        before,
        "the stream changed"
    );
    let events = admin.get_stream(names.run_events_stream()).await.unwrap();
    let kept = events
        .consumer_info(protocol::messaging::HISTORY_EVENTS_CONSUMER)
        .await
        .expect("history's consumer is still there");
    assert_eq!(
        kept.config.filter_subject, "",
        "history's consumer was changed"
    );
}

/// What a client following a run's events through the gateway saw.
#[derive(Debug, Default)]
struct Followed {
    /// Event ids in the order received, across reconnects.
    ids: Vec<u64>,
    /// How often the stream was cut before the terminal event and resumed.
    resumes: usize,
    /// Whether the terminal event arrived.
    terminal: bool,
    /// Whether the agent's reply started (`TEXT_MESSAGE_START`): a run whose worker was killed
    /// before that has no assistant message in history, only the user's.
    replied: bool,
}

/// Follows `run_id`'s events through the gateway to the terminal event, resuming with
/// `Last-Event-ID` whenever the stream is cut (a replica killed or restarted under it).
async fn follow(http: reqwest::Client, gateway: String, token: String, run_id: String) -> Followed {
    use futures::StreamExt as _;
    let mut followed = Followed::default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    while tokio::time::Instant::now() < deadline {
        let mut request = http
            .get(format!(
                "{gateway}/api/v1/agent/runs/{run_id}/events?compact=false"
            ))
            .bearer_auth(&token);
        if let Some(last) = followed.ids.last() {
            request = request.header("Last-Event-ID", last.to_string());
        }
        let response = match request.send().await {
            Ok(response) if response.status() == 200 => response,
            _ => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let mut body = response.bytes_stream();
        let mut parser = protocol::sse::SseParser::new();
        while let Some(Ok(chunk)) = body.next().await {
            for frame in parser.push(&chunk).expect("a well-formed event stream") {
                let protocol::sse::SseFrame::Event(event) = frame else {
                    continue;
                };
                let id = event.id.and_then(|id| id.parse::<u64>().ok());
                followed.ids.push(id.expect("every event has a numeric id"));
                let data: Value = serde_json::from_str(&event.data).expect("events are JSON");
                followed.replied |= data["type"] == "TEXT_MESSAGE_START";
                if matches!(data["type"].as_str(), Some("RUN_FINISHED" | "RUN_ERROR")) {
                    followed.terminal = true;
                    return followed;
                }
            }
        }
        followed.resumes += 1;
    }
    followed
}

/// One accepted run of the load.
#[derive(Debug, Clone)]
struct Accepted {
    token: String,
    thread: String,
    run_id: String,
    text: String,
    at: tokio::time::Instant,
}

/// Waits until `count` more runs than `from` were accepted.
async fn until_accepted(
    accepted: &std::sync::Mutex<Vec<Accepted>>,
    from: usize,
    more: usize,
) -> usize {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let now = accepted.lock().unwrap().len();
        if now >= from + more {
            return now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "acceptance stalled at {now}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn under_load_a_lost_nats_node_crashed_replicas_and_rolling_restarts_lose_no_run_and_no_event()
 {
    let mut fleet = Fleet::start(2, &[]).await.unwrap();
    let gateway = fleet.gateway.url.clone();
    let http = reqwest::Client::new();
    let accepted = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Accepted>::new()));
    let stop = tokio_util::sync::CancellationToken::new();
    let mut followers = tokio::task::JoinSet::new();
    let (follow_tx, mut follow_rx) = tokio::sync::mpsc::unbounded_channel();

    // The load: five owners, each starting a run (~1.2 s of streamed words) every 0.7 s on a
    // thread of its own, retrying a request the gateway could not deliver (the same run id:
    // acceptance is idempotent). Every accepted run is followed over SSE.
    let mut owners = tokio::task::JoinSet::new();
    for owner in 0..5 {
        let (http, gateway, accepted, stop) = (
            http.clone(),
            gateway.clone(),
            accepted.clone(),
            stop.clone(),
        );
        let token = fleet.infra.token(&format!("owner-{owner}"));
        let follow_tx = follow_tx.clone();
        owners.spawn(async move {
            let mut pace = tokio::time::interval(Duration::from_millis(700));
            for n in 0.. {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = pace.tick() => {}
                }
                let (thread, run_id) = (
                    uuid::Uuid::new_v4().to_string(),
                    format!("chaos-{owner}-{n}"),
                );
                let text = format!("/slow owner {owner} run {n} says hello");
                let (status, body) =
                    post_run(&http, &gateway, &token, &text_run(&thread, &run_id, &text)).await;
                assert_eq!(status, 202, "{run_id}: {body}");
                accepted.lock().unwrap().push(Accepted {
                    token: token.clone(),
                    thread,
                    run_id: run_id.clone(),
                    text,
                    at: tokio::time::Instant::now(),
                });
                let _ = follow_tx.send((token.clone(), run_id));
            }
        });
    }
    drop(follow_tx);
    let follower_spawner = {
        let (http, gateway) = (http.clone(), gateway.clone());
        tokio::spawn(async move {
            while let Some((token, run_id)) = follow_rx.recv().await {
                let task = follow(http.clone(), gateway.clone(), token, run_id.clone());
                followers.spawn(async move { (run_id, task.await) });
            }
            followers.join_all().await
        })
    };

    // The chaos, each step once the load has moved on.
    let mut seen = until_accepted(&accepted, 0, 10).await;
    fleet.nats.kill(0).unwrap();
    seen = until_accepted(&accepted, seen, 10).await;
    fleet.nats.restart(0).await.unwrap();
    seen = until_accepted(&accepted, seen, 5).await;
    for service in SERVICES {
        fleet.crash_and_restart(service, 0).await.unwrap();
    }
    let crashes_over = tokio::time::Instant::now();
    seen = until_accepted(&accepted, seen, 10).await;
    for service in SERVICES {
        for replica in 0..2 {
            let code = fleet.restart_gracefully(service, replica).await.unwrap();
            assert_eq!(
                code,
                Some(0),
                "{service} {replica} drained and exited cleanly"
            );
        }
    }
    until_accepted(&accepted, seen, 10).await;
    stop.cancel();
    while let Some(done) = owners.join_next().await {
        done.unwrap();
    }
    let followed = follower_spawner.await.unwrap();
    let accepted = accepted.lock().unwrap().clone();

    // Every run that got a 202: finished, in history exactly once, with its whole reply (a run
    // cut by a killed worker: with the part of its reply it streamed, if it streamed any).
    let replied: std::collections::HashMap<&str, bool> = followed
        .iter()
        .map(|(run_id, seen)| (run_id.as_str(), seen.replied))
        .collect();
    let (mut completed, mut lost) = (0, 0);
    for run in &accepted {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let status = loop {
            let response = http
                .get(format!("{gateway}/api/v1/agent/runs/{}", run.run_id))
                .bearer_auth(&run.token)
                .send()
                .await;
            if let Ok(response) = response
                && response.status() == 200
            {
                let body: Value = response.json().await.unwrap();
                if matches!(
                    body["status"].as_str(),
                    Some("completed" | "failed" | "cancelled")
                ) {
                    break body;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} never finished",
                run.run_id
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let whole = status["status"] == "completed";
        if whole {
            completed += 1;
        } else {
            // Only a run cut by a SIGKILLed worker may end `worker_lost`, never by a drain.
            assert_eq!(
                status["error"], "the worker running this run stopped before it finished",
                "{}: {status}",
                run.run_id
            );
            assert!(
                run.at < crashes_over,
                "{} was lost after the crashes: {status}",
                run.run_id
            );
            lost += 1;
        }
        let reply = format!("You said: {}", run.text);
        let said = replied.get(run.run_id.as_str()).copied().unwrap_or(true);
        assert!(said || !whole, "{}: completed without a reply", run.run_id);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let body = history(&http, &gateway, &run.token, &run.thread).await;
            let messages = body["messages"].as_array().cloned().unwrap_or_default();
            let users = messages.iter().filter(|m| m["role"] == "user").count();
            let answer = messages.get(1).map(|m| (&m["role"], m["content"].as_str()));
            let done = messages.len() == 1 + usize::from(said)
                && users == 1
                && messages[0]["content"] == run.text.as_str()
                && match answer {
                    None => true,
                    Some((role, Some(text))) if role == "assistant" => {
                        if whole {
                            text == reply
                        } else {
                            reply.starts_with(text)
                        }
                    }
                    Some(_) => false,
                };
            if done {
                break;
            }
            assert!(users <= 1, "{} written twice: {body}", run.run_id);
            assert!(
                tokio::time::Instant::now() < deadline,
                "{}: history {body}, status {status}, reply streamed: {said}",
                run.run_id
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // Every stream reached its terminal event, cut or not, nothing missing or repeated.
    let mut resumed = 0;
    for (run_id, seen) in &followed {
        assert!(seen.terminal, "{run_id}: the stream never ended: {seen:?}");
        let expected: Vec<u64> = (1..=seen.ids.len() as u64).collect();
        assert_eq!(seen.ids, expected, "{run_id}: events missing or repeated");
        resumed += usize::from(seen.resumes > 0);
    }
    assert_eq!(followed.len(), accepted.len());
    eprintln!(
        "cluster chaos: {} runs accepted, {completed} completed, {lost} worker_lost (SIGKILL), \
         {} streams followed, {resumed} of them cut and resumed",
        accepted.len(),
        followed.len()
    );
    assert!(
        resumed > 0,
        "no stream was cut: the chaos missed the streams"
    );
}

#[tokio::test]
async fn a_run_streaming_while_a_nats_node_dies_keeps_every_event_once_and_in_order() {
    let mut fleet = Fleet::start(1, &[]).await.unwrap();
    let http = reqwest::Client::new();
    let alice = fleet.infra.token("alice");
    let thread = uuid::Uuid::new_v4().to_string();
    let words: Vec<String> = (1..=20).map(|n| format!("w{n}")).collect();
    let text = format!("/slow {}", words.join(" "));
    let (status, accepted) = post_run(
        &http,
        &fleet.gateway.url,
        &alice,
        &text_run(&thread, "node-loss", &text),
    )
    .await;
    assert_eq!(status, 202);
    let follower = tokio::spawn(follow(
        http.clone(),
        fleet.gateway.url.clone(),
        alice.clone(),
        "node-loss".into(),
    ));
    // Kill a node once the reply is streaming (its first words are in history).
    let deadline = tokio::time::Instant::now() + EVENTUAL;
    loop {
        let body = history(&http, &fleet.gateway.url, &alice, &thread).await;
        if body["messages"][1]["content"]
            .as_str()
            .is_some_and(|c| c.contains("w2 "))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never streamed: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    fleet.nats.kill(0).unwrap();
    let followed = follower.await.unwrap();
    let task = accepted["taskId"].as_str().unwrap().to_owned();
    // What the stream holds, read as admin: every event once, numbered from 1.
    let js = async_nats::jetstream::new(fleet.nats.admin().await.unwrap());
    let stream = js
        .get_stream(fleet.nats.names.run_events_stream())
        .await
        .unwrap();
    let config = async_nats::jetstream::consumer::pull::Config {
        filter_subject: fleet.nats.names.run_event_subject(task.parse().unwrap()),
        ..Default::default()
    };
    // The cluster may still be electing leaders after the loss: a few tries.
    let mut tries = 0;
    let consumer = loop {
        match stream.create_consumer(config.clone()).await {
            Ok(consumer) => break consumer,
            Err(err) if tries < 50 => {
                tries += 1;
                eprintln!("reading the stream back: {err}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(err) => panic!("cannot read the stream back: {err}"),
        }
    };
    let mut messages = consumer
        .fetch()
        .max_messages(500)
        .expires(Duration::from_secs(2))
        .messages()
        .await
        .unwrap();
    let mut stored = Vec::new();
    use futures::StreamExt as _;
    while let Some(Ok(message)) = messages.next().await {
        let event: Value = serde_json::from_slice(&message.payload).unwrap();
        stored.push((
            event["seq"].as_u64().unwrap(),
            event["event"]["delta"].as_str().unwrap_or("").to_owned(),
            event["event"]["type"].as_str().unwrap_or("").to_owned(),
        ));
    }
    let seqs: Vec<u64> = stored.iter().map(|(s, _, _)| *s).collect();
    let text_stored: String = stored.iter().map(|(_, d, _)| d.as_str()).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "stored: {stored:?}"
    );
    assert_eq!(
        text_stored,
        format!("You said: {text}"),
        "stored: {stored:?}"
    );
    assert!(followed.terminal, "{followed:?}");
    assert_eq!(
        followed.ids,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "streamed: {followed:?}"
    );
    let body = history(&http, &fleet.gateway.url, &alice, &thread).await;
    assert_eq!(
        body["messages"][1]["content"],
        format!("You said: {text}"),
        "{body}"
    );
}

/// Makes a CA and a certificate for 127.0.0.1 signed by it in `dir`: (ca, cert, key).
fn certificates(
    dir: &std::path::Path,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let run = |args: &[&str]| {
        let status = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl runs");
        assert!(status.success(), "openssl {args:?}");
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=switchboard-test-ca",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(dir.join("ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "1",
        "-extfile",
        "ext",
    ]);
    (
        dir.join("ca.crt"),
        dir.join("server.crt"),
        dir.join("server.key"),
    )
}

#[tokio::test]
async fn a_service_reaches_a_tls_nats_with_the_ca_it_is_given_and_refuses_anything_less() {
    let dir = std::env::temp_dir().join(format!("sb-nats-tls-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca, cert, key) = certificates(&dir);
    let (tls_port, plain_port) = (
        switchboard_system_tests::free_port().unwrap(),
        switchboard_system_tests::free_port().unwrap(),
    );
    let config = dir.join("tls.conf");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:{tls_port}\njetstream {{ store_dir: \"{}\" }}\ntls {{ cert_file: \"{}\", key_file: \"{}\" }}\n",
            dir.join("js").display(),
            cert.display(),
            key.display()
        ),
    )
    .unwrap();
    let server = switchboard_system_tests::cluster::nats_server();
    let spawn = |args: Vec<String>| {
        std::process::Command::new(&server)
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut tls = spawn(vec!["-c".into(), config.display().to_string()]);
    let mut plain = spawn(vec![
        "-a".into(),
        "127.0.0.1".into(),
        "-p".into(),
        plain_port.to_string(),
    ]);
    // Whether a service with these settings gets a working connection within 5 s (the client
    // retries in the background; a round trip to the server proves the session).
    let connected = |pairs: Vec<(&'static str, String)>| async move {
        let config = platform::config::Env::from_pairs(pairs).nats().unwrap();
        let session = async {
            let (client, _) = platform::nats::connect(&config, "runs").await?;
            client.flush().await?;
            anyhow::Ok(())
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(5), session).await,
            Ok(Ok(()))
        )
    };
    let with_ca = vec![
        ("SB_NATS_URL", format!("nats://127.0.0.1:{tls_port}")),
        ("SB_NATS_TLS_CA_FILE", ca.display().to_string()),
        ("SB_NATS_TLS_REQUIRED", "true".to_owned()),
    ];
    assert!(
        connected(with_ca).await,
        "the CA verifies the server: a TLS session"
    );
    // Without the CA the server's certificate is not trusted: no session.
    let no_ca = vec![
        ("SB_NATS_URL", format!("nats://127.0.0.1:{tls_port}")),
        ("SB_NATS_TLS_REQUIRED", "true".to_owned()),
    ];
    assert!(
        !connected(no_ca).await,
        "a session with an untrusted server"
    );
    // TLS required, and the server speaks plaintext: no session.
    let plaintext = vec![
        ("SB_NATS_URL", format!("nats://127.0.0.1:{plain_port}")),
        ("SB_NATS_TLS_CA_FILE", ca.display().to_string()),
        ("SB_NATS_TLS_REQUIRED", "true".to_owned()),
    ];
    assert!(
        !connected(plaintext).await,
        "TLS required, yet a plaintext session"
    );

    for child in [&mut tls, &mut plain] {
        let _ = child.kill();
        let _ = child.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
