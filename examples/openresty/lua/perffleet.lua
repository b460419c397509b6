--- perffleet: the nginx workers' perf_event figures for the tools a fleet
-- already runs.
--  (1) /metrics: Prometheus text exposition of every worker's counters
--      (perfreq's per-request sums, the worker's own counter group, lost
--      samples), gathered through a lua_shared_dict: each worker publishes
--      its figures from a timer, the worker that answers the scrape
--      publishes its own first, then prints them all with a `pid` label;
--  (2) /debug/pprof/profile?seconds=N: the Go endpoint, answering a gzipped
--      pprof profile of the worker that serves it, taken with pe.profile
--      (Lua functions and lines) and written by perf_event.pprof.
--
--   http {
--     lua_shared_dict perf_fleet 1m;
--     init_worker_by_lua_block { require("perfreq").init_worker()
--                                require("perffleet").init_worker() }
--     server {
--       location = /metrics { content_by_lua_block { require("perffleet").metrics() } }
--       location = /debug/pprof/profile { content_by_lua_block { require("perffleet").pprof() } }
--       # opt-in per-route series: this location's requests also count under route="api"
--       location /api { log_by_lua_block { require("perffleet").log("api") } ... }
--     }
--   }
local ngx = ngx  -- luacheck: read globals ngx
local perfreq = require("perfreq")

local format, concat, floor, tonumber, tostring = string.format, table.concat, math.floor, tonumber, tostring
local pairs, ipairs, type, pcall, error = pairs, ipairs, type, pcall, error

local M = {}

local PREFIX = "nginx_perf_"
-- name, type, help; the order of the exposition
local FAMILIES = {
  { "requests_measured_total", "counter", "Requests whose counters perfreq measured." },
  { "request_task_clock_seconds_total", "counter",
    "CPU time the worker spent on the measured requests (task-clock)." },
  { "request_page_faults_total", "counter", "Page faults of the worker during the measured requests." },
  { "request_context_switches_total", "counter",
    "Context switches of the worker during the measured requests." },
  { "route_requests_measured_total", "counter", "Measured requests of the routes that opted in." },
  { "route_task_clock_seconds_total", "counter", "CPU time of the measured requests, by route." },
  { "route_page_faults_total", "counter", "Page faults of the measured requests, by route." },
  { "route_context_switches_total", "counter", "Context switches of the measured requests, by route." },
  { "worker_task_clock_seconds_total", "counter",
    "CPU time of the worker since its counters opened (task-clock, all of its work)." },
  { "worker_page_faults_total", "counter", "Page faults of the worker since its counters opened." },
  { "worker_context_switches_total", "counter", "Context switches of the worker since its counters opened." },
  { "worker_counters_enabled_seconds_total", "counter",
    "Time the worker's counter group was enabled (time_enabled)." },
  { "worker_counters_running_seconds_total", "counter",
    "Time the worker's counter group was counting on a CPU (time_running)." },
  { "lost_samples_total", "counter",
    "Samples the kernel dropped because a ring was full (source: sampler or pprof)." },
  { "pprof_profiles_total", "counter", "Profiles /debug/pprof/profile answered." },
  { "lua_vm_info", "gauge", "The worker's Lua VM: version and JIT state (value 1)." },
}

local conf = { dict = "perf_fleet", interval = 1, max_routes = 16, max_seconds = 60 }
local dict                   -- the shared dict, nil when the http{} block has none
local pid, host
local routes, nroutes = {}, 0
local profiling = false      -- one pprof profile at a time per worker
local pprof_lost, pprof_count = 0, 0
local gbuf = {}              -- reused by the worker's group reads

local function hostname()
  local f = io.open("/proc/sys/kernel/hostname", "r")
  local h = f and f:read("*l")
  if f then f:close() end
  return h or "unknown"
end

-- a label value as the text format wants it: \ " and newline escaped
local function esc(v)
  return (tostring(v):gsub("[\\\"\n]", { ["\\"] = "\\\\", ["\""] = "\\\"", ["\n"] = "\\n" }))
end

-- counts print as integers (no exponent up to 2^53), times as seconds
local function int(n) return format("%.0f", tonumber(n) or 0) end
local function secs(ns) return format("%.9f", (tonumber(ns) or 0) / 1e9) end

