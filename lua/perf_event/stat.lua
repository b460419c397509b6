--- perf_event.stat: counting sets and `perf stat`-like reports.
-- `pe.stat(fn, events)` counts `fn()`; the command line tool (`luaperf
-- stat`) uses the same counter sets on a child, a running process or every
-- CPU.  A result prints like `perf stat`: value, unit, event, the derived
-- metric perf shows (CPUs utilized, GHz, insn per cycle, K/sec) and the
-- percentage of time counted when the kernel multiplexed.
-- @module perf_event.stat

local table, math, io = table, math, io
local type, ipairs, pairs, next, tonumber, tostring, error, setmetatable, select, pcall =
      type, ipairs, pairs, next, tonumber, tostring, error, setmetatable, select, pcall
local unpack = table.unpack or unpack  -- luacheck: ignore

local M = {}

local report = require("perf_event.stat.report")

local function core() return require("perf_event.core") end

local abi = core().abi

local num, type_of = report._num, report._type_of

-- ------------------------------------------------------------- event specs

-- splits an event string at its top-level commas (not inside `{...}` or a
-- PMU's `/terms/`)
local function split_top(s)
  local out, depth, slash, start = {}, 0, false, 1
  for i = 1, #s do
    local ch = s:sub(i, i)
    if ch == "{" then depth = depth + 1
    elseif ch == "}" then depth = depth - 1
    elseif ch == "/" then slash = not slash
    elseif ch == "," and depth == 0 and not slash then
      out[#out + 1] = s:sub(start, i - 1)
      start = i + 1
    end
  end
  out[#out + 1] = s:sub(start)
  return out
end

-- perf's tool events: counted by the tool, not by the kernel: the wall
-- time, and the command's user and system CPU time (its rusage)
local TOOLS = { duration_time = { unit = "ns", from = "elapsed" }, user_time = { unit = "ns", from = "utime" },
                system_time = { unit = "ns", from = "stime" } }
M.TOOLS = { "duration_time", "user_time", "system_time" }   -- perf list's order

--- Expands `events` into an array of resolved specs (perf_event.resolve:
-- `{name=, attr=, explicit=, guest=, entry=}`) with `unit=` and `scale=`.
-- `events` is an event string ("task-clock,page-faults"), an array of
-- strings and/or spec tables, or one spec table.  `duration_time` (perf's
-- tool event: the wall time in ns) comes back as `{name=, tool=true, unit=}`.
-- A Lua value of the wrong type raises; a spec that does not resolve returns
-- nil, msg.
function M.expand(events, level)
  level = (level or 1) + 1
  local R = require("perf_event.resolve")
  local out = {}
  local function add_one(spec)
    local list, err, kind = R.many(spec)
    if not list then
      if kind == "type" then
        if type(spec) == "table" then error(err, level + 2) end   -- a bad field of a spec table
        error("perf_event.stat: events must be strings or spec tables, got " .. type(spec), level + 2)
      end
      return err
    end
    for _, r in ipairs(list) do
      local e = r.entry or {}
      r.unit, r.scale = e.unit, e.scale
      -- perf names a tracepoint without its modifiers (sys:event:u prints
      -- as sys:event): the kernel counts a tracepoint hit either way
      if r.attr and type_of(r.attr) == abi.type.tracepoint and type(r.name) == "string" then
        r.name = r.name:gsub("^([^:/]+:[^:/]+):%a+$", "%1")
      end
      out[#out + 1] = r
    end
  end
  local function add(spec)
    if type(spec) ~= "string" then return add_one(spec) end
    local pending = {}
    local function flush()
      if #pending == 0 then return nil end
      local err = add_one(table.concat(pending, ","))
      pending = {}
      return err
    end
    local pieces = {}
    for _, piece in ipairs(split_top(spec)) do
      -- a tool event in a group ('{task-clock,duration_time}') is read by
      -- the tool: the group opens without it, the tool event follows it
      local body, mods = piece:match("^{(.*)}(.*)$")
      local tools = {}
      if body then
        local keep = {}
        for _, m in ipairs(split_top(body)) do
          if TOOLS[m] then tools[#tools + 1] = m else keep[#keep + 1] = m end
        end
        if #tools > 0 then piece = #keep > 0 and "{" .. table.concat(keep, ",") .. "}" .. mods or nil end
      end
      if piece then pieces[#pieces + 1] = piece end
      for _, t in ipairs(tools) do pieces[#pieces + 1] = t end
    end
    for _, piece in ipairs(pieces) do
      local tool = TOOLS[piece]
      if tool then
        local err = flush()
        if err then return err end
        out[#out + 1] = { name = piece, tool = true, unit = tool.unit, from = tool.from }
      else
        pending[#pending + 1] = piece
      end
    end
    return flush()
  end
  local err
  if type(events) == "string" then
    err = add(events)
  elseif type(events) == "table" and events[1] == nil and next(events) ~= nil then
    err = add(events)
  elseif type(events) == "table" then
    for _, e in ipairs(events) do
      err = add(e)
      if err then break end
    end
  else
    error("perf_event.stat: events must be a string or an array, got " .. type(events), level)
  end
  if err then return nil, err end
  if #out == 0 then error("perf_event.stat: no events given", level) end
  return out
end

-- ------------------------------------------------------------- counter sets

local Set = {}
Set.__index = Set

local function online_cpus()
  local cpus = require("perf_event.pmu").parse_cpus(
    require("perf_event.fs").read("/sys/devices/system/cpu/online"))
  if #cpus == 0 then cpus[1] = 0 end
  return cpus
end
M.online_cpus = online_cpus

local function threads_of(pid)
  local tids = {}
  for _, l in ipairs(require("perf_event.fs").list("/proc/" .. tonumber(pid) .. "/task")) do
    tids[#tids + 1] = tonumber(l)
  end
  if #tids == 0 then tids[1] = pid end
  return tids
end

-- the answers perf stat takes as "this event is not supported here" (it
-- prints <not supported> and counts the rest); any other refusal (EACCES,
-- EPERM, EMFILE, ...) fails the whole set, as in perf
local UNSUPPORTED = {}
for _, n in ipairs({ "EINVAL", "ENOSYS", "ENOENT", "EOPNOTSUPP", "ENXIO" }) do
  if abi.errno[n] then UNSUPPORTED[abi.errno[n]] = true end
end

-- "comm-tid" of a thread, as perf --per-thread prints it
local function thread_label(tid)
  local f = io.open("/proc/" .. tostring(tid) .. "/comm", "r")
  local comm = f and f:read("*l") or "?"
  if f then f:close() end
  return comm .. "-" .. tostring(tid)
end

--- Opens counters.
-- @param events see `expand`; a `{a,b}` group opens as a kernel group (the
--   leader's fd is the members' group_fd, one group per thread/CPU)
-- @tparam[opt] table opts `pid` (0 = self, default), `threads` (true: one
--   counter per thread of `pid`), `tids` (array of thread ids), `cpus`
--   (array, or true for every online CPU, with pid -1), `inherit`,
--   `enable_on_exec`, `disabled` (default true), `keep_going` (an event
--   the kernel refuses is kept as unsupported, with `err`/`errno`, and the
--   others are counted, as perf stat does)
-- @tparam[opt=1] integer level where a caller mistake is raised, as for `error`
-- @treturn[1] table set with `enable`, `disable`, `read`, `close`
-- @treturn[2] nil
-- @treturn[2] string
-- @treturn[2] number errno
function M.open(events, opts, level)
  level = (level or 1) + 1
  opts = opts or {}
  local R = require("perf_event.resolve")
  local specs, serr = M.expand(events, level)
  if not specs then return nil, serr end
  local pid = opts.pid or 0
  local targets = {}
  if opts.cpus then
    local cpus = opts.cpus == true and online_cpus() or opts.cpus
    for _, c in ipairs(cpus) do targets[#targets + 1] = { pid = -1, cpu = c, label = "CPU" .. c } end
  elseif opts.tids then
    for _, t in ipairs(opts.tids) do targets[#targets + 1] = { pid = t, cpu = -1 } end
  elseif opts.threads and pid > 0 then
    for _, t in ipairs(threads_of(pid)) do targets[#targets + 1] = { pid = t, cpu = -1 } end
  else
    targets[1] = { pid = pid, cpu = -1 }
  end
  for _, tg in ipairs(targets) do
    if not tg.label then tg.label = thread_label(tg.pid > 0 and tg.pid or "self") end
  end
  local set = setmetatable({ counters = {}, targets = targets }, Set)
  local leaders = {}   -- group id -> counter of its leader
  for i, s in ipairs(specs) do
    local e = s.entry or {}
    local c = { name = s.name, attr = s.attr, unit = s.unit, scale = s.scale, fds = {}, tool = s.tool, from = s.from,
                supported = true }
    set.counters[i] = c
    local leader
    if e.group then
      if e.leader then leaders[e.group] = c else leader = leaders[e.group] end
    end
    if leader and not leader.supported then
      c.supported, c.err, c.errno = false, leader.err, leader.errno
    end
    for k, tg in ipairs(targets) do
      if s.tool or not c.supported then break end
      local attr = {}
      for f, v in pairs(s.attr) do attr[f] = v end
      attr.disabled = opts.disabled ~= false
      if leader then attr.disabled = false end   -- members follow their leader
      if opts.inherit ~= nil then attr.inherit = opts.inherit end
      if opts.enable_on_exec ~= nil and not leader then attr.enable_on_exec = opts.enable_on_exec end
      attr.read_format = "total_time_enabled|total_time_running"
      -- perf's fallbacks (user-space only on EACCES, exclude_guest on EINVAL)
      local ev, err, errno = R.open({ attr = attr, name = s.name, explicit = s.explicit, guest = s.guest },
                                    { pid = tg.pid, cpu = tg.cpu, group = leader and leader.fds[k] or nil },
                                    level)
      if not ev then
        if not (opts.keep_going and UNSUPPORTED[errno]) then
          set:close()
          return nil, err, errno
        end
        for _, f in ipairs(c.fds) do f:close() end
        c.fds, c.supported, c.err, c.errno = {}, false, err, errno
        break
      end
      if k == 1 then
        local info = ev:info()
        if info.auto_exclude_kernel then c.auto_excluded, c.note = true, info.note end
      end
      c.fds[k] = ev
    end
  end
  return set
end

--- Enables every counter.
function Set:enable()
  for _, c in ipairs(self.counters) do
    for _, ev in ipairs(c.fds) do
      local ok, err, errno = ev:enable()
      if not ok then return nil, err, errno end
    end
  end
  self.t0 = self.t0 or core().now()
  return true
end

--- Disables every counter.
function Set:disable()
  for _, c in ipairs(self.counters) do
    for _, ev in ipairs(c.fds) do ev:disable() end
  end
  return true
end

function Set:close()
  for _, c in ipairs(self.counters) do
    for _, ev in ipairs(c.fds) do ev:close() end
  end
end

local Result = report.Result

-- one counter's entry, summed over the fds of `only` (a target index) or all
local function entry_of(c, only, elapsed, extra)
  if c.tool then
    -- user_time/system_time: the command's rusage (none when attached:
    -- <not counted>, as perf's 0)
    local secs = c.from == "elapsed" and elapsed or (extra and extra[c.from])
    local ns = (secs or 0) * 1e9
    local counted = c.from == "elapsed" or ns > 0
    return { name = c.name, value = math.floor(ns + 0.5), enabled = ns, running = ns, counted = counted,
             supported = true, unit = c.unit, attr = {}, tool = true }
  end
  local value, ena, run, counted = 0, 0, 0, false
  for k, ev in pairs(c.fds) do
    if only == nil or only == k then
      local v, e, ru = ev:read()
      if v then
        local nv, ne, nr = num(v), num(e or 0), num(ru or 0)
        if nr > 0 then counted = true end
        value, ena, run = value + nv, ena + ne, run + nr
      end
    end
  end
  if c.scale then value = value * c.scale end
  local name = c.name
  if c.auto_excluded then name = name .. ":u" end   -- as perf prints task-clock:u
  return { name = name, value = value, enabled = ena, running = run, counted = counted and c.supported,
           supported = c.supported, unit = c.unit, attr = c.attr, err = c.err, errno = c.errno }
end

--- Reads every counter (summed over threads/CPUs) into a result.
-- @tparam[opt] table extra fields copied into the result (elapsed, label, ...)
-- @tparam[opt] integer only read only the counters of this thread/CPU (an
--   index of `set.targets`)
-- @treturn table result: array of `{name, value, unit, enabled, running,
--   counted, supported, percent, metric, metric_unit}`, `result[name]` =
--   value, `elapsed`
function Set:read(extra, only)
  local r = setmetatable({}, Result)
  local elapsed = extra and extra.elapsed
  for i, c in ipairs(self.counters) do
    r[i] = entry_of(c, only, elapsed, extra)
    r[c.name] = r[i].value
  end
  for k, v in pairs(extra or {}) do r[k] = v end
  M.derive(r)
  return r
end

--- Reads each thread/CPU apart (perf stat --per-thread, -A).
-- @treturn table array of results, each with `target` = "comm-tid" or "CPUn"
function Set:read_each(extra)
  local out = {}
  for k, tg in ipairs(self.targets) do
    local r = self:read(extra, k)
    r.target = tg.label
    out[k] = r
  end
  return out
end

--- The reasons (once each) the kernel was excluded automatically.
function Set:notes()
  local seen, out = {}, {}
  for _, c in ipairs(self.counters) do
    if c.note and not seen[c.note] then seen[c.note] = true out[#out + 1] = c.note end
  end
  return out
end
-- ------------------------------------------------------------- reports
-- (perf_event.stat.report)

--- Fills unit, metric and metric_unit of each entry the way perf stat does.
-- @function derive
M.derive = report.derive
--- One line per event, as `perf stat` prints them (no header).
-- @function lines
M.lines = report.lines
--- perf stat's -x output: value,unit,event,run,percent,metric,metric unit
-- @function csv
M.csv = report.csv
--- perf 6.1's -j output: one JSON object per event and line.
-- @function json
M.json = report.json
--- Aggregates the results of `-r N` runs: each entry gets the mean value
-- and `variance`, perf's relative standard deviation of the mean in percent
-- (100 * sqrt(var / n) / mean, var with n - 1); so does `elapsed`
-- (`elapsed_stddev`, in seconds).
-- @function mean
-- @tparam table runs array of results (same events, same order)
-- @treturn table a result
M.mean = report.mean
--- The whole `perf stat` block.
-- @function format
M.format = report.format

-- ------------------------------------------------------------- pe.stat

local function pack(...) return { n = select("#", ...), ... } end

--- Runs `fn()` once with `events` counting on the calling thread.
-- @tparam function fn
-- @param events an event string (`"task-clock,page-faults"`), an array of
--   strings or attr tables
-- @tparam[opt] table opts `label` (printed in the header), `args` (array
--   passed to fn)
-- @treturn[1] table result: `r[i]` = `{name, value, unit, enabled, running,
--   percent, metric, metric_unit}`, `r[name]` = value, `r.elapsed` (s);
--   `tostring(r)` prints like `perf stat`; then whatever fn returned
-- @treturn[2] nil
-- @treturn[2] string why the counters could not be opened
-- @treturn[2] number errno
function M.stat(fn, events, opts)
  if type(fn) ~= "function" then
    error("perf_event.stat: fn must be a function, got " .. type(fn), 2)
  end
  if opts ~= nil and type(opts) ~= "table" then
    error("perf_event.stat: opts must be a table, got " .. type(opts), 2)
  end
  opts = opts or {}
  for k in pairs(opts) do     -- an unknown option is a caller mistake (doc/errors.md)
    if k ~= "label" and k ~= "args" then
      error("perf_event.stat: unknown option '" .. tostring(k) .. "' (label, args)", 2)
    end
  end
  local set, err, errno = M.open(events, { pid = 0, disabled = true }, 2)
  if not set then return nil, err, errno end
  local now = core().now
  local args = opts.args or {}
  local t0 = now()
  set:enable()
  local res = pack(pcall(fn, unpack(args, 1, args.n or #args)))
  set:disable()
  local t1 = now()
  local r = set:read({ elapsed = t1 - t0, label = opts.label })
  set:close()
  if not res[1] then error(res[2], 0) end
  return r, unpack(res, 2, res.n)
end

M.Result = Result
return M
