--- perf_event.profile.resolve: the drain that reads the ring and resolves
-- each sample (not a public interface). LuaJIT's safe-point samples are
-- resolved in safepoint.lua, PUC Lua's hook mode in hook.lua; the others
-- (`lua=false`, `stacks=false`, LuaJIT where the safe point cannot run)
-- are their C leaf (`_leaf`: the sample's IP named from the ELF symbols).
-- Folding into counts is in aggregate.lua.
-- @module perf_event.profile.resolve

local tonumber, require = tonumber, require

local now = require("perf_event.profile.raw").now

local M = {}
-- the Profile methods of this file (init.lua puts them in the class)
local Profile = {}
M.methods = Profile

-- the C core's private functions: perf_event.core itself, so that this
-- file needs nothing of perf_event's init.lua
local function core_private()
  return require("perf_event.core")._private
end

--- A sample's C leaf: its IP named from the ELF symbols (a stripped
-- library's unnamed address as `[module]`, the kernel's as `[kernel]`),
-- as a list of one frame.
function Profile:_leaf(rec)
  -- (the record's own value: a kernel address is past a double's
  -- precision, and its frame has none)
  local name, _, module = self.sym:lookup(rec.ip)
  if module == "[kernel]" then return { { c = module, module = module } } end
  local ip = tonumber(rec.ip)
  if module and name:find("+0x", 1, true) then name = "[" .. module .. "]" end
  return { { c = name, addr = ip, module = module } }
end

--- The samples taken and not yet drained, when that is known without a
-- system call (LuaJIT's safe point: its signal records), else nil. An
-- always-on profile drains when enough have gathered: a drain has a fixed
-- part, so draining a handful at a time costs more per sample.
function Profile:pending()
  local s = self.safe
  if not (s and self.ev) then return nil end
  return core_private().luasafe_pending(s.slot)
end

local drain

--- Reads the samples in the ring and adds them to the profile.
-- Called by `stop`; call it now and then in a long run so the ring does
-- not overflow (`p.lost` counts what did). The event is paused while the
-- drain runs, as it is for stop's: its own work is not the program's (a
-- first drain reads the symbol tables of the libraries sampled, 50 ms of
-- CPU for libc's, and that showed up in a short profile as its hottest
-- function).
function Profile:drain()
  if not self.ev then return self end
  -- (a forked child's copy refuses with EPERM: it drains unpaused. _off:
  -- the event was disabled from outside, a spec's, and stays so)
  local paused = self.running and not self._off and self.ev:disable()
  local ok, err = pcall(drain, self)
  if paused then self.ev:enable() end
  if not ok then error(err, 0) end
  return self
end

function drain(self)
  if not self.sym then
    self.sym = require("perf_event.symbols").new({ kernel = false, offsets = true })
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
  -- it every 10 s, another every second (a PUC profile drained each few ms
  -- spent 95 % of its time there when it was read at every drain)
  if not self.maps_t or t_drain - self.maps_t > (self.keep == false and 1e10 or 1e9) then
    if self.keep == false then self.sym = self:_memo_sym() end
    self.sym:load_maps("self")
    self.maps_t = t_drain
    self.maps_reads = (self.maps_reads or 0) + 1
  end
  if self.hook then self:_hook_drain(not self.running) return self end
  local samples = self.samples
  for rec in self.ev:records() do
    if rec.type == "sample" then
      self.nsamples = self.nsamples + 1
      if self.keep == false then self:_count(self:_leaf(rec))
      else samples[#samples + 1] = self:_leaf(rec) end
    elseif rec.type == "lost" or rec.type == "lost_samples" then
      self.lost = self.lost + (tonumber(rec.lost) or 0)
    end
  end
  return self
end

return M
