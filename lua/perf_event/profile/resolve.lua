--- perf_event.profile.resolve: a sample's frames, and the drain that reads
-- the ring and resolves each sample (not a public interface). The leaf
-- (`_leaf`: a trace, the interpreter's PC in rbx, a trace's return address
-- on the sampled stack, or the C function named from its ELF symbols)
-- under the Lua callers the signal-time walk found (`callers`, `_resolve`).
-- The hook mode's drain is in hook.lua; folding into counts in aggregate.lua.
-- @module perf_event.profile.resolve

local math, table = math, table
local floor = math.floor
local tonumber, ipairs, rawget, require = tonumber, ipairs, rawget, require

local raw = require("perf_event.profile.raw")
local now, le_u64 = raw.now, raw.le_u64

local jutil
if rawget(_G, "jit") then jutil = require("jit.util") end

local M = {}
-- the Profile methods of this file (init.lua puts them in the class)
local Profile = {}
M.methods = Profile

local function pe_module()
  return require("perf_event")
end

-- the Lua callers from a sample-time frame walk, root first: each PC is a
-- return address into a known prototype; the walk stops at the first one
-- that is not (a C boundary, or not a frame at all)
local function callers(reg, sig)
  local out = {}
  local bx = tonumber(sig.bx)
  for i, v in ipairs(sig.pcs) do
    local pc = tonumber(v)
    -- returning from a fast function, rbx is already the caller's PC while
    -- rdx is still the callee's BASE: the first link repeats the leaf
    if i == 1 and pc == bx then pc = nil end
    local e = pc and reg:find_bc(pc - 4)
    if not e and (i > 1 or pc) then break end
    if e then
      local fi = jutil.funcinfo(e.obj, (pc - e.lo) / 4 - 1)
      out[#out + 1] = { lua = e.info, line = fi and fi.currentline or e.info.linedefined, walked = true }
    end
  end
  local n = #out
  for i = 1, floor(n / 2) do out[i], out[n - i + 1] = out[n - i + 1], out[i] end
  -- the function whose frame the walk started from (its line is not known
  -- from the walk: the function's first line stands for it)
  local fpc = n > 0 and tonumber(sig.fpc)
  local fe = fpc and fpc ~= 0 and reg.by_lo[fpc]
  if fe then out[#out + 1] = { lua = fe.info, line = fe.info.linedefined, walked = true, base = true } end
  return out
end
M.callers = callers

function Profile:_resolve(rec, sig)
  local leaf = self:_leaf(rec, sig)
  if not sig or not self.reg then return leaf end
  local up = callers(self.reg, sig)
  if #up == 0 then return leaf end
  -- the walk's BASE frame holds a builtin or C function and the leaf has
  -- no Lua frame: name it. LuaJIT's own unnamed code is the builtin (or
  -- what it calls inside the VM); a leaf in another module sits under it
  local bname = leaf[1].c and self.builtins and self.builtins[tonumber(sig.fn)]
  if bname then
    local f = leaf[1]
    if #leaf == 1 and f.module and f.module:find("luajit", 1, true) and f.c:find("^%[") then
      leaf[1] = { c = bname, addr = f.addr, module = f.module, builtin = true }
    else
      up[#up + 1] = { c = bname, builtin = true }
    end
  end
  -- the leaf's own Lua frame, when it is the same function, replaces the
  -- walk's base function (a different one was inlined into its trace)
  local last = up[#up]
  if last.base and leaf[1].lua and leaf[1].lua == last.lua then up[#up] = nil
  elseif last.base and leaf[1].caller and leaf[1].lua ~= last.lua then
    -- the stack scan took a stale return address (a trace of a function
    -- called earlier, left in an unused slot) where the walk found the
    -- frame that runs: the walk wins (its frame is the leaf when no C
    -- frame is left)
    table.remove(leaf, 1)
  end
  for _, f in ipairs(leaf) do up[#up + 1] = f end
  up.nleaf = #leaf > 0 and #leaf or 1
  return up
end

-- G->vmstate at the signal (the self-tested one): ~LJ_VMST_INTERP or
-- ~LJ_VMST_C, no trace runs, so no word of the stack is a trace's caller
local VMS_NO_TRACE = { [-1] = true, [-2] = true }

function Profile:_leaf(rec, sig)
  local reg, sym = self.reg, self.sym
  local ip = tonumber(rec.ip)
  local frames = {}
  local tr = reg and reg:find_trace(ip, tonumber(rec.time))
  if tr then
    frames[1] = { lua = tr.info, line = tr.line, trace = tr.tr }
    return frames
  end
  local lua
  -- out: the signal found the thread outside Lua (the host's code after
  -- lua_resume returned): rbx is not the interpreter's PC there
  local out = sig and sig.out
  if reg and not out and rec.regs_user and rec.regs_user.bx then
    local bx = tonumber(rec.regs_user.bx)
    local e = bx and reg:find_bc(bx - 4)
    if e then
      local pos = (bx - e.lo) / 4 - 1
      local fi = jutil.funcinfo(e.obj, pos)
      lua = { lua = e.info, line = fi and fi.currentline or e.info.linedefined }
    end
  end
  if not lua and reg and not out and rec.stack_user and rec.stack_user.data
    and not (sig and self.vms_ok and VMS_NO_TRACE[sig.vms]) then
    local data = rec.stack_user.data
    local n = tonumber(rec.stack_user.dyn_size) or #data
    if n > #data then n = #data end
    for o = 0, n - 8, 8 do
      local w = le_u64(data, o)
      local t = reg:find_trace(w, tonumber(rec.time))
      if t then lua = { lua = t.info, line = t.line, trace = t.tr, caller = true } break end
    end
  end
  local name, _, module = sym:lookup(ip)
  local vm = module and module:find("luajit", 1, true) and (name:find("+0x", 1, true)
    or name:find("^lj_BC_") or name:find("^lj_vm_"))
  if lua then frames[1] = lua end
  if not (lua and vm) then
    -- a stripped library: the module stands for its unnamed addresses
    if module and name:find("+0x", 1, true) then name = "[" .. module .. "]" end
    frames[#frames + 1] = { c = name, addr = ip, module = module }
  end
  return frames
end

--- The samples taken and not yet drained, when that is known without a
-- system call (LuaJIT's safe point: its signal records), else nil. An
-- always-on profile drains when enough have gathered: a drain has a fixed
-- part, so draining a handful at a time costs more per sample.
function Profile:pending()
  local s = self.safe
  if not (s and self.ev) then return nil end
  return pe_module().core._private.luasafe_pending(s.slot)
end

--- Reads the samples in the ring and adds them to the profile.
-- Called by `stop`; call it now and then in a long run so the ring does
-- not overflow (`p.lost` counts what did).
function Profile:drain()
  if not self.ev then return self end
  if not self.sym then
    self.sym = pe_module().symbols.new({ kernel = false, offsets = true })
  end
  if self.safe then
    -- the safe point reads /proc/self/maps once, and again only when an
    -- address falls in no known mapping (safepoint.lua's ip_sym): in nginx
    -- a reread cost several ms. (No _memo_sym: ip_sym remembers by address
    -- and by symbol range itself.)
    if not self.maps_t then
      self.sym:load_maps("self")
      self.maps_t, self.maps_reads = now(), (self.maps_reads or 0) + 1
    end
    require("perf_event.profile.safepoint").drain(self, not self.running)
    return self
  end
  local t_drain = now()
  -- reading /proc/self/maps costs ~0.5 ms, and the symbols' lookups start
  -- over after it: an always-on (keep=false) profile drained often rereads
  -- it every 10 s, another every second (until session 13 at every drain:
  -- a PUC profile drained each few ms spent 95 % of its time there)
  if not self.maps_t or t_drain - self.maps_t > (self.keep == false and 1e10 or 1e9) then
    if self.keep == false then self.sym = self:_memo_sym() end
    self.sym:load_maps("self")
    self.maps_t = t_drain
    self.maps_reads = (self.maps_reads or 0) + 1
  end
  if self.hook then self:_hook_drain(not self.running) return self end
  local samples = self.samples
  local sigs, si = nil, 1
  if self.stacks then
    local dropped, ns, throttled, _
    sigs, dropped, _, ns, _, _, throttled = pe_module().core._private.luaprof_read()
    self.sig_dropped = tonumber(dropped)
    self.sig_throttled = tonumber(throttled) - (self.sig_throttled0 or 0)
    self.walk_ns = tonumber(ns) - (self.walk_ns0 or 0)
    self.nsigs = (self.nsigs or 0) + #sigs
  end
  for rec in self.ev:records() do
    if rec.type == "sample" then
      self.nsamples = self.nsamples + 1
      -- the signal for this sample: the next one at the same user ip, taken
      -- after the sample and within 10 ms of it
      local sig
      if sigs then
        local ip, t = tonumber(rec.ip), tonumber(rec.time)
        for j = si, math.min(si + 3, #sigs) do
          local g = sigs[j]
          local gt = tonumber(g.time)
          if tonumber(g.ip) == ip and gt >= t and gt - t < 1e7 then sig = g; si = j + 1 break end
        end
      end
      if self.keep == false then self:_count(self:_resolve(rec, sig))
      else samples[#samples + 1] = self:_resolve(rec, sig) end
    elseif rec.type == "lost" or rec.type == "lost_samples" then
      self.lost = self.lost + (tonumber(rec.lost) or 0)
    end
  end
  if self.keep == false then self:_prune(t_drain) end
  return self
end

return M
