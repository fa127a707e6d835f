//! What one owner may hold and how fast they may add to it: upload forms and server uploads
//! per minute, unfinished uploads at once, and stored files (count and bytes). A flood of
//! unfulfilled forms from one owner can neither grow the files table without bound nor delay
//! everyone else's verification. Download links are rate-limited too: `download-url` may
//! verify a pending file inline, and even a verified one costs a lookup and a signature. Both
//! rates hold across every attachments replica ([`Rates`], `platform::limit::OwnerRate`).

use std::time::Duration;

use platform::limit::OwnerRate;
use platform::nats::JsonKv;
use sqlx::PgPool;

use crate::store;

/// `download-url` calls per owner per minute, across the fleet, by default
/// (`SB_ATTACHMENTS_DOWNLOAD_RATE_PER_MINUTE`, [`crate::Limits`]; a link lives for the download
/// TTL, so a client needs few).
pub const DOWNLOADS_PER_MINUTE: u32 = 120;
/// Burst of the same by default (`SB_ATTACHMENTS_DOWNLOAD_RATE_BURST`): a page opening many
/// files at once.
pub const DOWNLOADS_BURST: u32 = 60;

/// The limits (`SB_ATTACHMENTS_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaConfig {
    /// Upload forms and server uploads per owner per minute (`SB_ATTACHMENTS_UPLOAD_RATE_PER_MINUTE`, 60).
    pub uploads_per_minute: u32,
    /// Burst of the same (`SB_ATTACHMENTS_UPLOAD_RATE_BURST`, 20).
    pub uploads_burst: u32,
    /// Uploads signed but not verified yet, per owner (`SB_ATTACHMENTS_MAX_PENDING_PER_OWNER`, 20).
    pub max_pending: i64,
    /// Files per owner (`SB_ATTACHMENTS_MAX_FILES_PER_OWNER`, 10,000).
    pub max_files: i64,
    /// Bytes per owner (`SB_ATTACHMENTS_MAX_BYTES_PER_OWNER`, 10 GiB).
    pub max_bytes: i64,
}

impl Default for QuotaConfig {
    fn default() -> Self {
        Self {
            uploads_per_minute: 60,
            uploads_burst: 20,
            max_pending: 20,
            max_files: 10_000,
            max_bytes: 10 << 30,
        }
    }
}

/// Why an owner may not add a file now.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum QuotaError {
    /// Too many uploads in a short time (429, `Retry-After`).
    #[error("too many uploads; retry in {} s", .0.as_secs().max(1))]
    RateLimited(Duration),
    /// Too many download links asked for in a short time (429, `Retry-After`), naming the budget.
    #[error(
        "too many download-url requests (at most {per_minute} a minute per owner, bursts of {burst}); retry in {} s",
        .wait.as_secs().max(1)
    )]
    DownloadRateLimited {
        /// Until the next link may be asked for.
        wait: Duration,
        /// The rate (`SB_ATTACHMENTS_DOWNLOAD_RATE_PER_MINUTE`).
        per_minute: u32,
        /// The burst (`SB_ATTACHMENTS_DOWNLOAD_RATE_BURST`).
        burst: u32,
    },
    /// Too many unfinished uploads (429).
    #[error("{0} uploads are still waiting for their bytes; finish or let them expire first")]
    TooManyPending(i64),
    /// The owner's storage is full (403), naming the limit.
    #[error("storage quota reached: {0}")]
    Full(String),
}

/// The two per-owner rates: upload forms and server uploads ([`QuotaConfig`]), and
/// `download-url` ([`crate::Limits`]), shared by every replica through the owner budgets bucket.
pub(crate) struct Rates {
    uploads: OwnerRate,
    downloads: OwnerRate,
    /// The `download-url` rate per minute and burst, as its refusal names them.
    download_rate: (u32, u32),
}

impl Rates {
    /// `config`'s upload rate and `limits`' `download-url` rate, kept in `budgets`.
    pub(crate) fn new(config: &QuotaConfig, limits: &crate::Limits, budgets: JsonKv) -> Self {
        Self {
            uploads: OwnerRate::new(
                "uploads",
                config.uploads_per_minute,
                config.uploads_burst,
                budgets.clone(),
            ),
            downloads: OwnerRate::new(
                "downloads",
                limits.downloads_per_minute,
                limits.downloads_burst,
                budgets,
            ),
            download_rate: (limits.downloads_per_minute, limits.downloads_burst),
        }
    }

    /// May `owner` ask for one more upload now? Fails only when NATS does.
    pub(crate) async fn upload(&self, owner: &str) -> anyhow::Result<Result<(), QuotaError>> {
        Ok(self
            .uploads
            .check(owner)
            .await?
            .map_err(QuotaError::RateLimited))
    }

    /// May `owner` ask for one more download link now? Fails only when NATS does.
    pub(crate) async fn download(&self, owner: &str) -> anyhow::Result<Result<(), QuotaError>> {
        let (per_minute, burst) = self.download_rate;
        Ok(self
            .downloads
            .check(owner)
            .await?
            .map_err(|wait| QuotaError::DownloadRateLimited {
                wait,
                per_minute,
                burst,
            }))
    }
}

