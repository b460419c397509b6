-- The self-monitoring read through the user page (doc/coverage.md D18-D21, K24,
-- K25).  This machine has no hardware PMU (caps=0x2, index=0), so the
-- rdpmc path runs only against simulated pages: U.sim().userpage_sim builds a
-- perf_event_mmap_page in memory and reads it with the same C function
-- ev:read() uses, with scripted rdpmc/rdtsc values.  Expected values are
-- reference vectors computed independently (Python, exact integers) and,
-- on Lua 5.4, recomputed here with the D20 formula in native integers.
local core = require("perf_event.core")
local pe = require("perf_event")
local U = require("support.util")

local RDPMC, TIME, TIME_ZERO, TIME_SHORT = 4, 8, 16, 32
local u64 = core.u64   -- a value as the core returns it on this interpreter

-- D20 in Lua 5.4 integers (wrapping), compiled only where it parses
local d20 = _VERSION == "Lua 5.4" and load([[
  return function(cyc, time_offset, mult, shift, cycles, mask)
    if cycles then cyc = cycles + ((cyc - cycles) & mask) end
    local quot = cyc >> shift
    local rem = cyc & ((1 << shift) - 1)
    return time_offset + quot * mult + ((rem * mult) >> shift)
  end]])()

local function sim(t) return U.sim().userpage_sim(t) end

