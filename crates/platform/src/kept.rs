//! What each owner keeps in history, in bytes, and the budget on it
//! (`SB_RUNS_OWNER_HISTORY_BYTES`): history counts an owner's bytes as its runs end, as threads
//! are forked and erased (its tables `threads.bytes`, `owner_bytes`), and writes the sum under
//! `kept.<owner digest>` in the owner budgets bucket; every runs replica reads it there before it
//! accepts a run, so the budget holds across the fleet. An owner past it gets 403
//! `quota_exceeded` until they delete threads.
//!
//! The sum a replica reads may be a few seconds old ([`KEPT_CACHE_FOR`], and the ingest of the
//! last runs' ends): an owner may pass the budget by the runs that end meanwhile.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use protocol::messaging::short_digest;
use serde::{Deserialize, Serialize};

use crate::nats::JsonKv;

/// How long a runs replica trusts the sum it read for an owner.
pub const KEPT_CACHE_FOR: Duration = Duration::from_secs(1);

/// Owners whose sums a replica remembers at most (then it forgets them all and reads again).
const CACHED_OWNERS: usize = 100_000;

/// The record under [`key`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptRecord {
    /// What the owner keeps in history, in bytes.
    pub bytes: u64,
}

/// The key of `owner`'s record in the owner budgets bucket (erased with the owner's other
/// budget records, `*.<digest>`).
pub fn key(owner: &str) -> String {
    format!("kept.{}", short_digest(owner))
}

/// History's side: tells the runs replicas what `owner` keeps now.
pub async fn report(kv: &JsonKv, owner: &str, bytes: u64) {
    if let Err(err) = kv.put(&key(owner), &KeptRecord { bytes }).await {
        // The next run's end or erasure writes it again.
        tracing::warn!(
            error = format!("{err:#}"),
            "cannot tell what an owner keeps"
        );
    }
}

/// An owner past the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverKept {
    /// What the owner keeps.
    pub kept: u64,
    /// The budget.
    pub max: u64,
}

/// The runs replicas' side: whether an owner may start another run.
pub struct KeptBudget {
    /// The budget in bytes; 0: none.
    max: u64,
    kv: JsonKv,
    cache: Mutex<HashMap<String, (Instant, u64)>>,
}

impl KeptBudget {
    /// A budget of `max` bytes (0: not enforced) read from `kv` (the owner budgets bucket).
    pub fn new(max: u64, kv: JsonKv) -> Self {
        Self {
            max,
            kv,
            cache: Mutex::default(),
        }
    }

    /// `Err` when `owner` keeps `max` bytes or more. A failed read lets the run through (the
    /// budget is not what keeps the service up; the bucket being down is reported elsewhere).
    pub async fn check(&self, owner: &str) -> Result<(), OverKept> {
        if self.max == 0 {
            return Ok(());
        }
        let kept = match self.cached(owner) {
            Some(kept) => kept,
            None => match self.kv.get::<KeptRecord>(&key(owner)).await {
                Ok(record) => {
                    let kept = record.map_or(0, |(record, _)| record.bytes);
                    self.remember(owner, kept);
                    kept
                }
                Err(err) => {
                    tracing::warn!(
                        error = format!("{err:#}"),
                        "cannot read what an owner keeps"
                    );
                    return Ok(());
                }
            },
        };
        if kept >= self.max {
            Err(OverKept {
                kept,
                max: self.max,
            })
        } else {
            Ok(())
        }
    }

    fn cached(&self, owner: &str) -> Option<u64> {
        let cache = self.cache.lock().ok()?;
        let (at, kept) = cache.get(owner)?;
        (at.elapsed() < KEPT_CACHE_FOR).then_some(*kept)
    }

    fn remember(&self, owner: &str, kept: u64) {
        if let Ok(mut cache) = self.cache.lock() {
            if cache.len() >= CACHED_OWNERS {
                cache.clear();
            }
            cache.insert(owner.to_owned(), (Instant::now(), kept));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_per_owner_and_matches_the_erasure_of_an_owners_budget_records() {
        let (alice, bob) = (key("alice"), key("bob"));
        assert_ne!(alice, bob);
        let digest = short_digest("alice");
        // An owner's erasure purges `*.<digest>`: one token, then the digest.
        assert_eq!(alice, format!("kept.{digest}"));
        assert_eq!(alice.split('.').count(), 2);
    }
}
