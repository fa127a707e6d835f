//! The start of a run, shared by every way in (REST, AG-UI, chat, WebSocket): rate limit,
//! attachment admission, the agent's input schema, the answer to a prompt, acceptance onto
//! JetStream. Each refusal is a [`StartError`] whose variant says its status; the HTTP routes
//! and the WebSocket map it to their own vocabulary.

use std::time::Duration;

use platform::auth::Owner;
use protocol::TaskAcceptedResponse;
use protocol::agents::{AgentCard, input_body, requested_agent};
use protocol::run_input::RunAgentInput;
use protocol::validate::{Violation, ViolationKind};

use crate::AppState;
use crate::accept::AcceptError;
use crate::admit::AdmitError;
use crate::agents::ChooseError;
use crate::prompts::{self, PromptError, Reply};

/// The prompt a run answers: closed once the run is admitted (rate limit, files, agent), just
/// before it is accepted, so a refused run leaves the prompt open.
pub(crate) struct Answer {
    pub(crate) prompt_id: String,
    pub(crate) reply: Reply,
}

/// Why a run was not started.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartError {
    /// 429: the owner started too many runs; retry after the duration.
    #[error("rate limited")]
    RateLimited(Duration),
    /// 422: a file, the agent or the agent's input schema refused the message, naming the field.
    #[error("{}: {}", .0.field, .0.message)]
    Refused(Violation),
    /// 409/410/422/503: an answer to a prompt that cannot be taken, naming the field.
    #[error("prompt answer refused: {0}")]
    Prompt(PromptError, String),
    /// 409: the same run id was accepted before with a different body.
    #[error("run already accepted with a different body")]
    Conflict,
    /// 409: another run is still active on the thread (policy `reject`).
    #[error("another run is active on this thread")]
    ThreadBusy,
    /// 403: the owner's bytes of runs for the day are spent (`SB_RUNS_OWNER_BYTES_PER_DAY`).
    #[error("the owner's bytes of runs per day are spent")]
    OverBudget(crate::budget::Exhausted),
    /// 429: the owner has the most runs queued or running it may.
    #[error("the owner has {} runs queued or running", .0.max)]
    TooManyActive(platform::owner_set::Full),
    /// 429: one of the owner's token budgets is spent.
    #[error("the owner's token budget of the {} is spent", .0.period)]
    TokensSpent(platform::tokens::OverBudget),
    /// 403: the owner keeps the most bytes in history they may (`SB_RUNS_OWNER_HISTORY_BYTES`).
    #[error("the owner keeps {} bytes in history", .0.kept)]
    KeptFull(platform::kept::OverKept),
    /// 503: NATS or the attachments service did not answer.
    #[error("unavailable: {0:#}")]
    Unavailable(anyhow::Error),
}

fn refused(field: String, message: String) -> StartError {
    StartError::Refused(Violation {
        kind: ViolationKind::Rule,
        field,
        message,
    })
}

/// Starts a run: rate limit, attachment admission, the agent and its input schema, the
/// prompt's answer, then acceptance (the task names its agent).
pub(crate) async fn start_run(
    state: &AppState,
    owner: &Owner,
    mut input: RunAgentInput,
    conversation: bool,
    answer: Option<Answer>,
) -> Result<TaskAcceptedResponse, StartError> {
    state
        .limiter
        .check(owner.as_str())
        .await
        .map_err(StartError::Unavailable)?
        .map_err(StartError::RateLimited)?;
    // The tokens of the owner's earlier runs, against their budgets (nothing read when the
    // owner has none).
    state
        .tokens
        .check(
            owner.as_str(),
            state.token_budgets.of(owner.as_str()),
            chrono::Utc::now(),
        )
        .await
        .map_err(StartError::Unavailable)?
        .map_err(StartError::TokensSpent)?;
    // What the owner keeps in history, as history last told it.
    state
        .kept
        .check(owner.as_str())
        .await
        .map_err(StartError::KeptFull)?;
    let mut requested = requested_agent(&input)
        .map_err(|m| refused("/forwardedProps/agent".to_owned(), m))?
        .map(str::to_owned);
    if requested.is_none()
        && let Some(answer) = &answer
    {
        // The run that continues after a prompt goes to the agent that asked.
        requested = prompts::pending(&state.buckets, owner.as_str(), &answer.prompt_id)
            .await
            .map_err(StartError::Unavailable)?
            .and_then(|record| record.agent);
    }
    let requested = requested.as_deref();
    let agent = state
        .agents
        .choose(requested)
        .await
        .map_err(|err| match err {
            ChooseError::Unknown(..) => {
                refused("/forwardedProps/agent".to_owned(), err.to_string())
            }
            ChooseError::Unavailable(e) => StartError::Unavailable(e),
        })?;
    let attachments = state
        .admission
        .admit(owner.as_str(), &mut input)
        .await
        .map_err(|err| match err {
            AdmitError::Refused { field, message } => refused(field, message),
            AdmitError::Unavailable(e) => StartError::Unavailable(e),
        })?;
    if let Some(agent) = &agent {
        check_input(agent, &input, &attachments)?;
    }
    let resumed = match answer {
        None => None,
        Some(answer) => Some(
            prompts::answer(
                &state.buckets,
                owner.as_str(),
                &input.thread_id,
                &answer.prompt_id,
                answer.reply,
                &input.run_id,
            )
            .await
            .map_err(|err| {
                let field = match err {
                    PromptError::BadAnswer(_) => "/resume/0/payload",
                    _ => "/resume/0/interruptId",
                };
                StartError::Prompt(err, field.to_owned())
            })?,
        ),
    };
    state
        .accept
        .accept(
            owner.as_str(),
            input,
            attachments,
            conversation,
            resumed,
            agent.map(|card| card.name.clone()),
        )
        .await
        .map_err(|err| match err {
            AcceptError::Conflict => StartError::Conflict,
            AcceptError::ThreadBusy => StartError::ThreadBusy,
            AcceptError::OverBudget(exhausted) => StartError::OverBudget(exhausted),
            AcceptError::TooManyActive(full) => StartError::TooManyActive(full),
            AcceptError::Unavailable(e) => StartError::Unavailable(e),
        })
}

/// The new user message as a `MessageBody` must fit the agent's input schema; a refusal names
/// the first offending block (or the message) and the rule.
fn check_input(
    agent: &AgentCard,
    input: &RunAgentInput,
    attachments: &[protocol::metadata::AttachedFile],
) -> Result<(), StartError> {
    let (body, fields) = input_body(input, attachments)
        .map_err(|err| refused("/messages".to_owned(), err.to_string()))?;
    let Err(violations) = agent.input_schema.check(&body) else {
        return Ok(());
    };
    let field = violations
        .iter()
        .find_map(|v| match v {
            protocol::message_body::Violation::UnmatchedPart { part_index, .. } => {
                fields.get(*part_index).cloned()
            }
            protocol::message_body::Violation::MissingRequired { .. } => None,
        })
        .or_else(|| {
            fields
                .first()
                .map(|f| f.rsplit_once('/').map_or(f.clone(), |(m, _)| m.to_owned()))
        })
        .unwrap_or_else(|| "/messages".to_owned());
    let why: Vec<String> = violations.iter().map(ToString::to_string).collect();
    Err(refused(
        field,
        format!(
            "the agent {:?} does not accept this message: {}",
            agent.name,
            why.join("; ")
        ),
    ))
}
