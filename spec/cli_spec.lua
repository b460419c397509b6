-- bin/luaperf end to end: stat against the kernel's exact counts and perf's
-- own figure, record's folded stacks naming petarget's functions, list,
-- exit codes and usage errors.  Runs the tool under the suite's interpreter.
local U = require("support.util")
local sh, run, readable = U.run, U.luaperf, U.readable

local have_tracefs = readable("/sys/kernel/tracing/events/syscalls/sys_enter_getppid/id")
local have_perf = select(1, sh("command -v perf")) ~= ""

describe("luaperf stat", function()
  it("counts exactly the getppid(2) calls of the command, as perf stat does", function()
    if not have_tracefs then pending("tracefs is not readable by this user") return end
    local out, rc = run("stat -e syscalls:sys_enter_getppid -- build/test/petarget getppid 4321")
    assert.equal(0, rc, out)
    assert.truthy(out:find("\n Performance counter stats for 'build/test/petarget getppid 4321':\n", 1, true), out)
    local n = out:match("\n +(%d+)      syscalls:sys_enter_getppid\n")
    assert.equal("4321", n, out)
    if not have_perf then pending("perf is not installed: figure not cross-checked") return end
    local pout = sh("perf stat -x, -e syscalls:sys_enter_getppid -- build/test/petarget getppid 4321 2>&1")
    assert.equal(n, pout:match("(%d+),,syscalls:sys_enter_getppid"), pout)
  end)

  it("agrees with perf stat -x on several events in CSV", function()
    if not have_tracefs then pending("tracefs is not readable by this user") return end
    local out, rc = run("stat -x, -e syscalls:sys_enter_getppid,task-clock,page-faults -- "
                        .. "build/test/petarget getppid 77")
    assert.equal(0, rc, out)
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.equal("77,,syscalls:sys_enter_getppid", lines[1]:match("^([^,]*,[^,]*,[^,]*)"))
    assert.truthy(lines[2]:find("^%d+%.%d%d,msec,task%-clock,%d+,100%.00,%d+%.%d+,CPUs utilized$"), lines[2])
    assert.truthy(lines[3]:find("^%d+,,page%-faults,%d+,100%.00,"), lines[3])
    if have_perf then
      local pout = sh("perf stat -x, -e syscalls:sys_enter_getppid -- build/test/petarget getppid 77 2>&1")
      assert.equal("77", pout:match("(%d+),,syscalls:sys_enter_getppid"))
    end
  end)

  it("exits with the command's status", function()
    local out, rc = run("stat -e task-clock -- sh -c 'exit 3'")
    assert.equal(3, rc, out)
    assert.truthy(out:find("task-clock", 1, true))
  end)

  it("uses perf's default software events without -e", function()
    -- as a user perf's fallback adds :u to every name (cli_stat_spec checks it)
    U.need_kernel()
    local out, rc = run("stat -- true")
    assert.equal(0, rc, out)
    for _, e in ipairs({ "task-clock", "context-switches", "cpu-migrations", "page-faults" }) do
      assert.truthy(out:find(" " .. e:gsub("%-", "%%-") .. " "), out)
    end
    assert.truthy(out:find("seconds time elapsed", 1, true))
    assert.truthy(out:find("seconds user", 1, true))
  end)

  it("prints interval lines with -I", function()
    local out, rc = run("stat -I 50 -e task-clock -- build/test/petarget sleep 220")
    assert.equal(0, rc, out)
    assert.truthy(out:find("#           time             counts unit events", 1, true), out)
    local n = 0
    for _ in out:gmatch("\n +%d+%.%d+ +%d+%.%d%d msec task%-clock") do n = n + 1 end
    assert.truthy(n >= 2, out)
  end)

  it("attaches to a running process with -p for as long as CMD runs", function()
    local core = require("perf_event.core")
    local child = assert(core.spawn({ "build/test/petarget", "sleep", "5000" }))
    local out, rc = run("stat -e task-clock -p " .. child:pid() .. " -- true")
    child:kill(9)
    child:wait()
    assert.equal(0, rc, out)
    assert.truthy(out:find("Performance counter stats for 'process id '" .. child:pid(), 1, true) or
                  out:find("process id", 1, true), out)
  end)

  it("says what is wrong and exits 2 on usage errors", function()
    local out, rc = run("stat --bogus -- true")
    assert.equal(2, rc)
    assert.truthy(out:find("unknown option --bogus", 1, true), out)
    assert.truthy(out:find("usage: luaperf stat", 1, true), out)
    out, rc = run("stat -e task-clock")
    assert.equal(2, rc)
    assert.truthy(out:find("give a command after '--'", 1, true), out)
    out, rc = run("stat -p 1 -a -- true")
    assert.equal(2, rc)
    assert.truthy(out:find("exclude each other", 1, true), out)
    out, rc = run("frobnicate")
    assert.equal(2, rc)
    assert.truthy(out:find("unknown command 'frobnicate'", 1, true), out)
  end)

  it("reports a command that does not exist with status 127", function()
    local out, rc = run("stat -- /nonexistent/cmd")
    assert.equal(127, rc)
    assert.truthy(out:find("ENOENT", 1, true), out)
  end)

  it("reports a bad event string without running anything", function()
    local out, rc = run("stat -e no-such-event -- true")
    assert.equal(1, rc)
    assert.truthy(out:find("no-such-event", 1, true), out)
  end)

  it("prints --help for each command", function()
    for _, c in ipairs({ "stat", "list", "record" }) do
      local out, rc = run(c .. " --help")
      assert.equal(0, rc)
      assert.truthy(out:find("usage: luaperf " .. c, 1, true), out)
    end
    local out, rc = run("--help")
    assert.equal(0, rc)
    assert.truthy(out:find("record", 1, true))
  end)
end)

