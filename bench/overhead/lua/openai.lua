-- wrk script for bench/overhead/wrk.py: POST one fixed JSON body on every request,
-- optionally pin wrk thread i to address i (mod n) of $HC_SPLIT_ADDRS, and print
-- one machine-readable summary line.
--
-- Environment (wrk passes no script arguments to setup(), so the knobs are env vars):
--   HC_BODY_FILE    path of the JSON request body (required)
--   HC_SPLIT_ADDRS  "host:port,host:port": thread i connects to entry i mod n instead
--                   of the URL's address (the "direct" target: the threads, and so the
--                   connections, are split evenly across engines). Unset: use the URL.
--   HC_HEADERS      "Name: value" lines sent with every request besides Content-Type
--                   (a tenant's key: `Authorization: Bearer ...`). Unset: none.

local body_file = assert(io.open(assert(os.getenv("HC_BODY_FILE"), "HC_BODY_FILE unset"), "rb"))
wrk.method = "POST"
wrk.body = body_file:read("*a")
body_file:close()
wrk.headers["Content-Type"] = "application/json"
for name, value in (os.getenv("HC_HEADERS") or ""):gmatch("([^:\n]+): ([^\n]*)") do
   wrk.headers[name] = value
end

local split = os.getenv("HC_SPLIT_ADDRS")
local threads_set_up = 0

function setup(thread)
   if split == nil or split == "" then
      return
   end
   local targets = {}
   for target in split:gmatch("[^,]+") do
      table.insert(targets, target)
   end
   local host, port = targets[threads_set_up % #targets + 1]:match("^(.*):(%d+)$")
   thread.addr = assert(wrk.lookup(host, port)[1], "cannot resolve " .. host)
   threads_set_up = threads_set_up + 1
end

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      'HC_WRK {"duration_us": %.0f, "requests": %.0f, "bytes": %.0f, "connect": %.0f, '
         .. '"read": %.0f, "write": %.0f, "status": %.0f, "timeout": %.0f, '
         .. '"p50_us": %.0f, "p99_us": %.0f, "mean_us": %.1f, "max_us": %.0f}\n',
      summary.duration, summary.requests, summary.bytes, e.connect, e.read, e.write,
      e.status, e.timeout, latency:percentile(50), latency:percentile(99), latency.mean,
      latency.max))
end
