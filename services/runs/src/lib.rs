//! The runs service: accepts `RunAgentInput` onto JetStream and answers `TaskAcceptedResponse`
//! only after the publish is acknowledged.

mod accept;
mod admit;
mod agents;
mod budget;
mod compatibility;
mod events;
mod limit;
mod openapi;
mod prompts;
mod routes;
mod start;
mod status;
mod thread;
mod thread_admin;
mod ws;

pub use accept::ActiveRunPolicy;
pub use limit::LookupRate;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use axum::extract::FromRef;
use platform::auth::{AuthConfig, Authenticator};
use platform::config::{ConfigError, Env};
use platform::nats::NatsConfig;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Settings of the runs service.
#[derive(Debug, Clone)]
pub struct Config {
    /// Listen address (`SB_RUNS_ADDR`, default `127.0.0.1:8082`).
    pub addr: SocketAddr,
    /// Bearer-token verification.
    pub auth: AuthConfig,
    /// NATS connection and names.
    pub nats: NatsConfig,
    /// What a second run on a busy thread gets (`SB_RUNS_ACTIVE_RUN_POLICY`: `enqueue`, the default, or `reject`).
    pub active_run_policy: ActiveRunPolicy,
    /// Runs each user may start per minute (`SB_RUNS_RATE_PER_MINUTE`, default 120).
    pub rate_per_minute: u32,
    /// Runs each user may start in a burst (`SB_RUNS_RATE_BURST`, default 30).
    pub rate_burst: u32,
    /// Open event streams and WebSockets per owner per replica
    /// (`SB_RUNS_MAX_STREAMS_PER_OWNER`, default 100); one more answers 429.
    pub max_streams_per_owner: u32,
    /// Bytes of accepted runs one owner may add to the RUNS stream per UTC day, across every
    /// replica (`SB_RUNS_OWNER_BYTES_PER_DAY`, default 256 MiB); past it 403 `quota_exceeded`.
    pub owner_bytes_per_day: u64,
    /// Status, cancel, events and WebSocket reconnects per owner per replica
    /// (`SB_RUNS_LOOKUP_RATE_PER_MINUTE`, `SB_RUNS_LOOKUP_RATE_BURST`).
    pub lookup_rate: LookupRate,
    /// Tokens each owner's runs may use per UTC day and month, across every replica
    /// (`SB_RUNS_OWNER_TOKENS_PER_DAY`, `SB_RUNS_OWNER_TOKENS_PER_MONTH`, unset: unbounded;
    /// `SB_RUNS_OWNER_TOKEN_BUDGETS`, a JSON object of overrides by owner); past one, 429
    /// `budget_exceeded`.
    pub token_budgets: platform::tokens::TokenBudgets,
    /// Runs one owner may have queued or running at once, across every replica
    /// (`SB_RUNS_MAX_ACTIVE_PER_OWNER`, default 100, at most 10,000; 0: not counted); one more
    /// answers 429.
    pub max_active_per_owner: u32,
    /// Bytes one owner may keep in history, across every replica (`SB_RUNS_OWNER_HISTORY_BYTES`,
    /// default 1 GiB; 0: not bounded); at or past it 403 `quota_exceeded` until threads are
    /// deleted.
    pub owner_history_bytes: u64,
    /// How often, at least, a waiting event stream reads the run's log again in case a live
    /// event was lost (`SB_RUNS_STREAM_RECHECK_SECS`, default 60, plus a jitter of up to as much
    /// again); a NATS reconnection makes it read at once.
    pub stream_recheck: std::time::Duration,
}

