-- perf_event.openresty beyond on-CPU time, as a user meets it: the
-- nginx.conf lines of doc/openresty.md (its `location /debug/pprof/`
-- serving `profile` and `block`), the user's own handler file, and `go tool
-- pprof` reading the answers over HTTP.  Routes: every sample of a request
-- carries its `route` label (`-tagfocus`).  VM states: the `vmstate` label
-- and the /metrics counters (promtool).  Block profiles: where the workers
-- waited in the kernel under Lua code, weighed by the time waited; waits
-- that yield to the event loop (ngx.sleep) do not count.  Block profiles
-- count switches in the kernel: their server's workers run as root (`user
-- root;`); the other server's workers are unprivileged and get the
-- kernel's refusal, explained.  Runs once, in the luajit suite.
local U = require("support.util")
local N = require("support.nginx")
local sh, have, read, write = N.sh, N.have, N.read, N.write
local reason = N.skip_reason("the OpenResty profiles test")

-- the user's handlers, in their own file
local APP = [[
local ffi = require("ffi")
ffi.cdef("int usleep(unsigned int);")
local M = {}
local function hot_route_a(n)
  local s = 0
  for i = 1, n do s = (s * 31 + i) % 1000003 end
  return s
end
local function hot_route_b(n)
  local s = 0
  for i = 1, n do s = (s * 17 + i * 3) % 999983 end
  return s
end
local function make_garbage(n)
  local t
  for i = 1, n do t = { i, { i }, tostring(i) } end
  return #t
end
-- (never compiled: the route's interpreted part)
local function count_slowly(n)
  local s = 0
  for i = 1, n do s = (s + i * 7) % 65521 end
  return s
end
jit.off(count_slowly)
local function wait_in_usleep() ffi.C.usleep(20000) end
local function wait_in_ngx_sleep() ngx.sleep(0.02) end
function M.a() ngx.say(hot_route_a(300000)) end
function M.b() ngx.say(hot_route_b(300000)) end
function M.gc() ngx.say(make_garbage(60000), count_slowly(300000)) end
function M.blocks() wait_in_usleep() ngx.say("ok") end
function M.sleeps() wait_in_ngx_sleep() ngx.say("ok") end
return M
]]

local LOCATIONS = table.concat({
  '        location = /a { content_by_lua_block { require("profapp").a() } }',
  '        location = /b { content_by_lua_block { require("profapp").b() } }',
  '        location = /gc { content_by_lua_block { require("profapp").gc() } }',
  '        location = /blocks { content_by_lua_block { require("profapp").blocks() } }',
  '        location = /sleeps { content_by_lua_block { require("profapp").sleeps() } }',
  '        location = /hello { content_by_lua_block { ngx.say("hello") } }',
  -- the exact-match location of earlier versions of the doc keeps working
  '        location = /debug/pprof/profile { content_by_lua_block { require("perf_event.openresty").pprof() } }',
}, "\n")

describe("perf_event.openresty's routes, VM states and block profiles", function()
  if reason then
    pending(reason, function() end)
    return
  end
  if not have("go") or not have("wrk") then
    pending("needs Debian's golang-go (go tool pprof) and wrk", function() end)
    return
  end

  local dir, base, rbase
  local servers = {}

  local function status(path, b)
    return sh("curl -s -o /dev/null -w '%{http_code}' --max-time 60 '" .. (b or base) .. path .. "'")
  end

  -- `go tool pprof ARGS` on the profile fetched from url while wrk loads
  -- each of `paths` (two connections each), the profile saved first
  local function under_load(b, paths, url, file)
    local cmds = {}
    for i, p in ipairs(paths) do
      cmds[#cmds + 1] = ("wrk -t1 -c2 -d6s '%s%s' > %s/wrk%d.txt 2>&1 &"):format(b, p, dir, i)
    end
    local fetch = (" sleep 0.5; curl -s -S --max-time 60 -o %s -w '%%{http_code}' '%s%s'; wait"):format(file, b, url)
    local out = sh(table.concat(cmds, " ") .. fetch)
    return out:match("(%d%d%d)%s*$"), out
  end
  local function pprof(args)
    local home = dir .. "/gohome"
    return sh(("HOME=%s GOCACHE=%s/cache timeout 120 go tool pprof %s 2>&1"):format(home, home, args))
  end
  -- the values go tool pprof -tags lists under `key`
  local function tag_values(tags, key)
    local block = tags:match("\n%s*" .. key .. ": Total[^\n]*\n(.-)\n%s*\n")
                  or tags:match(key .. ": Total[^\n]*\n(.*)$")
    local vals = {}
    for v in (block or ""):gmatch("%): ([^\n]+)") do vals[v] = true end
    return vals
  end

  local function start(prefix, main, salt)
    local conf = N.conf_from_doc(prefix, { app = prefix .. "/app", locations = LOCATIONS, main = main })
    local b, m = N.start(prefix, { salt = salt, edit = function() return conf end })
    servers[#servers + 1] = m
    -- both workers have published (their timers run)
    for _ = 1, 100 do
      local text = sh("curl -s " .. b .. "/metrics")
      local n = 0
      for _ in text:gmatch("\nnginx_perf_lua_vm_info{") do n = n + 1 end
      if n == 2 then break end
      sh("sleep 0.1")
    end
    return b, m
  end

  setup(function()
    dir = N.prepare("profiles")
    sh("mkdir -p " .. dir .. "/app " .. dir .. "/gohome")
    write(dir .. "/app/profapp.lua", APP)
    assert(select(2, sh("chmod -R a+rX " .. dir)))
    base = start(dir, nil, 5)
    if U.is_root() then
      -- a second prefix whose workers may count the kernel's switches
      local rdir = dir .. "/root"
      sh("mkdir -p " .. rdir .. "/conf " .. rdir .. "/logs && cp -r " .. dir .. "/lua " .. dir .. "/lib "
         .. dir .. "/app " .. rdir .. "/")
      rbase = start(rdir, "user root;", 6)
    end
  end)

  teardown(function()
    for _, m in ipairs(servers) do N.stop(m) end
    N.remove(dir)
  end)

  it("labels each sample with its request's route: -tagfocus keeps one route's hot function", function()
    local file = dir .. "/routes.pb"
    local code, out = under_load(base, { "/a", "/b" }, "/debug/pprof/profile?seconds=3", file)
    assert.equal("200", code, out)
    local tags = pprof("-tags " .. file)
    local routes = tag_values(tags, "route")
    assert.is_true(routes["/a"] and routes["/b"], tags)
    local row = "\n%s*[%d.]+m?s%s+[%d.]+%%%s+[%d.]+%%%s+[%d.]+m?s%s+[%d.]+%%%s+(%S+)"
    for _, r in ipairs({ { "/a", "hot_route_a" }, { "/b", "hot_route_b" } }) do
      local top = pprof("-tagfocus 'route=^" .. r[1] .. "$' -top " .. file)
      assert.equal(r[2], top:match("\n%s+flat%s+flat%%[^\n]*" .. row), top)
    end
    -- folded stacks under route frames when asked
    local folded = sh(("wrk -t1 -c2 -d3s '%s/a' > /dev/null 2>&1 & sleep 0.3; "
                       .. "curl -s '%s/debug/pprof/profile?seconds=1&format=folded&by=route'; wait"):format(base, base))
    local rooted = "pid=%d+;route=/a;[^\n]*hot_route_a@"
    assert.truthy(folded:find("\n" .. rooted) or folded:find("^" .. rooted), folded)
    -- and speedscope's frames
    local js = sh(("wrk -t1 -c2 -d3s '%s/b' > /dev/null 2>&1 & sleep 0.3; "
                   .. "curl -s '%s/debug/pprof/profile?seconds=1&format=speedscope&by=route'; wait"):format(base, base))
    assert.truthy(js:find('"name":"route=/b"', 1, true), js:sub(1, 2000))
  end)

  it("labels each sample with the VM state: an allocating route shows three states, GC among them", function()
    -- (the route allocates in a compiled loop and counts in an interpreted one)
    local file = dir .. "/states.pb"
    local code, out = under_load(base, { "/gc" }, "/debug/pprof/profile?seconds=3", file)
    assert.equal("200", code, out)
    local tags = pprof("-tags " .. file)
    local states, n = tag_values(tags, "vmstate"), 0
    for _ in pairs(states) do n = n + 1 end
    assert.is_true(n >= 3 and states.gc, tags)
    -- /metrics counts the sampler's samples by state, per worker
    local text = sh("curl -s " .. base .. "/metrics")
    local gc = 0
    for v in text:gmatch('\nnginx_perf_sampler_vmstate_samples_total{[^}]*state="gc"} (%d+)') do
      gc = gc + tonumber(v)
    end
    assert.is_true(gc > 0, text)
    if have("promtool") then
      write(dir .. "/metrics.txt", text)
      local pout, ok = sh("promtool check metrics < " .. dir .. "/metrics.txt")
      assert.is_true(ok, pout)
    end
  end)

  it("answers a block profile: the usleep handler's waits, not ngx.sleep's", function()
    U.need_root("the block profile's server runs its workers as root (kernel switches are counted in the kernel)")
    local file = dir .. "/block.txt"
    local code, out = under_load(rbase, { "/blocks", "/sleeps" }, "/debug/pprof/block?seconds=3&format=folded", file)
    assert.equal("200", code, out)
    local folded = assert(read(file))
    local total, usleep, ngxsleep = 0, 0, 0
    for stack, n in folded:gmatch("([^\n]+) (%d+)\n") do
      total = total + tonumber(n)
      if stack:find("wait_in_usleep@", 1, true) then usleep = usleep + tonumber(n) end
      if stack:find("wait_in_ngx_sleep@", 1, true) then ngxsleep = ngxsleep + tonumber(n) end
    end
    -- each worker waits in usleep for most of the window: two workers,
    -- more than a second of waits each
    assert.is_true(usleep > 2e9 * 0.5, folded)
    assert.is_true(usleep >= 0.8 * total, folded)
    assert.is_true(ngxsleep <= 0.05 * total, folded)
    -- go tool pprof reads it: Go's delay sample type
    local pb = dir .. "/block.pb"
    code, out = under_load(rbase, { "/blocks", "/sleeps" }, "/debug/pprof/block?seconds=2", pb)
    assert.equal("200", code, out)
    local top = pprof("-top " .. pb)
    assert.truthy(top:find("\nType: delay\n", 1, true), top)
    assert.truthy(top:find("wait_in_usleep", 1, true), top)
  end)

  it("explains an unprivileged worker's refusal of a block profile, and refuses an unknown profile", function()
    local msg = sh("curl -s --max-time 30 '" .. base .. "/debug/pprof/block?seconds=0.5'")
    if U.is_root() or U.paranoid() >= 2 then
      assert.truthy(msg:find("Could not enable block profiling", 1, true), msg)
      assert.truthy(msg:find("CAP_PERFMON", 1, true), msg)
      assert.equal("500", status("/debug/pprof/block?seconds=0.5"))
    end
    assert.equal("404", status("/debug/pprof/heap?seconds=1"))
    assert.equal("400", status("/debug/pprof/profile?seconds=1&by=nothing"))
    assert.equal("200", status("/debug/pprof/profile?seconds=0.5"))
  end)
end)
