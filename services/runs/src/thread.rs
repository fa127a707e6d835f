//! A thread's stream: every run of a conversation, live, on every device
//! (`GET /api/v1/agent/threads/{threadId}/events`, and the WebSocket's `?conversation_id=`).
//!
//! A client joining a thread gets, in order:
//! 1. a `MESSAGES_SNAPSHOT` of the thread as history holds it, up to the thread's *active run*
//!    if it has one (left out: that run's messages and those of runs accepted after it), and
//!    the thread's `STATE_SNAPSHOT` if a remote agent left state;
//! 2. the active run's events from its first (the run holding the thread's lock, queued or
//!    running); or, when the thread's last run ended on a prompt that still waits, that run's
//!    last event: the `RUN_FINISHED` that carries the question;
//! 3. every run that takes the thread later, from any device and any replica, each from its
//!    first event (`RUN_STARTED.input` carries the turn's user message), until the client
//!    leaves.
//!
//! Runs on a thread never overlap (one active run per thread), so the stream is the runs' event
//! logs one after another. An event's id is `<taskId>:<seq>` (the snapshot's: `<taskId>:0`
//! before an active run, else `0`). `Last-Event-ID` resumes exactly after that event while its run has
//! more to send; a cursor whose run the client has seen end gets a fresh snapshot instead (a
//! `MESSAGES_SNAPSHOT` replaces the client's messages, so nothing shows twice) unless that run
//! is still the open one.
//!
//! This replica learns that a run took a thread from one KV watch of the thread locks
//! ([`ThreadWatch`]); a reader also looks at the lock every [`RECHECK`], so a missed change
//! costs a delay, never a run.

use std::collections::{HashMap, HashSet, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use chrono::Utc;
use futures::{Stream, StreamExt as _};
use platform::lifecycle::{RunBuckets, ThreadLock};
use platform::nats::JsonKv;
use protocol::interaction::{
    PromptRecord, PromptStatus, ThreadPrompt, prompt_key, thread_prompt_key,
};
use protocol::messaging::{
    MAX_THREAD_MESSAGES, Names, RunEventV1, ThreadMessagesReply, ThreadMessagesRequest,
    thread_lock_key, thread_state_key,
};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::events::{EventHub, FollowError};

/// How often, at least, a reader looks at its thread's lock itself.
const RECHECK: Duration = Duration::from_secs(30);
/// Runs taking a thread buffered per reader (a full buffer leaves the rest to the recheck).
const TAKEN_BUFFER: usize = 16;
/// How long a snapshot waits for history to have written the thread.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(10);
/// How long one question to history may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);

/// A position in a thread's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cursor {
    /// The snapshot of a thread with no open run (`0`).
    Idle,
    /// After event `seq` of the run `task_id` (`<taskId>:<seq>`; 0: the snapshot taken before
    /// its first event).
    Run {
        /// The run.
        task_id: Uuid,
        /// Its last event the client has.
        seq: u64,
    },
}

impl Cursor {
    /// Reads a `Last-Event-ID` (or a WebSocket's `last_message_id`) of a thread stream.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        if text == "0" {
            return Some(Self::Idle);
        }
        let (task, seq) = text.split_once(':')?;
        Some(Self::Run {
            task_id: Uuid::try_parse(task).ok()?,
            seq: seq.parse().ok()?,
        })
    }

    /// The id of the event after which this position is.
    pub(crate) fn id(self) -> String {
        match self {
            Self::Idle => "0".to_owned(),
            Self::Run { task_id, seq } => format!("{task_id}:{seq}"),
        }
    }
}

/// A thread's open run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Open {
    /// Queued or running: it holds the thread's lock.
    Active(Uuid),
    /// Ended on a prompt that still waits for the user.
    Prompt(Uuid),
}

impl Open {
    /// The run.
    pub(crate) fn task_id(self) -> Uuid {
        match self {
            Self::Active(task_id) | Self::Prompt(task_id) => task_id,
        }
    }
}

