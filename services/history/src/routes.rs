//! HTTP routes of the history service.

use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::routing::get;
use chrono::{DateTime, NaiveDate, SecondsFormat, Utc};
use platform::auth::Owner;
use platform::http::ErrorResponse;
use protocol::ErrorCode;
use protocol::history::{
    HistoryAgentMessage, HistoryMessage, HistoryScope, HistorySnapshotResponse, HistoryUserMessage,
};
use serde::Deserialize;

use crate::AppState;
use crate::store;

/// Longest thread id accepted in a query.
const MAX_THREAD_ID_CHARS: usize = 128;

pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/api/v1/agent/history", get(history))
        .route("/api/v1/agent/threads", get(threads))
        .with_state(state)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct HistoryQuery {
    thread_id: Option<String>,
    before: Option<String>,
    tz: Option<String>,
}

fn internal(err: sqlx::Error) -> ErrorResponse {
    ErrorResponse::internal(&anyhow::Error::new(err))
}

/// `GET /api/v1/agent/history`: the latest day with messages (before `before`, if given).
async fn history(
    State(state): State<AppState>,
    owner: Owner,
    query: Result<Query<HistoryQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::Json<HistorySnapshotResponse>, ErrorResponse> {
    let Query(query) = query.map_err(|err| {
        ErrorResponse::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidRequest,
            err.body_text(),
        )
    })?;
    let before = query
        .before
        .as_deref()
        .map(|raw| {
            NaiveDate::parse_from_str(raw, "%Y-%m-%d")
                .ok()
                .filter(|_| raw.len() == 10)
                .ok_or_else(|| {
                    ErrorResponse::with_field(
                        StatusCode::BAD_REQUEST,
                        ErrorCode::InvalidRequest,
                        "before must be a date in the form YYYY-MM-DD",
                        "before",
                    )
                })
        })
        .transpose()?;
    let tz = match query.tz {
        None => "UTC".to_owned(),
        Some(tz) if state.time_zones.contains(&tz) => tz,
        Some(_) => {
            return Err(ErrorResponse::with_field(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidRequest,
                "tz must be an IANA time zone name such as Europe/Berlin",
                "tz",
            ));
        }
    };
    let pool = &state.pool;
    let thread_id = match query.thread_id {
        Some(thread_id) => {
            if thread_id.is_empty() || thread_id.chars().count() > MAX_THREAD_ID_CHARS {
                return Err(ErrorResponse::with_field(
                    StatusCode::BAD_REQUEST,
                    ErrorCode::InvalidRequest,
                    "threadId must be 1 to 128 characters",
                    "threadId",
                ));
            }
            if !store::thread_exists(pool, owner.as_str(), &thread_id)
                .await
                .map_err(internal)?
            {
                return Err(ErrorResponse::not_found("thread"));
            }
            thread_id
        }
        None => match store::latest_thread(pool, owner.as_str())
            .await
            .map_err(internal)?
        {
            Some(thread_id) => thread_id,
            None => return Ok(axum::Json(empty(None))),
        },
    };
    // Day boundaries are those of the caller's IANA time zone (UTC unless given); PostgreSQL's
    // time zone database does the arithmetic, daylight-saving days included.
    let Some(day) = store::latest_day_before(pool, owner.as_str(), &thread_id, before, &tz)
        .await
        .map_err(internal)?
    else {
        return Ok(axum::Json(empty(Some(thread_id))));
    };
    let (from, to) = store::day_bounds(pool, day, &tz).await.map_err(internal)?;
    let rows = store::messages_between(pool, owner.as_str(), &thread_id, from, to)
        .await
        .map_err(internal)?;
    let has_more = store::has_messages_before(pool, owner.as_str(), &thread_id, from)
        .await
        .map_err(internal)?;
    // One signing request for the whole day: the first attachment of each user message.
    let wanted: Vec<(usize, String)> = rows
        .iter()
        .enumerate()
        .filter(|(_, row)| row.role == "user")
        .filter_map(|(i, row)| attachment_url(&row.metadata).map(|url| (i, url)))
        .collect();
    let signed = state
        .signer
        .sign(
            owner.as_str(),
            wanted.iter().map(|(_, url)| url.clone()).collect(),
        )
        .await;
    let mut urls = vec![None; rows.len()];
    for ((i, _), url) in wanted.into_iter().zip(signed) {
        urls[i] = url;
    }
    Ok(axum::Json(HistorySnapshotResponse {
        scope: HistoryScope::HistoryDay,
        thread_id: Some(thread_id),
        day: Some(day.format("%Y-%m-%d").to_string()),
        has_more,
        messages: rows
            .into_iter()
            .zip(urls)
            .map(|(row, url)| to_history_message(row, url))
            .collect(),
    }))
}

