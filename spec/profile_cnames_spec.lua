-- C functions named by their Lua name: a C function of a loaded module is
-- named `module.field` from package.loaded's tables, as the builtins are
-- (`cjson.encode`, `petest.xfunc`), not `[C@0x...]` or the name at the call
-- site, on LuaJIT (safe point) and PUC Lua (hook mode); the names reach
-- pprof and speedscope unchanged. Needs lua-cjson (tools/debian-packages).
local pe = require("perf_event")
local U = require("support.util")
local stats = require("support.stats")
local petest = require("petest")

local has_cjson, cjson = pcall(require, "cjson")

local function busy(seconds, fn)
  local c0 = os.clock()
  while os.clock() - c0 < seconds do fn() end
end

-- samples whose stack has `frame`, and the stacks naming a C function by
-- address, in p:folded()
local function count(text, frame)
  local n, anon = 0, {}
  for line in text:gmatch("([^\n]*)\n") do
    local stack, c = line:match("^(.*) (%d+)$")
    if (";" .. stack .. ";"):find(";" .. frame .. ";", 1, true) then n = n + tonumber(c) end
    if stack:find("[C@0x", 1, true) then anon[#anon + 1] = line end
  end
  return n, anon
end

describe("C functions of loaded modules", function()
  it("builtins() names them module.field by the address a frame holds", function()
    U.need(has_cjson, "lua-cjson is not installed (tools/debian-packages)")
    local names = pe.profile.builtins()
    local function addr(f)
      local h = (rawget(_G, "jit") and ("%p"):format(f) or tostring(f)):match("0x(%x+)")
      return tonumber(h, 16)
    end
    assert.equal("cjson.encode", names[addr(cjson.encode)])
    assert.equal("cjson.decode", names[addr(cjson.decode)])
    assert.equal("petest.xfunc", names[addr(petest.xfunc)])
    assert.equal("string.rep", names[addr(string.rep)])
    assert.equal("pcall", names[addr(pcall)])
  end)

  it("a workload in cjson.encode and petest.xfunc names both frames, in folded, pprof and speedscope", function()
    U.need(has_cjson, "lua-cjson is not installed (tools/debian-packages)")
    local doc = {}
    for i = 1, 2000 do doc[i] = { id = i, name = "item " .. i, tags = { "a", "b", "c" }, score = i / 7 } end
    local encode, xfunc = cjson.encode, petest.xfunc
    local p = assert(pe.profile.start({ event = "task-clock", freq = 999 }))
    local ok, err = pcall(function()
      busy(0.4, function() encode(doc) end)
      busy(0.3, function() xfunc(200000) end)
    end)
    p:stop()
    assert(ok, err)
    local text = p:folded({ lines = false })
    -- 0.4 s and 0.3 s of CPU at 999 Hz: about 400 and 300 samples
    local nenc, anon = count(text, "cjson.encode")
    local nx = count(text, "petest.xfunc")
    assert.is_true(nenc >= 200, ("%d samples in cjson.encode:\n%s"):format(nenc, text:sub(1, 3000)))
    assert.is_true(nx >= 150, ("%d samples in petest.xfunc:\n%s"):format(nx, text:sub(1, 3000)))
    assert.same({}, anon)
    -- the exporters take the frame's name as the function's
    local t = require("perf_event.pprof").profile_table(p)
    local pnames = {}
    for _, s in ipairs(t.samples) do
      for _, fr in ipairs(s.frames) do pnames[fr.name or ""] = true end
    end
    assert.is_true(pnames["cjson.encode"] and pnames["petest.xfunc"] or false)
    local json = require("perf_event.speedscope").from_profile(p)
    assert.is_truthy(json:find('"name":"cjson.encode"', 1, true))
    assert.is_truthy(json:find('"name":"petest.xfunc"', 1, true))
  end)

  it("a C function that calls back into Lua is named by its table name (table.sort)", function()
    local t = {}
    for i = 1, 3000 do t[i] = (i * 7919) % 3001 end
    local sort = table.sort
    local function cmp(a, b) return a < b end
    local p = assert(pe.profile.start({ event = "task-clock", freq = 999 }))
    local c0 = os.clock()
    local ok, err = pcall(function()
      busy(0.4, function()
        local c = {}
        for i = 1, #t do c[i] = t[i] end
        sort(c, cmp)
      end)
    end)
    local cpu = os.clock() - c0
    p:stop()
    assert(ok, err)
    local text = p:folded({ lines = false })
    -- (the Lua name at the call is the local `sort`: the table's name wins)
    local n = count(text, "table.sort")
    -- sorting with a Lua comparison is most of the window's CPU time: a
    -- quarter of what 999 Hz gives it, up to Poisson sampling, at least
    local enough, why = stats.count_at_least("samples under table.sort", n, 999 * cpu, 0.75)
    assert.is_true(enough, why .. "\n" .. text:sub(1, 3000))
    assert.equal(0, count(text, "sort"))
  end)
end)
