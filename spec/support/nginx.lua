-- A real Debian nginx (libnginx-mod-http-lua) for the specs: a
-- world-readable copy of the Lua layer and the LuaJIT core under a
-- temporary prefix (workers run as nobody and the checkout may sit under a
-- private directory), examples/openresty/nginx.conf filled in with a port
-- chosen per run, and a stop that never leaves nginx behind.
local U = require("support.util")

local N = {}

N.MODULE = "/usr/lib/nginx/modules/ngx_http_lua_module.so"

--- The user's handler module of the OpenResty specs (myapp.lua): a hot
-- function of their own, in their own file.
N.USER_APP = [[
local M = {}
local function crunch_numbers(n)
  local s = 0
  for i = 1, n do s = (s * 31 + i) % 1000003 end
  return s
end
function M.handler()
  ngx.say(crunch_numbers(tonumber(ngx.var.arg_n) or 200000))
end
return M
]]

-- output (stderr too), whether it exited 0, and its exit code
function N.sh(cmd)
  local out, code = U.run("(" .. cmd .. ") 2>&1")
  return out, code == 0, code
end
local sh = N.sh

function N.have(cmd) return (select(2, sh("command -v " .. cmd))) end

N.read = U.read

function N.write(path, s)
  local f = assert(io.open(path, "w"))
  f:write(s)
  f:close()
end

--- Why a spec of `what` cannot run here, or nil: it runs once, in the
-- luajit suite (nginx links luajit2), with nginx, its Lua module, curl and
-- the built core.
function N.skip_reason(what)
  local suite = os.getenv("PE_SUITE") or (rawget(_G, "jit") and "luajit" or _VERSION)
  if suite ~= "luajit" then
    return what .. " runs once, in the luajit suite (nginx links luajit2)"
  elseif not N.have("nginx") or not N.read(N.MODULE) or not N.have("curl") then
    return "needs the Debian packages nginx, libnginx-mod-http-lua and curl"
  elseif not N.read("build/perf_event/core.so") then
    return "run 'make' first (build/perf_event/core.so)"
  end
  return nil
end

--- A new prefix /tmp/pe-NAME.XXXXXX with lua/ (perf_event and the example
-- modules), lib/ (core.so), conf/ and logs/, all world-readable.
function N.prepare(name)
  local dir = sh("mktemp -d /tmp/pe-" .. name .. ".XXXXXX"):gsub("%s+$", "")
  assert(dir:find("^/tmp/pe%-" .. name:gsub("%-", "%%-")), dir)
  local _, ok = sh(table.concat({
    "chmod 755 " .. dir,
    "mkdir -p " .. dir .. "/lua " .. dir .. "/lib/perf_event " .. dir .. "/conf " .. dir .. "/logs",
    "cp -r lua/perf_event " .. dir .. "/lua/",
    "cp examples/openresty/lua/*.lua " .. dir .. "/lua/",
    "cp build/perf_event/core.so " .. dir .. "/lib/perf_event/",
    "chmod -R a+rX " .. dir,
  }, " && "))
  assert(ok, "could not prepare " .. dir)
  return dir
end

-- a port from our pid, the attempt and a salt: two runs at once (and two
-- servers of one run) try other ports
function N.port(attempt, salt)
  return 20000 + (U.pid() * 7919 + attempt * 104729 + (salt or 0) * 15485863 + os.time()) % 30000
end

