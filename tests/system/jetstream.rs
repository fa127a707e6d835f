//! The streams and buckets follow configuration: created with the configured replicas and
//! limits, reconciled when a setting changes, and a full RUNS stream refuses new runs instead of
//! dropping accepted ones.

use std::time::Duration;

use async_nats::jetstream::{self, stream::DiscardPolicy};
use platform::nats::{NatsConfig, StreamLimits};
use switchboard_system_tests::{Options, TestPlatform, text_run};

async fn stream_config(js: &jetstream::Context, name: &str) -> jetstream::stream::Config {
    let mut stream = js.get_stream(name).await.unwrap();
    stream.info().await.unwrap().config.clone()
}

#[tokio::test]
async fn stream_and_bucket_limits_follow_configuration_and_are_reconciled_when_changed() {
    let platform = TestPlatform::spawn().await.unwrap();
    let mut config: NatsConfig = platform.infra.fresh_nats();
    let (_client, js) = platform::nats::connect(&config, "limits-test")
        .await
        .unwrap();
    config.limits = StreamLimits {
        runs_max_bytes: 1 << 20,
        events_max_bytes: 2 << 20,
        kv_max_bytes: 1 << 20,
        ..StreamLimits::default()
    };
    platform::nats::ensure_streams(&js, &config).await.unwrap();
    platform::lifecycle::ensure_run_buckets(&js, &config)
        .await
        .unwrap();
    let names = &config.names;
    let runs = stream_config(&js, &names.runs_stream()).await;
    assert_eq!(
        (
            runs.max_bytes,
            runs.discard,
            runs.num_replicas,
            runs.max_message_size
        ),
        (1 << 20, DiscardPolicy::New, 1, 1 << 20)
    );
    let events = stream_config(&js, &names.run_events_stream()).await;
    assert_eq!(
        (events.max_bytes, events.discard),
        (2 << 20, DiscardPolicy::Old)
    );
    // Changed settings are applied on the next start; nothing else is touched.
    config.limits.runs_max_bytes = 3 << 20;
    config.limits.runs_max_age = Duration::from_secs(3600);
    config.limits.runs_dedup_window = Duration::from_secs(600);
    config.limits.max_msg_size = 512 << 10;
    config.limits.kv_max_bytes = 4 << 20;
    platform::nats::ensure_streams(&js, &config).await.unwrap();
    platform::lifecycle::ensure_run_buckets(&js, &config)
        .await
        .unwrap();
    let runs = stream_config(&js, &names.runs_stream()).await;
    assert_eq!(
        (
            runs.max_bytes,
            runs.max_age,
            runs.max_message_size,
            runs.duplicate_window
        ),
        (
            3 << 20,
            Duration::from_secs(3600),
            512 << 10,
            Duration::from_secs(600)
        )
    );
    let bucket = stream_config(&js, &format!("KV_{}", names.prompts_bucket())).await;
    assert_eq!(
        (
            bucket.max_bytes,
            bucket.max_age,
            bucket.max_messages_per_subject
        ),
        (4 << 20, Duration::from_secs(3600), 1),
        "the KV bucket keeps its own settings (history 1)"
    );
    test_support::remove_nats_prefix(&platform.infra.nats_url, names)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_full_runs_stream_refuses_new_runs_and_keeps_the_accepted_ones() {
    let platform = TestPlatform::spawn().await.unwrap();
    let mut config: NatsConfig = platform.infra.fresh_nats();
    let (_client, js) = platform::nats::connect(&config, "full-test").await.unwrap();
    config.limits.runs_max_bytes = 8 << 10;
    platform::nats::ensure_streams(&js, &config).await.unwrap();
    let names = &config.names;
    let payload = vec![b'x'; 1024];
    let mut accepted = 0u64;
    let refused = loop {
        match js
            .publish(names.run_queue_subject(), payload.clone().into())
            .await
            .unwrap()
            .await
        {
            Ok(_) => accepted += 1,
            Err(err) => break err,
        }
        assert!(accepted < 100, "a full stream must refuse");
    };
    assert!(
        refused.to_string().contains("maximum bytes exceeded"),
        "{refused}"
    );
    let mut stream = js.get_stream(names.runs_stream()).await.unwrap();
    let info = stream.info().await.unwrap();
    assert_eq!(
        (info.state.messages, info.state.first_sequence),
        (accepted, 1),
        "nothing accepted was dropped"
    );
    test_support::remove_nats_prefix(&platform.infra.nats_url, names)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_full_status_bucket_drops_its_oldest_records_and_keeps_taking_new_runs() {
    use platform::nats::Created;
    use protocol::messaging::{RunStatus, RunStatusRecord, status_key};

    let platform = TestPlatform::spawn().await.unwrap();
    let mut config: NatsConfig = platform.infra.fresh_nats();
    let (_client, js) = platform::nats::connect(&config, "full-status-test")
        .await
        .unwrap();
    config.limits.kv_max_bytes = 16 << 10;
    let buckets = platform::lifecycle::ensure_run_buckets(&js, &config)
        .await
        .unwrap();
    let names = &config.names;
    let now = chrono::Utc::now();
    let runs = 200_u128; // ~300 bytes each: four times what the bucket holds
    let keys: Vec<String> = (0..runs)
        .map(|i| status_key("owner-full", &format!("run-{i}"), uuid::Uuid::from_u128(i)))
        .collect();
    for (i, key) in (0..runs).zip(&keys) {
        let record = RunStatusRecord {
            task_id: uuid::Uuid::from_u128(i),
            owner: "owner-full".to_owned(),
            thread_id: format!("thread-{i}"),
            run_id: format!("run-{i}"),
            status: RunStatus::Running,
            cancel_requested: false,
            created: now,
            updated_at: now,
            error: None,
            alive_at: Some(now),
            usage: Vec::new(),
            timings: None,
        };
        let created = buckets
            .run_status
            .create(key, &record)
            .await
            .unwrap_or_else(|err| panic!("the status of run {i} was refused: {err:#}"));
        assert!(
            matches!(created, Created::Created(_)),
            "run {i}: {created:?}"
        );
    }
    let newest = buckets
        .run_status
        .get::<RunStatusRecord>(&keys[keys.len() - 1])
        .await
        .unwrap();
    assert_eq!(newest.map(|(r, _)| r.run_id).as_deref(), Some("run-199"));
    let oldest = buckets
        .run_status
        .get::<RunStatusRecord>(&keys[0])
        .await
        .unwrap();
    assert!(oldest.is_none(), "the oldest record made room");
    let mut stream = js
        .get_stream(format!("KV_{}", names.run_status_bucket()))
        .await
        .unwrap();
    let info = stream.info().await.unwrap();
    assert_eq!(info.config.discard, DiscardPolicy::Old);
    assert!(
        info.state.bytes <= 16 << 10 && info.state.messages < 200,
        "{:?}",
        info.state
    );
    let locks = stream_config(&js, &format!("KV_{}", names.thread_locks_bucket())).await;
    assert_eq!(
        locks.discard,
        DiscardPolicy::Old,
        "every run takes a lock too"
    );
    // The buckets that hold what a run still needs refuse instead of forgetting.
    let prompts = stream_config(&js, &format!("KV_{}", names.prompts_bucket())).await;
    assert_eq!(prompts.discard, DiscardPolicy::New);
    test_support::remove_nats_prefix(&platform.infra.nats_url, names)
        .await
        .unwrap();
}

#[tokio::test]
async fn with_full_status_and_lock_buckets_new_runs_still_start_and_old_ones_are_answered() {
    // ~480 bytes a status record: 24 KiB holds about 50 runs' (the locks' bucket fills too).
    let kv_max_bytes = 24 << 10;
    let platform = TestPlatform::spawn_with(Options {
        kv_max_bytes: Some(kv_max_bytes),
        ..Options::default()
    })
    .await
    .unwrap();
    let api = platform.api();
    let alice = platform.infra.token("alice");
    let runs = 120;
    for batch in (0..runs).collect::<Vec<_>>().chunks(20) {
        for i in batch {
            let thread = uuid::Uuid::now_v7().to_string();
            let body = text_run(&thread, &format!("full-{i}"), "hello");
            let (status, answer) = api.post_run(&alice, &body).await.unwrap();
            assert_eq!(status, 202, "run {i}: {answer}");
        }
        for i in batch {
            api.wait_for_status(&alice, &format!("full-{i}"), "completed")
                .await
                .unwrap();
        }
    }
    let names = &platform.nats.names;
    let (_client, js) = platform::nats::connect(&platform.nats, "full-buckets-test")
        .await
        .unwrap();
    for bucket in [names.run_status_bucket(), names.thread_locks_bucket()] {
        let mut stream = js.get_stream(format!("KV_{bucket}")).await.unwrap();
        let state = stream.info().await.unwrap().state.clone();
        assert!(
            state.first_sequence > 1 && state.bytes <= kv_max_bytes as u64,
            "{bucket} was to drop its oldest records: {state:?}"
        );
    }
    // A released lock leaves a marker that expires (a minute), not one kept for a day.
    let mut locks = js
        .get_stream(format!("KV_{}", names.thread_locks_bucket()))
        .await
        .unwrap();
    let last = locks.info().await.unwrap().state.last_sequence;
    let marker = locks.get_raw_message(last).await.unwrap();
    let header = |name: &str| {
        marker
            .headers
            .get(name)
            .map(|value| value.as_str().to_owned())
    };
    assert_eq!(
        (header("KV-Operation"), header("Nats-TTL")),
        (Some("PURGE".to_owned()), Some("60".to_owned())),
        "{:?}",
        marker.headers
    );
    // The first run's status record is gone; history still answers for it.
    let first = api
        .wait_for_status(&alice, "full-0", "completed")
        .await
        .unwrap();
    assert_eq!(first["runId"], "full-0", "{first}");
}

#[tokio::test]
async fn a_purged_key_leaves_a_marker_that_expires_with_its_subject() {
    let platform = TestPlatform::spawn().await.unwrap();
    let config: NatsConfig = platform.infra.fresh_nats();
    let (_client, js) = platform::nats::connect(&config, "purge-ttl-test")
        .await
        .unwrap();
    let buckets = platform::lifecycle::ensure_run_buckets(&js, &config)
        .await
        .unwrap();
    let names = &config.names;
    let revision = buckets
        .thread_locks
        .put("t.purged", &serde_json::json!({"held": true}))
        .await
        .unwrap();
    buckets
        .thread_locks
        .purge_at("t.purged", revision, Duration::from_secs(1))
        .await
        .unwrap();
    let bucket = format!("KV_{}", names.thread_locks_bucket());
    let mut stream = js.get_stream(&bucket).await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 1, "the marker");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let state = stream.info().await.unwrap().state.clone();
        if state.messages == 0 && state.subjects_count == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the marker never expired: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    test_support::remove_nats_prefix(&platform.infra.nats_url, names)
        .await
        .unwrap();
}

/// Runs accepted at the same moment are sent to NATS together (`platform::publish_batch`), yet
/// each request gets its own answer: a new run its own sequence, a repeat of a run (in the same
/// batch or a later one) the original's, and the stream holds each run once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_published_together_each_get_their_own_answer_and_repeats_are_recognised() {
    use platform::nats::Published;

    let infra = test_support::Infra::from_env();
    let config: NatsConfig = infra.fresh_nats();
    let (_client, js) = platform::nats::connect(&config, "batch-test")
        .await
        .unwrap();
    platform::nats::ensure_streams(&js, &config).await.unwrap();
    let batcher = platform::publish_batch::Batcher::start(js.clone());
    let names = config.names.clone();
    // 300 requests at once for 200 runs: runs 0..100 are each sent twice.
    let mut requests = tokio::task::JoinSet::new();
    for n in 0..300_usize {
        let run = n % 200;
        let input =
            serde_json::from_value(text_run("batch-thread", &format!("run-{run}"), "hi")).unwrap();
        let task = protocol::messaging::RunTaskV1 {
            task_id: uuid::Uuid::now_v7(),
            owner: "batch-owner".to_owned(),
            accepted_at: chrono::Utc::now(),
            input,
            attachments: Vec::new(),
            conversation: false,
            resumed: None,
            trace_id: None,
            agent: None,
        };
        let (batcher, names) = (batcher.clone(), names.clone());
        requests.spawn(async move {
            let payload = platform::nats::run_payload(&task).unwrap();
            let published = platform::nats::publish_run_batched(&batcher, &names, &task, payload)
                .await
                .unwrap();
            (run, published)
        });
    }
    let mut answers = std::collections::BTreeMap::<usize, Vec<Published>>::new();
    while let Some(answer) = requests.join_next().await {
        let (run, published) = answer.unwrap();
        answers.entry(run).or_default().push(published);
    }
    let mut sequences = std::collections::BTreeSet::new();
    for (run, published) in &answers {
        let new: Vec<u64> = published
            .iter()
            .filter_map(|p| match p {
                Published::New(seq) => Some(*seq),
                Published::Duplicate(_) => None,
            })
            .collect();
        assert_eq!(new.len(), 1, "run-{run} stored once: {published:?}");
        for p in published {
            if let Published::Duplicate(seq) = p {
                assert_eq!(*seq, new[0], "run-{run}'s repeat names the original");
            }
        }
        assert_eq!(published.len(), if *run < 100 { 2 } else { 1 });
        assert!(
            sequences.insert(new[0]),
            "run-{run} has a sequence of its own"
        );
    }
    assert_eq!(sequences.len(), 200);
    let mut stream = js.get_stream(names.runs_stream()).await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 200);
    test_support::remove_nats_prefix(&infra.nats_url, &names)
        .await
        .unwrap();
}

