//! Erasure: a thread, or an owner, removed from every store (`DELETE
//! /api/v1/agent/threads/{threadId}` and `DELETE /api/v1/agent/me`, served by the runs service,
//! which cancels what still runs and asks here; and the thread retention, which erases threads
//! idle past their time to live).
//!
//! A thread's traces, and how each goes:
//! - history's rows (messages, tool calls, runs, usage, the thread): one transaction, last, so a
//!   failure on the way leaves the index a retry needs;
//! - each run's task in RUNS (deleted by its sequence), its events in RUN_EVENTS (purged by
//!   subject), its status record, its prompts and their deadlines (erased keys; the purge
//!   markers that tell watchers go a minute later);
//! - the thread's lock, its remote-agent state and its pointer to its last prompt;
//! - its files, asked of attachments (a file still attached to another thread of the owner
//!   stays).
//!
//! Before anything goes, the runs are recorded as erased (`erased_runs`, task ids only): an
//! event of one that reaches history afterwards (a run that was still ending) is dropped and
//! removed from its stream instead of writing the thread back. A thread with a run that has not
//! ended is erased only when the caller says it cancelled them (`force`); otherwise the answer
//! names the runs to cancel.

use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::stream::{DeleteMessageErrorKind, Stream};
use async_nats::jetstream::{self, ErrorCode};
use chrono::Utc;
use platform::lifecycle::{RunBuckets, ThreadLock};
use platform::owner_set::OwnerSet;
use protocol::erase::{
    AttachmentsEraseReply, AttachmentsEraseRequest, EraseReply, OwnerEraseRequest,
    ThreadEraseRequest, UnendedRun,
};
use protocol::interaction::{prompt_key, thread_prompt_key};
use protocol::messaging::{Names, short_digest, status_key, thread_lock_key, thread_state_key};
use sqlx::PgPool;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::bus::ingest::PullConsumer;
use crate::bus::lookup::{CATCH_UP, caught_up};
use crate::bus::respond;
use crate::store;

/// How long attachments may take to drop a thread's (or an owner's) files.
const FILES_TIMEOUT: Duration = Duration::from_secs(20);
/// How long one owner erasure request works before it answers `more`.
const OWNER_BUDGET: Duration = Duration::from_secs(15);
/// Threads an owner erasure reads at a time.
const OWNER_BATCH: i64 = 100;
/// Unended runs named in a `Busy` answer.
const BUSY_RUNS: i64 = 100;

/// Erases threads and owners; shared by the two endpoints and the thread retention.
#[derive(Clone)]
pub(crate) struct Eraser {
    pool: PgPool,
    client: async_nats::Client,
    js: jetstream::Context,
    names: Names,
    runs: Stream,
    events: Stream,
    buckets: RunBuckets,
    /// History's RUNS consumer: an erasure waits until every run accepted before it is written.
    runs_consumer: PullConsumer,
}

/// What one thread's erasure removed.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Erased {
    pub(crate) runs: u64,
    pub(crate) messages: u64,
    pub(crate) files: u64,
}

impl Eraser {
    pub(crate) fn new(
        pool: PgPool,
        client: async_nats::Client,
        js: jetstream::Context,
        names: Names,
        streams: (Stream, Stream),
        buckets: RunBuckets,
        runs_consumer: PullConsumer,
    ) -> Self {
        let (runs, events) = streams;
        Self {
            pool,
            client,
            js,
            names,
            runs,
            events,
            buckets,
            runs_consumer,
        }
    }

    /// Answers a thread erasure.
    async fn thread(&self, request: ThreadEraseRequest) -> anyhow::Result<EraseReply> {
        let ThreadEraseRequest::V1 {
            owner,
            thread_id,
            runs_seq,
            force,
        } = request;
        if !caught_up(&self.runs_consumer, runs_seq, Instant::now() + CATCH_UP).await? {
            return Ok(EraseReply::Behind);
        }
        if !store::thread_or_runs_exist(&self.pool, &owner, &thread_id).await? {
            return Ok(EraseReply::NotFound);
        }
        let runs = store::thread_runs(&self.pool, &owner, &thread_id).await?;
        if !force && let Some(busy) = self.busy(&owner, &thread_id, &runs).await? {
            return Ok(busy);
        }
        let erased = self.erase_thread(&owner, &thread_id, runs).await?;
        tracing::info!(
            runs = erased.runs,
            messages = erased.messages,
            files = erased.files,
            force,
            "thread erased"
        );
        Ok(EraseReply::V1 {
            threads: 1,
            runs: erased.runs,
            messages: erased.messages,
            files: erased.files,
            more: false,
        })
    }

