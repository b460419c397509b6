-- doc/api.md against the code, both ways: every module, function and
-- method it lists exists; every name a listed module exports and every
-- method of a listed class is listed (names starting with _ are private);
-- every module file it does not list says it is not a public interface.
local pe = require("perf_event")
local class = require("perf_event.class")
local U = require("support.util")

local slurp = U.slurp

-- sections: { kind = "module"|"class", name = ..., names = {set}, order = {...} }
local function parse_api(text)
  local sections, by, cur = {}, {}, nil
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    local kind, name = line:match("^## (%a+) `([%w_%.]+)`$")
    if kind then
      assert(kind == "module" or kind == "class", "doc/api.md: unknown section kind " .. kind)
      assert(not by[kind .. " " .. name], "doc/api.md: two sections for " .. name)
      cur = { kind = kind, name = name, names = {}, order = {} }
      sections[#sections + 1] = cur
      by[kind .. " " .. name] = cur
    elseif cur and line:match("^%- `") then
      local entry = line:match("^%- `([%w_%.:]+)")
      if cur.kind == "class" then
        local cls, m = entry:match("^([%w_]+):([%w_]+)$")
        assert(cls == cur.name, "doc/api.md: " .. entry .. " under class " .. cur.name)
        entry = m
      end
      assert(not cur.names[entry], "doc/api.md: " .. cur.name .. " lists " .. entry .. " twice")
      cur.names[entry] = true
      cur.order[#cur.order + 1] = entry
    end
  end
  return sections, by
end

local API = slurp("doc/api.md")
local sections, by = parse_api(API)

local function public_keys(t, pred)
  local out = {}
  for k, v in pairs(t) do
    if type(k) == "string" and not k:match("^_") and (not pred or pred(v)) then out[#out + 1] = k end
  end
  table.sort(out)
  return out
end

local sorted = U.sorted_keys

local function is_fn(v) return type(v) == "function" end

-- the exports of a module that loading would start something in: the keys
-- of its final `return { ... }`
local function returned_keys(path)
  local body = assert(slurp(path):match("\nreturn (%b{})%s*$"), path .. ": a final return { ... }")
  local set = {}
  for k in body:gmatch("([%a_][%w_]*)%s*=") do set[k] = true end
  return sorted(set)
end

-- loading perf_event.luamap starts writing /tmp/perf-PID.map: stop it and
-- remove the map when this spec loaded it
local function unload_luamap()
  local m = package.loaded["perf_event.luamap"]
  local st = m and m.running()
  if m then m.stop() end
  if st and st.path then os.remove(st.path) end
end

local STATIC = { ["perf_event.autoprofile"] = "lua/perf_event/autoprofile.lua" }

describe("doc/api.md", function()
  local had_luamap = package.loaded["perf_event.luamap"] ~= nil
  teardown(function() if not had_luamap then unload_luamap() end end)

  it("lists the public modules and classes", function()
    local mods, classes = 0, 0
    for _, s in ipairs(sections) do
      if s.kind == "module" then mods = mods + 1 else classes = classes + 1 end
      assert.is_true(#s.order > 0, s.name .. " lists nothing")
    end
    assert.is_true(mods >= 12, "modules: " .. mods)
    for _, c in ipairs({ "event", "group", "profile", "set", "symbolizer", "elf", "writer" }) do
      assert.is_truthy(by["class " .. c], "class " .. c)
    end
    assert.are.equal(7, classes)
  end)

  it("every module it lists exports exactly the names it lists", function()
    for _, s in ipairs(sections) do
      if s.kind == "module" then
        local exported
        if STATIC[s.name] then
          exported = returned_keys(STATIC[s.name])
        else
          local mod = require(s.name)
          assert.are.equal("table", type(mod), s.name)
          exported = public_keys(mod)
          -- perf_event's names loaded on first use (its LAZY table): a
          -- field only after that, each listed too
          if s.name == "perf_event" then
            local lazy = assert(slurp("lua/perf_event/init.lua"):match("\nlocal LAZY = (%b{})"),
                                "lua/perf_event/init.lua: no LAZY table")
            local n = 0
            for k in lazy:gmatch("([%a_][%w_]*) = function") do
              n = n + 1
              assert.is_not_nil(pe[k], "pe." .. k .. " (loaded on first use) is nil")
              exported[#exported + 1] = k
            end
            assert.is_true(n >= 3, n .. " names loaded on first use")
            local seen = {}
            for _, e in ipairs(exported) do seen[e] = true end
            exported = sorted(seen)
          end
        end
        local listed = sorted(s.names)
        for _, k in ipairs(listed) do
          if not k:match("^_") then
            local found = false
            for _, e in ipairs(exported) do found = found or e == k end
            assert(found, ("doc/api.md lists %s.%s, which the module does not export"):format(s.name, k))
          end
        end
        for _, e in ipairs(exported) do
          assert(s.names[e], ("%s exports %s, which doc/api.md does not list"):format(s.name, e))
        end
      end
    end
  end)

  it("every class it lists has exactly the methods it lists", function()
    local function check(name, methods)
      local s = assert(by["class " .. name], name)
      assert.are.same(sorted(s.names), public_keys(methods, is_fn))
    end
    check("event", pe.core.event_mt.__index)
    check("group", pe.core.group_mt.__index)
    check("group", class.weak_mt.__index)
    local p = assert(pe.profile.start({ event = "task-clock", freq = 99 }))
    local ok, err = pcall(check, "profile", getmetatable(p).__index)
    p:stop()
    assert(ok, err)
    local stat = require("perf_event.stat")
    local set = assert(stat.open({ "task-clock" }))
    ok, err = pcall(check, "set", getmetatable(set).__index)
    set:close()
    assert(ok, err)
    local symbols = require("perf_event.symbols")
    local sym = symbols.new()
    check("symbolizer", getmetatable(sym).__index)
    local elf = assert(symbols.read_elf("build/test/libpetarget.so"))
    check("elf", getmetatable(elf).__index)
    -- a perf.data writer, in a file of this run's own
    local path = os.tmpname()
    finally(function() os.remove(path) end)
    local ev = assert(pe.open({ type = 1, config = 9, name = "dummy", exclude_kernel = true }))
    local w = assert(require("perf_event.perfdata").create(path, { { ev = ev, evs = { ev }, name = "dummy" } }))
    ok, err = pcall(check, "writer", getmetatable(w).__index)
    w:close()
    ev:close()
    assert(ok, err)
  end)

  it("every module file it does not list says it is not a public interface", function()
    local files = U.sh("ls lua/perf_event/*.lua lua/perf_event/*/*.lua")
    local n = 0
    for path in files:gmatch("[^\n]+") do
      n = n + 1
      local name = path:gsub("^lua/", ""):gsub("%.lua$", ""):gsub("/init$", ""):gsub("/", ".")
      if not by["module " .. name] then
        local head = (slurp(path):match("^(.-)\n[^%-]") or ""):gsub("\n%-%-%s*", " "):lower()
        assert(head:find("not a public interface", 1, true),
               path .. ": neither in doc/api.md nor 'not a public interface' in its header")
      end
    end
    assert.is_true(n >= 30, "files: " .. n)
  end)

  it("the LDoc configuration covers every module doc/api.md lists", function()
    local ld = slurp("config.ld")
    for _, s in ipairs(sections) do
      if s.kind == "module" then
        local rel = s.name:gsub("%.", "/")
        local file = rel == "perf_event" and "lua/perf_event/init.lua" or
          (U.sh("ls lua/" .. rel .. "/init.lua 2>/dev/null") ~= "" and "lua/" .. rel .. "/init.lua"
           or "lua/" .. rel .. ".lua")
        assert(ld:find('"' .. file .. '"', 1, true) or ld:find('"lua/perf_event"', 1, true),
               "config.ld leaves out " .. file)
      end
    end
  end)
end)
