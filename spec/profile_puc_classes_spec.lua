-- pe.profile on PUC Lua (5.1, 5.4), each workload class with the Lua's
-- default hook kind: the inclusive share of 2-3 top-level functions (the
-- samples whose stack holds the function) against the CPU time os.clock
-- measured around their calls in the same process, within 5 points. No
-- hook is involved in the reference. While the thread runs Lua, fewer
-- than 2 % of the samples may lack a Lua frame.
local pe = require("perf_event")
local stats = require("support.stats")

local jit = rawget(_G, "jit")
local clock = os.clock
local format, upper, gsub, rep = string.format, string.upper, string.gsub, string.rep
local sort, concat = table.sort, table.concat
local cocreate, coresume, costatus, coyield = coroutine.create, coroutine.resume, coroutine.status,
  coroutine.yield
local setmetatable, pcall, error = setmetatable, pcall, error

local FREQ = 2999
local SECONDS = 0.15           -- of the cases' CPU time per class (~450 samples due)
-- what a case's share of the samples may differ from its share of os.clock
-- beside sampling error (os.clock's reads around each call, the call
-- boundaries a sample falls either side of), a share
local SYS = 0.02

-- plain Lua work: a loop body of arithmetic
local function cls_loop(n)
  local s = 0
  for i = 1, n do s = s + (i % 7) * 3 end
  return s
end

-- the same, for use under other cases (a share is inclusive: cls_loop must
-- not run inside another case)
local function inner_loop(n)
  local s = 0
  for i = 1, n do s = s + (i % 7) * 3 end
  return s
end

-- string builtins without callbacks
local function cls_format(n)
  local t = 0
  for i = 1, n do t = t + #format("%d:%s:%5.2f", i, "abc", i / 3) end
  return t
end
local UP = rep("abcdefgh", 64)
local function cls_upper(n)
  local t = 0
  for _ = 1, n do t = t + #upper(UP) end
  return t
end

-- string.gsub calling a Lua function
local GS = rep("alpha beta gamma delta ", 20)
local function gs_cb(w) return #w > 4 and w or nil end
local function cls_gsub(n)
  local t = 0
  for _ = 1, n do t = t + #gsub(GS, "%a+", gs_cb) end
  return t
end

-- table.sort with a Lua comparator
local function sort_cmp(a, b) return a > b end
local function cls_sort(n)
  local t = {}
  for _ = 1, n do
    for i = 1, 200 do t[i] = (i * 7919) % 211 end
    sort(t, sort_cmp)
  end
  return t[1]
end

-- metamethods: an __index function, __add
local IDX = setmetatable({}, { __index = function(_, k) return k * 2 end })
local function cls_index(n)
  local s = 0
  for i = 1, n do s = s + IDX[i] end
  return s
end
local VMT = {}
VMT.__add = function(a, b) return setmetatable({ v = a.v + b.v }, VMT) end
local function cls_add(n)
  local a, one = setmetatable({ v = 0 }, VMT), setmetatable({ v = 1 }, VMT)
  for _ = 1, n do a = a + one end
  return a.v
end

-- allocation and GC
local function cls_alloc(n)
  local keep
  for i = 1, n do keep = { i, i + 1, { x = i }, tostring(i) } end
  return keep[1]
end

-- pcall and error
local function err_fn(i) if i % 2 == 0 then error("even " .. i) end return i end
local function cls_pcall(n)
  local bad = 0
  for i = 1, n do if not pcall(err_fn, i) then bad = bad + 1 end end
  return bad
end

-- coroutines: the resuming function gets the coroutine's time inclusive
local function co_body(n)
  while true do
    local s = 0
    for i = 1, n do s = s + (i % 5) end
    coyield(s)
  end
end
local function cls_resume(n)
  local co = cocreate(co_body)
  local s = 0
  for _ = 1, 20 do
    local _, v = coresume(co, n)
    s = s + v
  end
  return s, costatus(co)
end

-- closures made in a loop
local function cls_closures(n)
  local s = 0
  for i = 1, n do
    local f = function(x) return x + i end
    s = s + f(1)
  end
  return s
end

-- recursion 100 deep (deeper than the 64 frames a capture keeps)
local function rec(d, n)
  if d == 0 then return inner_loop(n) end
  return rec(d - 1, n) + 0
end
local function cls_recurse(n)
  local r = rec(100, n)   -- not a tail call: cls_recurse stays on the stack
  return r
end

