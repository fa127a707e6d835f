//! The user message's files as content for the agent: each is read from S3 (bounded in size
//! and time) and extracted to text or a vision image by `extract`. A file that cannot be read
//! never fails the run: the agent is told why instead.
//!
//! **Extraction runs in a helper process, a few at a time.** The worker never parses a file
//! itself: each file is streamed from S3 straight into its own `switchboard-extract` process
//! (see `extract::isolate`), which limits its address space to
//! [`ExtractionConfig::memory_mib`] before reading it, and is killed when the file's deadline
//! passes (or the run stops waiting: dropping the extraction kills the process). At most
//! [`ExtractionConfig::concurrency`] helpers run at once per worker; other files wait for a
//! slot within the same per-file deadline and only then open their download. A bomb that
//! needs more memory than allowed ends its helper, and the agent is told the file needs more
//! memory than allowed; the worker and every other run go on.
//!
//! **The worker's peak memory**, whatever users upload:
//!
//! ```text
//! worker RSS   <= base + R x 3 x 2 x (4/3 x max_image_bytes)     files' results held by runs
//!                      + E x 128 KiB                               pipe and copy buffers
//! helpers' RSS <= E x M
//! ```
//!
//! with R = `SB_WORKER_CONCURRENCY` (runs at once, default 16), E =
//! `SB_WORKER_EXTRACT_CONCURRENCY` (default 2), M = `SB_WORKER_EXTRACT_MEMORY_MIB` (default
//! 384 MiB) and `max_image_bytes` = 20 MiB: a vision image's base64 (27 MiB) is the largest
//! result a file can have, held by its run until the agent is done (x2: the reply as read and
//! as decoded, and the `data:` URL the agent builds from it). Text results are at most
//! 100,000 characters. The input file (up to [`MAX_FILE_BYTES`]) is never held by the worker:
//! it lives only in its helper, inside M. With the defaults: base + 16 x 3 x 54 MiB (only if
//! every file of every run is a 20 MiB image) + 768 MiB of helpers.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_s3::error::DisplayErrorContext;
use extract::isolate::{HELPER, Reply, Request};
use extract::{Extracted, Limits};
use platform::config::{ConfigError, Env};
use protocol::metadata::AttachedFile;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// What an agent that reads files here (the built-in ones, the model) is told of an audio file.
pub const AUDIO_NOT_TRANSCRIBED: &str =
    "audio is not transcribed; agents served over AG-UI get the file itself";

/// Files read per message; admission already refuses more.
pub const MAX_FILES: usize = 3;

/// Largest file read at all (the upload limit).
pub const MAX_FILE_BYTES: u64 = 100 * 1024 * 1024;

/// Time allowed for one file: waiting for an extraction slot, download and extraction
/// together. The helper is killed when it passes.
pub const FILE_TIMEOUT: Duration = Duration::from_secs(15);

/// Why a file whose deadline passed before a helper was free was not read.
const WAITED_TOO_LONG: &str = "timed out waiting for the worker's other files to be read";

/// Bytes of a helper's standard error kept for the log.
const MAX_STDERR: usize = 4 * 1024;

/// How the worker extracts files: in helper processes, a few at a time, each with a
/// memory limit (see the module doc for the resulting bound on the worker's memory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtractionConfig {
    /// Helper processes running at once in this worker (`SB_WORKER_EXTRACT_CONCURRENCY`,
    /// default 2, one per core of the reference machine); other files wait for a slot.
    pub concurrency: usize,
    /// Address space each helper may use, in MiB (`SB_WORKER_EXTRACT_MEMORY_MIB`, default
    /// 384, at least 64): the file itself (up to 100 MiB) and everything parsing it takes. A
    /// legitimate 100 MB scanned PDF needs about 200 MiB.
    pub memory_mib: u64,
    /// The helper binary (`SB_WORKER_EXTRACT_HELPER`); by default `switchboard-extract` next
    /// to the worker's executable (or one folder up, where cargo puts test binaries).
    pub helper: Option<PathBuf>,
}

impl Default for ExtractionConfig {
    fn default() -> Self {
        Self {
            concurrency: 2,
            memory_mib: 384,
            helper: None,
        }
    }
}