/// Enforces [`QuotaConfig`]'s unfinished uploads and storage limits.
pub(crate) struct Quota {
    config: QuotaConfig,
}

impl Quota {
    /// Enforces `config`.
    pub(crate) fn new(config: QuotaConfig) -> Self {
        Self { config }
    }

    /// Is there room for one more file of `owner` of `size` bytes (`None`: not known yet)?
    /// `pending`: whether it will be an upload still to come (counted against the unfinished
    /// uploads), or bytes the service already holds. Only an early refusal: a concurrent request
    /// may take the room before this one's file is recorded, so the insert itself must be
    /// judged again, atomically ([`Quota::insert`]).
    pub(crate) async fn room(
        &self,
        pool: &PgPool,
        owner: &str,
        size: Option<i64>,
        pending: bool,
    ) -> anyhow::Result<Result<(), QuotaError>> {
        let mut usage = store::usage(pool, owner).await?;
        if !pending {
            usage.pending = 0;
        }
        Ok(self.judge(&usage, size))
    }

    /// Records `u` as `store::insert_file` does (pending, or verified with `verified_sha256`)
    /// if its owner has room for it, judged and recorded in one transaction under the owner's
    /// quota lock ([`store::insert_within_quota`]): unlike [`Quota::room`] followed by an
    /// insert, concurrent calls for one owner cannot together overshoot a limit. A verified file
    /// is not held to the unfinished-upload limit. `Ok(true)`: recorded; `Ok(false)`: the owner
    /// already has a live file with `u`'s declared hash (nothing written); `Err`: no room.
    pub(crate) async fn insert(
        &self,
        pool: &PgPool,
        u: &store::NewUpload<'_>,
        verified_sha256: Option<&[u8]>,
    ) -> anyhow::Result<Result<bool, QuotaError>> {
        let pending = verified_sha256.is_none();
        let c = &self.config;
        let max_pending = if pending { c.max_pending } else { i64::MAX };
        let done = store::insert_within_quota(
            pool,
            u,
            verified_sha256,
            max_pending,
            c.max_files,
            c.max_bytes,
        )
        .await?;
        if done.inserted {
            return Ok(Ok(true));
        }
        let mut usage = done.usage;
        if !pending {
            usage.pending = 0;
        }
        Ok(self.judge(&usage, Some(u.size)).map(|()| false))
    }

    /// The limits.
    pub(crate) fn limits(&self) -> &QuotaConfig {
        &self.config
    }

    /// Whether `usage` leaves room for a file of `size` bytes. `store::claim_upload` and
    /// `store::insert_within_quota` apply the same three limits in SQL: keep them alike.
    pub(crate) fn judge(&self, usage: &store::Usage, size: Option<i64>) -> Result<(), QuotaError> {
        let c = &self.config;
        if usage.pending >= c.max_pending {
            return Err(QuotaError::TooManyPending(usage.pending));
        }
        if usage.files >= c.max_files {
            return Err(QuotaError::Full(format!("at most {} files", c.max_files)));
        }
        if usage.bytes.saturating_add(size.unwrap_or(0)) > c.max_bytes {
            return Err(QuotaError::Full(format!(
                "at most {} bytes in all ({} used)",
                c.max_bytes, usage.bytes
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota() -> Quota {
        Quota::new(QuotaConfig {
            uploads_per_minute: 60,
            uploads_burst: 5,
            max_pending: 2,
            max_files: 3,
            max_bytes: 100,
        })
    }

    fn usage(files: i64, bytes: i64, pending: i64) -> store::Usage {
        store::Usage {
            files,
            bytes,
            pending,
        }
    }

    #[test]
    fn each_limit_refuses_with_its_own_reason() {
        let q = quota();
        assert_eq!(q.judge(&usage(0, 0, 0), Some(100)), Ok(()));
        assert_eq!(
            q.judge(&usage(2, 10, 2), Some(1)),
            Err(QuotaError::TooManyPending(2))
        );
        assert!(
            matches!(q.judge(&usage(3, 10, 0), Some(1)), Err(QuotaError::Full(m)) if m.contains("3 files"))
        );
        assert!(
            matches!(q.judge(&usage(1, 60, 0), Some(41)), Err(QuotaError::Full(m)) if m.contains("100 bytes"))
        );
        assert_eq!(q.judge(&usage(1, 60, 0), None), Ok(()));
    }

    #[test]
    fn a_download_rate_refusal_names_the_rate_and_when_to_retry() {
        let refused = QuotaError::DownloadRateLimited {
            wait: Duration::from_millis(1500),
            per_minute: 1,
            burst: 2,
        };
        assert_eq!(
            refused.to_string(),
            "too many download-url requests (at most 1 a minute per owner, bursts of 2); retry in 1 s"
        );
    }
}
