-- perf_event.openresty as a user meets it: `luarocks make --tree TMP`, the
-- nginx.conf lines of doc/openresty.md (read from the doc, so it cannot
-- drift) with the package paths pointing at that tree only, two
-- unprivileged workers, and the user's own handler with its own hot Lua
-- function.  Then the real tools: promtool, a Prometheus server, `go tool
-- pprof` over HTTP; reloads, bad input, a full shared dict, and
-- perf_event_paranoid=3 (simulated: an LD_PRELOAD'ed syscall() refuses
-- perf_event_open with EACCES, and PE_SYSCTL_DIR words the message as for
-- 3, since the real sysctl is shared with everything on this machine).
-- Runs once, in the luajit suite (nginx links luajit2).
local U = require("support.util")
local N = require("support.nginx")
local sh, have, read, write = N.sh, N.have, N.read, N.write
local json_ok, json = pcall(require, "dkjson")
local reason = N.skip_reason("the OpenResty module test")
if not reason and not have("luarocks") then reason = "needs luarocks (tools/setup installs it)" end

-- the user's handler: a hot function of their own, in their own file
local APP = N.USER_APP

-- nginx's processes under /proc (no `ps` on a minimal Debian): the
-- children of `master` as { pid=, uid=, fds=, perf=, sockets= }: the fds
-- other than sockets (a connection in flight comes and goes), the
-- perf_event ones among them, and the sockets
local function children(master)
  local out = {}
  local list = sh("ls /proc")
  for p in list:gmatch("%d+") do
    local stat = read("/proc/" .. p .. "/stat")
    local ppid = stat and stat:match("^%d+ %(.-%) %a (%d+)")
    if ppid == tostring(master) then
      local status = read("/proc/" .. p .. "/status") or ""
      local cmd = (read("/proc/" .. p .. "/cmdline") or ""):gsub("%z", " ")
      if cmd:find("worker process", 1, true) then
        local w = { pid = p, uid = tonumber(status:match("\nUid:%s+(%d+)")), fds = 0, perf = 0, sockets = 0 }
        for target in sh("ls -l /proc/" .. p .. "/fd"):gmatch("%-> ([^\n]+)") do
          if target:find("^socket:") then w.sockets = w.sockets + 1
          else
            w.fds = w.fds + 1
            if target:find("perf_event", 1, true) then w.perf = w.perf + 1 end
          end
        end
        out[#out + 1] = w
      end
    end
  end
  table.sort(out, function(a, b) return tonumber(a.pid) < tonumber(b.pid) end)
  return out
end

describe("perf_event.openresty, installed by the rock, in a user's nginx.conf", function()
  if reason then
    pending(reason, function() end)
    return
  end

  local dir, tree, base, master, prom_pid
  local servers = {}   -- masters to stop

  local function get(path, b)
    local out, ok = sh("curl -s -S --max-time 60 '" .. (b or base) .. path .. "'")
    assert(ok, "curl " .. path .. ": " .. out)
    return out
  end
  local function status(path, b)
    return sh("curl -s -o /dev/null -w '%{http_code}' --max-time 60 '" .. (b or base) .. path .. "'")
  end

  local samples = N.prom_samples
  local function by_pid(list, name, match)
    local t = {}
    for _, s in ipairs(list) do
      local ok = s.name == name
      for k, v in pairs(match or {}) do ok = ok and s.labels[k] == v end
      if ok then t[s.labels.pid] = s.value end
    end
    return t
  end
  local function count(t) local n = 0 for _ in pairs(t) do n = n + 1 end return n end

  -- doc/openresty.md's snippet made into this run's nginx.conf
  local function conf_from_doc(extra_main)
    local doc = assert(read("doc/openresty.md"))
    local snippet = doc:match("\n## 2%. The nginx%.conf lines\n.-```nginx\n(.-\n)```")
    assert(snippet, "no ```nginx block under '## 2. The nginx.conf lines' in doc/openresty.md")
    -- the doc's load_module lines, which must hold under this run's -p prefix
    local modules = doc:match("\n```nginx\n(load_module [^`]-)\n```")
    assert(modules, "no ```nginx block of load_module lines in doc/openresty.md")
    local c, n = snippet, 0
    local function sub(from, to)
      local k
      c, k = c:gsub(from:gsub("%p", "%%%0"), (to:gsub("%%", "%%%%")))
      assert(k > 0, "the doc's snippet has no '" .. from .. "'")
      n = n + k
    end
    sub('lua_package_path  "/usr/local/share/lua/5.1/',
        'lua_package_path  "' .. dir .. '/app/?.lua;' .. tree .. '/share/lua/5.1/')
    sub("/usr/local/share/lua/5.1/", tree .. "/share/lua/5.1/")
    sub("/usr/local/lib/lua/5.1/", tree .. "/lib/lua/5.1/")
    -- (reuseport: each worker has its own socket, and the kernel spreads
    -- new connections over them by a hash of their addresses and ports.
    -- With one shared socket the worker that waited last takes each
    -- connection, and on a loaded machine one worker could get none for a
    -- whole window)
    sub("listen 8080;", "listen 127.0.0.1:@PORT@ reuseport;")
    -- a conf of its own has no access_log: nginx's default is
    -- /var/log/nginx/access.log, which a non-root master cannot open
    -- (make test-user), and this run's logs belong under its prefix anyway
    sub("http {\n", "http {\n    access_log logs/access.log;\n")
    sub("        location = /metrics {", table.concat({
      "        location = /hot { content_by_lua_block { require(\"myapp\").handler() } }",
      "        location = /hello { content_by_lua_block { ngx.say(\"hello\") } }",
      -- the spec's own probes, not the user's
      "        location = /where { content_by_lua_block {",
      "            ngx.say(package.searchpath('perf_event.openresty', package.path))",
      "            ngx.say(package.searchpath('perf_event.core', package.cpath)) } }",
      -- a profile of the worker's own: how its Lua stacks are taken
      "        location = /walk { content_by_lua_block {",
      "            local p = assert(require('perf_event').profile.start({ freq = 499 }))",
      "            local t0, a = os.clock(), 0",
      "            while os.clock() - t0 < 0.2 do a = a + math.sin(a) end",
      "            p:stop()",
      "            ngx.say('walk=', tostring(p.walk), ' reason=', tostring(p.stacks_reason),",
      "                    ' samples=', p.nsamples) } }",
      "        location = /fill { content_by_lua_block {",
      "            local d, i, size = ngx.shared.perf_event, 0, 4096",
      "            while size >= 1 do",
      "              while d:safe_set('junk:' .. i, string.rep('x', size)) do i = i + 1 end",
      "              size = size / 2",
      "            end",
      "            ngx.say(i) } }",
      "        location = /unfill { content_by_lua_block {",
      "            local d = ngx.shared.perf_event",
      "            local n = 0",
      "            for _, k in ipairs(d:get_keys(0)) do if k:find('^junk:') then d:delete(k) n = n + 1 end end",
      "            ngx.say(n) } }",
      "        location = /metrics {" }, "\n"))
    return table.concat({
      "worker_processes 2;",
      "pid logs/nginx.pid;",
      "error_log logs/error.log notice;",
      modules,
      extra_main or "",
      "events { worker_connections 1024; }",
      c }, "\n")
  end

  -- nginx under `prefix` with this conf; up when both workers published
  local function start(prefix, conf, salt, env)
    sh("mkdir -p " .. prefix .. "/conf " .. prefix .. "/logs && chmod 755 " .. prefix)
    local b, m = N.start(prefix, {
      salt = salt,
      edit = function() return conf end,
      env = env,
      ready = function(bb)
        local text, up = sh("curl -s " .. bb .. "/metrics")
        if not (up and text:find("# TYPE", 1, true)) then return false end
        return count(by_pid(samples(text), "nginx_perf_lua_vm_info")) == 2
      end,
    })
    servers[#servers + 1] = m
    return b, m
  end

  setup(function()
    dir = sh("mktemp -d /tmp/pe-openresty.XXXXXX"):gsub("%s+$", "")
    assert(dir:find("^/tmp/pe%-openresty%."), dir)
    tree = dir .. "/tree"
    local out, ok = sh("luarocks make --tree " .. tree .. " rockspec/perf_event-scm-1.rockspec")
    assert(ok, "luarocks make failed:\n" .. out)
    sh("mkdir -p " .. dir .. "/app")
    write(dir .. "/app/myapp.lua", APP)
    assert(select(2, sh("chmod -R a+rX " .. dir)))
    base, master = start(dir, conf_from_doc(), 3)
  end)

  teardown(function()
    if prom_pid then N.kill_wait(prom_pid) end
    for _, m in ipairs(servers) do N.stop(m) end
    N.remove(dir)
  end)

  it("is installed by the rock, and nginx loads it from that tree only", function()
    for _, f in ipairs({ "init", "counters", "metrics", "sampler", "window" }) do
      assert.truthy(read(tree .. "/share/lua/5.1/perf_event/openresty/" .. f .. ".lua"), f)
    end
    assert.equal(tree .. "/share/lua/5.1/perf_event/openresty/init.lua\n" ..
                 tree .. "/lib/lua/5.1/perf_event/core.so\n", get("/where"))
  end)

  it("takes a worker's Lua stacks at the safe point (LuaJIT's profiler hook) with the rock's core", function()
    local out = get("/walk")
    assert.truthy(out:find("walk=safepoint reason=nil ", 1, true), out)
    assert.truthy(tonumber(out:match("samples=(%d+)")) > 0, out)
  end)

  it("runs two unprivileged workers", function()
    local ws = children(master)
    assert.equal(2, #ws)
    for _, w in ipairs(ws) do assert.is_true(w.uid ~= 0, "worker " .. w.pid .. " runs as root") end
  end)

  it("after load, /metrics passes promtool and its per-request CPU seconds sum to more than 0", function()
    if not have("promtool") then U.pending("needs promtool (Debian package prometheus)") end
    local out, ok = sh(("seq 40 | xargs -P 4 -I{} curl -s -o /dev/null -w '%%{http_code}\\n' '%s/hot?n=20000'")
                       :format(base))
    assert(ok, out)
    assert.equal(40, select(2, out:gsub("200\n", "")), out)
    local list, sum, n
    for _ = 1, 50 do
      list = samples(get("/metrics"))
      sum, n = 0, 0
      for _, v in pairs(by_pid(list, "nginx_perf_request_task_clock_seconds_total")) do sum = sum + v end
      for _, v in pairs(by_pid(list, "nginx_perf_requests_measured_total")) do n = n + v end
      if n >= 40 then break end
      sh("sleep 0.1")
    end
    assert.is_true(sum > 0, "CPU seconds " .. sum)
    assert.is_true(n >= 40, "measured " .. n)
    local file = dir .. "/metrics.txt"
    write(file, get("/metrics"))
    out, ok = sh("promtool check metrics < " .. file)
    assert.is_true(ok, out .. "\n" .. read(file))
    assert.equal("", out)
    local pids = {}
    for _, w in ipairs(children(master)) do pids[w.pid] = true end
    local avail = by_pid(samples(read(file)), "nginx_perf_available", { what = "sampler" })
    assert.equal(2, count(avail))
    for p, v in pairs(avail) do
      assert.truthy(pids[p], p)
      assert.equal(1, v)
    end
  end)

  it("go tool pprof -top over HTTP under load: the user's hot function first, samples of both workers", function()
    if not have("go") then U.pending("needs Debian's golang-go (go tool pprof)") end
    if not have("wrk") then U.pending("needs wrk") end
    local home = dir .. "/gohome"
    sh("mkdir -p " .. home)
    local out = sh(("wrk -t2 -c8 -d5s -H 'Connection: close' '%s/hot' > %s/wrk.txt 2>&1 & " ..
                    "sleep 0.5; HOME=%s GOCACHE=%s/cache timeout 120 " ..
                    "go tool pprof -top '%s/debug/pprof/profile?seconds=3'; wait"):format(base, dir, home, home, base))
    assert.truthy(out:find("\nType: cpu\n", 1, true), out)
    local row = "\n%s*[%d.]+m?s%s+[%d.]+%%%s+[%d.]+%%%s+[%d.]+m?s%s+[%d.]+%%%s+(%S+)"
    local first = out:match("\n%s+flat%s+flat%%[^\n]*" .. row)
    assert.equal("crunch_numbers", first, out)
    local saved = assert(out:match("Saved profile in (%S+)"), out)
    local tags = sh(("HOME=%s GOCACHE=%s/cache go tool pprof -tags '%s'"):format(home, home, saved))
    local ws = children(master)
    assert.equal(2, #ws)
    for _, w in ipairs(ws) do
      assert.truthy(tags:find("%): " .. w.pid .. "\n"), "no samples of worker " .. w.pid .. ":\n" .. tags)
    end
  end)

  it("answers one worker (?pid=), folded stacks and speedscope JSON", function()
    if not have("wrk") then U.pending("needs wrk") end
    local ws = children(master)
    local tmp = dir .. "/folded.txt"
    -- /hot requests for as long as the window is open, each on a new
    -- connection (hundreds: wrk): which worker accepts each is the
    -- kernel's choice, by a hash of the connection's ports (reuseport), so
    -- that the odds of none reaching the worker asked for are 2^-hundreds.
    -- (A loop of curl made 4 or 5 requests a second on a loaded machine,
    -- and all of them went to the other worker now and then.)
    sh(("wrk -t1 -c4 -d30s -H 'Connection: close' '%s/hot' > /dev/null 2>&1 & w=$!; " ..
        "curl -s '%s/debug/pprof/profile?seconds=1&format=folded&pid=%s' > %s; kill $w; wait")
       :format(base, base, ws[1].pid, tmp))
    local folded = read(tmp)
    local lines = 0
    for stack, n in folded:gmatch("([^\n]+) (%d+)\n") do
      lines = lines + 1
      assert.truthy(stack:find("^pid=" .. ws[1].pid .. ";"), stack)
      assert.truthy(tonumber(n) > 0)
    end
    assert.is_true(lines > 0, folded)
    local js = get("/debug/pprof/profile?seconds=0.5&format=speedscope")
    if json_ok then
      local doc = assert(json.decode(js), js)
      assert.equal("https://www.speedscope.app/file-format-schema.json", doc["$schema"])
    else
      assert.truthy(js:find('"$schema"', 1, true), js)
    end
  end)

  it("takes one window per server: a second gets 429; bad input 400; an unknown pid 404", function()
    local tmp = dir .. "/first.txt"
    local out = sh(("curl -s -o %s -w '%%{http_code}' '%s/debug/pprof/profile?seconds=2&format=folded' & " ..
                    "sleep 0.5; curl -s -w ' %%{http_code}' '%s/debug/pprof/profile?seconds=1'; echo; wait")
                   :format(tmp, base, base))
    assert.truthy(out:find("already running on this server", 1, true), out)
    assert.truthy(out:find(" 429\n"), out)
    assert.truthy(out:find("^200") or out:find("\n200"), out)
    for _, q in ipairs({ "seconds=0", "seconds=-1", "seconds=abc", "seconds=61", "seconds=1&hz=0",
                         "seconds=1&format=svg", "seconds=1&pid=abc", "seconds=1&seconds=2" }) do
      assert.equal("400", status("/debug/pprof/profile?" .. q), q)
    end
    -- 150 arguments, the bad one last: the parser keeps 100, and says so
    local many = {}
    for i = 1, 150 do many[i] = "x" .. i .. "=1" end
    assert.equal("400", status("/debug/pprof/profile?" .. table.concat(many, "&") .. "&seconds=abc"))
    assert.equal("404", status("/debug/pprof/profile?seconds=1&pid=1"))
  end)

  it("is scraped by a real Prometheus server", function()
    if not have("prometheus") then U.pending("needs the Debian package prometheus") end
    if not json_ok then U.pending("needs dkjson (Debian lua-dkjson)") end
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
      pport = N.port(attempt, 4)
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
    local res
    for _ = 1, 100 do
      local out = sh(("curl -s -G --data-urlencode 'query=nginx_perf_request_task_clock_seconds_total' " ..
                      "http://127.0.0.1:%d/api/v1/query"):format(pport))
      local doc = json.decode(out)
      res = doc and doc.data and doc.data.result
      if res and #res == 2 then break end
      sh("sleep 0.2")
    end
    assert.equal(2, #res)
    local pids = {}
    for _, w in ipairs(children(master)) do pids[w.pid] = true end
    local sum = 0
    for _, r in ipairs(res) do
      assert.truthy(pids[r.metric.pid], r.metric.pid)
      assert.equal("nginx", r.metric.job)
      sum = sum + tonumber(r.value[2])
    end
    assert.is_true(sum > 0)
  end)

  it("drops figures when the shared dict is full, counts the drops, and no request errs", function()
    local filled = tonumber(get("/fill"))
    assert.is_true(filled > 0)
    for _ = 1, 20 do assert.equal("200", status("/hot?n=1000")) end
    -- no room for a profile window
    local out = sh("curl -s -w ' %{http_code}' '" .. base .. "/debug/pprof/profile?seconds=1'")
    assert.truthy(out:find("the shared dict", 1, true) and out:find(" 503$"), out)
    sh("sleep 1.5")   -- a publication per worker and second
    local text = get("/metrics")
    local drops = by_pid(samples(text), "nginx_perf_shared_dict_drops_total")
    local total = 0
    for _, v in pairs(drops) do total = total + v end
    assert.is_true(total > 0, text)
    -- every worker's count is there: the window's lock and sequence number
    -- did not evict them (an add or incr on a full dict evicts)
    for _, w in ipairs(children(master)) do assert.truthy(drops[w.pid], w.pid .. " has no drops line: " .. text) end
    -- nor anything of the user's
    assert.equal(filled .. "\n", get("/unfill"))
  end)

  it("keeps the workers' fd counts flat over 8 reloads", function()
    local counts = {}
    for i = 1, 8 do
      local before = {}
      for _, w in ipairs(children(master)) do before[w.pid] = true end
      assert(select(2, sh("nginx -p " .. dir .. " -c " .. dir .. "/conf/nginx.conf -s reload")))
      -- the new workers, once the old ones are gone and both published
      local ws
      for _ = 1, 100 do
        ws = children(master)
        local new = #ws == 2
        for _, w in ipairs(ws) do if before[w.pid] then new = false end end
        if new then break end
        sh("sleep 0.1")
      end
      assert.equal(2, #ws)
      for _ = 1, 50 do
        if status("/hello") == "200" then break end
        sh("sleep 0.1")
      end
      sh("sleep 0.3")
      ws = children(master)
      local n = {}
      for _, w in ipairs(ws) do n[#n + 1] = w.fds .. " fds, " .. w.perf .. " perf_event" end
      counts[i] = n
    end
    -- each worker: its counter group (3 events) and its sampler
    assert.same({ "4 perf_event", "4 perf_event" }, { counts[1][1]:match("%d+ perf_event"),
                                                      counts[1][2]:match("%d+ perf_event") })
    for i = 2, 8 do assert.same(counts[1], counts[i], "reload " .. i) end
  end)

  it("leaves no error in the error log", function()
    local log = read(dir .. "/logs/error.log")
    for line in log:gmatch("[^\n]+") do
      assert.is_nil(line:find("%[error%]") or line:find("%[alert%]") or line:find("%[crit%]")
                    or line:find("%[emerg%]"), line)
    end
  end)

  it("under perf_event_paranoid=3 (simulated) logs one clear line and /metrics still answers", function()
    if not have("cc") then U.pending("needs cc for the syscall shim") end
    local d3 = dir .. "/p3"
    sh("mkdir -p " .. d3 .. "/sysctl")
    write(d3 .. "/sysctl/perf_event_paranoid", "3\n")
    write(d3 .. "/shim.c", [[
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <sys/syscall.h>
long syscall(long n, ...)
{
  static long (*real)(long, ...);
  va_list ap;
  long a[6];
  int i;
  if (n == SYS_perf_event_open) { errno = EACCES; return -1; }
  if (!real) real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
  va_start(ap, n);
  for (i = 0; i < 6; i++) a[i] = va_arg(ap, long);
  va_end(ap);
  return real(n, a[0], a[1], a[2], a[3], a[4], a[5]);
}
]])
    local out, ok = sh("cc -shared -fPIC -o " .. d3 .. "/shim.so " .. d3 .. "/shim.c -ldl")
    assert(ok, out)
    sh("chmod -R a+rX " .. d3)
    local b3 = start(d3, conf_from_doc("env PE_SYSCTL_DIR;"), 5,
                     "LD_PRELOAD=" .. d3 .. "/shim.so PE_SYSCTL_DIR=" .. d3 .. "/sysctl")
    local text = get("/metrics", b3)
    local avail = by_pid(samples(text), "nginx_perf_available", { what = "counters" })
    assert.equal(2, count(avail), text)
    for _, v in pairs(avail) do assert.equal(0, v) end
    assert.equal("200", status("/hot?n=10", b3))
    assert.equal("500", status("/debug/pprof/profile?seconds=0.3", b3))
    local log = read(d3 .. "/logs/error.log")
    local lines = {}
    for line in log:gmatch("[^\n]+") do
      if line:find("perf_event.openresty", 1, true) then lines[#lines + 1] = line end
    end
    assert.equal(1, #lines, log)
    assert.truthy(lines[1]:find("perf_event_paranoid=3", 1, true), lines[1])
    assert.truthy(lines[1]:find("sysctl kernel.perf_event_paranoid=2", 1, true), lines[1])
  end)
end)
