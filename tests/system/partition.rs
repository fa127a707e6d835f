//! Faults that leave every process running: a NATS node cut off from the rest by the network
//! (a partition, healed afterwards) and the PostgreSQL server of history and attachments
//! restarted, both under load on the production-shaped fleet. No run may be lost, ended twice
//! or written twice, and no event skipped or repeated.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use serde_json::{Value, json};
use switchboard_system_tests::cluster::{Fleet, NatsCluster};
use switchboard_system_tests::postgres::Postgres;
use switchboard_system_tests::{EVENTUAL, read_sse, text_run, wait_http_ok};
use tokio::time::Instant;

/// What the load had to do again because of the faults.
#[derive(Debug, Default)]
struct Retries {
    /// Run requests sent again (no answer, or 502..=504 from the gateway).
    posts: AtomicUsize,
    /// Of those, the answers 503 (the runs replica could not reach JetStream).
    unavailable: AtomicUsize,
    /// Event streams opened again with `Last-Event-ID` after being cut or refused.
    reconnects: AtomicUsize,
}

/// Posts `body` through the gateway until an answer other than a gateway/connection failure;
/// the run's id makes retries safe. Patient: a runs replica whose NATS node is cut off retries
/// its publish for 30 s before it answers 503.
async fn post_run(
    http: &reqwest::Client,
    gateway: &str,
    token: &str,
    body: &Value,
    retries: &Retries,
) -> (u16, Value) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let sent = http
            .post(format!("{gateway}/api/v1/agent/runs"))
            .bearer_auth(token)
            .json(body)
            .send()
            .await;
        if let Ok(response) = sent {
            let status = response.status().as_u16();
            if !matches!(status, 502..=504) {
                return (status, response.json().await.unwrap_or(Value::Null));
            }
            if status == 503 {
                retries.unavailable.fetch_add(1, Ordering::Relaxed);
            }
        }
        retries.posts.fetch_add(1, Ordering::Relaxed);
        assert!(Instant::now() < deadline, "the gateway never took the run");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The history of `thread` as the thread endpoint shows it now.
