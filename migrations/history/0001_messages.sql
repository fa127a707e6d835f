-- History owns this schema. Every message of every thread, in conversation order.

CREATE TABLE threads (
    owner       text        NOT NULL,
    thread_id   text        NOT NULL,
    last_seq    bigint      NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT threads_pkey PRIMARY KEY (owner, thread_id)
);

CREATE INDEX threads_owner_recent_idx ON threads (owner, updated_at DESC);

CREATE TABLE messages (
    id          uuid        NOT NULL,
    owner       text        NOT NULL,
    thread_id   text        NOT NULL,
    seq         bigint      NOT NULL,
    task_id     uuid        NOT NULL,
    message_id  text        NOT NULL,
    role        text        NOT NULL,
    content     text        NOT NULL,
    metadata    jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at  timestamptz NOT NULL,
    CONSTRAINT messages_pkey PRIMARY KEY (id),
    CONSTRAINT messages_thread_seq_key UNIQUE (owner, thread_id, seq),
    CONSTRAINT messages_task_message_key UNIQUE (task_id, message_id),
    CONSTRAINT messages_thread_fkey FOREIGN KEY (owner, thread_id) REFERENCES threads (owner, thread_id),
    CONSTRAINT messages_role_check CHECK (role IN ('user', 'assistant', 'tool'))
);

CREATE INDEX messages_thread_time_idx ON messages (owner, thread_id, created_at);

-- How far each run's event log has been applied: events are applied exactly once, in order.
CREATE TABLE run_progress (
    task_id        uuid        NOT NULL,
    owner          text        NOT NULL,
    thread_id      text        NOT NULL,
    run_id         text        NOT NULL,
    accepted_at    timestamptz NOT NULL,
    last_event_seq bigint      NOT NULL DEFAULT 0,
    status         text        NOT NULL DEFAULT 'queued',
    CONSTRAINT run_progress_pkey PRIMARY KEY (task_id),
    CONSTRAINT run_progress_status_check CHECK (status IN ('queued', 'running', 'completed', 'failed', 'cancelled'))
);
