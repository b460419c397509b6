-- FFI-vs-C parity of records(): for every combination of the 9 fixed-layout
-- sample_type bits the LuaJIT fast path decodes, the same bytes in a
-- simulated ring (U.sim().sim_ring) come back as equal tables from the FFI
-- route and from the C decoder, new tables and refilled ones alike.
local U = require("support.util")
require("perf_event")        -- the public module assembles event:records()
local records = require("perf_event.records")

-- the kernel's layout order of these bits (perf_event.h, perf_output_sample)
local ORDER = {
  { bit = 0x10000, name = "identifier", w = 8 },
  { bit = 0x1, name = "ip", w = 8 },
  { bit = 0x2, name = "tid", w = 8 },      -- u32 pid, u32 tid
  { bit = 0x4, name = "time", w = 8 },
  { bit = 0x8, name = "addr", w = 8 },
  { bit = 0x40, name = "id", w = 8 },
  { bit = 0x200, name = "stream_id", w = 8 },
  { bit = 0x80, name = "cpu", w = 8 },     -- u32 cpu, u32 reserved
  { bit = 0x100, name = "period", w = 8 },
}

-- little-endian bytes of a 64-bit value given as { hi32, lo32 }
local function le32(n)
  local t = {}
  for i = 1, 4 do t[i] = string.char(n % 256); n = math.floor(n / 256) end
  return table.concat(t)
end
local function q(hi, lo) return le32(lo) .. le32(hi) end

-- three value sets per field: small, just under and at/over 2^53, all ones
local VALUES = {
  -- ip, id, time, addr, stream_id, period
  { q(0, 0x401000), q(0, 7), q(0x1FFFFF, 0xFFFFFFFF), q(0, 123456789), q(0, 1), q(0, 100000) },
  { q(0x00200000, 0), q(0x7FFFFFFF, 0xFFFFFFF0), q(0x80000000, 0), q(0xFFFFFFFF, 0xFFFFFFFF),
    q(0x00200000, 1), q(0, 1) },
  { q(0xFFFFFFFF, 0xFFFFFFFF), q(0, 0), q(0xDEADBEEF, 0x12345678), q(0x1, 0x0), q(0, 0xFFFFFFFF),
    q(0x00200000, 0) },
}
local PIDTID = { le32(4242) .. le32(4243), le32(0xFFFFFFFF) .. le32(0), le32(1) .. le32(0x7FFFFFFF) }
local CPU = { le32(0), le32(1023), le32(0xFFFFFFFF) }

