-- A child forked while a profile runs shares the file description of the
-- profile's event with its parent: an ioctl or fcntl on its copy of the fd
-- would act on the parent's event. Its p:stop(), ev:close() and garbage
-- collection only close its copy (and forget the mapping it does not have);
-- its ev:disable()/enable()/reset() are refused with EPERM (doc/api.md,
-- "Events and fork"). The parent's sampling rate afterwards is held to the
-- rate the kernel keeps: task-clock at freq F samples every 1e9/F ns of the
-- thread's CPU time (a software event turns freq into that fixed period),
-- over the whole profile: a child that stopped the parent's event leaves it
-- the samples before the fork only.
local pe = require("perf_event")
local petest = require("petest")

local EPERM = pe.core.abi.errno.EPERM
local FREQ = 999

local function self_pid()
  local f = assert(io.open("/proc/self/stat", "r"))
  local pid = tonumber(f:read("*l"):match("^(%d+)"))
  f:close()
  return pid
end

-- the Poisson interval [lo, hi] around mean m outside which a count falls
-- with odds <= 1e-6 (5e-7 each side): a looser bound than the kernel's
-- fixed period needs, and far above what a disabled event or a silenced
-- signal leaves (a handful of samples)
local function poisson_bounds(m)
  local tail = 5e-7
  local p = math.exp(-m)           -- P(X = 0); m <= ~700 keeps it above 0
  local cdf, k, lo = p, 0, nil
  while true do
    if not lo and cdf > tail then lo = k end
    if 1 - cdf < tail then return lo, k + 1 end
    k = k + 1
    p = p * m / k
    cdf = cdf + p
  end
end

local sink = 0
local function busy(seconds)
  local c0 = os.clock()
  local s = 0
  while os.clock() - c0 < seconds do
    for i = 1, 20000 do s = (s * 31 + i) % 1000003 end
  end
  sink = sink + s
end

-- after the child: the parent runs busy for `seconds` more, then stops; all
-- its samples since start against all its CPU time since start (c0, taken
-- once start returned): the child's work is not the parent's (the event
-- is not inherited), and a sample the hook has not paired yet at one
-- drain counts at stop. Returns n, lo, hi, cpu
local function parent_rate(p, c0, seconds)
  busy(seconds)
  local c1 = os.clock()
  p:stop()
  local lo, hi = poisson_bounds((c1 - c0) * FREQ)
  return p.nsamples, lo, hi, c1 - c0
end

local function start()
  local p = assert(pe.profile.start({ event = "task-clock", freq = FREQ, pages = 64 }))
  return p, os.clock()
end

