-- pe.profile.start's options, under the rule of the rest of the API
-- (doc/errors.md): a caller's mistake raises at the caller's line, naming the
-- option; what the kernel refuses comes back as nil, err. Each bad value is
-- checked for its exact message, for the position (this file's line), and
-- for leaving nothing open behind it.
local pe = require("perf_event")
local fs = require("perf_event.fs")
local stats = require("support.stats")

local SPEC = "profile_opts_spec.lua"

-- the open file descriptors of this process
local function nfds() return #fs.list("/proc/self/fd") end

-- start(opts) must raise from this file's line that called it; returns the
-- message without the position
local function raises(opts)
  local line
  local ok, err = pcall(function()
    line = debug.getinfo(1, "l").currentline + 1
    local p = pe.profile.start(opts)
    if p then p:stop() end      -- reached only when start did not raise
  end)
  assert.is_false(ok, "start did not raise")
  assert.are.equal("string", type(err))
  local where = SPEC .. ":" .. line .. ": "
  local at = err:find(where, 1, true)
  assert.truthy(at, "not raised at " .. where .. " but: " .. err)
  return err:sub(at + #where)
end

local P = "profile.start: "

describe("pe.profile.start's options", function()
  local fds0
  before_each(function() fds0 = nfds() end)
  after_each(function()
    -- no bad option leaves an event (or a map, a hook) behind
    assert.are.equal(fds0, nfds())
    assert.is_nil(debug.gethook())
  end)

  it("opts must be a table (or nothing)", function()
    assert.are.equal(P .. "opts must be a table, got string", raises("freq=99"))
    assert.are.equal(P .. "opts must be a table, got number", raises(999))
    assert.are.equal(P .. "opts must be a table, got boolean", raises(true))
  end)

  it("a rate that is not a positive integer raises, naming the option", function()
    for _, name in ipairs({ "freq", "period" }) do
      local o = P .. "option '" .. name .. "' "
      assert.are.equal(o .. "must be a positive integer, got 0", raises({ [name] = 0 }))
      assert.are.equal(o .. "must be a positive integer, got -5", raises({ [name] = -5 }))
      assert.are.equal(o .. "must be a positive integer, got 1.5", raises({ [name] = 1.5 }))
      assert.are.equal(o .. "must be a positive integer, got " .. tostring(1 / 0), raises({ [name] = 1 / 0 }))
      assert.are.equal(o .. "must be a positive integer below 2^63, got " .. tostring(1e30), raises({ [name] = 1e30 }))
      assert.are.equal(o .. "must be a number, got string", raises({ [name] = "fast" }))
      assert.are.equal(o .. "must be a number, got boolean", raises({ [name] = true }))
    end
    -- NaN: its text differs between interpreters (nan, -nan)
    local nan = raises({ freq = 0 / 0 })
    assert.truthy(nan:find("^" .. P .. "option 'freq' must be a positive integer, got %-?nan$"), nan)
  end)

  it("freq and period together raise", function()
    assert.are.equal(P .. "options 'freq' and 'period' exclude each other (a rate, or a count of events per sample)",
                     raises({ freq = 99, period = 1000000 }))
  end)

  it("sizes and counts: pages a power of two, stack 0 or more, the hook's within csrc/puc/hook.c's ranges", function()
    local function o(name, rest) return P .. "option '" .. name .. "' " .. rest end
    assert.are.equal(o("pages", "must be a power of two, got 3"), raises({ pages = 3 }))
    assert.are.equal(o("pages", "must be a power of two, got 0"), raises({ pages = 0 }))
    assert.are.equal(o("pages", "must be a power of two, got 12"), raises({ pages = 12 }))
    assert.are.equal(o("pages", "must be a number, got boolean"), raises({ pages = false }))
    assert.are.equal(o("stack", "must be 0 or a positive integer, got -8"), raises({ stack = -8 }))
    assert.are.equal(o("stack", "must be 0 or a positive integer, got 8.5"), raises({ stack = 8.5 }))
    assert.are.equal(o("hook_count", "must be an integer in 1..1000000000, got 0"), raises({ hook_count = 0 }))
    assert.are.equal(o("hook_slots", "must be an integer in 16..1048576, got 8"), raises({ hook_slots = 8 }))
    assert.are.equal(o("depth", "must be an integer in 1..1024, got 1025"), raises({ depth = 1025 }))
    assert.are.equal(o("depth", "must be a number, got string"), raises({ depth = "64" }))
  end)

  it("a value of the wrong type raises, naming the option and both types", function()
    local cases = {
      { "stacks", "no", "boolean", "string" }, { "lua", 0, "boolean", "number" },
      { "perfmap", 1, "boolean", "number" }, { "keep", "false", "boolean", "string" },
      { "event", 5, "string", "number" }, { "event", { "cpu-clock" }, "string", "table" },
      { "hook", true, "string", "boolean" }, { "sigtrap", 1, "boolean", "number" },
      { "kernel", "no", "boolean", "string" },
    }
    for _, c in ipairs(cases) do
      assert.are.equal(("%soption '%s' must be a %s, got %s"):format(P, c[1], c[3], c[4]), raises({ [c[1]] = c[2] }))
    end
    assert.are.equal(P .. [[option 'hook' must be "signal" or "count", got often]], raises({ hook = "often" }))
    assert.are.equal(P .. [[option 'lj_mode' must be "l" or "f", got i]], raises({ lj_mode = "i" }))
  end)

  it("walk=\"signal\" raises, naming the option and the safe point as LuaJIT's one stack sampler", function()
    local want = P .. [[option 'walk' must be "safepoint" (the safe point is LuaJIT's one stack sampler: ]]
                 .. [[the signal-time walk, "signal", is gone), got ]]
    assert.are.equal(want .. "signal", raises({ walk = "signal" }))
    assert.are.equal(want .. "signal", raises({ freq = 999, walk = "signal", perfmap = true }))
    assert.are.equal(want .. "full", raises({ walk = "full" }))
    assert.are.equal(P .. "option 'walk' must be a string, got boolean", raises({ walk = false }))
  end)

  it("an unknown option raises, with the close known name when there is one", function()
    local function unknown(name, near)
      return P .. "unknown option '" .. name .. "' (did you mean '" .. near .. "'?)"
    end
    assert.are.equal(unknown("frequency", "freq"), raises({ frequency = 999 }))
    assert.are.equal(unknown("evnt", "event"), raises({ evnt = "cpu-clock" }))
    assert.are.equal(unknown("perod", "period"), raises({ perod = 1e6 }))
    assert.are.equal(unknown("Freq", "freq"), raises({ Freq = 999 }))
    assert.are.equal(unknown("pagesize", "pages"), raises({ pagesize = 8 }))
    assert.are.equal(unknown("hook_cont", "hook_count"), raises({ hook_cont = 10 }))
    -- a valid value does not excuse a wrong name
    assert.are.equal(unknown("stak", "stack"), raises({ freq = 99, stak = 0 }))
    local all = "block, depth, event, freq, hook, hook_count, hook_leaf, hook_slots, keep, kernel, lj_mode, lua, "
                .. "pages, perfmap, period, sigtrap, stack, stacks, walk"
    assert.are.equal(P .. "unknown option 'bogus' (options: " .. all .. ")", raises({ bogus = 1 }))
    assert.are.equal(P .. "unknown option '1' (options: " .. all .. ")", raises({ "cpu-clock" }))
  end)

  -- user-space work for `secs` of CPU time by os.clock (os.clock's own
  -- calls run in the kernel); returns the time taken
  local function burn(secs)
    local t0, s = os.clock(), 0
    repeat
      for i = 1, 100000 do s = s + i % 7 end
    until os.clock() - t0 >= secs
    return os.clock() - t0, s
  end

  it("every valid option is taken: the profile samples at the rate asked", function()
    -- on LuaJIT the hook options are accepted and unused, as stack is everywhere
    -- (each window taken again when steal spoiled it: task-clock and
    -- cpu-clock count stolen time, os.clock does not)
    local p, cpu = stats.measure(function()
      local p = assert(pe.profile.start({ event = "task-clock", freq = 499.0, pages = 64, stack = 512, stacks = false,
                                          lua = true, perfmap = false, keep = true, hook = "count", hook_count = 1000,
                                          hook_slots = 64, depth = 8, walk = "safepoint" }))
      local cpu = burn(0.2)
      p:stop()
      return p, cpu
    end, { what = "the 499 Hz window", delay = false })
    assert.are.equal("task-clock", p.event)
    assert.are.equal(499, p.freq)
    -- the samples against os.clock's CPU time at 499 Hz, within a third
    -- (frequency mode's start, the window's edges) and the Poisson bound (the
    -- ring holds them all)
    assert.are.equal(0, p.lost)
    assert.is_true(stats.count_near("samples at 499 Hz", p.nsamples, cpu * 499, 0.33))
    local q
    q, cpu = stats.measure(function()
      local r = assert(pe.profile.start({ period = 4000000, lua = false }))   -- every 4 ms of cpu-clock
      local c = burn(0.2)
      r:stop()
      return r, c
    end, { what = "the 4 ms period window", delay = false })
    assert.are.equal(4000000, q.period)
    assert.is_nil(q.freq)
    assert.is_true(stats.count_near("samples every 4 ms", q.nsamples, cpu * 250, 0.33))
  end)

  it("what the kernel refuses stays nil, err (not raised)", function()
    -- above perf_event_max_sample_rate (100000 here at most)
    local p, err = pe.profile.start({ freq = 1000000000, lua = false })
    assert.is_nil(p)
    assert.truthy(err:find("EINVAL", 1, true), err)
    -- an event the machine does not have
    p, err = pe.profile.start({ event = "no-such-event-here", lua = false })
    assert.is_nil(p)
    assert.are.equal("string", type(err))
  end)
end)