--- Starts nginx with examples/openresty/nginx.conf under `dir`
-- (`opts.env`: "NAME=value ..." in the master's environment).
-- `opts.edit(conf)` may change the text first; `opts.ready(base)` says
-- when the server is up (default: /hello answers).  A port in use makes it
-- try another one.
-- @treturn string the base URL
-- @treturn string the master's pid
function N.start(dir, opts)
  opts = opts or {}
  local conf = assert(N.read("examples/openresty/nginx.conf"))
  if opts.edit then conf = opts.edit(conf) end
  local ready = opts.ready or function(base)
    return (select(2, sh("curl -s -o /dev/null " .. base .. "/hello")))
  end
  for attempt = 1, 8 do
    local port = N.port(attempt, opts.salt)
    N.write(dir .. "/conf/nginx.conf",
            (conf:gsub("@LUA_PATH@", dir .. "/lua/?.lua;" .. dir .. "/lua/?/init.lua")
                 :gsub("@LUA_CPATH@", dir .. "/lib/?.so")
                 :gsub("@PORT@", tostring(port))))
    local out, ok = sh((opts.env and ("env " .. opts.env .. " ") or "") ..
                       "nginx -p " .. dir .. " -c " .. dir .. "/conf/nginx.conf")
    if ok then
      local base = "http://127.0.0.1:" .. port
      local master = assert(N.read(dir .. "/logs/nginx.pid")):match("%d+")
      for _ = 1, 100 do
        if ready(base) then return base, master end
        sh("sleep 0.1")
      end
      error("nginx started but is not ready on " .. base .. "\n" .. (N.read(dir .. "/logs/error.log") or ""))
    end
    if not out:find("in use", 1, true) then error("nginx failed to start:\n" .. out) end
    -- the next attempt starts with an empty log ("no error in the error log")
    N.write(dir .. "/logs/error.log", "")
  end
  error("no free port on 127.0.0.1")
end

--- doc/openresty.md's nginx.conf lines (section 2, and its load_module
-- lines) for a prefix N.prepare made: its lua/ and lib/ in the package
-- paths, with `opts.app` (a folder of the user's modules) first; `listen`
-- on 127.0.0.1:@PORT@ (N.start fills it in); `opts.locations` (nginx.conf
-- text) before the doc's /metrics; `opts.main` in the main context; two
-- workers; the logs under the prefix.
function N.conf_from_doc(dir, opts)
  opts = opts or {}
  local doc = assert(N.read("doc/openresty.md"))
  local snippet = doc:match("\n## 2%. The nginx%.conf lines\n.-```nginx\n(.-\n)```")
  assert(snippet, "no ```nginx block under '## 2. The nginx.conf lines' in doc/openresty.md")
  local modules = doc:match("\n```nginx\n(load_module [^`]-)\n```")
  assert(modules, "no ```nginx block of load_module lines in doc/openresty.md")
  local c = snippet
  local function sub(from, to)
    local k
    c, k = c:gsub(from:gsub("%p", "%%%0"), (to:gsub("%%", "%%%%")))
    assert(k > 0, "the doc's snippet has no '" .. from .. "'")
  end
  sub('lua_package_path  "', 'lua_package_path  "' .. (opts.app and (opts.app .. "/?.lua;") or ""))
  sub("/usr/local/share/lua/5.1/", dir .. "/lua/")
  sub("/usr/local/lib/lua/5.1/", dir .. "/lib/")
  sub("listen 8080;", "listen 127.0.0.1:@PORT@;")
  sub("http {\n", "http {\n    access_log logs/access.log;\n")
  if opts.locations then sub("        location = /metrics {", opts.locations .. "\n        location = /metrics {") end
  return table.concat({ "worker_processes 2;", "pid logs/nginx.pid;", "error_log logs/error.log notice;",
                        modules, opts.main or "", "events { worker_connections 1024; }", c }, "\n")
end

--- The pids (numbers, sorted) of the worker processes whose parent is
-- `master`, read from /proc.
function N.workers(master)
  local out = {}
  for p in N.sh("ls /proc"):gmatch("%d+") do
    local stat = N.read("/proc/" .. p .. "/stat")
    local ppid = stat and stat:match("^%d+ %(.*%) %a (%d+)")
    if ppid == tostring(master) and (N.read("/proc/" .. p .. "/cmdline") or ""):find("worker process", 1, true) then
      out[#out + 1] = tonumber(p)
    end
  end
  table.sort(out)
  return out
end

--- Seconds since boot, to 10 ms (/proc/uptime): for deadlines and delays.
function N.clock()
  return tonumber(assert(N.read("/proc/uptime")):match("^[%d.]+"))
end

--- The samples of a Prometheus text exposition: { {name=, labels={...},
-- value=n}, ... } (a line that is no sample fails the spec).
function N.prom_samples(text)
  local out = {}
  for line in text:gmatch("[^\n]+") do
    if not line:find("^#") then
      local name, labels, value = line:match("^([%w_:]+){(.-)} (%S+)$")
      assert(name, "not a sample line: " .. line)
      local l = {}
      for k, v in labels:gmatch('([%w_]+)="(.-)"') do l[k] = v end
      out[#out + 1] = { name = name, labels = l, value = tonumber(value) }
    end
  end
  return out
end

--- QUIT, then TERM, then KILL: true once `pid` is gone.
function N.kill_wait(pid)
  for _, sig in ipairs({ "QUIT", "TERM", "KILL" }) do
    sh("kill -" .. sig .. " " .. pid)
    for _ = 1, 60 do
      if not select(2, sh("kill -0 " .. pid)) then return true end
      sh("sleep 0.05")
    end
  end
  return false
end

--- Stops the nginx whose master is `master`, its workers too if it hangs.
function N.stop(master)
  if not master then return end
  local left = sh("ps -o pid= --ppid " .. master):gsub("%s+", " ")
  if not N.kill_wait(master) and left:find("%d") then sh("kill -KILL " .. left) end
end

--- Removes a prefix N.prepare made.
function N.remove(dir)
  if dir and dir:find("^/tmp/pe%-[%w%-]+%.%w+$") then sh("rm -rf " .. dir) end
end

return N
