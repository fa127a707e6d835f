//! The writes: the user messages of accepted runs, and the changes of run events.

use chrono::{DateTime, Utc};
use protocol::messaging::{RunEventV1, RunStatus, RunTaskV1};
use protocol::metadata::{
    AgentChatMessageMetadata as Metadata, AttachedFile, STAGE_INPUT, STAGE_TOOL_EXECUTION,
    StoredToolCall, keys,
};
use protocol::run_input::Message;
use protocol::threads::derived_title;
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{PgPool, Postgres, Transaction};
use uuid::Uuid;

use super::{Outcome, Role, status_column};
use crate::changes::{Change, changes};

/// Persists the user message of an accepted run, once (with the input's own JSON of it in
/// `agui`, what a remote agent is given back), and the run in `run_progress` with where its
/// task is in the RUNS stream (`runs_seq`).
pub(crate) async fn record_accepted_run(
    pool: &PgPool,
    task: &RunTaskV1,
    runs_seq: u64,
) -> sqlx::Result<Outcome> {
    let mut tx = pool.begin().await?;
    // Not an erased run's (a redelivery after its thread was erased): that is told apart below,
    // off the path of every accepted run.
    let inserted = sqlx::query_scalar!(
        "INSERT INTO run_progress (task_id, owner, thread_id, run_id, accepted_at, runs_seq, agent)
         SELECT $1, $2, $3, $4, $5, $6, $7
          WHERE NOT EXISTS (SELECT 1 FROM erased_runs WHERE task_id = $1)
         ON CONFLICT (task_id) DO NOTHING
         RETURNING task_id",
        task.task_id,
        task.owner,
        task.input.thread_id,
        task.input.run_id,
        task.accepted_at,
        i64::try_from(runs_seq).ok(),
        task.agent
    )
    .fetch_optional(&mut *tx)
    .await?;
    if inserted.is_none() {
        return Ok(if erased_run(&mut tx, task.task_id).await? {
            Outcome::Erased
        } else {
            Outcome::Duplicate
        });
    }
    if task.conversation {
        record_conversation(&mut tx, task).await?;
        tx.commit().await?;
        return Ok(Outcome::Written);
    }
    let Some(message @ Message::User(user)) = task.input.messages.first() else {
        // Validation guarantees a first user message; a task without one has nothing to keep.
        tx.commit().await?;
        return Ok(Outcome::Written);
    };
    if thread_holds(&mut tx, &task.owner, &task.input.thread_id, &user.id).await? {
        // The turn is stored already: a run again on it (a retry, or a regenerated reply).
        regenerate(&mut tx, task, &user.id).await?;
        tx.commit().await?;
        return Ok(Outcome::Written);
    }
    let text = user.content.text();
    insert_message(
        &mut tx,
        NewMessage {
            owner: &task.owner,
            thread_id: &task.input.thread_id,
            task_id: task.task_id,
            message_id: &user.id,
            role: Role::User,
            content: &text,
            metadata: input_metadata(task, &user.id, true),
            agui: as_input(message),
            title: derived_title(&text, task.attachments.first().map(AttachedFile::name)),
            created_at: task.accepted_at,
        },
    )
    .await?;
    tx.commit().await?;
    Ok(Outcome::Written)
}

/// Metadata of a message that came in with the run; the new user message carries its files.
fn input_metadata(task: &RunTaskV1, message_id: &str, new_turn: bool) -> Metadata {
    // The seed's `user_message_attachments` is one object (bucket, path, MIME type): the first
    // file. A message may carry up to three, so all of them, with name and size for the
    // file-attachments history shape, are kept in `user_message_attachment_list`.
    let first = task.attachments.first().filter(|_| new_turn);
    Metadata {
        user_message_attachments: first.map(AttachedFile::location),
        user_message_attachment_list: first.map(|_| task.attachments.clone()),
        ..Metadata::of_run(&task.input.run_id, message_id, STAGE_INPUT)
    }
}

