-- attr encoding (doc/coverage.md B): every field lands at its offset, every flag
-- on its bit, bit names resolve, 64-bit values stay exact, mistakes raise.
local core = require("perf_event.core")
local U = require("support.util")

local function enc(t) return core.attr_encode(t) end

-- the flag word's bits as the kernel header numbers them (B19-B24)
local FLAGS = {
  "disabled", "inherit", "pinned", "exclusive", "exclude_user", "exclude_kernel",
  "exclude_hv", "exclude_idle", "mmap", "comm", "freq", "inherit_stat", "enable_on_exec",
  "task", "watermark", false, false, "mmap_data", "sample_id_all", "exclude_host",
  "exclude_guest", "exclude_callchain_kernel", "exclude_callchain_user", "mmap2",
  "comm_exec", "use_clockid", "context_switch", "write_backward", "namespaces", "ksymbol",
  "bpf_event", "aux_output", "cgroup", "text_poke", "build_id", "inherit_thread",
  "remove_on_exec", "sigtrap",
}

local function pow2hex(bit)
  return ("%x"):format(2 ^ (bit % 4)) .. ("0"):rep(math.floor(bit / 4))
end

describe("attr layout", function()
  it("is 136 bytes with size filled in", function()
    local s = enc({ type = 1, config = 1 })
    assert.equal(136, #s)
    assert.equal(136, core.ATTR_SIZE)
    assert.equal("88", U.hex_at(s, 4, 4))   -- 136
  end)

  for bit, name in ipairs(FLAGS) do
    if name then
      it(("puts %s on flag bit %d"):format(name, bit - 1), function()
        local s = enc({ [name] = true })
        assert.equal(pow2hex(bit - 1), U.hex_at(s, 40, 8))
        assert.equal("0", U.hex_at(enc({ [name] = false }), 40, 8))
      end)
    end
  end

  it("puts precise_ip on bits 15-16", function()
    assert.equal("18000", U.hex_at(enc({ precise_ip = 3 }), 40, 8))
    assert.equal("10000", U.hex_at(enc({ precise_ip = 2 }), 40, 8))
    assert.has_error(function() enc({ precise_ip = 4 }) end)
  end)

  local offsets = {
    { "config", 8, 8 }, { "sample_period", 16, 8 }, { "sample_type", 24, 8 },
    { "read_format", 32, 8 }, { "wakeup_events", 48, 4 }, { "bp_type", 52, 4 },
    { "config1", 56, 8 }, { "bp_addr", 56, 8 }, { "config2", 64, 8 }, { "bp_len", 64, 8 },
    { "kprobe_addr", 64, 8 }, { "probe_offset", 64, 8 },
    { "branch_sample_type", 72, 8 }, { "sample_regs_user", 80, 8 },
    { "sample_stack_user", 88, 4 }, { "clockid", 92, 4 }, { "sample_regs_intr", 96, 8 },
    { "aux_watermark", 104, 4 }, { "sample_max_stack", 108, 2 }, { "aux_sample_size", 112, 4 },
    { "aux_action", 116, 4 }, { "sig_data", 120, 8 }, { "config3", 128, 8 },
  }
  for _, o in ipairs(offsets) do
    it(("puts %s at offset %d"):format(o[1], o[2]), function()
      local s = enc({ [o[1]] = 5 })
      assert.equal("5", U.hex_at(s, o[2], o[3]))
      -- and nothing else moved: the rest of the struct is the empty encoding
      local empty = enc({})
      assert.equal(empty:sub(1, o[2]), s:sub(1, o[2]))
      assert.equal(empty:sub(o[2] + o[3] + 1), s:sub(o[2] + o[3] + 1))
    end)
  end

  it("sample_freq shares the period slot and sets freq", function()
    local s = enc({ sample_freq = 4000 })
    assert.equal("fa0", U.hex_at(s, 16, 8))
    assert.equal(pow2hex(10), U.hex_at(s, 40, 8))
  end)

  it("wakeup_watermark shares the wakeup slot and sets watermark", function()
    local s = enc({ wakeup_watermark = 4096 })
    assert.equal("1000", U.hex_at(s, 48, 4))
    assert.equal(pow2hex(14), U.hex_at(s, 40, 8))
  end)

  it("aux_start_paused / aux_pause / aux_resume are aux_action bits 0-2", function()
    assert.equal("1", U.hex_at(enc({ aux_start_paused = true }), 116, 4))
    assert.equal("6", U.hex_at(enc({ aux_pause = true, aux_resume = true }), 116, 4))
  end)
end)

describe("names", function()
  it("resolves type names and PMU names from sysfs", function()
    assert.equal("0", U.hex_at(enc({ type = "hardware" }), 0, 4))
    assert.equal("1", U.hex_at(enc({ type = "software" }), 0, 4))
    assert.equal("2", U.hex_at(enc({ type = "tracepoint" }), 0, 4))
    assert.equal("3", U.hex_at(enc({ type = "hw_cache" }), 0, 4))
    assert.equal("4", U.hex_at(enc({ type = "raw" }), 0, 4))
    assert.equal("5", U.hex_at(enc({ type = "breakpoint" }), 0, 4))
    local f = io.open("/sys/bus/event_source/devices/msr/type")
    if f then
      local t = tonumber(f:read("*l"))
      f:close()
      assert.equal(("%x"):format(t), U.hex_at(enc({ type = "msr" }), 0, 4))
    end
  end)

  it("accepts sample_type as a number, a name list or an 'a|b' string", function()
    local want = U.hex_at(enc({ sample_type = 1 + 2 + 4 + 32 }), 24, 8)
    assert.equal(want, U.hex_at(enc({ sample_type = { "ip", "tid", "time", "callchain" } }), 24, 8))
    assert.equal(want, U.hex_at(enc({ sample_type = "ip|tid|time|callchain" }), 24, 8))
    assert.equal(want, U.hex_at(enc({ sample_type = "IP | PERF_SAMPLE_TID|time|callchain" }), 24, 8))
    assert.equal("1000000", U.hex_at(enc({ sample_type = "weight_struct" }), 24, 8))
  end)

  it("names every read_format and branch_sample_type bit", function()
    assert.equal("1f", U.hex_at(enc({ read_format = "total_time_enabled|total_time_running|id|group|lost" }), 32, 8))
    assert.equal("20008", U.hex_at(enc({ branch_sample_type = "any|hw_index" }), 72, 8))
    assert.equal("80000", U.hex_at(enc({ branch_sample_type = { "counters" } }), 72, 8))
  end)

  it("lists the valid names when one is unknown", function()
    local ok, err = pcall(enc, { sample_type = "ip|bogus" })
    assert.is_false(ok)
    assert.matches("unknown sample_type name 'bogus'", err, 1, true)
    assert.matches("callchain", err, 1, true)
  end)

  it("core.bits resolves and lists names", function()
    assert.equal(2 + 4, core.bits("sample_type", "tid|time"))
    assert.equal(8, core.bits("read_format").group)
  end)

  it("bp_type takes r/w/x letters, clockid takes clock names", function()
    assert.equal("3", U.hex_at(enc({ bp_type = "rw" }), 52, 4))
    assert.equal("4", U.hex_at(enc({ bp_type = "x" }), 52, 4))
    assert.equal("1", U.hex_at(enc({ clockid = "monotonic" }), 92, 4))
    assert.equal("4", U.hex_at(enc({ clockid = "CLOCK_MONOTONIC_RAW" }), 92, 4))
    assert.equal("b", U.hex_at(enc({ clockid = "tai" }), 92, 4))
  end)
end)

describe("64-bit values", function()
  it("keeps all 64 bits of a hex string", function()
    local s = enc({ config = "0xffffffffffffffff", config1 = "0x8000000000000001" })
    assert.equal("ffffffffffffffff", U.hex_at(s, 8, 8))
    assert.equal("8000000000000001", U.hex_at(s, 56, 8))
  end)

  it("keeps decimal strings exact", function()
    assert.equal("ffffffffffffffff", U.hex_at(enc({ config = "18446744073709551615" }), 8, 8))
  end)

  it("takes 2^63 as a number exactly", function()
    assert.equal("8000000000000000", U.hex_at(enc({ config = 2 ^ 63 }), 8, 8))
  end)

  it("takes native 64-bit values: LuaJIT cdata, 5.3+ integers", function()
    if jit then
      local v = assert(load("return 0xffffffffffffff01ULL"))()
      assert.equal("ffffffffffffff01", U.hex_at(enc({ config = v }), 8, 8))
      local i = assert(load("return -2LL"))()
      assert.equal("fffffffffffffffe", U.hex_at(enc({ config = i }), 8, 8))
    elseif rawget(math, "type") then
      local v = assert(load("return 0x8000000000000003"))()   -- wraps to an integer
      assert.equal("8000000000000003", U.hex_at(enc({ config = v }), 8, 8))
    else
      pending("Lua 5.1 has no native 64-bit type: strings carry such values")
    end
  end)

  it("round-trips through the core: the value returned equals the value given", function()
    local s = enc({ config = "0xfedcba9876543210" })
    local t = core.attr_decode(s)
    assert.equal("fedcba9876543210", U.hex(t.config))
    assert.equal(s, enc(t))
  end)

  it("refuses fractions, NaN, out-of-range and non-integer strings", function()
    for _, bad in ipairs({ 1.5, 0 / 0, 2 ^ 64, "0x1g", "12abc", "", "1\0" }) do
      assert.has_error(function() enc({ config = bad }) end)
    end
    assert.has_error(function() enc({ config = {} }) end)
  end)
end)

describe("mistakes", function()
  it("an unknown field raises naming it", function()
    local ok, err = pcall(enc, { cnofig = 1 })
    assert.is_false(ok)
    assert.matches("unknown attr field 'cnofig'", err, 1, true)
  end)
  it("fields sharing storage may not both be given", function()
    assert.has_error(function() enc({ sample_period = 1, sample_freq = 2 }) end)
    assert.has_error(function() enc({ bp_addr = 1, config1 = 2 }) end)
    assert.has_error(function() enc({ wakeup_events = 1, wakeup_watermark = 2 }) end)
    assert.has_error(function() enc({ aux_action = 1, aux_pause = true }) end)
  end)
  it("contradictions raise", function()
    assert.has_error(function() enc({ sample_freq = 10, freq = false }) end)
  end)
  it("out-of-range narrow fields raise", function()
    assert.has_error(function() enc({ sample_max_stack = 65536 }) end)
    assert.has_error(function() enc({ bp_type = 2 ^ 32 }) end)
    assert.has_error(function() enc({ clockid = "jiffies" }) end)
  end)
  it("a non-string key raises", function()
    assert.has_error(function() enc({ 1, 2 }) end)
  end)
end)
