//! Wire contracts shared by every Switchboard service.
//!
//! Everything here is plain data and pure functions: serde types for the seed documents, the
//! AG-UI events the worker publishes, the NATS names every service agrees on, the one JSON error
//! envelope and the validation rules of `RunAgentInput`. No runtime (tokio, axum, sqlx) is
//! allowed in this crate, so any service, tool or fuzz target can depend on it cheaply.

pub mod agents;
pub mod agui;
pub mod agui_files;
pub mod erase;
pub mod error;
pub mod file_types;
pub mod files;
pub mod history;
pub mod interaction;
pub mod message_body;
pub mod messaging;
pub mod metadata;
pub mod run_input;
pub mod sse;
pub mod threads;
pub mod tools;
pub mod ui_schema;
pub mod usage;
pub mod validate;
pub mod ws;

pub use error::{ErrorBody, ErrorCode, ErrorEnvelope};
pub use run_input::{RunAgentInput, TaskAcceptedResponse};
