-- Errors: the nil, message, errno triple for every errno of doc/coverage.md I the
-- kernel gives here, messages that name the errno and what to do, and
-- raised errors for caller mistakes.
local pe = require("perf_event")
local core = require("perf_event.core")
local U = require("support.util")

local function expect_errno(errno, name, ev, msg, got)
  assert.is_nil(ev)
  assert.equal(errno, got)
  assert.is_string(msg)
  assert.matches(name, msg, 1, true)
end

describe("system-call errors", function()
  it("ENOENT for a hardware event on a machine without a hardware PMU", function()
    local ev, msg, errno = pe.open({ type = "hardware", config = 0, name = "cycles" })
    if ev then ev:close() pending("this machine has a hardware PMU") return end
    expect_errno(2, "ENOENT", ev, msg, errno)
    assert.matches("perf_event_open(cycles)", msg, 1, true)
    assert.matches("no hardware PMU", msg, 1, true)
  end)

  it("EINVAL for pid=-1, cpu=-1, naming the cause", function()
    local ev, msg, errno = pe.open({ type = "software", config = 1, name = "t" }, { pid = -1, cpu = -1 })
    expect_errno(22, "EINVAL", ev, msg, errno)
    assert.matches("pid=-1", msg, 1, true)
  end)

  it("EINVAL for a cpu that does not exist", function()
    local ev, msg, errno = pe.open({ type = "software", config = 1, name = "t" }, { cpu = 4096 })
    expect_errno(22, "EINVAL", ev, msg, errno)
    assert.matches("cpu 4096", msg, 1, true)
  end)

  it("EINVAL for an unknown tracepoint id, naming the tracepoint", function()
    local ev, msg, errno = pe.open({ type = "tracepoint", config = 999999, name = "tp" })
    expect_errno(22, "EINVAL", ev, msg, errno)
    assert.matches("tracepoint id 999999", msg, 1, true)
  end)

  it("EINVAL for a group member whose inherit is unlike the leader's, saying so", function()
    U.need_tracing()
    local lead = assert(pe.open({ type = "software", config = 1, name = "lead", read_format = 15 }))
    local sw = { type = "software", config = 2, name = "pf", inherit = true }
    local tp = pe.attr("syscalls:sys_enter_getppid")
    tp.inherit = true
    for _, spec in ipairs({ sw, tp }) do
      local ev, msg, errno = pe.open(spec, { group = lead })
      expect_errno(22, "EINVAL", ev, msg, errno)
      assert.matches("inherit unlike the leader's", msg, 1, true)
      spec.inherit = nil                          -- the same member without it joins
      local ok = assert(pe.open(spec, { group = lead }))
      ok:close()
    end
    lead:close()
  end)

  it("EBADF for a group fd that is not open", function()
    local ev, msg, errno = pe.open({ type = "software", config = 1, name = "t" }, { group = 9999 })
    expect_errno(9, "EBADF", ev, msg, errno)
    assert.matches("group_fd", msg, 1, true)
  end)

  it("ESRCH for a pid that does not exist", function()
    local ev, msg, errno = pe.open({ type = "software", config = 1, name = "t" }, { pid = 999999 })
    expect_errno(3, "ESRCH", ev, msg, errno)
    assert.matches("999999", msg, 1, true)
  end)

  it("E2BIG names the attr size the kernel wants, and that size works", function()
    local ev, msg, errno = pe.open({ type = "software", config = 1, size = 63, name = "t" })
    expect_errno(7, "E2BIG", ev, msg, errno)
    local want = tonumber(msg:match("attr size (%d+)"))
    assert.is_true(want >= 64)
    ev = assert(pe.open({ type = "software", config = 1, size = want, name = "t" }))
    ev:close()
  end)

  it("EOPNOTSUPP for a branch stack on a software event", function()
    local ev, msg, errno = pe.open({ type = "software", config = 0, sample_period = 10000,
                                     sample_type = "ip|branch_stack", branch_sample_type = "any",
                                     name = "cpu-clock" })
    expect_errno(95, "EOPNOTSUPP", ev, msg, errno)
    assert.matches("branch", msg, 1, true)
  end)

  it("EOVERFLOW for sample_max_stack above perf_event_max_stack", function()
    local ev, msg, errno = pe.open({ type = "software", config = 0, sample_period = 10000,
                                     sample_type = "ip|callchain", sample_max_stack = 60000,
                                     name = "cpu-clock" })
    expect_errno(75, "EOVERFLOW", ev, msg, errno)
    assert.matches("perf_event_max_stack", msg, 1, true)
  end)

  it("EINVAL for sigtrap without remove_on_exec, naming both", function()
    local ev, msg, errno = pe.open({ type = "software", config = 1, sigtrap = true, name = "t" })
    expect_errno(22, "EINVAL", ev, msg, errno)
    assert.matches("remove_on_exec", msg, 1, true)
  end)

  local function run_lua(prefix, code)
    local lua = U.lua_cmd()
    local cpath = package.cpath:gsub("'", "")
    local path = package.path:gsub("'", "")
    local cmd = ("%s %s -e 'package.path=[[%s]] package.cpath=[[%s]] %s' 2>&1")
      :format(prefix, lua, path, cpath, code)
    local p = io.popen(cmd)
    local out = p:read("*a")
    p:close()
    return out
  end

  it("EMFILE when RLIMIT_NOFILE runs out, with the limit in the hint", function()
    local out = run_lua("ulimit -n 16;", [[
      local pe = require("perf_event")
      local evs = {}
      for i = 1, 64 do
        local ev, msg, errno = pe.open({type="software", config=1, name="t"})
        if not ev then print(errno, msg) break end
        evs[i] = ev
      end]])
    local errno, msg = out:match("^(%d+)%s+(.-)\n")
    assert.equal("24", errno, out)
    assert.matches("EMFILE", msg, 1, true)
    assert.matches("RLIMIT_NOFILE=16", msg, 1, true)
  end)

  describe("as an unprivileged user (uid 65534)", function()
    -- uid 65534 may not be able to enter the checkout (CI clones anywhere):
    -- run from a world-readable copy of the Lua layer, the core and petest
    local stage
    local function staged()
      if stage then return stage end
      local p = io.popen("mktemp -d")
      local d = p:read("*l")
      p:close()
      local core_dir = U.searchpath("perf_event.core", package.cpath):gsub("/perf_event/core%.so$", "")
      local petest_so = U.searchpath("petest", package.cpath)
      assert(U.exec_ok(os.execute(table.concat({
        "mkdir -p " .. d .. "/lib/perf_event " .. d .. "/test/t",
        "cp -r lua " .. d .. "/lua",
        "cp " .. core_dir .. "/perf_event/core.so " .. d .. "/lib/perf_event/",
        "cp " .. petest_so .. " " .. d .. "/test/t/",
        "cp build/test/libpetarget.so " .. d .. "/test/",
        "chmod -R a+rX " .. d }, " && "))), "could not stage " .. d)
      stage = d
      return d
    end
    teardown(function()
      if stage then os.execute("rm -rf " .. stage) end
    end)

    -- runs code as uid 65534 (from root) or as this non-root user; env is
    -- a shell prefix such as "PE_SYSCTL_DIR=/x", caps one capability name
    -- kept as an ambient capability (e.g. "perfmon")
    local function unpriv(code, env, caps)
      local path, cpath, prefix
      if U.is_root() then
        local d = staged()
        path = d .. "/lua/?.lua;" .. d .. "/lua/?/init.lua;"
        cpath = d .. "/lib/?.so;" .. d .. "/test/t/?.so"
        prefix = "cd /tmp && " .. (env or "") .. " setpriv --reuid=65534 --regid=65534 --clear-groups "
          .. (caps and ("--inh-caps=-all,+%s --ambient-caps=+%s "):format(caps, caps) or "--inh-caps=-all ")
      else
        path = package.path:gsub("'", "")
        cpath = package.cpath:gsub("'", "")
        prefix = env or ""
      end
      local cmd = ("%s %s -e 'package.path=[[%s]] package.cpath=[[%s]] %s' 2>&1")
        :format(prefix, U.lua_cmd(), path, cpath, code)
      local p = io.popen(cmd)
      local out = p:read("*a")
      p:close()
      return out
    end

    -- a world-readable directory holding a fake perf_event_paranoid
    local function fake_sysctl(paranoid)
      local p = io.popen("mktemp -d")
      local d = p:read("*l")
      p:close()
      local f = assert(io.open(d .. "/perf_event_paranoid", "w"))
      f:write(paranoid, "\n")
      f:close()
      assert(os.execute("chmod -R a+rX " .. d))
      return d
    end

    it("EACCES for kernel-mode measurement, naming perf_event_paranoid", function()
      if not U.root_or_pending() then return end
      local paranoid = tonumber(io.open("/proc/sys/kernel/perf_event_paranoid"):read("*l"))
      if paranoid < 2 then pending("perf_event_paranoid < 2 here") return end
      local out = unpriv([[
        local core = require("perf_event.core")
        local ev, msg, errno = core.open({type="software", config=1}, {name="task-clock"})
        print(errno, msg)]])
      local errno, msg = out:match("^(%d+)%s+(.-)\n")
      assert.equal("13", errno, out)
      assert.matches("EACCES", msg, 1, true)
      assert.matches("perf_event_paranoid=" .. paranoid, msg, 1, true)
      assert.matches("exclude_kernel", msg, 1, true)
    end)

    it("pe.open falls back to user-space only, like perf, and says so in info()", function()
      if not U.root_or_pending() then return end
      local out = unpriv([[
        local pe = require("perf_event")
        local ev = assert(pe.open({type="software", config=1, name="task-clock"}))
        local i = ev:info()
        local a = ev:attr()
        print(i.auto_exclude_kernel, a.exclude_kernel, a.exclude_hv, (ev:read()) > 0, i.note ~= nil)]])
      assert.equal("true\ttrue\ttrue\ttrue\ttrue\n", out)
    end)

    it("counts its own syscall tracepoint exactly with exclude_kernel (A-up21)", function()
      if not U.root_or_pending() then return end
      U.need_tracefs()
      local id = U.tp_id("syscalls", "sys_enter_getppid")
      local out = unpriv(([[
        local pe = require("perf_event")
        local petest = require("petest")
        local ev = assert(pe.open({type="tracepoint", config=%d, name="getppid"}))
        petest.getppid(9)
        print((ev:read()), ev:info().auto_exclude_kernel)]]):format(id))
      assert.equal("9\ttrue\n", out)
    end)

    it("EACCES for a CPU-wide event, naming CAP_PERFMON", function()
      if not U.root_or_pending() then return end
      local out = unpriv([[
        local pe = require("perf_event")
        local ev, msg, errno = pe.open({type="software", config=1, name="t"}, {pid=-1, cpu=0})
        print(errno, msg)]])
      local errno, msg = out:match("^(%d+)%s+(.-)\n")
      assert.equal("13", errno, out)
      assert.matches("CAP_PERFMON", msg, 1, true)
    end)

    it("EACCES attaching to pid 1 names ptrace access, not ':u' (which was tried)", function()
      local out = unpriv([[
        local pe = require("perf_event")
        local ev, msg, errno = pe.open("task-clock", {pid=1})
        local ev2, msg2, errno2 = pe.open("task-clock:u", {pid=1})
        print(errno, msg) print(errno2, msg2)]])
      local e1, m1, e2, m2 = out:match("^(%d+)%s+(.-)\n(%d+)%s+(.-)\n")
      assert.equal("13", e1, out)
      assert.equal("13", e2, out)
      for _, m in ipairs({ m1, m2 }) do
        assert.matches("attaching to pid 1 needs ptrace access", m, 1, true)
        assert.is_nil(m:find("try the ':u' modifier", 1, true))
      end
    end)

    it("EACCES for a uprobe names CAP_SYS_ADMIN, also with CAP_PERFMON alone", function()
      local lib
      if U.is_root() then lib = staged() .. "/test/libpetarget.so"
      else
        local p = io.popen("pwd")
        lib = p:read("*l") .. "/build/test/libpetarget.so"
        p:close()
      end
      local code = ([[
        local pe = require("perf_event")
        local ev, msg, errno = pe.open({type="uprobe", uprobe_path=%q, probe_offset=0, name="up"})
        print(errno, msg)]]):format(lib)
      local runs = { unpriv(code) }
      if U.is_root() then runs[2] = unpriv(code, nil, "perfmon") end
      for _, out in ipairs(runs) do
        local errno, msg = out:match("^(%d+)%s+(.-)\n")
        assert.equal("13", errno, out)
        assert.matches("uprobe/kprobe PMU event needs CAP_SYS_ADMIN", msg, 1, true)
        assert.is_nil(msg:find("try the ':u' modifier", 1, true))
        assert.is_nil(msg:find("perf_event_paranoid=", 1, true))
      end
    end)

    it("EPERM for a ring over the mlock budget names perf_event_mlock_kb, not powers of two", function()
      local out = unpriv([[
        local pe = require("perf_event")
        local ev, msg, errno = pe.open({type="software", config=0, sample_period=100000, name="big"},
                                       {pages=1048576})
        print(errno, msg)]])
      local errno, msg = out:match("^(%d+)%s+(.-)\n")
      local kb = tonumber(io.open("/proc/sys/kernel/perf_event_mlock_kb"):read("*l"))
      assert.equal("1", errno, out)
      assert.matches("mmap(big): EPERM", msg, 1, true)
      assert.matches("1048576+1 pages", msg, 1, true)
      assert.matches("perf_event_mlock_kb=" .. kb, msg, 1, true)
      assert.is_nil(msg:find("power of two", 1, true))
    end)

    it("perf_event_paranoid=3 (simulated) gets its own hint, for a real EACCES too", function()
      local d3 = fake_sysctl(3)
      local out = unpriv([[
        local core = require("perf_event.core")
        print((core.explain(13, {type="software", config=1}, {name="task-clock"})))
        local ev, msg, errno = require("perf_event").open("task-clock:u", {pid=1})
        print(errno, msg)]], "PE_SYSCTL_DIR=" .. d3)
      os.execute("rm -rf " .. d3)
      local explained, errno, msg = out:match("^(.-)\n(%d+)%s+(.-)\n")
      assert.equal("13", errno, out)
      for _, m in ipairs({ explained, msg }) do
        assert.matches("perf_event_paranoid=3", m, 1, true)
        assert.matches("sysctl kernel.perf_event_paranoid=2", m, 1, true)
        assert.matches("CAP_PERFMON", m, 1, true)
      end
      -- the same explain without the simulation reads the real value
      local real = tonumber(io.open("/proc/sys/kernel/perf_event_paranoid"):read("*l"))
      out = unpriv([[
        print((require("perf_event.core").explain(13, {type="software", config=1})))]])
      assert.matches("perf_event_paranoid=" .. real, out, 1, true)
      if real ~= 3 then assert.is_nil(out:find("sysctl kernel.perf_event_paranoid=2", 1, true)) end
    end)

    it("hints per simulated perf_event_paranoid value", function()
      local cases = {
        { 3, { type = "software", config = 1 }, nil, "sysctl kernel.perf_event_paranoid=2" },
        { 2, { type = "software", config = 1 }, nil, "try the ':u' modifier" },
        { 2, { type = "software", config = 1 }, "{pid=-1, cpu=0}", "a CPU-wide event (pid=-1) needs" },
        { 1, { type = "software", config = 1 }, "{pid=-1, cpu=0}", "perf_event_paranoid < 1" },
        { 2, { type = "breakpoint", bp_type = 2 }, nil, "kernel-address breakpoint needs CAP_SYS_ADMIN", 1 },
        { 2, { type = "software", config = 1, exclude_kernel = true, namespaces = true }, nil,
          "namespaces=1 needs" },
      }
      for _, c in ipairs(cases) do
        local d = fake_sysctl(c[1])
        local attr = ("{type=%q, config=%d, bp_type=%s, exclude_kernel=%s, namespaces=%s}"):format(
          c[2].type, c[2].config or 0, tostring(c[2].bp_type), tostring(c[2].exclude_kernel),
          tostring(c[2].namespaces))
        local out = unpriv(([[print((require("perf_event.core").explain(%d, %s, %s)))]])
          :format(c[5] or 13, attr, c[3] or "nil"), "PE_SYSCTL_DIR=" .. d)
        os.execute("rm -rf " .. d)
        assert.matches(c[4], out, 1, true)
        if c[1] ~= 3 and not c[5] and not c[2].namespaces then
          assert.matches("perf_event_paranoid=" .. c[1], out, 1, true)
        end
      end
    end)
  end)
end)