/// A user message exactly as the run's input carried it (the `messages.agui` column).
fn as_input(message: &Message) -> Option<Value> {
    serde_json::to_value(message).ok()
}

/// Most bytes of text (content and tool-call arguments) kept of one assistant or tool message a
/// client resends that history did not produce; the rest is cut off.
pub(crate) const RESENT_MESSAGE_BYTES: usize = 32 * 1024;
/// Most messages a resent conversation may add to its thread in one run, besides the new turn.
pub(crate) const RESENT_MESSAGES_PER_RUN: usize = 64;
/// Most bytes (text, tool calls, a user message's input form) those may add.
pub(crate) const RESENT_BYTES_PER_RUN: usize = 128 * 1024;

/// A message of a resent conversation the thread does not hold yet, as it would be stored.
struct Resent<'a> {
    message_id: &'a str,
    role: Role,
    content: String,
    metadata: Metadata,
    agui: Option<Value>,
    /// The title a user message gives its thread if it has none yet.
    title: Option<String>,
    /// The run's new user message: always kept.
    new_turn: bool,
    /// Bytes it adds to the thread, as the per-run bound counts them.
    bytes: usize,
    /// Whether its text was cut to [`RESENT_MESSAGE_BYTES`].
    cut: bool,
}

/// A conversation resent whole by its client: keeps, in order, the user, assistant and tool
/// messages the thread does not hold yet (recognised by id), so a resent turn is never stored
/// twice.
///
/// What a client resends is its own word, not what the agent said: of the messages history has
/// not seen, an assistant or tool message keeps at most [`RESENT_MESSAGE_BYTES`] of text, and
/// one run adds at most [`RESENT_MESSAGES_PER_RUN`] of them and [`RESENT_BYTES_PER_RUN`] besides
/// the new user message, the newest first (the part nearest the new turn; what is older is not
/// stored, counted and logged). The run itself is not affected.
async fn record_conversation(
    tx: &mut Transaction<'_, Postgres>,
    task: &RunTaskV1,
) -> sqlx::Result<()> {
    lock_thread(tx, &task.owner, &task.input.thread_id, task.accepted_at).await?;
    let messages = &task.input.messages;
    let new_turn = messages.iter().rposition(|m| matches!(m, Message::User(_)));
    let mut seen = std::collections::HashSet::new();
    let mut unseen = Vec::new();
    for (at, message) in messages.iter().enumerate() {
        let id = message.id();
        if !seen.insert(id) {
            continue; // the same id twice in one request: the first one counts
        }
        let Some(resent) = resent(task, message, Some(at) == new_turn) else {
            continue; // system, developer, reasoning, activity: not conversation
        };
        if thread_holds(tx, &task.owner, &task.input.thread_id, id).await? {
            continue;
        }
        unseen.push(resent);
    }
    if let Some(Message::User(user)) = new_turn.map(|at| &messages[at])
        && !unseen.iter().any(|resent| resent.new_turn)
    {
        regenerate(tx, task, &user.id).await?;
    }
    let keep = within_run_bound(&unseen);
    let dropped = keep.iter().filter(|keep| !**keep).count();
    let mut cut = 0;
    for (resent, keep) in unseen.into_iter().zip(keep) {
        if !keep {
            continue;
        }
        cut += usize::from(resent.cut);
        insert_message(
            tx,
            NewMessage {
                owner: &task.owner,
                thread_id: &task.input.thread_id,
                task_id: task.task_id,
                message_id: resent.message_id,
                role: resent.role,
                content: &resent.content,
                metadata: resent.metadata,
                agui: resent.agui,
                title: resent.title,
                created_at: task.accepted_at,
            },
        )
        .await?;
    }
    if dropped > 0 || cut > 0 {
        metrics::counter!("switchboard_history_resent_messages_dropped_total")
            .increment(dropped as u64);
        metrics::counter!("switchboard_history_resent_messages_cut_total").increment(cut as u64);
        tracing::warn!(
            task.id = %task.task_id,
            dropped,
            cut,
            "a resent conversation held more than one run may store: older messages left out, long ones cut"
        );
    }
    Ok(())
}

