//! Finding the owner's verified files from the references runs and history hold: resolve a URL
//! or `content_url` to a verified file the caller owns (verifying a pending one at once), and
//! sign download URLs in bulk. Answered over NATS by [`crate::bus::resolve`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode};
use protocol::files::{
    FileRef, MAX_SIGN_BATCH, RefusalReason, ResolveOutcome, ResolvedFile, parse_file_url,
};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use sqlx::PgPool;

use crate::generated::valid_session;
use crate::policy::Signer;
use crate::store::{self, FileRow, FileStatus, Source};

/// What looking files up needs.
pub(crate) struct Lookup {
    pub(crate) pool: PgPool,
    /// Secret Supabase-style signed-URL tokens are verified with, when configured.
    pub(crate) supabase_secret: Option<SecretString>,
    /// Credentials and public endpoint download URLs are signed for.
    pub(crate) signer: Arc<Signer>,
    /// Validity of signed download URLs.
    pub(crate) download_ttl: Duration,
    /// Verifies a pending file a run refers to, once at a time.
    pub(crate) verifier: Arc<crate::verify::Verifier>,
}

#[derive(Deserialize)]
struct SupabaseClaims {
    url: String,
}

/// The verified row each reference names (`None`: no reference, or no such row), in order.
fn match_rows<'a>(refs: &[Option<FileRef>], rows: &'a [FileRow]) -> Vec<Option<&'a FileRow>> {
    let by_object: HashMap<(&str, &str), &FileRow> = rows
        .iter()
        .filter(|row| row.status == FileStatus::Verified)
        .map(|row| ((row.bucket.as_str(), row.object_key.as_str()), row))
        .collect();
    refs.iter()
        .map(|file| {
            let file = file.as_ref()?;
            by_object
                .get(&(file.bucket.as_str(), file.path.as_str()))
                .copied()
        })
        .collect()
}

impl Lookup {
    /// Resolves `url` for `owner`; a verified file joins the workspace of `session_id`, if
    /// given, as an upload (once: a file already there keeps its source).
    pub(crate) async fn resolve(
        &self,
        owner: &str,
        url: &str,
        session_id: Option<&str>,
    ) -> anyhow::Result<ResolveOutcome> {
        let refused = |reason| Ok(ResolveOutcome::Refused { reason });
        let file = match self.download_link(url).await? {
            // A download link this service made (what `download-url`, the server upload and
            // history hand out): its signature and expiry are checked, then it is the file
            // it names, which must still be the caller's (below).
            Some(Ok(file)) => file,
            Some(Err(reason)) => return refused(reason),
            None => {
                let Ok(file) = parse_file_url(url) else {
                    return refused(RefusalReason::BadUrl);
                };
                if !self.token_ok(&file) {
                    return refused(RefusalReason::BadSignature);
                }
                file
            }
        };
        let Some(mut row) = store::find_owned(&self.pool, owner, &file.bucket, &file.path).await?
        else {
            return refused(RefusalReason::NotFound);
        };
        if row.status == FileStatus::Pending {
            // Uploaded moments ago, perhaps: verify now rather than wait for the sweeper.
            // Shared with any other caller verifying it (see `crate::verify`).
            row.status = match self.verifier.verify(&row).await? {
                crate::verify::Verdict::Verified => FileStatus::Verified,
                crate::verify::Verdict::Quarantined(_) => FileStatus::Quarantined,
                crate::verify::Verdict::Waiting | crate::verify::Verdict::InProgress => {
                    FileStatus::Pending
                }
                crate::verify::Verdict::Expired => return refused(RefusalReason::NotFound),
            };
        }
        match row.status {
            FileStatus::Verified => {
                if let Some(session_id) = session_id.filter(|s| valid_session(s)) {
                    store::add_to_workspace(&self.pool, owner, session_id, row.id, Source::Upload)
                        .await?;
                }
                Ok(ResolveOutcome::Resolved(ResolvedFile {
                    bucket: file.bucket,
                    path: file.path,
                    mime_type: row.content_type,
                    file_name: row.file_name,
                    size_bytes: row.size_bytes,
                }))
            }
            FileStatus::Quarantined => refused(RefusalReason::Quarantined),
            FileStatus::Pending => refused(RefusalReason::NotVerified),
        }
    }

