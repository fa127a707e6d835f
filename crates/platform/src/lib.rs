//! Runtime plumbing shared by every Switchboard service.
//!
//! Each module is one concern: [`config`] reads typed settings from the environment,
//! [`telemetry`] sets up JSON logs and OpenTelemetry, [`shutdown`] owns the process's
//! cancellation token, [`auth`] turns a bearer JWT into an [`auth::Owner`], [`http`] holds the
//! error answer, health routes and the server loop, and [`nats`], [`db`], [`s3`] connect to
//! the infrastructure; [`budget`] holds per-owner budgets of bytes per day across replicas.

pub mod auth;
pub mod budget;
pub mod config;
pub mod db;
pub mod http;
pub mod kept;
pub mod lifecycle;
pub mod limit;
pub mod metrics;
pub mod nats;
pub mod nats_auth;
pub mod openapi;
pub mod owner_set;
pub mod publish_batch;
pub mod rpc;
pub mod s3;
pub mod service;
pub mod shutdown;
mod stream_server;
pub mod telemetry;
pub mod tokens;
