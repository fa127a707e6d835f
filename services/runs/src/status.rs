//! Run status and cancel. History's `run_progress` is the durable index of every run (the
//! owner's latest run with a run id, and where its task is in the RUNS stream); the live status
//! record in KV (`task.<id>`) is created by the worker when it starts the run or by a cancel, so
//! a run without one is queued (or, once history has its end, ended).

use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::stream::Stream;
use chrono::Utc;
use platform::lifecycle::RunBuckets;
use platform::nats::{Created, task_at};
use protocol::messaging::{
    Names, RunLookupReply, RunLookupRequest, RunRecord, RunStatus, RunStatusRecord, RunTaskV1,
    status_key, status_pattern,
};
use protocol::run_input::RunStatusResponse;

/// How long a lookup waits for history's answer (history itself waits at most 2 s to catch up).
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Looks runs up and cancels them, always scoped to their owner.
pub(crate) struct RunDirectory {
    client: async_nats::Client,
    runs: Stream,
    names: Names,
    buckets: RunBuckets,
}

/// The status record of a run no worker has touched: queued, or as far as history has it.
fn untouched(owner: &str, run_id: &str, run: &RunRecord) -> RunStatusRecord {
    RunStatusRecord {
        task_id: run.task_id,
        owner: owner.to_owned(),
        thread_id: run.thread_id.clone(),
        run_id: run_id.to_owned(),
        status: run.status,
        cancel_requested: false,
        created: run.accepted_at,
        updated_at: run.accepted_at,
        error: run.error.clone(),
        alive_at: None,
        usage: Vec::new(),
        timings: None,
    }
}

/// The live record, unless history has written the run's end and the record has not caught
/// up: the terminal event in the run's log is the end (the worker writes the record after it,
/// and a record read from a replica that lags, after a partition, may still say running), and
/// history has its error too.
fn settled(record: RunStatusRecord, run: &RunRecord) -> RunStatusRecord {
    if run.status.is_terminal() && !record.status.is_terminal() {
        RunStatusRecord {
            status: run.status,
            cancel_requested: false,
            error: record.error.or_else(|| run.error.clone()),
            ..record
        }
    } else {
        record
    }
}

impl RunDirectory {
    pub(crate) fn new(
        client: async_nats::Client,
        runs: Stream,
        names: Names,
        buckets: RunBuckets,
    ) -> Self {
        Self {
            client,
            runs,
            names,
            buckets,
        }
    }

    /// The caller's latest run with this run id (a run id may be reused on several threads),
    /// from history, once history has written every run accepted before this call. Another
    /// owner's run is `None`, exactly like a missing one: the owner is part of the question.
    #[tracing::instrument(name = "runs.status.lookup", skip_all, fields(run.id = %run_id))]
    async fn lookup(&self, owner: &str, run_id: &str) -> anyhow::Result<Option<RunRecord>> {
        let runs_seq = self.runs.get_info().await?.state.last_sequence;
        let request = RunLookupRequest::V1 {
            owner: owner.to_owned(),
            run_id: run_id.to_owned(),
            runs_seq,
        };
        let reply = platform::rpc::request(
            &self.client,
            self.names.history_run_lookup_subject(),
            serde_json::to_vec(&request)?.into(),
            LOOKUP_TIMEOUT,
        )
        .await
        .context("history did not answer a run lookup")?;
        match serde_json::from_slice(&reply.payload)? {
            RunLookupReply::V1 { run } => Ok(run),
            RunLookupReply::Behind => anyhow::bail!("history has not written the latest runs yet"),
        }
    }

    /// The caller's latest run with this run id, as accepted (its task).
    pub(crate) async fn task(
        &self,
        owner: &str,
        run_id: &str,
    ) -> anyhow::Result<Option<RunTaskV1>> {
        let Some(seq) = self
            .lookup(owner, run_id)
            .await?
            .and_then(|run| run.runs_seq)
        else {
            return Ok(None);
        };
        let task = task_at(&self.runs, seq).await?;
        Ok(task.filter(|t| t.owner == owner && t.input.run_id == run_id))
    }

    /// The caller's run with this id: from history, or, while history cannot answer (down or
    /// behind), from the live status record of the owner's run with that id a worker wrote
    /// last (runs no worker has touched then answer 503).
    async fn locate(&self, owner: &str, run_id: &str) -> anyhow::Result<Option<RunStatusRecord>> {
        match self.lookup(owner, run_id).await {
            Ok(None) => Ok(None),
            Ok(Some(run)) => {
                let key = status_key(owner, run_id, run.task_id);
                let live = self.buckets.run_status.get::<RunStatusRecord>(&key).await?;
                Ok(Some(live.map_or_else(
                    || untouched(owner, run_id, &run),
                    |(record, _)| settled(record, &run),
                )))
            }
            Err(err) => {
                let pattern = status_pattern(owner, run_id);
                let Some(live) = self.buckets.run_status.last_matching(&pattern).await? else {
                    return Err(err);
                };
                tracing::warn!(
                    error = format!("{err:#}"),
                    "run found by its live status only"
                );
                Ok(Some(live))
            }
        }
    }

