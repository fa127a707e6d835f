//! The runs service: accepts `RunAgentInput` onto JetStream and answers `TaskAcceptedResponse`
//! only after the publish is acknowledged.

mod accept;
mod routes;

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
}

impl Config {
    /// Reads the settings from the environment.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        Ok(Self {
            addr: env.or("SB_RUNS_ADDR", SocketAddr::from(([127, 0, 0, 1], 8082)))?,
            auth: env.auth()?,
            nats: env.nats()?,
        })
    }
}

/// Shared state of the handlers.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) auth: Arc<Authenticator>,
    pub(crate) accept: Arc<accept::Acceptor>,
}

impl FromRef<AppState> for Arc<Authenticator> {
    fn from_ref(state: &AppState) -> Self {
        Arc::clone(&state.auth)
    }
}

/// The built service, bound to its port and ready to run.
pub struct Application {
    listener: TcpListener,
    router: axum::Router,
}

impl Application {
    /// Connects to NATS, makes sure the streams exist and binds the listener (port 0 is fine).
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let auth = Arc::new(Authenticator::new(&config.auth)?);
        let (_client, js) = platform::nats::connect(&config.nats, "runs").await?;
        platform::nats::ensure_streams(&js, &config.nats.names).await?;
        let accept = Arc::new(accept::Acceptor::new(js.clone(), config.nats.names.clone()));
        let state = AppState { auth, accept };
        let router = routes::router(state).merge(platform::http::health_routes(vec![(
            "nats",
            platform::nats::probe(js),
        )]));
        let listener = TcpListener::bind(config.addr)
            .await
            .with_context(|| format!("cannot listen on {}", config.addr))?;
        Ok(Self { listener, router })
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
        platform::http::serve(self.listener, self.router, shutdown)
            .await
            .context("runs HTTP server failed")
    }
}
