--- bench/profile/puc_overhead.lua - the cost of pe.profile's hook mode on PUC Lua.
--   lua5.4 bench/profile/puc_overhead.lua [ROUNDS] [FREQ]
--   lua5.1 bench/profile/puc_overhead.lua [ROUNDS] [FREQ]
-- A CPU-bound loop 17 frames deep is run once per round with no profile
-- and once under each configuration (C leaf only, hook="signal",
-- hook="signal" with hook_leaf=false (5.4: no popped leaf noted at signal
-- time), hook="count"), in the same process and in a rotating order. It prints
-- the change of the median and of the minimum CPU time (os.clock) of each
-- against no profile, and the capture time the hook measured itself.
-- Run from the repository root. The figures in bench/README.md come
-- from here.
local build = os.getenv("PE_BUILD") or ("build/" .. _VERSION:gsub("Lua ", "lua"))
package.cpath = build .. "/?.so;" .. package.cpath
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path

if rawget(_G, "jit") then
  io.stderr:write("PUC Lua only: on LuaJIT pe.profile uses no hook\n")
  os.exit(2)
end

local pe = require("perf_event")

local rounds = tonumber(arg[1] or "40")
local freq = tonumber(arg[2] or "999")

local function leaf(n)
  local s = 0
  for i = 1, n do s = s + i % 7 end
  return s
end
local function deep(d, n)
  if d == 0 then return leaf(n) end
  return deep(d - 1, n) + 0
end
local function work()
  for _ = 1, 100 do deep(16, 100000) end
end

local configs = {
  none = false,
  c = { freq = freq, lua = false },
  signal = { freq = freq, hook = "signal" },
  noleaf = { freq = freq, hook = "signal", hook_leaf = false },
  count = { freq = freq, hook = "count" },
}
local order = { "none", "c", "signal", "noleaf", "count" }
local times, ns, caps = {}, { signal = 0, noleaf = 0, count = 0 }, { signal = 0, noleaf = 0, count = 0 }
for _, k in ipairs(order) do times[k] = {} end

for r = 1, rounds do
  for i = 0, #order - 1 do
    local k = order[(i + r) % #order + 1]
    local p = configs[k] and assert(pe.profile.start(configs[k]))
    local t0 = os.clock()
    work()
    local t = os.clock() - t0
    if p then
      p:stop()
      if p.mode == "hook" then
        ns[k] = ns[k] + (p.hook_ns or 0)
        caps[k] = caps[k] + (p.ncaps or 0)
      elseif k ~= "c" then
        error(k .. ": mode " .. p.mode .. " (" .. tostring(p.reason) .. ")")
      end
    end
    local list = times[k]
    list[#list + 1] = t
  end
end

local function median_min(list)
  table.sort(list)
  return list[math.floor(#list / 2) + 1], list[1]
end
local m0, b0 = median_min(times.none)
for _, k in ipairs(order) do
  local m, b = median_min(times[k])
  local extra = ""
  if caps[k] and caps[k] > 0 then extra = ("  capture %.1f us"):format(ns[k] / caps[k] / 1e3) end
  print(("%s %d Hz %-6s median %.4f s (%+.1f%%)  min %.4f s (%+.1f%%)%s"):format(
    _VERSION, freq, k, m, 100 * (m / m0 - 1), b, 100 * (b / b0 - 1), extra))
end
