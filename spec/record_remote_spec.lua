-- luaperf record --lua -p PID on a LuaJIT process that loaded nothing of
-- ours (spec/support/remote_target.lua): each sample's Lua stack is read at
-- the sample by the BPF program and checked.  The target times each of its
-- functions with os.clock; each one's inclusive share of the samples must
-- be that share, within the exact binomial bound of the count plus SYS.
-- luaperf runs under the suite's interpreter; the target is LuaJIT.
local U = require("support.util")
local stats = require("support.stats")

local TARGET = "spec/support/remote_target.lua"
local SYS = 0.03
local CASES = { "cls_gsub", "cls_sort", "cls_meta", "cls_alloc", "cls_pcall", "cls_co", "cls_loop", "cls_off" }
local have_luajit = U.sh("command -v luajit") ~= ""

local function wait_until(what, pred, secs)
  local t0 = os.time()
  while not pred() do
    assert(os.time() - t0 <= (secs or 10), "timed out waiting for " .. what)
    U.sh("sleep 0.02")
  end
end

-- the target started (as: a command prefix), once its loop runs
local function start(seconds, as)
  local dir = U.sh("mktemp -d"):gsub("%s+$", "")
  U.sh("chmod 777 " .. dir)
  local pid = tonumber(U.sh("sh -c '" .. (as or "") .. "luajit " .. TARGET .. " " .. seconds .. " " .. dir
                            .. "/ready > " .. dir .. "/out 2>&1 & echo $!'"))
  wait_until("the target's loop", function() return U.read(dir .. "/ready") ~= nil end)
  return pid, dir
end

