//! The handlers' shared state.

use std::sync::Arc;

use axum::extract::FromRef;
use platform::auth::Authenticator;
use tokio_util::sync::CancellationToken;

use crate::http::thread_admin;
use crate::{accept, admit, agents, compatibility, events, limit, status, thread};

/// Shared state of the handlers: one `Arc`, so the clone axum makes for every request is a
/// reference count, not a copy of every NATS handle (the KV stores and streams carry their
/// cached configuration: cloning them was a fifth of the service's CPU per accepted run,
/// BENCHMARKS.md section 2).
#[derive(Clone)]
pub(crate) struct AppState(pub(crate) Arc<SharedState>);

impl std::ops::Deref for AppState {
    type Target = SharedState;
    fn deref(&self) -> &SharedState {
        &self.0
    }
}

/// What [`AppState`] shares.
pub(crate) struct SharedState {
    pub(crate) auth: Arc<Authenticator>,
    pub(crate) accept: Arc<accept::Acceptor>,
    pub(crate) admission: Arc<admit::Admission>,
    pub(crate) runs: Arc<status::RunDirectory>,
    pub(crate) limiter: Arc<platform::limit::OwnerRate>,
    /// The owners' token budgets, and the tokens their runs used (the workers charge them).
    pub(crate) token_budgets: platform::tokens::TokenBudgets,
    /// What each owner may keep in history, against what history says they keep.
    pub(crate) kept: platform::kept::KeptBudget,
    pub(crate) tokens: platform::tokens::TokenLedger,
    /// Run lookups per owner: status, cancel, events, WebSocket reconnects.
    pub(crate) lookups: limit::Throttle,
    /// `POST /api/v1/agents/compatibility`: its rate and its places on the blocking pool.
    pub(crate) compatibility: compatibility::CompatibilityChecks,
    pub(crate) events: events::EventHub,
    /// Thread streams: a conversation's runs, live, on every device.
    pub(crate) threads: thread::Threads,
    /// Renames and erases threads, erases owners (history keeps them).
    pub(crate) thread_admin: thread_admin::ThreadAdmin,
    pub(crate) buckets: platform::lifecycle::RunBuckets,
    pub(crate) streams: limit::StreamQuota,
    /// The agents workers registered.
    pub(crate) agents: agents::AgentCatalog,
    /// Cancelled at shutdown: ends the open event streams so the server can drain.
    pub(crate) shutdown: CancellationToken,
}

impl FromRef<AppState> for Arc<Authenticator> {
    fn from_ref(state: &AppState) -> Self {
        Arc::clone(&state.auth)
    }
}
