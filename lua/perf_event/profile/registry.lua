--- perf_event.profile.registry: the LuaJIT code a sampled address can lie
-- in (not a public interface): the bytecode ranges of the known prototypes
-- (`protos`) and the machine code of the live traces (`live`), each trace
-- written to the perf tool's runtime map when `perfmap` is a file.
-- perf_event.luamap keeps its map with it, and pe.profile's perfmap=true.
-- @module perf_event.profile.registry

local format = string.format
local type, pairs, ipairs, setmetatable, pcall, rawget, require =
  type, pairs, ipairs, setmetatable, pcall, rawget, require
local debug, package = debug, package

local raw = require("perf_event.profile.raw")
local naming = require("perf_event.profile.naming")
local addr_of, u64p, FN_PC_OFFSET = raw.addr_of, raw.u64p, raw.FN_PC_OFFSET
local proto_info, frame_name = naming.proto_info, naming.frame_name

local jutil
if rawget(_G, "jit") then jutil = require("jit.util") end

local M = {}

local Reg = {}
Reg.__index = Reg
M.Reg = Reg

function M.new_registry()
  return setmetatable({ protos = {}, by_lo = {}, live = {}, pending = {}, nflush = 0 }, Reg)
end

-- registers the bytecode range [lo, lo + 4*n) of a function or prototype
function Reg:add_bc(obj, lo)
  if self.by_lo[lo] then return end
  local fi = jutil.funcinfo(obj)
  if not fi or not fi.bytecodes then return end
  local e = { lo = lo, hi = lo + 4 * fi.bytecodes, obj = obj, info = proto_info(fi) }
  self.by_lo[lo] = e
  self.protos[#self.protos + 1] = e
end

function Reg:add_proto(pt, off)
  local a = addr_of(pt)
  if a then self:add_bc(pt, a + off) end
end

-- how many entries of one table are looked at for functions (a big data
-- table in an upvalue would otherwise make start slow), and how many
-- functions and prototypes one start visits through upvalues and locals
-- (up to about 75 ms of CPU time, seen with a chain of 200000 closures)
local TABLE_SCAN = 4096
local VISIT_BUDGET = 10000

-- the functions among the values of table t (the first TABLE_SCAN), onto
-- the work list
local function push_table_functions(t, work, seen)
  if seen[t] then return end
  seen[t] = true
  local n = 0
  for _, x in pairs(t) do
    if type(x) == "function" and not seen[x] then work[#work + 1] = x end
    n = n + 1
    if n >= TABLE_SCAN then break end
  end
end

-- a Lua function and the prototypes nested in it, and the functions it
-- holds as upvalues (directly, or as the values of a table upvalue), and
-- theirs in turn: a module's local helpers are siblings of its exported
-- functions in the main chunk, which is gone once it has run. A work list,
-- not recursion, so a long chain of closures cannot overflow the stack.
function Reg:add_tree(root, off, seen)
  local work = { root }
  while #work > 0 do
    local obj = work[#work]
    work[#work] = nil
    if not seen[obj] then
      seen[obj] = true
      local lua = true
      if type(obj) == "function" then
        local ok, fi = pcall(jutil.funcinfo, obj)
        if not ok or not fi or not fi.bytecodes then
          lua = false                                  -- a C function
        else
          self:add_bc(obj, u64p(addr_of(obj) + FN_PC_OFFSET))
          self.nvisit = (self.nvisit or 0) + 1
          for u = 1, self.nvisit <= VISIT_BUDGET and fi.upvalues or 0 do
            local _, v = debug.getupvalue(obj, u)
            if type(v) == "function" then
              if not seen[v] then work[#work + 1] = v end
            elseif type(v) == "table" then
              push_table_functions(v, work, seen)
            end
          end
        end
      else
        self:add_proto(obj, off)
      end
      local i = -1
      while lua do
        local k = jutil.funck(obj, i)
        if k == nil then break end
        if type(k) == "proto" and not seen[k] then work[#work + 1] = k end
        i = i - 1
      end
    end
  end
end

-- the functions held in the locals of the frame at `level` (counted from
-- this function), directly or as the values of a table
function Reg:add_locals(level, off, seen)
  local work = {}
  for k = 1, 250 do
    local name, v = debug.getlocal(level, k)
    if not name then break end
    if type(v) == "function" then
      work[#work + 1] = v
    elseif type(v) == "table" then
      push_table_functions(v, work, seen)
    end
  end
  for _, f in ipairs(work) do self:add_tree(f, off, seen) end
end

-- the functions on the stack (from the caller of `seed` up) and in
-- package.loaded, with their nested prototypes
function Reg:seed(off, seen)
  for level = 2, 200 do
    local i = debug.getinfo(level, "f")
    if not i then break end
    if i.func then self:add_tree(i.func, off, seen) end
    self:add_locals(level + 1, off, seen)
  end
  for _, m in pairs(package.loaded) do
    if type(m) == "table" then
      for _, v in pairs(m) do
        if type(v) == "function" then self:add_tree(v, off, seen) end
      end
    elseif type(m) == "function" then
      self:add_tree(m, off, seen)
    end
  end
end

function Reg:trace_event(what, tr, func, pc)
  if what == "start" then
    self.pending[tr] = { func = func, pc = pc }
  elseif what == "stop" then
    local p = self.pending[tr]
    self.pending[tr] = nil
    local code, mc = jutil.tracemc(tr)   -- machine code (a string), its address
    if p and mc then
      local size = #code
      local fi = jutil.funcinfo(p.func, p.pc)
      local info = proto_info(jutil.funcinfo(p.func))
      local e = { tr = tr, lo = mc, hi = mc + size, info = info, line = fi.currentline or info.linedefined }
      if self.perfmap then
        self.perfmap:write(format("%x %x %s [trace %d]\n", mc, size, frame_name(info, e.line), tr))
        self.perfmap:flush()
      end
      self.ntraces = (self.ntraces or 0) + 1
      self.live[tr] = e
    end
  elseif what == "abort" then
    self.pending[tr] = nil
  elseif what == "flush" then
    self.live, self.pending = {}, {}
    self.nflush = self.nflush + 1
  end
end

return M
