//! A run's event log, as every client-facing stream reads it.
//!
//! The log is the RUN_EVENTS stream: one subject per task, each event numbered by its per-run
//! `seq` (1, 2, 3, ... with no gaps; the worker advances only after JetStream's ack). A reader
//! asks for the events after a `seq` it already has and gets each later event exactly once, in
//! order, until the terminal event.
//!
//! One core NATS subscription per runs replica ([`EventHub`]), to what the log republishes as
//! it stores each event (`<p>.runs.live.>`: never an event the log refused), carries live
//! events to every local reader: one `broadcast` channel per run with readers here, each event
//! sent to it once however many read it, so an idle stream costs a receiver (16 bytes), not a
//! JetStream consumer or a queue of its own. A reader registers for live events first, then
//! reads what the log already holds; events are deduplicated by
//! `seq`, and a gap (a live event lost to a slow subscriber) is filled from the log. A waiting
//! reader also re-reads the log every minute or two, so even a lost terminal event ends the
//! stream.
//!
//! **Compact replay.** What a reader gets from the log (a resume from far behind, a replay from
//! the start, a client joining a running run) is compacted as AG-UI's `compactEvents()` does:
//! consecutive `TEXT_MESSAGE_CONTENT` events of one message become one event carrying their
//! deltas joined (likewise `TOOL_CALL_ARGS` of one tool call), up to [`COMPACT_MAX_BYTES`] of
//! text each, numbered with the `seq` of the last event it holds. Ids stay cursors: a client that
//! resumes after a compacted event gets exactly what followed its last part. Live events, one at
//! a time as they come, are never held back to be joined. [`Replay::Raw`] reads every event as
//! it was stored.
//!
//! A run's terminal event is handed out only once history has written it ([`HistoryBarrier`]):
//! a client that has seen a run end and reloads the conversation finds the run's messages
//! complete. The wait is bounded ([`HISTORY_WAIT`]); with no history replica answering at all
//! it does not wait.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream;
use futures::{Stream, StreamExt};
use protocol::messaging::{Names, ProgressReply, ProgressRequest, RunEventMessage, RunEventV1};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Live events a run's channel keeps: a reader that falls further behind (its client reads
/// slowly) skips the live events it missed and reads them from the log instead.
const LIVE_BUFFER: usize = 64;
/// The longest a terminal event waits for history to have written the run.
const HISTORY_WAIT: Duration = Duration::from_secs(10);
/// How long one progress request to history may take.
const HISTORY_ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// Most bytes of text one compacted event carries (a longer message is sent in several).
const COMPACT_MAX_BYTES: usize = 64 * 1024;

/// How a reader gets the events the log already holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replay {
    /// Runs of deltas of one message (or tool call) joined into one event each.
    Compact,
    /// Every event as it was stored.
    Raw,
}

/// Appends `next` to `event` when both are deltas of the same message (or tool call) and the
/// joined text stays within [`COMPACT_MAX_BYTES`]; whether it did.
fn join(event: &mut RunEventV1, next: &RunEventV1) -> bool {
    use protocol::agui::Event;
    let (delta, more) = match (&mut event.event, &next.event) {
        (
            Event::TextMessageContent { message_id, delta },
            Event::TextMessageContent {
                message_id: next_id,
                delta: more,
            },
        ) if message_id == next_id => (delta, more),
        (
            Event::ToolCallArgs {
                tool_call_id,
                delta,
            },
            Event::ToolCallArgs {
                tool_call_id: next_id,
                delta: more,
            },
        ) if tool_call_id == next_id => (delta, more),
        _ => return false,
    };
    if delta.len() + more.len() > COMPACT_MAX_BYTES {
        return false;
    }
    delta.push_str(more);
    event.seq = next.seq;
    true
}

