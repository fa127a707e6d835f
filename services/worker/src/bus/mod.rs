//! The NATS edge: the durable pull consumer of accepted runs.

pub(crate) mod consumer;
