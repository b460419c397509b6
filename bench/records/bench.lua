--- bench/records: records() drain+decode throughput against a C drain+parse
-- of the same kind of records in the same run (LuaJIT).
-- Each round makes N getppid syscalls with a sys_enter_getppid tracepoint at
-- sample_period=1 (sample_type ip|tid|time|cpu|period: exactly N records),
-- drains them with the C baseline (cdrain.c through the FFI), makes N more
-- and drains them with `for rec in ev:records()` reading ip, pid, tid, time,
-- cpu and period.  Run as root from the checkout: bench/records/run.sh
local ffi = require("ffi")
local pe = require("perf_event")
local records = require("perf_event.records")

local N = tonumber(arg and arg[1]) or 20000
local ROUNDS = tonumber(arg and arg[2]) or 20

ffi.cdef [[
  long syscall(long nr, ...);
  struct bench_timespec { long tv_sec; long tv_nsec; };
  int clock_gettime(int clk, struct bench_timespec *ts);
  uint64_t cdrain(void *page, uint64_t *sum);
]]
local C = ffi.C
local cd = ffi.load(os.getenv("CDRAIN") or "build/bench/cdrain.so")
local ts = ffi.new("struct bench_timespec")
local function now()
  C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

local f = assert(io.open("/sys/kernel/tracing/events/syscalls/sys_enter_getppid/id"))
local id = tonumber(f:read("*l"))
f:close()

-- ring big enough for N 48-byte records
local pages = 1
while pages * 4096 < N * 48 * 1.1 do pages = pages * 2 end
local ev = assert(pe.open({ type = "tracepoint", config = id, sample_period = 1,
  sample_type = "ip|tid|time|cpu|period", exclude_kernel = false, disabled = true,
  name = "syscalls:sys_enter_getppid" }, { pages = pages }))
local page = ev:ring().base
local SYS_getppid = 110

local function produce(n)
  assert(ev:enable())
  for _ = 1, n do C.syscall(SYS_getppid) end
  assert(ev:disable())
end

local sum = ffi.new("uint64_t[1]")
local function c_pass()
  local t0 = now()
  local n = cd.cdrain(page, sum)
  return now() - t0, tonumber(n)
end

local reuse_t = {}
local function lua_pass(reuse)
  local t0 = now()
  local n, s = 0, 0
  for rec in ev:records(reuse and reuse_t or nil) do
    s = s + rec.ip + rec.pid + rec.tid + rec.time + rec.cpu + rec.period
    n = n + 1
  end
  return now() - t0, n
end

local function median(t)
  table.sort(t)
  return t[math.floor((#t + 1) / 2)]
end

-- per-round ns/record; the median of the rounds is reported (round 0 warms up)
local function run(label, fast, reuse)
  records.ffi = fast
  local cs, ls = {}, {}
  for r = 0, ROUNDS do
    produce(N)
    local t, n = c_pass()
    assert(n == N, "C drain saw " .. n)
    produce(N)
    local u, m = lua_pass(reuse)
    assert(m == N, "records() saw " .. m)
    if r > 0 then cs[#cs + 1] = t / n * 1e9; ls[#ls + 1] = u / m * 1e9 end
  end
  local c, l = median(cs), median(ls)
  print(("%-28s C %6.1f ns/rec (%6.1f M rec/s)   Lua %6.1f ns/rec (%6.2f M rec/s)   ratio %5.2fx")
    :format(label, c, 1e3 / c, l, 1e3 / l, l / c))
end

print(("N=%d records per round, %d rounds, ring %d pages, %s"):format(N, ROUNDS, pages, jit.version))
if records.ffi then
  if not os.getenv("ONLY_REUSE") then run("records() (FFI, new tables)", true) end
  run("records(t) (FFI, reused t)", true, true)
end
run("records() (C decoder)", false)
ev:close()
