//! The production-shaped topology on one machine, for the tests that break it: a 3-node NATS
//! JetStream cluster with a user per service (`platform::nats_auth`), two (or more) replicas of
//! every service binary connected as those users, and the gateway in front of them.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use anyhow::Context as _;
use protocol::messaging::Names;
use secrecy::ExposeSecret as _;
use test_support::Infra;

use crate::gateway::{Gateway, Upstreams, workspace_root};
use crate::netns::Netns;
use crate::{EVENTUAL, binary_env, free_port, start_binary_logging, wait_http_ok};

/// The nats-server binary: `SB_TEST_NATS_SERVER`, the one `scripts/infra.sh` installed, or
/// the one on the `PATH`.
pub fn nats_server() -> PathBuf {
    if let Ok(path) = std::env::var("SB_TEST_NATS_SERVER") {
        return PathBuf::from(path);
    }
    let installed = workspace_root().join(".data/tools/venv/bin/nats-server");
    if installed.exists() {
        installed
    } else {
        PathBuf::from("nats-server")
    }
}

/// The password of `user` on a test cluster.
fn password(user: &str) -> String {
    format!("{user}-test-password")
}

struct Node {
    name: String,
    /// The address it listens on (clients, routes, monitoring) and is reached at.
    host: String,
    client_port: u16,
    monitor_port: u16,
    config: PathBuf,
    child: Option<Child>,
}

/// A NATS cluster of JetStream nodes on loopback, each with its own store, the services'
/// users and permissions, and an `admin` user for the test itself.
pub struct NatsCluster {
    nodes: Vec<Node>,
    dir: PathBuf,
    /// The prefix of the deployment the permissions are made for.
    pub names: Names,
    /// The namespace of the node that can be partitioned, and its index; dropped after the
    /// nodes are stopped (fields drop after [`Drop::drop`]).
    isolable: Option<(Netns, usize)>,
}

impl NatsCluster {
    /// Starts `size` nodes and waits until every one is healthy (JetStream has a meta leader).
    pub async fn start(size: usize, names: Names) -> anyhow::Result<Self> {
        Self::start_with(size, names, None).await
    }

    /// Like [`NatsCluster::start`], with the last node in a network namespace of its own
    /// ([`Netns`]), so that [`NatsCluster::partition`] can cut it off from the other nodes and
    /// from every client while it keeps running. Every node then listens on an address of the
    /// veth pair (this side's for the others), not on 127.0.0.1.
    pub async fn start_partitionable(size: usize, names: Names) -> anyhow::Result<Self> {
        let netns = Netns::create()?;
        Self::start_with(size, names, Some((netns, size - 1))).await
    }

    async fn start_with(
        size: usize,
        names: Names,
        isolable: Option<(Netns, usize)>,
    ) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("sb-nats-cluster-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir)?;
        let ports: Vec<(u16, u16, u16)> = (0..size)
            .map(|_| Ok((free_port()?, free_port()?, free_port()?)))
            .collect::<anyhow::Result<_>>()?;
        let host = |index: usize| match &isolable {
            None => "127.0.0.1".to_owned(),
            Some((netns, isolated)) if *isolated == index => netns.ns_addr.to_string(),
            Some((netns, _)) => netns.host_addr.to_string(),
        };
        let routes = ports
            .iter()
            .enumerate()
            .map(|(index, (_, route, _))| format!("\"nats-route://{}:{route}\"", host(index)))
            .collect::<Vec<_>>()
            .join(", ");
        let authorization = platform::nats_auth::authorization_block(&names);
        let mut nodes = Vec::new();
        for (index, (client, route, monitor)) in ports.into_iter().enumerate() {
            let name = format!("n{}", index + 1);
            let host = host(index);
            let store = dir.join(&name);
            let config = dir.join(format!("{name}.conf"));
            std::fs::write(
                &config,
                format!(
                    "server_name: {name}\nlisten: {host}:{client}\nhttp: {host}:{monitor}\n\
                     log_file: \"{}\"\n\
                     jetstream {{ store_dir: \"{}\", max_file_store: 4GB, max_memory_store: 256MB }}\n\
                     cluster {{ name: sbtest, listen: {host}:{route}, routes: [{routes}] }}\n\
                     {authorization}",
                    dir.join(format!("{name}.log")).display(),
                    store.display()
                ),
            )?;
            nodes.push(Node {
                name,
                host,
                client_port: client,
                monitor_port: monitor,
                config,
                child: None,
            });
        }
        let mut cluster = Self {
            nodes,
            dir,
            names,
            isolable,
        };
        for index in 0..size {
            cluster.spawn(index)?;
        }
        for index in 0..size {
            cluster.wait_healthy(index).await?;
        }
        Ok(cluster)
    }