impl ExtractionConfig {
    /// Reads the settings from the environment.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        let defaults = Self::default();
        let concurrency: usize = env.or("SB_WORKER_EXTRACT_CONCURRENCY", defaults.concurrency)?;
        if concurrency == 0 {
            return Err(ConfigError::Invalid {
                name: "SB_WORKER_EXTRACT_CONCURRENCY".to_owned(),
                reason: "must be at least 1".to_owned(),
            });
        }
        let memory_mib: u64 = env.or("SB_WORKER_EXTRACT_MEMORY_MIB", defaults.memory_mib)?;
        if memory_mib < 64 {
            return Err(ConfigError::Invalid {
                name: "SB_WORKER_EXTRACT_MEMORY_MIB".to_owned(),
                reason: "must be at least 64".to_owned(),
            });
        }
        let helper: Option<PathBuf> = env.optional("SB_WORKER_EXTRACT_HELPER")?;
        if let Some(path) = &helper
            && !path.is_file()
        {
            return Err(ConfigError::Invalid {
                name: "SB_WORKER_EXTRACT_HELPER".to_owned(),
                reason: format!("{} is not a file", path.display()),
            });
        }
        Ok(Self {
            concurrency,
            memory_mib,
            helper,
        })
    }
}

/// Where the helper binary is: `configured`, else next to this executable or one folder up.
fn find_helper(configured: Option<&Path>) -> Option<PathBuf> {
    if let Some(path) = configured {
        return Some(path.to_owned());
    }
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join(HELPER))
        .find(|candidate| candidate.is_file())
}

/// Runs extractions in helper processes, at most [`ExtractionConfig::concurrency`] at once.
/// Cheap to clone: clones share the slots.
#[derive(Debug, Clone)]
pub struct Extractor {
    helper: Option<Arc<Path>>,
    slots: Arc<Semaphore>,
    limits: Limits,
    memory_mib: u64,
}

/// The right to run one helper; the slot is free again when this is dropped.
#[derive(Debug)]
pub struct Slot(#[expect(dead_code, reason = "held for its drop")] OwnedSemaphorePermit);

/// What one extraction gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extraction {
    /// The content, or why there is none (a sentence users may see).
    pub content: Result<Extracted, String>,
    /// The helper's peak resident memory in KiB, when it lived to report it.
    pub helper_peak_kib: Option<u64>,
}

impl Extraction {
    fn failed(reason: impl Into<String>) -> Self {
        Self {
            content: Err(reason.into()),
            helper_peak_kib: None,
        }
    }
}

/// Why feeding the file to the helper stopped.
enum Feed {
    /// Reading the download failed.
    Download(std::io::Error),
    /// The download ended before the size the storage announced.
    Short,
    /// The download went past the size the storage announced.
    Long,
}

impl Extractor {
    /// An extractor with `config`'s slots, memory limit and helper. Without a helper (none
    /// configured, none found) every file is described as unreadable, and this is logged.
    pub fn new(config: &ExtractionConfig) -> Self {
        let helper = find_helper(config.helper.as_deref());
        if helper.is_none() {
            tracing::error!(
                helper = HELPER,
                "the extraction helper is not next to the worker and SB_WORKER_EXTRACT_HELPER is unset: attachments are described to the agent as unreadable"
            );
        }
        Self {
            helper: helper.map(Arc::from),
            slots: Arc::new(Semaphore::new(config.concurrency)),
            limits: Limits::default(),
            memory_mib: config.memory_mib,
        }
    }

    /// Waits for a free extraction slot (`None` only if the slots were closed, which
    /// nothing does).
    pub async fn slot(&self) -> Option<Slot> {
        Arc::clone(&self.slots).acquire_owned().await.ok().map(Slot)
    }

