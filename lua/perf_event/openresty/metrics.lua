--- perf_event.openresty.metrics: every worker's figures in the shared
-- dict, and their Prometheus text exposition (not a public interface).
--
-- Each worker writes its figures under `w:PID` from its timer (every
-- `interval` seconds; the entry lives 5 intervals, so a worker that is
-- gone leaves the exposition soon after).  The text is padded to a slot of
-- whole pages with room to grow, and a write of the same length replaces
-- the entry in place: a full dict never refuses it (a write of another
-- length frees the old entry first, and may then find no room).  Figures
-- that outgrow the slot take a larger one only when the dict has the
-- pages free; else the entry keeps its last figures, renewed, and the
-- write counts as dropped.  Drops are counted in `d:PID`, a number stored
-- when the worker starts, which an increment changes in place without
-- more memory.  The answering worker renders its own figures from its
-- own state.
-- @module perf_event.openresty.metrics

local ngx = ngx  -- luacheck: read globals ngx
local counters = require("perf_event.openresty.counters")
local sampler = require("perf_event.openresty.sampler")

local format, concat, sort, gmatch, find = string.format, table.concat, table.sort, string.gmatch, string.find
local tostring, tonumber, ipairs, pairs, rawget, select, io = tostring, tonumber, ipairs, pairs, rawget, select, io
local rep, ceil = string.rep, math.ceil

local M = {}

local PREFIX = "nginx_perf_"
local VMSTATES = require("perf_event.profile.labels").VM
local jit = rawget(_G, "jit")

local st = { dict = nil, pid = nil, host = "unknown", interval = 1, drops = 0, profiles = 0,
             slot = nil }  -- the length of this worker's `w:PID` entry, when it has one
M.state = st

local function hostname()
  local f = io.open("/proc/sys/kernel/hostname", "r")
  local h = f and f:read("*l")
  if f then f:close() end
  return h or "unknown"
end

-- a process's state letter and parent pid, from /proc
local function stat(pid)
  local f = io.open("/proc/" .. pid .. "/stat", "r")
  local s = f and f:read("*l")
  if f then f:close() end
  return (s or ""):match("^%d+ %(.*%) (%a) (%d+)")
end

function M.init(dict, interval)
  st.dict, st.interval, st.pid, st.host = dict, interval, ngx.worker.pid(), hostname()
  st.master = select(2, stat("self"))
  if dict then dict:safe_add("d:" .. st.pid, 0) end
end

--- Counts one figure that the full dict did not take.
function M.drop()
  st.drops = st.drops + 1
  local d = st.dict
  if d then d:incr("d:" .. st.pid, 1) end
end

-- a label value as the text format wants it
local function esc(v)
  return (tostring(v):gsub("[\\\"\n]", { ["\\"] = "\\\\", ["\""] = "\\\"", ["\n"] = "\\n" }))
end
local function int(n) return format("%.0f", tonumber(n) or 0) end

