--- perf_event.class: the one place that assembles the methods of events and
-- groups.  Each class's method table is built here, once, from
--
-- * the C methods the core registers (`core._private.event_methods`,
--   `core._private.group_methods`; also the metatables' initial `__index`,
--   so the bare core works on its own),
-- * `event:records()` of perf_event.records (tracepoint fields, FFI fast path),
-- * on LuaJIT, the FFI routes of perf_event.fast for read/enable/disable/reset,
-- * the group methods that act on the leader (the remaining ioctls, `fd`,
--   `id`, `attr`, `info`) and `group:name()`, `group:event(i)`,
--
-- and then set as the `__index` of `core.event_mt` and `core.group_mt`.  No
-- other module writes a method into a class; fast.lua and records.lua only
-- return functions.  Names starting with `_` are never methods: the core's
-- private hooks stay in `core._private`, functions taking the event.
-- @module perf_event.class

local core = require("perf_event.core")
local records = require("perf_event.records")

local pairs, ipairs, error, concat = pairs, ipairs, error, table.concat

local P = core._private
local M = {}

local fast
if jit then
  local ok, f = pcall(require, "perf_event.fast")
  if ok and f.available then fast = f end
end
--- true when the FFI routes are the methods (LuaJIT, core bound through ffi.load)
M.ffi = fast ~= nil

local function copy(t)
  local c = {}
  for k, v in pairs(t) do c[k] = v end
  return c
end

-- ---- events -----------------------------------------------------------------
local event = copy(P.event_methods)
event.records = records.records
if fast then
  for k, f in pairs(fast.ffi.event) do event[k] = f end
end

-- ---- groups -----------------------------------------------------------------
local group = copy(P.group_methods)
local c_members = P.group_methods.members

-- the methods a group forwards to its leader (C methods of the event)
local LEADER = { "refresh", "period", "set_output", "set_filter", "set_bpf", "pause_output",
                 "modify", "query_bpf", "fd", "id", "attr", "info" }
for _, m in ipairs(LEADER) do
  local f = P.event_methods[m]
  group[m] = function(g, ...)
    local leader = c_members(g)[1]   -- raises on a wrong self or a closed group
    if not leader then error("attempt to use a closed perf_event.group", 2) end
    return f(leader, ...)
  end
end

function group.name(g)
  local names = {}
  for i, ev in ipairs(c_members(g)) do names[i] = ev:name() end
  return "{" .. concat(names, ",") .. "}"
end

function group.event(g, i)
  return c_members(g)[i]
end

if fast then
  for k, f in pairs(fast.ffi.group) do group[k] = f end
end

-- ---- installed once -----------------------------------------------------------
core.event_mt.__index = event
core.group_mt.__index = group

--- The method table of events (the metatable's `__index`).
M.event = event
--- The method table of groups.
M.group = group
--- The group methods that forward to the leader.
M.leader_methods = LEADER

return M
