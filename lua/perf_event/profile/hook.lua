--- perf_event.profile.hook: the PUC Lua (5.1 to 5.4) hook mode of a
-- profile (not a public interface): setting the hook at start, and at
-- drain pairing each sample with the Lua stack the hook captured after it.
--
-- csrc/puc/hook.c captures the Lua stack at the first VM hook point after a
-- sample: each sample signals this thread, whose handler sets a count hook
-- of 1 on the thread that called start ("signal"; "count" also keeps a
-- hook every `hook_count` instructions, which coroutines created after
-- start inherit). The hook captures when the ring's data_head has moved
-- since it last looked. drain pairs each sample with the first capture
-- taken at or after its time; the sample's IP gives the C leaf under those
-- Lua frames.
-- @module perf_event.profile.hook

local tonumber, ipairs, require = tonumber, ipairs, require
local _VERSION = _VERSION

local proto_info = require("perf_event.profile.naming").proto_info

local M = {}
-- the Profile methods of this file (init.lua puts them in the class)
local Profile = {}
M.methods = Profile

-- ns: a capture later than this after a sample is not its stack. The first
-- capture after a sample is taken at the first hook point after it, so
-- only a lost signal or the program's own hook (`c.foreign`) makes it
-- another stack; a loaded machine preempts the thread for 100 ms and more
-- between the two (1-7 % of a spec's samples with load average 7 on this
-- 2-core VM, when this was 100 ms).
local HOOK_WINDOW = 2e9

-- how the hook is set: "signal" (only the one-shot hook set by each
-- sample's signal) or "count" (and a count hook always set). A standing
-- hook costs on every instruction on 5.4, on every count-th one on 5.1.
function M.hook_kind(opts)
  if opts.hook then return opts.hook end
  if opts.hook_count then return "count" end
  return _VERSION == "Lua 5.1" and "count" or "signal"
end

local hook_kind = M.hook_kind

-- sets the hook (p.mode becomes "c", with the reason, when it cannot)
function M.hook_start(p, LP, opts)
  local kind = hook_kind(opts)
  local arg = kind == "signal" and "signal" or (opts.hook_count or 1000)
  local ok, err = LP.luahook_start(p.ev, arg, opts.hook_slots or 8192, opts.depth or 256,
                                    opts.hook_leaf == false)
  if not ok then
    p.mode, p.reason = "c", err
    return
  end
  p.hook, p.hook_kind, p.hpend = true, kind, {}
  p.hook_count = kind == "count" and arg or nil
  -- 5.4: a function popped between the signal and the hook is added back
  -- as the leaf, unless the self-test of the VM's offsets failed (why)
  p.hook_leaf, p.hook_leaf_reason = err == nil, err
end

-- a capture's frames, root first: Lua frames named like LuaJIT's, C
-- functions on the Lua stack by the name package.loaded's tables give them
-- (`table.sort`, `cjson.encode`: `names`, naming.builtins), else by the name
-- Lua gives them at the call (a local's or field's)
local function hook_frames(cap, strs, names)
  local f, out = cap.f, {}
  for i = #f - 4, 1, -5 do
    local src, line, ld, lld = strs[f[i]] or "?", f[i + 1], f[i + 2], f[i + 3]
    if ld < 0 then
      local n = names[f[i + 4]] or src
      if n ~= "?" then out[#out + 1] = { c = n, hook = true } end
    else
      out[#out + 1] = { lua = proto_info({ source = src, linedefined = ld, lastlinedefined = lld }),
                        line = line >= 0 and line or ld, hook = true }
    end
  end
  return out
end

-- the sample's leaf under the captured stack: a C frame is kept unless it
-- is the interpreter itself (an unnamed address in the module holding the
-- Lua VM), which the Lua frames already stand for
function Profile:_hook_resolve(rec, cap)
  local leaf = self:_leaf(rec)
  if not cap or #cap.frames == 0 then return leaf end
  local out = {}
  for i, f in ipairs(cap.frames) do out[i] = f end
  local n = 0
  for _, f in ipairs(leaf) do
    local vm = f.c and f.c:sub(1, 1) == "[" and f.module and self.vm_module
      and (self.vm_module == f.module or self.vm_module:sub(-#f.module - 1) == "/" .. f.module)
    if not vm then out[#out + 1] = f; n = n + 1 end
  end
  out.nleaf = n > 0 and n or nil
  return out
end

-- drain's hook branch: the samples of the ring, each with its capture.
-- The ring is read before the captures, so that a sample's capture, taken
-- at the first hook point after it, has been taken by then; a sample with
-- no capture yet waits for the next drain, unless `final`.
function Profile:_hook_drain(final)
  local waiting = self.hwait or {}
  for rec in self.ev:records() do
    if rec.type == "sample" then
      waiting[#waiting + 1] = rec
    elseif rec.type == "lost" or rec.type == "lost_samples" then
      self.lost = self.lost + (tonumber(rec.lost) or 0)
    end
  end
  local caps, strs, dropped, ncalls, vm, ns, added, shed, nsig, nsigio, nforeign =
    require("perf_event.core")._private.luahook_read()
  self.hook_dropped, self.hook_calls, self.hook_ns = tonumber(dropped), tonumber(ncalls), tonumber(ns)
  self.hook_added, self.hook_shed = tonumber(added), tonumber(shed)
  self.hook_signals, self.hook_sigio, self.hook_foreign = tonumber(nsig), tonumber(nsigio), tonumber(nforeign)
  self.vm_module = self.vm_module or vm
  local pend = self.hpend
  -- (made at the first drain: the modules loaded by then are named)
  local names = self.builtins or require("perf_event.profile.naming").builtins()
  self.builtins = names
  for _, c in ipairs(caps) do
    c.time = tonumber(c.time)
    c.frames = hook_frames(c, strs, names)
    pend[#pend + 1] = c
  end
  self.ncaps = (self.ncaps or 0) + #caps
  local j, k = 1, 1
  while k <= #waiting do
    local rec = waiting[k]
    local t = tonumber(rec.time)
    while pend[j] and pend[j].time < t do j = j + 1 end
    local c = pend[j]
    if not c and not final then break end
    if c and (c.time - t > HOOK_WINDOW or c.foreign) then c = nil end
    if c then self.nhooked = (self.nhooked or 0) + 1 end
    self.nsamples = self.nsamples + 1
    if self.keep == false then self:_count(self:_hook_resolve(rec, c))
    else self.samples[#self.samples + 1] = self:_hook_resolve(rec, c) end
    k = k + 1
  end
  local rest = {}
  for i = k, #waiting do rest[#rest + 1] = waiting[i] end
  self.hwait = rest
  -- captures before the last paired sample are no longer needed
  local keep = {}
  for i = j, #pend do keep[#keep + 1] = pend[i] end
  self.hpend = keep
end

return M
