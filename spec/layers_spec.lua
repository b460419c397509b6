-- The Lua modules' require graph, read from the source (as cdeps_spec.lua
-- reads the C one from the objects): every lua/perf_event/**/*.lua and
-- bin/luaperf, each `require("perf_event...")` with a literal name, lazy
-- ones inside functions included, has no cycle.  And the sizes that keep a
-- file to one concern: no Lua file over 600 lines, no C file over 800, no
-- Lua function over 150.  Function extents come from a small Lua scanner
-- (strings, long strings and comments skipped; `function`/`if`/`do`/
-- `repeat` open a block, `end`/`until` close one), checked here against
-- `luac5.4 -p -l`, which prints each function's line range.
local U = require("support.util")

local MAX_LUA_FILE, MAX_C_FILE, MAX_LUA_FUNCTION = 600, 800, 150

local function listing(cmd)
  local t = {}
  for l in U.sh(cmd):gmatch("[^\n]+") do t[#t + 1] = l end
  table.sort(t)
  return t
end

local function lua_files()
  local t = listing("find lua/perf_event -name '*.lua'")
  t[#t + 1] = "bin/luaperf"
  return t
end

local function module_name(path)
  if path == "bin/luaperf" then return "bin/luaperf" end
  return (path:gsub("^lua/", ""):gsub("%.lua$", ""):gsub("/init$", ""):gsub("/", "."))
end

-- ---- a Lua scanner ------------------------------------------------------------
-- tokens: {k = "name"|"string"|"op", v = text or the string's value, line = n}

local function long_bracket(s, i)
  local eq = s:match("^%[(=*)%[", i)
  if not eq then return nil end
  local close = "]" .. eq .. "]"
  local j = s:find(close, i + #eq + 2, true)
  assert(j, "unfinished long bracket at byte " .. i)
  return s:sub(i + #eq + 2, j - 1), j + #close
end

local function tokens(s)
  local out, i, line, n = {}, 1, 1, #s
  if s:sub(1, 2) == "#!" then i = (s:find("\n", 1, true) or n) end
  local function count(from, to)
    local _, c = s:sub(from, to):gsub("\n", "")
    line = line + c
  end
  while i <= n do
    local c = s:sub(i, i)
    if c == "\n" then line = line + 1; i = i + 1
    elseif c:match("%s") then i = i + 1
    elseif s:sub(i, i + 1) == "--" then
      local _, after = long_bracket(s, i + 2)
      if after then count(i, after - 1); i = after
      else i = (s:find("\n", i, true) or n + 1) end
    elseif c == "[" and s:match("^%[=*%[", i) then
      local v, after = long_bracket(s, i)
      out[#out + 1] = { k = "string", v = v:gsub("^\n", ""), line = line }
      count(i, after - 1); i = after
    elseif c == '"' or c == "'" then
      local j, buf = i + 1, {}
      while true do
        local d = s:sub(j, j)
        assert(d ~= "" and d ~= "\n", "unfinished string at line " .. line)
        if d == "\\" then
          local e = s:sub(j + 1, j + 1)
          if e == "\n" then line = line + 1 end
          if e == "z" then j = s:find("%S", j + 2) or n + 1
          else buf[#buf + 1] = "\\" .. e; j = j + 2 end
        elseif d == c then break
        else buf[#buf + 1] = d; j = j + 1 end
      end
      out[#out + 1] = { k = "string", v = table.concat(buf), line = line }
      i = j + 1
    elseif c:match("[%a_]") then
      local w = s:match("^[%w_]+", i)
      out[#out + 1] = { k = "name", v = w, line = line }
      i = i + #w
    elseif c:match("%d") or (c == "." and s:match("^%.%d", i)) then
      local w = s:match("^0[xX][%x%.]*[pP][%+%-]?%d+", i) or s:match("^0[xX][%x%.]*", i)
        or s:match("^[%d%.]*[eE][%+%-]?%d+", i) or s:match("^[%d%.]+", i)
      i = i + #w
      local suffix = s:match("^[uUlLiI]+", i)     -- LuaJIT's 1ULL, 2LL, 3i
      if suffix then i = i + #suffix end
      out[#out + 1] = { k = "number", v = w, line = line }
    else
      local op = s:match("^%.%.%.", i) or s:match("^[=~<>]=", i) or s:match("^%.%.", i)
        or s:match("^::", i) or s:match("^//", i) or s:match("^<<", i) or s:match("^>>", i) or c
      out[#out + 1] = { k = "op", v = op, line = line }
      i = i + #op
    end
  end
  return out
end

-- each function's {first, last} line, as luac reports them
local function functions(toks)
  local stack, out = {}, {}
  for _, t in ipairs(toks) do
    if t.k == "name" then
      local w = t.v
      if w == "function" then stack[#stack + 1] = { fn = true, line = t.line }
      elseif w == "if" or w == "do" or w == "repeat" then stack[#stack + 1] = { line = t.line }
      elseif w == "end" or w == "until" then
        local b = assert(table.remove(stack), "unbalanced '" .. w .. "' at line " .. t.line)
        if b.fn then out[#out + 1] = { b.line, t.line } end
      end
    end
  end
  assert(#stack == 0, "unclosed block")
  return out
end

-- the modules a file requires: require("perf_event.x") / require "perf_event.x",
-- pcall(require, "perf_event.x"), a module's name as a table's value or a
-- list's item (require(SUB[cmd]) over a table of names), and calls of a local helper
-- `function h(name) return require("perf_event." .. name) end` with a literal
local function requires(toks, known, self)
  local out, seen = {}, { [self] = true }     -- a module naming itself (a message, a field) is no edge
  local function add(name, line)
    if known[name] and not seen[name] then
      seen[name] = true
      out[#out + 1] = { name = name, line = line }
    end
  end
  local helpers = {}
  for i, t in ipairs(toks) do
    local a, b, c, d, e = toks[i + 1], toks[i + 2], toks[i + 3], toks[i + 4], toks[i + 5]
    local before = toks[i - 1] and toks[i - 1].v
    if t.k == "string" and t.v:match("^perf_event[%w_.]*$")
       and (before == "require" or before == "(" and toks[i - 2] and toks[i - 2].v == "require"
            or before == "," or before == "=" or before == "{") then
      add(t.v, t.line)
    end
    -- local function h(name) return require("perf_event." .. name)
    if t.v == "function" and a and a.k == "name" and b and b.v == "(" and c and c.k == "name" and d and d.v == ")"
       and e and e.v == "return" and toks[i + 6] and toks[i + 6].v == "require" and toks[i + 7]
       and toks[i + 7].v == "(" and toks[i + 8] and toks[i + 8].k == "string" and toks[i + 9]
       and toks[i + 9].v == ".." and toks[i + 10] and toks[i + 10].v == c.v then
      helpers[a.v] = toks[i + 8].v
    end
  end
  for i, t in ipairs(toks) do
    local a, b, c = toks[i + 1], toks[i + 2], toks[i + 3]
    if t.k == "name" and helpers[t.v] and a and a.v == "(" and b and b.k == "string" and c and c.v == ")"
       and (i == 1 or toks[i - 1].v ~= "function") then
      add(helpers[t.v] .. b.v, t.line)
    end
  end
  return out
end

local find_cycle = U.find_cycle

local function scan_all()
  local files, known = {}, {}
  for _, path in ipairs(lua_files()) do
    known[module_name(path)] = path
  end
  for _, path in ipairs(lua_files()) do
    local src = assert(U.read(path), path)
    local toks = tokens(src)
    local name = module_name(path)
    files[path] = { name = name, toks = toks, src = src, requires = requires(toks, known, name),
                    functions = functions(toks) }
  end
  return files, known
end

describe("the Lua require graph", function()
  local files, known = scan_all()

  it("reads every module and the requires it makes", function()
    local n = 0
    for _ in pairs(files) do n = n + 1 end
    assert.is_true(n >= 30, "files: " .. n)
    local function edges(path)
      local t = {}
      for _, r in ipairs(files[path].requires) do t[#t + 1] = r.name end
      table.sort(t)
      return t
    end
    -- a top-level require, a lazy one inside a function, pcall(require, ...)
    -- and a helper's literal: each seen, none from a comment
    assert.are.same({ "perf_event.fast", "perf_event.native", "perf_event.records" }, edges("lua/perf_event/class.lua"))
    local stat = {}
    for _, m in ipairs(edges("lua/perf_event/stat.lua")) do stat[m] = true end
    assert.is_true(stat["perf_event.resolve"] and stat["perf_event.pmu"] and stat["perf_event.fs"], "stat.lua")
    local init = {}
    for _, m in ipairs(edges("lua/perf_event/init.lua")) do init[m] = true end
    assert.is_true(init["perf_event.resolve"] and init["perf_event.pmu"], "init.lua's mod(...)")
    local cli = {}
    for _, m in ipairs(edges("lua/perf_event/cli.lua")) do cli[m] = true end
    assert.is_true(cli["perf_event.cli.record"] and cli["perf_event.cli.stat"], "cli.lua's SUB table")
    assert.are.same({ "perf_event.cli", "perf_event.core" }, edges("bin/luaperf"))
  end)

  it("the scanner skips comments and strings, and measures functions as luac does", function()
    local src = table.concat({
      '#!/usr/bin/env lua',
      '-- require("perf_event.a") in a comment',
      '--[==[ require("perf_event.b")',
      ']==] local s = [[ require("perf_event.c") ]]',
      'local t = "require(\\"perf_event.d\\")"',
      'local function f()',
      '  if s then return require("perf_event.e") end',
      '  for i = 1, 2 do repeat local x = i until x end',
      'end',
      'local g = function() return pcall(require, "perf_event.f") end',
      'local SUB = { x = "perf_event.g" }',
    }, "\n")
    local names = {}
    for c in ("abcdefg"):gmatch(".") do names["perf_event." .. c] = true end
    local toks = tokens(src)
    local got = {}
    for _, r in ipairs(requires(toks, names, "self")) do got[#got + 1] = r.name .. "@" .. r.line end
    table.sort(got)
    assert.are.same({ "perf_event.e@7", "perf_event.f@10", "perf_event.g@11" }, got)
    assert.are.same({ { 6, 9 }, { 10, 10 } }, functions(toks))
  end)

  it("the cycle finder reports a cycle it is given, and none in a chain", function()
    assert.same({ "a", "b", "c", "a" }, find_cycle({ a = { b = true }, b = { c = true }, c = { a = true } }))
    assert.is_nil(find_cycle({ a = { b = true }, b = { c = true }, c = {} }))
  end)

  it("has no cycle", function()
    local g = {}
    for path, f in pairs(files) do
      g[f.name] = g[f.name] or {}
      for _, r in ipairs(f.requires) do g[f.name][r.name] = path .. ":" .. r.line end
    end
    local c = find_cycle(g)
    if c then
      local via = {}
      for i = 1, #c - 1 do via[#via + 1] = c[i] .. " -> " .. c[i + 1] .. " (" .. g[c[i]][c[i + 1]] .. ")" end
      error("require cycle: " .. table.concat(c, " -> ") .. "\n  " .. table.concat(via, "\n  "))
    end
    for name in pairs(known) do assert.is_table(g[name], name) end
  end)
end)

describe("sizes", function()
  local files = scan_all()

  it("no Lua file over " .. MAX_LUA_FILE .. " lines", function()
    local bad = {}
    for path, f in pairs(files) do
      local _, n = f.src:gsub("\n", "")
      if n > MAX_LUA_FILE then bad[#bad + 1] = path .. ": " .. n end
    end
    table.sort(bad)
    assert.are.same({}, bad)
  end)

  it("no C file over " .. MAX_C_FILE .. " lines", function()
    local bad, n = {}, 0
    for _, path in ipairs(listing("find csrc -name '*.c'")) do
      n = n + 1
      local _, lines = assert(U.read(path)):gsub("\n", "")
      if lines > MAX_C_FILE then bad[#bad + 1] = path .. ": " .. lines end
    end
    assert.is_true(n >= 20, "C files: " .. n)
    assert.are.same({}, bad)
  end)

  it("no C function over " .. MAX_LUA_FUNCTION .. " lines", function()
    -- a function's body: from a '{' alone at the start of a line (the
    -- house style's definitions) to the next '}' there
    local bad, seen = {}, 0
    for _, path in ipairs(listing("find csrc spec/support -name '*.c'")) do
      local open_at, ln = nil, 0
      for line in (assert(U.read(path)) .. "\n"):gmatch("([^\n]*)\n") do
        ln = ln + 1
        if line == "{" then open_at = ln
        elseif line == "}" and open_at then
          seen = seen + 1
          if ln - open_at - 1 > MAX_LUA_FUNCTION then
            bad[#bad + 1] = ("%s:%d: %d lines"):format(path, open_at, ln - open_at - 1)
          end
          open_at = nil
        end
      end
    end
    assert.is_true(seen >= 300, "C functions: " .. seen)
    assert.are.same({}, bad)
  end)

  it("no Lua function over " .. MAX_LUA_FUNCTION .. " lines", function()
    local bad = {}
    for path, f in pairs(files) do
      for _, r in ipairs(f.functions) do
        local n = r[2] - r[1] + 1
        if n > MAX_LUA_FUNCTION then
          bad[#bad + 1] = ("%s:%d-%d: %d lines"):format(path, r[1], r[2], n)
        end
      end
    end
    table.sort(bad)
    assert.are.same({}, bad)
  end)

  it("the scanner finds the functions luac5.4 -p -l reports, with the same lines", function()
    if U.sh("command -v luac5.4") == "" then pending("no luac5.4") return end
    local checked = 0
    for path, f in pairs(files) do
      local want = {}
      for a, b in U.sh("luac5.4 -p -l " .. path .. " 2>&1"):gmatch("\nfunction <[^:]+:(%d+),(%d+)>") do
        want[#want + 1] = a .. "," .. b
      end
      local got = {}
      for _, r in ipairs(f.functions) do got[#got + 1] = r[1] .. "," .. r[2] end
      table.sort(want)
      table.sort(got)
      assert.are.same(want, got, path)
      checked = checked + 1
    end
    assert.is_true(checked >= 30)
  end)
end)
