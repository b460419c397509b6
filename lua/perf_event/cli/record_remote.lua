--- perf_event.cli.record_remote: `luaperf record --lua -p PID` on LuaJIT
-- processes that loaded nothing of ours. A BPF program (bpf/ljstack.bpf.c)
-- on a sampling event of each CPU reads, at each sample of a target's
-- thread, the running coroutine's frames and those of the thread that
-- resumed it, where the sample's own registers say the walk starts; here
-- each chain is checked (every frame a function, the leaf's PC in the
-- leaf's bytecode or the trace's snapshot) and named as `pe.profile` and
-- `luaperf dump` name frames (perf_event.remote). A chain that fails the
-- check is counted on the closing line, never written.
-- Needs root (BPF) and a core built with libbpf; perf_event.cli.record
-- falls back to its /tmp/perf-PID.map path otherwise.
-- (not a public interface: luaperf's subcommands, run through perf_event.cli's main)
-- @module perf_event.cli.record_remote

local io, string, table, os = io, string, table, os
local ipairs, pairs, tostring = ipairs, pairs, tostring
local format, concat = string.format, table.concat

local C = require("perf_event.cli.common")
local exit_code = C.exit_code

local M = {}

-- a target's C leaf namer: the sample's ip as pe.profile names a C leaf
-- (the ELF symbol, "[module]" where none covers it), or nil for the VM's
-- own code (the interpreter, LuaJIT's helpers, trace machine code) unless
-- the chain has no Lua frame; the maps are read again (at most every 5 s)
-- for an address in none of them: a library loaded since
local function cleaf_namer(pid, st)
  local sym = require("perf_event.symbols").new({ kernel = false })
  sym:load_maps(pid)
  local cache, ncache, reread = {}, 0, os.time()
  return function(ip, alone)
    if ip >= st.vm_lo and ip < st.vm_hi and not alone then return nil end
    local e = cache[ip]
    if not e then
      local name, _, module = sym:lookup(ip, pid)
      -- (in no mapping: trace machine code, most often; a library loaded
      -- since, at most every 5 s)
      if name == "[unknown]" and os.time() - reread >= 5 then
        reread = os.time()
        sym:load_maps(pid)
        name, _, module = sym:lookup(ip, pid)
      end
      -- the VM's own: anonymous memory (traces), LuaJIT's code
      local vm = not module or module == "anon" or module:sub(1, 1) == "[" and module ~= "[vdso]"
        or module:find("luajit", 1, true) and (name:find("^lj_") or name:find("^%["))
      e = { name, vm }
      if ncache >= 4096 then cache, ncache = {}, 0 end
      cache[ip], ncache = e, ncache + 1
    end
    if e[2] and not alone then return nil end
    return e[1]
  end
end

local function comm_of(pid)
  local f = io.open("/proc/" .. pid .. "/comm", "r")
  local s = f and f:read("*l")
  if f then f:close() end
  return s or tostring(pid)
end

-- the targets: pid -> {st=, name=, comm=} (false: no LuaJIT state in it)
local function targets_of(P, R, opts)
  local t, n = {}, 0
  local function add(pid)
    if t[pid] ~= nil then return end
    local vms = R.vms(pid)
    local st = vms and vms[1]
    if st and P.ljb_vm(pid, st) then
      t[pid] = { pid = pid, st = st, comm = comm_of(pid), cleaf = cleaf_namer(pid, st),
                 name = R.namer(pid, st, { lines = opts.lines }) }
      n = n + 1
    else
      t[pid] = false
    end
  end
  return t, add, function() return n end
end

-- sampling events on every online CPU with the BPF program attached
local function open_events(s, P)
  local pe = require("perf_event")
  local fs = require("perf_event.fs")
  local cpus = require("perf_event.pmu").parse_cpus(fs.read("/sys/devices/system/cpu/online") or "0")
  local spec = s.o.events[1] or "cpu-clock"
  local attr = { event = spec .. (spec:find(":") and "" or ":u"), disabled = true }
  if s.period then attr.sample_period = s.period else attr.sample_freq, attr.freq = s.freq, true end
  local evs = {}
  for _, cpu in ipairs(cpus) do
    local ev, err = pe.open(attr, { pid = -1, cpu = cpu })
    if not ev then
      for _, e in ipairs(evs) do e:close() end
      return nil, err
    end
    evs[#evs + 1] = ev
    local ok, berr = ev:set_bpf(P.ljb_prog())
    if not ok then
      for _, e in ipairs(evs) do e:close() end
      return nil, berr
    end
  end
  return evs
end

--- Whether the BPF program loads here: true, or nil and why not
-- (`PE_BPF=0` in the environment: not tried).
function M.available(c)
  if os.getenv("PE_BPF") == "0" then
    return nil, "reading the Lua stacks at each sample needs BPF, switched off by PE_BPF=0"
  end
  local ok, why = c._private.ljb_load()
  if ok then return true end
  return nil, "reading the Lua stacks at each sample needs BPF, which this cannot load (" .. tostring(why) .. ")"
end

--- Starts sampling the targets with the BPF program attached: returns a
-- session, or nil and why BPF cannot be used here (the caller may take
-- another path), or false and an exit code once the reason is written.
-- `sess.take(fn)` reads the samples so far, calling fn(target, names) for
-- each checked chain (names root first, as perf_event.remote's namer gives
-- them; `opts.lines = false`: functions, not lines) and counting the rest
-- (`sess.failed`, `sess.why_failed`); `sess.rescan()` adds the targets'
-- new children (--children); `sess.enable()` and `sess.disable()` switch
-- the sampling on and off; `sess.stop(fn)` disables, takes the last
-- samples and closes, setting `sess.dropped` (ring full).
-- @tparam table s perf_event.cli.record_args' settings (`pids`, `o`, `c`...)
function M.start(s, opts)
  opts = opts or {}
  local o, c = s.o, s.c
  local P = c._private
  local ok, why = P.ljb_load()
  if not ok then return nil, why end
  local R = require("perf_event.remote")
  local targets, add, ntargets = targets_of(P, R, opts)
  local sess = { targets = targets, failed = 0, why_failed = {}, dropped = 0 }
  function sess.rescan()
    for _, pid in ipairs(o.children and R.with_children(s.pids) or s.pids) do add(pid) end
  end
  sess.rescan()
  if ntargets() == 0 then
    P.ljb_close()
    io.stderr:write(format("luaperf %s: %s holds no LuaJIT 2.1 state (LuaJIT GC64 on x86-64 is read)\n",
                           s.cmdname or "record",
                           #s.pids == 1 and "process " .. s.pids[1] or "no process of " .. concat(s.pids, ",")))
    return false, 1
  end
  local evs, err = open_events(s, P)
  if not evs then
    P.ljb_close()
    io.stderr:write("luaperf ", s.cmdname or "record", ": ", tostring(err), "\n")
    return false, 1
  end
  sess.evs = evs
  function sess.take(fn)
    for _, smp in ipairs(P.ljb_poll(0)) do
      local t = targets[smp.pid]
      if t then
        local chain = P.ljr_chain(smp.pid, t.st, smp)
        if chain.ok then
          local frames = chain.frames
          local names = t.name(frames)
          -- (the outermost C function, the host's entry (lua_pcall's), is
          -- left out, as pe.profile leaves it out)
          if #frames > 1 and frames[#frames].ffid == 1 then table.remove(names, 1) end
          local leaf = t.cleaf(smp.rip, #names == 0)
          if leaf then names[#names + 1] = leaf end
          fn(t, names)
        else
          sess.failed = sess.failed + 1
          sess.why_failed[chain.why] = (sess.why_failed[chain.why] or 0) + 1
        end
      end
    end
  end
  function sess.enable()
    for _, e in ipairs(evs) do e:enable() end
  end
  function sess.disable()
    for _, e in ipairs(evs) do e:disable() end
  end
  function sess.stop(fn)
    for _, e in ipairs(evs) do e:disable() end
    sess.take(fn)
    for _, e in ipairs(evs) do e:close() end
    sess.dropped = P.ljb_counts().dropped or 0
    P.ljb_close()
  end
  -- the reasons chains failed the check, for a closing line: "(3 why, ...)"
  function sess.reasons()
    local r = {}
    for w, n in pairs(sess.why_failed) do r[#r + 1] = format("%d %s", n, w) end
    table.sort(r)
    return #r > 0 and " (" .. concat(r, ", ") .. ")" or ""
  end
  return sess
end

--- Records; returns the exit code, or nil and why BPF cannot be used here
-- (then the caller takes its other path).
-- @tparam table s perf_event.cli.record_args' settings (`pids`, `o`, `c`...)
-- @param out the open output file, path its name
function M.record(s, out, path)
  local o, c = s.o, s.c
  local sess, why = M.start(s)
  if sess == nil then return nil, why end
  if not sess then return why end
  local child, err
  if #o.cmd > 0 then
    child, err = c.spawn(o.cmd)
    if not child then
      sess.stop(function() end)
      io.stderr:write("luaperf record: ", tostring(err), "\n")
      return 127
    end
  end
  sess.enable()
  -- folded text: comm;frames; pprof and speedscope: each process's own
  -- (a pid label)
  local counts, keys, samples, by_pid = {}, {}, 0, {}
  local function count(t, names)
    local stack = concat(names, ";")
    local key = t.comm .. ";" .. stack
    if not counts[key] then counts[key] = 0 keys[#keys + 1] = key end
    counts[key] = counts[key] + 1
    samples = samples + 1
    local mine = by_pid[t.pid]
    if not mine then mine = {} by_pid[t.pid] = mine end
    mine[stack] = (mine[stack] or 0) + 1
  end
  local waited = child or (#s.pids == 1 and not o.children and s.pids[1]) or nil
  local last_scan, status, code = os.time(), nil, nil
  while true do
    local what = c.wait_events({}, 100, waited)
    sess.take(count)
    if what == "signal" then
      if child and child:wait(0) == false then child:kill(15) end
      break
    end
    if what == "exited" or what == nil then break end
    if o.children and os.time() ~= last_scan then sess.rescan() last_scan = os.time() end
  end
  sess.stop(count)
  if child then status, code = child:wait() end
  table.sort(keys)
  if s.as_profile then
    local pprof = require("perf_event.pprof")
    local pids, t = {}, nil
    for pid in pairs(by_pid) do pids[#pids + 1] = pid end
    table.sort(pids)
    for _, pid in ipairs(pids) do
      local mine = by_pid[pid]
      if s.as_profile == "speedscope" then
        local rooted = {}
        for stack, n in pairs(mine) do rooted["pid=" .. pid .. ";" .. stack] = n end
        mine = rooted
      end
      local part = pprof.folded_table(mine, { event = o.events[1] or "cpu-clock", freq = not s.period and s.freq or nil,
                                           period = s.period, labels = { { key = "pid", num = pid } } })
      if not t then t = part
      else for _, smp in ipairs(part.samples) do t.samples[#t.samples + 1] = smp end end
    end
    t = t or pprof.folded_table({}, { event = o.events[1] or "cpu-clock", freq = not s.period and s.freq or nil,
                                      period = s.period })
    out:write(s.as_profile == "pprof" and pprof.encode(t) or require("perf_event.speedscope").encode(t,
      { name = "luaperf record --lua -p " .. concat(s.pids, ",") }))
  else
    for _, k in ipairs(keys) do out:write(k, " ", counts[k], "\n") end
  end
  if out ~= io.stdout then out:close() end
  io.stderr:write(format("[ luaperf record: %d samples, %d stacks written to %s%s; %d failed the check%s%s ]\n",
                         samples, #keys, path == "-" and "stdout" or path,
                         s.as_profile and " (" .. s.as_profile .. ")" or "", sess.failed, sess.reasons(),
                         sess.dropped > 0 and format("; %d lost (ring full)", sess.dropped) or ""))
  return child and exit_code(status, code) or 0
end

return M