-- a function with no loop and no call: on 5.4 its samples are taken after
-- it returned unless the hook adds it back
local function cls_flat(a)
  local x = a * 3 + 1
  x = x * 5 % 1000003 + a; x = x * 7 % 1000033 + a; x = x * 3 % 1000037 + a
  x = x * 5 % 1000003 + a; x = x * 7 % 1000033 + a; x = x * 3 % 1000037 + a
  x = x * 5 % 1000003 + a; x = x * 7 % 1000033 + a; x = x * 3 % 1000037 + a
  x = x * 5 % 1000003 + a; x = x * 7 % 1000033 + a; x = x * 3 % 1000037 + a
  x = x * 5 % 1000003 + a; x = x * 7 % 1000033 + a; x = x * 3 % 1000037 + a
  x = x * 5 % 1000003 + a; x = x * 7 % 1000033 + a; x = x * 3 % 1000037 + a
  x = x * 5 % 1000003 + a; x = x * 7 % 1000033 + a; x = x * 3 % 1000037 + a
  x = x * 5 % 1000003 + a; x = x * 7 % 1000033 + a; x = x * 3 % 1000037 + a
  return x
end

-- a mix of the above under one function
local floor = math.floor
local function cls_mix(n)
  return cls_format(floor(n / 40) + 1) + cls_gsub(floor(n / 400) + 1) + cls_index(floor(n / 10) + 1)
    + inner_loop(n)
end