async fn history(http: &reqwest::Client, gateway: &str, token: &str, thread: &str) -> Value {
    let response = http
        .get(format!("{gateway}/api/v1/agent/history"))
        .bearer_auth(token)
        .query(&[("threadId", thread)])
        .send()
        .await;
    match response {
        Ok(response) => response.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

/// What a client following a run's events through the gateway saw, up to its terminal event.
#[derive(Debug, Default)]
struct Followed {
    /// The events (id, AG-UI event) in the order received, across reconnects.
    events: Vec<(u64, Value)>,
    /// When the terminal event arrived, if it did.
    ended_at: Option<Instant>,
    /// Why reconnecting failed, how often: the status answered, or `no answer`.
    refused: BTreeMap<String, usize>,
}

impl Followed {
    /// The ids of the events received, in order.
    fn ids(&self) -> Vec<u64> {
        self.events.iter().map(|(id, _)| *id).collect()
    }
}

/// Follows `run_id`'s events through the gateway to the terminal event, resuming with
/// `Last-Event-ID` whenever the stream is cut; gives up after 180 s (a hang guard: the runs
/// service re-reads the log when its NATS connection comes back, having lost live events).
async fn follow(
    http: reqwest::Client,
    gateway: String,
    token: String,
    run_id: String,
    retries: Arc<Retries>,
) -> Followed {
    let mut followed = Followed::default();
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut first = true;
    while Instant::now() < deadline {
        if !std::mem::take(&mut first) {
            retries.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        let mut request = http
            .get(format!(
                "{gateway}/api/v1/agent/runs/{run_id}/events?compact=false"
            ))
            .bearer_auth(&token);
        if let Some((last, _)) = followed.events.last() {
            request = request.header("Last-Event-ID", last.to_string());
        }
        let response = match request.send().await {
            Ok(response) if response.status() == 200 => response,
            refused => {
                let why = refused.map_or("no answer".to_owned(), |r| r.status().to_string());
                *followed.refused.entry(why).or_default() += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let mut body = response.bytes_stream();
        let mut parser = protocol::sse::SseParser::new();
        // The deadline holds mid-stream too: heartbeats keep a stalled stream open.
        while let Ok(Some(Ok(chunk))) = tokio::time::timeout_at(deadline, body.next()).await {
            for frame in parser.push(&chunk).expect("a well-formed event stream") {
                let protocol::sse::SseFrame::Event(event) = frame else {
                    continue;
                };
                let id = event.id.and_then(|id| id.parse::<u64>().ok());
                let data: Value = serde_json::from_str(&event.data).expect("events are JSON");
                let terminal = is_terminal(&data);
                followed
                    .events
                    .push((id.expect("every event has a numeric id"), data));
                if terminal {
                    followed.ended_at = Some(Instant::now());
                    return followed;
                }
            }
        }
        // Cut before the terminal event: reconnect after a pause, as an EventSource does.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    followed
}

/// Whether an AG-UI event ends its run.
fn is_terminal(event: &Value) -> bool {
    matches!(event["type"].as_str(), Some("RUN_FINISHED" | "RUN_ERROR"))
}

/// One accepted run of the load.
#[derive(Debug, Clone)]
struct Accepted {
    token: String,
    thread: String,
    run_id: String,
    task_id: String,
    text: String,
    at: Instant,
}

/// Waits until `more` runs more than `from` were accepted; returns how many there are.
async fn until_accepted(accepted: &Mutex<Vec<Accepted>>, from: usize, more: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let now = accepted.lock().unwrap().len();
        if now >= from + more {
            return now;
        }
        assert!(Instant::now() < deadline, "acceptance stalled at {now}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A replicated JetStream group: the meta group, a stream or a consumer.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Group {
    /// The meta group (streams and consumers, their placement).
    Meta,
    /// A stream, by name.
    Stream(String),
    /// A consumer: its stream's name and its own.
    Consumer(String, String),
}

/// A JetStream API request as `admin`; its JSON answer, or `None` when none came within 2 s
/// (no leader to answer yet).
async fn js_api(admin: &async_nats::Client, subject: String, body: &Value) -> Option<Value> {
    let request = admin.request(subject, body.to_string().into());
    match tokio::time::timeout(Duration::from_secs(2), request).await {
        Ok(Ok(message)) => serde_json::from_slice(&message.payload).ok(),
        _ => None,
    }
}

/// The server name of `group`'s leader as `admin` (or, for the meta group, the monitoring
/// endpoint of node `via`) sees it; `None` while there is none.
async fn leader(
    nats: &NatsCluster,
    admin: &async_nats::Client,
    via: usize,
    group: &Group,
) -> Option<String> {
    let info = match group {
        Group::Meta => {
            let jsz = reqwest::get(format!("{}/jsz", nats.monitor_url(via)))
                .await
                .ok()?
                .json::<Value>()
                .await
                .ok()?;
            return jsz["meta_cluster"]["leader"]
                .as_str()
                .filter(|leader| !leader.is_empty())
                .map(str::to_owned);
        }
        Group::Stream(stream) => {
            js_api(admin, format!("$JS.API.STREAM.INFO.{stream}"), &json!({})).await?
        }
        Group::Consumer(stream, consumer) => {
            let subject = format!("$JS.API.CONSUMER.INFO.{stream}.{consumer}");
            js_api(admin, subject, &json!({})).await?
        }
    };
    info["cluster"]["leader"].as_str().map(str::to_owned)
}

/// Every stream of more than one replica (the runs and their events, the key-value buckets)
/// and every durable consumer of more than one replica.
async fn replicated_groups(admin: &async_nats::Client) -> Vec<Group> {
    let replicated = |info: &Value| {
        info["cluster"]["replicas"]
            .as_array()
            .is_some_and(|replicas| !replicas.is_empty())
    };
    let mut groups = Vec::new();
    let streams = js_api(admin, "$JS.API.STREAM.LIST".into(), &json!({}))
        .await
        .expect("the streams");
    for stream in streams["streams"].as_array().expect("a list of streams") {
        let name = stream["config"]["name"].as_str().unwrap().to_owned();
        let subject = format!("$JS.API.CONSUMER.LIST.{name}");
        let consumers = js_api(admin, subject, &json!({}))
            .await
            .expect("the consumers of a stream");
        for consumer in consumers["consumers"].as_array().into_iter().flatten() {
            if consumer["config"]["durable_name"].is_string() && replicated(consumer) {
                let consumer = consumer["name"].as_str().unwrap().to_owned();
                groups.push(Group::Consumer(name.clone(), consumer));
            }
        }
        if replicated(stream) {
            groups.push(Group::Stream(name));
        }
    }
    groups
}

/// Makes node `index` the leader of every replicated stream and consumer (a leader stepdown
/// naming it as the preferred successor, again until it is), so that cutting it off takes
/// every leader away at once. Returns them. (The meta group's leader stays where it is: its
/// stepdown is for the system account, which the test cluster does not have.)
async fn lead_from(nats: &NatsCluster, index: usize) -> Vec<Group> {
    let admin = nats.admin().await.unwrap();
    let target = nats.node_name(index).to_owned();
    let groups = replicated_groups(&admin).await;
    let preferred = json!({"placement": {"preferred": target}});
    let deadline = Instant::now() + Duration::from_secs(60);
    for group in &groups {
        loop {
            let now = leader(nats, &admin, index, group).await;
            if now.as_deref() == Some(target.as_str()) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{group:?} never moved to {target}: {now:?}"
            );
            if now.is_some() {
                let subject = match group {
                    Group::Meta => unreachable!("the meta group is not moved"),
                    Group::Stream(stream) => format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}"),
                    Group::Consumer(stream, consumer) => {
                        format!("$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{consumer}")
                    }
                };
                js_api(&admin, subject, &preferred).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    groups
}

/// Waits until the nodes other than `isolated` have elected a leader among themselves for every
/// one of `groups`.
async fn until_led_without(nats: &NatsCluster, isolated: usize, groups: &[Group]) {
    let others: Vec<usize> = (0..3).filter(|&index| index != isolated).collect();
    let admin = nats.admin_at(&others).await.unwrap();
    let gone = nats.node_name(isolated).to_owned();
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut waiting: Vec<&Group> = groups.iter().collect();
    while !waiting.is_empty() {
        let mut still = Vec::new();
        for group in waiting {
            let now = leader(nats, &admin, others[0], group).await;
            if now.is_none() || now.as_deref() == Some(gone.as_str()) {
                still.push(group);
            }
        }
        waiting = still;
        assert!(
            Instant::now() < deadline,
            "no leader without {gone} for {waiting:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until node `isolated` is back in every one of `groups`: a replica caught up with its
/// leader (or the leader), and agreeing with node `other` on the meta leader.
async fn until_rejoined(nats: &NatsCluster, isolated: usize, other: usize, groups: &[Group]) {
    let admin = nats.admin().await.unwrap();
    let name = nats.node_name(isolated).to_owned();
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut waiting: Vec<&Group> = groups.iter().collect();
    while !waiting.is_empty() {
        let mut still = Vec::new();
        for group in waiting {
            let back = match group {
                Group::Meta => {
                    let there = leader(nats, &admin, isolated, group).await;
                    there.is_some() && there == leader(nats, &admin, other, group).await
                }
                Group::Stream(stream) => {
                    let subject = format!("$JS.API.STREAM.INFO.{stream}");
                    let info = js_api(&admin, subject, &json!({})).await;
                    info.is_some_and(|info| caught_up(&info, &name))
                }
                Group::Consumer(stream, consumer) => {
                    let subject = format!("$JS.API.CONSUMER.INFO.{stream}.{consumer}");
                    let info = js_api(&admin, subject, &json!({})).await;
                    info.is_some_and(|info| caught_up(&info, &name))
                }
            };
            if !back {
                still.push(group);
            }
        }
        waiting = still;
        assert!(
            Instant::now() < deadline,
            "{name} never caught up in {waiting:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether the group of `info` has a leader and `node` is it or a current replica.
fn caught_up(info: &Value, node: &str) -> bool {
    let cluster = &info["cluster"];
    cluster["leader"] == node
        || (cluster["leader"].is_string()
            && cluster["replicas"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|replica| replica["name"] == node && replica["current"] == true))
}

/// Restarts replicas of each service gracefully, one at a time, until `wanted` of them are
/// connected to node `index` (a client picks its node at random, so one in three restarts lands
/// there), at most 20 times per service; returns how many restarts that took. Where a restarted
/// replica landed is its service's newest connection across the nodes. A service still short
/// after that is cut off less; the caller reports who was cut off.
async fn connect_to(fleet: &mut Fleet, index: usize, services: &[(&str, usize)]) -> usize {
    let mut restarts = 0;
    for &(service, wanted) in services {
        // Which replicas are known to be on the node; unknown ones are restarted first.
        let mut there = vec![false; wanted];
        if clients_on(&fleet.nats, index)
            .await
            .get(service)
            .copied()
            .unwrap_or(0)
            >= wanted
        {
            continue;
        }
        for _ in 0..20 {
            let Some(replica) = there.iter().position(|on| !on) else {
                break;
            };
            let code = fleet.restart_gracefully(service, replica).await.unwrap();
            assert_eq!(code, Some(0), "{service} drained and exited cleanly");
            restarts += 1;
            there[replica] = newest_connection(&fleet.nats, service).await == Some(index);
        }
    }
    restarts
}

/// The node serving the most recently opened connection named `service`.
async fn newest_connection(nats: &NatsCluster, service: &str) -> Option<usize> {
    let mut newest: Option<(chrono::DateTime<chrono::FixedOffset>, usize)> = None;
    for node in 0..3 {
        for connection in connz(nats, node).await["connections"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let Some(start) = connection["start"]
                .as_str()
                .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
            else {
                continue;
            };
            if connection["name"] == service && newest.is_none_or(|(at, _)| start > at) {
                newest = Some((start, node));
            }
        }
    }
    newest.map(|(_, node)| node)
}

/// Every event of the run events stream, read as `admin`: `(task id, seq, event)` in stream
/// order.
async fn stored_events(nats: &NatsCluster) -> Vec<(String, u64, Value)> {
    let js = async_nats::jetstream::new(nats.admin().await.unwrap());
    let mut stream = js.get_stream(nats.names.run_events_stream()).await.unwrap();
    let total = stream.info().await.unwrap().state.messages;
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            ack_policy: async_nats::jetstream::consumer::AckPolicy::None,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut messages = consumer.messages().await.unwrap();
    let mut events = Vec::new();
    while (events.len() as u64) < total {
        let message = tokio::time::timeout(Duration::from_secs(20), messages.next())
            .await
            .expect("the stream reads back")
            .expect("more events")
            .unwrap();
        let stored: Value = serde_json::from_slice(&message.payload).unwrap();
        events.push((
            stored["task_id"].as_str().unwrap().to_owned(),
            stored["seq"].as_u64().unwrap(),
            stored["event"].clone(),
        ));
    }
    events
}

/// Node `index`'s connections as its monitoring endpoint lists them.
async fn connz(nats: &NatsCluster, index: usize) -> Value {
    reqwest::get(format!("{}/connz?limit=1024", nats.monitor_url(index)))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// How many clients of each name (the services name their connections) node `index` serves.
async fn clients_on(nats: &NatsCluster, index: usize) -> BTreeMap<String, usize> {
    let mut clients = BTreeMap::new();
    for connection in connz(nats, index).await["connections"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let name = connection["name"].as_str().unwrap_or("unnamed").to_owned();
        *clients.entry(name).or_default() += 1;
    }
    clients
}

/// A run's stored events in short: `seq:TYPE` (with the text of a content event).
fn summary(log: &[(u64, Value)]) -> String {
    log.iter()
        .map(|(seq, event)| match event["delta"].as_str() {
            Some(delta) => format!("{seq}:{}({delta:?})", event["type"].as_str().unwrap_or("?")),
            None => format!("{seq}:{}", event["type"].as_str().unwrap_or("?")),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// What a client that read `log` up to its (first) terminal event was told: how the run ended
/// and the agent's reply, `None` when the reply never started.
fn told(log: &[(u64, Value)]) -> (Option<String>, Option<String>) {
    let mut reply: Option<String> = None;
    for (_, event) in log {
        match event["type"].as_str() {
            Some("TEXT_MESSAGE_START") => reply = Some(String::new()),
            Some("TEXT_MESSAGE_CONTENT") => {
                if let (Some(reply), Some(delta)) = (reply.as_mut(), event["delta"].as_str()) {
                    reply.push_str(delta);
                }
            }
            Some(end @ ("RUN_FINISHED" | "RUN_ERROR")) => return (Some(end.to_owned()), reply),
            _ => {}
        }
    }
    (None, reply)
}

/// Issue 25, reliability under faults: runs from five owners through the gateway, two replicas
/// of every service on three NATS nodes; one node (leading every stream and consumer, with a
/// replica of runs, history and worker connected to it) is cut off by the network and healed,
/// then the PostgreSQL server of history and attachments is stopped and started. Every run that
/// got a 202 ends exactly once, as every client and history see it.
#[tokio::test]
async fn under_load_a_partitioned_nats_node_and_a_restarted_postgres_lose_no_run_and_repeat_no_event()
 {
    let began = Instant::now();
    let progress = |what: &str| eprintln!("[partition +{:.1?}] {what}", began.elapsed());
    let mut postgres = Postgres::start().await.unwrap();
    let names = test_support::Infra::from_env().fresh_nats().names;
    let nats = NatsCluster::start_partitionable(3, names).await.unwrap();
    let isolated = nats.isolable().unwrap();
    // A waiting stream reads its run's log again only after a NATS reconnection here (its
    // periodic recheck is put past the followers' 180 s guard): a stream on a runs replica cut
    // off with the node, whose live events were lost, must resume as its client reconnects.
    let mut fleet = Fleet::start_on(
        nats,
        Some(&postgres.url),
        2,
        &[("SB_RUNS_STREAM_RECHECK_SECS", "600")],
    )
    .await
    .unwrap();
    progress("fleet ready");
    let gateway = fleet.gateway.url.clone();
    let http = reqwest::Client::new();
    let retries = Arc::new(Retries::default());
    let accepted = Arc::new(Mutex::new(Vec::<Accepted>::new()));
    let stop = tokio_util::sync::CancellationToken::new();
    let (follow_tx, mut follow_rx) = tokio::sync::mpsc::unbounded_channel();

    // The load: five owners, each starting a run (~1.2 s of streamed words) every 0.7 s on a
    // thread of its own, retrying a request the gateway could not deliver (the same run id:
    // acceptance is idempotent). Every accepted run is followed over SSE.
    let mut owners = tokio::task::JoinSet::new();
    for owner in 0..5 {
        let (http, gateway, accepted, stop, retries) = (
            http.clone(),
            gateway.clone(),
            accepted.clone(),
            stop.clone(),
            retries.clone(),
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
                    format!("part-{owner}-{n}"),
                );
                let text = format!("/slow owner {owner} run {n} says hello");
                let body = text_run(&thread, &run_id, &text);
                let (status, answer) = post_run(&http, &gateway, &token, &body, &retries).await;
                assert_eq!(status, 202, "{run_id}: {answer}");
                accepted.lock().unwrap().push(Accepted {
                    token: token.clone(),
                    thread,
                    run_id: run_id.clone(),
                    task_id: answer["taskId"].as_str().unwrap().to_owned(),
                    text,
                    at: Instant::now(),
                });
                let _ = follow_tx.send((token.clone(), run_id));
            }
        });
    }
    drop(follow_tx);
    let follower_spawner = {
        let (http, gateway, retries) = (http.clone(), gateway.clone(), retries.clone());
        tokio::spawn(async move {
            let mut followers = tokio::task::JoinSet::new();
            while let Some((token, run_id)) = follow_rx.recv().await {
                let task = follow(
                    http.clone(),
                    gateway.clone(),
                    token,
                    run_id.clone(),
                    retries.clone(),
                );
                followers.spawn(async move { (run_id, task.await) });
            }
            followers.join_all().await
        })
    };

    // (a) The partition. A replica of every service on the runs' path is connected to the node,
    // and every leader is moved to it first, so that cutting it off takes them all: the other
    // two nodes must elect new ones and go on without it, the replicas on it are cut off from
    // the bus (their connections hang) and the others take over their work.
    until_accepted(&accepted, 0, 10).await;
    // Both runs replicas go to the node if the restarts allow: then no replica can take a run
    // until one notices its connection is dead and moves to another node.
    let restarts = connect_to(
        &mut fleet,
        isolated,
        &[("runs", 2), ("history", 1), ("worker", 1)],
    )
    .await;
    progress(&format!(
        "runs, history and worker connected to {} ({restarts} replicas restarted for it)",
        fleet.nats.node_name(isolated)
    ));
    let mut groups = lead_from(&fleet.nats, isolated).await;
    let moved = groups.len();
    let admin = fleet.nats.admin().await.unwrap();
    let meta = leader(&fleet.nats, &admin, isolated, &Group::Meta).await;
    groups.push(Group::Meta);
    let cut_off = clients_on(&fleet.nats, isolated).await;
    fleet.nats.partition().unwrap();
    let cut_at = Instant::now();
    progress(&format!(
        "{} cut off, leading {moved} streams and consumers (meta leader {meta:?}), serving \
         {cut_off:?}",
        fleet.nats.node_name(isolated)
    ));
    until_led_without(&fleet.nats, isolated, &groups).await;
    let elected_in = cut_at.elapsed();
    progress("new leaders elected without it");
    // The load goes on without the node, then the network is whole again.
    let now = accepted.lock().unwrap().len();
    until_accepted(&accepted, now, 10).await;
    fleet.nats.heal().unwrap();
    let healed_at = Instant::now();
    let partition_lasted = healed_at - cut_at;
    progress("healed");
    let other = (isolated + 1) % 3;
    until_rejoined(&fleet.nats, isolated, other, &groups).await;
    let rejoined_in = healed_at.elapsed();
    progress("the node caught up in every group");
    let mut seen = until_accepted(&accepted, now, 20).await;

    // (b) The database of history and attachments stops (fast shutdown: its clients are
    // disconnected) while runs keep coming, then starts again on the same data.
    postgres.stop().await.unwrap();
    let stopped_at = Instant::now();
    progress("PostgreSQL stopped");
    let readiness =
        [0, 1].map(|replica| format!("{}/readyz", fleet.replica_url("history", replica).unwrap()));
    let deadline = Instant::now() + EVENTUAL;
    for url in &readiness {
        while http
            .get(url)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            assert!(
                Instant::now() < deadline,
                "{url} never noticed the database gone"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    progress("history not ready");
    seen = until_accepted(&accepted, seen, 5).await;
    postgres.start_again().await.unwrap();
    let database_down = stopped_at.elapsed();
    progress("PostgreSQL started again");
    for url in &readiness {
        wait_http_ok(url, EVENTUAL, "history").await.unwrap();
    }
    let ready_in = stopped_at.elapsed() - database_down;
    progress("history ready again");
    until_accepted(&accepted, seen, 10).await;
    stop.cancel();
    while let Some(done) = owners.join_next().await {
        done.unwrap();
    }
    progress("load stopped");
    let followed = follower_spawner.await.unwrap();
    let accepted = accepted.lock().unwrap().clone();
    progress("every stream followed to its end");

    // Everything wrong with a run, by run id; checked all through, then reported together.
    let mut broken: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut report = |run: &str, what: String| broken.entry(run.to_owned()).or_default().push(what);

    // What the log holds: every accepted run's events numbered 1..n, each once, exactly one
    // terminal event and it is the last; no events of a run nobody got a 202 for.
    let stored = stored_events(&fleet.nats).await;
    let mut logs: BTreeMap<String, Vec<(u64, Value)>> = BTreeMap::new();
    for (task, seq, event) in &stored {
        logs.entry(task.clone())
            .or_default()
            .push((*seq, event.clone()));
    }
    let tasks: HashMap<&str, &Accepted> = accepted
        .iter()
        .map(|run| (run.task_id.as_str(), run))
        .collect();
    assert_eq!(tasks.len(), accepted.len(), "two runs got one task id");
    for (task, log) in &logs {
        if !tasks.contains_key(task.as_str()) {
            report(
                task,
                format!("events of a task no 202 named: {}", summary(log)),
            );
        }
    }
    let empty = Vec::new();
    for run in &accepted {
        let log = logs.get(&run.task_id).unwrap_or(&empty);
        let seqs: Vec<u64> = log.iter().map(|(seq, _)| *seq).collect();
        if seqs != (1..=log.len() as u64).collect::<Vec<_>>() {
            report(
                &run.run_id,
                format!("stored events missing or repeated: {seqs:?}"),
            );
        }
        let terminals = log.iter().filter(|(_, event)| is_terminal(event)).count();
        if terminals != 1 || !log.last().is_some_and(|(_, event)| is_terminal(event)) {
            report(
                &run.run_id,
                format!(
                    "{terminals} terminal events, not one at the end: {}",
                    summary(log)
                ),
            );
        }
    }

    // What clients saw: the live stream (cut and resumed or not) and the same stream read again
    // from the start, each exactly the log: 1..n, one terminal event, the last.
    assert_eq!(followed.len(), accepted.len());
    let followed: HashMap<&str, &Followed> = followed
        .iter()
        .map(|(run_id, seen)| (run_id.as_str(), seen))
        .collect();
    let (mut events_checked, mut slowest) = (0, Duration::ZERO);
    for run in &accepted {
        let n = logs.get(&run.task_id).map_or(0, Vec::len) as u64;
        let live = followed[run.run_id.as_str()];
        match live.ended_at {
            Some(at) => slowest = slowest.max(at - run.at),
            None => report(
                &run.run_id,
                format!(
                    "the live stream never ended: it had {}, refused {:?}; the log holds {}",
                    summary(&live.events),
                    live.refused,
                    summary(logs.get(&run.task_id).unwrap_or(&empty))
                ),
            ),
        }
        let log = logs.get(&run.task_id).unwrap_or(&empty);
        if live.ids() != (1..=n).collect::<Vec<_>>()
            || summary(&live.events) != summary(&log[..live.events.len().min(log.len())])
        {
            report(
                &run.run_id,
                format!("the live stream had {}", summary(&live.events)),
            );
        }
        let response = http
            .get(format!(
                "{gateway}/api/v1/agent/runs/{}/events?compact=false",
                run.run_id
            ))
            .bearer_auth(&run.token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{}", run.run_id);
        let again = read_sse(response, None).await.unwrap();
        let ids: Vec<u64> = again
            .iter()
            .map(|frame| frame.id.as_deref().unwrap().parse().unwrap())
            .collect();
        let terminals = again
            .iter()
            .filter(|frame| is_terminal(&frame.data))
            .count();
        if ids != (1..=n).collect::<Vec<_>>() || terminals != 1 {
            report(
                &run.run_id,
                format!("read again: {ids:?} with {terminals} terminal events, the log 1..={n}"),
            );
        }
        events_checked += ids.len() + live.events.len();
    }

    // Every run that got a 202 ended as its stream said: completed, or (its worker cut off
    // with the node, the run given to another) failed as `worker_lost`.
    let lost_message = "the worker running this run stopped before it finished";
    let mut statuses: HashMap<&str, Value> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while statuses.len() < accepted.len() && Instant::now() < deadline {
        for run in &accepted {
            if statuses.contains_key(run.run_id.as_str()) {
                continue;
            }
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
                    statuses.insert(run.run_id.as_str(), body);
                }
            }
        }
        if statuses.len() < accepted.len() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let (mut completed, mut lost) = (0, 0);
    for run in &accepted {
        let log = logs.get(&run.task_id).unwrap_or(&empty);
        let (ended, _) = told(log);
        let Some(status) = statuses.get(run.run_id.as_str()) else {
            report(&run.run_id, "never finished".to_owned());
            continue;
        };
        match (status["status"].as_str(), ended.as_deref()) {
            (Some("completed"), Some("RUN_FINISHED")) => completed += 1,
            (Some("failed"), Some("RUN_ERROR")) if status["error"] == lost_message => lost += 1,
            _ => report(
                &run.run_id,
                format!("status {status}, while its stream ended with {ended:?}"),
            ),
        }
    }

    // In history exactly once: once history has applied every stored event of every run (its
    // own bookkeeping, read from its database), each conversation shows its user message once
    // and the reply its stream told once (a lost run's: the part it streamed, none if it
    // streamed none).
    let db = sqlx::PgPool::connect(&postgres.url).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let applied = loop {
        let applied: HashMap<String, i64> =
            sqlx::query_as("SELECT task_id::text, last_event_seq FROM history.run_progress")
                .fetch_all(&db)
                .await
                .map(|rows: Vec<(String, i64)>| rows.into_iter().collect())
                .unwrap_or_default();
        let behind = accepted.iter().any(|run| {
            let stored = logs.get(&run.task_id).map_or(0, Vec::len);
            applied.get(&run.task_id).copied().unwrap_or(0) < stored as i64
        });
        if !behind || Instant::now() >= deadline {
            break applied;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    db.close().await;
    for run in &accepted {
        let log = logs.get(&run.task_id).unwrap_or(&empty);
        let done = applied.get(&run.task_id).copied().unwrap_or(0);
        if done < log.len() as i64 {
            report(
                &run.run_id,
                format!("history applied {done} of its {} events", log.len()),
            );
        }
        let (_, reply) = told(log);
        let body = history(&http, &gateway, &run.token, &run.thread).await;
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let users = messages.iter().filter(|m| m["role"] == "user").count();
        let replies: Vec<&Value> = messages
            .iter()
            .filter(|m| m["role"] == "assistant")
            .collect();
        if users != 1
            || messages[0]["content"] != run.text.as_str()
            || replies.len() != usize::from(reply.is_some())
            || replies.first().map(|m| m["content"].as_str()) != reply.as_deref().map(Some)
        {
            report(
                &run.run_id,
                format!("history {body} while its stream told the reply {reply:?}"),
            );
        }
    }
    for (run, log) in accepted
        .iter()
        .filter_map(|run| Some((run, logs.get(&run.task_id)?)))
    {
        let (ended, reply) = told(log);
        if ended.as_deref() == Some("RUN_FINISHED")
            && reply.as_deref() != Some(format!("You said: {}", run.text).as_str())
        {
            report(&run.run_id, format!("completed with the reply {reply:?}"));
        }
    }

    eprintln!(
        "partition and database restart: {} runs accepted, {completed} completed, {lost} \
         worker_lost (worker cut off with the node), {} broken; {events_checked} streamed \
         events checked against {} stored; {moved} stream and consumer leaders moved to {} \
         before the cut (meta leader {meta:?}), clients cut off with it {cut_off:?}; partition \
         lasted {partition_lasted:.1?} (leaders elected without the node after \
         {elected_in:.1?}, the node caught up {rejoined_in:.1?} after the heal; {restarts} \
         replicas restarted beforehand to have runs, history and worker on it); PostgreSQL \
         down for {database_down:.1?} (history ready {ready_in:.1?} after the start); retries: {} run requests sent again ({} answered 503), {} \
         event streams reopened; slowest stream ended {slowest:.1?} after its 202",
        accepted.len(),
        broken.len(),
        stored.len(),
        fleet.nats.node_name(isolated),
        retries.posts.load(Ordering::Relaxed),
        retries.unavailable.load(Ordering::Relaxed),
        retries.reconnects.load(Ordering::Relaxed),
    );
    assert!(
        broken.is_empty(),
        "{} of {} runs broken:\n{}",
        broken.len(),
        accepted.len(),
        broken
            .iter()
            .map(|(run, what)| format!("{run}: {}", what.join("; ")))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
