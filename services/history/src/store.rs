//! All SQL of the history service.

use chrono::{DateTime, NaiveDate, Utc};
use protocol::agui::Event;
use protocol::files::{ATTACHMENTS_EVENT, GeneratedAttachments};
use protocol::messaging::{RunEventV1, RunTaskV1};
use protocol::metadata::{AgentMetadata, MESSAGE_METADATA_EVENT};
use protocol::run_input::Message;
use protocol::ui_schema::{UI_HINTS_EVENT, UiHints};
use serde_json::{Value, json};
use sqlx::{PgPool, Postgres, Transaction};
use uuid::Uuid;

/// What applying a message from JetStream did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Written now.
    Written,
    /// Already written before (a redelivery): nothing changed.
    Duplicate,
    /// Depends on something not written yet (the run's user message, an earlier event).
    NotYet,
}

/// Persists the user message of an accepted run, once.
pub(crate) async fn record_accepted_run(pool: &PgPool, task: &RunTaskV1) -> sqlx::Result<Outcome> {
    let mut tx = pool.begin().await?;
    let inserted = sqlx::query_scalar::<_, Uuid>(
        "INSERT INTO run_progress (task_id, owner, thread_id, run_id, accepted_at)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (task_id) DO NOTHING
         RETURNING task_id",
    )
    .bind(task.task_id)
    .bind(&task.owner)
    .bind(&task.input.thread_id)
    .bind(&task.input.run_id)
    .bind(task.accepted_at)
    .fetch_optional(&mut *tx)
    .await?;
    if inserted.is_none() {
        return Ok(Outcome::Duplicate);
    }
    if task.conversation {
        record_conversation(&mut tx, task).await?;
        tx.commit().await?;
        return Ok(Outcome::Written);
    }
    let Some(Message::User(user)) = task.input.messages.first() else {
        // Validation guarantees a first user message; a task without one has nothing to keep.
        tx.commit().await?;
        return Ok(Outcome::Written);
    };
    insert_message(
        &mut tx,
        NewMessage {
            owner: &task.owner,
            thread_id: &task.input.thread_id,
            task_id: task.task_id,
            message_id: &user.id,
            role: "user",
            content: &user.content.text(),
            metadata: input_metadata(task, &user.id, true),
            created_at: task.accepted_at,
        },
    )
    .await?;
    tx.commit().await?;
    Ok(Outcome::Written)
}

/// Metadata of a message that came in with the run; the new user message carries its files.
fn input_metadata(task: &RunTaskV1, message_id: &str, new_turn: bool) -> Value {
    let mut metadata = json!({
        "run_id": task.input.run_id,
        "message_id": message_id,
        "stage": "input",
    });
    // The seed's `user_message_attachments` is one object (bucket, path, MIME type): the first
    // file. A message may carry up to three, so all of them, with name and size for the
    // file-attachments history shape, are kept in `user_message_attachment_list`.
    if new_turn && let Some(first) = task.attachments.first() {
        metadata["user_message_attachments"] = json!(first.location());
        metadata["user_message_attachment_list"] = json!(task.attachments);
    }
    metadata
}

/// A conversation resent whole by its client: keeps, in order, the user, assistant and tool
/// messages the thread does not hold yet (recognised by id), so a resent turn is never stored
/// twice.
async fn record_conversation(
    tx: &mut Transaction<'_, Postgres>,
    task: &RunTaskV1,
) -> sqlx::Result<()> {
    lock_thread(tx, &task.owner, &task.input.thread_id, task.accepted_at).await?;
    let messages = &task.input.messages;
    let new_turn = messages.iter().rposition(|m| matches!(m, Message::User(_)));
    let mut seen = std::collections::HashSet::new();
    for (at, message) in messages.iter().enumerate() {
        let id = message.id();
        if !seen.insert(id) {
            continue; // the same id twice in one request: the first one counts
        }
        let mut metadata = input_metadata(task, id, Some(at) == new_turn);
        let (role, content) = match message {
            Message::User(user) => ("user", user.content.text()),
            Message::Assistant(assistant) => {
                if let Some(calls) = &assistant.tool_calls {
                    let calls: Vec<Value> = calls
                        .iter()
                        .map(|c| json!({"id": c.id, "name": c.function.name, "arguments": c.function.arguments}))
                        .collect();
                    metadata["tool_calls"] = Value::Array(calls);
                }
                ("assistant", assistant.content.clone().unwrap_or_default())
            }
            Message::Tool(tool) => {
                metadata["tool_call_id"] = Value::String(tool.tool_call_id.clone());
                metadata["stage"] = Value::String("tool_execution".to_owned());
                ("tool", tool.content.clone())
            }
            _ => continue, // system, developer, reasoning, activity: not conversation
        };
        let known: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM messages WHERE owner = $1 AND thread_id = $2 AND message_id = $3)",
        )
        .bind(&task.owner)
        .bind(&task.input.thread_id)
        .bind(id)
        .fetch_one(&mut **tx)
        .await?;
        if known {
            continue;
        }
        insert_message(
            tx,
            NewMessage {
                owner: &task.owner,
                thread_id: &task.input.thread_id,
                task_id: task.task_id,
                message_id: id,
                role,
                content: &content,
                metadata,
                created_at: task.accepted_at,
            },
        )
        .await?;
    }
    Ok(())
}

