//! The history service: JetStream consumers persist every message of every run into
//! PostgreSQL (history's own schema), and `GET /api/v1/agent/history` serves day snapshots;
//! NATS endpoints answer how far a run is written, the run index and a thread's earlier
//! messages in AG-UI form.

mod bus;
mod changes;
mod config;
mod erase;
mod http;
mod retention;
mod search;
mod sign;
mod state;
mod store;

pub use config::Config;
pub use erase::ThreadTtl;
pub(crate) use state::AppState;

use std::sync::Arc;

use anyhow::Context as _;
use platform::auth::Authenticator;
use platform::config::{ConfigError, Env};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The schema history owns.
pub const SCHEMA: &str = "history";
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/history");

/// Every `(method, path)` the service serves: the table its router is built from, with the
/// health routes. The system tests compare it with the service's `/openapi.json`.
pub fn routes() -> Vec<(&'static str, &'static str)> {
    platform::openapi::served(&http::endpoints())
}

/// The built service: HTTP listener, the two consumers and the NATS endpoints.
pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    ingest: bus::ingest::Ingest,
    /// The RUN_EVENTS stream (the thread-messages endpoint compares runs' last events with
    /// what history wrote).
    events: async_nats::jetstream::stream::Stream,
    /// The RUNS stream, and how long after their end and how often runs leave it.
    runs: async_nats::jetstream::stream::Stream,
    runs_keep: std::time::Duration,
    runs_sweep: std::time::Duration,
    /// How long the RUNS stream keeps a run (and the tombstones of erased runs are kept).
    runs_max_age: std::time::Duration,
    client: async_nats::Client,
    names: protocol::messaging::Names,
    pool: PgPool,
    /// Signs the file links of a thread's snapshot.
    signer: Arc<sign::UrlSigner>,
    /// Erases threads and owners (on request, and the thread retention).
    eraser: erase::Eraser,
    thread_ttl: erase::ThreadTtl,
    /// Where the runs replicas read what each owner keeps (`platform::kept`).
    owner_budgets: platform::nats::JsonKv,
}

impl platform::service::Service for Application {
    type Config = Config;
    const NAME: &'static str = "history";

    fn config(env: &Env) -> Result<Config, ConfigError> {
        Config::from_env(env)
    }

    /// Applies the `history` schema's migrations.
    async fn migrate(env: &Env) -> anyhow::Result<()> {
        platform::db::migrate(&env.secret("SB_HISTORY_DATABASE_URL")?, SCHEMA, &MIGRATOR).await
    }

    /// Migrates the schema, connects to NATS, creates the durable consumers, binds the listener.
    async fn build(config: Config) -> anyhow::Result<Self> {
        let auth = Arc::new(Authenticator::new(&config.auth)?);
        let pool = platform::db::connect(
            &config.database_url,
            SCHEMA,
            &MIGRATOR,
            16,
            config.migrate_on_start,
        )
        .await?;
        let time_zones = Arc::new(store::time_zone_names(&pool).await?.into_iter().collect());
        let (client, js) = platform::nats::connect(&config.nats, "history").await?;
        let signer = Arc::new(sign::UrlSigner::new(client.clone(), &config.nats.names));
        platform::nats::ensure_streams(&js, &config.nats).await?;
        let ingest = bus::ingest::Ingest::new(&js, &config.nats.names, pool.clone()).await?;
        let runs = js
            .get_stream(config.nats.names.runs_stream())
            .await
            .context("runs stream missing")?;
        let events = js
            .get_stream(config.nats.names.run_events_stream())
            .await
            .context("run events stream missing")?;
        // Boxed: opening the buckets is a large future, and a test's whole platform is built
        // inside one future on a thread's stack.
        let buckets = Box::pin(platform::lifecycle::ensure_run_buckets(&js, &config.nats)).await?;
        let owner_budgets = buckets.owner_budgets.clone();
        let eraser = erase::Eraser::new(
            pool.clone(),
            client.clone(),
            js.clone(),
            config.nats.names.clone(),
            (runs.clone(), events.clone()),
            buckets,
            ingest.runs_consumer(),
        );
        let probes = vec![
            ("postgres", platform::db::probe(pool.clone())),
            ("nats", platform::nats::probe(js)),
        ];
        let router = http::router(AppState {
            auth,
            pool: pool.clone(),
            signer: Arc::clone(&signer),
            time_zones,
        })
        .merge(platform::http::health_routes(probes));
        let listener = platform::service::bind(config.addr).await?;
        Ok(Self {
            listener,
            router,
            ingest,
            events,
            runs,
            runs_keep: retention::keep_after_end(&config.nats.limits),
            runs_sweep: config.runs_sweep,
            runs_max_age: config
                .nats
                .limits
                .runs_max_age
                .max(config.nats.limits.events_max_age),
            client,
            names: config.nats.names.clone(),
            pool,
            signer,
            eraser,
            thread_ttl: config.thread_ttl,
            owner_budgets,
        })
    }

    /// The bound port.
    fn port(&self) -> u16 {
        platform::service::port(&self.listener)
    }

    /// Serves and consumes until `shutdown` is cancelled.
    async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let http = platform::http::serve(self.listener, self.router, shutdown.clone());
        // Ended runs leave the RUNS stream; it stops with `shutdown` (a failed sweep is logged
        // and tried again at the next tick).
        tokio::spawn(retention::run(
            self.pool.clone(),
            self.runs,
            self.runs_keep,
            self.runs_sweep,
            shutdown.clone(),
        ));
        // Threads past their time to live are erased, and the tombstones of erased runs kept
        // as long as the streams may hold their messages (the RUNS stream's age, the longer).
        tokio::spawn(erase::retain(
            self.eraser.clone(),
            self.thread_ttl,
            self.runs_max_age,
            self.runs_sweep,
            shutdown.clone(),
        ));
        let erasures = erase::serve(self.eraser, shutdown.clone());
        let forks = bus::fork::serve(
            self.client.clone(),
            self.names.clone(),
            self.pool.clone(),
            self.owner_budgets.clone(),
            shutdown.clone(),
        );
        let lookup = bus::lookup::serve(
            self.client.clone(),
            self.names.clone(),
            self.pool.clone(),
            self.ingest.runs_consumer(),
            shutdown.clone(),
        );
        let thread_messages = bus::thread_messages::serve(
            self.client.clone(),
            self.names.clone(),
            self.pool.clone(),
            bus::thread_messages::Written {
                runs: self.ingest.runs_consumer(),
                events: self.events,
            },
            self.signer,
            shutdown.clone(),
        );
        let thread_rename = bus::thread_rename::serve(
            self.client.clone(),
            self.names.clone(),
            self.pool.clone(),
            shutdown.clone(),
        );
        let progress = bus::progress::serve(self.client, self.names, self.pool, shutdown.clone());
        let (http, ingested, progress, lookup, thread_messages, thread_rename, erasures, forks) = tokio::join!(
            http,
            self.ingest.run(self.owner_budgets, shutdown),
            progress,
            lookup,
            thread_messages,
            thread_rename,
            erasures,
            forks
        );
        http.context("history HTTP server failed")?;
        progress.context("history progress endpoint failed")?;
        lookup.context("history run lookup endpoint failed")?;
        thread_messages.context("history thread messages endpoint failed")?;
        thread_rename.context("history thread rename endpoint failed")?;
        erasures.context("history erasure endpoints failed")?;
        forks.context("history fork endpoint failed")?;
        ingested
    }
}
