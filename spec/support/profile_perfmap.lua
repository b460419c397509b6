-- For spec/profile_spec.lua: runs a hot loop with the runtime perf map on
-- (run under `perf record`), then checks each live trace's map line against
-- jit.util.tracemc and prints "map PATH" and "ok N" (lines checked).
package.cpath = (os.getenv("PE_BUILD") or "build") .. "/?.so;" .. package.cpath
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local pe = require("perf_event")
local jutil = require("jit.util")

local function mapped_hot(n)
  local s = 0
  for i = 1, n do s = (s * 31 + i) % 1000003 end
  return s
end

local p = assert(pe.profile.start({ perfmap = true }))
for _ = 1, 15 do mapped_hot(3e6) end
-- no new trace while the map is read and checked (a loop over 28 or more
-- live traces is hot enough to be compiled in the middle of the check)
jit.off()
local lines = {}
for l in io.lines(p.perfmap_path) do lines[l] = true end
local ok = 0
for tr, e in pairs(p.reg.live) do
  local code, addr = jutil.tracemc(tr)
  local want = string.format("%x %x %s [trace %d]", addr, #code,
                             pe.profile.frame_name(e.info, e.line), tr)
  assert(lines[want], "no map line " .. want)
  ok = ok + 1
end
p:stop()
print("map " .. p.perfmap_path)
print("ok " .. ok)
