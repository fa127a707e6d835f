//! NATS and JetStream: connection, the streams every service relies on, and trace headers.

use std::time::Duration;

use anyhow::Context as _;
use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream};
use opentelemetry::propagation::{Extractor, Injector};
use protocol::messaging::{MSG_ID_HEADER, Names};

use crate::http::Probe;

/// NATS settings.
#[derive(Debug, Clone)]
pub struct NatsConfig {
    /// Server URL, or several comma-separated (the nodes of a cluster).
    pub url: String,
    /// Stream and subject names of this deployment.
    pub names: Names,
    /// Replicas and limits of the streams and buckets.
    pub limits: StreamLimits,
    /// The service's NATS user and TLS settings.
    pub credentials: crate::nats_auth::NatsCredentials,
}

impl NatsConfig {
    /// Whether the streams and buckets are the NATS admin's to create and reconcile
    /// ([`setup`], `<service> nats-setup`): so for a service that connects as its own user,
    /// whose permissions ([`crate::nats_auth`]) let it use them but not create, change or delete
    /// them. A service without a user (local development) creates them itself.
    pub fn provisioned(&self) -> bool {
        self.credentials.user.is_some() || self.credentials.creds_file.is_some()
    }
}

/// Replication and size limits of the JetStream streams and KV buckets, from configuration
/// (`SB_NATS_*`), applied when they are created and reconciled on every start (a changed
/// setting updates the stream; nothing else of its configuration is touched).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamLimits {
    /// Replicas of every stream and bucket (`SB_NATS_REPLICAS`; 1 locally, 3 on a cluster).
    pub replicas: usize,
    /// How long accepted runs are kept (`SB_NATS_RUNS_MAX_AGE_SECS`, 7 days): a worker backlog
    /// may be this old before runs expire unrun; status lookups read a run's task from here.
    pub runs_max_age: Duration,
    /// The RUNS stream's duplicate window (`SB_NATS_RUNS_DEDUP_WINDOW_SECS`, 1 hour): how long
    /// a retried run is recognised by its message id. The broker keeps ~300 bytes per run
    /// accepted within the window (BENCHMARKS.md section 9), so memory follows the rate of new
    /// runs times this window, not the number of runs kept.
    pub runs_dedup_window: Duration,
    /// Most bytes of accepted runs (`SB_NATS_RUNS_MAX_BYTES`, 8 GiB). Full: new runs are
    /// refused (503), accepted ones are never dropped.
    pub runs_max_bytes: i64,
    /// How long run events are kept for replay and resume (`SB_NATS_EVENTS_MAX_AGE_SECS`, 1 day).
    pub events_max_age: Duration,
    /// Most bytes of run events (`SB_NATS_EVENTS_MAX_BYTES`, 8 GiB). Full: the oldest go first
    /// (a cursor into them then gets 410).
    pub events_max_bytes: i64,
    /// Most bytes of each KV bucket (`SB_NATS_KV_MAX_BYTES`, 1 GiB).
    pub kv_max_bytes: i64,
    /// Largest message (`SB_NATS_MAX_MSG_SIZE`, 1 MiB; a run's task is at most ~260 KiB).
    pub max_msg_size: i32,
}

impl Default for StreamLimits {
    fn default() -> Self {
        Self {
            replicas: 1,
            runs_max_age: Duration::from_secs(7 * 24 * 3600),
            runs_dedup_window: Duration::from_secs(3600),
            runs_max_bytes: 8 << 30,
            events_max_age: Duration::from_secs(24 * 3600),
            events_max_bytes: 8 << 30,
            kv_max_bytes: 1 << 30,
            max_msg_size: 1 << 20,
        }
    }
}
/// Window in which the RUN_EVENTS stream drops a message whose `Nats-Msg-Id` it has already
/// stored (retried event publishes).
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// How often a client pings its server. A client gives its connection up after three pings
/// without an answer (async-nats), so a node cut off by the network is left for another of the
/// cluster's within about 15 s (the library's 60 s default left a runs replica on a cut-off
/// node refusing runs for three minutes).
const PING_INTERVAL: Duration = Duration::from_secs(5);

/// Connects to NATS and returns the client and its JetStream context.
/// Counts this process's NATS reconnections (every client's): what was published on core NATS
/// while a client was cut off never reaches it, so a reader that waits for live messages reads
/// the stream again when this changes.
static RECONNECTIONS: std::sync::LazyLock<tokio::sync::watch::Sender<u64>> =
    std::sync::LazyLock::new(|| tokio::sync::watch::Sender::new(0));

