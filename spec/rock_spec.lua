-- Packaging, as a new user meets it: the README's set-up command (taken from
-- README.md and run in tools/setup's dry-run mode, so the doc cannot drift
-- from what works), the Debian package behind every tool the specs call, the
-- rock that `luarocks make` builds into a temporary tree and what runs from
-- it, and `make doc` keeping every documented function of perf_event.
--
-- Each suite builds the rock its interpreter uses: luajit and lua5.1 the Lua
-- 5.1 rock (LuaJIT loads the same C module), lua5.4 the 5.4 rock.  The ASan
-- suite skips this file: it checks packaging, not the core's memory.
local U = require("support.util")
local suite = os.getenv("PE_SUITE") or (jit and "luajit" or _VERSION:gsub("Lua ", "lua"))
local asan = suite == "asan"

local q = U.shell_quote

-- runs a shell command without the ASan preload; returns stdout+stderr, exit code
local function sh(cmd)
  local p = io.popen("env -u LD_PRELOAD sh -c " .. q(cmd) .. " 2>&1; echo \"rc=$?\"")
  local out = p:read("*a")
  p:close()
  local rc = tonumber(out:match("rc=(%d+)\n?$"))
  return (out:gsub("rc=%d+\n?$", "")), rc
end

local read = U.slurp

local function have(tool) return select(2, sh("command -v " .. q(tool))) == 0 end

local uid = tonumber((sh("id -u")))
local root = uid == 0

