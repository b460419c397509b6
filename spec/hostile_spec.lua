-- Hostile input for every public function (issue 7): wrong types,
-- negative/huge numbers, NaN, strings with NULs, enormous strings, nested
-- tables, methods on closed objects, methods with the wrong self, a group
-- after its leader closed, an fd closed behind the binding's back.  Each
-- case asserts the exact outcome: a raised error whose message names the
-- argument, or nil, message, errno with the kernel's errno.  Nothing may
-- crash, hang or leak (the suite also runs on the ASan+UBSan core).
local pe = require("perf_event")
local core = require("perf_event.core")
local U = require("support.util")

local NAN = 0 / 0
local EBADF, ESRCH, EINVAL = 9, 3, 22

-- f(...) raises an error whose message contains every plain string given
local function raises(needles, f, ...)
  local ok, err = pcall(f, ...)
  assert.is_false(ok, "expected a raised error")
  err = tostring(err)
  if type(needles) == "string" then needles = { needles } end
  for _, n in ipairs(needles) do
    assert(err:find(n, 1, true), ("error %q does not contain %q"):format(err, n))
  end
  return err
end

-- f(...) returns nil, message (containing `needle`), errno
local function fails(errno, needle, f, ...)
  local r, msg, e = f(...)
  assert.is_nil(r)
  assert.equal("string", type(msg))
  if needle then assert(msg:find(needle, 1, true), ("%q does not contain %q"):format(msg, needle)) end
  assert.equal(errno, e)
  return msg
end

-- f(...) returns nil, message (no errno: a lookup, not a system call)
local function no(needle, f, ...)
  local r, msg = f(...)
  assert.is_nil(r)
  if needle then
    assert.equal("string", type(msg))
    assert(msg:find(needle, 1, true), ("%q does not contain %q"):format(msg, needle))
  end
end