describe("luaperf record --lua -p PID on a LuaJIT process that loaded nothing of ours", function()
  if not have_luajit then
    it("needs luajit", function()
      pending("no luajit: tools/setup installs luajit2")
    end)
    return
  end
  local core = require("perf_event.core")
  local bpf_ok, bpf_why = core._private.ljb_load()
  if bpf_ok then core._private.ljb_close() end

  it("gives each class's function its os.clock share, every sample a checked Lua chain", function()
    if not U.is_root() then pending("BPF: root") return end
    if not bpf_ok then pending(tostring(bpf_why)) return end
    U.need((os.getenv("PE_SUITE") or "luajit") == "luajit",
           "the target is luajit in every suite: its shares are checked in the luajit suite")
    local pid, dir = start(3)
    finally(function() U.sh("kill " .. pid .. " 2>/dev/null; rm -rf " .. dir) end)
    local text, rc = U.luaperf("record --lua -F 999 -p " .. pid .. " -o " .. dir .. "/t.folded")
    assert.equal(0, rc, text)
    local samples, failed = text:match("%[ luaperf record: (%d+) samples, %d+ stacks written to .-; (%d+) failed")
    assert.truthy(samples, text)
    samples, failed = tonumber(samples), tonumber(failed)
    -- the target's own timing
    wait_until("the target's figures", function() return (U.read(dir .. "/out") or ""):find("cls_off") end)
    local t, spent = {}, 0
    for name, secs in U.read(dir .. "/out"):gmatch("(cls_%w+) ([%d.]+)") do
      t[name] = tonumber(secs)
      spent = spent + t[name]
    end
    -- the samples: each stack's case (its inclusive frame)
    local hits, n, folded, with_lua = {}, 0, U.slurp(dir .. "/t.folded"), 0
    for _, c in ipairs(CASES) do hits[c] = 0 end
    for stack, k in folded:gmatch("([^\n]+) (%d+)\n") do
      assert.truthy(stack:find("^luajit;"), stack)
      if stack:find("@", 1, true) then with_lua = with_lua + tonumber(k) end
      for _, c in ipairs(CASES) do
        if stack:find(";" .. c .. "@" .. TARGET, 1, true) then
          hits[c], n = hits[c] + tonumber(k), n + tonumber(k)
          break
        end
      end
    end
    local lines = {}
    for _, c in ipairs(CASES) do
      lines[#lines + 1] = ("%s %.1f%% of samples, %.1f%% of os.clock"):format(c, 100 * hits[c] / math.max(n, 1),
                                                                           100 * t[c] / spent)
    end
    local msg = table.concat(lines, "; ") .. ("; %d samples in the cases, %d in all, %d failed the check")
      :format(n, samples, failed)
    -- too few samples would pass by luck: at least 40 % of 999 Hz over the
    -- target's recorded CPU time (most of its 3 s: the recording starts
    -- once its loop runs)
    local ok, why = stats.count_at_least("samples in the cases", n, 999 * spent * 0.8, 0.6)
    assert.is_true(ok, why .. "; " .. msg)
    ok, why = stats.at_most("samples whose chain failed the check", failed, samples + failed, 0.05)
    assert.is_true(ok, why .. "; " .. msg)
    -- (the target runs Lua throughout: its loop, timed by os.clock)
    ok, why = stats.at_least("samples with a Lua frame, of all", with_lua, samples + failed, 0.95)
    assert.is_true(ok, why .. "; " .. msg)
    for _, c in ipairs(CASES) do
      ok, why = stats.share(c, hits[c], n, t[c] / spent, SYS)
      assert.is_true(ok, why .. "; " .. msg)
    end
    -- through each C boundary: the caller, the builtin, the Lua function it
    -- called (named as pe.profile names them), in a tenth of the class's
    -- samples at least
    local T = TARGET:gsub("%p", "%%%0")
    for c, pat in pairs({ cls_gsub = ";cls_gsub@" .. T .. ":%d+;string%.gsub;repl@" .. T .. ":%d+",
                          cls_sort = ";cls_sort@" .. T .. ":%d+;table%.sort;cmp@" .. T .. ":%d+",
                          cls_pcall = ";cls_pcall@" .. T .. ":%d+;pcall;thrower@" .. T .. ":%d+",
                          cls_co = ";cls_co@" .. T .. ":%d+;coroutine%.wrap;co_body@" .. T .. ":%d+" }) do
      local k = 0
      for stack, m in folded:gmatch("([^\n]+) (%d+)\n") do
        if stack:find(pat) then k = k + tonumber(m) end
      end
      ok, why = stats.at_least(c .. " through its C boundary", k, hits[c], 0.1)
      assert.is_true(ok, why .. "\n" .. folded)
    end
  end)

  -- an nginx with two workers whose handler knows nothing of perf_event
  local NGINX_CONF = [[
worker_processes 2;
pid logs/nginx.pid;
error_log logs/error.log info;
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
events { worker_connections 64; }
http {
    access_log off;
    lua_package_path "@LUA_PATH@;;";
    lua_package_cpath "@LUA_CPATH@;;";
    server {
        listen 127.0.0.1:@PORT@ reuseport;
        location = /hot { content_by_lua_block { require("hot").handle() } }
    }
}
]]
  local HOT = [[
local M = {}
local function hot_loop(n)
  local s = 0
  for i = 1, n do s = s + (i % 7) * 3 end
  return s
end
function M.handle() ngx.say(hot_loop(300000)) end
return M
]]

  it("-p MASTER --children: both nginx workers' samples (pid labels), a worker forked meanwhile too, the "
     .. "handler's hot function on top (go tool pprof)", function()
    local N = require("support.nginx")
    if not U.is_root() then pending("BPF: root") return end
    if not bpf_ok then pending(tostring(bpf_why)) return end
    local why = N.skip_reason("the nginx record test")
    if why then pending(why) return end
    if U.sh("command -v go") == "" then pending("needs go tool pprof (golang-go)") return end
    local dir = N.prepare("remote")
    local master, load
    finally(function()
      if load then U.sh("kill " .. load .. " 2>/dev/null") end
      N.stop(master)
      N.remove(dir)
    end)
    N.write(dir .. "/lua/hot.lua", HOT)
    U.sh("chmod 644 " .. dir .. "/lua/hot.lua")
    local base
    base, master = N.start(dir, { edit = function() return NGINX_CONF end })
    -- load from two connections at a time, each a new one: reuseport spreads
    -- them over both workers by their ports' hash
    load = tonumber(U.sh(("sh -c 'while :; do curl -s -o /dev/null %s/hot & curl -s -o /dev/null %s/hot; wait; done "
                          .. ">/dev/null 2>&1 & echo $!'"):format(base, base)))
    local out = dir .. "/r.pb.gz"
    local function workers()
      local w = {}
      for _, pid in ipairs(require("perf_event.remote").with_children({ tonumber(master) })) do
        if pid ~= tonumber(master) then w[#w + 1] = tostring(pid) end
      end
      return w
    end
    local rec = tonumber(U.sh(("sh -c '%s bin/luaperf record --lua -F 999 --children --pprof -p %d -o %s -- sleep 3 "
                               .. ">%s/rec.out 2>&1 & echo $!'"):format(U.lua_cmd(), master, out, dir)))
    -- a worker killed a second in: the master forks another, which the
    -- recording follows (--children: descendants forked later too)
    U.sh("sleep 1")
    local before = workers()
    assert.equal(2, #before)
    U.sh("kill -9 " .. before[1])
    local t0 = os.time()
    while U.sh("kill -0 " .. rec .. " 2>/dev/null && echo on"):find("on") do
      assert(os.time() - t0 < 20, "luaperf record did not end")
      U.sh("sleep 0.1")
    end
    U.sh("kill " .. load .. " 2>/dev/null")
    load = nil
    local text = U.read(dir .. "/rec.out") or ""
    assert.truthy(text:find("%[ luaperf record: %d+ samples"), text)
    local new
    for _, w in ipairs(workers()) do if w ~= before[1] and w ~= before[2] then new = w end end
    assert.truthy(new, "the master forked no worker")
    local go = ("env -u LD_PRELOAD HOME=%s GOCACHE=%s/gocache go tool pprof "):format(dir, dir)
    local tags = U.sh(go .. "-tags " .. out .. " 2>&1")
    -- both workers of the start (one killed a second in) and the one forked
    for _, w in ipairs({ before[1], before[2], new }) do assert.truthy(tags:find("%f[%d]" .. w .. "%f[%D]"), tags) end
    local top = U.sh(go .. "-top -nodecount=3 " .. out .. " 2>&1")
    -- the first row of -top: flat, flat%, sum%, cum, cum%, then the name
    local first = top:match("\n%s*[%d.]+%a*%s+[%d.]+%%%s+[%d.]+%%%s+[%d.]+%a*%s+[%d.]+%%%s+(%S+)")
    assert.equal("hot_loop", first, top)
  end)

  it("--speedscope: each process's stacks under a pid=N root frame, its Lua function named", function()
    if not U.is_root() then pending("BPF: root") return end
    if not bpf_ok then pending(tostring(bpf_why)) return end
    local pid, dir = start(3)
    finally(function() U.sh("kill " .. pid .. " 2>/dev/null; rm -rf " .. dir) end)
    local text, rc = U.luaperf("record --lua --speedscope -p " .. pid .. " -o " .. dir .. "/s.json -- sleep 0.5")
    assert.equal(0, rc, text)
    local doc = require("dkjson").decode(U.slurp(dir .. "/s.json"))
    assert.truthy(doc and doc.shared and doc.profiles, text)
    local names = {}
    for _, f in ipairs(doc.shared.frames) do names[f.name] = true end
    assert.truthy(names["pid=" .. pid], "no pid=" .. pid .. " root frame")
    assert.truthy(names.cls_loop or names.cls_off or names.cls_alloc, "no Lua function of the target named")
  end)

  it("refuses a process it cannot read (PUC Lua), saying why", function()
    if not U.is_root() then pending("BPF: root") return end
    if not bpf_ok then pending(tostring(bpf_why)) return end
    if U.sh("command -v lua5.1") == "" then pending("needs lua5.1") return end
    local pid = tonumber(U.sh("sh -c 'lua5.1 -e \"while true do end\" >/dev/null 2>&1 & echo $!'"))
    finally(function() U.sh("kill " .. pid .. " 2>/dev/null") end)
    local text, rc = U.luaperf("record --lua -p " .. pid .. " -o - -- sleep 0.2")
    assert.equal(1, rc, text)
    assert.equal(("luaperf record: process %d holds no LuaJIT 2.1 state (LuaJIT GC64 on x86-64 is read)\n")
                 :format(pid), text)
  end)

  it("as a user: says what it needs, and samples the process's C frames only", function()
    U.need_root("starts the target and luaperf as nobody with setpriv")
    local as = "setpriv --reuid=65534 --regid=65534 --clear-groups "
    local pid, dir = start(30, as)
    finally(function() U.sh("kill " .. pid .. " 2>/dev/null; rm -rf " .. dir) end)
    local text, rc = U.run(as .. U.lua_cmd() .. " bin/luaperf record --lua -F 99 -p " .. pid .. " -o " .. dir
                           .. "/u.folded -- sleep 0.3 2>&1")
    assert.equal(0, rc, text)
    assert.truthy(text:find("luaperf record: reading the Lua stacks at each sample needs BPF, which this cannot "
                            .. "load (", 1, true), text)
    assert.truthy(text:find("only a process started with perf_event.luamap is named", 1, true), text)
  end)
end)
