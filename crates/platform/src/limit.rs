//! Per-owner request rates that hold across every replica of a service (runs started, run
//! lookups, compatibility checks, upload forms, download links). A rate kept per replica let one
//! owner send N times as much to a fleet of N replicas.
//!
//! Each owner's rate is one record in the owner budgets bucket (key `rate-<kind>.<owner
//! digest>`): its theoretical arrival time (GCRA, the generic cell rate algorithm, the token
//! bucket of `governor` written as one number), changed only by compare-and-set. A replica does
//! not write it per request: it leases a few requests' worth at a time and spends them locally.
//! A lease starts at one request and doubles, up to a quarter of the burst, while the owner spends
//! it quickly; it lapses after [`LEASE_LIFE`]. What a lapsed lease held is lost: an owner may get
//! a little less than the rate, never more. A refusal is remembered until its `Retry-After`, so
//! an owner who keeps asking past the limit costs the bucket nothing more.
//!
//! Replicas' clocks are assumed to agree within well under a request's interval (NTP).

use std::collections::HashMap;
use std::hash::BuildHasher as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use protocol::messaging::short_digest;
use serde::{Deserialize, Serialize};

use crate::nats::{Created, JsonKv};

/// How long a replica may spend a lease before it lapses.
pub const LEASE_LIFE: Duration = Duration::from_secs(1);

/// The largest lease, whatever the burst.
const MAX_LEASE: u32 = 64;
/// How many owners a replica remembers before it forgets those with nothing leased or refused.
const MAX_OWNERS: usize = 10_000;
/// The owners are counted once per this many checks.
const COUNT_EVERY: u32 = 256;

/// An owner's rate in the bucket: when the owner's next request would be on time if requests
/// came exactly at the rate (nanoseconds since the Unix epoch). The owner may be up to a burst
/// of requests ahead of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
struct RateRecord {
    tat: u64,
}

/// What a replica holds of one owner's rate.
#[derive(Debug, Clone, Copy)]
struct Lease {
    /// Requests leased and not yet spent.
    left: u32,
    /// How many the last lease asked for.
    size: u32,
    /// When the last lease was taken.
    taken: Instant,
    /// The record as this replica last wrote or read it, and its revision: the next lease tries
    /// to write over it directly, without reading it first.
    known: Option<(RateRecord, u64)>,
    /// Refused until then (the owner's next request cannot be on time before).
    refused_until: Option<Instant>,
}

/// A per-owner rate of `per_minute` requests, up to `burst` at once, shared by every replica
/// through the owner budgets bucket.
pub struct OwnerRate {
    /// The rate's name in its keys (`runs`, `lookups`, ...).
    kind: &'static str,
    /// Nanoseconds between two requests at the rate.
    interval: u64,
    burst: u32,
    largest_lease: u32,
    kv: JsonKv,
    leases: Mutex<HashMap<String, Lease>>,
    /// Checks since the owners were last counted.
    checks: AtomicU32,
    renewals: Renewals,
}

/// One lease renewal at a time per owner on this replica. The requests that find an owner's
/// lease spent while it is being renewed wait for that renewal and spend from what it brought,
/// instead of racing it in the bucket, where all but one compare-and-set fails and is read and
/// tried again (16 requests at once wrote the record 16 times), and a replica leases more of
/// the owner's budget than it needs. Owners are hashed onto [`Renewals::STRIPES`] locks.
pub(crate) struct Renewals {
    locks: Box<[tokio::sync::Mutex<()>]>,
    stripes: std::hash::RandomState,
}

impl Renewals {
    /// How many owners' renewals may run at once (owners sharing a stripe wait for each
    /// other's, a round trip each).
    const STRIPES: usize = 64;

    pub(crate) fn new() -> Self {
        Self {
            locks: (0..Self::STRIPES)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            stripes: std::hash::RandomState::new(),
        }
    }

    /// Held while `owner`'s lease is renewed here.
    pub(crate) async fn one_at_a_time(&self, owner: &str) -> tokio::sync::MutexGuard<'_, ()> {
        let stripe =
            usize::try_from(self.stripes.hash_one(owner)).unwrap_or_default() % Self::STRIPES;
        self.locks[stripe].lock().await
    }
}

/// What the shared record grants at `now`: up to `want` requests and the record after them, or
/// how long (nanoseconds) until one request is on time.
fn grant(
    record: RateRecord,
    now: u64,
    interval: u64,
    burst: u32,
    want: u32,
) -> Result<(u32, RateRecord), u64> {
    let start = record.tat.max(now);
    let ahead = start - now;
    let allowance = interval.saturating_mul(u64::from(burst));
    let free = allowance.saturating_sub(ahead) / interval.max(1);
    let granted = u32::try_from(free.min(u64::from(want))).unwrap_or(want);
    if granted == 0 {
        // `ahead` is more than the allowance less one interval: the wait is what is left.
        return Err((ahead + interval).saturating_sub(allowance).max(1));
    }
    Ok((
        granted,
        RateRecord {
            tat: start.saturating_add(interval.saturating_mul(u64::from(granted))),
        },
    ))
}

