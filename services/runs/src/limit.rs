//! Per-owner limits of the runs service: open event streams ([`StreamQuota`]), and the rates of
//! requests that cost far more than they carry ([`Throttle`]): run lookups (status, cancel,
//! events, WebSocket reconnects; each a STREAM.INFO and a history lookup that may wait 2 s,
//! finding L6 of the security review) and compatibility checks (CPU, finding H2). A refusal
//! names its budget and when to retry. Like the rate of runs started, each holds across the
//! fleet ([`platform::limit::OwnerRate`]); open streams are counted per replica.

use std::time::Duration;

use platform::config::{ConfigError, Env};
use platform::limit::OwnerRate;
use platform::nats::JsonKv;

/// The rate of run lookups (`SB_RUNS_LOOKUP_RATE_PER_MINUTE`, `SB_RUNS_LOOKUP_RATE_BURST`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupRate {
    /// Lookups per owner per minute, across the fleet (`SB_RUNS_LOOKUP_RATE_PER_MINUTE`, 600).
    pub per_minute: u32,
    /// Lookups per owner at once (`SB_RUNS_LOOKUP_RATE_BURST`, 120).
    pub burst: u32,
}

impl Default for LookupRate {
    /// Generous: a client polling the status of several runs every second, a page reopening
    /// its streams after a network change.
    fn default() -> Self {
        Self {
            per_minute: 600,
            burst: 120,
        }
    }
}

impl LookupRate {
    /// Reads the settings, failing naming the variable.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        let defaults = Self::default();
        Ok(Self {
            per_minute: env.positive(PER_MINUTE_VARIABLE, defaults.per_minute)?,
            burst: env.positive(BURST_VARIABLE, defaults.burst)?,
        })
    }
}

const PER_MINUTE_VARIABLE: &str = "SB_RUNS_LOOKUP_RATE_PER_MINUTE";
const BURST_VARIABLE: &str = "SB_RUNS_LOOKUP_RATE_BURST";

/// Compatibility checks per owner per minute, across the fleet (fixed: a client asks once per pair of
/// agents it wires, and each check may cost ~50 ms of CPU, parse included).
pub(crate) const COMPATIBILITY_PER_MINUTE: u32 = 30;
/// Burst of the same: a page comparing a few pairs at once.
pub(crate) const COMPATIBILITY_BURST: u32 = 10;

/// What the refusals of the two rates call what they count.
const LOOKUPS: &str = "run lookups (status, cancel, events and WebSocket reconnects)";
const COMPATIBILITY: &str = "compatibility checks";

/// One per-owner rate, with what its refusal says.
pub(crate) struct Throttle {
    limit: OwnerRate,
    /// What is counted, plural (`run lookups (...)`).
    what: &'static str,
    per_minute: u32,
    burst: u32,
    /// The variables that set it, if any.
    settings: Option<(&'static str, &'static str)>,
}

/// A request refused by a [`Throttle`] (429 with `Retry-After`), naming the budget.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "too many {what}: at most {per_minute} a minute per owner, in bursts of {burst}{}; retry in {} s",
    .settings.map(|(rate, burst)| format!(" ({rate}, {burst})")).unwrap_or_default(),
    retry_secs(*.wait)
)]
pub(crate) struct Throttled {
    what: &'static str,
    per_minute: u32,
    burst: u32,
    settings: Option<(&'static str, &'static str)>,
    /// How long until the next request would be taken.
    pub(crate) wait: Duration,
}

/// Why a [`Throttle`] did not let a request through.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    /// 429: past the owner's rate.
    #[error(transparent)]
    Throttled(#[from] Throttled),
    /// 503: the rate's record could not be read or written.
    #[error("the rate limit cannot be checked: {0:#}")]
    Unavailable(anyhow::Error),
}

