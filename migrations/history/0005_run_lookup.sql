-- History is the durable index of runs (issue 12): the RUNS stream keeps every run on one
-- subject, so "the owner's latest run with this run id" and "where is its task in the stream"
-- are answered here (GET /api/v1/agent/runs/{runId}, cancel, WebSocket reconnects).
-- Expand only: the previous release inserts without runs_seq (NULL: task not readable back).
ALTER TABLE run_progress ADD COLUMN runs_seq bigint;
CREATE INDEX run_progress_owner_run_idx ON run_progress (owner, run_id, accepted_at DESC);
