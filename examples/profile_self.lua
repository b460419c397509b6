-- Sample this process and name its own samples with pe.symbols: the
-- in-process use of the symbolizer (what examples/openresty does in nginx).
--   luajit examples/profile_self.lua
local build = os.getenv("PE_BUILD") or (jit and "build" or ("build/" .. _VERSION:gsub("Lua ", "lua")))
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = build .. "/?.so;" .. package.cpath

local pe = require("perf_event")

-- cpu-clock samples of this thread, with user call chains, at 2 kHz or the
-- kernel's current limit if that is lower (it lowers it by itself under load)
local hz = math.min(2000, pe.sysctl().max_sample_rate)
local ev = assert(pe.open({ type = "software", config = 0, name = "cpu-clock", freq = true,
                            sample_freq = hz, sample_type = "ip|tid|time|callchain" }))
-- work in C library code (string building, copying), so frames have names
local s = ""
for i = 1, 3000 do s = (s .. string.rep("x", 300)):sub(1, 400000) .. i end
ev:disable()

local sym = pe.symbols.new()
sym:load_maps("self")                          -- this process's mappings
local counts, total = {}, 0
for rec in ev:records() do
  if rec.type == "sample" then
    local frames = sym:callchain(rec.callchain, rec.pid)   -- leaf first
    local leaf = frames[1] or sym:name(rec.ip, rec.pid)
    counts[leaf] = (counts[leaf] or 0) + 1
    total = total + 1
  end
end
ev:close()

local names = {}
for k in pairs(counts) do names[#names + 1] = k end
table.sort(names, function(a, b) return counts[a] > counts[b] end)
print(("%d samples; hottest functions:"):format(total))
for i = 1, math.min(5, #names) do
  print(("%6d  %s"):format(counts[names[i]], names[i]))
end
