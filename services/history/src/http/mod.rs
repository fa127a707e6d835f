//! HTTP routes of the history service.

pub(crate) mod openapi;
pub(crate) mod usage;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, NaiveDate, SecondsFormat, Utc};
use platform::auth::Owner;
use platform::http::ErrorResponse;
use platform::openapi::{Endpoint, Verb};
use protocol::agents::StoredMessage;
use protocol::file_types;
use protocol::history::{
    BlockHistoryResponse, BlockMessage, BodyHistoryResponse, BodyMessage, HistoryAgentMessage,
    HistoryMessage, HistoryScope, HistorySnapshotResponse, HistoryUserMessage,
    SessionHistoryResponse, SessionMessage,
};
use protocol::metadata::{AgentChatMessageMetadata as Metadata, AttachedFile};
use protocol::threads::ThreadSummary;
use protocol::ui_schema::compile_stored;
use protocol::{ErrorCode, ErrorEnvelope};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::AppState;
use crate::http::openapi::{ThreadHit, ThreadList, ThreadSearch, Threads};
use crate::search::{self, SearchQuery};
use crate::store::{self, Role};

/// Longest thread id accepted in a query.
const MAX_THREAD_ID_CHARS: usize = 128;
/// Most messages in one answer of a day endpoint, and the default `limit`.
const DAY_PAGE_MESSAGES: i64 = 200;
/// Most bytes of messages in one answer of a day endpoint (its `messages` array as JSON),
/// unless a page's one message is larger by itself.
const DAY_PAGE_BYTES: usize = 4 * 1024 * 1024;

/// Every route of the service: the router is built from this table, and the system tests
/// compare it with the OpenAPI document the service serves ([`crate::http::openapi`]).
pub(crate) fn endpoints() -> Vec<Endpoint<AppState>> {
    vec![
        Endpoint::new(Verb::Get, "/api/v1/agent/history", history),
        Endpoint::new(Verb::Get, "/api/v1/agent/history/blocks", history_blocks),
        Endpoint::new(Verb::Get, "/api/v1/agent/history/bodies", history_bodies),
        Endpoint::new(Verb::Get, "/v2/history", session_history),
        Endpoint::new(Verb::Get, "/api/v1/agent/threads", threads),
        Endpoint::new(Verb::Get, "/api/v1/agent/usage", crate::http::usage::usage),
        Endpoint::new(Verb::Get, "/openapi.json", crate::http::openapi::serve),
    ]
}

