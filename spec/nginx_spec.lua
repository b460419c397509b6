-- The real Debian nginx with libnginx-mod-http-lua and examples/openresty's
-- nginx.conf: per-request counters in log_by_lua and the folded profile of
-- perf_event.openresty, workers unprivileged (nobody), on 127.0.0.1 only.
-- Runs once, in the luajit suite.
local N = require("support.nginx")
local stats = require("support.stats")
local sh, read = N.sh, N.read
local reason = N.skip_reason("the nginx integration test")

describe("nginx with perf_event.openresty (examples/openresty)", function()
  if reason then
    pending(reason, function() end)
    return
  end

  local dir, base, master

  local function get(path)
    local out, ok = sh("curl -s -S --max-time 30 '" .. base .. path .. "'")
    assert(ok, "curl " .. path .. ": " .. out)
    return out
  end

  setup(function()
    dir = N.prepare("nginx")
    base, master = N.start(dir)
  end)

  teardown(function()
    N.stop(master)
    N.remove(dir)
  end)

  it("runs its workers unprivileged", function()
    local ps = sh("ps -o user=,cmd= --ppid " .. master)
    assert.truthy(ps:find("worker process", 1, true), ps)
    assert.is_nil(ps:find("^root"), "worker runs as root: " .. ps)
  end)

  it("logs the counters of every request in log_by_lua", function()
    assert.equal("hello\n", get("/hello"))
    assert.equal("hello\n", get("/hello"))
    assert.equal("1000000\n", get("/work?n=3"))
    -- the log phase runs after the answer went out: wait for its line
    local log
    for _ = 1, 100 do
      log = read(dir .. "/logs/error.log")
      if log:find("perf: /work ", 1, true) then break end
      sh("sleep 0.05")
    end
    local n, work_tc = 0, nil
    for uri, tc, pf, cs in log:gmatch("perf: (%S+) task%-clock=(%d+)ns page%-faults=(%d+) context%-switches=(%d+)") do
      n = n + 1
      assert.truthy(tonumber(pf) and tonumber(cs))
      if uri == "/work" then work_tc = tonumber(tc) end
    end
    -- the three requests above (the worker's first request has no
    -- previous reading to start from; start()'s probes come before)
    assert.truthy(n >= 3, log)
    -- /work burns CPU in the worker: its task-clock is not zero
    assert.truthy(work_tc and work_tc > 0, log)
  end)

  it("counts exactly the requests it logged", function()
    -- the sums are updated in the log phase, after the answer: read them
    -- until they stop moving before and after two requests
    local function settled()
      local last
      for _ = 1, 100 do
        local n = tonumber(get("/metrics"):match("\nnginx_perf_requests_measured_total{[^}]*} (%d+)"))
        -- each /metrics is itself logged once after it answered
        if last and n == last + 1 then return n end
        last = n
      end
    end
    local r0 = settled()
    get("/hello")
    get("/hello")
    local r1 = settled()
    -- r0 was read by a /metrics that is logged afterwards (+1), then the
    -- two /hello (+2) and the first /metrics of settled() (+1), whose
    -- successor read r1
    assert.equal(r0 + 4, r1)
  end)

  -- first and last line of the `local function NAME` of a Lua file, and
  -- the line of the first call `NAME(` after it
  local function lines_of(path, name)
    local first, last, call, n = nil, nil, nil, 0
    for l in io.lines(path) do
      n = n + 1
      if l:find("^local function " .. name .. "%(") then first = n
      elseif first and not last and l:find("^end") then last = n
      elseif last and not call and l:find(name .. "(", 1, true) then call = n end
    end
    return first, last, call
  end

  -- folded text -> array of { stack=, count= } in the order given
  local function parse_folded(text)
    local out = {}
    for stack, count in text:gmatch("([^\n]+) (%d+)\n") do
      out[#out + 1] = { stack = stack, count = tonumber(count) }
    end
    return out
  end

  local function hot_share(stacks, pat)
    local n, total = 0, 0
    for _, e in ipairs(stacks) do
      total = total + e.count
      if e.stack:find(pat .. "$") then n = n + e.count end
    end
    return n, total
  end

  -- runs `path` for 2 s while the worker serves /lua-work (wrk, or curl)
  local function under_load(path, out)
    local load = N.have("wrk") and ("wrk -t1 -c2 -d2s '" .. base .. "/lua-work' > /dev/null")
                 or ("for i in $(seq 60); do curl -s '" .. base .. "/lua-work' > /dev/null; done")
    sh("curl -s --max-time 30 '" .. base .. path .. "' > " .. out .. " & sleep 0.2; " .. load .. "; wait")
    return assert(read(out))
  end

  it("names the Lua handler's hot function, file and line in the folded profile", function()
    local src = dir .. "/lua/perfwork.lua"
    local first, last, call = lines_of(src, "checksum_loop")
    assert.truthy(first and last and call, "checksum_loop not found in " .. src)
    assert.truthy(get("/lua-work?n=10"):find("^n=10 sum=%d+\n$"))
    local prof = under_load("/debug/pprof/profile?seconds=2&format=folded", dir .. "/lua-profile.txt")
    local stacks = parse_folded(prof)
    assert.truthy(#stacks > 0, prof)
    -- one worker: every stack under its pid
    local wpid = stacks[1].stack:match("^pid=(%d+);")
    assert.truthy(wpid, stacks[1].stack)
    for _, e in ipairs(stacks) do assert.truthy(e.stack:find("^pid=" .. wpid .. ";"), e.stack) end
    -- on top: the hot function, at a line of its own body
    local chunk = src:gsub("%p", "%%%0")
    local line = tonumber(stacks[1].stack:match(";checksum_loop@" .. chunk .. ":(%d+)$"))
    assert.truthy(line, "top stack: " .. stacks[1].stack .. "\n" .. prof)
    assert.truthy(line > first and line < last, "checksum_loop sampled at line " .. line)
    local n, total = hot_share(stacks, ";checksum_loop@" .. chunk .. ":%d+")
    local ok, why = stats.at_least("samples in checksum_loop", n, total, 0.5)
    assert.truthy(ok, why .. "\n" .. prof)
    -- its caller, at the line of the call
    assert.truthy(prof:find(";M.handler@" .. chunk .. ":" .. call .. ";checksum_loop@"), prof)
  end)

  it("leaves no error in the error log", function()
    -- a flood (e.g. a busy ngx.sleep(0) loop) fails here, not as an OOM
    local f = assert(io.open(dir .. "/logs/error.log"))
    local size = f:seek("end")
    f:close()
    assert.is_true(size < 1024 * 1024, "error.log has " .. size .. " bytes")
    local log = read(dir .. "/logs/error.log")
    assert.is_nil(log:find("sleep(0)", 1, true))
    -- the profiler's signal (SIGRTMIN+3, SA_RESTART) can interrupt
    -- epoll_wait, which nginx then logs at info level; never more than that
    for line in log:gmatch("[^\n]+") do
      if line:find("Interrupted system call", 1, true) then
        assert.truthy(line:find("%[info%]"), line)
      end
      assert.is_nil(line:find("%[error%]") or line:find("%[alert%]") or line:find("%[crit%]")
                    or line:find("%[emerg%]"), line)
    end
  end)
end)