--- In init_worker_by_lua, after perfreq.init_worker(): starts this worker's
-- publishing timer.  `opts`: `dict` (the lua_shared_dict's name,
-- "perf_fleet"), `interval` (seconds between two publications, 1),
-- `max_routes` (distinct route labels kept; later ones count as "other",
-- 16), `max_seconds` (the longest profile /debug/pprof/profile takes, 60).
function M.init_worker(opts)
  if opts ~= nil and type(opts) ~= "table" then error("perffleet.init_worker: opts must be a table", 2) end
  for k, v in pairs(opts or {}) do
    if conf[k] == nil then error("perffleet.init_worker: unknown option " .. tostring(k), 2) end
    conf[k] = v
  end
  pid, host = ngx.worker.pid(), hostname()
  -- load the compressor now: lua-zlib sets a global `zlib`, which nginx
  -- warns about when it happens in a request
  local okp, pprof = pcall(require, "perf_event.pprof")
  if okp and pprof.gzip_available then pprof.gzip_available() end
  dict = ngx.shared[conf.dict]
  if not dict then
    ngx.log(ngx.WARN, "perffleet: no lua_shared_dict ", conf.dict, ": /metrics shows the serving worker only")
    return
  end
  local ok, err = ngx.timer.every(conf.interval, function(premature)
    if not premature then M.publish() end
  end)
  if not ok then ngx.log(ngx.ERR, "perffleet: cannot start the publishing timer: ", err) end
  M.publish()
end

--- In log_by_lua, instead of perfreq.log(): measures the request like
-- perfreq.log() does and, when it was measured, also counts it under
-- `route` (a name chosen in nginx.conf, so the label's values are bounded;
-- past `max_routes` names the rest count as "other").
function M.log(route)
  if type(route) ~= "string" then error("perffleet.log: route must be a string", 2) end
  local t = perfreq.stats()
  local n0, tc0, pf0, cs0 = t.requests, t.task_clock_ns, t.page_faults, t.context_switches
  perfreq.log()
  if t.requests == n0 then return end
  local r = routes[route]
  if not r then
    if nroutes >= conf.max_routes then
      route = "other"
      r = routes.other
    end
    if not r then
      r = { 0, 0, 0, 0 }
      routes[route] = r
      nroutes = nroutes + 1
    end
  end
  r[1] = r[1] + (t.requests - n0)
  r[2] = r[2] + (t.task_clock_ns - tc0)
  r[3] = r[3] + (t.page_faults - pf0)
  r[4] = r[4] + (t.context_switches - cs0)
end

-- this worker's samples as "family\tsample line" lines
local function render_worker()
  local out = {}
  local base = format('pid="%d",host="%s"', pid, esc(host))
  local function add(fam, value, extra)
    out[#out + 1] = fam .. "\t" .. PREFIX .. fam .. "{" .. base .. (extra or "") .. "} " .. value
  end
  local t, group, sampler = perfreq.stats()
  add("requests_measured_total", int(t.requests))
  add("request_task_clock_seconds_total", secs(t.task_clock_ns))
  add("request_page_faults_total", int(t.page_faults))
  add("request_context_switches_total", int(t.context_switches))
  for name, r in pairs(routes) do
    local l = ',route="' .. esc(name) .. '"'
    add("route_requests_measured_total", int(r[1]), l)
    add("route_task_clock_seconds_total", secs(r[2]), l)
    add("route_page_faults_total", int(r[3]), l)
    add("route_context_switches_total", int(r[4]), l)
  end
  local g = group and group:read(gbuf)
  if g then
    add("worker_task_clock_seconds_total", secs(g[1]))
    add("worker_page_faults_total", int(g[2]))
    add("worker_context_switches_total", int(g[3]))
    add("worker_counters_enabled_seconds_total", secs(g.time_enabled))
    add("worker_counters_running_seconds_total", secs(g.time_running))
  end
  local slost = sampler and tonumber((sampler:lost())) or 0
  add("lost_samples_total", int(slost), ',source="sampler"')
  add("lost_samples_total", int(pprof_lost), ',source="pprof"')
  add("pprof_profiles_total", int(pprof_count))
  add("lua_vm_info", "1", format(',vm="%s",jit="%s"', esc(jit and jit.version or _VERSION),
                                 jit and (jit.status() and "on" or "off") or "none"))
  return concat(out, "\n")
end

--- Writes this worker's figures into the shared dict now (the timer does
-- it every `interval`; an entry lives 5 intervals, so a worker that is
-- gone leaves the exposition soon after).
function M.publish()
  if not dict or not pid then return end
  local ok, err = dict:set("w:" .. pid, render_worker(), 5 * conf.interval + 1)
  if not ok then ngx.log(ngx.ERR, "perffleet: cannot publish: ", err) end
end

