-- Tool calls of a run while their arguments stream in (TOOL_CALL_START/ARGS/END). The calling
-- assistant message's `metadata.tool_calls` is rebuilt from these rows; a tool result's
-- `metadata.tool_name` is looked up here.
CREATE TABLE tool_calls (
    task_id      uuid        NOT NULL,
    tool_call_id text        NOT NULL,
    message_id   text        NOT NULL,
    name         text        NOT NULL,
    arguments    text        NOT NULL DEFAULT '',
    started_seq  bigint      NOT NULL,
    CONSTRAINT tool_calls_pkey PRIMARY KEY (task_id, tool_call_id)
);
