//! The attachments service: owns the file records (its own schema) and the S3 bucket.
//!
//! This version answers the NATS resolve endpoint the runs service admits attachments with;
//! upload, download and delete arrive with their own issue (TODO(#4)).

mod resolve;
mod store;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use axum::extract::FromRef;
use platform::auth::{AuthConfig, Authenticator};
use platform::config::{ConfigError, Env};
use platform::nats::NatsConfig;
use platform::s3::S3Config;
use secrecy::SecretString;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The schema attachments owns.
pub const SCHEMA: &str = "attachments";
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/attachments");

/// Settings of the attachments service.
#[derive(Debug, Clone)]
pub struct Config {
    /// Listen address (`SB_ATTACHMENTS_ADDR`, default `127.0.0.1:8081`).
    pub addr: SocketAddr,
    /// Bearer-token verification.
    pub auth: AuthConfig,
    /// PostgreSQL URL (`SB_ATTACHMENTS_DATABASE_URL`).
    pub database_url: SecretString,
    /// Object storage.
    pub s3: S3Config,
    /// NATS connection and names (request/reply endpoints).
    pub nats: NatsConfig,
    /// Secret of Supabase-style signed URLs; their tokens are verified when set
    /// (`SB_ATTACHMENTS_SUPABASE_JWT_SECRET`).
    pub supabase_jwt_secret: Option<SecretString>,
}

impl Config {
    /// Reads the settings from the environment.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        Ok(Self {
            addr: env.or(
                "SB_ATTACHMENTS_ADDR",
                SocketAddr::from(([127, 0, 0, 1], 8081)),
            )?,
            auth: env.auth()?,
            database_url: env.secret("SB_ATTACHMENTS_DATABASE_URL")?,
            s3: S3Config::from_env(env)?,
            nats: env.nats()?,
            supabase_jwt_secret: env
                .raw("SB_ATTACHMENTS_SUPABASE_JWT_SECRET")
                .map(|s| SecretString::from(s.to_owned())),
        })
    }
}

/// Shared state of the handlers.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) auth: Arc<Authenticator>,
    #[expect(dead_code, reason = "read by the upload endpoints of TODO(#4)")]
    pub(crate) pool: PgPool,
}

impl FromRef<AppState> for Arc<Authenticator> {
    fn from_ref(state: &AppState) -> Self {
        Arc::clone(&state.auth)
    }
}

/// The built service, bound and ready to run.
pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    resolver: resolve::Resolver,
    client: async_nats::Client,
    names: protocol::messaging::Names,
}

impl Application {
    /// Migrates the schema, makes sure the bucket exists, binds the listener.
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let auth = Arc::new(Authenticator::new(&config.auth)?);
        let pool =
            platform::db::connect_and_migrate(&config.database_url, SCHEMA, &MIGRATOR, 16).await?;
        let s3 = platform::s3::client(&config.s3);
        platform::s3::ensure_bucket(&s3, &config.s3.bucket).await?;
        let (client, js) = platform::nats::connect(&config.nats, "attachments").await?;
        let probes = vec![
            ("postgres", platform::db::probe(pool.clone())),
            ("s3", platform::s3::probe(s3, config.s3.bucket.clone())),
            ("nats", platform::nats::probe(js)),
        ];
        let resolver = resolve::Resolver {
            pool: pool.clone(),
            supabase_secret: config.supabase_jwt_secret.clone(),
        };
        let state = AppState { auth, pool };
        let router = axum::Router::new()
            .with_state(state)
            .merge(platform::http::health_routes(probes));
        let listener = platform::service::bind(config.addr).await?;
        Ok(Self {
            listener,
            router,
            resolver,
            client,
            names: config.nats.names,
        })
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.listener
            .local_addr()
            .map(|a| a.port())
            .unwrap_or_default()
    }

    /// Serves until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let http = platform::http::serve(self.listener, self.router, shutdown.clone());
        let resolver = self.resolver.serve(self.client, self.names, shutdown);
        let (http, resolved) = tokio::join!(http, resolver);
        http.context("attachments HTTP server failed")?;
        resolved
    }
}

impl platform::service::Service for Application {
    type Config = Config;
    const NAME: &'static str = "attachments";

    fn config(env: &Env) -> Result<Config, ConfigError> {
        Config::from_env(env)
    }

    async fn build(config: Config) -> anyhow::Result<Self> {
        Application::build(config).await
    }

    fn port(&self) -> u16 {
        Application::port(self)
    }

    async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        Application::run(self, shutdown).await
    }
}