/// One item of a thread's stream: its id (a [`Cursor`]) and the AG-UI event.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ThreadItem {
    /// Where a client that has this item is.
    pub(crate) cursor: Cursor,
    /// The AG-UI event.
    pub(crate) event: Value,
    /// The run event it came from (`None` for a snapshot).
    pub(crate) run: Option<RunEventV1>,
}

impl ThreadItem {
    fn of_run(event: RunEventV1) -> Self {
        Self {
            cursor: Cursor::Run {
                task_id: event.task_id,
                seq: event.seq,
            },
            event: serde_json::to_value(&event.event).unwrap_or(Value::Null),
            run: Some(event),
        }
    }
}

/// Why a thread's stream cannot be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ThreadError {
    /// No message and no run of this owner on this thread.
    #[error("no thread with this id")]
    NotFound,
    /// The cursor names a run that is not one of this owner's on this thread.
    #[error("Last-Event-ID names no event of this thread")]
    ForeignCursor,
    /// NATS or history failed.
    #[error(transparent)]
    Unavailable(#[from] anyhow::Error),
}

/// Tells this replica's thread readers which run takes a thread: one watch of the thread lock
/// bucket, whatever the number of readers.
#[derive(Clone)]
pub(crate) struct ThreadWatch {
    readers: Arc<Mutex<HashMap<String, Vec<mpsc::Sender<Uuid>>>>>,
}

impl ThreadWatch {
    /// Watches `locks` until `shutdown` (watching again after an error); ends the readers of a
    /// thread whose lock key comes on `erased` (a thread erased by some replica).
    pub(crate) fn start(
        locks: JsonKv,
        erased: async_nats::Subscriber,
        shutdown: CancellationToken,
    ) -> Self {
        let watch = Self {
            readers: Arc::default(),
        };
        let ends = watch.clone();
        let until = shutdown.clone();
        tokio::spawn(async move {
            let mut erased = std::pin::pin!(erased.take_until(until.cancelled_owned()));
            while let Some(message) = erased.next().await {
                if let Ok(key) = std::str::from_utf8(&message.payload) {
                    ends.end(key);
                }
            }
        });
        let dispatch = watch.clone();
        tokio::spawn(async move {
            while !shutdown.is_cancelled() {
                match locks.watch_changes::<ThreadLock>().await {
                    Ok(changes) => {
                        let mut changes = std::pin::pin!(changes.take_until(shutdown.cancelled()));
                        while let Some((key, lock)) = changes.next().await {
                            if let Some(lock) = lock {
                                dispatch.dispatch(&key, lock.task_id);
                            }
                        }
                    }
                    Err(err) => {
                        tracing::warn!(error = format!("{err:#}"), "cannot watch thread locks");
                    }
                }
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        });
        watch
    }

    fn dispatch(&self, key: &str, task_id: Uuid) {
        let Ok(mut readers) = self.readers.lock() else {
            return;
        };
        if let Some(senders) = readers.get_mut(key) {
            senders.retain(|tx| !tx.is_closed());
            for tx in senders.iter() {
                // Full: the reader's recheck finds the run.
                let _ = tx.try_send(task_id);
            }
            if senders.is_empty() {
                readers.remove(key);
            }
        }
    }

    /// Ends every reader of the thread with lock key `key`: its registration goes, so the
    /// reader's wait for the next run ends, and with it the stream (after the run it follows,
    /// which the erasure cancelled).
    fn end(&self, key: &str) {
        if let Ok(mut readers) = self.readers.lock()
            && readers.remove(key).is_some()
        {
            tracing::info!("thread streams of an erased thread end");
        }
    }

    fn register(&self, key: String) -> Taken {
        let (tx, rx) = mpsc::channel(TAKEN_BUFFER);
        if let Ok(mut readers) = self.readers.lock() {
            readers.entry(key.clone()).or_default().push(tx);
        }
        Taken {
            watch: self.clone(),
            key,
            rx,
        }
    }
}

/// A reader's registration for the runs taking its thread; unregisters when dropped.
struct Taken {
    watch: ThreadWatch,
    key: String,
    rx: mpsc::Receiver<Uuid>,
}

impl Drop for Taken {
    fn drop(&mut self) {
        self.rx.close();
        if let Ok(mut readers) = self.watch.readers.lock()
            && let Some(senders) = readers.get_mut(&self.key)
        {
            senders.retain(|tx| !tx.is_closed());
            if senders.is_empty() {
                readers.remove(&self.key);
            }
        }
    }
}

/// Opens thread streams.
#[derive(Clone)]
pub(crate) struct Threads {
    watch: ThreadWatch,
    hub: EventHub,
    buckets: RunBuckets,
    client: async_nats::Client,
    names: Names,
    runs: jetstream::stream::Stream,
}

impl Threads {
    pub(crate) fn new(
        watch: ThreadWatch,
        hub: EventHub,
        buckets: RunBuckets,
        client: async_nats::Client,
        names: Names,
        runs: jetstream::stream::Stream,
    ) -> Self {
        Self {
            watch,
            hub,
            buckets,
            client,
            names,
            runs,
        }
    }