/// `message` as it would be stored, its text cut to [`RESENT_MESSAGE_BYTES`] unless a user
/// wrote it (the run input's rules bound those); `None` for a message that is not conversation.
fn resent<'a>(task: &RunTaskV1, message: &'a Message, new_turn: bool) -> Option<Resent<'a>> {
    let id = message.id();
    let mut metadata = input_metadata(task, id, new_turn);
    let mut room = RESENT_MESSAGE_BYTES;
    let mut cut = false;
    let mut title = None;
    let (role, content, agui, bytes) = match message {
        Message::User(user) => {
            let agui = as_input(message);
            let content = user.content.text();
            let bytes = content.len() + agui.as_ref().map_or(0, |a| a.to_string().len());
            let first_file = task.attachments.first().filter(|_| new_turn);
            title = derived_title(&content, first_file.map(AttachedFile::name));
            (Role::User, content, agui, bytes)
        }
        Message::Assistant(assistant) => {
            let mut bytes = 0;
            if let Some(calls) = &assistant.tool_calls {
                let calls = calls
                    .iter()
                    .map(|c| {
                        let mut arguments = c.function.arguments.clone();
                        cut |= cut_to(&mut arguments, room);
                        room -= arguments.len();
                        bytes += c.id.len() + c.function.name.len() + arguments.len();
                        StoredToolCall {
                            id: c.id.clone(),
                            name: c.function.name.clone(),
                            arguments,
                        }
                    })
                    .collect();
                metadata.tool_calls = Some(calls);
            }
            let mut content = assistant.content.clone().unwrap_or_default();
            cut |= cut_to(&mut content, room);
            bytes += content.len();
            (Role::Assistant, content, None, bytes)
        }
        Message::Tool(tool) => {
            metadata.tool_call_id = Some(tool.tool_call_id.clone());
            metadata.stage = Some(STAGE_TOOL_EXECUTION.to_owned());
            let mut content = tool.content.clone();
            cut |= cut_to(&mut content, room);
            let bytes = tool.tool_call_id.len() + content.len();
            (Role::Tool, content, None, bytes)
        }
        _ => return None,
    };
    if cut {
        metadata.truncated = Some(true);
    }
    Some(Resent {
        message_id: id,
        role,
        content,
        metadata,
        agui,
        title,
        new_turn,
        bytes,
        cut,
    })
}

/// Cuts `text` to at most `max` bytes at a character boundary; whether it cut anything.
fn cut_to(text: &mut String, max: usize) -> bool {
    if text.len() <= max {
        return false;
    }
    text.truncate(text.floor_char_boundary(max));
    true
}

