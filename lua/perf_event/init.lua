--- perf_event: Linux perf_event_open(2) for Lua.
-- The public face of the binding (API.md).  Counting, groups and the ioctls
-- live in the C core (`perf_event.core`); event strings, PMU discovery and
-- tracefs live in pure-Lua modules loaded on first use.
-- @module perf_event

local core = require("perf_event.core")

local type, pairs, ipairs, error, tostring = type, pairs, ipairs, error, tostring
local getmetatable, setmetatable = getmetatable, setmetatable
local require = require

local M = {
  _VERSION = "perf_event " .. core.VERSION,
  core = core,
}

-- lazily loaded pure-Lua modules (pmu.lua, parse.lua, tracepoint.lua, ...)
local function mod(name)
  return require("perf_event." .. name)
end

--- Builds the attr table for a spec, as perf would.
-- @param spec an event string (`"task-clock:u"`) or a table
-- @treturn[1] table attr fields named as in linux/perf_event.h
-- @treturn[2] nil
-- @treturn[2] string what is wrong with the spec
function M.attr(spec)
  return mod("parse").attr(spec)
end

--- Parses a comma-separated list of events, `{...}:mod` groups included.
-- @tparam string str
-- @treturn[1] table array of `{name=, attr=, group=, leader=}`
-- @treturn[2] nil
-- @treturn[2] string error
function M.parse(str)
  return mod("parse").parse(str)
end

--- Describes a spec the way `perf -vv` prints an attr.
function M.describe(spec)
  return mod("parse").describe(spec)
end

--- All PMUs of this machine (sysfs).
function M.pmus()
  return mod("pmu").pmus()
end

--- One PMU by name, or nil.
function M.pmu(name)
  return mod("pmu").pmu(name)
end

--- Event names this machine offers, optionally filtered by a pattern.
function M.list(pattern)
  return mod("pmu").list(pattern)
end

--- A tracepoint's id and format fields (tracefs).
function M.tracepoint(name)
  return mod("tracepoint").tracepoint(name)
end

--- perf-related sysctls as numbers.
function M.sysctl()
  return mod("pmu").sysctl()
end

-- Loaded on first use: `pe.stat(fn, events [, opts])` (perf_event.stat:
-- runs fn once with the events counting; the result prints like `perf
-- stat`) and `pe.symbols` (perf_event.symbols: addresses to names).
local LAZY = { stat = function() return mod("stat").stat end, symbols = function() return mod("symbols") end,
               profile = function() return mod("profile") end }
setmetatable(M, { __index = function(t, k)
  local f = LAZY[k]
  if f then
    local v = f()
    rawset(t, k, v)
    return v
  end
end })

local COUNT_FORMAT = "total_time_enabled|total_time_running"
local GROUP_FORMAT = "group|id|total_time_enabled|total_time_running"

local ATTR_ONLY = { event = true, name = true }

-- spec -> attr table (a fresh copy the caller may change), name, and
-- whether the caller chose the privilege level (so no auto exclusion)
local function copy_attr(a)
  local c = {}
  for k, v in pairs(a) do c[k] = v end
  return c
end

