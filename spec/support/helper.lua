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

-- tools/runtests as a user (no private /tmp): every os.tmpname is logged to
-- PE_TMPNAMES, and what still exists at the end of the suite is litter.
local tmpnames = os.getenv("PE_TMPNAMES")
if tmpnames and tmpnames ~= "" then
  local tmpname, open = os.tmpname, io.open
  os.tmpname = function()                        -- luacheck: ignore 122
    local name = tmpname()
    local f = open(tmpnames, "a")
    if f then f:write(name, "\n") f:close() end
    return name
  end
end

-- `make test` writes no kernel-wide setting: a spec opening a /proc/sys file
-- for writing fails here.  The opt-in specs (spec/optin/, make test-sysctl)
-- run with PE_ALLOW_SYSCTL=1.
if os.getenv("PE_ALLOW_SYSCTL") ~= "1" then
  local open = io.open
  io.open = function(path, mode, ...)          -- luacheck: ignore 122
    if type(path) == "string" and type(mode) == "string" and mode:find("[wa+]")
       and path:gsub("/+", "/"):find("^/proc/sys/") then
      error("a spec opened the kernel-wide " .. path .. " for writing: such specs are opt-in " ..
            "(spec/optin/, make test-sysctl)", 2)
    end
    return open(path, mode, ...)
  end
end