    fn spawn(&mut self, index: usize) -> anyhow::Result<()> {
        let mut command = match &self.isolable {
            Some((netns, isolated)) if *isolated == index => netns.command(nats_server()),
            _ => Command::new(nats_server()),
        };
        let node = &mut self.nodes[index];
        command.arg("-c").arg(&node.config);
        for user in platform::nats_auth::SERVICES.iter().chain(&["admin"]) {
            command.env(
                format!("SB_NATS_PASSWORD_{}", user.to_uppercase()),
                password(user),
            );
        }
        node.child = Some(
            command
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("cannot start nats-server (scripts/infra.sh installs it)")?,
        );
        Ok(())
    }

    /// Waits until node `index` says it is healthy (`/healthz`: JetStream current with its
    /// meta leader).
    pub async fn wait_healthy(&self, index: usize) -> anyhow::Result<()> {
        let node = &self.nodes[index];
        let url = format!("{}/healthz", self.monitor_url(index));
        wait_http_ok(&url, EVENTUAL * 3, &format!("NATS node {}", node.name)).await
    }

    /// Every node's client URL, comma-separated (what `SB_NATS_URL` takes).
    pub fn url(&self) -> String {
        self.urls().join(",")
    }

    /// Every node's client URL.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("nats://{}:{}", n.host, n.client_port))
            .collect()
    }

    /// The base URL of node `index`'s monitoring endpoints (`/healthz`, `/jsz`, ...).
    pub fn monitor_url(&self, index: usize) -> String {
        let node = &self.nodes[index];
        format!("http://{}:{}", node.host, node.monitor_port)
    }

    /// The server name of node `index` (`n1`, `n2`, ...), as JetStream names leaders.
    pub fn node_name(&self, index: usize) -> &str {
        &self.nodes[index].name
    }

    /// The index of the node [`NatsCluster::partition`] cuts off, when the cluster was started
    /// with [`NatsCluster::start_partitionable`].
    pub fn isolable(&self) -> Option<usize> {
        self.isolable.as_ref().map(|(_, index)| *index)
    }

    /// Cuts the isolable node off from the other nodes and from every client: its process keeps
    /// running, its connections hang, every packet to or from it is lost until
    /// [`NatsCluster::heal`].
    pub fn partition(&self) -> anyhow::Result<()> {
        self.netns()?.partition()
    }

    /// Ends [`NatsCluster::partition`]: packets flow again on the connections that survived it.
    pub fn heal(&self) -> anyhow::Result<()> {
        self.netns()?.heal()
    }

    fn netns(&self) -> anyhow::Result<&Netns> {
        self.isolable
            .as_ref()
            .map(|(netns, _)| netns)
            .context("the cluster was not started with start_partitionable")
    }

    /// Kills node `index` with SIGKILL (a node lost, not shut down).
    pub fn kill(&mut self, index: usize) -> anyhow::Result<()> {
        if let Some(mut child) = self.nodes[index].child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Starts node `index` again on its store and waits until it is healthy.
    pub async fn restart(&mut self, index: usize) -> anyhow::Result<()> {
        self.spawn(index)?;
        self.wait_healthy(index).await
    }

    /// A client connected as `admin` (every permission), for checks and clean-up.
    pub async fn admin(&self) -> anyhow::Result<async_nats::Client> {
        Ok(
            async_nats::ConnectOptions::with_user_and_password("admin".into(), password("admin"))
                .connect(self.urls())
                .await?,
        )
    }

    /// A client connected as `admin` to the nodes `indexes` only (one side of a partition).
    pub async fn admin_at(&self, indexes: &[usize]) -> anyhow::Result<async_nats::Client> {
        let urls = self.urls();
        let urls: Vec<&String> = indexes.iter().map(|&index| &urls[index]).collect();
        Ok(
            async_nats::ConnectOptions::with_user_and_password("admin".into(), password("admin"))
                .connect(urls)
                .await?,
        )
    }

    /// A client connected as `user` with its password.
    pub async fn connect_as(&self, user: &str) -> anyhow::Result<async_nats::Client> {
        Ok(
            async_nats::ConnectOptions::with_user_and_password(user.into(), password(user))
                .custom_inbox_prefix(platform::nats_auth::inbox_prefix(user))
                .connect(self.urls())
                .await?,
        )
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // A failed test leaves the nodes' logs (permission violations are logged there) and
        // those of a fleet's services.
        if std::thread::panicking() || std::env::var_os("SB_TEST_KEEP_NATS_LOGS").is_some() {
            eprintln!(
                "NATS cluster (and fleet) logs kept in {}",
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// One replica of a service binary.
struct Replica {
    service: &'static str,
    port: u16,
    child: Option<Child>,
}

/// Every service as `replicas` processes on the cluster, connected as their own NATS users,
/// with streams and buckets of 3 replicas, and the gateway routing to all of them.
pub struct Fleet {
    /// The gateway's origin: what clients use.
    pub gateway: Gateway,
    /// The NATS cluster.
    pub nats: NatsCluster,
    /// Infrastructure and token minting.
    pub infra: Infra,
    replicas: Vec<Replica>,
    env: Vec<(String, String)>,
}

/// The services a fleet runs, in start order.
pub const SERVICES: [&str; 4] = ["attachments", "history", "runs", "worker"];

impl Fleet {
    /// Starts the cluster, `replicas` of every service and the gateway; ready when it returns.
    pub async fn start(replicas: usize, extra_env: &[(&str, &str)]) -> anyhow::Result<Self> {
        let names = Infra::from_env().fresh_nats().names;
        let nats = NatsCluster::start(3, names).await?;
        Self::start_on(nats, None, replicas, extra_env).await
    }

    /// Like [`Fleet::start`], on a cluster the caller started (with
    /// [`NatsCluster::start_partitionable`], say) and, when `database` names one, with history
    /// and attachments on that database instead of a fresh one of the project's server.
    pub async fn start_on(
        nats: NatsCluster,
        database: Option<&str>,
        replicas: usize,
        extra_env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let infra = Infra::from_env();
        let names = nats.names.clone();
        let s3 = infra.fresh_s3();
        let database = match database {
            Some(url) => url.to_owned(),
            None => infra.fresh_database().await?.expose_secret().to_owned(),
        };
        let gateway_port = free_port()?;
        let mut env = binary_env(&infra, &nats.url(), names.prefix(), &s3, &database);
        env.extend(
            [
                ("SB_NATS_REPLICAS", "3".to_owned()),
                (
                    "SB_ATTACHMENTS_PUBLIC_URL",
                    format!("http://127.0.0.1:{gateway_port}"),
                ),
                ("SB_RUNS_RATE_PER_MINUTE", "100000".to_owned()),
                ("SB_RUNS_RATE_BURST", "100000".to_owned()),
            ]
            .map(|(name, value)| (name.to_owned(), value)),
        );
        env.extend(
            extra_env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        let mut fleet_replicas = Vec::new();
        for service in SERVICES {
            for _ in 0..replicas {
                fleet_replicas.push(Replica {
                    service,
                    port: free_port()?,
                    child: None,
                });
            }
        }
        let upstream = |service: &str| {
            fleet_replicas
                .iter()
                .filter(|r| r.service == service)
                .map(|r| format!("127.0.0.1:{}", r.port))
                .collect()
        };
        let upstreams = Upstreams {
            runs: upstream("runs"),
            history: upstream("history"),
            attachments: upstream("attachments"),
        };
        let gateway = Gateway::start(gateway_port, &upstreams, None).await?;
        let mut fleet = Self {
            gateway,
            nats,
            infra,
            replicas: fleet_replicas,
            env,
        };
        fleet.setup_nats().await?;
        for index in 0..fleet.replicas.len() {
            fleet.spawn(index)?;
        }
        for index in 0..fleet.replicas.len() {
            fleet.wait_ready(index).await?;
        }
        Ok(fleet)
    }

    /// Creates the streams and buckets as a deployment's Job does, before any service starts:
    /// `switchboard-runs nats-setup` as the NATS admin (the services' own users may not).
    async fn setup_nats(&self) -> anyhow::Result<()> {
        let mut setup = Command::new(crate::binary("switchboard-runs")?);
        setup
            .env_clear()
            .envs(self.env.iter().cloned())
            .env("SB_NATS_USER", "admin")
            .env("SB_NATS_PASSWORD", password("admin"))
            .arg("nats-setup")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let status = tokio::task::spawn_blocking(move || setup.status()).await??;
        anyhow::ensure!(status.success(), "nats-setup failed: {status}");
        Ok(())
    }

    fn index(&self, service: &str, replica: usize) -> anyhow::Result<usize> {
        self.replicas
            .iter()
            .enumerate()
            .filter(|(_, r)| r.service == service)
            .nth(replica)
            .map(|(index, _)| index)
            .with_context(|| format!("no replica {replica} of {service}"))
    }

    fn spawn(&mut self, index: usize) -> anyhow::Result<()> {
        let replica = &self.replicas[index];
        let mut env = self.env.clone();
        env.push(("SB_NATS_USER".into(), replica.service.to_owned()));
        env.push(("SB_NATS_PASSWORD".into(), password(replica.service)));
        // Its log lines go beside the nodes' logs, kept when a test fails.
        let service = replica.service;
        let same = self.replicas[..index]
            .iter()
            .filter(|r| r.service == service)
            .count();
        let logs = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.nats.dir.join(format!("{service}-{same}.log")))?;
        let child = start_binary_logging(service, replica.port, &env, logs.into())?;
        self.replicas[index].child = Some(child);
        Ok(())
    }

    async fn wait_ready(&self, index: usize) -> anyhow::Result<()> {
        let replica = &self.replicas[index];
        let url = format!("http://127.0.0.1:{}/readyz", replica.port);
        // Generous: on a 3-node cluster sharing 2 cores with other tests, every replica creating
        // its streams, buckets and durables at once waits on the JetStream meta leader (a request
        // may time out after 5 s and be retried); ready late is not wrong.
        wait_http_ok(&url, EVENTUAL * 9, replica.service).await
    }

    /// The base URL of one replica (its own port, bypassing the gateway).
    pub fn replica_url(&self, service: &str, replica: usize) -> anyhow::Result<String> {
        let index = self.index(service, replica)?;
        Ok(format!("http://127.0.0.1:{}", self.replicas[index].port))
    }

    /// SIGKILL to one replica (a crashed pod), then starts it again and waits until ready.
    pub async fn crash_and_restart(&mut self, service: &str, replica: usize) -> anyhow::Result<()> {
        let index = self.index(service, replica)?;
        if let Some(mut child) = self.replicas[index].child.take() {
            child.kill()?;
            child.wait()?;
        }
        self.spawn(index)?;
        self.wait_ready(index).await
    }

    /// A rolling restart's step: SIGTERM to one replica, waits for it to drain and exit
    /// (returning its exit code), then starts it again and waits until ready.
    pub async fn restart_gracefully(
        &mut self,
        service: &str,
        replica: usize,
    ) -> anyhow::Result<Option<i32>> {
        let index = self.index(service, replica)?;
        let mut code = None;
        if let Some(mut child) = self.replicas[index].child.take() {
            Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status()?;
            let waited = tokio::task::spawn_blocking(move || child.wait()).await??;
            code = waited.code();
        }
        self.spawn(index)?;
        self.wait_ready(index).await?;
        Ok(code)
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for replica in &mut self.replicas {
            if let Some(mut child) = replica.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
