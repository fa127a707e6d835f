//! The fork endpoint: the request/reply on which the runs service, which serves
//! `POST /api/v1/agent/threads/{threadId}/fork`, asks history for a new thread of the owner
//! holding one of its threads' messages up to one of them. The fork's files are the original's
//! too: attachments links them to the new thread before the copy is committed.

use std::time::Duration;

use anyhow::Context as _;
use protocol::erase::{AttachmentsLinkReply, AttachmentsLinkRequest};
use protocol::messaging::Names;
use protocol::threads::{ThreadForkReply, ThreadForkRequest};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::bus::respond;
use crate::store::Forked;
use crate::{http, store};

/// How long attachments may take to link the files.
const LINK_TIMEOUT: Duration = Duration::from_secs(5);

/// Answers [`ThreadForkRequest`]s until `shutdown`; an error gets no answer (the caller times
/// out and answers 503).
pub(crate) async fn serve(
    client: async_nats::Client,
    names: Names,
    pool: PgPool,
    owner_budgets: platform::nats::JsonKv,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let (pool, link_client, link_names, budgets) = (&pool, &client, &names, &owner_budgets);
    respond::serve(
        client.clone(),
        &names,
        names.history_thread_fork_subject(),
        shutdown,
        || tracing::info_span!("history.thread_fork.handle", otel.kind = "server"),
        |request| answer(pool, link_client, link_names, budgets, request),
    )
    .await
}

async fn answer(
    pool: &PgPool,
    client: &async_nats::Client,
    names: &Names,
    owner_budgets: &platform::nats::JsonKv,
    request: ThreadForkRequest,
) -> anyhow::Result<ThreadForkReply> {
    let ThreadForkRequest::V1 {
        owner,
        thread_id,
        message_id,
        new_thread_id,
    } = request;
    let link = || async {
        let request = AttachmentsLinkRequest::V1 {
            owner: owner.clone(),
            from_session: thread_id.clone(),
            to_session: new_thread_id.clone(),
        };
        let reply = platform::rpc::request(
            client,
            names.attachments_link_subject(),
            serde_json::to_vec(&request)?.into(),
            LINK_TIMEOUT,
        )
        .await
        .context("attachments did not link the thread's files")?;
        let AttachmentsLinkReply::V1 { .. } = serde_json::from_slice(&reply.payload)?;
        Ok(())
    };
    let forked =
        store::fork_thread(pool, &owner, &thread_id, &message_id, &new_thread_id, link).await?;
    Ok(match forked {
        Forked::Thread(row, kept) => {
            platform::kept::report(owner_budgets, &owner, u64::try_from(kept).unwrap_or(0)).await;
            tracing::info!(messages = row.last_seq, "thread forked");
            metrics::counter!("switchboard_history_threads_forked_total").increment(1);
            ThreadForkReply::V1 {
                thread: http::summary(row),
            }
        }
        Forked::NoThread => ThreadForkReply::NoThread,
        Forked::NoMessage => ThreadForkReply::NoMessage,
        Forked::Exists => ThreadForkReply::Exists,
    })
}
