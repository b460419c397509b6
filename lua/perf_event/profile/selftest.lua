--- perf_event.profile.selftest: `selftest` (the results of the safe-point
-- capture's self-test, profile/safepoint.lua, and of the layout check), and
-- the check of what perf_event.luamap's bytecode ranges rely on in
-- LuaJIT's internals, once per process (not a public interface, but for
-- `M.selftest`): GCfuncL.pc at offset 32 and the prototype header size,
-- against jit.util.funcbc on a probe of known shape.
-- @module perf_event.profile.selftest

local format = string.format
local type, rawget, require = type, rawget, require

local raw = require("perf_event.profile.raw")
local addr_of, u64p, u32p, FN_PC_OFFSET = raw.addr_of, raw.u64p, raw.u32p, raw.FN_PC_OFFSET

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

--- The self-test results: `safepoint`, the safe-point capture's (its
-- walk against debug.getinfo, and its reading of compiled lines), with its
-- `ok` and `reason` (LuaJIT only), and `layout`, the check of the prototype
-- layout perf_event.luamap relies on.
-- @treturn table {ok=, reason=, safepoint=, layout=}
function M.selftest()
  if not jit then return { ok = false, reason = "not LuaJIT" } end
  local sp = require("perf_event.profile.safepoint").selftest()
  return { ok = sp.ok, reason = sp.reason, safepoint = sp, layout = check_layout() }
end

return M
