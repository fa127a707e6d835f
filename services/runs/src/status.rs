//! Run status and cancel, read from and written to the run status bucket.

use chrono::Utc;
use platform::nats::RunBuckets;
use protocol::messaging::{Names, RunStatus, RunStatusRecord, run_lookup_key, status_key};
use protocol::run_input::RunStatusResponse;
use uuid::Uuid;

/// Looks runs up and cancels them, always scoped to their owner.
pub(crate) struct RunDirectory {
    client: async_nats::Client,
    names: Names,
    buckets: RunBuckets,
}

impl RunDirectory {
    pub(crate) fn new(client: async_nats::Client, names: Names, buckets: RunBuckets) -> Self {
        Self {
            client,
            names,
            buckets,
        }
    }

    /// The caller's run with this run id (the latest one, if the id was reused on several
    /// threads) or this task id. Another owner's run is `None`, exactly like a missing one.
    pub(crate) async fn find(
        &self,
        owner: &str,
        id: &str,
    ) -> anyhow::Result<Option<RunStatusRecord>> {
        let by_run_id = self
            .buckets
            .run_status
            .get::<Uuid>(&run_lookup_key(owner, id))
            .await?
            .map(|(task_id, _)| task_id);
        let task_id = match by_run_id {
            Some(task_id) => task_id,
            None => match Uuid::try_parse(id) {
                Ok(task_id) => task_id,
                Err(_) => return Ok(None),
            },
        };
        let record = self
            .buckets
            .run_status
            .get::<RunStatusRecord>(&status_key(task_id))
            .await?
            .map(|(record, _)| record);
        Ok(record.filter(|r| r.owner == owner))
    }

    /// Cancels the caller's run: a queued run ends cancelled at once; a running one is asked to
    /// stop (the worker ends it cancelled); an ended run is left as it is. Idempotent.
    pub(crate) async fn cancel(
        &self,
        owner: &str,
        id: &str,
    ) -> anyhow::Result<Option<RunStatusRecord>> {
        let Some(found) = self.find(owner, id).await? else {
            return Ok(None);
        };
        let now = Utc::now();
        let updated = self
            .buckets
            .run_status
            .modify::<RunStatusRecord, _>(&status_key(found.task_id), |r| match r.status {
                RunStatus::Queued => Some(RunStatusRecord {
                    status: RunStatus::Cancelled,
                    updated_at: now,
                    ..r.clone()
                }),
                RunStatus::Running if !r.cancel_requested => Some(RunStatusRecord {
                    cancel_requested: true,
                    updated_at: now,
                    ..r.clone()
                }),
                _ => None,
            })
            .await?;
        if let Some(record) = &updated {
            if record.status == RunStatus::Running {
                // Every worker listens; the one running the task stops it.
                self.client
                    .publish(
                        self.names.run_cancel_subject(record.task_id),
                        bytes::Bytes::new(),
                    )
                    .await?;
                self.client.flush().await?;
            }
            tracing::info!(task.id = %record.task_id, status = ?record.status, "run cancel requested");
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
