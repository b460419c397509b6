-- perf_event.openresty under faults: a profile window whose answering
-- worker, or whose every worker, is killed (kill -9: the master forks new
-- ones); a worker killed while it takes part; a window shorter than the
-- workers' 0.1 s timer; a shared dict full before a window, or filled
-- while it runs; /metrics with a full dict.  Each test runs an nginx of
-- its own: the nginx.conf lines of doc/openresty.md (read from the doc),
-- two workers, the user's own handler, and probes of the spec's own.
-- Every wait polls up to a deadline taken from the documented bounds
-- (doc/openresty.md).  Runs once, in the luajit suite (nginx links
-- luajit2).
local U = require("support.util")
local N = require("support.nginx")
local sh, have, read, write = N.sh, N.have, N.read, N.write
local reason = N.skip_reason("the OpenResty fault test")

-- the documented bounds: a window's lock lapses at most LAPSE s after its
-- answering worker's death; the answering worker waits at most GRACE s
-- after the window's end for the other workers' parts; the workers publish
-- their figures every second (`interval`)
local LAPSE, GRACE, INTERVAL = 3, 3, 1

-- the user's handler: a hot function of their own, in their own file
local APP = N.USER_APP

-- the user's location, 16 routes that opt in, and the spec's probes: the
-- window's lock and its record, a fill of the dict as the user's own code
-- could do (safe_set: nothing of anyone's is evicted), and its undoing
local function locations()
  local l = {
    '        location = /hot { content_by_lua_block { require("myapp").handler() } }',
    "        location = /probe/window { content_by_lua_block {",
    "            local d = ngx.shared.perf_event",
    "            ngx.say(tostring(d:get('pp:lock')), '|', tostring(d:get('pp:win'))) } }",
    "        location = /probe/fill { content_by_lua_block {",
    "            local d, i, size = ngx.shared.perf_event, 0, 4096",
    "            while size >= 1 do",
    "              while d:safe_set('junk:' .. i, string.rep('x', size)) do i = i + 1 end",
    "              size = size / 2",
    "            end",
    "            ngx.update_time()",
    "            ngx.say(i, ' ', string.format('%.3f', ngx.now())) } }",
    "        location = /probe/unfill { content_by_lua_block {",
    "            local d, n = ngx.shared.perf_event, 0",
    "            for _, k in ipairs(d:get_keys(0)) do if k:find('^junk:') then d:delete(k) n = n + 1 end end",
    "            ngx.say(n) } }",
  }
  for i = 1, 16 do
    l[#l + 1] = ('        location = /r/%d { content_by_lua_block { ngx.say("r%d") }\n' ..
                 '            log_by_lua_block { require("perf_event.openresty").log("route_%d") } }'):format(i, i, i)
  end
  return table.concat(l, "\n")
end

local samples = N.prom_samples   -- a Prometheus text's samples

-- the pids (numbers) that have a sample of `name`
local function pids_of(list, name)
  local t = {}
  for _, s in ipairs(list) do if s.name == name then t[tonumber(s.labels.pid)] = true end end
  return t
end

-- an HTTP GET: its status ("000" when curl got none) and body
local function fetch(url)
  local out = sh("curl -s --max-time 90 -w '\\n%{http_code}' '" .. url .. "'")
  local body, code = out:match("^(.*)\n(%d%d%d)$")
  return code or "000", body or out
end

-- `body` names each pid of `pids` (as a number of its own)
local function names_all(body, pids)
  for _, p in ipairs(pids) do
    if not body:find("%f[%d]" .. p .. "%f[%D]") then return false, p end
  end
  return true
end

-- an nginx under `dir` (from N.prepare) with the doc's lines, up once both
-- workers published their figures
local function serve(dir)
  sh("mkdir -p " .. dir .. "/app")
  write(dir .. "/app/myapp.lua", APP)
  assert(select(2, sh("chmod -R a+rX " .. dir)))
  local conf = N.conf_from_doc(dir, { app = dir .. "/app", locations = locations() })
  return N.start(dir, {
    edit = function() return conf end,
    ready = function(b)
      local code, text = fetch(b .. "/metrics")
      if code ~= "200" then return false end
      local n = 0
      for _ in pairs(pids_of(samples(text), "nginx_perf_lua_vm_info")) do n = n + 1 end
      return n == 2
    end,
  })
end

-- a server of the test's own, stopped and removed when the test ends
-- (the test's one finally)
local function up()
  local srv = { dir = N.prepare("faults") }
  finally(function() N.stop(srv.master) N.remove(srv.dir) end)
  srv.base, srv.master = serve(srv.dir)
  return srv
end

-- a profile request in the background: wait() gives its status, body and
-- the seconds it took (curl's time_total)
local function background(dir, url)
  local out = sh("mktemp " .. dir .. "/bg.XXXXXX"):gsub("%s+$", "")
  sh(("(curl -s -o %s.body -w '%%{http_code} %%{time_total}' --max-time 90 '%s' > %s; echo ' done' >> %s) " ..
      "< /dev/null > /dev/null 2>&1 &"):format(out, url, out, out))
  return {
    wait = function(deadline)
      repeat
        local s = read(out) or ""
        local code, took = s:match("^(%d+) ([%d.]+) done")
        if code then return code, read(out .. ".body") or "", tonumber(took) end
        assert(N.clock() < deadline, "the background request did not end in time: " .. s)
        sh("sleep 0.1")
      until false
    end,
  }
end

-- the window that runs now: its answering worker's pid (the lock is
-- "PID-MS") and its end (pp:win is "ID T0 T1 PID HZ"), polled until one runs
local function running(base, deadline)
  repeat
    local _, s = fetch(base .. "/probe/window")
    local holder = s:match("^(%d+)%-%d+|")
    local t1 = s:match("|%S+ %S+ (%S+) ")
    if holder and t1 then return tonumber(holder), tonumber(t1) end
    assert(N.clock() < deadline, "no window started: " .. s)
    sh("sleep 0.05")
  until false
end

-- polls short windows until one answers 200: the time it was sent.  Until
-- then each must answer 429 (the lock held), and none be sent after `bound`
local function retake(base, bound)
  repeat
    local sent = N.clock()
    assert.is_true(sent <= bound, "every window answered 429 until the bound")
    local code, body = fetch(base .. "/debug/pprof/profile?seconds=0.2&format=folded")
    if code == "200" then return sent end
    assert.equal("429", code, body)
    sh("sleep 0.1")
  until false
end

describe("perf_event.openresty under faults", function()
  if reason then
    pending(reason, function() end)
    return
  end

  it("a window whose answering worker is killed frees its lock: a new window answers 200 within "
     .. "seconds + 3 s", function()
    local srv = up()
    local dir, base, master = srv.dir, srv.base, srv.master
    local S = 5
    local bg = background(dir, base .. "/debug/pprof/profile?format=folded&seconds=" .. S)
    local holder = running(base, N.clock() + 10)
    assert(select(2, sh("kill -KILL " .. holder)))
    local killed = N.clock()
    -- taken by seconds + 3 s after the death (the lock lapses LAPSE s after it)
    retake(base, killed + S + LAPSE)
    local code = bg.wait(N.clock() + 10)
    assert.equal("000", code)
    local ws = N.workers(master)
    assert.equal(2, #ws)
    for _, p in ipairs(ws) do assert.is_true(p ~= holder) end
  end)

  it("every worker killed mid-window: the master's new workers take a new window within "
     .. "seconds + 3 s, and answer 200", function()
    local srv = up()
    local dir, base, master = srv.dir, srv.base, srv.master
    local S = 5
    local old = N.workers(master)
    local bg = background(dir, base .. "/debug/pprof/profile?seconds=" .. S)
    running(base, N.clock() + 10)
    assert(select(2, sh("kill -KILL " .. table.concat(old, " "))))
    retake(base, N.clock() + S + LAPSE)
    assert.equal("000", (bg.wait(N.clock() + 10)))
    local ws = N.workers(master)
    assert.equal(2, #ws)
    for _, p in ipairs(ws) do assert.is_true(p ~= old[1] and p ~= old[2]) end
    -- and the window after answers at once
    assert.equal("200", (fetch(base .. "/debug/pprof/profile?seconds=0.2&format=speedscope")))
  end)

  it("a worker killed while it takes part: the window answers 200 from the others, within its "
     .. "seconds + 3 s, and the next window is taken at once", function()
    local srv = up()
    local dir, base, master = srv.dir, srv.base, srv.master
    local S = 3
    local bg = background(dir, base .. "/debug/pprof/profile?format=folded&seconds=" .. S)
    local holder = running(base, N.clock() + 10)
    local other
    for _, p in ipairs(N.workers(master)) do if p ~= holder then other = p end end
    assert(select(2, sh("kill -KILL " .. other)))
    local code, body, took = bg.wait(N.clock() + S + GRACE + 10)
    assert.equal("200", code, body)
    assert.is_true(took <= S + GRACE, took .. " s")
    code, body = fetch(base .. "/debug/pprof/profile?seconds=0.2")
    assert.equal("200", code, body)
  end)

  it("a window of seconds=0.01 answers 200, in every format and for one worker", function()
    local srv = up()
    local base, master = srv.base, srv.master
    for _, q in ipairs({ "", "&format=folded", "&format=speedscope" }) do
      for _ = 1, 3 do
        local code, body = fetch(base .. "/debug/pprof/profile?seconds=0.01" .. q)
        assert.equal("200", code, q .. ": " .. body)
      end
    end
    for _, p in ipairs(N.workers(master)) do
      local code, body = fetch(base .. "/debug/pprof/profile?seconds=0.01&format=folded&pid=" .. p)
      assert.equal("200", code, body)
    end
  end)

  it("a full shared dict: every format answers 503 naming every worker; once emptied, 200", function()
    local srv = up()
    local base, master = srv.base, srv.master
    local ws = N.workers(master)
    local code, body = fetch(base .. "/probe/fill")
    assert.equal("200", code, body)
    for _, q in ipairs({ "", "&format=folded", "&format=speedscope" }) do
      code, body = fetch(base .. "/debug/pprof/profile?seconds=0.2" .. q)
      assert.equal("503", code, q .. ": " .. body)
      assert.truthy(body:find("shared dict is full", 1, true), body)
      local all, p = names_all(body, ws)
      assert.is_true(all, "worker " .. tostring(p) .. " not named: " .. body)
    end
    fetch(base .. "/probe/unfill")
    code, body = fetch(base .. "/debug/pprof/profile?seconds=0.2&format=folded")
    assert.equal("200", code, body)
  end)

  it("a dict that fills while the window runs: every format answers 503 naming the workers whose "
     .. "part did not fit", function()
    local srv = up()
    local dir, base, master = srv.dir, srv.base, srv.master
    for _, q in ipairs({ "", "&format=folded", "&format=speedscope" }) do
      -- the fill must end before the window does (the parts are written at
      -- its end): a window that ended first is not a case, and runs again longer
      local S, code, body, holder
      for attempt = 1, 3 do
        S = 2 * attempt
        local bg = background(dir, base .. "/debug/pprof/profile?seconds=" .. S .. q)
        local t1
        holder, t1 = running(base, N.clock() + 10)
        local _, filled = fetch(base .. "/probe/fill")
        local at = tonumber(filled:match(" ([%d.]+)"))
        code, body = bg.wait(N.clock() + S + GRACE + 10)
        fetch(base .. "/probe/unfill")
        if at < t1 then break end
        code = nil
      end
      assert(code, "the dict was never full before the window's end")
      assert.equal("503", code, q .. ": " .. body)
      assert.truthy(body:find("shared dict is full", 1, true), body)
      local others = {}
      for _, p in ipairs(N.workers(master)) do if p ~= holder then others[#others + 1] = p end end
      assert.equal(1, #others)
      local all, p = names_all(body, others)
      assert.is_true(all, "worker " .. tostring(p) .. " not named: " .. body)
      assert.is_nil(body:find("%f[%d]" .. holder .. "%f[%D]"), body)
    end
    local code, body = fetch(base .. "/debug/pprof/profile?seconds=0.2")
    assert.equal("200", code, body)
  end)

  it("/metrics with a full dict keeps every worker's own figures, and passes promtool", function()
    local srv = up()
    local dir, base, master = srv.dir, srv.base, srv.master
    local ws = N.workers(master)
    local code, body = fetch(base .. "/probe/fill")
    assert.equal("200", code, body)
    -- the workers' figures grow (new routes, and the counts' digits) while
    -- the dict is full; two publications of every worker at least
    local fams = { "nginx_perf_requests_measured_total", "nginx_perf_worker_task_clock_seconds_total",
                   "nginx_perf_available", "nginx_perf_lua_vm_info", "nginx_perf_shared_dict_drops_total" }
    local text
    local stop = N.clock() + 2 * INTERVAL + 1
    local round = 0
    repeat
      round = round + 1
      for i = 1, 16 do fetch(base .. "/r/" .. i) end
      code, text = fetch(base .. "/metrics")
      assert.equal("200", code, text)
      local list = samples(text)
      for _, f in ipairs(fams) do
        local have_pid = pids_of(list, f)
        for _, p in ipairs(ws) do
          assert.truthy(have_pid[p], "round " .. round .. ": no " .. f .. " of " .. p .. ":\n" .. text)
        end
      end
    until N.clock() > stop
    if not have("promtool") then U.pending("needs promtool (Debian package prometheus)") end
    local file = dir .. "/metrics.txt"
    write(file, text)
    local out, ok = sh("promtool check metrics < " .. file)
    assert.is_true(ok, out .. "\n" .. text)
    assert.equal("", out)
  end)
end)