pub(crate) fn router(state: AppState) -> Router {
    platform::openapi::router(endpoints()).with_state(state)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct HistoryQuery {
    thread_id: Option<String>,
    before: Option<String>,
    tz: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

impl HistoryQuery {
    fn day(self) -> DayRequest {
        DayRequest {
            thread: self.thread_id,
            thread_field: "threadId",
            before: self.before,
            tz: self.tz,
            limit: self.limit,
            cursor: self.cursor,
        }
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct SessionHistoryQuery {
    session_id: Option<String>,
    before: Option<String>,
    tz: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

/// The parameters of a day request, whichever the shape; `thread_field` names the thread
/// parameter in errors.
struct DayRequest {
    thread: Option<String>,
    thread_field: &'static str,
    before: Option<String>,
    tz: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

/// Errors of the history API; each variant's doc names its status. Its message is the one the
/// answer carries (a 5xx aside: logged with its cause chain, answered opaquely).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    /// 400: the query string does not parse (axum's words).
    #[error("{0}")]
    BadQuery(String),
    /// 400: `before` is not a date in the form YYYY-MM-DD.
    #[error("before must be a date in the form YYYY-MM-DD")]
    BadDate,
    /// 400: `tz` is not a time zone name PostgreSQL knows.
    #[error("tz must be an IANA time zone name such as Europe/Berlin")]
    BadTimeZone,
    /// 400: the thread parameter (named) is empty or too long.
    #[error("{0} must be 1 to 128 characters")]
    BadThreadId(&'static str),
    /// 400: `limit` is not an integer from 1 to the endpoint's most (given).
    #[error("limit must be an integer from 1 to {0}")]
    BadLimit(i64),
    /// 400: `cursor` is not one this endpoint returned.
    #[error("cursor is not one this endpoint returned")]
    BadCursor,
    /// 400: `q` is empty, too long or has nothing to look for.
    #[error(transparent)]
    BadSearch(#[from] search::QueryError),
    /// 404: the caller has no thread with this id.
    #[error("thread not found")]
    ThreadNotFound,
    /// 500: something failed on our side.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl From<sqlx::Error> for ApiError {
    fn from(err: sqlx::Error) -> Self {
        ApiError::Internal(err.into())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let field = match &self {
            ApiError::BadQuery(message) => {
                return ErrorResponse::new(
                    StatusCode::BAD_REQUEST,
                    ErrorCode::InvalidRequest,
                    message.as_str(),
                )
                .into_response();
            }
            ApiError::BadDate => "before",
            ApiError::BadTimeZone => "tz",
            ApiError::BadThreadId(field) => field,
            ApiError::BadLimit(_) => "limit",
            ApiError::BadCursor => "cursor",
            ApiError::BadSearch(_) => "q",
            ApiError::ThreadNotFound => return ErrorResponse::not_found("thread").into_response(),
            ApiError::Internal(err) => return ErrorResponse::internal(err).into_response(),
        };
        ErrorResponse::with_field(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidRequest,
            self.to_string(),
            field,
        )
        .into_response()
    }
}

pub(crate) type QueryResult<T> = Result<Query<T>, axum::extract::rejection::QueryRejection>;

fn query<T>(query: QueryResult<T>) -> Result<T, ApiError> {
    query
        .map(|Query(q)| q)
        .map_err(|err| ApiError::BadQuery(err.body_text()))
}

/// The page of a day a snapshot shows: which thread, which day (in which time zone), the rows'
/// `seq`s, whether the day goes on before them and whether earlier days have messages.
struct Day {
    thread_id: Option<String>,
    day: Option<NaiveDate>,
    tz: String,
    seqs: Vec<i64>,
    more_in_day: bool,
    earlier_days: bool,
}

/// What one answer shows of its day: the messages kept within [`DAY_PAGE_BYTES`], `hasMore`,
/// and the cursor that continues the day.
struct Page<T> {
    messages: Vec<T>,
    has_more: bool,
    next_cursor: Option<String>,
}

/// The thread, day and page of messages one snapshot shows, from the parameters of any of the
/// four day endpoints.
///
/// A page starts at the newest end: without a cursor, the day's latest messages (at most
/// `limit`, and at most [`DAY_PAGE_BYTES`] of text and metadata as the database measures them);
/// with one, those before its position. So a client that ignores the cursor still sees a
/// coherent page, the latest part of the day, and `hasMore` true. Only the rows of the page
/// are read (SQL `LIMIT`, the byte bound applied by the database), never the whole day.
async fn select_day(
    state: &AppState,
    owner: &Owner,
    request: DayRequest,
) -> Result<(Day, Vec<store::MessageRow>), ApiError> {
    let before = request
        .before
        .as_deref()
        .map(|raw| {
            NaiveDate::parse_from_str(raw, "%Y-%m-%d")
                .ok()
                .filter(|_| raw.len() == 10)
                .ok_or(ApiError::BadDate)
        })
        .transpose()?;
    let tz = match request.tz {
        None => "UTC".to_owned(),
        Some(tz) if state.time_zones.contains(&tz) => tz,
        Some(_) => return Err(ApiError::BadTimeZone),
    };
    let limit = parse_limit(
        request.limit.as_deref(),
        DAY_PAGE_MESSAGES,
        DAY_PAGE_MESSAGES,
    )?;
    let cursor = request
        .cursor
        .as_deref()
        .map(|raw| DayCursor::decode(raw, &state.time_zones).ok_or(ApiError::BadCursor))
        .transpose()?;
    if let Some(thread_id) = &request.thread {
        if thread_id.is_empty() || thread_id.chars().count() > MAX_THREAD_ID_CHARS {
            return Err(ApiError::BadThreadId(request.thread_field));
        }
        if cursor.as_ref().is_some_and(|c| &c.thread_id != thread_id) {
            return Err(ApiError::BadCursor); // a cursor continues its own thread only
        }
    }
    let pool = &state.pool;
    let nothing = |thread_id, tz| Day {
        thread_id,
        day: None,
        tz,
        seqs: Vec::new(),
        more_in_day: false,
        earlier_days: false,
    };
    let thread = request
        .thread
        .or_else(|| cursor.as_ref().map(|c| c.thread_id.clone()));
    let thread_id = match thread {
        Some(thread_id) => {
            if !store::thread_exists(pool, owner.as_str(), &thread_id).await? {
                return Err(ApiError::ThreadNotFound);
            }
            thread_id
        }
        None => match store::latest_thread(pool, owner.as_str()).await? {
            Some(thread_id) => thread_id,
            None => return Ok((nothing(None, tz), Vec::new())),
        },
    };
    // A cursor names its day and time zone (`before` and `tz` do not move it); otherwise day
    // boundaries are those of the caller's IANA time zone (UTC unless given), PostgreSQL's time
    // zone database doing the arithmetic, daylight-saving days included.
    let (day, tz, below) = match cursor {
        Some(cursor) => (cursor.day, cursor.tz, cursor.below),
        None => {
            let latest =
                store::latest_day_before(pool, owner.as_str(), &thread_id, before, &tz).await?;
            match latest {
                Some(day) => (day, tz, i64::MAX),
                None => return Ok((nothing(Some(thread_id), tz), Vec::new())),
            }
        }
    };
    let store::DayBounds {
        starts: from,
        ends: to,
    } = store::day_bounds(pool, day, &tz).await?;
    let window = store::DayWindow {
        owner: owner.as_str(),
        thread_id: &thread_id,
        from,
        to,
        below,
    };
    // One row past the limit says whether the day goes on; the byte bound, applied by the
    // database, says so by leaving rows out.
    let max_bytes = i64::try_from(DAY_PAGE_BYTES).unwrap_or(i64::MAX);
    let store::DayPage { mut rows, fetched } =
        store::day_page(pool, window, limit + 1, max_bytes).await?;
    let mut more_in_day = fetched > rows.len() as i64;
    let over = rows
        .len()
        .saturating_sub(usize::try_from(limit).unwrap_or(usize::MAX));
    if over > 0 {
        rows.drain(..over); // the oldest: a page keeps the newest end
        more_in_day = true;
    }
    let earlier_days = store::has_messages_before(pool, owner.as_str(), &thread_id, from).await?;
    let day = Day {
        thread_id: Some(thread_id),
        day: Some(day),
        tz,
        seqs: rows.iter().map(|row| row.seq).collect(),
        more_in_day,
        earlier_days,
    };
    Ok((day, rows))
}

impl Day {
    fn day(&self) -> Option<String> {
        self.day.map(|d| d.format("%Y-%m-%d").to_string())
    }

    /// The page `messages` (one per row read, in `seq` order) make: the oldest of them left
    /// out until the rest fit in [`DAY_PAGE_BYTES`] as JSON (the newest always stays), and the
    /// cursor to the ones before when the day goes on.
    fn page<T: Serialize>(&self, mut messages: Vec<T>) -> Page<T> {
        let cut = oldest_over(&messages, DAY_PAGE_BYTES);
        messages.drain(..cut);
        let more_in_day = self.more_in_day || cut > 0;
        let next_cursor = match (&self.thread_id, self.day, self.seqs.get(cut)) {
            (Some(thread_id), Some(day), Some(&below)) if more_in_day => Some(
                DayCursor {
                    thread_id: thread_id.clone(),
                    day,
                    tz: self.tz.clone(),
                    below,
                }
                .encode(),
            ),
            _ => None,
        };
        Page {
            messages,
            has_more: more_in_day || self.earlier_days,
            next_cursor,
        }
    }
}

/// How many of `messages` (oldest first) to leave out so that the newest ones, as a JSON
/// array, take at most `max_bytes`; the newest one always stays.
fn oldest_over<T: Serialize>(messages: &[T], max_bytes: usize) -> usize {
    let mut total = 2; // the brackets
    let mut kept = 0;
    for message in messages.iter().rev() {
        let size = json_len(message) + usize::from(kept > 0);
        if kept > 0 && total + size > max_bytes {
            break;
        }
        total += size;
        kept += 1;
    }
    messages.len() - kept
}

/// The length of `value` as JSON, counted without keeping the text.
fn json_len<T: Serialize>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Our response types always serialize (string keys, no failing `Serialize`).
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// Where a page of a day continues: the thread, the day and the time zone its bounds are
/// in, and the `seq` its earlier messages are below. Opaque to clients (hex of a JSON array).
#[derive(Debug, Clone, PartialEq, Eq)]
struct DayCursor {
    thread_id: String,
    day: NaiveDate,
    tz: String,
    below: i64,
}

impl DayCursor {
    fn encode(&self) -> String {
        let day = self.day.format("%Y-%m-%d").to_string();
        let raw = json!([self.thread_id, day, self.tz, self.below]).to_string();
        hex::encode(raw)
    }

    /// The cursor `raw` is, if it is one this service made (a well-formed thread id, day and
    /// known time zone; the caller's ownership of the thread is checked after).
    fn decode(raw: &str, time_zones: &std::collections::HashSet<String>) -> Option<Self> {
        let bytes = hex::decode(raw).ok()?;
        let (thread_id, day, tz, below): (String, String, String, i64) =
            serde_json::from_slice(&bytes).ok()?;
        let thread_chars = thread_id.chars().count();
        let day = NaiveDate::parse_from_str(&day, "%Y-%m-%d").ok()?;
        ((1..=MAX_THREAD_ID_CHARS).contains(&thread_chars) && time_zones.contains(&tz)).then_some(
            Self {
                thread_id,
                day,
                tz,
                below,
            },
        )
    }
}

/// `limit` as given (an integer from 1 to `max`), `default` when absent.
fn parse_limit(raw: Option<&str>, default: i64, max: i64) -> Result<i64, ApiError> {
    match raw {
        None => Ok(default),
        Some(raw) => raw
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or(ApiError::BadLimit(max)),
    }
}

/// `GET /api/v1/agent/history`: the latest day with messages (before `before`, if given), in the
/// shape of `agent-run-input-protocol.md`; a page of it (`limit`, `cursor`, see [`select_day`]).
#[utoipa::path(
    get,
    path = "/api/v1/agent/history",
    tag = "history",
    params(("threadId" = Option<String>, Query, description = "One thread (1 to 128 characters); all of the caller's by default."), ("before" = Option<String>, Query, description = "The latest day with messages before this date (`YYYY-MM-DD`); by default the latest day."), ("tz" = Option<String>, Query, description = "The IANA time zone the days are counted in; UTC by default."), ("limit" = Option<u32>, Query, description = "Most messages in the page, 1 to 200 (the default)."), ("cursor" = Option<String>, Query, description = "The `nextCursor` of the previous page of the day.")),
    responses(
        (status = 200, description = "A page of the day, in the shape of agent-run-input-protocol.md.", body = HistorySnapshotResponse),
        (status = 400, description = "A parameter breaks its rule (`invalid_request`); `field` names it (`threadId`, `before`, `tz`, `limit`, `cursor`).", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
        (status = 404, description = "The caller has no thread with this id (`not_found`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn history(
    State(state): State<AppState>,
    owner: Owner,
    params: QueryResult<HistoryQuery>,
) -> Result<axum::Json<HistorySnapshotResponse>, ApiError> {
    let (day, rows) = select_day(&state, &owner, query(params)?.day()).await?;
    // One signing request for the whole page: the first attachment of each user message.
    let wanted: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            user_files(row)
                .first()
                .map(|f| vec![f.content_url()])
                .unwrap_or_default()
        })
        .collect();
    let mut signed = sign_all(&state, &owner, &wanted).await.into_iter();
    let messages = rows
        .into_iter()
        .map(|row| {
            let url = signed
                .next()
                .and_then(|urls| urls.into_iter().next())
                .flatten();
            to_history_message(row, url)
        })
        .collect();
    let page = day.page(messages);
    Ok(axum::Json(HistorySnapshotResponse {
        scope: HistoryScope::HistoryDay,
        day: day.day(),
        thread_id: day.thread_id,
        has_more: page.has_more,
        next_cursor: page.next_cursor,
        messages: page.messages,
    }))
}

/// `GET /api/v1/agent/history/blocks`: the same day, paged alike, in the block form of
/// `agent-chat-messages-protocol.md`, every file of a user message as a re-signed `binary` block.
#[utoipa::path(
    get,
    path = "/api/v1/agent/history/blocks",
    tag = "history",
    params(("threadId" = Option<String>, Query, description = "One thread (1 to 128 characters); all of the caller's by default."), ("before" = Option<String>, Query, description = "The latest day with messages before this date (`YYYY-MM-DD`); by default the latest day."), ("tz" = Option<String>, Query, description = "The IANA time zone the days are counted in; UTC by default."), ("limit" = Option<u32>, Query, description = "Most messages in the page, 1 to 200 (the default)."), ("cursor" = Option<String>, Query, description = "The `nextCursor` of the previous page of the day.")),
    responses(
        (status = 200, description = "A page of the day in the block form of agent-chat-messages-protocol.md; a user's files as re-signed `binary` blocks.", body = BlockHistoryResponse),
        (status = 400, description = "A parameter breaks its rule (`invalid_request`); `field` names it (`threadId`, `before`, `tz`, `limit`, `cursor`).", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
        (status = 404, description = "The caller has no thread with this id (`not_found`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn history_blocks(
    State(state): State<AppState>,
    owner: Owner,
    params: QueryResult<HistoryQuery>,
) -> Result<axum::Json<BlockHistoryResponse>, ApiError> {
    let (day, rows) = select_day(&state, &owner, query(params)?.day()).await?;
    let (files, signed) = user_files_signed(&state, &owner, &rows).await;
    let messages = rows
        .into_iter()
        .zip(files.into_iter().zip(signed))
        .map(|(row, (files, urls))| to_block_message(row, &files, urls))
        .collect();
    let page = day.page(messages);
    Ok(axum::Json(BlockHistoryResponse {
        scope: HistoryScope::HistoryDay,
        day: day.day(),
        thread_id: day.thread_id,
        has_more: page.has_more,
        next_cursor: page.next_cursor,
        messages: page.messages,
    }))
}

/// `GET /api/v1/agent/history/bodies`: the same day, paged alike, every message a
/// `MessageBody`, so a client renders parts the same way whatever the transport; a user's files
/// carry freshly signed URLs (`s3://` when they cannot be signed, e.g. deleted).
#[utoipa::path(
    get,
    path = "/api/v1/agent/history/bodies",
    tag = "history",
    params(("threadId" = Option<String>, Query, description = "One thread (1 to 128 characters); all of the caller's by default."), ("before" = Option<String>, Query, description = "The latest day with messages before this date (`YYYY-MM-DD`); by default the latest day."), ("tz" = Option<String>, Query, description = "The IANA time zone the days are counted in; UTC by default."), ("limit" = Option<u32>, Query, description = "Most messages in the page, 1 to 200 (the default)."), ("cursor" = Option<String>, Query, description = "The `nextCursor` of the previous page of the day.")),
    responses(
        (status = 200, description = "A page of the day, every message a `MessageBody`; a user's files with fresh signed URLs.", body = BodyHistoryResponse),
        (status = 400, description = "A parameter breaks its rule (`invalid_request`); `field` names it (`threadId`, `before`, `tz`, `limit`, `cursor`).", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
        (status = 404, description = "The caller has no thread with this id (`not_found`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn history_bodies(
    State(state): State<AppState>,
    owner: Owner,
    params: QueryResult<HistoryQuery>,
) -> Result<axum::Json<BodyHistoryResponse>, ApiError> {
    let (day, rows) = select_day(&state, &owner, query(params)?.day()).await?;
    let (files, signed) = user_files_signed(&state, &owner, &rows).await;
    let mut messages = Vec::with_capacity(rows.len());
    for (row, (files, urls)) in rows.into_iter().zip(files.into_iter().zip(signed)) {
        let stored = StoredMessage {
            role: row.role.as_str(),
            text: &row.content,
            files: files
                .iter()
                .zip(urls)
                .map(|(f, url)| {
                    let url = url.unwrap_or_else(|| f.content_url());
                    (f.name().to_owned(), f.mime_type.clone(), url)
                })
                .collect(),
            tool_calls: stored_tool_calls(&row.metadata),
            generated: generated_files(&row.metadata),
        };
        let body = stored
            .body()
            .map_err(|err| anyhow::anyhow!("stored message {} as a body: {err}", row.message_id))?;
        messages.push(BodyMessage {
            id: row.message_id,
            seq: row.seq,
            role: row.role.as_str().to_owned(),
            body,
            metadata: row.metadata,
            timestamp: timestamp(row.created_at),
        });
    }
    let page = day.page(messages);
    Ok(axum::Json(BodyHistoryResponse {
        scope: HistoryScope::HistoryDay,
        day: day.day(),
        thread_id: day.thread_id,
        has_more: page.has_more,
        next_cursor: page.next_cursor,
        messages: page.messages,
    }))
}

/// `(id, name, arguments)` of a message's stored tool calls.
fn stored_tool_calls(metadata: &Metadata) -> Vec<(String, String, String)> {
    let calls = metadata.tool_calls.iter().flatten();
    calls
        .map(|c| (c.id.clone(), c.name.clone(), c.arguments.clone()))
        .collect()
}

/// `(file name, content type, URL)` of the files an agent made, where they were registered.
fn generated_files(metadata: &Metadata) -> Vec<(String, String, String)> {
    let files = metadata.attachments.iter().flatten();
    files
        .filter_map(|f| {
            let url = f.content_url.clone()?;
            Some((
                f.filename.clone(),
                "application/octet-stream".to_owned(),
                url,
            ))
        })
        .collect()
}

/// `GET /v2/history?session_id=`: the same day, paged alike, in the form of `file-attachments.md`.
#[utoipa::path(
    get,
    path = "/v2/history",
    tag = "history",
    params(("session_id" = Option<String>, Query, description = "The session (thread), 1 to 128 characters."), ("before" = Option<String>, Query, description = "The latest day with messages before this date (`YYYY-MM-DD`); by default the latest day."), ("tz" = Option<String>, Query, description = "The IANA time zone the days are counted in; UTC by default."), ("limit" = Option<u32>, Query, description = "Most messages in the page, 1 to 200 (the default)."), ("cursor" = Option<String>, Query, description = "The `nextCursor` of the previous page of the day.")),
    responses(
        (status = 200, description = "A page of the day in the form of file-attachments.md.", body = SessionHistoryResponse),
        (status = 400, description = "A parameter breaks its rule (`invalid_request`); `field` names it (`threadId`, `before`, `tz`, `limit`, `cursor`).", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
        (status = 404, description = "The caller has no thread with this id (`not_found`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn session_history(
    State(state): State<AppState>,
    owner: Owner,
    params: QueryResult<SessionHistoryQuery>,
) -> Result<axum::Json<SessionHistoryResponse>, ApiError> {
    let q = query(params)?;
    let request = DayRequest {
        thread: q.session_id,
        thread_field: "session_id",
        before: q.before,
        tz: q.tz,
        limit: q.limit,
        cursor: q.cursor,
    };
    let (day, rows) = select_day(&state, &owner, request).await?;
    let page = day.page(rows.into_iter().map(to_session_message).collect());
    Ok(axum::Json(SessionHistoryResponse {
        scope: HistoryScope::HistoryDay,
        day: day.day(),
        session_id: day.thread_id,
        has_more: page.has_more,
        next_cursor: page.next_cursor,
        messages: page.messages,
    }))
}

/// The files of each user message of `rows`, and a fresh URL for each (one signing request).
async fn user_files_signed(
    state: &AppState,
    owner: &Owner,
    rows: &[store::MessageRow],
) -> (Vec<Vec<AttachedFile>>, Vec<Vec<Option<String>>>) {
    let files: Vec<Vec<AttachedFile>> = rows.iter().map(user_files).collect();
    let wanted: Vec<Vec<String>> = files
        .iter()
        .map(|fs| fs.iter().map(AttachedFile::content_url).collect())
        .collect();
    let signed = sign_all(state, owner, &wanted).await;
    (files, signed)
}

/// Signs every URL of `wanted` in one request; the answer has `wanted`'s shape.
async fn sign_all(
    state: &AppState,
    owner: &Owner,
    wanted: &[Vec<String>],
) -> Vec<Vec<Option<String>>> {
    let flat: Vec<String> = wanted.iter().flatten().cloned().collect();
    let mut signed = state.signer.sign(owner.as_str(), flat).await.into_iter();
    wanted
        .iter()
        .map(|urls| urls.iter().map(|_| signed.next().flatten()).collect())
        .collect()
}

fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// The files of a user message, from its stored metadata.
fn user_files(row: &store::MessageRow) -> Vec<AttachedFile> {
    if row.role != Role::User {
        return Vec::new();
    }
    row.metadata.user_files()
}

fn text_block(content: &str) -> Vec<Value> {
    if content.is_empty() {
        Vec::new()
    } else {
        vec![json!({"type": "text", "text": content})]
    }
}

fn to_history_message(row: store::MessageRow, url: Option<String>) -> HistoryMessage {
    match row.role {
        Role::User => HistoryMessage::User(HistoryUserMessage {
            id: row.message_id,
            seq: row.seq,
            content: row.content,
            url,
            timestamp: timestamp(row.created_at),
        }),
        role @ (Role::Assistant | Role::Tool) => {
            let message = HistoryAgentMessage {
                ui_schema: compile_stored(row.metadata.ui_hints.as_ref()),
                id: row.message_id,
                seq: row.seq,
                content: row.content,
                timestamp: timestamp(row.created_at),
            };
            if role == Role::Tool {
                HistoryMessage::Tool(message)
            } else {
                HistoryMessage::Assistant(message)
            }
        }
    }
}

fn to_block_message(
    row: store::MessageRow,
    files: &[AttachedFile],
    urls: Vec<Option<String>>,
) -> BlockMessage {
    let mut content = text_block(&row.content);
    for (file, url) in files.iter().zip(urls) {
        content.push(json!({"type": "binary", "mimeType": file.mime_type, "url": url}));
    }
    let agent = row.role != Role::User;
    let calls = row.metadata.agui_tool_calls();
    BlockMessage {
        ui_schema: agent.then(|| compile_stored(row.metadata.ui_hints.as_ref())),
        tool_calls: (row.role == Role::Assistant && !calls.is_empty()).then_some(calls),
        tool_call_id: (row.role == Role::Tool)
            .then(|| row.metadata.tool_call_id.clone())
            .flatten(),
        id: row.message_id,
        seq: row.seq,
        role: row.role.as_str().to_owned(),
        content,
        metadata: row.metadata,
        timestamp: timestamp(row.created_at),
    }
}

fn to_session_message(row: store::MessageRow) -> SessionMessage {
    let mut content = text_block(&row.content);
    for file in user_files(&row) {
        content.push(json!({
            "type": "attachment",
            "path": file.content_url(),
            "filename": file.name(),
            "icon_type": file_types::allowed(&file.mime_type).map_or("file", |t| t.icon),
            "source": "upload",
            "url": file.path,
            "file_size": file.size_bytes,
            "content_type": file.mime_type,
        }));
    }
    // An assistant message always lists the files the agent made, `[]` when none (the seed's
    // example).
    let assistant = row.role == Role::Assistant;
    SessionMessage {
        tool_calls: assistant.then(|| row.metadata.agui_tool_calls()),
        tool_call_id: (row.role == Role::Tool)
            .then(|| row.metadata.tool_call_id.clone())
            .flatten(),
        attachments: assistant.then(|| row.metadata.attachments.clone().unwrap_or_default()),
        id: row.message_id,
        seq: row.seq,
        role: row.role.as_str().to_owned(),
        content,
        timestamp: timestamp(row.created_at),
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct ThreadsQuery {
    cursor: Option<String>,
    limit: Option<String>,
    q: Option<String>,
}

/// Most threads in one page, and the default.
const MAX_THREADS_PAGE: i64 = 100;
const DEFAULT_THREADS_PAGE: i64 = 20;
/// Most threads in one page of a search, and the default.
const MAX_SEARCH_PAGE: i64 = 50;
const DEFAULT_SEARCH_PAGE: i64 = 20;

/// A thread as the list shows it (and the rename answers it).
pub(crate) fn summary(row: store::ThreadRow) -> ThreadSummary {
    ThreadSummary {
        thread_id: row.thread_id,
        title: row.title,
        message_count: row.last_seq,
        created_at: timestamp(row.created_at),
        updated_at: timestamp(row.updated_at),
    }
}

/// `GET /api/v1/agent/threads?cursor=&limit=`: the caller's threads, most recent first, each
/// with its title. With `q`, a search instead ([`search_threads`]).
#[utoipa::path(
    get,
    path = "/api/v1/agent/threads",
    tag = "history",
    params(("cursor" = Option<String>, Query, description = "The `nextCursor` of the previous page."), ("limit" = Option<u32>, Query, description = "Most threads in the page: 1 to 100 (20 by default)."), ("q" = Option<String>, Query, description = "Search the caller's messages instead of listing threads.")),
    responses(
        (status = 200, description = "The caller's threads, most recent first; with `q`, the threads with a matching message, best first.", body = Threads),
        (status = 400, description = "A parameter breaks its rule (`invalid_request`); `field` names it (`limit`, `cursor`, `q`).", body = ErrorEnvelope),
        (status = 401, description = "No valid bearer token (`unauthorized`).", body = ErrorEnvelope),
    ),
)]
pub(crate) async fn threads(
    State(state): State<AppState>,
    owner: Owner,
    params: QueryResult<ThreadsQuery>,
) -> Result<axum::Json<Threads>, ApiError> {
    let query = query(params)?;
    if let Some(q) = &query.q {
        return Ok(axum::Json(Threads::Search(
            search_threads(&state, &owner, q, &query).await?,
        )));
    }
    let limit = parse_limit(
        query.limit.as_deref(),
        DEFAULT_THREADS_PAGE,
        MAX_THREADS_PAGE,
    )?;
    let after = query
        .cursor
        .as_deref()
        .map(|raw| decode_cursor(raw).ok_or(ApiError::BadCursor))
        .transpose()?;
    let mut rows = store::threads(&state.pool, owner.as_str(), after.as_ref(), limit + 1).await?;
    let more = rows.len() as i64 > limit;
    rows.truncate(usize::try_from(limit).unwrap_or_default());
    let next = more
        .then(|| {
            rows.last()
                .map(|r| encode_cursor(r.updated_at, &r.thread_id))
        })
        .flatten();
    let threads: Vec<ThreadSummary> = rows.into_iter().map(summary).collect();
    Ok(axum::Json(Threads::List(ThreadList {
        threads,
        next_cursor: next,
    })))
}

/// `GET /api/v1/agent/threads?q=&limit=&cursor=`: the caller's threads with a message that
/// matches `q` (see [`crate::search`]), best first, each with its best message: its id, its
/// day (UTC, `YYYY-MM-DD`) and a snippet (HTML-escaped, matches in `<mark>`).
async fn search_threads(
    state: &AppState,
    owner: &Owner,
    q: &str,
    query: &ThreadsQuery,
) -> Result<ThreadSearch, ApiError> {
    let search = SearchQuery::parse(q).map_err(ApiError::BadSearch)?;
    let limit = parse_limit(query.limit.as_deref(), DEFAULT_SEARCH_PAGE, MAX_SEARCH_PAGE)?;
    let offset = query
        .cursor
        .as_deref()
        .map(|raw| decode_search_cursor(raw, &search).ok_or(ApiError::BadCursor))
        .transpose()?
        .unwrap_or(0);
    let terms = store::SearchTerms {
        words: &search.words,
        loose: &search.loose,
        phrase: &search.phrase,
    };
    let pool = &state.pool;
    let mut hits = if search.has_trigram() {
        store::search_threads(pool, owner.as_str(), terms, limit + 1, offset).await?
    } else {
        store::search_threads_short(pool, owner.as_str(), terms, limit + 1, offset).await?
    };
    let more = hits.len() as i64 > limit && offset + limit < search::MAX_OFFSET;
    hits.truncate(usize::try_from(limit).unwrap_or_default());
    let next = more.then(|| encode_search_cursor(offset + limit, &search));
    let threads = hits
        .into_iter()
        .map(|hit| ThreadHit {
            snippet: search::snippet(&hit.text, &search),
            thread_id: hit.thread_id,
            title: hit.title,
            updated_at: timestamp(hit.updated_at),
            message_id: hit.message_id,
            day: hit.created_at.date_naive().format("%Y-%m-%d").to_string(),
        })
        .collect();
    Ok(ThreadSearch {
        threads,
        next_cursor: next,
    })
}

/// An opaque search cursor: how many results the next page skips, for this query only.
fn encode_search_cursor(offset: i64, search: &SearchQuery) -> String {
    hex::encode(serde_json::json!(["q", search.fingerprint(), offset]).to_string())
}

fn decode_search_cursor(raw: &str, search: &SearchQuery) -> Option<i64> {
    let bytes = hex::decode(raw).ok()?;
    let (tag, fingerprint, offset): (String, String, i64) = serde_json::from_slice(&bytes).ok()?;
    (tag == "q"
        && fingerprint == search.fingerprint()
        && (0..=search::MAX_OFFSET).contains(&offset))
    .then_some(offset)
}

/// An opaque cursor: the position of the last thread of a page.
fn encode_cursor(at: DateTime<Utc>, thread_id: &str) -> String {
    let raw = serde_json::json!([at.timestamp_micros(), thread_id]).to_string();
    hex::encode(raw)
}

fn decode_cursor(raw: &str) -> Option<store::ThreadCursor> {
    let bytes = hex::decode(raw).ok()?;
    let (micros, thread_id): (i64, String) = serde_json::from_slice(&bytes).ok()?;
    Some(store::ThreadCursor {
        updated_at: DateTime::from_timestamp_micros(micros)?,
        thread_id,
    })
}

#[cfg(test)]
mod tests {
    use protocol::ErrorEnvelope;

    use super::*;

    async fn answer(err: ApiError) -> (StatusCode, ErrorEnvelope) {
        let response = err.into_response();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap_or_default();
        let envelope = serde_json::from_slice(&bytes).expect("an error envelope");
        (status, envelope)
    }

    #[test]
    fn a_page_keeps_its_newest_messages_within_the_byte_bound() {
        let messages = vec!["a".repeat(100), "b".repeat(100), "c".repeat(100)];
        // Each is 102 bytes as JSON, plus a comma between two, plus the brackets.
        assert_eq!(oldest_over(&messages, 2 + 102 * 3 + 2), 0);
        assert_eq!(oldest_over(&messages, 2 + 102 * 3 + 1), 1);
        assert_eq!(oldest_over(&messages, 2 + 102 * 2 + 1), 1);
        assert_eq!(oldest_over(&messages, 10), 2, "the newest always stays");
        assert_eq!(oldest_over::<String>(&[], 10), 0);
    }

    #[test]
    fn a_day_cursor_comes_back_as_made_and_nothing_else_is_one() {
        let zones: std::collections::HashSet<String> = ["UTC".to_owned()].into();
        let cursor = DayCursor {
            thread_id: "t-1".to_owned(),
            day: NaiveDate::from_ymd_opt(2026, 3, 15).unwrap_or_default(),
            tz: "UTC".to_owned(),
            below: 42,
        };
        assert_eq!(DayCursor::decode(&cursor.encode(), &zones), Some(cursor));
        let made = |value: Value| hex::encode(value.to_string());
        for bad in [
            String::new(),
            "zz".to_owned(),
            made(json!(["t", "2026-03-15", "Mars/Olympus", 1])),
            made(json!(["", "2026-03-15", "UTC", 1])),
            made(json!(["t", "2026-02-30", "UTC", 1])),
            made(json!(["t", "2026-03-15", "UTC"])),
            made(json!(["x".repeat(129), "2026-03-15", "UTC", 1])),
        ] {
            assert_eq!(DayCursor::decode(&bad, &zones), None, "{bad}");
        }
    }

    #[test]
    fn a_search_cursor_continues_its_own_query_only() {
        let search = SearchQuery::parse("北京 weather").unwrap();
        let cursor = encode_search_cursor(40, &search);
        assert_eq!(decode_search_cursor(&cursor, &search), Some(40));
        let other = SearchQuery::parse("weather").unwrap();
        assert_eq!(
            decode_search_cursor(&cursor, &other),
            None,
            "another query's"
        );
        let list = encode_cursor(chrono::Utc::now(), "t-1");
        assert_eq!(decode_search_cursor(&list, &search), None, "the list's");
        let deep = encode_search_cursor(search::MAX_OFFSET + 1, &search);
        assert_eq!(
            decode_search_cursor(&deep, &search),
            None,
            "past the deepest page"
        );
        assert_eq!(decode_search_cursor("zz", &search), None);
    }

    #[tokio::test]
    async fn each_refusal_names_its_parameter_and_says_its_rule() {
        let cases = [
            (
                ApiError::BadDate,
                "before",
                "before must be a date in the form YYYY-MM-DD",
            ),
            (
                ApiError::BadTimeZone,
                "tz",
                "tz must be an IANA time zone name such as Europe/Berlin",
            ),
            (
                ApiError::BadThreadId("session_id"),
                "session_id",
                "session_id must be 1 to 128 characters",
            ),
            (
                ApiError::BadLimit(100),
                "limit",
                "limit must be an integer from 1 to 100",
            ),
            (
                ApiError::BadLimit(DAY_PAGE_MESSAGES),
                "limit",
                "limit must be an integer from 1 to 200",
            ),
            (
                ApiError::BadCursor,
                "cursor",
                "cursor is not one this endpoint returned",
            ),
            (
                ApiError::BadSearch(search::QueryError::TooLong),
                "q",
                "q must be at most 256 characters",
            ),
        ];
        for (err, field, message) in cases {
            let (status, envelope) = answer(err).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{field}");
            assert_eq!(envelope.error.code, ErrorCode::InvalidRequest, "{field}");
            assert_eq!(envelope.error.field.as_deref(), Some(field));
            assert_eq!(envelope.error.message, message);
        }
        let (status, envelope) = answer(ApiError::ThreadNotFound).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(envelope.error.message, "thread not found");
        let (status, envelope) = answer(ApiError::Internal(anyhow::anyhow!("secret cause"))).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            envelope.error.message, "internal error",
            "the cause is never shown"
        );
    }
}
