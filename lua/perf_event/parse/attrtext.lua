--- perf_event.parse.attrtext: an attr table as text, in the layout and
-- field order of `perf -vv` (perf_event_attr_fprintf.c), and the `__tostring`
-- that prints an attr table so.
-- Not a public interface: reached through perf_event (doc/api.md lists what is).
-- @module perf_event.parse.attrtext

local u64 = require("perf_event.u64")
local abi = require("perf_event.core").abi

local type, ipairs, tostring, setmetatable = type, ipairs, tostring, setmetatable
local format = string.format
local concat = table.concat

local M = {}

-- perf's print order, labels and hex fields (perf_event_attr_fprintf.c),
-- from the core's attr field table
local ORDER, HEXF = {}, {}
for _, f in ipairs(abi.attr_fields) do
  if f.perf then
    ORDER[#ORDER + 1] = { f.name, f.perf ~= f.name and f.perf or nil }
    HEXF[f.name] = f.hex or nil
  end
end

local function fmt_value(k, v)
  if v == true then return "1" end
  if HEXF[k] then
    local h = u64.tohex(v)
    if h then return h end
  end
  if type(v) == "number" or type(v) == "string" or type(v) == "cdata" then
    local u = u64.from(v)
    if u and u64.tonumber(u) then return tostring(u64.tonumber(u)):gsub("%.0$", "") end
  end
  return tostring(v)
end

local function iszero(v)
  if v == nil or v == false then return true end
  local u = u64.from(v)
  return u ~= nil and u64.iszero(u)
end

--- An attr table as text, in perf's `-vv` layout (non-zero fields only).
-- @tparam table attr
-- @treturn string
function M.format_attr(attr)
  local lines = { "perf_event_attr:" }
  for _, o in ipairs(ORDER) do
    local k = o[1]
    local v = attr[k]
    if not iszero(v) then
      lines[#lines + 1] = format("  %-32s %s", o[2] or k, fmt_value(k, v))
    end
  end
  return concat(lines, "\n")
end

local ATTR_MT = { __tostring = function(a) return M.format_attr(a) end }


--- Gives an attr table the `__tostring` that prints it like perf -vv.
-- @tparam table a
-- @treturn table a
function M.attr_table(a)
  return setmetatable(a, ATTR_MT)
end

return M
