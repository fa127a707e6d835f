//! Per-owner rate limit on starting runs (a token bucket per owner, per replica).

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

/// Token buckets keyed by owner.
pub(crate) struct PerOwnerLimit {
    limiter: DefaultKeyedRateLimiter<String>,
    clock: DefaultClock,
}

impl PerOwnerLimit {
    /// `per_minute` sustained, up to `burst` at once. Both must be at least 1.
    pub(crate) fn new(per_minute: u32, burst: u32) -> Self {
        let per_minute = NonZeroU32::new(per_minute).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
        Self {
            limiter: RateLimiter::keyed(Quota::per_minute(per_minute).allow_burst(burst)),
            clock: DefaultClock::default(),
        }
    }

    /// `Ok` if `owner` may start a run now, else how long to wait.
    pub(crate) fn check(&self, owner: &str) -> Result<(), Duration> {
        // Forget owners whose bucket is full again, so memory follows active users only.
        if self.limiter.len() > 10_000 {
            self.limiter.retain_recent();
        }
        self.limiter
            .check_key(&owner.to_owned())
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }
}

/// Open streams (SSE responses and WebSockets) per owner, per replica: each holds memory and a
/// socket for as long as the client keeps it, so one owner may not hold more than `max`.
#[derive(Clone)]
pub(crate) struct StreamQuota {
    open: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    max: usize,
}

/// One open stream; released when dropped (the stream ended or the client went away).
pub(crate) struct StreamPermit {
    quota: StreamQuota,
    owner: String,
}

impl StreamQuota {
    /// At most `max` open streams per owner.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            open: std::sync::Arc::default(),
            max,
        }
    }

    /// A permit for one more stream of `owner`, or `None` when the owner holds `max` already.
    pub(crate) fn acquire(&self, owner: &str) -> Option<StreamPermit> {
        let mut open = self.open.lock().ok()?;
        let count = open.entry(owner.to_owned()).or_default();
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(StreamPermit {
            quota: self.clone(),
            owner: owner.to_owned(),
        })
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        if let Ok(mut open) = self.quota.open.lock()
            && let Some(count) = open.get_mut(&self.owner)
        {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.owner);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_holds_at_most_max_streams_and_a_closed_one_frees_its_place() {
        let quota = StreamQuota::new(2);
        let first = quota.acquire("alice");
        let second = quota.acquire("alice");
        assert!(first.is_some() && second.is_some());
        assert!(quota.acquire("alice").is_none(), "a third is refused");
        assert!(quota.acquire("bob").is_some(), "per owner");
        drop(first);
        assert!(
            quota.acquire("alice").is_some(),
            "a closed stream frees its place"
        );
    }
}
