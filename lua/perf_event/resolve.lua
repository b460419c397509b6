--- perf_event.resolve: the one way from a spec to an attr, and to an open fd.
-- Every entry point (`pe.attr`, `pe.describe`, `pe.open`, `pe.group`,
-- `pe.stat`, `luaperf`) turns what the caller wrote into attr tables here,
-- and opens them with `open`, which applies perf's fallbacks.  So a spec is
-- accepted or refused the same way, with the same message, everywhere.
--
-- A resolved spec is `{attr=, name=, explicit=, guest=, entry=}`:
--   attr      a fresh attr table the caller may change
--   name      the event's name (the string, `name=`, or "type:config")
--   explicit  the caller chose the privilege level (`:u`/`:k`/`:h`, or an
--             `exclude_user`/`exclude_kernel`/`exclude_hv` field): no
--             automatic user-space-only retry
--   guest     the `exclude_guest` bit is perf's default, not the caller's:
--             dropped and retried once when the kernel answers EINVAL (msr)
--   entry     the parsed entry of an event string (`sample_read`, `weak`,
--             `unit`, `scale`, ...), nil for a plain attr table
--
-- Refusals come back as `nil, message, kind`; kind "type" means a Lua value
-- of the wrong type (the open paths raise it), anything else is a spec that
-- does not resolve (every path returns it as `nil, message`).
-- Not a public interface: reached through perf_event (doc/api.md lists what is).
-- @module perf_event.resolve

local type, pairs, ipairs, error, pcall, tostring, require =
  type, pairs, ipairs, error, pcall, tostring, require
local format = string.format

local M = {}

local grammar = require("perf_event.parse.grammar")
local attrtext = require("perf_event.parse.attrtext")
local function core() return require("perf_event.core") end

local EINVAL = require("perf_event.core").abi.errno.EINVAL

local function copy(t)
  local c = {}
  for k, v in pairs(t) do c[k] = v end
  return c
end

-- keys of a table spec that are not attr fields
local SPEC_ONLY = { event = true, name = true }

local function from_entry(e)
  return { attr = copy(e.attr), name = e.name, guest = e.guest_default or nil,
           explicit = e.mods ~= nil and e.mods:find("[ukh]") ~= nil, entry = e }
end

-- an event string -> array of resolved specs, or nil, msg
local function resolve_string(s)
  local list, err = grammar.parse(s)
  if not list then return nil, err end
  local out = {}
  for i, e in ipairs(list) do out[i] = from_entry(e) end
  return out
end

-- a table spec -> resolved specs (several when `event` names several)
local function resolve_table(t)
  local out
  if t.event ~= nil then
    if type(t.event) ~= "string" then
      return nil, "perf_event: spec.event must be an event string, got " .. type(t.event), "type"
    end
    local err
    out, err = resolve_string(t.event)
    if not out then return nil, err end
  elseif t.type ~= nil then
    out = { { attr = {}, explicit = false } }
  else
    return nil, "perf_event: an attr table needs 'event' or 'type'"
  end
  for _, r in ipairs(out) do
    for k, v in pairs(t) do
      if not SPEC_ONLY[k] then r.attr[k] = v end
    end
    if t.exclude_kernel ~= nil or t.exclude_user ~= nil or t.exclude_hv ~= nil then
      r.explicit = true
    end
    if t.exclude_guest ~= nil then r.guest = nil end
    if t.name ~= nil then
      r.name = tostring(t.name)
    elseif not r.name then
      r.name = format("%s:%s", tostring(r.attr.type), tostring(r.attr.config or 0))
    end
  end
  return out
end

--- Resolves a spec that may name several events (a list string, or a table
-- whose `event` is one).
-- @param spec an event string or a table
-- @treturn[1] table array of resolved specs
-- @treturn[2] nil
-- @treturn[2] string message
-- @treturn[2] string `"type"` when spec is a Lua value of the wrong type
function M.many(spec)
  if type(spec) == "string" then return resolve_string(spec) end
  if type(spec) == "table" then return resolve_table(spec) end
  return nil, "perf_event: spec must be an event string or a table, got " .. type(spec), "type"
