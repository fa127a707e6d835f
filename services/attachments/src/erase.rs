//! Erasure of an owner's files: those of one session (thread), or every file of the owner,
//! asked on `attachments.erase` by history as it erases a thread or an owner
//! ([`protocol::erase::AttachmentsEraseRequest`]).
//!
//! **Nothing asked for is left, nothing else goes.** The work goes in batches of [`BATCH`]
//! files, each one transaction: the files are locked (`FOR UPDATE`, in id order), the session's
//! links to them deleted, then the files that no workspace links any more are deleted by a
//! statement that runs after the lock was granted, so it sees every link committed before it (a
//! link made while the lock is held waits for it and then fails on the foreign key: the file is
//! gone, and the caller retries its request). A file another session still links stays. The
//! deleted files' objects (the file's own key and its staging key, [`store::staging_key`]: the
//! service stores nothing else per file) are deleted from S3 next, and only then is the batch
//! committed. An S3 failure rolls the batch back and the request gets no answer; a commit that
//! fails after S3 leaves rows without objects, which the retry deletes (deleting a missing
//! object succeeds). So no row ever goes while its object stays, and a second request finds
//! nothing and answers zeros.
//!
//! **Verifications in flight.** A pending file under another verifier's lease
//! (`files.verifying_until`, see `crate::verify`) is left alone, link and all, since that
//! verifier may be copying its bytes to the file's own key right now; the request waits up to
//! [`BUSY_WAIT`] for such verifications to end, then fails without an answer.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_s3::types::{Delete, ObjectIdentifier};
use protocol::erase::{AttachmentsEraseReply, AttachmentsEraseRequest};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::store;

/// Files locked, unlinked and deleted per transaction.
const BATCH: i64 = 500;
/// Keys per S3 `DeleteObjects` request (the API's maximum).
const KEYS_PER_DELETE: usize = 1000;
/// How long a request waits for verifications of its files to end before it gives up.
const BUSY_WAIT: Duration = Duration::from_secs(5);
/// How often it looks whether they have.
const BUSY_POLL: Duration = Duration::from_millis(100);

/// Why an erasure got no answer; the caller asks again.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EraseError {
    /// The request names no owner, or an empty session: a caller's bug, never guessed at.
    #[error("the erase request names no owner or an empty session")]
    Invalid,
    /// Files of the request were still being verified after [`BUSY_WAIT`].
    #[error("{0} files are still being verified")]
    Busy(usize),
    /// PostgreSQL failed; the batch at hand was rolled back.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// S3 failed; the batch at hand was rolled back. Boxed: the SDK's error is large.
    #[error("S3: {0}")]
    Storage(Box<aws_sdk_s3::Error>),
    /// S3 refused to delete an object; the batch at hand was rolled back.
    #[error("S3 did not delete {key}: {code}")]
    NotDeleted {
        /// The object's key.
        key: String,
        /// S3's error code.
        code: String,
    },
}

impl From<aws_sdk_s3::Error> for EraseError {
    fn from(err: aws_sdk_s3::Error) -> Self {
        Self::Storage(Box::new(err))
    }
}

/// What to erase: the owner's files of one session, or all of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Erasure {
    owner: String,
    session_id: Option<String>,
}

impl TryFrom<AttachmentsEraseRequest> for Erasure {
    type Error = EraseError;

    fn try_from(request: AttachmentsEraseRequest) -> Result<Self, EraseError> {
        let AttachmentsEraseRequest::V1 { owner, session_id } = request;
        if owner.is_empty() || session_id.as_deref().is_some_and(str::is_empty) {
            return Err(EraseError::Invalid);
        }
        Ok(Self { owner, session_id })
    }
}

/// What an erasure removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Erased {
    /// File rows deleted, each with its objects.
    pub(crate) files: u64,
    /// Workspace links (`workspace_files` rows) deleted, those of deleted files included.
    pub(crate) links: u64,
}

