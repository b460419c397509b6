--- perf_event.openresty.window: one profile window over the workers of
-- this nginx, through the shared dict (not a public interface).
--
-- The answering worker takes the lock `pp:lock` (`safe_add`: one window per
-- server at a time) under the window's id "PID-MS" (its pid, the start in
-- ms), and writes `pp:win` = "ID START END PID HZ" (PID 0: every worker).
-- The lock lives `LAPSE` seconds; the answering worker renews it at least
-- every `RENEW` seconds while it waits, so that a window whose worker died
-- frees it `LAPSE` seconds later.  It takes its own part in the request
-- (from START to END, without the dict).  Every other worker's timer (0.1 s)
-- reads `pp:win`; a worker the window is for begins its part
-- (sampler.begin) and, at END, writes its stacks under `pp:ID:r:PID`; a
-- worker that sees the window after its END writes an empty part at once;
-- a worker still in a window that a newer one replaced (its answerer died)
-- drops it.  The answering worker expects the parts of the workers that
-- published lately and run (metrics.workers()), and before `pp:win` it
-- writes each one's key with a placeholder as long as the part that says
-- the dict is full: a part that does not fit frees the placeholder and
-- finds room for that one in its place (or the key is gone).  It no longer
-- waits for a worker that died, and waits at most `GRACE` seconds after
-- END.  A part missing from a live worker makes the answer a 503 that
-- names it.  Nothing waits in the event loop.
-- @module perf_event.openresty.window

local ngx = ngx  -- luacheck: read globals ngx
local sampler = require("perf_event.openresty.sampler")
local metrics = require("perf_event.openresty.metrics")

local tonumber, tostring, ipairs, pairs, pcall, next = tonumber, tostring, ipairs, pairs, pcall, next
local format, rep, concat, sort = string.format, string.rep, table.concat, table.sort
local max, min, floor = math.max, math.min, math.floor

local M = {}

M.TICK = 0.1     -- the timer's period
local GRACE = 3  -- seconds after END the answering worker waits for the parts
local LAPSE = 3  -- seconds the lock outlives its last renewal
local RENEW = 0.25  -- the answering worker renews the lock at least this often

