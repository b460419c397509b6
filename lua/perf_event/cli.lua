--- perf_event.cli: the `luaperf` command line tool (stat, list, record).
-- `main(argv)` returns the process exit status; bin/luaperf calls it.
-- Reports go to stderr as perf's do; `record` writes folded stacks
-- (`comm;caller;callee N`, the flame-graph input) to a file or stdout, or
-- perf.data to a `.data` file (perf_event.perfdata).
-- @module perf_event.cli

local io, string, table, math = io, string, table, math
local ipairs, pairs, tonumber, tostring, type, pcall, error = ipairs, pairs, tonumber, tostring, type, pcall, error
local setmetatable, getmetatable = setmetatable, getmetatable
local format, concat = string.format, table.concat

local M = {}

local function pe() return require("perf_event") end
local function core() return require("perf_event.core") end

local USAGE = {
  main = [[
usage: luaperf COMMAND [OPTIONS] [-- CMD ARGS...]

  stat     count events while CMD runs (or for a running process / every CPU)
  list     list the event names this machine offers
  record   sample CMD and write folded stacks (flame-graph input) or perf.data

Run 'luaperf COMMAND --help' for the options of a command.
]],
  stat = [[
usage: luaperf stat [-e EVENTS] [-p PID | -t TID | -a | -C CPUS] [-A | --per-thread] [-r N]
                    [-I MS] [-x SEP | -j] [-o FILE] [-- CMD ARGS...]

  -e, --event EVENTS      comma-separated events, perf syntax (repeatable); '{a,b}'
                          opens a group; duration_time is the wall time in ns;
                          default: task-clock,context-switches,cpu-migrations,page-faults
  -p, --pid PID           count an existing process (all its threads)
  -t, --tid TIDS          count existing threads (comma-separated)
  -a, --all-cpus          count every CPU (system wide; needs CAP_PERFMON or paranoid <= 0)
  -C, --cpu CPUS          count these CPUs only (0,2-3), system wide
  -A, --no-aggr           with -a/-C: one count per CPU
      --per-thread        with -p/-t: one count per thread
  -r, --repeat N          run CMD N times; print the means and their relative stddev
  -I, --interval-print MS print the counts of every MS milliseconds
  -x, --field-separator SEP  CSV-like output: value,unit,event,run,percent,metric,unit
  -j, --json-output       one JSON object per event (perf 6.1's shape)
  -o, --output FILE       write the report to FILE instead of stderr

With CMD, the counters follow CMD and its children from exec on
(enable_on_exec, inherit) and luaperf exits with CMD's status.  With -p, -t,
-a or -C and no CMD, counting lasts until the process exits or Ctrl-C; with a
CMD it lasts as long as CMD runs (e.g. '-- sleep 1').  An event the kernel
refuses prints <not supported> and the others are counted; when the kernel
was excluded automatically (perf_event_paranoid), the event prints as
'name:u' and the reason goes to stderr once.
]],
  list = [[
usage: luaperf list [--all] [CLASS | PATTERN]

  -a, --all   also list hardware, cache and software events this machine
              cannot open (a VM without a PMU has no hardware events) and
              tracefs entries without an id

Lists the events 'luaperf stat -e' and 'luaperf record -e' accept, as perf
list does: generic hardware and software names (with their aliases), cache
events, PMU events (pmu/alias/) and tracepoints (sys:name; tracefs must be
readable, usually root), then the descriptor forms rNNN and mem:<addr>.
CLASS is one of perf list's classes: hw (hardware), sw (software), cache
(hwcache), tracepoint, pmu; an empty class is not an error.  PATTERN is a
substring or a glob ('sched:*', '*faults').
]],
  record = [=[
usage: luaperf record [-e EVENT] [-F HZ | -c PERIOD] [-g | --call-graph fp|dwarf[,SIZE]]
                      [-p PID | -t TID | -a | -C CPUS] [-o FILE] [--folded] [-- CMD ARGS...]
                      [--pprof | --speedscope]
       luaperf record --lua [-e EVENT] [-F HZ | -c PERIOD] [-p PID] [-o FILE] [-- CMD ARGS...]

  -e, --event EVENT   what triggers a sample (default: cpu-clock)
  -F, --freq HZ       samples per second (default 999); above the kernel's
                      perf_event_max_sample_rate lowered to it with a warning
  -c, --count PERIOD  one sample every PERIOD events instead of -F
  -g                  record call chains (frame pointers); without -g only the
                      sampled function is written
      --call-graph MODE  fp (as -g) or dwarf[,SIZE]: copy SIZE bytes (8192)
                      of user stack per sample and unwind it with the files'
                      call frame information (elfutils' libdw; code built
                      without frame pointers keeps its callers)
  -p, --pid PID       sample an existing process until it exits or Ctrl-C
                      (or as long as CMD runs)
  -t, --tid TID       sample one thread (not its children) until it exits or Ctrl-C
  -a, --all-cpus      sample every CPU (system wide) until Ctrl-C, or while CMD runs
  -C, --cpu CPUS      sample these CPUs only ('0-1,3'), system wide
  -o, --output FILE   folded stacks go to FILE (default perf.folded; '-' = stdout);
                      a FILE ending in .data gets perf.data instead, which
                      'perf report -i FILE' and 'perf script -i FILE' read
      --folded        folded stacks even when FILE ends in .data
      --pprof         pprof's profile.proto, gzipped, to FILE (default perf.pb.gz):
                      'go tool pprof -top FILE', Pyroscope and Parca read it
      --speedscope    speedscope's JSON to FILE (default perf.speedscope.json):
                      open it at https://www.speedscope.app
      --lua           Lua frames, 'function@chunk:line' (doc/profiling.md):
                      with CMD, each Lua process of CMD profiles itself
                      (perf_event.autoprofile, loaded through LUA_INIT) and
                      its stacks, Lua callers included, are written when it
                      closes its Lua state or calls os.exit; with -p PID, a
                      LuaJIT process started with perf_event.luamap
                      (luajit -l perf_event.luamap app.lua) is sampled and
                      its JIT traces and interpreted lines are named from
                      /tmp/perf-PID.map: the Lua leaf and the C frames under
                      it, no Lua callers; folded output only (with CMD,
                      --pprof and --speedscope too)

Folded output: one line per distinct stack, root first: 'comm;main;caller;callee N'.
User addresses are named from the ELF symbol tables (.symtab/.dynsym) of the
mapped files or of their separate debug files (/usr/lib/debug/.build-id,
.gnu_debuglink: install e.g. libc6-dbg), kernel ones from /proc/kallsyms; a
file's code without a symbol prints as [lib.so], others as [unknown].
]=],
}

local SW = core().abi.sw
local DEFAULT_EVENTS = {
  { type = "software", config = SW.task_clock, name = "task-clock" },
  { type = "software", config = SW.context_switches, name = "context-switches" },
  { type = "software", config = SW.cpu_migrations, name = "cpu-migrations" },
  { type = "software", config = SW.page_faults, name = "page-faults" },
}

-- ------------------------------------------------------------- arguments

local Usage = {}   -- error marker for usage mistakes

local function usage_error(cmd, msg)
  error(setmetatable({ msg = msg, cmd = cmd }, Usage), 0)
end

-- opts: { short = long, ... }, takes: { long = true } for options with a value
local function parse_args(cmd, argv, spec)
  local o = { events = {} }
  local i = 1
  while i <= #argv do
    local a = argv[i]
    if a == "--" then i = i + 1 break end
    if a:sub(1, 1) ~= "-" or a == "-" then break end
    local name, val
    if a:sub(1, 2) == "--" then
      name, val = a:match("^%-%-([^=]+)=(.*)$")
      if not name then name = a:sub(3) end
    else
      name = spec.short[a:sub(2, 2)]
      if not name then usage_error(cmd, "unknown option " .. a) end
      if #a > 2 then val = a:sub(3) end
    end
    if not spec.takes[name] and not spec.flags[name] then
      usage_error(cmd, "unknown option " .. a)
    end
    if spec.takes[name] then
      if val == nil then
        i = i + 1
        val = argv[i]
        if val == nil then usage_error(cmd, "option " .. a .. " needs a value") end
      end
      if name == "event" then o.events[#o.events + 1] = val else o[name] = val end
    else
      if val ~= nil then usage_error(cmd, "option --" .. name .. " takes no value") end
      o[name] = true
    end
    i = i + 1
  end
  o.cmd = {}
  for j = i, #argv do o.cmd[#o.cmd + 1] = argv[j] end
  return o
end

local function number_opt(cmd, v, what, min)
  local n = tonumber(v)
  -- 2^53: the largest integer every Lua here holds exactly
  if not n or n ~= math.floor(n) or n < (min or 1) or n > 2 ^ 53 then
    usage_error(cmd, format("%s must be an integer from %d to 2^53, got '%s'", what, min or 1, tostring(v)))
  end
  return n
end

local function exit_code(status, code)
  if status == "exited" then return code end
  if status == "signaled" then return 128 + code end
  return 1
end

-- ------------------------------------------------------------- stat

local function open_output(path)
  if not path or path == "" then return io.stderr end
  if path == "-" then return io.stdout end
  local f, err = io.open(path, "w")
  if not f then error({ msg = err }, 0) end
  return f
end

local function int_list(cmd, v, what)
  local out = {}
  for part in tostring(v):gmatch("[^,]+") do
    local x, y = part:match("^(%d+)%-(%d+)$")
    if x then
      for n = tonumber(x), tonumber(y) do out[#out + 1] = n end
    elseif part:match("^%d+$") then
      out[#out + 1] = tonumber(part)
    else
      usage_error(cmd, format("%s must be a list like 0,2-3, got '%s'", what, tostring(v)))
    end
  end
  if #out == 0 then usage_error(cmd, format("%s must not be empty", what)) end
  return out
end

-- one measurement: opens the counters, runs/attaches, returns the result
-- (or the per-thread/CPU results), the command's status and an exit code
local function stat_once(o, events, out)
  local stat = require("perf_event.stat")
  local c = core()
  local set, child, err, errno, label
  local sep, json = o.sep, o.json
  local attach = o.pid or o.all or o.tids
  local common = { keep_going = true }
  if attach then
    for k, v in pairs({ pid = o.pid, threads = o.pid ~= nil, cpus = o.all, tids = o.tids,
                        disabled = false, inherit = o.pid ~= nil or nil }) do common[k] = v end
    set, err, errno = stat.open(events, common)
    label = o.pid and format("process id '%d'", o.pid) or o.tids and format("thread id '%s'", o.tids_str)
            or "system wide"
    if o.cpus_str then label = format("CPU(s) %s", o.cpus_str) end
  else
    child, err, errno = c.spawn(o.cmd, { stopped = true })
    if child then
      common.pid, common.disabled, common.inherit, common.enable_on_exec = child:pid(), true, true, true
      set, err, errno = stat.open(events, common)
      if not set then child:kill(9) end
    end
    label = concat(o.cmd, " ")
  end
  if not set then
    io.stderr:write("luaperf stat: ", tostring(err), "\n")
    if errno == c.abi.errno.EACCES or errno == c.abi.errno.EPERM then
      io.stderr:write("luaperf stat: see 'luaperf list' and doc/permissions.md; perf_event_paranoid is ",
                      tostring(pe().sysctl and (pe().sysctl() or {}).paranoid or "?"), "\n")
    end
    return false, child and 127 or 1
  end
  if not o.noted then
    for _, n in ipairs(set:notes()) do io.stderr:write("luaperf stat: ", n, "\n") end
    o.noted = true
  end
  local t0 = c.now()   -- as perf: the clock starts when the command is released
  if attach and #o.cmd > 0 then
    child, err = c.spawn(o.cmd)
    if not child then set:close() io.stderr:write("luaperf stat: ", err, "\n") return false, 127 end
  elseif child then
    local ok
    ok, err = child:start()
    if not ok then set:close() io.stderr:write("luaperf stat: ", err, "\n") return false, 127 end
  end

  local last, last_t = nil, t0
  local function print_interval()
    local now = c.now()
    local r = set:read({ elapsed = now - t0 })
    local d = {}
    for i, e in ipairs(r) do
      local prev = last and last[i]
      d[i] = { name = e.name, value = e.value - (prev and prev.value or 0),
               enabled = e.enabled - (prev and prev.enabled or 0),
               running = e.running - (prev and prev.running or 0), unit = e.unit, attr = e.attr,
               supported = e.supported, tool = e.tool }
      -- an idle interval is <not counted>, as perf prints it
      d[i].counted = e.supported ~= false and d[i].running > 0
    end
    d.elapsed = now - last_t
    stat.derive(d)
    if not last and not sep and not json then
      out:write("#           time             counts unit events\n")
    end
    if json then out:write(stat.json(d, { { "interval", now - t0 } }))
    elseif sep then out:write(stat.csv(d, sep, format("%.9f%s", now - t0, sep)))
    else out:write(concat(stat.lines(d, format("%16.9f ", now - t0)), "\n"), "\n") end
    last, last_t = r, now
  end

  local status, code, ru
  while true do
    local step = o.interval or -1
    if child then
      status, code, ru = child:wait(step)
    else
      -- -a/-t without a command: pid 1 never exits, so this waits for Ctrl-C
      local w = o.pid or (o.tids and o.tids[1]) or 1
      status, code = c.wait_pid(w, step)
    end
    if status == false then
      print_interval()
    elseif status == "signal" then
      if not child then break end   -- Ctrl-C: print what was counted
      -- the child got the same SIGINT from the terminal; wait for it
    else
      break
    end
  end
  local elapsed = c.now() - t0
  set:disable()
  local res
  if o.interval then
    print_interval()
  else
    local extra = { elapsed = elapsed, label = label,
                    utime = (not attach and ru) and ru.utime or nil,
                    stime = (not attach and ru) and ru.stime or nil }
    if o.each then res = set:read_each(extra) res.elapsed, res.label = elapsed, label
    else res = set:read(extra) end
  end
  set:close()
  local rc = 0
  if child and (status == "exited" or status == "signaled") then rc = exit_code(status, code) end
  return res or true, rc
end

-- prints a result (or per-thread/CPU results) as perf stat does
local function stat_report(o, res, out)
  local stat = require("perf_event.stat")
  if o.each then
    local key = o.each == "cpu" and "cpu" or "thread"
    local rows, by_event = {}, {}
    -- perf -A prints event by event, CPU by CPU; --per-thread thread by thread
    for _, r in ipairs(res) do
      for i, e in ipairs(r) do
        by_event[i] = by_event[i] or {}
        by_event[i][#by_event[i] + 1] = { r = r, e = e }
      end
    end
    local order = {}
    if key == "cpu" then
      for _, list in ipairs(by_event) do for _, x in ipairs(list) do order[#order + 1] = x end end
    else
      for _, r in ipairs(res) do for _, e in ipairs(r) do order[#order + 1] = { r = r, e = e } end end
    end
    for _, x in ipairs(order) do
      local one = { x.e, elapsed = x.r.elapsed }
      local tag = key == "cpu" and x.r.target:gsub("^CPU", "") or x.r.target
      if o.json then rows[#rows + 1] = stat.json(one, { { key, tag } })
      elseif o.sep then rows[#rows + 1] = stat.csv(one, o.sep, x.r.target .. o.sep)
      else
        -- perf's columns: "CPU0" in 11, "comm-tid" as %16s-%-8d and a space
        local comm, tid = x.r.target:match("^(.*)%-(%d+)$")
        local prefix = key == "cpu" and format("%-11s", x.r.target)
                       or format("%16s-%-8s ", comm or x.r.target, tid or "")
        rows[#rows + 1] = concat(stat.lines(one, prefix), "\n") .. "\n"
      end
    end
    if o.json or o.sep then out:write(concat(rows)) return end
    local label = (o.pid or o.tids) and res.label or format("'%s'", res.label)
    out:write("\n", format(" Performance counter stats for %s:\n\n", label), concat(rows), "\n",
              format("%18.9f seconds time elapsed\n\n", res.elapsed))
    return
  end
  if o.json then out:write(stat.json(res))
  elseif o.sep then out:write(stat.csv(res, o.sep))
  else out:write(tostring(res)) end
end

function M.stat(argv)
  local o = parse_args("stat", argv, {
    short = { e = "event", p = "pid", a = "all-cpus", I = "interval-print", x = "field-separator",
              o = "output", h = "help", r = "repeat", t = "tid", C = "cpu", A = "no-aggr", j = "json-output" },
    takes = { event = true, pid = true, ["interval-print"] = true, ["field-separator"] = true, output = true,
              ["repeat"] = true, tid = true, cpu = true },
    flags = { ["all-cpus"] = true, help = true, ["per-thread"] = true, ["no-aggr"] = true,
              ["json-output"] = true },
  })
  if o.help then io.stdout:write(USAGE.stat) return 0 end
  local run = { cmd = o.cmd }
  run.pid = o.pid and number_opt("stat", o.pid, "-p PID")
  run.interval = o["interval-print"] and number_opt("stat", o["interval-print"], "-I MS", 10)
  run.sep, run.json = o["field-separator"], o["json-output"]
  local reps = o["repeat"] and number_opt("stat", o["repeat"], "-r N") or 1
  if o.tid then run.tids, run.tids_str = int_list("stat", o.tid, "-t TID"), o.tid end
  if o.cpu then run.all, run.cpus_str = int_list("stat", o.cpu, "-C CPUS"), o.cpu
  elseif o["all-cpus"] then run.all = true end
  local targets = (run.pid and 1 or 0) + (run.tids and 1 or 0) + (run.all and 1 or 0)
  if targets > 1 then usage_error("stat", "-p, -t and -a/-C exclude each other") end
  if run.sep and run.json then usage_error("stat", "-x and -j exclude each other") end
  if not run.pid and not run.all and not run.tids and #o.cmd == 0 then
    usage_error("stat", "nothing to measure: give a command after '--', -p PID, -t TID or -a")
  end
  if o["no-aggr"] then
    if not run.all then usage_error("stat", "-A needs -a or -C") end
    run.each = "cpu"
  end
  if o["per-thread"] then
    if not run.pid and not run.tids then usage_error("stat", "--per-thread needs -p or -t") end
    if run.each then usage_error("stat", "--per-thread and -A exclude each other") end
    run.each = "thread"
  end
  if run.interval and run.each then
    usage_error("stat", "-I with -A or --per-thread is not supported by luaperf yet")
  end
  if reps > 1 and (run.interval or run.each or #o.cmd == 0) then
    usage_error("stat", "-r needs a command and goes with neither -I, -A nor --per-thread")
  end
  local events = #o.events > 0 and { concat(o.events, ",") } or DEFAULT_EVENTS
  local ok, eerr = require("perf_event.stat").expand(events)
  if not ok then io.stderr:write("luaperf stat: ", tostring(eerr), "\n") return 1 end
  local out = open_output(o.output)
  core().catch_signals()
  local runs, rc = {}, 0
  for _ = 1, reps do
    local res
    res, rc = stat_once(run, events, out)
    if not res then return rc end
    runs[#runs + 1] = res
  end
  if not run.interval then
    local res = runs[1]
    if reps > 1 then res = require("perf_event.stat").mean(runs) end
    stat_report(run, res, out)
  end
  if out ~= io.stderr and out ~= io.stdout then out:close() end
  return rc
end

-- ------------------------------------------------------------- list

local KIND = { hw = "Hardware event", sw = "Software event", cache = "Hardware cache event",
               tracepoint = "Tracepoint event", pmu = "Kernel PMU event" }
local CLASSES = { hw = "hw", hardware = "hw", sw = "sw", software = "sw", cache = "cache",
                  hwcache = "cache", tracepoint = "tracepoint", pmu = "pmu" }
-- perf list's descriptor lines: forms of -e that name no event
local DESCRIPTORS = {
  { "rNNN", "Raw hardware event descriptor" },
  { "mem:<addr>[/len][:access]", "Hardware breakpoint" },
}

local function class_of(name)
  if name:find("/") then return "pmu" end
  if name:find(":") then return "tracepoint" end
  local ev = require("perf_event.events")
  if ev.software[name] then return "sw" end
  if ev.hardware[name] then return "hw" end
  return "cache"
end

-- "context-switches OR cs": a canonical name with its aliases, as perf shows it
local function with_aliases(name, byname)
  local al = {}
  for a, v in pairs(byname) do
    if a ~= name and v == byname[name] then al[#al + 1] = a end
  end
  table.sort(al)
  if #al == 0 then return name end
  return name .. " OR " .. concat(al, " OR ")
end

-- whether this machine opens the event for this process, as perf list's
-- is_event_supported: as named, else with the kernel excluded (:u)
local function openable(name)
  for _, n in ipairs({ name, name .. ":u" }) do
    local ok, ev = pcall(pe().open, n)
    if ok and ev then ev:close() return true end
  end
  return false
end

-- whether tracefs gives the tracepoint an id (perf list skips those without)
local function has_id(name)
  local root = require("perf_event.tracepoint").root()
  local sys, ev = name:match("^([^:]+):(.+)$")
  local f = root and sys and io.open(root .. "/events/" .. sys .. "/" .. ev .. "/id", "r")
  if f then f:close() return true end
  return false
end

local function glob_to_pattern(p)
  return "^" .. p:gsub("[%^%$%(%)%%%.%[%]%+%-]", "%%%0"):gsub("%*", ".*"):gsub("%?", ".") .. "$"
end

function M.list(argv)
  local o = parse_args("list", argv, { short = { h = "help", a = "all" }, takes = {},
                                       flags = { help = true, all = true } })
  if o.help then io.stdout:write(USAGE.list) return 0 end
  if #o.cmd > 1 then usage_error("list", "one CLASS or PATTERN at most") end
  local pattern = o.cmd[1]
  local class = pattern and CLASSES[pattern]
  local ev = require("perf_event.events")
  local lines = {}
  -- the descriptor lines, after the PMU events and before the tracepoints
  local descriptors_done = false
  local function add_descriptors()
    for _, d in ipairs(DESCRIPTORS) do lines[#lines + 1] = format("  %-50s [%s]", d[1], d[2]) end
    descriptors_done = true
  end
  local order = {}   -- perf list's order of the classes
  for i, c in ipairs({ "hw", "sw", "cache", "pmu", "tracepoint" }) do order[c] = i end
  local names = pe().list()
  table.sort(names, function(x, y)
    local cx, cy = order[class_of(x)], order[class_of(y)]
    if cx ~= cy then return cx < cy end
    return x < y
  end)
  for _, n in ipairs(names) do
    local c = class_of(n)
    local ok = true
    if class then ok = c == class
    elseif pattern then
      if pattern:find("[*?]") then ok = n:match(glob_to_pattern(pattern)) ~= nil
      else ok = n:find(pattern, 1, true) ~= nil end
    end
    -- hardware, cache and software events this machine cannot open (no
    -- PMU in a VM, an older kernel) are left out, as perf does, unless --all
    if ok and not o.all and (c == "hw" or c == "cache" or c == "sw") then ok = openable(n) end
    -- tracefs directories without an id (ftrace:bprint, ...) are no events
    if ok and not o.all and c == "tracepoint" then ok = has_id(n) end
    if c == "tracepoint" and not pattern and not descriptors_done then
      add_descriptors()
    end
    if ok then
      local shown = n
      if c == "sw" then shown = with_aliases(n, ev.software)
      elseif c == "hw" then shown = with_aliases(n, ev.hardware) end
      lines[#lines + 1] = format("  %-50s [%s]", shown, KIND[c])
    end
  end
  if not pattern and not descriptors_done then add_descriptors() end
  if #lines > 0 then
    io.stdout:write("\nList of pre-defined events (to be used in -e):\n\n", concat(lines, "\n"), "\n\n")
  end
  if #lines == 0 and not class then
    io.stderr:write(format("luaperf list: no event matches '%s'%s\n", tostring(pattern),
      io.open("/sys/kernel/tracing/events") and "" or
        " (tracepoints are hidden: tracefs is not readable by this user)"))
    return 1
  end
  return 0
end

-- ------------------------------------------------------------- record

--- Aggregates samples into folded stacks.
-- @tparam table sym a perf_event.symbols symbolizer
-- @treturn table with `add(rec)`, `lines()` and `samples`
function M.folder(sym, opts)
  opts = opts or {}
  local counts, order = {}, {}
  local f = { samples = 0 }
  local comm_of = {}
  local function comm(pid)
    local c = (sym.comms and sym.comms[pid]) or comm_of[pid]
    if not c then
      local h = io.open("/proc/" .. tostring(pid) .. "/comm", "r")
      c = h and h:read("*l") or tostring(pid)
      if h then h:close() end
      comm_of[pid] = c
    end
    return c
  end
  function f.add(rec)
    local frames = rec.frames   -- named already (record --lua -p)
    if not frames and rec.callchain and #rec.callchain > 0 then
      frames = sym:callchain(rec.callchain, rec.pid)
    elseif not frames then
      frames = { sym:name(rec.ip, rec.pid) }
    end
    local parts = {}
    if opts.comm ~= false then parts[1] = comm(rec.pid) end
    for i = #frames, 1, -1 do parts[#parts + 1] = frames[i] end
    local key = concat(parts, ";")
    if not counts[key] then counts[key] = 0; order[#order + 1] = key end
    counts[key] = counts[key] + 1
    f.samples = f.samples + 1
  end
  function f.lines()
    local keys = {}
    for i, k in ipairs(order) do keys[i] = k end
    table.sort(keys)
    local out = {}
    for i, k in ipairs(keys) do out[i] = format("%s %d", k, counts[k]) end
    return out
  end
  f.counts = counts
  return f
end

local function time_of(r)
  local t = r.time
  if type(t) == "number" then return t end
  return tonumber(t) or 0
end

--- perf record's --call-graph value: "fp", "dwarf" or "dwarf,SIZE" (bytes
-- of user stack copied per sample; perf's default 8192, rounded up to 8,
-- at most 65528).
-- @treturn table|nil `{mode=, size=}` (nil for no value)
-- @treturn string|nil what is wrong with the value
function M.call_graph(v)
  if v == nil then return nil end
  local mode, rest = tostring(v):match("^(%a+)(.*)$")
  if mode == "fp" and rest == "" then return { mode = "fp" } end
  if mode == "dwarf" then
    if rest == "" then return { mode = "dwarf", size = 8192 } end
    local n = tonumber(rest:match("^,(%d+)$"))
    if n and n > 0 then
      n = math.ceil(n / 8) * 8
      if n <= 65528 then return { mode = "dwarf", size = n } end
    end
    return nil, format("--call-graph dwarf,SIZE: SIZE must be 1..65528 bytes, got '%s'", rest:sub(2))
  end
  return nil, format("--call-graph: 'fp' or 'dwarf[,SIZE]', got '%s'", tostring(v))
end

-- ------------------------------------------------------------- record --lua

-- package.searchpath, for Lua 5.1 too
local function search_path(name, path)
  local file = name:gsub("%.", "/")
  for tmpl in path:gmatch("[^;]+") do
    local cand = tmpl:gsub("%?", file)
    local f = io.open(cand, "r")
    if f then f:close() return cand end
  end
end

-- where the child finds perf_event: the Lua files luaperf itself loaded,
-- and the core built for the child's Lua (a checkout has one build per Lua:
-- build/, build/lua5.1/, build/lua5.4/; an installed 5.1 module serves
-- LuaJIT as well)
local function child_paths()
  local init = search_path("perf_event", package.path)
  local ldir = init and init:match("^(.-)perf_event/init%.lua$")
  local core_so = search_path("perf_event.core", package.cpath)
  local cdir = core_so and core_so:match("^(.-)perf_event/core%.[^/]*$")
  local own = rawget(_G, "jit") and "luajit" or _VERSION:gsub("Lua ", "lua")
  local cp = {}
  if cdir then
    cp[own] = cdir .. "?.so"
    local base = cdir:match("^(.-build/)lua5%.%d/$") or cdir:match("^(.-build/)$") or cdir:match("^(.-build/)asan/$")
    if base then
      cp.luajit = cp.luajit or base .. "?.so"
      cp["lua5.1"] = cp["lua5.1"] or base .. "lua5.1/?.so"
      cp["lua5.4"] = cp["lua5.4"] or base .. "lua5.4/?.so"
    elseif own == "luajit" or own == "lua5.1" then
      cp.luajit, cp["lua5.1"] = cp[own], cp[own]
    end
  end
  return ldir and (ldir .. "?.lua;" .. ldir .. "?/init.lua"), cp
end

-- the chunk LUA_INIT runs in the child: a searcher for perf_event's modules
-- in luaperf's paths (the child's own package.path and cpath are left as
-- they are), perf_event.autoprofile, then the child's own LUA_INIT
local function lua_init_code(lpath, cp, prev)
  local cps = {}
  for k, v in pairs(cp) do cps[#cps + 1] = format("[%q] = %q", k, v) end
  table.sort(cps)
  local code = format([[
do
  local P, C = %s, { %s }
  local cp = C[rawget(_G, "jit") and "luajit" or _VERSION:gsub("Lua ", "lua")]
  local function find(name, path)
    local file = name:gsub("%%.", "/")
    for t in path:gmatch("[^;]+") do
      local f = t:gsub("%%?", file)
      local h = io.open(f, "r")
      if h then h:close() return f end
    end
  end
  table.insert(package.searchers or package.loaders, 2, function(name)
    if name ~= "perf_event" and name:sub(1, 11) ~= "perf_event." then return nil end
    local f = P and find(name, P)
    if f then return assert(loadfile(f)), f end
    f = cp and find(name, cp)
    if f then return assert(package.loadlib(f, "luaopen_" .. name:gsub("%%.", "_"))), f end
  end)
  local ok, err = pcall(require, "perf_event.autoprofile")
  if not ok then
    io.stderr:write("luaperf record --lua: perf_event did not load in this process: ", tostring(err), "\n")
  end
end]], lpath and format("%q", lpath) or "nil", concat(cps, ", "))
  if prev and prev ~= "" then
    if prev:sub(1, 1) == "@" then code = code .. format("\ndofile(%q)", prev:sub(2))
    else code = code .. format("\nassert((rawget(_G, 'loadstring') or load)(%q, '=LUA_INIT'))()", prev) end
  end
  return code
end

-- `record --lua -- CMD`: CMD profiles itself (pe.profile through
-- perf_event.autoprofile, loaded by LUA_INIT) and writes its folded stacks
-- to a per-run file, which luaperf reads when CMD has exited
local function record_lua_child(o, freq, period, out, path, as_profile)
  local c = core()
  local base = os.tmpname()   -- the profile files are base.PID, one per Lua process
  local lpath, cp = child_paths()
  local getenv = os.getenv
  -- the core's spawn runs `env -- NAME=VALUE... CMD`: env sets the variables
  -- and replaces itself with CMD (same process, same pid)
  local argv = { "env", "--" }
  local function set(k, v) argv[#argv + 1] = k .. "=" .. v end
  set("LUA_INIT", lua_init_code(lpath, cp, getenv("LUA_INIT")))
  for _, v in ipairs({ "5_2", "5_3", "5_4" }) do
    set("LUA_INIT_" .. v, lua_init_code(lpath, cp, getenv("LUA_INIT_" .. v) or getenv("LUA_INIT")))
  end
  set("PE_PROFILE_OUT", base .. ".%p")
  set("PE_PROFILE_COMM", "1")
  set("PE_PROFILE_EVENT", o.events[1] or "cpu-clock")
  if period then set("PE_PROFILE_PERIOD", tostring(period)) else set("PE_PROFILE_FREQ", tostring(freq)) end
  -- LuaJIT has one profiler per process: a -jp that starts after
  -- autoprofile would take the safe-point hook over, so the signal walk
  for _, a in ipairs(o.cmd) do
    if a:sub(1, 3) == "-jp" then set("PE_PROFILE_WALK", "signal") break end
  end
  for _, a in ipairs(o.cmd) do argv[#argv + 1] = a end
  local child, err = c.spawn(argv)
  if not child then
    os.remove(base)
    io.stderr:write("luaperf record: ", tostring(err), "\n")
    return 127
  end
  local status, code
  repeat status, code = child:wait() until status ~= "signal" and status ~= false
  -- every Lua process of the run wrote base.PID
  local dir, prefix = base:match("^(.*)/([^/]*)$")
  local counts, keys, files, samples = {}, {}, 0, 0
  for _, name in ipairs(c.readdir(dir) or {}) do
    if name:sub(1, #prefix + 1) == prefix .. "." and name:sub(#prefix + 2):match("^%d+$") then
      local file = dir .. "/" .. name
      files = files + 1
      for l in io.lines(file) do
        local key, n = l:match("^(.*) (%d+)$")
        if key then
          if not counts[key] then counts[key] = 0; keys[#keys + 1] = key end
          counts[key] = counts[key] + tonumber(n)
          samples = samples + tonumber(n)
        end
      end
      os.remove(file)
    end
  end
  os.remove(base)
  table.sort(keys)
  if as_profile and files > 0 then
    local pprof = require("perf_event.pprof")
    local t = pprof.folded_table(counts, { event = o.events[1] or "cpu-clock", freq = not period and freq or nil,
                                           period = period })
    out:write(as_profile == "pprof" and pprof.encode(t) or require("perf_event.speedscope").encode(t,
      { name = "luaperf record --lua " .. concat(o.cmd, " ") }))
  elseif not as_profile then
    for _, k in ipairs(keys) do out:write(k, " ", counts[k], "\n") end
  end
  if out ~= io.stdout then out:close() end
  local rc = exit_code(status, code)
  if files == 0 then
    io.stderr:write(format("luaperf record: no Lua profile was written: '%s' is not a Lua interpreter, "
      .. "perf_event did not load in it, or it ended without closing its Lua state (killed by a signal, "
      .. "or exit() from C) [exit status %d]\n", o.cmd[1], rc))
    return rc
  end
  io.stderr:write(format("[ luaperf record: %d samples, %d stacks written to %s%s ]\n", samples, #keys,
                         path == "-" and "stdout" or path, as_profile and " (" .. as_profile .. ")" or ""))
  return rc
end

-- `record --lua -p PID`: the process keeps /tmp/perf-PID.map up to date
-- (perf_event.luamap); its lines name the samples' JIT trace code and the
-- source line of the bytecode the interpreter's PC register points into
local LuaMap = {}
LuaMap.__index = LuaMap

local function addr(v)
  local h = v ~= nil and require("perf_event.symbols").hex(v)
  return h and tonumber(h, 16)
end

--- A reader of a process's /tmp/perf-PID.map as perf_event.luamap writes it.
-- @tparam number pid
-- @tparam[opt] string path the map (default `/tmp/perf-PID.map`)
-- @treturn table with `refresh()`, `frames(rec, sym)` and the counts
--   `nbc`, `ntraces`; `found` once the map was read
function M.luamap(pid, path)
  local start
  local f = io.open("/proc/" .. tostring(pid) .. "/stat", "r")
  if f then
    local rest = (f:read("*l") or ""):match("%) (.*)$") or ""
    f:close()
    local n = 2
    for v in rest:gmatch("%S+") do n = n + 1 if n == 22 then start = v break end end
  end
  return setmetatable({ path = path or format("/tmp/perf-%d.map", pid), start = start, pos = 0,
                        bc = {}, traces = {}, nbc = 0, ntraces = 0, found = false }, LuaMap)
end

local function by_lo(a, b) return a.lo < b.lo end

-- the entry of a sorted list whose [lo, hi) holds a
local function covering(list, a)
  local lo, hi, best = 1, #list, nil
  while lo <= hi do
    local mid = math.floor((lo + hi) / 2)
    if list[mid].lo <= a then best = mid; lo = mid + 1 else hi = mid - 1 end
  end
  local e = best and list[best]
  return e and a < e.hi and e or nil
end

--- Reads the lines added since the last call.
function LuaMap:refresh()
  if self.stale then return self end
  local f = io.open(self.path, "r")
  if not f then return self end
  f:seek("set", self.pos)
  local data = f:read("*a") or ""
  f:close()
  local upto = data:match(".*\n()")   -- complete lines only
  if not upto then return self end
  self.pos = self.pos + upto - 1
  for l in data:sub(1, upto - 1):gmatch("[^\n]+") do
    local lo, size, name = l:match("^(%x+) (%x+) (.+)$")
    lo, size = tonumber(lo or "", 16), tonumber(size or "", 16)
    if not self.found then
      self.found = true
      local start = l:match("^0 0 perf_event%.luamap (%d+)$")
      -- a map an earlier process with this pid left behind
      if start and self.start and start ~= self.start then self.stale = true return self end
    end
    if lo and size > 0 then
      local bcname = name:match("^(.*) %[bc%]$")
      local trname = name:match("^(.*) %[trace %d+%]$")
      local e = { lo = lo, hi = lo + size, name = bcname or trname }
      if bcname then
        self.bc[#self.bc + 1] = e
        self.bc_sorted, self.nbc = false, self.nbc + 1
      elseif trname then
        -- a flush reuses machine code: the later line wins
        local keep = {}
        for _, t in ipairs(self.traces) do
          if t.hi <= e.lo or t.lo >= e.hi then keep[#keep + 1] = t end
        end
        keep[#keep + 1] = e
        table.sort(keep, by_lo)
        self.traces, self.ntraces = keep, self.ntraces + 1
      end
    end
  end
  return self
end

local function le_u64(s, o)
  local a, b, c, d, e, f, g, h = s:byte(o + 1, o + 8)
  return a + b * 256 + c * 65536 + d * 16777216 + (e + f * 256 + g * 65536 + h * 16777216) * 4294967296
end

-- LuaJIT's own code: the interpreter and VM (named or, stripped, "[luajit...]")
local function vm_frame(name)
  return (name:sub(1, 1) == "[" and name:find("luajit", 1, true)) or name:find("^lj_BC_") or name:find("^lj_vm_")
end

--- The frames of a sample, leaf first: a JIT trace's Lua frame; or the
-- Lua line the interpreter's PC (rbx) is in, under it the C frames of the
-- callchain down to the leaf when the leaf is not LuaJIT's own code; or, as
-- pe.profile does, a C leaf under a trace whose return address is in the
-- sampled stack; else the C callchain alone.
function LuaMap:frames(rec, sym)
  local ip = addr(rec.ip)
  local t = ip and covering(self.traces, ip)
  if t then return { t.name }, true end
  if not self.bc_sorted then table.sort(self.bc, by_lo) self.bc_sorted = true end
  local bx = rec.regs_user and addr(rec.regs_user.bx)
  local b = bx and covering(self.bc, bx - 4)
  local lua = b and b.name
  local su = rec.stack_user
  if not lua and su and su.data and #self.traces > 0 then
    local n = math.min(tonumber(su.dyn_size) or #su.data, #su.data)
    for o = 0, n - 8, 8 do
      local tr = covering(self.traces, le_u64(su.data, o))
      if tr then lua = tr.name break end
    end
  end
  local chain = rec.callchain and #rec.callchain > 0 and sym:callchain(rec.callchain, rec.pid) or {}
  if #chain == 0 then chain[1] = sym:name(rec.ip, rec.pid) end
  if not lua then return chain, false end
  local out = {}
  for _, name in ipairs(chain) do
    if vm_frame(name) or name == "[unknown]" then break end
    out[#out + 1] = name
  end
  out[#out + 1] = lua
  return out, true
end

function M.record(argv)
  local o = parse_args("record", argv, {
    short = { e = "event", F = "freq", c = "count", g = "g", p = "pid", o = "output", h = "help",
              t = "tid", a = "all-cpus", C = "cpu" },
    takes = { event = true, freq = true, count = true, pid = true, output = true, tid = true, cpu = true,
              ["call-graph"] = true },
    flags = { g = true, help = true, folded = true, ["all-cpus"] = true, pprof = true, speedscope = true,
              lua = true },
  })
  if o.help then io.stdout:write(USAGE.record) return 0 end
  if o.pprof and o.speedscope then usage_error("record", "--pprof and --speedscope exclude each other") end
  local as_profile = o.pprof and "pprof" or o.speedscope and "speedscope"
  if as_profile and o.folded then usage_error("record", "--folded and --" .. as_profile .. " exclude each other") end
  if o.lua then
    if o["all-cpus"] or o.cpu or o.tid then
      usage_error("record", "--lua profiles a command or a process (-p PID): not with -a, -C or -t")
    end
    if o.pid and (o.pprof or o.speedscope) then   -- the options of perf_event.pprof's writers
      usage_error("record", "--lua -p writes folded stacks: not with --pprof or --speedscope")
    end
    if o["call-graph"] and o["call-graph"] ~= "fp" then
      usage_error("record", "--lua names the Lua code itself: not with --call-graph " .. o["call-graph"])
    end
    if o.output and o.output:find("%.data$") and not o.folded then
      usage_error("record", "--lua writes folded stacks, not perf.data: -o " .. o.output .. " (add --folded)")
    end
  end
  if #o.events > 1 then usage_error("record", "record takes one -e EVENT") end
  if o.freq and o.count then usage_error("record", "-F and -c exclude each other") end
  local pid = o.pid and number_opt("record", o.pid, "-p PID")
  -- -t TID: one thread, no inherit; -a / -C CPUS: pid -1 on each CPU (as perf record)
  local tid = o.tid and number_opt("record", o.tid, "-t TID")
  local wide = o["all-cpus"] or o.cpu ~= nil
  local cpu_list = o.cpu and require("perf_event.pmu").parse_cpus(o.cpu)
  if cpu_list and #cpu_list == 0 then usage_error("record", "-C CPUS: no CPU in '" .. o.cpu .. "'") end
  if (pid and 1 or 0) + (tid and 1 or 0) + (wide and 1 or 0) > 1 then
    usage_error("record", "-p, -t and -a/-C exclude each other")
  end
  local tgid
  if tid then   -- the thread's process: its maps name the samples
    local f = io.open("/proc/" .. tid .. "/status", "r")
    tgid = f and tonumber(f:read("*a"):match("\nTgid:%s*(%d+)") or "")
    if f then f:close() end
  end
  if tid and not tgid then io.stderr:write("luaperf record: no thread ", tid, "\n") return 1 end
  local attach = pid or tid or wide
  if not attach and #o.cmd == 0 then
    usage_error("record", "nothing to sample: give a command after '--', -p PID, -t TID or -a")
  end
  local freq = o.freq and number_opt("record", o.freq, "-F HZ")
  local period = o.count and number_opt("record", o.count, "-c PERIOD")
  local c = core()
  local cg, cg_err = M.call_graph(o["call-graph"] or (o.g and "fp"))
  if cg_err then usage_error("record", cg_err) end
  if cg and cg.mode == "dwarf" and not c.unwind_available then
    io.stderr:write("luaperf was built without libdw: --call-graph dwarf is not available\n")
    return 1
  end
  if not period then
    -- above perf_event_max_sample_rate the kernel refuses the event: lower
    -- it, as perf does (the kernel's own limit, read now; the warning only
    -- for a rate the user asked for)
    local want = freq or 999
    local max = pe().sysctl().max_sample_rate
    if max and max > 0 and want > max then
      if freq then
        io.stderr:write(format("warning: Maximum frequency rate (%d Hz) exceeded, throttling from %d Hz to %d Hz.\n"
          .. "         The limit can be raised via /proc/sys/kernel/perf_event_max_sample_rate.\n"
          .. "         The kernel will lower it when luaperf's interrupts take too long.\n", max, freq, max))
      end
      want = max
    end
    freq = want
  end
  c.catch_signals()
  if o.lua and not pid then
    local path = o.output or as_profile == "pprof" and "perf.pb.gz"
                 or as_profile == "speedscope" and "perf.speedscope.json" or "perf.folded"
    local out, oerr = io.stdout, nil
    if path ~= "-" then out, oerr = io.open(path, "wb") end
    if not out then io.stderr:write("luaperf record: cannot write ", tostring(oerr), "\n") return 1 end
    return record_lua_child(o, freq, period, out, path, as_profile)
  end

  local spec = o.events[1] or { type = "software", config = SW.cpu_clock, name = "cpu-clock" }
  local specs, serr = require("perf_event.stat").expand(spec, 1)
  if not specs then io.stderr:write("luaperf record: ", tostring(serr), "\n") return 1 end
  if #specs > 1 then usage_error("record", "record takes one event; '" .. spec .. "' names " .. #specs) end
  local R = require("perf_event.resolve")
  local base = specs[1].attr
  -- with -c, no PERIOD: the kernel samples every event of a software event
  -- or tracepoint whose sample_type has PERIOD (perf_swevent_event), so
  -- the period would be ignored; perf leaves it out as well
  local sample_type = period and "ip|tid|time|cpu" or "ip|tid|time|period|cpu"
  if cg then sample_type = sample_type .. "|callchain" end
  if cg and cg.mode == "dwarf" then sample_type = sample_type .. "|regs_user|stack_user" end
  -- --lua -p: the interpreter's PC register and a little stack (LuaMap:frames)
  if o.lua then sample_type = sample_type .. (cg and "" or "|callchain") .. "|regs_user|stack_user" end
  -- perf.data for a .data file unless --folded (perf_event.perfdata); a
  -- tracepoint's fields go with it (RAW), as perf record samples them
  local path = o.output or (o.pprof and "perf.pb.gz") or (o.speedscope and "perf.speedscope.json") or "perf.folded"
  local to_data = path:find("%.data$") ~= nil and not o.folded and not as_profile
  if to_data and tonumber(base.type) == c.abi.type.tracepoint then sample_type = sample_type .. "|raw" end

  -- the output is opened before anything runs: a bad path fails at once
  -- (perf.data: perfdata.create, below, before the command is started)
  local out, oerr = io.stdout, nil
  if path ~= "-" and not to_data then out, oerr = io.open(path, as_profile and "wb" or "w") end
  if not out then io.stderr:write("luaperf record: cannot write ", tostring(oerr), "\n") return 1 end

  local child, err
  local target = pid or tid or -1
  if not attach then
    child, err = c.spawn(o.cmd, { stopped = true })
    if not child then io.stderr:write("luaperf record: ", err, "\n") return 127 end
    target = child:pid()
  end
  local evs = {}
  local cpus = cpu_list or require("perf_event.stat").online_cpus()
  -- -p: every thread of the process (as stat -p), each on every CPU (an
  -- inherited event is mapped per CPU); new threads are inherited.  -t: the
  -- thread; -a/-C: pid -1; a command: the child
  local tids = { target }
  if pid then
    tids = {}
    for _, name in ipairs(c.readdir("/proc/" .. pid .. "/task") or {}) do
      if name:match("^%d+$") then tids[#tids + 1] = tonumber(name) end
    end
    if #tids == 0 then io.stderr:write(format("luaperf record: no process %d\n", pid)) return 1 end
  end
  local slots = {}
  for _, t in ipairs(tids) do
    for _, cpu in ipairs(cpus) do slots[#slots + 1] = { tid = t, cpu = cpu } end
  end
  for _, slot in ipairs(slots) do
    local cpu = slot.cpu
    local attr = {}
    for k, v in pairs(base) do attr[k] = v end
    attr.sample_type = sample_type
    if period then attr.sample_period = period
    else attr.freq = true; attr.sample_freq = freq or 999 end
    attr.disabled = child ~= nil
    attr.enable_on_exec = child ~= nil
    attr.inherit = not tid
    attr.mmap2 = true
    attr.mmap = true
    attr.comm = true
    attr.comm_exec = true
    attr.task = true
    attr.sample_id_all = true
    attr.wakeup_events = 0
    attr.watermark = false
    if cg and cg.mode == "dwarf" then
      -- the kernel's chain stops at user space; the user part is unwound
      -- from the registers and stack copy (core.unwind)
      attr.exclude_callchain_user = true
      attr.sample_regs_user = c.unwind_regs
      attr.sample_stack_user = cg.size
    end
    if o.lua then   -- user space only, as pe.profile
      attr.exclude_kernel, attr.exclude_callchain_kernel = true, true
      attr.sample_regs_user = require("perf_event.profile")._REGS_MASK
      attr.sample_stack_user = 256
    end
    -- perf's fallbacks (perf_event.resolve): user-space only on EACCES,
    -- no exclude_guest on EINVAL
    local r = { attr = attr, name = specs[1].name, explicit = specs[1].explicit, guest = specs[1].guest }
    local ev
    -- a DWARF sample carries a stack copy (8 KiB by default): a bigger ring
    ev, err = R.open(r, { pid = slot.tid, cpu = cpu, pages = (cg and cg.mode == "dwarf") and 512 or 64 })
    if not ev then
      -- a smaller ring when the mlock budget is tight
      ev, err = R.open(r, { pid = slot.tid, cpu = cpu, pages = 8 })
    end
    if not ev then
      for _, e in ipairs(evs) do e:close() end
      if child then child:kill(9) end
      if out ~= io.stdout then out:close() os.remove(path) end
      io.stderr:write("luaperf record: ", tostring(err), "\n")
      return 1
    end
    evs[#evs + 1] = ev
  end

  local pdata
  if to_data then
    local argv0 = { "luaperf", "record" }
    for _, a in ipairs(argv) do argv0[#argv0 + 1] = a end
    pdata, err = require("perf_event.perfdata").create(path, { { ev = evs[1], evs = evs, name = specs[1].name } },
                                                       { cmdline = argv0, pid = pid or tgid,
                                                         all = wide or nil })
    if not pdata then
      for _, e in ipairs(evs) do e:close() end
      if child then child:kill(9) end   -- still waiting to exec: never ran
      io.stderr:write("luaperf record: ", tostring(err), "\n")
      return 1
    end
  end

  local sym = require("perf_event.symbols").new()
  if pid or tgid then sym:load_maps(pid or tgid) end
  local folder = M.folder(sym)
  -- --pprof / --speedscope: the samples with their addresses and mappings
  local collector = as_profile and require("perf_event.pprof").recorder(sym, {
    event = specs[1].name, period = period, comm = function(p) return sym.comms and sym.comms[p] end })
  local t_start = c.now()
  local seen_pid = {}
  local lmap, nlua = o.lua and M.luamap(pid), 0
  if lmap and not lmap:refresh().found then
    io.stderr:write(format("luaperf record: %s does not exist: process %d was not started with "
      .. "perf_event.luamap (luajit -l perf_event.luamap, or require it), so its Lua code is not named; "
      .. "C frames only\n", lmap.path, pid))
  elseif lmap and lmap.stale then
    io.stderr:write(format("luaperf record: %s was left by an earlier process %d: not used; C frames only\n",
                           lmap.path, pid))
  end
  local function drain()
    local batch = {}
    if pdata then
      local records = require("perf_event.perfdata").records
      for _, ev in ipairs(evs) do
        for raw, rec in records(ev) do rec.raw_bytes = raw batch[#batch + 1] = rec end
      end
      table.sort(batch, function(a, b) return time_of(a) < time_of(b) end)
      for _, rec in ipairs(batch) do pdata:add(rec.raw_bytes, rec) end
      if #batch > 0 then pdata:round() end
      return
    end
    for _, ev in ipairs(evs) do
      for rec in ev:records() do batch[#batch + 1] = rec end
    end
    -- rings are per CPU: merge by time so mmaps precede the samples in them
    table.sort(batch, function(a, b) return time_of(a) < time_of(b) end)
    if lmap then lmap:refresh() end   -- the traces and functions made meanwhile
    for _, rec in ipairs(batch) do
      if rec.type == "sample" then
        if not seen_pid[rec.pid] and not sym.maps[rec.pid] then
          sym:load_maps(rec.pid)   -- started before we saw its mmaps
        end
        seen_pid[rec.pid] = true
        if cg and cg.mode == "dwarf" then rec.callchain = sym:unwind(rec) or rec.callchain end
        if lmap then
          local named
          rec.frames, named = lmap:frames(rec, sym)
          if named then nlua = nlua + 1 end
        end
        folder.add(rec)
        if collector then collector.add(rec) end
      else
        sym:record(rec)
      end
    end
  end

  if child then
    local ok
    ok, err = child:start()
    if not ok then
      for _, e in ipairs(evs) do e:close() end
      io.stderr:write("luaperf record: ", err, "\n")
      return 127
    end
  elseif #o.cmd > 0 then
    child, err = c.spawn(o.cmd)
    if not child then io.stderr:write("luaperf record: ", err, "\n") return 127 end
  end

  local status, code
  while true do
    if child then status, code = child:wait(100)
    else status, code = c.wait_pid(pid or tid or 1, 100) end
    drain()
    if status == "signal" and not child then break end
    if status ~= false and status ~= "signal" then break end
  end
  for _, ev in ipairs(evs) do ev:disable() end
  drain()
  local lost = 0
  for _, ev in ipairs(evs) do lost = lost + (tonumber((ev:lost())) or 0) ev:close() end

  if pdata then
    local ok, werr = pdata:close()
    if not ok then io.stderr:write("luaperf record: ", tostring(werr), "\n") return 1 end
    io.stderr:write(format("[ luaperf record: %d samples%s written to %s (perf.data) ]\n", pdata.samples,
                           lost > 0 and format(", %d records lost", lost) or "", path))
    if child and (status == "exited" or status == "signaled") then return exit_code(status, code) end
    return 0
  end
  if collector then
    local t = collector.table()
    t.duration_nanos = (c.now() - t_start) * 1e9
    local bytes
    if as_profile == "pprof" then bytes = require("perf_event.pprof").encode(t)
    else
      local name = #o.cmd > 0 and concat(o.cmd, " ") or "luaperf record"
      bytes = require("perf_event.speedscope").encode(t, { name = name })
    end
    out:write(bytes)
    if out ~= io.stdout then out:close() end
    io.stderr:write(format("[ luaperf record: %d samples, %d stacks%s written to %s (%s) ]\n", collector.samples,
                           #t.samples, lost > 0 and format(", %d records lost", lost) or "",
                           path == "-" and "stdout" or path, as_profile))
    if child and (status == "exited" or status == "signaled") then return exit_code(status, code) end
    return 0
  end
  local lines = folder.lines()
  if lmap then
    io.stderr:write(format("luaperf record: %d of %d samples in Lua code (%d bytecode lines and %d traces "
                           .. "in %s)\n", nlua, folder.samples, lmap.nbc, lmap.ntraces, lmap.path))
  end
  if #lines > 0 then out:write(concat(lines, "\n"), "\n") end
  if out ~= io.stdout then out:close() end
  io.stderr:write(format("[ luaperf record: %d samples, %d stacks%s written to %s ]\n", folder.samples,
                         #lines, lost > 0 and format(", %d records lost", lost) or "",
                         path == "-" and "stdout" or path))
  if child and (status == "exited" or status == "signaled") then return exit_code(status, code) end
  return 0
end

-- ------------------------------------------------------------- main

function M.main(argv)
  local cmd = argv[1]
  local rest = {}
  for i = 2, #argv do rest[#rest + 1] = argv[i] end
  if cmd == nil or cmd == "-h" or cmd == "--help" or cmd == "help" then
    io.stdout:write(USAGE.main)
    return cmd == nil and 2 or 0
  end
  if cmd == "--version" then io.stdout:write(pe()._VERSION, "\n") return 0 end
  local fn = ({ stat = M.stat, list = M.list, record = M.record })[cmd]
  if not fn then
    io.stderr:write(format("luaperf: unknown command '%s'\n\n", tostring(cmd)), USAGE.main)
    return 2
  end
  local ok, res = pcall(fn, rest)
  if ok then return res end
  if type(res) == "table" and getmetatable(res) == Usage then
    io.stderr:write(format("luaperf %s: %s\n\n%s", res.cmd, res.msg, USAGE[res.cmd]))
    return 2
  end
  if type(res) == "table" and res.msg then
    io.stderr:write("luaperf ", cmd, ": ", tostring(res.msg), "\n")
    return 1
  end
  -- never a source position ("cli.lua:177: ") in front of a message
  io.stderr:write("luaperf ", cmd, ": ", (tostring(res):gsub("^[%w%._/%-]+:%d+: ", "")), "\n")
  return 1
end

return M
