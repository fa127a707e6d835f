//! The gateway of `scripts/gateway.sh` (nginx, rendered from `deploy/routes.tsv`) in front of
//! a test's services: one origin, as clients see the platform.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};

/// A running gateway; stopped (nginx and its workers) on drop.
pub struct Gateway {
    /// Its origin, `http://127.0.0.1:<port>`.
    pub url: String,
    child: Child,
    dir: PathBuf,
}

/// The replicas behind each routed service.
#[derive(Debug, Clone, Default)]
pub struct Upstreams {
    /// `host:port` of every runs replica.
    pub runs: Vec<String>,
    /// `host:port` of every history replica.
    pub history: Vec<String>,
    /// `host:port` of every attachments replica.
    pub attachments: Vec<String>,
}

impl Upstreams {
    /// One replica of each, from the services' base URLs (`http://host:port`).
    pub fn single(urls: &crate::Urls) -> Self {
        let host = |url: &str| url.trim_start_matches("http://").to_owned();
        Self {
            runs: vec![host(&urls.runs)],
            history: vec![host(&urls.history)],
            attachments: vec![host(&urls.attachments)],
        }
    }
}

/// The workspace's root folder.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the workspace")
        .to_path_buf()
}

impl Gateway {
    /// Starts the gateway on `port` (see [`crate::free_port`]) and waits until it accepts
    /// connections; `web` is the folder served at `/` (the web client's build).
    pub async fn start(
        port: u16,
        upstreams: &Upstreams,
        web: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("sb-gateway-{port}-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir)?;
        let mut command = Command::new("bash");
        command
            .arg(workspace_root().join("scripts/gateway.sh"))
            .arg("--dir")
            .arg(&dir)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .args(["--runs", &upstreams.runs.join(",")])
            .args(["--history", &upstreams.history.join(",")])
            .args(["--attachments", &upstreams.attachments.join(",")]);
        if let Some(web) = web {
            command.arg("--web").arg(web);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("cannot run scripts/gateway.sh (bash and nginx needed; scripts/infra.sh installs nginx)")?;
        let mut gateway = Self {
            url: format!("http://127.0.0.1:{port}"),
            child,
            dir,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Ok(gateway);
            }
            if let Some(status) = gateway.child.try_wait()? {
                bail!("the gateway exited with {status} (see stderr)");
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("the gateway did not listen on {port} within 20 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Gateway {
    /// A fast shutdown of nginx (SIGTERM to the master stops its workers too).
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