-- The 5th result is the parsed entry of a string spec (its `sample_read`
-- and `weak` flags say whether `S` / `W` were written), else nil.
local function resolve(spec, level)
  local attr, name, explicit_priv, guest, entry
  if type(spec) == "string" then
    local list, err = M.parse(spec)
    if not list then error(err, level + 1) end
    if #list ~= 1 then
      error(("perf_event: '%s' names %d events; use pe.group for several"):format(spec, #list), level + 1)
    end
    attr, name, guest = copy_attr(list[1].attr), list[1].name, list[1].guest_default
    explicit_priv = list[1].mods and list[1].mods:find("[ukh]") ~= nil
    entry = list[1]
  elseif type(spec) == "table" then
    if spec.event ~= nil then
      if type(spec.event) ~= "string" then
        error("perf_event: spec.event must be an event string", level + 1)
      end
      local list, err = M.parse(spec.event)
      if not list then error(err, level + 1) end
      if #list ~= 1 then
        error(("perf_event: '%s' names %d events"):format(spec.event, #list), level + 1)
      end
      attr, name, guest = copy_attr(list[1].attr), list[1].name, list[1].guest_default
      explicit_priv = list[1].mods and list[1].mods:find("[ukh]") ~= nil
      entry = list[1]
    else
      attr = {}
    end
    for k, v in pairs(spec) do
      if not ATTR_ONLY[k] then attr[k] = v end
    end
    if spec.exclude_kernel ~= nil or spec.exclude_user ~= nil or spec.exclude_hv ~= nil then
      explicit_priv = true
    end
    if spec.exclude_guest ~= nil then guest = nil end
    if spec.name ~= nil then
      name = tostring(spec.name)
    elseif not name then
      name = ("%s:%s"):format(tostring(attr.type), tostring(attr.config or 0))
    end
  else
    error("perf_event: spec must be an event string or a table, got " .. type(spec), level + 1)
  end
  return attr, name, explicit_priv, guest, entry
end

-- core.open, plus perf's fallback for PMUs that refuse the exclude_guest
-- bit perf sets by default on events written without modifiers (msr):
-- on EINVAL, once more without it
-- A caller mistake the core raises (unknown field, bad option) is raised
-- again at the line that called pe.open/pe.group, without our position.
local function core_open(attr, o)
  local ok, ev, err, errno = pcall(core.open, attr, o)
  if not ok then
    error((tostring(ev):gsub("^[%w%._/%-]+:%d+: ", "")), 4)
  end
  return ev, err, errno
end

local function open_attr(attr, o, guest_default)
  local ev, err, errno = core_open(attr, o)
  if not ev and errno == 22 and guest_default and attr.exclude_guest then
    attr.exclude_guest = nil
    ev, err, errno = core_open(attr, o)
  end
  return ev, err, errno
end

local OPEN_OPTS = { pid = true, cpu = true, group = true, cgroup = true, cloexec = true,
                    pages = true, flags = true }

local function core_opts(opts, name, auto_exclude, level)
  local o = { name = name, auto_exclude = auto_exclude }
  if opts ~= nil then
    if type(opts) ~= "table" then
      error("perf_event: opts must be a table, got " .. type(opts), level + 1)
    end
    for k, v in pairs(opts) do
      if OPEN_OPTS[k] then
        o[k] = v
      elseif k ~= "disabled" then
        error("perf_event: unknown option '" .. tostring(k) .. "'", level + 1)
      end
    end
  end
  return o
end

--- Opens one event.
-- @param spec an event string, `{event="...", field=value...}` or a full attr table
-- @tparam[opt] table opts `pid`, `cpu`, `group`, `cgroup`, `cloexec`, `pages`
-- @treturn[1] perf_event.event
-- @treturn[2] nil
-- @treturn[2] string message naming the errno and what to do
-- @treturn[2] number errno
local single_sample_read   -- below, with the group modifiers

function M.open(spec, opts)
  local attr, name, explicit, guest, entry = resolve(spec, 2)
  if entry and entry.sample_read then single_sample_read(attr) end
  if attr.read_format == nil and not attr.sample_period and not attr.sample_freq then
    attr.read_format = COUNT_FORMAT
  end
  -- not a tail call: core_open raises at a fixed level above this frame
  local ev, err, errno = open_attr(attr, core_opts(opts, name, not explicit, 2), guest)
  return ev, err, errno
end

local function group_specs(specs, level)
  if type(specs) == "string" then
    local list, err = M.parse(specs)
    if not list then error(err, level + 1) end
    local out = {}
    for i, e in ipairs(list) do
      local explicit = e.mods and e.mods:find("[ukh]") ~= nil
      out[i] = { attr = copy_attr(e.attr), name = e.name, explicit = explicit,
                 guest = e.guest_default, sample_read = e.sample_read, weak = e.weak }
    end
    return out
  elseif type(specs) == "table" then
    if #specs == 0 then error("perf_event: pe.group needs at least one event", level + 1) end
    local out = {}
    for i, s in ipairs(specs) do
      local attr, name, explicit, guest, e = resolve(s, level + 1)
      out[i] = { attr = attr, name = name, explicit = explicit, guest = guest,
                 sample_read = e and e.sample_read, weak = e and e.weak }
    end
    return out
  end
  error("perf_event: pe.group takes an array of specs or a '{a,b}' string, got " .. type(specs), level + 1)
end

------------------------------------------------------------------------
-- S: leader sampling.  What perf record builds for `{a,b}:S`
-- (evsel__config + evsel__config_leader_sampling): the leader samples
-- with PERF_SAMPLE_READ|PERF_SAMPLE_ID added to its sample_type, so each
-- of its samples carries every member's count; the members take the
-- leader's sample_type and sample nothing themselves (they get no period
-- here unless one was written for them, as perf keeps an explicit one).
-- A leader written without a period gets perf record's default: period 1
-- for a tracepoint, else 4000 Hz (capped by perf_event_max_sample_rate);
-- without a sample_type, perf record's default one.

local RECORD_FREQ = 4000
local TYPE_TRACEPOINT = 2
local SAMPLE_READ_BIT, SAMPLE_ID_BIT = 4, 6

local function is_set(v)
  return v ~= nil and v ~= false and v ~= 0
end

-- sample_type with read and id added, in the form the caller wrote it
local function with_read_id(st)
  local t = type(st)
  if t == "string" then
    return st:find("%S") and (st .. "|read|id") or "read|id"
  elseif t == "table" then
    local c = {}
    for i, v in ipairs(st) do c[i] = v end
    c[#c + 1] = "read"
    c[#c + 1] = "id"
    return c
  end
  local u64 = mod("u64")
  local u = u64.from(st)
  if not u then return st end          -- the core says what is wrong with it
  u64.setbit(u, SAMPLE_READ_BIT)
  u64.setbit(u, SAMPLE_ID_BIT)
  return u64.value(u)
end

-- `S` on a single event that samples (a period or frequency given): as
-- perf record, its samples carry its count (READ|ID added to sample_type,
-- perf record's default sample_type when none).  On a counting event `S`
-- means nothing, as in perf stat.
single_sample_read = function(attr)
  if not (is_set(attr.sample_period) or is_set(attr.sample_freq)) then return end
  if attr.sample_type == nil then
    local tp = attr.type == TYPE_TRACEPOINT or attr.type == "tracepoint"
    attr.sample_type = tp and "ip|tid|time|cpu|period|raw" or "ip|tid|time|period"
  end
  attr.sample_type = with_read_id(attr.sample_type)
end

local function leader_sampling(members)
  local lead = members[1].attr
  local tp = lead.type == TYPE_TRACEPOINT or lead.type == "tracepoint"
  if not (is_set(lead.sample_period) or is_set(lead.sample_freq)) then
    if tp then
      lead.sample_period = 1
    else
      local rate = M.sysctl().max_sample_rate
      lead.freq = true
      lead.sample_freq = (rate and rate < RECORD_FREQ) and rate or RECORD_FREQ
    end
  end
  if lead.sample_type == nil then
    lead.sample_type = tp and "ip|tid|time|cpu|period|raw" or "ip|tid|time|period"
  end
  lead.sample_type = with_read_id(lead.sample_type)
  for i = 2, #members do
    local st = lead.sample_type
    if type(st) == "table" then st = copy_attr(st) end
    members[i].attr.sample_type = st
  end
end

------------------------------------------------------------------------
-- W: a weak group.  When the kernel refuses a member into the group
-- (perf falls back on EINVAL/EBADF; ENOSPC, EOPNOTSUPP and E2BIG are the
-- other answers meaning "not together"), the members are opened again as
-- independent events, as perf's evlist__reset_weak_group does, and
-- pe.group returns this table with the group's methods.

local WEAK_ERRNO = { [22] = "EINVAL", [9] = "EBADF", [28] = "ENOSPC", [95] = "EOPNOTSUPP",
                     [7] = "E2BIG" }

local weak = {}
local WEAK_MT = { __index = weak, __name = "perf_event.group" }

local function weak_self(g, what)
  if getmetatable(g) ~= WEAK_MT then
    error(("bad self to perf_event.group:%s (a weak group expected, got %s)")
      :format(what, type(g)), 3)
  end
  if g._closed then error("attempt to use a closed perf_event.group", 3) end
  return g
end

function weak.read(g, t)
  local evs = weak_self(g, "read")
  t = t or {}
  local en_t, run_t = t.times_enabled, t.times_running
  if type(en_t) ~= "table" then en_t = {} t.times_enabled = en_t end
  if type(run_t) ~= "table" then run_t = {} t.times_running = run_t end
  for i, ev in ipairs(evs) do
    local v, en, run = ev:read()
    if v == nil then return nil, en, run end
    t[i] = v
    t[ev:name()] = v
    en_t[i], run_t[i] = en, run
  end
  t.time_enabled, t.time_running = en_t[1], run_t[1]
  return t
end

-- members first, the leader last (as the group's enable)
local function each(g, what, method)
  local evs = weak_self(g, what)
  local n = #evs
  for k = 1, n do
    local ev = evs[k % n + 1]            -- 2, 3, ..., n, then 1
    local ok, err, errno = ev[method](ev)
    if not ok then return nil, err, errno end
  end
  return true
end

function weak.enable(g) return each(g, "enable", "enable") end
function weak.disable(g) return each(g, "disable", "disable") end
function weak.reset(g) return each(g, "reset", "reset") end

function weak.close(g)
  if getmetatable(g) ~= WEAK_MT then weak_self(g, "close") end
  if g._closed then return end
  g._closed = true
  for i = #g, 1, -1 do
    g[i]:close()
    g[i] = nil
  end
end

function weak.members(g)
  if getmetatable(g) ~= WEAK_MT then weak_self(g, "members") end
  local out = {}
  for i, ev in ipairs(g) do out[i] = ev end
  return out
end

function weak.event(g, i)
  return weak.members(g)[i]
end

function weak.name(g)
  local names = {}
  for i, ev in ipairs(weak_self(g, "name")) do names[i] = ev:name() end
  return "{" .. table.concat(names, ",") .. "}"
end

function weak.info(g)
  local info = weak_self(g, "info")[1]:info()
  info.weak_fallback = g.fallback_reason
  info.weak_errno = g.fallback_errno
  return info
end

for _, m in ipairs({ "refresh", "period", "set_output", "set_filter", "set_bpf",
                     "pause_output", "modify", "query_bpf", "fd", "id", "attr" }) do
  weak[m] = function(g, ...)
    local leader = weak_self(g, m)[1]
    return leader[m](leader, ...)
  end
end

WEAK_MT.__gc = weak.close              -- 5.2+; the members have their own __gc
WEAK_MT.__close = function(g) weak.close(g) end
WEAK_MT.__tostring = function(g)
  if g._closed then return "perf_event.group(weak, fell back, closed)" end
  return ("perf_event.group(%s, weak: fell back to %d separate events, leader fd %d: %s)")
    :format(weak.name(g), #g, g[1]:fd(), g.fallback_reason)
end

--- Opens events as one group: scheduled together, read at once.
-- The leader reads with PERF_FORMAT_GROUP|ID|TOTAL_TIME_*; the group
-- starts counting when it is complete (unless `opts.disabled`).
--
-- Group modifiers act as in perf:
--
-- `S` (leader sampling, `"{cpu-clock,page-faults}:S"`, or `:S` on the first
-- spec of an array): the leader samples (perf record's default period
-- when none is given: 1 for a tracepoint, else 4000 Hz) with `read|id`
-- added to its sample_type; the members take its sample_type and do not
-- sample. Each of the leader's samples has `rec.read = {nr=, values={{value=,
-- id=}, ...}, time_enabled=, time_running=}`: every member's count, by id.
--
-- `W` (weak group, `"{a,b}:W"`, or `:W` on any spec of an array): when the
-- kernel refuses a member into the group (EINVAL, EBADF, ENOSPC, EOPNOTSUPP,
-- E2BIG), the members are opened again as separate events (each with
-- `total_time_enabled|total_time_running`, the leader `id` too under `S`)
-- and a table with the group's methods comes back instead: `g.fallback` is
-- true, `g.fallback_reason` and `g.fallback_errno` say why, so does
-- `g:info().weak_fallback`. Its `read([t])` fills `t[i]`/`t[name]` with each
-- member's value scaled by its own times, `t.times_enabled[i]` and
-- `t.times_running[i]` with those times, and `t.time_enabled`/`t.time_running`
-- with the leader's. A group that opens is the ordinary group (`g.fallback`
-- is nil).
-- @param specs array of specs, or a string like `"{task-clock,page-faults}:u"`
-- @tparam[opt] table opts as for `open`, plus `disabled`
-- @treturn[1] perf_event.group
-- @treturn[2] nil
-- @treturn[2] string
-- @treturn[2] number errno
function M.group(specs, opts)
  local members = group_specs(specs, 2)
  local leader_disabled = members[1].attr.disabled
  local is_weak = false
  for _, m in ipairs(members) do
    if m.weak then is_weak = true end
  end
  if members[1].sample_read then leader_sampling(members) end
  if is_weak then
    for _, m in ipairs(members) do m.separate = copy_attr(m.attr) end
  end
  local evs = {}
  local fallback
  for i, m in ipairs(members) do
    m.attr.read_format = GROUP_FORMAT
    if i == 1 then m.attr.disabled = true end
    local o = core_opts(opts, m.name, not m.explicit, 2)
    if i > 1 then o.group = evs[1] end
    local ev, err, errno = open_attr(m.attr, o, m.guest)
    if not ev then
      for j = #evs, 1, -1 do evs[j]:close() end
      if not (is_weak and i > 1 and WEAK_ERRNO[errno]) then return nil, err, errno end
      fallback = { reason = err, errno = errno }
      break
    end
    evs[i] = ev
  end
  local g
  if fallback then
    evs = {}
    for i, m in ipairs(members) do
      local a = m.separate
      a.read_format = (i == 1 and members[1].sample_read)
        and "id|" .. COUNT_FORMAT or COUNT_FORMAT
      a.disabled = true
      local ev, err, errno = open_attr(a, core_opts(opts, m.name, not m.explicit, 2), m.guest)
      if not ev then
        for j = #evs, 1, -1 do evs[j]:close() end
        return nil, ("%s (weak group fallback, after the group failed: %s)")
          :format(err, fallback.reason), errno
      end
      evs[i] = ev
    end
    g = setmetatable(evs, WEAK_MT)    -- the members at g[1..n], so #g works on every Lua
    g.fallback, g.fallback_reason, g.fallback_errno = true, fallback.reason, fallback.errno
  else
    g = core.make_group(evs)
  end
  if not (leader_disabled or (opts and opts.disabled)) then
    local ok, err, errno = g:enable()
    if not ok then g:close() return nil, err, errno end
  end
  return g
end

--- Enables every event this process created (prctl).
M.enable_all = core.enable_all
--- Disables every event this process created (prctl).
M.disable_all = core.disable_all
--- Perf timestamps <-> TSC from an event's user page or saved parameters (userpage.c).
M.time_conv = core.time_conv
if jit then pcall(require, "perf_event.fast") end  -- FFI routes for read/enable/... (fast.lua)

--- Events.
-- The userdata `pe.open` returns (metatable `"perf_event.event"`, methods in C).
-- A failed system call returns `nil, message, errno`; using a closed event raises.
-- @type event

--- Starts counting (`PERF_EVENT_IOC_ENABLE`); on a group leader, the whole group.
-- @function event:enable
-- @tparam[opt] boolean group pass `PERF_IOC_FLAG_GROUP` (act on the whole group from any member)
-- @treturn[1] true
-- @treturn[2] nil
-- @treturn[2] string message
-- @treturn[2] number errno

--- Stops counting (`PERF_EVENT_IOC_DISABLE`). On a member, only that member unless `group`.
-- @function event:disable
-- @tparam[opt] boolean group

--- Zeroes the count (`PERF_EVENT_IOC_RESET`); time_enabled/running keep running.
-- @function event:reset
-- @tparam[opt] boolean group

--- Reads the counter: through the user page when the kernel allows it, else read(2).
-- @function event:read
-- @treturn[1] value, scaled by time_enabled/time_running when multiplexed
-- @treturn[1] time_enabled ns (nil when read_format lacks it)
-- @treturn[1] time_running ns
-- @treturn[2] nil
-- @treturn[2] string message (a 0-byte read: a pinned event in error state)
-- @treturn[2] number errno

--- Reads and decodes the whole read_format, unscaled: `{value=, id=, lost=,
-- time_enabled=, time_running=}`, or with GROUP `{nr=, values={...}, ...}`.
-- @function event:read_raw
-- @treturn table
-- @treturn number bytes the kernel returned

--- Adds n to the overflow budget (`IOC_REFRESH`); at 0 the kernel disables the event.
-- @function event:refresh
-- @tparam integer n

--- Sets a new sample period (or frequency for freq events) at once (`IOC_PERIOD`).
-- @function event:period
-- @param n 64-bit integer

--- Sends this event's records into `target`'s ring (`IOC_SET_OUTPUT`); nil detaches.
-- @function event:set_output
-- @param target an event, an fd, or nil

--- Sets an ftrace filter on a tracepoint or uprobe event (`IOC_SET_FILTER`); once only.
-- @function event:set_filter
-- @tparam string filter e.g. `"fd == 1"`

--- Attaches a loaded BPF program (`IOC_SET_BPF`).
-- @function event:set_bpf
-- @tparam integer prog_fd

--- Pauses (true) or resumes (false) writing into the ring (`IOC_PAUSE_OUTPUT`).
-- @function event:pause_output
-- @tparam boolean pause

--- Changes breakpoint fields in place (`IOC_MODIFY_ATTRIBUTES`): bp_addr, bp_len, bp_type, sig_data.
-- @function event:modify
-- @tparam table fields

--- Lists the ids of the BPF programs attached (`IOC_QUERY_BPF`): `{id, ..., prog_cnt=}`.
-- @function event:query_bpf
-- @tparam[opt=64] integer max

--- The kernel's id of this event (`IOC_ID`), as in read_format ID and sample ID.
-- @function event:id

--- The file descriptor, for poll/epoll loops.
-- @function event:fd

--- The event's name (the spec string, or `name=`).
-- @function event:name

--- A copy of the attr the kernel was given, as a table (as `pe.attr` returns).
-- @function event:attr

--- What the binding knows: fd, id, pid, cpu, read_format, sample_type, mapped, pages,
-- rdpmc (the user-page read is used), auto_exclude_kernel and a note when perf's
-- user-space-only fallback was applied.
-- @function event:info

--- Closes the fd and unmaps; idempotent; also `__gc` and `__close`.
-- @function event:close

--- Groups.
-- The userdata `pe.group` returns (metatable `"perf_event.group"`): its members are
-- scheduled together and read at once. It also has every event method above, applied
-- to its leader (`g:fd()`, `g:refresh(n)`, ...).
-- @type group

--- Enables, disables or resets every member (`PERF_IOC_FLAG_GROUP` on the leader).
-- @function group:enable

--- @function group:disable

--- @function group:reset

--- Reads every member at once.
-- @function group:read
-- @tparam[opt] table t a table to fill (reused: no allocation per read)
-- @treturn table `t[i]` and `t[name]` the scaled value of member i, `t.time_enabled`,
-- `t.time_running`

--- The member events, leader first.
-- @function group:members

--- Member i as an event.
-- @function group:event
-- @tparam integer i

--- Closes every member, leader last; idempotent; also `__gc` and `__close`.
-- @function group:close

-- groups forward the remaining ioctls to their leader
do
  local gidx = core.group_mt.__index
  local eidx = core.event_mt.__index
  local gmembers = gidx.members
  for _, m in ipairs({ "refresh", "period", "set_output", "set_filter", "set_bpf",
                       "pause_output", "modify", "query_bpf", "fd", "id", "attr", "info" }) do
    local f = eidx[m]
    gidx[m] = function(g, ...)
      local leader = gmembers(g)[1]   -- gmembers raises on a wrong self
      if not leader then error("attempt to use a closed perf_event.group", 2) end
      return f(leader, ...)
    end
  end
  gidx.name = function(g)
    local names = {}
    for i, ev in ipairs(g:members()) do names[i] = ev:name() end
    return "{" .. table.concat(names, ",") .. "}"
  end
  gidx.event = function(g, i)
    return g:members()[i]
  end
end

-- event:records() with tracepoint fields and the LuaJIT fast path
M.records = require("perf_event.records")

return M