    /// The status of the caller's run.
    pub(crate) async fn find(
        &self,
        owner: &str,
        run_id: &str,
    ) -> anyhow::Result<Option<RunStatusRecord>> {
        self.locate(owner, run_id).await
    }

    /// Cancels the caller's run: a queued run ends cancelled at once; a running one is asked to
    /// stop (the worker ends it cancelled); an ended run is left as it is. Idempotent.
    pub(crate) async fn cancel(
        &self,
        owner: &str,
        run_id: &str,
    ) -> anyhow::Result<Option<RunStatusRecord>> {
        self.cancel_in(owner, run_id, None).await
    }

    /// [`Self::cancel`], of the run with this id on `thread_id` only when one is named (a run
    /// id may be reused on another thread, whose run is then left alone).
    pub(crate) async fn cancel_in(
        &self,
        owner: &str,
        run_id: &str,
        thread_id: Option<&str>,
    ) -> anyhow::Result<Option<RunStatusRecord>> {
        let Some(current) = self.locate(owner, run_id).await? else {
            return Ok(None);
        };
        if thread_id.is_some_and(|thread| thread != current.thread_id) {
            return Ok(None);
        }
        if current.status.is_terminal() {
            return Ok(Some(current)); // ended: nothing to cancel
        }
        let key = status_key(owner, run_id, current.task_id);
        let now = Utc::now();
        let cancelled = RunStatusRecord {
            status: RunStatus::Cancelled,
            updated_at: now,
            ..current
        };
        // Not started yet: the cancel creates the record, and the worker will find it.
        if self.buckets.run_status.create(&key, &cancelled).await? != Created::Exists {
            tracing::info!(task.id = %cancelled.task_id, "queued run cancelled");
            return Ok(Some(cancelled));
        }
        let updated = self
            .buckets
            .run_status
            .modify::<RunStatusRecord, _>(&key, |r| {
                (r.status == RunStatus::Running && !r.cancel_requested).then(|| RunStatusRecord {
                    cancel_requested: true,
                    updated_at: now,
                    ..r.clone()
                })
            })
            .await?;
        if let Some(record) = &updated
            && record.status == RunStatus::Running
        {
            // Every worker listens; the one running the task stops it.
            self.client
                .publish(
                    self.names.run_cancel_subject(record.task_id),
                    bytes::Bytes::new(),
                )
                .await?;
            self.client.flush().await?;
            tracing::info!(task.id = %record.task_id, "running run asked to stop");
        }
        Ok(updated)
    }
}

/// The HTTP answer for a status record.
pub(crate) fn status_response(record: RunStatusRecord) -> RunStatusResponse {
    RunStatusResponse {
        task_id: record.task_id.to_string(),
        thread_id: record.thread_id,
        run_id: record.run_id,
        status: record.status,
        cancel_requested: record.cancel_requested && !record.status.is_terminal(),
        created: record.created,
        updated_at: record.updated_at,
        error: record.error,
        usage: record.usage,
        timings: record.timings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(status: RunStatus) -> RunRecord {
        RunRecord {
            task_id: uuid::Uuid::nil(),
            thread_id: "t".into(),
            accepted_at: chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap(),
            status,
            runs_seq: Some(7),
            error: None,
        }
    }

    #[test]
    fn a_run_whose_end_history_wrote_is_ended_whatever_a_lagging_record_says() {
        let running = RunStatusRecord {
            status: RunStatus::Running,
            cancel_requested: true,
            ..untouched("alice", "r1", &run(RunStatus::Running))
        };
        let settled_record = settled(running.clone(), &run(RunStatus::Completed));
        assert_eq!(settled_record.status, RunStatus::Completed);
        assert!(!settled_record.cancel_requested);
        assert_eq!(settled_record.error, None);
        // Failed as far as history has it: its error with it (the record has none yet).
        let lost = RunRecord {
            error: Some("the worker stopped".into()),
            ..run(RunStatus::Failed)
        };
        let settled_failed = settled(running.clone(), &lost);
        assert_eq!(settled_failed.status, RunStatus::Failed);
        assert_eq!(settled_failed.error.as_deref(), Some("the worker stopped"));
        // History behind the record: the record stands.
        assert_eq!(settled(running.clone(), &run(RunStatus::Running)), running);
        let failed = RunStatusRecord {
            status: RunStatus::Failed,
            ..running
        };
        assert_eq!(
            settled(failed.clone(), &run(RunStatus::Completed)).status,
            RunStatus::Failed,
            "an ended record is not changed"
        );
    }
}
