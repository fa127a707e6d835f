//! Real AG-UI agent servers for the worker's remote-agent tests: `tests/agents/serve.py`, the
//! deterministic Pydantic AI or LangGraph agent, started as a child process of the test.
//!
//! [`AgentServer::spawn`] starts it with the Python of the agents' virtualenv
//! (`SB_TEST_AGENTS_PYTHON`, which `scripts/test.sh` exports) on a port of its choosing, and
//! fails, naming why, when that Python is not set or the server does not say `listening <port>`
//! in time: a test that needs a real agent never passes without one. The server's log
//! (`request <runId>` per POST, `closed <runId>` when the client left mid-stream) is what a test
//! asserts on. [`AgentsFile`] writes the worker's `SB_WORKER_AGENTS_FILE` for a list of agents.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::AsyncBufReadExt as _;

/// The variable naming the Python of the agents' virtualenv (`$DATA/agents-venv/bin/python`).
pub const PYTHON_VAR: &str = "SB_TEST_AGENTS_PYTHON";

/// How long a server may take to import its framework and start listening (a loaded machine).
const START_WITHIN: Duration = Duration::from_secs(60);

/// A running `tests/agents/serve.py`; killed (and its files removed) when dropped.
pub struct AgentServer {
    framework: String,
    port: u16,
    child: tokio::process::Child,
    // Last: removed after the child is killed.
    dir: TempDir,
}