    /// `Busy` when a run of the thread has not ended, or has ended in its log but its worker
    /// still holds the thread (it writes the run's status before it lets go): erased now, what
    /// the worker writes next would stay behind.
    async fn busy(
        &self,
        owner: &str,
        thread_id: &str,
        runs: &[store::ErasedRun],
    ) -> anyhow::Result<Option<EraseReply>> {
        let unended: Vec<UnendedRun> = runs
            .iter()
            .filter(|run| !run.ended)
            .map(|run| UnendedRun {
                thread_id: thread_id.to_owned(),
                run_id: run.run_id.clone(),
            })
            .collect();
        let held = match self
            .buckets
            .thread_locks
            .get::<ThreadLock>(&thread_lock_key(owner, thread_id))
            .await?
        {
            Some((lock, _)) => runs.iter().any(|run| run.task_id == lock.task_id),
            None => false,
        };
        Ok((!unended.is_empty() || held).then_some(EraseReply::Busy { runs: unended }))
    }

    /// Removes the thread and its `runs` from every store (see the module's documentation).
    pub(crate) async fn erase_thread(
        &self,
        owner: &str,
        thread_id: &str,
        runs: Vec<store::ErasedRun>,
    ) -> anyhow::Result<Erased> {
        let task_ids: Vec<uuid::Uuid> = runs.iter().map(|run| run.task_id).collect();
        store::tombstone_runs(&self.pool, &task_ids).await?;
        let pending = OwnerSet::pending_prompts(self.buckets.owner_budgets.clone());
        for run in &runs {
            if let Some(seq) = run.runs_seq.and_then(|seq| u64::try_from(seq).ok()) {
                delete_message(&self.runs, seq).await?;
            }
            self.events
                .purge()
                .filter(self.names.run_event_subject(run.task_id))
                .await
                .context("cannot purge a run's events")?;
            self.buckets
                .run_status
                .erase(&status_key(owner, &run.run_id, run.task_id))
                .await?;
            for prompt_id in &run.prompt_ids {
                let key = prompt_key(prompt_id);
                self.buckets.prompts.erase(&key).await?;
                self.buckets.prompt_deadlines.erase(&key).await?;
                pending.leave(owner, prompt_id).await?;
            }
        }
        self.buckets
            .thread_locks
            .erase(&thread_lock_key(owner, thread_id))
            .await?;
        self.buckets
            .thread_state
            .erase(&thread_state_key(owner, thread_id))
            .await?;
        self.buckets
            .prompts
            .erase(&thread_prompt_key(owner, thread_id))
            .await?;
        let files = self.erase_files(owner, Some(thread_id)).await?;
        let removed = store::delete_thread(&self.pool, owner, thread_id).await?;
        let kept_key = platform::kept::key(owner);
        if removed.kept > 0 {
            platform::kept::report(&self.buckets.owner_budgets, owner, removed.kept as u64).await;
        } else if let Err(err) = self.buckets.owner_budgets.erase(&kept_key).await {
            tracing::warn!(
                error = format!("{err:#}"),
                "cannot erase what an owner kept"
            );
        }
        metrics::counter!("switchboard_history_threads_erased_total").increment(1);
        Ok(Erased {
            runs: removed.runs,
            messages: removed.messages,
            files,
        })
    }

    /// Asks attachments to drop the owner's files of `thread_id` (`None`: all of them); how
    /// many files went.
    async fn erase_files(&self, owner: &str, thread_id: Option<&str>) -> anyhow::Result<u64> {
        let request = AttachmentsEraseRequest::V1 {
            owner: owner.to_owned(),
            session_id: thread_id.map(str::to_owned),
        };
        let reply = platform::rpc::request(
            &self.client,
            self.names.attachments_erase_subject(),
            serde_json::to_vec(&request)?.into(),
            FILES_TIMEOUT,
        )
        .await
        .context("attachments did not erase the files")?;
        let AttachmentsEraseReply::V1 { files_deleted, .. } =
            serde_json::from_slice(&reply.payload)?;
        Ok(files_deleted)
    }

