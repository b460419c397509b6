-- The one error rule (doc/errors.md), shown case by case:
--   raise               the caller's mistake (wrong type, closed object, a
--                        method the event cannot have: no ring, no AUX area)
--   nil, msg, errno     the kernel or the system said no, or answered
--                        something unusable; errno > 0 and named in msg
--   nil, msg            the library refused the input before any system
--                        call (an event string that does not resolve, bytes
--                        a decoder cannot decode)
-- The kernel's odd answers are made real by putting a file in place of the
-- event's fd (petest.replace_fd): read(2) then returns what the file holds.
local pe = require("perf_event")
local core = require("perf_event.core")
local petest = require("petest")
local E = core.abi.errno

local function tmpfile(bytes)
  local path = os.tmpname()
  local f = assert(io.open(path, "wb"))
  f:write(bytes)
  f:close()
  return path
end

-- the C API method (the FFI route falls back to it on any failure; this
-- makes exactly one read(2) of the replaced fd)
local function c_method(class, name)
  return core._private[class .. "_methods"][name]
end

local function triple(msg, errno, name)
  assert.is_string(msg)
  assert.equal(E[name], errno)
  assert.truthy(msg:find(name, 1, true), msg)
end

describe("the error rule: nil, msg, errno for what the kernel answers", function()
  it("a 0-byte read (a pinned event in error state) is ENODATA, on every route", function()
    local path = tmpfile("")
    local ev = assert(pe.open("task-clock"))
    finally(function() ev:close() os.remove(path) end)
    petest.replace_fd(ev:fd(), path)
    local v, msg, errno = ev:read()                 -- the FFI route on LuaJIT
    assert.is_nil(v)
    triple(msg, errno, "ENODATA")
    assert.truthy(msg:find("error state", 1, true))
    v, msg, errno = c_method("event", "read")(ev)
    assert.is_nil(v)
    triple(msg, errno, "ENODATA")
    v, msg, errno = ev:read_raw()
    assert.is_nil(v)
    triple(msg, errno, "ENODATA")
    ev:close()
    os.remove(path)
  end)

  it("a short read (fewer bytes than the read_format) is EIO, not a raise", function()
    local path = tmpfile(("\1"):rep(8))             -- 8 bytes; the format needs 24
    local ev = assert(pe.open("task-clock"))
    finally(function() ev:close() os.remove(path) end)
    for _, read in ipairs({ c_method("event", "read"), c_method("event", "read_raw") }) do
      petest.replace_fd(ev:fd(), path)              -- fresh offset for each read
      local v, msg, errno = read(ev)
      assert.is_nil(v)
      triple(msg, errno, "EIO")
      assert.truthy(msg:find("8 bytes", 1, true), msg)
    end
    ev:close()
    os.remove(path)
  end)

  it("a group whose read comes back short is EIO, named by its leader", function()
    local path = tmpfile(("\0"):rep(16))
    local g = assert(pe.group({ "task-clock", "page-faults" }))
    finally(function() g:close() os.remove(path) end)
    petest.replace_fd(g:fd(), path)
    local t, msg, errno = c_method("group", "read")(g)
    assert.is_nil(t)
    triple(msg, errno, "EIO")
    assert.truthy(msg:find("read(task-clock)", 1, true), msg)
    g:close()
    os.remove(path)
  end)

  it("a failed system call carries its own errno, named in the message", function()
    local ev, msg, errno = pe.open({ type = "software", config = 4242 })
    assert.is_nil(ev)
    triple(msg, errno, "ENOENT")
    assert.truthy(msg:find("^perf_event_open%("), msg)
  end)

  it("time_conv of an event without a user page is ENODATA", function()
    local ev = assert(pe.open("task-clock", { pages = false }))
    local c, msg, errno = pe.time_conv(ev)
    assert.is_nil(c)
    triple(msg, errno, "ENODATA")
    ev:close()
  end)
end)

describe("the error rule: the caller's mistakes raise", function()
  it("ring() of an event with nothing mapped raises, saying how to map one", function()
    local ev = assert(pe.open("task-clock", { pages = false }))
    assert.has_error(function() ev:ring() end,
      "ring(task-clock): this event has no mapping (a sampling event, or opts.pages, maps "
      .. "one; so does a counting event of this thread)")
    ev:close()
  end)

  it("ring() of a counting event of this thread shows its user page (0 data pages)", function()
    local ev = assert(pe.open("task-clock"))
    local r = ev:ring()
    assert.equal(0, r.pages)
    ev:close()
  end)

  it("aux() before map_aux() and records() of a counting event raise", function()
    local ev = assert(pe.open({ event = "task-clock", sample_period = 1000000,
                                sample_type = "ip" }))
    assert.has_error(function() ev:aux() end,
      "aux(task-clock): no AUX area: call map_aux(pages) first")
    ev:close()
    local c = assert(pe.open("task-clock", { pages = false }))
    local ok, err = pcall(c.records, c)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("records(task-clock): this event has no ring buffer", 1, true),
      tostring(err))
    -- raised at the caller's line (doc/errors.md), not inside records.lua
    ok, err = pcall(function() local it = c:records() return it end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("^[^\n]*errors_rule_spec%.lua:%d+: records%(task%-clock%)"), tostring(err))
    c:close()
    ok, err = pcall(function() local it = c:records() return it end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("^[^\n]*errors_rule_spec%.lua:%d+: attempt to use a closed"), tostring(err))
  end)
end)

describe("the error rule: nil, msg for input refused before any system call", function()
  it("an event string that does not resolve gives nil, msg and no errno", function()
    local ev, msg, errno = pe.open("no-such-event-anywhere")
    assert.is_nil(ev)
    assert.is_string(msg)
    assert.is_nil(errno)
  end)

  it("bytes the record decoder cannot decode give nil, msg", function()
    local rec, msg, errno = core.decode_record("\9\0\0\0\8\0", { sample_type = "ip" })
    assert.is_nil(rec)
    assert.is_string(msg)
    assert.is_nil(errno)
  end)
end)
