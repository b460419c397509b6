-- Child of spec/profile_safepoint_spec.lua: LuaJIT's dispatch table left
-- stale (the hook flag clear, a mode without the hook, the first entries
-- the hook: csrc/lj/hook.c) inside jit.profile's callback, where LuaJIT's
-- profiler cannot set its flag (HOOK_VMEVENT), as a -jp run can
-- spin.  pe.profile runs beside it (armed first: its handler still runs on
-- each of its samples once jit.profile has LuaJIT's profiler).  Run as: luajit ljhook_stale.lua on|off
-- (the handlers' repairs); prints "done N R" (the callback's loop result,
-- the stale tables rewritten) when the program ends.  With the repairs
-- off the callback never returns: its parent kills it.
local build = os.getenv("PE_BUILD") or "build"
package.cpath = build .. "/?.so;build/test/" .. (build:match("asan$") and "asan" or "luajit") .. "/?.so;"
  .. package.cpath
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local pe = require("perf_event")
local profile = require("jit.profile")
local LP = pe.core._private
local T = require("ljtest")   -- (spec/support/ljtest.c: the tear)
local function work(n)
  local s = 0
  for i = 1, n do
    if i % 3 == 0 then s = s + 1 end   -- ISxx: below entry 16, the hook
  end
  return s
end
local result, armed
local p = assert(pe.profile.start({ freq = 999 }))
assert(p.walk == "safepoint", "not the safe point: " .. tostring(p.walk))
profile.stop()   -- (releases ours: the jit.profile started next keeps its mode)
profile.start("li1", function()
  if result or not armed then return end
  result = -1
  assert(T.ljhook_tear(LP.ljhook_stats(), 16, false))
  result = work(1e5)
end)
assert(LP.ljhook_stats().found == true, "the hook flag and table not found")
assert(T.ljhook_repairs(LP.ljhook_stats(), arg[1] ~= "off"))
armed = true
jit.off()
local t0 = os.clock()
repeat local _ = work(1000) until result and result >= 0 or os.clock() - t0 > 5
profile.stop()
p:stop()
io.write("done ", tostring(result), " ", LP.ljhook_stats().rewritten, "\n")
