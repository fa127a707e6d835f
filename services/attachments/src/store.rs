//! All SQL of the attachments service, each statement checked at compile time against the
//! migrations (`sqlx::query!` and friends; `scripts/sqlx-prepare.sh` refreshes the offline
//! data in `services/attachments/.sqlx/` after a query or a migration changes).

use chrono::{DateTime, Utc};
use sqlx::{Connection as _, PgConnection, PgExecutor, PgPool};
use uuid::Uuid;

/// Where a file is in its life: the `files.status` column (`files_status_check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
pub(crate) enum FileStatus {
    /// Recorded; its bytes are on their way (a presigned upload) or not checked yet.
    Pending,
    /// Its bytes are stored and checked; only verified files are served.
    Verified,
    /// Its bytes failed the check; kept for inspection, never served.
    Quarantined,
}

impl FileStatus {
    /// The column's (and the API's) spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FileStatus::Pending => "pending",
            FileStatus::Verified => "verified",
            FileStatus::Quarantined => "quarantined",
        }
    }
}

/// How a file came into a session's workspace: the `workspace_files.source` column
/// (`workspace_files_source_check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
pub(crate) enum Source {
    /// The owner uploaded it.
    Upload,
    /// An agent made it during a run.
    Generated,
}

impl Source {
    /// The column's (and the API's) spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Source::Upload => "upload",
            Source::Generated => "generated",
        }
    }
}

/// A file record.
#[derive(Debug, Clone)]
pub(crate) struct FileRow {
    pub(crate) id: Uuid,
    pub(crate) bucket: String,
    pub(crate) object_key: String,
    pub(crate) file_name: String,
    pub(crate) content_type: String,
    pub(crate) size_bytes: i64,
    pub(crate) declared_sha256: Option<Vec<u8>>,
    pub(crate) status: FileStatus,
    pub(crate) expires_at: Option<DateTime<Utc>>,
}

/// Where the bytes of a pending file are uploaded: a key of its own, never the file's
/// `object_key`. Verification copies verified bytes to `object_key`, which no upload form can
/// write, so re-posting a still-valid form cannot change a verified file.
pub(crate) fn staging_key(id: Uuid) -> String {
    format!("staging/{id}")
}

// The queries that read a [`FileRow`] spell its columns out: the macros take only literals.

/// The owner's file at `bucket`/`key`, if there is one.
pub(crate) async fn find_owned(
    pool: &PgPool,
    owner: &str,
    bucket: &str,
    key: &str,
) -> sqlx::Result<Option<FileRow>> {
    sqlx::query_as!(
        FileRow,
        r#"SELECT id, bucket, object_key, file_name, content_type, size_bytes, declared_sha256,
                  status AS "status: FileStatus", expires_at
         FROM files WHERE owner = $1 AND bucket = $2 AND object_key = $3"#,
        owner,
        bucket,
        key
    )
    .fetch_optional(pool)
    .await
}

/// The verified file `id`, if there is one (a download link names it).
pub(crate) async fn find_verified(pool: &PgPool, id: Uuid) -> sqlx::Result<Option<FileRow>> {
    sqlx::query_as!(
        FileRow,
        r#"SELECT id, bucket, object_key, file_name, content_type, size_bytes, declared_sha256,
                  status AS "status: FileStatus", expires_at
         FROM files WHERE id = $1 AND status = 'verified'"#,
        id
    )
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
    // The arrays bind as `&[&str]`, which the macro's check (`Vec<String>` for `text[]`) does
    // not know: the `as` says which type is meant.
    sqlx::query_as!(
        FileRow,
        r#"SELECT id, bucket, object_key, file_name, content_type, size_bytes, declared_sha256,
                  status AS "status: FileStatus", expires_at
         FROM files WHERE owner = $1 AND status = 'verified'
           AND (bucket, object_key) IN (SELECT * FROM unnest($2::text[], $3::text[]))"#,
        owner,
        &buckets[..] as &[&str],
        &keys[..] as &[&str]
    )
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
    sqlx::query_as!(
        FileRow,
        r#"SELECT id AS "id!", bucket AS "bucket!", object_key AS "object_key!",
                  file_name AS "file_name!", content_type AS "content_type!",
                  size_bytes AS "size_bytes!", declared_sha256,
                  status AS "status!: FileStatus", expires_at
         FROM (
           SELECT * FROM files WHERE owner = $1 AND sha256 = $2 AND status = 'verified'
           UNION ALL
           SELECT * FROM files WHERE owner = $1 AND declared_sha256 = $2
             AND declared_sha256 IS NOT NULL AND status IN ('pending', 'verified')
         ) AS live
         ORDER BY status = 'verified' DESC, created_at
         LIMIT 1"#,
        owner,
        sha256
    )
    .fetch_optional(pool)
    .await
}