    /// Answers an owner erasure: every thread (as many as [`OWNER_BUDGET`] allows, `more` when
    /// some are left), then every file and the owner's own records (budgets, token ledger,
    /// active runs and pending prompts).
    async fn owner(&self, request: OwnerEraseRequest) -> anyhow::Result<EraseReply> {
        let OwnerEraseRequest::V1 {
            owner,
            runs_seq,
            force,
        } = request;
        if !caught_up(&self.runs_consumer, runs_seq, Instant::now() + CATCH_UP).await? {
            return Ok(EraseReply::Behind);
        }
        if !force {
            let unended = store::owner_unended_runs(&self.pool, &owner, BUSY_RUNS).await?;
            if !unended.is_empty() {
                return Ok(EraseReply::Busy {
                    runs: unended
                        .into_iter()
                        .map(|(thread_id, run_id)| UnendedRun { thread_id, run_id })
                        .collect(),
                });
            }
        }
        let deadline = Instant::now() + OWNER_BUDGET;
        let (mut threads, mut total) = (0, Erased::default());
        loop {
            let batch = store::owner_threads(&self.pool, &owner, OWNER_BATCH).await?;
            if batch.is_empty() {
                break;
            }
            for thread_id in batch {
                if Instant::now() >= deadline {
                    tracing::info!(threads, "owner erasure paused at its time budget");
                    return Ok(EraseReply::V1 {
                        threads,
                        runs: total.runs,
                        messages: total.messages,
                        files: total.files,
                        more: true,
                    });
                }
                let runs = store::thread_runs(&self.pool, &owner, &thread_id).await?;
                let erased = self.erase_thread(&owner, &thread_id, runs).await?;
                threads += 1;
                total.runs += erased.runs;
                total.messages += erased.messages;
                total.files += erased.files;
            }
        }
        total.files += self.erase_files(&owner, None).await?;
        self.erase_owner_records(&owner).await?;
        metrics::counter!("switchboard_history_owners_erased_total").increment(1);
        tracing::info!(
            threads,
            runs = total.runs,
            files = total.files,
            "owner erased"
        );
        Ok(EraseReply::V1 {
            threads,
            runs: total.runs,
            messages: total.messages,
            files: total.files,
            more: false,
        })
    }

    /// The owner's records in the budget buckets: its active runs and pending prompts sets,
    /// its bytes per day (runs, events) and its tokens per day and month.
    async fn erase_owner_records(&self, owner: &str) -> anyhow::Result<()> {
        let digest = short_digest(owner);
        let budgets = self.names.owner_budgets_bucket();
        let tokens = self.names.owner_tokens_bucket();
        // Every record of the owner is `<kind>.<owner digest>` or `<kind>.<owner digest>.<period>`
        // (active runs, pending prompts, bytes of runs and of events per day, tokens per day and
        // month): whatever the kind.
        for (bucket, filter) in [
            (&budgets, format!("$KV.{budgets}.*.{digest}")),
            (&budgets, format!("$KV.{budgets}.*.{digest}.*")),
            (&tokens, format!("$KV.{tokens}.*.{digest}.*")),
        ] {
            self.js
                .get_stream(format!("KV_{bucket}"))
                .await?
                .purge()
                .filter(filter)
                .await
                .with_context(|| format!("cannot purge the owner's records in {bucket}"))?;
        }
        Ok(())
    }
}

/// Deletes message `seq` of `stream`; one that is gone already is fine.
pub(crate) async fn delete_message(stream: &Stream, seq: u64) -> anyhow::Result<()> {
    match stream.delete_message(seq).await {
        Ok(_) => Ok(()),
        Err(err)
            if matches!(err.kind(), DeleteMessageErrorKind::JetStream(e)
                if e.error_code() == ErrorCode::NO_MESSAGE_FOUND) =>
        {
            Ok(())
        }
        Err(err) => Err(anyhow::Error::new(err).context("cannot delete a message")),
    }
}

/// Answers thread and owner erasures until `shutdown`.
pub(crate) async fn serve(eraser: Eraser, shutdown: CancellationToken) -> anyhow::Result<()> {
    let names = eraser.names.clone();
    let threads = respond::serve(
        eraser.client.clone(),
        &names,
        names.history_thread_erase_subject(),
        shutdown.clone(),
        || tracing::info_span!("history.erase.thread", otel.kind = "server"),
        |request| eraser.thread(request),
    );
    let owners = respond::serve(
        eraser.client.clone(),
        &names,
        names.history_owner_erase_subject(),
        shutdown,
        || tracing::info_span!("history.erase.owner", otel.kind = "server"),
        |request| eraser.owner(request),
    );
    let (threads, owners) = tokio::join!(threads, owners);
    threads.and(owners)
}

/// The thread retention: every `every`, the threads idle longer than `ttl` (with no run that
/// has not ended) erased, 100 at a time, one replica at a time; and the tombstones of runs
/// erased longer ago than the streams keep anything dropped.
pub(crate) async fn retain(
    eraser: Eraser,
    ttl: ThreadTtl,
    tombstones_for: Duration,
    every: Duration,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let (eraser, ttl) = (&eraser, &ttl);
    crate::retention::every(every, shutdown, || async move {
        if ttl.any() {
            match expire_threads(eraser, ttl).await {
                Ok(0) => {}
                Ok(erased) => tracing::info!(erased, "threads past their time to live erased"),
                Err(err) => tracing::warn!(error = format!("{err:#}"), "thread retention failed"),
            }
        }
        let forgotten = chrono::Duration::from_std(tombstones_for)
            .map(|age| Utc::now() - age)
            .unwrap_or(chrono::DateTime::<Utc>::MIN_UTC);
        if let Err(err) = store::forget_tombstones(&eraser.pool, forgotten).await {
            tracing::warn!(error = %err, "cannot drop old tombstones");
        }
    })
    .await;
    Ok(())
}

