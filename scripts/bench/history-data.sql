-- Data generators of scripts/bench-history.sh (see BENCHMARKS.md, "4. History day snapshots").
-- Loaded into the benchmark's history database after the service has migrated it; creates the
-- schema `bench` (functions only) beside the service's `history` schema. Every row is a pure
-- function of its number, so the database can be grown step by step (10k -> 1M -> 10M) by
-- inserting the difference.
--
-- Filler: message n (1-based) is message seq = (n-1) % per_thread + 1 of thread
-- t = (n-1) / per_thread, which belongs to owner t / threads_per_owner. Odd seqs are user
-- messages, even ones the assistant's reply to them (one run, task_id, per pair). Each thread
-- starts on one of 180 days of 2025 and has a message every 90 s. Owner ids sort in thread
-- order ("user-00000042"), so growing the table appends to the right of the indexes on
-- (owner, thread_id, ...); thread ids are UUIDs, as clients send them.
--
-- Benchmark threads (owner "bench-owner"): bench.bench_rows(thread, with_attachments) is 400
-- messages: 5 earlier days of 40 messages (2025-07-10 .. 07-14) and the latest day, 2025-07-15,
-- of 200 messages from 08:00 UTC, alternating user / assistant; with_attachments: every other
-- user message (50) carries `user_message_attachments` = {bucket, path, mime_type} of file
-- bench.attachment_path(i), i = 1..50, which the script registers as verified files of
-- bench-owner in the attachments database.

CREATE SCHEMA IF NOT EXISTS bench;

CREATE OR REPLACE FUNCTION bench.hex_uuid(kind int, k bigint) RETURNS uuid
LANGUAGE sql IMMUTABLE AS $$
  SELECT (to_hex(kind) || lpad(to_hex(k), 31, '0'))::uuid
$$;

CREATE OR REPLACE FUNCTION bench.filler_owner(t bigint, threads_per_owner int) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT 'user-' || lpad((t / threads_per_owner)::text, 8, '0')
$$;