local function record(st, k)
  local v, parts = VALUES[k], {}
  local id = v[2]                   -- the kernel writes one id in IDENTIFIER and ID
  for _, f in ipairs(ORDER) do
    if st % (2 * f.bit) >= f.bit then
      if f.name == "tid" then parts[#parts + 1] = PIDTID[k]
      elseif f.name == "cpu" then parts[#parts + 1] = CPU[k] .. le32(0)
      elseif f.name == "identifier" or f.name == "id" then parts[#parts + 1] = id
      elseif f.name == "ip" then parts[#parts + 1] = v[1]
      elseif f.name == "time" then parts[#parts + 1] = v[3]
      elseif f.name == "addr" then parts[#parts + 1] = v[4]
      elseif f.name == "stream_id" then parts[#parts + 1] = v[5]
      else parts[#parts + 1] = v[6] end                       -- period
    end
  end
  local body = table.concat(parts)
  local size = 8 + #body
  local misc = ({ 2, 1, 0x4002 })[k]     -- USER, KERNEL, USER|EXACT_IP
  return "\9\0\0\0" .. string.char(misc % 256, math.floor(misc / 256), size % 256, math.floor(size / 256)) .. body
end

-- a 256-byte ring holding `bytes` from byte 200 on, wrapping past the end
local RING = 256
local function ring(st, bytes)
  local tail = 200
  local buf = {}
  for i = 1, RING do buf[i] = "\0" end
  for i = 1, #bytes do buf[(tail + i - 1) % RING + 1] = bytes:sub(i, i) end
  return U.sim().sim_ring({ data = table.concat(buf), tail = tail, head = tail + #bytes, sample_type = st })
end

-- a copy of a record table whose values compare by type and printed form
-- (a u64 over 2^53 is cdata on LuaJIT: equal values print alike)
local function flat(r)
  local t = {}
  for k, v in pairs(r) do t[k] = type(v) .. ":" .. tostring(v) end
  return t
end

local function drain(st, bytes, ffi, reuse)
  records.ffi = ffi
  local ev = ring(st, bytes)
  local it, s, c = ev:records(reuse)
  local src = debug.getinfo(it, "S").source
  local out = {}
  for r in it, s, c do out[#out + 1] = flat(r) end
  local tail = ev:ring().data_tail
  ev:close()
  return out, src, tail
end

describe("FFI-vs-C parity of records() over all 512 simple sample_type combinations", function()
  local saved
  before_each(function() saved = records.ffi end)
  after_each(function() records.ffi = saved end)

  it("every combination decodes to equal tables on both routes, fresh and reused", function()
    U.need(records.ffi, "no LuaJIT FFI on " .. _VERSION .. ": records() has one route here")
    for combo = 0, 511 do
      local st = 0
      for i, f in ipairs(ORDER) do
        if combo % 2 ^ i >= 2 ^ (i - 1) then st = st + f.bit end
      end
      local bytes = record(st, 1) .. record(st, 2) .. record(st, 3)
      local c, csrc, ctail = drain(st, bytes, false)
      local f, fsrc, ftail = drain(st, bytes, true)
      local r, rsrc = drain(st, bytes, true, {})
      -- each route is the one asked for
      assert.equal("=records.fast", fsrc, "st " .. st)
      assert.equal("=records.fast", rsrc, "st " .. st)
      assert.are_not.equal("=records.fast", csrc, "st " .. st)
      assert.equal(3, #c, "st " .. st)
      assert.same(c, f, "st " .. st)
      assert.same(c, r, "st " .. st)
      assert.equal(200 + #bytes, ctail)
      assert.equal(ctail, ftail)
    end
  end)

  it("the C route's values are the bytes written (pid/tid, cpu, misc, 64-bit fields)", function()
    records.ffi = false
    local all = 0
    for _, f in ipairs(ORDER) do all = all + f.bit end
    local ev = ring(all, record(all, 1) .. record(all, 2) .. record(all, 3))
    local got = {}
    for r in ev:records() do got[#got + 1] = r end
    assert.equal(100000, got[1].period)
    assert.equal(1, got[2].period)
    assert.equal(2 ^ 53, tonumber(got[3].period))
    ev:close()
    assert.equal(3, #got)
    assert.equal(0x401000, got[1].ip)
    assert.equal(4242, got[1].pid)
    assert.equal(4243, got[1].tid)
    assert.equal(7, got[1].id)
    assert.equal(2 ^ 53 - 1, got[1].time)
    assert.equal(123456789, got[1].addr)
    assert.equal(1, got[1].stream_id)
    assert.equal(0, got[1].cpu)
    assert.equal(2, got[1].misc)
    assert.equal(0xFFFFFFFF, got[2].pid)
    assert.equal(1023, got[2].cpu)
    assert.equal("ffffffffffffffff", U.hex(got[2].addr))
    assert.equal("7ffffffffffffff0", U.hex(got[2].id))
    assert.equal("deadbeef12345678", U.hex(got[3].time))
    assert.equal(0xFFFFFFFF, got[3].cpu)
    assert.equal(0x7FFFFFFF, got[3].tid)
    assert.equal(0x4002, got[3].misc)
  end)

  it("a sample_type with a bit outside the nine leaves the FFI route (READ)", function()
    U.need(records.ffi, "no LuaJIT FFI on " .. _VERSION)
    records.ffi = true
    local ev = ring(0x1 + 0x10, record(0x1, 1))
    assert.are_not.equal("=records.fast", debug.getinfo(ev:records(), "S").source)
    ev:close()
  end)
end)