    /// Extracts a file (`file`: its MIME type and name) of `size` bytes read from `body`, in
    /// a helper process that is killed at `deadline` (or when this future is dropped).
    pub async fn run(
        &self,
        _slot: &Slot,
        file: (&str, &str),
        size: u64,
        mut body: impl AsyncRead + Unpin,
        deadline: Instant,
    ) -> Extraction {
        let (mime_type, file_name) = file;
        let Some(helper) = &self.helper else {
            return Extraction::failed("the file could not be processed");
        };
        let mut child = match tokio::process::Command::new(helper.as_ref())
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
        {
            Ok(child) => child,
            Err(err) => {
                tracing::error!(helper = %helper.display(), error = %err, "cannot start the extraction helper");
                return Extraction::failed("the file could not be processed");
            }
        };
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Extraction::failed("the file could not be processed");
        };
        let request = Request {
            mime_type: mime_type.to_owned(),
            file_name: file_name.to_owned(),
            limits: self.limits.clone(),
            memory_bytes: self.memory_mib * 1024 * 1024,
            size,
        };
        let send = async move {
            // A pipe error means the helper stopped reading (it refused the file, or died):
            // its reply or exit status says why. Only the download's own errors count here.
            if stdin.write_all(&request.header()).await.is_err() {
                return Ok(());
            }
            let mut buf = vec![0u8; 64 * 1024];
            let mut sent = 0u64;
            let mut pipe_open = true;
            loop {
                let n = body.read(&mut buf).await.map_err(Feed::Download)?;
                if n == 0 {
                    break;
                }
                sent += n as u64;
                if sent > size {
                    return Err(Feed::Long);
                }
                if pipe_open && stdin.write_all(&buf[..n]).await.is_err() {
                    pipe_open = false;
                }
                if !pipe_open {
                    return Ok(());
                }
            }
            if sent < size {
                return Err(Feed::Short);
            }
            Ok(())
            // Dropping stdin closes the pipe.
        };
        let reply_cap = Reply::max_len(&self.limits);
        let finished = tokio::time::timeout_at(deadline, async {
            let (sent, reply, errors) = tokio::join!(
                send,
                read_capped(stdout, reply_cap),
                read_capped(stderr, MAX_STDERR)
            );
            (sent, reply, errors, child.wait().await)
        })
        .await;
        let Ok((sent, reply, errors, status)) = finished else {
            // Killed now, reaped here: nothing of it outlives the deadline.
            let _ = child.kill().await;
            return Extraction::failed("timed out");
        };
        match sent {
            Ok(()) => {}
            Err(Feed::Download(err)) => {
                tracing::warn!(error = %err, "attachment download broke off");
                return Extraction::failed("the download broke off");
            }
            Err(Feed::Short | Feed::Long) => {
                return Extraction::failed("the file changed size while it was read");
            }
        }
        let errors = String::from_utf8_lossy(&errors.0);
        let (reply, reply_too_long) = reply;
        match status {
            Ok(status) if status.success() => match Reply::decode(&reply) {
                Ok(reply) if !reply_too_long => Extraction {
                    content: reply.result,
                    helper_peak_kib: Some(reply.peak_rss_kib),
                },
                Ok(_) | Err(_) => {
                    tracing::error!(stderr = %errors, "the extraction helper's reply is unreadable");
                    Extraction::failed("the file could not be processed")
                }
            },
            Ok(status) => Extraction::failed(self.explain(status, &errors)),
            Err(err) => {
                tracing::error!(error = %err, "cannot wait for the extraction helper");
                Extraction::failed("the file could not be processed")
            }
        }
    }

    /// Why a helper ended without a reply, in words users may see.
    fn explain(&self, status: ExitStatus, stderr: &str) -> String {
        use std::os::unix::process::ExitStatusExt as _;
        // An allocation over the address-space limit aborts with this message.
        if stderr.contains("memory allocation of") {
            return format!(
                "it needs more than the {} MiB of memory a file may use to be read",
                self.memory_mib
            );
        }
        // SIGXCPU at the CPU limit; SIGKILL past its hard limit.
        if matches!(status.signal(), Some(24 | 9)) {
            return "timed out".to_owned();
        }
        let last = stderr.lines().last().unwrap_or_default();
        tracing::warn!(status = %status, stderr = %last, "the extraction helper failed");
        "the file could not be processed".to_owned()
    }

    /// Extracts `bytes` in a slot of its own, under [`FILE_TIMEOUT`] (tools and tests).
    pub async fn extract_bytes(
        &self,
        mime_type: &str,
        file_name: &str,
        bytes: bytes::Bytes,
    ) -> Extraction {
        let deadline = Instant::now() + FILE_TIMEOUT;
        let Ok(slot) = tokio::time::timeout_at(deadline, self.slot()).await else {
            return Extraction::failed(WAITED_TOO_LONG);
        };
        let Some(slot) = slot else {
            return Extraction::failed("the file could not be processed");
        };
        let size = bytes.len() as u64;
        self.run(&slot, (mime_type, file_name), size, &bytes[..], deadline)
            .await
    }
}

