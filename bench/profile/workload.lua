--- bench/profile/workload.lua - the fixed workload of bench/profile/safepoint.lua
-- and bench/profile/sample_cost.lua (loaded with dofile, from the repository
-- root): string.format/upper, gsub with a callback, table.sort with a Lua
-- comparator, a pcall/error loop, an allocating loop and a plain compiled
-- loop, each under `deep` frames. SLICES lists them with their sizes.
local sformat, supper, sgsub, tsort = string.format, string.upper, string.gsub, table.sort
local pcall, error, tostring = pcall, error, tostring

local function w_fmt(n)
  local s = 0
  for i = 1, n do s = s + #supper(sformat("%d:%s:%5.2f", i, "abc", i / 3)) end
  return s
end
local function w_repl(w) return w .. "!" end
local function w_gsub(n)
  local s = 0
  for _ = 1, n do s = s + #sgsub("alpha beta gamma delta epsilon", "%a+", w_repl) end
  return s
end
local function w_cmp(a, b) return a < b end
local function w_sort(n)
  local t = {}
  for i = 1, n do t[i] = (i * 7919) % 10007 end
  tsort(t, w_cmp)
  return t[1]
end
local function w_throw(i) if i % 2 == 0 then error("even") end return i end
local function w_pcall(n)
  local bad = 0
  for i = 1, n do if not pcall(w_throw, i) then bad = bad + 1 end end
  return bad
end
local function w_alloc(n)
  local keep = {}
  for i = 1, n do keep[i % 64 + 1] = { i, tostring(i) } end
  return #keep
end
local function w_lua(n)
  local s = 0
  for i = 1, n do s = (s * 31 + i) % 1000003 end
  return s
end
local function deep(d, f, n)
  if d == 0 then return f(n) end
  return deep(d - 1, f, n) + 0
end
return {
  deep = deep,
  SLICES = { { w_fmt, 30000 }, { w_gsub, 6000 }, { w_sort, 30000 }, { w_pcall, 30000 },
             { w_alloc, 60000 }, { w_lua, 2000000 } },
}
