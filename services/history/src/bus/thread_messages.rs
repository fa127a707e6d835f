//! A thread's earlier messages in AG-UI form: the request/reply endpoint a worker asks before it
//! relays a run to a remote agent, which keeps nothing between requests and so is sent the
//! conversation every time. History owns the messages; the worker owns none.
//!
//! Read-your-writes: the asking run holds its thread's lock, so every earlier run of the thread
//! has ended and published all its events. The answer waits (at most [`CATCH_UP`]) until history
//! has written every run up to the asking run's `runs_seq` (the RUNS consumer's ack floor, as the
//! run lookup does) and every event in the RUN_EVENTS stream of each earlier run of the thread
//! that has not ended in history's view; otherwise it is `Behind` and the caller asks again. So
//! the previous run's reply is never missing, and a run whose events are gone from the stream
//! (retention) never holds the thread up for good. A user message is answered exactly as its
//! run's input carried it (`messages.agui`); the agent's messages are rebuilt from the stored
//! text and tool calls.

use std::sync::Arc;

use async_nats::jetstream::stream::{LastRawMessageErrorKind, Stream};
use protocol::agui_files::{file_refs, replace_files};
use protocol::messaging::{
    MAX_THREAD_MESSAGES, Names, RunEventMessage, ThreadMessagesReply, ThreadMessagesRequest,
};
use serde_json::{Map, Value, json};
use sqlx::PgPool;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::bus::ingest::PullConsumer;
use crate::bus::lookup::{CATCH_UP, CATCH_UP_STEP, caught_up};
use crate::bus::respond;
use crate::sign::UrlSigner;
use crate::store::{self, AguiRow, Role};

/// Where the endpoint finds how far history has written.
pub(crate) struct Written {
    /// History's RUNS consumer (its ack floor: runs written).
    pub(crate) runs: PullConsumer,
    /// The RUN_EVENTS stream (each run's last event, against what history applied).
    pub(crate) events: Stream,
}

/// Answers [`ThreadMessagesRequest`]s until `shutdown`; an error gets no answer (the caller
/// times out).
pub(crate) async fn serve(
    client: async_nats::Client,
    names: Names,
    pool: PgPool,
    written: Written,
    signer: Arc<UrlSigner>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let (pool, written, names_ref, signer) = (&pool, &written, &names, &*signer);
    respond::serve(
        client,
        &names,
        names.history_thread_messages_subject(),
        shutdown,
        || tracing::info_span!("history.thread_messages.handle", otel.kind = "server"),
        |request| answer(pool, written, names_ref, signer, request),
    )
    .await
}

async fn answer(
    pool: &PgPool,
    written: &Written,
    names: &Names,
    signer: &UrlSigner,
    request: ThreadMessagesRequest,
) -> anyhow::Result<ThreadMessagesReply> {
    let ThreadMessagesRequest::V1 {
        owner,
        thread_id,
        task_id,
        runs_seq,
        limit,
        signed_links,
    } = request;
    let deadline = Instant::now() + CATCH_UP;
    if !caught_up(&written.runs, runs_seq, deadline).await? {
        return Ok(ThreadMessagesReply::Behind);
    }
    let runs_seq = i64::try_from(runs_seq).unwrap_or(i64::MAX);
    // An asking run waits for the runs before it; a thread's snapshot (no asking run: the nil
    // id) for every run up to and including `runs_seq`.
    let before = if task_id.is_nil() {
        runs_seq.saturating_add(1)
    } else {
        runs_seq
    };
    loop {
        let unended = store::unended_runs_before(pool, &owner, &thread_id, task_id, before).await?;
        if !events_pending(&written.events, names, &unended).await? {
            break;
        }
        if Instant::now() >= deadline {
            return Ok(ThreadMessagesReply::Behind);
        }
        tokio::time::sleep(CATCH_UP_STEP).await;
    }
    let limit = limit.min(MAX_THREAD_MESSAGES);
    // One more than asked: whether older ones were left out.
    let rows = store::messages_before_run(
        pool,
        &owner,
        &thread_id,
        task_id,
        runs_seq,
        i64::from(limit) + 1,
    )
    .await?;
    let (mut messages, truncated) = shape(rows, limit);
    if signed_links {
        // For a client: every file part a link it can fetch now (or a note that it is gone).
        let refs = file_refs(&messages);
        if !refs.is_empty() {
            let signed = signer
                .sign(&owner, refs.iter().map(|r| r.url.clone()).collect())
                .await;
            replace_files(&mut messages, &refs, signed);
        }
    }
    Ok(ThreadMessagesReply::V1 {
        messages,
        truncated,
    })
}

