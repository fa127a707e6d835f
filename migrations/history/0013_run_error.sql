-- Why a run ended with RUN_ERROR (its message, safe to show), beside its status: the run status
-- answer names it when history has the run's end and the worker's live record has not caught up.
-- Expand only: the previous release neither reads nor writes it.
ALTER TABLE run_progress ADD COLUMN error text;
