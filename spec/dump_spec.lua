-- luaperf dump --lua -p PID: the Lua stack of a LuaJIT process that loaded
-- nothing of ours (spec/support/dump_target.lua), read from outside.  The
-- blocking targets wait in io.read under a known stack, across each kind
-- of C boundary (pcall, table.sort's comparator, gsub's callback, a
-- metamethod, coroutine.resume): the dump must be that stack exactly, and
-- the target must carry on unharmed.  The spinning targets (interpreted,
-- compiled) are stopped at any instant: each dump must be a prefix of the
-- one call path they have.  luaperf runs under the suite's interpreter; the
-- targets are LuaJIT.
local U = require("support.util")
local N = require("support.nginx")

local TARGET = "spec/support/dump_target.lua"
local have_luajit = U.sh("command -v luajit") ~= ""

-- the line of the call site marked --@name in the target
local LINES = {}
do
  local n = 0
  for l in io.lines(TARGET) do
    n = n + 1
    local m = l:match("%-%-@([%w_]+)%s*$")
    if m then LINES[m] = n end
  end
end
local function at(fn, marker) return ("%s@%s:%d"):format(fn, TARGET, LINES[marker or fn]) end

local function proc_state(pid)
  local s = U.read("/proc/" .. pid .. "/stat")
  return s and s:match("^%d+ %b() (%a)")
end

local function wait_until(what, pred, secs)
  local t0 = os.time()
  while not pred() do
    assert(os.time() - t0 <= (secs or 10), "timed out waiting for " .. what)
    U.sh("sleep 0.02")
  end
end

-- a target in mode `mode`, its stdin a FIFO this test holds open (as:
-- a command prefix, setpriv); returned once it printed "ready" and sleeps
local function start(mode, as)
  local dir = U.sh("mktemp -d"):gsub("%s+$", "")
  U.sh("chmod 755 " .. dir .. " && mkfifo -m 666 " .. dir .. "/in && : > " .. dir .. "/out && chmod 666 "
       .. dir .. "/out")
  local t = { dir = dir, out = dir .. "/out" }
  -- (the FIFO opened read-write: that open does not wait for a writer,
  -- where a shell waiting in it would hold our pipe)
  t.pid = tonumber(U.sh("sh -c '" .. (as or "") .. "luajit " .. TARGET .. " " .. mode .. " > " .. t.out
                        .. " 2>&1 0<> " .. dir .. "/in & echo $!'"))
  t.w = assert(io.open(dir .. "/in", "w"))
  if mode == "interp" or mode == "jit" or mode == "alloc" or mode == "calls" then
    U.sh("sleep 0.3")   -- (its loop running, compiled in mode jit)
  else
    wait_until("the target's ready", function() return (U.read(t.out) or ""):find("ready\n", 1, true) end)
    wait_until("the target asleep in read", function() return proc_state(t.pid) == "S" end)
  end
  return t
end

-- the target's end: a line on its stdin (a spinning one is killed); its
-- output, and whether it exited by itself
local function finish(t)
  if not t.w then return end
  -- (a write to a FIFO nobody reads any more raises SIGPIPE: a spinning
  -- target is killed, its FIFO only closed)
  if t.kill then U.sh("kill " .. t.pid) elseif proc_state(t.pid) then t.w:write("go\n") end
  t.w:close()
  t.w = nil
  local ok = pcall(wait_until, "the target's exit", function() return proc_state(t.pid) == nil
    or proc_state(t.pid) == "Z" end, 10)
  if not ok then U.sh("kill -9 " .. t.pid) end
  local out = U.read(t.out) or ""
  U.sh("rm -rf " .. t.dir)
  return out, ok
end

