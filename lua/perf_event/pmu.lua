--- PMU discovery from sysfs (doc/coverage.md H6-H11) and the perf sysctls (H1-H5).
-- Reads `<root>/<pmu>/{type,format/*,events/*,caps/*,cpumask,cpus,...}`
-- where root defaults to /sys/bus/event_source/devices and can be pointed
-- at a fixture tree with `set_root`.
-- Not a public interface: reached through perf_event (doc/api.md lists what is).
-- @module perf_event.pmu

local fs = require("perf_event.fs")
local u64 = require("perf_event.u64")
local events = require("perf_event.events")

local tonumber, ipairs, pairs, type, tostring, pcall, require =
  tonumber, ipairs, pairs, type, tostring, pcall, require
local concat, sort = table.concat, table.sort
local format, gsub, match, gmatch, find = string.format, string.gsub, string.match,
  string.gmatch, string.find

local M = {}

local DEFAULT_ROOT = "/sys/bus/event_source/devices"
local root = DEFAULT_ROOT
-- PMUs by name (false: no such PMU) and the names list, each read from
-- sysfs once per process (and per root) until `refresh`
local cache = {}
local names_cache = {}

--- Points discovery at another sysfs devices directory (nil = the real one).
-- @tparam[opt] string dir
function M.set_root(dir)
  root = dir or DEFAULT_ROOT
  cache = {}
  names_cache = {}
end

--- The sysfs devices directory in use.
function M.root() return root end

--- Forgets cached PMUs and the PMU list (after hotplug or a module load
-- that adds a PMU, or between tests); the next lookup reads sysfs again.
function M.refresh()
  cache = {}
  names_cache = {}
end

local CONFIGS = { config = true, config1 = true, config2 = true, config3 = true }

