-- The library never starts a process (issue 11): parsing, discovery and
-- opening read sysfs/tracefs/procfs through the core's readdir and io.open.
-- The proof is strace's: a child interpreter runs every discovery path
-- under `strace -f -e trace=execve,clone,clone3,fork,vfork` and the spec
-- counts those calls between two marker opens (loading perf_event included).  A last popen after the end
-- marker shows that the count would see a fork if there were one.
local U = require("support.util")

local sh = U.sh

local function have(cmd)
  return sh("command -v " .. cmd .. " 2>/dev/null") ~= ""
end

local START = "/nonexistent/perf-event-nofork-start"
local STOP = "/nonexistent/perf-event-nofork-stop"

-- runs code (a chunk with perf_event on its path) under strace; returns
-- the script's stdout and strace's log lines split into before/during/after
local function traced(code)
  local script = os.tmpname()
  local log = os.tmpname()
  finally(function() os.remove(script) os.remove(log) end)
  local f = assert(io.open(script, "w"))
  f:write(("package.path=%q package.cpath=%q\n"):format(package.path, package.cpath))
  f:write(("io.open(%q)\n"):format(START))
  f:write("local pe = require('perf_event')\n")
  f:write(code, "\n")
  f:write(("io.open(%q)\n"):format(STOP))
  f:write("io.stdout:flush()\n")
  f:write("local p = io.popen('true') p:close()\n")
  f:close()
  local out = sh(("strace -f -qq -e signal=none -e trace=execve,clone,clone3,fork,vfork,openat "
                  .. "-o %s %s %s 2>&1"):format(log, U.lua_cmd(), script))
  local parts = { before = {}, during = {}, after = {} }
  local where = "before"
  for line in io.lines(log) do
    if line:find(START, 1, true) then where = "during"
    elseif line:find(STOP, 1, true) then where = "after"
    elseif not line:find("openat(", 1, true) then
      local t = parts[where]
      t[#t + 1] = line
    end
  end
  os.remove(script)
  os.remove(log)
  return out, parts
end

describe("no process is ever started by the library", function()
  if not have("strace") then
    it("needs strace", function() pending("strace is not installed") end)
    return
  end

  it("for every kind of event string, discovery call and open", function()
    if not U.tracefs() then pending("tracefs is not readable here") return end
    local out, parts = traced([[
      local n = 0
      local function attr(s) local a = pe.attr(s) assert(a.type ~= nil, s) n = n + 1 end
      for _, s in ipairs({ "cpu-clock", "task-clock:u", "page-faults:k", "context-switches",
                           "syscalls:sys_enter_getppid", "sched:sched_switch",
                           "msr/tsc/", "mem:0x1000:rw", "mem:0x2000:x",
                           "L1-dcache-loads", "dTLB-load-misses", "LLC-store-misses",
                           "instructions" }) do
        attr(s)
      end
      local parsed = #pe.parse("{cpu-clock,page-faults},syscalls:sys_enter_getp*")
      assert(pe.describe("msr/tsc/"))
      local names = pe.list()
      assert(#names > 100)
      assert(#pe.list("sched:*") > 0)
      local pmus = pe.pmus()
      assert(#pmus > 0)
      assert(pe.pmu("software").type == 1)
      assert(pe.tracepoint("sched:sched_switch").id > 0)
      local g = assert(pe.group("syscalls:sys_enter_getp*"))
      require("petest").getppid(5)
      local t = g:read()
      for _, s in ipairs({ "cpu-clock", "msr/tsc/", "syscalls:sys_enter_getppid" }) do
        local ev = assert(pe.open(s))
        ev:close()
        n = n + 1
      end
      g:close()
      print("ok", n, #t, t["syscalls:sys_enter_getppid"], parsed)
    ]])
    local ok, n, members, getppids, parsed = out:match("^(ok)\t(%d+)\t(%d+)\t(%d+)\t(%d+)")
    assert.equal("ok", ok, out)
    assert.equal(16, tonumber(n))
    -- the glob opened one member per tracefs directory it matches, and
    -- the kernel counted the child's 5 getppid calls
    local want = tonumber(sh("ls -d " .. U.tracefs() .. "/events/syscalls/sys_enter_getp* | wc -l"))
    assert.equal(want, tonumber(members))
    assert.equal(2 + want, tonumber(parsed))
    assert.equal(5, tonumber(getppids))
    assert.same({}, parts.during)
    -- before the start marker: only the interpreter's own execve; and the
    -- harness does see a fork when there is one
    assert.equal(1, #parts.before, table.concat(parts.before, "\n"))
    assert.matches("execve%(", parts.before[1])
    local forks = 0
    for _, l in ipairs(parts.after) do
      if l:find("clone", 1, true) or l:find("fork", 1, true) then forks = forks + 1 end
    end
    assert.is_true(forks >= 1, table.concat(parts.after, "\n"))
  end)
end)

describe("the library's source", function()
  it("has no io.popen or os.execute in lua/perf_event/ or bin/luaperf", function()
    local files = { "bin/luaperf" }
    local fs = require("perf_event.fs")
    local nsub = 0
    for _, f in ipairs(fs.list("lua/perf_event")) do
      if f:find("%.lua$") then
        files[#files + 1] = "lua/perf_event/" .. f
      else
        -- a module's folder (perf_event.profile's files)
        for _, g in ipairs(fs.list("lua/perf_event/" .. f)) do
          if g:find("%.lua$") then files[#files + 1] = "lua/perf_event/" .. f .. "/" .. g; nsub = nsub + 1 end
        end
      end
    end
    assert.is_true(#files >= 12)
    assert.is_true(nsub >= 2)
    local hits = {}
    for _, path in ipairs(files) do
      local n = 0
      for line in io.lines(path) do
        n = n + 1
        if line:find("popen", 1, true) or line:find("execute", 1, true) then
          hits[#hits + 1] = path .. ":" .. n .. ": " .. line
        end
      end
    end
    assert.same({}, hits)
    -- the grep finds what it looks for (here, in this spec's own helper)
    local seen = 0
    for line in io.lines("spec/nofork_spec.lua") do
      if line:find("io.popen", 1, true) then seen = seen + 1 end
    end
    assert.is_true(seen >= 1)
  end)
end)
