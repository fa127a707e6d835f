//! `POST /api/v1/agents/compatibility`: can every message valid under `from`'s output schema be
//! fed to `to`'s input schema? Either side is an agent name or an inline `MessageBodySchema`.
//!
//! Any caller may send two schemas of 256 parts with 1 KiB patterns (finding H2 of the security
//! review: this once cost seconds of CPU on the async runtime). Guarantee: one request costs at
//! most the parse of its body (256 KiB: ~20 ms, globs are compiled only when matched) plus
//! [`MAX_COMPATIBILITY_WORK`] units of comparison (~30 ms of one core; past that it is refused,
//! 422, naming the limit). The work is done on the blocking pool, by at most half the cores at
//! a time per replica (the other requests wait their turn without holding a runtime thread),
//! and an owner may ask [`COMPATIBILITY_PER_MINUTE`] times a minute (429 past that). Run
//! acceptance, streams and heartbeats never wait behind a check.
//!
//! [`COMPATIBILITY_PER_MINUTE`]: crate::limit::COMPATIBILITY_PER_MINUTE

use std::sync::Arc;

use anyhow::Context as _;
use protocol::agents::AgentCard;
use protocol::message_body::{MAX_COMPATIBILITY_WORK, MessageBodySchema, TooMuchWork, WorkMeter};
use protocol::validate::{Violation, ViolationKind};
use serde_json::Value;
use tokio::sync::Semaphore;

use crate::agents::AgentCatalog;
use crate::http::openapi::CompatibilityAnswer;
use crate::limit::{Refusal, Throttle, Throttled};

/// The checks of one replica: the per-owner rate and the places on the blocking pool.
pub(crate) struct CompatibilityChecks {
    throttle: Throttle,
    places: Arc<Semaphore>,
}

/// Why a check was not answered.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CheckError {
    /// 429: the owner asked too often.
    #[error(transparent)]
    Throttled(#[from] Throttled),
    /// 400 (not JSON) or 422 (a side is missing, names no agent or is not a schema), naming
    /// the field.
    #[error("{}: {}", .0.field, .0.message)]
    Invalid(Violation),
    /// 422: the comparison needs more than [`MAX_COMPATIBILITY_WORK`] units.
    #[error(transparent)]
    TooMuchWork(#[from] TooMuchWork),
    /// 500: the blocking task failed.
    #[error(transparent)]
    Internal(anyhow::Error),
    /// 503: the owner's rate cannot be checked (NATS).
    #[error("{0:#}")]
    Unavailable(anyhow::Error),
}

/// One side of the question, resolved.
enum Side {
    /// A registered agent's schema, shared with the catalog (its globs, once compiled by a
    /// check, stay compiled for the next).
    Agent(Arc<AgentCard>, Direction),
    Inline(MessageBodySchema),
}

#[derive(Clone, Copy)]
enum Direction {
    Output,
    Input,
}

impl Side {
    fn schema(&self) -> &MessageBodySchema {
        match self {
            Side::Agent(card, Direction::Output) => &card.output_schema,
            Side::Agent(card, Direction::Input) => &card.input_schema,
            Side::Inline(schema) => schema,
        }
    }
}

impl CompatibilityChecks {
    /// At most half the cores (at least one) compare schemas at once.
    pub(crate) fn new(budgets: platform::nats::JsonKv) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        Self {
            throttle: Throttle::compatibility(budgets),
            places: Arc::new(Semaphore::new((cores / 2).max(1))),
        }
    }

    /// `Ok` if `owner` may ask for one more check now.
    pub(crate) async fn admit(&self, owner: &str) -> Result<(), CheckError> {
        self.throttle
            .check(owner)
            .await
            .map_err(|refusal| match refusal {
                Refusal::Throttled(refused) => CheckError::Throttled(refused),
                Refusal::Unavailable(err) => CheckError::Unavailable(err),
            })
    }

    /// Answers the request `body` (JSON, already read within the body limit): parsed, resolved
    /// and compared on the blocking pool once a place is free.
    pub(crate) async fn answer(
        &self,
        agents: &AgentCatalog,
        body: bytes::Bytes,
    ) -> Result<CompatibilityAnswer, CheckError> {
        let place = Arc::clone(&self.places)
            .acquire_owned()
            .await
            .context("the compatibility places are closed")
            .map_err(CheckError::Internal)?;
        let agents = agents.clone();
        tokio::task::spawn_blocking(move || {
            let _place = place; // freed when the comparison is done
            judge(&agents, &body)
        })
        .await
        .context("the compatibility check failed")
        .map_err(CheckError::Internal)?
    }
}

/// Parses the request, resolves both sides and compares them within the work limit.
fn judge(agents: &AgentCatalog, body: &[u8]) -> Result<CompatibilityAnswer, CheckError> {
    let mut value: Value = serde_json::from_slice(body).map_err(|err| {
        CheckError::Invalid(Violation {
            kind: ViolationKind::Malformed,
            field: String::new(),
            message: format!("the body is not JSON: {err}"),
        })
    })?;
    let from = side(agents, &mut value, "from", Direction::Output)?;
    let to = side(agents, &mut value, "to", Direction::Input)?;
    let mut meter = WorkMeter::new(MAX_COMPATIBILITY_WORK);
    let answer = from.schema().compatible_within(to.schema(), &mut meter)?;
    tracing::debug!(work = meter.spent(), "schemas compared");
    Ok(match answer {
        Ok(()) => CompatibilityAnswer {
            compatible: true,
            incompatibilities: Vec::new(),
        },
        Err(reasons) => CompatibilityAnswer {
            compatible: false,
            incompatibilities: reasons,
        },
    })
}

/// `from` (an output schema) or `to` (an input schema): an agent's, by name, or inline.
fn side(
    agents: &AgentCatalog,
    value: &mut Value,
    name: &str,
    direction: Direction,
) -> Result<Side, CheckError> {
    let invalid = |message: String| {
        CheckError::Invalid(Violation {
            kind: ViolationKind::Rule,
            field: format!("/{name}"),
            message,
        })
    };
    match value.get_mut(name).map(Value::take) {
        Some(Value::String(agent)) => agents
            .get_cached(&agent)
            .map(|card| Side::Agent(card, direction))
            .ok_or_else(|| invalid(format!("{name} names no agent: {agent:?}"))),
        Some(inline @ Value::Object(_)) => serde_json::from_value::<MessageBodySchema>(inline)
            .map(Side::Inline)
            .map_err(|err| invalid(format!("{name} is not a MessageBodySchema: {err}"))),
        _ => Err(invalid(format!(
            "{name} is required: an agent name or a MessageBodySchema"
        ))),
    }
}
