-- Attachments owns this schema. One row per stored file, always scoped to its owner.

CREATE TABLE files (
    id              uuid        NOT NULL,
    owner           text        NOT NULL,
    bucket          text        NOT NULL,
    object_key      text        NOT NULL,
    file_name       text        NOT NULL,
    content_type    text        NOT NULL,
    size_bytes      bigint      NOT NULL,
    declared_sha256 bytea,
    status          text        NOT NULL DEFAULT 'pending',
    created_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT files_pkey PRIMARY KEY (id),
    CONSTRAINT files_object_key UNIQUE (bucket, object_key),
    CONSTRAINT files_size_check CHECK (size_bytes > 0),
    CONSTRAINT files_status_check CHECK (status IN ('pending', 'verified', 'quarantined'))
);

CREATE INDEX files_owner_idx ON files (owner, created_at DESC);