/// Reads at most `cap` bytes of `r` (the rest is read and dropped, so the writer never
/// blocks); the flag says whether there was more.
async fn read_capped(mut r: impl AsyncRead + Unpin, cap: usize) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let limit = u64::try_from(cap).unwrap_or(u64::MAX);
    let _ = (&mut r).take(limit).read_to_end(&mut kept).await;
    let more = tokio::io::copy(&mut r, &mut tokio::io::sink())
        .await
        .is_ok_and(|n| n > 0);
    (kept, more)
}
/// One attached file and what it became for the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachmentContent {
    /// The file, as admission resolved it.
    pub file: AttachedFile,
    /// Its content, or why it could not be read (safe to show users, e.g.
    /// `could not read report.pdf: timed out`).
    pub content: Result<Extracted, String>,
}

/// Reads attachments from the deployment's bucket.
#[derive(Debug, Clone)]
pub struct AttachmentReader {
    client: aws_sdk_s3::Client,
    bucket: String,
    extractor: Extractor,
    max_bytes: u64,
    timeout: Duration,
}

impl AttachmentReader {
    /// A reader of `config`'s bucket with the default limits, extracting with `extractor`.
    pub fn new(config: &platform::s3::S3Config, extractor: Extractor) -> Self {
        Self {
            client: platform::s3::client(config),
            bucket: config.bucket.clone(),
            extractor,
            max_bytes: MAX_FILE_BYTES,
            timeout: FILE_TIMEOUT,
        }
    }

    /// The same reader with other bounds (tests).
    #[must_use]
    pub fn with_bounds(mut self, max_bytes: u64, timeout: Duration) -> Self {
        self.max_bytes = max_bytes;
        self.timeout = timeout;
        self
    }

    /// Reads one file: a free extraction slot, then download and extraction, all under the
    /// per-file timeout (when it passes, the helper is killed).
    async fn read(&self, file: &AttachedFile) -> Result<Extracted, String> {
        let name = file.name();
        let deadline = Instant::now() + self.timeout;
        let failed = |reason: String| format!("could not read {name}: {reason}");
        // Audio is not transcribed here: nothing to download. (An agent served over AG-UI gets
        // the file itself, as a signed link.)
        if file.mime_type.starts_with("audio/") {
            return Ok(Extracted::Unsupported {
                reason: AUDIO_NOT_TRANSCRIBED.to_owned(),
            });
        }
        self.check(file).map_err(failed)?;
        let slot = match tokio::time::timeout_at(deadline, self.extractor.slot()).await {
            Ok(Some(slot)) => slot,
            Ok(None) => return Err(failed("the file could not be processed".to_owned())),
            Err(_) => return Err(failed(WAITED_TOO_LONG.to_owned())),
        };
        match tokio::time::timeout_at(deadline, self.fetch_and_extract(file, &slot, deadline)).await
        {
            Ok(result) => result.map_err(failed),
            Err(_) => Err(failed("timed out".to_owned())),
        }
    }

    fn too_large(&self, size: u64) -> String {
        format!("it is {size} bytes, over the {} limit", mib(self.max_bytes))
    }

    /// What can be refused before any download.
    fn check(&self, file: &AttachedFile) -> Result<(), String> {
        // Defence in depth: admission only resolves files of our bucket.
        if file.bucket != self.bucket {
            return Err("the file is not in this deployment's storage".to_owned());
        }
        if let Some(size) = file.size_bytes.and_then(|s| u64::try_from(s).ok())
            && size > self.max_bytes
        {
            return Err(self.too_large(size));
        }
        Ok(())
    }

    async fn fetch_and_extract(
        &self,
        file: &AttachedFile,
        slot: &Slot,
        deadline: Instant,
    ) -> Result<Extracted, String> {
        let object = self
            .client
            .get_object()
            .bucket(&file.bucket)
            .key(&file.path)
            .send()
            .await
            .map_err(|err| {
                if err
                    .as_service_error()
                    .is_some_and(aws_sdk_s3::operation::get_object::GetObjectError::is_no_such_key)
                {
                    return "the file no longer exists".to_owned();
                }
                tracing::warn!(bucket = %file.bucket, key = %file.path, error = %DisplayErrorContext(&err), "cannot download an attachment");
                "the file storage is unavailable".to_owned()
            })?;
        // The helper is told the size up front (it reads exactly that much); S3 always
        // sends Content-Length for a GetObject.
        let size = object
            .content_length()
            .and_then(|s| u64::try_from(s).ok())
            .ok_or_else(|| "the file storage did not say how large the file is".to_owned())?;
        if size > self.max_bytes {
            return Err(self.too_large(size));
        }
        // Streamed from S3 into the helper: the worker never holds the file.
        let body = object.body.into_async_read();
        let extraction = self
            .extractor
            .run(slot, (&file.mime_type, file.name()), size, body, deadline)
            .await;
        if let Some(kib) = extraction.helper_peak_kib {
            tracing::debug!(
                file.mime_type = %file.mime_type,
                file.bytes = size,
                helper.peak_rss_kib = kib,
                "attachment extracted"
            );
        }
        extraction.content
    }
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes / (1024 * 1024))
}

