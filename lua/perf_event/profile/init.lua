--- perf_event.profile: Lua-level profiles of this thread from perf_event samples.
--
--    local p = assert(pe.profile.start{ event = "cpu-clock", freq = 999 })
--    work()
--    p:stop()
--    io.write(p:folded())          -- "main@app.lua:0;alpha@app.lua:12 41\n..."
--    for _, e in ipairs(p:top(5)) do print(e.share, e.name) end
--
-- A sample is resolved, at drain time, in this order (LuaJIT, x86-64 GC64):
--
-- 1. Its IP lies in the machine code of a trace that was live at the
--    sample's time (CLOCK_MONOTONIC): the frame is the trace's start
--    function and line, `trace N` kept as detail. Traces are registered
--    through `jit.attach(cb, "trace")` and `jit.util.tracemc`, and closed on
--    a flush, since the addresses are reused.
-- 2. The VM's PC register (rbx, from PERF_SAMPLE_REGS_USER) points into the
--    bytecode of a known prototype: the frame is that function and the line
--    of the instruction being run. Prototypes are known from
--    `jit.attach(cb, "bc")` (loaded after start) and, at start, from the
--    functions on the stack and in package.loaded with their nested
--    prototypes. The registry holds references, so no address is reused
--    while the profile lives. When the IP is outside the LuaJIT VM (libc,
--    a C module), the C function named from its ELF symbols is the leaf.
-- 3. Otherwise the sampled stack (PERF_SAMPLE_STACK_USER, `stack` bytes)
--    is scanned for a return address into a live trace: that trace is the
--    Lua caller of the C leaf. Else the C leaf alone, or `[unknown]`.
--
-- Above that leaf go the Lua callers, walked at sample time: every sample
-- also signals this thread, and csrc/luaprof.c follows LuaJIT's frame links
-- from BASE (rdx; G->jit_base in a trace; cur_L->base in a C function the
-- interpreter called) in the handler. Only return addresses into known
-- bytecode become frames. A builtin or C function in the frame at BASE is
-- named from package.loaded's tables (`M.builtins`). Stacks are root first.
--
-- Steps 2 and 3 rely on LuaJIT internals (GCfuncL.pc at offset 32, the
-- prototype header size, rbx as PC). Both are checked by a self-test at the
-- first start; when it fails, `p.mode` is `"trace"` and `p.reason` says why.
-- PUC Lua (5.1, 5.4) gets `p.mode == "hook"`: the Lua stack captured by a
-- VM hook at the first instruction after each sample (csrc/luahook.c).
--
-- The files of this folder, one concern each: init.lua (this: `start`,
-- `stop`, the class), naming.lua (frame names, `builtins`), registry.lua
-- (LuaJIT's prototypes and traces by address), selftest.lua (the checks of
-- LuaJIT's internals, `selftest`), resolve.lua (a LuaJIT sample's frames,
-- `drain`), hook.lua (PUC Lua's hook mode), aggregate.lua (counts,
-- `aggregate`, `folded`, `top`, `kinds`), opts.lua (what each option of
-- `start` must be), raw.lua (clock, addresses, words).
-- @module perf_event.profile

local format = string.format
local floor = math.floor
local tonumber, pairs, ipairs, select, setmetatable, pcall, rawget, require, error =
  tonumber, pairs, ipairs, select, setmetatable, pcall, rawget, require, error
local io, os = io, os

local raw = require("perf_event.profile.raw")
local naming = require("perf_event.profile.naming")
local registry = require("perf_event.profile.registry")
local selftest = require("perf_event.profile.selftest")
local hook = require("perf_event.profile.hook")
local resolve = require("perf_event.profile.resolve")
local aggregate = require("perf_event.profile.aggregate")
local options = require("perf_event.profile.opts")
local now = raw.now
local check_layout, check_regs = selftest.check_layout, selftest.check_regs

local jit = rawget(_G, "jit")

local M = {}

M.frame_name = naming.frame_name
M.builtins = naming.builtins
M.callops = selftest.callops
M.selftest = selftest.selftest
-- for perf_event.luamap (the same registry and names, kept in a perf map
-- for luaperf): not a public interface
M._new_registry, M._check_layout, M._REGS_MASK = registry.new_registry, check_layout, raw.REGS_MASK

-- ---------------------------------------------------------------- profile

local MAX_WALK_HZ = 10000   -- the highest rate that gets a signal-time walk

local Profile = {}
Profile.__index = Profile
Profile.__name = "perf_event.profile"
-- the methods, each from the file of its concern
for _, methods in ipairs({ resolve.methods, hook.methods, aggregate.methods }) do
  for name, f in pairs(methods) do Profile[name] = f end
