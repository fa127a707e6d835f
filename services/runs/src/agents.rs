//! The agents runs can be started for: the cards workers register in `<PREFIX>_AGENTS`, kept
//! in memory from a KV watch (so choosing a run's agent costs no NATS round trip), with a direct
//! read for a name the watch has not brought yet.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use platform::nats::JsonKv;
use protocol::agents::{AgentCard, agent_key};
use tokio_util::sync::CancellationToken;

/// Why no agent could be chosen.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ChooseError {
    /// No running worker serves an agent of that name (422): the name, and the known ones.
    #[error("forwardedProps.agent {:?} names no agent a worker serves; known: {}", .0, .1.join(", "))]
    Unknown(String, Vec<String>),
    /// NATS did not answer (503).
    #[error(transparent)]
    Unavailable(anyhow::Error),
}

/// The registered agents. A card is shared, not copied, with each run that chooses it (its two
/// schemas are many allocations).
#[derive(Clone)]
pub(crate) struct AgentCatalog {
    cards: Arc<RwLock<BTreeMap<String, Arc<AgentCard>>>>,
    kv: JsonKv,
    /// When the bucket was last listed because no card was known (at most once a second).
    listed: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
}

/// How often an empty catalog lists the bucket itself instead of waiting for the watch.
const LIST_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl AgentCatalog {
    /// Follows the bucket until `shutdown` (re-watching after an error).
    pub(crate) fn start(kv: JsonKv, shutdown: CancellationToken) -> Self {
        let catalog = Self {
            cards: Arc::default(),
            kv,
            listed: Arc::default(),
        };
        let follower = catalog.clone();
        tokio::spawn(async move {
            while !shutdown.is_cancelled() {
                match follower.kv.watch_all::<AgentCard>().await {
                    Ok(changes) => {
                        let mut changes = std::pin::pin!(changes.take_until(shutdown.cancelled()));
                        while let Some((key, card)) = changes.next().await {
                            follower.apply(&key, card.map(Arc::new));
                        }
                    }
                    Err(err) => tracing::warn!(error = format!("{err:#}"), "cannot watch agents"),
                }
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        });
        catalog
    }

    fn apply(&self, key: &str, card: Option<Arc<AgentCard>>) {
        let Ok(mut cards) = self.cards.write() else {
            return;
        };
        let name = key.strip_prefix("agent.").unwrap_or(key).to_owned();
        match card {
            Some(card) if card.name == name => {
                cards.insert(name, card);
            }
            _ => {
                cards.remove(&name);
            }
        }
    }

    /// Every registered agent, by name.
    pub(crate) async fn list(&self) -> Result<Vec<Arc<AgentCard>>, ChooseError> {
        self.load_if_empty().await?;
        Ok(self
            .cards
            .read()
            .map(|c| c.values().cloned().collect())
            .unwrap_or_default())
    }

    /// The agent named `requested`, or the default one (`None` when no worker registered any
    /// agent: the worker then runs its own default).
    pub(crate) async fn choose(
        &self,
        requested: Option<&str>,
    ) -> Result<Option<Arc<AgentCard>>, ChooseError> {
        let Some(name) = requested else {
            self.load_if_empty().await?;
            return Ok(self.default_card());
        };
        if let Some(card) = self.get_cached(name) {
            return Ok(Some(card));
        }
        // Registered moments ago, perhaps: read it rather than wait for the watch.
        match self.kv.get::<AgentCard>(&agent_key(name)).await {
            Ok(Some((card, _))) if card.name == name => {
                let card = Arc::new(card);
                self.apply(&agent_key(name), Some(Arc::clone(&card)));
                Ok(Some(card))
            }
            Ok(_) => Err(ChooseError::Unknown(name.to_owned(), self.names())),
            Err(err) => Err(ChooseError::Unavailable(err)),
        }
    }

    /// One of the cards by name, if known here.
    pub(crate) fn get_cached(&self, name: &str) -> Option<Arc<AgentCard>> {
        self.cards.read().ok().and_then(|c| c.get(name).cloned())
    }

    fn names(&self) -> Vec<String> {
        self.cards
            .read()
            .map(|c| c.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The first card (by name) marked default.
    pub(crate) fn default_card(&self) -> Option<Arc<AgentCard>> {
        self.cards
            .read()
            .ok()
            .and_then(|c| c.values().find(|card| card.default).cloned())
    }

    /// Before the watch has delivered anything, read the bucket (at most every [`LIST_EVERY`]).
    async fn load_if_empty(&self) -> Result<(), ChooseError> {
        if self.cards.read().is_ok_and(|c| !c.is_empty()) {
            return Ok(());
        }
        // Listing a bucket is a consumer on the server: with no worker registered, once a
        // second, not once a request (it cost 4x the run's own publish in nats-server CPU).
        {
            let Ok(mut listed) = self.listed.lock() else {
                return Ok(());
            };
            if listed.is_some_and(|at| at.elapsed() < LIST_EVERY) {
                return Ok(());
            }
            *listed = Some(std::time::Instant::now());
        }
        let keys = self.kv.keys().await.map_err(ChooseError::Unavailable)?;
        for key in keys {
            if let Ok(Some((card, _))) = self.kv.get::<AgentCard>(&key).await {
                self.apply(&key, Some(Arc::new(card)));
            }
        }
        Ok(())
    }
}
