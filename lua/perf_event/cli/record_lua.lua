--- perf_event.cli.record_lua: `luaperf record`'s Lua mode: a command whose Lua
-- (not a public interface: luaperf's subcommands, run through perf_event.cli's main)
-- processes profile themselves (LUA_INIT, perf_event.autoprofile), and the
-- reader of /tmp/perf-PID.map for `record --lua -p PID`.
-- @module perf_event.cli.record_lua

local io, string, table, math = io, string, table, math
local ipairs, pairs, tonumber, tostring = ipairs, pairs, tonumber, tostring
local setmetatable = setmetatable
local format, concat = string.format, table.concat

local C = require("perf_event.cli.common")
local core, exit_code = C.core, C.exit_code

local M = {}

-- package.searchpath, for Lua 5.1 too
local function search_path(name, path)
  local file = name:gsub("%.", "/")
  for tmpl in path:gmatch("[^;]+") do
    local cand = tmpl:gsub("%?", file)
    local f = io.open(cand, "r")
    if f then f:close() return cand end
  end
end

-- where the child finds perf_event: the Lua files luaperf itself loaded,
-- and the core built for the child's Lua (a checkout has one build per Lua:
-- build/, build/lua5.1/, build/lua5.4/; an installed 5.1 module serves
-- LuaJIT as well)
local function child_paths()
  local init = search_path("perf_event", package.path)
  local ldir = init and init:match("^(.-)perf_event/init%.lua$")
  local core_so = search_path("perf_event.core", package.cpath)
  local cdir = core_so and core_so:match("^(.-)perf_event/core%.[^/]*$")
  local own = rawget(_G, "jit") and "luajit" or _VERSION:gsub("Lua ", "lua")
  local cp = {}
  if cdir then
    cp[own] = cdir .. "?.so"
    local base = cdir:match("^(.-build/)lua5%.%d/$") or cdir:match("^(.-build/)$") or cdir:match("^(.-build/)asan/$")
    if base then
      cp.luajit = cp.luajit or base .. "?.so"
      cp["lua5.1"] = cp["lua5.1"] or base .. "lua5.1/?.so"
      cp["lua5.4"] = cp["lua5.4"] or base .. "lua5.4/?.so"
    elseif own == "luajit" or own == "lua5.1" then
      cp.luajit, cp["lua5.1"] = cp[own], cp[own]
    end
  end
  return ldir and (ldir .. "?.lua;" .. ldir .. "?/init.lua"), cp
end