end

function Profile:__tostring()
  return format("perf_event.profile(%s, %s, %d samples%s)", self.event, self.mode, self.nsamples,
                self.running and ", running" or "")
end

local function pe_module()
  return require("perf_event")
end

-- the functions of a drain's resolution
local function drain_fns()
  local Reg = registry.Reg
  local t = { Profile.drain, Profile._resolve, Profile._leaf, Profile._count, Profile._prune, resolve.callers,
              Reg.find_trace, Reg.find_bc, registry.last_at_or_below, raw.le_u64 }
  for _, f in ipairs(require("perf_event.profile.safepoint").drain_fns()) do t[#t + 1] = f end
  return t
end

-- LuaJIT keeps one handler per VM event ("trace", "bc"): the profiles,
-- luamap and the program's own handler share it (perf_event.vmevent)
local vmevent = require("perf_event.vmevent")
local subscribe, unsubscribe = vmevent.subscribe, vmevent.unsubscribe

-- the default on LuaJIT: stacks taken at a safe point through LuaJIT's
-- profiler hook (profile/safepoint.lua, csrc/luasafe.c): no prototype
-- registry, no trace registry, no registers or stack copy per sample.
-- Returns the started profile; or false, why (the caller falls back to the
-- signal-time walk); or nil when the event cannot be opened (p.err).
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

local function start_safepoint(p, pe, opts)
  local safepoint = require("perf_event.profile.safepoint")
  -- the self-test runs coroutines, which some hosts forbid at some points
  -- (nginx's init_worker_by_lua*: "API disabled"): that falls back, and a
  -- later start (in a timer) tests again
  local tested, st = pcall(safepoint.selftest)
  if not tested then return false, "the self-test could not run here: " .. tostring(st) end
  if not st.ok then return false, st.reason end
  -- Each sample signals this thread. With sigtrap (Linux 5.13) the kernel
  -- sends SIGTRAP itself on the way back to user space; else a wakeup per
  -- sample makes it send the fd's signal (F_SETSIG), and on this VM that
  -- wakeup costs ~10 us a sample (an interrupt of its own)
  -- (disabled until armed: a SIGTRAP before its handler ends the process)
  local spec = { event = p.event, exclude_kernel = true, exclude_hv = true, disabled = true,
                 use_clockid = true, clockid = "monotonic", sample_type = "ip|tid|time" }
  if opts.period then spec.sample_period = opts.period
  else spec.freq = true; spec.sample_freq = opts.freq or 999 end
  local function open()
    local ev, err = pe.open(spec, { pages = opts.pages or 512 })
    if not ev and not opts.pages then ev, err = pe.open(spec, { pages = 64 }) end
    return ev, err
  end
  local trap, ev, err
  if opts.sigtrap == false then p.sigtrap_reason = "sigtrap=false"
  elseif pe.core._private.luasafe_trap_busy() then
    -- (one sigtrap profile at a time: see luasafe_trap_busy)
    p.sigtrap_reason = "another profile's event sends SIGTRAP"
  else p.sigtrap_reason = no_sigtrap() end
  if not p.sigtrap_reason then
    trap_seq = trap_seq % 0x7fffffff + 1
    trap = trap_seq
    spec.sigtrap, spec.remove_on_exec, spec.sig_data = true, true, trap
    ev, err = open()
    if not ev then   -- (a kernel before 5.13: EINVAL)
      trap, spec.sigtrap, spec.remove_on_exec, spec.sig_data = nil, nil, nil, nil
      p.sigtrap_reason = "the kernel refused sigtrap: " .. tostring(err)
    end
  end
  if not trap then
    spec.wakeup_events = 1
    ev, err = open()
  end
  if not ev then p.err = err return nil end
  p.ev, p.sigtrap = ev, trap ~= nil
  p.helpers = { proto_info = naming.proto_info, builtins = M.builtins, frame_name = naming.frame_name,
                addr_of = raw.addr_of }
  local ok, why = safepoint.arm(p, opts.lj_mode, trap)
  if not ok then ev:close() p.ev = nil return false, why end
  p.mode, p.walk, p.stacks, p.selftest = "safepoint", "safepoint", true, st
  p.running = true
  p.freq, p.period = not opts.period and (opts.freq or 999) or nil, opts.period
  p.time_nanos, p.t_start = os.time() * 1e9, now()
  local eok, e2 = ev:enable()
  if not eok and e2 then p:stop() return nil end
  return p
end

--- Starts sampling this thread.
-- A caller's mistake raises at the caller's line, naming the option: opts
-- not a table, an unknown option name (with the closest known one: "did
-- you mean 'freq'?"), a value of the wrong type, a rate, size or count
-- that is not a positive integer (`stack` may be 0, `pages` must be a
-- power of two, `hook_count`, `hook_slots` and `depth` within the ranges
-- below), `hook` not "signal" or "count", `freq` and `period` together.
-- What the kernel refuses (an unknown event, a rate above
-- perf_event_max_sample_rate, a `stack` not a multiple of 8 below 65536)
-- is returned as `nil, err`.
-- @tparam[opt] table opts `event` (string, "cpu-clock"), `freq` (integer
--   > 0, samples per second: 999) or `period` (integer > 0, in event
--   units: ns for the clocks), `pages` (ring pages, a power of two; 512, or 64 when
--   2 MiB cannot be locked),
--   `stack` (integer >= 0, bytes of user stack per sample scanned for a trace caller,
--   256; 0 disables), `stacks` (boolean; false: no signal-time walk of the Lua
--   callers, leaf frames only), `lua` (boolean; false: C leaf frames only), `perfmap`
--   (boolean; true: append each trace to /tmp/perf-PID.map for the perf tool),
--   `keep` (boolean; false: fold each sample into per-stack counts at drain instead
--   of keeping `p.samples`, so memory is bounded by the distinct stacks);
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
--   LuaJIT takes the hook options and does not use them, as PUC Lua does `stack`,
--   `sigtrap` and `lj_mode`
-- @treturn[1] table the profile
-- @treturn[2] nil
-- @treturn[2] string why the event could not be opened
function M.start(opts)
  local bad = options.check(opts)
  if bad then error(bad, 2) end
  opts = opts or {}
  local pe = pe_module()
  local p = setmetatable({ event = opts.event or "cpu-clock", nsamples = 0, lost = 0,
                           stacks = false, running = false, samples = {} }, Profile)
  if opts.keep == false then
    p.keep, p.counts, p.nstacks = false, {}, 0
    -- an aggregated profile drains a few samples at a time, of every shape
    -- (a C leaf, a walk of any depth, a trace): compiled, the resolution
    -- kept making side traces (about 40 a second at 1 kHz in nginx, each
    -- compile charged to the drain). Interpreted, a drain costs about as
    -- much per sample, without them. For the whole process
    if jit then for _, f in ipairs(drain_fns()) do jit.off(f) end end
  end
  local hz0 = opts.period and (p.event == "cpu-clock" or p.event == "task-clock") and 1e9 / opts.period
              or not opts.period and (opts.freq or 999)
  -- a signal per sample: a clock faster than MAX_WALK_HZ is sampled at
  -- MAX_WALK_HZ, on LuaJIT's safe point and PUC Lua's hook mode alike (at
  -- 100 kHz this VM's timer interrupts alone made a LuaJIT loop 18x slower,
  -- and PUC Lua never finished; at 10 kHz, 1.4-1.6x)
  local signalled = jit and opts.stacks ~= false and opts.walk ~= "signal" and not opts.perfmap
                    or not jit and pe.core._private.luahook_start   -- PUC Lua's hook mode
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
    opts, hz0 = capped, MAX_WALK_HZ
  end
  local safe_reason
  -- (perfmap names the traces: the signal walk's trace registry has them)
  if jit and opts.lua ~= false and opts.walk ~= "signal" and opts.stacks ~= false and not opts.perfmap
     and not (hz0 and hz0 > MAX_WALK_HZ) then
    local sp, why = start_safepoint(p, pe, opts)
    if sp then return sp end
    if sp == nil then return nil, p.err end
    safe_reason = "signal walk: the safe-point capture is not available: " .. tostring(why)
  end
  local mode, reason = "c", "not LuaJIT"
  local rc   -- the self-tests' results (full and trace modes)
  if jit and opts.lua ~= false then
    local lay = check_layout()
    if lay.ok then
      rc = check_regs(pe)
      if rc.ok then mode, reason = "full", nil
      else mode, reason = "trace", rc.reason end
    else
      mode, reason = "trace", lay.reason
    end
    p.layout = lay
  elseif opts.lua == false then
    reason = "lua=false"
  elseif pe.core._private.luahook_start then
    mode, reason = "hook", nil
  end
  p.mode, p.reason = mode, reason
  local stack = opts.stack or 256
  local st = "ip|tid|time"
  local spec = { event = p.event, exclude_kernel = true, exclude_hv = true,
                 use_clockid = true, clockid = "monotonic" }
  if mode == "full" then
    st = st .. "|regs_user"
    spec.sample_regs_user = raw.PROFILE_REGS
  end
  if jit and mode ~= "c" and stack > 0 then
    st = st .. "|stack_user"
    spec.sample_stack_user = stack
  end
  spec.sample_type = st
  local LP = pe.core._private
  -- a signal per sample: above MAX_WALK_HZ the deliveries and the kernel's
  -- own sampling cost more than the work sampled (a clock's period is in ns)
  local hz = opts.period and (p.event == "cpu-clock" or p.event == "task-clock") and 1e9 / opts.period
             or not opts.period and (opts.freq or 999)
  if mode == "full" and opts.stacks ~= false and LP.luaprof_arm then
    if hz and hz > MAX_WALK_HZ then
      p.stacks_reason = format("%d samples/s is above the %d/s a signal per sample allows: leaf frames only",
                               floor(hz), MAX_WALK_HZ)
    else
      spec.wakeup_events = 1     -- a wakeup, so a signal, for every sample
      p.stacks = true
    end
  end
  if mode == "hook" then
    spec.wakeup_events = 1     -- a wakeup, so a signal, for every sample
  end
  if opts.period then spec.sample_period = opts.period
  else spec.freq = true; spec.sample_freq = opts.freq or 999 end
  local ev, err = pe.open(spec, { pages = opts.pages or 512 })
  if not ev and not opts.pages then
    -- 2 MiB is over the unprivileged mlock budget (perf_event_mlock_kb)
    ev, err = pe.open(spec, { pages = 64 })
  end
  if not ev then return nil, err end
  p.ev = ev
  if jit and mode ~= "c" then
    local reg = registry.new_registry()
    p.reg = reg
    if mode == "full" then
      local off, seen = p.layout.proto_bc, {}
      reg:seed(off, seen)
      p.bc_cb = function(pt) reg:add_tree(pt, off, seen) end
      subscribe("bc", p.bc_cb)
    end
    if opts.perfmap then
      -- the runtime perf map the perf tool reads for JIT code: /tmp/perf-PID.map
      local f = io.open("/proc/self/stat", "r")
      local pid = f and f:read("*l"):match("^(%d+)")
      if f then f:close() end
      p.perfmap_path = format("/tmp/perf-%s.map", pid or "self")
      reg.perfmap = io.open(p.perfmap_path, "a")
    end
    -- traces compiled before start are unknown to the registry: start clean
    jit.flush()
    p.trace_cb = function(what, tr, func, pc) reg:trace_event(what, tr, func, pc) end
    subscribe("trace", p.trace_cb)
  end
  if p.stacks and not rc.walk.ok then
    p.stacks, p.stacks_reason = false, rc.walk.reason
  end
  if mode == "hook" then hook.hook_start(p, LP, opts) end
  if p.stacks then
    local ok, aerr = LP.luaprof_arm(ev:fd(), nil, M.callops(), rc.jit_base.ok and 1 or 0,
                                    rc.lbase.ok and 1 or 0, rc.vmstate.ok and 1 or 0)
    p.builtins = M.builtins()
    if not ok then p.stacks = false; p.stacks_reason = aerr end
    p.jit_base = rc.jit_base
    p.vms_ok = rc.vmstate.ok
    p.walk_ns0 = tonumber((select(4, LP.luaprof_read())))
    p.sig_throttled0 = tonumber((select(7, LP.luaprof_read())))
  end
  if safe_reason then p.walk, p.stacks_reason = "signal", p.stacks_reason or safe_reason
  elseif p.stacks then p.walk = "signal" end
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
  -- a forked child's copy: its fd shares the parent's event, which it only closes
  local own = open and not self.ev:info().inherited
  if own then self.ev:disable() end
  if self.safe then require("perf_event.profile.safepoint").disarm(self, open)
  elseif self.stacks and open then pe_module().core._private.luaprof_disarm(self.ev:fd()) end
  if self.hook then
    local LP = pe_module().core._private
    LP.luahook_stop()
    if not open then LP.luahook_read() end   -- no drain below: frees the captures
  end
  if self.trace_cb then unsubscribe("trace", self.trace_cb) self.trace_cb = nil end
  if self.bc_cb then unsubscribe("bc", self.bc_cb) self.bc_cb = nil end
  if self.reg and self.reg.perfmap then self.reg.perfmap:close() self.reg.perfmap = nil end
  if own then self:drain() end
  if open then self.ev:close() end
  self.ev = nil
  return self
end
Profile.__gc = Profile.stop
Profile.__close = Profile.stop

return M
