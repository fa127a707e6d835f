//! How far history has written a run: the request/reply endpoint the runs service asks before
//! it hands a client a run's terminal event, so that a client that has seen a run end reads the
//! run's messages complete from every history endpoint (read-your-writes across services).

use futures::StreamExt;
use protocol::messaging::{HISTORY_QUEUE, Names, ProgressReply, ProgressRequest};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::store;

/// Requests answered at once per replica.
const CONCURRENCY: usize = 32;

/// Answers [`ProgressRequest`]s until `shutdown`.
pub(crate) async fn serve(
    client: async_nats::Client,
    names: Names,
    pool: PgPool,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let requests = client
        .queue_subscribe(names.history_progress_subject(), HISTORY_QUEUE.to_owned())
        .await?;
    requests
        .take_until(shutdown.cancelled_owned())
        .for_each_concurrent(CONCURRENCY, |message| {
            let (client, pool) = (&client, &pool);
            async move {
                let Some(reply) = message.reply else {
                    return;
                };
                let Ok(ProgressRequest::V1 { task_id }) = serde_json::from_slice(&message.payload)
                else {
                    tracing::warn!("undecodable progress request ignored");
                    return;
                };
                // No answer on a database error: the caller times out and does not wait on us.
                let written = match store::written_seq(pool, task_id).await {
                    Ok(seq) => seq,
                    Err(err) => {
                        tracing::warn!(task.id = %task_id, error = %err, "progress unknown");
                        return;
                    }
                };
                let answer = ProgressReply::V1 {
                    written_seq: u64::try_from(written.unwrap_or(0)).unwrap_or(0),
                };
                if let Ok(payload) = serde_json::to_vec(&answer)
                    && let Err(err) = client.publish(reply, payload.into()).await
                {
                    tracing::warn!(error = %err, "cannot answer a progress request");
                }
            }
        })
        .await;
    Ok(())
}
