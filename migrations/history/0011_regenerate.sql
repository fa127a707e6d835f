-- Regenerate (issue 28): a run whose new user message is one the thread holds already, with
-- messages after it that the run's input leaves out, replaces the reply to it. The messages it
-- replaces stay, marked `superseded_by` (the new run's id) in their metadata; the run's own
-- messages are marked `regenerates` (the user message's id), from this column.
-- Expand only: the previous release writes none of it.
ALTER TABLE run_progress ADD COLUMN regenerates text;
