//! Tells the runs replicas what an owner keeps in history (`platform::kept`), after what changes
//! it: a run's end, a fork (an erasure reports what it leaves itself).

use platform::nats::JsonKv;
use sqlx::PgPool;

use crate::store;

/// Reads an owner's sum and writes it to the owner budgets bucket.
#[derive(Clone)]
pub(crate) struct Reporter {
    pub(crate) pool: PgPool,
    pub(crate) kv: JsonKv,
}

impl Reporter {
    /// Reports what `owner` keeps now; a failure is logged (the next change reports again).
    pub(crate) async fn report(&self, owner: &str) {
        match store::kept_bytes(&self.pool, owner).await {
            Ok(bytes) => {
                platform::kept::report(&self.kv, owner, u64::try_from(bytes).unwrap_or(0)).await;
            }
            Err(err) => tracing::warn!(error = %err, "cannot read what an owner keeps"),
        }
    }
}
