--- bench/profile/overhead.lua - what a Lua-level profile costs the profiled code.
--   luajit bench/profile/overhead.lua [ROUNDS] [SECONDS]
--   lua5.4 bench/profile/overhead.lua [ROUNDS] [SECONDS]   (also lua5.1)
--   luajit bench/profile/overhead.lua --once MODE [SECONDS] (one run, for valgrind)
-- In ONE process, each round runs the same CPU-bound workload once per mode,
-- in a rotating order: no profile; on LuaJIT, jit.profile at 1 ms ("i1")
-- whose callback takes a full stack dump; pe.profile at 999 Hz; pe.profile
-- at 99 Hz. The workload mixes builtins (string.format, table.concat),
-- callbacks from C (table.sort's comparator, string.gsub's function), GC
-- (small tables) and a 17-deep call chain; one run takes about SECONDS of
-- CPU (0.2). Before every run the JIT is flushed, so each mode compiles its
-- traces again as pe.profile.start's flush makes it do. It prints, per mode,
-- the median and minimum CPU time (this thread's: bench/profile/cpuclock.lua
-- says why not os.clock) and the median's ratio to the
-- unprofiled median of the same process; for pe.profile also the median
-- wall time of start and of stop and the Lua heap's growth (after a full
-- collect) across start and across the whole profile. The first start
-- (self-tests) is timed on its own. us/samp is the median's excess over
-- the unprofiled median divided by the median sample count: CPU time per
-- sample (only a sign on a noisy machine: see the min column). Run from the repository root
-- (PE_BUILD=build/asan for the ASan core). The figures in
-- bench/README.md come from here.
local jit = rawget(_G, "jit")
local build = os.getenv("PE_BUILD") or (jit and "build" or ("build/" .. _VERSION:gsub("Lua ", "lua")))
package.cpath = build .. "/?.so;" .. package.cpath
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path

local pe = require("perf_event")
local core = require("perf_event.core")

local clock, now = dofile("bench/profile/cpuclock.lua"), core.now
local format, gsub, upper = string.format, string.gsub, string.upper
local sort, concat = table.sort, table.concat
local collectgarbage = collectgarbage

-- ------------------------------------------------------------ the workload

local function by_k(a, b) return a.k < b.k end
local function shout(w)
  if #w > 4 then return upper(w) end
  return w
end
local function leaf(n)
  local acc = 0
  for i = 1, n do
    local t = {}
    for j = 1, 24 do t[j] = { k = (i * j * 7919) % 257 } end
    sort(t, by_k)
    local s = format("%d:%d:%.3f", i, t[1].k, i / 3)
    s = gsub("alpha beta gamma " .. s, "%a+", shout)
    acc = acc + #s + #concat({ s, s, s }, ",")
  end
  return acc
end
local function chain(d, n)
  if d == 0 then return leaf(n) end
  return chain(d - 1, n) + 0
end
local function work(n)
  local acc = 0
  for _ = 1, 8 do acc = acc + chain(16, n) end
  return acc
end

-- ------------------------------------------------------------ modes

local jp = jit and require("jit.profile")
local jp_samples = 0
local function jp_cb(th, samples)
  local s = jp.dumpstack(th, "pl;", -100)
  if #s > 0 then jp_samples = jp_samples + samples end
end

-- (freq nil: one sample per 100 s of CPU, none in a run)
local function pe_mode(freq, lj_mode)
  return {
    start = function()
      local p, err = pe.profile.start({ freq = freq, period = not freq and 1e11 or nil, lj_mode = lj_mode })
      if not p then error("pe.profile.start: " .. tostring(err)) end
      return p
    end,
    stop = function(p) p:stop(); return p.nsamples end,
  }
end

local MODES = {
  none = { start = function() return true end, stop = function() return 0 end },
  jitprof = jp and {
    start = function() jp_samples = 0; jp.start("i1", jp_cb); return true end,
    stop = function() jp.stop(); return jp_samples end,
  },
  pe999 = pe_mode(999),
  pe99 = pe_mode(99),
  -- (for callgrind, --once only: armed, one sample per 100 s, so none in
  -- the run (at 1 Hz, a run under valgrind took one, and its drain and
  -- naming counted for the work); what LuaJIT's line checks in the traces
  -- cost the work itself)
  pearm = pe_mode(nil),
  -- the same with lj_mode "f" (LuaJIT: checks at function changes only)
  pearmf = pe_mode(nil, jit and "f"),
  pe99f = pe_mode(99, jit and "f"),
  -- (--once only: LuaJIT's own profiler armed with no sample in the run, its
  -- 100 s interval: what its trace checks cost, mode "l" and mode "f")
  jparml = jp and {
    start = function() jp_samples = 0; jp.start("li100000", jp_cb); return true end,
    stop = function() jp.stop(); return jp_samples end,
  },
  jparmf = jp and {
    start = function() jp_samples = 0; jp.start("fi100000", jp_cb); return true end,
    stop = function() jp.stop(); return jp_samples end,
  },
}
local ORDER = jp and { "none", "jitprof", "pe999", "pe99" } or { "none", "pe999", "pe99" }
local LABEL = { none = "no profile", jitprof = "jit.profile i1 + dumpstack",
                pe999 = "pe.profile 999 Hz", pe99 = "pe.profile 99 Hz" }

