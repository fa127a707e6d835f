//! `GET /api/v1/agent/usage`: what an owner's runs cost and where their time went, summed by
//! day, thread or agent over a window of at most a year.
//!
//! A run counts in the window its end falls in. Its tokens are those its terminal event
//! reported (the worker's OpenAI-compatible backend, or what a remote agent reported), one entry
//! per provider and model; its times run from its acceptance (what its user waited): until its
//! first output (a text message's content or a tool call) and until its end. A caller whose
//! token carries the `switchboard:admin` scope ([`platform::auth::ADMIN_SCOPE`]) may name another
//! owner (`owner=<sub>`) or every owner (`owner=*`, which also allows `groupBy=owner`).

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Duration, NaiveDate, SecondsFormat, Utc};
use platform::auth::Identity;
use platform::http::ErrorResponse;
use protocol::{ErrorCode, ErrorEnvelope};
use serde::Deserialize;

use crate::AppState;
use crate::http::openapi::{UsageByModel, UsageGroupReport, UsageMillis, UsageReport, UsageTokens};
use crate::store::{self, UsageGroup, UsageModel};

/// The longest window.
const MAX_WINDOW_DAYS: i64 = 366;
/// The window when `from` is not given: the last 30 days.
const DEFAULT_WINDOW_DAYS: i64 = 30;
/// Most groups in one answer (the ones with the most tokens; `truncated` says more exist).
const MAX_GROUPS: i64 = 1000;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct UsageQuery {
    from: Option<String>,
    to: Option<String>,
    group_by: Option<String>,
    owner: Option<String>,
}

/// What the usage endpoint refuses.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UsageError {
    /// 400: a parameter is malformed; names it.
    #[error("{message}")]
    Bad {
        field: &'static str,
        message: String,
    },
    /// 403: another owner's usage without the admin scope.
    #[error("reading another owner's usage needs the switchboard:admin scope")]
    NotAdmin,
    /// 500.
    #[error(transparent)]
    Internal(#[from] sqlx::Error),
}

impl IntoResponse for UsageError {
    fn into_response(self) -> Response {
        match self {
            UsageError::Bad { field, message } => ErrorResponse::with_field(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidRequest,
                message,
                field,
            ),
            UsageError::NotAdmin => ErrorResponse::with_field(
                StatusCode::FORBIDDEN,
                ErrorCode::Forbidden,
                self.to_string(),
                "owner",
            ),
            UsageError::Internal(err) => ErrorResponse::internal(&anyhow::Error::from(err)),
        }
        .into_response()
    }
}

fn bad(field: &'static str, message: impl Into<String>) -> UsageError {
    UsageError::Bad {
        field,
        message: message.into(),
    }
}

/// How runs are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupBy {
    Day,
    Thread,
    Agent,
    Owner,
}

impl GroupBy {
    fn as_str(self) -> &'static str {
        match self {
            Self::Day => "day",
            Self::Thread => "thread",
            Self::Agent => "agent",
            Self::Owner => "owner",
        }
    }
}

/// Whose usage: one owner's, or every owner's.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Scope {
    One(String),
    All,
}

/// A validated request.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    group_by: GroupBy,
    scope: Scope,
}

/// `from`/`to`: an RFC 3339 instant, or a UTC day (`YYYY-MM-DD`: `from` its start, `to` its end).
fn instant(raw: &str, field: &'static str, end_of_day: bool) -> Result<DateTime<Utc>, UsageError> {
    if let Ok(at) = DateTime::parse_from_rfc3339(raw) {
        return Ok(at.with_timezone(&Utc));
    }
    let day = NaiveDate::parse_from_str(raw, "%Y-%m-%d").map_err(|_| {
        bad(
            field,
            format!("{field} must be a date (YYYY-MM-DD, UTC) or an RFC 3339 time"),
        )
    })?;
    let day = if end_of_day {
        day.succ_opt()
    } else {
        Some(day)
    };
    day.and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|t| t.and_utc())
        .ok_or_else(|| bad(field, format!("{field} is out of range")))
}

