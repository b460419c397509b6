-- Workload for spec/profile_spec.lua: three hot Lua functions, each with
-- its own loop of bytecode only (no call into C or a fast function).
-- Run as: luajit [-jp=Fi1] spec/support/profile_work.lua MODE OUT
-- MODE "jit" or "interp" (jit.off()); writes the profile's top list to OUT,
-- and each function's os.clock time ("clock alpha=S beta=S gamma=S").
package.cpath = (os.getenv("PE_BUILD") or "build") .. "/?.so;" .. package.cpath
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local mode, out = arg[1] or "jit", arg[2]
if mode == "interp" then jit.off() end
local pe = require("perf_event")

local function alpha(n)
  local s = 0
  for i = 1, n do s = s + (i % 7) * 3 end
  return s
end

local function beta(n)
  local s = 0
  for i = 1, n do s = s + (i * i) % 13 * 0.5 end
  return s
end

local function gamma(n)
  local s = 0
  for i = 1, n do s = (s * 31 + i) % 1000003 end
  return s
end

local scale = tonumber(os.getenv("PE_WORK_SCALE") or "1")
local freq = tonumber(os.getenv("PE_PROF_FREQ") or "999")
local pages = tonumber(os.getenv("PE_PROF_PAGES") or "512")
-- an 8 MiB ring needs root or CAP_IPC_LOCK; as a user, the default ring
local p = pe.profile.start({ event = "cpu-clock", freq = freq, pages = pages })
  or assert(pe.profile.start({ event = "cpu-clock", freq = freq }))
-- each call's count varies (x0.5 to x1.5, the same mean), so that a round
-- is no whole number of the kernel's ticks, at which -jp samples (see
-- spec/cli_lua_spec.lua's WORK)
local random, floor, clock = math.random, math.floor, os.clock
local function about(n) return floor(n * (0.5 + random())) end
local ta, tb, tg = 0, 0, 0
for _ = 1, 10 * scale do
  local c0 = clock()
  alpha(about(3e6))
  local c1 = clock()
  beta(about(2e6))
  local c2 = clock()
  gamma(about(3e6))
  ta, tb, tg = ta + c1 - c0, tb + c2 - c1, tg + clock() - c2
  p:drain()   -- a user's small ring would overflow over the whole run
end
p:stop()
local f = out and assert(io.open(out, "w")) or io.stdout
f:write("mode ", p.mode, " ", tostring(p.reason), "\n")
local k = p:kinds()
f:write(string.format("kinds trace=%d interp=%d caller=%d c=%d lost=%d\n", k.trace, k.interp, k.caller, k.c, p.lost))
f:write(string.format("clock alpha=%.4f beta=%.4f gamma=%.4f\n", ta, tb, tg))
for _, e in ipairs(p:top()) do f:write(string.format("top %d %s\n", e.count, e.name)) end
f:write(p:folded())
if out then f:close() end
