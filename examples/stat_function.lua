-- pe.stat: count what one Lua function costs and print it like `perf stat`.
--   luajit examples/stat_function.lua        (from the checkout, after `make`)
local build = os.getenv("PE_BUILD") or (jit and "build" or ("build/" .. _VERSION:gsub("Lua ", "lua")))
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = build .. "/?.so;" .. package.cpath

local pe = require("perf_event")

local function work(n)
  local t = {}
  for i = 1, n do t[i] = ("%d"):format(i) end   -- allocates: page faults
  for _ = 1, 25 do                               -- 25 close(2) calls
    local f = assert(io.open("/dev/null", "r"))
    f:close()
  end
  return #t
end

-- an event string when tracefs is readable (root), software events otherwise
local events = "task-clock,page-faults,context-switches"
if io.open("/sys/kernel/tracing/events/syscalls/sys_enter_close/id") then
  events = events .. ",syscalls:sys_enter_close"
end

local r, n = assert(pe.stat(work, events, { label = "work(200000)", args = { 200000 } }))
io.write(tostring(r))
print(("work returned %d; page-faults = %d"):format(n, r["page-faults"]))
if r["syscalls:sys_enter_close"] then
  print(("close(2) calls counted by the kernel: %d"):format(r["syscalls:sys_enter_close"]))
end