local tmps = {}
local function tmpdir()
  local d = sh("mktemp -d /tmp/pe-rock.XXXXXX"):gsub("%s+$", "")
  assert(d:match("^/tmp/pe%-rock%."), d)
  tmps[#tmps + 1] = d
  return d
end
teardown(function()
  for _, d in ipairs(tmps) do sh("rm -rf " .. q(d)) end
end)

-- the package names of tools/debian-packages ('#' starts a comment)
local function listed_packages()
  local names = {}
  for line in read("tools/debian-packages"):gmatch("[^\n]+") do
    for word in line:gsub("#.*", ""):gmatch("%S+") do names[#names + 1] = word end
  end
  return names
end

describe("the README's set-up command", function()
  -- (what it checks does not depend on the interpreter: one suite runs it)
  if suite ~= "lua5.1" then
    it("is checked in the lua5.1 suite", function() pending("interpreter-independent: the lua5.1 suite checks it") end)
    return
  end

  local readme = read("README.md")
  local section = readme:match("\n## Install\n(.-)\n## ")
  local cmd = section and section:match("```sh\n(.-)\n```")

  it("is one line, and every package install in it goes through tools/setup", function()
    assert.truthy(cmd, "no ```sh block under '## Install' in README.md")
    assert.is_nil(cmd:find("\n"), cmd)
    -- the dry run below must not install anything for real
    assert.is_nil(cmd:find("apt", 1, true), "apt outside tools/setup: " .. cmd)
    assert.is_nil(cmd:find("sudo", 1, true), "sudo is missing on a minimal Debian: " .. cmd)
    assert.truthy(cmd:find("tools/setup", 1, true), cmd)
  end)

  it("runs as this user: apt resolves every package, finds them all installed, first.lua measures", function()
    assert.truthy(cmd and not cmd:find("apt", 1, true) and not cmd:find("sudo", 1, true), "see above")
    local out, rc = sh("PE_SETUP_DRY_RUN=1 " .. cmd)
    if not root and not have("sudo") then
      assert.are.equal(1, rc, out)
      assert.truthy(out:find("needs root: run it as root, or install sudo", 1, true), out)
      return
    end
    assert.are.equal(0, rc, out)
    local as = root and "" or "sudo "
    assert.truthy(out:find("\n?%+ " .. as .. "apt%-get update"), out)
    assert.truthy(out:find("+ " .. as .. "env DEBIAN_FRONTEND=noninteractive apt-get install -y", 1, true), out)
    assert.is_nil(out:find("\nE: "), out)
    -- apt's own account of this machine: nothing the list names is missing
    local newly = tonumber(out:match("%d+ upgraded, (%d+) newly installed"))
    assert.are.equal(0, newly, out)
    for _, name in ipairs(listed_packages()) do
      assert.truthy(out:find("\n" .. name:gsub("%p", "%%%0") .. " is already the newest version")
                    or out:find("\nInst " .. name:gsub("%p", "%%%0") .. " "), name .. " not in apt's answer:\n" .. out)
    end
    -- make built the core and the first example measured with it
    local ms = tonumber(out:match("\ntask%-clock%s+([%d.]+) ms"))
    assert.truthy(ms and ms > 0, out)
    assert.truthy(tonumber(out:match("\npage%-faults%s+(%d+)")) > 0, out)
  end)

  describe("tools/setup as an unprivileged user (setpriv to nobody)", function()
    local function as_nobody(path_dir)
      local d = tmpdir()
      assert(select(2, sh(("mkdir -p %s/tools && cp tools/setup tools/debian-packages %s/tools/ && chmod -R a+rX %s")
        :format(q(d), q(d), q(d)))) == 0)
      local bin = d .. "/bin"
      sh("mkdir -p " .. q(bin))
      for _, t in ipairs({ "id", "dirname", "sed", "tr", "apt-get", "apt-config", "dpkg", "env" }) do
        sh(("ln -s \"$(command -v %s)\" %s/"):format(t, q(bin)))
      end
      if path_dir == "sudo" then
        -- a sudo that would say so if it were called: the dry run never calls it
        sh(("printf '#!/bin/sh\\necho fake-sudo-called \"$@\"\\nexit 99\\n' > %s/sudo && chmod 755 %s/sudo")
          :format(q(bin), q(bin)))
      end
      sh("chmod -R a+rX " .. q(d))
      return sh(("setpriv --reuid=65534 --regid=65534 --clear-groups env -i PATH=%s PE_SETUP_DRY_RUN=1 "
        .. "/bin/sh %s/tools/setup"):format(q(bin), q(d)))
    end

    it("with sudo on PATH: installs through sudo", function()
      if not root then pending("needs root for setpriv") return end
      local out, rc = as_nobody("sudo")
      assert.are.equal(0, rc, out)
      assert.truthy(out:find("+ sudo apt-get update -qq", 1, true), out)
      assert.truthy(out:find("+ sudo env DEBIAN_FRONTEND=noninteractive apt-get install", 1, true), out)
      assert.is_nil(out:find("fake-sudo-called", 1, true), out)
      assert.truthy(out:find("0 newly installed", 1, true), out)
    end)

    it("without sudo: refuses, saying it needs root or sudo", function()
      if not root then pending("needs root for setpriv") return end
      local out, rc = as_nobody(nil)
      assert.are.equal(1, rc, out)
      assert.truthy(out:find("tools/setup: installing packages needs root: run it as root, or install sudo", 1, true),
                    out)
      assert.is_nil(out:find("apt-get", 1, true), out)
    end)
  end)
end)

describe("tools/debian-packages", function()
  -- (what it checks does not depend on the interpreter: one suite runs it)
  if suite ~= "lua5.1" then
    it("is checked in the lua5.1 suite", function() pending("interpreter-independent: the lua5.1 suite checks it") end)
    return
  end

  -- every program the specs, benches, tools and the Makefile run
  local tools = {
    "ps", "strace", "setpriv", "unshare", "taskset", "awk", "nm", "perf", "nginx", "curl", "wrk",
    "valgrind", "callgrind_annotate", "clang-14", "cppcheck", "luacheck", "ldoc", "busted",
    "luajit", "lua5.1", "lua5.4", "luarocks", "pkg-config", "make", "gcc", "timeout", "mktemp",
    "sed", "grep",
  }

  it("names the package of every tool the tests call, unless a minimal Debian 12 has it", function()
    local list = {}
    for _, name in ipairs(listed_packages()) do list[name] = true end
    -- what the listed packages pull in (apt's own answer)
    local deps = {}
    local out = sh("apt-cache depends " .. table.concat(listed_packages(), " "))
    for dep in out:gmatch("Depends: <?([%w.+-]+)") do deps[dep] = true end
    -- each tool's paths (as found, the usual places, the link's target),
    -- then one dpkg -S and one dpkg-query for all (each reads every
    -- package's file list: a call per path took 17 s)
    local paths, all, seen = {}, {}, {}
    for _, tool in ipairs(tools) do
      local path = sh("command -v " .. q(tool)):gsub("%s+$", "")
      assert.truthy(path ~= "", tool .. " is not installed: run tools/setup")
      local real = sh("readlink -f " .. q(path)):gsub("%s+$", "")
      paths[tool] = { path, "/usr/bin/" .. tool, "/bin/" .. tool, "/usr/sbin/" .. tool, "/sbin/" .. tool, real }
      for _, p in ipairs(paths[tool]) do
        if not seen[p] then seen[p] = true all[#all + 1] = q(p) end
      end
    end
    local owner_of = {}
    for line in sh("dpkg -S " .. table.concat(all, " ") .. " 2>/dev/null"):gmatch("[^\n]+") do
      local pkg, p = line:match("^([%w.+-]+)[:,][^/]*(/.*)$")
      if pkg and not line:find("^diversion by") then owner_of[p] = owner_of[p] or pkg end
    end
    local owners, owner_list = {}, {}
    for _, tool in ipairs(tools) do
      for _, p in ipairs(paths[tool]) do
        if owner_of[p] then owners[tool] = owner_of[p] break end
      end
      assert.truthy(owners[tool], "no Debian package owns " .. paths[tool][1] .. " (" .. tool .. ")")
      owner_list[#owner_list + 1] = q(owners[tool])
    end
    local priority_of = {}
    for pkg, pri in sh("dpkg-query -W -f='${Package} ${Priority}\n' " .. table.concat(owner_list, " ")
                       .. " 2>/dev/null"):gmatch("([%w.+-]+) (%S*)") do
      priority_of[pkg] = pri
    end
    for _, tool in ipairs(tools) do
      local owner, priority = owners[tool], priority_of[owners[tool]]
      assert.truthy(list[owner] or deps[owner] or priority == "required",
        ("%s comes from %s (priority %s), which tools/debian-packages neither names nor pulls in")
          :format(tool, owner, tostring(priority)))
    end
  end)
end)

-- the rock of this suite's interpreter
local rock = ({
  luajit = { lua = "5.1", interp = "luajit", make = "luarocks make" },   -- the README's words
  ["lua5.1"] = { lua = "5.1", interp = "lua5.1", make = "luarocks --lua-version=5.1 make" },
  ["lua5.4"] = { lua = "5.4", interp = "lua5.4", make = "luarocks --lua-version=5.4 make" },
})[suite]

describe("the rock", function()
  if not rock then
    it("is checked in the luajit, lua5.4 and lua5.1 suites", function() pending(suite .. " suite") end)
    return
  end
  if not have("luarocks") then
    it("needs luarocks", function() pending("no luarocks: tools/setup installs it") end)
    return
  end

  -- `luarocks make` in a copy of this checkout (no build/ in it, so the
  -- compile line is printed), into a tree of its own
  local built
  local function build()
    if built then return built end
    local d = tmpdir()
    local src, tree = d .. "/src", d .. "/tree"
    assert(select(2, sh(("mkdir -p %s && tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C %s")
      :format(q(src), q(src)))) == 0)
    local out, rc = sh(("cd %s && %s --tree %s"):format(q(src), rock.make, q(tree)))
    built = { src = src, tree = tree, out = out, rc = rc,
              lua = tree .. "/share/lua/" .. rock.lua, lib = tree .. "/lib/lua/" .. rock.lua }
    return built
  end

  local function ls(pattern)
    local names = {}
    for name in sh("cd " .. q(pattern:match("^(.*)/")) .. " && ls " .. pattern:match("[^/]*$")):gmatch("%S+") do
      names[#names + 1] = name
    end
    table.sort(names)
    return names
  end

  it((rock and rock.make or "") .. " builds the core with the Makefile", function()
    local b = build()
    assert.are.equal(0, b.rc, b.out)
    local line = b.out:match("[^\n]*%-o build/rock[^\n]*/perf_event/core%.so[^\n]*")
    assert.truthy(line, "no link line of the core:\n" .. b.out)
    -- every csrc/*.c, csrc/lj/*.c and csrc/puc/*.c compiled with the Makefile's flags against
    -- the headers luarocks is set up for, into the rock's own object directory, and linked
    local sources = ls(b.src .. "/csrc/*.c")
    for _, dir in ipairs({ "lj", "puc" }) do
      local sub = ls(b.src .. "/csrc/" .. dir .. "/*.c")
      assert.truthy(#sub > 0, "no csrc/" .. dir .. "/*.c")
      for _, c in ipairs(sub) do sources[#sources + 1] = dir .. "/" .. c end
    end
    for _, c in ipairs(sources) do
      local o = c:gsub("%.c$", ".o")
      local cc = b.out:match("[^\n]* %-c csrc/" .. c:gsub("%.", "%%.") .. " %-o build/rock[^\n]*")
      assert.truthy(cc, c .. " not compiled by the rock:\n" .. b.out)
      assert.truthy(cc:find(" -fvisibility=hidden ", 1, true), cc)
      assert.truthy(cc:find(" -Werror ", 1, true), cc)
      assert.truthy(cc:find(" -I/usr/include/lua" .. rock.lua .. " ", 1, true), cc)
      assert.truthy(line:find("/obj/" .. o, 1, true), o .. " not linked by the rock: " .. line)
    end
    assert.is_nil(b.out:lower():find("warning", 1, true), b.out)
    -- what the core exports: the module's entry point and the FFI's, no more
    local syms = sh("nm -D --defined-only " .. q(b.lib .. "/perf_event/core.so"))
    local n = 0
    for kind, name in syms:gmatch("%x+ (%a) ([%w_]+)") do
      if kind == "T" then
        n = n + 1
        assert.truthy(name:match("^luaopen_perf_event") or name:match("^pe_fast_"), "exported: " .. name)
      end
    end
    assert.truthy(n > 1, syms)
    assert.truthy(syms:find(" T luaopen_perf_event_core\n", 1, true), syms)
  end)

  it("installs every lua/perf_event/*.lua, lua/perf_event/*/*.lua and luaperf", function()
    local b = build()
    assert.are.equal(0, b.rc, b.out)
    local want, got = ls(b.src .. "/lua/perf_event/*.lua"), ls(b.lua .. "/perf_event/*.lua")
    assert.are.same(want, got)
    assert.truthy(#want >= 10, table.concat(want, " "))
    -- the modules' folders: perf_event.profile is lua/perf_event/profile/init.lua and its parts
    local function ls2(dir)
      local names = {}
      for name in sh("cd " .. q(dir) .. " && ls -d */*.lua"):gmatch("%S+") do names[#names + 1] = name end
      table.sort(names)
      return names
    end
    want, got = ls2(b.src .. "/lua/perf_event"), ls2(b.lua .. "/perf_event")
    assert.are.same(want, got)
    assert.truthy(#want >= 2, table.concat(want, " "))
    local out, rc = sh(("cd /tmp && LUA_PATH=%s LUA_CPATH=%s %s -e %s"):format(
      q(b.lua .. "/?.lua;" .. b.lua .. "/?/init.lua;;"), q(b.lib .. "/?.so;;"), rock.interp,
      q('print(debug.getinfo(require("perf_event.profile").start, "S").source)')))
    assert.are.equal(0, rc, out)
    assert.truthy(out:find("@" .. b.lua .. "/perf_event/profile/init.lua", 1, true), out)
    assert.are.equal(0, select(2, sh("test -x " .. q(b.tree .. "/bin/luaperf"))))
  end)

  it("pe.open('task-clock') from the installed rock under " .. (rock and rock.interp or "")
     .. " counts this interpreter's CPU time", function()
    local b = build()
    assert.are.equal(0, b.rc, b.out)
    local script = [[
local pe = require("perf_event")
print("source=" .. debug.getinfo(pe.open, "S").source)
local ev = assert(pe.open("task-clock"))
local c0 = os.clock()
while os.clock() - c0 < 0.05 do end
local v, en = ev:read()
local cpu = os.clock() - c0
print(("value=%d enabled=%d cpu_ns=%d"):format(v, en, math.floor(cpu * 1e9)))
if jit then print("ffi=" .. tostring(require("perf_event.fast").available)) end
]]
    local out, rc = sh(("cd /tmp && LUA_PATH=%s LUA_CPATH=%s %s -e %s"):format(
      q(b.lua .. "/?.lua;" .. b.lua .. "/?/init.lua;;"), q(b.lib .. "/?.so;;"), rock.interp, q(script)))
    assert.are.equal(0, rc, out)
    assert.truthy(out:find("source=@" .. b.lua .. "/perf_event/init.lua", 1, true), out)
    local v, en, cpu = out:match("value=(%d+) enabled=(%d+) cpu_ns=(%d+)")
    v, en, cpu = tonumber(v), tonumber(en), tonumber(cpu)
    assert.truthy(v, out)
    -- the task's CPU time: at least most of what os.clock saw, and no more
    -- than the time it was enabled (the kernel takes the two a few us apart)
    assert.truthy(v >= 0.8 * cpu and v <= en * 1.01, out)
    if rock.interp == "luajit" then
      assert.truthy(out:find("ffi=true", 1, true), "the FFI route did not bind to the rock's core:\n" .. out)
    end
  end)

  -- one 5.1 rock for both: LuaJIT's API is 5.1's, and the LuaJIT entries
  -- the safe point calls are found when the module is loaded
  local PROFILE_WALK = [[
local pe = require("perf_event")
local w, why = pe.core._private.luasafe_here()
print("here=" .. (w and "stack" or tostring(why)))
local p = assert(pe.profile.start({ freq = 499 }))
local t0, a = os.clock(), 0
while os.clock() - t0 < 0.2 do a = a + math.sin(a) end
p:stop()
print(("mode=%s walk=%s samples=%d"):format(tostring(p.mode), tostring(p.walk), p.nsamples))
]]
  local function profile_under(b, interp)
    return sh(("cd /tmp && LUA_PATH=%s LUA_CPATH=%s %s -e %s"):format(
      q(b.lua .. "/?.lua;" .. b.lua .. "/?/init.lua"), q(b.lib .. "/?.so"), interp, q(PROFILE_WALK)))
  end

  it("the 5.1 rock's profile takes its stacks at the safe point under luajit, and says needs LuaJIT under lua5.1",
     function()
    if rock.lua ~= "5.1" then pending("the 5.1 rock's") return end
    local b = build()
    assert.are.equal(0, b.rc, b.out)
    -- the rock's tree alone on the paths (no ';;': the core is the rock's)
    local out, rc = profile_under(b, "luajit")
    assert.are.equal(0, rc, out)
    assert.truthy(out:find("here=stack", 1, true), out)
    assert.truthy(out:find("mode=safepoint walk=safepoint ", 1, true), out)
    assert.truthy(tonumber(out:match("samples=(%d+)")) > 0, out)
    out, rc = profile_under(b, "lua5.1")
    assert.are.equal(0, rc, out)
    assert.truthy(out:find("here=needs LuaJIT (x86-64)", 1, true), out)
    assert.truthy(out:find("mode=hook walk=nil ", 1, true), out)
    assert.truthy(tonumber(out:match("samples=(%d+)")) > 0, out)
  end)

  it("the 5.1 rock's profile takes its stacks at the safe point in an nginx worker", function()
    if suite ~= "luajit" then pending("nginx runs in the luajit suite") return end
    local N = require("support.nginx")
    local why = N.skip_reason("the rock's nginx profile")
    if why then pending(why) return end
    local b = build()
    assert.are.equal(0, b.rc, b.out)
    local prefix = b.src:gsub("/src$", "/nginx")
    assert(select(2, sh(("mkdir -p %s/conf %s/logs && chmod -R a+rX %s"):format(
      q(prefix), q(prefix), q(prefix:gsub("/nginx$", ""))))) == 0)
    local conf = table.concat({
      "worker_processes 1;",
      "pid logs/nginx.pid;",
      "error_log logs/error.log notice;",
      "load_module /usr/lib/nginx/modules/ndk_http_module.so;",
      "load_module " .. N.MODULE .. ";",
      "events { worker_connections 64; }",
      "http {",
      "  access_log off;",
      -- both end in ';;' (resty.core is found on the default paths)
      ('  lua_package_path "%s/?.lua;%s/?/init.lua;;";'):format(b.lua, b.lua),
      ('  lua_package_cpath "%s/?.so;;";'):format(b.lib),
      "  server {",
      "    listen 127.0.0.1:@PORT@;",
      '    location = /hello { content_by_lua_block { ngx.say("hello") } }',
      "    location = /walk { content_by_lua_block {",
      '      ngx.say("core=", package.searchpath("perf_event.core", package.cpath))',
      '      local p = assert(require("perf_event").profile.start({ freq = 499 }))',
      "      local t0, a = os.clock(), 0",
      "      while os.clock() - t0 < 0.2 do a = a + math.sin(a) end",
      "      p:stop()",
      '      ngx.say("walk=", tostring(p.walk), " reason=", tostring(p.stacks_reason), " samples=", p.nsamples) } }',
      "  }",
      "}" }, "\n")
    local master
    local ok, err = pcall(function()
      local base
      base, master = N.start(prefix, { edit = function() return conf end, salt = 11 })
      local out = sh("curl -s --max-time 30 " .. base .. "/walk")
      assert.truthy(out:find("core=" .. b.lib .. "/perf_event/core.so", 1, true), out)
      assert.truthy(out:find("walk=safepoint reason=nil ", 1, true),
                    out .. (N.read(prefix .. "/logs/error.log") or ""))
      assert.truthy(tonumber(out:match("samples=(%d+)")) > 0, out)
    end)
    N.stop(master)
    assert(ok, err)
  end)

  it("its luaperf lists events and runs `stat` under " .. (rock and rock.interp or ""), function()
    local b = build()
    assert.are.equal(0, b.rc, b.out)
    local luaperf = q(b.tree .. "/bin/luaperf")
    -- luajit: the 5.1 rock's luaperf goes on under LuaJIT by itself; the
    -- lua5.1 suite keeps luarocks' lua5.1 with LUAPERF_LUA= (empty)
    local env = rock.interp == "lua5.1" and "LUAPERF_LUA= " or ""
    local out, rc = sh("cd /tmp && " .. env .. luaperf .. " list software")
    assert.are.equal(0, rc, out)
    assert.truthy(out:find("\n%s*task%-clock%s+%[Software event%]"), out)
    -- the names perf lists for the same class (its first name of a line:
    -- `context-switches OR cs`)
    if have("perf") then
      local function names(text)
        local t = {}
        for name in text:gmatch("\n%s*(%S+)[^\n]-%[Software event%]") do t[#t + 1] = name end
        table.sort(t)
        return t
      end
      local theirs = "\n" .. sh("perf list software 2>/dev/null")
      assert.truthy(#names(theirs) >= 9, theirs)
      assert.are.same(names(theirs), names(out))
    end
    -- the parent of the measured command is luaperf: its argv[0] names the interpreter
    out, rc = sh("cd /tmp && " .. env .. luaperf
      .. [[ stat -e task-clock -- sh -c 'echo "parent=$(tr "\0" " " < /proc/$PPID/cmdline)"']])
    assert.are.equal(0, rc, out)
    local parent = out:match("parent=(%S+)")
    assert.are.equal(rock.interp, parent and parent:match("[^/]*$"), out)
    assert.truthy(out:find("[%d.]+ msec task%-clock"), out)
    -- the command's exit status comes back through the re-exec
    out, rc = sh("cd /tmp && " .. env .. luaperf .. " stat -e task-clock -- sh -c 'exit 7'")
    assert.are.equal(7, rc, out)
  end)
end)

describe("make doc", function()
  if asan then
    it("is checked in the luajit, lua5.4 and lua5.1 suites", function() pending("ASan suite") end)
    return
  end

  it("keeps every module (by its @module name) and every documented function of perf_event in the reference", function()
    if not have("ldoc") then pending("no ldoc: tools/setup installs lua-ldoc") return end
    local d = tmpdir()
    -- ldoc writes its built-in style to /tmp/ldoc<$HOME, / as _>: a HOME of
    -- this spec's own makes that directory this run's, removed at the end
    tmps[#tmps + 1] = "/tmp/ldoc" .. d:gsub("[/\\: ]", "_")
    local out, rc = sh("HOME=" .. q(d) .. " ldoc -d " .. q(d) .. " .")
    assert.are.equal(0, rc, out)
    local html = read(d .. "/modules/perf_event.html")
    local funcs = html:match('<h2><a href="#Functions">Functions</a></h2>(.-)</table>')
    assert.truthy(funcs, "no Functions table")
    local listed = {}
    for name in funcs:gmatch('href="#([%w_]+)"') do listed[name] = true end
    -- a `--- ` doc block documents the next `function M.x` unless a local
    -- function, a local assignment or a field comes first (ldoc drops a
    -- block that a bare `local x` declaration follows)
    local want, doc = {}, false
    for line in read("lua/perf_event/init.lua"):gmatch("[^\n]*") do
      if line:match("^%-%-%- ") then
        doc = true
      elseif line:match("^function M%.") then
        if doc then want[#want + 1] = line:match("^function M%.([%w_]+)") end
        doc = false
      elseif line:match("^local function ") or line:match("^local [%w_, ]+=") or line:match("^M%.[%w_]+%s*=") then
        doc = false
      end
    end
    assert.truthy(#want >= 5, table.concat(want, " "))
    for _, name in ipairs(want) do
      assert.truthy(listed[name], "pe." .. name .. " is documented in init.lua but missing from make doc's Functions")
    end
    assert.truthy(listed.open, "pe.open missing from the reference")
    -- every module has its page under the name its @module tag gives (a
    -- header comment ldoc cannot read, as one with a command-line option's
    -- two dashes in it, leaves the module named by its path)
    local mods = 0
    local p = io.popen("find lua/perf_event -name '*.lua'")
    for path in p:read("*a"):gmatch("[^\n]+") do
      local name = read(path):match("\n%-%- @module ([%w_.]+)")
      assert.truthy(name, path .. " has no @module tag")
      local f = io.open(d .. "/modules/" .. name .. ".html")
      assert.truthy(f, name .. " (" .. path .. ") has no page of its own in the reference")
      f:close()
      mods = mods + 1
    end
    p:close()
    assert.truthy(mods >= 30, mods .. " modules")
  end)
end)
