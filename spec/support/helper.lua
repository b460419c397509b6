-- Loaded by busted before the specs: points package.cpath at the C core
-- built for the running interpreter (PE_BUILD overrides, e.g. build/asan).
local build = os.getenv("PE_BUILD")
if not build then
  if jit then
    build = "build"
  else
    build = "build/" .. _VERSION:gsub("Lua ", "lua")
  end
end
local testdir = "build/test/" .. (jit and "luajit" or _VERSION:gsub("Lua ", "lua"))
package.cpath = build .. "/?.so;" .. testdir .. "/?.so;" .. package.cpath
package.path = "lua/?.lua;lua/?/init.lua;spec/?.lua;" .. package.path
