//! `<prefix>.history.thread-messages` against the real PostgreSQL and NATS: runs and their
//! events are published on the streams as runs and the worker publish them, history writes them,
//! and the endpoint answers the thread's earlier messages in AG-UI form.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream;
use platform::service::Service as _;
use protocol::messaging::{
    Names, ProgressReply, ProgressRequest, RunEventMessage, RunEventV1, RunTask, RunTaskV1,
    ThreadMessagesReply, ThreadMessagesRequest,
};
use serde_json::{Value, json};
use switchboard_history::{Application, Config};
use test_support::Infra;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The history service alone, on its own database and NATS prefix, and a client that publishes
/// what runs and the worker would.
struct TestHistory {
    infra: Infra,
    names: Names,
    client: async_nats::Client,
    js: jetstream::Context,
    shutdown: CancellationToken,
}

impl Drop for TestHistory {
    fn drop(&mut self) {
        self.shutdown.cancel();
        test_support::remove_nats_prefix_blocking(self.infra.nats_url.clone(), self.names.clone());
    }
}

/// A run as published on the RUNS stream: its task and the sequence the stream gave it.
struct Run {
    task: RunTaskV1,
    runs_seq: u64,
}

impl TestHistory {
    async fn spawn() -> anyhow::Result<Self> {
        let infra = Infra::from_env();
        let nats = infra.fresh_nats();
        let app = Application::build(Config {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            auth: infra.auth(),
            nats: nats.clone(),
            database_url: infra.fresh_database().await?,
            migrate_on_start: true,
            runs_sweep: std::time::Duration::from_secs(60),
            thread_ttl: Default::default(),
        })
        .await?;
        let shutdown = CancellationToken::new();
        tokio::spawn(app.run(shutdown.clone()));
        // As the runs service asks (history answers its callers' inboxes only).
        let client = async_nats::ConnectOptions::new()
            .custom_inbox_prefix(platform::nats_auth::inbox_prefix("runs"))
            .connect(&infra.nats_url)
            .await?;
        let js = jetstream::new(client.clone());
        Ok(Self {
            names: nats.names,
            infra,
            client,
            js,
            shutdown,
        })
    }

    /// Accepts a run of `owner` on `thread_id` with `messages` as its input (a whole resent
    /// conversation when `conversation`).
    async fn accept(
        &self,
        owner: &str,
        thread_id: &str,
        messages: Value,
        conversation: bool,
    ) -> anyhow::Result<Run> {
        let task: RunTaskV1 = serde_json::from_value(json!({
            "task_id": Uuid::now_v7(),
            "owner": owner,
            "accepted_at": chrono::Utc::now(),
            "input": {"threadId": thread_id, "runId": Uuid::new_v4().to_string(), "messages": messages},
            "conversation": conversation,
        }))?;
        let payload = serde_json::to_vec(&RunTask::V1(task.clone()))?;
        let ack = self
            .js
            .publish(self.names.run_queue_subject(), payload.into())
            .await?
            .await?;
        Ok(Run {
            task,
            runs_seq: ack.sequence,
        })
    }

    /// Publishes `events` of `run` as its events `first_seq`, `first_seq + 1`, ...
    async fn emit(&self, run: &Run, first_seq: u64, events: &[Value]) -> anyhow::Result<()> {
        for (seq, event) in (first_seq..).zip(events) {
            let message = RunEventMessage::V1(RunEventV1 {
                task_id: run.task.task_id,
                owner: run.task.owner.clone(),
                thread_id: run.task.input.thread_id.clone(),
                run_id: run.task.input.run_id.clone(),
                seq,
                emitted_at: chrono::Utc::now(),
                event: serde_json::from_value(event.clone())?,
            });
            self.js
                .publish(
                    self.names.run_event_subject(run.task.task_id),
                    serde_json::to_vec(&message)?.into(),
                )
                .await?
                .await?;
        }
        Ok(())
    }

