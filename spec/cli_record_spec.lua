-- luaperf record loses nothing silently (issue 20): bursts of tracepoint
-- hits at -c 1 written whole or the shortfall counted exactly, side by side
-- with perf 6.1 in the same run; write errors; signals; the fds CMD gets.
-- Runs the tool under the suite's interpreter.
local U = require("support.util")
local bounds = require("support.stats")   -- (tests below have their own `stats`)
local sh, run, readable = U.run, U.luaperf, U.readable
local interp = U.lua_cmd()

local have_tracefs = readable("/sys/kernel/tracing/events/syscalls/sys_enter_getppid/id")
local have_perf = sh("command -v perf") ~= ""

local tmp
before_each(function() tmp = sh("mktemp -d /tmp/pe_cli_record.XXXXXX"):gsub("%s+$", "") end)
after_each(function()
  if tmp and tmp:match("^/tmp/pe_cli_record%.") then
    -- the tmpfs of the full-filesystem case, also when it failed
    if readable(tmp .. "/mnt") then sh("umount '" .. tmp .. "/mnt' 2>/dev/null") end
    sh("rm -rf '" .. tmp .. "'")
  end
end)

-- the samples and the lost count of luaperf's closing line
local function closing(out)
  local n, lost = out:match("%[ luaperf record: (%d+) samples.-; (%d+) lost %]")
  return tonumber(n), tonumber(lost)
end

-- perf record's samples of the same burst, as `perf report --stats` counts them
local function perf_burst(n)
  local data = tmp .. "/perf.data"
  sh(("perf record -q -e syscalls:sys_enter_getppid -c 1 -o %s -- build/test/petarget getppid %d >/dev/null 2>&1")
     :format(data, n))
  local stats = sh("perf report -i " .. data .. " --stats 2>/dev/null")
  return tonumber(stats:match("SAMPLE events:%s+(%d+)")) or 0
end

