--- perf_event.openresty: self-profiling of an nginx (OpenResty, or nginx
-- with lua-nginx-module) in a few lines of its nginx.conf.
--
--    http {
--        lua_shared_dict perf_event 1m;
--        init_worker_by_lua_block { require("perf_event.openresty").init_worker({ sampler = true }) }
--        log_by_lua_block { require("perf_event.openresty").log() }
--        server {
--            location = /metrics { content_by_lua_block { require("perf_event.openresty").metrics() } }
--            location = /debug/pprof/profile { content_by_lua_block { require("perf_event.openresty").pprof() } }
--        }
--    }
--
-- Every worker counts its own work (pid 0: what perf_event_paranoid=2
-- allows an unprivileged worker) and shares its figures with the others
-- through the shared dict; `/metrics` answers them all, `/debug/pprof/profile`
-- profiles them all.  doc/openresty.md says what each endpoint returns and
-- what it costs.  The files of this folder: init.lua (the entry points),
-- counters.lua (the counter group, `log`), sampler.lua (the always-on
-- sampler, a worker's part of a window), window.lua (one window over the
-- workers, through the dict), metrics.lua (publication and exposition).
-- @module perf_event.openresty

local ngx = ngx  -- luacheck: read globals ngx
local counters = require("perf_event.openresty.counters")
local sampler = require("perf_event.openresty.sampler")
local metrics = require("perf_event.openresty.metrics")
local window = require("perf_event.openresty.window")

local type, tostring, tonumber, pairs, ipairs, pcall, error, require =
  type, tostring, tonumber, pairs, ipairs, pcall, error, require
local format, concat, sort, floor = string.format, table.concat, table.sort, math.floor

local M = {}

-- option -> { Lua type, default, check (nil: fine, else what it must be) }
local OPTIONS = {
  dict = { "string", "perf_event" },
  events = { "table", nil, function(v)
    if #v == 0 then return "a non-empty array of event names" end
    for _, e in ipairs(v) do if type(e) ~= "string" then return "an array of event name strings" end end
  end },
  every = { "number", 1, function(v) if v < 1 or v ~= floor(v) then return "an integer >= 1" end end },
  sampler = { "boolean", false },
  freq = { "number", 99, function(v)
    if v < 1 or v > 10000 or v ~= floor(v) then return "an integer in 1..10000" end
  end },
  stacks = { "string", "lua", function(v) if v ~= "lua" and v ~= "c" then return '"lua" or "c"' end end },
  interval = { "number", 1, function(v) if v < 0.1 or v > 3600 then return "a number of seconds in 0.1..3600" end end },
  max_routes = { "number", 16, function(v) if v < 1 or v ~= floor(v) then return "an integer >= 1" end end },
  max_seconds = { "number", 60, function(v)
    if v <= 0 or v > 3600 then return "a number of seconds in (0, 3600]" end
  end },
}

local conf           -- the options init_worker took
local dict           -- the shared dict, or nil
local pid
local busy = false   -- a window without a dict runs in this worker
local next_publish = 0