describe("pe.open with hostile specs", function()
  it("a spec of the wrong type raises naming the spec", function()
    raises("spec must be an event string or a table, got nil", pe.open, nil)
    raises("spec must be an event string or a table, got number", pe.open, 42)
    raises("spec must be an event string or a table, got boolean", pe.open, true)
    raises("spec.event must be an event string", pe.open, { event = 5 })
  end)

  it("empty, NUL-carrying and enormous event strings return nil and the parse error", function()
    no("empty event list", pe.open, "")
    no("unexpected", pe.open, "task-clock\0x")
    no("bad event string", pe.open, string.rep("a", 100000))
    no("bad event string", pe.open, string.rep("{", 5000))
    no("bad event string", pe.open, string.rep("task-clock:", 2000))
    no("empty event list", pe.group, "")
    no("bad event string", pe.group, string.rep("a", 100000))
  end)

  it("attr values: NaN, inf, fractions, nested tables, bad ranges, unknown fields raise naming the field", function()
    raises("attr field 'config': NaN is not an integer", pe.open, { type = "software", config = NAN })
    raises("attr field 'config': number out of 64-bit range", pe.open, { type = "software", config = 1 / 0 })
    raises("attr field 'config': number has a fractional part", pe.open, { type = "software", config = 1.5 })
    raises("attr field 'config': expected an integer", pe.open, { type = "software", config = { 1 } })
    raises("attr field 'type': out of range", pe.open, { type = 2 ^ 40 })
    raises("unknown attr field 'bogus'", pe.open, { type = "software", bogus = 1 })
    raises("keys must be field names, got a number key", pe.open, { type = "software", [1] = 1 })
    raises("unknown sample_type name 'bogus'", pe.open, { type = "software", sample_type = "ip|bogus" })
    raises("sample_type: entry 1 is a table, expected a name", pe.open,
      { type = "software", sample_type = { {} } })
    raises("attr field 'uprobe_path': string contains a NUL byte", pe.open,
      { type = "uprobe", uprobe_path = "/bin/true\0/etc/passwd" })
    raises("attr field 'sample_max_stack'", pe.open, { type = "software", sample_max_stack = 70000 })
    raises("attr field 'precise_ip': must be 0-3", pe.open, { type = "software", precise_ip = 4 })
  end)

  it("a negative config is a 64-bit bit pattern the kernel refuses: ENOENT", function()
    fails(2, "software event config 18446744073709551615", pe.open, { type = "software", config = -1 })
  end)

  it("options of the wrong type or range raise naming the option", function()
    raises("opts must be a table, got string", pe.open, "task-clock", "x")
    raises("unknown option 'bogus'", pe.open, "task-clock", { bogus = 1 })
    raises("option 'pid'", pe.open, "task-clock", { pid = NAN })
    raises("option 'pid': 1099511627776", pe.open, "task-clock", { pid = 2 ^ 40 })
    raises("option 'pages': 3 is not a power of two", pe.open, "task-clock", { pages = 3 })
    raises("option 'pages': must be >= 0", pe.open, "task-clock", { pages = -4 })
    raises("option 'group': expected a perf_event.event or an fd, got string", pe.open,
      "task-clock", { group = "x" })
    raises("option 'cgroup': expected a path or an fd, got table", pe.open, "task-clock", { cgroup = {} })
    raises("option 'cloexec': expected a boolean, got number", pe.open, "task-clock", { cloexec = 1 })
  end)

  it("a cgroup path with a NUL raises instead of opening the truncated path", function()
    raises("option 'cgroup': the path contains a NUL byte", pe.open, "task-clock",
      { cgroup = "/sys/fs/cgroup\0/../../etc" })
  end)

  it("numbers the kernel refuses come back as nil, message, errno", function()
    fails(ESRCH, "no process with pid -5", pe.open, "task-clock", { pid = -5 })
    fails(ESRCH, "pid 99999999", pe.open, "task-clock", { pid = 99999999 })
    fails(EINVAL, "cpu 1000000", pe.open, "task-clock", { cpu = 1000000 })
    fails(EINVAL, "cpu -2", pe.open, "task-clock", { cpu = -2 })
    fails(EBADF, "group_fd", pe.open, "task-clock", { group = 12345 })
  end)

  it("a ring larger than memory allows fails with ENOMEM or EPERM and leaks nothing", function()
    local spec = { event = "task-clock", sample_period = 100000 }
    assert.is_nil(pe.open(spec, { pages = 2 ^ 20 }))   -- warm up (lazy module loads)
    local fds, maps = U.count_perf_fds(), U.count_perf_maps()
    local ev, msg, errno = pe.open(spec, { pages = 2 ^ 20 })
    assert.is_nil(ev)
    assert.truthy(msg:find("^mmap%(task%-clock%)"))
    assert.truthy(errno == 12 or errno == 1)
    assert.equal(fds, U.count_perf_fds())
    assert.equal(maps, U.count_perf_maps())
  end)
end)