/// The request `query` makes for `caller` at `now`.
fn request(
    query: UsageQuery,
    caller: &Identity,
    now: DateTime<Utc>,
) -> Result<Request, UsageError> {
    let to = match query.to.as_deref() {
        Some(raw) => instant(raw, "to", true)?,
        None => now,
    };
    let from = match query.from.as_deref() {
        Some(raw) => instant(raw, "from", false)?,
        None => (to - Duration::days(DEFAULT_WINDOW_DAYS))
            .date_naive()
            .and_hms_opt(0, 0, 0)
            .map_or(to, |t| t.and_utc()),
    };
    if from >= to {
        return Err(bad("from", "from must be before to"));
    }
    if to - from > Duration::days(MAX_WINDOW_DAYS) {
        return Err(bad(
            "from",
            format!("the window from from to to may be at most {MAX_WINDOW_DAYS} days"),
        ));
    }
    let scope = match query.owner.as_deref() {
        None => Scope::One(caller.owner.as_str().to_owned()),
        Some(owner) if owner == caller.owner.as_str() => Scope::One(owner.to_owned()),
        Some(_) if !caller.admin => return Err(UsageError::NotAdmin),
        Some("*") => Scope::All,
        Some(owner) if owner.is_empty() || owner.len() > platform::auth::MAX_SUB_LEN => {
            return Err(bad(
                "owner",
                "owner must be an owner id (a token's sub) or *",
            ));
        }
        Some(owner) => Scope::One(owner.to_owned()),
    };
    let group_by = match query.group_by.as_deref().unwrap_or("day") {
        "day" => GroupBy::Day,
        "thread" => GroupBy::Thread,
        "agent" => GroupBy::Agent,
        "owner" if scope == Scope::All => GroupBy::Owner,
        "owner" => return Err(bad("groupBy", "groupBy=owner needs owner=*")),
        _ => return Err(bad("groupBy", "groupBy must be day, thread or agent")),
    };
    Ok(Request {
        from,
        to,
        group_by,
        scope,
    })
}

