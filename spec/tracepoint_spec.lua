-- tracefs discovery and format parsing, checked against the files and the kernel.
local tp = require("perf_event.tracepoint")

local U = require("support.util")
local function sh(cmd) return (U.sh(cmd):gsub("%s+$", "")) end

describe("tracepoint", function()
  local root = tp.root()
  if not root then
    it("needs a readable tracefs", function() pending("tracefs not readable") end)
    return
  end

  it("finds tracefs where /proc/mounts says it is", function()
    local mounts = sh("awk '$3==\"tracefs\"{print $2}' /proc/mounts")
    assert.truthy(("\n" .. mounts .. "\n"):find("\n" .. root .. "\n", 1, true) or root == "/sys/kernel/tracing")
  end)

  it("gives the id tracefs gives", function()
    local t = assert(tp.tracepoint("sched:sched_switch"))
    assert.are.equal(tonumber(sh("cat " .. root .. "/events/sched/sched_switch/id")), t.id)
    assert.are.equal("sched", t.system)
    assert.are.equal("sched_switch", t.name)
  end)

  it("parses every field of the format file (name, type, offset, size, signed, arrays)", function()
    local t = assert(tp.tracepoint("sched:sched_switch"))
    local lines = sh("grep -c 'field:' " .. root .. "/events/sched/sched_switch/format")
    assert.are.equal(tonumber(lines), #t.fields)
    local by = {}
    for _, f in ipairs(t.fields) do by[f.name] = f end
    local line = sh("grep 'next_comm' " .. root .. "/events/sched/sched_switch/format")
    local off, size = line:match("offset:(%d+);%s*size:(%d+)")
    assert.are.equal(tonumber(off), by.next_comm.offset)
    assert.are.equal(tonumber(size), by.next_comm.size)
    assert.are.equal(tonumber(size), by.next_comm.array)
    assert.are.equal("char", by.next_comm.type)
    assert.is_true(by.common_pid.signed)
    assert.is_false(by.common_type.signed)
    assert.is_true(by.common_pid.common)
  end)

  it("marks __data_loc fields", function()
    local f = sh("grep -l '__data_loc' " .. root .. "/events/*/*/format 2>/dev/null | head -1")
    if f == "" then pending("no __data_loc field here") return end
    local sys, name = f:match("/events/([^/]+)/([^/]+)/format$")
    local t = assert(tp.tracepoint(sys .. ":" .. name))
    local want = tonumber(sh("grep -c '__data_loc' " .. f))
    local n = 0
    for _, fld in ipairs(t.fields) do if fld.data_loc then n = n + 1; assert.are.equal(4, fld.size) end end
    assert.are.equal(want, n)
  end)

  it("parses a format text with arrays, pointers and __data_loc", function()
    local t = tp.parse_format([[
name: demo
ID: 42
format:
	field:unsigned short common_type;	offset:0;	size:2;	signed:0;
	field:const char * filename;	offset:8;	size:8;	signed:0;
	field:unsigned long args[6];	offset:16;	size:48;	signed:0;
	field:__data_loc char[] msg;	offset:64;	size:4;	signed:0;
]])
    assert.are.equal(42, t.id)
    assert.are.same({ name = "filename", type = "const char *", offset = 8, size = 8, signed = false,
      data_loc = false, common = false }, t.fields[2])
    assert.are.equal(6, t.fields[3].array)
    assert.is_true(t.fields[4].data_loc)
    assert.are.equal("msg", t.fields[4].name)
  end)

  it("lists and globs as the directory does", function()
    local want = tonumber(sh("ls -d " .. root .. "/events/syscalls/sys_enter_get* | wc -l"))
    assert.are.equal(want, #tp.list("syscalls:sys_enter_get*"))
    assert.are.same({ "sched:sched_switch" }, tp.list("sched:sched_switch"))
  end)

  it("lists every sys/name directory in find's (readdir) order, the order perf expands globs in", function()
    local want = {}
    local out = sh("find -L " .. root .. "/events -mindepth 2 -maxdepth 2 -type d")
    for line in out:gmatch("[^\n]+") do
      local sys, ev = line:match("/events/([^/]+)/([^/]+)$")
      want[#want + 1] = sys .. ":" .. ev
    end
    assert.is_true(#want > 100)
    assert.are.same(want, tp.list(nil, true))
    -- a glob keeps that order too
    local getp = {}
    for _, n in ipairs(want) do
      if n:find("^syscalls:sys_enter_getp") then getp[#getp + 1] = n end
    end
    assert.are.same(getp, tp.list("syscalls:sys_enter_getp*", true))
  end)

  it("core.readdir gives a directory's names, or nil, message, errno", function()
    local core = require("perf_event.core")
    local names = assert(core.readdir(root .. "/events/sched"))
    local want = {}
    for n in sh("LC_ALL=C ls -1A " .. root .. "/events/sched"):gmatch("[^\n]+") do want[#want + 1] = n end
    table.sort(names)
    assert.are.same(want, names)
    local dirs = assert(core.readdir(root .. "/events/sched", true))
    assert.equal(#want - tonumber(sh("find " .. root .. "/events/sched -maxdepth 1 -type f | wc -l")), #dirs)
    local none, msg, errno = core.readdir(root .. "/events/no_such_system")
    assert.is_nil(none)
    assert.equal(2, errno)
    assert.matches("opendir(" .. root .. "/events/no_such_system): ENOENT", msg, 1, true)
    local _, msg2, errno2 = core.readdir(root .. "/events/sched/enable")
    assert.equal(20, errno2)
    assert.matches("ENOTDIR", msg2, 1, true)
  end)

  it("reports an unknown tracepoint", function()
    local t, err = tp.tracepoint("sched:nosuch")
    assert.is_nil(t)
    assert.truthy(err:find("sched:nosuch", 1, true))
    assert.is_nil((tp.tracepoint("../../etc:passwd")))
  end)

  it("pe.open('syscalls:sys_enter_getppid') counts each getppid", function()
    local pe = require("perf_event")
    local ev = assert(pe.open("syscalls:sys_enter_getppid"))
    ev:reset()
    ev:enable()
    for _ = 1, 7 do sh("true") end -- a child process does not count (pid 0 = self)
    local n = 9
    require("petest").getppid(n)   -- the test module makes exact syscalls on every Lua
    ev:disable()
    local v = ev:read()
    ev:close()
    assert.are.equal(n, v)
  end)
end)