impl Config {
    /// Reads the settings from the environment.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        Ok(Self {
            addr: env.or("SB_RUNS_ADDR", SocketAddr::from(([127, 0, 0, 1], 8082)))?,
            auth: env.auth()?,
            nats: env.nats()?,
            active_run_policy: env.or("SB_RUNS_ACTIVE_RUN_POLICY", ActiveRunPolicy::Enqueue)?,
            rate_per_minute: env.positive("SB_RUNS_RATE_PER_MINUTE", 120)?,
            rate_burst: env.positive("SB_RUNS_RATE_BURST", 30)?,
            max_streams_per_owner: env.positive("SB_RUNS_MAX_STREAMS_PER_OWNER", 100)?,
            lookup_rate: LookupRate::from_env(env)?,
            owner_bytes_per_day: {
                let bytes: u64 = env.or("SB_RUNS_OWNER_BYTES_PER_DAY", 256 * 1024 * 1024)?;
                if bytes < 64 * 1024 {
                    return Err(ConfigError::Invalid {
                        name: "SB_RUNS_OWNER_BYTES_PER_DAY".to_owned(),
                        reason: "must be at least 65536 (a run may be 256 KiB)".to_owned(),
                    });
                }
                bytes
            },
            max_active_per_owner: {
                let max: u32 = env.or("SB_RUNS_MAX_ACTIVE_PER_OWNER", 100)?;
                // The owner's set is one KV record of ~60 bytes a run, under the 1 MiB message.
                if max > 10_000 {
                    return Err(ConfigError::Invalid {
                        name: "SB_RUNS_MAX_ACTIVE_PER_OWNER".to_owned(),
                        reason: "must be at most 10000 (0: not counted)".to_owned(),
                    });
                }
                max
            },
            owner_history_bytes: env.or("SB_RUNS_OWNER_HISTORY_BYTES", 1 << 30)?,
            stream_recheck: std::time::Duration::from_secs(
                env.positive("SB_RUNS_STREAM_RECHECK_SECS", 60)?.into(),
            ),
            token_budgets: platform::tokens::TokenBudgets::new(
                platform::tokens::TokenLimits {
                    per_day: env.optional("SB_RUNS_OWNER_TOKENS_PER_DAY")?,
                    per_month: env.optional("SB_RUNS_OWNER_TOKENS_PER_MONTH")?,
                },
                env.raw("SB_RUNS_OWNER_TOKEN_BUDGETS"),
            )
            .map_err(|reason| ConfigError::Invalid {
                name: "SB_RUNS_OWNER_TOKEN_BUDGETS".to_owned(),
                reason,
            })?,
        })
    }
}

/// Shared state of the handlers: one `Arc`, so the clone axum makes for every request is a
/// reference count, not a copy of every NATS handle (the KV stores and streams carry their
/// cached configuration: cloning them was a fifth of the service's CPU per accepted run,
/// BENCHMARKS.md section 2).
#[derive(Clone)]
pub(crate) struct AppState(Arc<SharedState>);

impl std::ops::Deref for AppState {
    type Target = SharedState;
    fn deref(&self) -> &SharedState {
        &self.0
    }
}

/// The kernel send buffer of each client connection (doubled by the kernel: 128 KiB), instead of
/// one that grows to 4 MiB: a client that stops reading its event stream pins at most that in the
/// kernel, and its reader then leaves the live feed after [`events`]' queue of 64 events and
/// catches up from the log once the client reads. Enough for a stream's events at any round trip
/// a browser sees (128 KiB per 100 ms is 1.3 MB/s).
const SEND_BUFFER_BYTES: u32 = 64 * 1024;

/// What [`AppState`] shares.
pub(crate) struct SharedState {
    pub(crate) auth: Arc<Authenticator>,
    pub(crate) accept: Arc<accept::Acceptor>,
    pub(crate) admission: Arc<admit::Admission>,
    pub(crate) runs: Arc<status::RunDirectory>,
    pub(crate) limiter: Arc<platform::limit::OwnerRate>,
    /// The owners' token budgets, and the tokens their runs used (the workers charge them).
    pub(crate) token_budgets: platform::tokens::TokenBudgets,
    /// What each owner may keep in history, against what history says they keep.
    pub(crate) kept: platform::kept::KeptBudget,
    pub(crate) tokens: platform::tokens::TokenLedger,
    /// Run lookups per owner: status, cancel, events, WebSocket reconnects.
    pub(crate) lookups: limit::Throttle,
    /// `POST /api/v1/agents/compatibility`: its rate and its places on the blocking pool.
    pub(crate) compatibility: compatibility::CompatibilityChecks,
    pub(crate) events: events::EventHub,
    /// Thread streams: a conversation's runs, live, on every device.
    pub(crate) threads: thread::Threads,
    /// Renames and erases threads, erases owners (history keeps them).
    pub(crate) thread_admin: thread_admin::ThreadAdmin,
    pub(crate) buckets: platform::lifecycle::RunBuckets,
    pub(crate) streams: limit::StreamQuota,
    /// The agents workers registered.
    pub(crate) agents: agents::AgentCatalog,
    /// Cancelled at shutdown: ends the open event streams so the server can drain.
    pub(crate) shutdown: CancellationToken,
}

impl FromRef<AppState> for Arc<Authenticator> {
    fn from_ref(state: &AppState) -> Self {
        Arc::clone(&state.auth)
    }
}

/// Every `(method, path)` the service serves: the table its router is built from, with the
/// health routes. The system tests compare it with the service's `/openapi.json`.
pub fn routes() -> Vec<(&'static str, &'static str)> {
    platform::openapi::served(&routes::endpoints())
}

