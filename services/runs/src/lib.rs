//! The runs service: accepts `RunAgentInput` onto JetStream and answers `TaskAcceptedResponse`
//! only after the publish is acknowledged.

mod accept;
mod admit;
mod agents;
mod budget;
mod compatibility;
mod config;
mod events;
mod http;
mod limit;
mod prompts;
mod start;
mod state;
mod status;
mod thread;

pub use accept::ActiveRunPolicy;
pub use config::Config;
pub use limit::LookupRate;
pub(crate) use state::{AppState, SharedState};

use std::sync::Arc;

use anyhow::Context as _;
use platform::auth::Authenticator;
use platform::config::{ConfigError, Env};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The kernel send buffer of each client connection (doubled by the kernel: 128 KiB), instead of
/// one that grows to 4 MiB: a client that stops reading its event stream pins at most that in the
/// kernel, and its reader then falls behind its run's live channel of 64 events ([`events`]) and
/// catches up from the log once the client reads. Enough for a stream's events at any round trip
/// a browser sees (128 KiB per 100 ms is 1.3 MB/s).
const SEND_BUFFER_BYTES: u32 = 64 * 1024;

/// Every `(method, path)` the service serves: the table its router is built from, with the
/// health routes. The system tests compare it with the service's `/openapi.json`.
pub fn routes() -> Vec<(&'static str, &'static str)> {
    platform::openapi::served(&http::endpoints())
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
        let thread_admin = http::thread_admin::ThreadAdmin::new(
            client.clone(),
            names.clone(),
            runs_stream.clone(),
        );
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
        let router = http::router(state).merge(platform::http::health_routes(vec![(
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
        let served =
            platform::http::serve_event_streams(self.listener, self.router, shutdown).await;
        self.streams.cancel();
        served.context("runs HTTP server failed")
    }
}
