--- The record stream in Lua: `event:records()` with tracepoint `fields`
-- (decoded through the tracefs format) and, on LuaJIT, a fast path that
-- reads the fixed-layout sample fields straight out of the ring through the
-- FFI.  The ring walk itself (barriers, wrap, tail) is always the C core's
-- (`pe_ring_next`); records this module does not decode itself go to the C
-- decoder, so both paths return the same tables.
-- @module perf_event.records

local core = require("perf_event.native")

local type, error, tonumber, pcall, setmetatable, require = type, error, tonumber, pcall,
  setmetatable, require
local byte, sub, find, format, gsub = string.byte, string.sub, string.find, string.format,
  string.gsub
local unpack_ = string.unpack   -- luacheck: ignore (nil before 5.3)

local M = {}

-- the C method this wraps and the core's hooks into the ring (functions of
-- an event, not methods): perf_event.class installs M.records as the method
local P = core._private
local c_records = P.event_methods.records
local ring_ptr, ring_error, ring_version = P.ring_ptr, P.ring_error, P.ring_version
local ring_layouts, decode_current = P.ring_layouts, P.decode_current
local abi = core.abi
local TYPE_TRACEPOINT = abi.type.tracepoint
local ST = abi.sample_type

-- ---- tracepoint fields ------------------------------------------------------

local TWO32 = 4294967296
local TWO53 = 9007199254740992

local ffi
do
  local ok, f = pcall(require, "ffi")
  if ok then ffi = f end
end

-- little-endian unsigned integer of n <= 4 bytes at 1-based position i
local function le(s, i, n)
  local v = 0
  for k = i + n - 1, i, -1 do v = v * 256 + (byte(s, k) or 0) end
  return v
end

local int_at
if unpack_ then
  local U = { [1] = "<I1", [2] = "<I2", [4] = "<I4", [8] = "<I8" }
  local S = { [1] = "<i1", [2] = "<i2", [4] = "<i4", [8] = "<i8" }
  int_at = function(s, i, n, signed)
    local f = (signed and S or U)[n]
    if not f or i + n - 1 > #s then return nil end
    return (unpack_(f, s, i))
  end
else
  local u64c = ffi and ffi.typeof("uint64_t")
  local i64c = ffi and ffi.typeof("int64_t")
  int_at = function(s, i, n, signed)
    if i + n - 1 > #s then return nil end
    if n == 8 then
      local lo, hi = le(s, i, 4), le(s, i + 4, 4)
      if signed and hi >= 2147483648 then
        -- negative: exact as a number when |v| < 2^53
        local mag_hi, mag_lo = TWO32 - 1 - hi, TWO32 - lo
        if mag_lo == TWO32 then mag_lo = 0; mag_hi = mag_hi + 1 end
        if mag_hi < 2097152 then return -(mag_hi * TWO32 + mag_lo) end
        if i64c then return i64c(u64c(hi) * TWO32 + lo) end
        return format("0x%08x%08x", hi, lo)
      end
      if hi < 2097152 then return hi * TWO32 + lo end
      return core.u64(format("0x%08x%08x", hi, lo))
    elseif n == 1 or n == 2 or n == 4 then
      local v = le(s, i, n)
      if signed then
        local half = 2 ^ (8 * n - 1)
        if v >= half then v = v - 2 * half end
      end
      return v
    end
    return nil
  end
end

local ELEM = {
  char = 1, ["unsigned char"] = 1, u8 = 1, s8 = 1, __u8 = 1, bool = 1,
  short = 2, ["unsigned short"] = 2, u16 = 2, s16 = 2, __u16 = 2,
  int = 4, ["unsigned int"] = 4, u32 = 4, s32 = 4, __u32 = 4, pid_t = 4, unsigned = 4,
  long = 8, ["unsigned long"] = 8, u64 = 8, s64 = 8, __u64 = 8, size_t = 8,
  ["long long"] = 8, ["unsigned long long"] = 8, dma_addr_t = 8, loff_t = 8,
}

local function is_char(t)
  return find(t, "char") ~= nil and find(t, "unsigned char") == nil
end

local function cstring(s)
  local z = find(s, "\0", 1, true)
  if z then return sub(s, 1, z - 1) end
  return s
end

-- an array of n-byte elements from bytes s
local function int_array(s, esize, signed)
  local out = {}
  for k = 1, #s - esize + 1, esize do out[#out + 1] = int_at(s, k, esize, signed) end
  return out
end

-- base type of a field's type string ("__data_loc char[]" -> "char")
local function base_type(t)
  t = gsub(t, "^__data_loc%s+", "")
  t = gsub(t, "^__rel_loc%s+", "")
  t = gsub(t, "%[.*$", "")
  t = gsub(t, "^const%s+", "")
  t = gsub(t, "%s+$", "")
  return t
end

