--- perf_event.openresty.counters: the worker's counter group and the
-- per-request figures `log()` adds up (not a public interface: the entry
-- points are perf_event.openresty's).
-- @module perf_event.openresty.counters

local ngx = ngx  -- luacheck: read globals ngx
local type, tostring, tonumber, error, pcall, require, ipairs =
  type, tostring, tonumber, error, pcall, require, ipairs
local gsub, lower, concat, floor, max = string.gsub, string.lower, table.concat, math.floor, math.max

local M = {}

M.DEFAULT_EVENTS = { "task-clock", "page-faults", "context-switches" }

-- per event: its name, the metric's stem ("task_clock_seconds"), whether
-- its value is in nanoseconds (a clock), the info line's unit
local events = {}
local group, group_err       -- the worker's group, or why it is not open
local buf = {}               -- reused by group:read(buf)
local every, seen = 1, 0
local last, last_seen = {}, -1
local use_start = false      -- start() was called once: ngx.ctx holds readings
local log_info = false       -- the error log takes info lines

-- sums over the measured requests: [1] = requests, [1 + i] = event i
M.totals = {}
-- route name -> the same sums; at most `max_routes` names, then "other"
M.routes = {}
local nroutes, max_routes = 0, 16

local function stem(name)
  local s = gsub(lower(name), "[^%w]+", "_")
  if name == "task-clock" or name == "cpu-clock" then return s .. "_seconds", true end
  return s, false
end

--- Opens the group of `names` in this worker (pid 0, user space where the
-- kernel asks for it). Returns true, or nil and the kernel's message.
function M.open(names, opts)
  events = {}
  for i, name in ipairs(names) do
    local st, ns = stem(name)
    events[i] = { name = name, stem = st, ns = ns }
  end
  every = opts.every
  max_routes = opts.max_routes
  M.totals, M.routes, nroutes = { 0 }, {}, 0
  for i = 1, #events do M.totals[i + 1] = 0 end
  local pe = require("perf_event")
  local specs = {}
  for i, e in ipairs(events) do specs[i] = e.name end
  local g, err = pe.group(specs)
  group, group_err = g, err
  local ok, errlog = pcall(require, "ngx.errlog")
  if ok and errlog.get_sys_filter_level then log_info = errlog.get_sys_filter_level() >= ngx.INFO end
  if not g then return nil, err end
  return true
end

function M.events() return events end
function M.group() return group, group_err end

--- Closes the group (the worker exits).
function M.close()
  if group then group:close() end
  group = nil
end

--- access_by_lua: measure this request from here.
function M.start()
  if not group then return end
  use_start = true
  local t = group:read(buf)
  if not t then return end
  local ctx = ngx.ctx
  local r = {}
  for i = 1, #events do r[i] = t[i] end
  ctx.perf_event_start = r
end

local function add(sums, d)
  sums[1] = sums[1] + 1
  for i = 1, #d do sums[i + 1] = sums[i + 1] + d[i] end
end

local function account(d, route)
  add(M.totals, d)
  if route then
    local r = M.routes[route]
    if not r then
      if nroutes >= max_routes then route = "other"; r = M.routes.other end
      if not r then
        r = { 0 }
        for i = 1, #events do r[i + 1] = 0 end
        M.routes[route] = r
        nroutes = nroutes + 1
      end
    end
    add(r, d)
  end
  if log_info then
    local parts = {}
    for i, e in ipairs(events) do parts[i] = e.name .. "=" .. tostring(d[i]) .. (e.ns and "ns" or "") end
    ngx.log(ngx.INFO, "perf: ", ngx.var.uri, " ", concat(parts, " "))
  end
end

--- log_by_lua: the request's figures, since start() when it ran in this
-- request, else since the end of the previous request of this worker.
function M.log(route)
  if route ~= nil and type(route) ~= "string" then
    error("perf_event.openresty.log: route must be a string or nil, got " .. type(route), 3)
  end
  if not group then return end
  seen = seen + 1
  local n = every
  local phase = seen % n
  if phase ~= 0 and phase ~= n - 1 then return end
  local t = group:read(buf)
  if not t then return end
  local d = {}
  local from = use_start and ngx.ctx.perf_event_start
  if from then
    for i = 1, #events do d[i] = t[i] - from[i] end
    account(d, route)
  elseif phase == 0 and last_seen == seen - 1 then
    for i = 1, #events do d[i] = t[i] - last[i] end
    account(d, route)
  end
  for i = 1, #events do last[i] = t[i] end
  last_seen = seen
end

--- The worker's group now: values, time_enabled, time_running, or nil.
function M.read_worker()
  if not group then return nil end
  return group:read(buf)
end

-- a value as the exposition prints it: seconds for a clock, else an integer
function M.value(e, v)
  v = tonumber(v) or 0
  if e.ns then return ("%.9f"):format(v / 1e9) end
  return ("%.0f"):format(floor(max(v, 0)))
end

return M
