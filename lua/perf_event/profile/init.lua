--- perf_event.profile: Lua-level profiles of this thread from perf_event samples.
--
--    local p = assert(pe.profile.start{ event = "cpu-clock", freq = 999 })
--    work()
--    p:stop()
--    io.write(p:folded())          -- "main@app.lua:0;alpha@app.lua:12 41\n..."
--    for _, e in ipairs(p:top(5)) do print(e.share, e.name) end
--
-- On LuaJIT the stacks are taken at a safe point (profile/safepoint.lua,
-- csrc/luasafe.c): each sample signals this thread, its handler arms
-- LuaJIT's profiler hook, and the VM calls the capture at its next
-- instruction, which walks the Lua frames there. `p.mode` and `p.walk`
-- are then "safepoint". Where the safe point cannot run (LuaJIT's profiler
-- is another's, as under jit.profile or -jp; a host that refuses the
-- coroutine API the self-test uses, as nginx's init_worker_by_lua; its
-- self-test failed), and with `stacks=false` or `lua=false`, a sample is
-- its C leaf only (the sample's IP named from the ELF symbols): `p.mode`
-- is "c" and `p.stacks_reason` says why.
-- PUC Lua (5.1, 5.4) gets `p.mode == "hook"`: the Lua stack captured by a
-- VM hook at the first instruction after each sample (csrc/puc/hook.c).
--
-- The files of this folder, one concern each: init.lua (this: `start`,
-- `stop`, the class), naming.lua (frame names, `builtins`), safepoint.lua
-- (LuaJIT's safe-point stacks), registry.lua (LuaJIT's prototypes and
-- traces by address, for perfmap=true and perf_event.luamap), selftest.lua
-- (`selftest`, and the layout check luamap relies on), resolve.lua (the
-- drain, a C leaf's frame), hook.lua (PUC Lua's hook mode), aggregate.lua (counts,
-- `aggregate`, `folded`, `top`, `kinds`), opts.lua (what each option of
-- `start` must be), raw.lua (clock, addresses, words).
-- @module perf_event.profile

local format = string.format
local floor = math.floor
local tonumber, tostring, pairs, ipairs, setmetatable, pcall, rawget, require, error =
  tonumber, tostring, pairs, ipairs, setmetatable, pcall, rawget, require, error
local io, os = io, os

local raw = require("perf_event.profile.raw")
local naming = require("perf_event.profile.naming")
local registry = require("perf_event.profile.registry")
local selftest = require("perf_event.profile.selftest")
local safepoint = require("perf_event.profile.safepoint")
local hook = require("perf_event.profile.hook")
local resolve = require("perf_event.profile.resolve")
local aggregate = require("perf_event.profile.aggregate")
local labels = require("perf_event.profile.labels")
local options = require("perf_event.profile.opts")
local LP = require("perf_event.core")._private
local EPERM = require("perf_event.core").abi.errno.EPERM
local now = raw.now

local jit = rawget(_G, "jit")

local M = {}

M.frame_name = naming.frame_name
M.builtins = naming.builtins
M.selftest = selftest.selftest
-- for perf_event.luamap (the same registry and names, kept in a perf map
-- for luaperf) and luaperf record: not a public interface
M._new_registry, M._check_layout, M._REGS_MASK = registry.new_registry, selftest.check_layout, raw.REGS_MASK

-- ---------------------------------------------------------------- profile

local MAX_WALK_HZ = 10000   -- the highest rate that gets a signal per sample

local Profile = {}
Profile.__index = Profile
Profile.__name = "perf_event.profile"
-- the methods, each from the file of its concern
for _, methods in ipairs({ resolve.methods, hook.methods, aggregate.methods }) do
  for name, f in pairs(methods) do Profile[name] = f end
end
Profile.vmstates = labels.methods_vmstates
-- perf_event.openresty's log(route): not a public interface
M._request_done = labels.request_done

function Profile:__tostring()
  return format("perf_event.profile(%s, %s, %d samples%s)", self.event, self.mode, self.nsamples,
                self.running and ", running" or "")
end

-- opens the profile's event through perf_event.resolve, the one spec ->
-- attr path pe.open takes too (perf's fallbacks included)
local function pe_open(spec, o)
  local spec_resolve = require("perf_event.resolve")
  local r, err = spec_resolve.one(spec)
  if not r then return nil, err end
  return spec_resolve.open(r, o, 2)
end

-- the functions of a drain's resolution
local function drain_fns()
  local t = { Profile.drain, Profile._leaf, Profile._count }
  for _, f in ipairs(safepoint.drain_fns()) do t[#t + 1] = f end
  return t
end

-- LuaJIT keeps one handler per VM event ("trace", "bc"): the profiles,
-- luamap and the program's own handler share it (perf_event.vmevent)
local vmevent = require("perf_event.vmevent")
local subscribe, unsubscribe = vmevent.subscribe, vmevent.unsubscribe

-- Time the thread spends in the kernel on its own behalf (system calls,
-- page faults, the JIT's mprotect) is sampled where the kernel allows it
-- (root, CAP_PERFMON, perf_event_paranoid <= 1), as os.clock and jit.p
-- count it; elsewhere the core's retry on EACCES (perf's own fallback)
-- leaves user time only. kernel=false asks for user time only; kernel=true
-- for kernel time or nothing (an explicit field: no retry, the kernel's
-- refusal comes back as nil, err).
local function user_only(spec, opts)
  if opts.kernel == false then spec.exclude_kernel, spec.exclude_hv = true, true
  elseif opts.kernel == true then spec.exclude_kernel = false end
end

-- p.kernel: whether the event samples kernel time; p.kernel_reason: why not
local function kernel_seen(p, ev, opts)
  local a = ev:attr()
  p.kernel = not a.exclude_kernel
  if p.kernel then p.kernel_reason = nil
  elseif opts.kernel == false then p.kernel_reason = "kernel=false"
  else
    p.kernel_reason = "the kernel refused to sample its own code to this process (perf_event_paranoid "
      .. "above 1 without CAP_PERFMON): user time only"
  end
end

-- the default on LuaJIT: stacks taken at a safe point through LuaJIT's
-- profiler hook (profile/safepoint.lua, csrc/luasafe.c).
-- Returns the started profile; or false, why (the caller falls back to C
-- leaf frames); or nil when the event cannot be opened (p.err).
local trap_seq = 0   -- the sig_data of the last sigtrap event

-- why this process should not get a perf SIGTRAP, or nil: valgrind takes
-- it for a fault of its own and ends the process; a tracer (gdb, strace)
-- stops at every one
local function no_sigtrap()
  if (os.getenv("LD_PRELOAD") or ""):find("vgpreload", 1, true) then return "under valgrind" end
  local f = io.open("/proc/self/status", "r")
  local st = f and f:read("*a") or ""
  if f then f:close() end
  local tracer = tonumber(st:match("\nTracerPid:%s*(%d+)"))
  if tracer and tracer ~= 0 then return "traced by pid " .. tracer end
  return nil
end

local function start_safepoint(p, opts)
  -- the self-test runs coroutines, which some hosts forbid at some points
  -- (nginx's init_worker_by_lua*: "API disabled"): that falls back, and a
  -- later start (in a timer) tests again
  local tested, st = pcall(safepoint.selftest)
  if not tested then return false, "the self-test could not run here: " .. tostring(st) end
  if not st.ok then return false, st.reason end
  -- Each sample signals this thread. With sigtrap (Linux 5.13) the kernel
  -- sends SIGTRAP itself on the way back to user space; else a wakeup per
  -- sample makes it send the fd's signal (F_SETSIG), and on a 2-vCPU VM
  -- that wakeup costs ~10 us a sample (an interrupt of its own)
  -- (disabled until armed: a SIGTRAP before its handler ends the process)
  local spec = { event = p.event, disabled = true,
                 use_clockid = true, clockid = "monotonic", sample_type = "ip|tid|time" }
  user_only(spec, opts)
  if p.block then
    -- every switch of this thread is a sample, and each comes with its
    -- switch records (their times): the kernel counts a switch in its own
    -- code, which needs perf_event_paranoid <= 1 or CAP_PERFMON
    spec.exclude_kernel, spec.sample_period, spec.context_switch, spec.sample_id_all = false, 1, true, true
  elseif opts.period then spec.sample_period = opts.period
  else spec.freq = true; spec.sample_freq = opts.freq or 999 end
  local function open()
    local ev, err = pe_open(spec, { pages = opts.pages or 512 })
    if not ev and not opts.pages then ev, err = pe_open(spec, { pages = 64 }) end
    return ev, err
  end
  local trap, ev, err
  if opts.sigtrap == false then p.sigtrap_reason = "sigtrap=false"
  elseif not p.block and LP.luasafe_trap_busy() then
    -- (one sigtrap profile at a time: see luasafe_trap_busy)
    p.sigtrap_reason = "another profile's event sends SIGTRAP"
  else p.sigtrap_reason = no_sigtrap() end
  if not p.sigtrap_reason then
    trap_seq = trap_seq % 0x7fffffff + 1
    trap = trap_seq
    spec.sigtrap, spec.remove_on_exec, spec.sig_data = true, true, trap
    ev, err = open()
    if not ev and p.block then
      p.err = "a block profile samples the thread's switches, which the kernel counts in its own code "
              .. "(perf_event_paranoid <= 1 or CAP_PERFMON; a kernel before 5.13 has no sigtrap): " .. tostring(err)
      return nil
    end
    if not ev then   -- (a kernel before 5.13: EINVAL)
      trap, spec.sigtrap, spec.remove_on_exec, spec.sig_data = nil, nil, nil, nil
      p.sigtrap_reason = "the kernel refused sigtrap: " .. tostring(err)
    end
  end
  if not trap and p.block then
    -- (the fd's signal would come at the switch-out, and end the wait)
    p.err = "a block profile needs the kernel's sigtrap (Linux 5.13): " .. tostring(p.sigtrap_reason)
    return nil
  end
  if not trap then
    spec.wakeup_events = 1
    ev, err = open()
  end
  if not ev then p.err = err return nil end
  p.ev, p.sigtrap = ev, trap ~= nil
  kernel_seen(p, ev, opts)
  p.helpers = { proto_info = naming.proto_info, builtins = M.builtins, frame_name = naming.frame_name,
                addr_of = raw.addr_of }
  local ok, why = safepoint.arm(p, opts.lj_mode, trap)
  if not ok then ev:close() p.ev, p.sigtrap = nil, nil return false, why end
  p.mode, p.walk, p.stacks, p.selftest = "safepoint", "safepoint", true, st
  p.running = true
  p.freq, p.period = not opts.period and (opts.freq or 999) or nil, opts.period
  if p.rate_note then p.freq, p.period = spec.freq and spec.sample_freq or nil, spec.sample_period end
  p.time_nanos, p.t_start = os.time() * 1e9, now()
  local eok, e2 = ev:enable()
  if not eok and e2 then p:stop() p.err = e2 return nil end
  return p
end

-- perfmap=true: each trace compiled from now on is appended to the perf
-- tool's runtime map, /tmp/perf-PID.map (the registry writes its line)
local function perfmap_start(p)
  local reg = registry.new_registry()
  p.reg = reg
  local f = io.open("/proc/self/stat", "r")
  local pid = f and f:read("*l"):match("^(%d+)")
  if f then f:close() end
  p.perfmap_path = format("/tmp/perf-%s.map", pid or "self")
  -- (a predictable path: a link or a file someone else planted there is
  -- refused, and p.perfmap_error says so)
  reg.perfmap, p.perfmap_error = require("perf_event.fs").own_file(p.perfmap_path)
  -- traces compiled before start would be missing from the map: start clean
  jit.flush()
  p.trace_cb = function(what, tr, func, pc) reg:trace_event(what, tr, func, pc) end
  subscribe("trace", p.trace_cb)
end

local function perfmap_stop(p)
  if p.trace_cb then unsubscribe("trace", p.trace_cb) p.trace_cb = nil end
  if p.reg and p.reg.perfmap then p.reg.perfmap:close() p.reg.perfmap = nil end
end

--- Starts sampling this thread.
-- A caller's mistake raises at the caller's line, naming the option: opts
-- not a table, an unknown option name (with the closest known one: "did
-- you mean 'freq'?"), a value of the wrong type, a rate, size or count
-- that is not a positive integer (`stack` may be 0, `pages` must be a
-- power of two, `hook_count`, `hook_slots` and `depth` within the ranges
-- below), `hook` not "signal" or "count", `walk` not "safepoint" (the safe
-- point is LuaJIT's one stack sampler), `freq` and `period` together.
-- What the kernel refuses (an unknown event, a rate above
-- perf_event_max_sample_rate) is returned as `nil, err`.
-- On LuaJIT the stacks come from the safe point (`p.mode` and `p.walk`
-- "safepoint"). Where it cannot run (LuaJIT's profiler in use by
-- jit.profile or -jp, a host that refuses coroutines at this point, its
-- self-test failed), or with `stacks=false`, each sample is its C leaf
-- only (`p.mode` "c", `p.stacks` false, `p.stacks_reason` says why).
-- @tparam[opt] table opts `event` (string, "cpu-clock"), `freq` (integer
--   > 0, samples per second: 999) or `period` (integer > 0, in event
--   units: ns for the clocks), `pages` (ring pages, a power of two; 512, or 64 when
--   2 MiB cannot be locked),
--   `stacks` (boolean; false: C leaf frames only, no signal per sample), `lua`
--   (boolean; false: C leaf frames only), `perfmap`
--   (boolean; true: append each trace to /tmp/perf-PID.map for the perf tool),
--   `keep` (boolean; false: fold each sample into per-stack counts at drain instead
--   of keeping `p.samples`, so memory is bounded by the distinct stacks),
--   `walk` ("safepoint", the only one; "signal" raises),
--   `block` (boolean; true: a block profile, perf's off-CPU time and Go's
--   block profile: where this thread waited in the kernel, each stack
--   counted in nanoseconds waited, from the waits that began with the
--   thread giving up its CPU (not preempted) under Lua frames; LuaJIT's
--   safe point and the kernel's sigtrap only, perf_event_paranoid <= 1 or
--   CAP_PERFMON, aggregated as `keep=false`; none of event, freq, period,
--   keep=true, stacks=false, lua=false, kernel=false with it),
--   `kernel` (boolean; by default time in the kernel on the thread's
--   behalf (system calls, page faults) is sampled too, as os.clock counts
--   it, where the kernel allows that (root, CAP_PERFMON,
--   perf_event_paranoid <= 1), and elsewhere the profile holds user time
--   only; false: user time only; true: kernel time too or `nil, err`.
--   `p.kernel` says which, `p.kernel_reason` why not. A sample taken in
--   the kernel has the leaf `[kernel]` with C leaf frames and on PUC Lua;
--   on LuaJIT's safe point, the C function that entered the kernel),
--   `stack` (integer >= 0: taken, not used);
--   on PUC Lua `hook` ("signal", the default on 5.2+, or "count", the
--   default on 5.1), `hook_count` (1..1e9 instructions: 1000), `hook_slots`
--   (16..2^20 captures held between drains: 8192), `depth` (1..1024 frames: 256),
--   `hook_leaf` (false: no function popped since the signal (on 5.1 a C function only) is added back
--   as the leaf);
--   on LuaJIT's safe point `sigtrap` (false: each sample signalled by the
--   fd's F_SETSIG after a wakeup, not by the kernel's SIGTRAP) and `lj_mode`
--   ("l", the default: traces check the hook at each line change; "f": at
--   function changes only, a compiled sample's line read from its trace's
--   snapshot; the first armed profile's mode holds, `p.lj_mode`);
--   LuaJIT takes the hook options and does not use them, as PUC Lua does
--   `sigtrap`, `lj_mode` and `perfmap`
-- @treturn[1] table the profile
-- @treturn[2] nil
-- @treturn[2] string why the event could not be opened
function M.start(opts)
  local bad = options.check(opts)
  if bad then error(bad, 2) end
  opts = opts or {}
  local p = setmetatable({ event = opts.event or "cpu-clock", nsamples = 0, lost = 0,
                           stacks = false, running = false, samples = {} }, Profile)
  if opts.block then
    if opts.event or opts.freq or opts.period or opts.keep == true or opts.stacks == false or opts.lua == false
       or opts.kernel == false then
      error("profile.start: option 'block' takes none of event, freq, period, keep=true, stacks=false, lua=false, "
            .. "kernel=false", 2)
    end
    if not jit then return nil, "a block profile needs LuaJIT's safe point (PUC Lua has no way to it)" end
    p.event, p.block, p.unit = "context-switches", true, "nanoseconds"
    opts = setmetatable({ keep = false, period = 1 }, { __index = opts })
  end
  if opts.keep == false then
    p.keep, p.counts, p.nstacks = false, {}, 0
    p._ebf = setmetatable({}, { __mode = "k" })   -- frames -> label -> count entry (aggregate.lua)
    -- an aggregated profile drains a few samples at a time, of every shape
    -- (a C leaf, a stack of any depth): compiled, the resolution kept
    -- making side traces (about 40 a second at 1 kHz in nginx, each
    -- compile charged to the drain). Interpreted, a drain costs about as
    -- much per sample, without them. For the whole process
    if jit then for _, f in ipairs(drain_fns()) do jit.off(f) end end
  end
  local hz0 = opts.period and (p.event == "cpu-clock" or p.event == "task-clock") and 1e9 / opts.period
              or not opts.period and (opts.freq or 999)
  -- a signal per sample: a clock faster than MAX_WALK_HZ is sampled at
  -- MAX_WALK_HZ, on LuaJIT's safe point and PUC Lua's hook mode alike (at
  -- 100 kHz a 2-vCPU VM's timer interrupts alone make a LuaJIT loop 18x
  -- slower, and PUC Lua never finishes; at 10 kHz, 1.4-1.6x)
  local signalled = jit and opts.stacks ~= false or not jit and LP.luahook_start   -- PUC Lua's hook mode
  if signalled and opts.lua ~= false and hz0 and hz0 > MAX_WALK_HZ then
    local capped = {}
    for k, v in pairs(opts) do capped[k] = v end
    if opts.period then
      capped.period = floor(1e9 / MAX_WALK_HZ)
      p.rate_note = format("period %d ns is under the %d ns a signal per sample allows: sampled every %d ns",
                           opts.period, capped.period, capped.period)
    else
      capped.freq = MAX_WALK_HZ
      p.rate_note = format("freq %d is above the %d samples/s a signal per sample allows: sampled at %d/s",
                           opts.freq, MAX_WALK_HZ, MAX_WALK_HZ)
    end
    opts = capped
  end
  if jit and opts.perfmap then perfmap_start(p) end
  -- the reason a LuaJIT profile has C leaf frames only
  local why
  if jit and opts.lua ~= false then
    if opts.stacks == false then why = "stacks=false"
    else
      local sp, swhy = start_safepoint(p, opts)
      if sp then return sp end
      if sp == nil then perfmap_stop(p) return nil, p.err end
      why = "the safe point cannot run: " .. tostring(swhy)
      if p.block then perfmap_stop(p) return nil, "a block profile needs LuaJIT's safe point: " .. why end
    end
  end
  local mode, reason = "c", why or "not LuaJIT"
  if opts.lua == false then
    reason = "lua=false"
  elseif not jit and LP.luahook_start then
    mode, reason = "hook", nil
  end
  p.mode, p.reason = mode, reason
  if jit then p.stacks_reason = reason end
  -- (disabled until start's end: the hook's set-up, tens of ms at times,
  -- is not the program's)
  local spec = { event = p.event, disabled = true, use_clockid = true, clockid = "monotonic",
                 sample_type = "ip|tid|time" }
  user_only(spec, opts)
  if mode == "hook" then
    spec.wakeup_events = 1     -- a wakeup, so a signal, for every sample
  end
  if opts.period then spec.sample_period = opts.period
  else spec.freq = true; spec.sample_freq = opts.freq or 999 end
  local ev, err = pe_open(spec, { pages = opts.pages or 512 })
  if not ev and not opts.pages then
    -- 2 MiB is over the unprivileged mlock budget (perf_event_mlock_kb)
    ev, err = pe_open(spec, { pages = 64 })
  end
  if not ev then perfmap_stop(p) return nil, err end
  p.ev = ev
  kernel_seen(p, ev, opts)
  if mode == "hook" then hook.hook_start(p, LP, opts) end
  p.running = true
  -- what an exporter needs to know (pprof's period, time and duration)
  p.freq, p.period = not opts.period and (opts.freq or 999) or nil, opts.period
  if p.rate_note then p.freq, p.period = spec.freq and spec.sample_freq or nil, spec.sample_period end
  p.time_nanos, p.t_start = os.time() * 1e9, jit and now() or nil
  local ok, e2 = ev:enable()
  if not ok and e2 then p:stop() return nil, e2 end
  return p
end

--- Stops sampling, detaches the JIT callbacks and reads the last samples.
-- In a process forked while the profile ran, only closes that process's copy
-- of the event (the parent's profile goes on).
-- Idempotent. @treturn table the profile
function Profile:stop()
  if not self.running then return self end
  self.running = false
  if self.t_start then self.duration_nanos = now() - self.t_start end
  local open = pcall(self.ev.fd, self.ev)   -- closed behind our back?
  -- a forked child's copy: its fd shares the parent's event, which it only
  -- closes (disable refuses there with EPERM; nothing is allocated before
  -- the event stops, so that stop's own work is not sampled)
  local own = open
  if open then
    local ok, _, errno = self.ev:disable()
    if not ok and errno == EPERM then own = false end
  end
  -- (the callbacks first: the last safe-point profile's disarm stops
  -- LuaJIT's profiler, which flushes the traces the registry holds)
  perfmap_stop(self)
  if self.safe then safepoint.disarm(self, open) end
  if self.hook then
    LP.luahook_stop()
    if not own then LP.luahook_read() end   -- no drain below: frees the captures
  end
  if own then self:drain() end
  if open then self.ev:close() end
  self.ev = nil
  return self
end
Profile.__gc = Profile.stop
Profile.__close = Profile.stop

return M
