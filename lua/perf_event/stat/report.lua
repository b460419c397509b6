--- perf_event.stat.report: a counting result as `perf stat` shows it:
-- the derived metrics (CPUs utilized, GHz, insn per cycle, K/sec, shares of
-- branches and cache references), the lines of its table, `-x` CSV, `-j`
-- JSON, the mean of `-r N` runs and the whole block; and the metatable of
-- results (`tostring(r)` prints that block).  perf_event.stat gives these
-- functions under its own name.
-- Not a public interface: reached through perf_event.stat.
-- @module perf_event.stat.report

local string, table, math = string, table, math
local type, ipairs, pairs, tonumber, tostring, setmetatable = type, ipairs, pairs, tonumber, tostring, setmetatable
local format = string.format

local M = {}

local abi = require("perf_event.core").abi
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

--- The metatable of results (perf_event.stat's `Result`).
local Result = {}
M.Result = Result
-- the helpers perf_event.stat shares (not a public interface)
M._num, M._type_of = num, type_of

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
    e.percent = e.enabled > 0 and 100 * e.running / e.enabled or 100   -- perf: 100.00 when never enabled
    if not e.counted then
      e.metric, e.metric_unit, e.metric_pct = nil, nil, nil
      if is_sw(a, SW.task_clock) or is_sw(a, SW.cpu_clock) then e.unit = "msec" end
    elseif (is_sw(a, SW.task_clock) or is_sw(a, SW.cpu_clock)) then
      e.unit, e.display = "msec", e.value / 1e6
      -- perf shows it for cpu-clock too (per CPU with -A)
      if r.elapsed and r.elapsed > 0 then
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
    elseif task_ns and task_ns > 0 and (not e.unit or e.tool) then
      e.metric, e.metric_unit = rate_unit(1e9 * e.value / task_ns)
    end
  end
  return r
end

-- ------------------------------------------------------------- output

local function value_str(e)
  if e.supported == false then return "<not supported>" end
  if not e.counted then return "<not counted>" end
  local v = e.display or e.value
  if e.variance and not e.display then return format("%.0f", v) end   -- a mean count, as perf rounds it
  if v ~= math.floor(v) or e.display then return format("%.2f", v) end
  return format("%.0f", v)
end

--- One line per event, as `perf stat` prints them (no header).
-- `prefix` starts each line (the interval's time, "CPU0", "comm-tid").
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
    if e.variance and e.variance ~= 0 then   -- perf omits a zero spread
      line = format("%-91s", line) .. format("  ( +-%6.2f%% )", e.variance)
    end
    out[#out + 1] = (prefix or "") .. line:gsub("%s+$", "")
  end
  return out
end

--- perf stat's -x output: value,unit,event,run,percent,metric,metric unit
-- (with -r, the relative stddev "N.NN%" after the event, as perf prints it)
function M.csv(r, sep, prefix)
  sep = sep or ","
  local out = {}
  for _, e in ipairs(r) do
    local cols = { value_str(e), e.unit or "", e.name }
    if e.variance then cols[#cols + 1] = format("%.2f%%", e.variance) end
    cols[#cols + 1] = format("%.0f", e.running)
    cols[#cols + 1] = format("%.2f", e.percent)
    cols[#cols + 1] = e.metric and format(e.metric_pct and "%.2f" or "%.3f", e.metric) or ""
    cols[#cols + 1] = e.metric_unit or ""
    out[#out + 1] = (prefix or "") .. table.concat(cols, sep)
  end
  return table.concat(out, "\n") .. "\n"
end

local function json_str(s)
  return '"' .. tostring(s):gsub('[%c"\\]', function(ch) return format("\\u%04x", ch:byte()) end) .. '"'
end

--- perf 6.1's -j output: one JSON object per event and line.
-- @tparam table r a result
-- @tparam[opt] table head `{{key, value}, ...}` put first in each object
--   (`interval`, `cpu`, `thread`); a number value is printed as one
function M.json(r, head)
  local out = {}
  for _, e in ipairs(r) do
    local kv = {}
    for _, h in ipairs(head or {}) do
      kv[#kv + 1] = json_str(h[1]) .. " : " .. (type(h[2]) == "number" and format("%.9f", h[2]) or json_str(h[2]))
    end
    local v = (e.counted and e.supported ~= false) and format("%f", e.display or e.value) or value_str(e)
    kv[#kv + 1] = '"counter-value" : ' .. json_str(v)
    kv[#kv + 1] = '"unit" : ' .. json_str(e.unit or "")
    kv[#kv + 1] = '"event" : ' .. json_str(e.name)
    if e.variance then kv[#kv + 1] = format('"variance" : %.2f', e.variance) end
    kv[#kv + 1] = format('"event-runtime" : %.0f', e.running)
    kv[#kv + 1] = format('"pcnt-running" : %.2f', e.percent)
    -- perf 6.1 prints "(null)" for an event without a metric, "" for one not supported
    kv[#kv + 1] = format('"metric-value" : %f', e.metric or 0)
    kv[#kv + 1] = '"metric-unit" : ' .. json_str(e.metric_unit or (e.supported == false and "" or "(null)"))
    out[#out + 1] = "{" .. table.concat(kv, ", ") .. "}"
  end
  return table.concat(out, "\n") .. "\n"
end

--- Aggregates the results of `-r N` runs: each entry gets the mean value
-- and `variance`, perf's relative standard deviation of the mean in percent
-- (100 * sqrt(var / n) / mean, var with n - 1); so does `elapsed`
-- (`elapsed_stddev`, in seconds).
-- @tparam table runs array of results (same events, same order)
-- @treturn table a result
function M.mean(runs)
  local n = #runs
  local function stats(get)
    local sum = 0
    for _, r in ipairs(runs) do sum = sum + get(r) end
    local mean = sum / n
    local m2 = 0
    for _, r in ipairs(runs) do m2 = m2 + (get(r) - mean) ^ 2 end
    local sd = n > 1 and math.sqrt(m2 / (n - 1) / n) or 0
    return mean, sd
  end
  local r = setmetatable({}, Result)
  for k, v in pairs(runs[n]) do if type(k) ~= "number" then r[k] = v end end
  for i, last in ipairs(runs[n]) do
    local e = {}
    for k, v in pairs(last) do e[k] = v end
    local function f(field) return function(x) return x[i][field] or 0 end end
    e.enabled = stats(f("enabled"))
    e.running = stats(f("running"))
    local sd
    e.value, sd = stats(f("value"))
    e.variance = e.value ~= 0 and 100 * sd / e.value or 0
    e.display = nil
    for _, x in ipairs(runs) do if x[i].counted then e.counted = true end end
    e.metric, e.metric_unit, e.metric_pct = nil, nil, nil
    r[i] = e
    r[e.name] = e.value
  end
  if runs[n].elapsed then r.elapsed, r.elapsed_stddev = stats(function(x) return x.elapsed end) end
  r.runs = n
  r.utime, r.stime = nil, nil
  return M.derive(r)
end

--- The whole `perf stat` block.
function M.format(r)
  local label = r.label or "Lua function"
  -- perf: "for process id '42'", "for thread id '42'", else "for 'CMD'"
  if not label:find("^process id '") and not label:find("^thread id '") then label = "'" .. label .. "'" end
  local b = { "", format(" Performance counter stats for %s%s:", label,
                         r.runs and format(" (%d runs)", r.runs) or ""), "" }
  for _, l in ipairs(M.lines(r)) do b[#b + 1] = l end
  b[#b + 1] = ""
  if r.elapsed and r.runs then
    b[#b + 1] = format("%18.6f +- %.6f seconds time elapsed  ( +-%6.2f%% )", r.elapsed, r.elapsed_stddev,
                       r.elapsed > 0 and 100 * r.elapsed_stddev / r.elapsed or 0)
    b[#b + 1] = ""
  elseif r.elapsed then
    b[#b + 1] = format("%18.9f seconds time elapsed", r.elapsed) b[#b + 1] = ""
  end
  if r.utime then
    b[#b + 1] = format("%18.9f seconds user", r.utime)
    b[#b + 1] = format("%18.9f seconds sys", r.stime or 0)
    b[#b + 1] = ""
  end
  return table.concat(b, "\n") .. "\n"
end

Result.__index = { csv = M.csv, lines = M.lines, json = M.json }
Result.__tostring = M.format

return M
