-- Child of spec/record_remote_spec.lua: a plain LuaJIT program that knows
-- nothing of perf_event, running one function of each class of code in
-- turns (a gsub callback, a sort comparator, metamethods, allocation and
-- GC, pcall, a coroutine, a compiled loop, a jit.off function), each call
-- timed with os.clock. Run as: luajit remote_target.lua SECONDS READY_FILE.
-- Writes READY_FILE when its loop starts; after SECONDS of the cases' CPU
-- time prints each case's seconds ("cls_x 0.123") and exits.
local seconds, ready = tonumber(arg[1]) or 2, arg[2]
local clock = os.clock

local function repl(w) return w:upper() end
local function cls_gsub(n) local s = ("abc def "):rep(n) return (s:gsub("%a+", repl)) end
local function cmp(a, b) return a > b end
local function cls_sort(n)
  local t = {}
  for i = 1, n do t[i] = (i * 7919) % 1009 end
  table.sort(t, cmp)
  return t[1]
end
local mt = { __index = function(_, k) return k * 2 end, __add = function(a, b) return a.v + b.v end }
local function cls_meta(n)
  local a, b, s = setmetatable({ v = 1 }, mt), setmetatable({ v = 2 }, mt), 0
  for i = 1, n do s = s + a[i] + (a + b) end
  return s
end
local function cls_alloc(n)
  local keep
  for i = 1, n do keep = { i, tostring(i), { i } } end
  return #keep
end
local function thrower(i) if i % 2 == 0 then error("even") end return i end
local function cls_pcall(n)
  local s = 0
  for i = 1, n do local ok, v = pcall(thrower, i) if ok then s = s + v end end
  return s
end
local function co_body(n) for i = 1, n do coroutine.yield(i) end end
local function cls_co(n)
  local co, s = coroutine.wrap(co_body), 0
  for _ = 1, n do s = s + co(n) end
  return s
end
local function cls_loop(n)
  local s = 0
  for i = 1, n do s = s + (i % 13) * 3 end
  return s
end
local function cls_off(n)
  local s = 0
  for i = 1, n do s = s + (i % 11) * 5 end
  return s
end
jit.off(cls_off)

local cases = {
  { "cls_gsub", cls_gsub, 4000 }, { "cls_sort", cls_sort, 3000 }, { "cls_meta", cls_meta, 400000 },
  { "cls_alloc", cls_alloc, 8000 }, { "cls_pcall", cls_pcall, 1600 }, { "cls_co", cls_co, 28000 },
  { "cls_loop", cls_loop, 400000 }, { "cls_off", cls_off, 150000 },
}
local t, total = {}, 0
for _, c in ipairs(cases) do t[c[1]] = 0 end
if ready then local f = io.open(ready, "w") f:write("go\n") f:close() end
while total < seconds do
  for _, c in ipairs(cases) do
    local c0 = clock()
    c[2](c[3])
    local dt = clock() - c0
    t[c[1]] = t[c[1]] + dt
    total = total + dt
  end
end
for _, c in ipairs(cases) do io.write(c[1], " ", string.format("%.6f", t[c[1]]), "\n") end
