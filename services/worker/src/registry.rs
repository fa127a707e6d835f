//! The agents this worker runs, by name, with their cards; registered in `<PREFIX>_AGENTS` at
//! start so the runs service can list them, choose a run's agent and check its input.

use std::collections::BTreeMap;
use std::sync::Arc;

use platform::nats::JsonKv;
use protocol::agents::{AgentCard, agent_key, valid_agent_name};

use crate::agent::Agent;

/// The agents of this worker.
pub struct AgentSet {
    agents: BTreeMap<String, (Arc<dyn Agent>, AgentCard)>,
    default: String,
}

impl AgentSet {
    /// The set of `agents`, runs that name none going to `default`. Fails on a card that does
    /// not build, a bad or repeated name, or a default that is not in the set.
    pub fn new(agents: Vec<Arc<dyn Agent>>, default: &str) -> anyhow::Result<Self> {
        let mut by_name = BTreeMap::new();
        for agent in agents {
            let mut card = agent.card()?;
            anyhow::ensure!(
                valid_agent_name(&card.name),
                "bad agent name {:?}",
                card.name
            );
            card.default = card.name == default;
            let name = card.name.clone();
            anyhow::ensure!(
                by_name.insert(name.clone(), (agent, card)).is_none(),
                "two agents are named {name:?}"
            );
        }
        anyhow::ensure!(
            by_name.contains_key(default),
            "the default agent {default:?} is not one of the agents"
        );
        Ok(Self {
            agents: by_name,
            default: default.to_owned(),
        })
    }

    /// An empty set whose default comes with a remote agent ([`AgentSet::with_remote`]).
    pub fn without_default() -> Self {
        Self {
            agents: BTreeMap::new(),
            default: String::new(),
        }
    }

    /// Whether runs that name no agent have one to go to.
    pub fn has_default(&self) -> bool {
        self.agents.contains_key(&self.default)
    }

    /// The names of its agents.
    pub fn names(&self) -> Vec<String> {
        self.agents.keys().cloned().collect()
    }

    /// The set with the configured remote agents added; one marked default becomes the default.
    pub fn with_remote(mut self, remote: Vec<crate::remote::RemoteAgent>) -> anyhow::Result<Self> {
        for agent in remote {
            let name = agent.name().to_owned();
            if agent.is_default() {
                if let Some((_, card)) = self.agents.get_mut(&self.default) {
                    card.default = false;
                }
                self.default.clone_from(&name);
            }
            let mut card = agent.card()?;
            card.default = agent.is_default();
            anyhow::ensure!(
                self.agents
                    .insert(name.clone(), (Arc::new(agent), card))
                    .is_none(),
                "two agents are named {name:?}"
            );
        }
        Ok(self)
    }

    /// The agent a task names, or the default one; `None` for a name this worker does not run.
    pub fn get(&self, name: Option<&str>) -> Option<(&Arc<dyn Agent>, &AgentCard)> {
        self.agents
            .get(name.unwrap_or(&self.default))
            .map(|(agent, card)| (agent, card))
    }

    /// Writes every card to the agents bucket (a replica with the same agents writes the same).
    ///
    /// On a cluster, a bucket just created may not take writes on every node yet (its
    /// subjects' interest is still spreading: "no stream found"): a few tries, 0.2 s apart.
    pub async fn register(&self, kv: &JsonKv) -> anyhow::Result<()> {
        for (name, (_, card)) in &self.agents {
            let mut tries = 0;
            loop {
                match kv.put(&agent_key(name), card).await {
                    Ok(_) => break,
                    Err(err) if tries < 25 => {
                        tries += 1;
                        tracing::debug!(error = %err, "agent card not written yet, retrying");
                        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    }
                    Err(err) => return Err(err),
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{EchoAgent, TextOnlyEcho};

    #[test]
    fn the_built_in_cards_build_and_one_is_the_default() {
        let set = AgentSet::new(vec![Arc::new(EchoAgent), Arc::new(TextOnlyEcho)], "echo").unwrap();
        let (_, echo) = set.get(None).unwrap();
        assert!(echo.default);
        assert_eq!(echo.name, "echo");
        let (_, text) = set.get(Some("echo-text")).unwrap();
        assert!(!text.default);
        assert!(set.get(Some("nobody")).is_none());
        assert!(AgentSet::new(vec![Arc::new(EchoAgent)], "openai").is_err());
        assert!(AgentSet::new(vec![Arc::new(EchoAgent), Arc::new(EchoAgent)], "echo").is_err());
    }
}
