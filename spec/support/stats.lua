-- Statistical checks for the specs, and measured windows taken again when
-- the VM spoiled them.
--
-- A check's tolerance comes from its count: the exact binomial tail (a
-- share of n samples) or Poisson tail (a count of events at a known mean),
-- summed term by term, at false-failure odds of at most S.ODDS (1e-6) per
-- check when the true value lies within the check's stated systematic
-- allowance (what the profiler may legitimately differ by: os.clock against
-- cpu-clock sampling, a sample lost at a window's edge).  Exact tails need no
-- condition on n*p; S.normal_halfwidth (z = 4.9, continuity corrected) is
-- there for comparison and refuses n*p or n*(1-p) under 10.
--
-- S.measure(fn, opts) runs a measured window and takes it again when more
-- than 2 % of it went to the hypervisor (/proc/stat's steal, on the CPU
-- that lost most: cpu-clock counts stolen time, os.clock does not, so steal
-- moves a share point for point) or more than 5 % to waiting on a runqueue
-- (this thread's run delay, /proc/thread-self/schedstat; a window judged on
-- CPU time alone -- cpu-clock samples against os.clock -- passes delay =
-- false: neither clock runs while the thread waits): a spoiled window is
-- named and retaken, never judged with a wider tolerance.
local S = {}

S.ODDS = 1e-6
S.MAX_STEAL = 0.02
S.MAX_DELAY = 0.05
S.TRIES = 4

local exp, log, floor, max, min = math.exp, math.log, math.floor, math.max, math.min
local fmt = string.format
local unpack = rawget(table, "unpack") or rawget(_G, "unpack")

-- log(k!) for k = 0..n, kept between calls
local lfact = { [0] = 0 }
local function logfact(n)
  for i = #lfact + 1, n do lfact[i] = lfact[i - 1] + log(i) end
  return lfact[n]
end

local function check_np(k, n, p)
  assert(type(n) == "number" and n >= 0 and n == floor(n), "stats: n must be a count, got " .. tostring(n))
  assert(type(k) == "number" and k == floor(k), "stats: k must be an integer, got " .. tostring(k))
  assert(type(p) == "number" and p >= 0 and p <= 1, "stats: p must be in [0, 1], got " .. tostring(p))
end

--- P(X = k) for X ~ Binomial(n, p)
function S.binom_pmf(k, n, p)
  check_np(k, n, p)
  if k < 0 or k > n then return 0 end
  if p == 0 then return k == 0 and 1 or 0 end
  if p == 1 then return k == n and 1 or 0 end
  return exp(logfact(n) - logfact(k) - logfact(n - k) + k * log(p) + (n - k) * log(1 - p))
end

-- sum of the pmf from k stepping by dir (+1: up to n, -1: down to 0)
local function binom_sum(k, n, p, dir)
  local term = S.binom_pmf(k, n, p)
  local total, j = term, k
  local r = p / (1 - p)
  while true do
    if dir > 0 then
      if j >= n then break end
      term = term * (n - j) / (j + 1) * r
      j = j + 1
    else
      if j <= 0 then break end
      term = term * j / (n - j + 1) / r
      j = j - 1
    end
    total = total + term
    -- (called from the tail outward: the terms only fall) stop when they no
    -- longer count
    if term <= total * 1e-17 then break end
  end
  return min(1, total)
end

--- P(X <= k), X ~ Binomial(n, p)
function S.binom_cdf(k, n, p)
  check_np(k, n, p)
  if k < 0 then return 0 end
  if k >= n then return 1 end
  if p == 0 then return 1 end
  if p == 1 then return 0 end
  if k > n * p then return 1 - S.binom_sf(k + 1, n, p) end
  return binom_sum(k, n, p, -1)
end

--- P(X >= k), X ~ Binomial(n, p)
function S.binom_sf(k, n, p)
  check_np(k, n, p)
  if k <= 0 then return 1 end
  if k > n then return 0 end
  if p == 0 then return 0 end
  if p == 1 then return 1 end
  if k < n * p then return 1 - S.binom_cdf(k - 1, n, p) end
  return binom_sum(k, n, p, 1)
end

--- P(X = k) for X ~ Poisson(mu)
function S.poisson_pmf(k, mu)
  if k < 0 then return 0 end
  if mu == 0 then return k == 0 and 1 or 0 end
  return exp(k * log(mu) - mu - logfact(k))
end

local function poisson_sum(k, mu, dir)
  local term = S.poisson_pmf(k, mu)
  local total, j = term, k
  while true do
    if dir > 0 then
      term = term * mu / (j + 1)
      j = j + 1
    else
      if j <= 0 then break end
      term = term * j / mu
      j = j - 1
    end
    total = total + term
    if term <= total * 1e-17 then break end
  end
  return min(1, total)
end

--- P(X <= k), X ~ Poisson(mu)
function S.poisson_cdf(k, mu)
  if k < 0 then return 0 end
  if mu == 0 then return 1 end
  if k > mu then return 1 - S.poisson_sf(k + 1, mu) end
  return poisson_sum(k, mu, -1)
end

--- P(X >= k), X ~ Poisson(mu)
function S.poisson_sf(k, mu)
  if k <= 0 then return 1 end
  if mu == 0 then return 0 end
  if k < mu then return 1 - S.poisson_cdf(k - 1, mu) end
  return poisson_sum(k, mu, 1)
end

--- the normal bound's half-width (in counts) for n trials at p, z standard
-- deviations (4.9: two-sided odds 1e-6) with a continuity correction of
-- 0.5; raises when n*p or n*(1-p) is under 10, where it is not valid
function S.normal_halfwidth(n, p, z)
  z = z or 4.9
  if n * p < 10 or n * (1 - p) < 10 then
    error(fmt("stats: the normal bound needs n*p and n*(1-p) >= 10 (n %d, p %.4f)", n, p), 2)
  end
  return z * math.sqrt(n * p * (1 - p)) + 0.5
end

-- the smallest k in [lo, hi] with pred(k) true (pred monotone: false then
-- true), or hi + 1
local function first_true(lo, hi, pred)
  while lo <= hi do
    local mid = floor((lo + hi) / 2)
    if pred(mid) then hi = mid - 1 else lo = mid + 1 end
  end
  return lo
end

--- the counts a Binomial(n, p) stays within at the given odds split over
-- both sides: lo, hi, the fewest with P(X <= lo) > odds/2 and the most with
-- P(X >= hi) > odds/2 (a count outside them is rarer than odds/2 each side)
function S.binom_range(n, p, odds)
  odds = odds or S.ODDS
  local hi = first_true(floor(n * p), n, function(k) return S.binom_sf(k + 1, n, p) <= odds / 2 end)
  local lo = first_true(0, math.ceil(n * p), function(k) return S.binom_cdf(k, n, p) > odds / 2 end)
  return lo, hi
end

local function pct(x) return fmt("%.1f%%", 100 * x) end

local function label(what) return what and (what .. ": ") or "" end

--- k of n samples against an expected share p (0..1) with a systematic
-- allowance `allow` (a share, e.g. 0.03 for 3 points) either side: fails
-- when k is farther from [p - allow, p + allow] than Binomial(n, .) puts it
-- with odds S.ODDS (split over both sides). Returns ok, message.
function S.share(what, k, n, p, allow)
  allow = allow or 0
  assert(n > 0, label(what) .. "no samples to judge a share on")
  local plo, phi = max(0, p - allow), min(1, p + allow)
  local lo = select(1, S.binom_range(n, plo))
  local _, hi = S.binom_range(n, phi)
  local ok = k >= lo and k <= hi
  return ok, fmt("%s%d of %d samples (%s), expected %s +- %.1f points (systematic); with "
    .. "n = %d the exact binomial bound is %d..%d (%s..%s) at false-failure odds %g",
    label(what), k, n, pct(k / n), pct(p), 100 * allow, n, lo, hi, pct(lo / n), pct(hi / n), S.ODDS)
end

--- k of n at least a share p_min (0..1) up to sampling: fails when
-- P(X <= k | n, p_min) < S.ODDS. Returns ok, message.
function S.at_least(what, k, n, p_min)
  if n == 0 then return false, label(what) .. "no samples (n = 0)" end
  local tail = S.binom_cdf(k, n, p_min)
  local lo = first_true(0, n, function(j) return S.binom_cdf(j, n, p_min) >= S.ODDS end)
  return tail >= S.ODDS, fmt("%s%d of %d (%s), expected at least %s; with n = %d the exact binomial "
    .. "bound is >= %d (%s) at false-failure odds %g (P(X <= %d) = %.3g)",
    label(what), k, n, pct(k / n), pct(p_min), n, lo, pct(lo / n), S.ODDS, k, tail)
end

--- k of n at most a share p_max (0..1) up to sampling: fails when
-- P(X >= k | n, p_max) < S.ODDS. Returns ok, message.
function S.at_most(what, k, n, p_max)
  if n == 0 then return true, label(what) .. "no samples (n = 0)" end
  local tail = S.binom_sf(k, n, p_max)
  local hi = first_true(0, n, function(j) return S.binom_sf(j + 1, n, p_max) < S.ODDS end)
  return tail >= S.ODDS, fmt("%s%d of %d (%s), expected at most %s; with n = %d the exact binomial "
    .. "bound is <= %d (%s) at false-failure odds %g (P(X >= %d) = %.3g)",
    label(what), k, n, pct(k / n), pct(p_max), n, hi, pct(hi / n), S.ODDS, k, tail)
end

--- a count k of events due at mean mu at least (1 - allow) of it, up to
-- Poisson sampling: fails when P(X <= k | mu * (1 - allow)) < S.ODDS.
-- Returns ok, message.
function S.count_at_least(what, k, mu, allow)
  allow = allow or 0
  local m = mu * (1 - allow)
  local tail = S.poisson_cdf(k, m)
  local lo = first_true(0, math.ceil(m), function(j) return S.poisson_cdf(j, m) >= S.ODDS end)
  return tail >= S.ODDS, fmt("%s%d counted, %.1f due, at least %.1f allowed (%.0f%% systematic); the "
    .. "exact Poisson bound is >= %d at false-failure odds %g (P(X <= %d) = %.3g)",
    label(what), k, mu, m, 100 * allow, lo, S.ODDS, k, tail)
end

--- a count k of events due at mean mu within a share `allow` of it either
-- way, up to Poisson sampling: fails when P(X <= k | mu * (1 - allow)) or
-- P(X >= k | mu * (1 + allow)) is under S.ODDS / 2. Returns ok, message.
function S.count_near(what, k, mu, allow)
  allow = allow or 0
  local lo_mu, hi_mu = mu * (1 - allow), mu * (1 + allow)
  local lo = first_true(0, math.ceil(lo_mu), function(j) return S.poisson_cdf(j, lo_mu) > S.ODDS / 2 end)
  local hi = first_true(floor(hi_mu), floor(hi_mu + 50 * math.sqrt(hi_mu + 1) + 50),
                        function(j) return S.poisson_sf(j + 1, hi_mu) <= S.ODDS / 2 end)
  return k >= lo and k <= hi, fmt("%s%d counted, %.1f due +- %.0f%% (systematic); the exact Poisson "
    .. "bound is %d..%d at false-failure odds %g", label(what), k, mu, 100 * allow, lo, hi, S.ODDS)
end

--- two counts at rates equal up to a share `allow`: n1 events in t1 (s)
-- and n2 in t2. Given n1 + n2, n1 is binomial with p = t1 r1 / (t1 r1 +
-- t2 r2) (both Poisson: a conservative model of timer-driven samples); fails
-- when n1 lies outside the exact binomial range (odds S.ODDS) of every p
-- with r1 / r2 in [1 - allow, 1 + allow]. Returns ok, message.
function S.rates(what, n1, t1, n2, t2, allow)
  allow = allow or 0
  local n = n1 + n2
  local msg = fmt("%s%d in %.3f s (%.1f/s) against %d in %.3f s (%.1f/s), rates equal +- %.0f%% (systematic)",
    label(what), n1, t1, n1 / t1, n2, t2, n2 / t2, 100 * allow)
  if n == 0 then return false, msg .. "; no events" end
  local plo = t1 * (1 - allow) / (t1 * (1 - allow) + t2)
  local phi = t1 * (1 + allow) / (t1 * (1 + allow) + t2)
  local lo = S.binom_range(n, plo)
  local _, hi = S.binom_range(n, phi)
  return n1 >= lo and n1 <= hi, msg .. fmt("; of their %d, the first may be %d..%d (exact binomial, "
    .. "false-failure odds %g)", n, lo, hi, S.ODDS)
end

--- two shares from two independent samplings, k1 of n1 and k2 of n2, equal
-- up to `allow` (a share): the normal bound at z = 4.9 on the difference
-- (two-sided odds 1e-6), continuity corrected, valid when each n*p and
-- n*(1-p) is >= 10 at the pooled p (else the check is not made: ok, and
-- the message says so). Returns ok, message.
function S.two_shares(what, k1, n1, k2, n2, allow)
  allow = allow or 0
  local p = (k1 + k2) / (n1 + n2)
  local msg = fmt("%s%s of %d against %s of %d, +- %.1f points (systematic)", label(what),
    pct(k1 / n1), n1, pct(k2 / n2), n2, 100 * allow)
  for _, n in ipairs({ n1, n2 }) do
    if n * p < 10 or n * (1 - p) < 10 then
      return true, msg .. fmt("; n*p = %.1f too small for the normal bound: not judged", n * p)
    end
  end
  local sd = math.sqrt(p * (1 - p) * (1 / n1 + 1 / n2))
  local bound = 4.9 * sd + 0.5 / n1 + 0.5 / n2
  local d = math.abs(k1 / n1 - k2 / n2)
  return d <= allow + bound, msg .. fmt("; differ by %.1f points, normal bound (z = 4.9, odds %g) "
    .. "%.1f points + the allowance", 100 * d, S.ODDS, 100 * bound)
end

-- ---------------------------------------------------------------------
-- spoiled windows

local function read_first(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local l = f:read("*l")
  f:close()
  return l
end

--- what the machine and this thread lost so far: { steal = ticks of all
-- CPUs (USER_HZ), total = all ticks, cpus = { {steal, total} per CPU },
-- delay = run delay ns, run = ns on CPU, up = /proc/uptime s }; fields nil
-- when unknown
function S.snapshot()
  local snap = { cpus = {} }
  local f = io.open("/proc/stat", "r")
  if f then
    for l in f:lines() do
      local name = l:match("^(cpu%d*)%s")
      if not name then break end
      local total, steal, i = 0, nil, 0
      for v in l:gmatch("%s(%d+)") do
        i = i + 1
        -- guest and guest_nice (9th, 10th) are already in user and nice
        if i <= 8 then total = total + tonumber(v) end
        if i == 8 then steal = tonumber(v) end
      end
      if name == "cpu" then snap.steal, snap.total = steal, total
      else snap.cpus[name] = { steal = steal, total = total } end
    end
    f:close()
  end
  local l = read_first("/proc/thread-self/schedstat") or read_first("/proc/self/schedstat")
  if l then
    local run, delay = l:match("^(%d+)%s+(%d+)")
    snap.run, snap.delay = tonumber(run), tonumber(delay)
  end
  l = read_first("/proc/uptime")
  snap.up = l and tonumber(l:match("^([%d%.]+)"))
  return snap
end

--- what a window between two snapshots lost: { wall (s), steal (the
-- largest share of one CPU's ticks: a thread on that CPU lost as much),
-- steal_sure (the same, one tick less: what /proc/stat's 10 ms ticks
-- show for sure), steal_ms (all CPUs), delay (share of the window),
-- delay_ms }
function S.lost(a, b)
  local w = {}
  w.wall = (a.up and b.up) and (b.up - a.up) or 0
  if a.steal and b.steal then
    local dt = b.total - a.total
    w.steal_ms = (b.steal - a.steal) * 10
    w.steal = dt > 0 and (b.steal - a.steal) / dt or 0
    -- (steal_sure: what is sure to have been stolen, one 10 ms tick of
    -- /proc/stat's resolution less: in a 0.17 s window one tick is 6 %)
    w.steal_sure = 0
    for name, c in pairs(a.cpus or {}) do
      local d = b.cpus and b.cpus[name]
      if d and d.total > c.total and c.steal and d.steal then
        w.steal = max(w.steal, (d.steal - c.steal) / (d.total - c.total))
        w.steal_sure = max(w.steal_sure, (d.steal - c.steal - 1) / (d.total - c.total))
      end
    end
  end
  if a.delay and b.delay then
    local d, r = (b.delay - a.delay) / 1e9, (b.run - a.run) / 1e9
    w.delay_ms = 1000 * d
    w.wall = max(w.wall, d + r)
    w.delay = w.wall > 0 and d / w.wall or 0
  end
  return w
end

local function describe(w)
  return fmt("%.2f s, steal %s of a CPU (%.0f ms of all CPUs' time), run delay %s (%.0f ms)", w.wall,
    w.steal and pct(w.steal) or "unknown", w.steal_ms or 0, w.delay and pct(w.delay) or "unknown",
    w.delay_ms or 0)
end
S.describe = describe

--- windows retaken so far in this process, each a line naming the window
-- and what spoiled it
S.retakes = {}

--- runs fn(try) as a measured window and returns what it returns, once a
-- window lost at most opts.max_steal (S.MAX_STEAL) of any CPU's time to
-- steal (beyond one 10 ms tick) and at most opts.max_delay (S.MAX_DELAY) of itself to run delay
-- (opts.delay = false: run delay not judged, for a window judged on CPU
-- time alone); a spoiled window is taken again (opts.discard(...) gets its
-- results first, e.g. to close a profile), up to opts.tries (S.TRIES) in
-- all, then the test fails naming each try's steal and delay. opts.what
-- names the window; opts.quiet: no line on stderr for a retake (S.retakes
-- still has it). S.last holds the kept window's losses.
function S.measure(fn, opts)
  opts = opts or {}
  local tries = opts.tries or S.TRIES
  local max_steal, max_delay = opts.max_steal or S.MAX_STEAL, opts.max_delay or S.MAX_DELAY
  local what = opts.what or "a measured window"
  local seen = {}
  for try = 1, tries do
    local a = S.snapshot()
    local r = { n = 0 }
    local function keep(...) r = { n = select("#", ...), ... } end
    keep(fn(try))
    local w = S.lost(a, S.snapshot())
    local spoiled = {}
    if w.steal_sure and w.steal_sure > max_steal then spoiled[#spoiled + 1] = "steal over " .. pct(max_steal) end
    if opts.delay ~= false and w.delay and w.delay > max_delay then
      spoiled[#spoiled + 1] = "run delay over " .. pct(max_delay)
    end
    w.try = try
    if #spoiled == 0 then
      S.last = w
      return unpack(r, 1, r.n)
    end
    local line = fmt("try %d: %s", try, describe(w))
    seen[#seen + 1] = line
    S.retakes[#S.retakes + 1] = what .. ": " .. line
    if not opts.quiet then
      io.stderr:write(fmt("[stats] %s spoiled by %s, taken again: %s\n", what, table.concat(spoiled, " and "), line))
    end
    if opts.discard then opts.discard(unpack(r, 1, r.n)) end
  end
  error(fmt("%s: every one of %d tries lost more than %s of a CPU's time to the hypervisor's "
    .. "steal%s, so none was judged: %s", what, tries, pct(max_steal),
    opts.delay ~= false and fmt(" or more than %s to waiting on a runqueue", pct(max_delay)) or "",
    table.concat(seen, "; ")), 2)
end

return S