/// An event as this replica's readers share it: decoded once by the hub and handed to every
/// reader of its run as one `Arc` (a reader's buffer holds pointers, not events), its AG-UI JSON
/// encoded once for every SSE client that sends it ([`SharedEvent::json`]).
#[derive(Debug, Clone)]
pub(crate) struct SharedEvent {
    inner: RunEventV1,
    json: std::sync::OnceLock<String>,
}

impl SharedEvent {
    pub(crate) fn new(event: RunEventV1) -> Arc<Self> {
        Arc::new(Self {
            inner: event,
            json: std::sync::OnceLock::new(),
        })
    }

    /// The AG-UI event as JSON, encoded by the first reader that asks.
    pub(crate) fn json(&self) -> &str {
        self.json.get_or_init(|| {
            serde_json::to_string(&self.inner.event).unwrap_or_else(|err| {
                tracing::error!(error = %err, "cannot encode a run event");
                String::from("{}")
            })
        })
    }

    /// [`join`]s `next` to this event (its JSON encoded again when next asked).
    fn join(&mut self, next: &RunEventV1) -> bool {
        let joined = join(&mut self.inner, next);
        if joined {
            self.json = std::sync::OnceLock::new();
        }
        joined
    }

    /// The event itself (a copy only when another reader still holds it).
    pub(crate) fn into_event(shared: Arc<Self>) -> RunEventV1 {
        Arc::unwrap_or_clone(shared).inner
    }
}

impl std::ops::Deref for SharedEvent {
    type Target = RunEventV1;
    fn deref(&self) -> &RunEventV1 {
        &self.inner
    }
}

/// The live channel of each run with readers on this replica; removed with its last reader.
type Readers = HashMap<Uuid, broadcast::Sender<Arc<SharedEvent>>>;

/// Fans the live events of every run out to this replica's readers.
#[derive(Clone)]
pub(crate) struct EventHub {
    readers: Arc<Mutex<Readers>>,
    /// Shared by every reader: the stream's handle carries its whole configuration and state
    /// (over a KiB), which a clone per reader copied into every open stream.
    log: Arc<jetstream::stream::Stream>,
    names: Names,
    history: Arc<HistoryBarrier>,
    /// How often, at least, a waiting reader re-reads the log in case a live event was lost
    /// (plus a per-reader jitter of up to the same again, so readers opened together do not
    /// read together; `SB_RUNS_STREAM_RECHECK_SECS`).
    recheck: Duration,
}

/// Why a run's events cannot be served from where the reader asked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FollowError {
    /// Events the reader still needs are older than the log's retention.
    #[error("events after {after} of this run are no longer retained")]
    Expired {
        /// The reader's position.
        after: u64,
    },
    /// The run has ended and the reader already has its terminal event: nothing more comes.
    #[error("the run ended with event {last}; nothing follows it")]
    Ended {
        /// `seq` of the terminal event.
        last: u64,
    },
    /// The reader's position is past any event the run has sent: a cursor of another run, or
    /// made up.
    #[error("event {after} is past the last event of this run ({last})")]
    PastEnd {
        /// The reader's position.
        after: u64,
        /// `seq` of the run's last event so far (0: none yet).
        last: u64,
    },
    /// NATS failed.
    #[error(transparent)]
    Nats(#[from] anyhow::Error),
}