/// Changes each time one of this process's NATS clients connects again after losing its
/// connection.
pub fn reconnections() -> tokio::sync::watch::Receiver<u64> {
    RECONNECTIONS.subscribe()
}

pub async fn connect(
    config: &NatsConfig,
    name: &str,
) -> anyhow::Result<(async_nats::Client, jetstream::Context)> {
    // TLS needs a process-wide crypto provider; the tree enables two, so rustls cannot pick one
    // (a TLS connection would panic). Installed once; an error means one is there already.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let credentials = &config.credentials;
    let mut options = async_nats::ConnectOptions::new()
        .name(name)
        .custom_inbox_prefix(crate::nats_auth::inbox_prefix(name))
        .retry_on_initial_connect()
        .connection_timeout(Duration::from_secs(5))
        .ping_interval(PING_INTERVAL)
        .event_callback(|event| async move {
            match event {
                async_nats::Event::Connected => {
                    RECONNECTIONS.send_modify(|n| *n += 1);
                    tracing::info!("NATS connected again");
                }
                async_nats::Event::Disconnected => tracing::warn!("NATS connection lost"),
                _ => {}
            }
        });
    if let Some(path) = &credentials.creds_file {
        options = options
            .credentials_file(path)
            .await
            .with_context(|| format!("cannot read the NATS credentials {}", path.display()))?;
    } else if let Some(user) = &credentials.user {
        let password = credentials
            .password
            .as_ref()
            .map(|p| secrecy::ExposeSecret::expose_secret(p).to_owned())
            .unwrap_or_default();
        options = options.user_and_password(user.clone(), password);
    }
    if let Some(ca) = &credentials.tls_ca_file {
        options = options.add_root_certificates(ca.clone());
    }
    if let Some((cert, key)) = &credentials.tls_client {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    // `SB_NATS_URL` may name every node of a cluster: "nats://a:4222,nats://b:4222".
    let servers: Vec<&str> = config.url.split(',').map(str::trim).collect();
    let client = options
        .require_tls(credentials.tls_required)
        .connect(servers)
        .await
        .with_context(|| {
            format!(
                "cannot connect to NATS at {}",
                without_userinfo(&config.url)
            )
        })?;
    let js = jetstream::new(client.clone());
    Ok((client, js))
}

/// `url` (a comma-separated list of servers) with any `user:password@` taken out, for messages.
fn without_userinfo(url: &str) -> String {
    url.split(',')
        .map(|server| {
            let server = server.trim();
            match (server.find("://"), server.rfind('@')) {
                (Some(scheme), Some(at)) if at > scheme => {
                    format!("{}://{}", &server[..scheme], &server[at + 1..])
                }
                (None, Some(at)) => server[at + 1..].to_owned(),
                _ => server.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Makes sure the RUNS and RUN_EVENTS streams are there: a service that creates its own
/// (not [`NatsConfig::provisioned`]) creates them or brings their limits and replicas in line
/// with `config.limits`; a provisioned one waits for them (the admin's [`setup`] may run beside
/// it) and changes nothing. Safe to call from every replica.
pub async fn ensure_streams(js: &jetstream::Context, config: &NatsConfig) -> anyhow::Result<()> {
    if !config.provisioned() {
        return Box::pin(reconcile_streams(js, config)).await;
    }
    for name in [config.names.runs_stream(), config.names.run_events_stream()] {
        settled(&name, || async {
            js.get_stream(&name).await.map(drop).with_context(|| {
                format!("stream {name} is not there: the NATS admin creates it (`nats-setup`)")
            })
        })
        .await?;
    }
    Ok(())
}

/// What a deployment's NATS admin runs before the services start (`<service> nats-setup`, a
/// Job in `deploy/k8s/migrate`): creates the streams and buckets of `config`, or reconciles
/// their limits and replicas. The services' own users may not (`crate::nats_auth`).
pub async fn setup(js: &jetstream::Context, config: &NatsConfig) -> anyhow::Result<()> {
    reconcile_streams(js, config).await?;
    crate::lifecycle::open_run_buckets(js, config, true).await?;
    Ok(())
}

/// Creates the RUNS and RUN_EVENTS streams, or brings their limits and replicas in line with
/// `config.limits`.
async fn reconcile_streams(js: &jetstream::Context, config: &NatsConfig) -> anyhow::Result<()> {
    let (names, limits) = (&config.names, &config.limits);
    // JetStream refuses a duplicate window longer than the stream's max age.
    let runs_window = limits.runs_dedup_window.min(limits.runs_max_age);
    // Live readers hear an event once the log stored it, never before or instead.
    let live = stream::Republish {
        source: names.run_events_subjects(),
        destination: names.run_events_live_subjects(),
        headers_only: false,
    };
    let streams = [
        (
            names.runs_stream(),
            names.runs_subjects(),
            limits.runs_max_age,
            limits.runs_max_bytes,
            stream::DiscardPolicy::New,
            runs_window,
            None,
        ),
        (
            names.run_events_stream(),
            names.run_events_subjects(),
            limits.events_max_age,
            limits.events_max_bytes,
            stream::DiscardPolicy::Old,
            DUPLICATE_WINDOW.min(limits.events_max_age),
            Some(live),
        ),
    ];
    for (name, subjects, max_age, max_bytes, discard, duplicate_window, republish) in streams {
        let wanted = stream::Config {
            name: name.clone(),
            subjects: vec![subjects],
            retention: stream::RetentionPolicy::Limits,
            storage: stream::StorageType::File,
            max_age,
            max_bytes,
            max_message_size: limits.max_msg_size,
            num_replicas: limits.replicas,
            discard,
            duplicate_window,
            republish,
            ..Default::default()
        };
        settled(&name, || reconcile(js, wanted.clone()))
            .await
            .with_context(|| format!("cannot create or update stream {name}"))?;
    }
    Ok(())
}

/// How long a start waits for a cluster to settle before creating or updating its streams.
const SETTLE_FOR: Duration = Duration::from_secs(30);

/// Runs `attempt` until it succeeds, for at most [`SETTLE_FOR`] (0.2 s doubling to 2 s
/// between tries): right after a cluster (re)starts, a stream can be refused for a while
/// ("no suitable peers for placement, peer offline", no meta leader yet), which is not a reason
/// for a replica to crash. The last error is returned.
pub async fn settled<T, F, Fut>(what: &str, attempt: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    retrying(what, SETTLE_FOR, Duration::from_millis(200), attempt).await
}

/// Runs `attempt` until it succeeds or `budget` is spent, waiting `first` after the first
/// failure and twice as long after each next one (at most 2 s), logging each failure.
async fn retrying<T, F, Fut>(
    what: &str,
    budget: Duration,
    first: Duration,
    mut attempt: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let deadline = tokio::time::Instant::now() + budget;
    let mut wait = first;
    loop {
        match attempt().await {
            Ok(value) => return Ok(value),
            // Another writer's message: retrying cannot change that.
            Err(err) if err.is::<Fenced>() => return Err(err),
            Err(err) if tokio::time::Instant::now() + wait < deadline => {
                tracing::warn!(what, error = format!("{err:#}"), "NATS refused, retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(2));
            }
            Err(err) => return Err(err),
        }
    }
}

/// Creates the stream `wanted`, or updates the fields this code owns (limits, replicas,
/// discard, subjects, republish) of the existing one when they differ.
async fn reconcile(js: &jetstream::Context, wanted: stream::Config) -> anyhow::Result<()> {
    let mut existing = match js.get_stream(&wanted.name).await {
        Ok(existing) => existing,
        Err(_) => {
            js.create_stream(wanted).await?;
            return Ok(());
        }
    };
    let name = wanted.name.clone();
    let changed = update_settings(js, &mut existing, |config| {
        config.subjects = wanted.subjects;
        config.max_age = wanted.max_age;
        config.max_bytes = wanted.max_bytes;
        config.max_message_size = wanted.max_message_size;
        config.num_replicas = wanted.num_replicas;
        config.discard = wanted.discard;
        config.duplicate_window = wanted.duplicate_window;
        config.republish = wanted.republish;
    })
    .await?;
    if changed {
        tracing::info!(stream = %name, "stream settings changed; updated");
    }
    Ok(())
}

/// Applies `change` to the settings of `stream` and updates the stream when that changes them;
/// `true` if it did.
async fn update_settings(
    js: &jetstream::Context,
    stream: &mut stream::Stream,
    change: impl FnOnce(&mut stream::Config),
) -> anyhow::Result<bool> {
    let current = stream.info().await?.config.clone();
    let mut updated = current.clone();
    change(&mut updated);
    if updated == current {
        return Ok(false);
    }
    js.update_stream(updated).await?;
    Ok(true)
}

/// Headers for a JetStream publish: the de-duplication id and the current trace context.
pub fn publish_headers(msg_id: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(MSG_ID_HEADER, msg_id);
    crate::telemetry::inject_current(&mut HeaderInjector(&mut headers));
    headers
}

/// Writes trace context into NATS headers.
pub struct HeaderInjector<'a>(pub &'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key, value.as_str());
    }
}

/// Reads trace context from NATS headers.
pub struct HeaderExtractor<'a>(pub &'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|v| v.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(k, _)| k.as_ref()).collect()
    }
}

