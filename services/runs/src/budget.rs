//! The runs service's per-owner budget of bytes of accepted runs per UTC day
//! (`SB_RUNS_OWNER_BYTES_PER_DAY`, [`platform::budget::DailyBudget`] of kind `bytes`): its
//! refusal.

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
