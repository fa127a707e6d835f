-- owner and thread_id are not independent (a thread belongs to one owner). Without this the
-- planner estimates one row per thread once the table is large, reads a whole thread through
-- the (owner, thread_id, seq) index to avoid a sort, and aggregates every entry of the thread
-- for its latest day (measured in BENCHMARKS.md, "4. History day snapshots").
CREATE STATISTICS messages_owner_thread_stats (ndistinct, dependencies) ON owner, thread_id FROM messages;
ANALYZE messages;