    /// The file a download link of this service names (`.../v2/files/content/{id}?expires=
    /// &signature=`): `None` when `url` is not such a link, a refusal when its signature is bad
    /// or it has expired or its file is gone.
    async fn download_link(
        &self,
        url: &str,
    ) -> anyhow::Result<Option<Result<FileRef, RefusalReason>>> {
        let marker = format!("{}/", crate::download::CONTENT_PATH);
        let Some((_, rest)) = url.split_once(&marker) else {
            return Ok(None);
        };
        let (id, query) = match rest.split_once('?') {
            Some((id, query)) => (id, Some(query)),
            None => (rest, None),
        };
        let link = match crate::download::check(&self.signer, id, query, SystemTime::now())? {
            Ok(link) => link,
            Err(_) => return Ok(Some(Err(RefusalReason::BadSignature))),
        };
        Ok(Some(
            match store::find_verified(&self.pool, link.file_id).await? {
                Some(row) => Ok(FileRef {
                    bucket: row.bucket,
                    path: row.object_key,
                    token: None,
                }),
                None => Err(RefusalReason::NotFound),
            },
        ))
    }

    /// A Supabase token must be valid for exactly this object when a secret is configured.
    fn token_ok(&self, file: &FileRef) -> bool {
        let (Some(token), Some(secret)) = (&file.token, &self.supabase_secret) else {
            return true;
        };
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp"]);
        validation.validate_aud = false;
        decode::<SupabaseClaims>(
            token,
            &DecodingKey::from_secret(secret.expose_secret().as_bytes()),
            &validation,
        )
        .is_ok_and(|data| data.claims.url == format!("{}/{}", file.bucket, file.path))
    }

    /// Fresh download URLs for the owner's verified files, `None` for anything else (a URL that
    /// does not parse, a file not the owner's, not verified, or gone), in request order: one
    /// query for the whole batch, then signing in memory.
    pub(crate) async fn sign(
        &self,
        owner: &str,
        urls: &[String],
    ) -> anyhow::Result<Vec<Option<String>>> {
        let refs: Vec<Option<FileRef>> = urls
            .iter()
            .take(MAX_SIGN_BATCH)
            .map(|url| parse_file_url(url).ok())
            .collect();
        let objects: Vec<(&str, &str)> = refs
            .iter()
            .flatten()
            .map(|f| (f.bucket.as_str(), f.path.as_str()))
            .collect();
        let rows = if objects.is_empty() {
            Vec::new()
        } else {
            store::find_verified_owned(&self.pool, owner, &objects).await?
        };
        crate::download::presign(
            &self.signer,
            match_rows(&refs, &rows),
            self.download_ttl,
            SystemTime::now(),
        )
    }
}

#[cfg(test)]
mod tests {
    use protocol::files::parse_file_url;
    use uuid::Uuid;

    use super::match_rows;
    use crate::store::{FileRow, FileStatus};

    fn row(bucket: &str, key: &str, status: FileStatus) -> FileRow {
        FileRow {
            id: Uuid::now_v7(),
            bucket: bucket.to_owned(),
            object_key: key.to_owned(),
            file_name: "f".to_owned(),
            content_type: "application/pdf".to_owned(),
            size_bytes: 1,
            declared_sha256: None,
            status,
            expires_at: None,
        }
    }

    #[test]
    fn rows_are_matched_in_request_order_with_duplicates_and_gaps() {
        let urls = [
            "s3://b/u/2.pdf",
            "not a url",
            "http://127.0.0.1:9000/b/u/1.pdf?X-Amz-Signature=old",
            "s3://b/u/missing.pdf",
            "s3://b/u/2.pdf",
            "s3://other/u/1.pdf",
            "s3://b/u/pending.pdf",
        ];
        let refs: Vec<_> = urls.iter().map(|u| parse_file_url(u).ok()).collect();
        // In no particular order, as the query returns them; a non-verified row never signs.
        let rows = [
            row("b", "u/1.pdf", FileStatus::Verified),
            row("b", "u/pending.pdf", FileStatus::Pending),
            row("b", "u/2.pdf", FileStatus::Verified),
        ];
        let keys: Vec<Option<&str>> = match_rows(&refs, &rows)
            .into_iter()
            .map(|r| r.map(|r| r.object_key.as_str()))
            .collect();
        assert_eq!(
            keys,
            [
                Some("u/2.pdf"),
                None,
                Some("u/1.pdf"),
                None,
                Some("u/2.pdf"),
                None,
                None
            ]
        );
    }
}
