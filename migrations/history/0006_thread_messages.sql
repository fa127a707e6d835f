-- A remote agent (AG-UI) keeps nothing between runs: before each run the worker asks history
-- for the thread's earlier messages (`<prefix>.history.thread-messages`). A user message is
-- answered exactly as its run's input carried it (same id, same content shape, unknown fields
-- kept), which the text in `content` cannot give back: it is kept here, as the run input's
-- `Message` JSON. Expand only: the previous release inserts without it (NULL: answered from
-- `content` as text).
ALTER TABLE messages ADD COLUMN agui jsonb;
-- Every answer first checks that history has written the events of the thread's other runs
-- that have not ended in its view: few rows (most runs end), found without reading the owner's
-- every run.
CREATE INDEX run_progress_thread_unended_idx ON run_progress (owner, thread_id)
    WHERE status IN ('queued', 'running');
