-- What each owner keeps in history, in bytes (issue 25: bytes an owner may keep "in all"): each
-- thread's messages (text, metadata, AG-UI form) and tool-call arguments, added as each of its
-- runs ends (and as a fork copies them), and the owner's sum, kept beside it in the same
-- transactions. The runs service refuses new runs of an owner past SB_RUNS_OWNER_HISTORY_BYTES
-- (history tells it the sum through NATS). A thread's erasure takes its bytes off; an owner with
-- no thread left has no row.
-- Expand only: the previous release neither reads nor writes these.
ALTER TABLE threads ADD COLUMN bytes bigint NOT NULL DEFAULT 0;

CREATE TABLE owner_bytes (
    owner text   NOT NULL,
    bytes bigint NOT NULL,
    CONSTRAINT owner_bytes_pkey PRIMARY KEY (owner)
);

-- What the threads hold already (one pass; a table of a few million messages takes seconds).
UPDATE threads t SET bytes = s.bytes
  FROM (SELECT m.owner, m.thread_id,
               sum(octet_length(m.content) + octet_length(m.metadata::text)
                   + coalesce(octet_length(m.agui::text), 0)) AS bytes
          FROM messages m GROUP BY m.owner, m.thread_id) s
 WHERE t.owner = s.owner AND t.thread_id = s.thread_id;
UPDATE threads t SET bytes = t.bytes + s.bytes
  FROM (SELECT p.owner, p.thread_id, sum(octet_length(c.arguments)) AS bytes
          FROM tool_calls c JOIN run_progress p ON p.task_id = c.task_id
         GROUP BY p.owner, p.thread_id) s
 WHERE t.owner = s.owner AND t.thread_id = s.thread_id;
INSERT INTO owner_bytes (owner, bytes)
SELECT owner, sum(bytes) FROM threads GROUP BY owner HAVING sum(bytes) > 0;
