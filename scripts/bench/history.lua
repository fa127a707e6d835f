-- wrk script for GET /api/v1/agent/history (used by scripts/bench-history.sh; see
-- BENCHMARKS.md, "4. History day snapshots").
--
-- Every request is the same day snapshot of one thread: wrk's URL carries the path and query
-- (?threadId=...), this script only adds the bearer token of the thread's owner.
--
-- Environment:
--   BENCH_TOKEN   bearer token (scripts/token.sh SUB) of the thread's owner
--
-- done() prints one line "BENCH_JSON {...}" with the rate and the latency percentiles, in the
-- format of scripts/bench/runs.lua and scripts/bench/upload_url.lua.

local token = os.getenv("BENCH_TOKEN") or ""
if token == "" then error("BENCH_TOKEN is not set") end

wrk.method = "GET"
wrk.headers["Authorization"] = "Bearer " .. token
wrk.headers["Accept"] = "application/json"

local threads = {}
function setup(thread)
  table.insert(threads, thread)
end

function done(summary, latency, requests)
  local e = summary.errors
  local seconds = summary.duration / 1e6
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"seconds":%.3f,"rps":%.1f,"bytes":%d,' ..
    '"p50_ms":%.3f,"p90_ms":%.3f,"p99_ms":%.3f,"max_ms":%.3f,"mean_ms":%.3f,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"threads":%d}\n',
    summary.requests, seconds, summary.requests / seconds, summary.bytes,
    latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000, latency.mean / 1000,
    e.connect, e.read, e.write, e.status, e.timeout,
    #threads))
end