/// `seq` of the last event of `task_id` whose changes are committed, if history knows the run.
pub(crate) async fn written_seq(pool: &PgPool, task_id: Uuid) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar("SELECT last_event_seq FROM run_progress WHERE task_id = $1")
        .bind(task_id)
        .fetch_optional(pool)
        .await
}

/// Applies one run event, exactly once and in per-run order.
pub(crate) async fn apply_event(pool: &PgPool, event: &RunEventV1) -> sqlx::Result<Outcome> {
    let mut tx = pool.begin().await?;
    let progress = sqlx::query_as::<_, (i64, String, DateTime<Utc>)>(
        "SELECT last_event_seq, owner, accepted_at FROM run_progress WHERE task_id = $1 FOR UPDATE",
    )
    .bind(event.task_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((last_seq, owner, accepted_at)) = progress else {
        return Ok(Outcome::NotYet);
    };
    if owner != event.owner {
        tracing::error!(task.id = %event.task_id, "event owner differs from the run's owner; ignored");
        return Ok(Outcome::Duplicate);
    }
    let seq = i64::try_from(event.seq).unwrap_or(i64::MAX);
    if seq <= last_seq {
        return Ok(Outcome::Duplicate);
    }
    if seq > last_seq + 1 {
        return Ok(Outcome::NotYet);
    }
    let run_meta = |message_id: &str, stage: &str| json!({"run_id": event.run_id, "message_id": message_id, "stage": stage});
    match &event.event {
        Event::RunStarted { .. } => set_status(&mut tx, event.task_id, "running").await?,
        Event::RunFinished { .. } => set_status(&mut tx, event.task_id, "completed").await?,
        Event::RunError { code, .. } => {
            let status = if code.as_deref() == Some("cancelled") {
                "cancelled"
            } else {
                "failed"
            };
            set_status(&mut tx, event.task_id, status).await?;
        }
        Event::TextMessageStart { message_id, .. } => {
            let meta = run_meta(message_id, "response");
            ensure_message(&mut tx, event, message_id, "assistant", meta).await?;
        }
        Event::TextMessageContent { message_id, delta } => {
            sqlx::query("UPDATE messages SET content = content || $3 WHERE task_id = $1 AND message_id = $2")
                .bind(event.task_id)
                .bind(message_id)
                .bind(delta)
                .execute(&mut *tx)
                .await?;
        }
        Event::TextMessageEnd { message_id } => {
            let latency_ms = (event.emitted_at - accepted_at).num_milliseconds();
            sqlx::query(
                "UPDATE messages SET metadata = metadata || jsonb_build_object('latency_ms', $3::bigint)
                 WHERE task_id = $1 AND message_id = $2",
            )
            .bind(event.task_id)
            .bind(message_id)
            .bind(latency_ms)
            .execute(&mut *tx)
            .await?;
        }
        Event::ToolCallStart {
            tool_call_id,
            tool_call_name,
            parent_message_id,
        } => {
            // The call belongs to its parent assistant message, or to a message of its own.
            let message_id = parent_message_id.as_deref().unwrap_or(tool_call_id);
            let meta = run_meta(message_id, "response");
            ensure_message(&mut tx, event, message_id, "assistant", meta).await?;
            sqlx::query(
                "INSERT INTO tool_calls (task_id, tool_call_id, message_id, name, started_seq)
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (task_id, tool_call_id) DO NOTHING",
            )
            .bind(event.task_id)
            .bind(tool_call_id)
            .bind(message_id)
            .bind(tool_call_name)
            .bind(seq)
            .execute(&mut *tx)
            .await?;
            refresh_tool_calls(&mut tx, event.task_id, tool_call_id).await?;
        }
        Event::ToolCallArgs {
            tool_call_id,
            delta,
        } => {
            sqlx::query(
                "UPDATE tool_calls SET arguments = arguments || $3 WHERE task_id = $1 AND tool_call_id = $2",
            )
            .bind(event.task_id)
            .bind(tool_call_id)
            .bind(delta)
            .execute(&mut *tx)
            .await?;
        }
        Event::ToolCallEnd { tool_call_id } => {
            refresh_tool_calls(&mut tx, event.task_id, tool_call_id).await?;
            // A message made only of tool calls ends with its last call; a text message keeps
            // the latency its TEXT_MESSAGE_END set.
            let latency_ms = (event.emitted_at - accepted_at).num_milliseconds();
            sqlx::query(
                "UPDATE messages SET metadata = metadata || jsonb_build_object('latency_ms', $3::bigint)
                 WHERE task_id = $1 AND NOT metadata ? 'latency_ms'
                   AND message_id = (SELECT message_id FROM tool_calls WHERE task_id = $1 AND tool_call_id = $2)",
            )
            .bind(event.task_id)
            .bind(tool_call_id)
            .bind(latency_ms)
            .execute(&mut *tx)
            .await?;
        }
        Event::ToolCallResult {
            message_id,
            tool_call_id,
            content,
        } => {
            let tool_name: Option<String> = sqlx::query_scalar(
                "SELECT name FROM tool_calls WHERE task_id = $1 AND tool_call_id = $2",
            )
            .bind(event.task_id)
            .bind(tool_call_id)
            .fetch_optional(&mut *tx)
            .await?;
            let mut metadata = run_meta(message_id, "tool_execution");
            metadata["tool_call_id"] = Value::String(tool_call_id.clone());
            metadata["latency_ms"] = json!((event.emitted_at - accepted_at).num_milliseconds());
            if let Some(tool_name) = tool_name {
                metadata["tool_name"] = Value::String(tool_name);
            }
            insert_message(
                &mut tx,
                NewMessage {
                    owner: &event.owner,
                    thread_id: &event.thread_id,
                    task_id: event.task_id,
                    message_id,
                    role: "tool",
                    content,
                    metadata,
                    created_at: event.emitted_at,
                },
            )
            .await?;
        }
        Event::Custom { name, value } if name == UI_HINTS_EVENT => {
            match UiHints::parse_event(value) {
                Ok(hints) => {
                    merge_metadata(
                        &mut tx,
                        event.task_id,
                        &hints.message_id,
                        json!({"ui_hints": hints.hints}),
                    )
                    .await?;
                }
                Err(err) => {
                    tracing::warn!(task.id = %event.task_id, error = %err, "ui_hints ignored");
                }
            }
        }
        Event::Custom { name, value } if name == MESSAGE_METADATA_EVENT => {
            match AgentMetadata::parse_event(value) {
                // Only on a message of this run (the `task_id` bound); the platform's own fields
                // cannot be set (the event is refused whole).
                Ok(fields) => {
                    merge_metadata(
                        &mut tx,
                        event.task_id,
                        &fields.message_id,
                        Value::Object(fields.metadata),
                    )
                    .await?;
                }
                Err(err) => {
                    tracing::warn!(task.id = %event.task_id, error = %err, "message_metadata ignored");
                }
            }
        }
        Event::Custom { name, value } if name == ATTACHMENTS_EVENT => {
            match GeneratedAttachments::parse_event(value) {
                Ok(generated) => {
                    merge_metadata(
                        &mut tx,
                        event.task_id,
                        &generated.message_id,
                        json!({"attachments": generated.files}),
                    )
                    .await?;
                }
                Err(err) => {
                    tracing::warn!(task.id = %event.task_id, error = %err, "attachments event ignored");
                }
            }
        }
        _ => {}
    }
    sqlx::query("UPDATE run_progress SET last_event_seq = $2 WHERE task_id = $1")
        .bind(event.task_id)
        .bind(seq)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Outcome::Written)
}

