-- The C files' call graph, read from the objects the build made (nm: each
-- object's undefined symbols against the others' defined ones): no cycle,
-- and every call goes down the file order stated in csrc/pe_core.h.  And
-- what core.so exports: exactly luaopen_* and the pe_fast_* FFI entries
-- (-fvisibility=hidden); the simulators live in pesim.so, not core.so.
local U = require("support.util")

local suite = os.getenv("PE_SUITE") or (jit and "luajit" or _VERSION:gsub("Lua ", "lua"))
local objdir = "build/obj/" .. suite
local build = os.getenv("PE_BUILD") or (jit and "build" or "build/" .. _VERSION:gsub("Lua ", "lua"))

local function lines(cmd)
  local p = assert(io.popen(cmd))
  local t = {}
  for l in p:lines() do t[#t + 1] = l end
  p:close()
  return t
end

-- the objects of csrc/*.c and of its subsystem folders (csrc/lj/*.c, csrc/puc/*.c)
local function objects()
  local t = {}
  for _, path in ipairs(lines("ls " .. objdir .. "/*.o " .. objdir .. "/*/*.o 2>/dev/null")) do
    t[#t + 1] = path
  end
  table.sort(t)
  return t
end

-- file (its path under csrc without .c: "event", "lj/walk") -> {def = set, undef = set}
local function symbols()
  local files = {}
  for _, path in ipairs(objects()) do
    local name = path:sub(#objdir + 2):match("^(.+)%.o$")
    local f = { def = {}, undef = {} }
    for _, l in ipairs(lines("nm " .. path)) do
      local kind, sym = l:match("^%s*%x*%s+(%a)%s+(%S+)$")
      if kind == "U" then f.undef[sym] = true
      elseif kind and kind:match("[TDBRVW]") then f.def[sym] = true end
    end
    files[name] = f
  end
  return files
end

-- caller -> {callee = "a symbol it uses"}
local function graph(files)
  local owner = {}
  for name, f in pairs(files) do
    for sym in pairs(f.def) do owner[sym] = name end
  end
  local g = {}
  for name, f in pairs(files) do
    g[name] = {}
    for sym in pairs(f.undef) do
      local o = owner[sym]
      if o and o ~= name then g[name][o] = sym end
    end
  end
  return g
end

local find_cycle = U.find_cycle

-- the order pe_core.h states: file -> its line in the diagram (1 = top)
local function stated_levels()
  local f = assert(io.open("csrc/pe_core.h"))
  local s = f:read("*a")
  f:close()
  local block = s:match("Dependency direction.-\n%s*%*%s*\n(.-)\n%s*%*%s*\n")
  local level, n = {}, 0
  for line in block:gmatch("[^\n]+") do
    local found = false
    -- the files are the first column; a description follows two spaces
    local names = line:match("^%s*%*%s+(.-%.c)%s%s") or line:match("^%s*%*%s+(.-%.c)%s*$") or ""
    for name in names:gmatch("([%w_/]+)%.c") do
      if not found then n = n + 1; found = true end
      level[name] = n
    end
  end
  return level
end

describe("C file dependencies", function()
  local files = symbols()
  local have = next(files) ~= nil

  it("finds the objects of this build (" .. objdir .. ")", function()
    assert.is_true(have, "no objects in " .. objdir .. ": run make")
    for _, n in ipairs({ "lifecycle", "group", "layouts", "event", "ring", "fast", "userpage", "lj/layout" }) do
      assert.is_table(files[n], n .. ".o")
    end
  end)

  it("the cycle finder reports a cycle it is given, and none in a chain", function()
    local c = find_cycle({ a = { b = "x" }, b = { c = "y" }, c = { a = "z" } })
    assert.same({ "a", "b", "c", "a" }, c)
    assert.is_nil(find_cycle({ a = { b = "x" }, b = { c = "y" }, c = {} }))
    assert.same({ "a", "b", "a" }, find_cycle({ a = { b = "x" }, b = { a = "y" } }))
  end)

  it("has no cycle between C files", function()
    if not have then return pending("no objects") end
    local g = graph(files)
    local c = find_cycle(g)
    if c then
      local steps = {}
      for i = 1, #c - 1 do
        steps[#steps + 1] = ("%s.c -> %s.c (%s)"):format(c[i], c[i + 1], g[c[i]][c[i + 1]])
      end
      error("call cycle: " .. table.concat(steps, ", "))
    end
    -- the old cycle event.c <-> ring.c <-> fast.c <-> userpage.c is gone
    assert.is_nil(g.ring.event)
    assert.is_nil(g.userpage.event)
    assert.is_nil(g.lifecycle.ring)
    assert.is_nil(g.lifecycle.fast)
  end)

  it("calls only go down the file order stated in csrc/pe_core.h", function()
    if not have then return pending("no objects") end
    local level = stated_levels()
    local g = graph(files)
    for name in pairs(files) do
      assert.is_number(level[name], name .. ".c is missing from pe_core.h's dependency diagram")
    end
    for caller, callees in pairs(g) do
      for callee, sym in pairs(callees) do
        assert(level[caller] < level[callee],
               ("%s.c (line %d) calls %s.c (line %d) through %s: up or sideways in pe_core.h's order")
               :format(caller, level[caller], callee, level[callee], sym))
      end
    end
  end)
end)

describe("LuaJIT's layout", function()
  local files = symbols()

  it("has one owner, lj/layout.c, that the other LuaJIT readers call", function()
    if not files["lj/layout"] then return pending("no lj/layout.o in " .. objdir) end
    -- (compiled against 5.1's headers on x86-64 only: Lua 5.4's objects are empty)
    if not (files["lj/signal"] and files["lj/signal"].def.ls_handler) then
      return pending("no safe point in a core for " .. suite)
    end
    local g = graph(files)
    -- global_State's scan, the frame links, traces and lines: defined there only
    for _, sym in ipairs({ "lj_g_find", "lj_frame_prev", "lj_cfunc_at", "lj_trace_pc", "lj_pc_line",
                           "lj_find_traces" }) do
      for name, f in pairs(files) do
        if f.def[sym] then assert.equal("lj/layout", name, sym .. " defined in " .. name) end
      end
      assert.truthy(files["lj/layout"].def[sym], sym)
    end
    -- the safe point's handler, capture and arming, and the hook repair, read through it
    for _, reader in ipairs({ "lj/signal", "lj/walk", "lj/arm", "lj/hook" }) do
      assert.truthy(g[reader] and g[reader]["lj/layout"], reader .. ".c does not call lj/layout.c")
    end
  end)
end)

describe("exported symbols", function()
  local function dynsyms(so)
    local t = {}
    for _, l in ipairs(lines("nm -D --defined-only " .. so .. " 2>/dev/null")) do
      local kind, sym = l:match("^%x*%s+(%a)%s+(%S+)$")
      if kind and kind:match("[TDBRVW]") and not sym:match("^_") then t[#t + 1] = sym end
    end
    table.sort(t)
    return t
  end

  -- the PE_EXPORT prototypes of csrc: what may be exported
  local function declared()
    local t = {}
    local seen = {}
    for _, l in ipairs(lines("grep -h '^PE_EXPORT ' csrc/*.c csrc/*.h")) do
      local name = l:match("([%w_]+)%(")
      if name and not seen[name] then seen[name] = true; t[#t + 1] = name end
    end
    table.sort(t)
    return t
  end

  it("core.so exports exactly luaopen_perf_event_core and the pe_fast_* entries", function()
    local got = dynsyms(build .. "/perf_event/core.so")
    assert.is_true(#got > 0, "nm -D found nothing in " .. build .. "/perf_event/core.so")
    assert.same(declared(), got)
    local fast = 0
    for _, s in ipairs(got) do
      assert.truthy(s == "luaopen_perf_event_core" or s:match("^pe_fast_"), s)
      if s:match("^pe_fast_") then fast = fast + 1 end
    end
    assert.equal(6, fast)    -- read, ioctl, group_read, group_ioctl, scale, token
  end)

  local TEST_ONLY = { "ljhook_tear", "ljhook_signal", "ljhook_find", "ljhook_repairs", "luasafe_signal",
                      "luasafe_cover" }
  it("what the specs do to LuaJIT on purpose is in ljtest.so, not in core.so", function()
    local core = require("perf_event.core")
    local P = core._private
    for _, name in ipairs(TEST_ONLY) do
      assert.is_nil(P[name], "core._private." .. name)
      assert.is_nil(core[name], "core." .. name)
    end
    -- (core.so's own entries of the safe point and the hook stay)
    assert.is_function(P.luasafe_take)
    assert.is_function(P.ljhook_stats)
    if not jit then return end
    local dir = (build:match("asan$") and "build/test/asan") or "build/test/" .. suite
    assert.same({ "luaopen_ljtest" }, dynsyms(dir .. "/ljtest.so"))
    local T = require("ljtest")
    for _, name in ipairs(TEST_ONLY) do
      assert.is_function(T[name], "ljtest." .. name)
    end
  end)

  it("pesim.so exports only luaopen_pesim, and core has no simulator", function()
    local dir = "build/test/" .. suite
    assert.same({ "luaopen_pesim" }, dynsyms(dir .. "/pesim.so"))
    local core = require("perf_event.core")
    assert.is_nil(core.sim_ring)
    assert.is_nil(core.sim_ring_write)
    assert.is_nil(core._userpage_sim)
    assert.is_function(U.sim().sim_ring)
    assert.is_function(U.sim().userpage_sim)
  end)
end)
