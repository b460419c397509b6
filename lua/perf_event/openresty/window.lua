--- perf_event.openresty.window: one profile window over the workers of
-- this nginx, through the shared dict (not a public interface).
--
-- The answering worker takes the lock `pp:lock` (`add`: one window per
-- server at a time), numbers the window (`pp:seq`) and writes
-- `pp:win` = "ID START END PID HZ" (PID 0: every worker).  Every worker's
-- timer (0.1 s) reads `pp:win`; a worker the window is for joins
-- (`pp:ID:j:PID`), begins its part (sampler.begin) and, at END, writes its
-- stacks under `pp:ID:r:PID`.  The answering worker sleeps (`ngx.sleep`)
-- until END, then gathers the parts of the workers that joined, waiting
-- at most `GRACE` seconds more for them.  Nothing waits in the event loop.
-- @module perf_event.openresty.window

local ngx = ngx  -- luacheck: read globals ngx
local sampler = require("perf_event.openresty.sampler")
local metrics = require("perf_event.openresty.metrics")

local tonumber, tostring, ipairs, pairs, pcall, format, max, min =
  tonumber, tostring, ipairs, pairs, pcall, string.format, math.max, math.min

local M = {}

M.TICK = 0.1     -- the timer's period
local GRACE = 3  -- seconds after END the answering worker waits for the parts

local cur            -- this worker's window in progress: { id=, deadline=, w= }
local last_id = 0    -- the last window this worker took part in, or skipped

local function parse(s)
  local id, t0, t1, pid, hz = s:match("^(%d+) (%S+) (%S+) (%d+) (%d+)$")
  if not id then return nil end
  return { id = tonumber(id), t0 = tonumber(t0), t1 = tonumber(t1), pid = tonumber(pid), hz = tonumber(hz) }
end

local function put(dict, key, value, ttl)
  local ok = dict:safe_set(key, value, ttl)
  if not ok then metrics.drop() end
  return ok
end

--- The timer's part, every TICK: join a new window, end the current one.
function M.tick(dict, pid, now)
  if cur then
    if now >= cur.deadline then
      local c = cur
      cur = nil
      local ok, text = pcall(sampler.finish, c.w)
      if not ok then text = "#error " .. tostring(text) end
      if not put(dict, format("pp:%d:r:%d", c.id, pid), text, 60) then
        put(dict, format("pp:%d:r:%d", c.id, pid), "#error the shared dict is full", 60)
      end
    end
    return
  end
  local s = dict:get("pp:win")
  if not s then return end
  local win = parse(s)
  if not win or win.id <= last_id then return end
  last_id = win.id
  if (win.pid ~= 0 and win.pid ~= pid) or now >= win.t1 then return end
  if not put(dict, format("pp:%d:j:%d", win.id, pid), 1, win.t1 - now + GRACE + 10) then return end
  local w, err = sampler.begin(win.hz)
  if not w then
    put(dict, format("pp:%d:r:%d", win.id, pid), "#error " .. tostring(err), 60)
    return
  end
  cur = { id = win.id, deadline = win.t1, w = w }
end

--- The worker exits: its window in progress is dropped.
function M.abandon()
  if cur and cur.w.own then pcall(cur.w.p.stop, cur.w.p) end
  cur = nil
end

-- waits (ngx.sleep) until `t`, in steps of at most 0.25 s; never sleep(0)
local function sleep_until(t)
  repeat
    ngx.update_time()
    local left = t - ngx.now()
    if left > 0 then ngx.sleep(max(0.001, min(0.25, left))) end
  until left <= 0
end

--- Runs one window of `seconds` for `target` (0: every worker) at `hz`
-- (when no always-on sampler runs).  Returns a table { [pid] = text }
-- and the window's start time, or nil, an HTTP status and a message.
function M.run(dict, seconds, target, hz)
  -- safe_add, and incr with no init value: an add or incr that finds the
  -- dict full evicts its least recently used keys (the workers' d:PID
  -- drop counts among the first: expire() does not renew them)
  local ok, err = dict:safe_add("pp:lock", 1, seconds + GRACE + 10)
  if not ok then
    if err == "exists" then
      return nil, 429, "perf_event.openresty: a profile window is already running on this server; try again later"
    end
    metrics.drop()
    return nil, 503, "perf_event.openresty: the shared dict cannot take the profile window: " .. tostring(err)
  end
  local pok, a, b, c = pcall(function()
    dict:safe_add("pp:seq", 0)
    local id = dict:incr("pp:seq", 1)
    if not id then
      metrics.drop()
      return nil, 503, "perf_event.openresty: the shared dict is full"
    end
    ngx.update_time()
    local t0 = ngx.now()
    local t1 = t0 + seconds
    if not dict:safe_set("pp:win", format("%d %.3f %.3f %d %d", id, t0, t1, target, hz), seconds + GRACE + 10) then
      metrics.drop()
      return nil, 503, "perf_event.openresty: the shared dict is full"
    end
    -- the parts come at the workers' first tick after END
    sleep_until(t1 + 2 * M.TICK)
    local parts, deadline = {}, t1 + GRACE
    repeat
      local missing = 0
      for _, k in ipairs(dict:get_keys(0)) do
        local wpid = k:match("^pp:" .. id .. ":j:(%d+)$")
        if wpid and not parts[wpid] then
          local text = dict:get("pp:" .. id .. ":r:" .. wpid)
          if text then parts[wpid] = text else missing = missing + 1 end
        end
      end
      ngx.update_time()
      if missing == 0 or ngx.now() >= deadline then break end
      ngx.sleep(M.TICK)
    until false
    for wpid in pairs(parts) do
      dict:delete("pp:" .. id .. ":j:" .. wpid)
      dict:delete("pp:" .. id .. ":r:" .. wpid)
    end
    dict:delete("pp:win")
    return parts, t0
  end)
  dict:delete("pp:lock")
  if not pok then return nil, 500, "perf_event.openresty: profile window failed: " .. tostring(a) end
  return a, b, c
end

--- The same window in this worker alone, without a shared dict.
function M.run_local(seconds, hz)
  local w, err = sampler.begin(hz)
  if not w then return nil, 500, "Could not enable CPU profiling: " .. tostring(err) end
  ngx.update_time()
  local t0 = ngx.now()
  local ok, e = pcall(sleep_until, t0 + seconds)
  local text = sampler.finish(w)
  if not ok then return nil, 500, tostring(e) end
  return { [tostring(ngx.worker.pid())] = text }, t0
end

return M
