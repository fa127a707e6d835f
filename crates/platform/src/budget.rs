//! Per-owner budgets of bytes per UTC day that hold across every replica of a service: the
//! bytes of accepted runs one owner may add to the RUNS stream (`SB_RUNS_OWNER_BYTES_PER_DAY`,
//! the runs service), and of run events to the RUN_EVENTS stream
//! (`SB_WORKER_OWNER_EVENT_BYTES_PER_DAY`, the worker). Both streams are shared by every owner, and
//! a per-replica rate let one owner fill them for everyone.
//!
//! The day's total lives in the `<PREFIX>_OWNER_BUDGETS` bucket (key `<kind>.<owner
//! digest>.<day>`), changed only by compare-and-set. A replica does not write it per spend: it
//! leases a chunk of the owner's day (a thirty-second of the budget, 64 KiB to 8 MiB) and spends
//! it locally, so the shared record is written about once per chunk. What is given back (a run
//! refused later, a retry) returns to the replica's lease. What a replica leased and did not
//! spend when it stopped is lost for that day: an owner may get up to a chunk per replica less,
//! never more.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use crate::nats::{Created, JsonKv};
use chrono::{DateTime, Datelike as _, NaiveDate, Utc};
use protocol::messaging::short_digest;
use serde::{Deserialize, Serialize};

/// The smallest and largest lease.
const MIN_CHUNK: u64 = 64 * 1024;
const MAX_CHUNK: u64 = 8 * 1024 * 1024;

/// What an owner's day has leased to replicas, in the bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
struct DayRecord {
    leased: u64,
}

/// A replica's unspent lease of one owner's day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lease {
    day: NaiveDate,
    left: u64,
}

/// Why bytes cannot be spent: the owner's day is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exhausted {
    /// The budget per day.
    pub per_day: u64,
    /// Until the day (UTC) ends.
    pub resets_in: Duration,
}

/// A per-owner budget of bytes per UTC day, shared by every replica through a KV bucket.
pub struct DailyBudget {
    /// The budget's name in its keys (`bytes`, `events`).
    kind: &'static str,
    per_day: u64,
    chunk: u64,
    kv: JsonKv,
    leases: Mutex<HashMap<String, Lease>>,
    /// The day (days from the common era) the leases of earlier days were last dropped.
    pruned: AtomicI32,
    renewals: crate::limit::Renewals,
}

/// How much of `want` a day that has leased `leased` of `per_day` can still grant.
fn grant(per_day: u64, leased: u64, want: u64) -> u64 {
    want.min(per_day.saturating_sub(leased))
}

/// The lease size for a budget.
fn chunk_of(per_day: u64) -> u64 {
    (per_day / 32).clamp(MIN_CHUNK, MAX_CHUNK).min(per_day)
}

/// Time until the UTC day of `now` ends.
fn until_tomorrow(now: DateTime<Utc>) -> Duration {
    let tomorrow = now
        .date_naive()
        .succ_opt()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|t| t.and_utc());
    tomorrow
        .and_then(|t| (t - now).to_std().ok())
        .unwrap_or(Duration::from_secs(1))
        .max(Duration::from_secs(1))
}

impl DailyBudget {
    /// A budget named `kind` of `per_day` bytes per owner, shared through `kv`.
    pub fn new(kind: &'static str, per_day: u64, kv: JsonKv) -> Self {
        Self {
            kind,
            per_day,
            chunk: chunk_of(per_day),
            kv,
            leases: Mutex::new(HashMap::new()),
            renewals: crate::limit::Renewals::new(),
            pruned: AtomicI32::new(0),
        }
    }

