-- A Lua-level profile of this thread with pe.profile: Lua frames as
-- function@chunk:line, root first, C leaves from ELF symbols.
--   luajit examples/profile_lua.lua      (lua5.4 / lua5.1: C leaves only)
-- See doc/profiling.md.
local build = os.getenv("PE_BUILD") or (jit and "build" or ("build/" .. _VERSION:gsub("Lua ", "lua")))
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = build .. "/?.so;" .. package.cpath

local pe = require("perf_event")

local function checksum(n)           -- a hot loop of its own
  local s = 0
  for i = 1, n do s = (s * 31 + i) % 1000003 end
  return s
end

local function build_text(n)         -- string work in C (string.rep)
  local t = 0
  for i = 1, n do t = t + #string.rep("ab", 20000 + i % 7) end
  return t
end

local function run()
  for _ = 1, 10 do
    checksum(1e6)
    build_text(300)
  end
end

local p = assert(pe.profile.start({ event = "cpu-clock", freq = 999 }))
run()
p:stop()

print(("%d samples, mode %s%s"):format(p.nsamples, p.mode, p.reason and (" (" .. p.reason .. ")") or ""))
print("hottest (innermost Lua function, or the C leaf):")
for _, e in ipairs(p:top(5)) do print(("  %5.1f%%  %s"):format(e.share, e.name)) end
print("stacks (folded, root first):")
local n = 0
for line in p:folded():gmatch("[^\n]+") do
  n = n + 1
  if n > 6 then break end
  print("  " .. line)
end