impl EventHub {
    /// Subscribes to every run's events and dispatches them until `shutdown`.
    pub(crate) async fn start(
        client: &async_nats::Client,
        js: &jetstream::Context,
        names: Names,
        recheck: Duration,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Self> {
        let log = js
            .get_stream(names.run_events_stream())
            .await
            .context("run events stream missing")?;
        let subscription = client
            .subscribe(names.run_events_live_subjects())
            .await
            .context("cannot subscribe to run events")?;
        let hub = Self {
            readers: Arc::default(),
            log: Arc::new(log),
            history: Arc::new(HistoryBarrier::new(
                client.clone(),
                names.history_progress_subject(),
            )),
            names,
            recheck,
        };
        let dispatch = hub.clone();
        tokio::spawn(async move {
            let mut live = std::pin::pin!(subscription.take_until(shutdown.cancelled_owned()));
            while let Some(message) = live.next().await {
                // The subject ends with the task id: events nobody here reads are not parsed.
                let listened = message
                    .subject
                    .rsplit('.')
                    .next()
                    .and_then(|id| Uuid::try_parse(id).ok())
                    .is_some_and(|task_id| dispatch.has_readers(task_id));
                if !listened {
                    continue;
                }
                if let Ok(RunEventMessage::V1(event)) = serde_json::from_slice(&message.payload) {
                    dispatch.dispatch(event);
                }
            }
        });
        Ok(hub)
    }

    fn has_readers(&self, task_id: Uuid) -> bool {
        self.readers
            .lock()
            .is_ok_and(|readers| readers.contains_key(&task_id))
    }

    fn dispatch(&self, event: RunEventV1) {
        let Ok(readers) = self.readers.lock() else {
            return;
        };
        if let Some(live) = readers.get(&event.task_id) {
            // Sent once, whatever the number of readers. A reader whose client is slow falls
            // behind the channel's [`LIVE_BUFFER`] events and reads what it missed from the log
            // (`Follow::next_event`): a slow client never holds the others back, and holds
            // nothing of its own meanwhile.
            let _ = live.send(SharedEvent::new(event));
        }
    }

    fn register(&self, task_id: Uuid) -> Registration {
        Registration::new(Arc::clone(&self.readers), task_id)
    }

    /// A reader of `task_id`'s events from the start, one at a time.
    fn reader(&self, task_id: Uuid) -> LogReader {
        LogReader {
            log: Arc::clone(&self.log),
            subject: self.names.run_event_subject(task_id),
            stream_seq: 0,
            ahead: std::collections::VecDeque::new(),
            bulk: false,
            read_singly: 0,
        }
    }

    /// The first event of `task_id` the log holds (its `RUN_STARTED`), if any.
    pub(crate) async fn first_event(&self, task_id: Uuid) -> anyhow::Result<Option<RunEventV1>> {
        self.reader(task_id).next().await
    }

    /// The last event of `task_id` the log holds, if any.
    pub(crate) async fn last_event(&self, task_id: Uuid) -> anyhow::Result<Option<RunEventV1>> {
        self.reader(task_id).last().await
    }

    /// The events of `task_id` after `after`, each once and in order, ending after the
    /// terminal event. Checked before the first event, so a caller can answer with a status
    /// code: `Expired` when the log no longer holds the next event the reader needs, `Ended`
    /// when the reader already has the terminal event, `PastEnd` when `after` names an event
    /// the run never sent. `ended`: the run is known to have ended, so an empty log means its
    /// events expired.
    pub(crate) async fn follow(
        &self,
        task_id: Uuid,
        after: u64,
        ended: bool,
    ) -> Result<impl Stream<Item = RunEventV1> + Send + 'static, FollowError> {
        Ok(self
            .follow_with(task_id, after, ended, Replay::Compact)
            .await?
            .map(SharedEvent::into_event))
    }

    /// [`Self::follow`], reading the log as `replay` says.
    pub(crate) async fn follow_with(
        &self,
        task_id: Uuid,
        after: u64,
        ended: bool,
        replay: Replay,
    ) -> Result<impl Stream<Item = Arc<SharedEvent>> + Send + 'static, FollowError> {
        let registration = self.register(task_id);
        let mut reader = self.reader(task_id);
        if after > 0 {
            let last = reader.last().await?;
            check_cursor(after, last.as_ref(), ended)?;
            // Far behind the log's end (a resume after a long drop): read it in bulk from the
            // start. A reader from the start goes over to bulk as it reads (`LogReader::next`).
            reader.bulk = last.is_some_and(|last| last.seq > after + BULK_AFTER);
        }
        let first = reader.next().await?;
        match &first {
            Some(first) if first.seq > after + 1 => return Err(FollowError::Expired { after }),
            None if ended => return Err(FollowError::Expired { after }),
            _ => {}
        }
        let pending_empty = first.is_none();
        let recheck = self.recheck + self.recheck.mul_f64(jitter(task_id, after));
        let state = Follow {
            registration,
            history: Arc::clone(&self.history),
            reader,
            last: after,
            pending: first.into_iter().map(SharedEvent::new).collect(),
            recheck,
            recheck_timer: Box::pin(tokio::time::sleep(recheck)),
            heard: false,
            reconnections: platform::nats::reconnections(),
            // An empty log was just read: wait for live events (or the recheck) first.
            read_log: !pending_empty,
            done: false,
            replay,
        };
        Ok(futures::stream::unfold(state, |mut state| async move {
            let event = state.next().await?;
            Some((event, state))
        }))
    }
}