-- the chunk LUA_INIT runs in the child: a searcher for perf_event's modules
-- in luaperf's paths (the child's own package.path and cpath are left as
-- they are; perf_event.native, which loads core.so, sees luaperf's cpath
-- while it runs), perf_event.autoprofile, then the child's own LUA_INIT
local function lua_init_code(lpath, cp, prev)
  local cps = {}
  for k, v in pairs(cp) do cps[#cps + 1] = format("[%q] = %q", k, v) end
  table.sort(cps)
  local code = format([[
do
  local P, C = %s, { %s }
  local cp = C[rawget(_G, "jit") and "luajit" or _VERSION:gsub("Lua ", "lua")]
  local function find(name, path)
    local file = name:gsub("%%.", "/")
    for t in path:gmatch("[^;]+") do
      local f = t:gsub("%%?", file)
      local h = io.open(f, "r")
      if h then h:close() return f end
    end
  end
  table.insert(package.searchers or package.loaders, 2, function(name)
    if name ~= "perf_event" and name:sub(1, 11) ~= "perf_event." then return nil end
    local f = P and find(name, P)
    if f and name == "perf_event.native" and cp then
      -- it loads core.so from package.cpath: luaperf's, for this one load
      local chunk = assert(loadfile(f))
      return function(...)
        local own = package.cpath
        package.cpath = cp
        local ok, m = pcall(chunk, ...)
        package.cpath = own
        if not ok then error(m, 0) end
        return m
      end, f
    end
    if f then return assert(loadfile(f)), f end
    f = cp and find(name, cp)
    if f then return assert(package.loadlib(f, "luaopen_" .. name:gsub("%%.", "_"))), f end
  end)
  local ok, err = pcall(require, "perf_event.autoprofile")
  if not ok then
    io.stderr:write("luaperf record --lua: perf_event did not load in this process: ", tostring(err), "\n")
  end
end]], lpath and format("%q", lpath) or "nil", concat(cps, ", "))
  if prev and prev ~= "" then
    if prev:sub(1, 1) == "@" then code = code .. format("\ndofile(%q)", prev:sub(2))
    else code = code .. format("\nassert((rawget(_G, 'loadstring') or load)(%q, '=LUA_INIT'))()", prev) end
  end
  return code
end

-- `record --lua -- CMD`: CMD profiles itself (pe.profile through
-- perf_event.autoprofile, loaded by LUA_INIT) and writes its folded stacks
-- to a per-run file, which luaperf reads when CMD has exited
local function record_lua_child(o, freq, period, out, path, as_profile)
  local c = core()
  local base = os.tmpname()   -- the profile files are base.PID, one per Lua process
  local lpath, cp = child_paths()
  local getenv = os.getenv
  -- the core's spawn runs `env -- NAME=VALUE... CMD`: env sets the variables
  -- and replaces itself with CMD (same process, same pid)
  local argv = { "env", "--" }
  local function set(k, v) argv[#argv + 1] = k .. "=" .. v end
  set("LUA_INIT", lua_init_code(lpath, cp, getenv("LUA_INIT")))
  for _, v in ipairs({ "5_2", "5_3", "5_4" }) do
    set("LUA_INIT_" .. v, lua_init_code(lpath, cp, getenv("LUA_INIT_" .. v) or getenv("LUA_INIT")))
  end
  set("PE_PROFILE_OUT", base .. ".%p")
  set("PE_PROFILE_COMM", "1")
  set("PE_PROFILE_EVENT", o.events[1] or "cpu-clock")
  if period then set("PE_PROFILE_PERIOD", tostring(period)) else set("PE_PROFILE_FREQ", tostring(freq)) end
  -- LuaJIT has one profiler per process: a -jp that starts after
  -- autoprofile would take the safe-point hook over (and start with no
  -- line checks in its traces), so C leaf frames only
  for _, a in ipairs(o.cmd) do
    if a:sub(1, 3) == "-jp" then set("PE_PROFILE_STACKS", "0") break end
  end
  for _, a in ipairs(o.cmd) do argv[#argv + 1] = a end
  local child, err = c.spawn(argv)
  if not child then
    os.remove(base)
    io.stderr:write("luaperf record: ", tostring(err), "\n")
    return 127
  end
  local status, code
  repeat status, code = child:wait() until status ~= "signal" and status ~= false
  -- every Lua process of the run wrote base.PID
  local dir, prefix = base:match("^(.*)/([^/]*)$")
  local counts, keys, files, samples = {}, {}, 0, 0
  for _, name in ipairs(c.readdir(dir) or {}) do
    if name:sub(1, #prefix + 1) == prefix .. "." and name:sub(#prefix + 2):match("^%d+$") then
      local file = dir .. "/" .. name
      files = files + 1
      for l in io.lines(file) do
        local key, n = l:match("^(.*) (%d+)$")
        if key then
          if not counts[key] then counts[key] = 0; keys[#keys + 1] = key end
          counts[key] = counts[key] + tonumber(n)
          samples = samples + tonumber(n)
        end
      end
      os.remove(file)
    end
  end
  os.remove(base)
  table.sort(keys)
  if as_profile and files > 0 then
    local pprof = require("perf_event.pprof")
    local t = pprof.folded_table(counts, { event = o.events[1] or "cpu-clock", freq = not period and freq or nil,
                                           period = period })
    out:write(as_profile == "pprof" and pprof.encode(t) or require("perf_event.speedscope").encode(t,
      { name = "luaperf record --lua " .. concat(o.cmd, " ") }))
  elseif not as_profile then
    for _, k in ipairs(keys) do out:write(k, " ", counts[k], "\n") end
  end
  if out ~= io.stdout then out:close() end
  local rc = exit_code(status, code)
  if files == 0 then
    io.stderr:write(format("luaperf record: no Lua profile was written: '%s' is not a Lua interpreter, "
      .. "perf_event did not load in it, or it ended without closing its Lua state (killed by a signal, "
      .. "or exit() from C) [exit status %d]\n", o.cmd[1], rc))
    return rc
  end
  io.stderr:write(format("[ luaperf record: %d samples, %d stacks written to %s%s ]\n", samples, #keys,
                         path == "-" and "stdout" or path, as_profile and " (" .. as_profile .. ")" or ""))
  return rc
end

-- `record --lua -p PID`: the process keeps /tmp/perf-PID.map up to date
-- (perf_event.luamap); its lines name the samples' JIT trace code and the
-- source line of the bytecode the interpreter's PC register points into
local LuaMap = {}
LuaMap.__index = LuaMap

local function addr(v)
  local h = v ~= nil and require("perf_event.symbols").hex(v)
  return h and tonumber(h, 16)
end

--- A reader of a process's /tmp/perf-PID.map as perf_event.luamap writes it.
-- @tparam number pid
-- @tparam[opt] string path the map (default `/tmp/perf-PID.map`)
-- @treturn table with `refresh()`, `frames(rec, sym)` and the counts
--   `nbc`, `ntraces`; `found` once the map was read
function M.luamap(pid, path)
  local start
  local f = io.open("/proc/" .. tostring(pid) .. "/stat", "r")
  if f then
    local rest = (f:read("*l") or ""):match("%) (.*)$") or ""
    f:close()
    local n = 2
    for v in rest:gmatch("%S+") do n = n + 1 if n == 22 then start = v break end end
  end
  return setmetatable({ path = path or format("/tmp/perf-%d.map", pid), start = start, pos = 0,
                        bc = {}, traces = {}, nbc = 0, ntraces = 0, found = false }, LuaMap)
end

local function by_lo(a, b) return a.lo < b.lo end

-- the entry of a sorted list whose [lo, hi) holds a
local function covering(list, a)
  local lo, hi, best = 1, #list, nil
  while lo <= hi do
    local mid = math.floor((lo + hi) / 2)
    if list[mid].lo <= a then best = mid; lo = mid + 1 else hi = mid - 1 end
  end
  local e = best and list[best]
  return e and a < e.hi and e or nil
end

--- Reads the lines added since the last call.
function LuaMap:refresh()
  if self.stale then return self end
  local f = io.open(self.path, "r")
  if not f then return self end
  f:seek("set", self.pos)
  local data = f:read("*a") or ""
  f:close()
  local upto = data:match(".*\n()")   -- complete lines only
  if not upto then return self end
  self.pos = self.pos + upto - 1
  for l in data:sub(1, upto - 1):gmatch("[^\n]+") do
    local lo, size, name = l:match("^(%x+) (%x+) (.+)$")
    lo, size = tonumber(lo or "", 16), tonumber(size or "", 16)
    if not self.found then
      self.found = true
      local start = l:match("^0 0 perf_event%.luamap (%d+)$")
      -- a map an earlier process with this pid left behind
      if start and self.start and start ~= self.start then self.stale = true return self end
    end
    if lo and size > 0 then
      local bcname = name:match("^(.*) %[bc%]$")
      local trname = name:match("^(.*) %[trace %d+%]$")
      local e = { lo = lo, hi = lo + size, name = bcname or trname }
      if bcname then
        self.bc[#self.bc + 1] = e
        self.bc_sorted, self.nbc = false, self.nbc + 1
      elseif trname then
        -- a flush reuses machine code: the later line wins
        local keep = {}
        for _, t in ipairs(self.traces) do
          if t.hi <= e.lo or t.lo >= e.hi then keep[#keep + 1] = t end
        end
        keep[#keep + 1] = e
        table.sort(keep, by_lo)
        self.traces, self.ntraces = keep, self.ntraces + 1
      end
    end
  end
  return self
end

local function le_u64(s, o)
  local a, b, c, d, e, f, g, h = s:byte(o + 1, o + 8)
  return a + b * 256 + c * 65536 + d * 16777216 + (e + f * 256 + g * 65536 + h * 16777216) * 4294967296
end

-- LuaJIT's own code: the interpreter and VM (named or, stripped, "[luajit...]")
local function vm_frame(name)
  return (name:sub(1, 1) == "[" and name:find("luajit", 1, true)) or name:find("^lj_BC_") or name:find("^lj_vm_")
end

--- The frames of a sample, leaf first: a JIT trace's Lua frame; or the
-- Lua line the interpreter's PC (rbx) is in, under it the C frames of the
-- callchain down to the leaf when the leaf is not LuaJIT's own code; or, as
-- pe.profile does, a C leaf under a trace whose return address is in the
-- sampled stack; else the C callchain alone.
function LuaMap:frames(rec, sym)
  local ip = addr(rec.ip)
  local t = ip and covering(self.traces, ip)
  if t then return { t.name }, true end
  if not self.bc_sorted then table.sort(self.bc, by_lo) self.bc_sorted = true end
  local bx = rec.regs_user and addr(rec.regs_user.bx)
  local b = bx and covering(self.bc, bx - 4)
  local lua = b and b.name
  local su = rec.stack_user
  if not lua and su and su.data and #self.traces > 0 then
    local n = math.min(tonumber(su.dyn_size) or #su.data, #su.data)
    for o = 0, n - 8, 8 do
      local tr = covering(self.traces, le_u64(su.data, o))
      if tr then lua = tr.name break end
    end
  end
  local chain = rec.callchain and #rec.callchain > 0 and sym:callchain(rec.callchain, rec.pid) or {}
  if #chain == 0 then chain[1] = sym:name(rec.ip, rec.pid) end
  if not lua then return chain, false end
  local out = {}
  for _, name in ipairs(chain) do
    if vm_frame(name) or name == "[unknown]" then break end
    out[#out + 1] = name
  end
  out[#out + 1] = lua
  return out, true
end

M.record_lua_child = record_lua_child

return M
