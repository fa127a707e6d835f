//! The worker: a durable pull consumer of accepted runs that drives an agent backend and
//! publishes every event of the run, in order, to the run's event subject.

pub mod agent;
pub mod attachments;
mod bus;
mod config;
mod deadlines;
pub mod generated;
pub mod openai;
pub mod registry;
pub mod remote;
pub mod sink;
mod store;

pub use config::{Config, EVENT_BYTES_VAR};

use std::sync::Arc;

use anyhow::Context as _;
use platform::config::{ConfigError, Env};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The built worker, consuming once run.
pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    consumer: bus::consumer::RunConsumer,
}

impl platform::service::Service for Application {
    type Config = Config;
    const NAME: &'static str = "worker";

    fn config(env: &Env) -> Result<Config, ConfigError> {
        Config::from_env(env)
    }

    /// Connects, makes sure the streams and the durable consumer exist, binds the health port.
    async fn build(config: Config) -> anyhow::Result<Self> {
        // The extraction helpers run as this user: non-dumpable, this process's memory and
        // environment (S3, NATS and model secrets) are closed to them (/proc/<pid>/environ).
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
            .context("cannot make the worker non-dumpable")?;
        // The test agents when enabled; the model backend when configured, then the default
        // (a remote agent marked default in the agents file takes its place).
        let mut agents: Vec<Arc<dyn agent::Agent>> = Vec::new();
        if config.test_agents {
            agents.push(Arc::new(agent::EchoAgent));
            agents.push(Arc::new(agent::TextOnlyEcho));
        }
        let default = match &config.openai {
            Some(openai) => {
                agents.push(Arc::new(openai::OpenAiAgent::new(openai.clone())?));
                Some("openai")
            }
            None => config.test_agents.then_some("echo"),
        };
        let agents = match default {
            Some(default) => registry::AgentSet::new(agents, default)?,
            None => registry::AgentSet::without_default(),
        };
        Application::build_with_agents(config, agents).await
    }

    /// The bound health port.
    fn port(&self) -> u16 {
        platform::service::port(&self.listener)
    }

    /// Consumes runs until `shutdown` is cancelled, then lets in-flight runs finish.
    async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let http = platform::http::serve(self.listener, self.router, shutdown.clone());
        let (http, consumed) = tokio::join!(http, self.consumer.run(shutdown));
        http.context("worker health server failed")?;
        consumed
    }
}

impl Application {
    /// Like [`Application::build`], with other agents.
    pub async fn build_with_agents(
        config: Config,
        agents: registry::AgentSet,
    ) -> anyhow::Result<Self> {
        let (client, js) = platform::nats::connect(&config.nats, "worker").await?;
        platform::nats::ensure_streams(&js, &config.nats).await?;
        let buckets = platform::lifecycle::ensure_run_buckets(&js, &config.nats).await?;
        let agents = match &config.agents_file {
            None => agents,
            Some(path) => {
                let reserved = agents.names();
                let reserved: Vec<&str> = reserved.iter().map(String::as_str).collect();
                let configs =
                    remote::config::load(path, &reserved, |name| std::env::var(name).ok())?;
                let context = remote::RelayContext {
                    client: client.clone(),
                    names: config.nats.names.clone(),
                    threads: buckets.thread_state.clone(),
                };
                let mut remote_agents = Vec::with_capacity(configs.len());
                for agent in configs {
                    tracing::info!(agent = %agent.name, url = %agent.url, "remote agent configured");
                    remote_agents.push(remote::RemoteAgent::new(agent, context.clone())?);
                }
                agents.with_remote(remote_agents)?
            }
        };
        anyhow::ensure!(
            agents.has_default(),
            "no default agent: configure the model backend (SB_OPENAI_*), mark an agent of \
             SB_WORKER_AGENTS_FILE default = true, or enable the test agents \
             (SB_WORKER_TEST_AGENTS=true, development only)"
        );
        let reader = config.s3.as_ref().map(|s3| {
            let extractor = attachments::Extractor::new(&config.extraction);
            attachments::AttachmentReader::new(s3, extractor)
        });
        if reader.is_none() {
            tracing::warn!(
                "SB_S3_BUCKET is unset: attachments are described to the agent as unavailable"
            );
        }
        let consumer = bus::consumer::RunConsumer::new(
            client,
            js.clone(),
            &config.nats,
            buckets,
            Arc::new(agents),
            reader,
            bus::consumer::Capacity {
                concurrency: config.concurrency,
                max_runs_per_owner: config.max_runs_per_owner,
                fleet_max_in_flight: config.fleet_max_in_flight,
                drain: config.drain,
                ack_wait: config.ack_wait,
                owner_event_bytes_per_day: config.owner_event_bytes_per_day,
                max_pending_prompts_per_owner: config.max_pending_prompts_per_owner,
            },
        )
        .await?;
        let router = platform::http::health_routes(vec![("nats", platform::nats::probe(js))]);
        let listener = platform::service::bind(config.addr).await?;
        Ok(Self {
            listener,
            router,
            consumer,
        })
    }
}
