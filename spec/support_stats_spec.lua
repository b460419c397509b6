-- spec/support/stats.lua, the statistical checks' bounds, against values
-- computed exactly (rational arithmetic, Python's fractions and math.comb)
-- and against direct summation of the pmf
local S = require("support.stats")

local function near(want, got, rel)
  assert.is_true(math.abs(got - want) <= (rel or 1e-9) * math.abs(want),
    ("want %.12g, got %.12g"):format(want, got))
end

-- P(X <= k) for Binomial(n, p) by summing C(n, j) p^j (1-p)^(n-j), C by
-- products (small n only)
local function naive_cdf(k, n, p)
  local total = 0
  for j = 0, k do
    local c = 1
    for i = 1, j do c = c * (n - j + i) / i end
    total = total + c * p ^ j * (1 - p) ^ (n - j)
  end
  return total
end

describe("spec/support/stats.lua", function()
  it("binomial tails equal exact values", function()
    near(0.4163708294474814, S.binom_cdf(5, 20, 0.3))
    near(1.3642320780330092e-10, S.binom_sf(600, 1000, 0.5), 1e-7)
    near(0.0107421875, S.binom_sf(9, 10, 0.5))
    near(0.00011488577334117506, S.binom_cdf(150, 10000, 0.02), 1e-7)
    -- the far side of the mean (computed as 1 - the other tail)
    near(1 - 0.4163708294474814, S.binom_sf(6, 20, 0.3))
    for k = 0, 20 do near(naive_cdf(k, 20, 0.3), S.binom_cdf(k, 20, 0.3), 1e-9) end
    -- a sum of the pmf over the whole range is 1
    local total = 0
    for k = 0, 50 do total = total + S.binom_pmf(k, 50, 0.37) end
    near(1, total, 1e-12)
    -- the ends
    assert.equal(1, S.binom_cdf(7, 7, 0.5))
    assert.equal(0, S.binom_sf(8, 7, 0.5))
    assert.equal(1, S.binom_cdf(0, 10, 0))
    assert.equal(0, S.binom_cdf(9, 10, 1))
    -- deep tails underflow to 0 without looping
    assert.is_true(S.binom_sf(99000, 100000, 0.5) < 1e-300)
  end)

  it("Poisson tails equal exact values", function()
    near(0.010336050675925718, S.poisson_cdf(3, 10), 1e-9)
    near(4.6949381426686365e-05, S.poisson_sf(25, 10), 1e-7)
    near(math.exp(-2), S.poisson_cdf(0, 2))
    assert.is_true(S.poisson_sf(5000, 10) < 1e-300)
  end)

  it("the two-sided range holds odds/2 each side, as summed exactly", function()
    for _, c in ipairs({ { 10000, 0.5, 4755, 5245 }, { 500, 0.1, 21, 86 }, { 200, 0.9, 157, 197 } }) do
      local lo, hi = S.binom_range(c[1], c[2])
      assert.same({ c[3], c[4] }, { lo, hi })
    end
    -- the normal bound (z = 4.9) is within a few counts of the exact one
    -- where it is valid, and refuses where it is not
    local w = S.normal_halfwidth(10000, 0.5)
    assert.is_true(math.abs(5000 + w - 5245) <= 2, tostring(w))
    assert.has_error(function() S.normal_halfwidth(100, 0.05) end)
  end)

  it("share, at_least, at_most and count_at_least judge at 1e-6 and say n, the values, the bound", function()
    local ok, msg = S.share("f", 500, 1000, 0.5, 0.03)
    assert.is_true(ok, msg)
    ok, msg = S.share("f", 700, 1000, 0.5, 0.03)
    assert.is_false(ok)
    for _, want in ipairs({ "f: 700 of 1000 samples", "70.0%%", "50.0%%", "3.0 points", "n = 1000",
                            "binomial bound", "1e%-06" }) do
      assert.matches(want, msg)
    end
    -- the allowance widens the range by its own width exactly
    local _, hi = S.binom_range(1000, 0.53)
    assert.is_true(S.share(nil, hi, 1000, 0.5, 0.03))
    assert.is_false(S.share(nil, hi + 1, 1000, 0.5, 0.03))
    -- at_least: the first count with P(X <= k | 100, 0.9) >= 1e-6 is 73
    assert.is_true(S.at_least("hits", 73, 100, 0.9))
    ok, msg = S.at_least("hits", 72, 100, 0.9)
    assert.is_false(ok)
    assert.matches("hits: 72 of 100 %(72.0%%%), expected at least 90.0%%.*>= 73", msg)
    assert.is_false(S.at_least("none", 0, 0, 0.5))
    -- at_most mirrors at_least
    assert.is_true(S.at_most("x", 27, 100, 0.1))
    assert.is_false(S.at_most("x", 28, 100, 0.1))
    assert.equal(S.binom_sf(28, 100, 0.1) < 1e-6, true)
    -- a Poisson count: P(X <= 3 | 10) = 0.0103 passes; P(X <= 15 | 50) = 6.4e-9 fails
    assert.is_true(S.count_at_least("n", 3, 10))
    ok, msg = S.count_at_least("n", 15, 100, 0.5)
    assert.is_false(ok)
    assert.matches("n: 15 counted, 100.0 due, at least 50.0 allowed", msg)
    -- two-sided counts: Poisson(100) stays within 55..153 at 1e-6 (each side
    -- summed exactly: P(X <= 54) = 3.4e-7, P(X >= 154) = 3.3e-7)
    assert.is_true(S.count_near("c", 55, 100))
    assert.is_true(S.count_near("c", 153, 100))
    assert.is_false(S.count_near("c", 54, 100))
    assert.is_false(S.count_near("c", 154, 100))
    ok, msg = S.count_near("c", 200, 100, 0.33)
    assert.is_false(ok)
    assert.matches("c: 200 counted, 100.0 due %+%- 33%% %(systematic%); the exact Poisson bound is", msg)
    -- two rates: equal time, no allowance: the range of Binomial(n, 1/2)
    local lo, top = S.binom_range(200, 0.5)
    assert.is_true(S.rates("r", lo, 1, 200 - lo, 1))
    assert.is_false(S.rates("r", lo - 1, 1, 201 - lo, 1))
    assert.is_true(S.rates("r", top, 1, 200 - top, 1))
    -- twice the time, twice the count; 15 % apart passes with 15 % allowed
    assert.is_true(S.rates("r", 400, 2, 200, 1))
    ok, msg = S.rates("r", 460, 2, 200, 1, 0.15)
    assert.is_true(ok, msg)
    assert.matches("r: 460 in 2.000 s %(230.0/s%) against 200 in 1.000 s", msg)
    assert.is_false(S.rates("r", 800, 2, 200, 1, 0.15))
    -- two samplings: equal shares pass, far apart fail
    assert.is_true(S.two_shares("g", 300, 1000, 150, 500, 0.02))
    assert.is_false(S.two_shares("g", 300, 1000, 250, 500, 0.02))
  end)

  it("measure returns the window's results, retakes a spoiled one and names every try", function()
    local a, b = S.measure(function(try) return "r" .. try, 2 end, { max_steal = 1, max_delay = 1 })
    assert.same({ "r1", 2 }, { a, b })
    assert.is_number(S.last.wall)
    -- a limit no window meets: each try taken, discarded, then a failure
    local discarded, tries, retakes = 0, 0, #S.retakes
    local ok, err = pcall(S.measure, function(try) tries = try return try end,
      { max_steal = -1, tries = 3, what = "the window", quiet = true,
        discard = function() discarded = discarded + 1 end })
    assert.is_false(ok)
    assert.equal(3, tries)
    assert.equal(3, discarded)
    assert.equal(retakes + 3, #S.retakes)
    assert.matches("^the window: try 3: ", S.retakes[#S.retakes])
    assert.matches("the window: every one of 3 tries lost more than %-100.0%% of a CPU's time", err)
    assert.matches("try 1: .* steal .*run delay .*; try 2: .*; try 3: ", err)
    -- what a window lost, from two snapshots
    local w = S.lost({ steal = 10, total = 1000, delay = 0, run = 0, up = 5 },
                     { steal = 20, total = 1100, delay = 1e8, run = 9e8, up = 6 })
    near(0.1, w.steal)
    -- the CPU that lost most: 9 of 50 ticks (the machine: 10 of 100)
    w = S.lost({ steal = 10, total = 1000,
                 cpus = { cpu0 = { steal = 5, total = 500 }, cpu1 = { steal = 5, total = 500 } } },
               { steal = 20, total = 1100,
                 cpus = { cpu0 = { steal = 14, total = 550 }, cpu1 = { steal = 6, total = 550 } } })
    near(0.18, w.steal)
    near(0.16, w.steal_sure)   -- (8 of 50: one tick is /proc/stat's resolution)
    -- a short window: one tick of 17 is 6 % of it, and nothing for sure
    w = S.lost({ steal = 0, total = 0, cpus = { cpu0 = { steal = 0, total = 0 } } },
               { steal = 1, total = 17, cpus = { cpu0 = { steal = 1, total = 17 } } })
    near(1 / 17, w.steal)
    near(0, w.steal_sure)
    -- a live snapshot names this machine's CPUs
    local snap = S.snapshot()
    assert.is_number(snap.total)
    assert.is_table(snap.cpus.cpu0)
    w = S.lost({ steal = 10, total = 1000, delay = 0, run = 0, up = 5 },
               { steal = 20, total = 1100, delay = 1e8, run = 9e8, up = 6 })
    assert.equal(100, w.steal_ms)
    near(0.1, w.delay)
    near(100, w.delay_ms)
  end)
end)
