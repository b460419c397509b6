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
-- @module perf_event.profile

local string, table, math, io = string, table, math, io
local type, tonumber, tostring, pairs, ipairs, setmetatable, pcall, rawget, require, error =
  type, tonumber, tostring, pairs, ipairs, setmetatable, pcall, rawget, require, error
local debug = debug
local format, byte, sub = string.format, string.byte, string.sub
local floor = math.floor
local concat, sort = table.concat, table.sort

local jit = rawget(_G, "jit")
local ffi, jutil, bit
if jit then
  ffi = require("ffi")
  jutil = require("jit.util")
  bit = require("bit")
end

local M = {}

-- x86-64 perf register bits (asm/perf_regs.h): bx 1, dx 3, bp 6, sp 7, ip 8
local REG_BX, REG_DX, REG_BP, REG_SP, REG_IP = 1, 3, 6, 7, 8
local REGS_MASK = 2^REG_BX + 2^REG_DX + 2^REG_BP + 2^REG_SP + 2^REG_IP
-- the profile's own samples: rbx (the interpreter's PC) is all _leaf reads
-- (each register is one more field to decode per sample)
local PROFILE_REGS = 2^REG_BX

-- ---------------------------------------------------------------- clock

local now
if ffi then
  pcall(ffi.cdef, [[
    struct pe_prof_timespec { long tv_sec; long tv_nsec; };
    int clock_gettime(int clk, struct pe_prof_timespec *tp);
  ]])
  local ts = ffi.new("struct pe_prof_timespec")
  now = function()
    ffi.C.clock_gettime(1, ts)   -- CLOCK_MONOTONIC, the samples' clockid
    return tonumber(ts.tv_sec) * 1e9 + tonumber(ts.tv_nsec)
  end
else
  now = function() return 0 end
end

-- ---------------------------------------------------------------- names

-- the object's address: LuaJIT's "%p" (tostring says "builtin#N" for
-- fast functions)
local function addr_of(obj)
  local h = format("%p", obj):match("0x(%x+)")
  return h and tonumber(h, 16)
end

local src_lines = {}   -- path -> array of lines | false