/// The next lease's size after `lease`: doubled while the owner spends leases within a quarter
/// of their life, the same within their life, back to one after.
fn next_size(lease: Option<&Lease>, now: Instant, largest: u32) -> u32 {
    match lease {
        Some(lease) if now.duration_since(lease.taken) < LEASE_LIFE / 4 => {
            lease.size.saturating_mul(2).min(largest)
        }
        Some(lease) if now.duration_since(lease.taken) < LEASE_LIFE => lease.size,
        _ => 1,
    }
}

/// Nanoseconds since the Unix epoch.
fn wall_clock() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
        })
}

/// What the local lease says.
enum Local {
    /// One request spent from it.
    Spent,
    /// Refused still, for this long.
    Refused(Duration),
    /// Lease this many from the bucket (over the record as last known).
    Lease(u32, Option<(RateRecord, u64)>),
}

impl OwnerRate {
    /// `per_minute` requests sustained, up to `burst` at once (both at least 1), per owner across
    /// the fleet, kept in `kv` (the owner budgets bucket) under `rate-<kind>.<owner digest>`.
    pub fn new(kind: &'static str, per_minute: u32, burst: u32, kv: JsonKv) -> Self {
        let burst = burst.max(1);
        Self {
            kind,
            interval: (60_000_000_000 / u64::from(per_minute.max(1))).max(1),
            burst,
            largest_lease: (burst / 4).clamp(1, MAX_LEASE),
            kv,
            leases: Mutex::new(HashMap::new()),
            checks: AtomicU32::new(0),
            renewals: Renewals::new(),
        }
    }

    /// `Ok(Ok(()))` if `owner` may make one more request now, `Ok(Err(wait))` if not before
    /// `wait`. Fails only when NATS does.
    pub async fn check(&self, owner: &str) -> anyhow::Result<Result<(), Duration>> {
        let mut local = self.take_local(owner, Instant::now());
        let _renewing;
        if matches!(local, Local::Lease(..)) {
            // The lease is spent: renew it, or wait for the renewal in progress and spend
            // from what it brought.
            _renewing = self.renewals.one_at_a_time(owner).await;
            local = self.take_local(owner, Instant::now());
        }
        let (size, known) = match local {
            Local::Spent => return Ok(Ok(())),
            Local::Refused(wait) => return Ok(Err(wait)),
            Local::Lease(size, known) => (size, known),
        };
        let (outcome, known) = self.lease(owner, size, known).await?;
        let now = Instant::now();
        let mut leases = self
            .leases
            .lock()
            .map_err(|_| anyhow::anyhow!("the rate leases are poisoned"))?;
        let held = leases.get(owner).copied();
        // What this replica still held (another request of the owner leased meanwhile).
        let still = held
            .filter(|lease| now.duration_since(lease.taken) < LEASE_LIFE)
            .map_or(0, |lease| lease.left);
        match outcome {
            Ok(granted) => {
                leases.insert(
                    owner.to_owned(),
                    Lease {
                        left: still + granted - 1,
                        size,
                        taken: now,
                        known: Some(known),
                        refused_until: None,
                    },
                );
                Ok(Ok(()))
            }
            Err(_) if still > 0 => {
                if let Some(lease) = leases.get_mut(owner) {
                    lease.left -= 1;
                }
                Ok(Ok(()))
            }
            Err(wait) => {
                let wait = Duration::from_nanos(wait);
                leases.insert(
                    owner.to_owned(),
                    Lease {
                        left: 0,
                        size: held.map_or(1, |lease| lease.size),
                        taken: held.map_or(now, |lease| lease.taken),
                        known: Some(known),
                        refused_until: Some(now + wait),
                    },
                );
                Ok(Err(wait))
            }
        }
    }

    /// Spends from this replica's lease if it holds one; else what to lease.
    fn take_local(&self, owner: &str, now: Instant) -> Local {
        let Ok(mut leases) = self.leases.lock() else {
            return Local::Lease(1, None);
        };
        if self
            .checks
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(COUNT_EVERY)
            && leases.len() > MAX_OWNERS
        {
            leases.retain(|_, lease| {
                now.duration_since(lease.taken) < LEASE_LIFE
                    || lease.refused_until.is_some_and(|until| until > now)
            });
        }
        let lease = leases.get_mut(owner);
        if let Some(lease) = lease {
            if let Some(until) = lease.refused_until {
                if until > now {
                    return Local::Refused(until - now);
                }
                lease.refused_until = None;
            }
            if lease.left > 0 && now.duration_since(lease.taken) < LEASE_LIFE {
                lease.left -= 1;
                return Local::Spent;
            }
            return Local::Lease(next_size(Some(lease), now, self.largest_lease), lease.known);
        }
        Local::Lease(1, None)
    }

