-- read(2) layouts for all 32 read_format combinations (doc/coverage.md C1-C7):
-- on the real kernel, and on synthetic buffers for scaling and truncation.
local pe = require("perf_event")
local core = require("perf_event.core")
local petest = require("petest")
local U = require("support.util")

local GETPPID = U.tp_id("syscalls", "sys_enter_getppid")
local TE, TR, ID, GROUP, LOST = 1, 2, 4, 8, 16

local function has(rf, bit) return rf % (2 * bit) >= bit end

-- C3: documented size of a read for read_format rf and nr members
local function size_of(rf, nr)
  local te, tr = has(rf, TE) and 1 or 0, has(rf, TR) and 1 or 0
  local id, lost = has(rf, ID) and 1 or 0, has(rf, LOST) and 1 or 0
  if has(rf, GROUP) then return 8 * (1 + te + tr) + nr * 8 * (1 + id + lost) end
  return 8 * (1 + te + tr + id + lost)
end

describe("read_format on the real kernel", function()
  for rf = 0, 31 do
    it(("decodes read_format=%d to the documented layout"):format(rf), function()
      U.need_tracing()
      local attr = { type = "tracepoint", config = GETPPID, read_format = rf, disabled = true }
      local leader = assert(core.open(attr, { name = "leader" }))
      local member
      if has(rf, GROUP) then
        member = assert(core.open({ type = "tracepoint", config = GETPPID, read_format = rf },
                                  { name = "member", group = leader }))
      end
      assert.is_true(leader:enable())
      petest.getppid(13)
      assert.is_true(leader:disable())
      local r, bytes = leader:read_raw()
      assert.equal(size_of(rf, member and 2 or 1), bytes)
      local vals = has(rf, GROUP) and r.values or { r }
      if has(rf, GROUP) then
        assert.equal(2, r.nr)
        assert.equal(2, #vals)
      end
      local evs = { leader, member }
      for i, v in ipairs(vals) do
        assert.equal(13, v.value)
        if has(rf, ID) then assert.equal(evs[i]:id(), v.id) else assert.is_nil(v.id) end
        if has(rf, LOST) then assert.equal(0, v.lost) else assert.is_nil(v.lost) end
      end
      if has(rf, TE) then assert.is_true(r.time_enabled > 0) else assert.is_nil(r.time_enabled) end
      if has(rf, TR) then assert.is_true(r.time_running > 0) else assert.is_nil(r.time_running) end
      -- read() returns this event's own value whatever the layout
      assert.equal(13, (leader:read()))
      if member then
        assert.equal(13, (member:read()))
        -- C5: a read on the member fd returns the whole group
        local mr = member:read_raw()
        assert.equal(2, mr.nr)
        member:close()
      end
      leader:close()
    end)
  end
end)

describe("read_format on synthetic buffers", function()
  local function build(rf, nr, base)
    local parts = {}
    local function add(n) parts[#parts + 1] = U.le64(n) end
    if has(rf, GROUP) then
      add(nr)
      if has(rf, TE) then add(1000) end
      if has(rf, TR) then add(500) end
      for i = 1, nr do
        add(base + i)
        if has(rf, ID) then add(100 + i) end
        if has(rf, LOST) then add(200 + i) end
      end
    else
      add(base)
      if has(rf, TE) then add(1000) end
      if has(rf, TR) then add(500) end
      if has(rf, ID) then add(101) end
      if has(rf, LOST) then add(201) end
    end
    return table.concat(parts)
  end

  for rf = 0, 31 do
    it(("decodes and bounds-checks read_format=%d"):format(rf), function()
      local nr = has(rf, GROUP) and 3 or 1
      local buf = build(rf, nr, 40)
      assert.equal(size_of(rf, nr), #buf)
      local r, used = core.decode_read(buf, rf)
      assert.equal(#buf, used)
      local vals = has(rf, GROUP) and r.values or { r }
      assert.equal(nr, #vals)
      for i, v in ipairs(vals) do
        assert.equal(has(rf, GROUP) and 40 + i or 40, v.value)
        assert.equal(has(rf, ID) and 100 + i or nil, v.id)
        assert.equal(has(rf, LOST) and 200 + i or nil, v.lost)
      end
      assert.equal(has(rf, TE) and 1000 or nil, r.time_enabled)
      assert.equal(has(rf, TR) and 500 or nil, r.time_running)
      -- every truncation is refused, never read past the end
      for cut = 0, #buf - 1 do
        assert.is_nil((core.decode_read(buf:sub(1, cut), rf)))
      end
    end)
  end

  it("refuses a group whose nr claims more entries than the buffer holds", function()
    local buf = U.le64(1e6) .. U.le64(1) .. U.le64(2)
    assert.is_nil((core.decode_read(buf, GROUP)))
  end)

  it("accepts read_format as names", function()
    local buf = U.le64(7) .. U.le64(9)
    local r = core.decode_read(buf, { "total_time_enabled" })
    assert.equal(7, r.value)
    assert.equal(9, r.time_enabled)
    r = core.decode_read(buf, "id")
    assert.equal(9, r.id)
  end)
end)

describe("multiplex scaling (simulated: software PMUs never multiplex)", function()
  it("scales value * enabled / running exactly", function()
    assert.equal(300, core.scale(100, 3000, 1000))
    assert.equal(100, core.scale(100, 1000, 1000))
    -- quotient/remainder exactness: 7 * 10 / 3 = 23 (floor)
    assert.equal(23, core.scale(7, 10, 3))
  end)
  it("never overflows in the intermediate product", function()
    -- 2^40 * 2^40 / 2^39 = 2^41 (the product 2^80 does not fit 64 bits)
    assert.equal(2 ^ 41, tonumber(core.scale(2 ^ 40, 2 ^ 40, 2 ^ 39)))
  end)
  it("reports 0 for an event that never ran (time_running == 0)", function()
    assert.equal(0, core.scale(0, 5000, 0))
  end)
  it("leaves a count alone when running >= enabled", function()
    assert.equal(55, core.scale(55, 10, 10))
  end)
end)

describe("pe.open's default read_format", function()
  it("reads value, time_enabled, time_running", function()
    U.need_tracing()
    local ev = assert(pe.open({ type = "tracepoint", config = GETPPID, name = "g" }))
    petest.getppid(2)
    local v, en, run = ev:read()
    assert.equal(2, v)
    assert.is_true(en > 0 and run > 0)
    ev:close()
  end)
end)
