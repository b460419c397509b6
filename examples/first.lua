-- A first measurement: count what a piece of Lua code costs.
--   luajit examples/first.lua        (from the checkout, after `make`)
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = (jit and "build/?.so;" or ("build/" .. _VERSION:gsub("Lua ", "lua") .. "/?.so;"))
  .. package.cpath

local pe = require("perf_event")

local g = assert(pe.group({ "task-clock", "page-faults", "context-switches" }))
local t = {}
for i = 1, 200000 do t[i] = tostring(i) end     -- the work being measured
assert(#t == 200000)
g:disable()
local r = g:read()
g:close()

print(("%-18s %12.3f ms"):format("task-clock", r["task-clock"] / 1e6))
print(("%-18s %12d"):format("page-faults", r["page-faults"]))
print(("%-18s %12d"):format("context-switches", r["context-switches"]))
local ev = pe.open("task-clock")
print(("read through %s"):format(ev:info().rdpmc and "rdpmc (user page)" or "read(2)"))
ev:close()