/// A directory removed when dropped (also when a start is abandoned half-way).
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl AgentServer {
    /// Starts `serve.py --framework <framework>` (`pydantic` or `langgraph`) on a free port and
    /// waits for its `listening <port>` line.
    pub async fn spawn(framework: &str) -> anyhow::Result<Self> {
        let python = std::env::var_os(PYTHON_VAR).with_context(|| {
            format!(
                "{PYTHON_VAR} is not set: run scripts/test.sh (it makes the agents' virtualenv), \
                 or export {PYTHON_VAR}=<repo>/.data/agents-venv/bin/python"
            )
        })?;
        let script = crate::gateway::workspace_root().join("tests/agents/serve.py");
        let dir = TempDir(std::env::temp_dir().join(format!(
            "sb-agent-{framework}-{}",
            uuid::Uuid::new_v4().simple()
        )));
        std::fs::create_dir_all(&dir.0)
            .with_context(|| format!("cannot make {}", dir.0.display()))?;
        let stderr = std::fs::File::create(dir.0.join("stderr"))?;
        let mut child = tokio::process::Command::new(&python)
            .arg(&script)
            .args(["--framework", framework, "--port", "0", "--log"])
            .arg(dir.0.join("log"))
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!(
                    "cannot start {} {} ({PYTHON_VAR})",
                    Path::new(&python).display(),
                    script.display()
                )
            })?;
        let stdout = child
            .stdout
            .take()
            .context("the agent server's stdout is piped")?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let first = match tokio::time::timeout(START_WITHIN, lines.next_line()).await {
            Ok(Ok(Some(line))) => Ok(line),
            Ok(Ok(None)) => Err("it exited".to_owned()),
            Ok(Err(err)) => Err(format!("its stdout was unreadable: {err}")),
            Err(_) => Err(format!("nothing within {START_WITHIN:?}")),
        };
        let port = first.as_ref().ok().and_then(|line| {
            line.strip_prefix("listening ")
                .and_then(|port| port.trim().parse::<u16>().ok())
        });
        let Some(port) = port else {
            let _ = child.start_kill();
            let _ = child.wait().await;
            let stderr = std::fs::read_to_string(dir.0.join("stderr")).unwrap_or_default();
            let tail: Vec<&str> = stderr.lines().rev().take(30).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            let said = first.map_or_else(|why| why, |line| format!("it said {line:?}"));
            bail!(
                "the {framework} agent server did not start (`listening <port>` expected; {said}); \
                 its stderr ends:\n{}",
                tail.join("\n")
            );
        };
        // The rest of its stdout is not read: keep the pipe drained so it never blocks.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Self {
            framework: framework.to_owned(),
            port,
            child,
            dir,
        })
    }

    /// The framework it serves.
    pub fn framework(&self) -> &str {
        &self.framework
    }

    /// Its AG-UI endpoint (`POST` a `RunAgentInput`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    /// Its whole log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("log")).unwrap_or_default()
    }

    /// Its stderr so far (Python warnings and tracebacks), for failure messages.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("stderr")).unwrap_or_default()
    }

    /// How many requests of the run `run_id` it received.
    pub fn requests(&self, run_id: &str) -> usize {
        self.count("request", run_id)
    }

    /// How many of the run `run_id`'s requests the client closed before their end.
    pub fn closed(&self, run_id: &str) -> usize {
        self.count("closed", run_id)
    }

    fn count(&self, what: &str, run_id: &str) -> usize {
        let line = format!("{what} {run_id}");
        self.log().lines().filter(|l| *l == line).count()
    }

    /// Polls the log until the client has closed a request of `run_id`, or fails after `within`
    /// with the log.
    pub async fn wait_closed(&self, run_id: &str, within: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.closed(run_id) > 0 {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "the {} agent's request of {run_id} was not closed within {within:?}; log:\n{}",
                    self.framework,
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

impl Drop for AgentServer {
    /// Kills the server (then its log is removed).
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// One `[[agents]]` entry of the worker's agents file.
#[derive(Debug, Clone)]
pub struct AgentEntry {
    /// `name` (what `forwardedProps.agent` names).
    pub name: String,
    /// `url`.
    pub url: String,
    /// `description`.
    pub description: String,
    /// `default`: runs that name no agent (the WebSocket's) go to it.
    pub default: bool,
    /// More `key = value` lines, as TOML (`run_timeout_secs = 30`).
    pub extra: Vec<String>,
}

impl AgentEntry {
    /// An agent `name` at `url`, described as `"<name> agent at <url>"`, not the default.
    pub fn new(name: &str, url: &str) -> Self {
        Self {
            name: name.to_owned(),
            url: url.to_owned(),
            description: format!("{name} agent at {url}"),
            default: false,
            extra: Vec::new(),
        }
    }

    fn toml(&self) -> String {
        // A JSON string is a valid TOML basic string (the same escapes).
        let quote = |s: &str| serde_json::Value::from(s).to_string();
        let mut entry = format!(
            "[[agents]]\nname = {}\nurl = {}\ndescription = {}\n",
            quote(&self.name),
            quote(&self.url),
            quote(&self.description)
        );
        if self.default {
            entry.push_str("default = true\n");
        }
        for line in &self.extra {
            entry.push_str(line);
            entry.push('\n');
        }
        entry.push('\n');
        entry
    }
}

/// The worker's agents file (`SB_WORKER_AGENTS_FILE`, [`crate::Options::agents_file`]) in a
/// uniquely named file under the temporary directory; removed when dropped.
pub struct AgentsFile {
    path: PathBuf,
}

impl AgentsFile {
    /// Writes `agents` as `[[agents]]` tables.
    pub fn write(agents: &[AgentEntry]) -> anyhow::Result<Self> {
        let path =
            std::env::temp_dir().join(format!("sb-agents-{}.toml", uuid::Uuid::new_v4().simple()));
        let text: String = agents.iter().map(AgentEntry::toml).collect();
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(Self { path })
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for AgentsFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agents_file_holds_one_table_per_agent_with_quoted_values() {
        let mut second = AgentEntry::new("b", "http://127.0.0.1:2/");
        second.default = true;
        second.description = "says \"hi\"".to_owned();
        second.extra.push("run_timeout_secs = 30".to_owned());
        let file = AgentsFile::write(&[AgentEntry::new("a", "http://127.0.0.1:1/"), second])
            .unwrap_or_else(|e| panic!("{e}"));
        let text = std::fs::read_to_string(file.path()).unwrap_or_default();
        assert_eq!(
            text,
            "[[agents]]\nname = \"a\"\nurl = \"http://127.0.0.1:1/\"\n\
             description = \"a agent at http://127.0.0.1:1/\"\n\n\
             [[agents]]\nname = \"b\"\nurl = \"http://127.0.0.1:2/\"\n\
             description = \"says \\\"hi\\\"\"\ndefault = true\nrun_timeout_secs = 30\n\n"
        );
        let path = file.path().to_owned();
        drop(file);
        assert!(!path.exists());
    }
}