    /// `owner`'s thread from `cursor` (`None`: from a snapshot), as described in the module's
    /// documentation. Never ends by itself: the caller ends it (client gone, shutdown).
    pub(crate) async fn open(
        &self,
        owner: &str,
        thread_id: &str,
        cursor: Option<Cursor>,
    ) -> Result<impl Stream<Item = ThreadItem> + Send + 'static, ThreadError> {
        let taken = self.watch.register(thread_lock_key(owner, thread_id));
        let open = self.open_run(owner, thread_id).await?;
        let mut queue = VecDeque::new();
        let resume = match cursor {
            Some(Cursor::Run { task_id, seq }) => {
                self.resume(owner, thread_id, task_id, seq, open).await?
            }
            Some(Cursor::Idle) | None => None,
        };
        let mut first = VecDeque::new();
        match resume {
            Some(after) => {
                queue.push_back(after);
                if let Some(next) = self.open_from(open).await?
                    && next.0 != after.0
                {
                    queue.push_back(next);
                }
            }
            None => {
                let active = match open {
                    Some(Open::Active(task_id)) => Some(task_id),
                    _ => None,
                };
                let messages = self.snapshot(owner, thread_id, active).await?;
                if messages.is_empty() && open.is_none() {
                    return Err(ThreadError::NotFound);
                }
                let cursor = active.map_or(Cursor::Idle, |task_id| Cursor::Run { task_id, seq: 0 });
                first.push_back(ThreadItem {
                    cursor,
                    event: json!({"type": "MESSAGES_SNAPSHOT", "messages": messages}),
                    run: None,
                });
                if let Some(state) = self.state(owner, thread_id).await? {
                    first.push_back(ThreadItem {
                        cursor,
                        event: json!({"type": "STATE_SNAPSHOT", "snapshot": state}),
                        run: None,
                    });
                }
                queue.extend(self.open_from(open).await?);
            }
        }
        let reader = ThreadReader {
            threads: self.clone(),
            owner: owner.to_owned(),
            thread_id: thread_id.to_owned(),
            taken,
            first,
            queue,
            followed: HashSet::new(),
            current: None,
            recheck: tokio::time::interval_at(Instant::now() + RECHECK, RECHECK),
        };
        Ok(futures::stream::unfold(reader, |mut reader| async move {
            let item = reader.next().await?;
            Some((item, reader))
        }))
    }

