--- perf_event.profile.selftest: what the full mode relies on in LuaJIT's
-- internals, checked once per process before the first full profile (not
-- a public interface, but for `M.selftest`): the layout (GCfuncL.pc at
-- offset 32, the prototype header size), rbx as the interpreter's PC, and
-- the signal-time walks from rdx, G->jit_base and cur_L->base, and
-- G->vmstate. Each check runs a probe of known shape under cpu-clock
-- sampling and compares what the samples say with debug.getinfo.
-- @module perf_event.profile.selftest

local string, table, os = string, table, os
local format = string.format
local type, tonumber, tostring, ipairs, select, rawget, require =
  type, tonumber, tostring, ipairs, select, rawget, require
local debug = debug

local raw = require("perf_event.profile.raw")
local addr_of, u64p, u32p, FN_PC_OFFSET, REGS_MASK = raw.addr_of, raw.u64p, raw.u32p, raw.FN_PC_OFFSET, raw.REGS_MASK

local jit = rawget(_G, "jit")
local ffi, jutil, bit
if jit then
  ffi = require("ffi")
  jutil = require("jit.util")
  bit = require("bit")
end

local M = {}

-- ---------------------------------------------------------------- LuaJIT layout

local layout                 -- { ok, reason, proto_bc } after the first check

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
M.check_layout = check_layout

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
-- the walk from cur_L->base alone, samples in string.find must name the
-- caller at its line and string.find as the function at BASE. The search
-- (libc's memchr over 1 MB, no match) allocates nothing: a probe that
-- allocates (string.rep of 1 MB, until session 12) drives the process's
-- GC: in a test suite's heap its steps took 11-19 of ~300 samples, with
-- vmstate GC, and once 112 of 305 samples were not in vmstate C
local selftest_find = string.find
local function selftest_ccaller(s) return (selftest_find(s, "y", 1, true) or 1) + 0 end
local function selftest_cspin(s) local n = 0 for _ = 1, 8 do n = n + selftest_ccaller(s) end return n end

-- the G->vmstate values samples saw, most frequent first ("-2 x193, -1
-- x100"; ~LJ_VMST_C is -2, the interpreter -1, GC -3, a trace its number),
-- for a failed check's message
local function vms_seen(sigs)
  local n, keys = {}, {}
  for _, g in ipairs(sigs) do
    local v = g.vms or "none"
    if not n[v] then n[v] = 0 keys[#keys + 1] = v end
    n[v] = n[v] + 1
  end
  table.sort(keys, function(a, b) return n[a] > n[b] end)
  local out = {}
  for i = 1, #keys do out[i] = format("%s x%d", tostring(keys[i]), n[keys[i]]) end
  return table.concat(out, ", ")
end

local function check_lbase(pe)
  local LP = pe.core._private
  local ev = pe.open({ event = "cpu-clock", sample_period = 100000, sample_type = "ip",
                       exclude_kernel = true, exclude_hv = true, wakeup_events = 1 }, { pages = 16 })
  if not ev then return { ok = false, reason = "cannot sample" } end
  jit.off(selftest_ccaller)
  jit.off(selftest_cspin)
  local armed, aerr = LP.luaprof_arm(ev:fd(), nil, M.callops(), 1, 2)
  if not armed then ev:close() return { ok = false, reason = tostring(aerr) } end
  local hay = string.rep("x", 1000000)
  local t0 = os.clock()
  ev:enable()
  repeat selftest_cspin(hay) until os.clock() - t0 > 0.03
  ev:disable()
  LP.luaprof_disarm(ev:fd())
  local sigs = LP.luaprof_read()
  ev:close()
  local clo = u64p(addr_of(selftest_ccaller) + FN_PC_OFFSET)
  local chi = clo + 4 * jutil.funcinfo(selftest_ccaller).bytecodes
  local want = debug.getinfo(selftest_ccaller, "S").linedefined
  local find_at = addr_of(selftest_find)
  local walked, good, vms_c = 0, 0, 0
  for _, g in ipairs(sigs) do
    local pc = g.pcs[1] and tonumber(g.pcs[1])
    if g.vms == -2 then vms_c = vms_c + 1 end    -- ~LJ_VMST_C
    if pc then
      walked = walked + 1
      if pc - 4 >= clo and pc - 4 < chi and tonumber(g.fn) == find_at
        and jutil.funcinfo(selftest_ccaller, (pc - clo) / 4 - 1).currentline == want then
        good = good + 1
      end
    end
  end
  -- string.find's search is most of the time; the rest (the interpreter,
  -- where cur_L->base is stale and its function slot holds a result)
  -- must give no walk rather than a wrong one
  if #sigs < 10 or walked < 0.5 * #sigs or good < 0.95 * walked then
    return { ok = false, samples = #sigs, walked = walked, hits = good, vms_c = vms_c,
             reason = format("the walk from cur_L->base found string.find under its caller's line in %d of %d"
                             .. " (%d walked)", good, #sigs, walked) }
  end
  -- (the values seen, for check_vmstate's message: it runs only after this passed)
  return { ok = true, samples = #sigs, walked = walked, hits = good, vms_c = vms_c, vms_seen = vms_seen(sigs) }
end

-- G->vmstate, found by the arm next to cur_L, must have held a live
-- trace's number in most samples of the compiled loop and ~LJ_VMST_C in
-- most of string.find's
local function check_vmstate(jb, lb, addr)
  if not addr or tonumber(addr) == 0 then
    return { ok = false, reason = "no single int32 held ~LJ_VMST_C in global_State before cur_L" }
  end
  local r = { trace = jb.vms_trace or 0, tsamples = jb.samples or 0, c = lb.vms_c or 0, csamples = lb.samples or 0 }
  if r.tsamples < 10 or r.csamples < 10 or r.trace < 0.8 * r.tsamples or r.c < 0.8 * r.csamples then
    r.ok = false
    r.reason = format("G->vmstate held a trace number in %d of %d samples of a compiled loop and ~LJ_VMST_C in"
                      .. " %d of %d in string.find (there: %s)", r.trace, r.tsamples, r.c, r.csamples,
                      lb.vms_seen or "?")
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
M.check_regs = check_regs

--- The self-test results: layout and register checks of the signal walk,
-- and `safepoint`, the safe-point capture's (LuaJIT only).
function M.selftest()
  if not jit then return { ok = false, reason = "not LuaJIT" } end
  local sp = require("perf_event.profile.safepoint").selftest()
  local lay = check_layout()
  if not lay.ok then return { ok = false, reason = lay.reason, layout = lay, safepoint = sp } end
  local rc = check_regs(require("perf_event"))
  return { ok = rc.ok, reason = rc.reason, layout = lay, regs = rc, safepoint = sp }
end

return M
