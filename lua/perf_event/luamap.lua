--- perf_event.luamap: a runtime perf map of a LuaJIT process, for
-- `luaperf record --lua -p PID` (and the `perf` tool).
--
--    luajit -l perf_event.luamap app.lua          -- or, in the app:
--    require("perf_event.luamap")                 -- starts it (once)
--
-- Loading the module keeps `/tmp/perf-PID.map` up to date in this process,
-- in perf's own format (`START SIZE name`, hexadecimal):
--
-- * every JIT trace's machine code, named `function@chunk:line [trace N]`
--   after the function and line the trace starts at (`perf report` and
--   `perf script` name trace code with these lines);
-- * the bytecode of every prototype, one range per source line, named
--   `function@chunk:line [bc]`. An interpreter sample whose PC register
--   (rbx on x86-64 GC64, one instruction past the one being run) falls in
--   a range ran that line.
--
-- The names and the registry are pe.profile's: prototypes come from the
-- functions on the stack and in package.loaded when it starts, then from
-- `jit.attach(cb, "bc")`; traces from `jit.attach(cb, "trace")`. The
-- registry holds a reference to every prototype, so no bytecode address is
-- reused while the map is kept (the cost: no prototype is freed). A trace
-- flush reuses machine code addresses: a later line for the same address
-- replaces the earlier one. The first line, `0 0 perf_event.luamap START`,
-- carries the process's start time (field 22 of /proc/PID/stat), so that a
-- map left by an earlier process with the same PID is told apart. A forked
-- child (an nginx worker of a master that loaded the module) notices the
-- new pid in the callbacks and moves to its own map.
-- @module perf_event.luamap

local io, string = io, string
local format = string.format
local rawget, tostring, tonumber, pairs, pcall, require = rawget, tostring, tonumber, pairs, pcall, require

local M = {}

local jit = rawget(_G, "jit")
local vmevent = require("perf_event.vmevent")

local state   -- the running map, or nil

-- pid and start time (clock ticks since boot) of this process
local function self_stat()
  local f = io.open("/proc/self/stat", "r")
  if not f then return nil end
  local s = f:read("*l")
  f:close()
  local pid = s:match("^(%d+)")
  -- the fields after "(comm)": state is field 3, starttime field 22
  local rest = s:match("%) (.*)$") or ""
  local n, start = 2, nil
  for v in rest:gmatch("%S+") do
    n = n + 1
    if n == 22 then start = v break end
  end
  return pid, start
end

-- the lines of the prototypes registered since the last call
local function write_protos(st)
  local reg, f, jutil, frame_name = st.reg, st.file, st.jutil, st.frame_name
  local protos = reg.protos
  for i = st.done + 1, #protos do
    local e = protos[i]
    local n = (e.hi - e.lo) / 4
    local first, line = 0, nil
    for pos = 0, n do
      local l
      if pos < n then
        local fi = jutil.funcinfo(e.obj, pos)
        l = fi and fi.currentline or e.info.linedefined
      end
      if l ~= line then
        if line then
          f:write(format("%x %x %s [bc]\n", e.lo + 4 * first, 4 * (pos - first), frame_name(e.info, line)))
        end
        first, line = pos, l
      end
    end
  end
  st.done = #protos
  f:flush()
end

-- opens the map of this process; in a process forked from one that kept
-- a map (nginx's workers, when the master loaded the module), the lines of
-- the prototypes and live traces it inherited are written again
local function open_map(st)
  local pid, start = self_stat()
  local path = st.custom or format("/tmp/perf-%s.map", tostring(pid))
  local header = format("0 0 perf_event.luamap %s", tostring(start))
  -- a map this process began (another Lua state, or start after stop) is
  -- kept; one an earlier process left is replaced. The path is
  -- predictable: a link or a file someone else planted there is refused
  -- (fs.own_file)
  local f, err = require("perf_event.fs").own_file(path)
  if not f then return nil, err end
  local mine = f:head(#header + 1) == header .. "\n"
  if not mine then f:truncate() f:write(header, "\n") f:flush() end
  if st.file then st.file:close() end
  st.file, st.reg.perfmap, st.pid, st.info.path = f, f, tonumber(pid), path
  if st.done > 0 then
    st.done = 0
    write_protos(st)
    for tr, e in pairs(st.reg.live) do
      f:write(format("%x %x %s [trace %d]\n", e.lo, e.hi - e.lo, st.frame_name(e.info, e.line), tr))
    end
    f:flush()
  end
  return true
end

-- getpid(2), to notice a fork
local getpid
if jit then
  local ffi = require("ffi")
  pcall(ffi.cdef, 'int pe_map_getpid(void) __asm__("getpid");')   -- (a name of our own)
  getpid = function() return ffi.C.pe_map_getpid() end
end

--- Starts keeping the map (loading the module does it). Calling it again
-- returns the running state. A forked child (an nginx worker of a master
-- that loaded the module) moves to its own map by itself.
-- @tparam[opt] table opts `path` (default `/tmp/perf-PID.map`)
-- @treturn[1] table `{path=, bytecode=, reason=}`: `bytecode` false when
--   the layout self-test failed (then only traces are written, and
--   `reason` says why)
-- @treturn[2] nil
-- @treturn[2] string why not (not LuaJIT, the file cannot be written)
function M.start(opts)
  if state then
    if not state.custom and getpid() ~= state.pid then open_map(state) end
    return state.info
  end
  if not jit then return nil, "perf_event.luamap needs LuaJIT (" .. _VERSION .. " has no JIT or jit.util)" end
  opts = opts or {}
  local profile = require("perf_event.profile")
  local jutil = require("jit.util")
  -- the registry writes each trace's line itself, to reg.perfmap
  local reg = profile._new_registry()
  local st = { reg = reg, done = 0, jutil = jutil, frame_name = profile.frame_name, custom = opts.path,
               info = { bytecode = false } }
  local ok, err = open_map(st)
  if not ok then return nil, err end
  local function forked()
    if not st.custom and getpid() ~= st.pid then open_map(st) end
  end
  local lay = profile._check_layout()
  if lay.ok then
    local off, seen = lay.proto_bc, {}
    reg:seed(off, seen)
    write_protos(st)
    st.bc_cb = function(pt) forked() reg:add_tree(pt, off, seen) write_protos(st) end
    vmevent.subscribe("bc", st.bc_cb)
    st.info.bytecode = true
  else
    st.info.reason = lay.reason
  end
  -- traces compiled before now are not in the map: compile them again
  jit.flush()
  st.trace_cb = function(what, tr, func, pc)
    forked()
    reg:trace_event(what, tr, func, pc)
  end
  vmevent.subscribe("trace", st.trace_cb)
  state = st
  return st.info
end

--- Stops writing: detaches the callbacks and closes the file, which stays
-- (the `perf` tool reads it when it reports, after the process is gone).
function M.stop()
  local st = state
  if not st then return end
  state = nil
  if st.bc_cb then vmevent.unsubscribe("bc", st.bc_cb) end
  vmevent.unsubscribe("trace", st.trace_cb)
  st.file:close()
end

--- The running state (`{path=, bytecode=, reason=}`), or nil.
function M.running()
  return state and state.info
end

local ok, err = M.start()
if not ok then io.stderr:write("perf_event.luamap: ", tostring(err), "\n") end

return M
