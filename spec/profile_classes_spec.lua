-- pe.profile judged on classes of real Lua code. For each class, two or
-- three top-level functions of clearly different cost run in rotation under
-- pe.profile.start{freq=}; each call is timed with os.clock in the same
-- process. A function's inclusive share of the samples (the samples whose
-- stack holds its frame) must be within 5 points of its share of the CPU
-- time, and the samples with no Lua frame at all under 2 %. Only the public
-- API is read (p:aggregate()). The workloads are written for this spec
-- alone (the profiler was tuned on the other specs' ones).
-- PE_CLASSES_REPORT=1 prints one line per class to stderr, pass or fail.
-- Tagged #classes (busted --exclude-tags=classes leaves it out).
-- PE_CLASSES_JUDGE=jit.profile:MODE (LuaJIT, e.g. "fi1") judges LuaJIT's own
-- profiler instead, a control for the judge itself: its callback walks the
-- sampled thread with debug.getinfo at the safe point (2 s a class, as it
-- takes ~250 samples a second here).
local pe = require("perf_event")
local stats = require("support.stats")

local jit = rawget(_G, "jit")
local clock = os.clock
local format, srep, upper, gsub, sub = string.format, string.rep, string.upper, string.gsub, string.sub
local sort, concat = table.sort, table.concat
local sqrt, floor, max = math.sqrt, math.floor, math.max
local co_create, co_resume, co_yield, co_wrap, co_status =
  coroutine.create, coroutine.resume, coroutine.yield, coroutine.wrap, coroutine.status
local tostring, setmetatable, pcall, error, ipairs, pairs, next =
  tostring, setmetatable, pcall, error, ipairs, pairs, next

local JUDGE_JP = jit and (os.getenv("PE_CLASSES_JUDGE") or ""):match("^jit%.profile:(%w+)$")
local FREQ = 1999        -- about 1000 samples a class: a share's sampling error is ~1.6 points
local BUDGET = JUDGE_JP and 2 or 0.5   -- CPU seconds of rotation per class
local UNIT = 0.002       -- CPU seconds of the cheapest call
-- what the profile's share of a function may differ from os.clock's beside
-- sampling error, in points: os.clock's reads around each call and the
-- call boundaries a sample may fall either side of
local SYS = 0.02
local NOLUA_MAX = 2      -- percent
local SUITE = os.getenv("PE_SUITE") or (jit and "luajit" or _VERSION)
local REPORT = os.getenv("PE_CLASSES_REPORT") == "1"
local CHUNK = (debug.getinfo(1, "S").source:gsub("^[@=]", ""))

-- ------------------------------------------------------------ workloads

local TEXT = srep("Lorem ipsum dolor sit amet 42, consectetur 7 adipiscing elit 1999; ", 6)
local DIGITS = srep("k3v77w512z9 ", 24)

-- string builtins, no Lua callback
local function sb_format(n)
  local acc = 0
  for i = 1, n do acc = acc + #format("%6d|%-9s|%.5f|%x", i, "cell", i / 7, i) end
  return acc
end
local function sb_upper(n)
  local acc = 0
  -- a different string each time: a compiled loop would hoist a constant one
  for i = 1, n do acc = acc + #upper(sub(TEXT, i % 9 + 1)) end
  return acc
end
local function sb_rep(n)
  local acc = 0
  for i = 1, n do acc = acc + #srep("xyz", 200 + i % 5) end
  return acc
end

-- string.gsub with a Lua function as the replacement
local function keep_long(w)
  if #w > 4 then return w end
  return ""
end
local function bump(d)
  return tostring(d * 3 + 1)
end
local function gs_words(n)
  local acc = 0
  for _ = 1, n do
    local s = gsub(TEXT, "%a+", keep_long)
    acc = acc + #s
  end
  return acc
end
local function gs_digits(n)
  local acc = 0
  for _ = 1, n do
    local _, k = gsub(DIGITS, "%d+", bump)
    acc = acc + k
  end
  return acc
end

-- table.sort with a Lua comparator
local SEQ = {}
for i = 1, 300 do SEQ[i] = (i * 7919) % 1009 end
local function by_value_desc(a, b) return a > b end
local function by_key(a, b)
  if a.k ~= b.k then return a.k < b.k end
  return a.id < b.id
end
local function so_numbers(n)
  local acc = 0
  for _ = 1, n do
    local t = {}
    for i = 1, #SEQ do t[i] = SEQ[i] end
    sort(t, by_value_desc)
    acc = acc + t[1]
  end
  return acc
end
local function so_records(n)
  local acc = 0
  for _ = 1, n do
    local t = {}
    for i = 1, 120 do t[i] = { k = SEQ[i] % 37, id = i } end
    sort(t, by_key)
    acc = acc + t[1].id
  end
  return acc
end

-- metamethods: __index function, __add, __call
local doubler = setmetatable({}, { __index = function(_, k) return k + k end })
local Vec = {}
Vec.__add = function(a, b) return setmetatable({ x = a.x + b.x, y = a.y + b.y }, Vec) end
local counter = setmetatable({ total = 0 }, {
  __call = function(self, x)
    self.total = self.total + x % 13
    return self.total
  end,
})
local function mm_index(n)
  local acc = 0
  for i = 1, n do acc = acc + doubler[i % 1000] end
  return acc
end
local function mm_add(n)
  local v = setmetatable({ x = 0, y = 0 }, Vec)
  local d = setmetatable({ x = 1, y = 2 }, Vec)
  for _ = 1, n do v = v + d end
  return v.x + v.y
end
local function mm_call(n)
  local acc = 0
  for i = 1, n do acc = acc + counter(i) end
  return acc
end

-- allocation and the GC: tables and strings
local function al_tables(n)
  local ring, acc = {}, 0
  for i = 1, n do
    local t = { i, i + 1, i + 2, tag = i % 11, sub = { i } }
    ring[i % 64 + 1] = t
    acc = acc + t.tag + #t
  end
  return acc + #ring
end
local function al_strings(n)
  local ring, acc = {}, 0
  for i = 1, n do
    local s = "row" .. i .. ":" .. (i * 3) .. ";"
    ring[i % 64 + 1] = s
    acc = acc + #s
  end
  return acc + #ring
end

-- pcall and error
local function risky(i)
  if i % 3 == 0 then error("bad row " .. i) end
  return i
end
local function risky_obj(i)
  if i % 2 == 0 then error({ code = i }) end
  return i
end
local function pe_strings(n)
  local bad = 0
  for i = 1, n do
    local ok = pcall(risky, i)
    if not ok then bad = bad + 1 end
  end
  return bad
end
local function pe_objects(n)
  local acc = 0
  for i = 1, n do
    local ok, e = pcall(risky_obj, i)
    acc = acc + (ok and e or e.code)
  end
  return acc
end

-- coroutines: the resumer's inclusive time holds the coroutine's (co_pump's
-- coroutine runs a few thousand VM instructions between its yields, so a
-- capture taken inside it must be joined to the resumer)
local function co_pump(n)
  local co = co_create(function(k)
    local s = 0
    for i = 1, k do
      for j = 1, 400 do s = s + (i * j) % 5 end
      co_yield(s)
    end
    return s
  end)
  local _, v = co_resume(co, n)
  while co_status(co) ~= "dead" do _, v = co_resume(co) end
  return v
end
local function co_gen(n)
  local gen = co_wrap(function()
    for i = 1, n do co_yield(sqrt(i) * 2) end
    co_yield(nil)
  end)
  local acc = 0
  for _ = 1, n do acc = acc + gen() end
  return acc
end
local function co_plain(n)
  local s = 0
  for i = 1, n do s = s + (i * 13) % 9 end
  return s
end

-- closures made in loops
local function cl_inline(n)
  local acc = 0
  for i = 1, n do
    local f = function(x) return x * i + 1 end
    acc = acc + f(i % 17)
  end
  return acc
end
local function cl_batch(n)
  local acc = 0
  for r = 1, n do
    local fs = {}
    for i = 1, 8 do fs[i] = function() return i + r end end
    for i = 1, 8 do acc = acc + fs[i]() end
  end
  return acc
end

-- recursion 100 deep: both top-level functions go through the same
-- recursive function, so only the root of the stack tells them apart
local function descend(d, n, leaf)
  if d == 0 then return leaf(n) end
  return descend(d - 1, n, leaf) + 0
end
local function arith_leaf(n)
  local s = 0
  for i = 1, n do s = s + (i % 11) * 2 end
  return s
end
local function string_leaf(n)
  local acc = 0
  for i = 1, n do acc = acc + #srep("ab", i % 40 + 40) end
  return acc
end
local function rc_arith(n)
  local acc = 0
  for _ = 1, 4 do acc = acc + descend(100, n, arith_leaf) end
  return acc
end
local function rc_string(n)
  local acc = 0
  for _ = 1, 4 do acc = acc + descend(100, n, string_leaf) end
  return acc
end

-- mixes
local function chain(d, n)
  if d == 0 then
    local t = {}
    for i = 1, n do t[i] = (i * 31) % 97 end
    sort(t, by_value_desc)
    return t[1]
  end
  return chain(d - 1, n) + 0
end
local function mx_sort_gsub(n)
  local acc = 0
  for i = 1, n do
    acc = acc + chain(16, 60)
    local s = gsub(sub(TEXT, 1, 120), "%a+", keep_long)
    acc = acc + #s
    local ok = pcall(risky, i)
    if ok then acc = acc + 1 end
  end
  return acc
end
local function mx_alloc_meta(n)
  local acc = 0
  for i = 1, n do
    local v = setmetatable({ x = i, y = 1 }, Vec) + setmetatable({ x = 1, y = i }, Vec)
    acc = acc + v.x + doubler[i % 50] + #format("%d-%d", v.x, v.y)
  end
  return acc
end
local function mx_closures(n)
  local acc = 0
  for i = 1, n do
    local add = function(a) return a + i end
    acc = acc + add(floor(sqrt(i))) + counter(i)
  end
  return acc
end

-- jit.off functions next to compiled ones (LuaJIT)
local function jo_interp(n)
  local s = 0
  for i = 1, n do s = s + (i * 3) % 7 end
  return s
end
local function jo_compiled(n)
  local s = 0
  for i = 1, n do s = s + (i * 5) % 11 end
  return s
end
local function jo_compiled_b(n)
  local s = 0.0
  for i = 1, n do s = s + sqrt(i) end
  return s
end
if jit then jit.off(jo_interp) end

-- ------------------------------------------------------------ the judge

-- n such that fn(n) takes about w * UNIT CPU seconds
local function calibrate(fn, w)
  local n, t = 4, 0
  while t < 0.004 and n < 2 ^ 30 do
    n = n * 2
    local t0 = clock()
    fn(n)
    t = clock() - t0
  end
  -- twice more at the size found: a loop compiled meanwhile runs faster
  for _ = 1, 2 do
    n = max(1, floor(n * w * UNIT / max(t, 1e-6) + 0.5))
    local t0 = clock()
    fn(n)
    t = clock() - t0
  end
  return max(1, floor(n * w * UNIT / max(t, 1e-6) + 0.5))
end

local function start_profile()
  -- a large ring where it can be locked (root); else the default
  local p = pe.profile.start({ freq = FREQ, pages = 1024 })
  if not p then p = assert(pe.profile.start({ freq = FREQ })) end
  return p
end

-- the control: jit.profile, with the stack of the sampled thread read at
-- the safe point, shaped as p:aggregate()'s stacks (one per sample)
local function jp_profile(mode)
  local jp = require("jit.profile")
  local stacks = {}
  jp.start(mode, function(th, samples)
    local frames = {}
    for level = 300, 0, -1 do
      local i = debug.getinfo(th, level, "S")
      if i and i.what ~= "C" then
        frames[#frames + 1] = { lua = { chunk = (i.source:gsub("^[@=]", "")), linedefined = i.linedefined } }
      end
    end
    if #frames == 0 then frames[1] = { c = "?" } end
    stacks[#stacks + 1] = { frames = frames, count = samples, key = "sample " .. #stacks + 1 }
  end)
  return { mode = "jit.profile " .. mode, lost = 0, stop = function() jp.stop() end,
           aggregate = function() return stacks end }
end

local function pct(a, b) return b > 0 and 100 * a / b or 0 end

-- the live traces and how many of them hold a PROF instruction (LuaJIT's
-- profiler check): for a failure's message, taken while the profile runs
local function trace_census()
  if not jit then return "n/a" end
  local jutil, names = require("jit.util"), require("jit.vmdef").irnames
  local prof = (names:find("PROF  ", 1, true) - 1) / 6
  local n, with = 0, 0
  for tr = 1, 65535 do
    local info = jutil.traceinfo(tr)
    if info then
      n = n + 1
      for ref = 1, info.nins do
        local _, ot = jutil.traceir(tr, ref)
        if ot and floor(ot / 256) == prof then with = with + 1 break end
      end
    end
  end
  return format("%d traces, %d with profiler checks", n, with)
end

-- runs the class's functions ({name=, f=, w=}) in rotation under a profile;
-- returns the measurements
local function measure(fns, interp)
  local p, span
  if interp then jit.off() end
  local ok, err = pcall(function()
    for _, e in ipairs(fns) do
      e.n = calibrate(e.f, e.w)
      e.ld = debug.getinfo(e.f, "S").linedefined
      e.t, e.calls = 0, 0
    end
    p = JUDGE_JP and jp_profile(JUDGE_JP) or start_profile()
    local t_begin = clock()
    repeat
      for _, e in ipairs(fns) do
        local t0 = clock()
        e.f(e.n)
        e.t = e.t + (clock() - t0)
        e.calls = e.calls + 1
      end
    until clock() - t_begin >= BUDGET
    span = clock() - t_begin
  end)
  local census = ok and trace_census()
  if p then p.stop(p) end
  if interp then jit.on() end
  if not ok then error(err, 0) end
  local m = { total = 0, nolua = 0, hits = {}, others = {}, span = span, mode = p.mode, lost = p.lost,
              lj_mode = p.lj_mode, census = census }
  for _, e in ipairs(fns) do m.hits[e] = 0 end
  for _, st in ipairs(p:aggregate()) do
    m.total = m.total + st.count
    local any, seen = false, {}
    for _, fr in ipairs(st.frames) do
      if fr.lua then
        any = true
        if fr.lua.chunk == CHUNK then
          for _, e in ipairs(fns) do
            if fr.lua.linedefined == e.ld then seen[e] = true end
          end
        end
      end
    end
    if not any then m.nolua = m.nolua + st.count end
    if next(seen) == nil and #m.others < 3 then
      -- the hottest stacks that hold none of the functions, for the message
      -- (the key is root first: keep its innermost frames)
      local key = st.key
      if #key > 160 then key = "..." .. sub(key, -157) end
      m.others[#m.others + 1] = format("%d x %s", st.count, key)
    end
    for e in pairs(seen) do m.hits[e] = m.hits[e] + st.count end
  end
  return m
end

-- a class judged in one window that lost little to steal (stats.measure;
-- judged on CPU time: run delay stops both clocks alike): each function's share of the samples against its share
-- of os.clock, within the exact binomial bound for the window's sample
-- count (odds 1e-6) plus SYS points either way
local function judge(label, fns, interp)
  local m = stats.measure(function() return measure(fns, interp) end, { what = label, delay = false })
  local parts, checks = {}, {}
  for _, e in ipairs(fns) do
    local want, got = pct(e.t, m.span), pct(m.hits[e], m.total)
    e.want, e.got = want, got
    parts[#parts + 1] = format("%s %.1f%% of samples vs %.1f%% of os.clock (%d calls)",
                               e.name, got, want, e.calls)
    checks[#checks + 1] = { stats.share(e.name, m.hits[e], m.total, want / 100, SYS) }
  end
  local nolua = pct(m.nolua, m.total)
  local msg = format("[%s] %s (mode %s, lj_mode %s): %s; no Lua frame %.1f%% (%d of %d samples, "
                     .. "%.3f s, lost %s; %s; %s); hottest stacks outside them: %s",
                     SUITE, label, tostring(m.mode), tostring(m.lj_mode),
                     concat(parts, "; "), nolua, m.nolua, m.total,
                     m.span, tostring(m.lost), m.census, stats.describe(stats.last),
                     #m.others > 0 and concat(m.others, " | ") or "none")
  -- a profile that took almost no samples would pass by luck: at least
  -- 40 % of FREQ * span (the kernel may lower the rate under load)
  if JUDGE_JP then
    assert.is_true(m.total >= 100, "too few samples: " .. msg)
  else
    local ok, why = stats.count_at_least("samples", m.total, FREQ * m.span, 0.6)
    assert.is_true(ok, why .. "; " .. msg)
  end
  for _, c in ipairs(checks) do
    if REPORT then io.stderr:write((c[1] and "PASS " or "FAIL ") .. c[2] .. "\n") end
    assert.is_true(c[1], c[2] .. "; " .. msg)
  end
  local ok, why = stats.at_most("samples with no Lua frame", m.nolua, m.total, NOLUA_MAX / 100)
  assert.is_true(ok, why .. "; " .. msg)
end

local CLASSES = {
  { "string builtins (format, upper, rep)", "both",
    { { name = "sb_format", f = sb_format, w = 4 }, { name = "sb_upper", f = sb_upper, w = 2 },
      { name = "sb_rep", f = sb_rep, w = 1 } } },
  { "string.gsub with a Lua function", "default",
    { { name = "gs_words", f = gs_words, w = 3 }, { name = "gs_digits", f = gs_digits, w = 1 } } },
  { "table.sort with a Lua comparator", "both",
    { { name = "so_numbers", f = so_numbers, w = 1 }, { name = "so_records", f = so_records, w = 3 } } },
  { "metamethods (__index, __add, __call)", "default",
    { { name = "mm_index", f = mm_index, w = 4 }, { name = "mm_add", f = mm_add, w = 2 },
      { name = "mm_call", f = mm_call, w = 1 } } },
  { "allocation and GC (tables, strings)", "both",
    { { name = "al_tables", f = al_tables, w = 3 }, { name = "al_strings", f = al_strings, w = 1 } } },
  { "jit.off function among compiled ones", "jit",
    { { name = "jo_interp", f = jo_interp, w = 1 }, { name = "jo_compiled", f = jo_compiled, w = 4 },
      { name = "jo_compiled_b", f = jo_compiled_b, w = 2 } } },
  { "pcall and error", "default",
    { { name = "pe_strings", f = pe_strings, w = 3 }, { name = "pe_objects", f = pe_objects, w = 1 } } },
  { "coroutines (resumer inclusive)", "default",
    { { name = "co_pump", f = co_pump, w = 4 }, { name = "co_gen", f = co_gen, w = 2 },
      { name = "co_plain", f = co_plain, w = 1 } } },
  { "closures made in loops", "default",
    { { name = "cl_inline", f = cl_inline, w = 1 }, { name = "cl_batch", f = cl_batch, w = 3 } } },
  { "recursion 100 deep", "default",
    { { name = "rc_arith", f = rc_arith, w = 3 }, { name = "rc_string", f = rc_string, w = 1 } } },
  { "mixes", "default",
    { { name = "mx_sort_gsub", f = mx_sort_gsub, w = 4 }, { name = "mx_alloc_meta", f = mx_alloc_meta, w = 2 },
      { name = "mx_closures", f = mx_closures, w = 1 } } },
}

describe("pe.profile on classes of code #classes", function()
  setup(function()
    -- the self-tests run on the first start in a process: not in a class's window
    local p = start_profile()
    p:stop()
  end)

  for _, c in ipairs(CLASSES) do
    local label, kind, fns = c[1], c[2], c[3]
    if kind == "jit" and not jit then
      pending(label .. ": LuaJIT only")
    elseif kind == "both" and jit then
      it(label .. ", interpreted: inclusive shares match os.clock", function()
        judge(label .. ", interpreted", fns, true)
      end)
      it(label .. ", compiled: inclusive shares match os.clock", function()
        judge(label .. ", compiled", fns, false)
      end)
    else
      it(label .. ": inclusive shares match os.clock", function()
        judge(label, fns, false)
      end)
    end
  end
end)
