//! A run's event log, as every client-facing stream reads it.
//!
//! The log is the RUN_EVENTS stream: one subject per task, each event numbered by its per-run
//! `seq` (1, 2, 3, ... with no gaps; the worker advances only after JetStream's ack). A reader
//! asks for the events after a `seq` it already has and gets each later event exactly once, in
//! order, until the terminal event.
//!
//! One core NATS subscription per runs replica ([`EventHub`]) carries live events to every
//! local reader, so an idle stream costs a channel, not a JetStream consumer. A reader registers
//! for live events first, then reads what the log already holds; events are deduplicated by
//! `seq`, and a gap (a live event lost to a slow subscriber) is filled from the log. A waiting
//! reader also re-reads the log every minute or two, so even a lost terminal event ends the
//! stream.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream;
use futures::{Stream, StreamExt};
use protocol::messaging::{Names, RunEventMessage, RunEventV1};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Live events buffered per reader before the reader falls back to the log.
const LIVE_BUFFER: usize = 64;
/// How often, at least, a waiting reader re-reads the log in case a live event was lost (plus
/// a per-reader jitter of up to the same again, so readers opened together do not read
/// together).
const RECHECK: Duration = Duration::from_secs(60);

/// Fans the live events of every run out to this replica's readers.
#[derive(Clone)]
pub(crate) struct EventHub {
    readers: Arc<Mutex<HashMap<Uuid, Vec<mpsc::Sender<RunEventV1>>>>>,
    log: jetstream::stream::Stream,
    names: Names,
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
        shutdown: CancellationToken,
    ) -> anyhow::Result<Self> {
        let log = js
            .get_stream(names.run_events_stream())
            .await
            .context("run events stream missing")?;
        let subscription = client
            .subscribe(names.run_events_subjects())
            .await
            .context("cannot subscribe to run events")?;
        let hub = Self {
            readers: Arc::default(),
            log,
            names,
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
        let Ok(mut readers) = self.readers.lock() else {
            return;
        };
        if let Some(senders) = readers.get_mut(&event.task_id) {
            // A full or closed channel drops the event for that reader only: it refills from
            // the log when it notices the gap.
            senders.retain(|tx| !tx.is_closed());
            for tx in senders.iter() {
                let _ = tx.try_send(event.clone());
            }
            if senders.is_empty() {
                readers.remove(&event.task_id);
            }
        }
    }

    fn register(&self, task_id: Uuid) -> Registration {
        let (tx, rx) = mpsc::channel(LIVE_BUFFER);
        if let Ok(mut readers) = self.readers.lock() {
            readers.entry(task_id).or_default().push(tx);
        }
        Registration {
            hub: self.clone(),
            task_id,
            rx,
        }
    }

    /// Number of readers registered on this replica (for metrics and tests).
    #[allow(dead_code)]
    pub(crate) fn readers(&self) -> usize {
        self.readers
            .lock()
            .map(|r| r.values().map(Vec::len).sum())
            .unwrap_or(0)
    }

    /// The events of `task_id` after `after`, each once and in order, ending after the
    /// terminal event. `Expired` when the log no longer holds the next event the reader needs
    /// (checked before the first event, so a caller can answer with a status code).
    /// `ended`: the run is known to have ended, so an empty log means its events expired.
    pub(crate) async fn follow(
        &self,
        task_id: Uuid,
        after: u64,
        ended: bool,
    ) -> Result<impl Stream<Item = RunEventV1> + Send + 'static, FollowError> {
        let registration = self.register(task_id);
        let subject = self.names.run_event_subject(task_id);
        let mut reader = LogReader {
            log: self.log.clone(),
            subject,
            stream_seq: 0,
        };
        let first = reader.next().await?;
        match &first {
            Some(first) if first.seq > after + 1 => return Err(FollowError::Expired { after }),
            None if ended => return Err(FollowError::Expired { after }),
            _ => {}
        }
        let pending_empty = first.is_none();
        let state = Follow {
            registration,
            reader,
            last: after,
            pending: first.into_iter().collect(),
            recheck: RECHECK + RECHECK.mul_f64(jitter(task_id, after)),
            // An empty log was just read: wait for live events (or the recheck) first.
            read_log: !pending_empty,
            done: false,
        };
        Ok(futures::stream::unfold(state, |mut state| async move {
            let event = state.next().await?;
            Some((event, state))
        }))
    }
}

/// A live registration; unregisters when dropped.
struct Registration {
    hub: EventHub,
    task_id: Uuid,
    rx: mpsc::Receiver<RunEventV1>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.rx.close();
        if let Ok(mut readers) = self.hub.readers.lock()
            && let Some(senders) = readers.get_mut(&self.task_id)
        {
            senders.retain(|tx| !tx.is_closed());
            if senders.is_empty() {
                readers.remove(&self.task_id);
            }
        }
    }
}

/// Reads one task's events from the log, in stream order.
struct LogReader {
    log: jetstream::stream::Stream,
    subject: String,
    /// Stream sequence of the last message read.
    stream_seq: u64,
}

impl LogReader {
    /// The next stored event of the task, if the log holds one.
    async fn next(&mut self) -> anyhow::Result<Option<RunEventV1>> {
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
    reader: LogReader,
    /// `seq` of the last event handed out.
    last: u64,
    /// Events read from the log, not handed out yet.
    pending: std::collections::VecDeque<RunEventV1>,
    recheck: Duration,
    /// Whether the log may hold events the live feed did not bring.
    read_log: bool,
    done: bool,
}

impl Follow {
    async fn next(&mut self) -> Option<RunEventV1> {
        loop {
            if self.done {
                return None;
            }
            while let Some(event) = self.pending.pop_front() {
                if let Some(event) = self.take(event) {
                    return Some(event);
                }
            }
            if self.read_log {
                self.read_log = false;
                loop {
                    match self.reader.next().await {
                        Ok(Some(event)) if event.seq > self.last => {
                            self.pending.push_back(event);
                            break;
                        }
                        Ok(Some(_)) => {} // handed out already (it came live)
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
            tokio::select! {
                live = self.registration.rx.recv() => match live {
                    Some(event) if event.seq == self.last + 1 => {
                        if let Some(event) = self.take(event) {
                            return Some(event);
                        }
                    }
                    Some(event) if event.seq > self.last + 1 => self.read_log = true, // a gap
                    Some(_) => {} // older: handed out already
                    None => return None,
                },
                () = tokio::time::sleep(self.recheck) => self.read_log = true,
            }
        }
    }

    /// Hands `event` out if it is the next one.
    fn take(&mut self, event: RunEventV1) -> Option<RunEventV1> {
        if event.seq != self.last + 1 {
            return None;
        }
        self.last = event.seq;
        self.done = event.event.is_terminal();
        Some(event)
    }
}

/// A fraction in [0, 1) that differs between readers (spreads their log re-reads).
fn jitter(task_id: Uuid, after: u64) -> f64 {
    use std::hash::BuildHasher;
    let hash = std::collections::hash_map::RandomState::new().hash_one((task_id, after));
    (hash % 1000) as f64 / 1000.0
}