/// What an owner holds: live files (pending or verified), their bytes, and how many of them
/// are uploads still waiting for their bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Usage {
    pub(crate) files: i64,
    pub(crate) bytes: i64,
    pub(crate) pending: i64,
}

/// The owner's [`Usage`] (one index range of `files_owner_idx`).
pub(crate) async fn usage(pool: &PgPool, owner: &str) -> sqlx::Result<Usage> {
    sqlx::query_as!(
        Usage,
        r#"SELECT count(*) AS "files!", coalesce(sum(size_bytes), 0)::bigint AS "bytes!",
                count(*) FILTER (WHERE status = 'pending' AND expires_at > now()) AS "pending!"
         FROM files WHERE owner = $1 AND status IN ('pending', 'verified')"#,
        owner
    )
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

/// What [`insert_within_quota`] did.
#[derive(Debug)]
pub(crate) struct QuotaInsert {
    /// The owner's [`Usage`] the insert was judged on.
    pub(crate) usage: Usage,
    /// Whether the file was recorded. When not, either `usage` leaves no room for it (as
    /// `Quota::judge` says), or the owner already has a live file with its declared hash.
    pub(crate) inserted: bool,
}

/// Records a file exactly as [`insert_file`] does (pending, or verified with `verified_sha256`),
/// but only if the owner's [`usage`] leaves room for it: fewer than `max_pending` unfinished
/// uploads (pass `i64::MAX` for a file that will not be pending), fewer than `max_files` files,
/// and `u.size` more bytes within `max_bytes`. One transaction under the owner's quota lock
/// ([`lock_owner`]), so concurrent inserts of one owner cannot together overshoot the limits.
pub(crate) async fn insert_within_quota(
    pool: &PgPool,
    u: &NewUpload<'_>,
    verified_sha256: Option<&[u8]>,
    max_pending: i64,
    max_files: i64,
    max_bytes: i64,
) -> sqlx::Result<QuotaInsert> {
    let (status, declared) = match verified_sha256 {
        Some(sha256) => (FileStatus::Verified, Some(sha256)),
        None => (FileStatus::Pending, u.declared_sha256),
    };
    let mut tx = pool.begin().await?;
    lock_owner(&mut tx, u.owner).await?;
    let row = sqlx::query!(
        r#"WITH usage AS (
             SELECT count(*) AS files, coalesce(sum(size_bytes), 0)::bigint AS bytes,
                    count(*) FILTER (WHERE status = 'pending' AND expires_at > now()) AS pending
             FROM files WHERE owner = $2 AND status IN ('pending', 'verified')
           ),
           inserted AS (
             INSERT INTO files (id, owner, bucket, object_key, file_name, content_type, size_bytes,
                                declared_sha256, sha256, status, expires_at, verified_at)
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,
                    CASE WHEN $10 = 'verified' THEN now() END
             FROM usage
             WHERE usage.pending < $12 AND usage.files < $13
               AND usage.bytes <= $14::bigint - $7::bigint
             ON CONFLICT (owner, declared_sha256)
               WHERE declared_sha256 IS NOT NULL AND status IN ('pending', 'verified')
             DO NOTHING
             RETURNING id
           )
           SELECT u.files AS "files!", u.bytes AS "bytes!", u.pending AS "pending!",
                  EXISTS (SELECT FROM inserted) AS "inserted!"
           FROM usage u"#,
        u.id,
        u.owner,
        u.bucket,
        u.key,
        u.file_name,
        u.content_type,
        u.size,
        declared,
        verified_sha256,
        status.as_str(),
        verified_sha256.is_none().then_some(u.expires_at),
        max_pending,
        max_files,
        max_bytes
    )
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(QuotaInsert {
        usage: Usage {
            files: row.files,
            bytes: row.bytes,
            pending: row.pending,
        },
        inserted: row.inserted,
    })
}

