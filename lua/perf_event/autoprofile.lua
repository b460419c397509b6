--- perf_event.autoprofile: profile a whole LuaJIT/Lua run without editing it.
--
--    PE_PROFILE_OUT=app.folded luajit -l perf_event.autoprofile app.lua
--
-- Loading the module starts `pe.profile` (options from the environment:
-- PE_PROFILE_EVENT, PE_PROFILE_FREQ or PE_PROFILE_PERIOD, PE_PROFILE_PAGES,
-- PE_PROFILE_LINES=0 for function-level frames, PE_PROFILE_STACKS=0 for C
-- leaf frames only). When the Lua state closes
-- (the script returned, or `os.exit(code, true)`) or the script calls
-- `os.exit` (the module wraps it), the profile stops and the folded stacks
-- go to PE_PROFILE_OUT (default `lua.folded`; a `%p` in it becomes the
-- process id). PE_PROFILE_COMM=1 starts each stack with the process's comm,
-- as `luaperf record` writes them. A process that is killed, or that ends
-- in C (exit() from a C module), writes nothing. The samples are read
-- every 0.5 s of CPU time, at a GC cycle, so that a long run fits the rings.
-- `luaperf record --lua -- CMD` loads this module into CMD through LUA_INIT.
-- @module perf_event.autoprofile

local os, io, tonumber, tostring, setmetatable, pcall = os, io, tonumber, tostring, setmetatable, pcall
local profile = require("perf_event").profile

local function env_number(name)
  local v = os.getenv(name)
  return v and v ~= "" and tonumber(v) or nil
end

local period = env_number("PE_PROFILE_PERIOD")
-- PE_PROFILE_STACKS=0: C leaf frames only, which leaves LuaJIT's own
-- profiler free for a -jp that starts after this module (luaperf record
-- --lua sets it when the command has -jp: the safe point uses that profiler)
local stacks
if os.getenv("PE_PROFILE_STACKS") == "0" then stacks = false end
-- a value start refuses (PE_PROFILE_FREQ=0) is said like an event that
-- cannot be opened: the run goes on unprofiled
local started, p, err = pcall(profile.start, { event = os.getenv("PE_PROFILE_EVENT") or "cpu-clock",
                               period = period, freq = not period and (env_number("PE_PROFILE_FREQ") or 999) or nil,
                               pages = env_number("PE_PROFILE_PAGES"), stacks = stacks })
if not started then p, err = nil, p end
if not p then
  io.stderr:write("perf_event.autoprofile: ", tostring(err), "\n")
  return false
end

local function self_pid()
  local f = io.open("/proc/self/stat", "r")
  local pid = f and f:read("*l"):match("^(%d+)")
  if f then f:close() end
  return pid or "self"
end

local draining, finish_later = false, false

local function finish()
  if not p.running then return end
  -- a drain's allocations may run this finalizer in the middle of the
  -- drain (Lua 5.1's close does): finish once the drain is done
  if draining then finish_later = true return end
  p:stop()
  local path = (os.getenv("PE_PROFILE_OUT") or "lua.folded"):gsub("%%p", self_pid())
  local f = io.open(path, "w")
  if not f then
    io.stderr:write("perf_event.autoprofile: cannot write ", path, "\n")
    return
  end
  local text = p:folded({ lines = os.getenv("PE_PROFILE_LINES") ~= "0" })
  if os.getenv("PE_PROFILE_COMM") == "1" and text ~= "" then
    local c = io.open("/proc/self/comm", "r")
    local comm = c and c:read("*l") or self_pid()
    if c then c:close() end
    text = comm .. ";" .. text:gsub("\n(.)", "\n" .. comm:gsub("%%", "%%%%") .. ";%1")
  end
  f:write(text)
  f:close()
  if p.lost > 0 then
    io.stderr:write(("perf_event.autoprofile: %d samples lost (the ring filled up; PE_PROFILE_PAGES "
                     .. "sets its size)\n"):format(p.lost))
  end
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

-- the samples are read now and then, so that the rings last a long run: from
-- a finalizer that arms a new one each GC cycle (a safe point; a program
-- that allocates nothing runs no cycle, and reads them all at the end)
local last = os.clock()
local function tick()
  if not p.running then return end
  if not draining and os.clock() - last >= 0.5 then
    draining = true
    pcall(p.drain, p)
    draining = false
    last = os.clock()
    if finish_later then finish() return end
  end
  if newproxy then getmetatable(newproxy(true)).__gc = tick
  else setmetatable({}, { __gc = tick }) end
end
tick()

-- a plain os.exit(code) does not close the state: write the profile first
local exit = os.exit
os.exit = function(...)   -- luacheck: ignore 122
  finish()
  return exit(...)
end

return { profile = p, finish = finish }
