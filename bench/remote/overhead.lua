--- bench/remote/overhead.lua [HZ [ROUNDS]] - what `luaperf record --lua -p`
-- costs an unprepared LuaJIT process (bench/remote/target.lua, pinned to
-- CPU 1) and what it costs itself (this process, pinned to CPU 0), as root.
--
-- The recording is luaperf's own session (perf_event.cli.record_remote:
-- the per-CPU cpu-clock events with the BPF program, the ring drained and
-- each chain checked and named every 100 ms), switched on and off in
-- windows of 0.5 s in ABBA order, ROUNDS rounds (default 10). The target
-- writes each ~10 ms chunk of fixed work with its wall time; a chunk that
-- lies inside a window is that window's. Per round: the mean chunk of the
-- sampled windows against the unsampled ones; the median over the rounds
-- is the slowdown. This process's CPU time (os.clock) in the sampled
-- windows, over their length, is luaperf's own share of a core, after a
-- first sampled window that reads the target's names (its cost printed
-- apart).
-- Run from the repository root; the figures in bench/README.md come from here.
package.cpath = "build/?.so;" .. package.cpath
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path

local core = require("perf_event.core")
local remote = require("perf_event.cli.record_remote")

local hz = tonumber(arg[1]) or 99
local rounds = tonumber(arg[2]) or 10
local WINDOW = 0.5

local ok, why = remote.available(core)
if not ok then io.stderr:write("bench/remote: ", why, "\n") os.exit(2) end

local dir = io.popen("mktemp -d"):read("*l")
local secs = rounds * 4 * WINDOW + 3
os.execute(("taskset -c 1 luajit bench/remote/target.lua %s/chunks %d & echo $! > %s/pid"):format(dir, secs, dir))
os.execute("taskset -p -c 0 " .. require("perf_event.fs").read("/proc/self/stat"):match("^%d+") .. " >/dev/null")
os.execute("sleep 1")   -- the target's warm-up chunks
local pid = tonumber(io.open(dir .. "/pid"):read("*l"))

local s = { o = { events = {}, cmd = {} }, c = core, pids = { pid }, freq = hz, cmdname = "bench" }
local sess, err = remote.start(s)
if not sess then io.stderr:write("bench/remote: ", tostring(err), "\n") os.exit(2) end
local samples = 0
local function count() samples = samples + 1 end

-- a first window of 0.3 s not counted: the names of the target's builtins
-- and C functions are read (its package.loaded) at the first sample
local w0 = os.clock()
sess.enable()
core.wait_events({}, 300)
sess.take(count)
sess.disable()
sess.take(count)
local warm = os.clock() - w0
samples = 0

-- the windows: {t0, t1 (CLOCK_MONOTONIC, s), on}
local windows, own_cpu, on_time = {}, 0, 0
for _ = 1, rounds do
  for _, on in ipairs({ false, true, true, false }) do
    local t0, c0 = core.now(), os.clock()
    if on then sess.enable() end
    while core.now() - t0 < WINDOW do
      core.wait_events({}, 100)   -- (record's loop: a drain every 100 ms)
      if on then sess.take(count) end
    end
    if on then sess.disable() sess.take(count) end
    local t1 = core.now()
    if on then own_cpu, on_time = own_cpu + os.clock() - c0, on_time + t1 - t0 end
    windows[#windows + 1] = { t0, t1, on }
  end
end
sess.stop(count)
-- the target's file, written when it ends
local text
for _ = 1, 10 * (secs + 10) do
  local f = io.open(dir .. "/chunks")
  text = f and f:read("*a")
  if f then f:close() end
  if text and text:find("\n$") then break end
  os.execute("sleep 0.1")
end
os.execute("kill " .. pid .. " 2>/dev/null; rm -rf " .. dir)

local chunks = {}
for t_end, wall in (text or ""):gmatch("(%d+) (%d+)") do
  chunks[#chunks + 1] = { tonumber(t_end) / 1e9, tonumber(wall) / 1e9 }
end
-- each round's sampled mean over its unsampled mean
local ratios = {}
for r = 0, rounds - 1 do
  local sum, n = { [true] = 0, [false] = 0 }, { [true] = 0, [false] = 0 }
  for k = 1, 4 do
    local w = windows[r * 4 + k]
    for _, c in ipairs(chunks) do
      if c[1] - c[2] >= w[1] and c[1] <= w[2] then sum[w[3]], n[w[3]] = sum[w[3]] + c[2], n[w[3]] + 1 end
    end
  end
  if n[true] > 0 and n[false] > 0 then ratios[#ratios + 1] = (sum[true] / n[true]) / (sum[false] / n[false]) end
end
table.sort(ratios)
local med = ratios[math.floor((#ratios + 1) / 2)]
print(string.format("%d Hz: target slowed %+.2f %% (median of %d rounds; %+.2f .. %+.2f %%), %d samples "
                    .. "(%.0f/s sampled), %d failed the check; luaperf's own CPU %.2f %% of a core "
                    .. "(and %.0f ms at the first samples: the target's names)",
                    hz, med and 100 * (med - 1) or 0 / 0, #ratios, 100 * ((ratios[1] or 1) - 1),
                    100 * ((ratios[#ratios] or 1) - 1), samples, samples / on_time, sess.failed,
                    100 * own_cpu / on_time, 1000 * warm))
