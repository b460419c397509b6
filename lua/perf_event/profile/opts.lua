--- perf_event.profile.opts: the options of `pe.profile.start` and what each
-- must be (not a public interface). `check` returns nil and the message for
-- a caller's mistake, which `start` raises at its caller's line: a value of
-- the wrong type, a rate or size that is not a positive integer, `freq` and
-- `period` together, an unknown name (with the closest known one). What
-- only the kernel can refuse (an event it does not have, a rate above
-- perf_event_max_sample_rate, a `stack` size it will not copy) is not
-- checked here: `start` returns it as `nil, err`.
-- @module perf_event.profile.opts

local format, lower, sub, byte = string.format, string.lower, string.sub, string.byte
local floor, min, max = math.floor, math.min, math.max
local concat, sort = table.concat, table.sort
local type, tostring, pairs, ipairs = type, tostring, pairs, ipairs

local M = {}

local HUGE = math.huge

local function whole(v) return v == v and v ~= HUGE and v ~= -HUGE and v == floor(v) end

-- a whole number > 0 (a rate, a count)
local function positive(v)
  if not whole(v) or v < 1 then return "must be a positive integer, got " .. tostring(v) end
  if v >= 2^63 then return "must be a positive integer below 2^63, got " .. tostring(v) end
end

local function zero_or_positive(v)
  if v ~= 0 and positive(v) then return "must be 0 or a positive integer, got " .. tostring(v) end
end

-- a whole number in [lo, hi]
local function integer_in(lo, hi)
  return function(v)
    if not whole(v) or v < lo or v > hi then
      return format("must be an integer in %d..%d, got %s", lo, hi, tostring(v))
    end
  end
end

local function power_of_two(v)
  local e = positive(v)
  if e then return "must be a power of two, got " .. tostring(v) end
  local n = v
  while n > 1 and n % 2 == 0 do n = n / 2 end
  if n ~= 1 then return "must be a power of two, got " .. tostring(v) end
end

local function one_of(...)
  local ok, words = {}, {}
  for _, w in ipairs({ ... }) do ok[w] = true; words[#words + 1] = format("%q", w) end
  local said = concat(words, " or ")
  return function(v)
    if not ok[v] then return "must be " .. said .. ", got " .. tostring(v) end
  end
end

-- name -> { the Lua type, a check of the value (nil: any of that type) }.
-- The ranges of hook_count, hook_slots and depth are csrc/puc/hook.c's.
M.OPTIONS = {
  event = { "string" },
  freq = { "number", positive },
  period = { "number", positive },
  pages = { "number", power_of_two },
  stack = { "number", zero_or_positive },
  stacks = { "boolean" },
  lua = { "boolean" },
  perfmap = { "boolean" },
  keep = { "boolean" },
  hook = { "string", one_of("signal", "count") },
  hook_count = { "number", integer_in(1, 1e9) },
  hook_slots = { "number", integer_in(16, 2^20) },
  depth = { "number", integer_in(1, 1024) },
  hook_leaf = { "boolean" },
  walk = { "string", function(v)
    if v ~= "safepoint" then
      return 'must be "safepoint" (the safe point is LuaJIT\'s one stack sampler: the signal-time walk, "signal", '
             .. "is gone), got " .. tostring(v)
    end
  end },
  lj_mode = { "string", one_of("l", "f") },
  sigtrap = { "boolean" },
  block = { "boolean" },
  kernel = { "boolean" },
}

local NAMES = {}
for k in pairs(M.OPTIONS) do NAMES[#NAMES + 1] = k end
sort(NAMES)

-- the edit distance of a and b (a few short names: no bound needed)
local function distance(a, b)
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = { [0] = i }
    for j = 1, #b do
      cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (byte(a, i) == byte(b, j) and 0 or 1))
    end
    prev = cur
  end
  return prev[#b]
end

-- the known name closest to `word` (fewest edits), or nil: a name that
-- starts the word or that the word starts (3 letters at least:
-- `frequency`, `pagesize`), or one a typo away (an edit per 4 letters, at
-- least one: `evnt`, `perod`, `hook_cont`)
function M.closest(word)
  local w = lower(word)
  local best, score
  for _, c in ipairs(NAMES) do
    local d = distance(w, c)
    local near = d <= max(1, floor(#w / 4))
      or (#c >= 3 and sub(w, 1, #c) == c) or (#w >= 3 and sub(c, 1, #w) == w)
    if near and (not score or d < score) then best, score = c, d end
  end
  return best
end

--- The message for what is wrong with `opts` (nil or a table), or nil.
-- @treturn[opt] string
function M.check(opts)
  if opts == nil then return nil end
  if type(opts) ~= "table" then return "profile.start: opts must be a table, got " .. type(opts) end
  -- sorted, so that the message does not depend on the table's order
  local keys = {}
  for k in pairs(opts) do keys[#keys + 1] = k end
  sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  for _, k in ipairs(keys) do
    local o = type(k) == "string" and M.OPTIONS[k]
    if not o then
      local near = type(k) == "string" and M.closest(k)
      return format("profile.start: unknown option '%s'%s", tostring(k),
                    near and format(" (did you mean '%s'?)", near) or " (options: " .. concat(NAMES, ", ") .. ")")
    end
    local v = opts[k]
    if type(v) ~= o[1] then
      return format("profile.start: option '%s' must be a %s, got %s", k, o[1], type(v))
    end
    local e = o[2] and o[2](v)
    if e then return format("profile.start: option '%s' %s", k, e) end
  end
  if opts.freq and opts.period then
    return "profile.start: options 'freq' and 'period' exclude each other (a rate, or a count of events per sample)"
  end
  return nil
end

return M
