--- Event strings in perf's syntax -> perf_event_attr tables (doc/coverage.md H13-H22).
-- Pure Lua over sysfs (pmu.lua) and tracefs (tracepoint.lua).  The attr
-- built for a string equals what `perf stat -vv -e STRING` prints (perf 6.1
-- rules, modifiers included); spec/perf_oracle_spec.lua checks that.
-- Not a public interface: reached through perf_event (doc/api.md lists what is).
-- @module perf_event.parse

local u64 = require("perf_event.u64")
local pmu = require("perf_event.pmu")
local events = require("perf_event.events")
local abi = require("perf_event.core").abi

local type, pairs, ipairs, error, pcall, tostring, setmetatable, getmetatable, require =
  type, pairs, ipairs, error, pcall, tostring, setmetatable, getmetatable, require
local min, max, floor = math.min, math.max, math.floor
local sub, find, match, format, rep, lower, byte =
  string.sub, string.find, string.match, string.format, string.rep, string.lower, string.byte
local concat, sort = table.concat, table.sort

local M = {}

local TYPE = events.TYPE
local ST, BR = abi.sample_type, abi.branch_sample_type
-- hw_cache config = id | op << op_shift | result << result_shift (integers on 5.3+)
local CACHE_OP_MUL = floor(2 ^ abi.hw_cache.op_shift)
local CACHE_RESULT_MUL = floor(2 ^ abi.hw_cache.result_shift)
local MODCHARS = events.modifiers

------------------------------------------------------------------------
-- errors: raised internally as tables, turned into `nil, msg` at the API

local ERR = {}

local function fail(_, pos, msg)
  error(setmetatable({ pos = pos, msg = msg }, ERR), 0)
end

