-- wrk script: reservations for one SKU, each from the next buyer of a credentials
-- file written by `seckill-bench --credentials-out` (user, Authorization value,
-- purchase token, tab-separated), with a fresh request id each, counting the
-- answers by status code and by the body's "status". Used by scripts/bench-sold-out
-- against a sale that has sold out (docs/BENCHMARKS.md).
--
--   wrk -t2 -c128 -d10s -s bench/wrk/sold-out.lua http://HOST:PORT -- PATH CREDENTIALS

local threads = {}
local next_id = 0

function setup(thread)
  next_id = next_id + 1
  thread:set("thread_id", next_id)
  table.insert(threads, thread)
end

function init(args)
  path = args[1]
  buyers = {}
  for line in io.lines(args[2]) do
    local user, bearer, purchase = line:match("^(%d+)\t([^\t]+)\t([^\t]*)$")
    if user then
      buyers[#buyers + 1] = { bearer, purchase }
    end
  end
  if #buyers == 0 then
    error("no buyers in " .. args[2])
  end
  math.randomseed(os.time() * 100 + thread_id)
  -- Each thread walks the buyers from its own starting point.
  turn = math.random(#buyers)
  counts = {}
  statuses = {}
end

local function request_id()
  return string.format("%08x-%04x-4%03x-%04x-%04x%08x",
    math.random(0, 0x7fffffff), math.random(0, 0xffff), math.random(0, 0xfff),
    0x8000 + math.random(0, 0x3fff), math.random(0, 0xffff), math.random(0, 0x7fffffff))
end

function request()
  turn = turn % #buyers + 1
  local buyer = buyers[turn]
  local headers = {
    ["Authorization"] = buyer[1],
    ["Content-Type"] = "application/json",
  }
  if buyer[2] ~= "" then
    headers["X-Purchase-Token"] = buyer[2]
  end
  return wrk.format("POST", path, headers, '{"request_id":"' .. request_id() .. '"}')
end

function response(status, headers, body)
  counts[status] = (counts[status] or 0) + 1
  local name = body:match('"status":"([A-Z_]+)"') or "?"
  statuses[name] = (statuses[name] or 0) + 1
end

function done(summary, latency, requests)
  local by_code, by_status = {}, {}
  for _, thread in ipairs(threads) do
    for code, n in pairs(thread:get("counts")) do
      by_code[code] = (by_code[code] or 0) + n
    end
    for name, n in pairs(thread:get("statuses")) do
      by_status[name] = (by_status[name] or 0) + n
    end
  end
  local seconds = summary.duration / 1e6
  io.write(string.format("requests/s %.0f (%d in %.1f s), errors %d\n",
    summary.requests / seconds, summary.requests, seconds,
    summary.errors.connect + summary.errors.read + summary.errors.write
      + summary.errors.timeout))
  for code, n in pairs(by_code) do
    io.write(string.format("status %d: %d\n", code, n))
  end
  for name, n in pairs(by_status) do
    io.write(string.format("answer %s: %d\n", name, n))
  end
  io.write(string.format("latency p50 %.2f ms, p99 %.2f ms\n",
    latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