describe("a child forked while a profile runs", function()
  it("the Poisson bound: [lo, hi] around 500 holds all but 1e-6 of the mass", function()
    local lo, hi = poisson_bounds(500)
    -- a peer figure: 500 -+ 4.9 standard deviations (sqrt(500) = 22.4), the
    -- upper side longer (the skew of a Poisson law: 395 and 614 exactly)
    assert.is_true(lo >= 390 and lo <= 400, "lo " .. lo)
    assert.is_true(hi >= 605 and hi <= 620, "hi " .. hi)
  end)

  it("p:stop() in the child leaves the parent sampling at its rate", function()
    local p, c0 = start()
    finally(function() p:stop() end)
    busy(0.1)
    local rc = petest.fork_run([[
      local p = ...
      p:stop()
      if p.running then return 3 end
      return 0
    ]], p)
    assert.equal(0, rc)
    assert.is_true(p.running)
    local n, lo, hi, cpu = parent_rate(p, c0, 0.5)
    assert.is_true(n >= lo and n <= hi,
      ("%d samples in %.3f s of CPU at %d Hz: expected %d..%d"):format(n, cpu, FREQ, lo, hi))
  end)

  it("the child's ev:disable()/enable()/reset() are refused with EPERM, its close() only closes its copy", function()
    local p, c0 = start()
    finally(function() p:stop() end)
    busy(0.1)
    local rc = petest.fork_run([[
      local ev, ppid, EPERM = ...
      local info = ev:info()
      if info.opener ~= ppid or not info.inherited then return 3 end
      for _, m in ipairs({ "disable", "enable", "reset" }) do
        local ok, msg, errno = ev[m](ev)
        if ok ~= nil or errno ~= EPERM then return 4 end
        local want = m .. "(task-clock): EPERM: Operation not permitted (event opened by pid " .. ppid
          .. ": a forked child cannot control it"
        if msg:sub(1, #want) ~= want then io.stderr:write(msg, "\n") return 5 end
      end
      local fd = ev:fd()
      ev:close()
      local f = io.open("/proc/self/fd/" .. fd, "r")
      if f then f:close() return 6 end
      return 0
    ]], p.ev, self_pid(), EPERM)
    assert.equal(0, rc)
    local info = p.ev:info()
    assert.is_false(info.inherited)
    assert.equal(self_pid(), info.opener)
    local n, lo, hi, cpu = parent_rate(p, c0, 0.5)
    assert.is_true(n >= lo and n <= hi,
      ("%d samples in %.3f s of CPU at %d Hz: expected %d..%d"):format(n, cpu, FREQ, lo, hi))
  end)

  it("the child's garbage collection of the dropped profile leaves the parent sampling", function()
    local p, c0 = start()
    local box = { p = p }
    finally(function() p:stop() end)
    busy(0.1)
    -- the child drops every reference to the profile (the box's, and the
    -- spec's local through a setter) and collects: the profile's and the
    -- event's finalizers run there
    local rc2 = petest.fork_run([[
      local box, getp = ...
      local fd = box.p.ev:fd()
      local weak = setmetatable({ box.p.ev }, { __mode = "v" })
      box.p = nil
      getp(nil)          -- the spec's local, cleared in this copy
      collectgarbage()
      collectgarbage()
      -- Lua 5.1 runs no table finalizer, and its hook keeps the event of a
      -- running profile referenced until stop(): there it stays open
      local puc51 = _VERSION == "Lua 5.1" and not rawget(_G, "jit")
      if puc51 then return weak[1] ~= nil and 0 or 5 end
      if weak[1] ~= nil then return 3 end   -- still referenced: no GC path taken
      local f = io.open("/proc/self/fd/" .. fd, "r")
      if f then f:close() return 4 end      -- the userdata's __gc closed the child's copy
      return 0
    ]], box, function(v) p = v end)
    assert.equal(0, rc2)
    assert.is_truthy(p)      -- the parent's local is untouched by the child
    local n, lo, hi, cpu = parent_rate(p, c0, 0.5)
    assert.is_true(n >= lo and n <= hi,
      ("%d samples in %.3f s of CPU at %d Hz: expected %d..%d"):format(n, cpu, FREQ, lo, hi))
  end)
  it("a group's disable()/reset() in the child are refused; the parent's group keeps counting", function()
    local g = assert(pe.group({ "task-clock", "context-switches" }))
    finally(function() g:close() end)
    busy(0.05)
    local rc = petest.fork_run([[
      local g, EPERM = ...
      for _, m in ipairs({ "disable", "reset", "enable" }) do
        local ok, msg, errno = g[m](g)
        if ok ~= nil or errno ~= EPERM or not msg:find("a forked child cannot control it", 1, true) then
          return 3
        end
      end
      g:close()
      return 0
    ]], g, EPERM)
    assert.equal(0, rc)
    -- still enabled and not reset: task-clock goes on counting this
    -- thread's CPU time (ns) from where it was
    local before = g:read()[1]
    local c0 = os.clock()
    busy(0.1)
    local dc = os.clock() - c0
    local d = g:read()[1] - before
    assert.is_true(d >= 0.5 * dc * 1e9, ("task-clock grew %d ns over %.3f s of CPU"):format(d, dc))
  end)
end)
