-- doc/coverage.md is the project's map of perf_event_open(2): one row per
-- item, its ID first.  Code and docs cite rows as "<the map's path> B7" (also
-- ranges, "C1-C7", "sections B-G", and lists, "A, C, G").  This spec keeps
-- the map and its citations honest: every citation names a row (or a
-- section), every spec file the map names exists and every test name it
-- quotes is a string of that file (or the start of one: a name built at run
-- time), and no file points at the feature list the map replaced.
local U = require("support.util")

local DOC = "doc/coverage.md"
-- built at run time, so that this file does not mention them itself
local GONE = { "CHECK" .. "LIST", "shared" .. "/spec" }

-- the rows and sections of the map: ids[ID], sections[letter]
local function rows(text)
  local ids, sections, dup = {}, {}, {}
  for line in text:gmatch("[^\n]+") do
    local sec = line:match("^## (%u)%. ")
    if sec then sections[sec] = true end
    local id = line:match("^| (%u%d+%l?) |")
    if id then
      if ids[id] then dup[#dup + 1] = id end
      ids[id] = true
    end
  end
  return ids, sections, dup
end

-- an ID at position i of s: "B7", "B11a" or a section letter "B"
-- (a capital followed by a letter or digit that is not an ID is a word)
local function id_at(s, i)
  local _, e, id = s:find("^(%u%d+%l?)%f[^%w]", i)
  if not id then _, e, id = s:find("^(%u)%f[^%w]", i) end
  return id, e
end

-- the separator after a cited ID at position i: a comma (the list may go on
-- on the next line, after a comment's leader) or " and "; its end, or nil
local function sep_at(s, i)
  local _, e, ws = s:find("^%s*,(%s*)", i)
  if e then
    if ws:find("\n", 1, true) then
      local _, e2 = s:find("^%-%-+%s*", e + 1)
      if not e2 then _, e2 = s:find("^[%*#]+%s*", e + 1) end
      e = e2 or e
    end
    return e
  end
  _, e = s:find("^%s+and%s+", i)
  return e
end

-- every citation of the map in text: an array of {from, to} (to = from for
-- a single ID), in order
local function citations(text)
  local out = {}
  local at = 1
  while true do
    local i, j = text:find(DOC, at, true)
    if not i then break end
    at = j + 1
    local _, e = text:find("^ +sections? +", j + 1)
    if not e then _, e = text:find("^ +", j + 1) end
    if e then
      local pos = e + 1
      while true do
        local id, ie = id_at(text, pos)
        if not id then break end
        local to, te = id, ie
        if text:sub(ie + 1, ie + 1) == "-" then
          local id2, e2 = id_at(text, ie + 2)
          if id2 then to, te = id2, e2 end
        end
        out[#out + 1] = { id, to }
        local se = sep_at(text, te + 1)
        if not se then break end
        pos = se + 1
      end
    end
  end
  return out
end

-- why the citation {from, to} does not resolve against ids/sections, or nil
local function unresolved(c, ids, sections)
  local from, to = c[1], c[2]
  local function known(id)
    if #id == 1 then return sections[id] end
    return ids[id]
  end
  if not known(from) then return from .. " is not a row or section of " .. DOC end
  if not known(to) then return to .. " is not a row or section of " .. DOC end
  if from == to then return nil end
  local l1, n1 = from:match("^(%u)(%d*)")
  local l2, n2 = to:match("^(%u)(%d*)")
  if (n1 == "") ~= (n2 == "") then return from .. "-" .. to .. " mixes a section and a row" end
  if n1 == "" then
    if l1 >= l2 then return from .. "-" .. to .. " is not an ascending range of sections" end
    for b = l1:byte(), l2:byte() do
      if not sections[string.char(b)] then return "section " .. string.char(b) .. " is missing" end
    end
    return nil
  end
  if l1 ~= l2 or tonumber(n1) >= tonumber(n2) then
    return from .. "-" .. to .. " is not an ascending range of one section"
  end
  for n = tonumber(n1), tonumber(n2) do
    if not ids[l1 .. n] then return l1 .. n .. " (in " .. from .. "-" .. to .. ") is not a row" end
  end
  return nil
end

-- the spec files and quoted test names of the map, line by line: an array
-- of {line=, file=, name=} (name nil: the file alone); code spans do not
-- count, and "\|" in a table cell is "|"
local function references(text)
  local out = {}
  local n = 0
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    local plain = line:gsub("`[^`]*`", ""):gsub("\\|", "|")
    local file
    local pos = 1
    while true do
      local fi, fe, f = plain:find("(spec/[%w_/%-]+%.lua)", pos)
      local qi, qe, q = plain:find('"([^"]*)"', pos)
      if not fi and not qi then break end
      if fi and (not qi or fi < qi) then
        file = f
        out[#out + 1] = { line = n, file = f }
        pos = fe + 1
      else
        out[#out + 1] = { line = n, file = file, name = q }
        pos = qe + 1
      end
    end
  end
  return out
end

-- the files of the checkout: git's list (tracked and new, not ignored), or
-- a walk of the tree without the build outputs where there is no git
local function project_files()
  local list = U.sh("git ls-files -co --exclude-standard 2>/dev/null")
  if list == "" then
    list = U.sh("find . -path ./.git -prune -o -path ./build -prune -o -path ./dist -prune " ..
                "-o -path ./doc/reference -prune -o -type f -print")
  end
  local out = {}
  for path in list:gmatch("[^\n]+") do out[#out + 1] = path:gsub("^%./", "") end
  return out
end

local doc = U.slurp(DOC)
local IDS, SECTIONS = rows(doc)

describe("doc/coverage.md", function()
  it("has each row once, and the sections A to K", function()
    local _, sections, dup = rows(doc)
    assert.same({}, dup)
    for b = ("A"):byte(), ("K"):byte() do
      assert.is_true(sections[string.char(b)], string.char(b))
    end
    local n = 0
    for _ in pairs(IDS) do n = n + 1 end
    assert.is_true(n > 300, n .. " rows")
  end)

  it("the citation reader finds IDs, ranges, lists and sections, and rejects what is no row", function()
    local function cited(s)
      local out = {}
      for _, c in ipairs(citations(s)) do
        out[#out + 1] = c[1] == c[2] and c[1] or c[1] .. "-" .. c[2]
      end
      return out
    end
    assert.same({ "G7" }, cited("see " .. DOC .. " G7 */"))
    assert.same({ "C1-C7" }, cited("(" .. DOC .. " C1-C7) and"))
    assert.same({ "B-G" }, cited("see " .. DOC .. " sections B-G;"))
    assert.same({ "A", "C", "G" }, cited("(" .. DOC .. " A, C,\n * G), the"))
    assert.same({ "D18-D21", "K24", "K25" }, cited("(" .. DOC .. " D18-D21, K24,\n-- K25)."))
    assert.same({ "B7", "H12", "H19" }, cited(DOC .. " B7, H12 and H19: x"))
    assert.same({ "I" }, cited("every errno of " .. DOC .. " I the kernel"))
    assert.same({}, cited("`" .. DOC .. "` (the map), " .. DOC .. " Items, " .. DOC .. "."))
    local bad = {}
    for _, s in ipairs({ DOC .. " B99", DOC .. " Z", DOC .. " C7-C1", DOC .. " A1-B2",
                         DOC .. " A-C1", DOC .. " A1, Q7" }) do
      local why
      for _, c in ipairs(citations(s)) do why = why or unresolved(c, IDS, SECTIONS) end
      bad[#bad + 1] = why or ("accepted: " .. s)
    end
    assert.same({ "B99 is not a row or section of " .. DOC, "Z is not a row or section of " .. DOC,
                  "C7-C1 is not an ascending range of one section",
                  "A1-B2 is not an ascending range of one section",
                  "A-C1 mixes a section and a row", "Q7 is not a row or section of " .. DOC }, bad)
    assert.is_nil(unresolved({ "B29", "B32a" }, IDS, SECTIONS))
  end)

  it("every citation of it in the project names one of its rows or sections", function()
    local bad, n = {}, 0
    for _, path in ipairs(project_files()) do
      local text = U.read(path)
      if text and text:find(DOC, 1, true) then
        for _, c in ipairs(citations(text)) do
          n = n + 1
          local why = unresolved(c, IDS, SECTIONS)
          if why then bad[#bad + 1] = path .. ": " .. why end
        end
      end
    end
    assert.same({}, bad)
    assert.is_true(n >= 30, n .. " citations")
  end)

  it("every spec file it names exists, and every test name it quotes is one of that file", function()
    local refs = references('a "b" `spec/x_spec.lua "c"` spec/y_spec.lua "d\\|e" "f"\n"g"')
    assert.same({ { line = 1, name = "b" }, { line = 1, file = "spec/y_spec.lua" },
                  { line = 1, file = "spec/y_spec.lua", name = "d|e" },
                  { line = 1, file = "spec/y_spec.lua", name = "f" }, { line = 2, name = "g" } }, refs)
    local bad, names, cache = {}, 0, {}
    for _, r in ipairs(references(doc)) do
      local where = DOC .. ":" .. r.line .. ": "
      if not r.file then
        bad[#bad + 1] = where .. "the test name \"" .. r.name .. "\" follows no spec file"
      else
        if cache[r.file] == nil then cache[r.file] = U.read(r.file) or false end
        local text = cache[r.file]
        if not text then
          bad[#bad + 1] = where .. r.file .. " does not exist"
        elseif r.name then
          names = names + 1
          -- a test's name, or the start of one its spec builds at run time
          if not text:find('"' .. r.name, 1, true) then
            bad[#bad + 1] = where .. "\"" .. r.name .. "\" is not in " .. r.file
          end
        end
      end
    end
    assert.same({}, bad)
    assert.is_true(names > 300, names .. " test names")
  end)

  it("no file of the project points at the feature list it replaced", function()
    local bad, n = {}, 0
    for _, path in ipairs(project_files()) do
      local text = U.read(path)
      if text then
        n = n + 1
        for _, word in ipairs(GONE) do
          if text:find(word, 1, true) then bad[#bad + 1] = path .. ": " .. word end
        end
      end
    end
    assert.same({}, bad)
    assert.is_true(n > 300, n .. " files")
  end)
end)
