-- Presigned uploads and their verification, per-owner dedup, workspace files.

ALTER TABLE files
    ADD COLUMN sha256      bytea,
    ADD COLUMN expires_at  timestamptz,
    ADD COLUMN verified_at timestamptz,
    ADD COLUMN problem     text;

-- Per-owner dedup: one live file per owner and content. A verified file answers later requests
-- for the same hash; a pending one makes two concurrent requests share one file.
CREATE UNIQUE INDEX files_owner_sha256_live_key ON files (owner, declared_sha256)
    WHERE declared_sha256 IS NOT NULL AND status IN ('pending', 'verified');

CREATE INDEX files_pending_expiry_idx ON files (expires_at) WHERE status = 'pending';

-- Every file belongs to sessions (threads) of its owner, as an upload or as generated output.
CREATE TABLE workspace_files (
    id          uuid        NOT NULL,
    owner       text        NOT NULL,
    session_id  text        NOT NULL,
    file_id     uuid        NOT NULL,
    source      text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT workspace_files_pkey PRIMARY KEY (id),
    CONSTRAINT workspace_files_file_fkey FOREIGN KEY (file_id) REFERENCES files (id) ON DELETE CASCADE,
    CONSTRAINT workspace_files_session_file_key UNIQUE (owner, session_id, file_id),
    CONSTRAINT workspace_files_source_check CHECK (source IN ('upload', 'generated'))
);

CREATE INDEX workspace_files_session_idx ON workspace_files (owner, session_id, created_at);
