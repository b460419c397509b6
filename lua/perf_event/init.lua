--- perf_event: Linux perf_event_open(2) for Lua.
-- The public face of the binding (doc/api.md).  Counting, groups and the ioctls
-- live in the C core (`perf_event.core`); event strings, PMU discovery and
-- tracefs live in pure-Lua modules loaded on first use.
-- @module perf_event

local core = require("perf_event.core")

local type, pairs, ipairs, error, tostring = type, pairs, ipairs, error, tostring
local setmetatable = setmetatable
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
  return mod("resolve").attr(spec)
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

--- One PMU by name, or `nil, message` naming the PMUs there are; raises when
-- `name` is not a string.
function M.pmu(name)
  if type(name) ~= "string" then
    error(("bad argument #1 to 'pmu' (string expected, got %s)"):format(type(name)), 2)
  end
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

local function copy_attr(a)
  local c = {}
  for k, v in pairs(a) do c[k] = v end
  return c
end

-- Every spec goes through perf_event.resolve (the one spec -> attr path,
-- shared with pe.attr, pe.describe, pe.stat and luaperf).  A Lua value of
-- the wrong type raises at the caller's line; a spec that does not resolve
-- (bad string, unknown name, tracefs missing) is returned as nil, msg.
local function resolved(level, list, err, kind)
  if not list and kind == "type" then error(err, level + 1) end
  return list, err
end

local OPEN_OPTS = { pid = true, cpu = true, group = true, cgroup = true, cloexec = true,
                    pages = true, flags = true }

-- opts -> core.open options (a fresh table) and whether `disabled` was asked
local function core_opts(opts, level)
  local o = {}
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
  return o, opts ~= nil and opts.disabled == true
end

local single_sample_read   -- below, with the group modifiers

--- Opens one event.
-- A spec that does not resolve (a malformed string, an unknown event or
-- PMU, tracefs missing for a tracepoint, a string naming several events)
-- returns `nil, msg`; a spec or opts of the wrong Lua type, an unknown
-- option or an unknown attr field name raises.
-- @param spec an event string, `{event="...", field=value...}` or a full attr table
-- @tparam[opt] table opts `pid`, `cpu`, `group`, `cgroup`, `cloexec`, `pages`,
--   `disabled` (true: the event opens disabled, as `disabled=true` in the attr)
-- @treturn[1] perf_event.event
-- @treturn[2] nil
-- @treturn[2] string message naming the errno (or what is wrong with the spec) and what to do
-- @treturn[2] number errno (nil for a spec that does not resolve)
function M.open(spec, opts)
  local R = mod("resolve")
  local o, disabled = core_opts(opts, 2)
  local r, err = resolved(2, R.one(spec))
  if not r then return nil, err end
  local attr = r.attr
  if r.entry and r.entry.sample_read then single_sample_read(attr) end
  if attr.read_format == nil and not attr.sample_period and not attr.sample_freq then
    attr.read_format = COUNT_FORMAT
  end
  if disabled then attr.disabled = true end
  -- not a tail call: R.open raises a caller mistake at a level counted from here
  local ev, oerr, errno = R.open(r, o, 2)
  return ev, oerr, errno
end

-- specs -> array of resolved specs, or nil, msg
local function group_specs(specs, level)
  local R = mod("resolve")
  if type(specs) == "string" then
    return resolved(level + 1, R.many(specs))
  elseif type(specs) == "table" then
    if #specs == 0 then return nil, "perf_event: pe.group needs at least one event" end
    local out = {}
    for i, s in ipairs(specs) do
      local r, err, kind = R.one(s)
      if not r then
        if kind == "type" then error(err, level + 1) end
        return nil, err
      end
      out[i] = r
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
local TYPE_TRACEPOINT = core.abi.type.tracepoint
local SAMPLE_READ, SAMPLE_ID = core.abi.sample_type.read, core.abi.sample_type.id

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
  return u64.value(u64.bor(u64.bor(u, u64.from(SAMPLE_READ)), u64.from(SAMPLE_ID)))
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

local WEAK_ERRNO = {}
for _, name in ipairs({ "EINVAL", "EBADF", "ENOSPC", "EOPNOTSUPP", "E2BIG" }) do
  WEAK_ERRNO[core.abi.errno[name]] = name
