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

-- tools/runtests logs every os.tmpname to PE_TMPNAMES with the spec line
-- that asked for it: what still exists at the end of the suite is litter,
-- and the log says where it came from.
local tmpnames = os.getenv("PE_TMPNAMES")
if tmpnames and tmpnames ~= "" then
  local tmpname, open, getinfo = os.tmpname, io.open, debug.getinfo
  os.tmpname = function()                        -- luacheck: ignore 122
    local name = tmpname()
    local f = open(tmpnames, "a")
    if f then
      local where = "?"
      for level = 2, 12 do
        local info = getinfo(level, "Sl")
        if not info then break end
        if info.what ~= "C" and not info.short_src:find("spec/support/", 1, true) then
          where = info.short_src .. ":" .. tostring(info.currentline)
          break
        end
      end
      f:write(name, "\t", where, "\n")
      f:close()
    end
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