local function source_line(source, line)
  if sub(source, 1, 1) ~= "@" then return nil end
  local path = sub(source, 2)
  local lines = src_lines[path]
  if lines == nil then
    lines = false
    local f = io.open(path, "r")
    if f then
      lines = {}
      for l in f:lines() do lines[#lines + 1] = l end
      f:close()
    end
    src_lines[path] = lines
  end
  return lines and lines[line]
end

-- "name", from the source text of the line that defines the function
local function guess_name(source, linedefined)
  if linedefined == 0 then return "main" end
  local l = source_line(source, linedefined)
  if l then
    local n = l:match("function%s+([%w_%.:]+)%s*%(")
      or l:match("([%w_%.%[%]\"']+)%s*=%s*function%s*%(")
    if n then return n end
  end
  return "anon"
end

local function chunk_name(source)
  local c = source:gsub("^[@=]", "")
  return c
end

local infos = {}   -- "source:linedefined" -> { name, chunk, linedefined, lastlinedefined }

-- fi: a jit.util.funcinfo table (or a debug.getinfo one)
local function proto_info(fi)
  local src = fi.source or "?"
  local key = src .. ":" .. tostring(fi.linedefined)
  local i = infos[key]
  if not i then
    i = { name = guess_name(src, fi.linedefined), chunk = chunk_name(src),
          linedefined = fi.linedefined, lastlinedefined = fi.lastlinedefined }
    infos[key] = i
  end
  return i
end

local function frame_name(info, line)
  return format("%s@%s:%d", info.name, info.chunk, line or info.linedefined)
end
M.frame_name = frame_name

-- ---------------------------------------------------------------- LuaJIT layout

local FN_PC_OFFSET = 32      -- GCfuncL.pc (GC64): GCHeader+ffid+nupvalues, env, gclist, pc
local layout                 -- { ok, reason, proto_bc } after the first check

local u64p, u32p
if ffi then
  u64p = function(a) return tonumber(ffi.cast("uint64_t *", ffi.cast("uintptr_t", a))[0]) end
  u32p = function(a) return bit.tobit(ffi.cast("uint32_t *", ffi.cast("uintptr_t", a))[0]) end
end

-- the bytecode words at `lo` are those jit.util.funcbc reports for f
local function same_bytecode(f, lo, n)
  for i = 0, n - 1 do
    local ins = jutil.funcbc(f, i)
    if not ins or bit.tobit(ins) ~= u32p(lo + 4 * i) then return false end
  end
  return true
end

local function first_proto(f)
  local i = -1
  while true do
    local k = jutil.funck(f, i)
    if k == nil then return nil end
    if type(k) == "proto" then return k end
    i = i - 1
  end
end

-- the probe: a nested function whose closure and prototype we both hold
local function probe_outer()
  local function probe_inner(a, b)
    local c = a * 3 + b
    return c - (a % 5)
  end
  return probe_inner
end

-- the opcodes (as a string of bytes) a return PC follows, from jit.vmdef
local callops
function M.callops()
  if callops then return callops end
  local names = require("jit.vmdef").bcnames
  local want = { CALLM = true, CALL = true, ITERC = true, ITERN = true }
  local t = {}
  for i = 0, #names / 6 - 1 do
    local n = names:sub(i * 6 + 1, i * 6 + 6):gsub(" ", "")
    if want[n] then t[#t + 1] = string.char(i) end
  end
  callops = table.concat(t)
  return callops
end

local function check_layout()
  if layout then return layout end
  if not ffi then layout = { ok = false, reason = "not LuaJIT" } return layout end
  if jit.arch ~= "x64" then layout = { ok = false, reason = "arch " .. jit.arch .. " (x64 only)" } return layout end
  if not ffi.abi("gc64") then layout = { ok = false, reason = "not a GC64 build" } return layout end
  local inner = probe_outer()
  local pt = first_proto(probe_outer)
  local fa, pa = addr_of(inner), pt and addr_of(pt)
  if not fa or not pa then layout = { ok = false, reason = "no address for the probe" } return layout end
  local pc = u64p(fa + FN_PC_OFFSET)
  local off = pc - pa
  if off < 64 or off > 256 or off % 8 ~= 0 then
    layout = { ok = false, reason = format("GCfuncL.pc at +%d gives proto+%d, not a header size", FN_PC_OFFSET, off) }
    return layout
  end
  local n = jutil.funcinfo(inner).bytecodes
  if not same_bytecode(inner, pc, n) then
    layout = { ok = false, reason = "bytecode after the prototype header differs from jit.util.funcbc" }
    return layout
  end
  local opc = u64p(addr_of(probe_outer) + FN_PC_OFFSET)
  if not same_bytecode(probe_outer, opc, jutil.funcinfo(probe_outer).bytecodes) then
    layout = { ok = false, reason = "GCfuncL.pc of a second function does not hold its bytecode" }
    return layout
  end
  layout = { ok = true, proto_bc = off }
  return layout
end

-- ---------------------------------------------------------------- registries

local Reg = {}
Reg.__index = Reg

local function new_registry()
  return setmetatable({ protos = {}, by_lo = {}, sorted = true,
                        live = {}, pending = {}, dead = {}, tsorted = nil, nflush = 0 }, Reg)
end

-- registers the bytecode range [lo, lo + 4*n) of a function or prototype
function Reg:add_bc(obj, lo)
  if self.by_lo[lo] then return end
  local fi = jutil.funcinfo(obj)
  if not fi or not fi.bytecodes then return end
  local e = { lo = lo, hi = lo + 4 * fi.bytecodes, obj = obj, info = proto_info(fi) }
  self.by_lo[lo] = e
  self.protos[#self.protos + 1] = e
  self.sorted = false
end

function Reg:add_proto(pt, off)
  local a = addr_of(pt)
  if a then self:add_bc(pt, a + off) end
end

-- how many entries of one table are looked at for functions (a big data
-- table in an upvalue would otherwise make start slow), and how many
-- functions and prototypes one start visits through upvalues and locals
-- (up to about 75 ms of CPU time, seen with a chain of 200000 closures)
local TABLE_SCAN = 4096
local VISIT_BUDGET = 10000

-- the functions among the values of table t (the first TABLE_SCAN), onto
-- the work list
local function push_table_functions(t, work, seen)
  if seen[t] then return end
  seen[t] = true
  local n = 0
  for _, x in pairs(t) do
    if type(x) == "function" and not seen[x] then work[#work + 1] = x end
    n = n + 1
    if n >= TABLE_SCAN then break end
  end
end

-- a Lua function and the prototypes nested in it, and the functions it
-- holds as upvalues (directly, or as the values of a table upvalue), and
-- theirs in turn: a module's local helpers are siblings of its exported
-- functions in the main chunk, which is gone once it has run. A work list,
-- not recursion, so a long chain of closures cannot overflow the stack.
function Reg:add_tree(root, off, seen)
  local work = { root }
  while #work > 0 do
    local obj = work[#work]
    work[#work] = nil
    if not seen[obj] then
      seen[obj] = true
      local lua = true
      if type(obj) == "function" then
        local ok, fi = pcall(jutil.funcinfo, obj)
        if not ok or not fi or not fi.bytecodes then
          lua = false                                  -- a C function
        else
          self:add_bc(obj, u64p(addr_of(obj) + FN_PC_OFFSET))
          self.nvisit = (self.nvisit or 0) + 1
          for u = 1, self.nvisit <= VISIT_BUDGET and fi.upvalues or 0 do
            local _, v = debug.getupvalue(obj, u)
            if type(v) == "function" then
              if not seen[v] then work[#work + 1] = v end
            elseif type(v) == "table" then
              push_table_functions(v, work, seen)
            end
          end
        end
      else
        self:add_proto(obj, off)
      end
      local i = -1
      while lua do
        local k = jutil.funck(obj, i)
        if k == nil then break end
        if type(k) == "proto" and not seen[k] then work[#work + 1] = k end
        i = i - 1
      end
    end
  end
end

-- the functions held in the locals of the frame at `level` (counted from
-- this function), directly or as the values of a table
function Reg:add_locals(level, off, seen)
  local work = {}
  for k = 1, 250 do
    local name, v = debug.getlocal(level, k)
    if not name then break end
    if type(v) == "function" then
      work[#work + 1] = v
    elseif type(v) == "table" then
      push_table_functions(v, work, seen)
    end
  end
  for _, f in ipairs(work) do self:add_tree(f, off, seen) end
end

-- the functions on the stack (from the caller of `seed` up) and in
-- package.loaded, with their nested prototypes
function Reg:seed(off, seen)
  for level = 2, 200 do
    local i = debug.getinfo(level, "f")
    if not i then break end
    if i.func then self:add_tree(i.func, off, seen) end
    self:add_locals(level + 1, off, seen)
  end
  for _, m in pairs(package.loaded) do
    if type(m) == "table" then
      for _, v in pairs(m) do
        if type(v) == "function" then self:add_tree(v, off, seen) end
      end
    elseif type(m) == "function" then
      self:add_tree(m, off, seen)
    end
  end
end

-- the entry of `list` (sorted by .lo) with the greatest lo <= a, or nil
local function last_at_or_below(list, a)
  local lo, hi, best = 1, #list, nil
  while lo <= hi do
    local mid = floor((lo + hi) / 2)
    if list[mid].lo <= a then best = mid; lo = mid + 1 else hi = mid - 1 end
  end
  return best and list[best]
end

function Reg:find_bc(a)
  local ps = self.protos
  if not self.sorted then
    sort(ps, function(x, y) return x.lo < y.lo end)
    self.sorted = true
  end
  local e = last_at_or_below(ps, a)
  if e and a < e.hi then return e end
  return nil
end

function Reg:trace_event(what, tr, func, pc)
  if what == "start" then
    self.pending[tr] = { func = func, pc = pc }
  elseif what == "stop" then
    local p = self.pending[tr]
    self.pending[tr] = nil
    local code, mc = jutil.tracemc(tr)   -- machine code (a string), its address
    if p and mc then
      local size = #code
      local fi = jutil.funcinfo(p.func, p.pc)
      local info = proto_info(jutil.funcinfo(p.func))
      local e = { tr = tr, lo = mc, hi = mc + size, t0 = now(), info = info,
                  line = fi.currentline or info.linedefined }
      if self.perfmap then
        self.perfmap:write(format("%x %x %s [trace %d]\n", mc, size, frame_name(info, e.line), tr))
        self.perfmap:flush()
      end
      self.ntraces = (self.ntraces or 0) + 1
      local old = self.live[tr]
      if old then old.t1 = e.t0; self.dead[#self.dead + 1] = old end
      self.live[tr] = e
      -- the span of all trace code ever seen: find_trace rejects any other
      -- address at once (the stack scan tries 32 words per sample)
      if not self.lo_min or e.lo < self.lo_min then self.lo_min = e.lo end
      if not self.hi_max or e.hi > self.hi_max then self.hi_max = e.hi end
      -- kept sorted as traces come (re-sorting per trace costs ~0.4 ms with
      -- hundreds of traces, as in an nginx worker)
      local ts = self.tsorted
      if ts and not old then
        local at = #ts + 1
        for i = #ts, 1, -1 do if ts[i].lo > e.lo then at = i else break end end
        table.insert(ts, at, e)
      else
        self.tsorted = nil
      end
    end
  elseif what == "abort" then
    self.pending[tr] = nil
  elseif what == "flush" then
    local t = now()
    for _, e in pairs(self.live) do e.t1 = t; self.dead[#self.dead + 1] = e end
    self.live, self.pending, self.tsorted = {}, {}, nil
    self.nflush = self.nflush + 1
  end
end

-- the trace whose machine code holds address a at time t
function Reg:find_trace(a, t)
  if not self.hi_max or a < self.lo_min or a >= self.hi_max then return nil end
  local ts = self.tsorted
  if not ts then
    ts = {}
    for _, e in pairs(self.live) do ts[#ts + 1] = e end
    sort(ts, function(x, y) return x.lo < y.lo end)
    self.tsorted = ts
  end
  local e = last_at_or_below(ts, a)
  if e and a < e.hi and (not t or t >= e.t0) then return e end
  if t then
    for _, d in ipairs(self.dead) do
      if a >= d.lo and a < d.hi and t >= d.t0 and t < d.t1 then return d end
    end
  end
  return nil
end

-- for perf_event.luamap (the same registry and names, kept in a perf map
-- for luaperf): not a public interface
M._new_registry, M._check_layout, M._REGS_MASK = new_registry, check_layout, REGS_MASK

-- ---------------------------------------------------------------- self-test of rbx

local regs_check   -- { ok, reason, samples, hits } after the first run

local function selftest_spin(n)
  local s = 0
  for i = 1, n do
    s = s + (i % 7) * 3
    s = s - (i % 5)
  end
  return s
end

-- its caller, on one line: the walk from a sample in selftest_spin must
-- give a return address into this function at this line
local function selftest_caller(n) return selftest_spin(n) + 0 end

-- a compiled loop and its one-line caller: with the walk from G->jit_base
-- alone, samples in the loop's trace must name the caller at its line
local function selftest_jspin(n)
  local s = 0
  for i = 1, n do s = s + (i % 7) end
  return s
end
local function selftest_jcaller(n) return selftest_jspin(n) + 0 end

local function check_jit_base(pe)
  local LP = pe.core._private
  local ev = pe.open({ event = "cpu-clock", sample_period = 100000, sample_type = "ip",
                       exclude_kernel = true, exclude_hv = true, wakeup_events = 1 }, { pages = 16 })
  if not ev then return { ok = false, reason = "cannot sample" } end
  jit.on(selftest_jspin)
  selftest_jcaller(1000)                 -- compiled before the samples
  local armed, aerr = LP.luaprof_arm(ev:fd(), nil, M.callops(), 2)
  if not armed then ev:close() return { ok = false, reason = tostring(aerr) } end
  local jb = select(5, LP.luaprof_read())
  local t0 = os.clock()
  ev:enable()
  repeat selftest_jcaller(200000) until os.clock() - t0 > 0.03
  ev:disable()
  LP.luaprof_disarm(ev:fd())
  local sigs = LP.luaprof_read()
  ev:close()
  if not jb or tonumber(jb) == 0 then return { ok = false, reason = "G->jit_base not found next to G->cur_L" } end
  local clo = u64p(addr_of(selftest_jcaller) + FN_PC_OFFSET)
  local chi = clo + 4 * jutil.funcinfo(selftest_jcaller).bytecodes
  local want = debug.getinfo(selftest_jcaller, "S").linedefined
  local good, vms_trace = 0, 0
  for _, g in ipairs(sigs) do
    local pc = g.pcs[1] and tonumber(g.pcs[1])
    if pc and pc - 4 >= clo and pc - 4 < chi
      and jutil.funcinfo(selftest_jcaller, (pc - clo) / 4 - 1).currentline == want then
      good = good + 1
    end
    -- G->vmstate, where found: the number of a trace while one runs
    if g.vms and g.vms > 0 and jutil.traceinfo(g.vms) then vms_trace = vms_trace + 1 end
  end
  if #sigs < 10 or good < 0.8 * #sigs then
    return { ok = false, samples = #sigs, hits = good, vms_trace = vms_trace,
             reason = format("the walk from G->jit_base found the caller at debug.getinfo's line in %d of %d",
                             good, #sigs) }
  end
  return { ok = true, samples = #sigs, hits = good, vms_trace = vms_trace }
end

-- a C function called by the interpreter, from a one-line caller: with
-- the walk from cur_L->base alone, samples in string.rep must name the
-- caller at its line and string.rep as the function at BASE
local selftest_rep = string.rep
local function selftest_ccaller(n) return #selftest_rep("x", n) + 0 end
local function selftest_cspin(n) local s = 0 for _ = 1, 8 do s = s + selftest_ccaller(n) end return s end

local function check_lbase(pe)
  local LP = pe.core._private
  local ev = pe.open({ event = "cpu-clock", sample_period = 100000, sample_type = "ip",
                       exclude_kernel = true, exclude_hv = true, wakeup_events = 1 }, { pages = 16 })
  if not ev then return { ok = false, reason = "cannot sample" } end
  jit.off(selftest_ccaller)
  jit.off(selftest_cspin)
  local armed, aerr = LP.luaprof_arm(ev:fd(), nil, M.callops(), 1, 2)
  if not armed then ev:close() return { ok = false, reason = tostring(aerr) } end
  local t0 = os.clock()
  ev:enable()
  repeat selftest_cspin(1000000) until os.clock() - t0 > 0.03
  ev:disable()
  LP.luaprof_disarm(ev:fd())
  local sigs = LP.luaprof_read()
  ev:close()
  local clo = u64p(addr_of(selftest_ccaller) + FN_PC_OFFSET)
  local chi = clo + 4 * jutil.funcinfo(selftest_ccaller).bytecodes
  local want = debug.getinfo(selftest_ccaller, "S").linedefined
  local rep_at = addr_of(selftest_rep)
  local walked, good, vms_c = 0, 0, 0
  for _, g in ipairs(sigs) do
    local pc = g.pcs[1] and tonumber(g.pcs[1])
    if g.vms == -2 then vms_c = vms_c + 1 end    -- ~LJ_VMST_C
    if pc then
      walked = walked + 1
      if pc - 4 >= clo and pc - 4 < chi and tonumber(g.fn) == rep_at
        and jutil.funcinfo(selftest_ccaller, (pc - clo) / 4 - 1).currentline == want then
        good = good + 1
      end
    end
  end
  -- string.rep's fill is most of the time; the rest (the interpreter,
  -- where cur_L->base is stale and its function slot holds a result)
  -- must give no walk rather than a wrong one
  if #sigs < 10 or walked < 0.5 * #sigs or good < 0.95 * walked then
    return { ok = false, samples = #sigs, walked = walked, hits = good, vms_c = vms_c,
             reason = format("the walk from cur_L->base found string.rep under its caller's line in %d of %d"
                             .. " (%d walked)", good, #sigs, walked) }
  end
  return { ok = true, samples = #sigs, walked = walked, hits = good, vms_c = vms_c }
end

-- G->vmstate, found by the arm next to cur_L, must have held a live
-- trace's number in most samples of the compiled loop and ~LJ_VMST_C in
-- most of string.rep's
local function check_vmstate(jb, lb, addr)
  if not addr or tonumber(addr) == 0 then
    return { ok = false, reason = "no single int32 held ~LJ_VMST_C in global_State before cur_L" }
  end
  local r = { trace = jb.vms_trace or 0, tsamples = jb.samples or 0, c = lb.vms_c or 0, csamples = lb.samples or 0 }
  if r.tsamples < 10 or r.csamples < 10 or r.trace < 0.8 * r.tsamples or r.c < 0.8 * r.csamples then
    r.ok = false
    r.reason = format("G->vmstate held a trace number in %d of %d samples of a compiled loop and ~LJ_VMST_C in"
                      .. " %d of %d in string.rep", r.trace, r.tsamples, r.c, r.csamples)
  else
    r.ok = true
  end
  return r
end

local function check_walk(lo, hi, sigs)
  local clo = u64p(addr_of(selftest_caller) + FN_PC_OFFSET)
  local chi = clo + 4 * jutil.funcinfo(selftest_caller).bytecodes
  local want = debug.getinfo(selftest_caller, "S").linedefined
  local n, good = 0, 0
  for _, g in ipairs(sigs) do
    local bx = tonumber(g.bx)
    if bx >= lo + 4 and bx < hi + 4 then
      n = n + 1
      local pc = g.pcs[1] and tonumber(g.pcs[1])
      if pc and pc - 4 >= clo and pc - 4 < chi
        and jutil.funcinfo(selftest_caller, (pc - clo) / 4 - 1).currentline == want then
        good = good + 1
      end
    end
  end
  if n < 10 then return { ok = false, reason = format("only %d signals in the frame-walk self-test", n) } end
  if good < 0.9 * n then
    return { ok = false, samples = n, hits = good,
             reason = format("the walk from rdx found the caller at debug.getinfo's line in %d of %d samples",
                             good, n) }
  end
  return { ok = true, samples = n, hits = good }
end

local function check_regs(pe)
  if regs_check then return regs_check end
  local LP = pe.core._private
  local walk = LP.luaprof_arm ~= nil
  local ev, err = pe.open({ event = "cpu-clock", sample_period = 100000, sample_type = "ip|regs_user",
                            sample_regs_user = REGS_MASK, exclude_kernel = true, exclude_hv = true,
                            wakeup_events = walk and 1 or nil },
                          { pages = 16 })
  if not ev then regs_check = { ok = false, reason = "cannot sample: " .. tostring(err) } return regs_check end
  jit.off(selftest_spin)
  jit.off(selftest_caller)
  local lo = u64p(addr_of(selftest_spin) + FN_PC_OFFSET)
  local hi = lo + 4 * jutil.funcinfo(selftest_spin).bytecodes
  local active = debug.getinfo(selftest_spin, "L").activelines
  local n, hits, badline = 0, 0, 0
  local armed, aerr = false, "no luaprof in the core"
  if walk then armed, aerr = LP.luaprof_arm(ev:fd(), nil, M.callops()) end
  local t0 = os.clock()
  ev:enable()
  repeat
    selftest_caller(200000)
  until os.clock() - t0 > 0.03
  ev:disable()
  local walk_check = { ok = false, reason = tostring(aerr) }
  if armed then
    LP.luaprof_disarm(ev:fd())
    walk_check = check_walk(lo, hi, (LP.luaprof_read()))
  end
  -- only samples in LuaJIT's own code count: under ASan, or at this rate,
  -- some land in the signal handler or libc, where rbx is not the PC
  local sym = pe.symbols.new({ kernel = false, offsets = true })
  sym:load_maps("self")
  for rec in ev:records() do
    local _, _, module = sym:lookup(rec.ip)
    if rec.type == "sample" and rec.regs_user and rec.regs_user.bx and module and module:find("luajit", 1, true) then
      n = n + 1
      local bx = tonumber(rec.regs_user.bx)
      if bx >= lo + 4 and bx < hi + 4 then
        hits = hits + 1
        local line = jutil.funcinfo(selftest_spin, (bx - lo) / 4 - 1).currentline
        if not active[line] then badline = badline + 1 end
      end
    end
  end
  ev:close()
  if n < 10 then
    regs_check = { ok = false, reason = format("only %d samples in the rbx self-test", n), samples = n, hits = hits }
  elseif hits < 0.9 * n or badline > 0 then
    regs_check = { ok = false, samples = n, hits = hits,
                   reason = format("rbx held the interpreter's PC in %d of %d samples, %d off debug.getinfo's lines",
                                   hits, n, badline) }
  else
    regs_check = { ok = true, samples = n, hits = hits }
  end
  regs_check.walk = walk_check
  regs_check.jit_base = walk_check.ok and check_jit_base(pe) or { ok = false, reason = "no walk" }
  regs_check.lbase = regs_check.jit_base.ok and check_lbase(pe) or { ok = false, reason = "no jit_base" }
  regs_check.vmstate = regs_check.lbase.ok
    and check_vmstate(regs_check.jit_base, regs_check.lbase, select(6, pe.core._private.luaprof_read()))
    or { ok = false, reason = "no cur_L->base" }
  return regs_check
end

-- ---------------------------------------------------------------- profile

local MAX_WALK_HZ = 10000   -- the highest rate that gets a signal-time walk

local Profile = {}
Profile.__index = Profile
Profile.__name = "perf_event.profile"

function Profile:__tostring()
  return format("perf_event.profile(%s, %s, %d samples%s)", self.event, self.mode, self.nsamples,
                self.running and ", running" or "")
end

local function pe_module()
  return require("perf_event")
end

local function le_u64(s, o)
  local a, b, c, d, e, f, g, h = byte(s, o + 1, o + 8)
  return a + b * 256 + c * 65536 + d * 16777216 + (e + f * 256 + g * 65536 + h * 16777216) * 4294967296
end

-- ---------------------------------------------------------------- PUC Lua: hook mode
--
-- csrc/luahook.c captures the Lua stack at the first VM hook point after a
-- sample: each sample signals this thread, whose handler sets a count hook
-- of 1 on the thread that called start ("signal"; "count" also keeps a
-- hook every `hook_count` instructions, which coroutines created after
-- start inherit). The hook captures when the ring's data_head has moved
-- since it last looked. drain pairs each sample with the first capture
-- taken at or after its time; the sample's IP gives the C leaf under those
-- Lua frames.

local HOOK_WINDOW = 1e8   -- ns: a capture later than this after a sample is not its stack

-- how the hook is set: "signal" (only the one-shot hook set by each
-- sample's signal) or "count" (and a count hook always set). A standing
-- hook costs on every instruction on 5.4, on every count-th one on 5.1.
local function hook_kind(opts)
  if opts.hook then return opts.hook end
  if opts.hook_count then return "count" end
  return _VERSION == "Lua 5.1" and "count" or "signal"
end

-- sets the hook (p.mode becomes "c", with the reason, when it cannot)
local function hook_start(p, LP, opts)
  local kind = hook_kind(opts)
  local arg = kind == "signal" and "signal" or (opts.hook_count or 1000)
  local ok, err = LP.luahook_start(p.ev, arg, opts.hook_slots or 8192, opts.depth or 64)
  if not ok then
    p.mode, p.reason = "c", err
    return
  end
  p.hook, p.hook_kind, p.hpend = true, kind, {}
  p.hook_count = kind == "count" and arg or nil
end

-- a capture's frames, root first: Lua frames named like LuaJIT's, C
-- functions on the Lua stack (pcall, table.sort) by the name Lua gives them
local function hook_frames(cap, strs)
  local f, out = cap.f, {}
  for i = #f - 3, 1, -4 do
    local src, line, ld, lld = strs[f[i]] or "?", f[i + 1], f[i + 2], f[i + 3]
    if ld < 0 then
      if src ~= "?" then out[#out + 1] = { c = src, hook = true } end
    else
      out[#out + 1] = { lua = proto_info({ source = src, linedefined = ld, lastlinedefined = lld }),
                        line = line >= 0 and line or ld, hook = true }
    end
  end
  return out
end

-- the sample's leaf under the captured stack: a C frame is kept unless it
-- is the interpreter itself (an unnamed address in the module holding the
-- Lua VM), which the Lua frames already stand for
function Profile:_hook_resolve(rec, cap)
  local leaf = self:_leaf(rec)
  if not cap or #cap.frames == 0 then return leaf end
  local out = {}
  for i, f in ipairs(cap.frames) do out[i] = f end
  local n = 0
  for _, f in ipairs(leaf) do
    local vm = f.c and f.c:sub(1, 1) == "[" and f.module and self.vm_module
      and (self.vm_module == f.module or self.vm_module:sub(-#f.module - 1) == "/" .. f.module)
    if not vm then out[#out + 1] = f; n = n + 1 end
  end
  out.nleaf = n > 0 and n or nil
  return out
end

-- drain's hook branch: the samples of the ring, each with its capture.
-- The ring is read before the captures, so that a sample's capture, taken
-- at the first hook point after it, has been taken by then; a sample with
-- no capture yet waits for the next drain, unless `final`.
function Profile:_hook_drain(final)
  local waiting = self.hwait or {}
  for rec in self.ev:records() do
    if rec.type == "sample" then
      waiting[#waiting + 1] = rec
    elseif rec.type == "lost" or rec.type == "lost_samples" then
      self.lost = self.lost + (tonumber(rec.lost) or 0)
    end
  end
  local caps, strs, dropped, ncalls, vm, ns = pe_module().core._private.luahook_read()
  self.hook_dropped, self.hook_calls, self.hook_ns = tonumber(dropped), tonumber(ncalls), tonumber(ns)
  self.vm_module = self.vm_module or vm
  local pend = self.hpend
  for _, c in ipairs(caps) do
    c.time = tonumber(c.time)
    c.frames = hook_frames(c, strs)
    pend[#pend + 1] = c
  end
  self.ncaps = (self.ncaps or 0) + #caps
  local j, k = 1, 1
  while k <= #waiting do
    local rec = waiting[k]
    local t = tonumber(rec.time)
    while pend[j] and pend[j].time < t do j = j + 1 end
    local c = pend[j]
    if not c and not final then break end
    if c and c.time - t > HOOK_WINDOW then c = nil end
    if c then self.nhooked = (self.nhooked or 0) + 1 end
    self.nsamples = self.nsamples + 1
    if self.keep == false then self:_count(self:_hook_resolve(rec, c))
    else self.samples[#self.samples + 1] = self:_hook_resolve(rec, c) end
    k = k + 1
  end
  local rest = {}
  for i = k, #waiting do rest[#rest + 1] = waiting[i] end
  self.hwait = rest
  -- captures before the last paired sample are no longer needed
  local keep = {}
  for i = j, #pend do keep[#keep + 1] = pend[i] end
  self.hpend = keep
end

--- Starts sampling this thread.
-- @tparam[opt] table opts `event` ("cpu-clock"), `freq` (999 Hz) or
--   `period` (in event units), `pages` (ring pages, a power of two; 512, or 64 when
--   2 MiB cannot be locked),
--   `stack` (bytes of user stack per sample scanned for a trace caller,
--   256; 0 disables), `stacks` (false: no signal-time walk of the Lua
--   callers, leaf frames only), `lua` (false: C leaf frames only), `perfmap`
--   (true: append each trace to /tmp/perf-PID.map for the perf tool),
--   `keep` (false: fold each sample into per-stack counts at drain instead
--   of keeping `p.samples`, so memory is bounded by the distinct stacks);
--   on PUC Lua `hook` ("signal", the default on 5.2+, or "count", the
--   default on 5.1), `hook_count` (1000 instructions), `depth` (64 frames)
-- @treturn[1] table the profile
-- @treturn[2] nil
-- @treturn[2] string why the event could not be opened
local drain_fns   -- the functions of a drain's resolution (defined at the end)
local start_safepoint

-- the default on LuaJIT: stacks taken at a safe point through LuaJIT's
-- profiler hook (profile/safepoint.lua, csrc/luasafe.c): no prototype
-- registry, no trace registry, no registers or stack copy per sample.
-- Returns the started profile; or false, why (the caller falls back to the
-- signal-time walk); or nil when the event cannot be opened (p.err).
start_safepoint = function(p, pe, opts)
  local safepoint = require("perf_event.profile.safepoint")
  local st = safepoint.selftest()
  if not st.ok then return false, st.reason end
  local spec = { event = p.event, exclude_kernel = true, exclude_hv = true,
                 use_clockid = true, clockid = "monotonic", sample_type = "ip|tid|time",
                 wakeup_events = 1 }
  if opts.period then spec.sample_period = opts.period
  else spec.freq = true; spec.sample_freq = opts.freq or 999 end
  local ev, err = pe.open(spec, { pages = opts.pages or 512 })
  if not ev and not opts.pages then ev, err = pe.open(spec, { pages = 64 }) end
  if not ev then p.err = err return nil end
  p.ev = ev
  p.helpers = { proto_info = proto_info, builtins = M.builtins, frame_name = frame_name, addr_of = addr_of }
  local ok, why = safepoint.arm(p, opts.lj_mode)   -- lj_mode "f": bench/profile/safepoint.lua only
  if not ok then ev:close() p.ev = nil return false, why end
  p.mode, p.walk, p.stacks, p.selftest = "safepoint", "safepoint", true, st
  p.running = true
  p.freq, p.period = not opts.period and (opts.freq or 999) or nil, opts.period
  p.time_nanos, p.t_start = os.time() * 1e9, now()
  local eok, e2 = ev:enable()
  if not eok and e2 then p:stop() return nil end
  return p
end

function M.start(opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("profile.start: opts must be a table", 2) end
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
  if opts.walk ~= nil and opts.walk ~= "safepoint" and opts.walk ~= "signal" then
    error("profile.start: walk must be \"safepoint\" or \"signal\", got " .. tostring(opts.walk), 2)
  end
  local hz0 = opts.period and (p.event == "cpu-clock" or p.event == "task-clock") and 1e9 / opts.period
              or not opts.period and (opts.freq or 999)
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
  if jit and opts.lua ~= false then
    local lay = check_layout()
    if lay.ok then
      local rc = check_regs(pe)
      if rc.ok then mode, reason = "full", nil
      else mode, reason = "trace", rc.reason end
    else
      mode, reason = "trace", lay.reason
    end
    p.layout = lay
  elseif opts.lua == false then
    reason = "lua=false"
  elseif pe.core._private.luahook_start then
    if opts.hook ~= nil and opts.hook ~= "signal" and opts.hook ~= "count" then
      error("profile.start: hook must be \"signal\" or \"count\", got " .. tostring(opts.hook), 2)
    end
    mode, reason = "hook", nil
  end
  p.mode, p.reason = mode, reason
  local stack = opts.stack or 256
  local st = "ip|tid|time"
  local spec = { event = p.event, exclude_kernel = true, exclude_hv = true,
                 use_clockid = true, clockid = "monotonic" }
  if mode == "full" then
    st = st .. "|regs_user"
    spec.sample_regs_user = PROFILE_REGS
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
    local reg = new_registry()
    p.reg = reg
    if mode == "full" then
      local off, seen = layout.proto_bc, {}
      reg:seed(off, seen)
      p.bc_cb = function(pt) reg:add_tree(pt, off, seen) end
      jit.attach(p.bc_cb, "bc")
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
    jit.attach(p.trace_cb, "trace")
  end
  if p.stacks and not regs_check.walk.ok then
    p.stacks, p.stacks_reason = false, regs_check.walk.reason
  end
  if mode == "hook" then hook_start(p, LP, opts) end
  if p.stacks then
    local ok, aerr = LP.luaprof_arm(ev:fd(), nil, M.callops(), regs_check.jit_base.ok and 1 or 0,
                                    regs_check.lbase.ok and 1 or 0, regs_check.vmstate.ok and 1 or 0)
    p.builtins = M.builtins()
    if not ok then p.stacks = false; p.stacks_reason = aerr end
    p.jit_base = regs_check.jit_base
    p.vms_ok = regs_check.vmstate.ok
    p.walk_ns0 = tonumber((select(4, LP.luaprof_read())))
    p.sig_throttled0 = tonumber((select(7, LP.luaprof_read())))
  end
  if safe_reason then p.walk, p.stacks_reason = "signal", p.stacks_reason or safe_reason
  elseif p.stacks then p.walk = "signal" end
  p.running = true
  -- what an exporter needs to know (pprof's period, time and duration)
  p.freq, p.period = not opts.period and (opts.freq or 999) or nil, opts.period
  p.time_nanos, p.t_start = os.time() * 1e9, jit and now() or nil
  local ok, e2 = ev:enable()
  if not ok and e2 then p:stop() return nil, e2 end
  return p
end

-- the library tables named first, in this order; the other modules of
-- package.loaded follow sorted by name
local LIBS = { "_G", "string", "table", "math", "io", "os", "coroutine", "debug", "package",
               "bit", "jit", "ffi", "jit.util", "jit.profile" }

--- Names of the builtins and C functions in package.loaded's tables, by the
-- function's address (what `%p` gives, the GCfunc the frame holds), as
-- `lib.name` (`_G`'s without a prefix); the cdata metamethods as
-- `cdata.__call`, .... The table keeps the functions, so no address in it
-- is reused while it lives.
-- @treturn table address -> name
function M.builtins()
  local names, keep = {}, {}
  local function add(prefix, t)
    if type(t) ~= "table" then return end
    local ks = {}
    for k, v in pairs(t) do
      if type(k) == "string" and type(v) == "function" then ks[#ks + 1] = k end
    end
    sort(ks)
    for _, k in ipairs(ks) do
      local f = t[k]
      local fi = jutil and jutil.funcinfo(f)
      local a = fi and fi.ffid and addr_of(f)
      if a and not names[a] then
        names[a] = prefix and prefix .. "." .. k or k
        keep[#keep + 1] = f
      end
    end
  end
  local seen = {}
  for _, m in ipairs(LIBS) do
    local t = package.loaded[m]
    if t then seen[m] = true add(m ~= "_G" and m or nil, t) end
  end
  local rest = {}
  for m in pairs(package.loaded) do
    if type(m) == "string" and not seen[m] then rest[#rest + 1] = m end
  end
  sort(rest)
  for _, m in ipairs(rest) do add(m, package.loaded[m]) end
  if ffi then add("cdata", debug.getmetatable(ffi.new("char[1]"))) end
  names.functions = keep
  return names
end

-- the Lua callers from a sample-time frame walk, root first: each PC is a
-- return address into a known prototype; the walk stops at the first one
-- that is not (a C boundary, or not a frame at all)
local function callers(reg, sig)
  local out = {}
  local bx = tonumber(sig.bx)
  for i, v in ipairs(sig.pcs) do
    local pc = tonumber(v)
    -- returning from a fast function, rbx is already the caller's PC while
    -- rdx is still the callee's BASE: the first link repeats the leaf
    if i == 1 and pc == bx then pc = nil end
    local e = pc and reg:find_bc(pc - 4)
    if not e and (i > 1 or pc) then break end
    if e then
      local fi = jutil.funcinfo(e.obj, (pc - e.lo) / 4 - 1)
      out[#out + 1] = { lua = e.info, line = fi and fi.currentline or e.info.linedefined, walked = true }
    end
  end
  local n = #out
  for i = 1, floor(n / 2) do out[i], out[n - i + 1] = out[n - i + 1], out[i] end
  -- the function whose frame the walk started from (its line is not known
  -- from the walk: the function's first line stands for it)
  local fpc = n > 0 and tonumber(sig.fpc)
  local fe = fpc and fpc ~= 0 and reg.by_lo[fpc]
  if fe then out[#out + 1] = { lua = fe.info, line = fe.info.linedefined, walked = true, base = true } end
  return out
end

function Profile:_resolve(rec, sig)
  local leaf = self:_leaf(rec, sig)
  if not sig or not self.reg then return leaf end
  local up = callers(self.reg, sig)
  if #up == 0 then return leaf end
  -- the walk's BASE frame holds a builtin or C function and the leaf has
  -- no Lua frame: name it. LuaJIT's own unnamed code is the builtin (or
  -- what it calls inside the VM); a leaf in another module sits under it
  local bname = leaf[1].c and self.builtins and self.builtins[tonumber(sig.fn)]
  if bname then
    local f = leaf[1]
    if #leaf == 1 and f.module and f.module:find("luajit", 1, true) and f.c:find("^%[") then
      leaf[1] = { c = bname, addr = f.addr, module = f.module, builtin = true }
    else
      up[#up + 1] = { c = bname, builtin = true }
    end
  end
  -- the leaf's own Lua frame, when it is the same function, replaces the
  -- walk's base function (a different one was inlined into its trace)
  local last = up[#up]
  if last.base and leaf[1].lua and leaf[1].lua == last.lua then up[#up] = nil
  elseif last.base and leaf[1].caller and leaf[1].lua ~= last.lua then
    -- the stack scan took a stale return address (a trace of a function
    -- called earlier, left in an unused slot) where the walk found the
    -- frame that runs: the walk wins (its frame is the leaf when no C
    -- frame is left)
    table.remove(leaf, 1)
  end
  for _, f in ipairs(leaf) do up[#up + 1] = f end
  up.nleaf = #leaf > 0 and #leaf or 1
  return up
end

-- G->vmstate at the signal (the self-tested one): ~LJ_VMST_INTERP or
-- ~LJ_VMST_C, no trace runs, so no word of the stack is a trace's caller
local VMS_NO_TRACE = { [-1] = true, [-2] = true }

function Profile:_leaf(rec, sig)
  local reg, sym = self.reg, self.sym
  local ip = tonumber(rec.ip)
  local frames = {}
  local tr = reg and reg:find_trace(ip, tonumber(rec.time))
  if tr then
    frames[1] = { lua = tr.info, line = tr.line, trace = tr.tr }
    return frames
  end
  local lua
  -- out: the signal found the thread outside Lua (the host's code after
  -- lua_resume returned): rbx is not the interpreter's PC there
  local out = sig and sig.out
  if reg and not out and rec.regs_user and rec.regs_user.bx then
    local bx = tonumber(rec.regs_user.bx)
    local e = bx and reg:find_bc(bx - 4)
    if e then
      local pos = (bx - e.lo) / 4 - 1
      local fi = jutil.funcinfo(e.obj, pos)
      lua = { lua = e.info, line = fi and fi.currentline or e.info.linedefined }
    end
  end
  if not lua and reg and not out and rec.stack_user and rec.stack_user.data
    and not (sig and self.vms_ok and VMS_NO_TRACE[sig.vms]) then
    local data = rec.stack_user.data
    local n = tonumber(rec.stack_user.dyn_size) or #data
    if n > #data then n = #data end
    for o = 0, n - 8, 8 do
      local w = le_u64(data, o)
      local t = reg:find_trace(w, tonumber(rec.time))
      if t then lua = { lua = t.info, line = t.line, trace = t.tr, caller = true } break end
    end
  end
  local name, _, module = sym:lookup(ip)
  local vm = module and module:find("luajit", 1, true) and (name:find("+0x", 1, true)
    or name:find("^lj_BC_") or name:find("^lj_vm_"))
  if lua then frames[1] = lua end
  if not (lua and vm) then
    -- a stripped library: the module stands for its unnamed addresses
    if module and name:find("+0x", 1, true) then name = "[" .. module .. "]" end
    frames[#frames + 1] = { c = name, addr = ip, module = module }
  end
  return frames
end

--- Reads the samples in the ring and adds them to the profile.
-- Called by `stop`; call it now and then in a long run so the ring does
-- not overflow (`p.lost` counts what did).
function Profile:drain()
  if not self.ev then return self end
  if not self.sym then
    self.sym = pe_module().symbols.new({ kernel = false, offsets = true })
  end
  local t_drain = self.keep == false and now()
  -- reading /proc/self/maps costs ~0.5 ms: an always-on (keep=false)
  -- profile drained often rereads it every 10 s only
  if not t_drain or not self.maps_t or t_drain - self.maps_t > 1e10 then
    if t_drain then self.sym = self:_memo_sym() end
    self.sym:load_maps("self")
    self.maps_t = t_drain or nil
  end
  if self.hook then self:_hook_drain(not self.running) return self end
  if self.safe then
    require("perf_event.profile.safepoint").drain(self, not self.running)
    return self
  end
  local samples = self.samples
  local sigs, si = nil, 1
  if self.stacks then
    local dropped, ns, throttled, _
    sigs, dropped, _, ns, _, _, throttled = pe_module().core._private.luaprof_read()
    self.sig_dropped = tonumber(dropped)
    self.sig_throttled = tonumber(throttled) - (self.sig_throttled0 or 0)
    self.walk_ns = tonumber(ns) - (self.walk_ns0 or 0)
    self.nsigs = (self.nsigs or 0) + #sigs
  end
  for rec in self.ev:records() do
    if rec.type == "sample" then
      self.nsamples = self.nsamples + 1
      -- the signal for this sample: the next one at the same user ip, taken
      -- after the sample and within 10 ms of it
      local sig
      if sigs then
        local ip, t = tonumber(rec.ip), tonumber(rec.time)
        for j = si, math.min(si + 3, #sigs) do
          local g = sigs[j]
          local gt = tonumber(g.time)
          if tonumber(g.ip) == ip and gt >= t and gt - t < 1e7 then sig = g; si = j + 1 break end
        end
      end
      if self.keep == false then self:_count(self:_resolve(rec, sig))
      else samples[#samples + 1] = self:_resolve(rec, sig) end
    elseif rec.type == "lost" or rec.type == "lost_samples" then
      self.lost = self.lost + (tonumber(rec.lost) or 0)
    end
  end
  if self.keep == false then self:_prune(t_drain) end
  return self
end

--- Stops sampling, detaches the JIT callbacks and reads the last samples.
-- Idempotent. @treturn table the profile
function Profile:stop()
  if not self.running then return self end
  self.running = false
  if self.t_start then self.duration_nanos = now() - self.t_start end
  local open = pcall(self.ev.fd, self.ev)   -- closed behind our back?
  if open then self.ev:disable() end
  if self.safe then require("perf_event.profile.safepoint").disarm(self, open)
  elseif self.stacks and open then pe_module().core._private.luaprof_disarm(self.ev:fd()) end
  if self.hook then
    local LP = pe_module().core._private
    LP.luahook_stop()
    if not open then LP.luahook_read() end   -- no drain below: frees the captures
  end
  if self.trace_cb then jit.attach(self.trace_cb) self.trace_cb = nil end
  if self.bc_cb then jit.attach(self.bc_cb) self.bc_cb = nil end
  if self.reg and self.reg.perfmap then self.reg.perfmap:close() self.reg.perfmap = nil end
  if open then
    self:drain()
    self.ev:close()
  end
  self.ev = nil
  return self
end
Profile.__gc = Profile.stop
Profile.__close = Profile.stop

local function frame_text(f, lines)
  if f.c then return f.c end
  return frame_name(f.lua, lines and f.line or nil)
end

-- ---------------------------------------------------------------- aggregated mode (keep=false)

local info_ids, next_info_id = setmetatable({}, { __mode = "k" }), 0

-- folds one resolved sample into self.counts: the key tells apart what
-- aggregate's options may keep apart (line, trace), and is cheap to build
function Profile:_count(frames)
  local parts = {}
  for i = 1, #frames do
    local f = frames[i]
    if f.c then
      parts[i] = f.c
    else
      local id = info_ids[f.lua]
      if not id then next_info_id = next_info_id + 1; id = next_info_id; info_ids[f.lua] = id end
      parts[i] = (f.caller and "@" or "") .. id .. ":" .. (f.line or "") .. ":" .. (f.trace or "")
    end
  end
  local k = concat(parts, ";", 1, #frames) .. "/" .. (frames.nleaf or "")
  local e = self.counts[k]
  if e then e.count = e.count + 1
  else self.counts[k] = { frames = frames, count = 1 }; self.nstacks = self.nstacks + 1 end
end

-- an aggregated profile sees the same C addresses again and again (a
-- lookup costs 3-6 us): its symbols answer through a bounded memo, made
-- anew when the maps are reread
function Profile:_memo_sym()
  local raw = self.sym_raw or self.sym
  self.sym_raw = raw
  local memo, n = {}, 0
  return {
    load_maps = function(_, pid) return raw:load_maps(pid) end,
    lookup = function(_, ip, pid)
      local e = memo[ip]
      if not e then
        if n >= 4096 then memo, n = {}, 0 end
        e = { raw:lookup(ip, pid) }
        memo[ip], n = e, n + 1
      end
      return e[1], e[2], e[3]
    end,
  }
end

-- a trace closed by a flush before this drain began matches no sample
-- still to come: forget it (the registry would grow with every flush)
function Profile:_prune(t)
  local reg = self.reg
  if not reg or #reg.dead == 0 then return end
  local keep = {}
  for _, d in ipairs(reg.dead) do
    if d.t1 >= t then keep[#keep + 1] = d end
  end
  reg.dead = keep
end

-- calls fn(frames, count) for every stored stack: the samples, or the
-- per-stack counts of an aggregated profile
local function each_stack(self, fn)
  if self.keep == false then
    for _, e in pairs(self.counts) do fn(e.frames, e.count) end
  else
    for _, frames in ipairs(self.samples) do fn(frames, 1) end
  end
end

--- Forgets the stored stacks (the samples, or the per-stack counts), so
-- that the next read covers what is sampled from now on; `nsamples` and
-- `lost` keep counting. @treturn table the profile
function Profile:reset()
  self.samples = {}
  if self.keep == false then self.counts, self.nstacks = {}, 0 end
  return self
end

--- The samples grouped by stack, most first: the form the exporters
-- (folded text, pprof, speedscope) read.
-- @tparam[opt] table opts `lines=false` merges the lines of a function;
--   `traces=true` keeps stacks through different traces apart; `reset=true`
--   forgets the stored stacks once read (`p:reset()`)
-- @treturn table array of `{frames=, count=, key=}` (key: the folded text); `frames` is root first, each
--   frame either `{lua=info, line=n, trace=N}` (info: `name`, `chunk`,
--   `linedefined`, `lastlinedefined`) or `{c=name, addr=ip, module=path}`
--   (addr and module when known)
function Profile:aggregate(opts)
  opts = opts or {}
  local lines = opts.lines ~= false
  local by, out = {}, {}
  each_stack(self, function(frames, count)
    local parts = {}
    for i, f in ipairs(frames) do
      local t = frame_text(f, lines)
      if opts.traces and f.trace then t = t .. " [trace " .. f.trace .. "]" end
      parts[i] = t
    end
    local k = concat(parts, ";")
    local e = by[k]
    if not e then e = { frames = frames, count = 0, key = k }; by[k] = e; out[#out + 1] = e end
    e.count = e.count + count
  end)
  if opts.reset then self:reset() end
  sort(out, function(a, b) if a.count ~= b.count then return a.count > b.count end return a.key < b.key end)
  return out
end

--- Folded stacks, root first, one "a;b;c N" line per distinct stack,
-- sorted by count (most first).
-- @tparam[opt] table opts `lines=false` names Lua frames by the line that
--   defines the function instead of the sampled line; `traces=true`
--   appends `[trace N]` to frames attributed through a trace; `reset=true`
--   as in aggregate
-- @treturn string
function Profile:folded(opts)
  local out = {}
  for i, e in ipairs(self:aggregate(opts)) do out[i] = e.key .. " " .. e.count end
  return concat(out, "\n") .. (#out > 0 and "\n" or "")
end

--- The hottest functions: each sample counts for its innermost Lua
-- function (C leaves under a known Lua caller count for the caller), or
-- for its C leaf when no Lua frame is known.
-- @tparam[opt] number n how many (all)
-- @tparam[opt] table opts `by="leaf"` counts the leaf frame instead;
--   `lines=true` keeps the sampled line in the name; `reset=true` as in
--   aggregate
-- @treturn table array of `{name=, count=, share=}` (share in percent),
--   most first
function Profile:top(n, opts)
  opts = opts or {}
  local counts, total = {}, 0
  each_stack(self, function(frames, count)
    local f = frames[#frames]
    if opts.by ~= "leaf" then
      for i = #frames, 1, -1 do if frames[i].lua then f = frames[i] break end end
    end
    local k = frame_text(f, opts.lines)
    counts[k] = (counts[k] or 0) + count
    total = total + count
  end)
  if opts.reset then self:reset() end
  local out = {}
  for k, c in pairs(counts) do out[#out + 1] = { name = k, count = c, share = 100 * c / total } end
  sort(out, function(a, b) if a.count ~= b.count then return a.count > b.count end return a.name < b.name end)
  if n and #out > n then for i = #out, n + 1, -1 do out[i] = nil end end
  return out
end

--- How many samples went each way: `trace`, `interp` (PC register),
-- `caller` (C leaf under a trace found on the stack), `c` (C leaf alone).
function Profile:kinds()
  local k = { trace = 0, interp = 0, caller = 0, c = 0 }
  each_stack(self, function(frames, count)
    local f = frames[#frames - (frames.nleaf or #frames) + 1]
    if f.trace and not f.caller then k.trace = k.trace + count
    elseif f.caller then k.caller = k.caller + count
    elseif f.lua then k.interp = k.interp + count
    else k.c = k.c + count end
  end)
  return k
end

--- The self-test results: layout and register checks of the signal walk,
-- and `safepoint`, the safe-point capture's (LuaJIT only).
function M.selftest()
  if not jit then return { ok = false, reason = "not LuaJIT" } end
  local sp = require("perf_event.profile.safepoint").selftest()
  local lay = check_layout()
  if not lay.ok then return { ok = false, reason = lay.reason, layout = lay, safepoint = sp } end
  local rc = check_regs(pe_module())
  return { ok = rc.ok, reason = rc.reason, layout = lay, regs = rc, safepoint = sp }
end

drain_fns = function()
  local t = { Profile.drain, Profile._resolve, Profile._leaf, Profile._count, Profile._prune, callers,
              Reg.find_trace, Reg.find_bc, last_at_or_below, le_u64 }
  for _, f in ipairs(require("perf_event.profile.safepoint").drain_fns()) do t[#t + 1] = f end
  return t
end

return M
