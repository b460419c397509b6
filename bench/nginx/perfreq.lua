--- perfreq: perf_event inside nginx (OpenResty / lua-nginx-module).
--  (1) per-request counters: task-clock, page-faults and context-switches of
--      the worker while it handled the request, logged in log_by_lua;
--  (2) an endpoint that samples the worker for N seconds and answers with
--      folded stacks (flame-graph input), resolved in the worker itself:
--      Lua frames as function@chunk:line (pe.profile), C leaves by symbol;
--  (3) an always-on sampler drained by a timer: Lua-level (pe.profile in
--      its aggregated mode, memory bounded by the distinct stacks) or
--      C addresses only.
-- Workers run unprivileged: everything here is self-monitoring of the
-- worker (pid 0), which perf_event_paranoid=2 allows for user space; the
-- binding adds exclude_kernel itself when the kernel asks for it.
--
--   init_by_lua_block        { require("perfreq").init() }
--   init_worker_by_lua_block { require("perfreq").init_worker() }
--   access_by_lua_block      { require("perfreq").start() }   (optional)
--   log_by_lua_block         { require("perfreq").log() }
--   location = /perf/profile { content_by_lua_block { require("perfreq").profile() } }
--   location = /perf/sampler { content_by_lua_block { require("perfreq").sampler_switch() } }
--   location = /perf/always  { content_by_lua_block { require("perfreq").always() } }
local ngx = ngx  -- luacheck: read globals ngx
local pe = require("perf_event")
local symbols = require("perf_event.symbols")
local profile = require("perf_event.profile")

local M = {}

local group          -- the worker's counter group
local busy = false   -- one /perf/profile at a time per worker
local totals = { requests = 0, task_clock_ns = 0, page_faults = 0, context_switches = 0 }

--- In init_by_lua (the master, before fork): loads the C core once so
-- workers share it and never read files after dropping privileges.
function M.init()
  require("perf_event.core")
  require("perf_event.stat")
  require("perf_event.profile")
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

-- a pe.profile's stacks into counts, under the root "nginx"
local function fold_profile(counts, p, sign)
  for _, e in ipairs(p:aggregate()) do
    local key = "nginx;" .. e.key
    counts[key] = (counts[key] or 0) + e.count * (sign or 1)
  end
end

