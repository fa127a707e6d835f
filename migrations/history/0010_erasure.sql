-- Erasure (issue 28): a thread or an owner removed from every store.
-- Expand only: the previous release writes none of it and reads none of it.

-- The prompts a run asked (the ids of its RUN_FINISHED interrupts): what an erasure removes
-- from the prompts buckets, which are keyed by prompt.
ALTER TABLE run_progress ADD COLUMN prompt_ids text[];

-- Runs that were erased: a task or event of one that reaches history later (a run that was
-- still ending) is dropped, not written back, and removed from its stream. Only the task id is
-- kept (a random UUID, nothing of the owner's), for as long as the streams may hold its
-- messages.
CREATE TABLE erased_runs (
    task_id    uuid        NOT NULL,
    erased_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT erased_runs_pkey PRIMARY KEY (task_id)
);
CREATE INDEX erased_runs_time_idx ON erased_runs (erased_at);

-- A thread's runs, all of them (the erasure's question; the other run indexes lead with the run
-- id or cover only runs that have not ended).
CREATE INDEX run_progress_thread_idx ON run_progress (owner, thread_id);

-- A deployment's thread retention finds the threads idle longest first.
CREATE INDEX threads_idle_idx ON threads (updated_at);
