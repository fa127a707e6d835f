//! The run lifecycle's KV rules, shared by runs and the worker: the buckets a run's life is
//! kept in ([`RunBuckets`]: status records, thread locks, prompts, the agent catalog, a remote
//! agent's thread state, the owners' budgets and tokens), how long each keeps a record, and the
//! thread lock that lets one run at a time hold a conversation ([`RunBuckets::claim_thread`]).
//! The KV plumbing they are written with (compare-and-set, watches) is `crate::nats::JsonKv`.

use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, stream};

use crate::nats::{Created, JsonKv, NatsConfig, open_or_wait};

/// The KV buckets of the run lifecycle.
#[derive(Clone)]
pub struct RunBuckets {
    /// Status records and run-id lookups.
    pub run_status: JsonKv,
    /// Per-thread locks held by running tasks.
    pub thread_locks: JsonKv,
    /// Human-in-the-loop prompts (`prompt.<digest>`).
    pub prompts: JsonKv,
    /// Deadlines of pending prompts that have a timeout (same keys as `prompts`).
    pub prompt_deadlines: JsonKv,
    /// The cards of the agents workers run (`agent.<name>`), each kept [`AGENT_CARD_TTL`]
    /// after its last registration: the workers that run an agent re-register it every
    /// [`AGENT_REFRESH`], so an agent no worker serves any more leaves the bucket (a delete
    /// marker tells the watchers) within a minute.
    pub agents: JsonKv,
    /// A remote agent's state and pending interrupts per thread (`state.<digest>`).
    pub thread_state: JsonKv,
    /// Each owner's budgets per day (`bytes.<digest>.<day>`), shared by the runs replicas.
    pub owner_budgets: JsonKv,
    /// The tokens each owner's runs used per day and month (`tokens.<digest>.d<day>`,
    /// `tokens.<digest>.m<month>`): the worker charges, runs checks the token budgets.
    pub owner_tokens: JsonKv,
}

/// How long an owner's budget record of a day is kept (the day, and one more for clocks).
pub const OWNER_BUDGET_MAX_AGE: Duration = Duration::from_secs(2 * 24 * 3600);

/// How long an owner's token record is kept after its last charge: a month's record lives
/// through its month.
pub const OWNER_TOKENS_MAX_AGE: Duration = Duration::from_secs(32 * 24 * 3600);

/// How long an agent card stays without being registered again.
pub const AGENT_CARD_TTL: Duration = Duration::from_secs(60);
/// How often a worker registers its agents' cards again.
pub const AGENT_REFRESH: Duration = Duration::from_secs(15);
/// How long a thread's remote-agent state is kept after its last run.
pub const THREAD_STATE_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);

/// Opens the run lifecycle buckets: a service that creates its own (not
/// [`NatsConfig::provisioned`]) creates them or reconciles their replicas and limits; a
/// provisioned one waits for them and changes nothing. Safe to call from every replica.
pub async fn ensure_run_buckets(
    js: &jetstream::Context,
    config: &NatsConfig,
) -> anyhow::Result<RunBuckets> {
    // Boxed: a large future, which services build inside their own start-up future (a debug
    // test thread's stack overflowed when it was inline).
    Box::pin(open_run_buckets(js, config, !config.provisioned())).await
}