/// The built service, bound to its port and ready to run.
pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    /// Ends the event streams (and the event hub) at shutdown.
    streams: CancellationToken,
}

impl platform::service::Service for Application {
    type Config = Config;
    const NAME: &'static str = "runs";

    fn config(env: &Env) -> Result<Config, ConfigError> {
        Config::from_env(env)
    }

    /// Connects to NATS, makes sure the streams exist and binds the listener (port 0 is fine).
    async fn build(config: Config) -> anyhow::Result<Self> {
        let lookup_rate = config.lookup_rate;
        let auth = Arc::new(Authenticator::new(&config.auth)?);
        let (client, js) = platform::nats::connect(&config.nats, "runs").await?;
        let names = &config.nats.names;
        platform::nats::ensure_streams(&js, &config.nats).await?;
        let buckets = platform::lifecycle::ensure_run_buckets(&js, &config.nats).await?;
        let runs_stream = js.get_stream(names.runs_stream()).await?;
        let accept = Arc::new(accept::Acceptor::new(
            js.clone(),
            runs_stream.clone(),
            names.clone(),
            buckets.clone(),
            config.active_run_policy,
            Arc::new(platform::budget::DailyBudget::new(
                "bytes",
                config.owner_bytes_per_day,
                buckets.owner_budgets.clone(),
            )),
            usize::try_from(config.max_active_per_owner).unwrap_or(usize::MAX),
        ));
        let admission = Arc::new(admit::Admission::new(
            client.clone(),
            names.attachments_resolve_subject(),
            std::time::Duration::from_secs(5),
        ));
        let hub_client = client.clone();
        let prompt_buckets = buckets.clone();
        let budgets = buckets.owner_budgets.clone();
        let tokens = platform::tokens::TokenLedger::new(buckets.owner_tokens.clone());
        let kept = platform::kept::KeptBudget::new(
            config.owner_history_bytes,
            buckets.owner_budgets.clone(),
        );
        let agents_kv = buckets.agents.clone();
        let thread_client = client.clone();
        let thread_admin =
            thread_admin::ThreadAdmin::new(client.clone(), names.clone(), runs_stream.clone());
        let thread_runs = runs_stream.clone();
        let runs = Arc::new(status::RunDirectory::new(
            client,
            runs_stream,
            names.clone(),
            buckets,
        ));
        let limiter = Arc::new(platform::limit::OwnerRate::new(
            "runs",
            config.rate_per_minute,
            config.rate_burst,
            budgets.clone(),
        ));
        let shutdown = CancellationToken::new();
        let events = events::EventHub::start(
            &hub_client,
            &js,
            names.clone(),
            config.stream_recheck,
            shutdown.clone(),
        )
        .await?;
        let threads = thread::Threads::new(
            thread::ThreadWatch::start(
                prompt_buckets.thread_locks.clone(),
                thread_client
                    .subscribe(names.threads_erased_subject())
                    .await?,
                shutdown.clone(),
            ),
            events.clone(),
            prompt_buckets.clone(),
            thread_client,
            names.clone(),
            thread_runs,
        );
        let state = AppState(Arc::new(SharedState {
            auth,
            accept,
            admission,
            runs,
            limiter,
            token_budgets: config.token_budgets.clone(),
            kept,
            tokens,
            lookups: limit::Throttle::lookups(lookup_rate, budgets.clone()),
            compatibility: compatibility::CompatibilityChecks::new(budgets),
            events,
            threads,
            thread_admin,
            buckets: prompt_buckets,
            streams: limit::StreamQuota::new(
                usize::try_from(config.max_streams_per_owner).unwrap_or(usize::MAX),
            ),
            agents: agents::AgentCatalog::start(agents_kv, shutdown.clone()),
            shutdown: shutdown.clone(),
        }));
        let router = routes::router(state).merge(platform::http::health_routes(vec![(
            "nats",
            platform::nats::probe(js),
        )]));
        let listener =
            platform::service::bind_with_send_buffer(config.addr, SEND_BUFFER_BYTES).await?;
        Ok(Self {
            listener,
            router,
            streams: shutdown,
        })
    }

    /// The bound port.
    fn port(&self) -> u16 {
        platform::service::port(&self.listener)
    }

    /// Serves until `shutdown` is cancelled.
    async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let streams = self.streams.clone();
        let stop_streams = shutdown.clone();
        tokio::spawn(async move {
            stop_streams.cancelled().await;
            streams.cancel();
        });
        let served = platform::http::serve(self.listener, self.router, shutdown).await;
        self.streams.cancel();
        served.context("runs HTTP server failed")
    }
}
