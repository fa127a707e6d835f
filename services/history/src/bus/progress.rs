//! How far history has written a run: the request/reply endpoint the runs service asks before
//! it hands a client a run's terminal event, so that a client that has seen a run end reads the
//! run's messages complete from every history endpoint (read-your-writes across services).

use protocol::messaging::{Names, ProgressReply, ProgressRequest};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::bus::respond;
use crate::store;

/// Answers [`ProgressRequest`]s until `shutdown`; a database error gets no answer (the caller
/// times out and does not wait on us).
pub(crate) async fn serve(
    client: async_nats::Client,
    names: Names,
    pool: PgPool,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let pool = &pool;
    respond::serve(
        client,
        &names,
        names.history_progress_subject(),
        shutdown,
        || tracing::info_span!("history.progress.handle", otel.kind = "server"),
        |ProgressRequest::V1 { task_id }| async move {
            let written = store::written_seq(pool, task_id).await?;
            anyhow::Ok(ProgressReply::V1 {
                written_seq: u64::try_from(written.unwrap_or(0)).unwrap_or(0),
            })
        },
    )
    .await
}
