-- Shared helpers for the specs: tracefs ids, fd/mapping counts, byte
-- packing that works on Lua 5.1 (no string.pack) and exact 64-bit checks.
local U = {}

function U.tracefs()
  for _, d in ipairs({ "/sys/kernel/tracing", "/sys/kernel/debug/tracing" }) do
    local f = io.open(d .. "/events/syscalls/sys_enter_getppid/id")
    if f then f:close() return d end
  end
end

--- the numeric id of a tracepoint, read straight from tracefs
function U.tp_id(sys, name)
  local root = U.tracefs()
  if not root then return nil end
  local f = io.open(("%s/events/%s/%s/id"):format(root, sys, name))
  if not f then return nil end
  local id = tonumber(f:read("*l"))
  f:close()
  return id
end

--- package.searchpath for Lua 5.1 too
function U.searchpath(name, path)
  local file = name:gsub("%.", "/")
  for tmpl in path:gmatch("[^;]+") do
    local cand = tmpl:gsub("%?", file)
    local f = io.open(cand)
    if f then f:close() return cand end
  end
end

--- the test-only simulators (spec/support/pesim.c, built by `make fixtures`
-- into build/test/<lua>/pesim.so): sim_ring{...} makes an event over a ring
-- of chosen bytes that the core's records()/aux()/poll() drain;
-- userpage_sim{...} runs the user-page read on a scripted page.  Every spec
-- reaches them through here.
function U.sim()
  if not U._sim then U._sim = require("pesim") end
  return U._sim
end

function U.is_root()
  local f = io.open("/proc/self/status")
  local s = f:read("*a")
  f:close()
  return s:match("\nUid:%s+0%s") ~= nil
end

--- perf_event fds of this process, after a full GC has closed dropped
-- events (other fds may come and go: pipes of io.popen, children reaped by
-- other specs)
function U.count_perf_fds()
  collectgarbage(); collectgarbage()
  local p = io.popen("ls -l /proc/" .. U.pid() .. "/fd | grep -c 'anon_inode:\\[perf_event\\]'")
  local n = tonumber(p:read("*l"))
  p:close()
  return n
end

function U.count_perf_maps()
  local f = io.open("/proc/" .. U.pid() .. "/maps")
  local n = 0
  for line in f:lines() do
    if line:find("perf_event", 1, true) then n = n + 1 end
  end
  f:close()
  return n
end

