--- perf_event.pprof.wire: the protobuf wire format pprof's profile.proto
-- is written in: varints (from numbers, Lua 5.3 integers, LuaJIT uint64
-- cdata or "0x..." strings), and varint, length-delimited and packed
-- repeated fields appended to a buffer.
-- Not a public interface: reached through perf_event.pprof.
-- @module perf_event.pprof.wire

local string, table, math = string, table, math
local type, tostring, tonumber, ipairs, error, rawget = type, tostring, tonumber, ipairs, error, rawget
local char, format, sub, concat = string.char, string.format, string.sub, table.concat
local floor = math.floor
local mtype = rawget(math, "type")

local M = {}

local function symbols() return require("perf_event.symbols") end


-- a varint from the two 32-bit halves of an unsigned 64-bit value
local function varint_hl(hi, lo)
  local out, n = {}, 0
  repeat
    local b = lo % 128
    lo = floor(lo / 128) + (hi % 128) * 33554432   -- hi's low 7 bits move down to lo's top
    hi = floor(hi / 128)
    n = n + 1
    if hi > 0 or lo > 0 then out[n] = char(b + 128) else out[n] = char(b) end
  until hi == 0 and lo == 0
  return concat(out)
end

-- a non-negative integer: a Lua number, a 5.3+ integer, a LuaJIT uint64
-- cdata or a "0x..." string (64-bit addresses come in all these forms)
local small = {}   -- the varints of 0..65535 (ids, counts, lines), made once
local function varint(v)
  local c = small[v]
  if c then return c end
  if type(v) == "number" and v >= 0 and v < 9007199254740992 and (not mtype or mtype(v) == "integer"
      or v == floor(v)) then
    if v < 128 then c = char(v)
    else
      local hi = floor(v / 4294967296)
      c = varint_hl(hi, v - hi * 4294967296)
    end
    if v < 65536 then small[v] = c end
    return c
  end
  local h = symbols().hex(v)
  if not h then error(format("pprof: %s is not an unsigned 64-bit integer", tostring(v)), 3) end
  return varint_hl(tonumber(sub(h, 1, 8), 16), tonumber(sub(h, 9, 16), 16))
end

local function is_zero(v)
  if v == nil or v == 0 or v == false then return true end
  local h = type(v) ~= "number" and symbols().hex(v)
  return h == "0000000000000000"
end

-- field `f` as a varint (proto3: a zero value is left out)
local function fv(buf, f, v)
  if is_zero(v) then return end
  if v == true then v = 1 end
  buf[#buf + 1] = varint(f * 8)
  buf[#buf + 1] = varint(v)
end

-- field `f` length-delimited: a string, bytes or an embedded message
local function fb(buf, f, s)
  buf[#buf + 1] = varint(f * 8 + 2)
  buf[#buf + 1] = varint(#s)
  buf[#buf + 1] = s
end

-- a packed repeated field of varints
local function fpacked(buf, f, list)
  if #list == 0 then return end
  local p = {}
  for i, v in ipairs(list) do p[i] = varint(v) end
  fb(buf, f, concat(p))
end

M.varint, M.is_zero, M.fv, M.fb, M.fpacked = varint, is_zero, fv, fb, fpacked

return M