impl std::ops::AddAssign for Erased {
    fn add_assign(&mut self, other: Self) {
        self.files += other.files;
        self.links += other.links;
    }
}

impl From<Erased> for AttachmentsEraseReply {
    fn from(erased: Erased) -> Self {
        AttachmentsEraseReply::V1 {
            files_deleted: erased.files,
            links_deleted: erased.links,
        }
    }
}

/// Answers an erase request (its JSON payload) with the reply's JSON; an error is not answered.
pub(crate) async fn answer(
    pool: &PgPool,
    s3: &aws_sdk_s3::Client,
    payload: &[u8],
) -> anyhow::Result<Vec<u8>> {
    let request: AttachmentsEraseRequest = serde_json::from_slice(payload)?;
    let erasure = Erasure::try_from(request)?;
    let erased = erase(pool, s3, &erasure, BUSY_WAIT).await?;
    tracing::info!(
        session.id = erasure.session_id.as_deref(),
        files = erased.files,
        links = erased.links,
        "files erased"
    );
    Ok(serde_json::to_vec(&AttachmentsEraseReply::from(erased))?)
}

/// Erases what `erasure` names, batch after batch until none is left, waiting up to `busy_wait`
/// for verifications in flight (see the module doc).
pub(crate) async fn erase(
    pool: &PgPool,
    s3: &aws_sdk_s3::Client,
    erasure: &Erasure,
    busy_wait: Duration,
) -> Result<Erased, EraseError> {
    let deadline = tokio::time::Instant::now() + busy_wait;
    let mut erased = Erased::default();
    loop {
        // Files being verified are passed over until every other file is done.
        let mut busy = Vec::new();
        loop {
            let batch = erase_batch(pool, s3, erasure, &busy).await?;
            erased += batch.erased;
            if batch.locked == 0 {
                break;
            }
            busy.extend(batch.busy);
        }
        if busy.is_empty() {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(EraseError::Busy(busy.len()));
        }
        tokio::time::sleep(BUSY_POLL).await;
    }
    if erasure.session_id.is_none() {
        erased.links += delete_stray_links(pool, &erasure.owner).await?;
    }
    Ok(erased)
}

/// What one batch did.
#[derive(Debug, Default)]
struct Batch {
    /// Files it locked (0: nothing left but the files passed over).
    locked: usize,
    /// Files it left because another verifier holds them.
    busy: Vec<Uuid>,
    erased: Erased,
}

/// One transaction (see the module doc): up to [`BATCH`] files of the erasure but those in
/// `skip`, locked; those not under a verifier's lease unlinked and, when no workspace links them
/// any more (always, for a whole owner), deleted with their objects.
async fn erase_batch(
    pool: &PgPool,
    s3: &aws_sdk_s3::Client,
    erasure: &Erasure,
    skip: &[Uuid],
) -> Result<Batch, EraseError> {
    let owner = erasure.owner.as_str();
    let mut tx = pool.begin().await?;
    let locked = match &erasure.session_id {
        Some(session_id) => lock_session_files(&mut tx, owner, session_id, skip).await?,
        None => lock_owner_files(&mut tx, owner, skip).await?,
    };
    if locked.is_empty() {
        return Ok(Batch::default());
    }
    let (busy, ready): (Vec<_>, Vec<_>) = locked.iter().partition(|file| file.busy);
    let ready: Vec<Uuid> = ready.iter().map(|file| file.id).collect();
    let (links, gone) = match &erasure.session_id {
        Some(session_id) => (
            delete_session_links(&mut tx, owner, session_id, &ready).await?,
            delete_unlinked_files(&mut tx, owner, &ready).await?,
        ),
        None => (
            delete_links(&mut tx, &ready).await?,
            delete_files(&mut tx, owner, &ready).await?,
        ),
    };
    delete_objects(s3, &gone).await?;
    tx.commit().await?;
    Ok(Batch {
        locked: locked.len(),
        busy: busy.iter().map(|file| file.id).collect(),
        erased: Erased {
            files: u64::try_from(gone.len()).unwrap_or(u64::MAX),
            links,
        },
    })
}

