-- The release: `make dist` writes the source archive and the .src.rock, and
-- the .src.rock installs with no network and no checkout, into a tree of its
-- own, from which `require("perf_event")` and `luaperf` work.
local U = require("support.util")

local q = U.shell_quote
local sh = U.run

local VERSION = "0.1.0"

-- a rockspec file's table (it is Lua assignments)
local function rockspec(path)
  local env = {}
  local chunk = assert(loadfile and (setfenv and loadfile(path) or loadfile(path, "t", env)))
  if setfenv then setfenv(chunk, env) end
  chunk()
  return env
end

local function same(a, b, path)
  if type(a) ~= "table" or type(b) ~= "table" then
    assert.are.equal(a, b, path)
    return
  end
  for k, v in pairs(a) do same(v, b[k], path .. "." .. tostring(k)) end
  for k in pairs(b) do assert.truthy(a[k] ~= nil, path .. "." .. tostring(k) .. " only in one rockspec") end
end

describe("the release rockspec", function()
  it("builds and installs as the scm one does", function()
    local scm = rockspec("rockspec/perf_event-scm-1.rockspec")
    local rel = rockspec("rockspec/release/perf_event-" .. VERSION .. "-1.rockspec")
    assert.are.equal(VERSION .. "-1", rel.version)
    assert.are.equal("perf_event-" .. VERSION .. ".tar.gz", rel.source.url)
    for _, k in ipairs({ "package", "rockspec_format", "description", "dependencies", "build",
                         "supported_platforms", "test" }) do
      same(scm[k], rel[k], k)
    end
    -- the licence the rockspec names is the LICENSE file's
    assert.are.equal("MIT", rel.description.license)
    assert.truthy(U.slurp("LICENSE"):find("^MIT License\n"), "LICENSE is not the MIT licence")
  end)
end)

describe("make dist", function()
  -- (the rock is the 5.1 one, loaded by luajit below: one suite runs it)
  if (os.getenv("PE_SUITE") or (jit and "luajit" or _VERSION:gsub("Lua ", "lua"))) ~= "lua5.1" then
    it("is checked in the lua5.1 suite", function() pending("one interpreter is enough") end)
    return
  end
  local have_git = select(2, sh("git rev-parse --git-dir >/dev/null 2>&1")) == 0
  if not have_git then
    it("needs the checkout's git history", function() pending("no .git: make dist archives HEAD") end)
    return
  end

  it("writes a .src.rock that installs offline, with require and luaperf working", function()
    local d = U.sh("mktemp -d"):gsub("%s+$", "")
    finally(function() os.execute("rm -rf " .. q(d)) end)
    local out, rc = sh(("make -s dist DIST=%s 2>&1"):format(q(d .. "/dist")))
    assert.are.equal(0, rc, out)
    local rock = d .. "/dist/perf_event-" .. VERSION .. "-1.src.rock"
    local listing = U.sh("unzip -l " .. q(rock))
    assert.truthy(listing:find("perf_event%-" .. VERSION .. "%-1%.rockspec"), listing)
    assert.truthy(listing:find("perf_event%-" .. VERSION .. "%.tar%.gz"), listing)
    local tar = U.sh("tar -tzf " .. q(d .. "/dist/perf_event-" .. VERSION .. ".tar.gz"))
    for _, f in ipairs({ "Makefile", "LICENSE", "bin/luaperf", "csrc/core.c", "lua/perf_event/init.lua" }) do
      local entry = "\nperf_event%-" .. VERSION .. "/" .. f:gsub("%p", "%%%0") .. "\n"
      assert.truthy(tar:find(entry), f .. " not in the archive")
    end
    -- no network (a network namespace of its own, as root), no checkout (run
    -- from elsewhere), a tree of its own
    local tree = d .. "/tree"
    local offline = U.is_root() and "unshare -n " or ""
    out, rc = sh(("cd %s && %sluarocks install --tree %s %s 2>&1"):format(q(d), offline, q(tree), q(rock)))
    assert.are.equal(0, rc, out)
    local env = ("cd %s && LUA_PATH=%s LUA_CPATH=%s "):format(q(d),
      q(tree .. "/share/lua/5.1/?.lua;" .. tree .. "/share/lua/5.1/?/init.lua"),
      q(tree .. "/lib/lua/5.1/?.so"))
    out, rc = sh(env .. "luajit -e 'local pe = require(\"perf_event\"); " ..
                 "local ev = assert(pe.open(\"task-clock\")); " ..
                 "print(package.searchpath(\"perf_event.core\", package.cpath)); ev:close()' 2>&1")
    assert.are.equal(0, rc, out)
    assert.are.equal(tree .. "/lib/lua/5.1/perf_event/core.so\n", out)
    out, rc = sh(env .. q(tree .. "/bin/luaperf") .. " stat -e task-clock,page-faults -- true 2>&1")
    assert.are.equal(0, rc, out)
    assert.truthy(out:find("task%-clock") and out:find("page%-faults"), out)
  end)
end)