/// Opens the run lifecycle buckets, creating or reconciling them when `reconcile`.
pub(crate) async fn open_run_buckets(
    js: &jetstream::Context,
    config: &NatsConfig,
    reconcile: bool,
) -> anyhow::Result<RunBuckets> {
    let (names, limits) = (&config.names, &config.limits);
    let open = |bucket: String, max_age: Duration, full: stream::DiscardPolicy| {
        open_or_wait(js, config, reconcile, bucket, max_age, full)
    };
    use stream::DiscardPolicy::{New, Old};
    // All at once: on a cluster a bucket's creation may wait seconds for the meta leader
    // (several services create the same buckets as they start), and one after another the
    // waits added up past a pod's startup budget.
    // Each future boxed and joined from a list: seven of them side by side in one future
    // overflowed a debug build's test thread.
    type Opening<'a> =
        std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<JsonKv>> + Send + 'a>>;
    let openings: Vec<Opening<'_>> = vec![
        // A status record lives as long as the run's events (history keeps every run's
        // status for good): a key per run for 7 days was ~550 bytes of broker memory per run.
        // Every run writes a status record and its thread's lock, so these two buckets fill
        // with the runs of a day (~480 bytes a status: 1 GiB is ~2.2M runs). Full, they drop
        // their oldest records (long-ended runs, whose status history answers, and released
        // locks); refusing new records instead stopped every new run from starting.
        Box::pin(open(names.run_status_bucket(), limits.events_max_age, Old)),
        Box::pin(open(
            names.thread_locks_bucket(),
            limits.events_max_age,
            Old,
        )),
        Box::pin(open(names.prompts_bucket(), limits.runs_max_age, New)),
        Box::pin(open(
            names.prompt_deadlines_bucket(),
            limits.runs_max_age,
            New,
        )),
        Box::pin(open(names.agents_bucket(), AGENT_CARD_TTL, New)),
        // Full, the oldest threads' states go first (an agent then starts that thread afresh).
        Box::pin(open(names.thread_state_bucket(), THREAD_STATE_MAX_AGE, Old)),
        Box::pin(open(
            names.owner_budgets_bucket(),
            OWNER_BUDGET_MAX_AGE,
            Old,
        )),
        Box::pin(open(names.owner_tokens_bucket(), OWNER_TOKENS_MAX_AGE, Old)),
    ];
    let mut opened = futures::future::try_join_all(openings).await?.into_iter();
    let mut next = || opened.next().context("a bucket was not opened");
    let (run_status, thread_locks, prompts, prompt_deadlines) =
        (next()?, next()?, next()?, next()?);
    let (agents, thread_state, owner_budgets, owner_tokens) = (next()?, next()?, next()?, next()?);
    Ok(RunBuckets {
        run_status,
        thread_locks,
        prompts,
        prompt_deadlines,
        agents,
        thread_state,
        owner_budgets,
        owner_tokens,
    })
}

/// Opens the owner budgets bucket alone, as [`ensure_run_buckets`] does: for a service that
/// keeps per-owner rates there ([`crate::limit::OwnerRate`]) and needs no other bucket.
pub async fn ensure_owner_budgets(
    js: &jetstream::Context,
    config: &NatsConfig,
) -> anyhow::Result<JsonKv> {
    Box::pin(open_or_wait(
        js,
        config,
        !config.provisioned(),
        config.names.owner_budgets_bucket(),
        OWNER_BUDGET_MAX_AGE,
        stream::DiscardPolicy::Old,
    ))
    .await
}

/// How long the marker of a released thread lock stays (then the lock's key is gone from the
/// broker, instead of costing it memory for a day).
const RELEASED_LOCK_TTL: Duration = Duration::from_secs(60);

/// The value of a thread lock: which run holds the thread, and since when.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ThreadLock {
    /// The holding task.
    pub task_id: uuid::Uuid,
    /// The holding run's key ([`protocol::messaging::run_key`]).
    #[serde(default)]
    pub run_key: String,
    /// The key of the holding run's status record ([`protocol::messaging::status_key`]).
    #[serde(default)]
    pub status_key: String,
    /// Whether the holding task is in the RUNS stream (claimed by the worker, or marked by the
    /// runs service once JetStream acknowledged it).
    #[serde(default)]
    pub published: bool,
    /// When the lock was taken.
    pub claimed_at: chrono::DateTime<chrono::Utc>,
}

/// How long a claim whose task is not in the RUNS stream yet counts as active (publish in flight).
const CLAIM_GRACE: chrono::TimeDelta = chrono::TimeDelta::seconds(10);

/// The outcome of [`RunBuckets::claim_thread`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The thread is held for this task now.
    Claimed,
    /// A concurrent request for the same run holds it: publish, and let JetStream decide.
    SameRun,
    /// Another run is active on the thread.
    Busy,
}

