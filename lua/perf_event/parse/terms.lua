--- perf_event.parse.terms: what follows an event name: the `:ukhGHIpPSDWeb`
-- modifiers (perf 6.1 get_event_modifier / check_modifier) and the terms
-- inside `pmu/.../` (sysfs format/ fields and perf's generic terms).
-- Not a public interface: reached through perf_event (doc/api.md lists what is).
-- @module perf_event.parse.terms

local u64 = require("perf_event.u64")
local pmu = require("perf_event.pmu")
local events = require("perf_event.events")
local abi = require("perf_event.core").abi
local lex = require("perf_event.parse.lex")
local fail, suggest, num, small_or = lex.fail, lex.suggest, lex.num, lex.small_or
local skip_space, peek, read_pat, parse_number = lex.skip_space, lex.peek, lex.read_pat, lex.parse_number

local pairs, ipairs, tostring = pairs, ipairs, tostring
local sub, find, match, format = string.sub, string.find, string.match, string.format
local concat, sort = table.concat, table.sort

local M = {}

local ST, BR = abi.sample_type, abi.branch_sample_type
local MODCHARS = events.modifiers
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


M.read_mods, M.apply_mods = read_mods, apply_mods
M.read_terms, M.apply_pmu_terms, M.apply_symbol_terms = read_terms, apply_pmu_terms, apply_symbol_terms

return M
