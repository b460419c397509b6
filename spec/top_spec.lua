-- luaperf top --lua -p PID on a LuaJIT process that loaded nothing of ours,
-- run in a terminal (tmux, a private server) and read as a user sees it
-- (capture-pane): the function that takes most of the target's CPU time is
-- the first row within 3 s, and q quits.
local U = require("support.util")

local have = U.sh("command -v luajit") ~= "" and U.sh("command -v tmux") ~= ""

-- a target whose hot function takes ~9 parts of 10 of its CPU time
local TARGET = [[
local function hot_spin(n) local s = 0 for i = 1, n do s = s + (i % 7) * 3 end return s end
local function cold_spin(n) local s = 0 for i = 1, n do s = s + (i % 5) end return s end
jit.off(hot_spin) jit.off(cold_spin)
local f = io.open(arg[1], "w") f:write("go\n") f:close()
while true do hot_spin(900000) cold_spin(100000) end
]]

describe("luaperf top --lua -p PID", function()
  if not have then
    it("needs luajit and tmux", function()
      pending("tools/setup installs luajit2 and tmux")
    end)
    return
  end

  it("shows the hot function first within 3 s, refreshed; q quits", function()
    U.need_root("BPF reads the Lua stacks at each sample")
    local core = require("perf_event.core")
    local ok, why = core._private.ljb_load()
    if not ok then pending(tostring(why)) return end
    core._private.ljb_close()
    local dir = U.sh("mktemp -d /tmp/pe_top.XXXXXX"):gsub("%s+$", "")
    local sock = "pe_top_" .. U.pid()
    -- (the server's socket in the test's directory, not /tmp/tmux-UID)
    local tmux = "TMUX_TMPDIR=" .. dir .. " tmux -L " .. sock .. " "
    local pid
    finally(function()
      U.sh(tmux .. "kill-server 2>/dev/null")
      if pid then U.sh("kill " .. pid .. " 2>/dev/null") end
      if dir:match("^/tmp/pe_top%.") then U.sh("rm -rf '" .. dir .. "'") end
    end)
    local f = assert(io.open(dir .. "/target.lua", "w"))
    f:write(TARGET)
    f:close()
    pid = tonumber(U.sh(("luajit %s/target.lua %s/ready >/dev/null 2>&1 & echo $!"):format(dir, dir)))
    local t0 = os.time()
    while not U.read(dir .. "/ready") do
      assert(os.time() - t0 < 10, "the target did not start")
      U.sh("sleep 0.02")
    end
    -- luaperf top under the suite's interpreter, in an 160x40 terminal; its
    -- stderr (the closing line) to a file
    local cwd = U.sh("pwd"):gsub("%s+$", "")
    local cmd = ("cd %s && LUA_PATH='%s' LUA_CPATH='%s' %s bin/luaperf top --lua -p %d 2>%s/err"):format(
      cwd, package.path, package.cpath, U.lua_cmd(), pid, dir)
    U.sh(tmux .. "new-session -d -s top -x 160 -y 40 " .. ("%q"):format(cmd))
    local now = require("perf_event.core").now
    local started = now()
    local screen, first, header
    -- the first function row, until it is the hot function: within 3 s
    while now() - started < 3 do
      screen = U.sh(tmux .. "capture-pane -p -t top 2>/dev/null")
      header = screen:match("luaperf top[^\n]*")
      first = screen:match("%%Own[^\n]*\n%s*[%d.]+%%%s+[%d.]+%%%s+%d+%s+%d+%s+(%S+)")
      if first and first:match("^hot_spin@") then break end
      U.sh("sleep 0.1")
    end
    assert.truthy(first and first:match("^hot_spin@" .. dir:gsub("%p", "%%%0") .. "/target.lua:1$"), screen)
    assert.truthy(screen:find("luaperf top --lua -p " .. pid .. ": 99 Hz", 1, true), screen)
    -- refreshed: another header (its counts) within 2 s more
    local refreshed = now()
    while (screen:match("luaperf top[^\n]*") or header) == header do
      assert(now() - refreshed < 2, "no refresh in 2 s:\n" .. screen)
      U.sh("sleep 0.1")
      screen = U.sh(tmux .. "capture-pane -p -t top 2>/dev/null")
    end
    -- q quits: the session ends with luaperf, which writes its closing line
    U.sh(tmux .. "send-keys -t top q")
    local q0 = os.time()
    while U.sh(tmux .. "has-session -t top 2>/dev/null && echo yes"):match("yes") do
      assert(os.time() - q0 < 5, "luaperf top did not quit on q:\n" .. screen)
      U.sh("sleep 0.05")
    end
    local err = U.read(dir .. "/err") or ""
    local n = tonumber(err:match("%[ luaperf top: (%d+) samples;"))
    assert.truthy(n and n > 0, err)
  end)

  it("refuses a process without LuaJIT, and a usage mistake, saying why", function()
    local out, rc = U.luaperf("top --lua -p " .. U.pid() .. "x")
    assert.equal(2, rc, out)
    assert.truthy(out:find("-p takes process ids like 123,456, got '", 1, true), out)
    out, rc = U.luaperf("top -p 1")
    assert.equal(2, rc, out)
    assert.truthy(out:find("--lua is required", 1, true), out)
    if not U.is_root() then
      -- a user cannot load BPF: the message says so
      out, rc = U.luaperf("top --lua -p " .. U.pid())
      assert.equal(1, rc, out)
      assert.truthy(out:find("luaperf top: reading the Lua stacks at each sample needs BPF", 1, true), out)
      return
    end
    local core = require("perf_event.core")
    if not core._private.ljb_load() then return end
    core._private.ljb_close()
    -- a sleeping shell holds no LuaJIT state
    local sh = tonumber(U.sh("sleep 30 >/dev/null 2>&1 & echo $!"))
    finally(function() U.sh("kill " .. sh .. " 2>/dev/null") end)
    out, rc = U.luaperf("top --lua -p " .. sh)
    assert.equal(1, rc, out)
    assert.truthy(out:find("luaperf top: process " .. sh .. " holds no LuaJIT 2.1 state", 1, true), out)
  end)
end)