#[utoipa::path(
    get,
    path = "/api/v1/agent/usage",
    tag = "history",
    params(("from" = Option<String>, Query, description = "Start of the window (RFC 3339 or `YYYY-MM-DD`); 30 days before `to` by default."), ("to" = Option<String>, Query, description = "End of the window (exclusive); now by default. At most 366 days after `from`."), ("groupBy" = Option<String>, Query, description = "`day` (default), `thread`, `agent`, or `owner` (with `owner=*`)."), ("owner" = Option<String>, Query, description = "Another owner's `sub`, or `*` for every owner (the `switchboard:admin` scope only).")),
    responses(
        (status = 200, description = "The caller's usage in the window, summed per group.", body = UsageReport),
        (status = 400, description = "A parameter is malformed (`invalid_request`); `field` names it (`from`, `to`, `groupBy`, `owner`).", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
        (status = 403, description = "Another owner's usage without the `switchboard:admin` scope (`forbidden`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn usage(
    State(state): State<AppState>,
    caller: Identity,
    query: Result<Query<UsageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::Json<UsageReport>, UsageError> {
    let Query(query) = query.map_err(|err| bad("query", err.body_text()))?;
    let request = request(query, &caller, Utc::now())?;
    let owner = match &request.scope {
        Scope::One(owner) => Some(owner.as_str()),
        Scope::All => None,
    };
    // Every owner's runs apart, except when grouped by owner (the key is the owner then).
    let split = owner.is_none() && request.group_by != GroupBy::Owner;
    let window = store::UsageWindow {
        owner,
        from: request.from,
        to: request.to,
    };
    let mut groups = store::usage_groups(
        &state.pool,
        &window,
        request.group_by.as_str(),
        split,
        MAX_GROUPS + 1,
    )
    .await?;
    let truncated = groups.len() > usize::try_from(MAX_GROUPS).unwrap_or(usize::MAX);
    groups.truncate(usize::try_from(MAX_GROUPS).unwrap_or(usize::MAX));
    let total = store::usage_groups(&state.pool, &window, "all", false, 1)
        .await?
        .pop();
    let models =
        store::usage_models(&state.pool, &window, request.group_by.as_str(), split).await?;
    let groups = groups
        .iter()
        .map(|group| group_report(group, &models, split))
        .collect();
    let time = |at: DateTime<Utc>| at.to_rfc3339_opts(SecondsFormat::Millis, true);
    Ok(axum::Json(UsageReport {
        owner: owner.map(str::to_owned),
        from: time(request.from),
        to: time(request.to),
        group_by: request.group_by.as_str().to_owned(),
        total: tokens(total.as_ref()),
        groups,
        truncated,
    }))
}

/// Runs and tokens of a group (or of the window: `None` when it has no runs).
fn tokens(group: Option<&UsageGroup>) -> UsageTokens {
    let n = |f: fn(&UsageGroup) -> i64| group.map_or(0, f);
    UsageTokens {
        runs: n(|g| g.runs),
        input_tokens: n(|g| g.input_tokens),
        output_tokens: n(|g| g.output_tokens),
        total_tokens: n(|g| g.total_tokens),
        reasoning_tokens: n(|g| g.reasoning_tokens),
        cached_input_tokens: n(|g| g.cached_input_tokens),
    }
}

/// A group of the answer: its key (and owner, when every owner's runs are apart), its tokens,
/// its times and its tokens by model.
fn group_report(group: &UsageGroup, models: &[UsageModel], split: bool) -> UsageGroupReport {
    let ms = |avg: Option<f64>, p50: Option<f64>, p95: Option<f64>| {
        avg.map(|avg| UsageMillis {
            avg: avg.round(),
            p50: p50.map(f64::round),
            p95: p95.map(f64::round),
        })
    };
    UsageGroupReport {
        owner: split.then(|| group.owner.clone()),
        key: group.key.clone(),
        tokens: tokens(Some(group)),
        time_to_first_token_ms: ms(group.ttft_avg, group.ttft_p50, group.ttft_p95),
        duration_ms: ms(group.duration_avg, group.duration_p50, group.duration_p95),
        models: models
            .iter()
            .filter(|m| m.key == group.key && m.owner == group.owner)
            .map(|m| UsageByModel {
                provider: (!m.provider.is_empty()).then(|| m.provider.clone()),
                model: (!m.model.is_empty()).then(|| m.model.clone()),
                runs: m.runs,
                input_tokens: m.input_tokens,
                output_tokens: m.output_tokens,
                total_tokens: m.total_tokens,
                reasoning_tokens: m.reasoning_tokens,
                cached_input_tokens: m.cached_input_tokens,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use platform::auth::Owner;

    fn caller(admin: bool) -> Identity {
        Identity {
            owner: Owner("alice".to_owned()),
            admin,
        }
    }

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    fn query(pairs: &[(&str, &str)]) -> UsageQuery {
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        };
        UsageQuery {
            from: get("from"),
            to: get("to"),
            group_by: get("groupBy"),
            owner: get("owner"),
        }
    }

    fn field(err: UsageError) -> &'static str {
        match err {
            UsageError::Bad { field, .. } => field,
            UsageError::NotAdmin => "owner (403)",
            UsageError::Internal(_) => "internal",
        }
    }

    #[test]
    fn the_default_is_the_callers_last_thirty_days_by_day() {
        let now = at("2026-11-27T13:00:00Z");
        let r = request(query(&[]), &caller(false), now).unwrap();
        assert_eq!(r.to, now);
        assert_eq!(r.from, at("2026-10-28T00:00:00Z"));
        assert_eq!(r.group_by, GroupBy::Day);
        assert_eq!(r.scope, Scope::One("alice".into()));
    }

    #[test]
    fn days_cover_their_whole_utc_day_and_instants_are_taken_as_they_are() {
        let now = at("2026-11-27T13:00:00Z");
        let r = request(
            query(&[("from", "2026-11-01"), ("to", "2026-11-27")]),
            &caller(false),
            now,
        )
        .unwrap();
        assert_eq!(
            (r.from, r.to),
            (at("2026-11-01T00:00:00Z"), at("2026-11-28T00:00:00Z"))
        );
        let r = request(
            query(&[
                ("from", "2026-11-27T10:00:00+01:00"),
                ("to", "2026-11-27T12:00:00Z"),
            ]),
            &caller(false),
            now,
        )
        .unwrap();
        assert_eq!(r.from, at("2026-11-27T09:00:00Z"));
    }

    #[test]
    fn bad_parameters_are_refused_naming_them() {
        let now = at("2026-11-27T13:00:00Z");
        let refused =
            |pairs: &[(&str, &str)]| field(request(query(pairs), &caller(false), now).unwrap_err());
        assert_eq!(refused(&[("from", "yesterday")]), "from");
        assert_eq!(refused(&[("to", "2026-13-01")]), "to");
        assert_eq!(
            refused(&[("from", "2026-11-28"), ("to", "2026-11-27")]),
            "from"
        );
        assert_eq!(
            refused(&[("from", "2024-01-01"), ("to", "2026-11-27")]),
            "from"
        );
        assert_eq!(refused(&[("groupBy", "week")]), "groupBy");
        assert_eq!(refused(&[("groupBy", "owner")]), "groupBy");
        assert_eq!(refused(&[("owner", "bob")]), "owner (403)");
        assert_eq!(refused(&[("owner", "*")]), "owner (403)");
    }

    #[test]
    fn an_admin_may_name_another_owner_or_all_and_group_by_owner() {
        let now = at("2026-11-27T13:00:00Z");
        let admin = caller(true);
        let r = request(query(&[("owner", "bob")]), &admin, now).unwrap();
        assert_eq!(r.scope, Scope::One("bob".into()));
        let r = request(query(&[("owner", "*"), ("groupBy", "owner")]), &admin, now).unwrap();
        assert_eq!((r.scope, r.group_by), (Scope::All, GroupBy::Owner));
        let r = request(query(&[("owner", "alice")]), &caller(false), now).unwrap();
        assert_eq!(
            r.scope,
            Scope::One("alice".into()),
            "one's own name needs no scope"
        );
    }
}
