//! Settings of the worker, read from the environment.

use std::net::SocketAddr;

use platform::config::{ConfigError, Env};
use platform::nats::NatsConfig;

use crate::{attachments, openai};

/// Settings of the worker.
#[derive(Debug, Clone)]
pub struct Config {
    /// Health endpoint address (`SB_WORKER_ADDR`, default `127.0.0.1:8084`).
    pub addr: SocketAddr,
    /// NATS connection and names.
    pub nats: NatsConfig,
    /// Runs processed at once by this replica (`SB_WORKER_CONCURRENCY`, default 16): the
    /// fleet's capacity is the sum over replicas.
    pub concurrency: usize,
    /// Runs of one owner processed at once by this replica (`SB_WORKER_MAX_RUNS_PER_OWNER`,
    /// default half the concurrency, at least 1): one owner never holds more than that share
    /// of each replica, so of the fleet.
    pub max_runs_per_owner: usize,
    /// Runs handed out and not finished across the whole fleet (`SB_WORKER_FLEET_MAX_IN_FLIGHT`,
    /// default 4096; the durable consumer's `max_ack_pending`): must be at least replicas x
    /// concurrency.
    pub fleet_max_in_flight: i64,
    /// How long a run may go without a progress heartbeat before JetStream gives it to another
    /// worker (`SB_WORKER_ACK_WAIT_SECS`, default 30, at least 3); heartbeats go every third of it.
    pub ack_wait: std::time::Duration,
    /// How long a SIGTERM waits for the replica's running runs to finish
    /// (`SB_WORKER_DRAIN_SECS`, default 300); nothing new is pulled meanwhile.
    pub drain: std::time::Duration,
    /// The OpenAI-compatible backend (`SB_OPENAI_BASE_URL`, `SB_OPENAI_MODEL`,
    /// `SB_OPENAI_API_KEY`); the built-in deterministic agent when unset.
    pub openai: Option<openai::OpenAiConfig>,
    /// Where the user message's files are read from: the attachments service's bucket
    /// (`SB_S3_ENDPOINT`, `SB_S3_REGION`, `SB_S3_ACCESS_KEY`, `SB_S3_SECRET_KEY`,
    /// `SB_S3_BUCKET`). `None` when `SB_S3_BUCKET` is unset: files are then described to the
    /// agent as unavailable.
    pub s3: Option<platform::s3::S3Config>,
    /// How files are extracted: in helper processes, `SB_WORKER_EXTRACT_CONCURRENCY` at once
    /// (default 2), each limited to `SB_WORKER_EXTRACT_MEMORY_MIB` of address space (default
    /// 384) and killed at the file's 15 s deadline; the helper binary is
    /// `SB_WORKER_EXTRACT_HELPER` (default: `switchboard-extract` next to the worker). The
    /// worker's memory is then bounded whatever users upload:
    /// worker RSS <= base + R x 3 x 54 MiB (results held by runs, only if every file is a
    /// 20 MiB image) and helpers' RSS <= E x M, with R = `SB_WORKER_CONCURRENCY`, E and M the
    /// two settings above (see `attachments`).
    pub extraction: attachments::ExtractionConfig,
    /// The remote agents this worker relays to (`SB_WORKER_AGENTS_FILE`, a TOML file of
    /// `[[agents]]`; see [`crate::remote::config`]); none when unset.
    pub agents_file: Option<std::path::PathBuf>,
    /// Whether the built-in test agents `echo` and `echo-text` run (`SB_WORKER_TEST_AGENTS`,
    /// default `true` in development, `false` with `SB_ENV=production`, which refuses `true`):
    /// their commands (`/file-large`, `/ask`, `/slow`) are for tests, not for users.
    pub test_agents: bool,
    /// Bytes of run events one owner's runs may add to the RUN_EVENTS stream per UTC day, across
    /// every worker (`SB_WORKER_OWNER_EVENT_BYTES_PER_DAY`, default 512 MiB, at least 1 MiB):
    /// the stream is shared and drops its oldest events when full. A run that goes past it ends
    /// with `RUN_ERROR` `quota_exceeded`.
    pub owner_event_bytes_per_day: u64,
    /// Prompts one owner may have waiting for an answer, across every worker
    /// (`SB_WORKER_MAX_PENDING_PROMPTS_PER_OWNER`, default 100): a run that would ask one more
    /// ends with `RUN_ERROR` `quota_exceeded`, naming the setting.
    pub max_pending_prompts_per_owner: usize,
}

