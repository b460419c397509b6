--- perf_event.openresty.sampler: the worker's always-on sampler and its
-- part of a profile window (not a public interface).
--
-- The always-on sampler is a `pe.profile` with `keep=false`: every sample
-- is folded into per-stack counts when the timer drains it, so memory
-- grows with the distinct stacks only, and the counts are forgotten at the
-- start of each window (and when they pass `max_stacks`).  A window is
-- then: drain and reset at its start, drain and read at its end.  Without
-- the always-on sampler, a window starts a profile of its own and stops it.
-- @module perf_event.openresty.sampler

local ngx = ngx  -- luacheck: read globals ngx
local require, tostring, tonumber, ipairs, format, concat, min, floor =
  require, tostring, tonumber, ipairs, string.format, table.concat, math.min, math.floor

local M = {}

local always        -- the always-on profile, or nil
local always_err    -- why it is not running
local conf = { freq = 99, stacks = "lua", max_stacks = 20000 }
local next_drain = 0
M.lost_window = 0   -- samples lost by the windows' own profiles

-- hz 0: a block profile (where the worker waited in the kernel)
local function start_profile(freq)
  local pe = require("perf_event")
  -- 32 pages (128 KiB): the unprivileged mlock budget (perf_event_mlock_kb)
  -- is per user, shared by every worker of nobody
  if freq == 0 then return pe.profile.start({ block = true, pages = 32 }) end
  return pe.profile.start({ freq = freq, keep = false, pages = 32, lua = conf.stacks ~= "c" })
end

local windows = 0   -- profiles a window of this worker runs (log() names routes while one runs)

--- The route names the samples of requests take: the first `max_routes`
-- names, then "other" (as the metrics' route label); `name` nil: the
-- request's path.
local route_seen, nroute_seen, max_routes = {}, 0, 16
function M.limit_routes(n) max_routes = n end
function M.route(name)
  if not (always or windows > 0) then return end
  name = name or ngx.var.uri
  if not route_seen[name] then
    if nroute_seen >= max_routes then name = "other"
    else route_seen[name], nroute_seen = true, nroute_seen + 1 end
  end
  require("perf_event.profile")._request_done(name)
end

--- Starts the always-on sampler of this worker.
function M.start(opts)
  conf.freq, conf.stacks = opts.freq, opts.stacks
  local p, err = start_profile(conf.freq)
  always, always_err = p, err
  if not p then return nil, err end
  return true
end

function M.profile() return always, always_err end

local DRAIN_SAMPLES = 100  -- a drain has a fixed part: wait for this many
local DRAIN_WAIT = 2        -- s: but not longer (128 KiB of ring holds ~400 samples)

--- The timer's part: drains the always-on profile once 100 samples are
-- waiting (p:pending(), no system call) or 2 s after the last drain (an
-- idle worker takes few samples; the 128 KiB ring holds about 4 s at
-- 99 Hz); where the count is not known, about every 100 samples of the
-- rate (once a second at 99 Hz).
function M.tick(now)
  local p = always
  if not p then return end
  local n = p:pending()
  if n then
    if n < DRAIN_SAMPLES and now < next_drain then return end
    next_drain = now + DRAIN_WAIT
  else
    if now < next_drain then return end
    next_drain = now + min(1, DRAIN_SAMPLES / conf.freq) - 0.05
  end
  p:drain()
  if (p.nstacks or 0) > conf.max_stacks then p:reset() end
end

--- Stops the always-on profile (the worker exits).
function M.stop()
  if always then always:stop() end
  always = nil
end

--- A window begins in this worker: returns its state, or nil and why.
-- hz 0: a block profile, always the window's own.
function M.begin(hz)
  local w = {}
  if always and hz ~= 0 then
    always:drain()
    always:reset()
    w.p, w.own, w.lost0, w.n0 = always, false, always.lost, always.nsamples
    w.freq = conf.freq
  else
    local p, err = start_profile(hz)
    if not p then return nil, err end
    w.p, w.own, w.lost0, w.n0, w.freq = p, true, 0, 0, hz
    windows = windows + 1
  end
  ngx.update_time()
  w.t0 = ngx.now()
  return w
end

-- a label value on a part's line: no tab or newline
local function field(v) return (tostring(v or ""):gsub("%c", " ")) end

--- The part of a window this worker did not sample (it saw the window
-- after its end): the header of a part with no samples, and why.
function M.empty(hz, note)
  return format("#freq=%d samples=0 lost=0 mode=none duration=0.000 note=%s",
                floor(always and conf.freq or hz), (note:gsub("%s", "_")))
end

--- The window ends: its stacks as text, a header line first
-- ("#freq=99 samples=N lost=L mode=safepoint duration=3.012"), then one
-- line per stack and labels ("ROUTE<tab>VMSTATE<tab>a;b;c N"; a block
-- profile's N in nanoseconds).
function M.finish(w)
  local p = w.p
  local counts
  if w.own then
    windows = windows - 1
    p:stop()
    M.lost_window = M.lost_window + (tonumber(p.lost) or 0)
  else
    p:drain()
  end
  counts = p:aggregate({ reset = not w.own, labels = true })
  ngx.update_time()
  local out = { format("#freq=%d samples=%d lost=%d mode=%s duration=%.3f%s", floor(w.freq),
                       p.block and (p.nwaits or 0) or p.nsamples - w.n0, (tonumber(p.lost) or 0) - w.lost0,
                       p.block and "block" or tostring(p.mode),
                       ngx.now() - w.t0,
                       p.stacks == false and p.stacks_reason and (" note=" .. p.stacks_reason:gsub("%s", "_")) or "") }
  for _, e in ipairs(counts) do
    local lab = e.labels or {}
    out[#out + 1] = field(lab.route) .. "\t" .. field(lab.vmstate) .. "\t" .. e.key .. " " .. format("%.0f", e.count)
  end
  return concat(out, "\n")
end

return M