/// Readiness probe: the server answers and JetStream is enabled.
pub fn probe(js: jetstream::Context) -> Probe {
    std::sync::Arc::new(move || {
        let js = js.clone();
        Box::pin(async move {
            js.query_account()
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    })
}

/// Whether `err` (or what caused it) is JetStream refusing a write for its expected last
/// sequence: another writer got there first.
fn lost_a_write_race(err: &(dyn std::error::Error + 'static)) -> bool {
    use jetstream::ErrorCode;
    let mut cause = Some(err);
    while let Some(err) = cause {
        if let Some(js) = err.downcast_ref::<jetstream::Error>()
            && matches!(
                js.error_code(),
                ErrorCode::STREAM_WRONG_LAST_SEQUENCE
                    | ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT
            )
        {
            return true;
        }
        cause = err.source();
    }
    // The client keeps some JetStream refusals only as text.
    let text = format!("{err:#}");
    text.contains("error code 10071") || text.contains("error code 10164")
}

/// Opens `bucket`: creates or reconciles it when `reconcile`, else waits for the NATS admin's.
pub(crate) async fn open_or_wait(
    js: &jetstream::Context,
    config: &NatsConfig,
    reconcile: bool,
    bucket: String,
    max_age: Duration,
    full: stream::DiscardPolicy,
) -> anyhow::Result<JsonKv> {
    settled(&bucket.clone(), || async {
        if reconcile {
            open_bucket(js, &config.limits, bucket.clone(), max_age, full).await
        } else {
            let store = js.get_key_value(&bucket).await.with_context(|| {
                format!("bucket {bucket} is not there: the NATS admin creates it (`nats-setup`)")
            })?;
            Ok(JsonKv { store })
        }
    })
    .await
}

/// Opens the bucket or creates it, then reconciles its replicas, limits and what it does when
/// full (`full`). Every bucket allows per-message TTLs (nats-server 2.11), which
/// [`JsonKv::purge_at`] uses.
async fn open_bucket(
    js: &jetstream::Context,
    limits: &StreamLimits,
    bucket: String,
    max_age: Duration,
    full: stream::DiscardPolicy,
) -> anyhow::Result<JsonKv> {
    let (store, created) = match js.get_key_value(&bucket).await {
        Ok(store) => (store, false),
        Err(_) => (
            js.create_key_value(jetstream::kv::Config {
                bucket: bucket.clone(),
                history: 1,
                max_age,
                max_bytes: limits.kv_max_bytes,
                num_replicas: limits.replicas,
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await
            .with_context(|| format!("cannot create KV bucket {bucket}"))?,
            true,
        ),
    };
    // A KV bucket is the stream `KV_<bucket>`: its limits reconcile like a stream's, a new
    // bucket's too (the KV API always creates it refusing writes when full).
    let mut stream = js.get_stream(format!("KV_{bucket}")).await?;
    let changed = update_settings(js, &mut stream, |config| {
        config.num_replicas = limits.replicas;
        config.max_bytes = limits.kv_max_bytes;
        config.max_age = max_age;
        config.discard = full;
        config.allow_message_ttl = true;
        // A key that ages out of a short-lived bucket (the agent cards) leaves a marker, so
        // watchers learn it is gone; the marker itself goes after as long again.
        config.subject_delete_marker_ttl =
            (!max_age.is_zero() && max_age <= crate::lifecycle::AGENT_CARD_TTL).then_some(max_age);
    })
    .await?;
    if changed && !created {
        tracing::info!(bucket = %bucket, "bucket settings changed; updated");
    }
    Ok(JsonKv { store })
}

/// How long the marker of an erased key ([`JsonKv::erase`]) stays: long enough for every
/// watcher to hear of it.
pub const ERASED_MARKER_TTL: Duration = Duration::from_secs(60);

/// How long [`publish_idempotent`] keeps retrying: longer than a stream leader election after
/// a node loss (a few seconds), well inside the streams' 2-minute duplicate window.
pub const PUBLISH_RETRY_FOR: Duration = Duration::from_secs(30);

/// Publishes a message that carries a `Nats-Msg-Id` and waits for JetStream's ack, retrying
/// (0.1 s doubling to 2 s, for [`PUBLISH_RETRY_FOR`]) when there is no ack: a reconnect to
/// another node or a leader election. The id makes a retry of a message that was stored after
/// all a duplicate JetStream drops, so the message is stored exactly once.
pub async fn publish_idempotent(
    js: &jetstream::Context,
    subject: &str,
    headers: HeaderMap,
    payload: bytes::Bytes,
) -> anyhow::Result<()> {
    let publish = || async {
        js.publish_with_headers(subject.to_owned(), headers.clone(), payload.clone())
            .await?
            .await?;
        anyhow::Ok(())
    };
    retrying(
        subject,
        PUBLISH_RETRY_FOR,
        Duration::from_millis(100),
        publish,
    )
    .await
    .context("JetStream did not acknowledge the publish")
}

/// A fenced publish was refused: another writer stored a message on the subject after this
/// writer's last one (a worker that lost NATS for a while, whose run another worker ended).
#[derive(Debug, thiserror::Error)]
#[error("another writer stored a message on {subject} after this writer's last one")]
pub struct Fenced {
    /// The subject.
    pub subject: String,
}

/// Publishes the next message of a subject that one writer owns (a run's event log) and waits
/// for JetStream's ack: stored only if the subject's last message is still the one at stream
/// sequence `after` (this writer's previous message; 0: none yet,
/// `Nats-Expected-Last-Subject-Sequence`), with `msg_id` (unique to this writer) so that a retry
/// of a publish that was stored after all is dropped as a duplicate. Retried like
/// [`publish_idempotent`]; another writer's message in between fails it at once with
/// [`Fenced`]. Returns the message's stream sequence.
pub async fn publish_fenced(
    js: &jetstream::Context,
    stream: &str,
    subject: &str,
    msg_id: &str,
    after: u64,
    payload: bytes::Bytes,
) -> anyhow::Result<u64> {
    let mut headers = publish_headers(msg_id);
    headers.insert(
        async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
        after.to_string().as_str(),
    );
    let publish = || async {
        let ack = js
            .publish_with_headers(subject.to_owned(), headers.clone(), payload.clone())
            .await?
            .await;
        match ack {
            Ok(ack) => Ok(ack.sequence),
            Err(err) if err.kind() == jetstream::context::PublishErrorKind::WrongLastSequence => {
                // An earlier try of this very publish may have been stored (its ack lost to a
                // node's death) and a new stream leader may not answer the retry as a
                // duplicate: the subject's last message is then this one.
                match stored_last(js, stream, subject, msg_id).await? {
                    Some(sequence) => Ok(sequence),
                    None => Err(Fenced {
                        subject: subject.to_owned(),
                    }
                    .into()),
                }
            }
            Err(err) => Err(err.into()),
        }
    };
    retrying(
        subject,
        PUBLISH_RETRY_FOR,
        Duration::from_millis(100),
        publish,
    )
    .await
}

/// The stream sequence of `subject`'s last message in `stream` if that message has `msg_id`.
async fn stored_last(
    js: &jetstream::Context,
    stream: &str,
    subject: &str,
    msg_id: &str,
) -> anyhow::Result<Option<u64>> {
    let last = js
        .get_stream(stream)
        .await?
        .get_last_raw_message_by_subject(subject)
        .await;
    match last {
        Ok(message) => Ok(message
            .headers
            .get(MSG_ID_HEADER)
            .is_some_and(|id| id.as_str() == msg_id)
            .then_some(message.sequence)),
        Err(err) if err.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(err) => Err(err.into()),
    }
}

/// `RunTask::V1` of a borrowed task: the same JSON, without copying the task to publish it.
#[derive(serde::Serialize)]
#[serde(tag = "v")]
enum RunTaskRef<'a> {
    #[serde(rename = "1")]
    V1(&'a protocol::messaging::RunTaskV1),
}

/// What [`publish_run`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// The run is new and stored at this RUNS sequence.
    New(u64),
    /// A run with the same `(owner, threadId, runId)` was stored within the duplicate window, at
    /// this sequence; nothing was written.
    Duplicate(u64),
}

/// Publishes `task` on the RUNS queue subject with its run key as message id and waits for
/// JetStream's ack. JetStream stores one message per run key within the stream's duplicate
/// window, atomically (any number of concurrent publishes of one run store one message) and
/// answers a duplicate with the original's sequence, so the caller can read it back
/// ([`task_at`]).
pub async fn publish_run(
    js: &jetstream::Context,
    names: &Names,
    task: &protocol::messaging::RunTaskV1,
) -> anyhow::Result<Published> {
    publish_run_payload(js, names, task, run_payload(task)?).await
}

/// The payload [`publish_run`] publishes for `task` (what it costs the RUNS stream).
pub fn run_payload(task: &protocol::messaging::RunTaskV1) -> anyhow::Result<Vec<u8>> {
    Ok(serde_json::to_vec(&RunTaskRef::V1(task))?)
}

/// [`publish_run`] with the payload made by [`run_payload`].
pub async fn publish_run_payload(
    js: &jetstream::Context,
    names: &Names,
    task: &protocol::messaging::RunTaskV1,
    payload: Vec<u8>,
) -> anyhow::Result<Published> {
    let ack = js
        .publish_with_headers(names.run_queue_subject(), run_headers(task), payload.into())
        .await?
        .await?;
    Ok(Published::from(&ack))
}

/// The headers of `task`'s message: its run key as message id (what JetStream deduplicates on)
/// and the trace context.
fn run_headers(task: &protocol::messaging::RunTaskV1) -> HeaderMap {
    publish_headers(&protocol::messaging::run_key(
        &task.owner,
        &task.input.thread_id,
        &task.input.run_id,
    ))
}

/// [`publish_run_payload`] through a [`crate::publish_batch::Batcher`]: sent to NATS together
/// with the other publishes that reach it at the same time.
pub async fn publish_run_batched(
    batcher: &crate::publish_batch::Batcher,
    names: &Names,
    task: &protocol::messaging::RunTaskV1,
    payload: Vec<u8>,
) -> anyhow::Result<Published> {
    let ack = batcher
        .publish(
            names.run_queue_subject().into(),
            run_headers(task),
            payload.into(),
        )
        .await?;
    Ok(Published::from(&ack))
}

impl From<&jetstream::publish::PublishAck> for Published {
    fn from(ack: &jetstream::publish::PublishAck) -> Self {
        if ack.duplicate {
            Self::Duplicate(ack.sequence)
        } else {
            Self::New(ack.sequence)
        }
    }
}

/// The task stored at `seq` of the RUNS stream; `None` if it is no longer there (expired).
pub async fn task_at(
    runs: &stream::Stream,
    seq: u64,
) -> anyhow::Result<Option<protocol::messaging::RunTaskV1>> {
    use protocol::messaging::RunTask;
    use stream::RawMessageErrorKind;
    match runs.get_raw_message(seq).await {
        Ok(message) => {
            let RunTask::V1(task) = serde_json::from_slice(&message.payload)?;
            Ok(Some(task))
        }
        Err(err) if err.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
        Err(err) => Err(err.into()),
    }
}

/// A KV bucket of JSON values with compare-and-set helpers.
#[derive(Clone)]
pub struct JsonKv {
    store: jetstream::kv::Store,
}

/// The outcome of [`JsonKv::create`].
#[derive(Debug, PartialEq, Eq)]
pub enum Created {
    /// The key did not exist and now holds the value, at this revision.
    Created(u64),
    /// The key already exists; nothing was written.
    Exists,
}

impl JsonKv {
    /// The value under `key` and its revision, if the key exists.
    pub async fn get<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
    ) -> anyhow::Result<Option<(T, u64)>> {
        use jetstream::kv::Operation;
        match self.store.entry(key).await? {
            Some(entry) if entry.operation == Operation::Put => {
                let value = serde_json::from_slice(&entry.value).with_context(|| {
                    format!("KV value under {key} is not what this version expects")
                })?;
                Ok(Some((value, entry.revision)))
            }
            _ => Ok(None),
        }
    }

    /// Writes `value` under `key` only if the key does not exist (atomic).
    pub async fn create<T: serde::Serialize>(
        &self,
        key: &str,
        value: &T,
    ) -> anyhow::Result<Created> {
        use jetstream::kv::CreateErrorKind;
        match self
            .store
            .create(key, serde_json::to_vec(value)?.into())
            .await
        {
            Ok(revision) => Ok(Created::Created(revision)),
            Err(err) if err.kind() == CreateErrorKind::AlreadyExists => Ok(Created::Exists),
            // Two replicas creating one key at once on a cluster: the loser's write is refused
            // for its expected sequence (10164 on nats-server 2.11, which the client does not
            // take for "exists"), and the read that follows may not see the winner's yet.
            Err(err) if lost_a_write_race(&err) => Ok(Created::Exists),
            Err(err) => Err(err.into()),
        }
    }

    /// Writes `value` under `key` unconditionally.
    pub async fn put<T: serde::Serialize>(&self, key: &str, value: &T) -> anyhow::Result<u64> {
        Ok(self
            .store
            .put(key, serde_json::to_vec(value)?.into())
            .await?)
    }

    /// Writes `value` under `key` if its revision is still `revision`; `None` if it moved on.
    pub async fn update<T: serde::Serialize>(
        &self,
        key: &str,
        value: &T,
        revision: u64,
    ) -> anyhow::Result<Option<u64>> {
        use jetstream::kv::UpdateErrorKind;
        match self
            .store
            .update(key, serde_json::to_vec(value)?.into(), revision)
            .await
        {
            Ok(revision) => Ok(Some(revision)),
            Err(err) if err.kind() == UpdateErrorKind::WrongLastRevision => Ok(None),
            // The same on a cluster, said differently (see `lost_a_write_race`).
            Err(err) if lost_a_write_race(&err) => Ok(None),
            Err(err) => Err(err.into()),
        }
    }

    /// Read-modify-write under compare-and-set, retried until it wins. `change` returns `None`
    /// to leave the value as it is. Returns the value finally stored, `None` if the key is absent.
    pub async fn modify<T, F>(&self, key: &str, mut change: F) -> anyhow::Result<Option<T>>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
        F: FnMut(&T) -> Option<T>,
    {
        let mut read = self.get::<T>(key).await?;
        loop {
            let Some((current, revision)) = read else {
                return Ok(None);
            };
            let Some(next) = change(&current) else {
                return Ok(Some(current));
            };
            if self.update(key, &next, revision).await?.is_some() {
                return Ok(Some(next));
            }
            read = self.get_latest::<T>(key).await?;
        }
    }

    /// The value most recently written under any key matching `pattern` (one `*` token), if
    /// the latest write there is a value (not a delete).
    pub async fn last_matching<T: serde::de::DeserializeOwned>(
        &self,
        pattern: &str,
    ) -> anyhow::Result<Option<T>> {
        Ok(self.leader_read(pattern).await?.map(|(value, _)| value))
    }

    /// [`JsonKv::get`] answered by the bucket's leader, so never behind the last write. `get`
    /// is a direct get, which any replica may answer: one that lags (a node restarted and
    /// catching up) answers an old revision, and a compare-and-set loop fed only from it loses
    /// every round. Each loop here reads with `get` first and with this after a lost round.
    pub async fn get_latest<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
    ) -> anyhow::Result<Option<(T, u64)>> {
        self.leader_read(key).await
    }

    /// What a compare-and-set loop reads on its round `round` (from 0): [`JsonKv::get`] first,
    /// [`JsonKv::get_latest`] once a round was lost.
    pub async fn get_for_round<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
        round: usize,
    ) -> anyhow::Result<Option<(T, u64)>> {
        if round == 0 {
            self.get(key).await
        } else {
            self.get_latest(key).await
        }
    }

    /// The last write on the subject of `pattern` (a key, or keys with one `*` token) and its
    /// revision, read through the stream's leader; `None` when there is none or it is a delete.
    async fn leader_read<T: serde::de::DeserializeOwned>(
        &self,
        pattern: &str,
    ) -> anyhow::Result<Option<(T, u64)>> {
        use stream::LastRawMessageErrorKind;
        let subject = format!("{}{pattern}", self.store.prefix);
        match self
            .store
            .stream
            .get_last_raw_message_by_subject(&subject)
            .await
        {
            Ok(message) => {
                let deleted = message
                    .headers
                    .get("KV-Operation")
                    .is_some_and(|op| op.as_str() != "PUT");
                if deleted || message.payload.is_empty() {
                    return Ok(None);
                }
                let value = serde_json::from_slice(&message.payload).with_context(|| {
                    format!("KV value under {pattern} is not what this version expects")
                })?;
                Ok(Some((value, message.sequence)))
            }
            Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(err) => Err(err.into()),
        }
    }

    /// Removes `key` if its revision is still `revision` (a moved-on key is left alone), leaving
    /// a purge marker the bucket drops after `marker_ttl`, and with it the key's subject: a
    /// deleted key's marker would stay for the bucket's max age, costing the broker memory per
    /// key (BENCHMARKS.md section 9).
    pub async fn purge_at(
        &self,
        key: &str,
        revision: u64,
        marker_ttl: Duration,
    ) -> anyhow::Result<()> {
        match self
            .store
            .purge_expect_revision_with_ttl(key, revision, marker_ttl)
            .await
        {
            Ok(()) => Ok(()),
            Err(err) => {
                tracing::debug!(key, error = %err, "KV key changed before purge; left alone");
                Ok(())
            }
        }
    }

    /// Erases `key`: every value it held goes, and the purge marker that tells watchers so goes
    /// too, [`ERASED_MARKER_TTL`] later. Nothing is left of the key after that.
    pub async fn erase(&self, key: &str) -> anyhow::Result<()> {
        Ok(self.store.purge_with_ttl(key, ERASED_MARKER_TTL).await?)
    }

    /// Deletes `key`.
    pub async fn delete(&self, key: &str) -> anyhow::Result<()> {
        Ok(self.store.delete(key).await?)
    }

    /// Every key in the bucket (for small buckets that are scanned, like prompt deadlines).
    pub async fn keys(&self) -> anyhow::Result<Vec<String>> {
        use futures::TryStreamExt as _;
        Ok(self.store.keys().await?.try_collect().await?)
    }

    /// The current value of `key` (if it has one), then every change to it: `None` for a
    /// delete or a value this version cannot decode. Ends when the watch fails.
    pub async fn watch_key<T: serde::de::DeserializeOwned + Send + 'static>(
        &self,
        key: &str,
    ) -> anyhow::Result<impl futures::Stream<Item = Option<T>> + Send + 'static> {
        use futures::StreamExt as _;
        use jetstream::kv::Operation;
        let watch = self.store.watch_with_history(key).await?;
        Ok(watch
            .take_while(|entry| std::future::ready(entry.is_ok()))
            .filter_map(|entry| async move {
                let entry = entry.ok()?;
                Some(
                    (entry.operation == Operation::Put)
                        .then(|| serde_json::from_slice(&entry.value).ok())
                        .flatten(),
                )
            }))
    }

    /// Every change to any key from now on (not the current values), as `(key, value)`:
    /// `None` for a delete or a value this version cannot decode. Ends when the watch fails.
    pub async fn watch_changes<T: serde::de::DeserializeOwned + Send + 'static>(
        &self,
    ) -> anyhow::Result<impl futures::Stream<Item = (String, Option<T>)> + Send + 'static> {
        Ok(decoded(self.store.watch_all().await?))
    }

    /// The current value of every key, then every change, as `(key, value)`: `None` for a
    /// delete or a value this version cannot decode. Ends when the watch fails.
    pub async fn watch_all<T: serde::de::DeserializeOwned + Send + 'static>(
        &self,
    ) -> anyhow::Result<impl futures::Stream<Item = (String, Option<T>)> + Send + 'static> {
        Ok(decoded(self.store.watch_with_history(">").await?))
    }
}