describe("luaperf record, bursts of tracepoint hits at -c 1", function()
  for _, n in ipairs({ 50000, 100000 }) do
    for _, form in ipairs({ "folded", "data" }) do
      -- #stats (`make test-stats`): a race of wakeups against perf, decided
      -- by the scheduler, not by a sampling bound
      it(("writes at least what perf does of %d getppid(2) calls, any shortfall counted (%s) #quiet #stats")
         :format(n, form),
         function()
        if not have_tracefs then pending("tracefs is not readable by this user (tracepoints need root here)") return end
        local file = tmp .. "/x." .. form
        -- perf and luaperf run one after the other on a shared 2-core VM:
        -- a ring fills in ~7 ms when luaperf is not scheduled.  Each try
        -- must account for every call exactly; up to 3 tries to write at
        -- least what perf wrote in the same try.  #quiet: beside the other
        -- lane of tools/runtests both tools lost samples in 4 of 9 tries
        -- (two CPU hogs: a race of wakeups, which either could lose
        -- three times in a row), so it runs after the lanes, alone.  A try
        -- in which the hypervisor stole more than 20 ms of the VM's CPUs
        -- (bursts of a third of them for a second here) is run again
        -- without counting, at most 5 times
        local try, stolen = 0, {}
        while true do
          local steal0 = U.steal_ms()
          local out, rc = run(("record -e syscalls:sys_enter_getppid -c 1 -o %s -- build/test/petarget getppid %d")
                              :format(file, n))
          assert.equal(0, rc, out)
          local written, lost = closing(out)
          assert.is_number(written, out)
          local in_file, file_lost
          if form == "folded" then
            in_file, file_lost = 0, 0
            for l in io.lines(file) do
              local c = tonumber(l:match(" (%d+)$"))
              if l:match("^%[lost%] ") then file_lost = c else in_file = in_file + c end
            end
          else
            local stats = sh("perf report -i " .. file .. " --stats 2>/dev/null")
            in_file = tonumber(stats:match("SAMPLE events:%s+(%d+)"))
            file_lost = tonumber(sh("perf report -i " .. file .. " --stdio 2>/dev/null")
                                   :match("Total Lost Samples: (%d+)"))
          end
          -- the file says what the closing line says
          assert.equal(written, in_file, out)
          assert.equal(lost, file_lost, out)
          -- every call is a sample written or one counted lost (the count of
          -- lost records may hold one task record too: EXIT)
          assert.truthy(written <= n, out)
          assert.truthy(written + lost >= n and written + lost <= n + 2, out)
          if have_perf then
            -- perf 6.1 writes a sample or two twice at times (50,002 for
            -- 50,000 calls): at least what it writes, n at most
            local p = perf_burst(n)
            if written >= math.min(p, n) then break end
            local steal = U.steal_ms() - steal0
            if steal > 20 and #stolen < 5 then
              stolen[#stolen + 1] = steal .. " ms"
            else
              try = try + 1
              assert.truthy(try < 3, ("luaperf wrote %d, perf %d (try %d, steal %d ms; tries run again for "
                .. "steal: %s): %s"):format(written, p, try, steal, table.concat(stolen, ", "), out))
            end
          else
            break
          end
        end
      end)
    end
  end

  it("takes -m as perf does: pages or a size, rounded up to a power of two", function()
    if not have_tracefs then pending("tracefs is not readable by this user (tracepoints need root here)") return end
    local out, rc = run("record -m 3 -e syscalls:sys_enter_getppid -c 1 -o " .. tmp
                        .. "/m.folded -- build/test/petarget getppid 1000")
    assert.equal(0, rc, out)
    assert.truthy(out:find("rounding mmap pages size to 16384 bytes (4 pages)", 1, true), out)
    local written, lost = closing(out)
    assert.truthy(written + lost >= 1000, out)
    out, rc = run("record -m 1x -o " .. tmp .. "/m.folded -- true")
    assert.equal(2, rc, out)
    assert.truthy(out:find("-m: a number of pages or a size", 1, true), out)
  end)
end)

describe("luaperf record, write errors", function()
  it("says so and exits non-zero when -o is /dev/full, as perf does", function()
    local out, rc = run("record -o /dev/full -- build/test/petarget spin 30000000")
    assert.equal(1, rc, out)
    assert.truthy(out:find("luaperf record: failed to write /dev/full: No space left on device", 1, true), out)
    assert.falsy(out:find("written to", 1, true), out)
  end)

  it("says so on a full filesystem, perf.data and folded (a small tmpfs)", function()
    local uid = tonumber((sh("id -u")))
    if uid ~= 0 then pending("mounting a tmpfs needs root") return end
    local mnt = tmp .. "/mnt"
    sh("mkdir " .. mnt)
    local mounted = sh("mount -t tmpfs -o size=8k pe_cli_record " .. mnt .. " 2>&1 && echo mounted")
    if not mounted:find("mounted\n") then pending("could not mount a tmpfs: " .. mounted) return end
    do
      -- ~300 samples: perf.data's header, ids, mmaps and samples are > 8 KiB
      local out, rc = run("record -F 999 -o " .. mnt .. "/x.data -- build/test/petarget spin 300000000")
      assert.equal(1, rc, out)
      assert.truthy(out:find("failed to write perf data to " .. mnt .. "/x.data: No space left on device", 1, true),
                    out)
      assert.falsy(out:find("written to", 1, true), out)
      if have_perf then   -- perf itself: rc 255
        local prc = sh("perf record -q -F 999 -o " .. mnt .. "/p.data -- build/test/petarget spin 300000000"
                       .. " >/dev/null 2>&1; echo $?")
        assert.equal(255, tonumber(prc))
      end
      sh("rm -f " .. mnt .. "/*.data")
      -- the folded stacks of -g fill what is left after a 6 KiB file
      sh("head -c 6144 /dev/zero > " .. mnt .. "/fill")
      out, rc = run("record -F 999 -g -o " .. mnt .. "/x.folded -- build/test/petarget spin 300000000")
      assert.equal(1, rc, out)
      assert.truthy(out:find("failed to write " .. mnt .. "/x.folded: No space left on device", 1, true), out)
    end
  end)
end)

describe("luaperf record, SIGINT and SIGTERM to luaperf alone", function()
  for _, sig in ipairs({ "INT", "TERM" }) do
    it("stops within a second, signals the workload and writes a complete file (SIG" .. sig .. ")", function()
      local data = tmp .. "/s.data"
      -- luaperf in the background (SIGINT ignored there, as a shell starts
      -- it; perf takes it back, so does luaperf); the workload would spin
      -- for many seconds; the kill is timed from the shell
      local script = ([[
%s bin/luaperf record -F 999 -o %s -- build/test/petarget spin 3000000000 >/dev/null 2>%s/err &
p=$!
sleep 1
t0=$(date +%%s%%N)
kill -%s $p
i=0
while kill -0 $p 2>/dev/null && [ $i -lt 150 ]; do sleep 0.1; i=$((i+1)); done
t1=$(date +%%s%%N)
kill -9 $p 2>/dev/null
wait $p
echo "rc=$? ms=$(( (t1 - t0) / 1000000 ))"
]]):format(interp, data, tmp, sig)
      local f = assert(io.open(tmp .. "/run.sh", "w"))
      f:write(script)
      f:close()
      local res = sh("sh " .. tmp .. "/run.sh")
      local err = sh("cat " .. tmp .. "/err")
      local rc, ms = res:match("rc=(%d+) ms=(%d+)")
      assert.truthy(tonumber(ms) < 1000, res .. err)
      -- the workload got SIGTERM: 128 + 15, as perf 6.1's status is
      assert.equal(143, tonumber(rc), res .. err)
      local n = tonumber(err:match("%[ luaperf record: (%d+) samples written to"))
      assert.truthy(n and n > 100, err)
      if have_perf then
        local stats = sh("perf report -i " .. data .. " --stats 2>&1")
        assert.equal(n, tonumber(stats:match("SAMPLE events:%s+(%d+)")), stats)
      end
    end)
  end
end)

describe("luaperf's fds", function()
  local list = [[sh -c 'for f in /proc/$$/fd/*; do echo "fd $(readlink $f)"; done']]
  it("none is inherited by CMD (record -o, perf.data, stat -o)", function()
    for _, args in ipairs({ "record -o " .. tmp .. "/f.folded -- ", "record -o " .. tmp .. "/f.data -- ",
                            "stat -e task-clock -o " .. tmp .. "/stat.txt -- " }) do
      local out, rc = run(args .. list)
      assert.equal(0, rc, out)
      local fds = 0
      for l in out:gmatch("fd ([^\n]*)") do
        fds = fds + 1
        assert.falsy(l:find(tmp, 1, true), args .. ": " .. out)
        assert.falsy(l:find("perf_event", 1, true) or l:find("signalfd", 1, true) or l:find("pidfd", 1, true),
                     args .. ": " .. out)
      end
      assert.truthy(fds >= 3, out)
    end
  end)
end)

-- the most common stack of `perf script` output, leaf first, names only
local function top_stack(script)
  local counts, best, bestn = {}, nil, 0
  for block in (script .. "\n\n"):gmatch("(.-)\n\n") do
    local names = {}
    for sym in block:gmatch("\n%s+%x+ ([^%s]+) %(") do names[#names + 1] = (sym:gsub("%+0x%x+$", "")) end
    if #names > 0 then
      local key = table.concat(names, ";")
      counts[key] = (counts[key] or 0) + 1
      if counts[key] > bestn then best, bestn = key, counts[key] end
    end
  end
  return best, bestn
end

describe("luaperf record --call-graph dwarf", function()
  local cmd = "build/test/petarget spin 300000000"

  -- #stats (`make test-stats`): whether a tool loses samples depends on when
  -- the scheduler runs it, not on a sampling bound
  it("loses no sample where perf loses none, and samples the child's CPU time at perf's rate (folded) #quiet #stats",
     function()
    if not have_perf then pending("needs perf (linux-perf)") return end
    -- a loss needs luaperf kept off the CPU for a ring's worth of samples
    -- (2 MiB: ~250 ms of 8 KiB stacks at 999 Hz), which a loaded machine or
    -- another suite's lane can do to either tool: up to three tries, each
    -- pair run back to back, and one try with no loss on either side decides.
    -- The child writes its CPU time: the same spin took 25 % more of it in
    -- one run than in the next on a shared VM (the host's other load is CPU
    -- time to the guest), so the counts are compared per second of it
    local spin = "build/test/petarget spincpu 300000000 "
    local out, n, lost, pn, plost, cpu, pcpu
    local function cpu_of(f)
      local h = assert(io.open(f))
      local v = tonumber(h:read("*l"))
      h:close()
      os.remove(f)
      return assert(v, f) / 1e9
    end
    for _ = 1, 3 do
      local rc
      out, rc = run("record --call-graph dwarf -F 999 -o " .. tmp .. "/d.folded -- " .. spin .. tmp .. "/c1")
      assert.equal(0, rc, out)
      n, lost = closing(out)
      cpu = cpu_of(tmp .. "/c1")
      sh("perf record -q --call-graph dwarf -F 999 -o " .. tmp .. "/p.data -- " .. spin .. tmp
         .. "/c2 >/dev/null 2>&1")
      pcpu = cpu_of(tmp .. "/c2")
      local stats = sh("perf report -i " .. tmp .. "/p.data --stats 2>&1")
      pn = tonumber(stats:match("SAMPLE events:%s+(%d+)"))
      plost = tonumber(stats:match("LOST events:%s+(%d+)")) or 0
      if lost == 0 and plost == 0 then break end
    end
    if plost > 0 and lost > 0 then pending("perf itself lost " .. plost .. " records in these runs") return end
    assert.equal(0, lost, out)
    -- samples per second of the child's CPU: within 10 % of perf's (the
    -- two tools' frequency modes) and the bound on two counts (odds 1e-6)
    local ok, why = bounds.rates("luaperf's samples against perf's, per s of the child's CPU", n, cpu, pn, pcpu, 0.1)
    assert.truthy(ok, why .. ": " .. out)
  end)

  it("writes perf.data perf script unwinds to the callers perf's own has (mmap_data)", function()
    if not have_perf then pending("needs perf (linux-perf)") return end
    local out, rc = run("record --call-graph dwarf -F 999 -o " .. tmp .. "/l.data -- " .. cmd)
    assert.equal(0, rc, out)
    sh("perf record -q --call-graph dwarf -F 999 -o " .. tmp .. "/p.data -- " .. cmd .. " >/dev/null 2>&1")
    local ours = top_stack(sh("perf script -i " .. tmp .. "/l.data 2>/dev/null"))
    local theirs = top_stack(sh("perf script -i " .. tmp .. "/p.data 2>/dev/null"))
    assert.truthy(theirs and theirs:find("^pet_spin_inner;pet_spin;main;"), theirs)
    assert.equal(theirs, ours)
  end)
end)

describe("luaperf record, process names, -a with CMD, exit codes", function()
  it("names a child that forked without exec by its parent's comm, as perf does", function()
    if not have_perf then pending("needs perf (linux-perf)") return end
    local cmd = [[sh -c '( i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done ); true']]
    local out, rc = run("record -o " .. tmp .. "/f.folded -- " .. cmd)
    assert.equal(0, rc, out)
    local ours, n = {}, 0
    for l in io.lines(tmp .. "/f.folded") do
      local root, c = l:match("^([^;]+);.* (%d+)$")
      ours[root] = (ours[root] or 0) + tonumber(c)
      n = n + tonumber(c)
    end
    assert.truthy(n > 20, out)
    sh("perf record -q -o " .. tmp .. "/p.data -- " .. cmd .. " >/dev/null 2>&1")
    local theirs = {}
    for c in sh("perf script -i " .. tmp .. "/p.data -F comm 2>/dev/null"):gmatch("%s*(%S+)%s*\n") do
      theirs[c] = true
    end
    for root in pairs(ours) do
      assert.falsy(root:match("^%d+$"), "named by its pid: " .. root)
      assert.truthy(theirs[root], root .. " is not a comm perf saw")
    end
    assert.truthy(ours.sh and ours.sh > n / 2, out)
  end)

  it("stops recording -a when CMD exits, and names idle CPUs swapper", function()
    local uid = tonumber((sh("id -u")))
    if uid ~= 0 or not have_perf then pending("-a needs root here (paranoid 2); perf reads the file") return end
    local out, rc = run("record -a -o " .. tmp .. "/a.data -- sh -c 'echo cmdpid=$$; exec sleep 0.5'")
    assert.equal(0, rc, out)
    local pid = out:match("cmdpid=(%d+)")
    local script = sh("perf script -i " .. tmp .. "/a.data --show-task-events 2>/dev/null")
    local exit_t = tonumber(script:match("%s(%d+%.%d+): PERF_RECORD_EXIT%(" .. pid .. ":" .. pid .. "%)"))
    assert.is_number(exit_t, script:sub(-2000))
    local last = 0
    for t in sh("perf script -i " .. tmp .. "/a.data -F time 2>/dev/null"):gmatch("(%d+%.%d+):") do
      t = tonumber(t)
      if t > last then last = t end
    end
    -- perf stops at once too; before, luaperf went on for 0.2-0.9 s
    assert.truthy(last - exit_t < 0.05, ("last sample %.3f s after CMD's exit"):format(last - exit_t))
    out, rc = run("record -a -o " .. tmp .. "/a.folded -- sleep 0.3")
    assert.equal(0, rc, out)
    local names = sh("cut -d';' -f1 " .. tmp .. "/a.folded")
    assert.falsy(names:find("^0\n") or names:find("\n0\n"), names)
  end)

  it("exits with CMD's status as perf 6.1's shell status shows it (128 + signal)", function()
    if not have_perf then pending("needs perf (linux-perf)") return end
    for _, cmd in ipairs({ "sh -c 'exit 3'", "sh -c 'kill -SEGV $$'", "sh -c 'kill -TERM $$'" }) do
      local _, rc = run("record -o " .. tmp .. "/e.folded -- " .. cmd)
      -- (the shell's "Segmentation fault" line for perf's own death kept quiet)
      local prc = tonumber((sh("{ (perf record -q -o " .. tmp .. "/e.data -- " .. cmd
                               .. ") >/dev/null 2>&1; echo $?; } 2>/dev/null")))
      assert.equal(prc, rc, cmd)
    end
  end)
end)

describe("luaperf record, lost samples in pprof and speedscope", function()
  it("says how many were lost in the profile itself (a 1-page ring drops some of a burst)", function()
    if not have_tracefs then pending("tracefs is not readable by this user (tracepoints need root here)") return end
    local base = "record -m 1 -e syscalls:sys_enter_getppid -c 1 "
    local out, rc = run(base .. "--speedscope -o " .. tmp .. "/x.json -- build/test/petarget getppid 100000")
    assert.equal(0, rc, out)
    local n, lost = closing(out)
    if lost == 0 then pending("nothing was lost this time: nothing to show") return end
    local json = sh("cat " .. tmp .. "/x.json")
    assert.truthy(json:find('"name":"[lost]"', 1, true), json)
    local sum = 0
    for w in (json:match('"weights":%[([%d,]*)%]') or ""):gmatch("%d+") do sum = sum + tonumber(w) end
    assert.equal(n + lost, sum, json)
    out, rc = run(base .. "--pprof -o " .. tmp .. "/x.pb.gz -- build/test/petarget getppid 100000")
    assert.equal(0, rc, out)
    lost = select(2, closing(out))
    if lost == 0 then pending("nothing was lost this time: nothing to show") return end
    local raw = sh("gzip -dc " .. tmp .. "/x.pb.gz")
    assert.truthy(raw:find("[lost]", 1, true))
    assert.truthy(raw:find(lost .. " samples lost", 1, true), out)
  end)
end)

describe("luaperf, smaller points of issue 20 as perf 6.1 has them", function()
  it("list PATTERN matching nothing exits 0, as perf list does", function()
    local _, rc = run("list no-such-event-anywhere")
    assert.equal(0, rc)
    if have_perf then assert.equal(0, tonumber((sh("perf list no-such-event-anywhere >/dev/null 2>&1; echo $?")))) end
  end)

  it("stat -o FILE starts with '# started on' and the time, as perf's", function()
    local out, rc = run("stat -e task-clock -o " .. tmp .. "/s.txt -- true")
    assert.equal(0, rc, out)
    local f = assert(io.open(tmp .. "/s.txt"))
    local first, second = f:read("*l"), f:read("*l")
    f:close()
    assert.truthy(first:match("^# started on %a%a%a %a%a%a [ %d]%d %d%d:%d%d:%d%d %d%d%d%d$"), first)
    assert.equal("", second)
    if have_perf then
      sh("perf stat -e task-clock -o " .. tmp .. "/p.txt -- true 2>/dev/null")
      local p = assert(io.open(tmp .. "/p.txt"))
      local pfirst = p:read("*l")
      p:close()
      assert.equal(pfirst:gsub("%d", "0"):sub(1, 16), first:gsub("%d", "0"):sub(1, 16))
    end
  end)

  it("stat shows 'CPUs utilized' for cpu-clock as for task-clock, -A per CPU too, as perf", function()
    local out, rc = run("stat -x, -e cpu-clock -- sleep 0.05")
    assert.equal(0, rc, out)
    -- (as a user, paranoid 2: user space only, named cpu-clock:u as perf names it)
    local fields = out:match("([^\n]*,cpu%-clock,[^\n]*)") or out:match("([^\n]*,cpu%-clock:u,[^\n]*)")
    assert.truthy(fields and fields:match(",CPUs utilized$"), out)
    if have_perf then
      local p = sh("perf stat -x, -e cpu-clock -- sleep 0.05 2>&1")
      assert.truthy(p:match(",cpu%-clock,[^\n]*,CPUs utilized\n") or p:match(",cpu%-clock:u,[^\n]*,CPUs utilized\n"), p)
    end
    if tonumber((sh("id -u"))) == 0 then   -- -a: root here (paranoid 2)
      out = run("stat -a -A -e cpu-clock -- sleep 0.05")
      local n = 0
      for _ in out:gmatch("\nCPU%d+ +[%d.,]+ msec cpu%-clock +# +[%d.]+ CPUs utilized") do n = n + 1 end
      assert.truthy(n >= 1, out)
    end
  end)

  it("lists perf's tool events and counts them: duration_time in a group, user_time, system_time", function()
    local out, rc = run("list sw")
    assert.equal(0, rc, out)
    local tools = {}
    for name in out:gmatch("\n  (%S+) +%[Tool event%]") do tools[#tools + 1] = name end
    assert.same({ "duration_time", "user_time", "system_time" }, tools)
    if have_perf then
      local theirs = {}
      for name in sh("perf list sw 2>/dev/null"):gmatch("\n  (%S+) +%[Tool event%]") do theirs[#theirs + 1] = name end
      assert.same(theirs, tools)
    end
    -- the command's own CPU time (rusage) against task-clock of the same run;
    -- task-clock counts the time the hypervisor stole from the vCPU, rusage
    -- does not (PARAVIRT_TIME_ACCOUNTING): a run in which the VM's steal
    -- (215 ms against 148 ms once, in a burst of it) was more than
    -- bounds.MAX_STEAL of a CPU's time is run again (run delay not
    -- judged: both count CPU time)
    out, rc = bounds.measure(function()
      return run("stat -x, -e '{task-clock,duration_time}',user_time,system_time -- "
                 .. "build/test/petarget spin 100000000")
    end, { what = "the stat run", delay = false })
    assert.equal(0, rc, out)
    local v = {}
    for line in out:gmatch("[^\n]+") do
      local val, name = line:match("^([%d.]+),[^,]*,([^,]+),")
      -- (a user's task-clock is task-clock:u)
      if name then v[(name:gsub(":u$", ""))] = tonumber(val) end
    end
    assert.is_number(v["task-clock"], out)
    local cpu_ms = ((v.user_time or 0) + (v.system_time or 0)) / 1e6
    assert.truthy(math.abs(cpu_ms - v["task-clock"]) <= 0.2 * v["task-clock"] + 10,
                  out .. "(" .. bounds.describe(bounds.last) .. ")")
    assert.truthy(v.duration_time / 1e6 >= v["task-clock"] * 0.9, out)
  end)

  it("stat names a tracepoint without its :u/:k, as perf does", function()
    if not have_tracefs then pending("tracefs is not readable by this user (tracepoints need root here)") return end
    local ev = "syscalls:sys_enter_getppid:u,syscalls:sys_enter_getppid:k,task-clock:u"
    local out, rc = run("stat -x, -e " .. ev .. " -- build/test/petarget getppid 10")
    assert.equal(0, rc, out)
    local function csv_names(text)
      local t = {}
      for line in text:gmatch("[^\n]+") do
        local count, name = line:match("^([%d.]+),[^,]*,([^,]+),")
        if name then t[#t + 1] = name .. "=" .. count end
      end
      return t
    end
    local names = csv_names(out)
    assert.same({ "syscalls:sys_enter_getppid=10", "syscalls:sys_enter_getppid=10" }, { names[1], names[2] })
    assert.equal("task-clock:u", names[3]:match("^[^=]+"))
    if have_perf then
      local p = sh("perf stat -x, -e " .. ev .. " -- build/test/petarget getppid 10 2>&1")
      local pnames = csv_names(p)
      assert.same({ pnames[1], pnames[2] }, { names[1], names[2] })
    end
  end)

  -- (a 0.1 s command once gave 2 lines, at 0.014 and 0.115 s, and a 0.3 s
  -- one steps of 15 ms (median): the tool waking every 5 ms waits for a
  -- CPU when both lanes keep both busy, as perf's loop, a sleep per
  -- interval, would. So #quiet, alone on the machine, over 0.3 s, judged
  -- by the median step (the last one is the partial interval the command's
  -- end cuts, as perf prints it; a step of 4.27 ms was a deadline kept in
  -- ms, csrc/spawn.c, since fixed)
  -- #stats (`make test-stats`): the steps are the scheduler's to keep
  it("stat -I 5 prints every 5 ms, as perf accepts it #quiet #stats", function()
    local out, rc = run("stat -I 5 -e task-clock -- sleep 0.3")
    assert.equal(0, rc, out)
    local times = {}
    for t in out:gmatch("\n%s*(%d+%.%d+) [^\n]*task%-clock") do times[#times + 1] = tonumber(t) end
    assert.truthy(#times >= 5, out)
    local steps = {}
    for i = 2, #times do steps[#steps + 1] = times[i] - times[i - 1] end
    table.sort(steps)
    local median = steps[math.floor((#steps + 1) / 2)]
    assert.truthy(median >= 0.0045 and median < 0.010, ("median step %.2f ms: %s"):format(median * 1e3, out))
  end)

  it("keeps an overwritten FILE.data as FILE.data.old, as perf does", function()
    local file = tmp .. "/x.data"
    local out, rc = run("record -o " .. file .. " -- build/test/petarget spin 30000000")
    assert.equal(0, rc, out)
    local f = assert(io.open(file, "rb"))
    local first = f:read("*a")
    f:close()
    out, rc = run("record -o " .. file .. " -- build/test/petarget spin 30000000")
    assert.equal(0, rc, out)
    f = assert(io.open(file .. ".old", "rb"))
    assert.equal(first, f:read("*a"))
    f:close()
  end)
end)

describe("luaperf record with several -e (issue 20)", function()
  local PP, P = "syscalls:sys_enter_getppid", "syscalls:sys_enter_getpgrp"
  -- getppid(2), then getpgrp(2) calls: a sample each at -c 1 (not getpid:
  -- under the asan suite the workload inherits the ASan runtime, which calls it)
  local NPP, NP = 3000, 2000
  local cmd = ("-c 1 -o %%s -- build/test/petarget getpids %d %d"):format(NPP, NP)

  -- the per-event part of the closing line: { [event] = {samples, lost} }
  local function each(out)
    local t = {}
    local inner = out:match("%[ luaperf record: .-; %d+ lost %((.-)%) %]")
    for name, n, l in (inner or ""):gmatch("([%w_:%-]+): (%d+) samples, (%d+) lost") do
      t[name] = { tonumber(n), tonumber(l) }
    end
    return t
  end
  -- samples per event name in `perf script -F time,event --ns` output;
  -- and the samples of each name whose time (ns) an earlier one of that
  -- name has already: a record written twice (no two calls share a ns)
  local function script_events(file)
    local t, twice, seen = {}, {}, {}
    for time, name in sh("perf script -i " .. file .. " -F time,event --ns 2>/dev/null")
                        :gmatch("%s*([%d.]+):%s+([%w_:%-]+):%s*\n") do
      t[name] = (t[name] or 0) + 1
      local k = name .. "@" .. time
      if seen[k] then twice[name] = (twice[name] or 0) + 1 end
      seen[k] = true
    end
    return t, twice
  end
  local function checked_run(args)
    local out, rc = run("record -e " .. args)
    assert.equal(0, rc, out)
    local e = each(out)
    -- every call is a sample of its event, none lost, none of the other's
    assert.same({ [PP] = { NPP, 0 }, [P] = { NP, 0 } }, e, out)
    return out
  end

  it("keeps each event's samples apart in folded output, rooted at the event", function()
    if not have_tracefs then pending("tracefs is not readable by this user (tracepoints need root here)") return end
    local file = tmp .. "/x.folded"
    checked_run(PP .. " -e " .. P .. " " .. cmd:format(file))
    local sums = {}
    for l in io.lines(file) do
      local root, n = l:match("^([^;]+);.* (%d+)$")
      assert.truthy(root, l)
      sums[root] = (sums[root] or 0) + tonumber(n)
    end
    assert.same({ [PP] = NPP, [P] = NP }, sums)
  end)

  it("writes one attr per event to perf.data; perf script names each sample's event, as for perf's own file",
     function()
    if not have_tracefs then pending("tracefs is not readable by this user (tracepoints need root here)") return end
    if not have_perf then pending("needs perf") return end
    local file = tmp .. "/x.data"
    checked_run(PP .. "," .. P .. " " .. cmd:format(file))   -- -e A,B: as -e A -e B
    local ours, ours_twice = script_events(file)
    assert.same({ [PP] = NPP, [P] = NP }, ours)
    assert.same({}, ours_twice)
    -- perf 6.1 on the same program: the same counts once the records it
    -- wrote twice (the same time to the ns) are set aside (its own file
    -- had 2001, 2002 and 2003 getpgrp samples of 2000 calls in full runs,
    -- as in the bursts above, 50,002 of 50,000); luaperf's counts stay exact
    local pfile = tmp .. "/p.data"
    sh(("perf record -q -e %s -e %s %s >/dev/null 2>&1"):format(PP, P, cmd:format(pfile)))
    local pc, twice = script_events(pfile)
    for name, n in pairs({ [PP] = NPP, [P] = NP }) do
      assert.equal(n, (pc[name] or 0) - (twice[name] or 0), ("%s: perf wrote %s, %d of them twice")
                   :format(name, tostring(pc[name]), twice[name] or 0))
    end
    -- and perf report's per-event totals
    local stats = sh("perf report -i " .. file .. " --stats 2>/dev/null")
    assert.equal(NPP, tonumber(stats:match(PP .. " stats:%s+SAMPLE events:%s+(%d+)")), stats)
    assert.equal(NP, tonumber(stats:match(P .. " stats:%s+SAMPLE events:%s+(%d+)")), stats)
  end)

  it("writes one speedscope profile and one pprof sample type per event", function()
    if not have_tracefs then pending("tracefs is not readable by this user (tracepoints need root here)") return end
    local file = tmp .. "/x.json"
    checked_run(PP .. " -e " .. P .. " --speedscope " .. cmd:format(file))
    local f = assert(io.open(file, "rb"))
    local json = f:read("*a")
    f:close()
    local sums, names = {}, {}
    for name, w in json:gmatch('"name":"([^"]+)","samples":%b[],"startValue":0,"type":"sampled","unit":"%a+",'
                               .. '"weights":(%b[])') do
      names[#names + 1] = name
      local s = 0
      for x in w:gmatch("%d+") do s = s + tonumber(x) end
      sums[name] = s
    end
    assert.same({ PP, P }, names, json)
    assert.same({ [PP] = NPP, [P] = NP }, sums, json)

    file = tmp .. "/x.pb.gz"
    checked_run(PP .. " -e " .. P .. " --pprof " .. cmd:format(file))
    if sh("command -v go") == "" then pending("needs `go tool pprof` for the pprof half") return end
    local raw = sh(("env -u LD_PRELOAD HOME=%s GOCACHE=%s/gocache go tool pprof -raw %s 2>&1"):format(tmp, tmp, file))
    -- the header names both sample types; each sample counts for one event
    local h1, h2 = raw:match("\nSamples:\n(%S+)/count%S* (%S+)/count")
    assert.same({ PP, P }, { h1, h2 }, raw)
    local a, b = 0, 0
    for x, y in raw:gmatch("\n%s+(%d+)%s+(%d+): [%d ]+\n") do
      assert.truthy(tonumber(x) == 0 or tonumber(y) == 0, raw)
      a, b = a + tonumber(x), b + tonumber(y)
    end
    assert.same({ NPP, NP }, { a, b }, raw)
  end)
end)