describe("lookups with hostile arguments", function()
  it("pe.attr, pe.parse, pe.describe return nil, message", function()
    no("spec must be an event string or a table, got nil", pe.attr, nil)
    no("spec must be an event string or a table, got number", pe.attr, 5)
    no("unexpected", pe.attr, "task-clock\0")
    no("an event string is expected, got nil", pe.parse, nil)
    no("an event string is expected, got table", pe.parse, {})
    no("bad event string", pe.parse, string.rep(",", 10000))
    no("spec must be an event string or a table, got nil", pe.describe, nil)
    no("an attr table needs 'event' or 'type'", pe.describe, {})
  end)

  it("pe.pmu raises for nil or a number, and is nil, msg for a path or a NUL-carrying name", function()
    assert.has_error(function() pe.pmu(nil) end, "bad argument #1 to 'pmu' (string expected, got nil)")
    assert.has_error(function() pe.pmu(5) end, "bad argument #1 to 'pmu' (string expected, got number)")
    assert.is_nil(pe.pmu("../../../etc"))
    assert.is_nil(pe.pmu("software\0x"))
    local none, msg = pe.pmu(string.rep("x", 5000))
    assert.is_nil(none)
    assert.truthy(#msg < 400 and msg:find('no PMU named "' .. string.rep("x", 57) .. '..."', 1, true), msg)
    assert.equal("software", pe.pmu("software").name)
  end)

  it("pe.list with a non-string pattern raises; a malformed pattern matches nothing", function()
    raises("perf_event.list: pattern must be a string, got table", pe.list, {})
    raises("perf_event.list: pattern must be a string, got boolean", pe.list, true)
    assert.same({}, pe.list("["))
    assert.equal("table", type(pe.list(string.rep("*", 300) .. "\0")))
    raises("perf_event.list: pattern has more than 64 '*' wildcards", pe.list, string.rep("*x", 300))
  end)

  it("pe.tracepoint refuses bad names and paths out of tracefs", function()
    U.need_tracing()
    no('bad tracepoint name "nil"', pe.tracepoint, nil)
    no('bad tracepoint name "5"', pe.tracepoint, 5)
    no("bad tracepoint name", pe.tracepoint, "../..:x")
    no("bad tracepoint name", pe.tracepoint, "syscalls:..")
    no("unknown tracepoint", pe.tracepoint, "syscalls\0:sys_enter_read")
    no("unknown tracepoint", pe.tracepoint, "nosuch:thing")
  end)

  it("pe.sysctl returns numbers", function()
    local s = pe.sysctl()
    assert.equal("number", type(s.paranoid))
    assert.equal("number", type(s.max_sample_rate))
  end)

  it("pe.stat and pe.group raise on arguments of the wrong type", function()
    raises("perf_event.stat: fn must be a function, got nil", pe.stat, nil)
    raises("events must be a string or an array, got nil", pe.stat, function() end, nil)
    raises("pe.group takes an array of specs or a '{a,b}' string, got nil", pe.group, nil)
    raises("pe.group takes an array of specs or a '{a,b}' string, got number", pe.group, 5)
    raises("spec must be an event string or a table, got number", pe.group, { "task-clock", 5 })
  end)

  it("pe.group returns nil, msg for an empty array and a spec that does not resolve", function()
    no("pe.group needs at least one event", pe.group, {})
    no("bad event string", pe.group, "{task-clock,")
    no("unknown event 'nosuch'", pe.group, { "task-clock", "nosuch" })
  end)
end)

describe("event methods with hostile arguments", function()
  local ev, tp, g
  before_each(function()
    ev = assert(pe.open("task-clock"))
    -- the tests using tp start with U.need_tracing()
    tp = U.can_trace() and assert(pe.open({ event = "syscalls:sys_enter_getppid", sample_period = 1,
      sample_type = "ip" })) or nil
    g = assert(pe.group("{task-clock,page-faults}"))
  end)
  after_each(function()
    ev:close(); g:close()
    if tp then tp:close() end
  end)

  it("every method called with a wrong self raises naming the expected class", function()
    for _, m in ipairs({ "enable", "disable", "reset", "read", "read_raw", "fd", "id", "name",
                         "attr", "info", "refresh", "period", "set_output", "set_filter",
                         "set_bpf", "pause_output", "modify", "query_bpf", "records", "poll",
                         "lost", "ring", "map_aux", "aux", "close" }) do
      raises({ "bad argument #1", "perf_event.event expected" }, ev[m], "x")
      raises({ "bad argument #1", "perf_event.event expected" }, ev[m], g)
      raises({ "bad argument #1", "perf_event.event expected" }, ev[m], nil)
    end
    for _, m in ipairs({ "enable", "disable", "reset", "read", "members", "close", "fd", "id",
                         "attr", "info", "refresh", "period", "set_filter" }) do
      raises({ "bad argument #1", "perf_event.group expected" }, g[m], ev)
      raises({ "bad argument #1", "perf_event.group expected" }, g[m], {})
    end
  end)

  it("ioctl arguments out of range raise; ones the kernel refuses return its errno", function()
    U.need_tracing()
    raises("bad argument #2", ev.refresh, ev, NAN)
    raises("must be 0..2^31-1", ev.refresh, ev, -1)
    raises("bad argument #2", ev.refresh, ev, "x")
    raises("NaN is not an integer", ev.period, ev, NAN)
    fails(EINVAL, "period(task-clock): EINVAL", ev.period, ev, -1)
    fails(EINVAL, "period(syscalls:sys_enter_getppid): EINVAL", tp.period, tp, "18446744073709551615")
    raises("expected a perf_event.event, an fd or nil", ev.set_output, ev, "x")
    fails(EBADF, "set_output(task-clock): EBADF", ev.set_output, ev, 99999)
    raises("bad argument #2", tp.set_filter, tp, nil)
    raises("filter contains a NUL byte", tp.set_filter, tp, "common_pid == 1\0 || 1")
    fails(EINVAL, "set_filter(syscalls:sys_enter_getppid): EINVAL", tp.set_filter, tp,
      string.rep("x", 1000000))
    fails(EINVAL, "set_filter(syscalls:sys_enter_getppid): EINVAL", tp.set_filter, tp, "nope == 1")
    fails(EBADF, "set_bpf(task-clock): EBADF", ev.set_bpf, ev, -1)
    fails(EINVAL, "pause_output(task-clock): EINVAL", ev.pause_output, ev, true)
    raises("bad argument #2", ev.modify, ev, nil)
    raises("unknown attr field 'bogus'", ev.modify, ev, { bogus = 1 })
    raises("modify: field 'config' cannot be changed", ev.modify, ev, { config = 1 })
    raises("keys must be field names", ev.modify, ev, { [1] = 1 })
    fails(EINVAL, "modify(task-clock): EINVAL", ev.modify, ev, { bp_addr = 1 })
    raises("0..256", ev.query_bpf, ev, -1)
    raises("0..256", ev.query_bpf, ev, 1e9)
    raises("a power of two of pages", tp.map_aux, tp, 3)
    fails(95, "this PMU has no AUX area", tp.map_aux, tp, 1)
  end)

  it("poll refuses a NaN timeout instead of waiting forever", function()
    U.need_tracing()
    raises("timeout is NaN", tp.poll, tp, NAN)
    raises("bad argument #2", tp.poll, tp, "x")
    assert.is_false(tp:poll(0))
  end)

  it("records() of an event without a ring raises saying why", function()
    U.need_tracing()
    raises("this event has no ring buffer", ev.records, ev)
    raises("the argument must be a table to reuse, got number", tp.records, tp, 1)
  end)

  it("a group's read ignores a non-table reuse argument", function()
    local t = g:read(5)
    assert.equal("table", type(t))
    assert.equal("number", type(t.time_enabled))
  end)
end)

describe("closed objects", function()
  it("every method of a closed event raises, except close/name/attr/info/lost/tostring", function()
    U.need_tracing()
    local ev = assert(pe.open({ event = "syscalls:sys_enter_getppid", sample_period = 1, sample_type = "ip" }))
    ev:close()
    for _, m in ipairs({ "enable", "disable", "reset", "read", "read_raw", "fd", "id", "refresh",
                         "period", "set_output", "set_filter", "set_bpf", "pause_output",
                         "modify", "query_bpf", "records", "poll", "ring", "map_aux", "aux" }) do
      local arg = ({ modify = {}, records = {}, set_filter = "x", poll = 0 })[m] or 1
      raises("attempt to use a closed perf_event.event", ev[m], ev, arg)
    end
    ev:close()
    assert.equal("syscalls:sys_enter_getppid", ev:name())
    assert.is_true(ev:info().closed)
    assert.equal(2, ev:attr().type)
    assert.equal(0, ev:lost())
    assert.equal("perf_event.event(syscalls:sys_enter_getppid, closed)", tostring(ev))
  end)

  it("a group whose leader was closed raises on group operations", function()
    local g = assert(pe.group("{task-clock,page-faults}"))
    g:members()[1]:close()
    for _, m in ipairs({ "enable", "disable", "reset", "read" }) do
      raises("attempt to use a closed perf_event.group", g[m], g)
    end
    raises("attempt to use a closed perf_event.event", g.fd, g)
    raises("attempt to use a closed perf_event.event", g.refresh, g, 1)
    g:close()
    g:close()
  end)

  it("a closed group raises on every operation and forwarded ioctl", function()
    local g = assert(pe.group("{task-clock,page-faults}"))
    g:close()
    for _, m in ipairs({ "enable", "disable", "reset", "read", "fd", "id", "attr", "info",
                         "refresh", "period", "set_filter", "query_bpf" }) do
      raises("attempt to use a closed perf_event.group", g[m], g)
    end
    assert.same({}, g:members())
    assert.equal(0, #g)
    assert.equal("perf_event.group(closed)", tostring(g))
  end)

  it("an fd closed behind the binding's back gives EBADF, and close() stays safe", function()
    local petest = require("petest")
    local ev = assert(pe.open("task-clock", { pages = false }))
    local fd = ev:fd()
    petest.closefd(fd)
    fails(EBADF, "read(task-clock): EBADF", ev.read, ev)
    fails(EBADF, "enable(task-clock): EBADF", ev.enable, ev)
    ev:close()
    assert.is_true(ev:info().closed)
  end)
end)

describe("hostile bytes through the decoders", function()
  it("a malformed record leaves exactly nil, message (no half-built table on the stack)", function()
    -- a SAMPLE with regs_user whose register block is cut short
    local rec = string.char(9, 0, 0, 0, 0, 0, 24, 0) .. U.le64(2) .. U.le64(1)
    local opts = { sample_type = "regs_user", sample_regs_user = 0xff }
    assert.equal(2, select("#", core.decode_record(rec, opts)))
    local r, msg = core.decode_record(rec, opts)
    assert.is_nil(r)
    assert.equal("sample record (24 bytes): record truncated in regs", msg)
  end)

  it("poll(0) on a drained simulated ring returns false at once (no spin on a ready fd)", function()
    local ring = string.char(14, 0, 0, 0, 0, 0, 8, 0) .. string.rep("\0", 56)   -- one SWITCH
    local ev = U.sim().sim_ring({ data = ring, head = 8, tail = 0 })
    assert.is_true(ev:poll(0))
    local n = 0
    for rec in ev:records() do n = n + 1; assert.equal("switch", rec.type) end
    assert.equal(1, n)
    assert.is_false(ev:poll(0))
    assert.is_false(ev:poll(1))
    ev:close()
  end)

  it("read_format buffers of every length and layout decode or fail cleanly", function()
    for rf = 0, 31 do
      for len = 0, 48, 8 do
        local r, msg = core.decode_read(string.rep("\1", len), rf)
        if r == nil then
          assert.equal(("read_format buffer truncated (%d bytes)"):format(len), msg)
        end
      end
    end
    -- a group whose nr claims more members than the bytes hold
    local r, msg = core.decode_read(U.le64(1000000) .. U.le64(5), "group")
    assert.is_nil(r)
    assert.equal("read_format buffer truncated (16 bytes)", msg)
  end)
end)

-- Lua numbers the kernel takes as int are range-checked before the cast:
-- (int)1e12 would silently become another pid/fd/count (or be undefined).
-- Each case also shows what the old truncation would have done.
describe("int arguments out of range (issue 11)", function()
  -- software/task-clock, user space only: a user under paranoid 2 gets the
  -- kernel's answer about the pid or fd, not EACCES
  local TC = { type = 1, config = 1, exclude_kernel = true, exclude_hv = true }
  local INT_MAX = 2 ^ 31 - 1

  it("pid and cpu beyond int raise instead of truncating", function()
    raises("option 'pid': 1000000000000 is out of range", core.open, TC, { pid = 1e12 })
    raises("option 'pid': 4294967296 is out of range", core.open, TC, { pid = 2 ^ 32 })
    raises("option 'pid': -2147483649 is out of range", core.open, TC, { pid = -2 ^ 31 - 1 })
    raises("option 'cpu': 4294967296 is out of range", core.open, TC, { cpu = 2 ^ 32 })
    raises("option 'pid': 1000000000000 is out of range", pe.open, "task-clock", { pid = 1e12 })
    raises("option 'pid': 1.5 is not an integer", core.open, TC, { pid = 1.5 })
    -- in range, the kernel decides: no task has pid INT_MAX (pid_max <= 2^22)
    fails(ESRCH, "perf_event_open", core.open, TC, { pid = INT_MAX })
    -- (int)(2^32 + our pid) would have been our pid: a silent self-measurement
    raises("out of range", core.open, TC, { pid = 2 ^ 32 + U.pid() })
  end)

  it("group and cgroup fds beyond int raise; 2^32 + fd is not fd", function()
    local leader = assert(core.open({ type = 1, config = 1, read_format = "group",
                                      exclude_kernel = true, exclude_hv = true }, {}))
    raises("option 'group': " .. ("%d"):format(2 ^ 32 + leader:fd()) .. " is out of range",
           core.open, TC, { group = 2 ^ 32 + leader:fd() })
    raises("option 'cgroup': 4294967296 is out of range", core.open, TC, { cgroup = 2 ^ 32, cpu = 0 })
    raises("option 'cgroup': -1 is out of range", core.open, TC, { cgroup = -1, cpu = 0 })
    -- the fd itself still makes a group member
    local m = assert(core.open(TC, { group = leader:fd() }))
    assert.is_true(m:info().member)
    m:close()
    leader:close()
  end)

  it("pages and flags beyond int raise", function()
    raises("option 'pages': 4294967296 is out of range", core.open, TC, { pages = 2 ^ 32 })
    raises("option 'pages': 1e+15 is out of range", core.open, TC, { pages = 1e15 })
    raises("option 'flags': 4294967304 is out of range", core.open, TC, { flags = 2 ^ 32 + 8 })
  end)

  it("ioctl fd arguments beyond int raise; in range the kernel answers", function()
    local ev = assert(pe.open("task-clock"))
    local other = assert(pe.open("task-clock"))
    -- SET_OUTPUT's fd: the kernel would read 2^32 + fd as fd
    raises("set_output: target fd: " .. ("%d"):format(2 ^ 32 + other:fd()) .. " is out of range",
           ev.set_output, ev, 2 ^ 32 + other:fd())
    fails(EBADF, "set_output(task-clock): EBADF", ev.set_output, ev, INT_MAX)
    -- SET_BPF's fd was cast to u32: 2^32 + 5 became fd 5
    raises("set_bpf: program fd: 4294967301 is out of range", ev.set_bpf, ev, 2 ^ 32 + 5)
    raises("set_bpf: program fd: 1e+300 is out of range", ev.set_bpf, ev, 1e300)
    fails(EBADF, "set_bpf(task-clock): EBADF", ev.set_bpf, ev, INT_MAX)
    ev:close()
    other:close()
  end)

  it("errno, pid and cpu of core.explain/strerror beyond int raise", function()
    raises("strerror: errno: 4294967318 is out of range", core.strerror, 2 ^ 32 + 22)
    assert.equal("EINVAL", (core.strerror(22)))
    raises("explain: errno: 4294967309 is out of range", core.explain, 2 ^ 32 + 13, TC)
    raises("explain: pid: 1000000000000 is out of range", core.explain, 13, TC, { pid = 1e12 })
    raises("explain: cpu: 4294967296 is out of range", core.explain, 13, TC, { cpu = 2 ^ 32 })
  end)

  it("child:kill's signal and wait_pid's pid beyond int raise; a huge timeout is not short", function()
    local child = assert(core.spawn({ "sleep", "0.3" }))
    -- (int)(2^32 + 9) is SIGKILL
    raises("kill: signal: 4294967305 is out of range", child.kill, child, 2 ^ 32 + 9)
    assert.is_true(child:kill(0))      -- still there
    raises("wait_pid: pid: 1000000000000 is out of range", core.wait_pid, 1e12, 0)
    -- 2^32 + 5 ms must not become 5 ms: this waits for the exit, not a timeout
    local status, code = child:wait(2 ^ 32 + 5)
    assert.equal("exited", status)
    assert.equal(0, code)
  end)

  it("child:wait and wait_pid time out no sooner than asked", function()
    -- (their deadline came from a clock truncated to the ms: a 5 ms wait
    -- could end after 4, `luaperf stat -I 5` printed a step of 4.27 ms)
    local child = assert(core.spawn({ "sleep", "5" }))
    local ok, err = pcall(function()
      for _ = 1, 40 do
        local t0 = core.now()
        assert.is_false(child:wait(5))
        local t1 = core.now()
        assert.is_false(core.wait_pid(child:pid(), 3))
        local t2 = core.now()
        assert.is_true(t1 - t0 >= 0.005, ("child:wait(5) returned after %.3f ms"):format((t1 - t0) * 1e3))
        assert.is_true(t2 - t1 >= 0.003, ("wait_pid(pid, 3) returned after %.3f ms"):format((t2 - t1) * 1e3))
      end
    end)
    child:kill(9)
    child:wait()
    assert(ok, err)
  end)
end)

describe("a program's own FFI declarations", function()
  -- LuaJIT's ffi.C namespace is one per VM: a program that declared
  -- clock_gettime or zlib's functions with its own structs first must not
  -- break pe.profile or pprof.gzip (which declare theirs under names of
  -- their own), nor lose its declarations
  it("clock_gettime with struct timespec and zlib's with its own z_stream, declared first", function()
    U.need(jit ~= nil, "the FFI is LuaJIT's")
    local out, code = U.run("LUA_PATH='lua/?.lua;lua/?/init.lua;;' LUA_CPATH='build/?.so;;' luajit - 2>&1 <<'EOS'\n"
      .. [==[
local ffi = require("ffi")
ffi.cdef[[
  struct timespec { long tv_sec; long tv_nsec; };
  int clock_gettime(int clk, struct timespec *tp);
  typedef struct z_stream_s { char opaque[112]; } z_stream;
  const char *zlibVersion(void);
  int deflateInit2_(z_stream *s, int l, int m, int w, int ml, int st, const char *v, int n);
  unsigned long deflateBound(z_stream *s, unsigned long n);
  int deflate(z_stream *s, int flush);
  int deflateEnd(z_stream *s);
]]

local pe = require("perf_event")
local p = assert(pe.profile.start({ freq = 999 }))
local x = 0
for i = 1, 3e7 do x = x + i % 7 end
p:stop()
assert(p.duration_nanos > 0, "duration")
local gz, how = require("perf_event.pprof").gzip(("hello "):rep(50), "ffi")
assert(how == "ffi" and gz:byte(1) == 0x1f and gz:byte(2) == 0x8b, tostring(how))
local ts = ffi.new("struct timespec")
assert(ffi.C.clock_gettime(1, ts) == 0 and ts.tv_sec > 0, "the program's clock_gettime")
io.write("ok ", x > 0 and p.nsamples > 0 and "1" or "0", "\n")   -- (~30 ms of loop: ~30 samples)
EOS
]==])
    assert.are.equal("ok 1\n", out)
    assert.are.equal(0, code)
  end)
end)
