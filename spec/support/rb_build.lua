-- Builds spec/support/rb_test.c into build/test/<suite>/rbtest.so for the
-- running interpreter (when missing or older than the source) and loads it.
local suite = jit and "luajit" or _VERSION:gsub("Lua ", "lua")
local inc = ({
  luajit = "-I/usr/include/luajit-2.1",
  ["lua5.4"] = "-I/usr/include/lua5.4",
  ["lua5.1"] = "-I/usr/include/lua5.1",
})[suite]
local dir = "build/test/" .. suite
local so = dir .. "/rbtest.so"
local src = "spec/support/rb_test.c"

local function mtime(path)
  local p = io.popen("stat -c %Y " .. path .. " 2>/dev/null")
  local t = tonumber(p:read("*l") or "")
  p:close()
  return t
end

local built = mtime(so)
if not built or built < (mtime(src) or 0) then
  -- the luajit and asan suites share this file and may run side by side
  -- (tools/runtests' lanes): each builds into a name of its own (pid) and
  -- renames it into place, which is atomic
  local tmp = ("%s.tmp.%d"):format(so, require("support.util").pid())
  local cmd = ("mkdir -p %s && cc -O1 -g -fPIC -shared -Wall -Wextra -Werror %s %s -o %s -ldl && mv %s %s")
    :format(dir, inc, src, tmp, tmp, so)
  local r = os.execute(cmd)
  assert(r == true or r == 0, "building " .. so .. " failed")
end
local f = assert(package.loadlib(so, "luaopen_rbtest"))
return f()