describe("luaperf list", function()
  it("lists software events and filters by pattern", function()
    local out, rc = run("list")
    assert.equal(0, rc)
    assert.truthy(out:find("\n  task%-clock +%[Software event%]"), out)
    out, rc = run("list faults")
    assert.equal(0, rc)
    assert.truthy(out:find("page-faults", 1, true))
    assert.is_nil(out:find("task-clock", 1, true))
    if have_tracefs then
      out = run("list 'syscalls:sys_enter_getppid'")
      assert.truthy(out:find("syscalls:sys_enter_getppid +%[Tracepoint event%]"), out)
    end
    out, rc = run("list no-such-thing-at-all")
    assert.equal(0, rc)   -- as perf list's
    assert.truthy(out:find("no event matches", 1, true), out)
  end)

  -- the event lines of a listing, "name [Kind]" with the padding squeezed;
  -- perf lists its tool events (duration_time, ...) with the software ones
  local function event_lines(out)
    local t, n = {}, 0
    for l in out:gmatch("[^\n]+") do
      local name, kind = l:match("^  (%S.-)%s+%[(.-)%]$")
      if name and kind ~= "Tool event" and kind ~= "SDT event" then
        t[name .. " [" .. kind .. "]"] = true
        n = n + 1
      end
    end
    return t, n
  end

  it("lists perf list's classes sw, hw, cache and pmu with the same lines as perf", function()
    if not have_perf then pending("needs perf (linux-perf)") return end
    for _, class in ipairs({ "sw", "hw", "cache", "pmu" }) do
      local out, rc = run("list " .. class)
      assert.equal(0, rc, out)
      local ours, n = event_lines(out)
      local theirs = event_lines((sh("perf list " .. class .. " 2>/dev/null")))
      assert.same(theirs, ours)
      if class == "sw" then
        assert.equal(12, n)   -- PERF_COUNT_SW_CPU_CLOCK .. PERF_COUNT_SW_CGROUP_SWITCHES
        assert.truthy(ours["context-switches OR cs [Software event]"])
      end
    end
  end)

  it("lists the same tracepoints as perf list tracepoint", function()
    if not have_perf then pending("needs perf (linux-perf)") return end
    if not have_tracefs then pending("tracefs is not readable by this user") return end
    local out, rc = run("list tracepoint")
    assert.equal(0, rc)
    local ours, n = event_lines(out)
    local theirs, pn = event_lines((sh("perf list tracepoint 2>/dev/null")))
    assert.truthy(ours["syscalls:sys_enter_getppid [Tracepoint event]"])
    assert.equal(pn, n)
    assert.same(theirs, ours)
  end)

  it("hides hardware and cache events the kernel refuses to open, unless --all", function()
    local pe = require("perf_event")
    local function opens(name)
      for _, n in ipairs({ name, name .. ":u" }) do
        local ev = pe.open(n)
        if ev then ev:close() return true end
      end
      return false
    end
    local out = run("list hw")
    local shown = event_lines(out)
    -- what the kernel answers for cpu-cycles decides (ENOENT without a PMU)
    assert.equal(opens("cpu-cycles"), shown["cpu-cycles OR cycles [Hardware event]"] == true)
    local cache = event_lines(run("list cache"))
    assert.equal(opens("L1-dcache-loads"), cache["L1-dcache-loads [Hardware cache event]"] == true)
    local all, n = event_lines(run("list --all hw"))
    assert.equal(10, n)   -- every generic hardware name, openable or not
    assert.truthy(all["cpu-cycles OR cycles [Hardware event]"])
    assert.truthy(all["stalled-cycles-frontend OR idle-cycles-frontend [Hardware event]"])
    local _, ncache = event_lines(run("list -a cache"))
    assert.equal(#require("perf_event.events").cache_list(), ncache)
  end)

  it("prints perf list's rNNN and mem: descriptor lines, before the tracepoints", function()
    local out = run("list")
    local r = out:find("\n  rNNN +%[Raw hardware event descriptor%]\n")
    local m = out:find("\n  mem:<addr>%[/len%]%[:access%] +%[Hardware breakpoint%]\n")
    assert.truthy(r and m and r < m, out)
    local tp = out:find("%[Tracepoint event%]")
    if tp then assert.truthy(m < tp) end
    assert.truthy(out:find("  task%-clock +%[Software event%]") < r)
    if have_perf then
      local pout = sh("perf list 2>/dev/null")
      for _, want in ipairs({ "  rNNN +%[Raw hardware event descriptor%]", "  mem:<addr>" }) do
        local mine, theirs = out:match("\n(" .. want .. "[^\n]*)"), pout:match("\n(" .. want .. "[^\n]*)")
        assert.equal(theirs, mine)
      end
    end
    -- a class with nothing this machine can open prints nothing, as perf
    local hw, rc = run("list hw")
    assert.equal(0, rc)
    if hw ~= "" then assert.truthy(hw:find("[Hardware event]", 1, true)) end
  end)
end)

describe("luaperf record", function()
  -- (made per test: a run whose filter takes none of these leaves nothing)
  local tmp
  before_each(function() tmp = os.tmpname() end)
  after_each(function() os.remove(tmp) end)

  local function folded()
    local stacks = {}
    for line in io.lines(tmp) do
      local stack, n = line:match("^(.+) (%d+)$")
      assert.truthy(stack, "not a folded line: " .. line)
      stacks[stack] = tonumber(n)
    end
    return stacks
  end

  it("-g names pet_spin_inner under its caller pet_spin under main", function()
    local out, rc = run("record -g -F 999 -o " .. tmp .. " -- build/test/petarget spin 200000000")
    assert.equal(0, rc, out)
    assert.truthy(out:find("samples", 1, true), out)
    local hits = 0
    for stack, n in pairs(folded()) do
      if stack:find("^petarget;.*main;pet_spin;pet_spin_inner") then hits = hits + n end
    end
    assert.truthy(hits > 0, "no petarget;...;main;pet_spin;pet_spin_inner stack in " .. tmp)
  end)

  it("without -g writes the sampled function alone", function()
    local out, rc = run("record -c 1000000 -o " .. tmp .. " -- build/test/petarget spin 200000000")
    assert.equal(0, rc, out)
    local stacks = folded()
    assert.truthy(stacks["petarget;pet_spin_inner"] and stacks["petarget;pet_spin_inner"] > 0)
  end)

  it("refuses -F with -c", function()
    local out, rc = run("record -F 99 -c 1000 -- true")
    assert.equal(2, rc)
    assert.truthy(out:find("exclude each other", 1, true), out)
  end)
end)