    /// Where a joining client follows the open run from: an active run from its first event;
    /// a run that ended on a waiting prompt from its last (the question), its messages being
    /// in the snapshot.
    async fn open_from(&self, open: Option<Open>) -> anyhow::Result<Option<(Uuid, u64)>> {
        Ok(match open {
            None => None,
            Some(Open::Active(task_id)) => Some((task_id, 0)),
            Some(Open::Prompt(task_id)) => self
                .hub
                .last_event(task_id)
                .await?
                .map(|last| (task_id, last.seq.saturating_sub(1))),
        })
    }

    /// Where a client at event `seq` of `task_id` goes on: `Some((task, after))` to continue a
    /// run exactly, `None` for a fresh snapshot.
    async fn resume(
        &self,
        owner: &str,
        thread_id: &str,
        task_id: Uuid,
        seq: u64,
        open: Option<Open>,
    ) -> Result<Option<(Uuid, u64)>, ThreadError> {
        let is_open = open.is_some_and(|open| open.task_id() == task_id);
        let last = self.hub.last_event(task_id).await?;
        match last {
            Some(last) if last.owner != owner || last.thread_id != thread_id => {
                Err(ThreadError::ForeignCursor)
            }
            Some(last) if last.event.is_terminal() && seq >= last.seq => {
                // The client saw the run end: nothing of it is left to send.
                Ok(is_open.then_some((task_id, last.seq)))
            }
            Some(last) if seq > last.seq + 1 => Err(ThreadError::ForeignCursor),
            Some(_) => Ok(Some((task_id, seq))),
            // No event logged: the open run not started yet, or a run whose events expired.
            None if is_open => Ok(Some((task_id, seq))),
            None => Ok(None),
        }
    }

    /// The thread's open run: the one holding the thread, or else the last one if it ended on
    /// a prompt that still waits.
    pub(crate) async fn open_run(
        &self,
        owner: &str,
        thread_id: &str,
    ) -> anyhow::Result<Option<Open>> {
        if let Some(task_id) = self.buckets.active_run(owner, thread_id).await? {
            return Ok(Some(Open::Active(task_id)));
        }
        Ok(self
            .pending_prompt(owner, thread_id)
            .await?
            .map(|prompt| Open::Prompt(prompt.task_id)))
    }

    /// The last prompt asked on the thread, if it still waits for an answer.
    pub(crate) async fn pending_prompt(
        &self,
        owner: &str,
        thread_id: &str,
    ) -> anyhow::Result<Option<PromptRecord>> {
        let Some((pointer, _)) = self
            .buckets
            .prompts
            .get::<ThreadPrompt>(&thread_prompt_key(owner, thread_id))
            .await?
        else {
            return Ok(None);
        };
        let record = self
            .buckets
            .prompts
            .get::<PromptRecord>(&prompt_key(&pointer.prompt_id))
            .await?;
        Ok(record.map(|(record, _)| record).filter(|r| {
            r.owner == owner
                && r.thread_id == thread_id
                && r.status == PromptStatus::Pending
                && !r.expired(Utc::now())
        }))
    }

    /// The thread's messages in AG-UI form, up to `open` (its own and later runs' left out),
    /// once history has written every run accepted so far.
    #[tracing::instrument(name = "runs.thread.snapshot", skip_all, fields(thread.id = %thread_id))]
    async fn snapshot(
        &self,
        owner: &str,
        thread_id: &str,
        open: Option<Uuid>,
    ) -> anyhow::Result<Vec<Value>> {
        let runs_seq = self.runs.get_info().await?.state.last_sequence;
        let request = ThreadMessagesRequest::V1 {
            owner: owner.to_owned(),
            thread_id: thread_id.to_owned(),
            task_id: open.unwrap_or(Uuid::nil()),
            runs_seq,
            limit: MAX_THREAD_MESSAGES,
            signed_links: true,
        };
        platform::rpc::request_until(
            &self.client,
            self.names.history_thread_messages_subject(),
            serde_json::to_vec(&request)?.into(),
            ASK_TIMEOUT,
            SNAPSHOT_WAIT,
            |payload| {
                Ok(match serde_json::from_slice(payload)? {
                    ThreadMessagesReply::V1 { messages, .. } => Some(messages),
                    ThreadMessagesReply::Behind => None,
                })
            },
        )
        .await?
        .ok_or_else(|| anyhow::anyhow!("history did not answer the thread's messages in time"))
    }