    /// Waits until history has written the events of `run` up to `seq`.
    async fn written(&self, run: &Run, seq: u64) -> anyhow::Result<()> {
        let request = ProgressRequest::V1 {
            task_id: run.task.task_id,
        };
        let payload = serde_json::to_vec(&request)?;
        for _ in 0..200 {
            let reply = platform::rpc::request(
                &self.client,
                self.names.history_progress_subject(),
                payload.clone().into(),
                Duration::from_secs(10),
            )
            .await?;
            let ProgressReply::V1 { written_seq } = serde_json::from_slice(&reply.payload)?;
            if written_seq >= seq {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::bail!("history never wrote event {seq} of the run")
    }

    /// What history answers `owner` about the thread of `run`, asked by `run`.
    async fn ask_as(
        &self,
        owner: &str,
        run: &Run,
        limit: u32,
    ) -> anyhow::Result<ThreadMessagesReply> {
        let request = ThreadMessagesRequest::V1 {
            owner: owner.to_owned(),
            thread_id: run.task.input.thread_id.clone(),
            task_id: run.task.task_id,
            runs_seq: run.runs_seq,
            limit,
            signed_links: false,
        };
        let reply = platform::rpc::request(
            &self.client,
            self.names.history_thread_messages_subject(),
            serde_json::to_vec(&request)?.into(),
            Duration::from_secs(10),
        )
        .await
        .context("history did not answer within 10 s")?;
        Ok(serde_json::from_slice(&reply.payload)?)
    }

    async fn ask(&self, run: &Run, limit: u32) -> anyhow::Result<ThreadMessagesReply> {
        self.ask_as(&run.task.owner, run, limit).await
    }
}

/// The `V1` answer as JSON (what the wire carries), failing on `Behind`.
fn v1(reply: ThreadMessagesReply) -> anyhow::Result<Value> {
    anyhow::ensure!(reply != ThreadMessagesReply::Behind, "history is behind");
    Ok(serde_json::to_value(reply)?)
}

fn user(id: &str, content: Value) -> Value {
    json!({"id": id, "role": "user", "content": content})
}

/// A whole run of the built-in kind: text, a tool call with its result, text again.
fn answered_with_a_tool(thread_id: &str, run_id: &str) -> Vec<Value> {
    vec![
        json!({"type": "RUN_STARTED", "threadId": thread_id, "runId": run_id}),
        json!({"type": "REASONING_MESSAGE_CONTENT", "messageId": "r1", "delta": "weather, then"}),
        json!({"type": "TEXT_MESSAGE_START", "messageId": "a1", "role": "assistant"}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "a1", "delta": "Let me "}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "a1", "delta": "check."}),
        json!({"type": "TEXT_MESSAGE_END", "messageId": "a1"}),
        json!({"type": "TOOL_CALL_START", "toolCallId": "c1", "toolCallName": "weather", "parentMessageId": "a1"}),
        json!({"type": "TOOL_CALL_ARGS", "toolCallId": "c1", "delta": "{\"city\":"}),
        json!({"type": "TOOL_CALL_ARGS", "toolCallId": "c1", "delta": "\"Oslo\"}"}),
        json!({"type": "TOOL_CALL_END", "toolCallId": "c1"}),
        json!({"type": "TOOL_CALL_RESULT", "messageId": "t1", "toolCallId": "c1", "content": "18C"}),
        json!({"type": "TEXT_MESSAGE_START", "messageId": "a2", "role": "assistant"}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "a2", "delta": "It is 18C in Oslo."}),
        json!({"type": "TEXT_MESSAGE_END", "messageId": "a2"}),
        json!({"type": "RUN_FINISHED", "threadId": thread_id, "runId": run_id}),
    ]
}