/// Whether a reader at `after` can be served, given the run's `last` logged event.
fn check_cursor(after: u64, last: Option<&RunEventV1>, ended: bool) -> Result<(), FollowError> {
    let Some(last) = last else {
        // Nothing logged: an ended run's events expired (the caller says so); a live run's
        // first event may be in flight, so a reader may hold seq 1 (live) but nothing beyond.
        return if !ended && after > 1 {
            Err(FollowError::PastEnd { after, last: 0 })
        } else {
            Ok(())
        };
    };
    let terminal = last.event.is_terminal();
    if terminal && after == last.seq {
        return Err(FollowError::Ended { last: last.seq });
    }
    // A live event reaches readers as JetStream stores it, so a reader of a running run may be
    // one event ahead of the log; never more, and never past a terminal event.
    let next_possible = if terminal { last.seq } else { last.seq + 1 };
    if after > next_possible {
        return Err(FollowError::PastEnd {
            after,
            last: last.seq,
        });
    }
    Ok(())
}

/// A live registration: a receiver of its run's channel; the channel goes with its last reader.
struct Registration {
    readers: Arc<Mutex<Readers>>,
    task_id: Uuid,
    rx: Option<broadcast::Receiver<Arc<SharedEvent>>>,
}

impl Registration {
    fn new(readers: Arc<Mutex<Readers>>, task_id: Uuid) -> Self {
        let rx = readers.lock().ok().map(|mut live| {
            live.entry(task_id)
                .or_insert_with(|| broadcast::Sender::new(LIVE_BUFFER))
                .subscribe()
        });
        Self {
            readers,
            task_id,
            rx,
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // A reader that ended from the log while the channel lapped it (its client was slow
        // and the run went on) never saw the lag in a `recv`: it is counted here.
        if let Some(rx) = self.rx.as_mut()
            && let Err(broadcast::error::TryRecvError::Lagged(skipped)) = rx.try_recv()
        {
            lagged(self.task_id, skipped);
        }
        if let Ok(mut readers) = self.readers.lock() {
            // Under the lock: a reader registering meanwhile would be left on a removed channel.
            drop(self.rx.take());
            if readers
                .get(&self.task_id)
                .is_some_and(|live| live.receiver_count() == 0)
            {
                readers.remove(&self.task_id);
            }
        }
    }
}

/// Counts and logs a reader that fell `skipped` live events behind its run's channel.
fn lagged(task_id: Uuid, skipped: u64) {
    metrics::counter!("switchboard_stream_live_events_skipped_total").increment(skipped);
    metrics::counter!("switchboard_stream_readers_detached_total", "reason" => "queue_full")
        .increment(1);
    tracing::info!(
        task_id = %task_id,
        skipped,
        queue = LIVE_BUFFER,
        "a slow reader skipped live events its client did not take in time; it reads them from \
         the log"
    );
}

/// Reads one task's events from the log, in stream order: one message per request, or, while
/// far behind, [`BULK_BATCH`] per request through a short-lived consumer of the task's subject.
struct LogReader {
    log: Arc<jetstream::stream::Stream>,
    subject: String,
    /// Stream sequence of the last message read.
    stream_seq: u64,
    /// Events read ahead in bulk, not handed to the caller yet.
    ahead: std::collections::VecDeque<(u64, RunEventV1)>,
    /// Events the log may still hold past `stream_seq` that are worth reading in bulk.
    bulk: bool,
    /// Events read one request each so far.
    read_singly: u64,
}

/// How far behind the log's last event a resuming reader must be for its events to be read in
/// bulk; and how many events a reader from the start reads one at a time before it goes bulk.
const BULK_AFTER: u64 = 64;
/// Events read per bulk request.
const BULK_BATCH: usize = 1_000;
/// How long the server keeps a bulk reader's consumer after its fetch: the server removes it
/// (a service may not delete consumers, `platform::nats_auth`, lest it delete another's).
const BULK_CONSUMER_IDLE: Duration = Duration::from_secs(5);

impl LogReader {
    /// The task's last stored event, if the log holds one.
    async fn last(&self) -> anyhow::Result<Option<RunEventV1>> {
        let found = self
            .log
            .get_last_raw_message_by_subject(&self.subject)
            .await;
        let message = match found {
            Ok(message) => message,
            Err(err)
                if err.kind()
                    == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound =>
            {
                return Ok(None);
            }
            Err(err) => return Err(anyhow::Error::new(err).context("cannot read run events")),
        };
        match serde_json::from_slice::<RunEventMessage>(&message.payload) {
            Ok(RunEventMessage::V1(event)) => Ok(Some(event)),
            Err(err) => Err(anyhow::Error::new(err).context("undecodable last run event")),
        }
    }