local function say_folded(counts)
  local keys = {}
  for k, n in pairs(counts) do if n > 0 then keys[#keys + 1] = k end end
  table.sort(keys, function(a, b)
    if counts[a] ~= counts[b] then return counts[a] > counts[b] end
    return a < b
  end)
  local out = {}
  for i, k in ipairs(keys) do out[i] = k .. " " .. counts[k] end
  ngx.header.content_type = "text/plain"
  if #out > 0 then ngx.print(table.concat(out, "\n"), "\n") end
end

-- sleeps until `deadline` (ngx.now() seconds) in steps of at most 0.1 s,
-- calling each() after every step: the worker keeps serving meanwhile.
-- ngx.now() is nginx's cached clock: refresh it, and never sleep(0) (a busy
-- loop that floods the error log with "sleep(0) called without delayed
-- events patch")
local function sleep_until(deadline, each)
  repeat
    ngx.sleep(math.max(0.001, math.min(0.1, deadline - ngx.now())))
    ngx.update_time()
    each()
  until ngx.now() >= deadline
end

local always_lua          -- the always-on Lua-level profile (see start_sampler)
local lua_on = false      -- it is sampling (false: paused, or none)

-- C-only: callchains of C frames (JIT-compiled Lua shows as [unknown])
local function profile_c(seconds, hz)
  local ev, err = sampler(hz)
  if not ev then return nil, err end
  local sym = symbols.new()
  sym:load_maps("self")
  local counts = {}
  local function drain()
    for rec in ev:records() do
      if rec.type == "sample" then fold(counts, sym, rec) end
    end
  end
  ngx.update_time()
  sleep_until(ngx.now() + seconds, drain)
  ev:disable()
  drain()
  local lost = ev:lost()
  ev:close()
  if tonumber(lost) and tonumber(lost) > 0 then ngx.log(ngx.WARN, "perfreq: ", lost, " records lost") end
  return counts
end

-- Lua-level: pe.profile on this worker (aggregated: memory bounded by the
-- distinct stacks, whatever the duration)
local function profile_lua(seconds, hz)
  local counts = {}
  if always_lua and always_lua.running then
    -- one profile per process walks the Lua stacks at sample time: the
    -- always-on one holds it, so answer what it gains meanwhile (sampling
    -- for the window if it was paused)
    local p, paused = always_lua, not lua_on
    p:drain()
    fold_profile(counts, p, -1)
    if paused then p.ev:enable() end
    ngx.update_time()
    sleep_until(ngx.now() + seconds, function() end)
    if paused then p.ev:disable() end
    p:drain()
    fold_profile(counts, p, 1)
    return counts
  end
  local p, err = profile.start({ freq = hz, keep = false })
  if not p then return nil, err end
  ngx.update_time()
  sleep_until(ngx.now() + seconds, function() p:drain() end)
  p:stop()
  if p.mode ~= "safepoint" or not p.stacks then
    ngx.log(ngx.INFO, "perfreq: profile mode ", p.mode, ": ", p.reason or p.stacks_reason or "leaf frames only")
  end
  if p.lost > 0 then ngx.log(ngx.WARN, "perfreq: ", p.lost, " samples lost") end
  fold_profile(counts, p)
  return counts
end

--- Content handler: samples this worker for ?seconds=N (default 1, max 30)
-- at ?hz=F (default 999) while it keeps serving, then answers with folded
-- stacks, most samples first.  By default (pe.profile) Lua frames are
-- `function@chunk:line`, JIT-compiled code is attributed to its trace's
-- function and line, C leaves are named from the ELF symbols of nginx and
-- its libraries.  `?mode=c` gives C callchains only (Lua shows as
-- [unknown]).
function M.profile()
  local seconds = math.min(tonumber(ngx.var.arg_seconds) or 1, 30)
  local hz = math.min(tonumber(ngx.var.arg_hz) or 999, 10000)
  if busy then
    ngx.status = 409
    ngx.say("perfreq: a profile is already running in this worker")
    return
  end
  busy = true
  local ok, counts, err = pcall(ngx.var.arg_mode == "c" and profile_c or profile_lua, seconds, hz)
  busy = false
  if not ok then error(counts, 0) end
  if not counts then
    ngx.status = 500
    ngx.say("perfreq: cannot sample: ", err)
    return
  end
  say_folded(counts)
end

-- ---------------------------------------------------------------- always-on sampler

local always, always_counts = nil, {}
local always_rec = {}      -- reused by records(t): no table per sample
local drain_timer = false  -- the ngx.timer.every of this worker, once made
local drain_cpu = 0        -- CPU seconds (os.clock) spent draining always_lua
local drains = 0          -- how many drains that took
local lua_next_drain = 0  -- ngx.now() from which the timer drains always_lua again
local stats_zero = {}     -- the profile's counts at the last ?stats=1&reset=1

-- the timer's work: reads the C sampler's ring (counting addresses) or
-- drains the Lua-level profile (resolving and folding its samples)
-- (force: every sample now, as on pause; the timer passes `premature`,
-- true when the worker exits)
local function drain_always(force)
  local ev = always
  if ev then
    for rec in ev:records(always_rec) do
      if rec.type == "sample" then
        local ip = rec.ip
        always_counts[ip] = (always_counts[ip] or 0) + 1
      end
    end
  end
  local p = always_lua
  -- a drain costs a fixed part (the ring's and the signal ring's reads,
  -- the stats) besides its samples: as the module's sampler, drain once
  -- 100 samples wait or 2 s after the last drain; where p:pending() is
  -- not known, about every 100 samples of the rate (at 99 Hz once a
  -- second; at 1 kHz every tick). The ring (128 KiB, ~400 samples) keeps
  -- well ahead.
  local n = p and p:pending()
  if p and lua_on and (force or ngx.now() >= lua_next_drain or (n and n >= 100)) then
    lua_next_drain = ngx.now() + (n and 2 or math.min(1, 100 / (p.hz or 1000)) - 0.05)
    local t0 = os.clock()
    p:drain()
    drain_cpu = drain_cpu + (os.clock() - t0)
    drains = drains + 1
  end
end

--- In init_worker_by_lua (or any time): samples the worker all the time
-- at `hz` (default 1000).  A timer drains it every `interval` seconds
-- (default 0.1, fixed by the first call in a worker).  `lua = true` runs
-- pe.profile in its aggregated mode (keep=false): every sample becomes
-- a Lua-level stack, folded into per-stack counts, so memory grows with the
-- distinct stacks only; switched off, it is paused (its event disabled)
-- and switched on again with the same options, it resumes: no new start,
-- so no self-test, JIT flush or registry walk again (`hz` may differ).  `popts` are more
-- pe.profile.start options (`stack`, `stacks`).  Otherwise only the ip is
-- recorded and counted by address; /perf/always symbolizes on demand.
function M.start_sampler(hz, interval, lua, popts)
  M.stop_sampler()
  if not drain_timer then
    local ok, err = ngx.timer.every(interval or 0.1, drain_always)
    if not ok then return nil, err end
    drain_timer = true
  end
  if lua then
    -- 128 KiB: an unprivileged worker's mlock budget (perf_event_mlock_kb)
    -- is shared with /perf/profile; 0.3 s of samples at 1 kHz
    local o = { freq = hz or 1000, keep = false, pages = 32 }
    local conf = {}
    for k, v in pairs(popts or {}) do o[k] = v; conf[#conf + 1] = k .. "=" .. tostring(v) end
    table.sort(conf)
    conf = table.concat(conf, " ")
    local p = always_lua
    -- cpu-clock turns a frequency into a fixed period when it is opened
    -- (the kernel clears attr.freq): IOC_PERIOD then takes nanoseconds,
    -- and a frequency given there would be a storm of samples
    local retune = p and p.hz ~= o.freq and p.event == "cpu-clock"
    if p and p.running and p.conf == conf and (p.hz == o.freq or retune) then
      -- resume, at the frequency asked for
      local ok, err = true, nil
      if retune then ok, err = p.ev:period(math.floor(1e9 / o.freq)) end
      if ok then ok, err = p.ev:enable() end
      if not ok then return nil, err end
      p.hz = o.freq
    else
      if p then p:stop() end
      local err
      p, err = profile.start(o)
      if not p then
        ngx.log(ngx.ERR, "perfreq: Lua sampler unavailable: ", err)
        return nil, err
      end
      p.conf, p.hz = conf, o.freq
      always_lua, drain_cpu, drains, stats_zero = p, 0, 0, {}
    end
    lua_on = true
    return true
  end
  local ev, err = pe.open({ type = "software", config = 0, name = "cpu-clock", freq = true,
                            sample_freq = hz or 1000, sample_type = "ip" }, { pages = 16 })
  if not ev then
    ngx.log(ngx.ERR, "perfreq: sampler unavailable: ", err)
    return nil, err
  end
  always = ev
  return true
end

--- Stops the always-on sampler (its counts are kept): closes the C one,
-- pauses the Lua-level one, or stops it for good when `close` is true.
function M.stop_sampler(close)
  local ev = always
  if ev then
    drain_always()
    always = nil
    ev:close()
  end
  local p = always_lua
  if p and lua_on then
    p.ev:disable()
    drain_always(true)
    lua_on = false
  end
  if close and p then p:stop() end
end

--- Content handler: `?on=1` starts the always-on sampler in this worker
-- (`&hz=F`, default 1000; `&lua=1` for Lua-level stacks, `&stacks=0` for
-- their leaves only, `&stack=N` bytes of stack scanned), `?on=0` stops it
-- (`&close=1`: the Lua-level one for good, not paused); answers "sampler
-- on" or "sampler off".
function M.sampler_switch()
  ngx.header.content_type = "text/plain"
  if ngx.var.arg_on == "1" then
    local popts = { stack = tonumber(ngx.var.arg_stack), stacks = ngx.var.arg_stacks ~= "0" }
    local ok, err = M.start_sampler(tonumber(ngx.var.arg_hz) or 1000, nil, ngx.var.arg_lua == "1", popts)
    if not ok then ngx.status = 500; ngx.say("perfreq: ", err); return end
  else
    M.stop_sampler(ngx.var.arg_close == "1")
  end
  ngx.say((always or lua_on) and "sampler on" or "sampler off")
end

--- Content handler: the always-on samplers' counts as folded stacks: the
-- Lua-level one's stacks, and the C one's by function.  `?reset=1` clears
-- the Lua-level counts once read.
function M.always()
  if ngx.var.arg_stats == "1" then return M.sampler_stats() end
  local counts = {}
  if always_lua then
    if always_lua.running then always_lua:drain() end
    fold_profile(counts, always_lua)
    if ngx.var.arg_reset == "1" then always_lua:reset() end
  end
  if next(always_counts) then
    local sym = symbols.new()
    sym:load_maps("self")
    for ip, n in pairs(always_counts) do
      local key = "nginx;" .. sym:name(ip)
      counts[key] = (counts[key] or 0) + n
    end
  end
  say_folded(counts)
end

--- For perffleet: the live sums over the measured requests (read them,
-- do not change them), the worker's counter group and the always-on
-- sampler's event (each nil when not open).
function M.stats() return totals, group, always end

--- Content handler (/perf/always?stats=1): what the always-on Lua-level
-- profile cost: samples, CPU time of the timer's drains (resolution and
-- folding) and of the stack taking, per sample: the safe point's signal
-- handler's own time plus the capture's (also given apart, handler_us and
-- capture_us; 0 when the profile has C leaf frames only); its distinct
-- stacks; the Lua heap of the worker; the traces compiled and the JIT
-- flushes since it started, or since the last `&reset=1` (which zeroes
-- these figures once printed; the stacks stay).
local function walk_figures(p)
  return { handler_ns = p.handler_total_ns or 0, capture_ns = p.capture_total_ns or 0 }
end

function M.sampler_stats()
  ngx.header.content_type = "text/plain"
  local p = always_lua
  if not p then ngx.say("no Lua sampler") return end
  local z = stats_zero
  local ns = p.nsamples - (z.nsamples or 0)
  local n = math.max(ns, 1)
  local w, wz = walk_figures(p), z.walk or walk_figures({})
  local h, c = (w.handler_ns - wz.handler_ns) / 1e3 / n, (w.capture_ns - wz.capture_ns) / 1e3 / n
  local walk = h + c
  ngx.say(string.format("samples %d lost %d stacks %d drains %d drain_us_per_sample %.2f" ..
                        " walk_us_per_sample %.2f lua_heap_kb %d traces %d jit_flushes %d" ..
                        " walk %s handler_us %.2f capture_us %.2f",
                        ns, p.lost - (z.lost or 0), p.nstacks or 0, drains, drain_cpu * 1e6 / n,
                        walk, collectgarbage("count"),
                        (p.reg and p.reg.ntraces or 0) - (z.ntraces or 0), p.reg and p.reg.nflush or 0,
                        tostring(p.walk), h, c))
  if p.safe then ngx.say("distinct samples per drain ", p.safe.nkeys, ", resolved ", p.safe.nresolved,
                         ", /proc/self/maps read ", p.maps_reads or 0, " times") end
  if p.walk ~= "safepoint" and p.stacks_reason then ngx.say("C leaf frames only: ", p.stacks_reason) end
  if ngx.var.arg_reset == "1" then
    -- the figures from now on (after a warm-up, whose first drains read
    -- the symbol tables of nginx and its libraries). A file's symbols are
    -- read once per worker, at the first sample in it: the ones the
    -- warm-up did not meet are read now, timed, so that no round pays it
    local t0, nf = os.clock(), 0
    local f = io.open("/proc/self/maps")
    if f then
      for line in f:lines() do
        local perms, path = line:match("^%x+%-%x+ (%S+) %x+ %S+ %d+%s*(/.*)$")
        if perms and perms:sub(3, 3) == "x" then symbols.elf(path) nf = nf + 1 end
      end
      f:close()
    end
    if p.running then p:drain() end
    ngx.say(string.format("symbol tables of %d mapped files made ready in %.1f ms", nf, (os.clock() - t0) * 1e3))
    stats_zero = { nsamples = p.nsamples, lost = p.lost, walk = walk_figures(p),
                   ntraces = p.reg and p.reg.ntraces }
    drain_cpu, drains = 0, 0
  end
end

--- The always-on Lua-level profile of this worker, or nil (for a handler
-- that exports it differently: p:aggregate(), p:top()).
function M.lua_profile()
  return always_lua
end

return M
