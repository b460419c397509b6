-- The route label of pe.profile's samples (perf_event.openresty's log()
-- gives it): each capture notes the thread's exdata (OpenResty's LuaJIT:
-- the request lua-nginx-module runs the coroutine for), and
-- request_done(route) gives the route to that request's samples, the ones
-- the core still holds and the ones a drain took before. Here the "requests"
-- are exdata values set with OpenResty LuaJIT's own thread.exdata, as
-- lua-nginx-module sets them; each runs a function of its own, and the
-- samples of each function must carry its request's route and no other.
local pe = require("perf_event")
local U = require("support.util")
local jit = rawget(_G, "jit")
local has_exdata, exdata = pcall(require, "thread.exdata")
local ffi = jit and require("ffi")

local function rt_a(n) local s = 0 for i = 1, n do s = (s * 31 + i) % 1000003 end return s end
local function rt_b(n) local s = 0 for i = 1, n do s = (s * 17 + i) % 999983 end return s end
local function rt_c(n) local s = 0 for i = 1, n do s = (s * 13 + i) % 999979 end return s end
local function rt_d(n) local s = 0 for i = 1, n do s = (s * 11 + i) % 999961 end return s end

local function burn(f, secs)
  local t0 = os.clock()
  while os.clock() - t0 < secs do f(20000) end
end

-- the routes the samples of each function carry: fn name -> route -> count
local function routes_of(p)
  local out = {}
  for _, e in ipairs(p:aggregate({ labels = true })) do
    local fn = e.key:match("(rt_%a)@")
    if fn then
      local r = e.labels and e.labels.route or "(none)"
      out[fn] = out[fn] or {}
      out[fn][r] = (out[fn][r] or 0) + e.count
    end
  end
  return out
end

local function only(t, route)
  local n = 0
  for r, c in pairs(t or {}) do if r ~= route then return false end n = n + c end
  return n > 0
end

local function show(t)
  local parts = {}
  for fn, rs in pairs(t) do
    for r, c in pairs(rs) do parts[#parts + 1] = fn .. " " .. r .. " " .. c end
  end
  table.sort(parts)
  return table.concat(parts, "\n")
end

describe("pe.profile's route labels (OpenResty's requests)", function()
  for _, keep in ipairs({ true, false }) do
    it(("gives each request's samples its route, drained before or after (keep=%s)"):format(tostring(keep)), function()
      U.need(jit and has_exdata, "OpenResty's LuaJIT (thread.exdata)")
      local p = assert(pe.profile.start({ freq = 999, keep = keep }))
      finally(function()
        p:stop()
        exdata(ffi.cast("void *", 0))
      end)
      -- request 1: drained before it ends (the samples wait in the profile)
      exdata(ffi.cast("void *", 0x10000))
      burn(rt_a, 0.3)
      p:drain()
      assert.is_true(pe.profile._request_done("/a"))
      -- request 2: ends before any drain (its records get the route in the core)
      exdata(ffi.cast("void *", 0x20000))
      burn(rt_b, 0.3)
      pe.profile._request_done("/b")
      -- request 3: at request 1's address, once request 1 is done
      exdata(ffi.cast("void *", 0x10000))
      burn(rt_d, 0.3)
      p:drain()
      pe.profile._request_done("/d")
      -- request 4: never ends: no route
      exdata(ffi.cast("void *", 0x30000))
      burn(rt_c, 0.2)
      p:stop()
      local got = routes_of(p)
      assert.is_true(only(got.rt_a, "/a"), show(got))
      assert.is_true(only(got.rt_b, "/b"), show(got))
      assert.is_true(only(got.rt_d, "/d"), show(got))
      assert.is_true(only(got.rt_c, "(none)"), show(got))
    end)
  end
  it("keeps every route apart over thousands of requests at reused addresses", function()
    U.need(jit and has_exdata, "OpenResty's LuaJIT (thread.exdata)")
    -- eight routes, each its own function; 6000 requests at 300 addresses
    -- (more ends than the core notes before it gives routes out, 2048, and
    -- addresses that share the index's slots), drained now and then
    local fns = {}
    for k = 1, 8 do
      -- (named by their chunk, routesK)
      fns[k] = load(("return function(n) local s = 0 for i = 1, n do s = (s * %d + i) %% 999983 end "
                     .. "return s end"):format(k + 2), "=routes" .. k)()
    end
    local p = assert(pe.profile.start({ freq = 999, keep = false }))
    finally(function()
      p:stop()
      exdata(ffi.cast("void *", 0))
    end)
    local t0 = os.clock()
    for i = 1, 6000 do
      local k = i % 8 + 1
      exdata(ffi.cast("void *", 0x40000 + (i * 7919 % 300) * 0x2000))
      fns[k](4000)
      pe.profile._request_done("/r" .. k)
      if i % 500 == 0 then p:drain() end
    end
    local cpu = os.clock() - t0
    p:stop()
    local wrong, right = {}, 0
    for _, e in ipairs(p:aggregate({ labels = true })) do
      local k = e.key:match("@routes(%d):")
      if k then
        local r = e.labels and e.labels.route
        if r == "/r" .. k then right = right + e.count
        else wrong[#wrong + 1] = ("routes%s under %s: %d"):format(k, tostring(r), e.count) end
      end
    end
    -- (the last request may be in flight at the last drain: no route)
    assert.is_true(#wrong <= 1, table.concat(wrong, "\n"))
    assert.is_true(right > 0.5 * 999 * cpu, ("%d samples with their route in %.2f s of CPU"):format(right, cpu))
  end)
end)
