-- Lifecycle: idempotent close, __gc and __close, use after close, tostring,
-- and no fd or mapping leaks over thousands of events.
local pe = require("perf_event")
local U = require("support.util")

local GETPPID = U.tp_id("syscalls", "sys_enter_getppid")

describe("events", function()
  it("close is idempotent, and use after close raises", function()
    local ev = assert(pe.open({ type = "software", config = 1, name = "task-clock" }))
    local fd = ev:fd()
    assert.matches("^perf_event%.event%(task%-clock, fd " .. fd .. "%)$", tostring(ev))
    ev:close()
    ev:close()
    assert.equal("perf_event.event(task-clock, closed)", tostring(ev))
    assert.has_error(function() ev:read() end, "attempt to use a closed perf_event.event")
    assert.has_error(function() ev:enable() end, "attempt to use a closed perf_event.event")
    assert.is_true(ev:info().closed)
    assert.equal("task-clock", ev:name())
  end)

  it("a method called with the wrong self raises", function()
    local ev = assert(pe.open({ type = "software", config = 1, name = "t" }))
    assert.has_error(function() ev.read({}) end)
    assert.has_error(function() ev.read("x") end)
    ev:close()
  end)

  it("attr() is a copy with the fields given", function()
    local ev = assert(pe.open({ type = "software", config = 2, name = "pf", exclude_kernel = true }))
    local a = ev:attr()
    assert.equal(1, a.type)
    assert.equal(2, a.config)
    assert.is_true(a.exclude_kernel)
    a.config = 99
    assert.equal(2, ev:attr().config)
    ev:close()
  end)

  it("thousands of events opened and dropped leave no perf fd or mapping behind", function()
    collectgarbage()
    collectgarbage()
    local fds, maps = U.count_perf_fds(), U.count_perf_maps()
    -- (software events: closing a tracepoint event waits for an RCU grace
    -- period, milliseconds each, in the kernel)
    for _ = 1, 3000 do
      pe.open({ type = "software", config = 1, name = "t" })          -- user page mapped
      pe.open({ type = "software", config = 0, name = "s", disabled = true,
                sample_period = 1000000000, sample_type = "ip" }, { pages = 1 }) -- ring mapped
    end
    collectgarbage()
    collectgarbage()
    assert.equal(fds, U.count_perf_fds())
    assert.equal(maps, U.count_perf_maps())
  end)

  it("an explicitly closed event unmaps at once", function()
    U.need_tracing()
    collectgarbage(); collectgarbage()
    local maps = U.count_perf_maps()
    local ev = assert(pe.open({ type = "tracepoint", config = GETPPID, name = "s",
                                sample_period = 1, sample_type = "ip" }, { pages = 2 }))
    assert.equal(maps + 1, U.count_perf_maps())
    ev:close()
    assert.equal(maps, U.count_perf_maps())
  end)

  it("closes at scope exit with <close> on Lua 5.4", function()
    if _VERSION ~= "Lua 5.4" then pending("to-be-closed variables need Lua 5.4") return end
    collectgarbage(); collectgarbage()
    local fds = U.count_perf_fds()
    local chunk = assert(load([[
      local pe = ...
      local ev <close> = assert(pe.open({type="software", config=1, name="t"}))
      return ev
    ]]))
    local ev = chunk(pe)
    assert.equal("perf_event.event(t, closed)", tostring(ev))
    assert.equal(fds, U.count_perf_fds())
  end)
end)

describe("groups", function()
  it("close closes every member; use after close raises", function()
    collectgarbage(); collectgarbage()
    local fds = U.count_perf_fds()
    local g = assert(pe.group({ { type = "software", config = 1, name = "a" },
                                { type = "software", config = 2, name = "b" } }))
    assert.matches("^perf_event%.group%({a,b}, leader fd %d+%)$", tostring(g))
    local members = g:members()
    g:close()
    g:close()
    assert.equal("perf_event.group(closed)", tostring(g))
    assert.equal("perf_event.event(b, closed)", tostring(members[2]))
    assert.has_error(function() g:read() end, "attempt to use a closed perf_event.group")
    assert.equal(fds, U.count_perf_fds())
  end)

  it("a group used after its leader closed raises", function()
    local g = assert(pe.group({ { type = "software", config = 1, name = "a" },
                                { type = "software", config = 2, name = "b" } }))
    g:members()[1]:close()
    assert.has_error(function() g:read() end, "attempt to use a closed perf_event.group")
    g:close()
  end)

  it("a failing member closes the members already opened", function()
    collectgarbage(); collectgarbage()
    local fds = U.count_perf_fds()
    local g, msg, errno = pe.group({ { type = "software", config = 1, name = "a" },
                                     { type = "software", config = 77, name = "bad" } })
    assert.is_nil(g)
    assert.equal(2, errno)
    assert.matches("perf_event_open(bad)", msg, 1, true)
    collectgarbage()
    assert.equal(fds, U.count_perf_fds())
  end)

  it("forwards the remaining ioctls to its leader", function()
    local g = assert(pe.group({ { type = "software", config = 1, name = "a" },
                                { type = "software", config = 2, name = "b" } }))
    assert.equal(g:members()[1]:fd(), g:fd())
    assert.equal(g:members()[1]:id(), g:id())
    assert.equal("{a,b}", g:name())
    assert.equal(g:members()[2], g:event(2))
    g:close()
  end)
end)
