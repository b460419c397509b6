--- bench/profile/safepoint.lua - the cost of pe.profile's safe-point stacks on LuaJIT.
--   luajit bench/profile/safepoint.lua [ROUNDS]
-- A fixed workload (string.format/upper, gsub with a callback, table.sort
-- with a Lua comparator, a pcall/error loop, an allocating loop and a
-- plain compiled loop, under a few frames) runs once per round under each
-- configuration, in the same process and in a rotating order: no profile;
-- jit.profile("li1") with a dumpstack per sample (what -jp does), and at
-- 100 Hz with lines ("li10") and functions ("fi10"); pe.profile at 999 Hz,
-- 99 Hz and 9999 Hz (safe point, mode "l"; the last one's time over its
-- samples gives a cost per sample above the noise); at 999 Hz and 99 Hz
-- with lj_mode "f"; no stacks at all (C leaf frames only) at 9999 Hz.
-- It prints each one's median and
-- minimum CPU time (this thread's) against no profile, the capture's own time
-- per sample, and pe.profile's start time and Lua heap growth (median
-- of the rounds). Run from the repository root; bench/README.md's figures
-- come from here.
local build = os.getenv("PE_BUILD") or "build"
package.cpath = build .. "/?.so;" .. package.cpath
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path

local jit = rawget(_G, "jit")
if not jit then
  io.stderr:write("LuaJIT only (bench/profile/puc_overhead.lua is for PUC Lua)\n")
  os.exit(2)
end

local pe = require("perf_event")
local jprofile = require("jit.profile")
local clock = dofile("bench/profile/cpuclock.lua")   -- (not os.clock: see there)
local sformat = string.format

local rounds = tonumber(arg[1] or "15")

local W = dofile("bench/profile/workload.lua")
local deep = W.deep
local function work()
  for _ = 1, 4 do
    for _, s in ipairs(W.SLICES) do deep(8, s[1], s[2]) end
  end
end

local stats = {}
-- opts.name names the configuration (taken out: not an option of start)
local function pe_cfg(opts)
  local name = opts.name
  local popts = {}
  for k, v in pairs(opts) do if k ~= "name" then popts[k] = v end end
  return function()
    local t0, m0 = clock(), collectgarbage("count")
    local p = assert(pe.profile.start(popts))
    local st = stats[name] or { start = {}, heap = {}, cap = {} }
    stats[name] = st
    st.start[#st.start + 1] = (clock() - t0) * 1000
    st.heap[#st.heap + 1] = collectgarbage("count") - m0
    return function()
      p:stop()
      if p.capture_ns then st.cap[#st.cap + 1] = p.capture_ns end
      st.walk = p.walk
      st.samples = (st.samples or 0) + p.nsamples
    end
  end
end

local configs = {
  { "none", function() return function() end end },
  { "jit.profile li1 + dumpstack", function()
      local n = 0
      jprofile.start("li1", function(th, samples)
        n = n + samples
        jprofile.dumpstack(th, "pl;", -100)
      end)
      return function() jprofile.stop() end
    end },
  -- LuaJIT's own profiler at ~100 Hz, with lines and with functions only:
  -- what its line checks cost at a low rate
  { "jit.profile li10 + dumpstack", function()
      jprofile.start("li10", function(th) jprofile.dumpstack(th, "pl;", -100) end)
      return function() jprofile.stop() end
    end },
  { "jit.profile fi10 + dumpstack", function()
      jprofile.start("fi10", function(th) jprofile.dumpstack(th, "pl;", -100) end)
      return function() jprofile.stop() end
    end },
  { "pe 999 Hz", pe_cfg({ freq = 999, name = "pe 999 Hz" }) },
  { "pe 99 Hz", pe_cfg({ freq = 99, name = "pe 99 Hz" }) },
  { "pe 99 Hz mode f", pe_cfg({ freq = 99, lj_mode = "f", name = "pe 99 Hz mode f" }) },
  -- the fd's signal (a wakeup per sample) instead of sigtrap's SIGTRAP
  { "pe 999 Hz F_SETSIG", pe_cfg({ freq = 999, sigtrap = false, name = "pe 999 Hz F_SETSIG" }) },
  -- 10x the samples: the cost per sample shows above the noise
  { "pe 9999 Hz", pe_cfg({ freq = 9999, name = "pe 9999 Hz" }) },
  { "pe 9999 Hz F_SETSIG", pe_cfg({ freq = 9999, sigtrap = false, name = "pe 9999 Hz F_SETSIG" }) },
  -- no signal at all (C leaf frames only): the kernel's sampling alone
  { "pe 9999 Hz no stacks", pe_cfg({ freq = 9999, stacks = false, name = "pe 9999 Hz no stacks" }) },
  { "pe 999 Hz mode f", pe_cfg({ freq = 999, lj_mode = "f", name = "pe 999 Hz mode f" }) },
}

local times = {}
for _, c in ipairs(configs) do times[c[1]] = {} end
work()   -- warm up: traces compiled once
for r = 1, rounds do
  for k = 0, #configs - 1 do
    local c = configs[(r + k) % #configs + 1]
    collectgarbage()
    local stop = c[2]()
    local t0 = clock()
    work()
    local dt = clock() - t0
    stop()
    local t = times[c[1]]
    t[#t + 1] = dt
  end
end

local function median(t)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  if #s == 0 then return 0 end
  return #s % 2 == 1 and s[(#s + 1) / 2] or (s[#s / 2] + s[#s / 2 + 1]) / 2
end
local function min(t)
  local m = math.huge
  for _, v in ipairs(t) do if v < m then m = v end end
  return m
end

local base_med, base_min = median(times.none), min(times.none)
print(sformat("%d rounds; no profile: median %.3f s, min %.3f s of CPU", rounds, base_med, base_min))
for _, c in ipairs(configs) do
  local name = c[1]
  if name ~= "none" then
    local t = times[name]
    local line = sformat("%-26s median %+6.1f %%  min %+6.1f %%", name, 100 * (median(t) / base_med - 1),
                         100 * (min(t) / base_min - 1))
    local st = stats[name]
    if st then
      local per = st.samples / rounds
      line = line .. sformat("  start %.2f ms  heap %+.0f KB  capture %.2f us/sample  %d samples/round"
                             .. "  => %.1f us of CPU per sample (median)  (%s)",
                             median(st.start), median(st.heap), median(st.cap) / 1000, per,
                             (median(t) - base_med) / per * 1e6, tostring(st.walk))
    end
    print(line)
  end
end
