-- wrk script for POST /v2/files/upload-url (used by scripts/bench-attachments.sh; see
-- BENCHMARKS.md, "3. Attachments").
--
-- Every request is a new, valid upload of a PDF with a declared SHA-256 that no earlier request
-- declared: content_hash is a per-invocation nonce, the wrk thread number and a counter, padded
-- with per-thread random hex digits to 64 hex digits. So on the attachments service every request
-- does the dedup lookup (and finds nothing), inserts a new pending row and signs a POST policy;
-- no request is answered as a duplicate.
--
--   {"file_name":"bench-<nonce>-<thread>-<n>.pdf","file_type":"application/pdf",
--    "file_size":1048576,"content_hash":"<64 hex>"}
--
-- Environment:
--   BENCH_TOKEN     bearer token (scripts/token.sh SUB): one owner for every request
--   BENCH_TOKENS_FILE  instead, a file of tokens, one a line: request n of a thread uses token
--                   n mod count, so the rows are spread evenly over that many owners
--   BENCH_NONCE     8 hex digits, unique per wrk invocation (default: random)
--   BENCH_FILE_SIZE the declared file_size (default 1048576)
--
-- done() prints one line "BENCH_JSON {...}" with the rate and the latency percentiles, in the
-- format of scripts/bench/runs.lua.

local token = os.getenv("BENCH_TOKEN") or ""
local file_size = tonumber(os.getenv("BENCH_FILE_SIZE") or "1048576") or 1048576
local tokens_file = os.getenv("BENCH_TOKENS_FILE")
local tokens = nil
if tokens_file ~= nil and tokens_file ~= "" then
  tokens = {}
  for line in io.lines(tokens_file) do
    if line ~= "" then table.insert(tokens, "Bearer " .. line) end
  end
  if #tokens == 0 then error("no token in " .. tokens_file) end
end

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
local pad
local counter = 0
local headers = nil

function init(args)
  -- thread_no was set by setup() as a global of this thread's Lua state.
  local n = thread_no or 0
  math.randomseed(os.time() + n * 7919)
  nonce = os.getenv("BENCH_NONCE")
  if nonce == nil or not nonce:match("^%x%x%x%x%x%x%x%x$") then
    nonce = string.format("%04x%04x", math.random(0, 65535), math.random(0, 65535))
  end
  nonce = nonce:lower()
  local parts = {}
  for i = 1, 10 do
    parts[i] = string.format("%04x", math.random(0, 65535))
  end
  pad = table.concat(parts) -- 40 hex digits
end

function request()
  counter = counter + 1
  local n = thread_no or 0
  -- 8 + 4 + 12 + 40 = 64 hex digits, unique per (invocation, thread, counter).
  local hash = string.format("%s%04x%012x%s", nonce, n, counter, pad)
  local body = '{"file_name":"bench-' .. nonce .. '-' .. n .. '-' .. counter ..
    '.pdf","file_type":"application/pdf","file_size":' .. string.format("%d", file_size) ..
    ',"content_hash":"' .. hash .. '"}'
  if tokens then
    -- wrk.format takes the whole header table; one table per thread, re-used.
    headers = headers or { ["Content-Type"] = "application/json" }
    headers["Authorization"] = tokens[(counter % #tokens) + 1]
    return wrk.format(nil, nil, headers, body)
  end
  return wrk.format(nil, nil, nil, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  local seconds = summary.duration / 1e6
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"seconds":%.3f,"rps":%.1f,' ..
    '"p50_ms":%.3f,"p90_ms":%.3f,"p99_ms":%.3f,"max_ms":%.3f,"mean_ms":%.3f,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"threads":%d}\n',
    summary.requests, seconds, summary.requests / seconds,
    latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000, latency.mean / 1000,
    e.connect, e.read, e.write, e.status, e.timeout,
    #threads))
end