/// The content of the first [`MAX_FILES`] files, read concurrently (each waits for an
/// extraction slot). Without a reader (no S3 configured) every file is described as
/// unavailable.
pub async fn read_all(
    reader: Option<&AttachmentReader>,
    files: &[AttachedFile],
) -> Vec<AttachmentContent> {
    let reads = files.iter().take(MAX_FILES).map(|file| async move {
        let content = match reader {
            Some(reader) => reader.read(file).await,
            None => Err(format!(
                "could not read {}: file storage is not configured for the agent",
                file.name()
            )),
        };
        AttachmentContent {
            file: file.clone(),
            content,
        }
    });
    futures::future::join_all(reads).await
}
#[cfg(test)]
mod tests {
    use super::*;

    fn file(bucket: &str, size: Option<i64>) -> AttachedFile {
        AttachedFile {
            bucket: bucket.to_owned(),
            path: "u/report.pdf".to_owned(),
            mime_type: "application/pdf".to_owned(),
            file_name: Some("report.pdf".to_owned()),
            size_bytes: size,
        }
    }

    fn reader() -> AttachmentReader {
        // Nothing listens on port 9: a request would fail, so the checks below must refuse first.
        AttachmentReader::new(
            &platform::s3::S3Config {
                endpoint: Some("http://127.0.0.1:9".to_owned()),
                region: "us-east-1".to_owned(),
                access_key: "k".to_owned(),
                secret_key: secrecy::SecretString::from("s"),
                bucket: "mine".to_owned(),
            },
            Extractor::new(&ExtractionConfig::default()),
        )
    }

    #[tokio::test]
    async fn without_storage_every_file_is_unavailable_and_at_most_three_are_read() {
        let files = vec![file("mine", None); 5];
        let read = read_all(None, &files).await;
        assert_eq!(read.len(), MAX_FILES);
        assert_eq!(
            read[0].content,
            Err(
                "could not read report.pdf: file storage is not configured for the agent"
                    .to_owned()
            )
        );
    }

    #[tokio::test]
    async fn other_buckets_and_oversized_files_are_refused_before_any_download() {
        let reader = reader();
        let read = read_all(
            Some(&reader),
            &[
                file("theirs", Some(10)),
                file("mine", Some(100 * 1024 * 1024 + 1)),
            ],
        )
        .await;
        assert_eq!(
            read[0].content,
            Err(
                "could not read report.pdf: the file is not in this deployment's storage"
                    .to_owned()
            )
        );
        assert_eq!(
            read[1].content,
            Err(
                "could not read report.pdf: it is 104857601 bytes, over the 100 MiB limit"
                    .to_owned()
            )
        );
    }

    /// An extractor whose "helper" is the shell script `body`, in a fresh folder (returned
    /// too, for files the script leaves). Environment and arguments are none, as for the
    /// real helper.
    fn fake_helper(body: &str, concurrency: usize) -> (Extractor, PathBuf) {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("sb-fake-helper-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("helper.sh");
        let body = body.replace("$DIR", &dir.display().to_string());
        std::fs::write(&script, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let extractor = Extractor::new(&ExtractionConfig {
            concurrency,
            memory_mib: 384,
            helper: Some(script),
        });
        (extractor, dir)
    }

    /// Whether process `pid` still exists (a zombie counts as gone: it runs nothing).
    fn alive(pid: &str) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| !stat.rsplit(") ").next().unwrap_or("").starts_with('Z'))
    }

