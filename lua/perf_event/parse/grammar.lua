--- perf_event.parse.grammar: event strings in perf's syntax -> entries
-- with their perf_event_attr tables: hardware cache names, breakpoints,
-- tracepoints, `pmu/terms/`, symbolic names, then `{...}:mods` groups and
-- comma-separated lists (perf 6.1 rules, modifiers included).
-- Not a public interface: reached through perf_event (doc/api.md lists what is).
-- @module perf_event.parse.grammar

local u64 = require("perf_event.u64")
local pmu = require("perf_event.pmu")
local events = require("perf_event.events")
local abi = require("perf_event.core").abi
local lex = require("perf_event.parse.lex")
local fail, suggest, num = lex.fail, lex.suggest, lex.num
local WORD, skip_space, peek, read_pat, parse_number =
  lex.WORD, lex.skip_space, lex.peek, lex.read_pat, lex.parse_number
local T = require("perf_event.parse.terms")
local read_mods, apply_mods = T.read_mods, T.apply_mods
local read_terms, apply_pmu_terms, apply_symbol_terms = T.read_terms, T.apply_pmu_terms,
  T.apply_symbol_terms

local type, pairs, ipairs, require = type, pairs, ipairs, require
local floor = math.floor
local sub, find, match, format, lower = string.sub, string.find, string.match, string.format, string.lower
local concat, sort = table.concat, table.sort

local M = {}

local TYPE = events.TYPE
-- hw_cache config = id | op << op_shift | result << result_shift (integers on 5.3+)
local CACHE_OP_MUL = floor(2 ^ abi.hw_cache.op_shift)
local CACHE_RESULT_MUL = floor(2 ^ abi.hw_cache.result_shift)

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
  return lex.protected(str, function()
    local st = { s = str, pos = 1 }
    return parse_list(st)
  end)
end


return M