/// Threads erased per sweep at most (the next sweep goes on).
const RETENTION_BATCH: i64 = 100;

/// One retention sweep: how many threads it erased (the owners with a time to live of their
/// own first, then every owner's against the deployment's).
async fn expire_threads(eraser: &Eraser, ttl: &ThreadTtl) -> anyhow::Result<u64> {
    let Some(_lock) = store::retention_lock(&eraser.pool).await? else {
        return Ok(0); // another replica is at it
    };
    let now = Utc::now();
    let mut idle = Vec::new();
    for (owner, days) in &ttl.by_owner {
        let before = now - chrono::Duration::days(i64::from(*days));
        let threads =
            store::owner_idle_threads(&eraser.pool, owner, before, RETENTION_BATCH).await?;
        idle.extend(threads.into_iter().map(|thread| (owner.clone(), thread)));
    }
    if let Some(days) = ttl.default_days {
        let before = now - chrono::Duration::days(i64::from(days));
        idle.extend(store::idle_threads(&eraser.pool, before, RETENTION_BATCH).await?);
    }
    let mut erased = 0;
    for (owner, thread_id) in idle {
        let runs = store::thread_runs(&eraser.pool, &owner, &thread_id).await?;
        if runs.iter().any(|run| !run.ended) {
            continue; // a run started since
        }
        eraser.erase_thread(&owner, &thread_id, runs).await?;
        erased += 1;
    }
    metrics::counter!("switchboard_history_threads_expired_total").increment(erased);
    Ok(erased)
}

/// How long threads are kept after their last message: the deployment's time to live
/// (`SB_HISTORY_THREAD_TTL_DAYS`, unset or 0: for good) and shorter ones of some owners
/// (`SB_HISTORY_OWNER_THREAD_TTL_DAYS`, a JSON object `{"<sub>": days}`; one longer than the
/// deployment's is the deployment's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThreadTtl {
    default_days: Option<u32>,
    by_owner: Vec<(String, u32)>,
}

/// Most days a time to live may be (100 years).
const MAX_TTL_DAYS: u32 = 36_500;

impl ThreadTtl {
    /// The deployment's time to live in days (0: none) and the owners' (a JSON object).
    /// An error names the variable at fault and why.
    pub fn new(default_days: u32, by_owner: Option<&str>) -> Result<Self, (&'static str, String)> {
        const DEFAULT: &str = "SB_HISTORY_THREAD_TTL_DAYS";
        const OWNERS: &str = "SB_HISTORY_OWNER_THREAD_TTL_DAYS";
        if default_days > MAX_TTL_DAYS {
            return Err((DEFAULT, format!("at most {MAX_TTL_DAYS} days")));
        }
        let default_days = (default_days > 0).then_some(default_days);
        let mut owners = Vec::new();
        if let Some(raw) = by_owner.filter(|raw| !raw.trim().is_empty()) {
            let parsed: std::collections::BTreeMap<String, u32> = serde_json::from_str(raw)
                .map_err(|err| {
                    (
                        OWNERS,
                        format!("not a JSON object of owners and whole days: {err}"),
                    )
                })?;
            for (owner, days) in parsed {
                if days == 0 || days > MAX_TTL_DAYS {
                    return Err((
                        OWNERS,
                        format!("{owner:?}: days must be 1 to {MAX_TTL_DAYS}"),
                    ));
                }
                // Shorter only: the deployment's applies to everyone.
                let days = default_days.map_or(days, |d| d.min(days));
                owners.push((owner, days));
            }
        }
        Ok(Self {
            default_days,
            by_owner: owners,
        })
    }

    /// Whether any thread expires.
    pub fn any(&self) -> bool {
        self.default_days.is_some() || !self.by_owner.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_time_to_live_is_the_deployments_or_an_owners_shorter_one() {
        let ttl = ThreadTtl::new(90, Some(r#"{"alice": 7, "bob": 365}"#));
        assert_eq!(
            ttl,
            Ok(ThreadTtl {
                default_days: Some(90),
                by_owner: vec![("alice".into(), 7), ("bob".into(), 90)],
            })
        );
        assert_eq!(ThreadTtl::new(0, None).map(|t| t.any()), Ok(false));
        assert_eq!(
            ThreadTtl::new(0, Some(r#"{"a": 3}"#)).map(|t| t.any()),
            Ok(true)
        );
        assert!(ThreadTtl::new(0, Some(r#"{"a": 0}"#)).is_err());
        assert!(ThreadTtl::new(0, Some(r#"{"a": "x"}"#)).is_err());
        assert!(ThreadTtl::new(0, Some("[1]")).is_err());
        assert!(ThreadTtl::new(MAX_TTL_DAYS + 1, None).is_err());
    }
}
