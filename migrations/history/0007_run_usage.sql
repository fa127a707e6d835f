-- What every run cost and where its time went (issue 27), from its events: the agent its task
-- named, when it started, first showed output (a text message's content or a tool call) and
-- ended, and the tokens its terminal event reported, one row per provider and model.
-- GET /api/v1/agent/usage sums them by day, thread or agent. Expand only: the previous release
-- writes none of it (NULL: a run of before, counted without timings or tokens).
ALTER TABLE run_progress
    ADD COLUMN agent text,
    ADD COLUMN started_at timestamptz,
    ADD COLUMN first_output_at timestamptz,
    ADD COLUMN ended_at timestamptz;
-- An owner's runs that ended in a window (the usage endpoint), and every owner's (its admin
-- scope).
CREATE INDEX run_progress_owner_ended_idx ON run_progress (owner, ended_at)
    WHERE ended_at IS NOT NULL;
CREATE INDEX run_progress_ended_idx ON run_progress (ended_at)
    WHERE ended_at IS NOT NULL;

CREATE TABLE run_usage (
    task_id             uuid   NOT NULL REFERENCES run_progress (task_id) ON DELETE CASCADE,
    provider            text   NOT NULL,
    model               text   NOT NULL,
    input_tokens        bigint NOT NULL,
    output_tokens       bigint NOT NULL,
    total_tokens        bigint NOT NULL,
    reasoning_tokens    bigint,
    cached_input_tokens bigint,
    CONSTRAINT run_usage_pkey PRIMARY KEY (task_id, provider, model),
    CONSTRAINT run_usage_tokens_check CHECK (
        input_tokens >= 0 AND output_tokens >= 0 AND total_tokens >= 0
        AND coalesce(reasoning_tokens, 0) >= 0 AND coalesce(cached_input_tokens, 0) >= 0)
);
