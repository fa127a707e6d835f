//! System tests: the whole platform against real PostgreSQL, NATS JetStream and S3.
#![allow(
    clippy::disallowed_methods,
    reason = "the system tests also speak NATS as a hostile or foreign client would, raw"
)]

mod admission;
mod agent_registration;
mod agents;
mod agui;
mod attachment_content;
mod attachments_abuse;
mod attachments_races;
mod audio;
mod browser;
mod cluster;
mod compatibility_abuse;
mod extraction_bounds;
mod first_run;
mod fleet;
mod gateway;
mod generated_files;
mod history_bounds;
mod history_days;
mod history_shapes;
mod jetstream;
mod metrics;
mod migrations;
mod openai_backend;
mod openapi;
mod owner_budget;
mod owner_rate;
mod partition;
mod remote_agent_faults;
mod remote_agents;
mod replay;
mod resilience;
mod run_contract;
mod runs_retention;
mod security;
mod server_upload;
mod slow_reader;
mod stream_reconnect;
mod streams;
mod thread_erase;
mod thread_fork;
mod thread_retention;
mod thread_search;
mod thread_stream;
mod threads;
mod traces;
mod uploads;
mod usage;
mod web;
mod websocket;
mod ws_rejoin;