impl RunBuckets {
    /// Takes the lock of the task's `(owner, threadId)` for it; `published`: the task is in the
    /// RUNS stream already (the worker's claim). A lock held by a run that ended (or whose task
    /// never reached the stream) is taken over.
    pub async fn claim_thread(
        &self,
        task: &protocol::messaging::RunTaskV1,
        published: bool,
    ) -> anyhow::Result<Claim> {
        use protocol::messaging::{run_key, status_key, thread_lock_key};
        let (owner, thread_id, task_id) = (&task.owner, &task.input.thread_id, task.task_id);
        let run_key = run_key(owner, thread_id, &task.input.run_id);
        let key = thread_lock_key(owner, thread_id);
        let mine = ThreadLock {
            task_id,
            run_key: run_key.clone(),
            status_key: status_key(owner, &task.input.run_id, task_id),
            published,
            claimed_at: chrono::Utc::now(),
        };
        let mut round = 0;
        loop {
            if self.thread_locks.create(&key, &mine).await? != Created::Exists {
                return Ok(Claim::Claimed);
            }
            let read = self
                .thread_locks
                .get_for_round::<ThreadLock>(&key, round)
                .await?;
            round += 1;
            let Some((holder, revision)) = read else {
                continue; // released meanwhile: try to create again
            };
            if holder.task_id == task_id {
                return Ok(Claim::Claimed);
            }
            if holder.run_key == run_key {
                return Ok(Claim::SameRun);
            }
            if self.holds_active(&holder).await? {
                return Ok(Claim::Busy);
            }
            if self
                .thread_locks
                .update(&key, &mine, revision)
                .await?
                .is_some()
            {
                return Ok(Claim::Claimed);
            }
        }
    }

    /// The task holding `(owner, thread_id)`'s lock, if that run is still queued or running.
    pub async fn active_run(
        &self,
        owner: &str,
        thread_id: &str,
    ) -> anyhow::Result<Option<uuid::Uuid>> {
        let key = protocol::messaging::thread_lock_key(owner, thread_id);
        let Some((holder, _)) = self.thread_locks.get::<ThreadLock>(&key).await? else {
            return Ok(None);
        };
        Ok(self.holds_active(&holder).await?.then_some(holder.task_id))
    }

    async fn holds_active(&self, holder: &ThreadLock) -> anyhow::Result<bool> {
        use protocol::messaging::RunStatusRecord;
        if !holder.status_key.is_empty()
            && let Some((record, _)) = self
                .run_status
                .get::<RunStatusRecord>(&holder.status_key)
                .await?
        {
            return Ok(!record.status.is_terminal());
        }
        // No status yet: queued if its task is in the stream, or still being published.
        Ok(holder.published || chrono::Utc::now() - holder.claimed_at < CLAIM_GRACE)
    }

    /// Records that the task holding `(owner, thread_id)`'s lock, `task_id`, is in the RUNS
    /// stream now (so the lock stays held while the run waits for a worker).
    pub async fn mark_published(
        &self,
        owner: &str,
        thread_id: &str,
        task_id: uuid::Uuid,
    ) -> anyhow::Result<()> {
        let key = protocol::messaging::thread_lock_key(owner, thread_id);
        self.thread_locks
            .modify::<ThreadLock, _>(&key, |holder| {
                (holder.task_id == task_id && !holder.published).then(|| ThreadLock {
                    published: true,
                    ..holder.clone()
                })
            })
            .await?;
        Ok(())
    }

    /// Releases the lock of `(owner, thread_id)` if `task_id` holds it.
    pub async fn release_thread(
        &self,
        owner: &str,
        thread_id: &str,
        task_id: uuid::Uuid,
    ) -> anyhow::Result<()> {
        let key = protocol::messaging::thread_lock_key(owner, thread_id);
        if let Some((holder, revision)) = self.thread_locks.get::<ThreadLock>(&key).await?
            && holder.task_id == task_id
        {
            self.thread_locks
                .purge_at(&key, revision, RELEASED_LOCK_TTL)
                .await?;
        }
        Ok(())
    }
}
