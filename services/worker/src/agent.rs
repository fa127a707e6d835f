//! Agent backends. The built-in [`EchoAgent`] is deterministic: tests and the quick start use it.

use std::time::Duration;

use futures::future::BoxFuture;
use protocol::agui::Event;
use protocol::messaging::RunTaskV1;
use protocol::run_input::Message;
use protocol::tools::build_tools_prompt;

use crate::sink::EventSink;

/// What the worker gives an agent: the task and the prompt it built for it.
pub struct ModelInput<'a> {
    /// The accepted task.
    pub task: &'a RunTaskV1,
    /// System prompt: the tools block of `build_tools_prompt` (empty without tools).
    pub system_prompt: String,
}

impl<'a> ModelInput<'a> {
    /// Builds the model input of `task`.
    pub fn new(task: &'a RunTaskV1) -> Self {
        let tools = task.input.tools.as_deref().unwrap_or_default();
        Self {
            task,
            system_prompt: build_tools_prompt(tools),
        }
    }

    /// The user's text.
    pub fn user_text(&self) -> String {
        match self.task.input.messages.first() {
            Some(Message::User(user)) => user.content.text(),
            _ => String::new(),
        }
    }
}

/// An agent backend: turns a task into events on `sink`. Emits no terminal event itself; the
/// worker ends the run with `RUN_FINISHED` or `RUN_ERROR` from the result. Waits through
/// [`EventSink::pause`] so a cancel stops it promptly.
pub trait Agent: Send + Sync + 'static {
    /// Runs the agent, publishing its events.
    fn run<'a>(
        &'a self,
        input: &'a ModelInput<'a>,
        sink: &'a mut EventSink,
    ) -> BoxFuture<'a, anyhow::Result<()>>;
}

/// Deterministic agent. It answers `You said: <text>`, streamed word by word, except:
/// - `/tools` answers with the system prompt the worker built (the tools block);
/// - `/slow <text>` streams the same echo with a 200 ms pause between words (for cancel tests);
/// - `/fail` fails, so the run ends with `RUN_ERROR`.
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
        input: &'a ModelInput<'a>,
        sink: &'a mut EventSink,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let text = input.user_text();
            if text.trim() == "/fail" {
                anyhow::bail!("asked to fail");
            }
            let (reply, pause) = if text.trim() == "/tools" {
                (input.system_prompt.clone(), None)
            } else if text.starts_with("/slow") {
                (Self::reply(&text), Some(Duration::from_millis(200)))
            } else {
                (Self::reply(&text), None)
            };
            let message_id = format!("{}-reply", input.task.task_id);
            sink.emit(Event::TextMessageStart {
                message_id: message_id.clone(),
                role: "assistant".to_owned(),
            })
            .await?;
            for chunk in reply.split_inclusive(' ') {
                if let Some(pause) = pause {
                    sink.pause(pause).await?;
                }
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
