//! Settings of the runs service, read from the environment.

use std::net::SocketAddr;

use platform::auth::AuthConfig;
use platform::config::{ConfigError, Env};
use platform::nats::NatsConfig;

use crate::{ActiveRunPolicy, LookupRate};

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
    /// How long a waiting event stream goes without a live event before it reads the run's log
    /// again in case one was lost (`SB_RUNS_STREAM_RECHECK_SECS`, default 60, plus a jitter of up
    /// to as much again; checked each time that passes, so at most twice that after its last live
    /// event); a NATS reconnection makes it read at once.
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
