-- Child of spec/dump_spec.lua: a plain LuaJIT program that knows nothing
-- of perf_event, stopped at a known stack or spinning in a known one.
-- Run as: luajit dump_target.lua MODE. The blocking modes print "ready",
-- then wait in io.read under the stack the mode names, print "read LINE"
-- and exit once a line arrives. Each call site ends with a marker comment
-- (--@name) that the spec finds to know its line.
local mode = arg[1]
local function ready() io.stdout:write("ready\n") io.stdout:flush() end

local function gamma() ready() local l = io.read("*l") return l end   --@gamma
local function beta() local l = gamma() return l end                  --@beta
local function alpha() local l = beta() return l end                  --@alpha

local function p_inner() ready() local l = io.read("*l") return l end --@p_inner
local function p_outer() local _, l = pcall(p_inner) return l end     --@p_outer

local got
local function s_cmp(a, b)
  if not got then ready() got = io.read("*l") end                     --@s_cmp
  return a < b
end
local function s_outer() table.sort({ 2, 1 }, s_cmp) return got end   --@s_outer

local function g_repl() ready() got = io.read("*l") return "" end     --@g_repl
local function g_outer() string.gsub("x", "x", g_repl) return got end --@g_outer

local function m_index() ready() got = io.read("*l") return got end   --@m_index
local function m_outer() local t = setmetatable({}, { __index = m_index }) local v = t.k return v end --@m_outer

local function co_body() ready() local l = io.read("*l") return l end --@co_body
local function co_outer() local _, l = coroutine.resume(coroutine.create(co_body)) return l end --@co_outer

-- spinning: leaf's loop, under mid, under top, forever
local function leaf(n) local s = 0 for i = 1, n do s = s + i % 7 end return s end
local function mid(n) local s = leaf(n) return s + 1 end              --@mid
local function top() local t = 0 while true do t = t + mid(1000) end end --@top

-- calling: a call and a return every few instructions, interpreted
local function tiny(x) return x + 1 end
local function caller() local t = 0 while true do t = tiny(t) end end  --@caller

-- allocating: the GC runs all the time (its lists link the main thread)
local function churn() local t while true do t = { tostring(#(t or "")), {} } end end --@churn

local blocking = { block = alpha, pcall = p_outer, sort = s_outer, gsub = g_outer, meta = m_outer, co = co_outer }
if blocking[mode] then
  local l = blocking[mode]()                                          --@main
  io.stdout:write("read ", tostring(l), "\n")
elseif mode == "alloc" then
  churn()                                                             --@main_churn
elseif mode == "interp" or mode == "jit" then
  if mode == "interp" then jit.off() end
  top()                                                               --@main_spin
elseif mode == "calls" then
  jit.off()
  caller()                                                            --@main_calls
else
  error("mode? " .. tostring(mode))
end