#[tokio::test]
async fn a_thread_is_answered_in_agui_form_without_the_asking_run_or_later_ones()
-> anyhow::Result<()> {
    let history = TestHistory::spawn().await?;
    let thread = "weather-chat";
    // The first run: a user message of blocks (a file among them, an unknown field kept),
    // answered with text, a tool call and its result, and text again.
    let u1 = json!({"id": "u1", "role": "user", "x-client": {"draft": false}, "content": [
        {"type": "text", "text": "What is the weather here?"},
        {"type": "binary", "mimeType": "image/png", "url": "s3://uploads/alice/photo.png", "filename": "photo.png"}
    ]});
    let first = history.accept("alice", thread, json!([u1]), false).await?;
    let run_id = first.task.input.run_id.clone();
    let events = answered_with_a_tool(thread, &run_id);
    history.emit(&first, 1, &events).await?;
    // Written before the client resends it (else the resent a1 would be stored as new).
    history.written(&first, events.len() as u64).await?;
    // The second, on the AG-UI route: the conversation resent whole; only u2 is new.
    let u2 = json!({"id": "u2", "role": "user", "name": "al",
                    "content": [{"type": "text", "text": "And tomorrow?"}]});
    let second = history
        .accept(
            "alice",
            thread,
            json!([u1, {"id": "a1", "role": "assistant", "content": "Let me check."}, u2]),
            true,
        )
        .await?;
    let run_id = second.task.input.run_id.clone();
    history
        .emit(
            &second,
            1,
            &[
                json!({"type": "RUN_STARTED", "threadId": thread, "runId": run_id}),
                json!({"type": "TEXT_MESSAGE_START", "messageId": "a3", "role": "assistant"}),
                json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "a3", "delta": "Sunny."}),
                json!({"type": "TEXT_MESSAGE_END", "messageId": "a3"}),
                json!({"type": "RUN_FINISHED", "threadId": thread, "runId": run_id}),
            ],
        )
        .await?;
    history.written(&second, 5).await?;
    // The asking run, and one accepted after it (queued behind it on the thread).
    let asking = history
        .accept("alice", thread, json!([user("u3", json!("thanks"))]), false)
        .await?;
    let later = history
        .accept(
            "alice",
            thread,
            json!([user("u4", json!("one more"))]),
            false,
        )
        .await?;

    let tool_call = json!({"id": "c1", "type": "function",
                           "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}});
    assert_eq!(
        v1(history.ask(&asking, 100).await?)?,
        json!({"v": "1", "truncated": false, "messages": [
            u1,
            {"id": "a1", "role": "assistant", "content": "Let me check.", "toolCalls": [tool_call]},
            {"id": "t1", "role": "tool", "toolCallId": "c1", "content": "18C"},
            {"id": "a2", "role": "assistant", "content": "It is 18C in Oslo."},
            u2,
            {"id": "a3", "role": "assistant", "content": "Sunny."},
        ]}),
        "every earlier message, oldest first; not the asking run's u3, not the later run's u4"
    );
    assert_eq!(
        v1(history.ask(&asking, 2).await?)?,
        json!({"v": "1", "truncated": true, "messages": [
            u2,
            {"id": "a3", "role": "assistant", "content": "Sunny."},
        ]}),
        "the most recent two, and older ones left out"
    );
    assert_eq!(
        v1(history.ask(&asking, 6).await?)?["truncated"],
        json!(false),
        "exactly all of them is not truncated"
    );
    let for_later = v1(history.ask(&later, 2).await?)?;
    assert_eq!(
        for_later["messages"],
        json!([{"id": "a3", "role": "assistant", "content": "Sunny."}, user("u3", json!("thanks"))]),
        "the later run is given the run before it, which has not even started"
    );
    assert_eq!(
        v1(history.ask_as("bob", &asking, 100).await?)?,
        json!({"v": "1", "messages": [], "truncated": false}),
        "another owner's thread has no messages"
    );
    let elsewhere = history
        .accept(
            "alice",
            "a-new-thread",
            json!([user("n1", json!("hi"))]),
            false,
        )
        .await?;
    assert_eq!(
        v1(history.ask(&elsewhere, 100).await?)?,
        json!({"v": "1", "messages": [], "truncated": false}),
        "a thread with nothing before the run"
    );
    let never = Run {
        task: RunTaskV1 {
            input: protocol::run_input::RunAgentInput {
                thread_id: "no-such-thread".into(),
                ..elsewhere.task.input.clone()
            },
            task_id: Uuid::now_v7(),
            ..elsewhere.task.clone()
        },
        runs_seq: elsewhere.runs_seq,
    };
    assert_eq!(
        v1(history.ask(&never, 100).await?)?,
        json!({"v": "1", "messages": [], "truncated": false}),
        "a thread history never heard of"
    );
    Ok(())
}

#[tokio::test]
async fn history_is_behind_until_the_earlier_runs_events_are_written() -> anyhow::Result<()> {
    let history = TestHistory::spawn().await?;
    let thread = "busy";
    let earlier = history
        .accept("alice", thread, json!([user("u1", json!("hello"))]), false)
        .await?;
    let run_id = earlier.task.input.run_id.clone();
    let events = [
        json!({"type": "RUN_STARTED", "threadId": thread, "runId": run_id}),
        json!({"type": "TEXT_MESSAGE_START", "messageId": "a1", "role": "assistant"}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "a1", "delta": "Hi there."}),
        json!({"type": "TEXT_MESSAGE_END", "messageId": "a1"}),
        json!({"type": "RUN_FINISHED", "threadId": thread, "runId": run_id}),
    ];
    let asking = history
        .accept("alice", thread, json!([user("u2", json!("again"))]), false)
        .await?;

    // Event 2 in the stream but not event 1: history can write none of them (queued in its view).
    history.emit(&earlier, 2, &events[1..2]).await?;
    assert_eq!(
        history.ask(&asking, 100).await?,
        ThreadMessagesReply::Behind,
        "an earlier run that has not started in history's view, with events in the stream"
    );
    // Events 1 and 2 written (running in history's view), event 4 waits for event 3.
    history.emit(&earlier, 1, &events[..1]).await?;
    history.emit(&earlier, 4, &events[3..4]).await?;
    assert_eq!(
        history.ask(&asking, 100).await?,
        ThreadMessagesReply::Behind,
        "an earlier run running in history's view, with events not written yet"
    );
    history.emit(&earlier, 3, &events[2..3]).await?;
    history.emit(&earlier, 5, &events[4..]).await?;
    assert_eq!(
        v1(history.ask(&asking, 100).await?)?,
        json!({"v": "1", "truncated": false, "messages": [
            user("u1", json!("hello")),
            {"id": "a1", "role": "assistant", "content": "Hi there."},
        ]}),
        "once every event of the earlier run is written, its reply is there"
    );
    Ok(())
}

