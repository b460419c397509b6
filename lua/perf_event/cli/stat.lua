--- perf_event.cli.stat: `luaperf stat`, counts as perf stat prints them.
-- (not a public interface: luaperf's subcommands, run through perf_event.cli's main)
-- @module perf_event.cli.stat

local io, string, table = io, string, table
local ipairs, pairs, tostring = ipairs, pairs, tostring
local os_date = os.date
local format, concat = string.format, table.concat

local C = require("perf_event.cli.common")
local pe, core = C.pe, C.core
local usage_error, parse_args, number_opt = C.usage_error, C.parse_args, C.number_opt
local exit_code, open_output, int_list = C.exit_code, C.open_output, C.int_list

local M = {}

local USAGE = {
  stat = [[
usage: luaperf stat [-e EVENTS] [-p PID | -t TID | -a | -C CPUS] [-A | --per-thread] [-r N]
                    [-I MS] [-x SEP | -j] [-o FILE] [-- CMD ARGS...]

  -e, --event EVENTS      comma-separated events, perf syntax (repeatable); '{a,b}'
                          opens a group; perf's tool events: duration_time (wall
                          time, ns), user_time and system_time (CMD's, ns);
                          default: task-clock,context-switches,cpu-migrations,page-faults
  -p, --pid PID           count an existing process (all its threads)
  -t, --tid TIDS          count existing threads (comma-separated)
  -a, --all-cpus          count every CPU (system wide; needs CAP_PERFMON or paranoid <= 0)
  -C, --cpu CPUS          count these CPUs only (0,2-3), system wide
  -A, --no-aggr           with -a/-C: one count per CPU
      --per-thread        with -p/-t: one count per thread
  -r, --repeat N          run CMD N times; print the means and their relative stddev;
                          -r 0: forever, each run printed as it ends, until SIGINT or
                          SIGTERM (the run it cuts short is not counted), then the
                          means of the runs so far; exit status 128 + the signal
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
}

local SW = core().abi.sw
local DEFAULT_EVENTS = {
  { type = "software", config = SW.task_clock, name = "task-clock" },
  { type = "software", config = SW.context_switches, name = "context-switches" },
  { type = "software", config = SW.cpu_migrations, name = "cpu-migrations" },
  { type = "software", config = SW.page_faults, name = "page-faults" },
}

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

  local status, code, ru, sig
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
      -- the child got the same SIGINT from the terminal; wait for it.
      -- -r 0: this run is cut short and the repeating ends; the signal
      -- goes to the command too (sent to luaperf alone, it would not end)
      if o.forever then
        sig = sig or code
        child:kill(code)
      end
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
    -- (-r 0's runs without user/sys times, as perf prints them)
    local times = not attach and not o.forever and ru
    local extra = { elapsed = elapsed, label = label,
                    utime = times and ru.utime or nil,
                    stime = times and ru.stime or nil }
    if o.each then res = set:read_each(extra) res.elapsed, res.label = elapsed, label
    else res = set:read(extra) end
  end
  set:close()
  local rc = 0
  if child and (status == "exited" or status == "signaled") then rc = exit_code(status, code) end
  return res or true, rc, sig
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
  run.interval = o["interval-print"] and number_opt("stat", o["interval-print"], "-I MS", 1)
  run.sep, run.json = o["field-separator"], o["json-output"]
  -- -r 0: forever (perf's "forever: 0"), until SIGINT or SIGTERM
  local reps = o["repeat"] and number_opt("stat", o["repeat"], "-r N", 0) or 1
  run.forever = reps == 0
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
  if reps ~= 1 and (run.interval or run.each or #o.cmd == 0) then
    usage_error("stat", "-r needs a command and goes with neither -I, -A nor --per-thread")
  end
  local events = #o.events > 0 and { concat(o.events, ",") } or DEFAULT_EVENTS
  local ok, eerr = require("perf_event.stat").expand(events)
  if not ok then io.stderr:write("luaperf stat: ", tostring(eerr), "\n") return 1 end
  local out = open_output(o.output)
  -- perf stat -o FILE starts the file with the time, as ctime(3) prints it
  if out ~= io.stderr and out ~= io.stdout then out:write(os_date("# started on %a %b %e %H:%M:%S %Y\n\n")) end
  core().catch_signals()
  local runs, rc = {}, 0
  if run.forever then
    -- as perf 6.1's -r 0: each run printed as it ends, its counts alone;
    -- on SIGINT/SIGTERM the exit status of a death by that signal (perf
    -- dies by it: 130, 143).  Then (perf prints nothing more) the means of
    -- the runs completed, as -r N prints them
    local mean = require("perf_event.stat").mean
    while true do
      local res, sig
      res, rc, sig = stat_once(run, events, out)
      if not res then return rc end
      if sig then
        if #runs > 0 then stat_report(run, #runs > 1 and mean(runs) or runs[1], out) end
        if out ~= io.stderr and out ~= io.stdout then out:close() end
        return 128 + sig
      end
      runs[#runs + 1] = res
      stat_report(run, res, out)
      out:flush()
    end
  end
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

M.USAGE = USAGE

return M
