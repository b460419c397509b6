-- Opt-in (`make test-sysctl`, as root): specs that write a kernel-wide
-- sysctl.  They are outside `make test` (this file does not match busted's
-- "_spec" pattern): a write to /proc/sys/kernel/* changes every other perf
-- user on the machine while it lasts, including a second `make test`.
-- Each value written is restored, and the spec checks that it was.
local pe = require("perf_event")
local rb = require("support.rb_build")
local U = require("support.util")

local RATE = "/proc/sys/kernel/perf_event_max_sample_rate"

local function read1(file)
  local f = assert(io.open(file))
  local s = f:read("*l")
  f:close()
  return s
end

local function write1(file, v)
  local w = assert(io.open(file, "w"))
  w:write(v)
  w:close()
end

describe("sysctl (opt-in)", function()
  it("THROTTLE/UNTHROTTLE when the rate passes perf_event_max_sample_rate (restored)", function()
    U.need_root("writes " .. RATE)
    local saved = read1(RATE)
    local ok, err = pcall(function()
      write1(RATE, "1000")
      assert.equal("1000", read1(RATE))
      -- 100 kHz of cpu-clock against a 1000/s limit: throttled every tick
      local ev = assert(pe.open({ type = "software", config = 0, sample_period = 10000,
        sample_type = "tid|time|id", sample_id_all = true, disabled = true,
        exclude_kernel = false, name = "cpu-clock" }, { pages = 64 }))
      assert(ev:enable())
      rb.spin(150)
      assert(ev:disable())
      local th, un = 0, 0
      for rec in ev:records() do
        if rec.type == "throttle" then th = th + 1; assert.equal(ev:id(), rec.id) end
        if rec.type == "unthrottle" then un = un + 1; assert.equal(ev:id(), rec.id) end
      end
      ev:close()
      assert.is_true(th >= 1, "no THROTTLE record")
      assert.is_true(un >= 1, "no UNTHROTTLE record")
    end)
    write1(RATE, saved)
    assert.equal(saved, read1(RATE))
    assert(ok, err)
  end)
end)
