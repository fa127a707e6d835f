//! All SQL of the attachments service.

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

/// A file record.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct FileRow {
    pub(crate) id: Uuid,
    pub(crate) bucket: String,
    pub(crate) object_key: String,
    pub(crate) file_name: String,
    pub(crate) content_type: String,
    pub(crate) size_bytes: i64,
    pub(crate) declared_sha256: Option<Vec<u8>>,
    pub(crate) status: String,
    pub(crate) expires_at: Option<DateTime<Utc>>,
}

/// Where the bytes of a pending file are uploaded: a key of its own, never the file's
/// `object_key`. Verification copies verified bytes to `object_key`, which no upload form can
/// write, so re-posting a still-valid form cannot change a verified file.
pub(crate) fn staging_key(id: Uuid) -> String {
    format!("staging/{id}")
}

/// The columns of [`FileRow`], as a literal so queries stay static strings.
macro_rules! file_columns {
    () => {
        "id, bucket, object_key, file_name, content_type, size_bytes, declared_sha256, status, expires_at"
    };
}

/// The owner's file at `bucket`/`key`, if there is one.
pub(crate) async fn find_owned(
    pool: &PgPool,
    owner: &str,
    bucket: &str,
    key: &str,
) -> sqlx::Result<Option<FileRow>> {
    sqlx::query_as(concat!(
        "SELECT ",
        file_columns!(),
        " FROM files WHERE owner = $1 AND bucket = $2 AND object_key = $3"
    ))
    .bind(owner)
    .bind(bucket)
    .bind(key)
    .fetch_optional(pool)
    .await
}

/// The verified file `id`, if there is one (a download link names it).
pub(crate) async fn find_verified(pool: &PgPool, id: Uuid) -> sqlx::Result<Option<FileRow>> {
    sqlx::query_as(concat!(
        "SELECT ",
        file_columns!(),
        " FROM files WHERE id = $1 AND status = 'verified'"
    ))
    .bind(id)
    .fetch_optional(pool)
    .await
}

/// The owner's verified files among `objects` (bucket, key), in no particular order, one
/// query (each pair an index lookup on `files_object_key`).
pub(crate) async fn find_verified_owned(
    pool: &PgPool,
    owner: &str,
    objects: &[(&str, &str)],
) -> sqlx::Result<Vec<FileRow>> {
    let (buckets, keys): (Vec<&str>, Vec<&str>) = objects.iter().copied().unzip();
    sqlx::query_as(concat!(
        "SELECT ",
        file_columns!(),
        " FROM files WHERE owner = $1 AND status = 'verified'
           AND (bucket, object_key) IN (SELECT * FROM unnest($2::text[], $3::text[]))"
    ))
    .bind(owner)
    .bind(buckets)
    .bind(keys)
    .fetch_all(pool)
    .await
}

/// The owner's live file (verified, or pending) with this content, if any. Two lookups, each
/// on its own index: verified bytes by `sha256`, and live claims by `declared_sha256`.
pub(crate) async fn find_by_hash(
    pool: &PgPool,
    owner: &str,
    sha256: &[u8],
) -> sqlx::Result<Option<FileRow>> {
    sqlx::query_as(concat!(
        "SELECT ",
        file_columns!(),
        " FROM (
           SELECT * FROM files WHERE owner = $1 AND sha256 = $2 AND status = 'verified'
           UNION ALL
           SELECT * FROM files WHERE owner = $1 AND declared_sha256 = $2
             AND declared_sha256 IS NOT NULL AND status IN ('pending', 'verified')
         ) AS live
         ORDER BY status = 'verified' DESC, created_at
         LIMIT 1"
    ))
    .bind(owner)
    .bind(sha256)
    .fetch_optional(pool)
    .await
}

/// What an owner holds: live files (pending or verified), their bytes, and how many of them
/// are uploads still waiting for their bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct Usage {
    pub(crate) files: i64,
    pub(crate) bytes: i64,
    pub(crate) pending: i64,
}

/// The owner's [`Usage`] (one index range of `files_owner_idx`).
pub(crate) async fn usage(pool: &PgPool, owner: &str) -> sqlx::Result<Usage> {
    sqlx::query_as(
        "SELECT count(*) AS files, coalesce(sum(size_bytes), 0)::bigint AS bytes,
                count(*) FILTER (WHERE status = 'pending' AND expires_at > now()) AS pending
         FROM files WHERE owner = $1 AND status IN ('pending', 'verified')",
    )
    .bind(owner)
    .fetch_one(pool)
    .await
}

/// A new upload waiting for its bytes.
pub(crate) struct NewUpload<'a> {
    pub(crate) id: Uuid,
    pub(crate) owner: &'a str,
    pub(crate) bucket: &'a str,
    pub(crate) key: &'a str,
    pub(crate) file_name: &'a str,
    pub(crate) content_type: &'a str,
    pub(crate) size: i64,
    pub(crate) declared_sha256: Option<&'a [u8]>,
    pub(crate) expires_at: DateTime<Utc>,
}