-- the frames a dump printed for its one VM: {header, frames...}
local function frames_of(text)
  local lines = {}
  for l in text:gmatch("([^\n]*)\n") do lines[#lines + 1] = l end
  local fr = {}
  for i = 4, #lines do fr[#fr + 1] = lines[i]:match("^    (.*)$") end
  return lines, fr
end

local BLOCKING = {
  block = { at("main"), at("alpha"), at("beta"), at("gamma"), "io.read" },
  pcall = { at("main"), at("p_outer"), "pcall", at("p_inner"), "io.read" },
  sort = { at("main"), at("s_outer"), "table.sort", at("s_cmp"), "io.read" },
  gsub = { at("main"), at("g_outer"), "string.gsub", at("g_repl"), "io.read" },
  meta = { at("main"), at("m_outer"), at("m_index"), "io.read" },
  co = { at("main"), at("co_outer"), "coroutine.resume", at("co_body"), "io.read" },
}

describe("luaperf dump --lua -p PID", function()
  if not have_luajit then
    it("needs luajit", function() pending("no luajit: tools/setup installs luajit2") end)
    return
  end
  if not U.is_root() then
    -- (a process of our own user can be read; these specs also start
    -- targets as another user)
    it("runs as root", function() pending("ptrace of the targets: run as root") end)
    return
  end

  for _, mode in ipairs({ "block", "pcall", "sort", "gsub", "meta", "co" }) do
    it("prints the exact stack of a target blocked under " .. mode .. ", which then carries on", function()
      local t = start(mode)
      finally(function() finish(t) end)
      local text, rc = U.luaperf("dump --lua -p " .. t.pid)
      assert.equal(0, rc, text)
      local lines, fr = frames_of(text)
      assert.equal(("Process %d: luajit %s %s"):format(t.pid, TARGET, mode), lines[1])
      assert.truthy(lines[3]:find(("^Thread %d %%(LuaJIT VM 0x%%x+%%): C$"):format(t.pid)), lines[3])
      -- the root: the C function of luajit's main that runs the script
      assert.truthy(fr[1] and fr[1]:find("^%[C@0x%x+%]$"), tostring(fr[1]))
      table.remove(fr, 1)
      assert.same(BLOCKING[mode], fr)
      local out, exited = finish(t)
      assert.is_true(exited, "the target did not exit after its line")
      assert.equal("ready\nread go\n", out)
    end)
  end

  it("--nonblocking reads the same stack without stopping the target", function()
    local t = start("pcall")
    finally(function() finish(t) end)
    local text, rc = U.luaperf("dump --lua --nonblocking -p " .. t.pid)
    assert.equal(0, rc, text)
    local _, fr = frames_of(text)
    table.remove(fr, 1)
    assert.same(BLOCKING.pcall, fr)
    assert.equal("ready\nread go\n", (finish(t)))
  end)

  -- every dump of a spinning target: [C], main, top, then mid and leaf or
  -- not (the stop lands anywhere in the loop); each function is on one
  -- line, so each frame's text is fixed. In a trace of top's loop that
  -- inlined mid and leaf, the leaf is leaf marked "(inlined)" right above
  -- top: the frames between are not materialized
  local SPIN = { at("main", "main_spin"), at("top"), at("mid"), ("leaf@%s:%d"):format(TARGET, LINES.mid - 1) }
  for _, mode in ipairs({ "interp", "jit" }) do
    it("stops a spinning " .. mode .. " target 20 times: each stack is a prefix of its one call path", function()
      local t = start(mode)
      t.kill = true
      finally(function() finish(t) end)
      local states, leaves, compiled = {}, 0, 0
      for _ = 1, 20 do
        local text, rc = U.luaperf("dump --lua -p " .. t.pid)
        assert.equal(0, rc, text)
        local lines, fr = frames_of(text)
        local state = lines[3]:match("%): (.*)$")
        states[#states + 1] = state
        assert.truthy(fr[1]:find("^%[C@0x%x+%]$"), text)
        table.remove(fr, 1)
        assert.is_true(#fr >= 2 and #fr <= 4, text)
        if mode == "jit" and #fr == 3 and fr[3]:find(" %(inlined%)$") then
          assert.equal(SPIN[4] .. " (inlined)", fr[3], text)
          fr[3] = nil
          leaves = leaves + 1
        end
        for i, f in ipairs(fr) do assert.equal(SPIN[i], f, text) end
        if #fr == 4 then leaves = leaves + 1 end
        if state:find("^compiled %(trace %d+%)$") then compiled = compiled + 1 end
        if mode == "interp" then assert.equal("interpreted", state) end
      end
      -- the loop in leaf is nearly all the time: a stop outside it every
      -- time would be odds far below 1e-6 (at most half the time outside
      -- it: 2^-20)
      assert.is_true(leaves > 0, "no dump in leaf: " .. table.concat(states, ", "))
      if mode == "jit" then assert.is_true(compiled > 0, "no dump in a trace: " .. table.concat(states, ", ")) end
    end)
  end

  -- a spinning `calls` target held stopped (ljr_stop) for a test: h.t, the
  -- core's private functions h.P, its registers h.regs; h.held false once
  -- the test let it go. It is let go and killed at the test's end
  local function held_calls()
    local h = { P = require("perf_event.core")._private, t = start("calls"), held = false }
    h.t.kill = true
    -- (one finally: busted keeps the last one a test gives)
    finally(function()
      if h.held then h.P.ljr_detach(h.t.pid) end
      finish(h.t)
    end)
    h.regs = assert(h.P.ljr_stop(h.t.pid))
    h.held = true
    return h
  end

  -- a stop inside the interpreter's call or return sequence finds the
  -- frames half rebuilt (BC_RET writes the result over the function's slot
  -- before it moves BASE down). Stepped through every instruction of a
  -- call-and-return loop in turn: the registers' own walk is torn at some
  -- of them (the window is there and is reached), and the dump's walk,
  -- which steps the thread on until the frames are whole, is a prefix of
  -- the one call path at every one
  it("steps a target stopped mid-return on to whole frames, at every instruction of a call loop", function()
    local h = held_calls()
    local t, P, regs = h.t, h.P, h.regs
    local R = require("perf_event.remote")
    local st = assert(R.vms(t.pid))[1]
    local name = R.namer(t.pid, st)
    local path = { at("main", "main_calls"), at("caller"), ("tiny@%s:%d"):format(TARGET, LINES.caller - 1) }
    local torn, in_tiny, max_steps = 0, 0, 0
    for _ = 1, 1500 do
      local raw = P.ljr_walk(t.pid, st, regs)
      if raw.truncated then torn = torn + 1 end
      local w, steps, r, sig = R._whole_walk(t.pid, st, t.pid, regs)
      assert.is_nil(sig)
      max_steps = math.max(max_steps, steps)
      local fr = name(w.frames)
      assert.is_false(w.truncated, table.concat(fr, "\n"))
      table.remove(fr, 1)   -- (the host's [C] entry)
      assert.is_true(#fr == 2 or #fr == 3, table.concat(fr, "\n"))
      for i, f in ipairs(fr) do assert.equal(path[i], f) end
      if #fr == 3 then in_tiny = in_tiny + 1 end
      regs = assert(P.ljr_step(t.pid))
      assert.equal(r.r14, regs.r14)   -- (still the interpreter: DISPATCH in r14)
    end
    h.held = false
    assert(P.ljr_detach(t.pid))
    assert.is_true(torn > 0, "no instruction of the loop tore the frames")
    assert.is_true(in_tiny > 0, "no instruction in tiny")
    assert.is_true(max_steps > 0 and max_steps < 64, tostring(max_steps))
  end)

  -- a signal that comes to a held thread stops the stepping, and ljr_detach
  -- hands it back: SIGTERM still ends the target
  it("hands a signal that arrived while it stepped back to the thread", function()
    local h = held_calls()
    local t, P = h.t, h.P
    U.sh("kill -TERM " .. t.pid)
    local r, why, _, sig = P.ljr_step(t.pid)
    assert.is_nil(r)
    assert.equal("a signal arrived while stepping: Interrupted system call", why)
    assert.equal(15, sig)
    h.held = false
    assert(P.ljr_detach(t.pid, sig))
    wait_until("the target's end by its SIGTERM", function() return proc_state(t.pid) == nil end)
    t.kill = false   -- (ended: nothing for finish to kill)
  end)

  it("reads an allocating target's state and stack while its GC runs, 20 times", function()
    local t = start("alloc")
    t.kill = true
    finally(function() finish(t) end)
    local known = { interpreted = true, C = true, GC = true, ["trace exit"] = true, ["JIT recording"] = true,
                    ["JIT optimizing"] = true, ["JIT assembling"] = true }
    for _ = 1, 20 do
      local text, rc = U.luaperf("dump --lua -p " .. t.pid)
      assert.equal(0, rc, text)
      local lines, fr = frames_of(text)
      local state = lines[3]:match("%): (.*)$")
      assert.truthy(known[state] or state:find("^compiled %(trace %d+%)$"), text)
      table.remove(fr, 1)
      assert.equal(at("main", "main_churn"), fr[1], text)
      assert.equal(at("churn"), fr[2] and fr[2]:gsub(":%d+$", ":" .. LINES.churn) or nil, text)
    end
  end)

  it("says why for a process that is not LuaJIT, a process that is gone, and bad arguments", function()
    local pid = tonumber(U.sh("sh -c 'sleep 30 >/dev/null 2>&1 & echo $!'"))
    finally(function() U.sh("kill " .. pid) end)
    local text, rc = U.luaperf("dump --lua -p " .. pid)
    assert.equal(1, rc, text)
    assert.equal(("luaperf dump: process %d holds no LuaJIT 2.1 state (LuaJIT GC64 on x86-64 is read)\n")
                 :format(pid), text)
    local gone = tonumber(U.sh("sh -c 'true & echo $!'"))
    wait_until("the short process's end", function() return proc_state(gone) == nil end)
    text, rc = U.luaperf("dump --lua -p " .. gone)
    assert.equal(1, rc, text)
    assert.equal(("luaperf dump: no process %d\n"):format(gone), text)
    text, rc = U.luaperf("dump -p " .. pid)
    assert.equal(2, rc, text)
    assert.truthy(text:find("--lua is required", 1, true), text)
    text, rc = U.luaperf("dump --lua -p 12x")
    assert.equal(2, rc, text)
    assert.truthy(text:find("-p takes process ids like 123,456, got '12x'", 1, true), text)
  end)

  it("as a user: dumps its own process, and says what it needs for another user's", function()
    local as = "setpriv --reuid=65534 --regid=65534 --clear-groups "
    local mine = start("block", as)
    local roots = start("block")
    finally(function() finish(mine) finish(roots) end)
    local text, rc = U.run(as .. U.lua_cmd() .. " bin/luaperf dump --lua -p " .. mine.pid .. " 2>&1")
    assert.equal(0, rc, text)
    local _, fr = frames_of(text)
    table.remove(fr, 1)
    assert.same(BLOCKING.block, fr)
    text, rc = U.run(as .. U.lua_cmd() .. " bin/luaperf dump --lua -p " .. roots.pid .. " 2>&1")
    assert.equal(1, rc, text)
    assert.equal(("luaperf dump: cannot read /proc/%d/smaps: Permission denied (dump runs as the process's "
                  .. "user or as root)\n"):format(roots.pid), text)
    assert.equal("ready\nread go\n", (finish(mine)))
    assert.equal("ready\nread go\n", (finish(roots)))
  end)

  -- an nginx whose handler knows nothing of perf_event: a worker blocked
  -- in it (opening a FIFO nobody writes yet), then idle between requests
  local NGINX_CONF = [[
worker_processes 1;
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
        listen 127.0.0.1:@PORT@;
        location = /hello { content_by_lua_block { ngx.say("hello") } }
        location = /block { content_by_lua_block { require("blocker").handle() } }
    }
}
]]
  local BLOCKER = [[
local M = {}
local function wait_line(path)
  local f = io.open(path, "r")   --@open
  local l = f:read("*l")
  f:close()
  return l
end
function M.handle()
  local l = wait_line(ngx.config.prefix() .. "fifo")   --@wait
  ngx.say("got ", tostring(l))
end
return M
]]
  local function line_in(text, marker)
    local n = 0
    for l in text:gmatch("([^\n]*)\n") do
      n = n + 1
      if l:find(marker, 1, true) then return n end
    end
  end

  it("dumps an nginx worker blocked in a handler, exactly, and idle between requests; --children from the master",
     function()
    local why = N.skip_reason("the nginx dump test")
    if why then pending(why) return end
    local dir = N.prepare("dump")
    local master, curl
    finally(function()
      if curl then U.sh("kill " .. curl .. " 2>/dev/null") end
      N.stop(master)
      N.remove(dir)
    end)
    local src = BLOCKER:gsub("%s*%-%-@%w+", "")
    N.write(dir .. "/lua/blocker.lua", src)
    U.sh("chmod 644 " .. dir .. "/lua/blocker.lua && mkfifo -m 666 " .. dir .. "/fifo")
    local base
    base, master = N.start(dir, { edit = function() return NGINX_CONF end })
    local children = U.luaperf("dump --lua --children -p " .. master)
    local worker = children:match("\nProcess (%d+): nginx: worker process")
    assert.truthy(worker, children)
    -- the master loaded the Lua module too: its VM runs no Lua
    assert.truthy(children:find(("^Process %s: nginx: master process"):format(master)), children)
    assert.truthy(children:find("Thread " .. worker .. " %(LuaJIT VM 0x%x+%): idle, not in Lua\n"), children)
    curl = tonumber(U.sh("sh -c 'curl -s -m 20 -o " .. dir .. "/got " .. base .. "/block >/dev/null 2>&1 & echo $!'"))
    local text
    wait_until("the worker in the handler", function()
      text = U.luaperf("dump --lua -p " .. worker)
      return text:find("io.open", 1, true)
    end)
    local lines, fr = frames_of(text)
    assert.equal(("Process %s: nginx: worker process"):format(worker), lines[1])
    assert.truthy(lines[3]:find(("^Thread %s %%(LuaJIT VM 0x%%x+%%): C$"):format(worker)), text)
    local file = dir .. "/lua/blocker.lua"
    local conf_line = line_in(NGINX_CONF, "location = /block")
    assert.same({ ("main@content_by_lua(nginx.conf:%d):1"):format(conf_line),
                  ("M.handle@%s:%d"):format(file, line_in(BLOCKER, "--@wait")),
                  ("wait_line@%s:%d"):format(file, line_in(BLOCKER, "--@open")), "io.open" }, fr)
    local w = assert(io.open(dir .. "/fifo", "w"))
    w:write("go\n")
    w:close()
    wait_until("the answer", function() return U.read(dir .. "/got") == "got go\n" end)
    curl = nil
  end)
end)
