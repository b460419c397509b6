--- bench/profile/cpuclock.lua - the CPU clock the profile benches time with
-- (loaded with dofile, from the repository root): this thread's CPU time,
-- CLOCK_THREAD_CPUTIME_ID, through the FFI on LuaJIT; os.clock elsewhere.
-- os.clock is CLOCK_PROCESS_CPUTIME_ID, and while a process CPU timer runs
-- (jit.profile's ITIMER_PROF) the kernel answers it from that timer's
-- running total, which it brings up to date only at its ticks and context
-- switches: each reading is up to a tick stale (4 ms at HZ=250). Seen here:
-- 20 ms chunks of work timed with os.clock came out 8-11 % shorter while
-- jit.profile's timer ran than while it was off, and within 1 % of each
-- other on this clock. (PUC Lua has no jit.profile; pe.profile arms no
-- process CPU timer.)
local jit = rawget(_G, "jit")
if not jit then return os.clock end
local ffi = require("ffi")
ffi.cdef [[
  struct pe_bench_ts { long sec, nsec; };
  int pe_bench_clock_gettime(int clk, struct pe_bench_ts *ts) __asm__("clock_gettime");
]]
local CLOCK_THREAD_CPUTIME_ID = 3
local ts = ffi.new("struct pe_bench_ts")
local C = ffi.C
return function()
  if C.pe_bench_clock_gettime(CLOCK_THREAD_CPUTIME_ID, ts) ~= 0 then error("clock_gettime failed") end
  return tonumber(ts.sec) + tonumber(ts.nsec) * 1e-9
end
