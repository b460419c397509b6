--- Tracepoints from tracefs (doc/coverage.md B7, H12, H19): where tracefs is
-- mounted, a tracepoint's id and its `format` fields, and name globs.
-- Not a public interface: reached through perf_event (doc/api.md lists what is).
-- @module perf_event.tracepoint

local fs = require("perf_event.fs")

local tonumber, ipairs, type, tostring, pcall = tonumber, ipairs, type, tostring, pcall
local match, gmatch, gsub, find, format = string.match, string.gmatch, string.gsub,
  string.find, string.format
local sort = table.sort

local M = {}

local override
local found

--- Uses dir as the tracefs root (nil = find it again).
-- @tparam[opt] string dir e.g. a fixture tree
function M.set_root(dir)
  override = dir
  found = nil
end

local function is_tracefs(dir)
  return fs.exists(dir .. "/events/header_page") or fs.exists(dir .. "/available_events")
end

--- The tracefs directory: /sys/kernel/tracing, the debugfs path, or any
-- tracefs/debugfs mount listed in /proc/mounts.
-- @treturn[1] string
-- @treturn[2] nil
-- @treturn[2] string why
function M.root()
  if override then return override end
  if found then return found end
  local cands = { "/sys/kernel/tracing", "/sys/kernel/debug/tracing" }
  for _, m in ipairs(fs.mounts("tracefs")) do cands[#cands + 1] = m end
  for _, m in ipairs(fs.mounts("debugfs")) do cands[#cands + 1] = m .. "/tracing" end
  for _, d in ipairs(cands) do
    if is_tracefs(d) then found = d return d end
  end
  return nil, "tracefs not found (not mounted, or not readable: it is mode 0700 root on many systems)"
end

--- Parses the text of a tracefs `format` file.
-- @tparam string text
-- @treturn table `{name=, id=, fields={{name=, type=, offset=, size=, signed=,
--   array=<n|nil>, data_loc=<bool>, common=<bool>}, ...}, print_fmt=}`
function M.parse_format(text)
  local out = { fields = {} }
  out.name = match(text, "name:%s*([^\n]+)")
  out.id = tonumber(match(text, "\nID:%s*(%d+)") or match(text, "^ID:%s*(%d+)") or "")
  out.print_fmt = match(text, "print fmt:%s*([^\n]*)")
  for decl, off, size, signed in gmatch(text,
      "field:([^;]+);%s*offset:(%d+);%s*size:(%d+);%s*signed:(%d+);") do
    decl = gsub(decl, "^%s+", "")
    decl = gsub(decl, "%s+$", "")
    local data_loc = false
    local rest = decl
    if find(rest, "^__data_loc%s") or find(rest, "^__rel_loc%s") then
      data_loc = true
    end
    local array
    local base, name, dim = match(rest, "^(.-)%s*([%w_]+)%s*%[([^%]]*)%]$")
    if base then
      array = tonumber(dim) or (dim ~= "" and dim or nil)
    else
      base, name = match(rest, "^(.-)%s*([%w_]+)$")
    end
    out.fields[#out.fields + 1] = {
      name = name or rest,
      type = base or rest,
      offset = tonumber(off), size = tonumber(size), signed = signed == "1",
      array = array, data_loc = data_loc,
      common = name ~= nil and find(name, "^common_") ~= nil,
    }
  end
  return out
end

local function split(name)
  if type(name) ~= "string" then return nil end
  local sys, ev = match(name, "^([^:/]+)[:/]([^:/]+)$")
  return sys, ev
end

--- A tracepoint's id and decoded format.
-- @tparam string name `"sys:name"` (or `"sys/name"`)
-- @treturn[1] table `{id=, name=, system=, fields={...}}` (see `parse_format`)
-- @treturn[2] nil
-- @treturn[2] string
function M.tracepoint(name)
  local sys, ev = split(name)
  if not sys or find(sys, "%.%.") or find(ev, "%.%.") then
    return nil, format("bad tracepoint name %q: expected 'system:name'", tostring(name))
  end
  local root, why = M.root()
  if not root then return nil, why end
  local dir = root .. "/events/" .. sys .. "/" .. ev
  local text = fs.read(dir .. "/format")
  local id = tonumber(fs.read(dir .. "/id") or "")
  if not text and not id then
    return nil, format("unknown tracepoint '%s:%s' (no %s)", sys, ev, dir)
  end
  local t = text and M.parse_format(text) or { fields = {} }
  t.id = id or t.id
  t.name = ev
  t.system = sys
  return t
end

local list_cache = {}

-- all tracepoints in readdir order (cached per root)
local function all_tracepoints()
  local root = M.root()
  if not root then return {} end
  local all = list_cache[root]
  if not all then
    all = {}
    for _, p in ipairs(fs.subdirs2(root .. "/events")) do
      local sys, ev = match(p, "^([^/]+)/([^/]+)$")
      if sys then all[#all + 1] = sys .. ":" .. ev end
    end
    list_cache[root] = all
  end
  return all
end

--- All tracepoints `sys:name`, optionally matching a glob.
-- @tparam[opt] string glob e.g. `"sched:*"`, `"syscalls:sys_enter_get*"`
-- @tparam[opt] boolean readdir_order keep tracefs' directory order (the
--   order perf expands a glob in) instead of sorting
-- @treturn table array of names (empty when tracefs is unreadable)
function M.list(glob, readdir_order)
  local all = all_tracepoints()
  local out = {}
  if not glob then
    for i, n in ipairs(all) do out[i] = n end
    if not readdir_order then sort(out) end
    return out
  end
  local pat = "^" .. gsub(gsub(gsub(glob, "[%^%$%(%)%%%.%+%-]", "%%%0"), "%*", "[^:]*"), "%?", "[^:]") .. "$"
  local ok = pcall(function()
    for _, n in ipairs(all) do
      if match(n, pat) then out[#out + 1] = n end
    end
  end)
  if not ok then return {} end -- a malformed bracket in the glob matches nothing
  if not readdir_order then sort(out) end
  return out
end

--- Forgets the cached tracepoint list.
function M.refresh() list_cache = {} end

return M