/// Whether the RUN_EVENTS stream holds an event of one of `runs` that history has not written
/// yet. A run with no event there (not started, or its events expired) waits for nothing.
async fn events_pending(
    events: &Stream,
    names: &Names,
    runs: &[store::UnendedRun],
) -> anyhow::Result<bool> {
    for run in runs {
        if let Some(last) = last_event_seq(events, names, run.task_id).await?
            && last > run.last_event_seq
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// `seq` of the last event of the run `task_id` in the RUN_EVENTS stream, if any.
async fn last_event_seq(
    events: &Stream,
    names: &Names,
    task_id: Uuid,
) -> anyhow::Result<Option<i64>> {
    let subject = names.run_event_subject(task_id);
    let message = match events.get_last_raw_message_by_subject(&subject).await {
        Ok(message) => message,
        Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
        Err(err) => return Err(err.into()),
    };
    match serde_json::from_slice::<RunEventMessage>(&message.payload) {
        Ok(RunEventMessage::V1(event)) => Ok(Some(i64::try_from(event.seq).unwrap_or(i64::MAX))),
        // History drops an undecodable event too: nothing to wait for.
        Err(err) => {
            tracing::warn!(task.id = %task_id, error = %err, "undecodable last run event");
            Ok(None)
        }
    }
}

/// The AG-UI messages of `newest_first` (at most `limit + 1` rows), oldest first, and whether
/// more than `limit` were there (older ones left out).
fn shape(mut newest_first: Vec<AguiRow>, limit: u32) -> (Vec<Value>, bool) {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let truncated = newest_first.len() > limit;
    newest_first.truncate(limit);
    let messages = newest_first.iter().rev().map(agui_message).collect();
    (messages, truncated)
}

/// One stored message as an AG-UI message.
fn agui_message(row: &AguiRow) -> Value {
    match row.role {
        Role::User => row.agui.clone().unwrap_or_else(
            || json!({"id": row.message_id, "role": "user", "content": row.content}),
        ),
        Role::Assistant => {
            let mut message = Map::new();
            message.insert("id".into(), row.message_id.clone().into());
            message.insert("role".into(), "assistant".into());
            if !row.content.is_empty() {
                message.insert("content".into(), row.content.clone().into());
            }
            let calls = tool_calls(row);
            if !calls.is_empty() {
                message.insert("toolCalls".into(), Value::Array(calls));
            }
            Value::Object(message)
        }
        Role::Tool => json!({
            "id": row.message_id,
            "role": "tool",
            "toolCallId": row.metadata.tool_call_id.as_deref().unwrap_or_default(),
            "content": row.content,
        }),
    }
}

/// An assistant message's tool calls as AG-UI `ToolCall`s: from `tool_calls` (what the run's
/// events streamed), else from `metadata.tool_calls` (an assistant message a client resent
/// whole on the AG-UI route).
fn tool_calls(row: &AguiRow) -> Vec<Value> {
    let stored = row.tool_calls.as_ref().or(row.metadata.tool_calls.as_ref());
    stored
        .into_iter()
        .flatten()
        .filter_map(|call| serde_json::to_value(call.to_agui()).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use protocol::metadata::{AgentChatMessageMetadata as Metadata, StoredToolCall};

    use super::*;

    fn metadata(value: Value) -> Metadata {
        serde_json::from_value(value).unwrap()
    }

    fn row(message_id: &str, role: Role, content: &str) -> AguiRow {
        AguiRow {
            message_id: message_id.into(),
            role,
            content: content.into(),
            metadata: metadata(json!({"message_id": message_id})),
            agui: None,
            tool_calls: None,
        }
    }

    #[test]
    fn a_user_message_is_the_one_the_run_input_carried() {
        let input = json!({"id": "u1", "role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "binary", "mimeType": "image/png", "url": "s3://b/k.png"}
        ], "x-kept": 1});
        let stored = AguiRow {
            agui: Some(input.clone()),
            ..row("u1", Role::User, "look")
        };
        assert_eq!(agui_message(&stored), input);
    }

    #[test]
    fn a_user_message_written_before_the_agui_column_is_its_text() {
        assert_eq!(
            agui_message(&row("u1", Role::User, "hello")),
            json!({"id": "u1", "role": "user", "content": "hello"})
        );
    }

    #[test]
    fn an_assistant_message_has_content_only_when_it_said_something() {
        assert_eq!(
            agui_message(&row("a1", Role::Assistant, "hi")),
            json!({"id": "a1", "role": "assistant", "content": "hi"})
        );
        assert_eq!(
            agui_message(&row("a1", Role::Assistant, "")),
            json!({"id": "a1", "role": "assistant"})
        );
    }

    #[test]
    fn tool_calls_come_from_the_table_before_the_metadata() {
        let streamed = AguiRow {
            tool_calls: Some(vec![StoredToolCall {
                id: "c1".into(),
                name: "weather".into(),
                arguments: r#"{"city":"Oslo"}"#.into(),
            }]),
            metadata: metadata(
                json!({"tool_calls": [{"id": "c1", "name": "weather", "arguments": "{\"ci"}]}),
            ),
            ..row("a1", Role::Assistant, "")
        };
        assert_eq!(
            agui_message(&streamed),
            json!({"id": "a1", "role": "assistant", "toolCalls": [
                {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}}
            ]})
        );
        let resent = AguiRow {
            metadata: metadata(
                json!({"tool_calls": [{"id": "c2", "name": "f", "arguments": "{}"}]}),
            ),
            ..row("a2", Role::Assistant, "calling")
        };
        assert_eq!(
            agui_message(&resent),
            json!({"id": "a2", "role": "assistant", "content": "calling", "toolCalls": [
                {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ]})
        );
    }

    #[test]
    fn a_tool_result_names_its_call() {
        let result = AguiRow {
            metadata: metadata(json!({"tool_call_id": "c1", "tool_name": "weather"})),
            ..row("t1", Role::Tool, "18C")
        };
        assert_eq!(
            agui_message(&result),
            json!({"id": "t1", "role": "tool", "toolCallId": "c1", "content": "18C"})
        );
    }

    #[test]
    fn the_most_recent_messages_come_oldest_first_and_truncation_is_told() {
        let newest_first = || {
            vec![
                row("a2", Role::Assistant, "2"),
                row("u2", Role::User, "2"),
                row("a1", Role::Assistant, "1"),
            ]
        };
        let ids = |messages: &[Value]| {
            messages
                .iter()
                .map(|m| m["id"].as_str().unwrap_or_default().to_owned())
                .collect::<Vec<_>>()
        };
        let (messages, truncated) = shape(newest_first(), 2);
        assert_eq!(
            (ids(&messages), truncated),
            (vec!["u2".into(), "a2".into()], true)
        );
        let (messages, truncated) = shape(newest_first(), 3);
        assert_eq!(
            (ids(&messages), truncated),
            (vec!["a1".into(), "u2".into(), "a2".into()], false)
        );
        assert_eq!(shape(Vec::new(), 5), (Vec::new(), false));
        assert_eq!(shape(newest_first(), 0), (Vec::new(), true));
    }
}
