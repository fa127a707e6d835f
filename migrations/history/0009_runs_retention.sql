-- Retention that follows consumption (issue 25): history deletes an ended run's task from the
-- RUNS stream once no one needs it (after the duplicate window and the events' age) and records
-- it here, so the sweep finds the runs still to delete without reading the owner's every run.
-- Expand only: the previous release writes none of it.
ALTER TABLE run_progress ADD COLUMN runs_deleted_at timestamptz;
CREATE INDEX run_progress_runs_kept_idx ON run_progress (ended_at)
    WHERE runs_seq IS NOT NULL AND runs_deleted_at IS NULL AND ended_at IS NOT NULL;
