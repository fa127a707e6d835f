//! The system-test harness: the four services, in-process or as their compiled binaries,
//! against the real infrastructure, each test isolated by its own database, prefix and bucket.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use platform::service::Service as _;
use secrecy::ExposeSecret;
use serde_json::{Value, json};
use test_support::Infra;
use tokio_util::sync::CancellationToken;

pub mod agent_server;
pub mod cluster;
pub mod fake_agent;
pub mod fake_model;
pub mod gateway;
pub mod link;
pub mod netns;
pub mod postgres;

/// How long a test waits for something that happens asynchronously (a run reaching history).
pub const EVENTUAL: Duration = Duration::from_secs(20);

/// Base URLs of a running platform.
#[derive(Debug, Clone)]
pub struct Urls {
    /// attachments.
    pub attachments: String,
    /// runs.
    pub runs: String,
    /// history.
    pub history: String,
    /// worker (health only).
    pub worker: String,
}

/// Secret the test platform verifies Supabase-style signed-URL tokens with.
pub const SUPABASE_SECRET: &str = "supabase-test-secret-0123456789abcdef";

/// Run lookups (status, cancel, events, reconnects) per owner: tests poll status often; the
/// limit has its own tests.
const GENEROUS_LOOKUPS: runs::LookupRate = runs::LookupRate {
    per_minute: 1_000_000,
    burst: 1_000_000,
};

/// Settings a test may change from the defaults.
#[derive(Debug, Clone)]
pub struct Options {
    /// What a second run on a busy thread gets.
    pub active_run_policy: runs::ActiveRunPolicy,
    /// Runs per owner per minute.
    pub rate_per_minute: u32,
    /// Runs per owner in a burst.
    pub rate_burst: u32,
    /// Origins the attachments service answers CORS requests from (a browser test's page).
    pub cors_allowed_origins: Vec<String>,
    /// How long presigned upload forms stay valid.
    pub upload_ttl: Duration,
    /// The worker's OpenAI-compatible backend (the built-in agent when `None`).
    pub openai: Option<worker::openai::OpenAiConfig>,
    /// Open event streams and WebSockets per owner on the runs service.
    pub max_streams_per_owner: u32,
    /// Per-owner upload rate and storage quotas of the attachments service.
    pub quota: attachments::quota::QuotaConfig,
    /// Runs at once per worker replica.
    pub worker_concurrency: usize,
    /// Runs of one owner at once per worker replica.
    pub max_runs_per_owner: usize,
    /// Bytes of each KV bucket (`SB_NATS_KV_MAX_BYTES`); the default when `None`.
    pub kv_max_bytes: Option<i64>,
    /// Where browsers reach the attachments service (a gateway's origin); its own address when
    /// `None`.
    pub attachments_public_url: Option<String>,
    /// The worker's remote agents file (`SB_WORKER_AGENTS_FILE`); built-in agents only when
    /// `None`.
    pub agents_file: Option<std::path::PathBuf>,
    /// Whether the worker runs the built-in test agents (`SB_WORKER_TEST_AGENTS`).
    pub worker_test_agents: bool,
    /// Bytes of runs one owner may start per day across the runs replicas
    /// (`SB_RUNS_OWNER_BYTES_PER_DAY`; 1 TiB by default here, so no other test meets it).
    pub runs_owner_bytes_per_day: u64,
    /// Bytes one owner may keep in history (`SB_RUNS_OWNER_HISTORY_BYTES`; the product's 1 GiB
    /// by default).
    pub runs_owner_history_bytes: u64,
    /// Bytes of run events one owner's runs may produce per day across the workers
    /// (`SB_WORKER_OWNER_EVENT_BYTES_PER_DAY`; 1 TiB by default here).
    pub worker_event_bytes_per_day: u64,
    /// Tokens each owner's runs may use per day and month across the runs replicas
    /// (`SB_RUNS_OWNER_TOKENS_PER_DAY`, ...; unbounded by default).
    pub token_budgets: platform::tokens::TokenBudgets,
    /// Runs one owner may have queued or running across the runs replicas
    /// (`SB_RUNS_MAX_ACTIVE_PER_OWNER`; 10,000, the most, by default here, so no other test meets
    /// it).
    pub max_active_per_owner: u32,
    /// Prompts one owner may have waiting across the workers
    /// (`SB_WORKER_MAX_PENDING_PROMPTS_PER_OWNER`; 10,000, the most, by default here).
    pub max_pending_prompts_per_owner: usize,
    /// How long run events are kept (`SB_NATS_EVENTS_MAX_AGE_SECS`; the duplicate window is cut
    /// to it too); the default when `None`.
    pub events_max_age: Option<Duration>,
    /// How often history deletes ended runs from the RUNS stream (`SB_HISTORY_RUNS_SWEEP_SECS`).
    pub history_runs_sweep: Duration,
    /// How long threads are kept (`SB_HISTORY_THREAD_TTL_DAYS` and the owners'); for good by
    /// default.
    pub thread_ttl: history::ThreadTtl,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            active_run_policy: runs::ActiveRunPolicy::Reject,
            rate_per_minute: 10_000,
            rate_burst: 10_000,
            cors_allowed_origins: Vec::new(),
            upload_ttl: Duration::from_secs(300),
            openai: None,
            max_streams_per_owner: 100,
            // Generous: tests upload many files quickly; the quota tests set their own.
            quota: attachments::quota::QuotaConfig {
                uploads_per_minute: 10_000,
                uploads_burst: 10_000,
                max_pending: 1_000,
                ..attachments::quota::QuotaConfig::default()
            },
            worker_concurrency: 4,
            max_runs_per_owner: 4,
            attachments_public_url: None,
            kv_max_bytes: None,
            agents_file: None,
            worker_test_agents: true,
            runs_owner_bytes_per_day: 1 << 40,
            runs_owner_history_bytes: 1 << 30,
            worker_event_bytes_per_day: 1 << 40,
            token_budgets: platform::tokens::TokenBudgets::default(),
            max_active_per_owner: 10_000,
            max_pending_prompts_per_owner: 10_000,
            events_max_age: None,
            history_runs_sweep: Duration::from_secs(60),
            thread_ttl: history::ThreadTtl::default(),
        }
    }
}

