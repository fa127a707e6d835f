//! The refusals of the runs service's per-owner budgets: bytes of accepted runs per UTC day
//! (`SB_RUNS_OWNER_BYTES_PER_DAY`, [`platform::budget::DailyBudget`] of kind `bytes`), and the
//! tokens of runs per UTC day and month ([`platform::tokens`]).

pub(crate) use platform::budget::Exhausted;

/// The refusal's message: names the budget, its setting and when it resets.
pub(crate) fn refusal(exhausted: &Exhausted) -> String {
    format!(
        "the bytes of runs you may start per day ({} bytes, SB_RUNS_OWNER_BYTES_PER_DAY) are spent; \
         the budget resets at 00:00 UTC, in {} s",
        exhausted.per_day,
        exhausted.resets_in.as_secs().max(1)
    )
}

/// The refusal of a run whose owner's tokens of the day or month are spent: names the budget,
/// what was used, and when it resets.
pub(crate) fn tokens_refusal(over: &platform::tokens::OverBudget) -> String {
    use platform::tokens::Period;
    let (setting, reset) = match over.period {
        Period::Day => ("SB_RUNS_OWNER_TOKENS_PER_DAY", "00:00 UTC"),
        Period::Month => ("SB_RUNS_OWNER_TOKENS_PER_MONTH", "00:00 UTC on the 1st"),
    };
    format!(
        "your token budget per {} ({} tokens, {setting}) is spent: {} used; \
         the budget resets at {reset}, in {} s",
        over.period,
        over.limit,
        over.used,
        over.resets_in.as_secs().max(1)
    )
}

/// The refusal of a run whose owner keeps the most bytes in history they may.
pub(crate) fn kept_refusal(over: &platform::kept::OverKept) -> String {
    format!(
        "your conversations keep {} bytes, at least the {} bytes you may keep \
         (SB_RUNS_OWNER_HISTORY_BYTES); delete threads to start new runs",
        over.kept, over.max
    )
}

/// How long a client is told to wait when it has the most runs queued or running.
pub(crate) const ACTIVE_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// The refusal of a run whose owner has the most runs queued or running it may.
pub(crate) fn active_refusal(full: &platform::owner_set::Full) -> String {
    format!(
        "you have {} runs queued or running, the most you may (SB_RUNS_MAX_ACTIVE_PER_OWNER); \
         start more as they end",
        full.max
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use platform::tokens::{OverBudget, Period};
    use std::time::Duration;

    #[test]
    fn a_history_refusal_names_the_budget_what_is_kept_and_the_way_out() {
        let message = kept_refusal(&platform::kept::OverKept {
            kept: 2048,
            max: 1024,
        });
        for part in [
            "2048 bytes",
            "1024 bytes",
            "SB_RUNS_OWNER_HISTORY_BYTES",
            "delete threads",
        ] {
            assert!(message.contains(part), "{message}");
        }
    }

    #[test]
    fn a_token_refusal_names_the_budget_its_use_and_its_reset() {
        let message = tokens_refusal(&OverBudget {
            period: Period::Month,
            limit: 1000,
            used: 1234,
            resets_in: Duration::from_secs(90),
        });
        assert_eq!(
            message,
            "your token budget per month (1000 tokens, SB_RUNS_OWNER_TOKENS_PER_MONTH) is spent: \
             1234 used; the budget resets at 00:00 UTC on the 1st, in 90 s"
        );
    }
}
