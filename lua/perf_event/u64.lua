--- Exact unsigned 64-bit values in pure Lua, on every supported version.
-- A value is a table `{h = <high 32 bits>, l = <low 32 bits>}` whose halves
-- are non-negative integers below 2^32, so only arithmetic is needed (PUC
-- 5.1 has no bit operators, LuaJIT's `bit` is 32-bit).  `value(u)` converts
-- to the representation doc/api.md fixes for the running interpreter:
-- a Lua 5.3+ integer (>= 2^63 wraps to negative, same bits), on LuaJIT a
-- number below 2^53 and a `uint64_t` cdata above, on PUC 5.1 a number below
-- 2^53 and a `"0x..."` hex string above.
-- Not a public interface: reached through perf_event (doc/api.md lists what is).
-- @module perf_event.u64

local floor, tostring, type, pcall, require, rawget, load =
  math.floor, tostring, type, pcall, require, rawget, load or loadstring
local format, byte, sub = string.format, string.byte, string.sub
local math_type, tointeger = rawget(math, "type"), rawget(math, "tointeger")

local M = {}

local TWO32 = 4294967296
local TWO53 = 9007199254740992

local function new(h, l) return { h = h, l = l } end

--- A new value from its two halves (default 0).
function M.new(h, l) return new(h or 0, l or 0) end

--- Zero.
function M.zero() return new(0, 0) end

local HEXVAL = {}
for i = 0, 9 do HEXVAL[48 + i] = i end
for i = 0, 5 do HEXVAL[65 + i] = 10 + i; HEXVAL[97 + i] = 10 + i end

-- u = u * base + d, with overflow detection
local function muladd(u, base, d)
  local l = u.l * base + d
  local carry = floor(l / TWO32)
  l = l - carry * TWO32
  local h = u.h * base + carry
  if h >= TWO32 then return false end
  u.h, u.l = h, l
  return true
end

--- Parses a decimal or `0x` hexadecimal string (no sign, no spaces).
-- @tparam string s
-- @treturn[1] table the value
-- @treturn[2] nil
-- @treturn[2] string `"overflow"` or `"syntax"`
function M.parse(s)
  if type(s) ~= "string" or s == "" then return nil, "syntax" end
  local base, i = 10, 1
  if sub(s, 1, 2) == "0x" or sub(s, 1, 2) == "0X" then base, i = 16, 3 end
  if i > #s then return nil, "syntax" end
  local u = new(0, 0)
  for k = i, #s do
    local d = HEXVAL[byte(s, k)]
    if d == nil or d >= base then return nil, "syntax" end
    if not muladd(u, base, d) then return nil, "overflow" end
  end
  return u
end

--- Parses a hex digit string without prefix (as in perf's `rNNNN`).
function M.parse_hex(s)
  if type(s) ~= "string" or s == "" then return nil, "syntax" end
  return M.parse("0x" .. s)
end

local function negate(u)
  local h, l = TWO32 - 1 - u.h, TWO32 - 1 - u.l
  l = l + 1
  if l == TWO32 then l = 0; h = h + 1; if h == TWO32 then h = 0 end end
  return new(h, l)
end

--- Converts any Lua representation of a 64-bit value to a u64 table:
-- a number (integer-valued, 0 <= v < 2^64), a 5.3+ integer (negative means
-- the same bits), a LuaJIT `uint64_t`/`int64_t` cdata, or a string.
-- @treturn[1] table
-- @treturn[2] nil
-- @treturn[2] string why
function M.from(v)
  local t = type(v)
  if t == "table" and v.h and v.l then return new(v.h, v.l) end
  if t == "number" then
    if math_type and math_type(v) == "integer" then
      return M.parse(format("0x%x", v))
    end
    if v ~= v or v < 0 or v >= TWO32 * TWO32 or floor(v) ~= v then
      return nil, "not a 64-bit unsigned integer: " .. tostring(v)
    end
    local h = floor(v / TWO32)
    return new(h, v - h * TWO32)
  elseif t == "string" then
    local s = v:match("^%s*(.-)%s*$")
    local neg = false
    if sub(s, 1, 1) == "-" then neg, s = true, sub(s, 2) end
    s = s:gsub("U?LL$", "")
    local u, why = M.parse(s)
    if not u then return nil, why end
    return neg and negate(u) or u
  elseif t == "cdata" then
    return M.from((tostring(v):gsub("U?LL$", "")))
  end
  return nil, "expected an integer, got " .. t
end

--- Bit k (0..63) of u, as 0 or 1.
function M.bit(u, k)
  if k >= 32 then return floor(u.h / 2 ^ (k - 32)) % 2 end
  return floor(u.l / 2 ^ k) % 2
end

--- Sets bit k of u in place.
function M.setbit(u, k)
  if M.bit(u, k) == 1 then return u end
  if k >= 32 then u.h = u.h + 2 ^ (k - 32) else u.l = u.l + 2 ^ k end
  return u
end

--- Clears bit k of u in place.
function M.clearbit(u, k)
  if M.bit(u, k) == 0 then return u end
  if k >= 32 then u.h = u.h - 2 ^ (k - 32) else u.l = u.l - 2 ^ k end
  return u
end

local function or32(a, b)
  local r, p = 0, 1
  for _ = 1, 32 do
    local x, y = a % 2, b % 2
    if x == 1 or y == 1 then r = r + p end
    a, b, p = (a - x) / 2, (b - y) / 2, p * 2
  end
  return r
end

--- Bitwise or (a new value).
function M.bor(a, b) return new(or32(a.h, b.h), or32(a.l, b.l)) end

--- True if u is 0.
function M.iszero(u) return u.h == 0 and u.l == 0 end

--- True if a == b.
function M.eq(a, b) return a.h == b.h and a.l == b.l end

--- Number of significant bits (0 for 0).
function M.bitlen(u)
  for k = 63, 0, -1 do
    if M.bit(u, k) == 1 then return k + 1 end
  end
  return 0
end

--- Minimal lower-case hex with `0x` prefix, as perf prints.
function M.hex(u)
  if u.h == 0 then return format("0x%x", u.l) end
  return format("0x%x%08x", u.h, u.l)
end

--- The value in the running interpreter's representation (see module doc).
local value
if math_type then
  -- Lua 5.3+: build an integer; `<<` is compiled only here
  local join = load("return function(h, l) return (h << 32) | l end")()
  value = function(u) return join(tointeger(u.h), tointeger(u.l)) end
else
  local ok, ffi = pcall(require, "ffi")
  if ok then
    local u64t = ffi.typeof("uint64_t")
    value = function(u)
      if u.h < TWO53 / TWO32 then return u.h * TWO32 + u.l end
      return u64t(u.h) * TWO32 + u.l
    end
  else
    value = function(u)
      if u.h < TWO53 / TWO32 then return u.h * TWO32 + u.l end
      return format("0x%x%08x", u.h, u.l)
    end
  end
end
M.value = value

--- Converts any representation to a plain hex string (for comparisons).
-- @treturn[1] string
-- @treturn[2] nil
function M.tohex(v)
  local u = M.from(v)
  return u and M.hex(u) or nil
end

--- Converts to a Lua number when exact (below 2^53), else nil.
function M.tonumber(u)
  if u.h < TWO53 / TWO32 then return u.h * TWO32 + u.l end
  return nil
end

return M