impl Config {
    /// Reads the settings from the environment.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        let concurrency: usize = env.or("SB_WORKER_CONCURRENCY", 16)?;
        if concurrency == 0 {
            return Err(ConfigError::Invalid {
                name: "SB_WORKER_CONCURRENCY".to_owned(),
                reason: "must be at least 1".to_owned(),
            });
        }
        let ack_wait_secs: u64 = env.or("SB_WORKER_ACK_WAIT_SECS", 30)?;
        if ack_wait_secs < 3 {
            return Err(ConfigError::Invalid {
                name: "SB_WORKER_ACK_WAIT_SECS".to_owned(),
                reason: "must be at least 3".to_owned(),
            });
        }
        let production = env.production()?;
        let test_agents = env.or("SB_WORKER_TEST_AGENTS", !production)?;
        if production && test_agents {
            return Err(ConfigError::Invalid {
                name: "SB_WORKER_TEST_AGENTS".to_owned(),
                reason: "the built-in test agents are refused with SB_ENV=production".to_owned(),
            });
        }
        Ok(Self {
            addr: env.or("SB_WORKER_ADDR", SocketAddr::from(([127, 0, 0, 1], 8084)))?,
            nats: env.nats()?,
            concurrency,
            max_runs_per_owner: env
                .or("SB_WORKER_MAX_RUNS_PER_OWNER", concurrency.div_ceil(2))?
                .max(1),
            fleet_max_in_flight: env.or("SB_WORKER_FLEET_MAX_IN_FLIGHT", 4096)?,
            ack_wait: std::time::Duration::from_secs(ack_wait_secs),
            drain: std::time::Duration::from_secs(env.or("SB_WORKER_DRAIN_SECS", 300)?),
            openai: openai::OpenAiConfig::from_env(env)?,
            s3: match env.raw("SB_S3_BUCKET") {
                Some(_) => Some(platform::s3::S3Config::from_env(env)?),
                None => None,
            },
            extraction: attachments::ExtractionConfig::from_env(env)?,
            agents_file: env
                .raw("SB_WORKER_AGENTS_FILE")
                .map(std::path::PathBuf::from),
            test_agents,
            owner_event_bytes_per_day: {
                let bytes: u64 = env.or(EVENT_BYTES_VAR, 512 * 1024 * 1024)?;
                if bytes < 1024 * 1024 {
                    return Err(ConfigError::Invalid {
                        name: EVENT_BYTES_VAR.to_owned(),
                        reason: "must be at least 1048576 (a run's events may be large)".to_owned(),
                    });
                }
                bytes
            },
            max_pending_prompts_per_owner: {
                let max = env.positive("SB_WORKER_MAX_PENDING_PROMPTS_PER_OWNER", 100)?;
                // The owner's set is one KV record of ~80 bytes a prompt, under the 1 MiB message.
                if max > 10_000 {
                    return Err(ConfigError::Invalid {
                        name: "SB_WORKER_MAX_PENDING_PROMPTS_PER_OWNER".to_owned(),
                        reason: "must be at most 10000".to_owned(),
                    });
                }
                usize::try_from(max).unwrap_or(usize::MAX)
            },
        })
    }
}

/// The setting of [`Config::owner_event_bytes_per_day`].
pub const EVENT_BYTES_VAR: &str = "SB_WORKER_OWNER_EVENT_BYTES_PER_DAY";

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&'static str, &'static str)]) -> Result<Config, ConfigError> {
        Config::from_env(&Env::from_pairs(pairs.iter().copied()))
    }

    #[test]
    fn the_test_agents_run_in_development_and_are_refused_in_production() {
        assert!(config(&[]).unwrap().test_agents);
        assert!(
            !config(&[("SB_WORKER_TEST_AGENTS", "false")])
                .unwrap()
                .test_agents
        );
        let production = [("SB_ENV", "production"), ("SB_NATS_ALLOW_INSECURE", "true")];
        assert!(!config(&production).unwrap().test_agents);
        let refused = config(&[
            production[0],
            production[1],
            ("SB_WORKER_TEST_AGENTS", "true"),
        ])
        .err()
        .map(|e| e.to_string());
        assert!(
            refused
                .as_deref()
                .is_some_and(|e| e.contains("SB_WORKER_TEST_AGENTS")),
            "{refused:?}"
        );
        let unauthenticated = config(&[("SB_ENV", "production")])
            .err()
            .map(|e| e.to_string());
        assert!(
            unauthenticated
                .as_deref()
                .is_some_and(|e| e.contains("SB_NATS_USER")),
            "the worker reads SB_ENV too: {unauthenticated:?}"
        );
    }
}