    /// The state a remote agent left on the thread, if any.
    async fn state(&self, owner: &str, thread_id: &str) -> anyhow::Result<Option<Value>> {
        let record = self
            .buckets
            .thread_state
            .get::<Value>(&thread_state_key(owner, thread_id))
            .await?;
        Ok(record
            .and_then(|(mut record, _)| record.get_mut("state").map(Value::take))
            .filter(|state| !state.is_null() && state.as_object().is_none_or(|o| !o.is_empty())))
    }
}

/// A run's events as a boxed stream.
type RunEvents = Pin<Box<dyn Stream<Item = RunEventV1> + Send>>;

/// The state of one client's thread stream.
struct ThreadReader {
    threads: Threads,
    owner: String,
    thread_id: String,
    taken: Taken,
    /// The snapshot, before any run.
    first: VecDeque<ThreadItem>,
    /// Runs to follow next, each from an event on.
    queue: VecDeque<(Uuid, u64)>,
    /// Runs followed already (never twice).
    followed: HashSet<Uuid>,
    current: Option<RunEvents>,
    recheck: tokio::time::Interval,
}

impl ThreadReader {
    async fn next(&mut self) -> Option<ThreadItem> {
        loop {
            if let Some(item) = self.first.pop_front() {
                return Some(item);
            }
            if let Some(current) = &mut self.current {
                if let Some(event) = current.next().await {
                    return Some(ThreadItem::of_run(event));
                }
                self.current = None;
                continue;
            }
            if let Some((task_id, after)) = self.queue.pop_front() {
                if !self.followed.insert(task_id) {
                    continue;
                }
                match self.threads.hub.follow(task_id, after, false).await {
                    Ok(events) => self.current = Some(Box::pin(events)),
                    Err(FollowError::Nats(err)) => {
                        // The client reconnects with its last id and loses nothing.
                        tracing::warn!(task.id = %task_id, error = format!("{err:#}"), "thread stream ends: cannot read a run's events");
                        return None;
                    }
                    Err(err) => {
                        tracing::debug!(task.id = %task_id, error = %err, "thread stream skips a run");
                    }
                }
                continue;
            }
            tokio::select! {
                taken = self.taken.rx.recv() => match taken {
                    Some(task_id) => self.take(task_id),
                    None => return None,
                },
                _ = self.recheck.tick() => {
                    match self.threads.open_run(&self.owner, &self.thread_id).await {
                        Ok(Some(Open::Active(task_id))) => self.take(task_id),
                        Ok(_) => {}
                        Err(err) => tracing::debug!(error = format!("{err:#}"), "thread recheck failed"),
                    }
                }
            }
        }
    }

    fn take(&mut self, task_id: Uuid) {
        if !self.followed.contains(&task_id) && !self.queue.iter().any(|(t, _)| *t == task_id) {
            self.queue.push_back((task_id, 0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_what_it_writes() {
        let task_id = Uuid::now_v7();
        for cursor in [
            Cursor::Idle,
            Cursor::Run { task_id, seq: 0 },
            Cursor::Run { task_id, seq: 42 },
        ] {
            assert_eq!(Cursor::parse(&cursor.id()), Some(cursor));
        }
    }

    #[test]
    fn a_cursor_that_is_not_a_thread_position_is_refused() {
        for text in [
            "",
            "12",
            "x:1",
            "0:1",
            &format!("{}:-1", Uuid::now_v7()),
            &format!("{}", Uuid::now_v7()),
        ] {
            assert_eq!(Cursor::parse(text), None, "{text:?}");
        }
    }
}