/// Which of `unseen` (in conversation order) one run stores: the new turn always; the others
/// from the newest back, while they fit in [`RESENT_MESSAGES_PER_RUN`] and
/// [`RESENT_BYTES_PER_RUN`]; from the first that does not, none older (the stored part stays
/// one unbroken stretch of the conversation).
fn within_run_bound(unseen: &[Resent<'_>]) -> Vec<bool> {
    let mut keep = vec![false; unseen.len()];
    let (mut count, mut bytes, mut full) = (0, 0, false);
    for (at, message) in unseen.iter().enumerate().rev() {
        if message.new_turn {
            keep[at] = true;
            continue;
        }
        full = full
            || count + 1 > RESENT_MESSAGES_PER_RUN
            || bytes + message.bytes > RESENT_BYTES_PER_RUN;
        if !full {
            keep[at] = true;
            count += 1;
            bytes += message.bytes;
        }
    }
    keep
}

/// Applies one run event, exactly once and in per-run order: the event's [`Change`]s (a pure
/// function of it) and the run's progress, in one transaction.
pub(crate) async fn apply_event(pool: &PgPool, event: &RunEventV1) -> sqlx::Result<Outcome> {
    let mut tx = pool.begin().await?;
    let progress = sqlx::query_as!(
        Progress,
        r#"SELECT p.last_event_seq, p.owner, p.accepted_at, p.regenerates,
                  p.ended_at IS NULL AS "open!", e.task_id IS NOT NULL AS "erased!"
             FROM run_progress p LEFT JOIN erased_runs e ON e.task_id = p.task_id
            WHERE p.task_id = $1 FOR UPDATE OF p"#,
        event.task_id
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some(Progress {
        last_event_seq: last_seq,
        owner,
        accepted_at,
        regenerates,
        open,
        erased,
    }) = progress
    else {
        // Not written yet, or erased with its thread (an event of a run that was ending).
        return Ok(if erased_run(&mut tx, event.task_id).await? {
            Outcome::Erased
        } else {
            Outcome::NotYet
        });
    };
    if erased {
        return Ok(Outcome::Erased);
    }
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
    for mut change in changes(event, accepted_at) {
        if let (Change::EnsureAssistant { metadata, .. }, Some(user_message_id)) =
            (&mut change, &regenerates)
        {
            metadata.regenerates = Some(user_message_id.clone());
        }
        apply(&mut tx, event, change).await?;
    }
    // The run's first start, output and end stay (a redelivered run starts again).
    let marks = crate::changes::marks(event);
    sqlx::query!(
        "UPDATE run_progress SET last_event_seq = $2,
             started_at = coalesce(started_at, $3),
             first_output_at = coalesce(first_output_at, $4),
             ended_at = coalesce(ended_at, $5),
             prompt_ids = coalesce($6, prompt_ids)
         WHERE task_id = $1",
        event.task_id,
        seq,
        marks.started_at,
        marks.first_output_at,
        marks.ended_at,
        marks.prompt_ids.as_deref()
    )
    .execute(&mut *tx)
    .await?;
    let kept = if open && marks.ended_at.is_some() {
        super::add_run(&mut tx, event.task_id).await?
    } else {
        None
    };
    tx.commit().await?;
    Ok(kept.map_or(Outcome::Written, |kept| Outcome::Ended { kept }))
}

/// How far a run's events are applied, and what every event of it is checked against.
struct Progress {
    last_event_seq: i64,
    owner: String,
    accepted_at: DateTime<Utc>,
    /// The user message whose reply the run regenerates.
    regenerates: Option<String>,
    /// The run has not ended yet (its first end counts its bytes).
    open: bool,
    /// The run is being erased with its thread.
    erased: bool,
}

/// Whether the run was erased (`erased_runs`).
async fn erased_run(tx: &mut Transaction<'_, Postgres>, task_id: Uuid) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM erased_runs WHERE task_id = $1) AS "erased!""#,
        task_id
    )
    .fetch_one(&mut **tx)
    .await
}

/// One change, by the store function that makes it.
async fn apply(
    tx: &mut Transaction<'_, Postgres>,
    event: &RunEventV1,
    change: Change,
) -> sqlx::Result<()> {
    let task_id = event.task_id;
    match change {
        Change::Status(status) => set_status(tx, task_id, status).await,
        Change::Error(message) => set_error(tx, task_id, &message).await,
        Change::EnsureAssistant {
            message_id,
            metadata,
        } => ensure_message(tx, event, &message_id, Role::Assistant, metadata).await,
        Change::AppendText { message_id, delta } => {
            append_text(tx, task_id, &message_id, &delta).await
        }
        Change::ToolCallStarted {
            tool_call_id,
            message_id,
            name,
        } => {
            let seq = i64::try_from(event.seq).unwrap_or(i64::MAX);
            start_tool_call(tx, task_id, &tool_call_id, &message_id, &name, seq).await?;
            refresh_tool_calls(tx, task_id, &tool_call_id).await
        }
        Change::ToolCallArgs {
            tool_call_id,
            delta,
        } => append_tool_args(tx, task_id, &tool_call_id, &delta).await,
        Change::ToolCallEnded {
            tool_call_id,
            latency_ms,
        } => {
            refresh_tool_calls(tx, task_id, &tool_call_id).await?;
            set_tool_message_latency(tx, task_id, &tool_call_id, latency_ms).await
        }
        Change::ToolResult {
            message_id,
            tool_call_id,
            content,
            mut metadata,
        } => {
            metadata.tool_name = tool_name(tx, task_id, &tool_call_id).await?;
            insert_message(
                tx,
                NewMessage {
                    owner: &event.owner,
                    thread_id: &event.thread_id,
                    task_id,
                    message_id: &message_id,
                    role: Role::Tool,
                    content: &content,
                    metadata,
                    agui: None,
                    title: None,
                    created_at: event.emitted_at,
                },
            )
            .await
        }
        Change::MergeMetadata { message_id, fields } => {
            merge_metadata(tx, task_id, &message_id, &fields).await
        }
        Change::Usage(usage) => record_usage(tx, task_id, &usage).await,
        Change::Ignored(why) => {
            tracing::warn!(task.id = %task_id, reason = %why, "event ignored");
            Ok(())
        }
    }
}

/// The run's tokens, one row per provider and model (a model without a name is kept as "").
async fn record_usage(
    tx: &mut Transaction<'_, Postgres>,
    task_id: Uuid,
    usage: &[protocol::usage::TokenUsage],
) -> sqlx::Result<()> {
    let tokens = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    for entry in usage {
        sqlx::query!(
            "INSERT INTO run_usage (task_id, provider, model, input_tokens, output_tokens,
                                    total_tokens, reasoning_tokens, cached_input_tokens)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (task_id, provider, model) DO NOTHING",
            task_id,
            entry.provider.as_deref().unwrap_or(""),
            entry.model.as_deref().unwrap_or(""),
            tokens(entry.input_tokens),
            tokens(entry.output_tokens),
            tokens(entry.total_tokens),
            entry.reasoning_tokens.map(tokens),
            entry.cached_input_tokens.map(tokens)
        )
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

async fn append_text(
    tx: &mut Transaction<'_, Postgres>,
    task_id: Uuid,
    message_id: &str,
    delta: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE messages SET content = content || $3 WHERE task_id = $1 AND message_id = $2",
        task_id,
        message_id,
        delta
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn start_tool_call(
    tx: &mut Transaction<'_, Postgres>,
    task_id: Uuid,
    tool_call_id: &str,
    message_id: &str,
    name: &str,
    seq: i64,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO tool_calls (task_id, tool_call_id, message_id, name, started_seq)
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (task_id, tool_call_id) DO NOTHING",
        task_id,
        tool_call_id,
        message_id,
        name,
        seq
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn append_tool_args(
    tx: &mut Transaction<'_, Postgres>,
    task_id: Uuid,
    tool_call_id: &str,
    delta: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE tool_calls SET arguments = arguments || $3 WHERE task_id = $1 AND tool_call_id = $2",
        task_id,
        tool_call_id,
        delta
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A message made only of tool calls ends with its last call; a text message keeps the latency
/// its `TEXT_MESSAGE_END` set.
async fn set_tool_message_latency(
    tx: &mut Transaction<'_, Postgres>,
    task_id: Uuid,
    tool_call_id: &str,
    latency_ms: i64,
) -> sqlx::Result<()> {
    let latency = Metadata {
        latency_ms: Some(latency_ms),
        ..Metadata::default()
    };
    sqlx::query!(
        "UPDATE messages SET metadata = metadata || $3
         WHERE task_id = $1 AND NOT metadata ? $4
           AND message_id = (SELECT message_id FROM tool_calls WHERE task_id = $1 AND tool_call_id = $2)",
        task_id,
        tool_call_id,
        Json(&latency) as _,
        keys::LATENCY_MS
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn tool_name(
    tx: &mut Transaction<'_, Postgres>,
    task_id: Uuid,
    tool_call_id: &str,
) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!(
        "SELECT name FROM tool_calls WHERE task_id = $1 AND tool_call_id = $2",
        task_id,
        tool_call_id
    )
    .fetch_optional(&mut **tx)
    .await
}

async fn set_status(
    tx: &mut Transaction<'_, Postgres>,
    task_id: Uuid,
    status: RunStatus,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE run_progress SET status = $2 WHERE task_id = $1",
        task_id,
        status_column(status)
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn set_error(
    tx: &mut Transaction<'_, Postgres>,
    task_id: Uuid,
    message: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE run_progress SET error = $2 WHERE task_id = $1",
        task_id,
        message
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

struct NewMessage<'a> {
    owner: &'a str,
    thread_id: &'a str,
    task_id: Uuid,
    message_id: &'a str,
    role: Role,
    content: &'a str,
    metadata: Metadata,
    /// A user message as its run's input carried it; `None` for what the agent made.
    agui: Option<Value>,
    /// The title the message gives its thread if the thread has none yet (a user message's).
    title: Option<String>,
    created_at: DateTime<Utc>,
}

/// Whether the thread holds a message with this id (of any run).
/// A run on a user message the thread holds already: if the thread has messages after it that
/// the run's input leaves out (the client dropped the reply to ask again), they are superseded
/// by this run (`metadata.superseded_by`, the run id; kept, and shown as a previous version) and
/// the run's own messages are marked `regenerates` (`run_progress.regenerates`). A continuation
/// (an answered prompt) or an AG-UI client resending the whole conversation supersedes nothing.
async fn regenerate(
    tx: &mut Transaction<'_, Postgres>,
    task: &RunTaskV1,
    user_message_id: &str,
) -> sqlx::Result<()> {
    if task.resumed.is_some() {
        return Ok(());
    }
    let resent: Vec<String> = task
        .input
        .messages
        .iter()
        .map(|m| m.id().to_owned())
        .collect();
    let superseded_by = Metadata {
        superseded_by: Some(task.input.run_id.clone()),
        ..Metadata::default()
    };
    let superseded = sqlx::query!(
        r#"UPDATE messages SET metadata = metadata || $5
            WHERE owner = $1 AND thread_id = $2
              AND seq > (SELECT max(seq) FROM messages
                          WHERE owner = $1 AND thread_id = $2 AND message_id = $3
                            AND role = 'user')
              AND NOT (metadata ? $6)
              AND message_id <> ALL($4)"#,
        task.owner,
        task.input.thread_id,
        user_message_id,
        &resent,
        Json(&superseded_by) as _,
        keys::SUPERSEDED_BY
    )
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if superseded > 0 {
        sqlx::query!(
            "UPDATE run_progress SET regenerates = $2 WHERE task_id = $1",
            task.task_id,
            user_message_id
        )
        .execute(&mut **tx)
        .await?;
        metrics::counter!("switchboard_history_replies_regenerated_total").increment(1);
    }
    Ok(())
}

async fn thread_holds(
    tx: &mut Transaction<'_, Postgres>,
    owner: &str,
    thread_id: &str,
    message_id: &str,
) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (
             SELECT 1 FROM messages WHERE owner = $1 AND thread_id = $2 AND message_id = $3
           ) AS "exists!""#,
        owner,
        thread_id,
        message_id
    )
    .fetch_one(&mut **tx)
    .await
}

/// Inserts the run's message `message_id` unless the thread holds it (a tool call may have created it
/// before its text starts, or the other way round).
async fn ensure_message(
    tx: &mut Transaction<'_, Postgres>,
    event: &RunEventV1,
    message_id: &str,
    role: Role,
    metadata: Metadata,
) -> sqlx::Result<()> {
    // By thread, not by run: a conversation resent by its client may have stored this very
    // message (by id) before this run's events arrived. Under the thread's lock, so the two
    // consumers never both decide to insert it.
    lock_thread(tx, &event.owner, &event.thread_id, event.emitted_at).await?;
    if thread_holds(tx, &event.owner, &event.thread_id, message_id).await? {
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
            agui: None,
            title: None,
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
    sqlx::query!(
        "INSERT INTO threads (owner, thread_id, last_seq, created_at, updated_at)
         VALUES ($1, $2, 0, $3, $3) ON CONFLICT (owner, thread_id) DO NOTHING",
        owner,
        thread_id,
        at
    )
    .execute(&mut **tx)
    .await?;
    // The row exists now; its lock is what counts, not the answer.
    sqlx::query_scalar!(
        "SELECT 1 AS locked FROM threads WHERE owner = $1 AND thread_id = $2 FOR UPDATE",
        owner,
        thread_id
    )
    .fetch_optional(&mut **tx)
    .await?;
    Ok(())
}

/// Adds the fields set in `fields` to the metadata of the run's message `message_id` (if it
/// exists), in the database: another run may mark the message superseded meanwhile.
async fn merge_metadata(
    tx: &mut Transaction<'_, Postgres>,
    task_id: Uuid,
    message_id: &str,
    fields: &Metadata,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE messages SET metadata = metadata || $3 WHERE task_id = $1 AND message_id = $2",
        task_id,
        message_id,
        Json(fields) as _
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Rebuilds `metadata.tool_calls` (in call order) of the message the tool call `tool_call_id`
/// belongs to. Only this run's events (applied one at a time) change its calls.
async fn refresh_tool_calls(
    tx: &mut Transaction<'_, Postgres>,
    task_id: Uuid,
    tool_call_id: &str,
) -> sqlx::Result<()> {
    let calls = sqlx::query!(
        r#"SELECT c.message_id, c.tool_call_id AS id, c.name, c.arguments
             FROM tool_calls c
             JOIN tool_calls t ON t.task_id = c.task_id AND t.message_id = c.message_id
            WHERE t.task_id = $1 AND t.tool_call_id = $2
            ORDER BY c.started_seq"#,
        task_id,
        tool_call_id
    )
    .fetch_all(&mut **tx)
    .await?;
    let Some(message_id) = calls.first().map(|call| call.message_id.clone()) else {
        return Ok(());
    };
    let tool_calls = calls
        .into_iter()
        .map(|call| StoredToolCall {
            id: call.id,
            name: call.name,
            arguments: call.arguments,
        })
        .collect();
    let fields = Metadata {
        tool_calls: Some(tool_calls),
        ..Metadata::default()
    };
    merge_metadata(tx, task_id, &message_id, &fields).await
}

/// Inserts a message at the thread's next `seq` (allocated under the thread row's lock); the
/// thread takes the message's title if it has none yet: the first user message that gives one
/// titles it, and a title its owner gave stays.
async fn insert_message(tx: &mut Transaction<'_, Postgres>, m: NewMessage<'_>) -> sqlx::Result<()> {
    let seq = sqlx::query_scalar!(
        "INSERT INTO threads (owner, thread_id, last_seq, created_at, updated_at, title)
         VALUES ($1, $2, 1, $3, $3, $4)
         ON CONFLICT (owner, thread_id) DO UPDATE
           SET last_seq = threads.last_seq + 1,
               updated_at = GREATEST(threads.updated_at, EXCLUDED.updated_at),
               title = COALESCE(threads.title, EXCLUDED.title)
         RETURNING last_seq",
        m.owner,
        m.thread_id,
        m.created_at,
        m.title
    )
    .fetch_one(&mut **tx)
    .await?;
    sqlx::query!(
        "INSERT INTO messages (id, owner, thread_id, seq, task_id, message_id, role, content, metadata, agui, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        Uuid::now_v7(),
        m.owner,
        m.thread_id,
        seq,
        m.task_id,
        m.message_id,
        m.role.as_str(),
        m.content,
        Json(&m.metadata) as _,
        m.agui,
        m.created_at
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn task(messages: Value, attachments: Value) -> RunTaskV1 {
        serde_json::from_value(json!({
            "task_id": Uuid::nil(), "owner": "alice", "accepted_at": "2026-03-15T10:00:00Z",
            "input": {"threadId": "t", "runId": "r1", "state": {}, "tools": [], "context": [],
                      "forwardedProps": {}, "messages": messages},
            "attachments": attachments,
        }))
        .unwrap()
    }

    /// The JSON a message's metadata is stored as.
    fn stored(metadata: &Metadata) -> Value {
        serde_json::to_value(metadata).unwrap()
    }

    #[test]
    fn a_new_user_message_is_stored_with_its_files_as_before() {
        let files = json!([
            {"bucket": "b", "path": "u/t/r/a.png", "mime_type": "image/png", "file_name": "a.png", "size_bytes": 12},
            {"bucket": "b", "path": "u/t/r/b.pdf", "mime_type": "application/pdf", "file_name": "b.pdf", "size_bytes": 34}
        ]);
        let task = task(
            json!([{"id": "u1", "role": "user", "content": "look"}]),
            files.clone(),
        );
        assert_eq!(
            stored(&input_metadata(&task, "u1", true)),
            json!({"run_id": "r1", "message_id": "u1", "stage": "input",
                   "user_message_attachments": {"bucket": "b", "path": "u/t/r/a.png", "mime_type": "image/png"},
                   "user_message_attachment_list": files})
        );
        assert_eq!(
            stored(&input_metadata(&task, "u0", false)),
            json!({"run_id": "r1", "message_id": "u0", "stage": "input"}),
            "an earlier message of the conversation has no files"
        );
    }

    #[test]
    fn resent_assistant_and_tool_messages_are_stored_as_before() {
        let long = "x".repeat(RESENT_MESSAGE_BYTES + 1);
        let task = task(
            json!([
                {"id": "a1", "role": "assistant", "content": "calling",
                 "toolCalls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"id": "t1", "role": "tool", "toolCallId": "c1", "content": long},
                {"id": "u2", "role": "user", "content": "again"}
            ]),
            json!([]),
        );
        let messages = &task.input.messages;
        let assistant = resent(&task, &messages[0], false).unwrap();
        assert_eq!(
            stored(&assistant.metadata),
            json!({"run_id": "r1", "message_id": "a1", "stage": "input",
                   "tool_calls": [{"id": "c1", "name": "f", "arguments": "{}"}]})
        );
        let tool = resent(&task, &messages[1], false).unwrap();
        assert_eq!(
            stored(&tool.metadata),
            json!({"run_id": "r1", "message_id": "t1", "stage": "tool_execution",
                   "tool_call_id": "c1", "truncated": true})
        );
    }

    fn unseen(bytes: &[usize], new_turn: Option<usize>) -> Vec<Resent<'static>> {
        bytes
            .iter()
            .enumerate()
            .map(|(at, &bytes)| Resent {
                message_id: "m",
                role: Role::Assistant,
                content: String::new(),
                metadata: Metadata::default(),
                agui: None,
                title: None,
                new_turn: Some(at) == new_turn,
                bytes,
                cut: false,
            })
            .collect()
    }

    #[test]
    fn a_run_keeps_the_newest_resent_messages_that_fit_and_none_older() {
        let big = RESENT_BYTES_PER_RUN / 2;
        // Oldest first: the two newest fit, the third does not, and the small one before it
        // is not kept either (no hole in the stored stretch); the new turn always is.
        let keep = within_run_bound(&unseen(&[1, big, 10, big, big, 50_000], Some(5)));
        assert_eq!(keep, [false, false, false, true, true, true]);
        let keep = within_run_bound(&unseen(&[1; RESENT_MESSAGES_PER_RUN + 3], None));
        assert_eq!(keep.iter().filter(|k| **k).count(), RESENT_MESSAGES_PER_RUN);
        assert!(
            keep[3..].iter().all(|k| *k),
            "the newest {RESENT_MESSAGES_PER_RUN}"
        );
    }

    #[test]
    fn a_cut_ends_on_a_character_boundary_within_the_bound() {
        let mut text = "é".repeat(10); // 2 bytes each
        assert!(cut_to(&mut text, 5));
        assert_eq!(text, "éé");
        let mut short = "abc".to_owned();
        assert!(!cut_to(&mut short, 3));
        assert_eq!(short, "abc");
    }
}