/// The four services running in this process, stopped on drop.
pub struct TestPlatform {
    /// Where they listen.
    pub urls: Urls,
    /// The NATS names this platform uses (its own prefix).
    pub nats: platform::nats::NatsConfig,
    /// URL of the attachments service's database.
    pub attachments_db: secrecy::SecretString,
    /// The attachments service's S3 settings (its own bucket).
    pub s3: platform::s3::S3Config,
    /// URL of the history service's database.
    pub history_db: secrecy::SecretString,
    /// Infrastructure and token minting.
    pub infra: Infra,
    /// HTTP client.
    pub http: reqwest::Client,
    shutdown: CancellationToken,
    /// The runs service's budget of bytes per owner per day, for more replicas of it.
    runs_owner_bytes_per_day: u64,
    runs_owner_history_bytes: u64,
    token_budgets: platform::tokens::TokenBudgets,
    max_active_per_owner: u32,
    /// The worker's settings, for more replicas of it.
    worker_config: worker::Config,
}

impl Drop for TestPlatform {
    /// Stops the services and removes the streams and buckets of the test's prefix.
    fn drop(&mut self) {
        self.shutdown.cancel();
        test_support::remove_nats_prefix_blocking(
            self.infra.nats_url.clone(),
            self.nats.names.clone(),
        );
    }
}

fn any_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

impl TestPlatform {
    /// Builds and starts all four services on port 0.
    pub async fn spawn() -> anyhow::Result<Self> {
        Self::spawn_with(Options::default()).await
    }

    /// Like [`TestPlatform::spawn`], with other settings.
    pub async fn spawn_with(options: Options) -> anyhow::Result<Self> {
        // A task of its own: the services' builders make a deep chain of large futures, and
        // polled under a test's own future it overflowed a debug build's test thread (a task
        // is polled from the runtime's loop, at the bottom of the stack).
        tokio::spawn(Self::build(options)).await?
    }

    async fn build(options: Options) -> anyhow::Result<Self> {
        // Spans and trace ids as in the binaries (the WebSocket's trace message carries one).
        static TELEMETRY: std::sync::OnceLock<()> = std::sync::OnceLock::new();
        TELEMETRY.get_or_init(|| {
            let config = platform::telemetry::TelemetryConfig {
                service: "system-tests",
                log_format: platform::telemetry::LogFormat::Pretty,
                otlp_endpoint: None,
            };
            if let Ok(guard) = platform::telemetry::init(&config) {
                std::mem::forget(guard);
            }
        });
        let infra = Infra::from_env();
        let mut nats = infra.fresh_nats();
        if let Some(bytes) = options.kv_max_bytes {
            nats.limits.kv_max_bytes = bytes;
        }
        if let Some(age) = options.events_max_age {
            nats.limits.events_max_age = age;
            nats.limits.runs_dedup_window = nats.limits.runs_dedup_window.min(age);
        }
        let history_db = infra.fresh_database().await?;
        let attachments_db = infra.fresh_database().await?;
        let s3 = infra.fresh_s3();
        let shutdown = CancellationToken::new();

        let attachments = attachments::Application::build(attachments::Config {
            addr: any_port(),
            auth: infra.auth(),
            database_url: attachments_db.clone(),
            migrate_on_start: true,
            s3: s3.clone(),
            nats: nats.clone(),
            supabase_jwt_secret: Some(secrecy::SecretString::from(SUPABASE_SECRET)),
            public_endpoint: None,
            public_url: options.attachments_public_url.clone(),
            upload_ttl: options.upload_ttl,
            download_ttl: Duration::from_secs(300),
            sweep_every: Duration::from_secs(1),
            cors_allowed_origins: options.cors_allowed_origins.clone(),
            quota: options.quota.clone(),
            limits: attachments::Limits::default(),
        })
        .await?;
        let runs = runs::Application::build(runs::Config {
            addr: any_port(),
            auth: infra.auth(),
            nats: nats.clone(),
            active_run_policy: options.active_run_policy,
            rate_per_minute: options.rate_per_minute,
            rate_burst: options.rate_burst,
            max_streams_per_owner: options.max_streams_per_owner,
            owner_bytes_per_day: options.runs_owner_bytes_per_day,
            owner_history_bytes: options.runs_owner_history_bytes,
            stream_recheck: Duration::from_secs(60),
            token_budgets: options.token_budgets.clone(),
            max_active_per_owner: options.max_active_per_owner,
            lookup_rate: GENEROUS_LOOKUPS,
        })
        .await?;
        let history = history::Application::build(history::Config {
            addr: any_port(),
            auth: infra.auth(),
            nats: nats.clone(),
            database_url: history_db.clone(),
            migrate_on_start: true,
            runs_sweep: options.history_runs_sweep,
            thread_ttl: options.thread_ttl.clone(),
        })
        .await?;
        let worker_config = worker::Config {
            addr: any_port(),
            nats: nats.clone(),
            concurrency: options.worker_concurrency,
            max_runs_per_owner: options.max_runs_per_owner,
            fleet_max_in_flight: 4096,
            ack_wait: Duration::from_secs(30),
            drain: Duration::from_secs(30),
            openai: options.openai.clone(),
            s3: Some(s3.clone()),
            extraction: worker::attachments::ExtractionConfig::default(),
            agents_file: options.agents_file.clone(),
            test_agents: options.worker_test_agents,
            owner_event_bytes_per_day: options.worker_event_bytes_per_day,
            max_pending_prompts_per_owner: options.max_pending_prompts_per_owner,
        };
        let worker = worker::Application::build(worker_config.clone()).await?;
        let url = |port: u16| format!("http://127.0.0.1:{port}");
        let urls = Urls {
            attachments: url(attachments.port()),
            runs: url(runs.port()),
            history: url(history.port()),
            worker: url(worker.port()),
        };
        tokio::spawn(attachments.run(shutdown.clone()));
        tokio::spawn(runs.run(shutdown.clone()));
        tokio::spawn(history.run(shutdown.clone()));
        tokio::spawn(worker.run(shutdown.clone()));
        Ok(Self {
            urls,
            nats,
            attachments_db,
            s3,
            history_db,
            infra,
            http: reqwest::Client::new(),
            shutdown,
            worker_config,
            runs_owner_bytes_per_day: options.runs_owner_bytes_per_day,
            runs_owner_history_bytes: options.runs_owner_history_bytes,
            token_budgets: options.token_budgets.clone(),
            max_active_per_owner: options.max_active_per_owner,
        })
    }
}