    /// Leases up to `want` requests of `owner`'s rate from the shared record: how many it got
    /// (or how long until one is on time) and the record as written or read.
    async fn lease(
        &self,
        owner: &str,
        want: u32,
        mut known: Option<(RateRecord, u64)>,
    ) -> anyhow::Result<(Result<u32, u64>, (RateRecord, u64))> {
        let key = format!("rate-{}.{}", self.kind, short_digest(owner));
        loop {
            let now = wall_clock();
            match known {
                None => {
                    let (granted, next) =
                        grant(RateRecord::default(), now, self.interval, self.burst, want)
                            .unwrap_or((0, RateRecord::default()));
                    if granted > 0
                        && let Created::Created(revision) = self.kv.create(&key, &next).await?
                    {
                        return Ok((Ok(granted), (next, revision)));
                    }
                }
                Some((record, revision)) => {
                    match grant(record, now, self.interval, self.burst, want) {
                        Err(wait) => return Ok((Err(wait), (record, revision))),
                        Ok((granted, next)) => {
                            if let Some(revision) = self.kv.update(&key, &next, revision).await? {
                                return Ok((Ok(granted), (next, revision)));
                            }
                        }
                    }
                }
            }
            // The record moved on (another replica leased) or was not known: read it, from the
            // leader (a replica behind it would answer the revision just refused).
            known = self.kv.get_latest::<RateRecord>(&key).await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn an_idle_owner_gets_the_burst_at_once_then_one_request_per_interval() {
        // 60 a minute, 3 at once: one a second.
        let (now, interval) = (100 * SECOND, SECOND);
        let (granted, record) = grant(RateRecord::default(), now, interval, 3, 5).unwrap();
        assert_eq!(granted, 3, "the burst, not more");
        assert_eq!(record.tat, now + 3 * SECOND);
        assert_eq!(
            grant(record, now, interval, 3, 1),
            Err(SECOND),
            "the next is a second away"
        );
        let later = now + SECOND / 2;
        assert_eq!(grant(record, later, interval, 3, 1), Err(SECOND / 2));
        let (granted, after) = grant(record, now + SECOND, interval, 3, 5).unwrap();
        assert_eq!((granted, after.tat), (1, now + 4 * SECOND), "one came back");
    }

    #[test]
    fn leasing_in_parts_grants_no_more_than_leasing_at_once() {
        let (now, interval) = (100 * SECOND, SECOND);
        let mut record = RateRecord::default();
        let mut total = 0;
        while let Ok((granted, next)) = grant(record, now, interval, 10, 3) {
            total += granted;
            record = next;
        }
        assert_eq!(total, 10);
    }

    #[test]
    fn an_owner_idle_for_long_has_no_more_than_a_burst() {
        let record = RateRecord { tat: SECOND };
        let (granted, _) = grant(record, 1_000 * SECOND, SECOND, 4, 100).unwrap();
        assert_eq!(granted, 4);
    }

    #[test]
    fn huge_rates_and_bursts_do_not_overflow() {
        // What the acceptance benchmark sets: 100,000,000 a minute and at once.
        let interval = 60_000_000_000 / 100_000_000u64;
        let (granted, _) =
            grant(RateRecord::default(), 5 * SECOND, interval, 100_000_000, 64).unwrap();
        assert_eq!(granted, 64);
        // One a minute, a burst of u32::MAX: the allowance saturates instead of wrapping.
        let (granted, _) =
            grant(RateRecord::default(), 5 * SECOND, 60 * SECOND, u32::MAX, 7).unwrap();
        assert_eq!(granted, 7);
    }

    #[test]
    fn leases_grow_while_spent_quickly_and_shrink_when_the_owner_slows() {
        let start = Instant::now();
        let lease = |size| Lease {
            left: 0,
            size,
            taken: start,
            known: None,
            refused_until: None,
        };
        assert_eq!(next_size(None, start, 8), 1);
        assert_eq!(
            next_size(Some(&lease(2)), start + Duration::from_millis(10), 8),
            4
        );
        assert_eq!(
            next_size(Some(&lease(8)), start + Duration::from_millis(10), 8),
            8,
            "at most the largest"
        );
        assert_eq!(
            next_size(Some(&lease(4)), start + Duration::from_millis(500), 8),
            4
        );
        assert_eq!(
            next_size(Some(&lease(4)), start + Duration::from_secs(2), 8),
            1
        );
    }
}