-- runs cases (name, run: a function whose time counts for `name`) in
-- turns for SECONDS of their own CPU time under a profile; returns the measured shares (os.clock)
-- and the inclusive sample shares of the names, the profile
local function measure(cases)
  local p = pe.profile.start({ freq = FREQ, pages = 2048 }) or assert(pe.profile.start({ freq = FREQ }))
  local ok, err = pcall(function()
    assert.equal("hook", p.mode, tostring(p.reason))
    local t = {}
    for _, c in ipairs(cases) do t[c.name] = 0 end
    -- SECONDS of the cases' own CPU time, the drains left out (on a loaded
    -- machine they can take most of a window: the count of samples checked
    -- below is due from the cases' time), within 30 times that in all
    local t0, spent = clock(), 0
    repeat
      for _, c in ipairs(cases) do
        local c0 = clock()
        c.run()
        local dt = clock() - c0
        t[c.name] = t[c.name] + dt
        spent = spent + dt
      end
      p:drain()
    until spent > SECONDS or clock() - t0 > 30 * SECONDS
    p:stop()
    return t
  end)
  if not ok then p:stop() error(err, 0) end
  local t = err
  local total = 0
  for _, c in ipairs(cases) do total = total + t[c.name] end
  local hits, n, nolua, nolua_stacks, others = {}, 0, 0, {}, {}
  for _, c in ipairs(cases) do hits[c.name] = 0 end
  for _, frames in ipairs(p.samples) do
    local seen, any, lua = {}, false, false
    for _, f in ipairs(frames) do
      if f.lua then
        lua = true
        local nm = f.lua.name
        if hits[nm] and not seen[nm] then seen[nm] = true; hits[nm] = hits[nm] + 1; any = true end
      end
    end
    if any then n = n + 1 end
    if lua and not any then
      -- (for the message: the stacks of samples in none of the cases)
      local names = {}
      for _, f in ipairs(frames) do names[#names + 1] = f.c or tostring(f.lua.name) end
      local k = concat(names, ";")
      others[k] = (others[k] or 0) + 1
    end
    if not lua then
      nolua = nolua + 1
      if nolua <= 3 then
        local names = {}
        for _, f in ipairs(frames) do names[#names + 1] = f.c or "?" end
        nolua_stacks[#nolua_stacks + 1] = concat(names, ";")
      end
    end
  end
  local want, got = {}, {}
  for _, c in ipairs(cases) do
    want[c.name] = 100 * t[c.name] / total
    got[c.name] = n > 0 and 100 * hits[c.name] / n or 0
  end
  local top = {}
  for k, c in pairs(others) do top[#top + 1] = { c, k } end
  table.sort(top, function(a, b) return a[1] > b[1] end)
  for i = 4, #top do top[i] = nil end
  for i, e in ipairs(top) do top[i] = e[1] .. " " .. e[2] end
  return want, got, n, nolua, p, nolua_stacks, hits, concat(top, " | "), total
end

local function check(cases)
  -- one window, taken again when steal spoiled it (stats.measure; judged on
  -- CPU time: run delay stops both clocks alike)
  local want, got, n, nolua, p, nolua_stacks, hits, others, spent = stats.measure(function()
    return measure(cases)
  end, { what = "the classes' window", delay = false })
  local lines = {}
  for _, c in ipairs(cases) do
    lines[#lines + 1] = format("%s %.1f%% of the samples, %.1f%% of os.clock", c.name, got[c.name], want[c.name])
  end
  local msg = format("%s (%d samples in them, %d in all, %d without a Lua frame: %s; %d paired, %d captures, "
                     .. "%d shed, %d signals, %d SIGIO, %d foreign, %d lost; %s)",
                     concat(lines, "; "), n, p.nsamples, nolua, concat(nolua_stacks, " | "), p.nhooked or 0,
                     p.ncaps or 0, p.hook_shed or 0, p.hook_signals, p.hook_sigio, p.hook_foreign, p.lost,
                     stats.describe(stats.last))
  if os.getenv("PE_DEBUG") then print(msg) end   -- the figures in bench/README.md
  -- too few samples would pass by luck: the cases' own CPU time (os.clock,
  -- the drains left out: at 2999 Hz they take most of a loaded machine's
  -- window) sampled at 40 % of FREQ at least, up to the Poisson bound
  local enough, few = stats.count_at_least("samples in the cases", n, FREQ * spent, 0.6)
  assert.is_true(n >= 100 and enough, few .. "; " .. msg .. "; the others' most frequent stacks: " .. others)
  local ok, why = stats.at_most("samples without a Lua frame", nolua, p.nsamples, 0.02)
  assert.is_true(ok, why .. "; " .. msg)
  -- each share within the exact binomial bound of n (odds 1e-6) plus SYS
  for _, c in ipairs(cases) do
    ok, why = stats.share(c.name, hits[c.name], n, want[c.name] / 100, SYS)
    assert.is_true(ok, why .. "; " .. msg)
  end
  return p
end

describe("pe.profile on PUC Lua: workload classes, default hook kind", function()
  if jit then
    it("is for PUC Lua only", function()
      pending("LuaJIT has no hook mode: its classes are in profile_classes_spec.lua")
    end)
    return
  end

  -- the cases' `run` are closures (not named like any case); each case's
  -- work is sized to a few ms a turn
  it("string builtins without callbacks: format, upper", function()
    check({
      { name = "cls_format", run = function() cls_format(3000) end },
      { name = "cls_upper", run = function() cls_upper(4000) end },
      { name = "cls_loop", run = function() cls_loop(60000) end },
    })
  end)

  it("string.gsub with a Lua function", function()
    check({
      { name = "cls_gsub", run = function() cls_gsub(60) end },
      { name = "cls_loop", run = function() cls_loop(60000) end },
    })
  end)

  it("table.sort with a Lua comparator", function()
    check({
      { name = "cls_sort", run = function() cls_sort(6) end },
      { name = "cls_loop", run = function() cls_loop(60000) end },
    })
  end)

  it("metamethods: an __index function, __add", function()
    check({
      { name = "cls_index", run = function() cls_index(20000) end },
      { name = "cls_add", run = function() cls_add(8000) end },
      { name = "cls_loop", run = function() cls_loop(40000) end },
    })
  end)

  it("allocation and GC", function()
    check({
      { name = "cls_alloc", run = function() cls_alloc(4000) end },
      { name = "cls_loop", run = function() cls_loop(60000) end },
    })
  end)

  it("pcall and error", function()
    check({
      { name = "cls_pcall", run = function() cls_pcall(4000) end },
      { name = "cls_loop", run = function() cls_loop(60000) end },
    })
  end)

  it("coroutines: the resuming function gets the coroutine's time", function()
    check({
      { name = "cls_resume", run = function() cls_resume(4000) end },
      { name = "cls_loop", run = function() cls_loop(60000) end },
    })
  end)

  it("closures made in a loop", function()
    check({
      { name = "cls_closures", run = function() cls_closures(20000) end },
      { name = "cls_loop", run = function() cls_loop(60000) end },
    })
  end)

  it("recursion 100 deep, deeper than a capture", function()
    check({
      { name = "cls_recurse", run = function() cls_recurse(60000) end },
      { name = "cls_loop", run = function() cls_loop(30000) end },
    })
  end)

  it("a function with no loop and no call, called from the driver's loop", function()
    -- os.clock times the loop of calls; the loop's own three instructions a
    -- call are charged to cls_flat by os.clock, to the driver by the samples
    check({
      { name = "cls_flat", run = function() for i = 1, 3000 do cls_flat(i) end end },
      { name = "cls_loop", run = function() cls_loop(60000) end },
    })
  end)

  it("a mix", function()
    check({
      { name = "cls_mix", run = function() cls_mix(20000) end },
      { name = "cls_sort", run = function() cls_sort(3) end },
      { name = "cls_loop", run = function() cls_loop(30000) end },
    })
  end)
end)