/// Records a file: pending (a presigned upload will bring its bytes, `verified_sha256` is
/// `None`) or verified (the service checked the bytes itself; their hash also serves as the
/// declared one). `false` when the owner already has a live file with this declared hash (a
/// concurrent request won): nothing was written.
pub(crate) async fn insert_file(
    pool: &PgPool,
    u: &NewUpload<'_>,
    verified_sha256: Option<&[u8]>,
) -> sqlx::Result<bool> {
    let (status, declared) = match verified_sha256 {
        Some(sha256) => ("verified", Some(sha256)),
        None => ("pending", u.declared_sha256),
    };
    let inserted = sqlx::query_scalar::<_, Uuid>(
        "INSERT INTO files (id, owner, bucket, object_key, file_name, content_type, size_bytes,
                            declared_sha256, sha256, status, expires_at, verified_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,
                 CASE WHEN $10 = 'verified' THEN now() END)
         ON CONFLICT (owner, declared_sha256)
           WHERE declared_sha256 IS NOT NULL AND status IN ('pending', 'verified')
         DO NOTHING
         RETURNING id",
    )
    .bind(u.id)
    .bind(u.owner)
    .bind(u.bucket)
    .bind(u.key)
    .bind(u.file_name)
    .bind(u.content_type)
    .bind(u.size)
    .bind(declared)
    .bind(verified_sha256)
    .bind(status)
    .bind(verified_sha256.is_none().then_some(u.expires_at))
    .fetch_optional(pool)
    .await?;
    Ok(inserted.is_some())
}

/// Extends a pending upload's expiry (a new form was signed for it).
pub(crate) async fn extend_pending(
    pool: &PgPool,
    id: Uuid,
    expires_at: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query("UPDATE files SET expires_at = GREATEST(expires_at, $2) WHERE id = $1 AND status = 'pending'")
        .bind(id)
        .bind(expires_at)
        .execute(pool)
        .await?;
    Ok(())
}

/// Marks a pending file verified with the SHA-256 of its stored bytes.
pub(crate) async fn mark_verified(pool: &PgPool, id: Uuid, sha256: &[u8]) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE files SET status = 'verified', sha256 = $2, verified_at = now(), problem = NULL
         WHERE id = $1 AND status = 'pending'",
    )
    .bind(id)
    .bind(sha256)
    .execute(pool)
    .await?;
    Ok(())
}

/// Marks a pending file quarantined, saying why.
pub(crate) async fn mark_quarantined(pool: &PgPool, id: Uuid, problem: &str) -> sqlx::Result<()> {
    sqlx::query("UPDATE files SET status = 'quarantined', problem = $2 WHERE id = $1 AND status = 'pending'")
        .bind(id)
        .bind(problem)
        .execute(pool)
        .await?;
    Ok(())
}

/// Pending uploads to look at, oldest first.
pub(crate) async fn pending(pool: &PgPool, limit: i64) -> sqlx::Result<Vec<FileRow>> {
    sqlx::query_as(concat!(
        "SELECT ",
        file_columns!(),
        " FROM files WHERE status = 'pending' ORDER BY expires_at LIMIT $1"
    ))
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// Deletes a file record (its workspace entries go with it).
pub(crate) async fn delete(pool: &PgPool, id: Uuid) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM files WHERE id = $1")
        .bind(id)
        .execute(pool)
        .await?;
    Ok(())
}

/// Puts a file in a session's workspace (idempotent).
pub(crate) async fn add_to_workspace(
    pool: &PgPool,
    owner: &str,
    session_id: &str,
    file_id: Uuid,
    source: &str,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO workspace_files (id, owner, session_id, file_id, source) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (owner, session_id, file_id) DO NOTHING",
    )
    .bind(Uuid::now_v7())
    .bind(owner)
    .bind(session_id)
    .bind(file_id)
    .bind(source)
    .execute(pool)
    .await?;
    Ok(())
}

/// A file of a session's workspace.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct WorkspaceRow {
    pub(crate) bucket: String,
    pub(crate) object_key: String,
    pub(crate) file_name: String,
    pub(crate) content_type: String,
    pub(crate) size_bytes: i64,
    pub(crate) status: String,
    pub(crate) source: String,
    pub(crate) created_at: DateTime<Utc>,
}

/// The files of the owner's session, oldest first.
pub(crate) async fn workspace(
    pool: &PgPool,
    owner: &str,
    session_id: &str,
) -> sqlx::Result<Vec<WorkspaceRow>> {
    sqlx::query_as(
        "SELECT f.bucket, f.object_key, f.file_name, f.content_type, f.size_bytes, f.status, w.source, w.created_at
         FROM workspace_files w JOIN files f ON f.id = w.file_id
         WHERE w.owner = $1 AND w.session_id = $2 AND f.owner = $1
         ORDER BY w.created_at, w.id
         LIMIT 1000",
    )
    .bind(owner)
    .bind(session_id)
    .fetch_all(pool)
    .await
}