end

-- its metatable and methods are assembled with the other classes' (class.lua)
local WEAK_MT = require("perf_event.class").weak_mt

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
--
-- As `open`: a spec that does not resolve (bad string, unknown name, an
-- empty array) returns `nil, msg`; specs or opts of the wrong Lua type, an
-- unknown option or attr field raise.
-- @param specs array of specs, or a string like `"{task-clock,page-faults}:u"`
-- @tparam[opt] table opts as for `open` (`disabled`: the group stays disabled until `g:enable()`)
-- @treturn[1] perf_event.group
-- @treturn[2] nil
-- @treturn[2] string
-- @treturn[2] number errno (nil for a spec that does not resolve)
function M.group(specs, opts)
  local R = mod("resolve")
  local base, disabled = core_opts(opts, 2)
  local members, err0 = group_specs(specs, 2)
  if not members then return nil, err0 end
  for _, m in ipairs(members) do
    local e = m.entry or {}
    m.sample_read, m.weak = e.sample_read, e.weak
  end
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
    local o = copy_attr(base)
    if i > 1 then o.group = evs[1] end
    local ev, err, errno = R.open(m, o, 2)
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
      local ev, err, errno = R.open({ attr = a, name = m.name, explicit = m.explicit, guest = m.guest },
                                    copy_attr(base), 2)
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
  if not (leader_disabled or disabled) then
    local ok, err, errno = g:enable()
    if not ok then g:close() return nil, err, errno end
  end
  return g
end

--- Enables every event this process created (prctl).
M.enable_all = core.enable_all
--- Disables every event this process created (prctl).
M.disable_all = core.disable_all
--- Perf timestamps <-> TSC from an event's user page or saved parameters
-- (userpage.c); `nil, msg, errno` when the event has no user page (ENODATA) or
-- the kernel offers no `cap_user_time_zero` (EOPNOTSUPP).
M.time_conv = core.time_conv

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
-- @treturn[2] string message
-- @treturn[2] number errno (ENODATA for a 0-byte read: a pinned event in
--   error state; EIO for a read shorter than the read_format needs)

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

--- An iterator over the records now in the ring (perf_event.records): decoded
-- tables, tracepoint samples with `fields`.  Raises for an event with no ring
-- buffer (doc/errors.md).
-- @function event:records
-- @tparam[opt] table reuse a table refilled for each fixed-layout sample

--- Waits for records: `true` at once when unread ones are in the ring, else after
-- the kernel's wakeup; `false` on timeout; `nil, "hup", ESRCH` when the event
-- is gone (the monitored task exited and the ring is drained).
-- @function event:poll
-- @tparam[opt] number timeout_ms

--- Records the kernel reported lost so far (LOST and LOST_SAMPLES records).
-- @function event:lost

--- The user page's control fields, the consumer state and `base`, the mapping's
-- address (for code that parses the ring itself).  Raises for an event with
-- nothing mapped; a counting event of this thread has its user page
-- (`pages == 0`).
-- @function event:ring

--- Maps the AUX area after the data area: `true`, or `nil, msg, errno` (a PMU
-- without AUX: EOPNOTSUPP).  Raises for an event with no ring buffer.
-- @function event:map_aux
-- @tparam integer pages a power of two

--- The AUX bytes between `aux_tail` and `aux_head` (publishes `aux_tail`).
-- Raises for an event with no ring buffer or before `map_aux`.
-- @function event:aux

--- Groups.
-- The userdata `pe.group` returns (metatable `"perf_event.group"`): its members are
-- scheduled together and read at once. It also has these event methods, applied to
-- its leader: `refresh`, `period`, `set_output`, `set_filter`, `set_bpf`,
-- `pause_output`, `modify`, `query_bpf`, `fd`, `id`, `attr`, `info`.
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

--- The members' names, `"{a,b,...}"`.
-- @function group:name

-- the methods of events and groups are complete once perf_event.core is
-- loaded (core.lua has class.lua assemble them)
-- event:records() with tracepoint fields and the LuaJIT fast path
M.records = require("perf_event.records")

return M
