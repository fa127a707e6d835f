//! The queries of a thread's fork (`crate::bus::fork`): a new thread of the owner holding a copy of
//! another's messages up to one of them.

use protocol::metadata::{AgentChatMessageMetadata as Metadata, ForkedFrom, keys};
use sqlx::PgPool;
use sqlx::types::Json;

use super::ThreadRow;

/// What a fork did.
#[derive(Debug)]
pub(crate) enum Forked {
    /// The new thread, as the list shows it, and what its owner keeps in history now.
    Thread(ThreadRow, i64),
    /// The owner has no such thread.
    NoThread,
    /// The thread holds no message with that id.
    NoMessage,
    /// The owner has a thread with the new id already.
    Exists,
}

/// Copies the owner's thread `from` up to (and with) its message `message_id` into the new
/// thread `to`, in one transaction: the messages of the conversation as it stands there (each
/// keeping its id, role, content, metadata and time, marked `forked_from`; earlier versions of
/// a regenerated reply left out), their tool calls, and the title; the new thread is the
/// owner's most recent. A copied message belongs
/// to a task of its own (derived from its run's task and the new thread: a message id is
/// unique per task), which no run record names. `before_commit` runs once the copy is made and
/// before it is committed (the files' links): its failure leaves nothing.
pub(crate) async fn fork_thread<F, Fut>(
    pool: &PgPool,
    owner: &str,
    from: &str,
    message_id: &str,
    to: &str,
    before_commit: F,
) -> anyhow::Result<Forked>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let mut tx = pool.begin().await?;
    let Some(title) = sqlx::query_scalar!(
        "SELECT title FROM threads WHERE owner = $1 AND thread_id = $2 FOR SHARE",
        owner,
        from
    )
    .fetch_optional(&mut *tx)
    .await?
    else {
        return Ok(Forked::NoThread);
    };
    // The latest message with that id (a resent id is stored once; a regenerated turn keeps
    // its user message).
    let Some(upto) = sqlx::query_scalar!(
        "SELECT max(seq) FROM messages WHERE owner = $1 AND thread_id = $2 AND message_id = $3",
        owner,
        from,
        message_id
    )
    .fetch_one(&mut *tx)
    .await?
    else {
        return Ok(Forked::NoMessage);
    };
    // Made now: listed first among the owner's threads (`last_seq` is set once the messages
    // are copied).
    let created = sqlx::query!(
        "INSERT INTO threads (owner, thread_id, last_seq, created_at, updated_at, title)
         SELECT $1, $3, 0, min(created_at), now(), $4
           FROM messages WHERE owner = $1 AND thread_id = $2 AND seq <= $5
         ON CONFLICT (owner, thread_id) DO NOTHING",
        owner,
        from,
        to,
        title,
        upto
    )
    .execute(&mut *tx)
    .await?;
    if created.rows_affected() == 0 {
        return Ok(Forked::Exists);
    }
    // The conversation as it stands at that message: earlier versions of a regenerated reply
    // are left out (the message forked at is kept even if it is one, no longer marked).
    let superseded = keys::SUPERSEDED_BY;
    sqlx::query!(
        "INSERT INTO tool_calls (task_id, tool_call_id, message_id, name, arguments, started_seq)
         SELECT md5(c.task_id::text || $3)::uuid, c.tool_call_id, c.message_id, c.name,
                c.arguments, c.started_seq
           FROM tool_calls c
          WHERE EXISTS (SELECT 1 FROM messages m
                         WHERE m.owner = $1 AND m.thread_id = $2 AND m.seq <= $4
                           AND (m.seq = $4 OR NOT (m.metadata ? $5))
                           AND m.task_id = c.task_id AND m.message_id = c.message_id)",
        owner,
        from,
        to,
        upto,
        superseded
    )
    .execute(&mut *tx)
    .await?;
    let forked_from = Metadata {
        forked_from: Some(ForkedFrom {
            thread_id: from.to_owned(),
        }),
        ..Metadata::default()
    };
    let copied = sqlx::query!(
        "INSERT INTO messages (id, owner, thread_id, seq, task_id, message_id, role, content,
                               metadata, agui, created_at)
         SELECT gen_random_uuid(), owner, $3, row_number() OVER (ORDER BY seq),
                md5(task_id::text || $3)::uuid, message_id, role, content,
                (metadata - $5::text) || $6, agui, created_at
           FROM messages
          WHERE owner = $1 AND thread_id = $2 AND seq <= $4
            AND (seq = $4 OR NOT (metadata ? $5))",
        owner,
        from,
        to,
        upto,
        superseded,
        Json(&forked_from) as _
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    sqlx::query!(
        "UPDATE threads SET last_seq = $3 WHERE owner = $1 AND thread_id = $2",
        owner,
        to,
        i64::try_from(copied).unwrap_or(i64::MAX)
    )
    .execute(&mut *tx)
    .await?;
    let kept = super::count_thread(&mut tx, owner, to).await?;
    let thread = sqlx::query_as!(
        ThreadRow,
        "SELECT thread_id, title, last_seq, created_at, updated_at FROM threads
         WHERE owner = $1 AND thread_id = $2",
        owner,
        to
    )
    .fetch_one(&mut *tx)
    .await?;
    before_commit().await?;
    tx.commit().await?;
    Ok(Forked::Thread(thread, kept))
}