    /// The next stored event of the task, if the log holds one.
    async fn next(&mut self) -> anyhow::Result<Option<RunEventV1>> {
        if self.ahead.is_empty() && self.bulk {
            match self.read_ahead().await {
                Ok(0) => self.bulk = false,
                Ok(read) => self.bulk = read == BULK_BATCH,
                Err(err) => {
                    // One message at a time still works: go on that way.
                    tracing::debug!(error = format!("{err:#}"), "bulk read of run events failed");
                    self.bulk = false;
                }
            }
        }
        if let Some((seq, event)) = self.ahead.pop_front() {
            self.stream_seq = seq;
            return Ok(Some(event));
        }
        let event = self.next_one().await?;
        // Many events read one at a time and more coming: the rest in bulk.
        self.read_singly += u64::from(event.is_some());
        if self.read_singly == BULK_AFTER {
            self.bulk = true;
        }
        Ok(event)
    }

    /// Reads up to [`BULK_BATCH`] events after `stream_seq` in one fetch, through an ephemeral
    /// consumer of the task's subject that the server removes [`BULK_CONSUMER_IDLE`] after;
    /// how many it read.
    async fn read_ahead(&mut self) -> anyhow::Result<usize> {
        use jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
        let consumer = self
            .log
            .create_consumer(pull::Config {
                filter_subject: self.subject.clone(),
                deliver_policy: DeliverPolicy::ByStartSequence {
                    start_sequence: self.stream_seq + 1,
                },
                ack_policy: AckPolicy::None,
                inactive_threshold: BULK_CONSUMER_IDLE,
                memory_storage: true,
                ..Default::default()
            })
            .await
            .context("cannot open a bulk read of run events")?;
        let mut batch = consumer
            .fetch()
            .max_messages(BULK_BATCH)
            .messages()
            .await
            .context("cannot fetch run events")?;
        let mut read = 0;
        while let Some(message) = batch.next().await {
            let message = message.map_err(|err| anyhow::anyhow!("fetching run events: {err}"))?;
            read += 1;
            let seq = message.info().map_or(0, |info| info.stream_sequence);
            match serde_json::from_slice::<RunEventMessage>(&message.payload) {
                Ok(RunEventMessage::V1(event)) => self.ahead.push_back((seq, event)),
                Err(err) => {
                    tracing::error!(error = %err, seq, "undecodable run event skipped");
                    self.stream_seq = self.stream_seq.max(seq);
                }
            }
        }
        Ok(read)
    }