impl TestPlatform {
    /// Starts another runs replica on the same NATS (a second instance behind a load
    /// balancer); it stops with the platform or when the returned token is cancelled.
    pub async fn spawn_runs_replica(&self) -> anyhow::Result<(String, CancellationToken)> {
        self.spawn_runs_replica_with(|_| {}).await
    }

    /// Like [`TestPlatform::spawn_runs_replica`], with its settings as `change` leaves them
    /// (another NATS URL, say).
    pub async fn spawn_runs_replica_with(
        &self,
        change: impl FnOnce(&mut runs::Config),
    ) -> anyhow::Result<(String, CancellationToken)> {
        let mut config = runs::Config {
            addr: any_port(),
            auth: self.infra.auth(),
            nats: self.nats.clone(),
            active_run_policy: runs::ActiveRunPolicy::Enqueue,
            rate_per_minute: 10_000,
            rate_burst: 10_000,
            max_streams_per_owner: 100,
            owner_bytes_per_day: self.runs_owner_bytes_per_day,
            owner_history_bytes: self.runs_owner_history_bytes,
            stream_recheck: Duration::from_secs(60),
            token_budgets: self.token_budgets.clone(),
            max_active_per_owner: self.max_active_per_owner,
            lookup_rate: GENEROUS_LOOKUPS,
        };
        change(&mut config);
        // Built on a task of its own, like the platform (a large future on a test thread).
        let runs = tokio::spawn(runs::Application::build(config)).await??;
        let url = format!("http://127.0.0.1:{}", runs.port());
        let stop = self.shutdown.child_token();
        tokio::spawn(runs.run(stop.clone()));
        Ok((url, stop))
    }

    /// Starts another worker replica on the same NATS, with the same settings.
    pub async fn spawn_worker_replica(&self) -> anyhow::Result<CancellationToken> {
        self.spawn_worker_replica_with(|_| {}).await
    }

    /// Starts another worker replica on the same NATS, with the platform's settings as
    /// `change` leaves them (another agents file, say); it stops with the platform or when the
    /// returned token is cancelled.
    pub async fn spawn_worker_replica_with(
        &self,
        change: impl FnOnce(&mut worker::Config),
    ) -> anyhow::Result<CancellationToken> {
        let mut config = worker::Config {
            addr: any_port(),
            ..self.worker_config.clone()
        };
        change(&mut config);
        let worker = tokio::spawn(worker::Application::build(config)).await??;
        let stop = self.shutdown.child_token();
        tokio::spawn(worker.run(stop.clone()));
        Ok(stop)
    }

    /// Records a file in the attachments service's table, as an upload would (fixture).
    pub async fn insert_file(
        &self,
        owner: &str,
        bucket: &str,
        key: &str,
        content_type: &str,
        status: &str,
    ) -> anyhow::Result<()> {
        let pool = sqlx::PgPool::connect(self.attachments_db.expose_secret()).await?;
        sqlx::query(
            "INSERT INTO attachments.files (id, owner, bucket, object_key, file_name, content_type, size_bytes, status)
             VALUES ($1, $2, $3, $4, $5, $6, 1024, $7)",
        )
        .bind(uuid::Uuid::now_v7())
        .bind(owner)
        .bind(bucket)
        .bind(key)
        .bind(key.rsplit('/').next().unwrap_or(key))
        .bind(content_type)
        .bind(status)
        .execute(&pool)
        .await?;
        pool.close().await;
        Ok(())
    }