/// Whole seconds to wait, rounded up, at least 1 (what `Retry-After` says).
fn retry_secs(wait: Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

impl Throttle {
    /// Run lookups: status, cancel, events and WebSocket reconnects.
    pub(crate) fn lookups(rate: LookupRate, budgets: JsonKv) -> Self {
        Self {
            limit: OwnerRate::new("lookups", rate.per_minute, rate.burst, budgets),
            what: LOOKUPS,
            per_minute: rate.per_minute,
            burst: rate.burst,
            settings: Some((PER_MINUTE_VARIABLE, BURST_VARIABLE)),
        }
    }

    /// `POST /api/v1/agents/compatibility`.
    pub(crate) fn compatibility(budgets: JsonKv) -> Self {
        Self {
            limit: OwnerRate::new(
                "compatibility",
                COMPATIBILITY_PER_MINUTE,
                COMPATIBILITY_BURST,
                budgets,
            ),
            what: COMPATIBILITY,
            per_minute: COMPATIBILITY_PER_MINUTE,
            burst: COMPATIBILITY_BURST,
            settings: None,
        }
    }

    /// `Ok` if `owner` may make one more request now.
    pub(crate) async fn check(&self, owner: &str) -> Result<(), Refusal> {
        self.limit
            .check(owner)
            .await
            .map_err(Refusal::Unavailable)?
            .map_err(|wait| self.refusal(wait))?;
        Ok(())
    }

    /// The refusal of a request that may come again after `wait`.
    fn refusal(&self, wait: Duration) -> Throttled {
        Throttled {
            what: self.what,
            per_minute: self.per_minute,
            burst: self.burst,
            settings: self.settings,
            wait,
        }
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
    _open: platform::metrics::GaugeGuard,
}

impl StreamQuota {
    /// At most `max` open streams per owner.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            open: std::sync::Arc::default(),
            max,
        }
    }

    /// A permit for one more stream of `owner` over `transport` (`sse`, `websocket`: the label
    /// of `switchboard_open_streams`), or `None` when the owner holds `max` already.
    pub(crate) fn acquire(&self, owner: &str, transport: &'static str) -> Option<StreamPermit> {
        let mut open = self.open.lock().ok()?;
        let count = open.entry(owner.to_owned()).or_default();
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(StreamPermit {
            quota: self.clone(),
            owner: owner.to_owned(),
            _open: platform::metrics::GaugeGuard::new(metrics::gauge!(
                "switchboard_open_streams",
                "transport" => transport
            )),
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
    fn a_refusal_names_the_budget_its_variables_and_when_to_retry() {
        let lookups = Throttled {
            what: LOOKUPS,
            per_minute: 60,
            burst: 2,
            settings: Some((PER_MINUTE_VARIABLE, BURST_VARIABLE)),
            wait: Duration::from_millis(400),
        };
        assert_eq!(
            lookups.to_string(),
            "too many run lookups (status, cancel, events and WebSocket reconnects): at most 60 a \
             minute per owner, in bursts of 2 (SB_RUNS_LOOKUP_RATE_PER_MINUTE, \
             SB_RUNS_LOOKUP_RATE_BURST); retry in 1 s"
        );
        let compatibility = Throttled {
            what: COMPATIBILITY,
            per_minute: COMPATIBILITY_PER_MINUTE,
            burst: COMPATIBILITY_BURST,
            settings: None,
            wait: Duration::from_millis(1500),
        };
        assert_eq!(
            compatibility.to_string(),
            "too many compatibility checks: at most 30 a minute per owner, in bursts of 10; \
             retry in 2 s"
        );
    }

    #[test]
    fn the_lookup_rate_is_read_from_its_variables_and_refuses_zero_naming_it() {
        assert_eq!(
            LookupRate::from_env(&Env::from_pairs::<_, &str, &str>([])).unwrap(),
            LookupRate::default()
        );
        let set = Env::from_pairs([
            ("SB_RUNS_LOOKUP_RATE_PER_MINUTE", "5"),
            ("SB_RUNS_LOOKUP_RATE_BURST", "3"),
        ]);
        assert_eq!(
            LookupRate::from_env(&set).unwrap(),
            LookupRate {
                per_minute: 5,
                burst: 3
            }
        );
        let zero = Env::from_pairs([("SB_RUNS_LOOKUP_RATE_BURST", "0")]);
        assert!(
            LookupRate::from_env(&zero)
                .unwrap_err()
                .to_string()
                .contains("SB_RUNS_LOOKUP_RATE_BURST"),
        );
    }

    #[test]
    fn an_owner_holds_at_most_max_streams_and_a_closed_one_frees_its_place() {
        let quota = StreamQuota::new(2);
        let first = quota.acquire("alice", "sse");
        let second = quota.acquire("alice", "sse");
        assert!(first.is_some() && second.is_some());
        assert!(
            quota.acquire("alice", "sse").is_none(),
            "a third is refused"
        );
        assert!(quota.acquire("bob", "sse").is_some(), "per owner");
        drop(first);
        assert!(
            quota.acquire("alice", "sse").is_some(),
            "a closed stream frees its place"
        );
    }
}