    /// The next stored event of the task, one request for it.
    async fn next_one(&mut self) -> anyhow::Result<Option<RunEventV1>> {
        loop {
            let found = self
                .log
                .get_first_raw_message_by_subject(&self.subject, self.stream_seq + 1)
                .await;
            let message = match found {
                Ok(message) => message,
                Err(err)
                    if err.kind()
                        == async_nats::jetstream::stream::RawMessageErrorKind::NoMessageFound =>
                {
                    return Ok(None);
                }
                Err(err) => return Err(anyhow::Error::new(err).context("cannot read run events")),
            };
            self.stream_seq = message.sequence;
            match serde_json::from_slice::<RunEventMessage>(&message.payload) {
                Ok(RunEventMessage::V1(event)) => return Ok(Some(event)),
                Err(err) => {
                    tracing::error!(error = %err, seq = message.sequence, "undecodable run event skipped");
                }
            }
        }
    }
}

struct Follow {
    registration: Registration,
    history: Arc<HistoryBarrier>,
    reader: LogReader,
    /// `seq` of the last event handed out.
    last: u64,
    /// Events read from the log, not handed out yet.
    pending: std::collections::VecDeque<Arc<SharedEvent>>,
    recheck: Duration,
    /// Fires every [`Self::recheck`]; the log is read again when nothing came live since it
    /// last fired. One timer for the reader's life, reset only when it fires: a live event does
    /// not touch it (10,000 readers of one event made and dropped 10,000 timers, each a lock on
    /// the runtime's timer wheel).
    recheck_timer: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// A live event came since the timer last fired.
    heard: bool,
    /// Whether the log may hold events the live feed did not bring.
    read_log: bool,
    /// Changes when this process's NATS connection came back: live events published meanwhile
    /// never arrive, so the log is read again.
    reconnections: tokio::sync::watch::Receiver<u64>,
    done: bool,
    replay: Replay,
}

impl Follow {
    /// The next event; a terminal one once history has written it. What is awaited rarely (a
    /// log read, history's progress) is boxed, so an idle reader's future stays small.
    async fn next(&mut self) -> Option<Arc<SharedEvent>> {
        let event = self.next_event().await?;
        if event.event.is_terminal() {
            Box::pin(self.history.written(event.task_id, event.seq)).await;
        }
        Some(event)
    }

    async fn next_event(&mut self) -> Option<Arc<SharedEvent>> {
        loop {
            if self.done {
                return None;
            }
            while let Some(event) = self.pending.pop_front() {
                if let Some(event) = self.take(event) {
                    return Some(Box::pin(self.compacted(event)).await);
                }
            }
            if self.read_log {
                self.read_log = false;
                loop {
                    match Box::pin(self.reader.next()).await {
                        Ok(Some(event)) if event.seq > self.last => {
                            self.pending.push_back(SharedEvent::new(event));
                            break;
                        }
                        // At or before the cursor: handed out already (it came live), or
                        // the cursor was one ahead of the log and this is the end after all.
                        Ok(Some(event)) if event.event.is_terminal() => {
                            self.done = true;
                            return None;
                        }
                        Ok(Some(_)) => {}
                        Ok(None) => break,
                        Err(err) => {
                            tracing::warn!(error = format!("{err:#}"), "run event log read failed");
                            break;
                        }
                    }
                }
                if !self.pending.is_empty() {
                    self.read_log = true; // maybe more after it
                }
                continue;
            }
            // Caught up: wait for a live event, or re-read the log now and then.
            let live = async {
                match self.registration.rx.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                live = live => match live {
                    Ok(event) if event.seq == self.last + 1 => {
                        self.heard = true;
                        if let Some(event) = self.take(event) {
                            return Some(event);
                        }
                    }
                    Ok(event) if event.seq > self.last + 1 => self.read_log = true, // a gap
                    Ok(event) if event.event.is_terminal() => return None, // reader was ahead
                    Ok(_) => {} // older: handed out already
                    // The client fell more than the channel holds behind: what it missed is
                    // read from the log, and it goes on with the channel's oldest event.
                    Err(broadcast::error::RecvError::Lagged(skipped)) => {
                        lagged(self.registration.task_id, skipped);
                        self.read_log = true;
                    }
                    // The hub is gone (the service stops): the log alone, at each recheck.
                    Err(broadcast::error::RecvError::Closed) => self.registration.rx = None,
                },
                () = self.recheck_timer.as_mut() => {
                    let deadline = tokio::time::Instant::now() + self.recheck;
                    self.recheck_timer.as_mut().reset(deadline);
                    self.read_log = !std::mem::take(&mut self.heard);
                }
                Ok(()) = self.reconnections.changed() => self.read_log = true,
            }
        }
    }

