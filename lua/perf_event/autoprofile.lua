--- perf_event.autoprofile: profile a whole LuaJIT/Lua run without editing it.
--
--    PE_PROFILE_OUT=app.folded luajit -l perf_event.autoprofile app.lua
--
-- Loading the module starts `pe.profile` (options from the environment:
-- PE_PROFILE_EVENT, PE_PROFILE_FREQ, PE_PROFILE_LINES=0 for function-level
-- frames). When the Lua state closes (the script returned, or
-- `os.exit(code, true)`), the profile stops and the folded stacks go to
-- PE_PROFILE_OUT (default `lua.folded`). A plain `os.exit(code)` does not
-- close the state, so nothing is written then.
-- @module perf_event.autoprofile

local os, io, tonumber, setmetatable = os, io, tonumber, setmetatable
local profile = require("perf_event").profile

local p, err = profile.start({ event = os.getenv("PE_PROFILE_EVENT") or "cpu-clock",
                               freq = tonumber(os.getenv("PE_PROFILE_FREQ") or "999") })
if not p then
  io.stderr:write("perf_event.autoprofile: ", tostring(err), "\n")
  return false
end

local function finish()
  if not p.running then return end
  p:stop()
  local path = os.getenv("PE_PROFILE_OUT") or "lua.folded"
  local f = io.open(path, "w")
  if not f then return end
  f:write(p:folded({ lines = os.getenv("PE_PROFILE_LINES") ~= "0" }))
  f:close()
end

-- the state's close finalizes this object last of all: a userdata on
-- LuaJIT/5.1 (newproxy), a table with __gc on 5.4
local sentinel
local newproxy = rawget(_G, "newproxy")
if newproxy then
  sentinel = newproxy(true)
  getmetatable(sentinel).__gc = finish
else
  sentinel = setmetatable({}, { __gc = finish })
end
debug.getregistry()["perf_event.autoprofile"] = sentinel

return { profile = p, finish = finish }
