--- perf_event.speedscope: profiles as speedscope's JSON file format
-- (https://www.speedscope.app/file-format-schema.json), a "sampled"
-- profile over shared frames.
--
--    local speedscope = require("perf_event.speedscope")
--    assert(io.open("cpu.speedscope.json", "w")):write(speedscope.from_profile(p))
--
-- It reads the neutral table of perf_event.pprof (`pprof.encode`'s input:
-- `samples` of root-first `frames` and `values`), so a `pe.profile` and
-- `luaperf record`'s samples both come through it.
-- @module perf_event.speedscope

local string, table, math = string, table, math
local type, tostring, ipairs, pairs, error, require, rawget =
      type, tostring, ipairs, pairs, error, require, rawget
local format, concat, floor = string.format, table.concat, math.floor
local mtype = rawget(math, "type")

local M = {}

-- ---------------------------------------------------------------- JSON

local ESC = { ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f", ["\n"] = "\\n",
              ["\r"] = "\\r", ["\t"] = "\\t" }

local function jstring(s)
  s = tostring(s):gsub('[%c"\\]', function(c) return ESC[c] or format("\\u%04x", c:byte()) end)
  return '"' .. s .. '"'
end

local function jnumber(n)
  if n ~= n or n == math.huge or n == -math.huge then error("speedscope: a number JSON cannot hold: " .. n, 3) end
  if (mtype and mtype(n) == "integer") or (n == floor(n) and n > -2^53 and n < 2^53) then
    return format("%d", n)
  end
  return format("%.17g", n)
end

local json -- forward

local function jarray(a, buf)
  buf[#buf + 1] = "["
  for i, v in ipairs(a) do
    if i > 1 then buf[#buf + 1] = "," end
    json(v, buf)
  end
  buf[#buf + 1] = "]"
end

-- arrays are marked (an empty one must still print as [])
local ARRAY = {}
local function array(a) a[ARRAY] = true return a end

-- objects keep their keys sorted: one table gives one text
local function jobject(o, buf)
  local keys = {}
  for k in pairs(o) do
    if type(k) ~= "string" then error("speedscope: JSON object keys must be strings", 3) end
    keys[#keys + 1] = k
  end
  table.sort(keys)
  buf[#buf + 1] = "{"
  for i, k in ipairs(keys) do
    if i > 1 then buf[#buf + 1] = "," end
    buf[#buf + 1] = jstring(k)
    buf[#buf + 1] = ":"
    json(o[k], buf)
  end
  buf[#buf + 1] = "}"
end

json = function(v, buf)
  local t = type(v)
  if t == "string" then buf[#buf + 1] = jstring(v)
  elseif t == "number" then buf[#buf + 1] = jnumber(v)
  elseif t == "boolean" then buf[#buf + 1] = tostring(v)
  elseif t == "table" then
    if rawget(v, ARRAY) or v[1] ~= nil then jarray(v, buf) else jobject(v, buf) end
  else
    error("speedscope: cannot write a " .. t .. " as JSON", 3)
  end
end

-- ---------------------------------------------------------------- encode

-- the text speedscope shows for a frame, and its file
local function frame_of(fr, mappings)
  local file = fr.file
  if not file and fr.mapping and mappings and mappings[fr.mapping] then file = mappings[fr.mapping].file end
  local f = { name = tostring(fr.name or "[unknown]") }
  if file then f.file = tostring(file) end
  if fr.line and fr.line ~= 0 then f.line = fr.line end
  return f
end

--- The speedscope JSON of a profile in perf_event.pprof's neutral form.
-- Each distinct stack is one sample whose weight is its value (the first
-- value, the sample count, by default), frames shared by name, file and line.
-- @tparam table t the neutral table (`samples = { {frames=, values=}, ... }`)
-- @tparam[opt] table opts `name` (the profile's name), `value` (which value
--   is the weight: 1, the count; 2, e.g. nanoseconds of a clock event);
--   `values` (a list of value indexes): one profile for each, named by its
--   sample type, over the samples whose value there is not 0 (`luaperf
--   record` with several events)
-- @treturn string JSON text
function M.encode(t, opts)
  opts = opts or {}
  if type(t) ~= "table" or type(t.samples) ~= "table" then
    error("speedscope.encode: a table with samples expected", 2)
  end
  if opts.values ~= nil and (type(opts.values) ~= "table" or #opts.values == 0) then
    error("speedscope.encode: opts.values must be a list of value indexes", 2)
  end
  local frames, fidx, by_frame = array({}), {}, {}
  local stacks = {}
  for i, s in ipairs(t.samples) do
    if type(s) ~= "table" or type(s.frames) ~= "table" or type(s.values) ~= "table" then
      error(format("speedscope.encode: samples[%d] must be {frames=, values=}", i), 2)
    end
    local stack = array({})
    for j, fr in ipairs(s.frames) do
      local id = by_frame[fr]   -- producers reuse one table for a repeated frame
      if not id then
        if type(fr) ~= "table" then
          error(format("speedscope.encode: samples[%d].frames[%d] is not a table", i, j), 2)
        end
        local f = frame_of(fr, t.mappings)
        local k = concat({ f.name, f.file or "", tostring(f.line or "") }, "\0")
        id = fidx[k]
        if not id then
          id = #frames
          frames[id + 1] = f
          fidx[k] = id
        end
        by_frame[fr] = id
      end
      stack[#stack + 1] = id
    end
    stacks[i] = stack
  end
  local function profile(vi, pname, keep_zero)
    local vt = t.sample_types and t.sample_types[vi]
    -- speedscope's units: a clock's nanoseconds stay, anything else is "none"
    local unit = (vt and vt.unit == "nanoseconds") and "nanoseconds" or "none"
    local samples, weights, same = array({}), array({}), {}
    local total = 0
    for i, s in ipairs(t.samples) do
      local w = s.values[vi] or error(format("speedscope.encode: samples[%d] has no value %d", i, vi), 3)
      if keep_zero or w ~= 0 then
        -- stacks that differ only in addresses (or pid) name the same frames: one sample
        local sk = concat(stacks[i], ",")
        local at = same[sk]
        if at then weights[at] = weights[at] + w
        else
          samples[#samples + 1] = stacks[i]
          weights[#weights + 1] = w
          same[sk] = #weights
        end
        total = total + w
      end
    end
    return { type = "sampled", name = pname or (vt and vt.type) or "profile", unit = unit, startValue = 0,
             endValue = total, samples = samples, weights = weights }
  end
  local profiles = array({})
  if opts.values then
    for _, vi in ipairs(opts.values) do profiles[#profiles + 1] = profile(vi, nil, false) end
  else
    local vi = opts.value or 1
    local vt = t.sample_types and t.sample_types[vi]
    profiles[1] = profile(vi, opts.name or (vt and vt.type) or "profile", true)
  end
  local doc = {
    ["$schema"] = "https://www.speedscope.app/file-format-schema.json",
    exporter = "perf_event.speedscope",
    name = opts.name or profiles[1].name,
    activeProfileIndex = 0,
    shared = { frames = frames },
    profiles = profiles,
  }
  local buf = {}
  json(doc, buf)
  return concat(buf)
end

--- A `pe.profile` as speedscope JSON: `encode(pprof.profile_table(p, opts), opts)`.
-- @tparam table p the profile
-- @tparam[opt] table opts as perf_event.pprof's profile_table and encode
-- @treturn string JSON text
function M.from_profile(p, opts)
  if type(p) ~= "table" or type(p.aggregate) ~= "function" then
    error("speedscope.from_profile: a pe.profile expected", 2)
  end
  return M.encode(require("perf_event.pprof").profile_table(p, opts), opts)
end

return M