    /// `event` (read from the log) with the deltas that follow it in the log joined to it, as
    /// far as they go ([`Replay::Compact`]); what ends the run of deltas stays pending.
    async fn compacted(&mut self, mut event: Arc<SharedEvent>) -> Arc<SharedEvent> {
        if self.replay == Replay::Raw || self.done {
            return event;
        }
        loop {
            let next = match self.pending.pop_front() {
                Some(next) => next,
                None => match self.reader.next().await {
                    Ok(Some(next)) => SharedEvent::new(next),
                    // The live tail: what comes next comes live.
                    Ok(None) => return event,
                    Err(err) => {
                        tracing::warn!(error = format!("{err:#}"), "run event log read failed");
                        self.read_log = true;
                        return event;
                    }
                },
            };
            if next.seq <= self.last {
                continue; // handed out already (it came live)
            }
            // An event read from the log is this reader's alone: joined in place, not copied.
            if next.seq == self.last + 1 && Arc::make_mut(&mut event).join(&next) {
                self.last = next.seq;
                continue;
            }
            self.pending.push_front(next);
            self.read_log = true;
            return event;
        }
    }

    /// Hands `event` out if it is the next one.
    fn take(&mut self, event: Arc<SharedEvent>) -> Option<Arc<SharedEvent>> {
        if event.seq != self.last + 1 {
            return None;
        }
        self.last = event.seq;
        self.done = event.event.is_terminal();
        Some(event)
    }
}

/// Asks history how far it has written a run (`<prefix>.history.progress`). One per process,
/// shared by every reader.
struct HistoryBarrier {
    client: async_nats::Client,
    subject: String,
    /// The waits in progress, one per run end: every reader of that end on this replica waits
    /// for the same one (10,000 clients of one run asked history 10,000 times).
    waits: Arc<Mutex<HashMap<(Uuid, u64), SharedWait>>>,
}

/// One wait for a run's end to be written, shared by its readers.
type SharedWait = Arc<tokio::sync::OnceCell<()>>;

impl HistoryBarrier {
    fn new(client: async_nats::Client, subject: String) -> Self {
        Self {
            client,
            subject,
            waits: Arc::default(),
        }
    }

    /// Returns once history has written `task_id` up to `seq` (see [`Self::wait`]); readers of
    /// the same end share one wait.
    async fn written(&self, task_id: Uuid, seq: u64) {
        let key = (task_id, seq);
        let Some(wait) = self
            .waits
            .lock()
            .ok()
            .map(|mut waits| waits.entry(key).or_default().clone())
        else {
            return self.wait(task_id, seq).await;
        };
        wait.get_or_init(|| self.wait(task_id, seq)).await;
        // Readers that come later find history caught up at their first question.
        if let Ok(mut waits) = self.waits.lock()
            && waits.get(&key).is_some_and(|held| Arc::ptr_eq(held, &wait))
        {
            waits.remove(&key);
        }
    }

