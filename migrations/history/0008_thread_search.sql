-- Conversations people can manage (issue 28): a thread's title, and search over the owner's
-- messages. Expand only: the previous release writes no title (NULL: the list shows none until
-- the next user message, or a rename, gives one) and never reads the new indexes.

-- A thread's title: given by its owner (PATCH /api/v1/agent/threads/{threadId}), else derived
-- from its first user message (protocol::threads::derived_title).
ALTER TABLE threads
    ADD COLUMN title text,
    ADD CONSTRAINT threads_title_check CHECK (char_length(title) BETWEEN 1 AND 200);

-- The threads of before get the title their first user message gives, cut as
-- derived_title cuts it: control and space characters made one space, at most 80 characters,
-- ending at the last word boundary within them (or 81 when a space follows); a message of
-- files only gives its first file's name.
WITH firsts AS (
    SELECT DISTINCT ON (owner, thread_id) owner, thread_id, line
      FROM (SELECT owner, thread_id, seq,
                   coalesce(
                       nullif(btrim(regexp_replace(content, '[[:space:][:cntrl:]]+', ' ', 'g')), ''),
                       nullif(btrim(regexp_replace(
                           coalesce(metadata -> 'user_message_attachment_list' -> 0 ->> 'file_name',
                                    regexp_replace(metadata -> 'user_message_attachments' ->> 'path',
                                                   '^.*/', '')),
                           '[[:space:][:cntrl:]]+', ' ', 'g')), '')) AS line
              FROM messages
             WHERE role = 'user') AS candidates
     WHERE line IS NOT NULL
     ORDER BY owner, thread_id, seq
)
UPDATE threads t
   SET title = CASE WHEN char_length(f.line) <= 80 THEN f.line
                    ELSE coalesce(substring(left(f.line, 81) FROM '^(.*[^ ]) '), left(f.line, 80))
               END
  FROM firsts f
 WHERE t.owner = f.owner AND t.thread_id = f.thread_id AND t.title IS NULL;

-- Search: full text ('simple': no language's stemming or stop words, the seeds speak several)
-- for words, trigrams for what has no spaces between its words (Chinese) and for any part of
-- a word. Both trusted extensions (PostgreSQL 13+): the database owner, who runs migrations,
-- may create them; they land in this schema (the first on the search path).
CREATE EXTENSION IF NOT EXISTS pg_trgm;
-- GIN operator classes for plain columns: the owner is the first column of both indexes, so a
-- search reads only the entries of the caller's own messages (never every owner's matches).
CREATE EXTENSION IF NOT EXISTS btree_gin;

-- The first 10 000 characters of a message are searched (a user message's text is at most
-- that long): an append to a long streaming reply re-indexes a bounded text, and a tsvector
-- stays far below its 1 MB limit. Tool results are not searched (the role is fixed at insert,
-- so the predicate never moves a row in or out).
CREATE INDEX messages_search_words_idx ON messages
    USING gin (owner, to_tsvector('simple', left(content, 10000)))
    WHERE role <> 'tool';
CREATE INDEX messages_search_trigrams_idx ON messages
    USING gin (owner, left(content, 10000) gin_trgm_ops)
    WHERE role <> 'tool';