async fn set_status(
    tx: &mut Transaction<'_, Postgres>,
    task_id: Uuid,
    status: &str,
) -> sqlx::Result<()> {
    sqlx::query("UPDATE run_progress SET status = $2 WHERE task_id = $1")
        .bind(task_id)
        .bind(status)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

struct NewMessage<'a> {
    owner: &'a str,
    thread_id: &'a str,
    task_id: Uuid,
    message_id: &'a str,
    role: &'a str,
    content: &'a str,
    metadata: Value,
    created_at: DateTime<Utc>,
}

/// Inserts the run's message `message_id` unless the thread holds it (a tool call may have created it
/// before its text starts, or the other way round).
async fn ensure_message(
    tx: &mut Transaction<'_, Postgres>,
    event: &RunEventV1,
    message_id: &str,
    role: &str,
    metadata: Value,
) -> sqlx::Result<()> {
    // By thread, not by run: a conversation resent by its client may have stored this very
    // message (by id) before this run's events arrived. Under the thread's lock, so the two
    // consumers never both decide to insert it.
    lock_thread(tx, &event.owner, &event.thread_id, event.emitted_at).await?;
    let exists: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM messages WHERE owner = $1 AND thread_id = $2 AND message_id = $3)",
    )
    .bind(&event.owner)
    .bind(&event.thread_id)
    .bind(message_id)
    .fetch_one(&mut **tx)
    .await?;
    if exists {
        return Ok(());
    }
    insert_message(
        tx,
        NewMessage {
            owner: &event.owner,
            thread_id: &event.thread_id,
            task_id: event.task_id,
            message_id,
            role,
            content: "",
            metadata,
            created_at: event.emitted_at,
        },
    )
    .await
}

