-- Files at predictable paths (/tmp/perf-PID.map: perf_event.luamap and
-- pe.profile's perfmap=true) are opened without following a link and
-- written only when they are the writer's own regular file with one link
-- (fs.own_file): a link, a hard link or a file another user planted there
-- first is refused, and its target keeps its bytes.
local U = require("support.util")
local fs = require("perf_event.fs")

local jit = rawget(_G, "jit")
local build = os.getenv("PE_BUILD") or "build"

describe("a file at a predictable path", function()
  local dir
  before_each(function()
    dir = U.sh("mktemp -d"):gsub("%s+$", "")
    local f = assert(io.open(dir .. "/victim.txt", "w"))
    f:write("precious")
    f:close()
  end)
  after_each(function() U.sh("rm -rf " .. dir) end)

  it("is created, appended to, read back and emptied when it is ours", function()
    local path = dir .. "/perf-1.map"
    local f = assert(fs.own_file(path))
    f:write("0 0 header", "\n")
    assert.truthy(f:flush())
    assert.equal("0 0 header\n", f:head(64))
    f:write("1 2 x\n")
    f:close()
    assert.equal("0 0 header\n1 2 x\n", U.read(path))
    assert.equal("644", U.sh("stat -c %a " .. path):gsub("%s+$", ""))
    f = assert(fs.own_file(path))   -- (kept: writes append)
    f:write("3 4 y\n")
    f:close()
    assert.equal("0 0 header\n1 2 x\n3 4 y\n", U.read(path))
    f = assert(fs.own_file(path))
    f:truncate()
    f:write("new\n")
    f:close()
    assert.equal("new\n", U.read(path))
  end)

  it("is refused when it is a link, and the link's target keeps its bytes", function()
    local path = dir .. "/perf-2.map"
    U.sh("ln -s " .. dir .. "/victim.txt " .. path)
    local f, err = fs.own_file(path)
    assert.is_nil(f)
    assert.truthy(err:find("ELOOP", 1, true) and err:find("a link", 1, true), err)
    assert.equal("precious", U.read(dir .. "/victim.txt"))
  end)

  it("is refused when it is a hard link to another file", function()
    local path = dir .. "/perf-3.map"
    U.sh("ln " .. dir .. "/victim.txt " .. path)
    local f, err = fs.own_file(path)
    assert.is_nil(f)
    assert.truthy(err:find("not a regular file of this user with one link", 1, true), err)
    assert.equal("precious", U.read(dir .. "/victim.txt"))
  end)

  it("is refused when another user owns it", function()
    U.need_root("gives the file to another user (chown)")
    local path = dir .. "/perf-4.map"
    U.sh("cp " .. dir .. "/victim.txt " .. path .. " && chown 65534:65534 " .. path)
    local f, err = fs.own_file(path)
    assert.is_nil(f)
    assert.truthy(err:find("not written", 1, true), err)
    assert.equal("precious", U.read(path))
  end)

  it("perf_event.luamap in a process whose map path is a planted link: refused, said, nothing written", function()
    U.need(U.sh("command -v luajit") ~= "", "luajit is not on PATH")
    local cwd = U.sh("pwd"):gsub("%s+$", "")
    local env = ('LUA_PATH="%s/lua/?.lua;%s/lua/?/init.lua;;" LUA_CPATH="%s/%s/?.so;;"'):format(cwd, cwd, cwd, build)
    local prog = assert(io.open(dir .. "/prog.lua", "w"))
    prog:write('io.write("ran\\n")\n')
    prog:close()
    -- (the shell's pid is the program's: exec keeps it)
    local out = U.sh("sh -c 'echo $$; ln -s " .. dir .. "/victim.txt /tmp/perf-$$.map && exec env " .. env
                     .. " luajit -l perf_event.luamap " .. dir .. "/prog.lua' 2>&1")
    local pid = out:match("^(%d+)\n")
    assert.truthy(pid, out)
    os.remove("/tmp/perf-" .. pid .. ".map")
    assert.truthy(out:find("perf_event.luamap: open(/tmp/perf-" .. pid .. ".map): ELOOP", 1, true), out)
    assert.truthy(out:find("\nran\n", 1, true), out)   -- (the program ran)
    assert.equal("precious", U.read(dir .. "/victim.txt"))
  end)

  it("pe.profile's perfmap=true with a planted link: p.perfmap_error, nothing written", function()
    if not jit then pending("perfmap: LuaJIT only") return end
    local pe = require("perf_event")
    local path = "/tmp/perf-" .. U.pid() .. ".map"
    os.remove(path)
    U.sh("ln -s " .. dir .. "/victim.txt " .. path)
    finally(function() os.remove(path) end)
    local p = assert(pe.profile.start({ freq = 99, perfmap = true }))
    local s = 0
    for i = 1, 1e6 do s = s + i % 3 end   -- (a trace: what the map would get)
    p:stop()
    assert.truthy(s > 0)
    assert.truthy(p.perfmap_error and p.perfmap_error:find("ELOOP", 1, true), tostring(p.perfmap_error))
    assert.equal("precious", U.read(dir .. "/victim.txt"))
  end)
end)