/// What a compare-and-set loop reads after a lost round (`JsonKv::get_latest`, through the
/// bucket's leader) is what `get` reads on a current replica: the last value and its revision,
/// nothing once the key is deleted, and a revision an update at it wins with.
#[tokio::test]
async fn a_read_from_the_leader_gives_the_last_value_and_a_revision_that_wins() {
    let infra = test_support::Infra::from_env();
    let config: NatsConfig = infra.fresh_nats();
    let (_client, js) = platform::nats::connect(&config, "leader-read-test")
        .await
        .unwrap();
    let buckets = platform::lifecycle::ensure_run_buckets(&js, &config)
        .await
        .unwrap();
    let kv = &buckets.owner_budgets;
    assert_eq!(kv.get_latest::<u64>("k.absent").await.unwrap(), None);
    kv.put("k.one", &1_u64).await.unwrap();
    let second = kv.put("k.one", &2_u64).await.unwrap();
    kv.put("k.other", &7_u64).await.unwrap();
    let latest = kv.get_latest::<u64>("k.one").await.unwrap();
    assert_eq!(latest, Some((2, second)));
    assert_eq!(latest, kv.get::<u64>("k.one").await.unwrap());
    assert_eq!(
        kv.get_for_round::<u64>("k.one", 1).await.unwrap(),
        latest,
        "a later round reads from the leader"
    );
    assert!(kv.update("k.one", &3_u64, second).await.unwrap().is_some());
    assert_eq!(
        kv.update("k.one", &4_u64, second).await.unwrap(),
        None,
        "a revision that moved on loses"
    );
    kv.delete("k.one").await.unwrap();
    assert_eq!(kv.get_latest::<u64>("k.one").await.unwrap(), None);
    test_support::remove_nats_prefix(&infra.nats_url, &config.names)
        .await
        .unwrap();
}
