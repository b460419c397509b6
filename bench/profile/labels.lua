--- bench/profile/labels.lua - one round of bench/profile/labels.sh: the
-- workload of bench/profile/workload.lua cut into "requests" as an nginx
-- worker runs them, under pe.profile{keep=false} at HZ (9999 by default,
-- so that the per-sample parts stand out of the noise), drained every
-- 100 ms of CPU as perf_event.openresty's timer does.  Where the build has
-- route labels (pe.profile._request_done) and the VM has exdata
-- (OpenResty's LuaJIT: thread.exdata), each request sets the thread's
-- exdata to its own address (one of 64, reused, as nginx reuses its
-- requests' memory) and ends with request_done(route): a route per kind of
-- work (the workload's six slices), as a route's requests run its code.
-- A first pass of the workload is not timed (the distinct samples met for
-- the first time cost their symbols' lookups, once per profile), then six.
-- Prints one line: samples, the drains' CPU, the captures' mean ns, the
-- request_done calls' CPU, the requests, and whether routes were given.
-- request_done's CPU is measured apart, after the profile (a loop of calls
-- with a profile armed at 1 Hz): timed one by one inside it, each call's
-- os.clock would take the signals due (they are delivered on a system
-- call's return) and charge their samples to the call.
--   luajit labels.lua [HZ]   (from the root of the tree to measure)
package.cpath = "build/?.so;" .. package.cpath
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path

local pe = require("perf_event")
local clock = os.clock
local HZ = tonumber(arg and arg[1] or "9999")
local W = dofile(assert(os.getenv("PE_BENCH_WORKLOAD"), "PE_BENCH_WORKLOAD: bench/profile/workload.lua's path"))

local done = pe.profile._request_done
local has_exdata, exdata = pcall(require, "thread.exdata")
local ffi = require("ffi")
local routed = done ~= nil and has_exdata
local ROUTES = {}
for i = 1, #W.SLICES do ROUTES[i] = "/route" .. i end

local p = assert(pe.profile.start({ freq = HZ, keep = false }))
assert(p.walk == "safepoint", "not the safe point: " .. tostring(p.stacks_reason))
local drain_t, route_t, requests = 0, 0, 0

-- one pass of the workload in requests; timed: its drains' CPU summed
local function pass(timed)
  local next_t = clock() + 0.1
  for j, s in ipairs(W.SLICES) do
    for _ = 1, 16 do
      requests = requests + 1
      if routed then exdata(ffi.cast("void *", 0x100000 + (requests % 64) * 0x1000)) end
      W.deep(8, s[1], s[2] / 16)
      if routed then done(ROUTES[j]) end
      if clock() >= next_t then
        local t0 = clock()
        p:drain()
        local t1 = clock()
        if timed then drain_t = drain_t + (t1 - t0) end
        next_t = t1 + 0.1
      end
    end
  end
end

-- a pass untimed first: the distinct samples met for the first time (their
-- symbols looked up, their frames made) are not the steady drain's cost
pass(false)
p:drain()
local n0 = p.nsamples
requests = 0
for _ = 1, 6 do pass(true) end
local t0 = clock()
p:drain()
drain_t = drain_t + (clock() - t0)
local nsamples = p.nsamples - n0
p:stop()
if routed then
  -- request_done per request, the same calls without the samples
  local q = assert(pe.profile.start({ freq = 1, keep = false }))
  local n = 100000
  local t1 = clock()
  for i = 1, n do
    exdata(ffi.cast("void *", 0x100000 + (i % 64) * 0x1000))
    done(ROUTES[i % #ROUTES + 1])
  end
  route_t = (clock() - t1) / n * requests
  q:stop()
  exdata(ffi.cast("void *", 0))
end
print(string.format("%d %.6f %.1f %.6f %d %s", nsamples, drain_t, p.capture_ns or 0, route_t, requests,
                    tostring(routed)))
