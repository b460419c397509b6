-- The program's own jit.attach handler (as -jv's) and the library's VM
-- event callbacks (pe.profile's self-test, its perfmap=true trace registry, luamap)
-- share LuaJIT's one handler per event (perf_event.vmevent): the program's
-- handler gets the events while they run and after they stop.  Before, a
-- first start's self-test, a profile with a trace registry or luamap each
-- left the program with no handler.  In a child process, so that the
-- self-test runs there.
local U = require("support.util")

local jit = rawget(_G, "jit")
local describe_jit = jit and describe or pending
local build = os.getenv("PE_BUILD") or "build"

-- prints one line per step: its name, the "stop" events the program's
-- handler got while a new function's loop was compiled, and the traces
-- the library's registry saw (or -)
local SCRIPT = [[
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = (os.getenv("PE_BUILD") or "build") .. "/?.so;" .. package.cpath
local pe = require("perf_event")
local stops = 0
local function mine(what) if what == "stop" then stops = stops + 1 end end
jit.attach(mine, "trace")
local k = 0
-- the "stop" events of compiling a new function's loop
local function compiled()
  k = k + 1
  local f = loadstring("return function(n) local s = 0 for i = 1, n do s = s + i % 3 end return s end", "=w" .. k)()
  local s0 = stops
  f(1e5)
  return stops - s0
end
local function step(name, reg)
  local t0 = reg and (reg.ntraces or 0)
  local n = compiled()
  print(name, n, reg and (reg.ntraces or 0) - t0 or "-")
end
step("before")
local p = assert(pe.profile.start())               -- the first start: the self-test
step("profile " .. p.walk)
p:stop()
step("stopped")
p = assert(pe.profile.start({ perfmap = true }))   -- a trace registry (its map: luamap's path, below)
step("registry", p.reg)
p:stop()
step("stopped")
local pid = io.open("/proc/self/stat"):read("*l"):match("^%d+")
local luamap = require("perf_event.luamap")
step("luamap")
luamap.stop()
os.remove("/tmp/perf-" .. pid .. ".map")
step("stopped")
]]

describe_jit("perf_event.vmevent", function()
  it("the program's jit.attach handler gets the trace events while the library's run and after they stop", function()
    local path = os.tmpname()
    finally(function() os.remove(path) end)
    local f = assert(io.open(path, "w"))
    f:write(SCRIPT)
    f:close()
    local out, rc = U.run("PE_BUILD=" .. build .. " luajit " .. path .. " 2>&1")
    assert.equal(0, rc, out)
    local steps = {}
    for name, n, reg in out:gmatch("([%w ]+)\t(%d+)\t([%d%-]+)\n") do steps[#steps + 1] = { name, tonumber(n), reg } end
    assert.equal(7, #steps, out)
    for i, st in ipairs(steps) do
      assert.is_true(st[2] >= 1, ("step %d, %s: the program's handler got no stop event\n%s"):format(i, st[1], out))
    end
    -- and the registry got the trace too
    assert.equal("registry", steps[4][1], out)
    assert.is_true(tonumber(steps[4][3]) >= 1, "the registry saw no trace\n" .. out)
  end)
end)
