--- perf_event.vmevent: LuaJIT's VM events ("trace", "bc") shared by the
-- library's users of them (pe.profile's registry and self-test,
-- perf_event.luamap) and the program's own handler
-- (not a public interface).
--
-- LuaJIT keeps one handler per event: `jit.attach(f, what)` replaces the
-- one there, and a detach leaves none. So each event gets one handler of
-- this module's while anything here subscribes to it; that handler calls
-- the subscribed callbacks in turn, then the handler the program had
-- attached before the first subscription (`-jv`'s, `jit.dump`'s, its
-- own), which is attached again after the last one goes. A handler the
-- program attaches meanwhile replaces this module's (the subscribed
-- callbacks then miss the events, as they would have anyway) and stays.
-- @module perf_event.vmevent

local rawget, pairs, ipairs, debug = rawget, pairs, ipairs, debug

local M = {}

local jit = rawget(_G, "jit")

-- LuaJIT's table of handlers in the registry (lj_vmevent.h's
-- LJ_VMEVENTS_REGKEY), by a hash of the event's name
local function handlers()
  return debug.getregistry()._VMEVENTS or {}
end

local subs = { trace = {}, bc = {} }   -- what -> the callbacks (a list replaced, never changed)
local before = {}                      -- what -> the program's handler when the first came
local key = {}                         -- what -> this module's handler's key in _VMEVENTS
local dispatch = {}
for what in pairs(subs) do
  -- a call goes through the list it began with; the program's handler
  -- last, so that an error of its own does not cost the callbacks theirs
  dispatch[what] = function(...)
    local l = subs[what]
    for i = 1, #l do l[i](...) end
    local b = before[what]
    if b then b(...) end
  end
end

--- Calls cb with each `what` event ("trace" or "bc") from now on.
function M.subscribe(what, cb)
  local l = { cb }
  for i, f in ipairs(subs[what]) do l[i + 1] = f end
  subs[what] = l
  if #l > 1 then return end
  local old = {}
  for k, v in pairs(handlers()) do old[k] = v end
  jit.attach(dispatch[what], what)
  for k, v in pairs(handlers()) do
    if v == dispatch[what] then key[what], before[what] = k, old[k] end
  end
end

--- Stops calling cb; after the last one, the program's handler is back.
function M.unsubscribe(what, cb)
  local l = {}
  for _, f in ipairs(subs[what]) do if f ~= cb then l[#l + 1] = f end end
  subs[what] = l
  if #l > 0 then return end
  local b, mine = before[what], handlers()[key[what]] == dispatch[what]
  before[what], key[what] = nil, nil
  jit.attach(dispatch[what])
  if b and mine then jit.attach(b, what) end
end

return M
