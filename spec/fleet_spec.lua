-- The fleet endpoints of examples/openresty (perf_event.openresty) against the real
-- tools: a real nginx with two unprivileged workers, Debian's promtool and
-- Prometheus server scraping /metrics, and Go's `go tool pprof` reading
-- /debug/pprof/profile.  Temporary prefix and ports per run, on 127.0.0.1
-- only.  Runs once, in the luajit suite (nginx links luajit2).
local U = require("support.util")
local N = require("support.nginx")
local sh, have, read, write = N.sh, N.have, N.read, N.write
local json_ok, json = pcall(require, "dkjson")
local reason = N.skip_reason("the fleet test")

describe("the OpenResty fleet endpoints (perf_event.openresty)", function()
  if reason then
    pending(reason, function() end)
    return
  end

  local dir, base, master, prom_pid
  local HOT = 40          -- requests sent to /fleet/hot

  local function get(path)
    local out, ok = sh("curl -s -S --max-time 60 '" .. base .. path .. "'")
    assert(ok, "curl " .. path .. ": " .. out)
    return out
  end

  local samples = N.prom_samples   -- the samples of an exposition

  -- value of `name` by pid (only the samples whose labels include `match`)
  local function by_pid(list, name, match)
    local t = {}
    for _, s in ipairs(list) do
      local ok = s.name == name
      for k, v in pairs(match or {}) do ok = ok and s.labels[k] == v end
      if ok then t[s.labels.pid] = s.value end
    end
    return t
  end

  local function workers()
    local t = {}
    for user, wpid in sh("ps -o user=,pid= --ppid " .. master):gmatch("(%S+)%s+(%d+)") do
      t[#t + 1] = { user = user, pid = wpid }
    end
    return t
  end

  local function start()
    base, master = N.start(dir, {
      salt = 1,
      edit = function(conf)
        local two, n = conf:gsub("worker_processes%s+%d+;", "worker_processes 2;")
        assert(n == 1, "examples/openresty/nginx.conf has no worker_processes line")
        return two
      end,
      -- up when both workers have published once
      ready = function(b)
        local text, up = sh("curl -s " .. b .. "/metrics")
        if not (up and text:find("# TYPE", 1, true)) then return false end
        local nw = 0
        for _ in pairs(by_pid(samples(text), "nginx_perf_lua_vm_info")) do nw = nw + 1 end
        return nw == 2
      end,
    })
  end

  local function stop()
    if prom_pid then N.kill_wait(prom_pid) end
    N.stop(master)
  end

  setup(function()
    dir = N.prepare("fleet")
    start()
  end)

  teardown(function()
    stop()
    N.remove(dir)
  end)

  it("runs two unprivileged workers, and /metrics shows both by pid", function()
    local ws = workers()
    assert.equal(2, #ws, sh("ps -f --ppid " .. master))
    local vm = by_pid(samples(get("/metrics")), "nginx_perf_lua_vm_info", { jit = "on" })
    for _, w in ipairs(ws) do
      assert.are_not.equal("root", w.user)
      assert.equal(1, vm[w.pid], "no lua_vm_info for worker " .. w.pid)
    end
    local text = get("/metrics")
    assert.truthy(text:find('vm="LuaJIT 2', 1, true), text)
    local hostname = assert(read("/proc/sys/kernel/hostname")):gsub("%s+$", "")
    assert.truthy(text:find('host="' .. hostname .. '"', 1, true), text)
  end)

  it("counts exactly the requests sent to an opted-in route, as each worker logged them", function()
    -- four at a time, so that both workers take some
    local out, ok = sh(("seq %d | xargs -P 4 -I{} curl -s -o /dev/null -w '%%{http_code}\\n' '%s/fleet/hot?n=300'")
                       :format(HOT, base))
    assert(ok, out)
    local _, codes = out:gsub("200\n", "")
    assert.equal(HOT, codes, out)
    -- the log phase runs after the answer, and the other worker publishes
    -- every second: wait until the sum is in
    local list, sum
    for _ = 1, 60 do
      list = samples(get("/metrics"))
      sum = 0
      for _, v in pairs(by_pid(list, "nginx_perf_route_requests_measured_total", { route = "hot" })) do
        sum = sum + v
      end
      if sum == HOT then break end
      sh("sleep 0.1")
    end
    assert.equal(HOT, sum)
    -- each worker's own log lines (info level, "pid#tid: *conn perf: ...")
    local log = read(dir .. "/logs/error.log")
    local mine = {}
    for wpid, tc, pf, cs in log:gmatch("(%d+)#%d+: %*%d+ [^\n]-perf: /fleet/hot task%-clock=(%d+)ns " ..
                                       "page%-faults=(%d+) context%-switches=(%d+)") do
      local m = mine[wpid] or { 0, 0, 0, 0 }
      mine[wpid] = m
      m[1], m[2] = m[1] + 1, m[2] + tonumber(tc)
      m[3], m[4] = m[3] + tonumber(pf), m[4] + tonumber(cs)
    end
    local route = { route = "hot" }
    local n = by_pid(list, "nginx_perf_route_requests_measured_total", route)
    local tc = by_pid(list, "nginx_perf_route_task_clock_seconds_total", route)
    local pf = by_pid(list, "nginx_perf_route_page_faults_total", route)
    local cs = by_pid(list, "nginx_perf_route_context_switches_total", route)
    local seen = 0
    for wpid, m in pairs(mine) do
      seen = seen + m[1]
      assert.equal(m[1], n[wpid])
      assert.is_true(math.abs(tc[wpid] * 1e9 - m[2]) < 1, ("%s: %.9f s vs %d ns"):format(wpid, tc[wpid], m[2]))
      assert.equal(m[3], pf[wpid])
      assert.equal(m[4], cs[wpid])
      assert.is_true(m[2] > 0)
    end
    assert.equal(HOT, seen)
    -- the worker's whole task-clock holds its requests' part
    local wtc = by_pid(list, "nginx_perf_worker_task_clock_seconds_total")
    local en = by_pid(list, "nginx_perf_worker_counters_enabled_seconds_total")
    local run = by_pid(list, "nginx_perf_worker_counters_running_seconds_total")
    for wpid in pairs(mine) do
      assert.is_true(wtc[wpid] >= tc[wpid])
      assert.is_true(en[wpid] > 0 and run[wpid] > 0 and run[wpid] <= en[wpid])
    end
  end)

  it("passes promtool check metrics", function()
    if not have("promtool") then U.pending("needs promtool (Debian package prometheus)") end
    -- the always-on sampler runs: its lost-sample count is read too
    local file = dir .. "/metrics.txt"
    write(file, get("/metrics"))
    local out, ok = sh("promtool check metrics < " .. file)
    assert.is_true(ok, out .. "\n" .. read(file))
    assert.equal("", out)
    -- and every family is described: a HELP and a TYPE before its samples
    local text = read(file)
    for _, s in ipairs(samples(text)) do
      assert.truthy(text:find("# HELP " .. s.name .. " ", 1, true), s.name)
      assert.truthy(text:find("# TYPE " .. s.name .. " ", 1, true), s.name)
    end
  end)

  it("is scraped by a real Prometheus server whose API returns the counters with their labels", function()
    if not have("prometheus") then U.pending("needs the Debian package prometheus") end
    if not json_ok then U.pending("needs dkjson (Debian lua-dkjson) to read Prometheus' answers") end
    write(dir .. "/prometheus.yml", ([[
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: nginx
    metrics_path: /metrics
    static_configs:
      - targets: ["127.0.0.1:%d"]
]]):format(tonumber(base:match(":(%d+)$"))))
    local pport
    for attempt = 1, 8 do
      pport = N.port(attempt, 2)
      local pid = sh(("prometheus --config.file=%s/prometheus.yml --storage.tsdb.path=%s/tsdb " ..
                      "--web.listen-address=127.0.0.1:%d > %s/prometheus.log 2>&1 & echo $!")
                     :format(dir, dir, pport, dir)):match("%d+")
      local up = false
      for _ = 1, 150 do
        if select(2, sh(("curl -sf http://127.0.0.1:%d/-/ready"):format(pport))) then up = true break end
        if not select(2, sh("kill -0 " .. pid)) then break end
        sh("sleep 0.1")
      end
      if up then prom_pid = pid break end
      N.kill_wait(pid)
      local log = read(dir .. "/prometheus.log") or ""
      if not log:find("address already in use", 1, true) then error("prometheus did not start:\n" .. log) end
    end
    assert(prom_pid, "no free port for prometheus")
    local function query(q)
      local out, ok = sh(("curl -s -S -G --data-urlencode 'query=%s' http://127.0.0.1:%d/api/v1/query")
                         :format(q, pport))
      assert(ok, out)
      local doc = assert(json.decode(out), out)
      assert.equal("success", doc.status, out)
      return doc.data.result
    end
    -- the figures nginx shows now (no /fleet/hot request comes any more)
    local want = by_pid(samples(get("/metrics")), "nginx_perf_route_requests_measured_total", { route = "hot" })
    local res
    for _ = 1, 100 do
      res = query('nginx_perf_route_requests_measured_total{route="hot"}')
      local sum = 0
      for _, r in ipairs(res) do sum = sum + tonumber(r.value[2]) end
      if sum == HOT then break end
      sh("sleep 0.2")
    end
    local hostname = assert(read("/proc/sys/kernel/hostname")):gsub("%s+$", "")
    local sum = 0
    for _, r in ipairs(res) do
      local m = r.metric
      assert.equal("nginx", m.job)
      assert.equal(base:match("//(.*)$"), m.instance)
      assert.equal(hostname, m.host)
      assert.equal("hot", m.route)
      assert.equal(want[m.pid], tonumber(r.value[2]), "pid " .. tostring(m.pid))
      sum = sum + tonumber(r.value[2])
    end
    assert.equal(HOT, sum)
    -- both workers' series of the worker-wide counters, with the VM's state
    local pids = {}
    for _, w in ipairs(workers()) do pids[w.pid] = true end
    for _, q in ipairs({ "nginx_perf_worker_task_clock_seconds_total", "nginx_perf_lua_vm_info" }) do
      local r = query(q)
      assert.equal(2, #r, q)
      for _, s in ipairs(r) do assert.truthy(pids[s.metric.pid], q .. " pid " .. tostring(s.metric.pid)) end
    end
    for _, s in ipairs(query("nginx_perf_lua_vm_info")) do
      assert.equal("on", s.metric.jit)
      assert.truthy(s.metric.vm:find("^LuaJIT 2"), s.metric.vm)
    end
  end)

  it("refuses a profile duration that is not a positive number of seconds up to the limit", function()
    for _, q in ipairs({ "seconds=0", "seconds=-1", "seconds=abc", "seconds=61", "seconds=1&hz=0" }) do
      local out = sh("curl -s -o /dev/null -w '%{http_code}' '" .. base .. "/debug/pprof/profile?" .. q .. "'")
      assert.equal("400", out, q)
    end
  end)

  it("answers Go's /debug/pprof/profile: go tool pprof reads it and names the hot Lua function", function()
    if not read("lua/perf_event/pprof.lua") then U.pending("perf_event.pprof is not in this tree") end
    if not have("go") then U.pending("needs Debian's golang-go (go tool pprof)") end
    if not have("wrk") then U.pending("needs wrk to drive the hot handler") end
    -- the headers Go's net/http/pprof sends, and gzip's magic
    local file = dir .. "/short.pb.gz"
    local hdr = sh("curl -s -S -D - -o " .. file .. " '" .. base .. "/debug/pprof/profile?seconds=0.5'")
    assert.truthy(hdr:find("^HTTP/1.1 200"), hdr)
    assert.truthy(hdr:find("\nContent%-Type: application/octet%-stream\r\n"), hdr)
    assert.truthy(hdr:find('\nContent%-Disposition: attachment; filename="profile"\r\n'), hdr)
    assert.equal("\31\139", read(file):sub(1, 2))
    -- load on the hot handler from new connections, so that the worker
    -- that sleeps in the profile accepts its share of them
    local home = dir .. "/gohome"
    sh("mkdir -p " .. home)
    local out = sh(("wrk -t2 -c8 -d5s -H 'Connection: close' '%s/fleet/hot?n=2000' > %s/wrk.txt 2>&1 & " ..
                    "sleep 0.5; HOME=%s GOCACHE=%s/cache timeout 120 " ..
                    "go tool pprof -top '%s/debug/pprof/profile?seconds=2'; wait"):format(base, dir, home, home, base))
    assert.truthy(out:find("\nType: cpu\n", 1, true), out)
    -- the first function of -top (most flat samples) is the handler's loop
    local row = "\n%s*[%d.]+m?s%s+[%d.]+%%%s+[%d.]+%%%s+[%d.]+m?s%s+[%d.]+%%%s+(%S+)"
    local first = out:match("\n%s+flat%s+flat%%[^\n]*" .. row)
    assert.equal("collatz_steps", first, out)
    -- the samples carry the worker's pid and the host (pprof labels, as on the metrics)
    local saved = out:match("Saved profile in (%S+)")
    assert.truthy(saved, out)
    local tags = sh(("HOME=%s GOCACHE=%s/cache go tool pprof -tags '%s'"):format(home, home, saved))
    local wpid = tags:match("pid: Total[^\n]*\n[^\n]*%): (%d+)\n")
    local pids = {}
    for _, w in ipairs(workers()) do pids[w.pid] = true end
    assert.truthy(wpid and pids[wpid], tags)
    local hostname = assert(read("/proc/sys/kernel/hostname")):gsub("%s+$", "")
    assert.truthy(tags:find(hostname, 1, true), tags)
    local n = 0
    for _, v in pairs(by_pid(samples(get("/metrics")), "nginx_perf_pprof_profiles_total")) do n = n + v end
    assert.is_true(n >= 2, "pprof_profiles_total " .. n)
  end)

  it("leaves no error in the error log", function()
    local log = read(dir .. "/logs/error.log")
    for line in log:gmatch("[^\n]+") do
      assert.is_nil(line:find("%[error%]") or line:find("%[alert%]") or line:find("%[crit%]")
                    or line:find("%[emerg%]"), line)
    end
  end)
end)
