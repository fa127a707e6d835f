//! Per-owner token budgets per UTC day and per UTC month that hold across every replica.
//!
//! The worker charges a run's tokens (every model's, as the run's terminal event reports them)
//! to its owner as the run ends, before the terminal event is published: a client that saw a
//! run end and starts the next one finds the charge there. Each runs replica reads the owner's
//! two records before it accepts a run, and refuses it while either budget is spent. A run is
//! never stopped for its tokens: one that crosses its budget mid-way finishes, the next one is
//! refused (`budget_exceeded`, naming the budget and when it resets).
//!
//! The records live in the `<PREFIX>_OWNER_TOKENS` bucket (`tokens.<owner digest>.d<yyyymmdd>`
//! and `tokens.<owner digest>.m<yyyymm>`), changed only by compare-and-set.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Datelike as _, NaiveDate, Utc};
use protocol::messaging::short_digest;
use serde::{Deserialize, Serialize};

use crate::nats::{Created, JsonKv};

/// An owner's tokens of one day or month, in the bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Used {
    tokens: u64,
}

/// Which budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    /// The UTC day.
    Day,
    /// The UTC month.
    Month,
}

impl fmt::Display for Period {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Day => "day",
            Self::Month => "month",
        })
    }
}

/// An owner's token budgets; `None`: unbounded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenLimits {
    /// Tokens per UTC day.
    pub per_day: Option<u64>,
    /// Tokens per UTC month.
    pub per_month: Option<u64>,
}

impl TokenLimits {
    /// Whether any budget is set.
    pub fn is_bounded(&self) -> bool {
        self.per_day.is_some() || self.per_month.is_some()
    }
}

/// The budgets of every owner: a default, and overrides by owner (`sub`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenBudgets {
    default: TokenLimits,
    overrides: HashMap<String, TokenLimits>,
}

impl TokenBudgets {
    /// The default budgets and the overrides, a JSON object by owner
    /// (`{"alice": {"perDay": 200000, "perMonth": null}}`; a field left out is the default,
    /// `null` is unbounded).
    pub fn new(default: TokenLimits, overrides: Option<&str>) -> Result<Self, String> {
        let mut parsed = HashMap::new();
        if let Some(raw) = overrides.filter(|raw| !raw.trim().is_empty()) {
            let by_owner: HashMap<String, serde_json::Map<String, serde_json::Value>> =
                serde_json::from_str(raw).map_err(|err| {
                    format!("not a JSON object of owners and their budgets: {err}")
                })?;
            for (owner, fields) in by_owner {
                let mut limits = default;
                for (field, value) in fields {
                    let value = match value {
                        serde_json::Value::Null => None,
                        value => Some(value.as_u64().ok_or_else(|| {
                            format!("{owner:?}: {field} must be a whole number of tokens or null")
                        })?),
                    };
                    match field.as_str() {
                        "perDay" => limits.per_day = value,
                        "perMonth" => limits.per_month = value,
                        other => {
                            return Err(format!(
                                "{owner:?}: {other:?} is not a budget; use perDay or perMonth"
                            ));
                        }
                    }
                }
                parsed.insert(owner, limits);
            }
        }
        Ok(Self {
            default,
            overrides: parsed,
        })
    }

    /// Whether any owner has a budget (else nothing is read at admission).
    pub fn any(&self) -> bool {
        self.default.is_bounded() || self.overrides.values().any(TokenLimits::is_bounded)
    }

    /// `owner`'s budgets.
    pub fn of(&self, owner: &str) -> TokenLimits {
        self.overrides.get(owner).copied().unwrap_or(self.default)
    }
}

/// A spent budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverBudget {
    /// Which.
    pub period: Period,
    /// Its tokens.
    pub limit: u64,
    /// The tokens used in it.
    pub used: u64,
    /// Until it starts afresh.
    pub resets_in: Duration,
}

/// The owners' tokens used, shared through the `OWNER_TOKENS` bucket.
#[derive(Clone)]
pub struct TokenLedger {
    kv: JsonKv,
}

fn day_key(owner: &str, day: NaiveDate) -> String {
    format!("tokens.{}.d{}", short_digest(owner), day.format("%Y%m%d"))
}

fn month_key(owner: &str, day: NaiveDate) -> String {
    format!("tokens.{}.m{}", short_digest(owner), day.format("%Y%m"))
}

/// Time from `now` until the UTC day, or month, after it starts.
fn resets_in(period: Period, now: DateTime<Utc>) -> Duration {
    let today = now.date_naive();
    let next = match period {
        Period::Day => today.succ_opt(),
        Period::Month => {
            let (year, month) = if today.month() == 12 {
                (today.year() + 1, 1)
            } else {
                (today.year(), today.month() + 1)
            };
            NaiveDate::from_ymd_opt(year, month, 1)
        }
    };
    next.and_then(|d| d.and_hms_opt(0, 0, 0))
        .and_then(|t| (t.and_utc() - now).to_std().ok())
        .unwrap_or(Duration::from_secs(1))
        .max(Duration::from_secs(1))
}

/// The first budget of `limits` that `day` and `month` tokens have spent.
fn spent(limits: TokenLimits, day: u64, month: u64, now: DateTime<Utc>) -> Option<OverBudget> {
    let over = |period, limit: Option<u64>, used: u64| {
        limit
            .filter(|limit| used >= *limit)
            .map(|limit| OverBudget {
                period,
                limit,
                used,
                resets_in: resets_in(period, now),
            })
    };
    // The month first: when both are spent, the later reset is the one that matters.
    over(Period::Month, limits.per_month, month).or_else(|| over(Period::Day, limits.per_day, day))
}

