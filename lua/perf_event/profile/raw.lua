--- perf_event.profile.raw: the machine-level reads the profile is built on
-- (not a public interface): the samples' clock, an object's address, a
-- word of memory, LuaJIT's GCfuncL.pc offset and the x86-64 register bits
-- of LuaJIT's VM state (luaperf record --lua asks for them).
-- @module perf_event.profile.raw

local format = string.format
local tonumber, pcall, rawget, require = tonumber, pcall, rawget, require

local jit = rawget(_G, "jit")
local ffi, bit
if jit then
  ffi = require("ffi")
  bit = require("bit")
end

local M = {}

-- x86-64 perf register bits (asm/perf_regs.h): bx 1, dx 3, bp 6, sp 7, ip 8
local REG_BX, REG_DX, REG_BP, REG_SP, REG_IP = 1, 3, 6, 7, 8
M.REGS_MASK = 2^REG_BX + 2^REG_DX + 2^REG_BP + 2^REG_SP + 2^REG_IP

M.FN_PC_OFFSET = 32      -- GCfuncL.pc (GC64): GCHeader+ffid+nupvalues, env, gclist, pc

-- ---------------------------------------------------------------- clock

if ffi then
  -- (libc's clock_gettime under a name of our own: a program that declared
  -- clock_gettime with its own struct timespec first keeps its declaration)
  pcall(ffi.cdef, [[
    struct pe_prof_timespec { long tv_sec; long tv_nsec; };
    int pe_prof_clock_gettime(int clk, struct pe_prof_timespec *tp) __asm__("clock_gettime");
  ]])
  local ts = ffi.new("struct pe_prof_timespec")
  M.now = function()
    ffi.C.pe_prof_clock_gettime(1, ts)   -- CLOCK_MONOTONIC, the samples' clockid
    return tonumber(ts.tv_sec) * 1e9 + tonumber(ts.tv_nsec)
  end
else
  M.now = function() return 0 end
end

-- ---------------------------------------------------------------- memory

-- the object's address: LuaJIT's "%p" (tostring says "builtin#N" for
-- fast functions)
function M.addr_of(obj)
  local h = format("%p", obj):match("0x(%x+)")
  return h and tonumber(h, 16)
end

if ffi then
  M.u64p = function(a) return tonumber(ffi.cast("uint64_t *", ffi.cast("uintptr_t", a))[0]) end
  M.u32p = function(a) return bit.tobit(ffi.cast("uint32_t *", ffi.cast("uintptr_t", a))[0]) end
end

return M