local function render(str, pos, msg)
  local s = tostring(str)
  local shown, caret = s, pos or 1
  if #shown > 120 then
    local from = (caret > 60) and (caret - 60) or 1
    shown = sub(s, from, from + 119)
    caret = caret - from + 1
    if from > 1 then shown = ".." .. shown; caret = caret + 2 end
  end
  shown = shown:gsub("[%c]", " ")
  caret = min(caret, #shown + 1)
  return format("perf_event: bad event string '%s': %s\n    %s\n    %s^", s, msg, shown, rep(" ", caret - 1))
end

------------------------------------------------------------------------
-- helpers

local function num(v)
  return u64.value(v)
end

local function small_or(a, b)
  return u64.tonumber(u64.bor(u64.from(a or 0), u64.from(b or 0)))
end

-- "did you mean" is bounded: no suggestion for a word longer than
-- SUGGEST_MAX_LEN, at most SUGGEST_MAX_CANDS candidates looked at, a
-- candidate whose length alone puts it too far is skipped, and the edit
-- distance stops as soon as a row exceeds the limit.  M.suggest_work
-- counts the distance cells computed (specs assert on it).
local SUGGEST_MAX_LEN, SUGGEST_MAX_CANDS = 64, 20000
M.suggest_work = 0

-- Levenshtein distance of a and b, or limit + 1 once it must exceed limit
local function distance(a, b, limit)
  local la, lb = #a, #b
  if la == 0 then return lb end
  if lb == 0 then return la end
  local prev = {}
  for j = 0, lb do prev[j] = j end
  for i = 1, la do
    local cur = { [0] = i }
    local ca = byte(a, i)
    local row_min = i
    for j = 1, lb do
      local cost = (ca == byte(b, j)) and 0 or 1
      local v = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
      cur[j] = v
      if v < row_min then row_min = v end
    end
    M.suggest_work = M.suggest_work + lb
    if row_min > limit then return limit + 1 end
    prev = cur
  end
  return prev[lb]
end

local function suggest(word, cands)
  if #word > SUGGEST_MAX_LEN then return {} end
  if type(cands) == "function" then cands = cands() end
  local lw = lower(word)
  local limit = max(2, floor(#word / 3))
  local scored = {}
  local seen = {}
  for n, c in ipairs(cands) do
    if n > SUGGEST_MAX_CANDS then break end
    if not seen[c] then
      seen[c] = true
      local lc = lower(c)
      local d
      if #lw >= 3 and find(lc, lw, 1, true) then
        d = 1
      elseif #lc - #lw <= limit and #lw - #lc <= limit then
        d = distance(lw, lc, limit)
      end
      if d and d <= limit then scored[#scored + 1] = { c, d } end
    end
  end
  sort(scored, function(x, y) if x[2] ~= y[2] then return x[2] < y[2] end return x[1] < y[1] end)
  local out = {}
  for i = 1, min(5, #scored) do out[i] = scored[i][1] end
  return out
end

------------------------------------------------------------------------
-- scanner

local WORD = "^[%w_%.%-%*%?%[%]!]+"

local function skip_space(st)
  local _, e = find(st.s, "^%s+", st.pos)
  if e then st.pos = e + 1 end
end

local function peek(st) return sub(st.s, st.pos, st.pos) end

local function read_pat(st, pat)
  local s, e = find(st.s, pat, st.pos)
  if not s then return nil end
  local w = sub(st.s, s, e)
  st.pos = e + 1
  return w
end

local function parse_number(st, text, pos, what)
  local v, why = u64.parse(text)
  if not v then
    if why == "overflow" then fail(st, pos, format("%s '%s' does not fit in 64 bits", what, text)) end
    fail(st, pos, format("%s '%s' is not a number (decimal or 0x hex)", what, text))
  end
  return v
end

------------------------------------------------------------------------
-- modifiers (perf 6.1 get_event_modifier / check_modifier)

local function read_mods(st)
  local start = st.pos
  local m = read_pat(st, "^%a+") or ""
  for i = 1, #m do
    local c = sub(m, i, i)
    if not find(MODCHARS, c, 1, true) then
      fail(st, start + i - 1, format("unknown modifier '%s' (valid: %s)", c,
        "u k h G H I p pp ppp P S D W e b"))
    end
    if c ~= "p" and find(m, c, i + 1, true) then
      fail(st, start + i - 1, format("modifier '%s' given twice", c))
    end
  end
  if #m > 15 then fail(st, start, "too many modifiers") end
  return m, start
end

local function b2i(v) return v and 1 or 0 end

-- Applies a modifier string the way perf does.  group: the evsel already
-- has modifiers (group modifiers start from its state).
local function apply_mods(st, e, mods, pos, group, member)
  local a = e.attr
  local eu, ek, eh, eH, eG, eI, precise = 0, 0, 0, 0, 0, 0, 0
  local pinned, exclusive = 0, 0
  local exclude_GH = false
  if group then
    eu, ek, eh = b2i(a.exclude_user), b2i(a.exclude_kernel), b2i(a.exclude_hv)
    eH, eG, eI = b2i(a.exclude_host), b2i(a.exclude_guest), b2i(a.exclude_idle)
    precise = a.precise_ip or 0
    pinned, exclusive = b2i(a.pinned), b2i(a.exclusive)
    exclude_GH = e._exclude_GH or false
  end
  local exclude = (eu + ek + eh) > 0
  for i = 1, #mods do
    local c = sub(mods, i, i)
    if c == "u" or c == "k" or c == "h" then
      if not exclude then exclude = true; eu, ek, eh = 1, 1, 1 end
      if c == "u" then
        if not exclude_GH then eG = 1 end
        eu = 0
      elseif c == "k" then ek = 0 else eh = 0 end
    elseif c == "G" or c == "H" then
      if not exclude_GH then exclude_GH = true; eG, eH = 1, 1 end
      if c == "G" then eG = 0 else eH = 0 end
    elseif c == "I" then eI = 1
    elseif c == "p" then
      precise = precise + 1
      if not exclude_GH then eG = 1 end
    elseif c == "P" then e.precise_max = true
    elseif c == "S" then e.sample_read = true
    elseif c == "D" then pinned = 1
    elseif c == "e" then exclusive = 1
    elseif c == "W" then e.weak = true
    elseif c == "b" then e.bpf_counter = true
    end
  end
  if precise > 3 then fail(st, pos, "precise level above 3 (use at most 'ppp')") end
  local function flag(k, v) if v == 1 then a[k] = true else a[k] = nil end end
  flag("exclude_user", eu); flag("exclude_kernel", ek); flag("exclude_hv", eh)
  flag("exclude_host", eH); flag("exclude_guest", eG); flag("exclude_idle", eI)
  if not member then flag("pinned", pinned); flag("exclusive", exclusive) end
  a.precise_ip = precise > 0 and precise or nil
  e._exclude_GH = exclude_GH
end

------------------------------------------------------------------------
-- terms inside pmu/.../

local GENERIC = {
  config = "num", config1 = "num", config2 = "num", config3 = "num",
  name = "str", ["metric-id"] = "str", period = "num", freq = "num",
  branch_type = "str", time = "num", ["call-graph"] = "str", ["stack-size"] = "num",
  ["max-stack"] = "num", nr = "num", inherit = "flag", ["no-inherit"] = "flag",
  overwrite = "flag", ["no-overwrite"] = "flag", percore = "num", ["aux-output"] = "num",
  ["aux-sample-size"] = "num", ["driver-config"] = "str",
}
local GENERIC_NAMES = {}
for k in pairs(GENERIC) do GENERIC_NAMES[#GENERIC_NAMES + 1] = k end
sort(GENERIC_NAMES)

-- perf's branch_type words -> the kernel's PERF_SAMPLE_BRANCH_* names
local BRANCH = {}
for word, name in pairs({
  u = "user", k = "kernel", hv = "hv", any = "any", any_call = "any_call",
  any_ret = "any_return", ind_call = "ind_call", abort_tx = "abort_tx", in_tx = "in_tx",
  no_tx = "no_tx", cond = "cond", stack = "call_stack", ind_jmp = "ind_jump", call = "call",
  no_flags = "no_flags", no_cycles = "no_cycles", save_type = "type_save",
  hw_index = "hw_index", priv = "priv_save", counter = "counters",
}) do BRANCH[word] = BR[name] end

local function read_terms(st)
  -- at '/'
  st.pos = st.pos + 1
  local terms = {}
  skip_space(st)
  if peek(st) == "/" then st.pos = st.pos + 1 return terms end
  while true do
    skip_space(st)
    local tpos = st.pos
    local name = read_pat(st, "^[%a_][%w_%.%-]*")
    if not name then
      if st.pos > #st.s then fail(st, st.pos, "missing closing '/'") end
      fail(st, st.pos, "expected a term name")
    end
    skip_space(st)
    local value, vpos
    if peek(st) == "=" then
      st.pos = st.pos + 1
      skip_space(st)
      vpos = st.pos
      if peek(st) == "'" or peek(st) == '"' then
        local q = peek(st)
        local close = find(st.s, q, st.pos + 1, true)
        if not close then fail(st, st.pos, "unterminated quote") end
        value = sub(st.s, st.pos + 1, close - 1)
        st.pos = close + 1
      else
        value = read_pat(st, "^[^,/%s]+")
        if not value then fail(st, st.pos, format("missing value for term '%s'", name)) end
      end
      skip_space(st)
    end
    terms[#terms + 1] = { name = name, value = value, pos = tpos, vpos = vpos or tpos }
    local c = peek(st)
    if c == "/" then st.pos = st.pos + 1 return terms end
    if c == "," then
      st.pos = st.pos + 1
    elseif c == "" then
      fail(st, st.pos, "missing closing '/'")
    else
      fail(st, st.pos, format("unexpected '%s' in term list", c))
    end
  end
end

local function term_number(st, t)
  if t.value == nil then return u64.new(0, 1) end
  if t.value == "?" then fail(st, t.vpos, format("'?' is only allowed in sysfs aliases (term '%s')", t.name)) end
  return parse_number(st, t.value, t.vpos, format("value of '%s'", t.name))
end

-- Applies the generic (PMU-independent) terms; returns nothing.
local function apply_generic(st, e, t, words)
  local kind = GENERIC[t.name]
  local a = e.attr
  if kind == "str" then
    if t.value == nil or t.value == "" then fail(st, t.pos, format("term '%s' needs a value", t.name)) end
  elseif kind == "flag" and t.value ~= nil then
    fail(st, t.vpos, format("term '%s' takes no value", t.name))
  end
  local v = (kind == "num") and term_number(st, t) or nil
  local n = t.name
  e.terms[n] = (kind == "num") and num(v) or (t.value or true)
  if words[n] then
    words[n] = v
    e._assigned[n] = true
  elseif n == "name" then e.name = t.value
  elseif n == "period" then a.sample_period = num(v); a.sample_freq = nil; a.freq = nil
  elseif n == "freq" then a.sample_freq = num(v); a.sample_period = nil; a.freq = true
  elseif n == "inherit" then a.inherit = true
  elseif n == "no-inherit" then a.inherit = false
  elseif n == "overwrite" then a.write_backward = true
  elseif n == "no-overwrite" then a.write_backward = false
  elseif n == "max-stack" then a.sample_max_stack = num(v)
  elseif n == "stack-size" then a.sample_stack_user = num(v)
  elseif n == "aux-output" then a.aux_output = not u64.iszero(v)
  elseif n == "aux-sample-size" then a.aux_sample_size = num(v)
  elseif n == "branch_type" then
    local bits = 0
    for w in t.value:gmatch("[^|]+") do
      if not BRANCH[w] then
        local names = pmu.sorted_keys(BRANCH)
        fail(st, t.vpos, format("unknown branch_type '%s' (valid: %s)", w, concat(names, ", ")))
      end
      bits = small_or(bits, BRANCH[w])
    end
    a.branch_sample_type = bits
    a.sample_type = small_or(a.sample_type, ST.branch_stack)
  elseif n == "call-graph" then
    local mode = match(t.value, "^(%a+)")
    if mode == "fp" then
      a.sample_type = small_or(a.sample_type, ST.callchain)
    elseif mode == "dwarf" then
      a.sample_type = small_or(a.sample_type, ST.callchain + ST.regs_user + ST.stack_user)
      a.sample_regs_user = 0xff0fff
      a.exclude_callchain_user = true
      if not a.sample_stack_user then a.sample_stack_user = 8192 end
    elseif mode == "lbr" then
      a.sample_type = small_or(a.sample_type, ST.callchain + ST.branch_stack)
      a.branch_sample_type = small_or(a.branch_sample_type,
        BR.user + BR.call_stack + BR.no_flags + BR.no_cycles + BR.hw_index)
    elseif mode ~= "no" then
      fail(st, t.vpos, format("unknown call-graph mode '%s' (valid: fp, dwarf, lbr, no)", t.value))
    end
  end
end

local function config_words(a)
  return {
    config = u64.from(a.config or 0), config1 = u64.from(a.config1 or 0),
    config2 = u64.from(a.config2 or 0), config3 = u64.from(a.config3 or 0),
  }
end

local function store_words(e, words)
  local a = e.attr
  for _, k in ipairs({ "config", "config1", "config2", "config3" }) do
    if k == "config" or not u64.iszero(words[k]) or e._assigned[k] then
      a[k] = num(words[k])
    end
  end
end

local function valid_terms(p)
  local out = {}
  for _, k in ipairs(pmu.sorted_keys(p.format)) do out[#out + 1] = k end
  for _, k in ipairs(GENERIC_NAMES) do out[#out + 1] = k end
  return out
end

-- terms of a PMU event (formats, aliases, generic terms)
local function apply_pmu_terms(st, e, p, terms)
  local words = config_words(e.attr)
  e.bits = e.bits or {}
  -- expand aliases first; collect format terms in order
  local fterms = {}
  local given = {}
  for _, t in ipairs(terms) do given[t.name] = true end
  for _, t in ipairs(terms) do
    if GENERIC[t.name] then
      apply_generic(st, e, t, words)
    elseif p.format[t.name] then
      fterms[#fterms + 1] = { t = t, from = "user" }
    elseif p.events[t.name] and t.value == nil then
      local al = p.events[t.name]
      e.alias = t.name
      e.scale, e.unit, e.per_pkg, e.snapshot = al.scale, al.unit, al.per_pkg, al.snapshot
      for _, at in ipairs(al.terms) do
        if at.param then
          if not given[at.name] then
            fail(st, t.pos, format("event '%s/%s/' needs parameter '%s' (write %s/%s,%s=N/)",
              p.name, t.name, at.name, p.name, t.name, at.name))
          end
        elseif GENERIC[at.name] and words[at.name] then
          local v = u64.parse(at.value or "1")
          if not v then fail(st, t.pos, format("bad value '%s' in sysfs alias %s", tostring(at.value), t.name)) end
          words[at.name] = v
          e._assigned[at.name] = true
        elseif p.format[at.name] then
          fterms[#fterms + 1] = { t = { name = at.name, value = at.value, pos = t.pos, vpos = t.pos },
                                  from = "alias " .. t.name }
        end
      end
    else
      local cands = valid_terms(p)
      for _, k in ipairs(pmu.sorted_keys(p.events)) do cands[#cands + 1] = k end
      local close = suggest(t.name, cands)
      local msg
      if p.events[t.name] then
        msg = format("alias '%s' takes no value", t.name)
      else
        msg = format("unknown term '%s' for PMU %s", t.name, p.name)
        if #close > 0 then msg = msg .. " (did you mean: " .. concat(close, ", ") .. "?)" end
        msg = msg .. "; valid terms: " .. concat(valid_terms(p), ", ")
      end
      fail(st, t.pos, msg)
    end
  end
  for _, ft in ipairs(fterms) do
    local t = ft.t
    local fmt = p.format[t.name]
    local v = term_number(st, t)
    local ok, why = pmu.pack(fmt, v, words[fmt.config])
    if not ok then fail(st, t.vpos, format("term '%s': %s", t.name, why)) end
    e.bits[#e.bits + 1] = { term = t.name, value = u64.hex(v), config = fmt.config, spec = fmt.spec,
                            from = ft.from }
  end
  store_words(e, words)
end

-- generic terms after a symbolic / raw / cache event
local function apply_symbol_terms(st, e, terms)
  local words = config_words(e.attr)
  for _, t in ipairs(terms) do
    if not GENERIC[t.name] then
      local close = suggest(t.name, GENERIC_NAMES)
      fail(st, t.pos, format("unknown term '%s' for %s%s; valid terms: %s", t.name, tostring(e._word),
        #close > 0 and (" (did you mean: " .. concat(close, ", ") .. "?)") or "",
        concat(GENERIC_NAMES, ", ")))
    end
    apply_generic(st, e, t, words)
  end
  store_words(e, words)
end

------------------------------------------------------------------------
-- hardware cache names (perf 6.1: lexer words + parse_aliases prefix rule)

local OPRES = {}
for _, g in ipairs(events.cache_ops) do for _, w in ipairs(g) do OPRES[#OPRES + 1] = w end end
for _, g in ipairs(events.cache_results) do for _, w in ipairs(g) do OPRES[#OPRES + 1] = w end end
sort(OPRES, function(a, b) return #a > #b end)

local function alias_index(w, groups)
  local lw = lower(w)
  for i, g in ipairs(groups) do
    for _, a in ipairs(g) do
      if lower(sub(lw, 1, #a)) == lower(a) then return i - 1 end
    end
  end
  return nil
end

-- returns config or nil (not a cache name) or raises on a bad combination
local function cache_event(st, word, pos)
  local id, tlen
  for i, g in ipairs(events.cache_types) do
    for _, a in ipairs(g) do
      if word == a or (a ~= "branches" and sub(word, 1, #a + 1) == a .. "-") then
        if not tlen or #a > tlen then id, tlen = i - 1, #a end
      end
    end
  end
  if not id then return nil end
  local rest = sub(word, tlen + 2)
  local words = {}
  local p = 1
  while p <= #rest do
    local got
    for _, w in ipairs(OPRES) do
      if sub(rest, p, p + #w - 1) == w and (p + #w > #rest or sub(rest, p + #w, p + #w) == "-") then
        got = w
        break
      end
    end
    if not got then return nil end
    words[#words + 1] = got
    p = p + #got + 1
    if p == #rest + 1 and sub(rest, -1) == "-" then return nil end
  end
  if #words > 2 then return nil end
  local op, res
  for _, w in ipairs(words) do
    local o = (op == nil) and alias_index(w, events.cache_ops) or nil
    if o then
      if not events.cache_valid[id][o] then
        fail(st, pos, format("%s does not support '%s' (it has: %s)", events.cache_types[id + 1][1], w,
          id == abi.hw_cache.id.l1i and "loads, prefetches" or "loads"))
      end
      op = o
    elseif res == nil then
      res = alias_index(w, events.cache_results)
    end
  end
  op = op or abi.hw_cache.op.read
  if not events.cache_valid[id][op] then fail(st, pos, "invalid cache operation") end
  res = res or abi.hw_cache.result.access
  return id + op * CACHE_OP_MUL + res * CACHE_RESULT_MUL
end

------------------------------------------------------------------------
-- events

local function new_entry(name, attr, pos)
  return { name = name, attr = attr, mods = "", terms = {}, pos = pos, _assigned = {} }
end

local function event_end(st)
  local c = peek(st)
  if c == "" or c == "," or c == "}" or find(c, "%s") then return end
  fail(st, st.pos, format("unexpected '%s' after the event", c))
end

-- ':' mods (or mods right after a closing '/', as perf allows)
local function finish_mods(st, list, after_slash)
  local mods, mpos = "", st.pos
  if after_slash and find(peek(st), "%a") then
    mods, mpos = read_mods(st)
  elseif peek(st) == ":" then
    if after_slash then fail(st, st.pos, "modifiers go right after the closing '/' (no ':')") end
    st.pos = st.pos + 1
    mods, mpos = read_mods(st)
  end
  event_end(st)
  for _, e in ipairs(list) do
    e.mods = mods
    if mods ~= "" then
      apply_mods(st, e, mods, mpos, false)
    else
      e.attr.exclude_guest = true; e.guest_default = true
    end
  end
end

local function breakpoint_event(st, start)
  st.pos = st.pos + 4
  local apos = st.pos
  local atext = read_pat(st, "^0[xX]%x+") or read_pat(st, "^%d+")
  if not atext then fail(st, apos, "expected an address after 'mem:' (decimal or 0x hex)") end
  local addr = parse_number(st, atext, apos, "address")
  local len
  if peek(st) == "/" then
    st.pos = st.pos + 1
    local lpos = st.pos
    local ltext = read_pat(st, "^0[xX]%x+") or read_pat(st, "^%d+")
    if not ltext then fail(st, lpos, "expected a length after '/'") end
    len = parse_number(st, ltext, lpos, "length")
  end
  local bp_type
  local mods, mpos = "", st.pos
  if peek(st) == ":" then
    st.pos = st.pos + 1
    local acc_pos = st.pos
    local acc = match(st.s, "^[rwx]+", st.pos)
    if acc then
      acc = sub(acc, 1, 3)
      st.pos = st.pos + #acc
      bp_type = 0
      for i = 1, #acc do
        local c = sub(acc, i, i)
        if find(acc, c, i + 1, true) then fail(st, acc_pos + i, format("access '%s' given twice", c)) end
        bp_type = bp_type + abi.bp_type[c]
      end
      if peek(st) == ":" then st.pos = st.pos + 1 end
    end
    mods, mpos = read_mods(st)
  end
  event_end(st)
  bp_type = bp_type or abi.bp_type.rw
  local l = len and u64.tonumber(len) or 0
  if l == 0 then l = (bp_type == abi.bp_type.x) and 8 or 4 end
  if not len or u64.tonumber(len) then len = u64.new(0, 0) end
  local e = new_entry(sub(st.s, start, st.pos - 1), {
    type = TYPE.breakpoint, config = 0, bp_type = bp_type, bp_addr = num(addr),
    bp_len = (u64.iszero(len) and l) or num(len),
  }, start)
  e.mods = mods
  if mods ~= "" then apply_mods(st, e, mods, mpos, false) else e.attr.exclude_guest = true; e.guest_default = true end
  return { e }
end

local function tracepoint_event(st, start, sys)
  local tp = require("perf_event.tracepoint")
  st.pos = st.pos + 1
  local npos = st.pos
  local name = read_pat(st, WORD)
  if not name then fail(st, npos, "expected a tracepoint name after ':'") end
  local full = sys .. ":" .. name
  local list = {}
  if find(full, "[%*%?%[]") then
    for _, n in ipairs(tp.list(full, true)) do
      local t = tp.tracepoint(n)
      if t and t.id then
        list[#list + 1] = new_entry(n, { type = TYPE.tracepoint, config = t.id }, start)
      end
    end
    if #list == 0 then fail(st, start, format("no tracepoint matches '%s'", full)) end
  else
    local t, why = tp.tracepoint(full)
    if not t or not t.id then
      local msg = why or ("unknown tracepoint " .. full)
      local root = tp.root()
      if root then
        local close = suggest(full, function() return tp.list(sys .. ":*") end)
        if #close == 0 then
          close = suggest(sys, function()
            local syss, seen = {}, {}
            for _, n in ipairs(tp.list()) do
              local s = match(n, "^([^:]+)")
              if not seen[s] then seen[s] = true; syss[#syss + 1] = s end
            end
            return syss
          end)
        end
        msg = format("unknown tracepoint '%s'", full)
        if #close > 0 then msg = msg .. " (did you mean: " .. concat(close, ", ") .. "?)" end
      end
      fail(st, start, msg)
    end
    list[1] = new_entry(full, { type = TYPE.tracepoint, config = t.id }, start)
  end
  if peek(st) == "/" then fail(st, st.pos, "a tracepoint takes no '/terms/'") end
  finish_mods(st, list, false)
  if #list == 1 and not find(full, "[%*%?%[]") then list[1].name = sub(st.s, start, st.pos - 1) end
  return list
end

local function all_event_names()
  local out = {}
  for k in pairs(events.hardware) do out[#out + 1] = k end
  for k in pairs(events.software) do out[#out + 1] = k end
  for _, k in ipairs(events.cache_list()) do out[#out + 1] = k end
  for _, p in ipairs(pmu.pmus()) do
    out[#out + 1] = p.name
    for a in pairs(p.events) do out[#out + 1] = a end
  end
  return out
end

local function pmu_event(st, start, word)
  local pmus = pmu.match(word)
  if #pmus == 0 then
    local names = pmu.names()
    local close = suggest(word, names)
    fail(st, start, format("unknown PMU '%s'%s (PMUs here: %s)", word,
      #close > 0 and (" (did you mean: " .. concat(close, ", ") .. "?)") or "", concat(names, ", ")))
  end
  local terms = read_terms(st)
  local list = {}
  for _, p in ipairs(pmus) do
    local e = new_entry(nil, { type = p.type, config = 0 }, start)
    e.pmu = p.name
    apply_pmu_terms(st, e, p, terms)
    list[#list + 1] = e
  end
  finish_mods(st, list, true)
  local text = sub(st.s, start, st.pos - 1)
  for _, e in ipairs(list) do
    if not e.name then
      e.name = (#pmus > 1) and (e.pmu .. sub(text, #word + 1)) or text
    end
  end
  return list
end

local function symbol_event(st, start, attr)
  local e = new_entry(nil, attr, start)
  local after_slash = false
  if peek(st) == "/" then
    e._word = sub(st.s, start, st.pos - 1)
    apply_symbol_terms(st, e, read_terms(st))
    after_slash = true
  end
  finish_mods(st, { e }, after_slash)
  e.name = e.name or sub(st.s, start, st.pos - 1)
  return { e }
end

local function parse_event(st)
  skip_space(st)
  local start = st.pos
  if sub(st.s, start, start + 3) == "mem:" then return breakpoint_event(st, start) end
  local word = read_pat(st, WORD)
  if not word then
    local c = peek(st)
    if c == "" then fail(st, st.pos, "expected an event name at the end") end
    fail(st, st.pos, format("expected an event name, got '%s'", c))
  end
  local c = peek(st)
  local hw, sw = events.hardware[word], events.software[word]
  if hw then return symbol_event(st, start, { type = TYPE.hardware, config = hw }) end
  if sw then return symbol_event(st, start, { type = TYPE.software, config = sw }) end
  local hex = match(word, "^r(%x+)$")
  if hex then
    local v, why = u64.parse_hex(hex)
    if not v then
      fail(st, start, why == "overflow" and "raw event code does not fit in 64 bits"
        or "bad raw event code")
    end
    return symbol_event(st, start, { type = TYPE.raw, config = num(v) })
  end
  local cfg = cache_event(st, word, start)
  if cfg then return symbol_event(st, start, { type = TYPE.hw_cache, config = cfg }) end
  if c == "/" then return pmu_event(st, start, word) end
  -- a bare PMU alias (perf: `tsc` finds msr/tsc/), else sys:name
  local list = {}
  for _, p in ipairs(pmu.pmus()) do
    if p.events[word] then
      local e = new_entry(word, { type = p.type, config = 0 }, start)
      e.pmu = p.name
      apply_pmu_terms(st, e, p, { { name = word, pos = start, vpos = start } })
      list[#list + 1] = e
    end
  end
  if #list > 0 then
    finish_mods(st, list, false)
    for _, e in ipairs(list) do e.name = sub(st.s, start, st.pos - 1) end
    return list
  end
  if c == ":" then return tracepoint_event(st, start, word) end
  local close = suggest(word, all_event_names)
  fail(st, start, format("unknown event '%s'%s", word,
    #close > 0 and (" (did you mean: " .. concat(close, ", ") .. "?)") or ""))
end

------------------------------------------------------------------------
-- lists and groups

local function finalize(e)
  e._assigned = nil
  e._exclude_GH = nil
  e._word = nil
  e.pos = nil
  return e
end

local function parse_list(st)
  local out = {}
  local ngroups = 0
  skip_space(st)
  if st.pos > #st.s then fail(st, st.pos, "empty event list") end
  while true do
    skip_space(st)
    local gname = match(st.s, "^([%w_%.%-]*){", st.pos)
    if gname then
      local gstart = st.pos
      st.pos = st.pos + #gname + 1
      ngroups = ngroups + 1
      local members = {}
      while true do
        skip_space(st)
        if peek(st) == "{" then fail(st, st.pos, "groups cannot be nested") end
        if peek(st) == "}" then fail(st, st.pos, "empty group member") end
        for _, e in ipairs(parse_event(st)) do members[#members + 1] = e end
        skip_space(st)
        local c = peek(st)
        if c == "}" then st.pos = st.pos + 1 break end
        if c == "," then
          st.pos = st.pos + 1
        elseif c == "" then
          fail(st, gstart, "unclosed '{'")
        else
          fail(st, st.pos, format("unexpected '%s' in group", c))
        end
      end
      local gmods, gpos = "", st.pos
      if peek(st) == ":" then
        st.pos = st.pos + 1
        gmods, gpos = read_mods(st)
      end
      event_end(st)
      for i, e in ipairs(members) do
        if gmods ~= "" then
          apply_mods(st, e, gmods, gpos, true, i > 1)
          e.guest_default = nil
          e.mods = e.mods .. gmods
        end
        e.group = ngroups
        e.leader = (i == 1)
        if gname ~= "" then e.group_name = gname end
        out[#out + 1] = finalize(e)
      end
    else
      if peek(st) == "}" then fail(st, st.pos, "'}' without '{'") end
      for _, e in ipairs(parse_event(st)) do
        e.leader = false
        out[#out + 1] = finalize(e)
      end
    end
    skip_space(st)
    local c = peek(st)
    if c == "" then break end
    if c ~= "," then fail(st, st.pos, format("unexpected '%s' (events are separated by ',')", c)) end
    st.pos = st.pos + 1
    skip_space(st)
    if st.pos > #st.s or peek(st) == "," then fail(st, st.pos, "expected an event after ','") end
  end
  return out
end

local function protected(str, fn)
  local ok, res = pcall(fn)
  if ok then return res end
  if type(res) == "table" and getmetatable(res) == ERR then
    return nil, render(str, res.pos, res.msg)
  end
  error(res, 0)
end

--- Parses a comma-separated list of events (`{a,b}:mod` groups included).
-- @tparam string str e.g. `"cycles:u,{task-clock,page-faults}:k"`
-- @treturn[1] table array of `{name=, attr=, group=<n|nil>, leader=<bool>, mods=<string>,
--   pmu=, alias=, scale=, unit=, per_pkg=, snapshot=, terms={...}, bits={...},
--   precise_max=, sample_read=, weak=}`
-- @treturn[2] nil
-- @treturn[2] string the error, quoting the string with a caret under the bad spot
function M.parse(str)
  if type(str) ~= "string" then
    return nil, "perf_event: an event string is expected, got " .. type(str)
  end
  return protected(str, function()
    local st = { s = str, pos = 1 }
    return parse_list(st)
  end)
end

-- ---------------------------------------------------------------------
-- describe / tostring

-- perf's print order, labels and hex fields (perf_event_attr_fprintf.c),
-- from the core's attr field table
local ORDER, HEXF = {}, {}
for _, f in ipairs(abi.attr_fields) do
  if f.perf then
    ORDER[#ORDER + 1] = { f.name, f.perf ~= f.name and f.perf or nil }
    HEXF[f.name] = f.hex or nil
  end
end

local function fmt_value(k, v)
  if v == true then return "1" end
  if HEXF[k] then
    local h = u64.tohex(v)
    if h then return h end
  end
  if type(v) == "number" or type(v) == "string" or type(v) == "cdata" then
    local u = u64.from(v)
    if u and u64.tonumber(u) then return tostring(u64.tonumber(u)):gsub("%.0$", "") end
  end
  return tostring(v)
end

local function iszero(v)
  if v == nil or v == false then return true end
  local u = u64.from(v)
  return u ~= nil and u64.iszero(u)
end

--- An attr table as text, in perf's `-vv` layout (non-zero fields only).
-- @tparam table attr
-- @treturn string
function M.format_attr(attr)
  local lines = { "perf_event_attr:" }
  for _, o in ipairs(ORDER) do
    local k = o[1]
    local v = attr[k]
    if not iszero(v) then
      lines[#lines + 1] = format("  %-32s %s", o[2] or k, fmt_value(k, v))
    end
  end
  return concat(lines, "\n")
end

local ATTR_MT = { __tostring = function(a) return M.format_attr(a) end }

--- Describes a spec: for each event the attr perf would print and which
-- sysfs format terms produced which config bits.  The spec is resolved by
-- perf_event.resolve, as for `pe.open`.
-- @param spec an event string (or a table accepted by `attr`)
-- @treturn[1] string
-- @treturn[2] nil
-- @treturn[2] string error
function M.describe(spec)
  local list, err = require("perf_event.resolve").entries(spec)
  if not list then return nil, err end
  local out = {}
  for _, e in ipairs(list) do
    local head = e.name
    if e.group then head = format("%s  (group %d%s)", head, e.group, e.leader and ", leader" or "") end
    if e.pmu then head = head .. "  pmu " .. e.pmu end
    out[#out + 1] = head
    out[#out + 1] = M.format_attr(e.attr)
    for _, b in ipairs(e.bits or {}) do
      out[#out + 1] = format("  # %s=%s -> %s (format %s, from %s)", b.term, b.value, b.config,
        b.spec, b.from)
    end
    if e.scale or e.unit then
      out[#out + 1] = format("  # scale %s unit %s", tostring(e.scale), tostring(e.unit))
    end
    if e.mods and e.mods ~= "" then out[#out + 1] = "  # modifiers :" .. e.mods end
  end
  return concat(out, "\n")
end

--- Gives an attr table the `__tostring` that prints it like perf -vv.
-- @tparam table a
-- @treturn table a
function M.attr_table(a)
  return setmetatable(a, ATTR_MT)
end

--- Builds one attr table from a spec (an event string, `{event="...", field=...}`,
-- or a full attr table with `type`): perf_event.resolve's `attr`, as `pe.attr`.
-- @treturn[1] table attr fields named as in linux/perf_event.h (tostring() prints it like perf -vv)
-- @treturn[2] nil
-- @treturn[2] string
function M.attr(spec)
  return require("perf_event.resolve").attr(spec)
end

M.render_error = render

return M
