//! A session's files linked to another session of the owner, asked on `attachments.link` by
//! history as it forks a thread ([`protocol::erase::AttachmentsLinkRequest`]): the fork's
//! messages name the same files, which must stay the owner's for as long as either thread
//! holds them (erasing the original drops only its own links).

use protocol::erase::{AttachmentsLinkReply, AttachmentsLinkRequest};
use sqlx::PgPool;
use uuid::Uuid;

/// Links every file of `from` to `to` (same source: upload or generated); how many links were
/// made now. Idempotent (`workspace_files_session_file_key`).
pub(crate) async fn link(pool: &PgPool, owner: &str, from: &str, to: &str) -> sqlx::Result<u64> {
    let ids: Vec<Uuid> = sqlx::query_scalar!(
        "SELECT file_id FROM workspace_files WHERE owner = $1 AND session_id = $2",
        owner,
        from
    )
    .fetch_all(pool)
    .await?;
    if ids.is_empty() {
        return Ok(0);
    }
    let new_ids: Vec<Uuid> = ids.iter().map(|_| Uuid::now_v7()).collect();
    let made = sqlx::query!(
        "INSERT INTO workspace_files (id, owner, session_id, file_id, source)
         SELECT n.id, w.owner, $3, w.file_id, w.source
           FROM workspace_files w
           JOIN unnest($4::uuid[], $5::uuid[]) AS n (file_id, id) ON n.file_id = w.file_id
          WHERE w.owner = $1 AND w.session_id = $2
         ON CONFLICT (owner, session_id, file_id) DO NOTHING",
        owner,
        from,
        to,
        &ids,
        &new_ids
    )
    .execute(pool)
    .await?;
    Ok(made.rows_affected())
}

/// Answers one request (an error gets no answer: the caller retries).
pub(crate) async fn answer(pool: &PgPool, payload: &[u8]) -> anyhow::Result<Vec<u8>> {
    let AttachmentsLinkRequest::V1 {
        owner,
        from_session,
        to_session,
    } = serde_json::from_slice(payload)?;
    anyhow::ensure!(
        !owner.is_empty() && !from_session.is_empty() && !to_session.is_empty(),
        "a link request names no owner or an empty session"
    );
    let linked = link(pool, &owner, &from_session, &to_session).await?;
    tracing::info!(linked, "a session's files linked to another");
    Ok(serde_json::to_vec(&AttachmentsLinkReply::V1 { linked })?)
}
