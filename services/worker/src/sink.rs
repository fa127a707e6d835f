//! Publishes a run's events in order, each with its per-run sequence number.

use async_nats::jetstream;
use chrono::Utc;
use protocol::agui::Event;
use protocol::messaging::{Names, RunEventMessage, RunEventV1, RunTaskV1};

/// Where an agent writes its events. Every event is acknowledged by JetStream before the next.
pub struct EventSink {
    js: jetstream::Context,
    subject: String,
    template: RunEventV1,
}

impl EventSink {
    pub(crate) fn new(js: jetstream::Context, names: &Names, task: &RunTaskV1) -> Self {
        Self {
            js,
            subject: names.run_event_subject(task.task_id),
            template: RunEventV1 {
                task_id: task.task_id,
                owner: task.owner.clone(),
                thread_id: task.input.thread_id.clone(),
                run_id: task.input.run_id.clone(),
                seq: 0,
                emitted_at: Utc::now(),
                event: Event::RunStarted {
                    thread_id: String::new(),
                    run_id: String::new(),
                },
            },
        }
    }

    /// Publishes `event` as the run's next event and waits for the ack. The message id is
    /// `<task>:<seq>`, so a run replayed after a crash does not duplicate what was stored.
    pub async fn emit(&mut self, event: Event) -> anyhow::Result<()> {
        self.template.seq += 1;
        let message = RunEventMessage::V1(RunEventV1 {
            emitted_at: Utc::now(),
            event,
            ..self.template.clone()
        });
        let payload = serde_json::to_vec(&message)?;
        let headers = platform::nats::publish_headers(&format!(
            "{}:{}",
            self.template.task_id, self.template.seq
        ));
        self.js
            .publish_with_headers(self.subject.clone(), headers, payload.into())
            .await?
            .await?;
        Ok(())
    }
}