/// A file locked for erasure.
#[derive(Debug)]
struct Locked {
    id: Uuid,
    /// Pending under another verifier's unexpired lease.
    busy: bool,
}

/// A file deleted, whose objects go next.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Gone {
    id: Uuid,
    bucket: String,
    object_key: String,
}

/// Every object of the `gone` files (own key and staging key), by bucket, in requests of at most
/// [`KEYS_PER_DELETE`] keys.
fn objects_by_bucket(gone: &[Gone]) -> Vec<(&str, Vec<String>)> {
    let mut by_bucket: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for file in gone {
        by_bucket
            .entry(file.bucket.as_str())
            .or_default()
            .extend([file.object_key.clone(), store::staging_key(file.id)]);
    }
    by_bucket
        .into_iter()
        .flat_map(|(bucket, keys)| {
            keys.chunks(KEYS_PER_DELETE)
                .map(|chunk| (bucket, chunk.to_vec()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Deletes the objects of the `gone` files; a key S3 reports it could not delete fails it.
async fn delete_objects(s3: &aws_sdk_s3::Client, gone: &[Gone]) -> Result<(), EraseError> {
    for (bucket, keys) in objects_by_bucket(gone) {
        let objects = keys
            .into_iter()
            .map(|key| ObjectIdentifier::builder().key(key).build())
            .collect::<Result<Vec<_>, _>>()
            .map_err(aws_sdk_s3::Error::from)?;
        let delete = Delete::builder()
            .set_objects(Some(objects))
            .quiet(true)
            .build()
            .map_err(aws_sdk_s3::Error::from)?;
        let deleted = s3
            .delete_objects()
            .bucket(bucket)
            .delete(delete)
            .send()
            .await
            .map_err(aws_sdk_s3::Error::from)?;
        if let Some(refused) = deleted.errors().first() {
            return Err(EraseError::NotDeleted {
                key: refused.key().unwrap_or_default().to_owned(),
                code: refused.code().unwrap_or_default().to_owned(),
            });
        }
    }
    Ok(())
}

// The statements, each in the batch's transaction. Every one that touches files takes them in
// id order, so concurrent erasures cannot deadlock.

/// Locks up to [`BATCH`] files the owner's session links, but those in `skip`.
async fn lock_session_files(
    tx: &mut PgConnection,
    owner: &str,
    session_id: &str,
    skip: &[Uuid],
) -> sqlx::Result<Vec<Locked>> {
    sqlx::query_as!(
        Locked,
        r#"SELECT f.id,
                  (f.status = 'pending' AND coalesce(f.verifying_until > now(), false)) AS "busy!"
         FROM workspace_files w JOIN files f ON f.id = w.file_id
         WHERE w.owner = $1 AND w.session_id = $2 AND f.id <> ALL($3::uuid[])
         ORDER BY f.id
         LIMIT $4
         FOR UPDATE OF f"#,
        owner,
        session_id,
        skip,
        BATCH
    )
    .fetch_all(tx)
    .await
}

/// Locks up to [`BATCH`] files of the owner, of any status, but those in `skip`.
async fn lock_owner_files(
    tx: &mut PgConnection,
    owner: &str,
    skip: &[Uuid],
) -> sqlx::Result<Vec<Locked>> {
    sqlx::query_as!(
        Locked,
        r#"SELECT id,
                  (status = 'pending' AND coalesce(verifying_until > now(), false)) AS "busy!"
         FROM files
         WHERE owner = $1 AND id <> ALL($2::uuid[])
         ORDER BY id
         LIMIT $3
         FOR UPDATE"#,
        owner,
        skip,
        BATCH
    )
    .fetch_all(tx)
    .await
}

/// Deletes the session's links to `files`; how many.
async fn delete_session_links(
    tx: &mut PgConnection,
    owner: &str,
    session_id: &str,
    files: &[Uuid],
) -> sqlx::Result<u64> {
    let deleted = sqlx::query!(
        "DELETE FROM workspace_files
         WHERE owner = $1 AND session_id = $2 AND file_id = ANY($3::uuid[])",
        owner,
        session_id,
        files
    )
    .execute(tx)
    .await?;
    Ok(deleted.rows_affected())
}

/// Deletes those of the owner's `files` no workspace links (any more). Run after the files were
/// locked, so no link committed before escapes it (`workspace_files_file_idx`).
async fn delete_unlinked_files(
    tx: &mut PgConnection,
    owner: &str,
    files: &[Uuid],
) -> sqlx::Result<Vec<Gone>> {
    sqlx::query_as!(
        Gone,
        "DELETE FROM files f
         WHERE f.id = ANY($2::uuid[]) AND f.owner = $1
           AND NOT EXISTS (SELECT FROM workspace_files w WHERE w.file_id = f.id)
         RETURNING f.id, f.bucket, f.object_key",
        owner,
        files
    )
    .fetch_all(tx)
    .await
}

/// Deletes every link to `files`; how many (the foreign key would cascade, uncounted).
async fn delete_links(tx: &mut PgConnection, files: &[Uuid]) -> sqlx::Result<u64> {
    let deleted = sqlx::query!(
        "DELETE FROM workspace_files WHERE file_id = ANY($1::uuid[])",
        files
    )
    .execute(tx)
    .await?;
    Ok(deleted.rows_affected())
}

/// Deletes the owner's `files`, linked or not.
async fn delete_files(
    tx: &mut PgConnection,
    owner: &str,
    files: &[Uuid],
) -> sqlx::Result<Vec<Gone>> {
    sqlx::query_as!(
        Gone,
        "DELETE FROM files WHERE id = ANY($2::uuid[]) AND owner = $1
         RETURNING id, bucket, object_key",
        owner,
        files
    )
    .fetch_all(tx)
    .await
}

/// Deletes the owner's links to files not the owner's (none are ever made): after a whole
/// owner's erasure, no link of the owner is left at all.
async fn delete_stray_links(pool: &PgPool, owner: &str) -> sqlx::Result<u64> {
    let deleted = sqlx::query!(
        "DELETE FROM workspace_files w
         WHERE w.owner = $1
           AND NOT EXISTS (SELECT FROM files f WHERE f.id = w.file_id AND f.owner = $1)",
        owner
    )
    .execute(pool)
    .await?;
    Ok(deleted.rows_affected())
}

/// The pure parts, then erasures against the local PostgreSQL and S3 of `scripts/infra.sh`.
#[cfg(test)]
mod tests {
    use secrecy::SecretString;

    use super::*;
    use crate::verify::tests::{local_pool, local_s3};

    fn gone(bucket: &str, key: &str) -> Gone {
        Gone {
            id: Uuid::now_v7(),
            bucket: bucket.to_owned(),
            object_key: key.to_owned(),
        }
    }

    #[test]
    fn both_objects_of_every_file_are_deleted_bucket_by_bucket_in_requests_s3_accepts() {
        let mut files: Vec<Gone> = (0..600).map(|i| gone("a", &format!("k{i}"))).collect();
        files.push(gone("b", "only"));
        let requests = objects_by_bucket(&files);
        let sizes: Vec<(&str, usize)> = requests.iter().map(|(b, keys)| (*b, keys.len())).collect();
        assert_eq!(
            sizes,
            [("a", 1000), ("a", 200), ("b", 2)],
            "1,200 keys of bucket a in two requests, then b's two"
        );
        let last = files
            .last()
            .map(|f| vec![f.object_key.clone(), store::staging_key(f.id)]);
        assert_eq!(
            Some(requests[2].1.clone()),
            last,
            "a file's own key and its staging key"
        );
        assert!(
            objects_by_bucket(&[]).is_empty(),
            "nothing to delete, no request"
        );
    }

    #[test]
    fn a_request_must_name_an_owner_and_a_session_if_any_and_the_reply_is_versioned() {
        let request = |owner: &str, session: Option<&str>| {
            Erasure::try_from(AttachmentsEraseRequest::V1 {
                owner: owner.to_owned(),
                session_id: session.map(str::to_owned),
            })
        };
        assert!(matches!(request("", None), Err(EraseError::Invalid)));
        assert!(matches!(
            request("alice", Some("")),
            Err(EraseError::Invalid)
        ));
        assert_eq!(
            request("alice", Some("t")).ok(),
            Some(Erasure {
                owner: "alice".to_owned(),
                session_id: Some("t".to_owned()),
            })
        );
        let reply = AttachmentsEraseReply::from(Erased { files: 2, links: 3 });
        assert_eq!(
            serde_json::to_value(reply).ok(),
            Some(serde_json::json!({"v": "1", "files_deleted": 2, "links_deleted": 3}))
        );
    }

    /// A database and a bucket of their own, and files in them.
    struct Fixture {
        pool: PgPool,
        s3: aws_sdk_s3::Client,
        bucket: String,
    }

    impl Fixture {
        async fn new() -> Self {
            let pool = local_pool().await;
            let (s3, bucket) = local_s3().await;
            Self { pool, s3, bucket }
        }

        /// A file of `owner` in `status`, its object stored (a pending one's at its staging key
        /// too), linked to `sessions`.
        async fn file(&self, owner: &str, status: &str, sessions: &[&str]) -> Uuid {
            let id = Uuid::now_v7();
            sqlx::query(
                "INSERT INTO files (id, owner, bucket, object_key, file_name, content_type,
                                    size_bytes, status, expires_at)
                 VALUES ($1, $2, $3, $4, 'f.txt', 'text/plain', 1, $5, now() + interval '1 hour')",
            )
            .bind(id)
            .bind(owner)
            .bind(&self.bucket)
            .bind(key(id))
            .bind(status)
            .execute(&self.pool)
            .await
            .unwrap();
            let mut keys = vec![key(id)];
            if status == "pending" {
                keys.push(store::staging_key(id));
            }
            for key in keys {
                self.s3
                    .put_object()
                    .bucket(&self.bucket)
                    .key(key)
                    .body(b"x".to_vec().into())
                    .send()
                    .await
                    .unwrap();
            }
            for session in sessions {
                store::add_to_workspace(&self.pool, owner, session, id, store::Source::Upload)
                    .await
                    .unwrap();
            }
            id
        }

        async fn erase(&self, owner: &str, session: Option<&str>) -> Result<Erased, EraseError> {
            erase(
                &self.pool,
                &self.s3,
                &erasure(owner, session),
                Duration::from_millis(300),
            )
            .await
        }

        /// Whether file `id` still has its row, and how many of its objects are stored.
        async fn left(&self, id: Uuid) -> (bool, usize) {
            let row: Option<Uuid> = sqlx::query_scalar("SELECT id FROM files WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await
                .unwrap();
            let mut objects = 0;
            for key in [key(id), store::staging_key(id)] {
                let head = self
                    .s3
                    .head_object()
                    .bucket(&self.bucket)
                    .key(key)
                    .send()
                    .await;
                objects += usize::from(head.is_ok());
            }
            (row.is_some(), objects)
        }

        /// The sessions that link file `id`, in order.
        async fn sessions(&self, id: Uuid) -> Vec<String> {
            sqlx::query_scalar(
                "SELECT session_id FROM workspace_files WHERE file_id = $1 ORDER BY session_id",
            )
            .bind(id)
            .fetch_all(&self.pool)
            .await
            .unwrap()
        }
    }

    fn key(id: Uuid) -> String {
        format!("uploads/test/{id}/f.txt")
    }

    fn erasure(owner: &str, session: Option<&str>) -> Erasure {
        Erasure {
            owner: owner.to_owned(),
            session_id: session.map(str::to_owned),
        }
    }

    #[tokio::test]
    async fn a_session_loses_its_files_but_one_another_session_of_the_owner_still_links() {
        let f = Fixture::new().await;
        let only_here = f.file("alice", "verified", &["t1"]).await;
        let pending_here = f.file("alice", "pending", &["t1"]).await;
        let shared = f.file("alice", "verified", &["t1", "t2"]).await;
        let elsewhere = f.file("alice", "verified", &["t2"]).await;
        let unlinked = f.file("alice", "verified", &[]).await;
        let bobs = f.file("bob", "verified", &["t1"]).await;

        let erased = f.erase("alice", Some("t1")).await.unwrap();
        assert_eq!(
            erased,
            Erased { files: 2, links: 3 },
            "two files gone, and the three links of t1"
        );
        for id in [only_here, pending_here] {
            assert_eq!(f.left(id).await, (false, 0), "row and objects of {id} gone");
        }
        assert_eq!(f.left(shared).await, (true, 1), "the shared file stays");
        assert_eq!(f.sessions(shared).await, ["t2"], "linked to t2 only");
        for id in [elsewhere, unlinked, bobs] {
            assert_eq!(f.left(id).await, (true, 1), "{id} is not the session's");
        }
        assert_eq!(f.sessions(bobs).await, ["t1"], "bob's t1 is not alice's");

        let again = f.erase("alice", Some("t1")).await.unwrap();
        assert_eq!(again, Erased::default(), "a second erasure finds nothing");
    }

    #[tokio::test]
    async fn an_owner_loses_every_file_whatever_its_status_and_every_link() {
        let f = Fixture::new().await;
        let mut alices = Vec::new();
        for (status, sessions) in [
            ("verified", &["t1", "t2"][..]),
            ("pending", &["t1"][..]),
            ("quarantined", &[][..]),
            ("verified", &[][..]),
        ] {
            alices.push(f.file("alice", status, sessions).await);
        }
        let bobs = f.file("bob", "verified", &["t1"]).await;

        let erased = f.erase("alice", None).await.unwrap();
        assert_eq!(erased, Erased { files: 4, links: 3 });
        for id in alices {
            assert_eq!(f.left(id).await, (false, 0), "row and objects of {id} gone");
        }
        let links: i64 =
            sqlx::query_scalar("SELECT count(*) FROM workspace_files WHERE owner = 'alice'")
                .fetch_one(&f.pool)
                .await
                .unwrap();
        assert_eq!(links, 0, "no link of alice left");
        assert_eq!(f.left(bobs).await, (true, 1), "bob's file stays");
        assert_eq!(f.sessions(bobs).await, ["t1"]);

        // Asked again on the bus: the same request answers zeros.
        let again = answer(
            &f.pool,
            &f.s3,
            br#"{"v": "1", "owner": "alice", "session_id": null}"#,
        )
        .await
        .unwrap();
        assert_eq!(
            serde_json::from_slice::<AttachmentsEraseReply>(&again).ok(),
            Some(AttachmentsEraseReply::V1 {
                files_deleted: 0,
                links_deleted: 0
            }),
            "a second erasure finds nothing"
        );
    }

    #[tokio::test]
    async fn more_files_than_a_batch_are_all_erased_in_one_request() {
        let f = Fixture::new().await;
        let count = usize::try_from(BATCH).unwrap() + 20;
        // Rows only: the objects of this many files would take long to store.
        sqlx::query(
            "INSERT INTO files (id, owner, bucket, object_key, file_name, content_type, size_bytes,
                                status)
             SELECT gen_random_uuid(), 'alice', $1, 'k/' || i, 'f', 'text/plain', 1, 'verified'
             FROM generate_series(1, $2) AS i",
        )
        .bind(&f.bucket)
        .bind(i32::try_from(count).unwrap())
        .execute(&f.pool)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO workspace_files (id, owner, session_id, file_id, source)
             SELECT gen_random_uuid(), owner, 't1', id, 'upload' FROM files",
        )
        .execute(&f.pool)
        .await
        .unwrap();
        let erased = f.erase("alice", Some("t1")).await.unwrap();
        let count = u64::try_from(count).unwrap();
        assert_eq!(
            erased,
            Erased {
                files: count,
                links: count
            }
        );
    }

    #[tokio::test]
    async fn a_link_made_while_the_erasure_waits_for_the_file_keeps_it() {
        let f = Fixture::new().await;
        let file = f.file("alice", "verified", &["t1"]).await;
        // Another request putting the file in t2, not committed yet.
        let mut linking = f.pool.begin().await.unwrap();
        store::add_to_workspace(&mut *linking, "alice", "t2", file, store::Source::Upload)
            .await
            .unwrap();
        let erasing = {
            let (pool, s3) = (f.pool.clone(), f.s3.clone());
            tokio::spawn(async move {
                erase(&pool, &s3, &erasure("alice", Some("t1")), Duration::ZERO).await
            })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !erasing.is_finished(),
            "the erasure waits for the file, which the new link holds"
        );
        linking.commit().await.unwrap();
        let erased = erasing.await.unwrap().unwrap();
        assert_eq!(erased, Erased { files: 0, links: 1 }, "only t1's link went");
        assert_eq!(f.left(file).await, (true, 1), "the file t2 links stays");
        assert_eq!(f.sessions(file).await, ["t2"]);
    }

    #[tokio::test]
    async fn a_file_another_verifier_holds_is_left_until_its_lease_ends() {
        let f = Fixture::new().await;
        let held = f.file("alice", "pending", &["t1"]).await;
        let free = f.file("alice", "verified", &["t1"]).await;
        sqlx::query("UPDATE files SET verifying_until = now() + interval '1 minute' WHERE id = $1")
            .bind(held)
            .execute(&f.pool)
            .await
            .unwrap();

        let refused = f.erase("alice", Some("t1")).await;
        assert!(
            matches!(refused, Err(EraseError::Busy(1))),
            "no answer while the file is verified: {refused:?}"
        );
        assert_eq!(
            f.left(free).await,
            (false, 0),
            "the other file went already"
        );
        assert_eq!(f.left(held).await, (true, 2), "the held file stays whole");
        assert_eq!(
            f.sessions(held).await,
            ["t1"],
            "with its link, for the retry"
        );

        store::release_verification(&f.pool, held).await.unwrap();
        let erased = f.erase("alice", Some("t1")).await.unwrap();
        assert_eq!(erased, Erased { files: 1, links: 1 });
        assert_eq!(f.left(held).await, (false, 0));
    }

    #[tokio::test]
    async fn an_s3_failure_leaves_every_row_for_the_retry() {
        let f = Fixture::new().await;
        let file = f.file("alice", "verified", &["t1"]).await;
        let unreachable = platform::s3::client(&platform::s3::S3Config {
            endpoint: Some("http://127.0.0.1:1".to_owned()),
            region: "us-east-1".to_owned(),
            access_key: "nobody".to_owned(),
            secret_key: SecretString::from("nothing".to_owned()),
            bucket: f.bucket.clone(),
        });
        let failed = erase(
            &f.pool,
            &unreachable,
            &erasure("alice", None),
            Duration::ZERO,
        )
        .await;
        assert!(
            matches!(failed, Err(EraseError::Storage(_))),
            "an S3 failure is no success: {failed:?}"
        );
        assert_eq!(f.left(file).await, (true, 1), "row and object stay");
        assert_eq!(f.sessions(file).await, ["t1"], "and the link");

        let erased = f.erase("alice", None).await.unwrap();
        assert_eq!(erased, Erased { files: 1, links: 1 }, "the retry erases it");
        assert_eq!(f.left(file).await, (false, 0));
    }
}