    /// Returns once history has written `task_id` up to `seq`, or after [`HISTORY_WAIT`], or at
    /// once when no history replica is there to answer. Polls with a growing pause (10 ms to
    /// 200 ms): history is usually a few milliseconds behind the worker.
    async fn wait(&self, task_id: Uuid, seq: u64) {
        let deadline = tokio::time::Instant::now() + HISTORY_WAIT;
        let mut pause = Duration::from_millis(10);
        let mut warned = false;
        loop {
            match self.ask(task_id).await {
                Ok(written) if written >= seq => return,
                Ok(_) => {}
                Err(err) => {
                    if matches!(err, platform::rpc::RpcError::NoResponders { .. }) {
                        tracing::warn!(task.id = %task_id, "no history replica answers; the run's end is not held back");
                        return;
                    }
                    // Once per wait: 10,000 runs ending at once asked history ~5 times each
                    // while it was behind, and logged every one (section 21 of BENCHMARKS.md).
                    if !std::mem::replace(&mut warned, true) {
                        tracing::warn!(task.id = %task_id, error = %err, "history progress unknown");
                    }
                }
            }
            if tokio::time::Instant::now() + pause > deadline {
                tracing::warn!(task.id = %task_id, seq, "history has not written the run's end in time; handed out anyway");
                return;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    async fn ask(&self, task_id: Uuid) -> Result<u64, platform::rpc::RpcError> {
        let request = ProgressRequest::V1 { task_id };
        let payload = serde_json::to_vec(&request).unwrap_or_default();
        let reply = platform::rpc::request(
            &self.client,
            self.subject.clone(),
            payload.into(),
            HISTORY_ASK_TIMEOUT,
        )
        .await?;
        match serde_json::from_slice(&reply.payload) {
            Ok(ProgressReply::V1 { written_seq }) => Ok(written_seq),
            Err(_) => Ok(0),
        }
    }
}

/// A fraction in [0, 1) that differs between readers (spreads their log re-reads).
fn jitter(task_id: Uuid, after: u64) -> f64 {
    use std::hash::BuildHasher;
    let hash = std::collections::hash_map::RandomState::new().hash_one((task_id, after));
    (hash % 1000) as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::agui::Event;

    fn event(seq: u64, event: Event) -> RunEventV1 {
        RunEventV1 {
            task_id: Uuid::nil(),
            owner: "alice".into(),
            thread_id: "t".into(),
            run_id: "r".into(),
            seq,
            emitted_at: chrono::DateTime::UNIX_EPOCH,
            event,
        }
    }

    fn text(seq: u64, id: &str, delta: &str) -> RunEventV1 {
        event(
            seq,
            Event::TextMessageContent {
                message_id: id.into(),
                delta: delta.into(),
            },
        )
    }

    #[test]
    fn deltas_of_one_message_join_under_the_last_seq_and_nothing_else_does() {
        let mut joined = text(3, "m1", "Hello, ");
        assert!(join(&mut joined, &text(4, "m1", "world")));
        assert_eq!(joined.seq, 4);
        assert_eq!(joined, text(4, "m1", "Hello, world"));
        // Another message, another kind, or past the size bound: not joined, unchanged.
        assert!(!join(&mut joined, &text(5, "m2", "!")));
        let end = event(
            5,
            Event::TextMessageEnd {
                message_id: "m1".into(),
            },
        );
        assert!(!join(&mut joined, &end));
        let big = "x".repeat(COMPACT_MAX_BYTES);
        assert!(!join(&mut joined, &text(5, "m1", &big)));
        assert_eq!(joined, text(4, "m1", "Hello, world"));
        // Tool call arguments likewise.
        let args = |seq, delta: &str| {
            event(
                seq,
                Event::ToolCallArgs {
                    tool_call_id: "c1".into(),
                    delta: delta.into(),
                },
            )
        };
        let mut call = args(7, "{\"q\":");
        assert!(join(&mut call, &args(8, "1}")));
        assert_eq!(call, args(8, "{\"q\":1}"));
    }
}
