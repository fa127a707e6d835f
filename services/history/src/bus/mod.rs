//! The NATS edge: the durable consumers that write history and the request/reply endpoints.

pub(crate) mod fork;
pub(crate) mod ingest;
pub(crate) mod lookup;
pub(crate) mod progress;
pub(crate) mod respond;
pub(crate) mod thread_messages;
pub(crate) mod thread_rename;