local function check_opts(opts)
  if opts == nil then opts = {} end
  if type(opts) ~= "table" then
    return nil, "perf_event.openresty.init_worker: opts must be a table, got " .. type(opts)
  end
  local c = {}
  for k, v in pairs(opts) do
    local o = OPTIONS[k]
    if not o then
      local names = {}
      for n in pairs(OPTIONS) do names[#names + 1] = n end
      sort(names)
      return nil, format("perf_event.openresty.init_worker: unknown option '%s' (known: %s)",
                         tostring(k), concat(names, ", "))
    end
    if type(v) ~= o[1] then
      return nil, format("perf_event.openresty.init_worker: option '%s' must be a %s, got %s", k, o[1], type(v))
    end
    local bad = o[3] and o[3](v)
    if bad then return nil, format("perf_event.openresty.init_worker: option '%s' must be %s", k, bad) end
    c[k] = v
  end
  for k, o in pairs(OPTIONS) do if c[k] == nil then c[k] = o[2] end end
  c.events = c.events or counters.DEFAULT_EVENTS
  return c
end

-- an error.log line once per nginx master (the workers share the dict)
local function log_once(level, msg)
  if dict then
    local okp, process = pcall(require, "ngx.process")
    local master = okp and process.get_master_pid and process.get_master_pid() or 0
    if not dict:safe_add("once:" .. tostring(master) .. ":" .. msg, true, 86400) then return end
  end
  ngx.log(level, msg)
end

local function timer(premature)
  if premature then
    window.abandon()
    sampler.stop()
    counters.close()
    metrics.retire()
    return
  end
  ngx.update_time()
  local now = ngx.now()
  sampler.tick(now)
  if dict then
    window.tick(dict, pid, now)
    if now >= next_publish then
      next_publish = now + conf.interval
      metrics.publish()
    end
  end
end

--- In `init_worker_by_lua*`: opens this worker's per-request counter group
-- and, when asked, its always-on sampler (at once, from a timer: the
-- coroutine API its self-test needs is disabled in `init_worker_by_lua*`),
-- and starts the worker's timer
-- (every 0.1 s: the sampler's drains, the figures' publication, profile
-- windows).  What the kernel refuses (perf_event_paranoid=3, no such
-- event) goes to error.log once per server, and the rest goes on: `/metrics`
-- answers with `nginx_perf_available` 0 for what is missing.  A wrong
-- option raises, naming it.
-- @tparam[opt] table opts
--   `dict` (string, "perf_event"): the `lua_shared_dict` the workers share
--     (without one, `/metrics` and `/debug/pprof/profile` cover the answering
--     worker only);
--   `events` (array of strings, `{"task-clock", "page-faults", "context-switches"}`):
--     the per-request counters, one group; the metric of `task-clock` is
--     `..._task_clock_seconds_total`, of any other event `..._NAME_total`;
--   `every` (integer, 1): measure one request in `every`;
--   `sampler` (boolean, false): run the always-on sampler (`pe.profile`,
--     `keep=false`): a profile window then starts and ends without opening
--     anything, and costs no JIT flush;
--   `freq` (integer, 99): its samples per second;
--   `stacks` ("lua"): `"lua"` for Lua-level stacks (`function@file:line`,
--     C leaves by symbol), `"c"` for the C leaf function only;
--   `interval` (seconds, 1): how often each worker publishes its figures;
--   `max_routes` (16): distinct `route` labels kept per worker, the rest
--     count as "other";
--   `max_seconds` (60): the longest profile `/debug/pprof/profile` takes.
function M.init_worker(opts)
  local c, err = check_opts(opts)
  if not c then error(err, 2) end
  conf = c
  pid = ngx.worker.pid()
  sampler.limit_routes(c.max_routes)
  -- lua-zlib sets a global `zlib`, which nginx warns about in a request
  local okp, pprof = pcall(require, "perf_event.pprof")
  if okp and pprof.gzip_available then pprof.gzip_available() end
  dict = ngx.shared[c.dict]
  if not dict then
    ngx.log(ngx.WARN, "perf_event.openresty: no lua_shared_dict ", c.dict,
            ": /metrics and /debug/pprof/profile cover the answering worker only")
  end
  metrics.init(dict, c.interval)
  local problems = {}
  local ok, cerr = counters.open(c.events, c)
  if not ok then problems[#problems + 1] = "per-request counters unavailable: " .. tostring(cerr) end
  -- the sampler starts in a timer: its first start runs the safe-point
  -- walk's self-test, which resumes coroutines, and init_worker_by_lua*
  -- forbids the coroutine API; one error.log line tells both outcomes
  local function start_sampler(premature)
    if premature then return end
    if c.sampler then
      local pok, sok, serr = pcall(sampler.start, c)
      if not pok then sok, serr = nil, sok end
      if not sok then problems[#problems + 1] = "always-on sampler unavailable: " .. tostring(serr) end
    end
    if #problems > 0 then
      log_once(ngx.ERR, "perf_event.openresty: " .. concat(problems, "; ") .. " (/metrics still answers)")
    end
  end
  local sok, serr = ngx.timer.at(0, start_sampler)
  if not sok then
    problems[#problems + 1] = "cannot start the worker's timer: " .. tostring(serr)
    start_sampler(false)
  end
  local tok, terr = ngx.timer.every(window.TICK, timer)
  if not tok then ngx.log(ngx.ERR, "perf_event.openresty: cannot start the worker's timer: ", terr) end
  metrics.publish()
end

--- Optional, in `access_by_lua*`: measure the requests of this location from
-- the access phase (one more group read per request) instead of from the
-- end of the worker's previous request.
function M.start()
  counters.start()
end

--- In `log_by_lua*`: the request's counters (task-clock, page faults,
-- context switches by default) since the end of the worker's previous
-- request, or since `start()`; added to the worker's sums (and, at info
-- level, one error.log line per request).  Never raises on a request's
-- behalf and touches no shared dict.
-- @tparam[opt] string route also count the request under this `route`
--   label (a name written in nginx.conf: past `max_routes` names they
--   count as "other")
function M.log(route)
  if not conf then return end
  counters.log(route)
  -- the request's samples take its route: the one given, else its path
  -- (ngx.var.uri: an exact-match location's name), while a profile runs
  pcall(sampler.route, route)
end

local function refuse(status, msg)
  ngx.status = status
  ngx.header.content_type = "text/plain; charset=utf-8"
  ngx.header["X-Content-Type-Options"] = "nosniff"
  ngx.say(msg)
end

--- Content handler: the Prometheus text exposition (0.0.4) of every worker
-- of this nginx, each sample with `pid` and `host` labels: the measured
-- requests' counters (`nginx_perf_request_*_total`, by `route` as
-- `nginx_perf_route_*_total`), each worker's whole counters
-- (`nginx_perf_worker_*_total`), the sampler's samples and the lost ones,
-- the profiles answered, the figures the full dict dropped, what is
-- available, the Lua VM.
function M.metrics()
  if not conf then return refuse(500, "perf_event.openresty: init_worker() was not called") end
  local text = metrics.exposition()
  ngx.header.content_type = "text/plain; version=0.0.4; charset=utf-8"
  ngx.print(text)
end

-- a part: its header "#freq=.. samples=.. lost=.. mode=.. duration=.."
-- then "ROUTE<tab>VMSTATE<tab>stack N" lines (sampler.finish)
local function read_part(text)
  local head, body = text:match("^(#[^\n]*)\n?(.*)$")
  local info = {}
  for k, v in (head or ""):gmatch("(%w+)=(%S+)") do info[k] = v end
  info.error = head and head:match("^#error (.*)$")
  local rows = {}
  for route, vmstate, stack, n in body:gmatch("([^\t\n]*)\t([^\t\n]*)\t([^\n]+) (%d+)") do
    rows[#rows + 1] = { route = route ~= "" and route or nil, vmstate = vmstate ~= "" and vmstate or nil,
                        stack = stack, n = tonumber(n) }
  end
  return info, rows
end

-- the answer's format and the path's kind: bad input answers 400
local function check_args(args, kind)
  local seconds = tonumber(args.seconds or "30")
  if type(args.seconds) == "table" or not seconds or seconds <= 0 or seconds ~= seconds then
    return nil, "seconds must be a positive number"
  end
  if seconds > conf.max_seconds then
    return nil, format("profile duration exceeds the limit of %gs", conf.max_seconds)
  end
  local hz = tonumber(args.hz or "99")
  if type(args.hz) == "table" or not hz or hz < 1 or hz > 10000 then return nil, "hz must be in 1..10000" end
  local fmt = args.format or "pprof"
  if fmt ~= "pprof" and fmt ~= "folded" and fmt ~= "speedscope" then
    return nil, "format must be pprof, folded or speedscope"
  end
  if args.by ~= nil and args.by ~= "route" then return nil, "by must be route" end
  local target = 0
  if args.pid ~= nil then
    target = tonumber(args.pid)
    if type(args.pid) == "table" or not target or target < 1 or target ~= floor(target) then
      return nil, "pid must be a process id"
    end
  end
  return { seconds = seconds, hz = kind == "block" and 0 or floor(hz), fmt = fmt, target = floor(target),
           by_route = args.by == "route", kind = kind }
end

-- the parts' rows as folded counts, each stack under "pid=P;" (and
-- "route=R;" when asked)
local function rooted(by_pid, pids, by_route)
  local counts = {}
  for _, wp in ipairs(pids) do
    for _, r in ipairs(by_pid[wp]) do
      local k = "pid=" .. wp .. ";" .. (by_route and "route=" .. (r.route or "none") .. ";" or "") .. r.stack
      counts[k] = (counts[k] or 0) + r.n
    end
  end
  return counts
end

-- the pprof table: one group of samples per worker, route and VM state,
-- labelled so (`go tool pprof -tagfocus route=/a`)
local function pprof_table(a, by_pid, pids, freq, t0, comments)
  local pprof = require("perf_event.pprof")
  local host = metrics.state.host
  local t
  for _, wp in ipairs(pids) do
    local groups, order = {}, {}
    for _, r in ipairs(by_pid[wp]) do
      local gk = (r.route or "") .. "\t" .. (r.vmstate or "")
      local g = groups[gk]
      if not g then
        g = { route = r.route, vmstate = r.vmstate, counts = {} }
        groups[gk], order[#order + 1] = g, gk
      end
      g.counts[r.stack] = (g.counts[r.stack] or 0) + r.n
    end
    sort(order)
    for _, gk in ipairs(order) do
      local g = groups[gk]
      local labels = { { key = "pid", num = wp }, { key = "host", str = host } }
      if g.route then labels[#labels + 1] = { key = "route", str = g.route } end
      if g.vmstate then labels[#labels + 1] = { key = "vmstate", str = g.vmstate } end
      local part = pprof.folded_table(g.counts, {
        freq = freq, time_nanos = floor(t0 * 1e9), duration_nanos = floor(a.seconds * 1e9),
        event = a.kind == "block" and "block" or nil, labels = labels, comments = comments })
      if not t then t = part
      else for _, s in ipairs(part.samples) do t.samples[#t.samples + 1] = s end end
    end
  end
  if not t then
    t = pprof.folded_table({}, { freq = freq, time_nanos = floor(t0 * 1e9), duration_nanos = floor(a.seconds * 1e9),
                                 event = a.kind == "block" and "block" or nil, comments = comments })
  end
  return t
end

--- Content handler, Go's `/debug/pprof/profile?seconds=N` (default 30, at
-- most `max_seconds`): by default a profile of every worker of this nginx
-- over the next N seconds, as one gzipped `profile.proto`, each sample
-- labelled with its worker's `pid` (and `host`), its request's `route`
-- (the name given to `log(route)`, else the request's path) and the VM
-- state the sample found (`vmstate`: interpreted, compiled, c, gc, jit).
-- At a path ending in `/block` (`location /debug/pprof/ {...}` serves
-- both), Go's block profile instead: where the workers waited in the
-- kernel under Lua code, each stack weighed by the time waited (`delay`,
-- nanoseconds); waits that yield to the event loop (`ngx.sleep`,
-- cosockets, the idle `epoll_wait`) have no Lua frame and do not count.
-- `?pid=P` profiles that worker only; `?format=folded` answers folded
-- stacks under a root frame `pid=P`, `?format=speedscope` speedscope's
-- JSON, `?by=route` puts a `route=R` frame under it; `?hz=F` (default
-- 99) is the rate when no always-on sampler runs.  A second window while
-- one runs gets 429; bad arguments 400; an unknown pid or path 404.  The
-- answering worker waits with `ngx.sleep` and keeps serving.
function M.pprof()
  if not conf then return refuse(500, "perf_event.openresty: init_worker() was not called") end
  local last = ngx.var.uri:match("([^/]*)/*$")
  local kind = last == "block" and "block" or "profile"
  if last ~= "block" and last ~= "profile" then
    return refuse(404, "perf_event.openresty: no profile '" .. last .. "' (profile or block)")
  end
  -- (past its limit, 100, the parser drops the rest: a window must not
  -- start from what it kept)
  local args, aerr = ngx.req.get_uri_args()
  if aerr == "truncated" then
    return refuse(400, "perf_event.openresty: more than 100 arguments")
  end
  local a, bad = check_args(args, kind)
  if not a then return refuse(400, "perf_event.openresty: " .. bad) end
  if a.target ~= 0 then
    local known = false
    for _, w in ipairs(metrics.workers()) do if w == a.target then known = true end end
    if not known then return refuse(404, "perf_event.openresty: no worker " .. a.target .. " in this nginx") end
  end
  local parts, t0, msg
  if dict then
    parts, t0, msg = window.run(dict, a.seconds, a.target, a.hz)
  else
    if busy then return refuse(429, "perf_event.openresty: a profile is already running in this worker") end
    busy = true
    parts, t0, msg = window.run_local(a.seconds, a.hz)
    busy = false
  end
  if not parts then return refuse(t0, msg) end
  -- the workers' parts, by pid
  local pids, comments, by_pid, errors = {}, {}, {}, {}
  local freq = a.hz
  for wpid, text in pairs(parts) do
    local info, rows = read_part(text)
    if info.error then
      errors[#errors + 1] = format("worker %s: %s", wpid, info.error)
    else
      pids[#pids + 1] = tonumber(wpid)
      by_pid[tonumber(wpid)] = rows
      freq = tonumber(info.freq) or freq
      comments[#comments + 1] = format("nginx worker %s: %s %s, %s lost, mode %s, %s s%s", wpid,
                                       info.samples or "?", kind == "block" and "waits" or "samples",
                                       info.lost or "?", info.mode or "?",
                                       info.duration or "?", info.note and (", " .. info.note) or "")
    end
  end
  sort(pids)
  if #pids == 0 then
    return refuse(500, (kind == "block" and "Could not enable block profiling: " or "Could not enable CPU profiling: ")
                       .. (errors[1] or "no worker answered"))
  end
  for _, e in ipairs(errors) do comments[#comments + 1] = e end
  metrics.state.profiles = metrics.state.profiles + 1
  if a.fmt == "folded" then
    local lines = {}
    for stack, n in pairs(rooted(by_pid, pids, a.by_route)) do lines[#lines + 1] = { stack, n } end
    sort(lines, function(x, y) if x[2] ~= y[2] then return x[2] > y[2] end return x[1] < y[1] end)
    local out = {}
    for i, l in ipairs(lines) do out[i] = l[1] .. " " .. format("%.0f", l[2]) end
    ngx.header.content_type = "text/plain; charset=utf-8"
    ngx.print(concat(out, "\n"), #out > 0 and "\n" or "")
    return
  end
  if a.fmt == "speedscope" then
    local pprof = require("perf_event.pprof")
    local t = pprof.folded_table(rooted(by_pid, pids, a.by_route), {
      freq = freq, time_nanos = floor(t0 * 1e9), duration_nanos = floor(a.seconds * 1e9),
      event = kind == "block" and "block" or nil, comments = comments })
    local json = require("perf_event.speedscope").encode(t, { name = "nginx " .. metrics.state.host })
    ngx.header.content_type = "application/json"
    ngx.print(json)
    return
  end
  local t = pprof_table(a, by_pid, pids, freq, t0, comments)
  local okb, bytes = pcall(require("perf_event.pprof").encode, t)
  if not okb then return refuse(500, "perf_event.openresty: cannot write the profile: " .. tostring(bytes)) end
  ngx.header.content_type = "application/octet-stream"
  ngx.header["Content-Disposition"] = 'attachment; filename="' .. kind .. '"'
  ngx.header["X-Content-Type-Options"] = "nosniff"
  ngx.print(bytes)
end

return M