--- Decodes a tracepoint payload (`rec.raw`) with a tracefs format.
-- Integers of 1/2/4/8 bytes (signed as the format says), fixed arrays
-- (`char[]` as strings, others as arrays of integers), `__data_loc` and
-- `__rel_loc` strings and arrays.
-- @tparam string raw the RAW bytes of a sample
-- @tparam table fmt `tracepoint()` result (`fields` with name/type/offset/size/signed)
-- @treturn table field name -> value
function M.decode_fields(raw, fmt)
  local out = {}
  for _, f in ipairs(fmt.fields) do
    local i, size, t = f.offset + 1, f.size, f.type or ""
    local v
    if f.data_loc then
      local loc = int_at(raw, i, 4, false)
      if loc then
        local off, len = loc % 65536, (loc - loc % 65536) / 65536
        if find(t, "^__rel_loc") then off = off + f.offset + size end
        local bytes = sub(raw, off + 1, off + len)
        if #bytes == len then
          local bt = base_type(t)
          if is_char(bt) then v = cstring(bytes)
          elseif ELEM[bt] and ELEM[bt] > 1 then v = int_array(bytes, ELEM[bt], f.signed)
          else v = bytes end
        end
      end
    elseif f.array then
      local bytes = sub(raw, i, i + size - 1)
      if #bytes == size then
        local bt = base_type(t)
        local n = tonumber(f.array)
        if is_char(bt) then v = cstring(bytes)
        elseif n and n > 0 and size % n == 0 and (size / n == 1 or size / n == 2 or
            size / n == 4 or size / n == 8) then
          v = int_array(bytes, size / n, f.signed)
        else v = bytes end
      end
    elseif size == 1 or size == 2 or size == 4 or size == 8 then
      v = int_at(raw, i, size, f.signed)
    else
      v = sub(raw, i, i + size - 1)
    end
    out[f.name] = v
  end
  return out
end

-- tracepoint id -> format (cached; false when unknown)
local formats = {}

-- the tracefs format of a tracepoint event (attr type tracepoint, config =
-- tracepoint id, name as opened), cached by id; false when unknown
local function format_of(atype, config, name)
  if tonumber(atype) ~= TYPE_TRACEPOINT then return false end
  local id = tonumber(config)
  if not id then return false end
  local cached = formats[id]
  if cached ~= nil then return cached end
  local ok, tp = pcall(require, "perf_event.tracepoint")
  if not ok then formats[id] = false return false end
  local fmt = false
  if type(name) == "string" and find(name, "^[%w_]+:[%w_]+$") then
    local t = tp.tracepoint(name)
    if t and t.id == id then fmt = t end
  end
  if not fmt then   -- opened by id: find the name through tracefs
    for _, n in ipairs(tp.list()) do
      local t = tp.tracepoint(n)
      if t and t.id == id then fmt = t break end
    end
  end
  formats[id] = fmt
  return fmt
end

local function format_for(ev)
  local a = ev:attr()
  return format_of(a.type, a.config, ev:name())
end
M.format_for = format_for

-- ---- LuaJIT fast path ----------------------------------------------------------

-- the sample_type bits of the fixed-layout head of a sample (core.abi)
local SIMPLE = abi.sample_fixed_mask

