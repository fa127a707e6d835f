//! All SQL of the history service: writes (the two consumers) in `write`, reads (the history
//! endpoints) in `read`.

mod read;
mod write;

pub(crate) use read::*;
pub(crate) use write::*;

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
