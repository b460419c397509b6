-- luaperf stat's perf options and record's bug fixes, each checked against
-- what the kernel makes true (exact tracepoint counts, thread ids, CPUs)
-- and against `perf stat` / `perf record` run on the same command here.
local U = require("support.util")
local interp = jit and "luajit" or _VERSION:gsub("Lua ", "lua")

local sh = U.sh

-- runs luaperf with stdout+stderr together; returns the text and the exit code
local function run(args)
  local out = sh(interp .. " bin/luaperf " .. args .. " 2>&1; echo \"rc=$?\"")
  local rc = tonumber(out:match("rc=(%d+)\n?$"))
  return (out:gsub("rc=%d+\n?$", "")), rc
end

local function perf(args) return sh("perf " .. args .. " 2>&1") end

local function lines_of(s)
  local t = {}
  for l in s:gmatch("[^\n]+") do t[#t + 1] = l end
  return t
end

-- the lines of a CSV/JSON report, without perf's blank and comment lines
local function rows(s)
  local t = {}
  for _, l in ipairs(lines_of(s)) do
    if not l:find("^%s*$") and not l:find("^#") then t[#t + 1] = l end
  end
  return t
end

local have_perf = sh("command -v perf") ~= ""
local function need_perf() U.need(have_perf, "perf is not installed") end
local function need_tp()
  U.need(U.tracefs() ~= nil and U.is_root(), "tracepoints need root and tracefs")
end

-- whether `cycles` opens here (a hardware PMU); the VM has none
local function have_cycles()
  local ok, pe = pcall(require, "perf_event")
  if not ok then return false end
  local ev = pe.open("cycles")
  if ev then ev:close() return true end
  return false
end

local function tids_of(pid)
  local core = require("perf_event.core")
  local t = {}
  for _, n in ipairs(core.readdir("/proc/" .. pid .. "/task") or {}) do
    if n:match("^%d+$") then t[#t + 1] = tonumber(n) end
  end
  table.sort(t)
  return t
end

-- true once pid sleeps: /proc/PID/stat's state S at two reads 20 ms apart.
-- A target that just exec'ed spends ~1.5 ms of CPU in the dynamic loader
-- first (more under load): an -t test under ASan and steal once counted
-- 1.46 ms of it
local function asleep(pid)
  local core = require("perf_event.core")
  local function state()
    local f = io.open("/proc/" .. pid .. "/stat")
    local l = f and f:read("*l") or ""
    if f then f:close() end
    return l:match("%) (%S) ")
  end
  for _ = 1, 200 do
    local s1 = state()
    core.wait_pid(pid, 20)
    if s1 == "S" and state() == "S" then return true end
  end
  return false
end

-- a background petarget; returns pid and a function that ends it, once
-- it runs its own image with `tasks` threads (default 1)
local function background(args, tasks)
  local core = require("perf_event.core")
  local child = assert(core.spawn(args))
  for _ = 1, 400 do
    local f = io.open("/proc/" .. child:pid() .. "/comm")
    local comm = f and f:read("*l")
    if f then f:close() end
    if comm == "petarget" and #tids_of(child:pid()) >= (tasks or 1) then break end
    core.wait_pid(child:pid(), 5)
  end
  return child:pid(), function() child:kill(9) child:wait() end
end

describe("luaperf stat, as perf stat", function()
  it("prints <not supported> for an event the kernel refuses and counts the rest", function()
    -- as a user perf's fallback adds :u to every name (its own test below)
    U.need_kernel()
    U.need(not have_cycles(), "this machine has a hardware PMU: cycles opens")
    local out, rc = run("stat -x, -e task-clock,cycles,page-faults -- build/test/petarget getppid 3")
    assert.equal(0, rc, out)
    local r = rows(out)
    assert.equal(3, #r, out)
    assert.truthy(r[1]:find("^%d+%.%d%d,msec,task%-clock,%d+,100%.00,"), r[1])
    assert.equal("<not supported>,,cycles,0,100.00,,", r[2])
    assert.truthy(r[3]:find("^%d+,,page%-faults,"), r[3])
    need_perf()
    local p = rows(perf("stat -x, -e task-clock,cycles,page-faults -- build/test/petarget getppid 3"))
    assert.equal(p[2], r[2])
    -- and the human report
    out, rc = run("stat -e task-clock,cycles -- true")
    assert.equal(0, rc, out)
    assert.truthy(out:find("\n   <not supported>      cycles\n", 1, true), out)
  end)

  it("counts a {a,b} group with the leader as the members' group_fd, as perf does", function()
    need_perf()
    U.need(sh("command -v strace") ~= "", "strace is not installed")
    local function group_fds(cmd)
      local fds = {}
      -- -qq: no attach/exit notes; one traced call per line
      local text = sh("strace -f -qq -e trace=perf_event_open -e signal=none " .. cmd .. " 2>&1 >/dev/null")
      for fd in text:gmatch("perf_event_open%(%b{}, %-?%d+, %-?%d+, (%-?%d+), [^)]*%) = %d+") do
        fds[#fds + 1] = tonumber(fd)
      end
      return fds, text
    end
    local ours, text = group_fds(interp .. " bin/luaperf stat -e '{task-clock,page-faults}' -- true")
    local theirs = group_fds("perf stat -e '{task-clock,page-faults}' -- true")
    assert.equal(2, #ours, text)
    assert.equal(-1, ours[1])
    assert.truthy(ours[2] >= 0, "the member has a group_fd")
    assert.equal(-1, theirs[#theirs - 1])
    assert.truthy(theirs[#theirs] >= 0)
  end)

  it("marks name:u and says why once when the kernel was excluded (as nobody, like perf)", function()
    U.need_root("runs luaperf and perf as nobody with setpriv")
    U.need(U.paranoid() >= 2, "perf_event_paranoid < 2: the kernel is not excluded")
    need_perf()
    local as = "cd /tmp && setpriv --reuid=65534 --regid=65534 --clear-groups "
    local here = sh("pwd"):gsub("\n", "")
    local out = sh(as .. interp .. " " .. here .. "/bin/luaperf stat -x, -e task-clock,page-faults -- true 2>&1")
    local theirs = sh(as .. "perf stat -x, -e task-clock,page-faults -- true 2>&1")
    if out:find("cannot load", 1, true) then
      U.pending("luaperf cannot load its module as nobody here: " .. out:match("[^\n]*"))
    end
    local r, p = rows(out), rows(theirs)
    local notes = 0
    for _, l in ipairs(r) do if l:find("user-space only", 1, true) then notes = notes + 1 end end
    assert.equal(1, notes, out)
    local names, pnames = {}, {}
    for _, l in ipairs(r) do names[#names + 1] = l:match("^[^,]*,[^,]*,([^,]+),%d") end
    for _, l in ipairs(p) do pnames[#pnames + 1] = l:match("^[^,]*,[^,]*,([^,]+),%d") end
    assert.same({ "task-clock:u", "page-faults:u" }, names)
    assert.same(pnames, names)
    -- a refusal that is not "not supported" (EACCES for -a) still fails, as perf's
    local rc = tonumber(sh(as .. interp .. " " .. here .. "/bin/luaperf stat -a -e task-clock -- true 2>&1; echo $?")
                        :match("(%d+)\n$"))
    local prc = tonumber(sh(as .. "perf stat -a -e task-clock -- true >/dev/null 2>&1; echo $?"):match("(%d+)\n$"))
    assert.equal(1, rc)
    assert.are_not.equal(0, prc)
  end)

  it("-r N prints the mean and perf's relative spread of exact counts", function()
    need_tp()
    local out, rc = run("stat -r 3 -x, -e syscalls:sys_enter_getppid -- build/test/petarget getppid 123")
    assert.equal(0, rc, out)
    local r = rows(out)
    assert.equal(1, #r, out)
    assert.equal("123,,syscalls:sys_enter_getppid,0.00%", r[1]:match("^([^,]*,[^,]*,[^,]*,[^,]*)"))
    need_perf()
    local p = rows(perf("stat -r 3 -x, -e syscalls:sys_enter_getppid -- build/test/petarget getppid 123"))
    assert.equal(p[1]:match("^([^,]*,[^,]*,[^,]*,[^,]*)"), r[1]:match("^([^,]*,[^,]*,[^,]*,[^,]*)"))
    out = run("stat -r 3 -e task-clock -- true")
    assert.truthy(out:find("Performance counter stats for 'true' (3 runs):", 1, true), out)
    assert.truthy(out:find("\n +%d+%.%d+ %+%- %d+%.%d+ seconds time elapsed  %( %+%- *%d+%.%d%d%% %)\n"), out)
  end)

  it("-j prints perf 6.1's JSON objects with the kernel's exact count", function()
    need_tp()
    local cmd = "stat -j -e syscalls:sys_enter_getppid,task-clock -- build/test/petarget getppid 77"
    local out, rc = run(cmd)
    assert.equal(0, rc, out)
    local r = rows(out)
    assert.equal(2, #r, out)
    assert.truthy(r[1]:find('^{"counter%-value" : "77%.000000", "unit" : "", '
                            .. '"event" : "syscalls:sys_enter_getppid", "event%-runtime" : %d+, '
                            .. '"pcnt%-running" : 100%.00, "metric%-value" : %d+%.%d+, '
                            .. '"metric%-unit" : "[^"]*"}$'), r[1])
    need_perf()
    local p = rows(perf(cmd))
    local function keys(l) local k = {} for n in l:gmatch('"([%w%-]+)" :') do k[#k + 1] = n end return k end
    assert.same(keys(p[1]), keys(r[1]))
    assert.same(keys(p[2]), keys(r[2]))
    assert.equal(p[1]:match('"counter%-value" : "([^"]*)"'), "77.000000")

    -- -I: "interval" first, as perf 6.1
    local icmd = "stat -j -I 100 -e task-clock -- build/test/petarget sleep 250"
    local ours, theirs = rows((run(icmd))), rows(perf(icmd))
    assert.truthy(#ours >= 2, table.concat(ours, "\n"))
    assert.same(keys(theirs[1]), keys(ours[1]))
    assert.equal("interval", keys(ours[1])[1])
  end)

  it("duration_time is the wall time in ns, as perf's tool event", function()
    -- as a user perf's fallback adds :u to every name (its own test below)
    U.need_kernel()
    local out, rc = run("stat -x, -e duration_time,task-clock -- build/test/petarget sleep 200")
    assert.equal(0, rc, out)
    local ns = tonumber(rows(out)[1]:match("^(%d+),ns,duration_time,"))
    assert.truthy(ns and ns >= 200e6 and ns < 2e9, out)
    need_perf()
    local p = rows(perf("stat -x, -e duration_time,task-clock -- build/test/petarget sleep 200"))
    assert.truthy(p[1]:find("^%d+,ns,duration_time,"), p[1])
  end)

  it("--per-thread prints one row per thread (comm-tid), the threads perf finds", function()
    local pid, stop = background({ "build/test/petarget", "threads", "2", "4000000000" }, 3)
    local ok, err = pcall(function()
      local out, rc = run("stat --per-thread -x, -e task-clock -p " .. pid .. " -- sleep 0.1")
      assert.equal(0, rc, out)
      local labels = {}
      for _, l in ipairs(rows(out)) do labels[#labels + 1] = l:match("^petarget%-(%d+),") end
      table.sort(labels, function(a, b) return tonumber(a) < tonumber(b) end)
      local want = {}
      for i, t in ipairs(tids_of(pid)) do want[i] = tostring(t) end
      assert.equal(3, #want)
      assert.same(want, labels)
      if have_perf then
        local pl = {}
        for _, l in ipairs(rows(perf("stat --per-thread -x, -e task-clock -p " .. pid .. " -- sleep 0.1"))) do
          pl[#pl + 1] = l:match("^petarget%-(%d+),")
        end
        table.sort(pl, function(a, b) return tonumber(a) < tonumber(b) end)
        assert.same(pl, labels)
      end
    end)
    stop()
    assert(ok, err)
  end)

  it("-t TID counts that thread only, and an idle one is <not counted> as perf prints it", function()
    -- as a user perf's fallback adds :u to every name (its own test below)
    U.need_kernel()
    local pid, stop = background({ "build/test/petarget", "sleep", "5000" })
    local ok, err = pcall(function()
      assert.is_true(asleep(pid), "petarget never went to sleep")
      local out, rc = run("stat -t " .. pid .. " -x, -e task-clock -- sleep 0.1")
      assert.equal(0, rc, out)
      assert.same({ "<not counted>,msec,task-clock,0,100.00,," }, rows(out))
      if have_perf then
        assert.same(rows(perf("stat -t " .. pid .. " -x, -e task-clock -- sleep 0.1")), rows(out))
      end
      -- perf's header and columns for a thread
      out = run("stat --per-thread -t " .. pid .. " -e task-clock -- sleep 0.1")
      assert.truthy(out:find("\n Performance counter stats for thread id '" .. pid .. "':\n", 1, true), out)
      assert.truthy(out:find(("\n%16s-%-8d      <not counted> msec task-clock\n"):format("petarget", pid), 1, true),
                    out)
      if have_perf then
        local p = perf("stat --per-thread -t " .. pid .. " -e task-clock -- sleep 0.1")
        assert.equal(p:match("\n( Performance counter stats for [^\n]*)"),
                     out:match("\n( Performance counter stats for [^\n]*)"))
        assert.equal(p:match("\n( *petarget%-[^\n]-task%-clock)"), out:match("\n( *petarget%-[^\n]-task%-clock)"))
      end
            -- intervals of an idle process stay <not counted>, never a 0
      out = run("stat -I 100 -p " .. pid .. " -e task-clock -- sleep 0.35")
      local n = 0
      for _, l in ipairs(rows(out)) do
        assert.truthy(l:find("^ +%d+%.%d+ +<not counted> msec task%-clock$"), l)
        n = n + 1
      end
      assert.truthy(n >= 3, out)
    end)
    stop()
    assert(ok, err)
  end)

  it("-C and -A count per CPU, in perf's order", function()
    U.need_root("system-wide counting")
    local cpus = require("perf_event.stat").online_cpus()
    local out, rc = run("stat -a -A -x, -e task-clock,page-faults -- sleep 0.05")
    assert.equal(0, rc, out)
    local got = {}
    local function key(l) return l:match("^(CPU%d+,)") .. l:match("^CPU%d+,[^,]*,[^,]*,([^,]*)") end
    for _, l in ipairs(rows(out)) do got[#got + 1] = key(l) end
    local want = {}
    for _, e in ipairs({ "task-clock", "page-faults" }) do
      for _, c in ipairs(cpus) do want[#want + 1] = "CPU" .. c .. "," .. e end
    end
    assert.same(want, got)
    if have_perf then
      local p = {}
      for _, l in ipairs(rows(perf("stat -a -A -x, -e task-clock,page-faults -- sleep 0.05"))) do
        p[#p + 1] = key(l)
      end
      assert.same(p, got)
    end
    -- -C: only that CPU; a task-clock of about the elapsed time (the CPU's clock)
    out, rc = run("stat -C " .. cpus[#cpus] .. " -A -x, -e task-clock -- sleep 0.1")
    assert.equal(0, rc, out)
    local r = rows(out)
    assert.equal(1, #r, out)
    local ms = tonumber(r[1]:match("^CPU" .. cpus[#cpus] .. ",([%d%.]+),msec,task%-clock,"))
    assert.truthy(ms and ms > 90 and ms < 1000, out)
  end)

  it("says what is wrong without a source position", function()
    for _, a in ipairs({ "record -c 1e30 -- true", "stat -r -1 -- true", "stat -C x -a -- true",
                         "stat -A -- true", "stat --per-thread -- true", "record -e '' -- true" }) do
      local out, rc = run(a)
      assert.truthy(rc == 1 or rc == 2, a .. ": " .. out)
      assert.is_nil(out:find("%.lua:%d+:"), out)
    end
  end)
end)

describe("luaperf record, bugs found against perf", function()
  it("-p samples every thread of the process, as perf record -p does", function()
    local pid, stop = background({ "build/test/petarget", "threads", "2", "4000000000" }, 3)
    local ok, err = pcall(function()
      assert.equal(3, #tids_of(pid))
      local out, rc = run("record -p " .. pid .. " -o - -- sleep 0.3")
      assert.equal(0, rc, out)
      -- the main thread sleeps in pthread_join: every sample is a spinning thread's
      local n = tonumber(out:match("\npetarget;pet_spin_inner (%d+)\n")
                         or out:match("^petarget;pet_spin_inner (%d+)\n"))
      assert.truthy(n and n > 0, out)
      if have_perf then
        local data = os.tmpname()       -- per run: two make test at once
        sh("perf record -q -p " .. pid .. " -o " .. data .. " -- sleep 0.2")
        local script = sh("perf script -F tid -i " .. data .. " 2>/dev/null")
        os.remove(data)
        assert.is_nil(script:find("^%s*" .. pid .. "\n"), "perf, too, finds only the workers")
        assert.truthy(script:find("%d"), "perf finds samples")
      end
    end)
    stop()
    assert(ok, err)
  end)

  it("-c N takes one sample every N tracepoint hits (exact)", function()
    need_tp()
    -- the child's events are one per CPU (inherited, as perf's), each with
    -- its own period (so is each inherited task's: two children of 2500
    -- calls each give 2 + 2 samples): a child that moved between CPUs once
    -- gave 4 samples of its 5000 calls. On one CPU it is exact
    local pin = U.sh("command -v taskset") ~= "" and "taskset -c 0 " or ""
    local out, rc = run("record -c 1000 -e syscalls:sys_enter_getppid -o - -- " .. pin
                        .. "build/test/petarget getppid 5000")
    assert.equal(0, rc, out)
    assert.truthy(out:find("\n?petarget;[^\n]* 5\n"), out)
    assert.truthy(out:find("luaperf record: 5 samples", 1, true), out)
  end)

  it("-c N on a software event samples like perf record -c N (no PERIOD in sample_type)", function()
    -- as a user perf's fallback adds :u to every name (its own test below)
    U.need_kernel()
    local cmd = "build/test/petarget touch 1 1"
    local faults = tonumber(rows(select(1, run("stat -x, -e page-faults -- " .. cmd)))[1]:match("^(%d+)"))
    local out, rc = run("record -c 10 -e page-faults -o /dev/null -- " .. cmd)
    assert.equal(0, rc, out)
    local n = tonumber(out:match("luaperf record: (%d+) samples"))
    assert.truthy(n and n >= 1 and n <= math.ceil(faults / 10) + 2, out .. " faults=" .. faults)
    need_perf()
    local data = os.tmpname()
    local vv = perf("record -vv -c 10 -e page-faults -o " .. data .. " -- " .. cmd)
    os.remove(data)
    local st = vv:match("sample_type%s+([%u|]+)")
    assert.truthy(st and not st:find("PERIOD"), vv)
  end)

  it("-o into a missing directory fails before the workload runs", function()
    local mark = os.tmpname()
    os.remove(mark)
    local out, rc = run("record -o /nonexistent-dir/x.folded -- sh -c 'touch " .. mark .. "'")
    assert.equal(1, rc, out)
    assert.truthy(out:find("/nonexistent-dir/x.folded", 1, true), out)
    assert.is_nil(io.open(mark), "the workload did not run")
  end)
end)

describe("luaperf stat -r 0 (issue 20)", function()
  local dir
  before_each(function() dir = sh("mktemp -d /tmp/pe_cli_stat_r0.XXXXXX"):gsub("%s+$", "") end)
  after_each(function()
    if dir and dir:match("^/tmp/pe_cli_stat_r0%.") then sh("rm -rf '" .. dir .. "'") end
  end)

  -- runs `CMD -r 0 ...` in the background (SIGINT at its default, as from a
  -- terminal), sends it SIG after `after` seconds; its stderr and exit code
  -- (killed with SIGKILL after 5 s more: it never ends by itself)
  -- cmd signalled once it has begun its `runs`-th run (its stderr holds
  -- that many headers; at most 30 s): a fixed wait gave 4 runs of perf
  -- under ASan's preload on a loaded machine
  local function forever(cmd, sig, runs)
    local err = dir .. "/err"
    local out = sh(("(exec env --default-signal=INT %s 2>%s >/dev/null) & p=$!; "
                    .. "for i in $(seq 300); do [ \"$(grep -c 'Performance counter stats' %s)\" -ge %d ] && break; "
                    .. "sleep 0.1; done; kill -%s $p; "
                    .. "for i in $(seq 50); do kill -0 $p 2>/dev/null || break; sleep 0.1; done; "
                    .. "kill -KILL $p 2>/dev/null; wait $p; echo \"rc=$?\"")
                   :format(cmd, err, err, runs, sig))
    local f = assert(io.open(err, "r"))
    local text = f:read("*a")
    f:close()
    return text, tonumber(out:match("rc=(%d+)"))
  end
  -- the blocks of one run each, and the summary's "(N runs)"
  local function blocks(text)
    local n, nonzero = 0, 0
    for body in (text:gsub("Performance counter stats", "\1")):gmatch("\1 for 'true':([^\1]*)") do
      n = n + 1
      local ms = tonumber(body:match("([%d%.]+) msec task%-clock"))
      if ms and ms > 0 then nonzero = nonzero + 1 end
    end
    return n, nonzero, tonumber(text:match("stats for 'true' %((%d+) runs%)"))
  end

  for _, case in ipairs({ { "INT", 130 }, { "TERM", 143 } }) do
    it(("repeats until SIG%s, each run printed, then the runs so far; rc %d as perf 6.1's"):format(case[1], case[2]),
       function()
      local text, rc = forever(interp .. " bin/luaperf stat -r 0 -e task-clock -- true", case[1], 6)
      assert.equal(case[2], rc, text)
      local n, nonzero, summary = blocks(text)
      -- signalled after its sixth run: each run printed with its own count
      assert.truthy(n >= 5, text)
      assert.equal(n, nonzero, text)
      -- the summary covers exactly the runs printed (not the one cut short)
      if n > 1 then assert.equal(n, summary, text) end
      if have_perf then
        -- perf 6.1: the same runs printed and the same exit code; it dies
        -- by the signal, so it prints no summary (luaperf adds one)
        local ptext, prc = forever("perf stat -r 0 -e task-clock -- true", case[1], 6)
        assert.equal(case[2], prc, ptext)
        local pn, pnonzero, psummary = blocks(ptext)
        assert.truthy(pn >= 5, ptext)
        assert.truthy(pnonzero >= pn - 1, ptext)   -- perf's last block may be cut mid-line
        assert.is_nil(psummary, ptext)
      end
    end)
  end

  it("-r 0 needs a command, as -r N", function()
    local out, rc = run("stat -r 0 -a -e task-clock")
    assert.equal(2, rc, out)
    assert.truthy(out:find("-r needs a command", 1, true), out)
  end)
end)
