-- perf_event.openresty under faults: /metrics with a full dict.  Each
-- test runs an nginx of its own: the nginx.conf lines of doc/openresty.md
-- (read from the doc), two workers, the user's own handler, and probes of
-- the spec's own.  Every wait polls up to a deadline taken from the
-- documented bounds (doc/openresty.md).  Runs once, in the luajit suite
-- (nginx links luajit2).
local U = require("support.util")
local N = require("support.nginx")
local sh, have, write = N.sh, N.have, N.write
local reason = N.skip_reason("the OpenResty fault specs")

-- the documented bound: the workers publish their figures every second
-- (`interval`)
local INTERVAL = 1

-- the user's handler: a hot function of their own, in their own file
local APP = [[
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

-- a Prometheus text's samples: { name=, labels=, value= }
local function samples(text)
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

describe("perf_event.openresty under faults", function()
  if reason then
    pending(reason, function() end)
    return
  end

  it("/metrics with a full dict keeps every worker's own figures, and passes promtool", function()
    local dir = N.prepare("faults")
    local master
    finally(function() N.stop(master) N.remove(dir) end)
    local base
    base, master = serve(dir)
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