describe("user page read (simulated page, injected rdpmc/rdtsc)", function()
  it("adds the rdpmc value to offset and passes index-1 to rdpmc", function()
    local r = sim { capabilities = RDPMC + TIME, index = 3, pmc_width = 48, offset = 1000,
                    pmc = 5000, time_enabled = 1000000, time_running = 1000000,
                    tsc = 3000000000123, time_mult = 341, time_shift = 10,
                    time_offset = "0xffffff1766f5ba00" }
    assert.are.equal("ok", r.status)
    assert.are.equal(6000, r.count)
    assert.are.equal(6000, r.value)
    assert.are.equal(2, r.counter)
    assert.are.equal(1, r.loops)
    assert.are.equal(1, r.pmc_calls)
    assert.are.equal(1, r.tsc_calls)
    -- delta = 23437540 (reference); both times advance by it
    assert.are.equal(1000000 + 23437540, r.enabled)
    assert.are.equal(1000000 + 23437540, r.running)
    if d20 then
      assert.are.equal(23437540, d20(3000000000123, 0xffffff1766f5ba00, 341, 10))
    end
  end)

  it("sign-extends a 48-bit counter that crossed its width", function()
    local base = { capabilities = RDPMC + TIME, index = 1, pmc_width = 48, offset = 1000,
                   time_mult = 1, time_shift = 0, tsc = 0, read_format = 0 }
    base.pmc = "0xfffffffffff0"                -- -16 in 48 bits
    assert.are.equal(984, sim(base).count)
    base.pmc = "0x1000000000005"               -- bits above the width are ignored
    assert.are.equal(1005, sim(base).count)
    base.pmc = "0x7fffffffffff"                -- the largest positive value
    assert.are.equal(1000 + 140737488355327, sim(base).count)
    base.pmc_width, base.pmc = 64, 7           -- 64-bit counters: no extension
    assert.are.equal(1007, sim(base).count)
    base.pmc_width, base.pmc = 32, "0xffffffff" -- 32-bit counters: -1
    assert.are.equal(999, sim(base).count)
  end)

  it("retries when the lock changes during the read (torn seqlock)", function()
    local r = sim { capabilities = RDPMC + TIME, index = 2, pmc_width = 48, lock = 6,
                    offset = 1000, time_enabled = 50, time_running = 50,
                    time_mult = 1, time_shift = 0, tsc = 0,
                    pmc = { 111, 222 },
                    tear = { { offset = 2000, time_enabled = 70, time_running = 70 } } }
    assert.are.equal("ok", r.status)
    assert.are.equal(2, r.loops)
    assert.are.equal(2, r.pmc_calls)
    assert.are.equal(2222, r.count)         -- the second pass: new offset, new pmc
    assert.are.equal(70, r.enabled)
    -- three updates in a row, the last one moving the counter to index 4
    r = sim { capabilities = RDPMC + TIME, index = 2, pmc_width = 48, offset = 10,
              time_mult = 1, time_shift = 0, tsc = 0, pmc = { 1, 2, 3, 4 },
              tear = { { offset = 20 }, { offset = 30 }, { offset = 40, index = 5 } } }
    assert.are.equal(4, r.loops)
    assert.are.equal(44, r.count)
    assert.are.equal(4, r.counter)
    -- a writer racing with the TSC read
    r = sim { capabilities = RDPMC + TIME, index = 1, pmc_width = 48, offset = 5,
              time_enabled = 100, time_running = 100, time_mult = 1, time_shift = 0,
              time_offset = 0, tsc = { 7, 9 }, pmc = 1, tear_on = "tsc",
              tear = { { time_enabled = 200, time_running = 200 } } }
    assert.are.equal(2, r.loops)
    assert.are.equal(209, r.enabled)
  end)

  it("falls back without executing rdpmc when index is 0 or rdpmc is not offered", function()
    local r = sim { capabilities = RDPMC + TIME, index = 0, pmc_width = 48, offset = 5, pmc = 1 }
    assert.are.equal("noindex", r.status)
    assert.are.equal(0, r.pmc_calls)
    assert.is_nil(r.value)
    r = sim { capabilities = 2, index = 3, pmc_width = 48, offset = 5, pmc = 1 }  -- a PMU-less VM's caps
    assert.are.equal("nocap", r.status)
    assert.are.equal(0, r.pmc_calls)
    r = sim { capabilities = RDPMC + TIME, index = 3, pmc_width = 0, pmc = 1 }
    assert.are.equal("badwidth", r.status)
    assert.are.equal(0, r.pmc_calls)
  end)

  it("falls back for events the page cannot describe", function()
    local page = { capabilities = RDPMC + TIME, index = 1, pmc_width = 48, offset = 5, pmc = 1,
                   time_mult = 1, time_shift = 0 }
    page.selfmon = false
    assert.are.equal("nopage", sim(page).status)
    page.selfmon, page.inherit = true, true
    assert.are.equal("inherit", sim(page).status)
    page.inherit = nil
    -- another thread than the opener: its rdpmc would read its own CPU's
    -- counter, so the read falls back to read(2) (never executing rdpmc)
    page.other_thread = true
    local r = sim(page)
    assert.are.equal("thread", r.status)
    assert.are.equal(0, r.pmc_calls)
    page.other_thread = nil
    page.offset, page.pmc = -100, 10            -- a negative total: not a count
    assert.are.equal("negative", sim(page).status)
  end)

  it("converts the TSC delta with and without cap_user_time_short", function()
    local page = { capabilities = RDPMC + TIME + TIME_SHORT, index = 1, pmc_width = 48,
                   offset = 1, pmc = 0, time_enabled = 1000, time_running = 1000,
                   time_mult = 1024, time_shift = 10, time_offset = "0xffffffff00000128",
                   time_cycles = "0xffffff00", time_mask = "0xffffffff", tsc = "0x50" }
    local r = sim(page)
    -- the 32-bit clock wrapped: cyc = time_cycles + ((0x50 - time_cycles) & mask)
    assert.are.equal(1000 + 376, r.enabled)
    assert.are.equal(1000 + 376, r.running)
    if d20 then assert.are.equal(376, d20(0x50, 0xffffffff00000128, 1024, 10, 0xffffff00, 0xffffffff)) end
    page.capabilities = RDPMC + TIME               -- the same page read as a 64-bit clock
    r = sim(page)
    assert.are.equal(u64("0xffffffff00000560"), r.enabled)
    if d20 then assert.are.equal(0xffffffff00000560, 1000 + d20(0x50, 0xffffffff00000128, 1024, 10)) end
    page.capabilities = RDPMC + TIME + TIME_SHORT  -- short without the fields (old size)
    page.size = 72
    assert.are.equal("badtime", sim(page).status)
  end)

  it("scales a multiplexed count with the advanced times", function()
    -- delta = 500 (time_offset -10000, cyc 10500, mult/shift = 1); enabled
    -- 2000 -> 2500, running 1000 -> 1500; 3000 * 2500 / 1500 = 5000
    local page = { capabilities = RDPMC + TIME, index = 1, pmc_width = 48, offset = 2990, pmc = 10,
                   time_enabled = 2000, time_running = 1000, time_mult = 1024, time_shift = 10,
                   time_offset = "0xffffffffffffd8f0", tsc = 10500 }
    local r = sim(page)
    assert.are.equal(3000, r.count)
    assert.are.equal(2500, r.enabled)
    assert.are.equal(1500, r.running)
    assert.are.equal(5000, r.value)
    page.read_format = 1                           -- no running time: read(2) does not scale
    assert.are.equal(3000, sim(page).value)
  end)

  it("needs cap_user_time for the times read(2) would return", function()
    local page = { capabilities = RDPMC, index = 1, pmc_width = 48, offset = 40, pmc = 2,
                   time_enabled = 10, time_running = 10 }
    local r = sim(page)
    assert.are.equal("stale", r.status)
    assert.are.equal(1, r.pmc_calls)              -- the loop ran; the times decided
    page.read_format = 0                          -- no times asked: the count is enough
    r = sim(page)
    assert.are.equal("ok", r.status)
    assert.are.equal(42, r.value)
    assert.are.equal(0, r.tsc_calls)
  end)

  it("rejects unknown page fields", function()
    assert.has_error(function() sim { capabilitiez = 4 } end,
                     "userpage_sim: unknown page field 'capabilitiez'")
  end)
end)