describe("hints that name the true cause (as root)", function()
  it("EPERM on ftrace:function does not blame perf_event_paranoid when privileged", function()
    if not U.root_or_pending() then return end
    if not U.tracefs() then pending("tracefs is not readable") return end
    local ev, msg, errno = pe.open("ftrace:function")
    if ev then ev:close() pending("this kernel lets root open ftrace:function") return end
    assert.equal(1, errno, msg)
    assert.matches("EPERM", msg, 1, true)
    assert.matches("perf_event_paranoid is not the cause", msg, 1, true)
    assert.is_nil(msg:find("try the ':u' modifier", 1, true))
    assert.is_nil(msg:find("perf_event_paranoid=", 1, true))
    -- perf, as root too, is refused the same event
    local p = io.popen("perf stat -e ftrace:function -- true 2>&1")
    local out = p:read("*a")
    p:close()
    assert.matches("No permission to enable ftrace:function", out, 1, true)
  end)

  it("ENOMEM for a ring too big to allocate names its size, not powers of two", function()
    if not U.root_or_pending() then return end
    local ev, msg, errno = pe.open({ type = "software", config = 0, sample_period = 100000,
                                     name = "big" }, { pages = 1048576 })
    if ev then ev:close() pending("this machine mapped a 4 GiB ring") return end
    assert.equal(12, errno, msg)
    local p = io.popen("getconf PAGESIZE")
    local page = tonumber(p:read("*l"))
    p:close()
    assert.matches("mmap(big): ENOMEM", msg, 1, true)
    assert.matches(("1048576+1 pages (%d KiB)"):format(math.floor(1048577 * page / 1024)), msg, 1, true)
    assert.is_nil(msg:find("power of two", 1, true))
  end)

  it("a forked child's records() says the ring stayed in the parent", function()
    local petest = require("petest")
    local ev = assert(pe.open({ type = "software", config = 0, sample_period = 100000,
                                sample_type = "ip", name = "cpu-clock" }, { pages = 2 }))
    local plain = assert(pe.open({ type = "software", config = 1, name = "t" }, { pages = false }))
    local rc = petest.fork_run([[
      local ev, plain = ...
      local ok, err = pcall(function() for _ in ev:records() do end end)
      if ok then return 3 end
      err = tostring(err)
      if not err:find("mapped by the parent before fork()", 1, true) then return 4 end
      if err:find("open it with sample_period", 1, true) then return 5 end
      -- an event that never had a ring keeps the other message
      ok, err = pcall(function() for _ in plain:records() do end end)
      if ok or not tostring(err):find("open it with sample_period", 1, true) then return 6 end
      return 0
    ]], ev, plain)
    assert.equal(0, rc)
    -- the parent's ring is still there
    assert.is_true(ev:info().mapped)
    ev:close()
    plain:close()
  end)
end)

