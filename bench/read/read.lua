--- bench/read/read.lua - the Lua side of bench/read.
--   luajit bench/read/read.lua MODE N [route]   prints "MODE N ns_per_op"
--   MODE: read (ev:read() of task-clock), group4 (g:read(t) of a 4-event
--   group into a reused table) or group3 (g:read(t) of perf_event.openresty's
--   default group, opened by name as the module opens it); route: ffi (default on LuaJIT) or c (the
--   C API methods, also what PUC Lua uses).
-- Run from the repository root (bench/read/run does).
local build = os.getenv("PE_BUILD")
  or (jit and "build" or ("build/" .. _VERSION:gsub("Lua ", "lua")))
package.cpath = build .. "/?.so;" .. package.cpath
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path

local pe = require("perf_event")
local fast = require("perf_event.fast")

local mode = arg[1] or "read"
local n = tonumber(arg[2] or "1000000")
local route = arg[3] or (fast.available and "ffi" or "c")
if route == "ffi" and not fast.available then
  io.stderr:write("the FFI route is not available: ", tostring(fast.reason), "\n")
  os.exit(2)
end
local methods = fast[route]

local now
if jit then
  local ffi = require("ffi")
  ffi.cdef [[
    struct pe_bench_timespec { long tv_sec, tv_nsec; };
    int clock_gettime(int clk, struct pe_bench_timespec *ts);
  ]]
  local ts = ffi.new("struct pe_bench_timespec")
  now = function()
    ffi.C.clock_gettime(1, ts)    -- CLOCK_MONOTONIC
    return tonumber(ts.tv_sec) * 1e9 + tonumber(ts.tv_nsec)
  end
else
  now = function() return os.clock() * 1e9 end   -- CPU time: the loop never sleeps
end

-- the read under test: the method the user calls on the FFI route (a
-- wrapper the JIT inlines), the C API function itself on the C route
local function reader(kind)
  if route == "ffi" then return function(x, t) return x:read(t) end end
  return methods[kind].read
end

local sink = 0
local t0, t1
if mode == "read" then
  local ev = assert(pe.open({ type = 1, config = 1, name = "task-clock", exclude_kernel = true,
                              exclude_hv = true }))
  local read = reader("event")
  t0 = now()
  for _ = 1, n do sink = sink + read(ev) end
  t1 = now()
  ev:close()
elseif mode == "group4" or mode == "group3" then
  local g
  if mode == "group4" then
    g = assert(pe.group({
      { type = 1, config = 1, name = "task-clock", exclude_kernel = true, exclude_hv = true },
      { type = 1, config = 2, name = "page-faults", exclude_kernel = true, exclude_hv = true },
      { type = 1, config = 3, name = "context-switches", exclude_kernel = true, exclude_hv = true },
      { type = 1, config = 4, name = "cpu-migrations", exclude_kernel = true, exclude_hv = true },
    }))
  else
    g = assert(pe.group({ "task-clock", "page-faults", "context-switches" }))
  end
  local read = reader("group")
  local t = {}
  t0 = now()
  for _ = 1, n do read(g, t); sink = sink + t[1] end
  t1 = now()
  g:close()
else
  error("unknown mode " .. tostring(mode))
end
assert(sink > 0)
print(("%s %d %.1f"):format(mode, n, (t1 - t0) / n))
