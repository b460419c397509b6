-- A guided tour for teaching (doc/guide.md walks through it line by line):
-- the machine's PMUs, the perf sysctls, how an event string becomes a
-- struct perf_event_attr, one counter, one group, and the records of a
-- sampling event.
--   luajit examples/explore.lua
local build = os.getenv("PE_BUILD") or (jit and "build" or ("build/" .. _VERSION:gsub("Lua ", "lua")))
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = build .. "/?.so;" .. package.cpath

local pe = require("perf_event")
print(pe._VERSION)

-- 1. PMUs: every directory of /sys/bus/event_source/devices is one
print("\n-- PMUs (name = attr.type)")
for _, p in ipairs(pe.pmus()) do print(("%-12s type=%s"):format(p.name, tostring(p.type))) end

-- 2. the sysctls that decide what an unprivileged user may do
local sc = pe.sysctl()
print("\n-- sysctls")
print("perf_event_paranoid", sc.paranoid)
print("perf_event_max_sample_rate", sc.max_sample_rate)

-- 3. an event string is only a way to write an attr
print("\n-- attr of 'page-faults:u'")
local attr = assert(pe.attr("page-faults:u"))
for _, k in ipairs({ "type", "config", "exclude_user", "exclude_kernel", "exclude_hv" }) do
  print(("%-16s %s"):format(k, tostring(attr[k])))
end

-- 4. one counter: open, run something, read
local ev = assert(pe.open("page-faults"))
local t = {}
for i = 1, 100000 do t[i] = i end
assert(#t == 100000)
local value, enabled, running = ev:read()
print(("\n-- one counter: page-faults=%s enabled=%sns running=%sns"):format(
  tostring(value), tostring(enabled), tostring(running)))
ev:close()

-- 5. a group is read in one go, members by index and by name
local g = assert(pe.group({ "task-clock", "context-switches" }))
local r = g:read()
print(("-- group: task-clock=%sns context-switches=%s"):format(tostring(r[1]), tostring(r["context-switches"])))
g:close()

-- 6. a sampling event fills a ring buffer with records
local s = assert(pe.open({ type = "software", config = 0, name = "cpu-clock",
                           sample_period = 100000, sample_type = "ip|tid|time" }))
local x = 0
for i = 1, 3e6 do x = x + i % 7 end
s:disable()
local kinds = {}
for rec in s:records() do kinds[rec.type] = (kinds[rec.type] or 0) + 1 end
s:close()
print("\n-- records of a cpu-clock sampler (period 100 us)")
for k, n in pairs(kinds) do print(("%-8s %d"):format(k, n)) end