    #[tokio::test]
    async fn an_extraction_past_its_deadline_is_killed_not_left_running() {
        // Before issue 14, extraction ran on `spawn_blocking`: the timeout returned, the
        // thread went on parsing. Now the helper process is killed and reaped.
        let (extractor, dir) = fake_helper("echo $$ > $DIR/pid\nexec sleep 60", 1);
        let slot = extractor.slot().await.unwrap();
        let deadline = Instant::now() + Duration::from_millis(500);
        let extraction = extractor
            .run(
                &slot,
                ("application/pdf", "slow.pdf"),
                3,
                &b"pdf"[..],
                deadline,
            )
            .await;
        assert_eq!(extraction.content, Err("timed out".to_owned()));
        let pid = std::fs::read_to_string(dir.join("pid")).unwrap();
        assert!(!alive(pid.trim()), "the helper {} still runs", pid.trim());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn a_dropped_extraction_kills_its_helper() {
        // A cancelled run stops waiting for its files: the helper must not outlive that.
        let (extractor, dir) = fake_helper("echo $$ > $DIR/pid\nexec sleep 60", 1);
        let slot = extractor.slot().await.unwrap();
        let far = Instant::now() + Duration::from_secs(60);
        let run = extractor.run(&slot, ("text/plain", "a.txt"), 1, &b"a"[..], far);
        assert!(
            tokio::time::timeout(Duration::from_millis(500), run)
                .await
                .is_err()
        );
        let pid = std::fs::read_to_string(dir.join("pid")).unwrap();
        let mut waited = Duration::ZERO;
        while alive(pid.trim()) && waited < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            waited += Duration::from_millis(20);
        }
        assert!(!alive(pid.trim()), "the helper {} still runs", pid.trim());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn a_helper_that_dies_at_its_memory_limit_is_described_as_such() {
        let (extractor, dir) = fake_helper(
            "echo 'memory allocation of 4026531840 bytes failed' >&2\nkill -ABRT $$",
            1,
        );
        let extraction = extractor
            .extract_bytes(
                "application/pdf",
                "bomb.pdf",
                bytes::Bytes::from_static(b"%PDF"),
            )
            .await;
        assert_eq!(
            extraction.content,
            Err("it needs more than the 384 MiB of memory a file may use to be read".to_owned())
        );
        // Any other death is a plain failure, without details for users.
        let (extractor, other) = fake_helper("exit 3", 1);
        let extraction = extractor
            .extract_bytes(
                "application/pdf",
                "x.pdf",
                bytes::Bytes::from_static(b"%PDF"),
            )
            .await;
        assert_eq!(
            extraction.content,
            Err("the file could not be processed".to_owned())
        );
        std::fs::remove_dir_all(dir).unwrap();
        std::fs::remove_dir_all(other).unwrap();
    }

    #[tokio::test]
    async fn at_most_the_configured_number_of_helpers_run_at_once() {
        let (extractor, dir) = fake_helper(
            "touch $DIR/running.$$\nsleep 0.2\nls $DIR | grep -c running >> $DIR/seen\nrm $DIR/running.$$",
            2,
        );
        let runs = (0..6).map(|_| {
            extractor.extract_bytes("text/plain", "a.txt", bytes::Bytes::from_static(b"a"))
        });
        futures::future::join_all(runs).await;
        let seen = std::fs::read_to_string(dir.join("seen")).unwrap();
        let counts: Vec<u32> = seen.lines().map(|l| l.trim().parse().unwrap()).collect();
        assert_eq!(counts.len(), 6, "every helper ran: {seen}");
        assert!(
            counts.iter().all(|&n| n <= 2) && counts.contains(&2),
            "two at a time, never more: {counts:?}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn extraction_settings_are_read_and_checked_naming_the_variable() {
        let config = ExtractionConfig::from_env(&Env::from_pairs([
            ("SB_WORKER_EXTRACT_CONCURRENCY", "3"),
            ("SB_WORKER_EXTRACT_MEMORY_MIB", "512"),
        ]))
        .unwrap();
        assert_eq!((config.concurrency, config.memory_mib), (3, 512));
        for (name, value) in [
            ("SB_WORKER_EXTRACT_CONCURRENCY", "0"),
            ("SB_WORKER_EXTRACT_MEMORY_MIB", "32"),
            (
                "SB_WORKER_EXTRACT_HELPER",
                "/nonexistent/switchboard-extract",
            ),
        ] {
            let error = ExtractionConfig::from_env(&Env::from_pairs([(name, value)])).unwrap_err();
            assert!(error.to_string().contains(name), "{error}");
        }
    }

    #[tokio::test]
    async fn unreachable_storage_is_a_note_not_a_failure() {
        let reader = reader().with_bounds(MAX_FILE_BYTES, Duration::from_secs(10));
        let read = read_all(Some(&reader), &[file("mine", Some(10))]).await;
        let note = read[0].content.clone().unwrap_err();
        assert!(
            note == "could not read report.pdf: the file storage is unavailable"
                || note == "could not read report.pdf: timed out",
            "{note}"
        );
    }
}
