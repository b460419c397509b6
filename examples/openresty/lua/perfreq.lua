--- perfreq: perf_event inside nginx (OpenResty / lua-nginx-module).
--  (1) per-request counters: task-clock, page-faults and context-switches of
--      the worker while it handled the request, logged in log_by_lua;
--  (2) an endpoint that samples the worker for N seconds and answers with
--      folded stacks (flame-graph input), symbolized in the worker itself;
--  (3) an always-on sampler drained by a timer (for the overhead bench).
-- Workers run unprivileged: everything here is self-monitoring of the
-- worker (pid 0), which perf_event_paranoid=2 allows for user space; the
-- binding adds exclude_kernel itself when the kernel asks for it.
--
--   init_by_lua_block        { require("perfreq").init() }
--   init_worker_by_lua_block { require("perfreq").init_worker() }
--   access_by_lua_block      { require("perfreq").start() }   (optional)
--   log_by_lua_block         { require("perfreq").log() }
--   location = /perf/profile { content_by_lua_block { require("perfreq").profile() } }
local ngx = ngx  -- luacheck: read globals ngx
local pe = require("perf_event")
local symbols = require("perf_event.symbols")

local M = {}

local group          -- the worker's counter group
local busy = false   -- one /perf/profile at a time per worker
local totals = { requests = 0, task_clock_ns = 0, page_faults = 0, context_switches = 0 }

--- In init_by_lua (the master, before fork): loads the C core once so
-- workers share it and never read files after dropping privileges.
function M.init()
  require("perf_event.core")
  require("perf_event.stat")
end

--- In init_worker_by_lua: opens the per-request counters of this worker.
-- `opts.every = N` measures one request in N (default 1: every request):
-- a group read is a read(2) of ~1-2 us, which a 10 us request feels.
local buf = {}            -- reused by group:read(buf): no table per read
local log_info = true     -- whether the error log takes info lines
local every, seen = 1, 0
local last_tc, last_pf, last_cs   -- reading at the end of the previous request
local last_seen = -1
local use_start = false           -- start() was called once: look in ngx.ctx

function M.init_worker(opts)
  local err
  every = math.max(1, math.floor(tonumber(opts and opts.every) or 1))
  group, err = pe.group({
    { type = "software", config = 1, name = "task-clock" },
    { type = "software", config = 2, name = "page-faults" },
    { type = "software", config = 3, name = "context-switches" },
  })
  if not group then
    ngx.log(ngx.ERR, "perfreq: per-request counters unavailable: ", err)
  end
  local ok, errlog = pcall(require, "ngx.errlog")
  if ok and errlog.get_sys_filter_level then
    log_info = errlog.get_sys_filter_level() >= ngx.INFO
  end
end

--- Optional, at the start of a request (access_by_lua or the first line
-- of a content handler): measure from here rather than from the end of
-- the previous request.  Costs one more read and one Lua phase.
function M.start()
  if not group then return end
  use_start = true
  local t = group:read(buf)
  if t then
    local ctx = ngx.ctx
    ctx.perf_tc, ctx.perf_pf, ctx.perf_cs = t[1], t[2], t[3]
  end
end

local function account(tc, pf, cs)
  totals.requests = totals.requests + 1
  totals.task_clock_ns = totals.task_clock_ns + tc
  totals.page_faults = totals.page_faults + pf
  totals.context_switches = totals.context_switches + cs
  if log_info then
    ngx.log(ngx.INFO, "perf: ", ngx.var.uri, " task-clock=", tc, "ns page-faults=", pf,
            " context-switches=", cs)
  end
end

--- In log_by_lua: what the worker spent on CPU, the page faults and the
-- context switches for this request: since start() when it was called,
-- otherwise since the end of the previous request (which, for a worker
-- serving requests one after the other, is this request's parsing,
-- handlers and response writing).  With requests in flight concurrently
-- the figures include the worker's other work in between: an event loop
-- has no per-request accounting.  `each` (optional) measures one request
-- in `each` here, whatever init_worker's `every` says.
function M.log(each)
  if not group then return end
  seen = seen + 1
  local n = each or every
  local phase = seen % n
  if phase ~= 0 and phase ~= n - 1 then return end       -- not measured
  local t = group:read(buf)
  if not t then return end
  local tc, pf, cs = t[1], t[2], t[3]
  local ctx = use_start and ngx.ctx   -- ngx.ctx costs a table per request
  if ctx and ctx.perf_tc then
    account(tc - ctx.perf_tc, pf - ctx.perf_pf, cs - ctx.perf_cs)
  elseif phase == 0 and last_seen == seen - 1 then
    account(tc - last_tc, pf - last_pf, cs - last_cs)
  end
  last_tc, last_pf, last_cs, last_seen = tc, pf, cs, seen
end

--- Content handler: the sums over the requests this worker logged.
function M.totals()
  ngx.header.content_type = "text/plain"
  ngx.say("pid ", ngx.worker.pid(), " requests ", totals.requests,
          " task-clock-ns ", totals.task_clock_ns, " page-faults ", totals.page_faults,
          " context-switches ", totals.context_switches)
end

local function sampler(hz)
  return pe.open({ type = "software", config = 0, name = "cpu-clock", freq = true,
                   sample_freq = hz, sample_type = "ip|tid|time|callchain" },
                 { pages = 16 })
