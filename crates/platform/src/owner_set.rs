//! Sets of what each owner has open, counted across every replica: a bound on each that one
//! owner cannot pass however many replicas it spreads its requests over.
//!
//! - **Active runs** (`active.<owner digest>`): runs accepted and not ended (queued or running).
//!   The runs service enters a run before it publishes it and refuses the owner's next one while
//!   `SB_RUNS_MAX_ACTIVE_PER_OWNER` are active; the worker takes a run out as it writes the run's
//!   end. Without it one owner could queue a week of work in the RUNS stream (every replica's
//!   rate limit allowing), which every other owner's runs wait behind.
//! - **Pending prompts** (`prompts.<owner digest>`): questions agents asked that wait for the
//!   owner's answer. The worker enters one before it stores it (past
//!   `SB_WORKER_MAX_PENDING_PROMPTS_PER_OWNER` the run fails, naming the setting); answering,
//!   cancelling or the prompt's timeout takes it out. Without it one owner's unanswered prompts
//!   could fill the prompts bucket, after which no agent of anyone could ask.
//!
//! A set is one record in the `<PREFIX>_OWNER_BUDGETS` bucket (each member with the time it
//! entered), changed only by compare-and-set: entering and leaving are idempotent, so a
//! redelivered end or a retried accept cannot count anything twice. A member that never left
//! (its run's stream lost) leaves by age; and a record no one changed for the bucket's two days
//! is gone, which can only let an owner have more, never fewer.

use std::time::Duration;

use chrono::{DateTime, Utc};
use protocol::messaging::short_digest;
use serde::{Deserialize, Serialize};

use crate::nats::{Created, JsonKv};

/// How long a run counts as active at most, ended or not.
pub const RUN_STALE_AFTER: Duration = Duration::from_secs(24 * 3600);
/// How long a prompt counts as pending at most (the prompts bucket keeps one a week).
pub const PROMPT_STALE_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);

/// An owner's set: each member (a task id, a prompt id) with when it entered (Unix seconds).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    members: Vec<(String, i64)>,
}

impl Record {
    /// The record without the members that entered `stale_after` or longer before `now`.
    fn fresh(mut self, now: DateTime<Utc>, stale_after: Duration) -> Self {
        let oldest = now.timestamp() - i64::try_from(stale_after.as_secs()).unwrap_or(i64::MAX);
        self.members.retain(|(_, at)| *at > oldest);
        self
    }
}

/// The owner's set has as many members as allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full {
    /// The most members an owner's set may have.
    pub max: usize,
}

/// What [`ActiveRuns::enter`] decided, as a pure function of the record.
#[derive(Debug, PartialEq, Eq)]
enum Entry {
    /// Write this record.
    Write(Record),
    /// The run is in already: nothing to write.
    Already,
    /// Refused.
    Full,
}

fn enter(
    record: Record,
    member: &str,
    now: DateTime<Utc>,
    max: usize,
    stale_after: Duration,
) -> Entry {
    let mut record = record.fresh(now, stale_after);
    if record.members.iter().any(|(id, _)| id == member) {
        return Entry::Already;
    }
    if record.members.len() >= max {
        return Entry::Full;
    }
    record.members.push((member.to_owned(), now.timestamp()));
    Entry::Write(record)
}

/// One kind of set of every owner, shared through a KV bucket.
#[derive(Clone)]
pub struct OwnerSet {
    kv: JsonKv,
    kind: &'static str,
    stale_after: Duration,
}

impl OwnerSet {
    /// The owners' active runs, kept in `kv` (the `OWNER_BUDGETS` bucket).
    pub fn active_runs(kv: JsonKv) -> Self {
        Self {
            kv,
            kind: "active",
            stale_after: RUN_STALE_AFTER,
        }
    }