local fast_iter
if ffi and jit and core.ring_next_ptr then
  local cast = ffi.cast
  local ring_next = cast("int (*)(void *, const uint8_t **)", core.ring_next_ptr)
  local u16p = ffi.typeof("const uint16_t *")
  local u32p = ffi.typeof("const uint32_t *")
  local u64p = ffi.typeof("const uint64_t *")
  local ppt = ffi.typeof("const uint8_t *[1]")
  local LIM = ffi.cast("uint64_t", TWO53)

  local band = require("bit").band

  -- the iterator is generated per sample_type (and per mode: new tables or
  -- one reused table): its constructor names exactly the fields present, a
  -- smaller table and no branch per field
  local gen_cache = {}
  local function generate(st, reuse)
    local o, fields = 1, {}
    local function slot(bit, code)
      if band(st, bit) ~= 0 then fields[#fields + 1] = code(o); o = o + 1 end
    end
    for _, f in ipairs(abi.sample_fixed) do
      slot(f.bit, function(k)
        if f.field then return ("%s = u64(q, %d)"):format(f.field, k) end
        local code = ("%s = tonumber(w[%d])"):format(f.lo, 2 * k)
        if f.hi then code = code .. (", %s = tonumber(w[%d])"):format(f.hi, 2 * k + 1) end
        return code
      end)
    end
    local ctor = "{ type = \"sample\", misc = tonumber(cast(u16p, p)[2]), " ..
      table.concat(fields, ", ") .. " }"
    local fill = {}
    for _, f in ipairs(fields) do
      for k, v in f:gmatch("([%w_]+) = ([^,]+%b())") do fill[#fill + 1] = "r." .. k .. " = " .. v end
    end
    local src = ([[
local ring_next, cast, u16p, u32p, u64p, LIM, tonumber, error, ring_error, decode_current, SAMPLE = ...
local function u64(q, k)
  local v = q[k]
  if v < LIM then return tonumber(v) end
  return v
end
return function(ev, ptr, pp, r)
  return function()
    local n = ring_next(ptr, pp)
    if n <= 0 then
      if n == 0 then return nil end
      if n == -1 then error("records(" .. ev:name() .. "): " .. ring_error(ev), 2) end
      error("records: the event was closed during iteration", 2)
    end
    local p = pp[0]
    local w = cast(u32p, p)
    if w[0] ~= SAMPLE or n ~= %d then return decode_current(ev) end
    local q = cast(u64p, p)
    %s
  end
end]]):format(o * 8, reuse and ("r.type = \"sample\"; r.misc = tonumber(cast(u16p, p)[2]); " ..
      table.concat(fill, "; ") .. (#fill > 0 and "; " or "") .. "return r") or ("return " .. ctor))
    local chunk = assert((loadstring or load)(src, "=records.fast"))
    return chunk(ring_next, cast, u16p, u32p, u64p, LIM, tonumber, error, ring_error,
                 decode_current, abi.record_type.sample)
  end

  fast_iter = function(ev, st, reuse, ptr)
    -- separate code for the two modes, so their traces stay separate
    local key = reuse and -1 - st or st
    local maker = gen_cache[key]
    if not maker then maker = generate(st, reuse); gen_cache[key] = maker end
    return maker(ev, cast("void *", ptr), ppt(), reuse)
  end
end

--- Whether records() uses the LuaJIT FFI fast path for simple samples
-- (settable, e.g. to compare both paths).
M.ffi = fast_iter ~= nil

-- a C check's error (no ring, closed event) raised at records()'s caller, as
-- doc/errors.md says; pcall keeps this file's position out of the message
local function at_caller(ok, ...)
  if not ok then error((...), 3) end
  return ...
end

-- no sample_type bit outside the fixed-layout ones the fast path reads
local function only_simple(st)
  if st >= 2 ^ abi.sample_max_bit then return false end
  for b = 0, abi.sample_max_bit - 1 do
    local v = 2 ^ b
    if (st / v) % 2 >= 1 and (SIMPLE / v) % 2 < 1 then return false end
  end
  return true
end

-- per-event choices, computed once per set of events sharing the ring
local plans = setmetatable({}, { __mode = "k" })

local function has_raw(st)
  return (st / ST.raw) % 2 >= 1     -- PERF_SAMPLE_RAW: tracepoint fields
end

local function plan(ev)
  local ver = ring_version(ev)
  local p = plans[ev]
  if p and p.ver == ver then return p end
  local info = ev:info()
  local st = tonumber(info.sample_type) or 0
  p = { fmt = has_raw(st) and format_for(ev), simple = only_simple(st), st = st, ver = ver }
  if ver ~= 0 then
    -- other events write into this ring (set_output): the FFI fast path
    -- knows one layout only, and tracepoint fields come from each
    -- record's own event (by rec.id)
    local mixed, lays = ring_layouts(ev)
    if mixed then p.simple = false end
    local byid, any = {}, false
    for id, l in pairs(lays) do
      local f = has_raw(tonumber(l.sample_type) or 0) and format_of(l.type, l.config, l.name)
      byid[id] = f
      any = any or f ~= false
    end
    if any or (p.fmt and next(lays) ~= nil) then
      byid[info.id] = p.fmt
      p.byid = byid
    end
  end
  plans[ev] = p
  return p
end

--- `event:records([reuse])`: an iterator over the records in the ring now.
-- Tracepoint samples with `raw` also carry `fields`.
-- @param ev the event
-- @tparam[opt] table reuse a table the iterator may refill for each sample
--   instead of allocating one (LuaJIT fast path: fixed-layout samples); the
--   loop must then not keep `rec` past the iteration
-- In a ring shared through `set_output`, records of events with another
-- sample layout are told apart by `identifier` and decoded with their own
-- event's layout; a tracepoint sample's `fields` come from its own event's
-- format (looked up by `rec.id`).
-- @treturn function iterator yielding record tables
function M.records(ev, reuse)
  if getmetatable(ev) ~= core.event_mt then   -- not an event: say so, as the C methods do
    error("bad argument #1 to 'records' (perf_event.event expected, got " .. type(ev) .. ")", 2)
  end
  local p = plan(ev)
  local it, s, c
  if reuse ~= nil and type(reuse) ~= "table" then
    error("records: the argument must be a table to reuse, got " .. type(reuse), 2)
  end
  if M.ffi and fast_iter and p.simple and not p.fmt and not p.byid then
    return fast_iter(ev, p.st, reuse, at_caller(pcall(ring_ptr, ev)))
  end
  it, s, c = at_caller(pcall(c_records, ev))
  local fmt, byid = p.fmt, p.byid
  if byid then      -- a shared ring: the format of the record's own event
    return function()
      local rec = it(s, c)
      if rec and rec.raw then
        local f = fmt
        if rec.id ~= nil then f = byid[rec.id] end
        if f == nil then f = fmt end
        if f then rec.fields = M.decode_fields(rec.raw, f) end
      end
      return rec
    end
  end
  if not fmt then return it, s, c end
  return function()
    local rec = it(s, c)
    if rec and rec.raw then rec.fields = M.decode_fields(rec.raw, fmt) end
    return rec
  end
end

return M
