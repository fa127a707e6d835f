//! Agent backends. The built-in [`EchoAgent`] is deterministic: tests and the quick start use it.

use futures::future::BoxFuture;
use protocol::agui::Event;
use protocol::messaging::RunTaskV1;
use protocol::run_input::Message;

use crate::sink::EventSink;

/// An agent backend: turns a task into events on `sink`. Must emit no terminal event itself;
/// the worker ends the run with `RUN_FINISHED` or `RUN_ERROR` from the result.
pub trait Agent: Send + Sync + 'static {
    /// Runs the agent for `task`, publishing its events.
    fn run<'a>(
        &'a self,
        task: &'a RunTaskV1,
        sink: &'a mut EventSink,
    ) -> BoxFuture<'a, anyhow::Result<()>>;
}

/// Deterministic agent: answers `You said: <the user's text>`, streamed word by word.
#[derive(Debug, Clone, Copy, Default)]
pub struct EchoAgent;

impl EchoAgent {
    /// The reply to a user text.
    pub fn reply(text: &str) -> String {
        format!("You said: {text}")
    }
}

impl Agent for EchoAgent {
    fn run<'a>(
        &'a self,
        task: &'a RunTaskV1,
        sink: &'a mut EventSink,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let text = match task.input.messages.first() {
                Some(Message::User(user)) => user.content.text(),
                _ => String::new(),
            };
            let message_id = format!("{}-reply", task.task_id);
            sink.emit(Event::TextMessageStart {
                message_id: message_id.clone(),
                role: "assistant".to_owned(),
            })
            .await?;
            let reply = Self::reply(&text);
            for chunk in reply.split_inclusive(' ') {
                sink.emit(Event::TextMessageContent {
                    message_id: message_id.clone(),
                    delta: chunk.to_owned(),
                })
                .await?;
            }
            sink.emit(Event::TextMessageEnd { message_id }).await
        })
    }
}