    /// The owners' pending prompts, kept in `kv` (the `OWNER_BUDGETS` bucket).
    pub fn pending_prompts(kv: JsonKv) -> Self {
        Self {
            kv,
            kind: "prompts",
            stale_after: PROMPT_STALE_AFTER,
        }
    }

    fn key(&self, owner: &str) -> String {
        format!("{}.{}", self.kind, short_digest(owner))
    }

    /// Makes `member` one of `owner`'s set, unless it has `max` already. Fails only when NATS
    /// does.
    pub async fn enter(
        &self,
        owner: &str,
        member: &str,
        now: DateTime<Utc>,
        max: usize,
    ) -> anyhow::Result<Result<(), Full>> {
        let key = self.key(owner);
        let mut round = 0;
        loop {
            let read = self.kv.get_for_round::<Record>(&key, round).await?;
            round += 1;
            let (record, revision) = match read {
                Some((record, revision)) => (record, Some(revision)),
                None => (Record::default(), None),
            };
            let next = match enter(record, member, now, max, self.stale_after) {
                Entry::Already => return Ok(Ok(())),
                Entry::Full => return Ok(Err(Full { max })),
                Entry::Write(next) => next,
            };
            let written = match revision {
                None => matches!(self.kv.create(&key, &next).await?, Created::Created(_)),
                Some(revision) => self.kv.update(&key, &next, revision).await?.is_some(),
            };
            if written {
                return Ok(Ok(()));
            }
            // Another replica or worker changed the record meanwhile (or the read came from a
            // replica behind it): read it again, from the leader.
        }
    }

    /// Takes `member` out of `owner`'s set (nothing when it is not in). Fails only when NATS
    /// does.
    pub async fn leave(&self, owner: &str, member: &str) -> anyhow::Result<()> {
        let key = self.key(owner);
        let mut round = 0;
        loop {
            let read = self.kv.get_for_round::<Record>(&key, round).await?;
            round += 1;
            let Some((mut record, revision)) = read else {
                return Ok(());
            };
            let before = record.members.len();
            record.members.retain(|(id, _)| id != member);
            if record.members.len() == before {
                return Ok(());
            }
            if self.kv.update(&key, &record, revision).await?.is_some() {
                return Ok(());
            }
        }
    }

    /// How many members `owner`'s set has at `now`.
    pub async fn count(&self, owner: &str, now: DateTime<Utc>) -> anyhow::Result<usize> {
        Ok(self
            .kv
            .get::<Record>(&self.key(owner))
            .await?
            .map_or(0, |(record, _)| {
                record.fresh(now, self.stale_after).members.len()
            }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    fn id(n: u128) -> String {
        format!("task-{n}")
    }

    #[test]
    fn a_run_enters_until_the_owner_has_the_most_allowed() {
        let mut record = Record::default();
        for n in 0..3 {
            match enter(record, &id(n), at(0), 3, RUN_STALE_AFTER) {
                Entry::Write(next) => record = next,
                other => panic!("run {n}: {other:?}"),
            }
        }
        assert_eq!(
            enter(record.clone(), &id(9), at(1), 3, RUN_STALE_AFTER),
            Entry::Full
        );
        assert_eq!(
            enter(record, &id(1), at(1), 3, RUN_STALE_AFTER),
            Entry::Already,
            "a retried enter counts once"
        );
    }

    #[test]
    fn a_run_that_never_ended_stops_counting_after_a_day() {
        let record = Record {
            members: vec![(id(1), at(0).timestamp()), (id(2), at(100).timestamp())],
        };
        let day = i64::try_from(RUN_STALE_AFTER.as_secs()).unwrap();
        let Entry::Write(next) = enter(record, &id(3), at(day + 50), 2, RUN_STALE_AFTER) else {
            panic!("the stale run should have made room");
        };
        assert_eq!(
            next.members
                .iter()
                .map(|(id, _)| id.clone())
                .collect::<Vec<_>>(),
            [id(2), id(3)]
        );
    }
}
