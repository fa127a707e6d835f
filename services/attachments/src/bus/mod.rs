//! The NATS edge: the request/reply endpoints.

pub(crate) mod resolve;
