--- perf_event.stat: counting sets and `perf stat`-like reports.
-- `pe.stat(fn, events)` counts `fn()`; the command line tool (`luaperf
-- stat`) uses the same counter sets on a child, a running process or every
-- CPU.  A result prints like `perf stat`: value, unit, event, the derived
-- metric perf shows (CPUs utilized, GHz, insn per cycle, K/sec) and the
-- percentage of time counted when the kernel multiplexed.
-- @module perf_event.stat

local string, table, math, io = string, table, math, io
local type, ipairs, pairs, next, tonumber, tostring, error, setmetatable, select, pcall =
      type, ipairs, pairs, next, tonumber, tostring, error, setmetatable, select, pcall
local format = string.format
local unpack = table.unpack or unpack  -- luacheck: ignore

local M = {}

local function core() return require("perf_event.core") end

local abi = core().abi
local SOFTWARE, HARDWARE = abi.type.software, abi.type.hardware
local SW, HW = abi.sw, abi.hw

local function num(v)
  if type(v) == "number" then return v end
  return tonumber(v) or tonumber(tostring(v):match("^(%d+)")) or 0
end

local function type_of(attr)
  local t = attr.type
  if type(t) == "string" and abi.type[t] then return abi.type[t] end
  return tonumber(t)
end

-- ------------------------------------------------------------- event specs