end

--- Resolves a spec that must name exactly one event.
-- @treturn[1] table resolved spec
-- @treturn[2] nil
-- @treturn[2] string message
-- @treturn[2] string `"type"` for a Lua value of the wrong type
function M.one(spec)
  local list, err, kind = M.many(spec)
  if not list then return nil, err, kind end
  if #list ~= 1 then
    local s = type(spec) == "table" and spec.event or spec
    return nil, format("perf_event: '%s' names %d events; one is expected here (pe.group or pe.parse take several)",
      s, #list)
  end
  return list[1]
end

--- Checks an attr's fields the way the core will (`core.attr_encode`).
-- @treturn[1] true
-- @treturn[2] nil
-- @treturn[2] string the core's message (unknown field, bad value), as pe.open raises it
function M.check(attr)
  local ok, err = pcall(core().attr_encode, attr)
  if ok then return true end
  return nil, (tostring(err):gsub("^[%w%._/%-]+:%d+: ", ""))
end

--- The attr of one spec, as `pe.attr` returns it.
-- @treturn[1] table attr (tostring() prints it like perf -vv)
-- @treturn[2] nil
-- @treturn[2] string
function M.attr(spec)
  local r, err = M.one(spec)
  if not r then return nil, err end
  local ok, cerr = M.check(r.attr)
  if not ok then return nil, cerr end
  return attrtext.attr_table(r.attr)
end

--- Every event of a spec, for `pe.describe`: `{name=, attr=, mods=, ...}`
-- (the parsed entries of a string; one entry for a table).
-- @treturn[1] table
-- @treturn[2] nil
-- @treturn[2] string
function M.entries(spec)
  local list, err = M.many(spec)
  if not list then return nil, err end
  local out = {}
  for i, r in ipairs(list) do
    local ok, cerr = M.check(r.attr)
    if not ok then return nil, cerr end
    if type(r.attr.type) == "string" then
      -- perf -vv prints the number ("software" -> 1)
      r.attr.type = core().attr_decode(core().attr_encode({ type = r.attr.type })).type
    end
    if type(spec) == "string" then
      out[i] = r.entry
    else
      local e = copy(r.entry or { mods = "" })
      e.name, e.attr = r.name, r.attr
      out[i] = e
    end
  end
  return out
end

-- a core.open refusal of the caller's values is raised again at `level`
-- (counted from the caller of open) without the core's position
local function core_open(attr, o, level)
  local ok, ev, err, errno = pcall(core().open, attr, o)
  if not ok then
    error((tostring(ev):gsub("^[%w%._/%-]+:%d+: ", "")), level + 2)
  end
  return ev, err, errno
end

--- Opens one resolved spec with perf's fallbacks: the core retries
-- user-space only on EACCES unless the privilege level was chosen
-- (`auto_exclude`), and an EINVAL with perf's default `exclude_guest` is
-- retried once without it (PMUs such as msr refuse the bit).
-- @tparam table r a resolved spec (its attr may be changed by the retry)
-- @tparam table o core.open options (pid, cpu, group, pages, ...); `name`
--   and `auto_exclude` are filled in
-- @tparam[opt=1] integer level where a caller mistake is raised, as for `error`
-- @treturn[1] perf_event.event
-- @treturn[2] nil
-- @treturn[2] string
-- @treturn[2] number errno
function M.open(r, o, level)
  level = level or 1
  o = o or {}
  o.name = o.name or r.name
  o.auto_exclude = not r.explicit
  local attr = r.attr
  local ev, err, errno = core_open(attr, o, level)
  if not ev and errno == EINVAL and r.guest and attr.exclude_guest then
    attr.exclude_guest = nil
    ev, err, errno = core_open(attr, o, level)
    if not ev then attr.exclude_guest = true end
  end
  return ev, err, errno
end

return M
