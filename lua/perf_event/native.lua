--- perf_event.native: the C half of perf_event.core, as core.so's
-- `luaopen_perf_event_core` builds it (functions, constants, the classes
-- with their C methods).  perf_event.core (core.lua) is this table once
-- perf_event.class has completed the classes' methods; only that module and
-- the Lua half of the classes (class.lua, records.lua, fast.lua) load this
-- one.  core.so is found on `package.cpath` as `perf_event.core` (Lua looks
-- at `package.path` first, where core.lua answers to that name).
-- Not a public interface: reached through perf_event.core.
-- @module perf_event.native

local io, package, error, tostring = io, package, error, tostring

-- package.searchpath, which Lua 5.1 lacks
local function search(name, path)
  local file = name:gsub("%.", "/")
  local tried = {}
  for tmpl in path:gmatch("[^;]+") do
    local cand = tmpl:gsub("%?", file)
    local f = io.open(cand, "r")
    if f then f:close() return cand end
    tried[#tried + 1] = "\n\tno file '" .. cand .. "'"
  end
  return nil, table.concat(tried)
end

local path, tried = search("perf_event.core", package.cpath)
if not path then
  error("perf_event.core: core.so not found on package.cpath (run 'make', or install the rock):"
        .. tried, 0)
end
local open, err = package.loadlib(path, "luaopen_perf_event_core")
if not open then error("perf_event.core: cannot load " .. path .. ": " .. tostring(err), 0) end

local C = open("perf_event.core", path)
--- The file the C half was loaded from (perf_event.fast binds the same copy).
C._private.path = path
return C
