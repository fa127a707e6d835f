//! The attachments service: owns the file records (its own schema) and the S3 bucket.
//!
//! Presigned uploads with verified, per-owner SHA-256 dedup, signed downloads, delete, the
//! NATS resolve endpoint the runs service admits attachments with, and erasure of an owner's
//! files (of a thread, or all) for history.

mod bus;
mod config;
mod download;
mod erase;
mod file_name;
mod form;
mod generated;
mod http;
mod intake;
pub mod limits;
mod link;
mod lookup;
pub mod policy;
pub mod quota;
mod server_upload;
mod state;
mod store;
mod upload_url;
mod verify;

pub use config::Config;
pub use limits::Limits;
pub(crate) use state::AppState;
pub use upload_url::UploadUrlWork;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use platform::auth::Authenticator;
use platform::config::{ConfigError, Env};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The schema attachments owns.
pub const SCHEMA: &str = "attachments";
/// Connections of the service's PostgreSQL pool.
const POOL_CONNECTIONS: u32 = 16;
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/attachments");

/// The service's PostgreSQL pool (16 connections, `POOL_CONNECTIONS`; the `attachments` schema
/// first on the search path), migrated if `migrate_on_start`; the benchmarks open theirs here too.
pub async fn connect_pool(config: &Config) -> anyhow::Result<PgPool> {
    platform::db::connect(
        &config.database_url,
        SCHEMA,
        &MIGRATOR,
        POOL_CONNECTIONS,
        config.migrate_on_start,
    )
    .await
}

/// What the background verifier needs.
struct Sweeper {
    verifier: Arc<verify::Verifier>,
    every: Duration,
}

/// Every `(method, path)` the service serves: the table its router is built from, with the
/// health routes. The system tests compare it with the service's `/openapi.json`.
pub fn routes() -> Vec<(&'static str, &'static str)> {
    platform::openapi::served(&http::endpoints())
}

/// The built service, bound and ready to run.
pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    resolver: bus::resolve::Resolver,
    sweeper: Sweeper,
    client: async_nats::Client,
    names: protocol::messaging::Names,
}

impl platform::service::Service for Application {
    type Config = Config;
    const NAME: &'static str = "attachments";

    fn config(env: &Env) -> Result<Config, ConfigError> {
        Config::from_env(env)
    }

    /// Applies the `attachments` schema's migrations.
    async fn migrate(env: &Env) -> anyhow::Result<()> {
        platform::db::migrate(
            &env.secret("SB_ATTACHMENTS_DATABASE_URL")?,
            SCHEMA,
            &MIGRATOR,
        )
        .await
    }

    /// Migrates the schema, makes sure the bucket exists, binds the listener.
    async fn build(config: Config) -> anyhow::Result<Self> {
        let limits = config.limits;
        let auth = Arc::new(Authenticator::new(&config.auth)?);
        let pool = connect_pool(&config).await?;
        let s3 = platform::s3::client(&config.s3);
        platform::s3::ensure_bucket(&s3, &config.s3.bucket).await?;
        let (client, js) = platform::nats::connect(&config.nats, "attachments").await?;
        let probes = vec![
            ("postgres", platform::db::probe(pool.clone())),
            (
                "s3",
                platform::s3::probe(s3.clone(), config.s3.bucket.clone()),
            ),
            ("nats", platform::nats::probe(js.clone())),
        ];
        // Bound first: download links default to the bound address (port 0 in tests).
        let listener = platform::service::bind(config.addr).await?;
        let download_base = match &config.public_url {
            Some(url) => url.clone(),
            None => config::default_public_url(
                listener
                    .local_addr()
                    .context("the listener has no local address")?,
            ),
        };
        let public_endpoint = config
            .public_endpoint
            .clone()
            .or_else(|| config.s3.endpoint.clone())
            .unwrap_or_else(|| format!("https://s3.{}.amazonaws.com", config.s3.region));
        let signer = Arc::new(policy::Signer {
            access_key: config.s3.access_key.clone(),
            secret_key: config.s3.secret_key.clone(),
            region: config.s3.region.clone(),
            public_endpoint,
            download_base,
        });
        let quota = Arc::new(quota::Quota::new(config.quota.clone()));
        let budgets = platform::lifecycle::ensure_owner_budgets(&js, &config.nats).await?;
        let rates = Arc::new(quota::Rates::new(&config.quota, &limits, budgets));
        let verifier = verify::Verifier::new(s3.clone(), pool.clone());
        let resolver = bus::resolve::Resolver {
            pool: pool.clone(),
            s3: s3.clone(),
            lookup: lookup::Lookup {
                pool: pool.clone(),
                supabase_secret: config.supabase_jwt_secret.clone(),
                signer: Arc::clone(&signer),
                download_ttl: config.download_ttl,
                verifier: Arc::clone(&verifier),
            },
            generated: generated::Generated {
                pool: pool.clone(),
                s3: s3.clone(),
                signer: Arc::clone(&signer),
                bucket: config.s3.bucket.clone(),
                upload_ttl: config.upload_ttl,
                quota: Arc::clone(&quota),
            },
        };
        let sweeper = Sweeper {
            verifier: Arc::clone(&verifier),
            every: config.sweep_every,
        };
        let state = AppState {
            auth,
            pool,
            s3,
            signer,
            bucket: config.s3.bucket.clone(),
            upload_ttl: config.upload_ttl,
            download_ttl: config.download_ttl,
            quota,
            rates,
            part_header_limit: form::PartHeaderLimit(limits.max_part_header_bytes),
            verifier,
        };
        let mut router = http::router(state).merge(platform::http::health_routes(probes));
        if let Some(cors) = http::cors_layer(&config.cors_allowed_origins)? {
            router = router.layer(cors);
        }
        Ok(Self {
            listener,
            router,
            resolver,
            sweeper,
            client,
            names: config.nats.names,
        })
    }

    /// The bound port.
    fn port(&self) -> u16 {
        platform::service::port(&self.listener)
    }

    /// Serves until `shutdown` is cancelled.
    async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let http = platform::http::serve(self.listener, self.router, shutdown.clone());
        let resolver = self
            .resolver
            .serve(self.client, self.names, shutdown.clone());
        let sweeper = verify::sweep(self.sweeper.verifier, self.sweeper.every, shutdown);
        let (http, resolved, ()) = tokio::join!(http, resolver, sweeper);
        http.context("attachments HTTP server failed")?;
        resolved
    }
}