#[tokio::test]
async fn a_run_whose_events_are_all_written_does_not_hold_the_thread_up() -> anyhow::Result<()> {
    // The asking run holds the thread's lock, so an earlier run still running in history's
    // view has ended; if the stream has nothing of it past what history wrote (its events
    // expired), there is nothing to wait for: the answer is what history has.
    let history = TestHistory::spawn().await?;
    let thread = "cut-short";
    let earlier = history
        .accept("alice", thread, json!([user("u1", json!("hello"))]), false)
        .await?;
    let run_id = earlier.task.input.run_id.clone();
    history
        .emit(
            &earlier,
            1,
            &[
                json!({"type": "RUN_STARTED", "threadId": thread, "runId": run_id}),
                json!({"type": "TEXT_MESSAGE_START", "messageId": "a1", "role": "assistant"}),
                json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "a1", "delta": "Hi"}),
            ],
        )
        .await?;
    let asking = history
        .accept("alice", thread, json!([user("u2", json!("again"))]), false)
        .await?;
    assert_eq!(
        v1(history.ask(&asking, 100).await?)?["messages"],
        json!([user("u1", json!("hello")), {"id": "a1", "role": "assistant", "content": "Hi"}]),
        "what history has of the run that was cut short"
    );
    Ok(())
}