describe("time_conv (D21)", function()
  local params = { time_zero = 1700000000, time_mult = 349525, time_shift = 20 }

  it("converts perf timestamps to TSC and back (reference vectors)", function()
    local c = assert(pe.time_conv(params))
    assert.are.equal(9900009810, c.to_tsc(5000000123))
    assert.are.equal(5815222375, c.to_perf(12345678901))
    assert.are.equal(1700000005, c.to_perf(0x10))
    assert.are.equal(349525, c.time_mult)
    assert.is_false(c.cap_user_time_short)
    -- a timestamp survives the round trip up to one TSC tick (~3 ns here)
    local ts = 5000000123
    local back = c.to_perf(c.to_tsc(ts))
    assert.is_true(back <= ts and ts - back <= 3)
  end)

  it("applies time_cycles/time_mask when cap_user_time_short is set", function()
    local c = assert(pe.time_conv { time_zero = 1700000000, time_mult = 349525, time_shift = 20,
                                    cap_user_time_short = true, time_cycles = 0xfffffff0,
                                    time_mask = 0xffffffff })
    assert.are.equal(3131654405, c.to_perf(0x10))
    assert.is_true(c.cap_user_time_short)
  end)

  it("refuses parameters that would divide by zero or shift out", function()
    assert.has_error(function() pe.time_conv { time_mult = 0 } end)
    assert.has_error(function() pe.time_conv { time_mult = 1, time_shift = 64 } end)
  end)

  it("reads the parameters of a live event's page when the kernel offers them", function()
    local ev = assert(pe.open({ type = 1, config = 1, name = "task-clock", exclude_kernel = true }))
    local info = ev:info()
    assert.is_true(info.mapped)
    local c, msg = pe.time_conv(ev)
    local caps = tonumber(info.capabilities)
    if caps % (2 * TIME_ZERO) >= TIME_ZERO then
      assert.is_table(c)
      assert.is_true(c.time_mult > 0)
    else                              -- a VM without a PMU: caps=0x2 (doc/coverage.md D10)
      assert.is_nil(c)
      assert.matches("time_conv%(task%-clock%): .*cap_user_time_zero", msg)
    end
    ev:close()
    assert.has_error(function() pe.time_conv(ev) end, "attempt to use a closed perf_event.event")
  end)
end)

describe("user page on real events", function()
  it("maps the page of self-monitoring counters and says which read path is used", function()
    local ev = assert(pe.open({ type = 1, config = 1, name = "task-clock", exclude_kernel = true }))
    local info = ev:info()
    assert.is_true(info.mapped)
    assert.is_true(info.self)
    local caps = tonumber(info.capabilities)
    if caps % (2 * RDPMC) < RDPMC then            -- a VM without a PMU: no rdpmc (doc/coverage.md D10)
      assert.is_false(info.rdpmc)
      assert.are.equal("read(2): the kernel does not offer rdpmc on this event (cap_user_rdpmc=0)",
                       info.read_path)
    end
    ev:close()
    assert.is_false(ev:info().rdpmc)
  end)

  it("falls back to read(2) for other processes' counters", function()
    local ev = assert(pe.open({ type = 1, config = 1, name = "task-clock", exclude_kernel = true },
                              { pid = 0, cpu = 0 }))
    local info = ev:info()
    assert.is_false(info.self)
    assert.is_false(info.rdpmc)
    assert.are.equal("read(2): not a mapped self-monitoring event (pid=0, cpu=-1)", info.read_path)
    ev:close()
  end)

  it("reads a stopped counter identically through the page path and read_raw", function()
    local ev = assert(pe.open({ type = 1, config = 2, name = "page-faults", exclude_kernel = true }))
    local t = {}
    for i = 1, 1000 do t[i] = i end         -- touch some memory
    assert.are.equal(1000, #t)
    assert(ev:disable())
    local v, e, r = ev:read()
    local raw = ev:read_raw()
    assert.are.equal(raw.value, v)           -- enabled == running: no scaling
    assert.are.equal(raw.time_enabled, e)
    assert.are.equal(raw.time_running, r)
    ev:close()
  end)
end)