/// Locks the thread's row (creating it if needed) until the transaction ends: whoever checks
/// whether the thread holds a message id and then inserts it does so alone.
async fn lock_thread(
    tx: &mut Transaction<'_, Postgres>,
    owner: &str,
    thread_id: &str,
    at: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO threads (owner, thread_id, last_seq, created_at, updated_at)
         VALUES ($1, $2, 0, $3, $3) ON CONFLICT (owner, thread_id) DO NOTHING",
    )
    .bind(owner)
    .bind(thread_id)
    .bind(at)
    .execute(&mut **tx)
    .await?;
    sqlx::query("SELECT 1 FROM threads WHERE owner = $1 AND thread_id = $2 FOR UPDATE")
        .bind(owner)
        .bind(thread_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Adds `fields` to the metadata of the run's message `message_id` (if it exists).
async fn merge_metadata(
    tx: &mut Transaction<'_, Postgres>,
    task_id: Uuid,
    message_id: &str,
    fields: Value,
) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE messages SET metadata = metadata || $3 WHERE task_id = $1 AND message_id = $2",
    )
    .bind(task_id)
    .bind(message_id)
    .bind(fields)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Rebuilds `metadata.tool_calls` (`[{id, name, arguments}]`, in call order) of the message
/// the tool call `tool_call_id` belongs to.
async fn refresh_tool_calls(
    tx: &mut Transaction<'_, Postgres>,
    task_id: Uuid,
    tool_call_id: &str,
) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE messages m
            SET metadata = m.metadata || jsonb_build_object('tool_calls', (
                SELECT jsonb_agg(jsonb_build_object('id', c.tool_call_id, 'name', c.name, 'arguments', c.arguments)
                                 ORDER BY c.started_seq)
                  FROM tool_calls c WHERE c.task_id = m.task_id AND c.message_id = m.message_id))
          FROM tool_calls t
         WHERE t.task_id = $1 AND t.tool_call_id = $2
           AND m.task_id = t.task_id AND m.message_id = t.message_id",
    )
    .bind(task_id)
    .bind(tool_call_id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Inserts a message at the thread's next `seq` (allocated under the thread row's lock).
async fn insert_message(tx: &mut Transaction<'_, Postgres>, m: NewMessage<'_>) -> sqlx::Result<()> {
    let seq: i64 = sqlx::query_scalar(
        "INSERT INTO threads (owner, thread_id, last_seq, created_at, updated_at)
         VALUES ($1, $2, 1, $3, $3)
         ON CONFLICT (owner, thread_id) DO UPDATE
           SET last_seq = threads.last_seq + 1,
               updated_at = GREATEST(threads.updated_at, EXCLUDED.updated_at)
         RETURNING last_seq",
    )
    .bind(m.owner)
    .bind(m.thread_id)
    .bind(m.created_at)
    .fetch_one(&mut **tx)
    .await?;
    sqlx::query(
        "INSERT INTO messages (id, owner, thread_id, seq, task_id, message_id, role, content, metadata, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(Uuid::now_v7())
    .bind(m.owner)
    .bind(m.thread_id)
    .bind(seq)
    .bind(m.task_id)
    .bind(m.message_id)
    .bind(m.role)
    .bind(m.content)
    .bind(m.metadata)
    .bind(m.created_at)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A stored message, as the history endpoints read it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct MessageRow {
    pub(crate) message_id: String,
    pub(crate) seq: i64,
    pub(crate) role: String,
    pub(crate) content: String,
    pub(crate) metadata: Value,
    pub(crate) created_at: DateTime<Utc>,
}

/// The caller's most recently active thread.
pub(crate) async fn latest_thread(pool: &PgPool, owner: &str) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar(
        "SELECT thread_id FROM threads WHERE owner = $1 ORDER BY updated_at DESC LIMIT 1",
    )
    .bind(owner)
    .fetch_optional(pool)
    .await
}

/// Whether the caller has a thread with this id.
pub(crate) async fn thread_exists(
    pool: &PgPool,
    owner: &str,
    thread_id: &str,
) -> sqlx::Result<bool> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM threads WHERE owner = $1 AND thread_id = $2)")
        .bind(owner)
        .bind(thread_id)
        .fetch_one(pool)
        .await
}