    /// Writes a thread's messages straight into history's tables, with chosen times and
    /// metadata (fixture): `(message_id, role, content, RFC 3339 time, metadata)`, `seq` from 1.
    pub async fn insert_history(
        &self,
        owner: &str,
        thread: &str,
        messages: &[(&str, &str, &str, &str, Value)],
    ) -> anyhow::Result<()> {
        let db = sqlx::PgPool::connect(self.history_db.expose_secret()).await?;
        sqlx::query("INSERT INTO history.threads (owner, thread_id, last_seq) VALUES ($1, $2, $3)")
            .bind(owner)
            .bind(thread)
            .bind(i64::try_from(messages.len())?)
            .execute(&db)
            .await?;
        for (seq, (id, role, content, at, metadata)) in (1_i64..).zip(messages) {
            sqlx::query(
                "INSERT INTO history.messages (id, owner, thread_id, seq, task_id, message_id, role, content, metadata, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::timestamptz)",
            )
            .bind(uuid::Uuid::now_v7())
            .bind(owner)
            .bind(thread)
            .bind(seq)
            .bind(uuid::Uuid::now_v7())
            .bind(id)
            .bind(role)
            .bind(content)
            .bind(metadata)
            .bind(at)
            .execute(&db)
            .await?;
        }
        db.close().await;
        Ok(())
    }

    /// The stored `metadata` of the message `message_id` in `thread_id`, read from history's table.
    pub async fn message_metadata(
        &self,
        thread_id: &str,
        message_id: &str,
    ) -> anyhow::Result<Value> {
        let pool = sqlx::PgPool::connect(self.history_db.expose_secret()).await?;
        let metadata: Value = sqlx::query_scalar(
            "SELECT metadata FROM history.messages WHERE thread_id = $1 AND message_id = $2",
        )
        .bind(thread_id)
        .bind(message_id)
        .fetch_one(&pool)
        .await?;
        pool.close().await;
        Ok(metadata)
    }
}

/// One server-sent event: its `id` and its JSON `data`.
#[derive(Debug, Clone, PartialEq)]
pub struct SseFrame {
    /// The `id:` field (`None` when absent).
    pub id: Option<String>,
    /// The `data:` field, parsed.
    pub data: Value,
}

/// The text an AG-UI event sequence streamed: its `TEXT_MESSAGE_CONTENT` deltas, joined.
pub fn streamed_text<'a>(events: impl IntoIterator<Item = &'a Value>) -> String {
    events
        .into_iter()
        .filter(|e| e["type"] == "TEXT_MESSAGE_CONTENT")
        .filter_map(|e| e["delta"].as_str())
        .collect()
}

/// Reads server-sent events from `response` until the server ends the stream or `limit`
/// events have arrived (then the connection is dropped); comments (heartbeats) are skipped.
/// Fails after [`EVENTUAL`] without an end.
pub async fn read_sse(
    response: reqwest::Response,
    limit: Option<usize>,
) -> anyhow::Result<Vec<SseFrame>> {
    use futures::StreamExt as _;
    let mut body = response.bytes_stream();
    let mut parser = protocol::sse::SseParser::new();
    let mut frames = Vec::new();
    let deadline = tokio::time::Instant::now() + EVENTUAL;
    loop {
        let chunk = match tokio::time::timeout_at(deadline, body.next()).await {
            Err(_) => bail!("the event stream did not end; got {} events", frames.len()),
            Ok(None) => return Ok(frames),
            Ok(Some(chunk)) => chunk?,
        };
        for frame in parser.push(&chunk)? {
            let protocol::sse::SseFrame::Event(event) = frame else {
                continue; // a heartbeat
            };
            frames.push(SseFrame {
                id: event.id,
                data: serde_json::from_str(&event.data)?,
            });
            if limit.is_some_and(|n| frames.len() >= n) {
                return Ok(frames);
            }
        }
    }
}

/// A WebSocket client of the runs service's `/websocket`.
pub struct WsClient {
    socket: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
}

impl WsClient {
    /// Connects to `runs_url` (`http://...`) with `Authorization: Bearer <token>` and the
    /// query `query` (e.g. `?last_message_id=...`).
    pub async fn connect(runs_url: &str, token: &str, query: &str) -> anyhow::Result<Self> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
        let url = format!("{}/websocket{query}", runs_url.replacen("http", "ws", 1));
        let mut request = url.into_client_request()?;
        request
            .headers_mut()
            .insert("authorization", format!("Bearer {token}").parse()?);
        let (socket, _) = tokio_tungstenite::connect_async(request).await?;
        Ok(Self { socket })
    }

    /// Sends one JSON message.
    pub async fn send(&mut self, message: &Value) -> anyhow::Result<()> {
        use futures::SinkExt as _;
        self.socket
            .send(tokio_tungstenite::tungstenite::Message::text(
                message.to_string(),
            ))
            .await?;
        Ok(())
    }

    /// Sends a raw text frame.
    pub async fn send_text(&mut self, text: &str) -> anyhow::Result<()> {
        use futures::SinkExt as _;
        self.socket
            .send(tokio_tungstenite::tungstenite::Message::text(text))
            .await?;
        Ok(())
    }

    /// The next JSON message from the server, or fails after [`EVENTUAL`].
    pub async fn next(&mut self) -> anyhow::Result<Value> {
        use futures::StreamExt as _;
        loop {
            let frame = tokio::time::timeout(EVENTUAL, self.socket.next())
                .await
                .context("no message from the server in time")?
                .context("the server closed the connection")??;
            if let tokio_tungstenite::tungstenite::Message::Text(text) = frame {
                return Ok(serde_json::from_str(text.as_str())?);
            }
        }
    }

    /// Messages up to and including the first for which `last` holds.
    pub async fn until(&mut self, last: impl Fn(&Value) -> bool) -> anyhow::Result<Vec<Value>> {
        let mut got = Vec::new();
        loop {
            let message = self.next().await?;
            let done = last(&message);
            got.push(message);
            if done {
                return Ok(got);
            }
        }
    }

    /// Closes the connection.
    pub async fn close(mut self) -> anyhow::Result<()> {
        self.socket.close(None).await?;
        Ok(())
    }
}

