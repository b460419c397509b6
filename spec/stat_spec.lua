-- pe.stat and the counter sets behind `luaperf stat`: exact syscall counts
-- from the kernel's tracepoints, the perf-stat-like report, errors.
local pe = require("perf_event")
local stat = require("perf_event.stat")
local U = require("support.util")

local function tp_id(name)
  local sys, ev = name:match("^([^:]+):(.+)$")
  for _, root in ipairs({ "/sys/kernel/tracing", "/sys/kernel/debug/tracing" }) do
    local f = io.open(root .. "/events/" .. sys .. "/" .. ev .. "/id", "r")
    if f then
      local id = tonumber(f:read("*l"))
      f:close()
      return id
    end
  end
end

local have_parse = pcall(require, "perf_event.parse")
local CLOSE = tp_id("syscalls:sys_enter_close")
local OPENAT = tp_id("syscalls:sys_enter_openat")

-- n io.open + close pairs: exactly n openat(2) and n close(2)
local function open_close(n)
  for _ = 1, n do
    local f = assert(io.open("/dev/null", "r"))
    f:close()
  end
  return n
end

describe("pe.stat", function()
  it("counts exactly the close(2) calls fn makes (tracepoint by id)", function()
    if not CLOSE then pending("tracefs not readable") return end
    local r, ret = assert(pe.stat(open_close, {
      { type = "tracepoint", config = CLOSE, name = "syscalls:sys_enter_close" },
      { type = "tracepoint", config = OPENAT, name = "syscalls:sys_enter_openat" },
    }, { args = { 37 } }))
    assert.equal(37, ret)
    assert.equal(37, r["syscalls:sys_enter_close"])
    assert.equal(37, r["syscalls:sys_enter_openat"])
    assert.equal("syscalls:sys_enter_close", r[1].name)
    assert.equal(r[1].enabled, r[1].running)
    assert.equal(100, r[1].percent)
  end)

  it("takes perf event strings", function()
    if not have_parse or not CLOSE then pending("needs perf_event.parse and tracefs") return end
    local r = assert(pe.stat(function() open_close(11) end,
                             "syscalls:sys_enter_close,task-clock,page-faults"))
    assert.equal(11, r["syscalls:sys_enter_close"])
    assert.truthy(r["task-clock"] > 0)
  end)

  it("prints like perf stat: header, value, unit, event, metric, elapsed", function()
    -- as a user perf's fallback adds :u to every name (its own test below)
    U.need_kernel()
    local r = assert(pe.stat(function() open_close(5) end, {
      { type = "software", config = 1, name = "task-clock" },
      { type = "software", config = 2, name = "page-faults" },
      CLOSE and { type = "tracepoint", config = CLOSE, name = "syscalls:sys_enter_close" } or nil,
    }, { label = "open_close" }))
    local s = tostring(r)
    assert.truthy(s:find("\n Performance counter stats for 'open_close':\n\n", 1, true), s)
    -- task-clock in msec with CPUs utilized, as perf prints it
    assert.truthy(s:find("\n +%d+%.%d%d msec task%-clock +# +%d+%.%d%d%d CPUs utilized\n"), s)
    -- counts right-aligned in 18 columns, then 6 spaces, then the name
    local pf = s:match("\n([^\n]*page%-faults[^\n]*)\n")
    assert.equal(("%18d      page-faults"):format(r["page-faults"]), pf:sub(1, 35))
    assert.truthy(pf:find("# +%d+%.%d%d%d [KMG]?/sec$"), pf)
    if CLOSE then
      assert.truthy(s:find(("\n%18d      syscalls:sys_enter_close"):format(5), 1, true), s)
    end
    assert.truthy(s:find("\n +%d+%.%d%d%d%d%d%d%d%d%d seconds time elapsed\n"), s)
  end)

  it("writes perf's -x CSV columns", function()
    -- as a user perf's fallback adds :u to every name (its own test below)
    U.need_kernel()
    local r = assert(pe.stat(function() open_close(3) end, {
      { type = "software", config = 1, name = "task-clock" },
      { type = "software", config = 3, name = "context-switches" },
    }))
    local lines = {}
    for l in r:csv(";"):gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.equal(2, #lines)
    local v, unit, name, run, pct, metric, munit =
      lines[1]:match("^([^;]*);([^;]*);([^;]*);([^;]*);([^;]*);([^;]*);(.*)$")
    assert.truthy(tonumber(v))
    assert.equal("msec", unit)
    assert.equal("task-clock", name)
    assert.truthy(tonumber(run) > 0)
    assert.equal("100.00", pct)
    assert.truthy(tonumber(metric))
    assert.equal("CPUs utilized", munit)
    assert.truthy(lines[2]:find("^%d+;;context%-switches;%d+;100%.00;"), lines[2])
  end)

  it("shows the multiplexing percentage and <not counted> like perf", function()
    local r = stat.derive({
      { name = "a", value = 1000, enabled = 200, running = 100, counted = true,
        attr = { type = "hardware", config = 0 } },
      { name = "b", value = 0, enabled = 200, running = 0, counted = false, attr = { type = 1, config = 9 } },
    })
    local lines = stat.lines(r)
    assert.truthy(lines[1]:find("%(50%.00%%%)$"), lines[1])
    assert.truthy(lines[2]:find("^ +<not counted>"), lines[2])
  end)

  it("derives GHz and insn per cycle from cycles, instructions and task-clock", function()
    local r = stat.derive({
      { name = "task-clock", value = 2e6, enabled = 1, running = 1, counted = true, attr = { type = 1, config = 1 } },
      { name = "cycles", value = 5e6, enabled = 1, running = 1, counted = true, attr = { type = 0, config = 0 } },
      { name = "instructions", value = 1e7, enabled = 1, running = 1, counted = true, attr = { type = 0, config = 1 } },
    })
    assert.equal("GHz", r[2].metric_unit)
    assert.equal(2.5, r[2].metric)
    assert.equal("insn per cycle", r[3].metric_unit)
    assert.equal(2, r[3].metric)
  end)

  it("returns nil, message, errno when the kernel refuses an event", function()
    local r, err, errno = pe.stat(function() end, { { type = "software", config = 99, name = "bogus" } })
    assert.is_nil(r)
    assert.truthy(err:find("bogus", 1, true), err)
    assert.equal("number", type(errno))
  end)

  it("raises on caller mistakes", function()
    assert.has_error(function() pe.stat(42, {}) end)
    assert.has_error(function() pe.stat(function() end, 42) end)
    assert.has_error(function() pe.stat(function() end, {}) end)
    -- an unknown option or opts of the wrong type, at the caller's line; nothing opened
    local before = U.count_perf_fds()
    local ok, err = pcall(function() local r = pe.stat(function() end, "task-clock", { lable = "x" }) return r end)
    assert.is_false(ok)
    assert.truthy(err:find("stat_spec.lua:%d+: perf_event.stat: unknown option 'lable'"), err)
    ok, err = pcall(function() local r = pe.stat(function() end, "task-clock", "x") return r end)
    assert.is_false(ok)
    assert.truthy(err:find("stat_spec.lua:%d+: perf_event.stat: opts must be a table, got string"), err)
    assert.equal(before, U.count_perf_fds())
  end)

  it("re-raises fn's error and leaks no descriptor", function()
    local before = U.count_perf_fds()
    local ok, err = pcall(pe.stat, function() error("boom") end,
                          { { type = "software", config = 1, name = "task-clock" } })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("boom", 1, true))
    -- perf fds only: io.popen's pipe may show both ends to a racing child
    assert.equal(before, U.count_perf_fds())
  end)
end)

