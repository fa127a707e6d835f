//! Run status and cancel. A run's task lives in the RUNS stream; its status record in KV
//! (`task.<id>`) is created by the worker when it starts the run or by a cancel, so a run
//! without one is queued.

use async_nats::jetstream::stream::Stream;
use chrono::Utc;
use platform::nats::{Created, RunBuckets, stored_task};
use protocol::messaging::{Names, RunStatus, RunStatusRecord, RunTaskV1, status_key};
use protocol::run_input::RunStatusResponse;

/// Looks runs up and cancels them, always scoped to their owner.
pub(crate) struct RunDirectory {
    client: async_nats::Client,
    runs: Stream,
    names: Names,
    buckets: RunBuckets,
}

fn queued(task: &RunTaskV1) -> RunStatusRecord {
    RunStatusRecord {
        task_id: task.task_id,
        owner: task.owner.clone(),
        thread_id: task.input.thread_id.clone(),
        run_id: task.input.run_id.clone(),
        status: RunStatus::Queued,
        cancel_requested: false,
        created: task.accepted_at,
        updated_at: task.accepted_at,
        error: None,
        alive_at: None,
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

    /// The caller's latest run with this run id (a run id may be reused on several threads).
    /// Another owner's run is `None`, exactly like a missing one: the owner is part of the key.
    pub(crate) async fn task(
        &self,
        owner: &str,
        run_id: &str,
    ) -> anyhow::Result<Option<RunTaskV1>> {
        let pattern = self.names.run_accepted_pattern(owner, run_id);
        let task = stored_task(&self.runs, &pattern).await?;
        Ok(task.filter(|t| t.owner == owner && t.input.run_id == run_id))
    }

    /// The status of the caller's run.
    pub(crate) async fn find(
        &self,
        owner: &str,
        run_id: &str,
    ) -> anyhow::Result<Option<RunStatusRecord>> {
        let Some(task) = self.task(owner, run_id).await? else {
            return Ok(None);
        };
        let record = self
            .buckets
            .run_status
            .get::<RunStatusRecord>(&status_key(task.task_id))
            .await?
            .map(|(record, _)| record);
        Ok(Some(record.unwrap_or_else(|| queued(&task))))
    }

    /// Cancels the caller's run: a queued run ends cancelled at once; a running one is asked to
    /// stop (the worker ends it cancelled); an ended run is left as it is. Idempotent.
    pub(crate) async fn cancel(
        &self,
        owner: &str,
        run_id: &str,
    ) -> anyhow::Result<Option<RunStatusRecord>> {
        let Some(task) = self.task(owner, run_id).await? else {
            return Ok(None);
        };
        let key = status_key(task.task_id);
        let now = Utc::now();
        let cancelled = RunStatusRecord {
            status: RunStatus::Cancelled,
            updated_at: now,
            ..queued(&task)
        };
        // Not started yet: the cancel creates the record, and the worker will find it.
        if self.buckets.run_status.create(&key, &cancelled).await? != Created::Exists {
            tracing::info!(task.id = %task.task_id, "queued run cancelled");
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
    }
}
