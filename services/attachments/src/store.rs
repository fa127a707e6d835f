//! All SQL of the attachments service.

use sqlx::PgPool;

/// A file record, as the resolve endpoint reads it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct FileRow {
    pub(crate) status: String,
    pub(crate) content_type: String,
    pub(crate) file_name: String,
    pub(crate) size_bytes: i64,
}

/// The owner's file at `bucket`/`key`, if there is one.
pub(crate) async fn find_owned(
    pool: &PgPool,
    owner: &str,
    bucket: &str,
    key: &str,
) -> sqlx::Result<Option<FileRow>> {
    sqlx::query_as(
        "SELECT status, content_type, file_name, size_bytes FROM files
         WHERE owner = $1 AND bucket = $2 AND object_key = $3",
    )
    .bind(owner)
    .bind(bucket)
    .bind(key)
    .fetch_optional(pool)
    .await
}
