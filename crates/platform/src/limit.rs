//! Per-owner rate limits: a token bucket per owner, per replica (runs started, upload forms
//! signed).

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

/// Token buckets keyed by owner.
pub struct PerOwnerLimit {
    limiter: DefaultKeyedRateLimiter<String>,
    clock: DefaultClock,
    /// Checks since the number of owners was last counted (counting locks every shard).
    checks: AtomicU32,
}

/// How many owners are remembered before the idle ones are forgotten.
const MAX_OWNERS: usize = 10_000;
/// The owners are counted once per this many checks: at most this many more than
/// [`MAX_OWNERS`] are remembered between two counts.
const COUNT_EVERY: u32 = 256;

impl PerOwnerLimit {
    /// `per_minute` sustained, up to `burst` at once. Both must be at least 1.
    pub fn new(per_minute: u32, burst: u32) -> Self {
        let per_minute = NonZeroU32::new(per_minute).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
        Self {
            limiter: RateLimiter::keyed(Quota::per_minute(per_minute).allow_burst(burst)),
            clock: DefaultClock::default(),
            checks: AtomicU32::new(0),
        }
    }

    /// `Ok` if `owner` may go on now, else how long to wait.
    pub fn check(&self, owner: &str) -> Result<(), Duration> {
        // Forget owners whose bucket is full again, so memory follows active users only.
        if self
            .checks
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(COUNT_EVERY)
            && self.limiter.len() > MAX_OWNERS
        {
            self.limiter.retain_recent();
        }
        self.limiter
            .check_key(&owner.to_owned())
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_allowed_then_the_owner_waits_and_others_do_not() {
        let limit = PerOwnerLimit::new(60, 2);
        assert!(limit.check("alice").is_ok() && limit.check("alice").is_ok());
        let wait = limit.check("alice").unwrap_err();
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_secs(1),
            "{wait:?}"
        );
        assert!(limit.check("bob").is_ok(), "per owner");
    }
}
