//! Settings of the history service, read from the environment.

use std::net::SocketAddr;

use platform::auth::AuthConfig;
use platform::config::{ConfigError, Env};
use platform::nats::NatsConfig;
use secrecy::SecretString;

use crate::ThreadTtl;

/// Settings of the history service.
#[derive(Debug, Clone)]
pub struct Config {
    /// Listen address (`SB_HISTORY_ADDR`, default `127.0.0.1:8083`).
    pub addr: SocketAddr,
    /// Bearer-token verification.
    pub auth: AuthConfig,
    /// NATS connection and names.
    pub nats: NatsConfig,
    /// PostgreSQL URL (`SB_HISTORY_DATABASE_URL`).
    pub database_url: SecretString,
    /// Applies missing migrations at start (`SB_DB_MIGRATE`, default true); when false, only
    /// checks the schema has them (the `migrate` subcommand, run as a Job, applied them).
    pub migrate_on_start: bool,
    /// How often ended runs are deleted from the RUNS stream (`SB_HISTORY_RUNS_SWEEP_SECS`,
    /// default 60; see `retention`).
    pub runs_sweep: std::time::Duration,
    /// How long threads are kept after their last message (`SB_HISTORY_THREAD_TTL_DAYS`, 0 or
    /// unset: for good; `SB_HISTORY_OWNER_THREAD_TTL_DAYS`, shorter ones by owner); swept as
    /// often as the RUNS retention.
    pub thread_ttl: ThreadTtl,
}

impl Config {
    /// Reads the settings from the environment.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        Ok(Self {
            addr: env.or("SB_HISTORY_ADDR", SocketAddr::from(([127, 0, 0, 1], 8083)))?,
            auth: env.auth()?,
            nats: env.nats()?,
            database_url: env.secret("SB_HISTORY_DATABASE_URL")?,
            migrate_on_start: env.or("SB_DB_MIGRATE", true)?,
            runs_sweep: std::time::Duration::from_secs(
                env.positive("SB_HISTORY_RUNS_SWEEP_SECS", 60)?.into(),
            ),
            thread_ttl: ThreadTtl::new(
                env.or("SB_HISTORY_THREAD_TTL_DAYS", 0)?,
                env.raw("SB_HISTORY_OWNER_THREAD_TTL_DAYS"),
            )
            .map_err(|(name, reason)| ConfigError::Invalid {
                name: name.to_owned(),
                reason,
            })?,
        })
    }
}
