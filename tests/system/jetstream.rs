//! The streams and buckets follow configuration: created with the configured replicas and
//! limits, reconciled when a setting changes, and a full RUNS stream refuses new runs instead of
//! dropping accepted ones.

use std::time::Duration;

use async_nats::jetstream::{self, stream::DiscardPolicy};
use platform::nats::{NatsConfig, StreamLimits};
use switchboard_system_tests::TestPlatform;

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
    platform::nats::ensure_run_buckets(&js, &config)
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
    platform::nats::ensure_run_buckets(&js, &config)
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
