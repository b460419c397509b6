--- perf_event.parse.lex: the event-string scanner's pieces: errors with a
-- position (raised as tables, rendered with a caret under the bad spot),
-- "did you mean" suggestions, and reading words, numbers and patterns at
-- the cursor `st = {s=, pos=}`.
-- Not a public interface: reached through perf_event (doc/api.md lists what is).
-- @module perf_event.parse.lex

local u64 = require("perf_event.u64")

local type, ipairs, error, pcall, tostring, setmetatable, getmetatable =
  type, ipairs, error, pcall, tostring, setmetatable, getmetatable
local min, max, floor = math.min, math.max, math.floor
local sub, find, format, rep, lower, byte =
  string.sub, string.find, string.format, string.rep, string.lower, string.byte
local sort = table.sort

local M = {}

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


-- runs fn; a raised position error becomes nil, the rendered message
local function protected(str, fn)
  local ok, res = pcall(fn)
  if ok then return res end
  if type(res) == "table" and getmetatable(res) == ERR then
    return nil, render(str, res.pos, res.msg)
  end
  error(res, 0)
end

M.fail, M.render, M.protected = fail, render, protected
M.num, M.small_or, M.suggest = num, small_or, suggest
M.WORD, M.skip_space, M.peek, M.read_pat, M.parse_number = WORD, skip_space, peek, read_pat, parse_number

return M
