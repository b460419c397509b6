--- bench/remote/target.lua OUT SECONDS - the unprepared target of
-- bench/remote/overhead.lua: plain LuaJIT (nothing of perf_event loaded),
-- running bench/profile/workload.lua's slices in chunks of fixed work
-- under 8 frames, and writing each chunk's end (CLOCK_MONOTONIC, ns) and
-- its wall time (ns) to OUT, one line a chunk, until SECONDS have passed.
local ffi = require("ffi")
ffi.cdef [[
typedef struct { long tv_sec, tv_nsec; } pe_bench_ts;
int clock_gettime(int clk, pe_bench_ts *ts);
]]
local ts = ffi.new("pe_bench_ts")
local function now()
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) * 1e9 + tonumber(ts.tv_nsec)
end
local out, secs = assert(io.open(arg[1], "w")), tonumber(arg[2]) or 10
local W = dofile("bench/profile/workload.lua")
local deep = W.deep
-- a chunk: each slice at a tenth of its size (~10 ms on a 2-vCPU VM)
local function chunk()
  for _, s in ipairs(W.SLICES) do deep(8, s[1], s[2] / 10) end
end
for _ = 1, 20 do chunk() end    -- traces compiled before the first window
local t_end = now() + secs * 1e9
local lines = {}
while true do
  local t0 = now()
  chunk()
  local t1 = now()
  lines[#lines + 1] = string.format("%.0f %.0f", t1, t1 - t0)
  if t1 > t_end then break end
end
out:write(table.concat(lines, "\n"), "\n")
out:close()