local FULL = "the shared dict is full"
local FULL_PART = "#error " .. FULL
-- what a part's key holds until the worker writes its part: as long as
-- FULL_PART, which a part that does not fit then finds room for in its
-- place (a safe_set of another length frees the entry first)
local PENDING = "#pending" .. rep(" ", #FULL_PART - #"#pending")

local cur            -- this worker's part in progress: { win=, w=, inline= }
local last_seen      -- the last `pp:win` this worker acted on
local tdict, tpid    -- the dict and pid the timer passes

local function parse(s)
  local id, t0, t1, pid, hz = s:match("^(%d+%-%d+) (%S+) (%S+) (%d+) (%d+)$")
  if not id then return nil end
  return { s = s, id = id, t0 = tonumber(t0), t1 = tonumber(t1), pid = tonumber(pid), hz = tonumber(hz) }
end

local function put(dict, key, value, ttl)
  local ok = dict:safe_set(key, value, ttl)
  if not ok then metrics.drop() end
  return ok
end

-- a worker's part, or what stopped it; kept until the answering worker
-- takes it, or GRACE s more (its answerer died)
local function write_part(dict, id, pid, text)
  local key = format("pp:%s:r:%d", id, pid)
  if not put(dict, key, text, GRACE + LAPSE) then
    put(dict, key, FULL_PART, GRACE + LAPSE)
  end
end

-- this worker's part in progress, dropped (its window is over)
local function drop_cur()
  if cur and cur.w.own then pcall(cur.w.p.stop, cur.w.p) end
  cur = nil
end

local function finish_cur()
  local c = cur
  cur = nil
  local ok, text = pcall(sampler.finish, c.w)
  if not ok then text = "#error " .. tostring(text) end
  return text
end

--- The timer's part, every TICK: join a new window, end the current one.
function M.tick(dict, pid, now)
  tdict, tpid = dict, pid
  local s = dict:get("pp:win")
  if cur then
    if cur.inline then return end            -- the answering worker's own: run() ends it
    if s and s ~= cur.win.s then drop_cur()  -- replaced: its answerer is gone
    elseif now < cur.win.t1 then return
    else
      local id = cur.win.id
      write_part(dict, id, pid, finish_cur())
      return
    end
  end
  if not s or s == last_seen then return end
  last_seen = s
  local win = parse(s)
  if not win or (win.pid ~= 0 and win.pid ~= pid) then return end
  if now >= win.t1 then
    write_part(dict, win.id, pid, sampler.empty(win.hz, "the window had ended when this worker saw it"))
    return
  end
  local w, err = sampler.begin(win.hz)
  if not w then return write_part(dict, win.id, pid, "#error " .. tostring(err)) end
  cur = { win = win, w = w }
end

--- The worker exits: its window in progress is dropped, and its answering
-- worker told so.
function M.abandon()
  if cur and not cur.inline and tdict then
    write_part(tdict, cur.win.id, tpid, "#error the worker exited during the window")
  end
  drop_cur()
end

-- waits (ngx.sleep) until `t`, in steps of at most RENEW s, renewing the
-- lock; never sleep(0).  False when the lock is no longer this window's.
local function sleep_until(t, renew)
  repeat
    if not renew() then return false end
    ngx.update_time()
    local left = t - ngx.now()
    if left > 0 then ngx.sleep(max(0.001, min(RENEW, left))) end
  until left <= 0
  return true
end

-- the 503 naming the workers whose part is missing: { [pid] = why }
local function lacking(missing)
  local pids, by, order = {}, {}, {}
  for p in pairs(missing) do pids[#pids + 1] = p end
  sort(pids)
  for _, p in ipairs(pids) do
    local why = missing[p]
    if not by[why] then by[why] = {}; order[#order + 1] = why end
    by[why][#by[why] + 1] = tostring(p)
  end
  local out = {}
  for i, why in ipairs(order) do
    local l = by[why]
    out[i] = format("%s %s (%s)", #l > 1 and "workers" or "worker", concat(l, ", "), why)
  end
  return nil, 503, "perf_event.openresty: the profile lacks " .. concat(out, ", ") .. "; try again later"
end

-- the window, once the lock is taken
local function window(dict, id, pid, t0, seconds, target, hz, expect, renew)
  local t1 = t0 + seconds
  local s = format("%s %.3f %.3f %d %d", id, t0, t1, target, hz)
  local waiting, ttl = {}, seconds + GRACE + LAPSE
  local room = true
  for _, p in ipairs(expect) do
    if p ~= pid then
      waiting[p] = format("pp:%s:r:%d", id, p)
      room = room and dict:safe_set(waiting[p], PENDING, ttl)
    end
  end
  room = room and dict:safe_set("pp:win", s, ttl)
  if not room then
    metrics.drop()
    local missing = {}
    for _, key in pairs(waiting) do dict:delete(key) end
    for _, p in ipairs(expect) do missing[p] = FULL .. ": no room for the window" end
    return lacking(missing)
  end
  last_seen = s              -- this worker's own part is taken here, not by its timer
  local parts, missing = {}, {}
  if target == 0 or target == pid then
    drop_cur()
    local w, err = sampler.begin(hz)
    if w then cur = { win = parse(s), w = w, inline = true }
    else parts[tostring(pid)] = "#error " .. tostring(err) end
  end
  if not sleep_until(t1, renew) then
    drop_cur()
    return nil, 503, "perf_event.openresty: the window's lock lapsed (its worker was blocked for more than "
                     .. LAPSE .. " s); try again"
  end
  if cur and cur.inline then parts[tostring(pid)] = finish_cur() end
  local deadline = t1 + GRACE
  while next(waiting) do
    for p, key in pairs(waiting) do
      local text = dict:get(key)
      if text ~= PENDING then
        -- (no text: the part freed the placeholder and found no room, not
        -- even for FULL_PART)
        waiting[p] = nil
        dict:delete(key)
        if not text or text == FULL_PART then missing[p] = FULL else parts[tostring(p)] = text end
      elseif not metrics.alive(p) then
        waiting[p] = nil
        dict:delete(key)
        parts[tostring(p)] = "#error the worker exited during the window"
      end
    end
    ngx.update_time()
    if not next(waiting) or ngx.now() >= deadline then break end
    renew()
    ngx.sleep(M.TICK)
  end
  for p, key in pairs(waiting) do
    dict:delete(key)
    missing[p] = format("no part %d s after the window's end", GRACE)
  end
  if dict:get("pp:win") == s then dict:delete("pp:win") end
  if next(missing) then return lacking(missing) end
  return parts, t0
end

--- Runs one window of `seconds` for `target` (0: every worker) at `hz`
-- (when no always-on sampler runs).  Returns a table { [pid] = text }
-- and the window's start time, or nil, an HTTP status and a message.
function M.run(dict, seconds, target, hz)
  local pid = ngx.worker.pid()
  local expect = {}
  if target ~= 0 then expect[1] = target
  else
    expect = metrics.workers()
    local me = false
    for _, p in ipairs(expect) do me = me or p == pid end
    if not me then expect[#expect + 1] = pid end
  end
  ngx.update_time()
  local t0 = ngx.now()
  local id = format("%d-%d", pid, floor(t0 * 1000))
  -- safe_add: an add that finds the dict full evicts its least recently
  -- used keys
  local ok, err = dict:safe_add("pp:lock", id, LAPSE)
  if not ok then
    if err == "exists" then
      return nil, 429, "perf_event.openresty: a profile window is already running on this server; try again later"
    end
    metrics.drop()
    local missing = {}
    for _, p in ipairs(expect) do missing[p] = FULL .. ": no room for the window's lock" end
    return lacking(missing)
  end
  local function renew()
    if dict:get("pp:lock") ~= id then return false end
    dict:expire("pp:lock", LAPSE)
    return true
  end
  local pok, a, b, c = pcall(window, dict, id, pid, t0, seconds, target, hz, expect, renew)
  if cur and cur.inline then drop_cur() end
  if dict:get("pp:lock") == id then dict:delete("pp:lock") end
  if not pok then return nil, 500, "perf_event.openresty: profile window failed: " .. tostring(a) end
  return a, b, c
end

--- The same window in this worker alone, without a shared dict.
function M.run_local(seconds, hz)
  local w, err = sampler.begin(hz)
  if not w then return nil, 500, "Could not enable CPU profiling: " .. tostring(err) end
  ngx.update_time()
  local t0 = ngx.now()
  local ok, e = pcall(sleep_until, t0 + seconds, function() return true end)
  local text = sampler.finish(w)
  if not ok then return nil, 500, tostring(e) end
  return { [tostring(ngx.worker.pid())] = text }, t0
end

return M
