//! The handlers' shared state.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRef;
use platform::auth::Authenticator;
use sqlx::PgPool;

use crate::{form, policy, quota, verify};

/// Shared state of the handlers.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) auth: Arc<Authenticator>,
    pub(crate) pool: PgPool,
    pub(crate) s3: aws_sdk_s3::Client,
    /// Credentials and public endpoints of upload forms and download links.
    pub(crate) signer: Arc<policy::Signer>,
    pub(crate) bucket: String,
    pub(crate) upload_ttl: Duration,
    pub(crate) download_ttl: Duration,
    pub(crate) quota: Arc<quota::Quota>,
    /// The per-owner rates of upload forms and download links, across the fleet.
    pub(crate) rates: Arc<quota::Rates>,
    /// How long the framing of a server upload's form may be (`SB_ATTACHMENTS_MAX_PART_HEADER_BYTES`).
    pub(crate) part_header_limit: form::PartHeaderLimit,
    /// Verifies pending files, each once at a time (shared with the resolver and the sweeper).
    pub(crate) verifier: Arc<verify::Verifier>,
}

impl FromRef<AppState> for Arc<Authenticator> {
    fn from_ref(state: &AppState) -> Self {
        Arc::clone(&state.auth)
    }
}

impl FromRef<AppState> for form::PartHeaderLimit {
    fn from_ref(state: &AppState) -> Self {
        state.part_header_limit
    }
}