impl TokenLedger {
    /// A ledger kept in `kv` (the `OWNER_TOKENS` bucket).
    pub fn new(kv: JsonKv) -> Self {
        Self { kv }
    }

    /// Adds `tokens` to `owner`'s day and month of `now`. Fails only when NATS does.
    pub async fn charge(&self, owner: &str, tokens: u64, now: DateTime<Utc>) -> anyhow::Result<()> {
        if tokens == 0 {
            return Ok(());
        }
        let day = now.date_naive();
        let (day, month) = (day_key(owner, day), month_key(owner, day));
        let (a, b) = tokio::join!(self.add(&day, tokens), self.add(&month, tokens));
        a.and(b)
    }

    /// The tokens `owner` used on the day and in the month of `now`.
    pub async fn used(&self, owner: &str, now: DateTime<Utc>) -> anyhow::Result<(u64, u64)> {
        let day = now.date_naive();
        let (day, month) = (day_key(owner, day), month_key(owner, day));
        let (d, m) = tokio::join!(self.kv.get::<Used>(&day), self.kv.get::<Used>(&month));
        let tokens = |found: Option<(Used, u64)>| found.map_or(0, |(used, _)| used.tokens);
        Ok((tokens(d?), tokens(m?)))
    }

    /// Whether `owner` may start a run at `now` under `limits`: the first spent budget if not.
    /// Reads nothing when `limits` bound nothing. Fails only when NATS does.
    pub async fn check(
        &self,
        owner: &str,
        limits: TokenLimits,
        now: DateTime<Utc>,
    ) -> anyhow::Result<Result<(), OverBudget>> {
        if !limits.is_bounded() {
            return Ok(Ok(()));
        }
        let (day, month) = self.used(owner, now).await?;
        Ok(spent(limits, day, month, now).map_or(Ok(()), Err))
    }

    async fn add(&self, key: &str, tokens: u64) -> anyhow::Result<()> {
        let mut round = 0;
        loop {
            let read = self.kv.get_for_round::<Used>(key, round).await?;
            round += 1;
            match read {
                None => {
                    if let Created::Created(_) = self.kv.create(key, &Used { tokens }).await? {
                        return Ok(());
                    }
                }
                Some((used, revision)) => {
                    let next = Used {
                        tokens: used.tokens.saturating_add(tokens),
                    };
                    if self.kv.update(key, &next, revision).await?.is_some() {
                        return Ok(());
                    }
                }
            }
            // Another worker charged meanwhile: read again (from the leader).
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn a_budget_is_spent_once_its_tokens_are_used_and_the_month_is_named_first() {
        let now = at("2026-11-27T23:00:00Z");
        let limits = TokenLimits {
            per_day: Some(100),
            per_month: Some(1000),
        };
        assert_eq!(spent(limits, 99, 500, now), None);
        let day = spent(limits, 100, 500, now).unwrap();
        assert_eq!((day.period, day.limit, day.used), (Period::Day, 100, 100));
        assert_eq!(day.resets_in, Duration::from_secs(3600));
        let month = spent(limits, 150, 1000, now).unwrap();
        assert_eq!(month.period, Period::Month);
        assert_eq!(month.resets_in, Duration::from_secs(3 * 24 * 3600 + 3600));
        assert_eq!(spent(TokenLimits::default(), u64::MAX, u64::MAX, now), None);
    }

    #[test]
    fn a_month_resets_on_the_first_of_the_next_and_december_rolls_the_year() {
        let now = at("2026-12-31T12:00:00Z");
        assert_eq!(
            resets_in(Period::Month, now),
            Duration::from_secs(12 * 3600)
        );
        assert_eq!(resets_in(Period::Day, now), Duration::from_secs(12 * 3600));
    }

    #[test]
    fn keys_name_the_owner_by_digest_and_the_period() {
        let day = NaiveDate::from_ymd_opt(2026, 11, 27).unwrap();
        let key = day_key("alice", day);
        assert!(
            key.starts_with("tokens.") && key.ends_with(".d20261127"),
            "{key}"
        );
        assert!(!key.contains("alice"));
        assert!(month_key("alice", day).ends_with(".m202611"));
    }

    #[test]
    fn overrides_replace_the_fields_they_name_and_keep_the_default_of_the_others() {
        let default = TokenLimits {
            per_day: Some(100),
            per_month: Some(1000),
        };
        let budgets = TokenBudgets::new(
            default,
            Some(r#"{"bob": {"perDay": 5}, "carol": {"perDay": null, "perMonth": null}}"#),
        )
        .unwrap();
        assert_eq!(budgets.of("alice"), default);
        assert_eq!(
            budgets.of("bob"),
            TokenLimits {
                per_day: Some(5),
                per_month: Some(1000)
            }
        );
        assert!(!budgets.of("carol").is_bounded());
        assert!(budgets.any());
        assert!(
            !TokenBudgets::new(TokenLimits::default(), None)
                .unwrap()
                .any()
        );
    }

    #[test]
    fn bad_overrides_are_refused_naming_the_owner_and_field() {
        let none = TokenLimits::default();
        let err = TokenBudgets::new(none, Some(r#"{"bob": {"perWeek": 5}}"#)).unwrap_err();
        assert!(err.contains("\"bob\"") && err.contains("perWeek"), "{err}");
        let err = TokenBudgets::new(none, Some(r#"{"bob": {"perDay": -1}}"#)).unwrap_err();
        assert!(err.contains("perDay"), "{err}");
        assert!(TokenBudgets::new(none, Some("[1]")).is_err());
    }
}
