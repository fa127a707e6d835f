//! The handlers' shared state.

use std::sync::Arc;

use axum::extract::FromRef;
use platform::auth::Authenticator;
use sqlx::PgPool;

use crate::sign;

#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) auth: Arc<Authenticator>,
    pub(crate) pool: PgPool,
    pub(crate) signer: Arc<sign::UrlSigner>,
    /// IANA time zone names the `tz` parameter accepts.
    pub(crate) time_zones: Arc<std::collections::HashSet<String>>,
}

impl FromRef<AppState> for Arc<Authenticator> {
    fn from_ref(state: &AppState) -> Self {
        Arc::clone(&state.auth)
    }
}