describe("counter sets", function()
  it("count a child from exec on, inherited by its children (enable_on_exec)", function()
    if not CLOSE then pending("tracefs not readable") return end
    local core = require("perf_event.core")
    local getppid = tp_id("syscalls:sys_enter_getppid")
    local child = assert(core.spawn({ "build/test/petarget", "getppid", "321" }, { stopped = true }))
    local set = assert(stat.open({ { type = "tracepoint", config = getppid, name = "getppid" } },
                                 { pid = child:pid(), inherit = true, enable_on_exec = true }))
    assert(child:start())
    local how, code = child:wait()
    assert.equal("exited", how)
    assert.equal(0, code)
    local r = set:read()
    set:close()
    assert.equal(321, r.getppid)
  end)

  it("open '{a,b}' as a kernel group: a member counts only while its leader does", function()
    if not CLOSE then pending("tracefs not readable") return end
    -- the member is enabled, the leader disabled: in a group nothing counts
    local set = assert(stat.open("{syscalls:sys_enter_close,syscalls:sys_enter_openat}", { disabled = true }))
    local member = set.counters[2].fds[1]
    assert.is_true(member:info().member)
    open_close(5)
    local r = set:read()
    assert.equal(0, r["syscalls:sys_enter_openat"])
    -- the leader alone enabled: the member counts too (kernel group scheduling)
    assert(set.counters[1].fds[1]:enable())
    open_close(7)
    set.counters[1].fds[1]:disable()
    r = set:read()
    set:close()
    assert.equal(7, r["syscalls:sys_enter_close"])
    assert.equal(7, r["syscalls:sys_enter_openat"])
    -- pe.stat takes the same group and counts both exactly
    r = assert(pe.stat(open_close, "{syscalls:sys_enter_close,syscalls:sys_enter_openat}", { args = { 9 } }))
    assert.equal(9, r["syscalls:sys_enter_close"])
    assert.equal(9, r["syscalls:sys_enter_openat"])
  end)

  it("keep_going: an event the kernel refuses is kept as <not supported>, the rest counted", function()
    local pe_ok = pe.open("cycles")
    if pe_ok then pe_ok:close() pending("a hardware PMU: cycles opens here") return end
    local set = assert(stat.open("page-faults,cycles", { disabled = true, keep_going = true }))
    assert.is_true(set:enable())          -- doc/api.md: true, or fail
    require("petest").touch_pages(64)     -- 64 fresh pages: 64 faults at least
    assert.is_true(set:disable())
    local r = set:read()
    set:close()
    assert.is_true(r[1].counted)
    assert.truthy(r[1].value > 0)
    assert.is_false(r[2].supported)
    assert.equal(require("perf_event.core").abi.errno.ENOENT, r[2].errno)
    assert.equal("<not supported>,,cycles,0,100.00,,", r:csv(","):match("\n([^\n]*)\n$"))
    assert.is_nil(stat.open("page-faults,cycles", { disabled = true }))
  end)
end)