end

local function fold(counts, sym, rec)
  local frames = rec.callchain and #rec.callchain > 0 and sym:callchain(rec.callchain, rec.pid)
                 or { sym:name(rec.ip, rec.pid) }
  local parts = { "nginx" }
  for i = #frames, 1, -1 do parts[#parts + 1] = frames[i] end
  local key = table.concat(parts, ";")
  counts[key] = (counts[key] or 0) + 1
end

local function say_folded(counts)
  local keys = {}
  for k in pairs(counts) do keys[#keys + 1] = k end
  table.sort(keys)
  local out = {}
  for i, k in ipairs(keys) do out[i] = k .. " " .. counts[k] end
  ngx.header.content_type = "text/plain"
  if #out > 0 then ngx.print(table.concat(out, "\n"), "\n") end
end

--- Content handler: samples this worker for ?seconds=N (default 1, max 30)
-- at ?hz=F (default 999) while it keeps serving, then answers with folded
-- stacks.  JIT-compiled Lua shows as [unknown]; C frames are named from
-- the ELF symbols of nginx and its libraries.
function M.profile()
  local seconds = math.min(tonumber(ngx.var.arg_seconds) or 1, 30)
  local hz = math.min(tonumber(ngx.var.arg_hz) or 999, 10000)
  if busy then
    ngx.status = 409
    ngx.say("perfreq: a profile is already running in this worker")
    return
  end
  local ev, err = sampler(hz)
  if not ev then
    ngx.status = 500
    ngx.say("perfreq: cannot sample: ", err)
    return
  end
  busy = true
  local sym = symbols.new()
  sym:load_maps("self")
  local counts = {}
  ngx.update_time()
  local deadline = ngx.now() + seconds
  -- drain while sleeping so the ring never fills.  ngx.now() is nginx's
  -- cached clock: refresh it, and never sleep(0) (a busy loop that floods
  -- the error log with "sleep(0) called without delayed events patch")
  repeat
    ngx.sleep(math.max(0.001, math.min(0.1, deadline - ngx.now())))
    ngx.update_time()
    for rec in ev:records() do
      if rec.type == "sample" then fold(counts, sym, rec) end
    end
  until ngx.now() >= deadline
  ev:disable()
  for rec in ev:records() do
    if rec.type == "sample" then fold(counts, sym, rec) end
  end
  local lost = ev:lost()
  ev:close()
  busy = false
  if tonumber(lost) and tonumber(lost) > 0 then ngx.log(ngx.WARN, "perfreq: ", lost, " records lost") end
  say_folded(counts)
end

-- ---------------------------------------------------------------- always-on sampler

local always, always_counts = nil, {}
local always_rec = {}      -- reused by records(t): no table per sample

-- drains the ring, then re-arms itself until stop_sampler() (or another
-- start_sampler) replaces the event it was started for
local function drain_always(premature, ev, interval)
  if always ~= ev then return end
  for rec in ev:records(always_rec) do
    if rec.type == "sample" then
      local ip = rec.ip
      always_counts[ip] = (always_counts[ip] or 0) + 1
    end
  end
  if not premature then ngx.timer.at(interval, drain_always, ev, interval) end
end

--- In init_worker_by_lua (or any time): samples the worker all the time
-- at `hz` (default 1000) and drains the ring every `interval` seconds
-- (default 0.1) from a timer, counting samples by address (cheap: only the
-- ip is recorded); /perf/always symbolizes on demand.
function M.start_sampler(hz, interval)
  M.stop_sampler()
  local ev, err = pe.open({ type = "software", config = 0, name = "cpu-clock", freq = true,
                            sample_freq = hz or 1000, sample_type = "ip" }, { pages = 16 })
  if not ev then
    ngx.log(ngx.ERR, "perfreq: sampler unavailable: ", err)
    return nil, err
  end
  always = ev
  interval = interval or 0.1
  ngx.timer.at(interval, drain_always, ev, interval)
  return true
end

--- Stops the always-on sampler (its counts are kept).
function M.stop_sampler()
  local ev = always
  if not ev then return end
  drain_always(true, ev)
  always = nil
  ev:close()
end

--- Content handler: `?on=1` starts the always-on sampler in this worker,
-- `?on=0` stops it; answers "sampler on" or "sampler off".
function M.sampler_switch()
  ngx.header.content_type = "text/plain"
  if ngx.var.arg_on == "1" then
    local ok, err = M.start_sampler(tonumber(ngx.var.arg_hz) or 1000)
    if not ok then ngx.status = 500; ngx.say("perfreq: ", err); return end
  else
    M.stop_sampler()
  end
  ngx.say(always and "sampler on" or "sampler off")
end

--- Content handler: the always-on sampler's counts, by function.
function M.always()
  local sym = symbols.new()
  sym:load_maps("self")
  local counts = {}
  for ip, n in pairs(always_counts) do
    local key = "nginx;" .. sym:name(ip)
    counts[key] = (counts[key] or 0) + n
  end
  say_folded(counts)
end

--- For perffleet: the live sums over the measured requests (read them,
-- do not change them), the worker's counter group and the always-on
-- sampler's event (each nil when not open).
function M.stats() return totals, group, always end

return M
