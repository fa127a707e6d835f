-- wrk script for POST /api/v1/agent/runs (used by scripts/bench-runs.sh; see BENCHMARKS.md).
--
-- Every request is a new, valid run: a UUID-shaped threadId made of a per-invocation nonce, the
-- wrk thread number and a counter, so no request is a duplicate of another. The body is byte for
-- byte what crates/bench's `run_body` builds, so the JetStream publish loop sends the same runs.
--
-- Environment:
--   BENCH_TOKEN     bearer token (scripts/token.sh SUB)
--   BENCH_TEXT      the user text (default: the same as crates/bench DEFAULT_TEXT)
--   BENCH_NONCE     8 hex digits, unique per wrk invocation (default: random)
--   BENCH_RATE      target rate in requests/s over all threads (0 = closed loop, full speed).
--                   Paced with wrk's delay() hook: each wrk thread keeps a schedule of send
--                   slots BENCH_THREADS * 1000 / BENCH_RATE ms apart on a monotonic clock, and a
--                   connection whose response is complete waits for the next free slot. A
--                   connection that falls behind does not catch up in a burst: the achieved rate
--                   is what done() reports.
--   BENCH_THREADS   wrk's -t (to split the rate among threads)
--
-- done() prints one line "BENCH_JSON {...}" with the rate and the latency percentiles.

local token = os.getenv("BENCH_TOKEN") or ""
local text = os.getenv("BENCH_TEXT")
if text == nil or text == "" then
  text = "Summarise the attached quarterly report in three bullet points and list the open risks."
end
local rate = tonumber(os.getenv("BENCH_RATE") or "0") or 0
local rate_threads = tonumber(os.getenv("BENCH_THREADS") or "1") or 1

local function json_string(s)
  s = s:gsub('[%c"\\]', function(c)
    if c == '"' then return '\\"' end
    if c == "\\" then return "\\\\" end
    if c == "\n" then return "\\n" end
    return string.format("\\u%04x", c:byte())
  end)
  return '"' .. s .. '"'
end

local text_json = json_string(text)

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. token

-- setup() runs in the main Lua state, once per wrk thread.
local threads = {}
function setup(thread)
  table.insert(threads, thread)
  thread:set("thread_no", #threads)
end

local nonce
local counter = 0
local mid, low

function init(args)
  -- thread_no was set by setup() as a global of this thread's Lua state.
  local n = thread_no or 0
  math.randomseed(os.time() + n * 7919)
  nonce = os.getenv("BENCH_NONCE")
  if nonce == nil or not nonce:match("^%x%x%x%x%x%x%x%x$") then
    nonce = string.format("%04x%04x", math.random(0, 65535), math.random(0, 65535))
  end
  nonce = nonce:lower()
  mid = math.random(0, 4095)
  low = math.random(0, 4095)
end

function request()
  counter = counter + 1
  local n = thread_no or 0
  local thread_id = string.format("%s-%04x-4%03x-8%03x-%012x", nonce, n, mid, low, counter)
  local run_id = string.format("wrk-%s-%d-%d", nonce, n, counter)
  local body = '{"threadId":"' .. thread_id .. '","runId":"' .. run_id ..
    '","messages":[{"id":"m1","role":"user","content":' .. text_json .. '}]}'
  return wrk.format(nil, nil, nil, body)
end

if rate > 0 then
  local ffi = require("ffi")
  ffi.cdef[[
    typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
    int clock_gettime(int clk_id, bench_timespec *tp);
  ]]
  local CLOCK_MONOTONIC = 1
  local ts = ffi.new("bench_timespec")
  local function now_ms()
    ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
    return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
  end
  local interval = rate_threads * 1000 / rate
  local next_slot = 0
  -- Milliseconds until this connection's next send slot (wrk truncates to whole ms; the slots
  -- themselves stay exactly `interval` apart, so the mean rate is kept).
  function delay()
    local now = now_ms()
    local slot = math.max(next_slot, now)
    next_slot = slot + interval
    return slot - now
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  local seconds = summary.duration / 1e6
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"seconds":%.3f,"rps":%.1f,' ..
    '"p50_ms":%.3f,"p90_ms":%.3f,"p99_ms":%.3f,"max_ms":%.3f,"mean_ms":%.3f,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"goal_rps":%.1f,"threads":%d}\n',
    summary.requests, seconds, summary.requests / seconds,
    latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000, latency.mean / 1000,
    e.connect, e.read, e.write, e.status, e.timeout,
    rate, #threads))
end