    /// Takes `bytes` of `owner`'s day at `now`, or says the day's budget is spent. Fails only
    /// when NATS does.
    pub async fn spend(
        &self,
        owner: &str,
        bytes: u64,
        now: DateTime<Utc>,
    ) -> anyhow::Result<Result<(), Exhausted>> {
        let day = now.date_naive();
        if self.take_local(owner, bytes, day).is_none() {
            return Ok(Ok(()));
        }
        let exhausted = Exhausted {
            per_day: self.per_day,
            resets_in: until_tomorrow(now),
        };
        if bytes > self.per_day {
            return Ok(Err(exhausted));
        }
        // Renew the lease, or wait for the renewal in progress and spend from what it brought.
        let _renewing = self.renewals.one_at_a_time(owner).await;
        let Some(need) = self.take_local(owner, bytes, day) else {
            return Ok(Ok(()));
        };
        let granted = self.lease(owner, day, self.chunk.max(need)).await?;
        let mut leases = self
            .leases
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?;
        let lease = leases
            .entry(owner.to_owned())
            .or_insert(Lease { day, left: 0 });
        if lease.day != day {
            *lease = Lease { day, left: 0 };
        }
        lease.left += granted;
        if lease.left >= bytes {
            lease.left -= bytes;
            Ok(Ok(()))
        } else {
            Ok(Err(exhausted))
        }
    }

    /// Gives `bytes` back to `owner`'s lease of `now`'s day (a run that was not stored after
    /// all, or a retry of one that was).
    pub fn refund(&self, owner: &str, bytes: u64, now: DateTime<Utc>) {
        let day = now.date_naive();
        if let Ok(mut leases) = self.leases.lock()
            && let Some(lease) = leases.get_mut(owner)
            && lease.day == day
        {
            lease.left += bytes;
        }
    }

    /// Spends from this replica's lease if it holds enough; else the bytes still needed.
    fn take_local(&self, owner: &str, bytes: u64, day: NaiveDate) -> Option<u64> {
        let Ok(mut leases) = self.leases.lock() else {
            return Some(bytes);
        };
        // A new day: the leases of earlier days are worth nothing (dropped once a day).
        let today = day.num_days_from_ce();
        if self.pruned.swap(today, Ordering::Relaxed) != today {
            leases.retain(|_, lease| lease.day == day);
        }
        match leases.get_mut(owner) {
            Some(lease) if lease.day == day && lease.left >= bytes => {
                lease.left -= bytes;
                None
            }
            Some(lease) if lease.day == day => Some(bytes - lease.left),
            _ => Some(bytes),
        }
    }

    /// Leases up to `want` bytes of `owner`'s `day` from the shared record; what it got.
    async fn lease(&self, owner: &str, day: NaiveDate, want: u64) -> anyhow::Result<u64> {
        let key = format!(
            "{}.{}.{}",
            self.kind,
            short_digest(owner),
            day.format("%Y%m%d")
        );
        let mut round = 0;
        loop {
            let read = self.kv.get_for_round::<DayRecord>(&key, round).await?;
            round += 1;
            match read {
                None => {
                    let granted = grant(self.per_day, 0, want);
                    if let Created::Created(_) =
                        self.kv.create(&key, &DayRecord { leased: granted }).await?
                    {
                        return Ok(granted);
                    }
                }
                Some((record, revision)) => {
                    let granted = grant(self.per_day, record.leased, want);
                    if granted == 0 {
                        return Ok(0);
                    }
                    let next = DayRecord {
                        leased: record.leased + granted,
                    };
                    if self.kv.update(&key, &next, revision).await?.is_some() {
                        return Ok(granted);
                    }
                }
            }
            // Another replica leased meanwhile: read again (from the leader).
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_day_grants_what_it_has_left_and_no_more() {
        assert_eq!(grant(1000, 0, 300), 300);
        assert_eq!(grant(1000, 900, 300), 100);
        assert_eq!(grant(1000, 1000, 300), 0);
        assert_eq!(grant(1000, 1200, 300), 0);
    }

    #[test]
    fn leases_are_a_thirty_second_of_the_budget_within_bounds() {
        assert_eq!(chunk_of(256 * 1024 * 1024), 8 * 1024 * 1024);
        assert_eq!(chunk_of(32 * 1024 * 1024), 1024 * 1024);
        assert_eq!(chunk_of(1024 * 1024), MIN_CHUNK);
        assert_eq!(chunk_of(1000), 1000, "never more than the budget");
    }

    #[test]
    fn the_day_resets_at_utc_midnight() {
        let now = DateTime::parse_from_rfc3339("2026-11-27T23:59:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(until_tomorrow(now), Duration::from_secs(60));
    }
}
