-- One place assembles each class's methods (lua/perf_event/class.lua): the
-- method tables of events, groups and weak groups are exactly the documented
-- sets, no private hook is a method, and no other module writes an __index.
local U = require("support.util")
local pe = require("perf_event")
local class = require("perf_event.class")
local core = pe.core

local slurp = U.read


local sorted = U.sorted_keys

-- The methods init.lua's LDoc documents: `@function event:x` / `group:x`,
-- and for groups the event methods the "@type group" text says act on the
-- leader ("applied to its leader: `refresh`, ...").
local INIT = assert(slurp("lua/perf_event/init.lua"))
local function documented(kind)
  local set = {}
  for name in INIT:gmatch("@function " .. kind .. ":([%w_]+)") do set[name] = true end
  if kind == "group" then
    local block = INIT:match("applied to\n?%-*%s*its leader:(.-)\n%-%- @type group")
    assert(block, "init.lua: the group's leader methods sentence")
    for name in block:gmatch("`([%w_]+)`") do set[name] = true end
  end
  return set
end

local function open_tp_free_event()
  return assert(pe.open({ type = 1, config = 2, name = "page-faults", exclude_kernel = true }))
end

describe("perf_event.class", function()
  it("events have exactly the methods init.lua documents", function()
    local doc = documented("event")
    assert.are.same(sorted(doc), sorted(core.event_mt.__index))
    assert.are.equal(class.event, core.event_mt.__index)
    local ev = open_tp_free_event()
    for name in pairs(doc) do assert.are.equal("function", type(ev[name]), name) end
    ev:close()
  end)

  it("groups and weak groups have exactly the methods init.lua documents", function()
    local doc = documented("group")
    assert.are.same(sorted(doc), sorted(core.group_mt.__index))
    assert.are.same(sorted(doc), sorted(class.weak_mt.__index))
    -- a real weak group: the kernel refuses a pinned member into the group
    local g = assert(pe.group("{task-clock,page-faults:D}:W"))
    assert.is_true(g.fallback)
    assert.are.equal(22, g.fallback_errno)
    assert.are.equal(class.weak_mt, getmetatable(g))
    for name in pairs(doc) do assert.are.equal("function", type(g[name]), name) end
    assert.are.equal(g:event(1):fd(), g:fd())
    g:close()
    local real = assert(pe.group({ "task-clock", "page-faults" }))
    assert.are.equal(core.group_mt, getmetatable(real))
    assert.are.equal(real:event(1):id(), real:id())     -- forwarded to the leader
    assert.are.equal("{task-clock,page-faults}", real:name())
    real:close()
  end)

  it("the group's leader methods are the ones class.lua forwards", function()
    local block = INIT:match("applied to\n?%-*%s*its leader:(.-)\n%-%- @type group")
    local listed = {}
    for name in block:gmatch("`([%w_]+)`") do listed[#listed + 1] = name end
    assert.are.same(class.leader_methods, listed)
  end)

  it("every method doc/api.md names exists on its class", function()
    local api = assert(slurp("doc/api.md"))
    local n = 0
    for name in api:gmatch("\n%- `event:([%w_]+)%(") do
      n = n + 1
      assert.are.equal("function", type(core.event_mt.__index[name]), "event:" .. name)
    end
    assert.are.equal(#sorted(core.event_mt.__index), n)
    n = 0
    for name in api:gmatch("\n%- `group:([%w_]+)%(") do
      n = n + 1
      assert.are.equal("function", type(core.group_mt.__index[name]), "group:" .. name)
      assert.are.equal("function", type(class.weak_mt.__index[name]), "weak group:" .. name)
    end
    assert.are.equal(#sorted(core.group_mt.__index), n)
  end)

  it("no method starts with _; the core's hooks are functions of core._private", function()
    for _, t in ipairs({ core.event_mt.__index, core.group_mt.__index, class.weak_mt.__index }) do
      for name in pairs(t) do assert.is_nil(name:match("^_"), name) end
    end
    local P = core._private
    local ev = assert(pe.open({ type = 1, config = 9, name = "dummy", sample_period = 1,
                                sample_type = "tid", exclude_kernel = true }))
    for _, name in ipairs({ "ring_ptr", "ring_error", "ring_version", "ring_layouts",
                            "decode_current" }) do
      assert.are.equal("function", type(P[name]), name)
      assert.is_nil(ev[name])
      assert.is_nil(ev["_" .. name])
    end
    -- the hooks work as functions of the event: the ring's address is the
    -- mapping ev:ring() reports, no other event writes into the ring
    assert.are.equal("userdata", type(P.ring_ptr(ev)))
    assert.are.equal(0, P.ring_version(ev))
    local by_id, lays = P.ring_layouts(ev)
    assert.is_false(by_id)
    assert.are.same({}, lays)
    ev:close()
  end)

  it("no module but class.lua writes an __index or a method into a class", function()
    local p = assert(io.popen("grep -rn -e __index -e _mt -e _methods lua bin"))
    local out = p:read("*a")
    p:close()
    local bad, seen = {}, 0
    for line in out:gmatch("[^\n]+") do
      local file, text = line:match("^([^:]+):%d+:(.*)$")
      if file ~= "lua/perf_event/class.lua" then
        seen = seen + 1
        local ok
        if text:find("__index", 1, true) then
          -- a module's own class (`Sym.__index = Sym`) or a new table's
          -- metatable (`{ __index = ... }`): never a perf_event class
          local owner, rhs = text:match("^%s*([%w_]+)%.__index%s*=%s*(.*)$")
          ok = (owner and not owner:find("_mt$") and not rhs:find("_m[et]")
                and not rhs:find("core", 1, true))
            or (text:find("{%s*__index%s*=") and not text:find("_mt%s*[%.%[]"))
        else
          -- the class tables may be read (getmetatable(x) ~= event_mt), not written
          ok = not (text:find("_mt%s*[%.%[][^=~<>]-=[^=]") or
                    text:find("_methods%s*[%.%[][^=~<>]-=[^=]") or
                    text:find("rawset%s*%([%w_.]*_m[et]"))
        end
        if not ok then bad[#bad + 1] = line end
      end
    end
    assert.is_true(seen > 0)          -- grep saw the other modules' lines
    assert.are.same({}, bad)
  end)

  it("require('perf_event.core') alone gives the classes the same methods as require('perf_event')", function()
    -- a fresh interpreter that loads only the core: its method names and,
    -- for the Lua ones, where they come from (records() of perf_event.records)
    local script = ("package.path = %q package.cpath = %q "
      .. "local core = require('perf_event.core') "
      .. "local names = {} "
      .. "for k in pairs(core.event_mt.__index) do names[#names + 1] = 'e.' .. k end "
      .. "for k in pairs(core.group_mt.__index) do names[#names + 1] = 'g.' .. k end "
      .. "table.sort(names) "
      .. "local loaded = package.loaded['perf_event.records'] "
      .. "print(table.concat(names, ' '), tostring(loaded and core.event_mt.__index.records == loaded.records), "
      .. "tostring(package.loaded['perf_event'] ~= nil))")
      :format(package.path, package.cpath)
    local f = os.tmpname()
    finally(function() os.remove(f) end)
    local h = assert(io.open(f, "w"))
    h:write(script)
    h:close()
    local out, code = U.run(U.lua_cmd() .. " " .. f .. " 2>&1")
    assert.are.equal(0, code, out)
    local names = {}
    for k in pairs(core.event_mt.__index) do names[#names + 1] = "e." .. k end
    for k in pairs(core.group_mt.__index) do names[#names + 1] = "g." .. k end
    table.sort(names)
    assert.are.equal(table.concat(names, " ") .. "\ttrue\tfalse\n", out)
  end)

  it("loading fast.lua and records.lua again changes no method", function()
    local before = {}
    for k, v in pairs(core.event_mt.__index) do before["e." .. k] = v end
    for k, v in pairs(core.group_mt.__index) do before["g." .. k] = v end
    local fast = assert(loadfile("lua/perf_event/fast.lua"))()
    local records = assert(loadfile("lua/perf_event/records.lua"))()
    assert.are.equal("function", type(records.records))
    assert.are.equal("table", type(fast.c.event))
    local after = {}
    for k, v in pairs(core.event_mt.__index) do after["e." .. k] = v end
    for k, v in pairs(core.group_mt.__index) do after["g." .. k] = v end
    assert.are.same(before, after)
    for k, v in pairs(before) do assert.are.equal(v, after[k], k) end   -- the same functions
  end)
end)