--- Expands `events` into an array of resolved specs (perf_event.resolve:
-- `{name=, attr=, explicit=, guest=, entry=}`) with `unit=` and `scale=`.
-- `events` is an event string ("task-clock,page-faults"), an array of
-- strings and/or spec tables, or one spec table.  A Lua value of the wrong
-- type raises; a spec that does not resolve returns nil, msg.
function M.expand(events, level)
  level = (level or 1) + 1
  local R = require("perf_event.resolve")
  local out = {}
  local function add(spec)
    local list, err, kind = R.many(spec)
    if not list then
      if kind == "type" then
        if type(spec) == "table" then error(err, level + 1) end   -- a bad field of a spec table
        error("perf_event.stat: events must be strings or spec tables, got " .. type(spec), level + 1)
      end
      return err
    end
    for _, r in ipairs(list) do
      local e = r.entry or {}
      r.unit, r.scale = e.unit, e.scale
      out[#out + 1] = r
    end
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
  local f = io.open("/sys/devices/system/cpu/online", "r")
  local s = f and f:read("*l") or "0"
  if f then f:close() end
  local cpus = {}
  for part in s:gmatch("[^,]+") do
    local a, b = part:match("^(%d+)%-(%d+)$")
    if a then for c = tonumber(a), tonumber(b) do cpus[#cpus + 1] = c end
    else cpus[#cpus + 1] = tonumber(part) end
  end
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

--- Opens counters.
-- @param events see `expand`
-- @tparam[opt] table opts `pid` (0 = self, default), `threads` (true: one
--   counter per thread of `pid`), `cpus` (array, or true for every online
--   CPU, with pid -1), `inherit`, `enable_on_exec`, `disabled` (default true)
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
    for _, c in ipairs(cpus) do targets[#targets + 1] = { pid = -1, cpu = c } end
  elseif opts.threads and pid > 0 then
    for _, t in ipairs(threads_of(pid)) do targets[#targets + 1] = { pid = t, cpu = -1 } end
  else
    targets[1] = { pid = pid, cpu = -1 }
  end
  local set = setmetatable({ counters = {} }, Set)
  for i, s in ipairs(specs) do
    local c = { name = s.name, attr = s.attr, unit = s.unit, scale = s.scale, fds = {} }
    set.counters[i] = c
    for _, tg in ipairs(targets) do
      local attr = {}
      for k, v in pairs(s.attr) do attr[k] = v end
      attr.disabled = opts.disabled ~= false
      if opts.inherit ~= nil then attr.inherit = opts.inherit end
      if opts.enable_on_exec ~= nil then attr.enable_on_exec = opts.enable_on_exec end
      attr.read_format = "total_time_enabled|total_time_running"
      -- perf's fallbacks (user-space only on EACCES, exclude_guest on EINVAL)
      local ev, err, errno = R.open({ attr = attr, name = s.name, explicit = s.explicit, guest = s.guest },
                                    { pid = tg.pid, cpu = tg.cpu }, level)
      if not ev then
        set:close()
        return nil, err, errno
      end
      c.fds[#c.fds + 1] = ev
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

local Result = {}

--- Reads every counter (summed over threads/CPUs) into a result.
-- @tparam[opt] table extra fields copied into the result (elapsed, label, ...)
-- @treturn table result: array of `{name, value, unit, enabled, running,
--   percent, metric, metric_unit}`, `result[name]` = value, `elapsed`
function Set:read(extra)
  local r = setmetatable({}, Result)
  for i, c in ipairs(self.counters) do
    local value, ena, run, counted = 0, 0, 0, false
    for _, ev in ipairs(c.fds) do
      local v, e, ru = ev:read()
      if v then
        local nv, ne, nr = num(v), num(e or 0), num(ru or 0)
        if nr > 0 then counted = true end
        value, ena, run = value + nv, ena + ne, run + nr
      end
    end
    if c.scale then value = value * c.scale end
    r[i] = { name = c.name, value = value, enabled = ena, running = run,
             counted = counted, unit = c.unit, attr = c.attr }
    r[c.name] = value
  end
  for k, v in pairs(extra or {}) do r[k] = v end
  M.derive(r)
  return r
end

-- ------------------------------------------------------------- metrics

local function is_sw(attr, config)
  return type_of(attr) == SOFTWARE and num(attr.config or 0) == config
end
local function is_hw(attr, config)
  return type_of(attr) == HARDWARE and num(attr.config or 0) == config
end

-- K/M/G scaling as perf's convert_unit_double
local function rate_unit(v)
  if v >= 1e9 then return v / 1e9, "G/sec" end
  if v >= 1e6 then return v / 1e6, "M/sec" end
  if v >= 1e3 then return v / 1e3, "K/sec" end
  return v, "/sec"
end

--- Fills unit, metric and metric_unit of each entry the way perf stat does.
function M.derive(r)
  local task_ns, cycles, branches, cache_refs
  for _, e in ipairs(r) do
    local a = e.attr or {}
    if is_sw(a, SW.task_clock) or is_sw(a, SW.cpu_clock) then task_ns = task_ns or e.value end
    if is_hw(a, HW.cpu_cycles) then cycles = e.value end
    if is_hw(a, HW.branch_instructions) then branches = e.value end
    if is_hw(a, HW.cache_references) then cache_refs = e.value end
  end
  for _, e in ipairs(r) do
    local a = e.attr or {}
    e.percent = e.enabled > 0 and 100 * e.running / e.enabled or 0
    if (is_sw(a, SW.task_clock) or is_sw(a, SW.cpu_clock)) then
      e.unit, e.display = "msec", e.value / 1e6
      if is_sw(a, SW.task_clock) and r.elapsed and r.elapsed > 0 then
        e.metric, e.metric_unit = e.value / (r.elapsed * 1e9), "CPUs utilized"
      end
    elseif is_hw(a, HW.cpu_cycles) and task_ns and task_ns > 0 then
      e.metric, e.metric_unit = e.value / task_ns, "GHz"
    elseif is_hw(a, HW.instructions) and cycles and cycles > 0 then
      e.metric, e.metric_unit = e.value / cycles, "insn per cycle"
    elseif is_hw(a, HW.branch_misses) and branches and branches > 0 then
      e.metric, e.metric_unit, e.metric_pct = 100 * e.value / branches, "of all branches", true
    elseif is_hw(a, HW.cache_misses) and cache_refs and cache_refs > 0 then
      e.metric, e.metric_unit, e.metric_pct = 100 * e.value / cache_refs, "of all cache refs", true
    elseif task_ns and task_ns > 0 and not e.unit then
      e.metric, e.metric_unit = rate_unit(1e9 * e.value / task_ns)
    end
  end
  return r
end

-- ------------------------------------------------------------- output

local function value_str(e)
  if not e.counted then return "<not counted>" end
  local v = e.display or e.value
  if v ~= math.floor(v) or e.display then return format("%.2f", v) end
  return format("%.0f", v)
end

--- One line per event, as `perf stat` prints them (no header).
function M.lines(r, prefix)
  local out = {}
  for _, e in ipairs(r) do
    local line = format("%18s %-5s%-32s", value_str(e), e.unit or "", e.name)
    if e.counted and e.metric then
      if e.metric_pct then
        line = line .. format(" # %7.2f%% %s", e.metric, e.metric_unit)
      else
        line = line .. format(" # %8.3f %s", e.metric, e.metric_unit)
      end
    end
    if e.counted and e.running ~= e.enabled and e.enabled > 0 then
      line = line .. format("  (%.2f%%)", e.percent)
    end
    out[#out + 1] = (prefix or "") .. line:gsub("%s+$", "")
  end
  return out
end

--- perf stat's -x output: value,unit,event,run,percent,metric,metric unit
function M.csv(r, sep, prefix)
  sep = sep or ","
  local out = {}
  for _, e in ipairs(r) do
    local cols = {
      e.counted and value_str(e) or "<not counted>", e.unit or "", e.name,
      format("%.0f", e.running), format("%.2f", e.percent),
      e.metric and format(e.metric_pct and "%.2f" or "%.3f", e.metric) or "", e.metric_unit or "",
    }
    out[#out + 1] = (prefix or "") .. table.concat(cols, sep)
  end
  return table.concat(out, "\n") .. "\n"
end

--- The whole `perf stat` block.
function M.format(r)
  local b = { "", format(" Performance counter stats for '%s':", r.label or "Lua function"), "" }
  for _, l in ipairs(M.lines(r)) do b[#b + 1] = l end
  b[#b + 1] = ""
  if r.elapsed then b[#b + 1] = format("%18.9f seconds time elapsed", r.elapsed) b[#b + 1] = "" end
  if r.utime then
    b[#b + 1] = format("%18.9f seconds user", r.utime)
    b[#b + 1] = format("%18.9f seconds sys", r.stime or 0)
    b[#b + 1] = ""
  end
  return table.concat(b, "\n") .. "\n"
end

Result.__index = { csv = M.csv, lines = M.lines }
Result.__tostring = M.format

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