/// The latest day (in time zone `tz`) with a message strictly before the day `before`, if any.
pub(crate) async fn latest_day_before(
    pool: &PgPool,
    owner: &str,
    thread_id: &str,
    before: Option<NaiveDate>,
    tz: &str,
) -> sqlx::Result<Option<NaiveDate>> {
    // One index entry, read backwards from the bound: the bound is part of the index
    // condition (an `IS NULL OR` would only be a filter over every newer message).
    sqlx::query_scalar::<_, NaiveDate>(
        "SELECT (created_at AT TIME ZONE $4)::date FROM messages
         WHERE owner = $1 AND thread_id = $2
           AND created_at < COALESCE($3::date::timestamp AT TIME ZONE $4, 'infinity')
         ORDER BY created_at DESC
         LIMIT 1",
    )
    .bind(owner)
    .bind(thread_id)
    .bind(before)
    .bind(tz)
    .fetch_optional(pool)
    .await
}

/// The instants `day` starts and ends at in time zone `tz`.
pub(crate) async fn day_bounds(
    pool: &PgPool,
    day: NaiveDate,
    tz: &str,
) -> sqlx::Result<(DateTime<Utc>, DateTime<Utc>)> {
    sqlx::query_as(
        "SELECT ($1::date::timestamp AT TIME ZONE $2), (($1::date + 1)::timestamp AT TIME ZONE $2)",
    )
    .bind(day)
    .bind(tz)
    .fetch_one(pool)
    .await
}

/// Every time zone name PostgreSQL knows (loaded once at start).
pub(crate) async fn time_zone_names(pool: &PgPool) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar("SELECT name FROM pg_timezone_names")
        .fetch_all(pool)
        .await
}

/// The messages written in `[from, to)`, in `seq` order.
pub(crate) async fn messages_between(
    pool: &PgPool,
    owner: &str,
    thread_id: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<Vec<MessageRow>> {
    sqlx::query_as(
        "SELECT message_id, seq, role, content, metadata, created_at FROM messages
         WHERE owner = $1 AND thread_id = $2 AND created_at >= $3 AND created_at < $4
         ORDER BY seq",
    )
    .bind(owner)
    .bind(thread_id)
    .bind(from)
    .bind(to)
    .fetch_all(pool)
    .await
}

/// Whether any message was written before `at`.
pub(crate) async fn has_messages_before(
    pool: &PgPool,
    owner: &str,
    thread_id: &str,
    at: DateTime<Utc>,
) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM messages WHERE owner = $1 AND thread_id = $2 AND created_at < $3)",
    )
    .bind(owner)
    .bind(thread_id)
    .bind(at)
    .fetch_one(pool)
    .await
}

/// A thread in the caller's list.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct ThreadRow {
    pub(crate) thread_id: String,
    pub(crate) last_seq: i64,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
}

/// The owner's threads, most recently active first, strictly after the cursor `(updated_at,
/// thread_id)` when one is given (keyset pagination: stable under inserts).
pub(crate) async fn threads(
    pool: &PgPool,
    owner: &str,
    after: Option<(DateTime<Utc>, String)>,
    limit: i64,
) -> sqlx::Result<Vec<ThreadRow>> {
    let (at, id) = after.unzip();
    sqlx::query_as(
        "SELECT thread_id, last_seq, created_at, updated_at FROM threads
         WHERE owner = $1 AND ($2::timestamptz IS NULL OR (updated_at, thread_id) < ($2, $3))
         ORDER BY updated_at DESC, thread_id DESC
         LIMIT $4",
    )
    .bind(owner)
    .bind(at)
    .bind(id)
    .bind(limit)
    .fetch_all(pool)
    .await
}
