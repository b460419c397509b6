-- Event-string parser: structure of pe.parse's entries, end-to-end opens,
-- errors with a caret, describe(), and fuzzing (only clean errors).
-- Attr values themselves are checked against perf in perf_oracle_spec.lua.
local parse = require("perf_event.parse")
local u64 = require("perf_event.u64")

describe("parse", function()
  it("returns entries with name, attr, group, leader and mods", function()
    local l = assert(parse.parse("cycles:u,{task-clock,page-faults}:k"))
    assert.are.equal(3, #l)
    assert.are.equal("cycles:u", l[1].name)
    assert.are.equal("u", l[1].mods)
    assert.is_nil(l[1].group)
    assert.is_false(l[1].leader)
    assert.are.equal(1, l[2].group)
    assert.is_true(l[2].leader)
    assert.are.equal(1, l[3].group)
    assert.is_false(l[3].leader)
    assert.are.equal("k", l[3].mods)
    assert.are.equal("", assert(parse.parse("task-clock"))[1].mods)
  end)

  it("the name= term names the event", function()
    assert.are.equal("x", assert(parse.parse("task-clock/name=x/"))[1].name)
  end)

  it("pe.group('{task-clock,page-faults}:u') counts both members", function()
    local pe = require("perf_event")
    local g = assert(pe.group("{task-clock,page-faults}:u"))
    g:disable()
    g:reset()
    g:enable()
    -- 300 fresh pages, huge pages off: at least 300 faults (not a Lua
    -- string: the allocator may hand back pages earlier specs touched)
    require("petest").touch_pages(300)
    g:disable()
    local r = g:read()
    g:close()
    assert.is_true(r["task-clock"] > 0)
    assert.is_true(r["page-faults"] >= 300, r["page-faults"])
    -- each member was opened with the bits perf sets for ':u'
    for _, ev in ipairs(g:members()) do
      local a = ev:attr()
      assert.is_true(a.exclude_kernel)
      assert.is_true(a.exclude_hv)
      assert.is_true(a.exclude_guest)
      assert.is_falsy(a.exclude_user)
    end
  end)

  it("pe.open of a comma list is refused, pe.parse of it is not", function()
    assert.are.equal(2, #assert(parse.parse("task-clock,cpu-clock")))
    local a, err = parse.attr("task-clock,cpu-clock")
    assert.is_nil(a)
    assert.truthy(err:find("2 events"))
  end)

  it("attr() accepts {event=, overrides} and full attr tables", function()
    local a = assert(parse.attr({ event = "task-clock:u", sample_period = 1000 }))
    assert.are.equal(1, a.type)
    assert.are.equal(1000, a.sample_period)
    assert.is_true(a.exclude_kernel)
    local b = assert(parse.attr({ type = 1, config = 2 }))
    assert.are.equal(2, b.config)
    assert.is_nil((parse.attr({})))
    assert.is_nil((parse.attr(42)))
  end)

  it("errors quote the string and put a caret under the offending spot", function()
    local _, err = parse.parse("task-clock,cycles:ux")
    assert.truthy(err:find("'task-clock,cycles:ux'", 1, true))
    local caret = #err:match("\n(%s*)%^$")
    local line = err:match("\n(%s*task%-clock,cycles:ux)\n")
    assert.are.equal("x", line:sub(caret + 1, caret + 1))
    assert.truthy(err:find("valid: u k h", 1, true))
  end)

  it("an unknown event names close matches", function()
    local _, err = parse.parse("task-clok")
    assert.truthy(err:find("task-clock", 1, true))
    _, err = parse.parse("L1-dcache-lod-misses")
    assert.truthy(err:find("did you mean", 1, true))
  end)

  it("describe() prints perf's -vv layout and the sysfs terms behind the bits", function()
    local d = assert(parse.describe("uprobe/retprobe,ref_ctr_offset=0x10/u"))
    assert.truthy(d:find("perf_event_attr:", 1, true))
    assert.truthy(d:find("config%s+0x1000000001"))
    assert.truthy(d:find("ref_ctr_offset=0x10 -> config (format config:32-63", 1, true))
    assert.truthy(d:find("exclude_kernel%s+1"))
    assert.truthy(tostring(assert(parse.attr("mem:0x1000/8:rw"))):find("{ bp_addr, config1 }%s+0x1000"))
  end)

  it("keeps kernel addresses exact on every interpreter", function()
    local a = assert(parse.attr("mem:0xffffffff81000000:x"))
    assert.are.equal("0xffffffff81000000", u64.tohex(a.bp_addr))
    local core = require("perf_event.core")
    assert.are.equal("0xffffffff81000000", u64.tohex(core.u64(a.bp_addr)))
  end)
end)

describe("parse fuzz", function()
  local ALPHA = "abcdekhpuGHIPSDWrwx0123456789_-/:=,{}?*. 'LTMcmst"
  local SEEDS = { "cycles:u", "{task-clock,page-faults}:u", "msr/tsc/", "mem:0x1000/8:rw",
    "sched:sched_switch", "L1-dcache-load-misses", "r01c4", "uprobe/retprobe,ref_ctr_offset=1/k",
    "task-clock/period=1000,name='a,b'/", "foo{cpu-clock}:W" }

  local function check(s)
    local ok, l, err = pcall(parse.parse, s)
    assert(ok, "raised on " .. string.format("%q", s) .. ": " .. tostring(l))
    if l == nil then
      assert(type(err) == "string" and err:find("^perf_event: bad event string"), "bad error for "
        .. string.format("%q", s) .. ": " .. tostring(err))
    else
      assert(type(l) == "table" and #l >= 1)
    end
  end

  it("never raises on 3000 random strings", function()
    math.randomseed(1234)
    for _ = 1, 1500 do
      local n = math.random(0, 24)
      local t = {}
      for i = 1, n do
        local k = math.random(1, #ALPHA)
        t[i] = ALPHA:sub(k, k)
      end
      check(table.concat(t))
    end
    for _ = 1, 1500 do
      local s = SEEDS[math.random(1, #SEEDS)]
      local op = math.random(1, 3)
      local p = math.random(1, #s)
      local k = math.random(1, #ALPHA)
      if op == 1 then s = s:sub(1, p - 1) .. s:sub(p + 1)
      elseif op == 2 then s = s:sub(1, p) .. ALPHA:sub(k, k) .. s:sub(p + 1)
      else s = s:sub(1, p - 1) .. ALPHA:sub(k, k) .. s:sub(p + 1) end
      check(s)
    end
  end)

  it("handles binary junk and huge inputs", function()
    check(string.rep("{", 10000))
    check(string.rep("a,", 2000))
    check("\0\1\2\255")
    check("sch[d:sc[Thed_switch") -- unbalanced glob bracket in a tracepoint name
    check("sched:sched_wak[")
    check("msr/event=" .. string.rep("9", 100) .. "/")
    check("mem:" .. string.rep("f", 40))
    check("r" .. string.rep("0", 40) .. "1")
  end)

  it("rejects non-strings cleanly", function()
    local l, err = parse.parse(nil)
    assert.is_nil(l)
    assert.truthy(err:find("expected"))
  end)
end)