--- our own pid (not the shell's): /proc/self/stat read by this process
function U.pid()
  if not U._pid then
    local f = io.open("/proc/self/stat")
    U._pid = tonumber(f:read("*l"):match("^(%d+)"))
    f:close()
  end
  return U._pid
end

--- little-endian u64 bytes of a value given as a non-negative number < 2^53
function U.le64(n)
  local t = {}
  for i = 1, 8 do
    t[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(t)
end

--- hex of the little-endian integer in s[off+1 .. off+len]
function U.hex_at(s, off, len)
  local t = {}
  for i = off + len, off + 1, -1 do
    t[#t + 1] = ("%02x"):format(s:byte(i))
  end
  return (table.concat(t):gsub("^0+(.)", "%1"))
end

--- a 64-bit value the core returned, as a hex string (all versions)
function U.hex(v)
  if type(v) == "string" then return (v:gsub("^0x", "")) end
  if type(v) == "cdata" then return ("%x"):format(v) end
  local mtype = rawget(math, "type")
  if mtype and mtype(v) == "integer" then return ("%x"):format(v) end
  return ("%x"):format(v)
end

-- busted's `pending` lives in the environment of the spec files, not in
-- _G: a required module finds it in the environment of the spec function
-- that called it (getfenv on 5.1/LuaJIT, the _ENV upvalue on 5.2+).  Inside
-- an `it` it throws, so the test ends there as a skip carrying `msg`.
local function env_of(f)
  if rawget(_G, "getfenv") then return getfenv(f) end
  for i = 1, 255 do
    local name, v = debug.getupvalue(f, i)
    if name == nil then return nil end
    if name == "_ENV" then return v end
  end
end

-- the first spec environment on the stack (not _G)
local function spec_env(from)
  for level = from, 40 do
    local info = debug.getinfo(level, "f")
    if not info then break end
    local env = info.func and env_of(info.func)
    if env and env ~= _G and rawget(env, "pending") == nil and env.pending then return env end
  end
end

-- busted wraps every spec file in one environment: kept from the spec file
-- that first required this module (a test function that names no global
-- has no _ENV of its own on 5.2+)
local SPEC_ENV = spec_env(3)

function U.pending(msg)
  local env = spec_env(2) or SPEC_ENV
  local p = env and env.pending
  if type(p) == "function" then p(msg) end
  error("skipped but busted's pending was not found: " .. msg, 2)
end

--- skips the running test with `reason` unless `ok`
function U.need(ok, reason)
  if not ok then U.pending(reason) end
  return true
end

--- skips the running test unless we are root; the reason says why root
function U.need_root(why)
  return U.need(U.is_root(), "needs root: " .. (why or "CAP_SYS_ADMIN / CAP_PERFMON"))
end

function U.root_or_pending(why)
  return U.need_root(why)
end

--- kernel.perf_event_paranoid as a number
function U.paranoid()
  local f = io.open("/proc/sys/kernel/perf_event_paranoid")
  if not f then return 2 end
  local n = tonumber(f:read("*l"))
  f:close()
  return n or 2
end

--- skips the running test unless this user may measure tracepoints, the
-- kernel and other CPUs: root, or a user at perf_event_paranoid=-1, with a
-- readable tracefs.  The reason names what refuses it.
function U.can_trace()
  return (U.is_root() or U.paranoid() <= -1) and U.tracefs() ~= nil
end

function U.need_tracing()
  if U.can_trace() then return true end
  local par, tfs, why = U.paranoid(), U.tracefs() ~= nil, {}
  if not tfs then
    why[#why + 1] = "tracefs (the tracepoint ids) is not mounted or not readable by this user"
  end
  if not U.is_root() and par > -1 then
    why[#why + 1] = ("perf_event_paranoid=%d refuses kernel-mode, CPU-wide and raw tracepoint " ..
      "measurement to a user without CAP_PERFMON"):format(par)
  end
  U.pending((U.is_root() and "" or "needs root: ") .. table.concat(why, "; "))
end

--- skips the running test unless this user may measure kernel mode of its
-- own processes (root, or perf_event_paranoid <= 1)
function U.need_kernel()
  local par = U.paranoid()
  return U.need(U.is_root() or par <= 1, ("needs root: perf_event_paranoid=%d refuses kernel-mode " ..
    "measurement to a user without CAP_PERFMON"):format(par))
end

--- skips the running test unless tracefs is readable (tracepoint ids)
function U.need_tracefs()
  return U.need(U.tracefs() ~= nil, "tracefs is not mounted or not readable by this user " ..
    "(mode 0700 root on many systems; tools/runtests mounts it as root)")
end

--- a cpu-clock/task-clock sample_period (ns) for `hz` samples a second,
-- or for a quarter of perf_event_max_sample_rate when that is lower now: the
-- kernel lowers the limit by itself when samples take long
function U.sample_period(hz)
  local max = require("perf_event").sysctl().max_sample_rate
  return math.ceil(1e9 / math.min(hz, max / 4))
end

-- The VM's steal time (the share checks: spec/support/stats.lua). cpu-clock, which the
-- profiler samples, and task-clock count the time the hypervisor took
-- from the vCPU while this thread ran; os.clock does not (the kernel's
-- PARAVIRT_TIME_ACCOUNTING leaves it out of CPU time). Here steal comes in
-- bursts of a third of the CPU for a second or two: in a window of 0.5 s
-- the functions that ran during a burst get up to that much more of the
-- samples than of os.clock's time.
U.STEAL_MAX = 0.02   -- of a window: at most ~2 points of any share

--- starts a task-clock count of this thread; the function returned ends it
-- and gives the share of the window's CPU time (0..1) that was stolen, or
-- nil when task-clock cannot be opened (or, called again, nil)
function U.steal_window()
  local ev = require("perf_event").open("task-clock")
  if not ev then return function() return nil end end
  ev:enable()
  local c0, t0 = os.clock(), ev:read()
  return function()
    if not ev then return nil end
    local c1, t1 = os.clock(), ev:read()
    ev:close()
    ev = nil
    local cpu = c1 - c0
    if cpu <= 0 then return nil end
    return math.max(0, tonumber(t1 - t0) / 1e9 - cpu) / cpu
  end
end

--- the time the hypervisor stole from all of the machine's CPUs since boot, in
-- ms (/proc/stat's steal column, in USER_HZ = 100 ticks), or 0 when unknown:
-- for judges of two processes (a tool against perf), where one thread's
-- task-clock cannot tell
function U.steal_ms()
  local f = io.open("/proc/stat", "r")
  if not f then return 0 end
  local l = f:read("*l") or ""
  f:close()
  local st = l:match("^cpu%s+%d+%s+%d+%s+%d+%s+%d+%s+%d+%s+%d+%s+%d+%s+(%d+)")
  return st and tonumber(st) * 10 or 0
end

--- the "sample" records of an array: throttle/unthrottle records come
-- whenever the kernel throttles an event, on any machine under load
function U.samples_only(recs)
  local out = {}
  for _, r in ipairs(recs) do
    if r.type == "sample" then out[#out + 1] = r
    else assert(r.type == "throttle" or r.type == "unthrottle", "unexpected record " .. tostring(r.type)) end
  end
  return out
end

--- the standard output of a shell command (stderr too with "2>&1" in cmd)
function U.sh(cmd)
  local p = io.popen(cmd)
  local out = p:read("*a")
  p:close()
  return out
end

--- a shell command's standard output (stderr too with "2>&1" in cmd) and
-- its exit status, from the shell (128 + N for a signal N): on LuaJIT and
-- 5.1 a popen'ed file's close() does not give it
function U.run(cmd)
  local out = U.sh("(" .. cmd .. "); echo \"rc=$?\"")
  local code = tonumber(out:match("rc=(%d+)\n?$"))
  return (out:gsub("rc=%d+\n?$", "")), code
end

--- the contents of the file at path, or nil when it cannot be opened
function U.read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

--- the contents of the file at path; an error when it cannot be read
function U.slurp(path)
  return (assert(U.read(path), path .. ": cannot be read"))
end

--- the keys of table t, sorted
function U.sorted_keys(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = k end
  table.sort(out)
  return out
end

--- s (tostring'd) as one word for sh: in single quotes
function U.shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

--- runs `luajit -e code` as nobody (setpriv; the caller is root) with
-- this checkout's Lua and core, and returns its stdout and stderr; skips
-- the test when nobody cannot read the checkout (an EACCES the code
-- prints is the kernel's, not that)
function U.luajit_as_nobody(code)
  local out = U.sh("setpriv --reuid=65534 --regid=65534 --clear-groups env LUA_PATH='lua/?.lua;lua/?/init.lua;;' "
                   .. "LUA_CPATH='build/?.so;;' luajit -e " .. U.shell_quote(code) .. " 2>&1")
  if out:find("module 'perf_event' not found", 1, true) or out:find("Permission denied", 1, true)
     and not out:find("EACCES", 1, true) then
    U.pending("the checkout is not readable by nobody here: " .. out:match("[^\n]*"))
  end
  return out
end

--- whether the file at path can be opened for reading
function U.readable(path)
  local f = io.open(path, "r")
  if f then f:close() return true end
  return false
end

--- bin/luaperf run with args under the suite's interpreter: its stdout and
-- stderr, and its exit status
function U.luaperf(args)
  return U.run(U.lua_cmd() .. " bin/luaperf " .. args .. " 2>&1")
end

--- pe.profile's rate cap (issue 18), on any interpreter: a clock above
-- 10 kHz (freq 100000, 50000; period 10000 ns) is sampled at 10 kHz, and
-- p.rate_note says so; check(p) asserts what the mode adds; 10 kHz itself
-- is taken as asked. The cap is judged by the kernel's count, not by time:
-- a clock's samples come every period of the thread's CPU time, so the
-- samples over the work's os.clock time give the rate used (uncapped,
-- 100 kHz took ten times as many; a window the hypervisor's steal
-- spoiled is taken again, cpu-clock counting stolen time).
-- start(opts) starts a profile, work() runs the work three times over
function U.check_rate_cap(start, work, check)
  local la = require("luassert")
  local S = require("support.stats")
  for _, o in ipairs({ { freq = 100000 }, { freq = 50000 }, { period = 10000 } }) do
    local byfreq = o.period == nil
    local what = byfreq and ("freq " .. o.freq) or ("period " .. o.period)
    local p, cpu = S.measure(function()
      local q = start(o)
      local c0 = os.clock()
      local ok, err = pcall(function() for _ = 1, 3 do work() end end)
      local c = os.clock() - c0
      q:stop()
      if not ok then error(err, 0) end
      return q, c
    end, { what = what .. "'s window", delay = false })
    local note = byfreq and "sampled at 10000/s" or "sampled every 100000 ns"
    la.is_truthy(p.rate_note and p.rate_note:find(note, 1, true), tostring(p.rate_note))
    if byfreq then la.equal(10000, p.freq) else la.equal(100000, p.period) end
    la.is_true(S.count_near(what .. ": samples at 10 kHz of " .. cpu .. " s CPU", p.nsamples + p.lost,
                            cpu * 10000, 0.33))
    check(p)
  end
  local p = start({ freq = 10000 })
  p:stop()
  la.is_nil(p.rate_note)
  la.equal(10000, p.freq)
end

--- whether os.execute's result means exit status 0: a number on 5.1 and
-- LuaJIT (where `assert(os.execute(...))` always passes), true/nil on 5.2+
function U.exec_ok(r)
  return r == true or r == 0
end

function U.lua_cmd()
  if jit then return "luajit" end
  return (_VERSION:gsub("Lua ", "lua"))
end

-- The attr blocks of `perf ... -vv` output: an array of
-- { fields = {name = text}, opens = {"sys_perf_event_open..." lines after
-- the block}, failed = true when one of them failed }
function U.perf_attr_blocks(out)
  local blocks, cur, in_attr = {}, nil, false
  for line in out:gmatch("[^\n]+") do
    if line == "perf_event_attr:" then
      cur = { fields = {}, opens = {} }
      blocks[#blocks + 1] = cur
      in_attr = true
    elseif line:find("^%-%-%-%-") then
      in_attr = false
    elseif cur and in_attr then
      local k, v = line:match("^  (.-)%s%s+(%S+)$")
      if k then cur.fields[k] = v end
    elseif cur and line:find("^sys_perf_event_open") then
      cur.opens[#cur.opens + 1] = line
      if line:find("^sys_perf_event_open failed") then cur.failed = true end
    end
  end
  return blocks
end

--- a cycle of the directed graph g (g[a][b]: an edge a -> b) as a list of
-- nodes (first == last), or nil; nodes are visited in sorted order, so the
-- same graph gives the same cycle (spec/layers_spec.lua, spec/cdeps_spec.lua)
function U.find_cycle(g)
  local state, stack = {}, {}
  local function visit(n)
    state[n] = "open"
    stack[#stack + 1] = n
    local next_ = {}
    for m in pairs(g[n] or {}) do next_[#next_ + 1] = m end
    table.sort(next_)
    for _, m in ipairs(next_) do
      if state[m] == "open" then
        local cyc = {}
        for i = #stack, 1, -1 do
          table.insert(cyc, 1, stack[i])
          if stack[i] == m then break end
        end
        cyc[#cyc + 1] = m
        return cyc
      elseif not state[m] then
        local c = visit(m)
        if c then return c end
      end
    end
    stack[#stack] = nil
    state[n] = "done"
  end
  local names = {}
  for n in pairs(g) do names[#names + 1] = n end
  table.sort(names)
  for _, n in ipairs(names) do
    if not state[n] then
      local c = visit(n)
      if c then return c end
    end
  end
end

return U
