--- perf_event.cli.list: `luaperf list`, the event names as perf list prints them.
-- (not a public interface: luaperf's subcommands, run through perf_event.cli's main)
-- @module perf_event.cli.list

local io, string, table = io, string, table
local ipairs, pairs, tostring, pcall = ipairs, pairs, tostring, pcall
local format, concat = string.format, table.concat

local C = require("perf_event.cli.common")
local pe, usage_error, parse_args = C.pe, C.usage_error, C.parse_args

local M = {}

local USAGE = {
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
}

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
  -- perf's tool events (luaperf stat counts them), after the software
  -- events and in 'list sw' too, as perf list shows them
  local tools_done = false
  local function add_tools()
    tools_done = true
    if class and class ~= "sw" then return end
    for _, n in ipairs(require("perf_event.stat").TOOLS) do
      local ok = true
      if pattern and not class then
        if pattern:find("[*?]") then ok = n:match(glob_to_pattern(pattern)) ~= nil
        else ok = n:find(pattern, 1, true) ~= nil end
      end
      if ok then lines[#lines + 1] = format("  %-50s [%s]", n, "Tool event") end
    end
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
    if not tools_done and order[c] > order.sw then add_tools() end
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
  if not tools_done then add_tools() end
  if not pattern and not descriptors_done then add_descriptors() end
  if #lines > 0 then
    io.stdout:write("\nList of pre-defined events (to be used in -e):\n\n", concat(lines, "\n"), "\n\n")
  end
  if #lines == 0 and not class then
    io.stderr:write(format("luaperf list: no event matches '%s'%s\n", tostring(pattern),
      io.open("/sys/kernel/tracing/events") and "" or
        " (tracepoints are hidden: tracefs is not readable by this user)"))
    return 0   -- perf list prints nothing and exits 0
  end
  return 0
end

M.USAGE = USAGE

return M
