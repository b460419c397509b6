-- Lifecycle across fork(), signals and dead children (issue 7).
-- The kernel does not copy perf mappings into a child (VM_DONTCOPY): the
-- child inherits the fds but not the user page or the ring.  The core
-- notices the fork (pthread_atfork) and forgets the mappings in the child,
-- so there the child may: read() counters (through read(2): they count what
-- they counted for the parent), read groups, close() its copies (the
-- parent's events stay open), open its own events.  records()/ring() raise
-- (doc/errors.md); enable/disable/reset are refused with EPERM, since they
-- would act on the parent's (shared) kernel event
-- (spec/profile_fork_spec.lua).  Documented in doc/hardening.md.
local pe = require("perf_event")
local petest = require("petest")
local U = require("support.util")

local GETPPID = U.tp_id("syscalls", "sys_enter_getppid")

local function sampler(pages)
  return assert(pe.open({ type = "tracepoint", config = GETPPID, sample_period = 1,
    sample_type = "ip|tid", disabled = true, name = "syscalls:sys_enter_getppid" },
    { pages = pages or 4 }))
end

describe("fork with events open", function()
  it("a child reads a counter through read(2) instead of the (absent) user page", function()
    local ev = assert(pe.open("task-clock"))
    assert.is_true(ev:info().mapped)
    local rc = petest.fork_run([[
      local ev = ...
      local v, en, run = ev:read()
      if type(v) ~= "number" or type(en) ~= "number" or type(run) ~= "number" then return 3 end
      if ev:info().mapped then return 4 end
      return 0
    ]], ev)
    assert.equal(0, rc)
    assert.is_true(ev:info().mapped)     -- the parent's mapping is untouched
    assert.equal("number", type(ev:read()))
    ev:close()
  end)

  it("a child cannot drain the parent's ring; the parent reads every record afterwards", function()
    U.need_tracing()
    local ev = sampler()
    assert(ev:enable())
    petest.getppid(100)
    assert(ev:disable())
    local rc = petest.fork_run([[
      local ev = ...
      local ok, err = pcall(function() for _ in ev:records() do end end)
      if ok or not tostring(err):find("no ring buffer", 1, true) then return 3 end
      -- ring() raises in the child too (doc/errors.md), saying why
      local okr, rerr = pcall(ev.ring, ev)
      if okr or not tostring(rerr):find("mapped by the parent before fork", 1, true) then
        return 4
      end
      ev:close()                 -- the child's copy only; no munmap of a stale range
      collectgarbage()
      return 0
    ]], ev)
    assert.equal(0, rc)
    local n = 0
    for rec in ev:records() do
      assert.equal("sample", rec.type)
      n = n + 1
    end
    assert.equal(100, n)
    assert.equal(0, ev:lost())
    local r = ev:ring()
    assert.equal(r.data_head, r.data_tail)
    ev:close()
  end)

  it("a child that garbage-collects every event and opens its own exits cleanly", function()
    U.need_tracing()
    local g = assert(pe.group("{task-clock,page-faults}"))
    local ev = sampler(2)
    local rc = petest.fork_run([[
      local pe, g, ev = ...
      local t = g:read()
      if type(t["task-clock"]) ~= "number" then return 3 end
      local own = pe.open("syscalls:sys_enter_getppid")
      require("petest").getppid(7)
      if own:read() ~= 7 then return 4 end
      own:close()
      g:close(); ev:close()
      return 0
    ]], pe, g, ev)
    assert.equal(0, rc)
    assert.equal("number", type(g:read()["page-faults"]))
    assert.is_true(ev:info().mapped)
    g:close(); ev:close()
  end)

  it("the LuaJIT FFI read path falls back in a child instead of touching the page", function()
    local ev = assert(pe.open("task-clock"))
    local rc = petest.fork_run([[
      local ev = ...
      for _ = 1, 1000 do if type(ev:read()) ~= "number" then return 3 end end
      return 0
    ]], ev)
    assert.equal(0, rc)
    ev:close()
  end)
end)

describe("signals", function()
  it("poll() retries after EINTR and times out normally", function()
    U.need_tracing()
    local ev = sampler(1)
    petest.itimer(2000)            -- SIGALRM every 2 ms, handler without SA_RESTART
    local ok, r = pcall(ev.poll, ev, 50)
    local alarms = petest.itimer(0)
    assert.is_true(ok)
    assert.is_false(r)
    assert.is_true(alarms >= 5)
    ev:close()
  end)

  it("reads and group reads under a stream of signals return values", function()
    local ev = assert(pe.open("task-clock", { pages = false }))
    local g = assert(pe.group("{task-clock,page-faults}"))
    petest.itimer(100)
    for _ = 1, 20000 do
      assert.equal("number", type(ev:read()))
      assert.equal("number", type(g:read().time_enabled))
    end
    assert.is_true(petest.itimer(0) > 0)
    ev:close(); g:close()
  end)

  it("starting a stopped child that was killed gives no SIGPIPE", function()
    local core = require("perf_event.core")
    local child = assert(core.spawn({ "true" }, { stopped = true }))
    assert(child:kill(9))
    local function state()
      local f = io.open("/proc/" .. child:pid() .. "/stat")
      local st = f and f:read("*l"):match("%) (%a)")
      if f then f:close() end
      return st
    end
    for _ = 1, 500 do                           -- a zombie: the gate has no reader now
      if state() == "Z" then break end
      os.execute("sleep 0.01")
    end
    assert.equal("Z", state())
    local ok, r = pcall(child.start, child)   -- writes to that pipe: EPIPE, not SIGPIPE
    assert.is_true(ok)
    assert.is_true(r)                          -- and this process is still alive
  end)
end)