-- the families, in the order of the exposition: { name, type, help }
local function families()
  local f = { { "requests_measured_total", "counter", "Requests whose counters were measured." } }
  local evs = counters.events()
  for _, e in ipairs(evs) do
    f[#f + 1] = { "request_" .. e.stem .. "_total", "counter",
                  "The worker's " .. e.name .. " during the measured requests." }
  end
  f[#f + 1] = { "route_requests_measured_total", "counter", "Measured requests of the routes that opted in." }
  for _, e in ipairs(evs) do
    f[#f + 1] = { "route_" .. e.stem .. "_total", "counter", "The worker's " .. e.name .. ", by route." }
  end
  for _, e in ipairs(evs) do
    f[#f + 1] = { "worker_" .. e.stem .. "_total", "counter",
                  "The worker's " .. e.name .. " since its counters opened (all of its work)." }
  end
  f[#f + 1] = { "worker_counters_enabled_seconds_total", "counter",
                "Time the worker's counter group was enabled (time_enabled)." }
  f[#f + 1] = { "worker_counters_running_seconds_total", "counter",
                "Time the worker's counter group was counting on a CPU (time_running)." }
  f[#f + 1] = { "sampler_samples_total", "counter", "Samples the always-on sampler took." }
  f[#f + 1] = { "sampler_vmstate_samples_total", "counter",
                "The always-on sampler's samples by the Lua VM's state (interpreted, compiled, c, gc, jit)." }
  f[#f + 1] = { "lost_samples_total", "counter",
                "Samples the kernel dropped because a ring was full (source: sampler or pprof)." }
  f[#f + 1] = { "pprof_profiles_total", "counter", "Profiles /debug/pprof/profile answered." }
  f[#f + 1] = { "shared_dict_drops_total", "counter",
                "Figures or profiles not stored because the shared dict was full." }
  f[#f + 1] = { "available", "gauge",
                "1 when the worker's counters (what=counters) or sampler (what=sampler) are open, else 0." }
  f[#f + 1] = { "lua_vm_info", "gauge", "The worker's Lua VM: version and JIT state (value 1)." }
  return f
end

-- this worker's samples, as "family\tsample line" lines
local function render_worker(with_drops)
  local out = {}
  local base = format('pid="%d",host="%s"', st.pid, esc(st.host))
  local function add(fam, value, extra)
    out[#out + 1] = fam .. "\t" .. PREFIX .. fam .. "{" .. base .. (extra or "") .. "} " .. value
  end
  local evs = counters.events()
  local t = counters.totals
  local group = counters.group()
  if group then
    add("requests_measured_total", int(t[1]))
    for i, e in ipairs(evs) do add("request_" .. e.stem .. "_total", counters.value(e, t[i + 1])) end
    for name, r in pairs(counters.routes) do
      local l = ',route="' .. esc(name) .. '"'
      add("route_requests_measured_total", int(r[1]), l)
      for i, e in ipairs(evs) do add("route_" .. e.stem .. "_total", counters.value(e, r[i + 1]), l) end
    end
    local g = counters.read_worker()
    if g then
      for i, e in ipairs(evs) do add("worker_" .. e.stem .. "_total", counters.value(e, g[i])) end
      add("worker_counters_enabled_seconds_total", format("%.9f", (tonumber(g.time_enabled) or 0) / 1e9))
      add("worker_counters_running_seconds_total", format("%.9f", (tonumber(g.time_running) or 0) / 1e9))
    end
  end
  local p = sampler.profile()
  if p then
    add("sampler_samples_total", int(p.nsamples))
    local vmc = p.vmcount
    if vmc then
      for i, name in ipairs(VMSTATES) do
        add("sampler_vmstate_samples_total", int(vmc[i]), ',state="' .. name .. '"')
      end
    end
    add("lost_samples_total", int(p.lost), ',source="sampler"')
  end
  add("lost_samples_total", int(sampler.lost_window), ',source="pprof"')
  add("pprof_profiles_total", int(st.profiles))
  if with_drops then add("shared_dict_drops_total", int(st.drops)) end
  add("available", group and "1" or "0", ',what="counters"')
  add("available", p and "1" or "0", ',what="sampler"')
  add("lua_vm_info", "1", format(',vm="%s",jit="%s"', esc(jit and jit.version or _VERSION),
                                 jit and (jit.status() and "on" or "off") or "none"))
  return concat(out, "\n")
end

-- a slot: whole 4 KiB pages of the dict's slab allocator, less the
-- entry's header and key (at most 128 bytes), with at least 1 KiB to grow
local PAGE, HEAD, ROOM = 4096, 128, 1024
local function slot_for(len) return ceil((len + ROOM + HEAD) / PAGE) * PAGE - HEAD end

--- Writes this worker's figures into the dict (the timer, and metrics()).
function M.publish()
  local d = st.dict
  if not d or not st.pid then return end
  local key, ttl = "w:" .. st.pid, 5 * st.interval + 1
  local text = render_worker(false)
  local slot = st.slot
  if slot and #text >= slot then
    -- a larger slot frees this one first: only when the pages are free
    local want = slot_for(#text)
    if d.free_space and d:free_space() < want + HEAD then
      M.drop()
      d:expire(key, ttl)
      d:expire("d:" .. st.pid, ttl)
      return
    end
    slot = want
  end
  slot = slot or slot_for(#text)
  -- the padding is a line of blanks, which the exposition skips
  local ok, err = d:safe_set(key, text .. "\n" .. rep(" ", slot - #text - 1), ttl)
  st.slot = ok and slot or nil
  if not ok then
    M.drop()
    if err ~= "no memory" then ngx.log(ngx.ERR, "perf_event.openresty: cannot publish: ", err) end
  end
  -- the drop count lives as long as the figures
  d:expire("d:" .. st.pid, ttl)
end

--- Forgets this worker's entries (it exits).
function M.retire()
  local d = st.dict
  if d and st.pid then d:delete("w:" .. st.pid); d:delete("d:" .. st.pid) end
end

--- Whether the worker `pid` of this nginx still runs: its /proc entry is
-- there, not a zombie, and its parent is this worker's (the master).  True
-- when /proc cannot tell.
function M.alive(pid)
  if pid == st.pid or not st.master then return true end
  local state, parent = stat(pid)
  return state ~= nil and state ~= "Z" and state ~= "X" and parent == st.master
end

--- The pids of the workers that published lately and still run.
function M.workers()
  local d, pids = st.dict, {}
  if not d then return { st.pid } end
  for _, k in ipairs(d:get_keys(0)) do
    local pid = tonumber(k:match("^w:(%d+)$"))
    if pid and M.alive(pid) then pids[#pids + 1] = pid end
  end
  sort(pids)
  return pids
end

--- The text exposition (format 0.0.4) of every worker's figures.
function M.exposition()
  local texts = {}
  local d = st.dict
  local drops = {}
  if d then
    M.publish()
    local keys = d:get_keys(0)
    keys[#keys + 1] = "w:" .. st.pid   -- this worker's own, from its state
    sort(keys)
    for i, k in ipairs(keys) do
      if k == "w:" .. st.pid then
        if k ~= keys[i - 1] then texts[#texts + 1] = render_worker(false) end
      elseif find(k, "^w:") then
        local text = d:get(k)
        local pad = text and find(text, "\n ", 1, true)
        texts[#texts + 1] = pad and text:sub(1, pad - 1) or text
      else
        local pid = k:match("^d:(%d+)$")
        if pid then drops[#drops + 1] = { pid, d:get(k) } end
      end
    end
  else
    texts[1] = render_worker(true)
  end
  local by = {}
  local function put(fam, line)
    local l = by[fam]
    if not l then l = {}; by[fam] = l end
    l[#l + 1] = line
  end
  for _, text in ipairs(texts) do
    for fam, line in gmatch(text, "([^\t\n]+)\t([^\n]+)") do put(fam, line) end
  end
  local own = false
  for _, e in ipairs(drops) do own = own or tonumber(e[1]) == st.pid end
  -- the worker whose d:PID did not fit reports its own count
  if d and not own and st.drops > 0 then drops[#drops + 1] = { tostring(st.pid), st.drops } end
  for _, e in ipairs(drops) do
    local n = tonumber(e[2]) or 0
    if tonumber(e[1]) == st.pid and st.drops > n then n = st.drops end
    put("shared_dict_drops_total", format('%sshared_dict_drops_total{pid="%s",host="%s"} %s',
                                          PREFIX, e[1], esc(st.host), int(n)))
  end
  local out = {}
  for _, f in ipairs(families()) do
    local lines = by[f[1]]
    if lines then
      local name = PREFIX .. f[1]
      out[#out + 1] = "# HELP " .. name .. " " .. f[3]
      out[#out + 1] = "# TYPE " .. name .. " " .. f[2]
      for _, line in ipairs(lines) do out[#out + 1] = line end
    end
  end
  return concat(out, "\n") .. "\n"
end

return M