/// `POST {runs}/api/v1/agent/runs` with `body` and `Accept: text/event-stream` (`runs`: any
/// runs replica), as the owner of `token`: the run's AG-UI events, to its end; an error when the
/// run is not started (the answer's status and body).
pub async fn stream_run(
    http: &reqwest::Client,
    runs: &str,
    token: &str,
    body: &Value,
) -> anyhow::Result<Vec<Value>> {
    let response = http
        .post(format!("{runs}/api/v1/agent/runs"))
        .bearer_auth(token)
        .header("accept", "text/event-stream")
        .json(body)
        .send()
        .await?;
    if response.status() != 200 {
        let status = response.status();
        bail!(
            "the run was not started: {status} {}",
            response.text().await?
        );
    }
    Ok(read_sse(response, None)
        .await?
        .into_iter()
        .map(|frame| frame.data)
        .collect())
}

/// A client of a running platform, whichever way it was started.
pub struct Api<'a> {
    /// Where the services listen.
    pub urls: &'a Urls,
    /// HTTP client.
    pub http: &'a reqwest::Client,
}

impl Api<'_> {
    /// `POST /api/v1/agent/runs` with `body`, as the owner of `token`.
    pub async fn post_run(&self, token: &str, body: &Value) -> anyhow::Result<(u16, Value)> {
        let response = self
            .http
            .post(format!("{}/api/v1/agent/runs", self.urls.runs))
            .bearer_auth(token)
            .json(body)
            .send()
            .await?;
        let status = response.status().as_u16();
        Ok((status, response.json().await.unwrap_or(Value::Null)))
    }

    /// `POST /api/v1/agent/runs` with `body` and `Accept: text/event-stream`, as the owner of
    /// `token`: the run's AG-UI events, to its end.
    pub async fn stream_run(&self, token: &str, body: &Value) -> anyhow::Result<Vec<Value>> {
        stream_run(self.http, &self.urls.runs, token, body).await
    }

    /// `GET` a path of the runs service.
    pub async fn get_runs(&self, token: &str, path: &str) -> anyhow::Result<(u16, Value)> {
        let response = self
            .http
            .get(format!("{}{path}", self.urls.runs))
            .bearer_auth(token)
            .send()
            .await?;
        let status = response.status().as_u16();
        Ok((status, response.json().await.unwrap_or(Value::Null)))
    }

    /// `POST /api/v1/agent/runs/{id}/cancel`.
    pub async fn cancel_run(&self, token: &str, id: &str) -> anyhow::Result<(u16, Value)> {
        let response = self
            .http
            .post(format!("{}/api/v1/agent/runs/{id}/cancel", self.urls.runs))
            .bearer_auth(token)
            .send()
            .await?;
        let status = response.status().as_u16();
        Ok((status, response.json().await.unwrap_or(Value::Null)))
    }

    /// Polls `GET /api/v1/agent/runs/{id}` until its `status` is `want`, or fails after [`EVENTUAL`].
    pub async fn wait_for_status(
        &self,
        token: &str,
        id: &str,
        want: &str,
    ) -> anyhow::Result<Value> {
        self.wait_for_status_within(token, id, want, EVENTUAL).await
    }

    /// Like [`Self::wait_for_status`], for a run that may take longer than [`EVENTUAL`].
    pub async fn wait_for_status_within(
        &self,
        token: &str,
        id: &str,
        want: &str,
        within: Duration,
    ) -> anyhow::Result<Value> {
        let deadline = tokio::time::Instant::now() + within;
        let mut last = Value::Null;
        while tokio::time::Instant::now() < deadline {
            let (status, body) = self
                .get_runs(token, &format!("/api/v1/agent/runs/{id}"))
                .await?;
            if status == 200 && body["status"] == want {
                return Ok(body);
            }
            last = body;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!("run {id} never reached status {want}; last answer: {last}")
    }

    /// `GET /api/v1/agent/history` with the query `query`, as the owner of `token`.
    pub async fn history(
        &self,
        token: &str,
        query: &[(&str, &str)],
    ) -> anyhow::Result<(u16, Value)> {
        self.get_history(token, "/api/v1/agent/history", query)
            .await
    }

    /// `GET` a path of the history service with the query `query`, as the owner of `token`.
    pub async fn get_history(
        &self,
        token: &str,
        path: &str,
        query: &[(&str, &str)],
    ) -> anyhow::Result<(u16, Value)> {
        let response = self
            .http
            .get(format!("{}{path}", self.urls.history))
            .bearer_auth(token)
            .query(query)
            .send()
            .await?;
        let status = response.status().as_u16();
        Ok((status, response.json().await.unwrap_or(Value::Null)))
    }

    /// Polls the history of `thread_id` until it holds at least `count` messages and its last
    /// message is complete (`done` says when), or fails after [`EVENTUAL`].
    pub async fn wait_for_history(
        &self,
        token: &str,
        thread_id: &str,
        done: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Value> {
        let deadline = tokio::time::Instant::now() + EVENTUAL;
        let mut last = Value::Null;
        while tokio::time::Instant::now() < deadline {
            let (status, body) = self.history(token, &[("threadId", thread_id)]).await?;
            if status == 200 && done(&body) {
                return Ok(body);
            }
            last = body;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("history of {thread_id} never reached the expected state; last answer: {last}")
    }
}

impl TestPlatform {
    /// A client for this platform.
    pub fn api(&self) -> Api<'_> {
        Api {
            urls: &self.urls,
            http: &self.http,
        }
    }
}

/// A minimal valid run: one user text message on a new thread.
pub fn text_run(thread_id: &str, run_id: &str, text: &str) -> Value {
    json!({
        "threadId": thread_id,
        "runId": run_id,
        "state": {},
        "messages": [{"id": format!("{run_id}-user"), "role": "user", "content": text}],
        "tools": [],
        "context": [],
        "forwardedProps": {}
    })
}

/// The four services as separate processes, started from the compiled binaries.
pub struct ProcessPlatform {
    /// Where they listen.
    pub urls: Urls,
    /// Infrastructure and token minting.
    pub infra: Infra,
    /// HTTP client.
    pub http: reqwest::Client,
    children: Vec<(String, Child)>,
    env: Vec<(String, String)>,
}

pub(crate) fn start_binary(
    service: &str,
    port: u16,
    env: &[(String, String)],
) -> anyhow::Result<Child> {
    start_binary_logging(service, port, env, Stdio::null())
}

/// [`start_binary`] with the service's log lines (JSON, on its stdout) going to `logs`.
pub(crate) fn start_binary_logging(
    service: &str,
    port: u16,
    env: &[(String, String)],
    logs: Stdio,
) -> anyhow::Result<Child> {
    let addr_var = format!("SB_{}_ADDR", service.to_uppercase());
    Command::new(binary(&format!("switchboard-{service}"))?)
        .env_clear()
        .envs(env.iter().cloned())
        .env(addr_var, format!("127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(logs)
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot start {service}"))
}

/// The environment every service binary of a test gets: the NATS server and prefix, the
/// test's JWT secret, S3 bucket and database, quiet logs, a 3 s ack wait (a killed worker's run
/// is taken over within seconds, not the default 30 s) and the test stream limits.
pub fn binary_env(
    infra: &Infra,
    nats_url: &str,
    prefix: &str,
    s3: &platform::s3::S3Config,
    database: &str,
) -> Vec<(String, String)> {
    let pairs = [
        ("SB_NATS_URL", nats_url),
        ("SB_NATS_PREFIX", prefix),
        ("SB_JWT_ALG", "HS256"),
        ("SB_JWT_SECRET", &infra.jwt_secret),
        ("SB_S3_ENDPOINT", s3.endpoint.as_deref().unwrap_or_default()),
        ("SB_S3_ACCESS_KEY", &s3.access_key),
        ("SB_S3_SECRET_KEY", s3.secret_key.expose_secret()),
        ("SB_S3_BUCKET", &s3.bucket),
        ("SB_HISTORY_DATABASE_URL", database),
        ("SB_ATTACHMENTS_DATABASE_URL", database),
        ("RUST_LOG", "warn"),
        ("SB_WORKER_ACK_WAIT_SECS", "3"),
        // Tests poll run status often; the lookup limit has its own test.
        ("SB_RUNS_LOOKUP_RATE_PER_MINUTE", "1000000"),
        ("SB_RUNS_LOOKUP_RATE_BURST", "1000000"),
        // Load tests keep many runs of one owner queued; the limit has its own test.
        ("SB_RUNS_MAX_ACTIVE_PER_OWNER", "10000"),
    ];
    pairs
        .iter()
        .chain(test_support::TEST_STREAM_LIMITS.iter())
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect()
}

/// Polls `url` until it answers 2xx, or fails after `within` naming `what`.
pub async fn wait_http_ok(url: &str, within: Duration, what: &str) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if let Ok(response) = http.get(url).send().await
            && response.status().is_success()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("{what} never became ready ({url})")
}

/// Debian's Chromium, which the browser tests drive (playwright-core downloads none).
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// Fails the test, naming the fix, unless Chromium and `<dir>/node_modules/playwright-core`
/// (a driver's npm packages, `dir` relative to the workspace) are installed.
pub fn require_browser_driver(dir: &str) {
    assert!(
        std::path::Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: run scripts/test.sh (or apt-get install chromium)"
    );
    assert!(
        gateway::workspace_root()
            .join(dir)
            .join("node_modules/playwright-core")
            .exists(),
        "{dir}/node_modules is missing: run scripts/test.sh (or npm ci in {dir})"
    );
}

/// What a JavaScript driver (`node <script>`) reported: its exit status, the JSON report it
/// printed on stdout, and its stderr.
pub struct DriverReport {
    /// The process's exit status.
    pub status: std::process::ExitStatus,
    /// The JSON object it printed.
    pub report: Value,
    /// Its stderr, for failure messages.
    pub stderr: String,
}

/// Runs `driver` (a `node` command, killed when late) to its end within `within`; panics when
/// it cannot run, does not finish or prints no JSON.
pub async fn run_node_driver(
    mut driver: tokio::process::Command,
    within: Duration,
) -> DriverReport {
    let output = tokio::time::timeout(within, driver.kill_on_drop(true).output())
        .await
        .expect("the driver finished in time")
        .unwrap_or_else(|e| panic!("cannot run node (is Node.js installed?): {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let report = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!("the driver printed no JSON ({e}); stdout: {stdout}\nstderr: {stderr}")
    });
    DriverReport {
        status: output.status,
        report,
        stderr,
    }
}

/// Runs the binary of `service` with `args` and only the environment `env` to its end.
pub async fn run_binary(
    service: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<std::process::Output> {
    Ok(
        tokio::process::Command::new(binary(&format!("switchboard-{service}"))?)
            .env_clear()
            .envs(env.iter().copied())
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await?,
    )
}

/// Starts the binary of `service` with only the environment `env`; killed when dropped.
pub fn spawn_binary(service: &str, env: &[(&str, &str)]) -> anyhow::Result<tokio::process::Child> {
    Ok(
        tokio::process::Command::new(binary(&format!("switchboard-{service}"))?)
            .env_clear()
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()?,
    )
}

/// Where `cargo build` put the workspace's binaries: next to this test's `deps/` folder.
pub(crate) fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .context("test binary has no target directory")?;
    let path = dir.join(name);
    if !path.exists() {
        bail!(
            "{} is missing: build the services first (`cargo build --bins`, which the test command does)",
            path.display()
        );
    }
    Ok(path)
}

/// A fresh owner budgets bucket (rates and daily budgets) on the test NATS, with a count of
/// the writes it has taken: the bucket's stream holds nothing but those writes.
pub struct OwnerBudgets {
    /// The bucket.
    pub kv: platform::nats::JsonKv,
    js: async_nats::jetstream::Context,
    stream: String,
}

impl OwnerBudgets {
    /// Opens the bucket under a fresh prefix.
    pub async fn fresh() -> anyhow::Result<Self> {
        let config = test_support::Infra::from_env().fresh_nats();
        let (_client, js) = platform::nats::connect(&config, "budgets-test").await?;
        let kv = platform::lifecycle::ensure_owner_budgets(&js, &config).await?;
        let stream = format!("KV_{}", config.names.owner_budgets_bucket());
        Ok(Self { kv, js, stream })
    }

    /// How many writes the bucket has taken.
    pub async fn writes(&self) -> anyhow::Result<u64> {
        Ok(self
            .js
            .get_stream(&self.stream)
            .await?
            .info()
            .await?
            .state
            .last_sequence)
    }
}

/// A port free on 127.0.0.1 a moment ago (for a process that binds it itself), and held for
/// this test process: no other test process is handed it while this one lives.
pub fn free_port() -> anyhow::Result<u16> {
    // Below Linux's ephemeral range (32768-60999): a port asked of the kernel (`:0`) and
    // released can be handed to any outgoing connection of any test before the process that
    // picked it binds it ("address already in use", a service that never starts), and a
    // service restarted on its port can find it taken the same way. Ports from this range
    // are only ever taken by a test binding them on purpose.
    //
    // A port is also locked (`flock` of a file named after it) until this process exits:
    // nextest runs each test in a process of its own, and two tests could otherwise pick the
    // same port while neither had bound it yet (seen in CI: a fleet's service "never became
    // ready", its port in use). The kernel releases the lock with the process.
    static HELD: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("switchboard-test-ports");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for _ in 0..200 {
        let random = uuid::Uuid::new_v4().as_u128();
        let port = 20_000 + u16::try_from(random % 12_000).unwrap_or(0);
        let path = dir.join(port.to_string());
        let lock = std::fs::File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        if lock.try_lock().is_err() {
            continue; // another test holds it (or this one, through another pick)
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            HELD.lock()
                .map_err(|_| anyhow::anyhow!("the held ports' lock is poisoned"))?
                .push(lock);
            return Ok(port);
        }
    }
    anyhow::bail!("no free port between 20000 and 32000")
}

impl ProcessPlatform {
    /// Starts the four binaries with their own database, prefix and bucket, and waits until
    /// each answers `/readyz` with 200.
    pub async fn spawn() -> anyhow::Result<Self> {
        Self::spawn_with_env(&[]).await
    }

    /// Like [`ProcessPlatform::spawn`], every service (and every restart) also getting `extra`
    /// in its environment, after [`binary_env`]'s, so it may override one of those
    /// (e.g. `SB_WORKER_AGENTS_FILE`).
    pub async fn spawn_with_env(extra: &[(&str, &str)]) -> anyhow::Result<Self> {
        let infra = Infra::from_env();
        let nats = infra.fresh_nats();
        let s3 = infra.fresh_s3();
        let database = infra.fresh_database().await?;
        let mut common = binary_env(
            &infra,
            &infra.nats_url,
            nats.names.prefix(),
            &s3,
            database.expose_secret(),
        );
        common.extend(
            extra
                .iter()
                .map(|(name, value)| ((*name).to_owned(), (*value).to_owned())),
        );
        let mut children = Vec::new();
        let mut urls = Vec::new();
        for service in ["attachments", "runs", "history", "worker"] {
            let port = free_port()?;
            children.push((service.to_owned(), start_binary(service, port, &common)?));
            urls.push(format!("http://127.0.0.1:{port}"));
        }
        let platform = Self {
            urls: Urls {
                attachments: urls[0].clone(),
                runs: urls[1].clone(),
                history: urls[2].clone(),
                worker: urls[3].clone(),
            },
            infra,
            http: reqwest::Client::new(),
            children,
            env: common,
        };
        for url in [
            &platform.urls.attachments,
            &platform.urls.runs,
            &platform.urls.history,
            &platform.urls.worker,
        ] {
            platform.wait_ready(url).await?;
        }
        Ok(platform)
    }

    async fn wait_ready(&self, base: &str) -> anyhow::Result<()> {
        wait_http_ok(&format!("{base}/readyz"), EVENTUAL, base).await
    }

    /// A client for this platform.
    pub fn api(&self) -> Api<'_> {
        Api {
            urls: &self.urls,
            http: &self.http,
        }
    }

    /// Kills `service` with SIGKILL (no draining, like a crashed pod) and waits for it to die.
    pub fn kill(&mut self, service: &str) -> anyhow::Result<()> {
        let (_, child) = self
            .children
            .iter_mut()
            .find(|(name, _)| name == service)
            .context("no such service")?;
        child.kill()?;
        child.wait()?;
        Ok(())
    }

    /// Starts `service` again on its port and waits until it is ready.
    pub async fn restart(&mut self, service: &str) -> anyhow::Result<()> {
        let base = match service {
            "attachments" => self.urls.attachments.clone(),
            "runs" => self.urls.runs.clone(),
            "history" => self.urls.history.clone(),
            _ => self.urls.worker.clone(),
        };
        let port: u16 = base.rsplit(':').next().context("url has a port")?.parse()?;
        let child = start_binary(service, port, &self.env)?;
        if let Some(slot) = self.children.iter_mut().find(|(name, _)| name == service) {
            slot.1 = child;
        }
        self.wait_ready(&base).await
    }

    /// Sends SIGTERM to every service and returns each one's exit status.
    pub fn terminate(&mut self) -> anyhow::Result<Vec<(String, Option<i32>)>> {
        for (_, child) in &self.children {
            Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status()?;
        }
        let mut statuses = Vec::new();
        for (name, child) in &mut self.children {
            statuses.push((name.clone(), child.wait()?.code()));
        }
        self.children.clear();
        Ok(statuses)
    }
}

impl Drop for ProcessPlatform {
    /// Kills the services and removes the streams and buckets of the test's prefix.
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let prefix = self
            .env
            .iter()
            .find(|(name, _)| name == "SB_NATS_PREFIX")
            .and_then(|(_, prefix)| protocol::messaging::Names::new(prefix).ok());
        if let Some(names) = prefix {
            test_support::remove_nats_prefix_blocking(self.infra.nats_url.clone(), names);
        }
    }
}

