//! System tests: the whole platform against real PostgreSQL, NATS JetStream and S3.

mod admission;
mod agents;
mod agui;
mod attachment_content;
mod browser;
mod cluster;
mod extraction_bounds;
mod first_run;
mod fleet;
mod gateway;
mod generated_files;
mod history_days;
mod history_shapes;
mod jetstream;
mod metrics;
mod migrations;
mod openai_backend;
mod resilience;
mod run_contract;
mod security;
mod server_upload;
mod streams;
mod threads;
mod uploads;
mod web;
mod websocket;
