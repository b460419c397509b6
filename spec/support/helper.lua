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
-- the ASan run loads the simulators (pesim) built with ASan when present
local asandir = build:match("asan$") and "build/test/asan/?.so;" or ""
package.cpath = build .. "/?.so;" .. asandir .. testdir .. "/?.so;" .. package.cpath
package.path = "lua/?.lua;lua/?/init.lua;spec/?.lua;" .. package.path