/// What [`claim_upload`] found or did.
#[derive(Debug)]
pub(crate) struct Claim {
    /// The owner's live file with the declared content, if any; then nothing was written.
    pub(crate) existing: Option<FileRow>,
    /// The owner's [`Usage`] the insert was judged on (zero when `existing` is set).
    pub(crate) usage: Usage,
    /// Whether the new pending file was recorded.
    pub(crate) inserted: bool,
}

/// Takes `owner`'s quota lock until the end of the transaction `tx` runs in: a transaction-level
/// advisory lock on a 64-bit hash of the owner (namespaced, so that no other user of advisory
/// locks in the database shares its keys). Every statement that judges an owner's usage and then
/// inserts a file runs under it ([`claim_upload`], [`insert_within_quota`]), so concurrent
/// requests of one owner are judged one after the other, each seeing the files the previous ones
/// added: under READ COMMITTED, two statements running at once would both count the usage as it
/// was before either (review finding L2). The lock must be taken by a statement of its own,
/// before the one that reads the usage, whose snapshot is then taken after the lock was granted.
/// Two owners whose hashes collide merely wait for each other.
async fn lock_owner(tx: &mut PgConnection, owner: &str) -> sqlx::Result<()> {
    sqlx::query_scalar!(
        r#"SELECT true AS "locked!"
         FROM pg_advisory_xact_lock(hashtextextended('switchboard.attachments.owner:' || $1, 0))"#,
        owner
    )
    .fetch_one(tx)
    .await?;
    Ok(())
}

/// One transaction for a new presigned upload, under the owner's quota lock ([`lock_owner`]):
/// then one statement, the dedup lookup of [`find_by_hash`] (by the declared hash); when it finds
/// nothing, the owner's [`usage`] and, if it stays within the pending, file and byte limits, the
/// insert of the pending file `u` exactly as [`insert_file`] makes it, yielding to a concurrent
/// claim of the same content (`files_owner_sha256_live_key`). The limits are those
/// `Quota::judge` applies to the returned usage, which says why nothing was inserted.
pub(crate) async fn claim_upload(
    conn: &mut PgConnection,
    u: &NewUpload<'_>,
    max_pending: i64,
    max_files: i64,
    max_bytes: i64,
) -> sqlx::Result<Claim> {
    let mut tx = conn.begin().await?;
    lock_owner(&mut tx, u.owner).await?;
    let row = sqlx::query!(
        r#"WITH found AS (
             SELECT id, bucket, object_key, file_name, content_type, size_bytes, declared_sha256,
                    status, expires_at
             FROM (
               SELECT * FROM files WHERE owner = $2 AND sha256 = $8 AND status = 'verified'
               UNION ALL
               SELECT * FROM files WHERE owner = $2 AND declared_sha256 = $8
                 AND declared_sha256 IS NOT NULL AND status IN ('pending', 'verified')
             ) AS live
             ORDER BY status = 'verified' DESC, created_at
             LIMIT 1
           ),
           usage AS (
             SELECT count(*) AS files, coalesce(sum(size_bytes), 0)::bigint AS bytes,
                    count(*) FILTER (WHERE status = 'pending' AND expires_at > now()) AS pending
             FROM files WHERE owner = $2 AND status IN ('pending', 'verified')
               AND NOT EXISTS (SELECT FROM found)
           ),
           inserted AS (
             INSERT INTO files (id, owner, bucket, object_key, file_name, content_type, size_bytes,
                                declared_sha256, status, expires_at)
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, 'pending', $9 FROM usage
             WHERE NOT EXISTS (SELECT FROM found)
               AND usage.pending < $10 AND usage.files < $11 AND usage.bytes <= $12::bigint - $7::bigint
             ON CONFLICT (owner, declared_sha256)
               WHERE declared_sha256 IS NOT NULL AND status IN ('pending', 'verified')
             DO NOTHING
             RETURNING id
           )
           SELECT f.id AS "id?", f.bucket AS "bucket?", f.object_key AS "object_key?",
                  f.file_name AS "file_name?", f.content_type AS "content_type?",
                  f.size_bytes AS "size_bytes?", f.declared_sha256,
                  f.status AS "status?: FileStatus", f.expires_at,
                  u.files AS "files!", u.bytes AS "bytes!", u.pending AS "pending!",
                  EXISTS (SELECT FROM inserted) AS "inserted!"
           FROM usage u LEFT JOIN found f ON true"#,
        u.id,
        u.owner,
        u.bucket,
        u.key,
        u.file_name,
        u.content_type,
        u.size,
        u.declared_sha256,
        u.expires_at,
        max_pending,
        max_files,
        max_bytes
    )
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    let existing = match (
        row.id,
        row.bucket,
        row.object_key,
        row.file_name,
        row.content_type,
        row.size_bytes,
        row.status,
    ) {
        (
            Some(id),
            Some(bucket),
            Some(object_key),
            Some(file_name),
            Some(content_type),
            Some(size_bytes),
            Some(status),
        ) => Some(FileRow {
            id,
            bucket,
            object_key,
            file_name,
            content_type,
            size_bytes,
            declared_sha256: row.declared_sha256,
            status,
            expires_at: row.expires_at,
        }),
        _ => None,
    };
    Ok(Claim {
        existing,
        usage: Usage {
            files: row.files,
            bytes: row.bytes,
            pending: row.pending,
        },
        inserted: row.inserted,
    })
}