--- Parses a `format/<term>` line such as `config:0-7,32-35` or `config1:9`.
-- @tparam string s
-- @treturn[1] table `{config=, bits={{lo,hi},...}, width=, spec=}`
-- @treturn[2] nil
-- @treturn[2] string
function M.parse_format(s)
  s = gsub(s or "", "%s", "")
  local cfg, ranges = match(s, "^(config%d?):([%d,%-]+)$")
  if not cfg or not CONFIGS[cfg] then return nil, "bad format '" .. s .. "'" end
  local bits, width = {}, 0
  for r in gmatch(ranges, "[^,]+") do
    local lo, hi = match(r, "^(%d+)%-(%d+)$")
    if not lo then lo = match(r, "^(%d+)$"); hi = lo end
    lo, hi = tonumber(lo), tonumber(hi)
    if not lo or lo > hi or hi > 63 then return nil, "bad bit range '" .. r .. "' in '" .. s .. "'" end
    bits[#bits + 1] = { lo, hi }
    width = width + hi - lo + 1
  end
  if #bits == 0 then return nil, "bad format '" .. s .. "'" end
  return { config = cfg, bits = bits, width = width, spec = s }
end

--- Parses a term list `a=1,b=0x2,c,d=?` (sysfs events/ files).
-- @treturn array of `{name=, value=<string|nil>, param=<bool>}`
function M.parse_terms(s)
  local out = {}
  for t in gmatch(gsub(s or "", "%s", ""), "[^,]+") do
    local name, val = match(t, "^([^=]+)=(.*)$")
    if not name then name = t end
    out[#out + 1] = { name = name, value = val, param = (val == "?") }
  end
  return out
end

--- Parses a cpu list `0-3,8` into an array of numbers.
function M.parse_cpus(s)
  local out = {}
  for r in gmatch(gsub(s or "", "%s", ""), "[^,]+") do
    local lo, hi = match(r, "^(%d+)%-(%d+)$")
    if lo then
      for c = tonumber(lo), tonumber(hi) do out[#out + 1] = c end
    elseif match(r, "^%d+$") then
      out[#out + 1] = tonumber(r)
    end
  end
  return out
end

local SUFFIXES = { scale = true, unit = true, ["per-pkg"] = true, snapshot = true }

local function load_events(dir)
  local evs = {}
  local names = fs.list(dir)
  for _, f in ipairs(names) do
    local base, suffix = match(f, "^(.-)%.([%w%-]+)$")
    if not (base and SUFFIXES[suffix]) then
      local raw = fs.read(dir .. "/" .. f)
      if raw then
        local terms = M.parse_terms(raw)
        local params = {}
        for _, t in ipairs(terms) do
          if t.param then params[#params + 1] = t.name end
        end
        evs[f] = { name = f, raw = raw, terms = terms, params = params }
      end
    end
  end
  for _, f in ipairs(names) do
    local base, suffix = match(f, "^(.-)%.([%w%-]+)$")
    local ev = base and evs[base]
    if ev and SUFFIXES[suffix] then
      local v = fs.read(dir .. "/" .. f)
      if suffix == "scale" then
        ev.scale = tonumber(v)
        ev.scale_str = v
      elseif suffix == "unit" then
        ev.unit = v
      elseif suffix == "per-pkg" then
        ev.per_pkg = tonumber(v) ~= 0
      else
        ev.snapshot = tonumber(v) ~= 0
      end
    end
  end
  return evs
end

local function load_pmu(name)
  local dir = root .. "/" .. name
  local t = tonumber(fs.read(dir .. "/type") or "")
  if not t then return nil end
  local p = { name = name, type = t, path = dir, format = {}, events = {}, caps = {} }
  for _, f in ipairs(fs.list(dir .. "/format")) do
    local spec = fs.read(dir .. "/format/" .. f)
    local fmt = spec and M.parse_format(spec)
    if fmt then p.format[f] = fmt end
  end
  p.events = load_events(dir .. "/events")
  for _, f in ipairs(fs.list(dir .. "/caps")) do
    local v = fs.read(dir .. "/caps/" .. f)
    if v then p.caps[f] = tonumber(v) or v end
  end
  local cpumask = fs.read(dir .. "/cpumask")
  if cpumask then p.cpumask = cpumask; p.cpumask_list = M.parse_cpus(cpumask) end
  local cpus = fs.read(dir .. "/cpus")
  if cpus then p.cpus = cpus; p.cpus_list = M.parse_cpus(cpus) end
  p.mux_interval_ms = tonumber(fs.read(dir .. "/perf_event_mux_interval_ms") or "")
  p.nr_addr_filters = tonumber(fs.read(dir .. "/nr_addr_filters") or "")
  p.rdpmc = tonumber(fs.read(dir .. "/rdpmc") or "")
  return p
end

--- One PMU by its sysfs name.
-- @tparam string name e.g. "msr"
-- @treturn[1] table `{name=, type=, format={term={config=,bits=,width=}}, events={alias={terms=,
--   params=, scale=, unit=, per_pkg=, snapshot=}}, caps=, cpumask=, cpus=, mux_interval_ms=}`
-- @treturn[2] nil
-- @treturn[2] string "no PMU named ... (the PMUs here: ...)"
-- @raise when name is not a string
function M.pmu(name)
  if type(name) ~= "string" then
    error(("bad argument #1 to 'pmu' (string expected, got %s)"):format(type(name)), 2)
  end
  local p = false
  if name ~= "" and not find(name, "/", 1, true) and name ~= "." and name ~= ".." then
    p = cache[name]
    if p == nil then
      p = load_pmu(name) or false
      cache[name] = p
    end
  end
  if p then return p end
  local shown = #name > 60 and name:sub(1, 57) .. "..." or name
  return nil, format("no PMU named %q (the PMUs here: %s)", shown, concat(M.names(), ", "))
end

--- Names of all PMUs, sorted (or in sysfs readdir order, the order perf uses).
-- The sysfs directory is read once per process; `refresh` forgets it.
-- @tparam[opt] boolean readdir_order
-- @treturn table a new array (the caller may modify it)
function M.names(readdir_order)
  local key = readdir_order and "readdir" or "sorted"
  local cached = names_cache[key]
  if not cached then
    cached = {}
    for _, n in ipairs(fs.list(root, readdir_order)) do
      if M.pmu(n) then cached[#cached + 1] = n end
    end
    names_cache[key] = cached
  end
  local out = {}
  for i, n in ipairs(cached) do out[i] = n end
  return out
end

--- All PMUs of this machine, sorted by name.
-- @treturn table array of PMU tables (see `pmu`)
function M.pmus()
  local out = {}
  for _, n in ipairs(M.names()) do out[#out + 1] = M.pmu(n) end
  return out
end

--- A PMU whose type number is t, or nil.
function M.by_type(t)
  for _, p in ipairs(M.pmus()) do
    if p.type == t then return p end
  end
  return nil
end

local function glob_to_pattern(g)
  local p = gsub(g, "[%^%$%(%)%%%.%[%]%+%-]", "%%%0")
  p = gsub(p, "%*", ".*")
  p = gsub(p, "%?", ".")
  return "^" .. p .. "$"
end
M.glob_to_pattern = glob_to_pattern

--- PMUs a user-written PMU name refers to, the way perf 6.1 matches them:
-- the exact name, else `uncore_<name>`, else the numbered instances
-- `<name>_N` / `uncore_<name>_N` in sysfs order (no globs, as perf 6.1).
-- @treturn table array (possibly empty) of PMU tables
function M.match(name)
  local p = M.pmu(name) or M.pmu("uncore_" .. name)
  if p then return { p } end
  local out = {}
  if find(name, "[%*%?%[]") then return out end
  for _, n in ipairs(M.names(true)) do
    local base = match(n, "^(.-)_%d+$")
    if base and (base == name or base == "uncore_" .. name) then out[#out + 1] = M.pmu(n) end
  end
  return out
end

--- Packs a value into a PMU format's bits (value bit k -> k-th lowest listed bit).
-- @tparam table fmt a format from `parse_format`
-- @tparam table v a u64 value
-- @tparam table word the u64 config word to OR into (modified)
-- @treturn[1] table word
-- @treturn[2] nil
-- @treturn[2] string why (value too wide)
function M.pack(fmt, v, word)
  if u64.bitlen(v) > fmt.width then
    return nil, format("value %s too big for format %s (%d bit%s)", u64.hex(v), fmt.spec,
      fmt.width, fmt.width == 1 and "" or "s")
  end
  local k = 0
  for _, r in ipairs(fmt.bits) do
    for b = r[1], r[2] do
      if u64.bit(v, k) == 1 then u64.setbit(word, b) end
      k = k + 1
    end
  end
  return word
end

local function sorted_keys(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = k end
  sort(out)
  return out
end
M.sorted_keys = sorted_keys

--- Event names a user can pass to `pe.open`, like `perf list`.
-- @tparam[opt] string pattern a glob (`*`, `?`) or a plain substring
-- @treturn table sorted array of names
function M.list(pattern)
  local names = {}
  for _, n in ipairs(events.hardware_list) do names[#names + 1] = n end
  for _, n in ipairs(events.software_list) do names[#names + 1] = n end
  for _, n in ipairs(events.cache_list()) do names[#names + 1] = n end
  for _, p in ipairs(M.pmus()) do
    for _, a in ipairs(sorted_keys(p.events)) do
      names[#names + 1] = p.name .. "/" .. a .. "/"
    end
  end
  local ok, tp = pcall(require, "perf_event.tracepoint")
  if ok then
    for _, n in ipairs(tp.list() or {}) do names[#names + 1] = n end
  end
  if pattern == nil then return names end
  if type(pattern) ~= "string" and type(pattern) ~= "number" then
    error("perf_event.list: pattern must be a string, got " .. type(pattern), 2)
  end
  local pat
  if find(pattern, "[%*%?]") then
    -- each '*' is one level of the matcher's recursion (limit ~200)
    local glob, stars = string.gsub(string.gsub(pattern, "%*+", "*"), "%*", "*")
    if stars > 64 then error("perf_event.list: pattern has more than 64 '*' wildcards", 2) end
    pat = glob_to_pattern(glob)
  end
  local out = {}
  for _, n in ipairs(names) do
    if (pat and match(n, pat)) or (not pat and find(n, pattern, 1, true)) then out[#out + 1] = n end
  end
  return out
end

local SYSCTLS = {
  paranoid = "perf_event_paranoid",
  max_sample_rate = "perf_event_max_sample_rate",
  mlock_kb = "perf_event_mlock_kb",
  max_stack = "perf_event_max_stack",
  max_contexts_per_stack = "perf_event_max_contexts_per_stack",
  cpu_time_max_percent = "perf_cpu_time_max_percent",
  nmi_watchdog = "nmi_watchdog",
}

--- perf-related sysctls from /proc/sys/kernel, as numbers.
-- @tparam[opt] string dir another directory holding the files (tests)
-- @treturn table `{paranoid=, max_sample_rate=, mlock_kb=, max_stack=,
--   max_contexts_per_stack=, cpu_time_max_percent=, nmi_watchdog=}`
--   (a key is absent when its file is)
function M.sysctl(dir)
  dir = dir or "/proc/sys/kernel"
  local out = {}
  for k, f in pairs(SYSCTLS) do
    out[k] = tonumber(fs.read(dir .. "/" .. f) or "")
  end
  return out
end

--- A PMU as text (name, type, formats, aliases): a teaching aid.
function M.describe(p)
  local lines = { format("%s (type %d)", p.name, p.type) }
  for _, f in ipairs(sorted_keys(p.format)) do
    lines[#lines + 1] = format("  format %-16s %s", f, p.format[f].spec)
  end
  for _, a in ipairs(sorted_keys(p.events)) do
    local e = p.events[a]
    local extra = ""
    if e.scale then extra = extra .. " scale=" .. tostring(e.scale_str) end
    if e.unit then extra = extra .. " unit=" .. e.unit end
    lines[#lines + 1] = format("  event  %-16s %s%s", a, e.raw, extra)
  end
  return concat(lines, "\n")
end

return M
