-- pe.profile samples the time the kernel spends for the thread (system
-- calls, page faults) where the kernel lets it (root, CAP_PERFMON,
-- perf_event_paranoid <= 1), as os.clock counts it; kernel=false, and a
-- user the kernel refuses, get user time only, and the profile says so.
local pe = require("perf_event")
local U = require("support.util")
local S = require("support.stats")
local petest = require("petest")

-- page faults: more than half of it the kernel's time (a page zeroed at
-- each first touch); returns os.clock's CPU time
local function faults(secs)
  local t0 = os.clock()
  repeat petest.touch_pages(256) until os.clock() - t0 >= secs
  return os.clock() - t0
end

-- a profile of faults(0.3); a window spoiled by steal is taken again
-- (cpu-clock counts stolen time, os.clock does not)
local function window(opts)
  return S.measure(function()
    local p = assert(pe.profile.start(opts))
    local ok, cpu = pcall(faults, 0.3)
    p:stop()
    if not ok then error(cpu, 0) end
    return p, cpu
  end, { what = "the page-fault window", delay = false })
end

-- the samples whose leaf frame is the kernel, and all of them
local function kernel_leaves(p)
  local k, n = 0, 0
  for _, e in ipairs(p:aggregate()) do
    n = n + e.count
    if e.frames[#e.frames].c == "[kernel]" then k = k + e.count end
  end
  return k, n
end

describe("pe.profile and the kernel's time for the thread", function()
  it("is sampled where allowed: a page-fault loop gets os.clock's count of samples", function()
    U.need_kernel()
    local p, cpu = window({ freq = 999 })
    assert.is_true(p.kernel)
    assert.is_nil(p.kernel_reason)
    assert.are.equal(0, p.lost)
    -- (a clock's frequency is a fixed period: 1001 us of the thread's time)
    assert.is_true(S.count_near("samples at 999 Hz", p.nsamples, cpu * 999, 0.1))
  end)

  it("C leaf frames: a sample in the kernel is [kernel]; kernel=false samples user time alone", function()
    U.need_kernel()
    local all, cpu1 = window({ freq = 999, lua = false })
    local user, cpu2 = window({ freq = 999, lua = false, kernel = false })
    assert.is_true(all.kernel)
    -- (kernel=true where allowed is the default's profile)
    local k = assert(pe.profile.start({ lua = false, kernel = true }))
    k:stop()
    assert.is_true(k.kernel)
    assert.is_false(user.kernel)
    assert.are.equal("kernel=false", user.kernel_reason)
    local k1, n1 = kernel_leaves(all)
    local k2, n2 = kernel_leaves(user)
    -- the kernel leaves out of a user-only profile every sample it takes
    -- in its own code
    assert.are.equal(0, k2)
    assert.is_true(k1 > 0, "no [kernel] leaf in " .. n1 .. " samples")
    -- the default profile's user samples come at kernel=false's rate
    assert.is_true(S.rates("user samples", n1 - k1, cpu1, n2, cpu2, 0.15))
  end)

  it("a user the kernel refuses gets user time only, and p.kernel_reason says why", function()
    U.need(U.paranoid() >= 2, "perf_event_paranoid is below 2: any user may sample the kernel here")
    -- (and kernel=true is the kernel's refusal, not a fallback)
    local code = "local pf = require('perf_event').profile local p = assert(pf.start({ lua = false })) p:stop() "
                 .. "print(p.kernel, p.kernel_reason) print(pf.start({ lua = false, kernel = true }))"
    local out
    if U.is_root() then
      U.need(jit ~= nil, "the luajit suite checks it (the same Lua on every interpreter)")
      out = U.luajit_as_nobody(code)
    else
      local p = assert(pe.profile.start({ lua = false }))
      p:stop()
      local q, err = pe.profile.start({ lua = false, kernel = true })
      out = tostring(p.kernel) .. "\t" .. tostring(p.kernel_reason) .. "\n" .. tostring(q) .. "\t" .. tostring(err)
    end
    assert.truthy(out:find("^false\tthe kernel refused", 1), out)
    assert.truthy(out:find("perf_event_paranoid", 1, true), out)
    assert.truthy(out:find("\nnil\t[^\n]*EACCES", 1), out)
  end)
end)