/// The parts of an attachments download link `{attachments}/v2/files/content/{fileId}?expires=
/// <unix secs>&signature=<64 hex>`: the file id and the expiry, or `None` for any other URL.
pub fn download_link(attachments: &str, url: &str) -> Option<(uuid::Uuid, i64)> {
    let rest = url
        .strip_prefix(attachments)?
        .strip_prefix("/v2/files/content/")?;
    let (id, query) = rest.split_once('?')?;
    let (expires, signature) = query.strip_prefix("expires=")?.split_once("&signature=")?;
    let hex_signature = signature.len() == 64
        && signature
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    hex_signature
        .then(|| Some((uuid::Uuid::parse_str(id).ok()?, expires.parse().ok()?)))
        .flatten()
}

/// Whether a WebSocket server message ends a response: `completed`, or an error.
pub fn ws_done(message: &Value) -> bool {
    message["type"] == "system_response_message" && message["status"] == "completed"
        || message["type"] == "error_message"
}

/// The text of the `system_response_message`s among `messages`, joined.
pub fn ws_reply_text(messages: &[Value]) -> String {
    messages
        .iter()
        .filter(|m| m["type"] == "system_response_message")
        .filter_map(|m| m["content"]["text"].as_str())
        .collect()
}

/// Uploads `bytes` through the attachments service's server upload, in `session` (outside any
/// session when empty, as the document's client does), and returns its `s3://` content URL.
pub async fn upload_file(
    platform: &TestPlatform,
    token: &str,
    session: &str,
    bytes: Vec<u8>,
    name: &str,
    mime: &str,
) -> String {
    let part = reqwest::multipart::Part::bytes(bytes)
        .file_name(name.to_owned())
        .mime_str(mime)
        .unwrap_or_else(|err| panic!("{mime} is a MIME type: {err}"));
    let mut form = reqwest::multipart::Form::new();
    if !session.is_empty() {
        form = form.text("session_id", session.to_owned());
    }
    let response = platform
        .http
        .post(format!(
            "{}/api/v1/agent/attachments",
            platform.urls.attachments
        ))
        .bearer_auth(token)
        .multipart(form.part("file", part))
        .send()
        .await
        .unwrap_or_else(|err| panic!("upload of {name}: {err}"));
    let status = response.status().as_u16();
    let answer: Value = response.json().await.unwrap_or(Value::Null);
    assert_eq!(status, 200, "upload of {name}: {answer}");
    format!(
        "s3://{}/{}",
        answer["bucket"].as_str().unwrap_or_default(),
        answer["path"].as_str().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_port_handed_out_is_held_until_the_process_ends() {
        let port = super::free_port().unwrap();
        let path = std::env::temp_dir()
            .join("switchboard-test-ports")
            .join(port.to_string());
        // What another test process would do with the same port: its lock is refused.
        let other = std::fs::File::options().write(true).open(&path).unwrap();
        assert!(
            other.try_lock().is_err(),
            "port {port} was handed out but not held"
        );
        let ports: Vec<u16> = (0..50).map(|_| super::free_port().unwrap()).collect();
        assert!(!ports.contains(&port), "port {port} handed out twice");
    }
}