/// Extends a pending upload's expiry (a new form was signed for it).
pub(crate) async fn extend_pending<'e>(
    db: impl PgExecutor<'e>,
    id: Uuid,
    expires_at: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE files SET expires_at = GREATEST(expires_at, $2) WHERE id = $1 AND status = 'pending'",
        id,
        expires_at
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Marks a pending file verified with the SHA-256 of its stored bytes.
pub(crate) async fn mark_verified(pool: &PgPool, id: Uuid, sha256: &[u8]) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE files SET status = 'verified', sha256 = $2, verified_at = now(), problem = NULL
         WHERE id = $1 AND status = 'pending'",
        id,
        sha256
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Marks a pending file quarantined, saying why.
pub(crate) async fn mark_quarantined(pool: &PgPool, id: Uuid, problem: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE files SET status = 'quarantined', problem = $2 WHERE id = $1 AND status = 'pending'",
        id,
        problem
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Pending uploads to look at, oldest first; those another verifier holds a lease on are left
/// to it.
pub(crate) async fn pending(pool: &PgPool, limit: i64) -> sqlx::Result<Vec<FileRow>> {
    sqlx::query_as!(
        FileRow,
        r#"SELECT id, bucket, object_key, file_name, content_type, size_bytes, declared_sha256,
                  status AS "status: FileStatus", expires_at
         FROM files WHERE status = 'pending'
           AND (verifying_until IS NULL OR verifying_until < now())
         ORDER BY expires_at LIMIT $1"#,
        limit
    )
    .fetch_all(pool)
    .await
}

/// What [`claim_verification`] found.
#[derive(Debug)]
pub(crate) enum VerificationClaim {
    /// The file is pending and this verifier now holds its lease: the row as it is now.
    Claimed(FileRow),
    /// The file is pending and another verifier holds an unexpired lease on it.
    Leased,
    /// The file is no longer pending: its status and, when quarantined, why.
    Settled(FileStatus, Option<String>),
    /// There is no such file (any more).
    Gone,
}

/// Claims the verification of pending file `id` for `lease` (`files.verifying_until`): only one
/// verifier at a time, across replicas, reads a file's bytes.
pub(crate) async fn claim_verification(
    pool: &PgPool,
    id: Uuid,
    lease: std::time::Duration,
) -> sqlx::Result<VerificationClaim> {
    let claimed = sqlx::query_as!(
        FileRow,
        r#"UPDATE files SET verifying_until = now() + make_interval(secs => $2)
         WHERE id = $1 AND status = 'pending'
           AND (verifying_until IS NULL OR verifying_until < now())
         RETURNING id, bucket, object_key, file_name, content_type, size_bytes, declared_sha256,
                   status AS "status: FileStatus", expires_at"#,
        id,
        lease.as_secs_f64()
    )
    .fetch_optional(pool)
    .await?;
    if let Some(row) = claimed {
        return Ok(VerificationClaim::Claimed(row));
    }
    let now = sqlx::query!(
        r#"SELECT status AS "status: FileStatus", problem FROM files WHERE id = $1"#,
        id
    )
    .fetch_optional(pool)
    .await?;
    Ok(match now {
        None => VerificationClaim::Gone,
        Some(row) if row.status == FileStatus::Pending => VerificationClaim::Leased,
        Some(row) => VerificationClaim::Settled(row.status, row.problem),
    })
}

/// Gives up the verification lease on `id` (its bytes had not arrived, or verifying failed),
/// so the next verifier need not wait for it to run out.
pub(crate) async fn release_verification(pool: &PgPool, id: Uuid) -> sqlx::Result<()> {
    sqlx::query!("UPDATE files SET verifying_until = NULL WHERE id = $1", id)
        .execute(pool)
        .await?;
    Ok(())
}

/// Deletes a file record (its workspace entries go with it).
pub(crate) async fn delete(pool: &PgPool, id: Uuid) -> sqlx::Result<()> {
    sqlx::query!("DELETE FROM files WHERE id = $1", id)
        .execute(pool)
        .await?;
    Ok(())
}

/// Puts a file in a session's workspace (idempotent).
pub(crate) async fn add_to_workspace<'e>(
    db: impl PgExecutor<'e>,
    owner: &str,
    session_id: &str,
    file_id: Uuid,
    source: Source,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO workspace_files (id, owner, session_id, file_id, source) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (owner, session_id, file_id) DO NOTHING",
        Uuid::now_v7(),
        owner,
        session_id,
        file_id,
        source.as_str()
    )
    .execute(db)
    .await?;
    Ok(())
}

