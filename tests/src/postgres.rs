//! A PostgreSQL server of one test's own, for the tests that stop and start it: the project's
//! server is shared by every test running at the same time, so it is never restarted.
//!
//! Made like `scripts/infra.sh` makes the project's (the Debian PostgreSQL binaries, run as the
//! `postgres` user when we are root), in a temporary folder, on a free port of 127.0.0.1, with
//! `trust` authentication (loopback only) and `fsync` off: a test restarts it with a fast
//! shutdown, which checkpoints, never with a crash.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context as _, bail};
use sqlx::Connection as _;

use crate::free_port;

/// The folder of the server binaries: Debian's PostgreSQL 15, or any other version installed.
fn bin_dir() -> anyhow::Result<PathBuf> {
    let root = Path::new("/usr/lib/postgresql");
    let mut candidates = vec![root.join("15/bin")];
    if let Ok(versions) = std::fs::read_dir(root) {
        candidates.extend(versions.flatten().map(|v| v.path().join("bin")));
    }
    candidates
        .into_iter()
        .find(|dir| dir.join("postgres").exists() && dir.join("pg_ctl").exists())
        .context(
            "no PostgreSQL server binaries in /usr/lib/postgresql/*/bin \
             (scripts/infra.sh installs postgresql-15)",
        )
}

/// A running (or stopped) private PostgreSQL server; stopped and its folder removed on drop.
pub struct Postgres {
    /// URL of its `switchboard` database, as the services take it.
    pub url: String,
    port: u16,
    bin: PathBuf,
    dir: PathBuf,
    running: bool,
}

impl Postgres {
    /// Creates a cluster in a new temporary folder, starts it and creates the `switchboard`
    /// database.
    pub async fn start() -> anyhow::Result<Self> {
        let bin = bin_dir()?;
        let dir = std::env::temp_dir().join(format!("sb-postgres-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(dir.join("socket"))?;
        if rustix::process::getuid().is_root() {
            // PostgreSQL refuses to run as root: the folder is the postgres user's.
            let status = tokio::process::Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .await?;
            anyhow::ensure!(
                status.success(),
                "cannot give {} to postgres",
                dir.display()
            );
        }
        let port = free_port()?;
        let mut server = Self {
            url: format!("postgres://postgres@127.0.0.1:{port}/switchboard"),
            port,
            bin,
            dir,
            running: false,
        };
        let data = server.dir.join("data");
        server
            .pg("initdb", |c| {
                c.arg("-D")
                    .arg(&data)
                    .args(["-U", "postgres", "--auth=trust", "-E", "UTF8"])
                    .args(["--locale=C.UTF-8", "--no-sync"]);
            })
            .await?;
        server.start_again().await?;
        let admin = format!("postgres://postgres@127.0.0.1:{port}/postgres");
        let mut connection = sqlx::PgConnection::connect(&admin).await?;
        sqlx::query("CREATE DATABASE switchboard")
            .execute(&mut connection)
            .await?;
        connection.close().await?;
        Ok(server)
    }

    /// Runs the server program `program` (`initdb`, `pg_ctl`) as the postgres user, its output
    /// appended to `pg.log` in the folder, failing unless it succeeds.
    async fn pg(
        &self,
        program: &str,
        args: impl FnOnce(&mut tokio::process::Command),
    ) -> anyhow::Result<()> {
        let log = self.dir.join("pg.log");
        let output = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let mut command = if rustix::process::getuid().is_root() {
            let mut command = tokio::process::Command::new("runuser");
            command.args(["-u", "postgres", "--"]);
            command.arg(self.bin.join(program));
            command
        } else {
            tokio::process::Command::new(self.bin.join(program))
        };
        args(&mut command);
        let status = command
            .stdin(Stdio::null())
            .stdout(output.try_clone()?)
            .stderr(output)
            .status()
            .await
            .with_context(|| format!("cannot run {program}"))?;
        if !status.success() {
            bail!(
                "{program} failed ({status}); see {}:\n{}",
                log.display(),
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        Ok(())
    }

    /// Starts the server on its data folder and waits until it accepts connections.
    pub async fn start_again(&mut self) -> anyhow::Result<()> {
        let (data, socket, port) = (self.dir.join("data"), self.dir.join("socket"), self.port);
        self.pg("pg_ctl", |c| {
            c.arg("-D")
                .arg(&data)
                .args(["-w", "-t", "60", "-o"])
                .arg(format!(
                    "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
                    socket.display()
                ));
            c.arg("start");
        })
        .await?;
        self.running = true;
        Ok(())
    }

    /// Stops the server with a fast shutdown (clients disconnected, a checkpoint written) and
    /// waits until it is gone.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        let data = self.dir.join("data");
        self.pg("pg_ctl", |c| {
            c.arg("-D").arg(&data).args(["-w", "-m", "fast", "stop"]);
        })
        .await?;
        self.running = false;
        Ok(())
    }
}

impl Drop for Postgres {
    /// Stops the server at once (`immediate`: nothing of it is kept) and removes its folder,
    /// unless the test failed: then the folder (its `pg.log`) is kept and named.
    fn drop(&mut self) {
        if self.running {
            let pg_ctl = self.bin.join("pg_ctl");
            let mut command = if rustix::process::getuid().is_root() {
                let mut command = std::process::Command::new("runuser");
                command.args(["-u", "postgres", "--"]).arg(pg_ctl);
                command
            } else {
                std::process::Command::new(pg_ctl)
            };
            let _ = command
                .arg("-D")
                .arg(self.dir.join("data"))
                .args(["-w", "-m", "immediate", "stop"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        if std::thread::panicking() {
            eprintln!("private PostgreSQL kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