/// A KV watch as `(key, value)` pairs: `None` for a delete or a value this version cannot
/// decode; ends when the watch fails.
fn decoded<T: serde::de::DeserializeOwned + Send + 'static>(
    watch: jetstream::kv::Watch,
) -> impl futures::Stream<Item = (String, Option<T>)> + Send + 'static {
    use futures::StreamExt as _;
    use jetstream::kv::Operation;
    watch
        .take_while(|entry| std::future::ready(entry.is_ok()))
        .filter_map(|entry| async move {
            let entry = entry.ok()?;
            let value = (entry.operation == Operation::Put)
                .then(|| serde_json::from_slice(&entry.value).ok())
                .flatten();
            Some((entry.key, value))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::messaging::{RunTask, RunTaskV1};

    #[test]
    fn a_borrowed_task_is_published_as_the_same_json_as_an_owned_one() {
        let input = protocol::validate::parse_run_input(
            br#"{"threadId":"550e8400-e29b-41d4-a716-446655440000","runId":"r1","messages":[{"id":"m1","role":"user","content":"hi"}]}"#,
        )
        .unwrap();
        let task = RunTaskV1 {
            task_id: uuid::Uuid::now_v7(),
            owner: "alice".to_owned(),
            accepted_at: chrono::Utc::now(),
            input,
            attachments: Vec::new(),
            conversation: true,
            resumed: None,
            trace_id: Some("t".to_owned()),
            agent: Some("echo".to_owned()),
        };
        let borrowed = serde_json::to_vec(&RunTaskRef::V1(&task)).unwrap();
        let owned = serde_json::to_vec(&RunTask::V1(task.clone())).unwrap();
        assert_eq!(borrowed, owned);
        let RunTask::V1(back) = serde_json::from_slice(&borrowed).unwrap();
        assert_eq!(back, task);
    }

    #[test]
    fn credentials_in_a_nats_url_are_not_shown() {
        assert_eq!(
            super::without_userinfo("nats://runs:s3cret@a:4222, tls://b:4222"),
            "nats://a:4222,tls://b:4222"
        );
        assert_eq!(super::without_userinfo("user:pw@host:4222"), "host:4222");
    }
}