/// A file of a session's workspace.
#[derive(Debug)]
pub(crate) struct WorkspaceRow {
    pub(crate) bucket: String,
    pub(crate) object_key: String,
    pub(crate) file_name: String,
    pub(crate) content_type: String,
    pub(crate) size_bytes: i64,
    pub(crate) status: FileStatus,
    pub(crate) source: Source,
    pub(crate) created_at: DateTime<Utc>,
}

/// The files of the owner's session, oldest first.
pub(crate) async fn workspace(
    pool: &PgPool,
    owner: &str,
    session_id: &str,
) -> sqlx::Result<Vec<WorkspaceRow>> {
    sqlx::query_as!(
        WorkspaceRow,
        r#"SELECT f.bucket, f.object_key, f.file_name, f.content_type, f.size_bytes,
                  f.status AS "status: FileStatus", w.source AS "source: Source", w.created_at
         FROM workspace_files w JOIN files f ON f.id = w.file_id
         WHERE w.owner = $1 AND w.session_id = $2 AND f.owner = $1
         ORDER BY w.created_at, w.id
         LIMIT 1000"#,
        owner,
        session_id
    )
    .fetch_all(pool)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_spellings_are_those_the_columns_check() {
        // files_status_check and workspace_files_source_check (migrations/attachments).
        let statuses = [
            FileStatus::Pending,
            FileStatus::Verified,
            FileStatus::Quarantined,
        ];
        assert_eq!(
            statuses.map(FileStatus::as_str),
            ["pending", "verified", "quarantined"]
        );
        assert_eq!(
            [Source::Upload, Source::Generated].map(Source::as_str),
            ["upload", "generated"]
        );
    }
}
