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
-- and then set as the `__index` of `core.event_mt` and `core.group_mt`, while
-- perf_event.core loads (core.lua: the C half, perf_event.native, then this
-- module), so no program sees the classes without these methods.  No
-- other module writes a method into a class; fast.lua and records.lua only
-- return functions.  Names starting with `_` are never methods: the core's
-- private hooks stay in `core._private`, functions taking the event.
-- Not a public interface: reached through perf_event (doc/api.md lists what is).
-- @module perf_event.class

local core = require("perf_event.native")
local records = require("perf_event.records")

local pairs, ipairs, error, pcall, concat = pairs, ipairs, error, pcall, table.concat
local getmetatable, type = getmetatable, type

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

-- ---- weak groups --------------------------------------------------------------
-- W: what pe.group returns when the kernel refused a member into a weak
-- group (init.lua opens the members again as independent events, as perf's
-- evlist__reset_weak_group does): a table of the events, g[1..n], with
-- fallback_reason/fallback_errno, and the methods of a group.

local weak = {}
local WEAK_MT = { __name = "perf_event.group" }

local function weak_self(g, what)
  if getmetatable(g) ~= WEAK_MT then
    error(("bad self to perf_event.group:%s (a weak group expected, got %s)")
      :format(what, type(g)), 3)
  end
  if g._closed then error("attempt to use a closed perf_event.group", 3) end
  return g
end

function weak.read(g, t)
  local evs = weak_self(g, "read")
  t = t or {}
  local en_t, run_t = t.times_enabled, t.times_running
  if type(en_t) ~= "table" then en_t = {} t.times_enabled = en_t end
  if type(run_t) ~= "table" then run_t = {} t.times_running = run_t end
  for i, ev in ipairs(evs) do
    local v, en, run = ev:read()
    if v == nil then return nil, en, run end
    t[i] = v
    t[ev:name()] = v
    en_t[i], run_t[i] = en, run
  end
  t.time_enabled, t.time_running = en_t[1], run_t[1]
  return t
end

-- members first, the leader last (as the group's enable)
local function each(g, what, method)
  local evs = weak_self(g, what)
  local n = #evs
  for k = 1, n do
    local ev = evs[k % n + 1]            -- 2, 3, ..., n, then 1
    local ok, err, errno = ev[method](ev)
    if not ok then return nil, err, errno end
  end
  return true
end

function weak.enable(g) return each(g, "enable", "enable") end
function weak.disable(g) return each(g, "disable", "disable") end
function weak.reset(g) return each(g, "reset", "reset") end

function weak.close(g)
  if getmetatable(g) ~= WEAK_MT then weak_self(g, "close") end
  if g._closed then return end
  g._closed = true
  for i = #g, 1, -1 do
    g[i]:close()
    g[i] = nil
  end
end

function weak.members(g)
  if getmetatable(g) ~= WEAK_MT then weak_self(g, "members") end
  local out = {}
  for i, ev in ipairs(g) do out[i] = ev end
  return out
end

function weak.event(g, i)
  return weak.members(g)[i]
end

function weak.name(g)
  local names = {}
  for i, ev in ipairs(weak_self(g, "name")) do names[i] = ev:name() end
  return "{" .. concat(names, ",") .. "}"
end

function weak.info(g)
  local info = weak_self(g, "info")[1]:info()
  info.weak_fallback = g.fallback_reason
  info.weak_errno = g.fallback_errno
  return info
end

-- the rest of LEADER (info is weak.info above) acts on the leader event
for _, m in ipairs(LEADER) do
  if not weak[m] then
    weak[m] = function(g, ...)
      local leader = weak_self(g, m)[1]
      return leader[m](leader, ...)
    end
  end
end

WEAK_MT.__gc = weak.close              -- 5.2+; the members have their own __gc
WEAK_MT.__close = function(g) weak.close(g) end
WEAK_MT.__tostring = function(g)
  if g._closed then return "perf_event.group(weak, fell back, closed)" end
  return ("perf_event.group(%s, weak: fell back to %d separate events, leader fd %d: %s)")
    :format(weak.name(g), #g, g[1]:fd(), g.fallback_reason)
end

-- ---- installed once -----------------------------------------------------------
core.event_mt.__index = event
core.group_mt.__index = group
WEAK_MT.__index = weak

--- The method table of events (the metatable's `__index`).
M.event = event
--- The method table of groups.
M.group = group
--- The group methods that forward to the leader.
M.leader_methods = LEADER
--- The metatable of weak groups (init.lua's pe.group sets it on the table of
-- events it opened separately); its `__index` holds the group's methods.
M.weak_mt = WEAK_MT
--- The method table of weak groups.
M.weak_group = weak

return M