fn empty(thread_id: Option<String>) -> HistorySnapshotResponse {
    HistorySnapshotResponse {
        scope: HistoryScope::HistoryDay,
        thread_id,
        day: None,
        has_more: false,
        messages: Vec::new(),
    }
}

fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// `s3://bucket/path` of a user message's (first) attachment, from its stored metadata.
fn attachment_url(metadata: &serde_json::Value) -> Option<String> {
    let attachment = metadata.get("user_message_attachments")?;
    let bucket = attachment.get("bucket")?.as_str()?;
    let path = attachment.get("path")?.as_str()?;
    Some(format!("s3://{bucket}/{path}"))
}

fn to_history_message(row: store::MessageRow, url: Option<String>) -> HistoryMessage {
    match row.role.as_str() {
        "user" => HistoryMessage::User(HistoryUserMessage {
            id: row.message_id,
            seq: row.seq,
            content: row.content,
            url,
            timestamp: timestamp(row.created_at),
        }),
        role => {
            let message = HistoryAgentMessage {
                id: row.message_id,
                seq: row.seq,
                content: row.content,
                ui_schema: None,
                timestamp: timestamp(row.created_at),
            };
            if role == "tool" {
                HistoryMessage::Tool(message)
            } else {
                HistoryMessage::Assistant(message)
            }
        }
    }
}

#[derive(Debug, Deserialize)]
struct ThreadsQuery {
    cursor: Option<String>,
    limit: Option<String>,
}

/// Most threads in one page, and the default.
const MAX_THREADS_PAGE: i64 = 100;
const DEFAULT_THREADS_PAGE: i64 = 20;

/// `GET /api/v1/agent/threads?cursor=&limit=`: the caller's threads, most recent first.
async fn threads(
    State(state): State<AppState>,
    owner: Owner,
    Query(query): Query<ThreadsQuery>,
) -> Result<axum::Json<serde_json::Value>, ErrorResponse> {
    let limit = match query.limit.as_deref() {
        None => DEFAULT_THREADS_PAGE,
        Some(raw) => raw
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=MAX_THREADS_PAGE).contains(n))
            .ok_or_else(|| {
                ErrorResponse::with_field(
                    StatusCode::BAD_REQUEST,
                    ErrorCode::InvalidRequest,
                    "limit must be an integer from 1 to 100",
                    "limit",
                )
            })?,
    };
    let after = query
        .cursor
        .as_deref()
        .map(|raw| {
            decode_cursor(raw).ok_or_else(|| {
                ErrorResponse::with_field(
                    StatusCode::BAD_REQUEST,
                    ErrorCode::InvalidRequest,
                    "cursor is not one this endpoint returned",
                    "cursor",
                )
            })
        })
        .transpose()?;
    let mut rows = store::threads(&state.pool, owner.as_str(), after, limit + 1)
        .await
        .map_err(internal)?;
    let more = rows.len() as i64 > limit;
    rows.truncate(usize::try_from(limit).unwrap_or_default());
    let next = more
        .then(|| {
            rows.last()
                .map(|r| encode_cursor(r.updated_at, &r.thread_id))
        })
        .flatten();
    let threads: Vec<serde_json::Value> = rows
        .into_iter()
        .map(|r| {
            serde_json::json!({
                "threadId": r.thread_id,
                "messageCount": r.last_seq,
                "createdAt": timestamp(r.created_at),
                "updatedAt": timestamp(r.updated_at),
            })
        })
        .collect();
    Ok(axum::Json(
        serde_json::json!({"threads": threads, "nextCursor": next}),
    ))
}

/// An opaque cursor: the position of the last thread of a page.
fn encode_cursor(at: DateTime<Utc>, thread_id: &str) -> String {
    let raw = serde_json::json!([at.timestamp_micros(), thread_id]).to_string();
    hex::encode(raw)
}

fn decode_cursor(raw: &str) -> Option<(DateTime<Utc>, String)> {
    let bytes = hex::decode(raw).ok()?;
    let (micros, thread_id): (i64, String) = serde_json::from_slice(&bytes).ok()?;
    Some((DateTime::from_timestamp_micros(micros)?, thread_id))
}
