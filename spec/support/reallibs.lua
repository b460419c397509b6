-- Real libraries as workloads (Debian's lua-markdown, lua-dkjson,
-- lua-messagepack, lua-cosmo, lua-penlight, lua-cjson), each called from a
-- top-level function of its own, in rounds under pe.profile; prints, per
-- workload, its os.clock time and the samples whose stack holds its
-- function, then the samples in all and those without a Lua frame (each
-- such stack also on a line of its own, for the spec's message):
--   w NAME SECONDS SAMPLES
--   kernel yes | kernel WHY-NOT   (whether the profile samples kernel time)
--   total SAMPLES NOLUA
-- Run by spec/profile_reallibs_spec.lua:  INTERP reallibs.lua BUILD SECONDS
local build, seconds = arg[1], tonumber(arg[2]) or 2
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = build .. "/?.so;" .. package.cpath
local pe = require("perf_event")

local libs = {}
for _, m in ipairs({ "markdown", "dkjson", "MessagePack", "cosmo", "pl.pretty", "pl.stringx", "cjson" }) do
  local ok, mod = pcall(require, m)
  if ok and type(mod) == "table" or type(mod) == "function" then libs[m] = mod end
end

-- the inputs, made once
local doc = {}
for i = 1, 40 do
  doc[#doc + 1] = ("## Section %d\n\nSome *emphasis*, a [link](http://x/%d) and `code`.\n\n- one\n- two\n"):format(i, i)
end
doc = table.concat(doc, "\n")
local data = {}
for i = 1, 200 do data[i] = { id = i, name = "item" .. i, tags = { "a", "b", "c" }, score = i * 1.5 } end
local template = "$do_items[[<li>$name ($id): $score</li>\n]]"
local items = {}
for i = 1, 100 do items[i] = { name = "n" .. i, id = i, score = i / 3 } end

local W = {}
local order = {}
local function def(name, f) W[name] = f order[#order + 1] = name end

if libs.markdown then
  local md = libs.markdown
  def("w_markdown", function() return #md(doc) end)
end
if libs.dkjson then
  local json = libs.dkjson
  def("w_dkjson", function() return #json.decode(json.encode(data)) end)
end
if libs.MessagePack then
  local mp = libs.MessagePack
  def("w_msgpack", function()
    local n = 0
    for _ = 1, 4 do n = n + #mp.unpack(mp.pack(data)) end
    return n
  end)
end
if libs.cosmo then
  local cosmo = libs.cosmo
  def("w_cosmo", function()
    local n = 0
    for _ = 1, 3 do
      n = n + #cosmo.fill(template, { do_items = function() for _, it in ipairs(items) do cosmo.yield(it) end end })
    end
    return n
  end)
end
if libs["pl.pretty"] then
  local pretty, stringx = libs["pl.pretty"], libs["pl.stringx"]
  def("w_penlight", function()
    local s = pretty.write(data)
    local n = 0
    for _, line in ipairs(stringx.splitlines(s)) do n = n + #stringx.strip(line) end
    return n
  end)
end
if libs.cjson then
  local cjson = libs.cjson
  def("w_cjson", function()
    local n = 0
    for _ = 1, 30 do n = n + #cjson.decode(cjson.encode(data)) end
    return n
  end)
end

-- each workload's share of the time is set by how often a round calls it:
-- unequal on purpose, so that a profile that spreads samples evenly fails
local reps = {}
for i, name in ipairs(order) do reps[name] = i end

-- calibrate: one call of each, so that a round takes ~20 ms
local cost = {}
for _, name in ipairs(order) do
  local t0 = os.clock()
  local k = 0
  repeat W[name]() k = k + 1 until os.clock() - t0 > 0.01
  cost[name] = (os.clock() - t0) / k
end
local round = 0
for _, name in ipairs(order) do round = round + cost[name] * reps[name] end
local scale = 0.02 / round

local spent = {}
for _, name in ipairs(order) do spent[name] = 0 end
local p = assert(pe.profile.start({ event = "task-clock", freq = 999 }))
local t_start = os.clock()
while os.clock() - t_start < seconds do
  for _, name in ipairs(order) do
    local n = math.max(1, math.floor(reps[name] * scale + 0.5))
    local f = W[name]
    local t0 = os.clock()
    for _ = 1, n do f() end
    spent[name] = spent[name] + (os.clock() - t0)
  end
  p:drain()
end
p:stop()

-- a workload's frames: its function's first line in this chunk (a frame
-- is named by its call site, here a local `f`)
local by_line = {}
for _, name in ipairs(order) do by_line[debug.getinfo(W[name], "S").linedefined] = name end
local hits, total, nolua = {}, 0, 0
for _, name in ipairs(order) do hits[name] = 0 end
for _, e in ipairs(p:aggregate({ lines = false })) do
  total = total + e.count
  local lua, seen = false, {}
  for _, fr in ipairs(e.frames) do
    if fr.lua then
      lua = true
      local fname = fr.lua.chunk and fr.lua.chunk:find("reallibs%.lua$") and by_line[fr.lua.linedefined]
      if fname and not seen[fname] then
        seen[fname] = true
        hits[fname] = hits[fname] + e.count
      end
    end
  end
  if not lua then
    nolua = nolua + e.count
    local t = {}
    for _, fr in ipairs(e.frames) do t[#t + 1] = tostring(fr.c) .. "@" .. tostring(fr.module) end
    io.write("nolua ", e.count, " ", table.concat(t, ";"), "\n")
  end
end
for _, name in ipairs(order) do
  io.write(("w %s %.6f %d\n"):format(name, spent[name], hits[name]))
end
io.write(("kernel %s\n"):format(p.kernel and "yes" or tostring(p.kernel_reason)))
io.write(("total %d %d\n"):format(total, nolua))