local function raises(fn, text)
  local ok, err = pcall(fn)
  assert.is_false(ok)
  assert.matches(text, tostring(err), 1, true)
end

describe("caller mistakes raise", function()
  it("on an unknown attr field", function()
    raises(function() pe.open({ type = "software", config = 1, bogus = 1 }) end,
      "unknown attr field 'bogus'")
  end)
  it("at the caller's line, not inside the binding", function()
    local ok, err = pcall(function() pe.open({ type = "software", config = 1, bogus = 1 }) end)
    assert.is_false(ok)
    assert.matches("^spec/errors_spec%.lua:%d+: unknown attr field 'bogus'", err)
    ok, err = pcall(function() pe.group({ { type = "software", config = 1 }, { type = "software", pid = 1 } }) end)
    assert.is_false(ok)
    assert.matches("^spec/errors_spec%.lua:%d+: unknown attr field 'pid'", err)
  end)
  it("on an unknown option", function()
    raises(function() pe.open({ type = "software", config = 1 }, { cpus = 1 }) end,
      "unknown option 'cpus'")
  end)
  it("on a spec that is neither a string nor a table", function()
    assert.has_error(function() pe.open(42) end)
  end)
  it("on an out-of-range u32 field", function()
    assert.has_error(function() core.open({ type = "software", config = 1, wakeup_events = 2 ^ 33 }) end)
  end)
  it("on a fractional or NaN config", function()
    assert.has_error(function() core.open({ type = "software", config = 1.5 }) end)
    assert.has_error(function() core.open({ type = "software", config = 0 / 0 }) end)
  end)
  it("on an unknown type or PMU name", function()
    local ok, err = pcall(core.open, { type = "nosuchpmu", config = 0 })
    assert.is_false(ok)
    assert.matches("nosuchpmu", err, 1, true)
  end)
  it("on pages that are not a power of two", function()
    assert.has_error(function() pe.open({ type = "software", config = 1 }, { pages = 3 }) end)
  end)
end)