local function full_collect()
  collectgarbage("collect")
  collectgarbage("collect")
  return collectgarbage("count")
end

-- one run of the workload under mode k: the figures of that run
local function run(k, n)
  local mode = MODES[k]
  if jit then jit.flush() end
  local heap0 = full_collect()
  local w0 = now()
  local p = mode.start()
  local t_start = now() - w0
  local heap1 = full_collect()
  local c0 = clock()
  work(n)
  local cpu = clock() - c0
  local w1 = now()
  local nsamp = mode.stop(p)
  local t_stop = now() - w1
  local heap2 = full_collect()
  return { cpu = cpu, t_start = t_start, t_stop = t_stop, nsamp = nsamp,
           dheap_start = heap1 - heap0, dheap_all = heap2 - heap0 }
end

local function median(list)
  local s = {}
  for i, v in ipairs(list) do s[i] = v end
  sort(s)
  local m = #s
  if m % 2 == 1 then return s[(m + 1) / 2] end
  return (s[m / 2] + s[m / 2 + 1]) / 2
end
local function minimum(list)
  local m = math.huge
  for _, v in ipairs(list) do if v < m then m = v end end
  return m
end

-- n such that work(n) takes about `secs` of CPU
local function calibrate(secs)
  local n, t = 1, 0
  while t < 0.05 do
    n = n * 2
    local c0 = clock()
    work(n)
    t = clock() - c0
  end
  for _ = 1, 2 do
    n = math.max(1, math.floor(n * secs / t + 0.5))
    local c0 = clock()
    work(n)
    t = clock() - c0
  end
  return math.max(1, math.floor(n * secs / t + 0.5))
end

-- ------------------------------------------------------------ main

local interp = jit and "LuaJIT " .. jit.version:gsub("^LuaJIT ", "") or _VERSION

if arg[1] == "--once" then
  -- one run of one mode: for `valgrind --tool=callgrind`, whose instruction
  -- counts of two such runs give the profile's cost without timer noise
  local k = arg[2] or "none"
  if not MODES[k] then
    error("unknown mode " .. k .. " (none, jitprof, pe999, pe99, pearm, pearmf, pe99f, jparml, jparmf)")
  end
  local n = tonumber(arg[3] or "0") or 0
  if n <= 0 then n = calibrate(0.2) end
  local warm = pe.profile.start({ freq = 99 })   -- the self-tests, outside the run
  if warm then warm:stop() end
  local r = run(k, n)
  print(format("%s %s n=%d cpu %.4f s samples %d", interp, k, n, r.cpu, r.nsamp))
  return
end

