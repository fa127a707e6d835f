//! The rename endpoint: the request/reply on which the runs service, which serves
//! `PATCH /api/v1/agent/threads/{threadId}` (every path under `/api/v1/agent/threads/` is
//! routed to it), asks history to give an owner's thread a title. The answer is the thread as
//! the list shows it, or none: another owner's thread is never renamed, and is not found.

use protocol::messaging::Names;
use protocol::threads::{ThreadRenameReply, ThreadRenameRequest, parse_title};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::bus::respond;
use crate::{http, store};

/// Answers [`ThreadRenameRequest`]s until `shutdown`; an error gets no answer (the caller
/// times out and answers 503).
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
        names.history_thread_rename_subject(),
        shutdown,
        || tracing::info_span!("history.thread_rename.handle", otel.kind = "server"),
        |request| answer(pool, request),
    )
    .await
}

async fn answer(pool: &PgPool, request: ThreadRenameRequest) -> anyhow::Result<ThreadRenameReply> {
    let ThreadRenameRequest::V1 {
        owner,
        thread_id,
        title,
    } = request;
    // The caller checked it; checked again, as the table's constraint would refuse it anyway.
    let title = match parse_title(&title) {
        Ok(title) => title,
        Err(err) => {
            return Ok(ThreadRenameReply::Refused {
                message: err.to_string(),
            });
        }
    };
    let thread = store::rename_thread(pool, &owner, &thread_id, &title).await?;
    if thread.is_some() {
        tracing::info!(thread.id = %thread_id, "thread renamed");
    }
    Ok(ThreadRenameReply::V1 {
        thread: thread.map(http::summary),
    })
}