--- Content handler: the text exposition of every worker's figures.
function M.metrics()
  if not pid then
    ngx.status = 500
    ngx.say("perffleet: init_worker() was not called")
    return
  end
  local texts = {}
  if dict then
    M.publish()
    local keys = dict:get_keys(0)
    table.sort(keys)
    for _, k in ipairs(keys) do
      if k:find("^w:") then texts[#texts + 1] = dict:get(k) end
    end
  else
    texts[1] = render_worker()
  end
  local by = {}
  for _, text in ipairs(texts) do
    for fam, line in text:gmatch("([^\t\n]+)\t([^\n]+)") do
      local l = by[fam]
      if not l then l = {}; by[fam] = l end
      l[#l + 1] = line
    end
  end
  local out = {}
  for _, f in ipairs(FAMILIES) do
    local lines = by[f[1]]
    if lines then
      -- text format 0.0.4: HELP and TYPE name the samples, "_total" included
      local name = PREFIX .. f[1]
      out[#out + 1] = "# HELP " .. name .. " " .. f[3]
      out[#out + 1] = "# TYPE " .. name .. " " .. f[2]
      for _, line in ipairs(lines) do out[#out + 1] = line end
    end
  end
  ngx.header.content_type = "text/plain; version=0.0.4; charset=utf-8"
  ngx.print(concat(out, "\n"), "\n")
end

-- ---------------------------------------------------------------- pprof

local function refuse(status, msg)
  ngx.status = status
  ngx.header.content_type = "text/plain; charset=utf-8"
  ngx.header["X-Content-Type-Options"] = "nosniff"
  ngx.say(msg)
end

--- Content handler, Go's /debug/pprof/profile: samples this worker with
-- pe.profile for ?seconds=N (default 30, as Go) at ?hz=F (default 100, as
-- Go) while it keeps serving, and answers the gzipped profile.proto.
function M.pprof()
  local seconds = tonumber(ngx.var.arg_seconds or "30")
  if not seconds or seconds <= 0 then
    return refuse(400, "perffleet: seconds must be a positive number")
  end
  if seconds > conf.max_seconds then
    return refuse(400, format("perffleet: profile duration exceeds the limit of %gs", conf.max_seconds))
  end
  local hz = tonumber(ngx.var.arg_hz or "100")
  if not hz or hz < 1 or hz > 10000 then return refuse(400, "perffleet: hz must be in 1..10000") end
  local okp, pprof = pcall(require, "perf_event.pprof")
  if not okp then return refuse(501, "perffleet: perf_event.pprof is not installed") end
  if profiling then
    return refuse(500, "Could not enable CPU profiling: cpu profiling already in use")
  end
  local p, err = require("perf_event").profile.start({ event = "cpu-clock", freq = floor(hz) })
  if not p then return refuse(500, "Could not enable CPU profiling: " .. tostring(err)) end
  profiling = true
  ngx.update_time()
  local t0 = ngx.now()
  local deadline = t0 + seconds
  -- drain now and then so the ring never fills; never sleep(0) (see perfreq)
  local ok, perr = pcall(function()
    repeat
      ngx.sleep(math.max(0.001, math.min(0.25, deadline - ngx.now())))
      ngx.update_time()
      p:drain()
    until ngx.now() >= deadline
  end)
  p:stop()
  profiling = false
  pprof_lost = pprof_lost + (tonumber(p.lost) or 0)
  if not ok then return refuse(500, "perffleet: profile failed: " .. tostring(perr)) end
  local okb, bytes = pcall(pprof.from_profile, p, {
    freq = floor(hz), time_nanos = floor(t0 * 1e9), duration_nanos = floor((ngx.now() - t0) * 1e9),
    -- the worker and host on every sample, as on the metrics
    labels = { { key = "pid", num = pid }, { key = "host", str = host } },
    -- and why the Lua callers are missing, when they are (another profile
    -- of this process holds the sample-time stack walk, for instance)
    comments = { format("perf_event.profile %s, mode %s, nginx worker %d", p.event, p.mode, pid),
                 not p.stacks and ("leaf frames only: " .. tostring(p.stacks_reason or p.reason)) or nil } })
  if not okb then return refuse(500, "perffleet: cannot write the profile: " .. tostring(bytes)) end
  pprof_count = pprof_count + 1
  ngx.header.content_type = "application/octet-stream"
  ngx.header["Content-Disposition"] = 'attachment; filename="profile"'
  ngx.header["X-Content-Type-Options"] = "nosniff"
  ngx.print(bytes)
end

-- ---------------------------------------------------------------- a hot handler

-- pure Lua work the profiles name (the test and the bench drive it)
local function collatz_steps(limit)
  local steps = 0
  for i = 1, limit do
    local x = i
    while x ~= 1 do
      if x % 2 == 0 then x = x / 2 else x = 3 * x + 1 end
      steps = steps + 1
    end
  end
  return steps
end

--- Content handler: a CPU-bound Lua handler (?n=, default 3000 numbers),
-- answering the total Collatz steps of 1..n.
function M.hot()
  local n = floor(tonumber(ngx.var.arg_n) or 3000)
  ngx.say(collatz_steps(math.max(1, math.min(n, 1000000))))
end

return M