if arg[1] == "--paired" then
  -- The paired bench: per-sample costs resolved below a shared VM's noise.
  -- Each profiler is armed once per round (its traces compiled with its
  -- checks, sampling off), then its sampling is switched on and off for
  -- chunks of the workload (~CHUNK s of CPU each) in ABBA order, so that
  -- each "on" chunk has an "off" neighbour run under the same traces, the
  -- same heap and nearly the same moment of the VM's steal. The excess of
  -- the on chunks over the off chunks is the samples' cost: the kernel's
  -- (timer interrupt, sample, signal) and the profiler's (handler, trace
  -- exit, capture, and the caches they disturb). What an armed profiler
  -- costs with no sample (its traces' checks) is not in it: `--once` under
  -- callgrind counts that (run.sh). Phases: "none" (no profiler: both
  -- chunks plain, the noise's own figure, which should be 0 within its se),
  -- pe.profile at 999 and 99 Hz (its event enabled and disabled), and on
  -- LuaJIT jit.profile "li1" with a dumpstack per sample (its ITIMER_PROF
  -- armed and disarmed by setitimer: ~250 samples a second at HZ=250).
  --   luajit bench/profile/overhead.lua --paired [ROUNDS] [PAIRS] [CHUNK]
  local rounds_p = tonumber(arg[2] or "8")
  local npairs = tonumber(arg[3] or "25")
  local chunk = tonumber(arg[4] or "0.02")
  local cn = calibrate(chunk)
  work(cn)
  local itimer
  if jp then
    local ffi = require("ffi")
    ffi.cdef[[
      struct pe_bench_itv { long isec, iusec, vsec, vusec; };
      int pe_bench_setitimer(int which, const struct pe_bench_itv *nv, struct pe_bench_itv *ov)
        __asm__("setitimer");
    ]]
    local on, off = ffi.new("struct pe_bench_itv", 0, 1000, 0, 1000), ffi.new("struct pe_bench_itv")
    itimer = function(enable) assert(ffi.C.pe_bench_setitimer(2, enable and on or off, nil) == 0) end
  end
  -- phase: arm() -> toggle(enable), disarm() -> samples taken
  local function pe_phase(freq)
    local mode, p = pe_mode(freq)
    return {
      arm = function() p = mode.start() assert(p.ev:disable()) end,
      toggle = function(on) if on then assert(p.ev:enable()) else assert(p.ev:disable()) end end,
      disarm = function() return mode.stop(p) end,
    }
  end
  local PHASES = {
    none = { arm = function() end, toggle = function() end, disarm = function() return 0 end },
    pe999 = pe_phase(999),
    pe99 = pe_phase(99),
    jitprof = jp and {
      arm = function() jp_samples = 0 jp.start("li1", jp_cb) itimer(false) end,
      toggle = itimer,
      disarm = function() jp.stop() return jp_samples end,
    },
  }
  local PORDER = jp and { "none", "pe999", "pe99", "jitprof" } or { "none", "pe999", "pe99" }
  local PLABEL = { none = "no profiler (on = off)", pe999 = LABEL.pe999, pe99 = LABEL.pe99,
                   jitprof = "jit.profile li1 + dumpstack" }
  local acc = {}
  for _, k in ipairs(PORDER) do acc[k] = { on = 0, off = 0, d = {}, samples = 0 } end
  local function timed(ph, on)
    if on then ph.toggle(true) end
    local c0 = clock()
    work(cn)
    local t = clock() - c0
    if on then ph.toggle(false) end
    return t
  end
  for r = 1, rounds_p do
    for i = 0, #PORDER - 1 do
      local k = PORDER[(i + r) % #PORDER + 1]
      local ph, a = PHASES[k], acc[k]
      if jit then jit.flush() end
      ph.arm()
      for _ = 1, 3 do work(cn) end      -- the traces, with the profiler's checks
      for j = 1, npairs do
        local on, off
        if j % 2 == 1 then on = timed(ph, true) off = timed(ph, false)
        else off = timed(ph, false) on = timed(ph, true) end
        a.on, a.off = a.on + on, a.off + off
        a.d[#a.d + 1] = on - off
      end
      a.samples = a.samples + ph.disarm()
    end
  end
  print(format("%s, paired: %d rounds x %d pairs of %.0f ms chunks (workload n=%d)",
               interp, rounds_p, npairs, acc.none.off / (rounds_p * npairs) * 1e3, cn))
  print(format("%-30s %9s %7s %9s %10s %8s %7s", "profiler", "on vs off", "se", "median", "samples/s", "us/samp", "se"))
  for _, k in ipairs(PORDER) do
    local a = acc[k]
    local n = #a.d
    local mean = (a.on - a.off) / n
    local v = 0
    for _, x in ipairs(a.d) do v = v + (x - mean) ^ 2 end
    local se = math.sqrt(v / (n - 1) / n)
    local off1 = a.off / n
    local rate = a.samples / a.on
    local per = a.samples > 0 and a.samples / n
    print(format("%-30s %+8.2f%% %6.2f%% %+8.2f%% %10s %8s %7s", PLABEL[k], mean / off1 * 100, se / off1 * 100,
                 median(a.d) / off1 * 100, per and format("%.0f", rate) or "-",
                 per and format("%.1f", mean / per * 1e6) or "-", per and format("%.1f", se / per * 1e6) or "-"))
  end
  return
end

local rounds = tonumber(arg[1] or "11")
local secs = tonumber(arg[2] or "0.2")

local w0 = now()
local first = pe.profile.start({ freq = 999 })
local t_first = now() - w0
if not first then error("pe.profile.start failed") end
local first_mode = first.mode
first:stop()

local n = calibrate(secs)
work(n)

local res = {}
for _, k in ipairs(ORDER) do res[k] = {} end
for r = 1, rounds do
  for i = 0, #ORDER - 1 do
    local k = ORDER[(i + r) % #ORDER + 1]
    local list = res[k]
    list[#list + 1] = run(k, n)
  end
end

local function col(k, field)
  local out = {}
  for i, r in ipairs(res[k]) do out[i] = r[field] end
  return out
end

print(format("%s, %d rounds, workload n=%d (%.2f s unprofiled), pe.profile mode %s",
             interp, rounds, n, median(col("none", "cpu")), tostring(first_mode)))
print(format("first pe.profile.start (self-tests included): %.1f ms wall", t_first * 1e3))
print(format("%-27s %9s %9s %8s %8s %9s %9s %9s %9s %9s",
             "mode", "median s", "min s", "ratio", "samples", "us/samp", "start ms", "stop ms", "heap+st",
             "heap+all"))
local m0 = median(col("none", "cpu"))
for _, k in ipairs(ORDER) do
  local m = median(col(k, "cpu"))
  local ns = median(col(k, "nsamp"))
  local is_pe = k == "pe999" or k == "pe99"
  print(format("%-27s %9.4f %9.4f %8.3f %8d %9s %9s %9s %9s %9s", LABEL[k], m, minimum(col(k, "cpu")), m / m0,
               math.floor(ns + 0.5), ns > 0 and format("%.1f", (m - m0) / ns * 1e6) or "-",
               is_pe and format("%.2f", median(col(k, "t_start")) * 1e3) or "-",
               is_pe and format("%.2f", median(col(k, "t_stop")) * 1e3) or "-",
               is_pe and format("%.0fK", median(col(k, "dheap_start"))) or "-",
               is_pe and format("%.0fK", median(col(k, "dheap_all"))) or "-"))
end
