--- perf_event.profile.labels: what a sample carries beside its stack (not
-- a public interface, but for `vmstates`, which init.lua puts in the
-- Profile class): the VM state the signal found (LuaJIT's safe point) and
-- the route of the request it ran for (OpenResty).
--
-- A label is one interned table `{vmstate=, route=, ctx=, id=}`: `ctx` is
-- the request (lua_getexdata of the captured thread) while its route is
-- not known yet. `request_done(route)`, from perf_event.openresty's
-- log(), gives the route to the records of the calling request that the
-- core still holds (luasafe_route) and to the samples of it that a drain
-- already took (each profile's `_pend`, by request).
-- @module perf_event.profile.labels

local setmetatable, pairs, ipairs, require = setmetatable, pairs, ipairs, require

local M = {}

--- The VM state classes of luasafe_take's keys (csrc/lj/match.c), by number.
M.VM = { "interpreted", "compiled", "c", "gc", "jit" }

local interned, ninterned, next_id = {}, 0, 0   -- vm -> route -> ctx -> label
local INTERN_MAX = 4096    -- labels remembered; beyond, the memo starts again
local ROUTES_MAX = 4096    -- route names given ids; beyond, "other"
local PEND_MAX = 20000     -- samples of a profile waiting for their request's route

local route_names, route_ids, nroutes = {}, {}, 0

--- The label of VM class `vm` (0: not known), route id (0: none) and
-- request `ctx` (0: none, or the route is known).
function M.get(vm, route, ctx)
  local byvm = interned[vm]
  local byroute = byvm and byvm[route]
  local lab = byroute and byroute[ctx]
  if lab then return lab end
  if ninterned >= INTERN_MAX then interned, ninterned = {}, 0 end
  byvm = interned[vm] or {}
  interned[vm] = byvm
  byroute = byvm[route] or {}
  byvm[route] = byroute
  next_id = next_id + 1
  lab = { vmstate = M.VM[vm], route = route_names[route], ctx = ctx ~= 0 and ctx or nil, vm = vm,
          id = next_id }
  byroute[ctx], ninterned = lab, ninterned + 1
  return lab
end

--- The memo of `get` (vm -> route -> ctx -> label), for the drain's loop.
function M.interned() return interned end

local function route_id(name)
  local id = route_ids[name]
  if id then return id end
  if nroutes >= ROUTES_MAX then
    name = "other"
    id = route_ids[name]
    if id then return id end
  end
  nroutes = nroutes + 1
  route_names[nroutes], route_ids[name] = name, nroutes
  return nroutes
end

-- the profiles whose drains keep labels (weak: a forgotten profile goes)
local live = setmetatable({}, { __mode = "k" })

--- p's drains keep labels: its pending samples by request start empty.
function M.track(p)
  p._pend, p._npend = {}, 0
  live[p] = true
end

--- A drain took `what` (a count entry, or a sample's index) with label
-- `lab`: when its request's route is not known yet, it waits for it.
function M.pend(p, lab, what)
  local ctx = lab.ctx
  if not ctx then return end
  if p._npend >= PEND_MAX then p._pend, p._npend = {}, 0 end   -- (requests that never log)
  local l = p._pend[ctx]
  if not l then l = {} p._pend[ctx] = l end
  l[#l + 1] = what
  p._npend = p._npend + 1
end

-- the samples of p that waited for request ctx get route id
local function resolve(p, ctx, id)
  local l = p._pend[ctx]
  if not l then return end
  p._pend[ctx], p._npend = nil, p._npend - #l
  if p.keep == false then
    local counts, ebf = p.counts, p._ebf
    for _, e in ipairs(l) do
      local lab = M.get(e.labels.vm, id, 0)
      local k = e.base .. "|" .. lab.id
      if counts[e.ck] == e then
        counts[e.ck] = nil
        local byf = ebf[e.frames]
        if byf then byf[e.labels] = nil end   -- (the request's address serves another request next)
        local to = counts[k]
        if to then to.count = to.count + e.count; p.nstacks = p.nstacks - 1
        else
          e.labels, e.ck = lab, k
          counts[k] = e
          if byf then byf[lab] = e end
        end
      end
    end
  else
    local labs = p.labels
    for _, i in ipairs(l) do
      local lab = labs[i]
      if lab and lab.ctx == ctx then labs[i] = M.get(lab.vm, id, 0) end
    end
  end
end

--- perf_event.openresty's log(route): the calling request's samples get
-- `route`, in every profile that keeps labels. Returns whether the VM
-- tells requests apart (OpenResty's LuaJIT).
function M.request_done(route)
  local id = route_id(route)
  local ctx = require("perf_event.core")._private.luasafe_route(id)
  if not ctx then return false end
  for p in pairs(live) do if p._pend then resolve(p, ctx, id) end end
  return true
end

-- a sample without a label: what its frames tell (PUC Lua, C leaf frames)
local function state_of(frames)
  local n = #frames
  local f = frames[n]
  -- (the kernel works on behalf of the frame under it)
  if f and f.module == "[kernel]" then f = frames[n - 1] end
  if not f then return "c" end
  return f.lua and "interpreted" or "c"
end

--- Samples by VM state: `interpreted`, `compiled`, `c` (a C function or
-- builtin, code outside the VM), `gc`, `jit` (the compiler: recording,
-- optimising, assembling, a trace exit). LuaJIT's safe point reads the
-- state the signal found; elsewhere (PUC Lua, C leaf frames) the leaf
-- frame tells `interpreted` from `c`. A block profile counts nanoseconds.
-- @treturn table state -> count (states without samples left out)
function M.methods_vmstates(self)
  local out = {}
  require("perf_event.profile.aggregate").each_stack(self, function(frames, count, lab)
    local s = lab and lab.vmstate or state_of(frames)
    out[s] = (out[s] or 0) + count
  end)
  return out
end

return M