describe("strerror", function()
  it("names errnos", function()
    local name = core.strerror(13)
    assert.equal("EACCES", name)
  end)
end)

-- simulated where the kernel here cannot be made to fail that way
describe("the hint for every perf_event_open errno (doc/coverage.md I)", function()
  local sw = { type = "software", config = 1 }
  local cases = {
    { 7, sw, nil, "E2BIG", "attr size" },
    { 9, sw, nil, "EBADF", "group_fd" },
    { 9, sw, { cgroup = true, cpu = 0 }, "EBADF", "cgroup" },
    { 16, sw, nil, "EBUSY", "exclusive access" },
    { 14, sw, nil, "EFAULT", "not readable" },
    { 4, sw, nil, "EINTR", "uprobe" },
    { 22, { type = "software", config = 1, inherit_thread = true }, nil, "EINVAL", "inherit_thread requires inherit" },
    { 22, { type = "breakpoint", bp_type = 1 }, nil, "EINVAL", "bp_type" },
    { 24, sw, nil, "EMFILE", "RLIMIT_NOFILE" },
    { 19, sw, nil, "ENODEV", "CPU model" },
    { 2, { type = "hardware", config = 0 }, nil, "ENOENT", "no hardware PMU" },
    { 2, sw, { cgroup = true, cpu = 0 }, "ENOENT", "perf_event controller" },
    { 28, { type = "breakpoint", bp_type = 2 }, nil, "ENOSPC", "at most 4" },
    { 38, sw, nil, "ENOSYS", "not supported" },
    { 95, { type = "software", config = 0, precise_ip = 2 }, nil, "EOPNOTSUPP", "precise" },
    { 75, { type = "software", config = 0, sample_max_stack = 500 }, nil, "EOVERFLOW", "perf_event_max_stack" },
    { 3, sw, { pid = 4242 }, "ESRCH", "4242" },
  }
  for _, c in ipairs(cases) do
    it(("explains %s (%s)"):format(c[4], c[5]), function()
      local msg = core.explain(c[1], c[2], c[3])
      assert.matches("perf_event_open(event): " .. c[4] .. ": ", msg, 1, true)
      assert.matches(c[5], msg, 1, true)
    end)
  end
end)
