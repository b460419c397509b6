--- bench/profile/sample_cost.lua - where a safe-point sample's CPU goes, in-process.
--   luajit bench/profile/sample_cost.lua [ROUNDS] [HZ]
-- A fixed workload (string.format/upper, gsub with a callback, table.sort
-- with a Lua comparator, pcall/error, allocation, a plain loop, under 8
-- frames) runs once per round under each configuration, in a rotating
-- order, each drained every 100 ms of CPU as the nginx sampler's timer
-- does:
--   none     no event
--   kernel   an event as pe.profile's safe point opens it (ip|tid|time, a
--            wakeup per sample) with no signal: the kernel's own sampling;
--            its ring read by ev:records() (timed, and taken off)
--   safe     pe.profile{keep=false} at HZ (default 9999, so that the cost
--            per sample stands out of the noise)
--   keep     pe.profile{} (keep=true) at HZ
-- Per sample (medians over the rounds, CPU time from os.clock):
--   total    (safe's CPU - none's) / its samples
--   kernel   (kernel's CPU - none's - its ring reads) / its samples
--   drain    the drains' CPU / samples (os.clock around p:drain())
--   handler  the signal handler's own time (p.handler_ns, CLOCK_MONOTONIC
--            inside it), capture its time (p.capture_ns) per capture
--   rest     total - kernel - drain - handler - capture: the signal's
--            delivery and return, the trace exits at the next line check
-- Run from the repository root (PE_BUILD=dir for another build).
local build = os.getenv("PE_BUILD") or "build"
package.cpath = build .. "/?.so;" .. package.cpath
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path

local jit = rawget(_G, "jit")
if not jit then
  io.stderr:write("LuaJIT only\n")
  os.exit(2)
end

local pe = require("perf_event")
local clock = os.clock
local sformat = string.format

local rounds = tonumber(arg[1] or "7")
local HZ = tonumber(arg[2] or "9999")

local W = dofile("bench/profile/workload.lua")
local deep = W.deep

-- the workload in slices; drain() every 100 ms of CPU, its own time summed
local function work(drain)
  local spent, next_t = 0, clock() + 0.1
  for _ = 1, 4 do
    for _, s in ipairs(W.SLICES) do
      for _ = 1, 4 do
        deep(8, s[1], s[2] / 4)
        if clock() >= next_t then
          local t0 = clock()
          drain()
          local t1 = clock()
          spent = spent + (t1 - t0)
          next_t = t1 + 0.1
        end
      end
    end
  end
  return spent
end

local function nothing() end

local configs = {
  none = function() return nothing, function() return 0 end end,
  kernel = function()
    local ev = assert(pe.open({ event = "cpu-clock", exclude_kernel = true, exclude_hv = true,
                                use_clockid = true, clockid = "monotonic", sample_type = "ip|tid|time",
                                wakeup_events = 1, freq = true, sample_freq = HZ }, { pages = 512 }))
    local n = 0
    local function drain()
      for rec in ev:records() do if rec.type == "sample" then n = n + 1 end end
    end
    assert(ev:enable())
    return drain, function() drain() ev:close() return n end
  end,
}
local last = {}
local function pe_cfg(name, opts)
  configs[name] = function()
    local p = assert(pe.profile.start(opts))
    assert(p.walk == "safepoint", "not the safe point: " .. tostring(p.stacks_reason))
    return function() p:drain() end, function()
      local t0 = clock()
      p:stop()
      last[name] = { p = p, stop = clock() - t0 }
      return p.nsamples
    end
  end
end
pe_cfg("safe", { freq = HZ, keep = false })
pe_cfg("keep", { freq = HZ })

local order = { "none", "kernel", "safe", "keep" }
local res = {}
for _, k in ipairs(order) do res[k] = { cpu = {}, drain = {}, n = {}, h = {}, c = {} } end
work(nothing)   -- warm up: traces compiled once
for r = 1, rounds do
  for k = 0, #order - 1 do
    local name = order[(r + k) % #order + 1]
    collectgarbage()
    local drain, stop = configs[name]()
    local t0 = clock()
    local spent = work(drain)
    local t1 = clock()
    local n = stop()
    local dt = t1 - t0 + (last[name] and last[name].stop or 0)
    local e = res[name]
    e.cpu[#e.cpu + 1] = dt
    e.drain[#e.drain + 1] = spent + (last[name] and last[name].stop or 0)
    e.n[#e.n + 1] = n
    local p = last[name] and last[name].p
    if p then
      e.h[#e.h + 1] = p.handler_ns or 0
      e.c[#e.c + 1] = p.capture_ns or 0
    end
    last[name] = nil
  end
end

local function median(t)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  local n = #s
  if n == 0 then return 0 end
  return n % 2 == 1 and s[(n + 1) / 2] or (s[n / 2] + s[n / 2 + 1]) / 2
end

local none = median(res.none.cpu)
local function load()
  local f = io.open("/proc/loadavg")
  local l = f and f:read("*l") or "?"
  if f then f:close() end
  return l
end
print(sformat("%d rounds at %d Hz; none %.3f s CPU a round; loadavg %s", rounds, HZ, none, load()))
local kper = {}
for i = 1, rounds do
  local e = res.kernel
  kper[i] = (e.cpu[i] - none - e.drain[i]) / e.n[i] * 1e6
end
print(sformat("kernel: %.2f us/sample (its ring reads %.2f us/sample taken off), %d samples a round",
              median(kper), median(res.kernel.drain) / median(res.kernel.n) * 1e6, median(res.kernel.n)))
for _, name in ipairs({ "safe", "keep" }) do
  local e = res[name]
  local tot, dr, share = {}, {}, {}
  for i = 1, rounds do
    tot[i] = (e.cpu[i] - none) / e.n[i] * 1e6
    dr[i] = e.drain[i] / e.n[i] * 1e6
    share[i] = (e.cpu[i] / none - 1) * 100
  end
  local t, d, h, c = median(tot), median(dr), median(e.h) / 1e3, median(e.c) / 1e3
  print(sformat("%-6s %d samples a round, +%.1f %% CPU: total %.2f us/sample = kernel %.2f + drain %.2f"
                .. " + handler %.2f + capture %.2f + rest %.2f; library's own (total - kernel) %.2f us",
                name, median(e.n), median(share), t, median(kper), d, h, c, t - median(kper) - d - h - c,
                t - median(kper)))
end
