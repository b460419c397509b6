-- Shared helpers for the specs: tracefs ids, fd/mapping counts, byte
-- packing that works on Lua 5.1 (no string.pack) and exact 64-bit checks.
local U = {}

function U.tracefs()
  for _, d in ipairs({ "/sys/kernel/tracing", "/sys/kernel/debug/tracing" }) do
    local f = io.open(d .. "/events/syscalls/sys_enter_getppid/id")
    if f then f:close() return d end
  end
end

--- the numeric id of a tracepoint, read straight from tracefs
function U.tp_id(sys, name)
  local root = U.tracefs()
  if not root then return nil end
  local f = io.open(("%s/events/%s/%s/id"):format(root, sys, name))
  if not f then return nil end
  local id = tonumber(f:read("*l"))
  f:close()
  return id
end

--- package.searchpath for Lua 5.1 too
function U.searchpath(name, path)
  local file = name:gsub("%.", "/")
  for tmpl in path:gmatch("[^;]+") do
    local cand = tmpl:gsub("%?", file)
    local f = io.open(cand)
    if f then f:close() return cand end
  end
end

--- the test-only simulators (spec/support/pesim.c, built by `make fixtures`
-- into build/test/<lua>/pesim.so): sim_ring{...} makes an event over a ring
-- of chosen bytes that the core's records()/aux()/poll() drain;
-- userpage_sim{...} runs the user-page read on a scripted page.  Every spec
-- reaches them through here.
function U.sim()
  if not U._sim then U._sim = require("pesim") end
  return U._sim
end

function U.is_root()
  local f = io.open("/proc/self/status")
  local s = f:read("*a")
  f:close()
  return s:match("\nUid:%s+0%s") ~= nil
end

--- perf_event fds of this process, after a full GC has closed dropped
-- events (other fds may come and go: pipes of io.popen, children reaped by
-- other specs)
function U.count_perf_fds()
  collectgarbage(); collectgarbage()
  local p = io.popen("ls -l /proc/" .. U.pid() .. "/fd | grep -c 'anon_inode:\\[perf_event\\]'")
  local n = tonumber(p:read("*l"))
  p:close()
  return n
end

function U.count_perf_maps()
  local f = io.open("/proc/" .. U.pid() .. "/maps")
  local n = 0
  for line in f:lines() do
    if line:find("perf_event", 1, true) then n = n + 1 end
  end
  f:close()
  return n
end

--- our own pid (not the shell's): /proc/self/stat read by this process
function U.pid()
  if not U._pid then
    local f = io.open("/proc/self/stat")
    U._pid = tonumber(f:read("*l"):match("^(%d+)"))
    f:close()
  end
  return U._pid
end

--- little-endian u64 bytes of a value given as a non-negative number < 2^53
function U.le64(n)
  local t = {}
  for i = 1, 8 do
    t[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(t)
end

--- hex of the little-endian integer in s[off+1 .. off+len]
function U.hex_at(s, off, len)
  local t = {}
  for i = off + len, off + 1, -1 do
    t[#t + 1] = ("%02x"):format(s:byte(i))
  end
  return (table.concat(t):gsub("^0+(.)", "%1"))
end

--- a 64-bit value the core returned, as a hex string (all versions)
function U.hex(v)
  if type(v) == "string" then return (v:gsub("^0x", "")) end
  if type(v) == "cdata" then return ("%x"):format(v) end
  local mtype = rawget(math, "type")
  if mtype and mtype(v) == "integer" then return ("%x"):format(v) end
  return ("%x"):format(v)
end

function U.root_or_pending()
  if not U.is_root() then
    pending("needs root (CAP_SYS_ADMIN / CAP_PERFMON)")
    return false
  end
  return true
end

function U.lua_cmd()
  if jit then return "luajit" end
  return (_VERSION:gsub("Lua ", "lua"))
end

-- The attr blocks of `perf ... -vv` output: an array of
-- { fields = {name = text}, opens = {"sys_perf_event_open..." lines after
-- the block}, failed = true when one of them failed }
function U.perf_attr_blocks(out)
  local blocks, cur, in_attr = {}, nil, false
  for line in out:gmatch("[^\n]+") do
    if line == "perf_event_attr:" then
      cur = { fields = {}, opens = {} }
      blocks[#blocks + 1] = cur
      in_attr = true
    elseif line:find("^%-%-%-%-") then
      in_attr = false
    elseif cur and in_attr then
      local k, v = line:match("^  (.-)%s%s+(%S+)$")
      if k then cur.fields[k] = v end
    elseif cur and line:find("^sys_perf_event_open") then
      cur.opens[#cur.opens + 1] = line
      if line:find("^sys_perf_event_open failed") then cur.failed = true end
    end
  end
  return blocks
end

return U