CREATE OR REPLACE FUNCTION bench.filler_thread(t bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT md5('thread-' || t)::uuid::text
$$;

CREATE OR REPLACE FUNCTION bench.filler_time(t bigint, seq bigint) RETURNS timestamptz
LANGUAGE sql IMMUTABLE AS $$
  SELECT timestamptz '2025-01-01 00:00:00+00'
    + make_interval(days => ((t * 7919) % 180)::int, secs => ((t * 104729) % 36000)::double precision)
    + make_interval(secs => (seq * 90)::double precision)
$$;

-- Text of a message: a user question of ~120 characters or an answer of ~400 to ~700.
CREATE OR REPLACE FUNCTION bench.body(is_user boolean, n bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN is_user
    THEN 'Question ' || n || ': summarise the attached quarterly report and list the open risks, with owners and dates.'
    ELSE 'Answer ' || n || ': ' || repeat('The report shows revenue up 4% on the quarter; the open risks are supplier concentration, the delayed migration and hiring. ', 3 + (n % 3)::int)
  END
$$;

CREATE OR REPLACE FUNCTION bench.attachment_path(i int) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT 'uploads/bench-owner/' || bench.hex_uuid(10, i) || '/quarterly-report-' || i || '.pdf'
$$;

-- The filler messages first_n .. last_n (and their threads' rows, created or brought up to date).
CREATE OR REPLACE FUNCTION bench.load_filler(first_n bigint, last_n bigint, per_thread int, threads_per_owner int)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  inserted bigint;
BEGIN
  IF last_n < first_n THEN
    RETURN 0;
  END IF;
  INSERT INTO history.threads AS th (owner, thread_id, last_seq, created_at, updated_at)
  SELECT bench.filler_owner(t, threads_per_owner), bench.filler_thread(t), last_seq,
         bench.filler_time(t, 1), bench.filler_time(t, last_seq)
  FROM generate_series((first_n - 1) / per_thread, (last_n - 1) / per_thread) AS t,
       LATERAL (SELECT least(per_thread::bigint, last_n - t * per_thread) AS last_seq) AS l
  ON CONFLICT (owner, thread_id) DO UPDATE
    SET last_seq = EXCLUDED.last_seq, updated_at = EXCLUDED.updated_at;
  INSERT INTO history.messages (id, owner, thread_id, seq, task_id, message_id, role, content, metadata, created_at)
  SELECT bench.hex_uuid(0, n), bench.filler_owner(t, threads_per_owner), bench.filler_thread(t), seq,
         bench.hex_uuid(1, (n + 1) / 2), 'msg-' || n,
         CASE WHEN seq % 2 = 1 THEN 'user' ELSE 'assistant' END,
         bench.body(seq % 2 = 1, n),
         CASE WHEN seq % 2 = 1
           THEN jsonb_build_object('run_id', 'run-' || (n + 1) / 2, 'message_id', 'msg-' || n, 'stage', 'input')
           ELSE jsonb_build_object('run_id', 'run-' || (n + 1) / 2, 'message_id', 'msg-' || n, 'stage', 'response',
                                   'latency_ms', 800 + n % 4000)
         END,
         bench.filler_time(t, seq)
  FROM generate_series(first_n, last_n) AS n,
       LATERAL (SELECT (n - 1) / per_thread AS t, (n - 1) % per_thread + 1 AS seq) AS x;
  GET DIAGNOSTICS inserted = ROW_COUNT;
  RETURN inserted;
END
$$;

-- The 400 messages of a benchmark thread (kind: 0 with attachments, 1 without), as rows of
-- history.messages; the script inserts them together with the first filler rows, in random
-- order, so the latest day's rows lie on different heap pages as they do in production.
CREATE OR REPLACE FUNCTION bench.bench_rows(thread_id text, kind int)
RETURNS SETOF history.messages LANGUAGE sql STABLE AS $$
  WITH numbered AS (
    -- i = 1..400: i <= 200 the five earlier days (40 a day), then the latest day.
    SELECT i,
           CASE WHEN i <= 200
             THEN timestamptz '2025-07-10 09:00:00+00' + make_interval(days => (i - 1) / 40, secs => ((i - 1) % 40) * 120)
             ELSE timestamptz '2025-07-15 08:00:00+00' + make_interval(secs => (i - 201) * 120)
           END AS at,
           i % 2 = 1 AS is_user
    FROM generate_series(1, 400) AS i
  )
  SELECT bench.hex_uuid(11 + kind, i), 'bench-owner', thread_id, i::bigint,
         bench.hex_uuid(13 + kind, (i + 1) / 2), 'bench-msg-' || i,
         CASE WHEN is_user THEN 'user' ELSE 'assistant' END,
         bench.body(is_user, i),
         CASE
           WHEN NOT is_user THEN
             jsonb_build_object('run_id', 'bench-run-' || (i + 1) / 2, 'message_id', 'bench-msg-' || i,
                                'stage', 'response', 'latency_ms', 1500 + i)
           -- user messages 201, 205, 209, ... of the latest day: 50 attachments
           WHEN kind = 0 AND i > 200 AND (i - 201) % 4 = 0 THEN
             jsonb_build_object('run_id', 'bench-run-' || (i + 1) / 2, 'message_id', 'bench-msg-' || i,
                                'stage', 'input',
                                'user_message_attachments', jsonb_build_object(
                                  'bucket', current_setting('bench.bucket'),
                                  'path', bench.attachment_path(((i - 201) / 4 + 1)::int),
                                  'mime_type', 'application/pdf'))
           ELSE
             jsonb_build_object('run_id', 'bench-run-' || (i + 1) / 2, 'message_id', 'bench-msg-' || i,
                                'stage', 'input')
         END,
         at
  FROM numbered
$$;

-- The first step: the benchmark threads and filler 1 .. last_n, the messages in random order.
CREATE OR REPLACE FUNCTION bench.load_first(last_n bigint, per_thread int, threads_per_owner int,
                                            sign_thread text, nosign_thread text)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  inserted bigint;
BEGIN
  INSERT INTO history.threads (owner, thread_id, last_seq, created_at, updated_at)
  VALUES ('bench-owner', sign_thread, 400, '2025-07-10 09:00:00+00', '2025-07-15 14:38:00+00'),
         ('bench-owner', nosign_thread, 400, '2025-07-10 09:00:00+00', '2025-07-15 14:38:00+00');
  PERFORM bench.load_filler(1, last_n, per_thread, threads_per_owner);
  -- Move the filler aside and write everything back shuffled.
  CREATE TEMP TABLE shuffled ON COMMIT DROP AS
    SELECT * FROM history.messages
    UNION ALL SELECT * FROM bench.bench_rows(sign_thread, 0)
    UNION ALL SELECT * FROM bench.bench_rows(nosign_thread, 1);
  TRUNCATE history.messages;
  INSERT INTO history.messages SELECT * FROM shuffled ORDER BY random();
  GET DIAGNOSTICS inserted = ROW_COUNT;
  RETURN inserted;
END
$$;
