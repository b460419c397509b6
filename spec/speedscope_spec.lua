-- perf_event.speedscope: JSON validated by python3-jsonschema against the
-- file-format schema speedscope publishes in its npm package (fetched with
-- `npm pack speedscope` into build/speedscope/ once, never committed), for a
-- pe.profile of spec/support/profile_work.lua and for luaperf record
-- --speedscope of build/test/petarget; the weights sum to the sample count.
local U = require("support.util")
local speedscope = require("perf_event.speedscope")

local jit = rawget(_G, "jit")
local LUA = U.lua_cmd()
local BUILD = os.getenv("PE_BUILD") or (jit and "build" or "build/" .. LUA)
local WORK = "spec/support/profile_work.lua"
local CACHE = "build/speedscope/file-format-schema.json"

local tmpdir = U.sh("mktemp -d 2>/dev/null"):gsub("%s+$", "")
local made = { tmpdir }   -- removed after the file's tests
teardown(function()
  for _, d in ipairs(made) do
    -- what mktemp -d made, in $TMPDIR or /tmp (tools/runtests as a user sets TMPDIR)
    if d:find("^/.*/tmp%.%w+$") then U.sh("rm -rf '" .. d .. "'") end
  end
end)

local readable = U.readable

-- the schema: cached, or fetched now from the npm registry (the package's
-- dist/release/file-format-schema.json); nil and why when it cannot be
local function schema()
  if readable(CACHE) then return CACHE end
  if U.sh("command -v npm 2>/dev/null") == "" then
    return nil, "needs npm to fetch speedscope's file-format-schema.json (npm pack speedscope)"
  end
  local dir = tmpdir .. "/npm"
  local out = U.sh(("mkdir -p %s build/speedscope && cd %s && env -u LD_PRELOAD HOME=%s "
    .. "npm_config_cache=%s/cache timeout 120 npm pack --silent speedscope 2>&1 && "
    .. "tar xzf speedscope-*.tgz package/dist/release/file-format-schema.json 2>&1")
    :format(dir, dir, dir, dir))
  local got = dir .. "/package/dist/release/file-format-schema.json"
  if not readable(got) then return nil, "npm pack speedscope failed (registry unreachable?): " .. out end
  U.sh(("cp %s %s.$$ && mv %s.$$ %s"):format(got, CACHE, CACHE, CACHE))
  return readable(CACHE) and CACHE or got
end

local have_jsonschema = U.sh("env -u LD_PRELOAD python3 -c 'import jsonschema' 2>&1; echo $?"):match("(%d+)%s*$") == "0"

-- "valid", or jsonschema's complaint
local function validate(json_path)
  local s, why = schema()
  U.need(s ~= nil, tostring(why))
  U.need(have_jsonschema, "needs python3-jsonschema (tools/debian-packages)")
  return (U.sh(("env -u LD_PRELOAD python3 -c 'import json,sys,jsonschema\n"
    .. "jsonschema.validate(json.load(open(sys.argv[1])), json.load(open(sys.argv[2])))\n"
    .. "print(\"valid\")' %s %s 2>&1"):format(json_path, s)):gsub("%s+$", ""))
end

-- python's reading of the file: total weight, frames, leaf weights
local function summary(json_path)
  local out = U.sh(("env -u LD_PRELOAD python3 -c 'import json,sys\n"
    .. "d=json.load(open(sys.argv[1])); p=d[\"profiles\"][0]; fr=d[\"shared\"][\"frames\"]\n"
    .. "print(\"total\", sum(p[\"weights\"]), len(fr), p[\"type\"], p[\"endValue\"])\n"
    .. "[print(\"frame\", f[\"name\"], f.get(\"file\",\"\"), f.get(\"line\",0)) for f in fr]\n"
    .. "[print(\"leaf\", fr[s[-1]][\"name\"], w) for s,w in zip(p[\"samples\"], p[\"weights\"]) if s]' %s 2>&1")
    :format(json_path))
  local r = { frames = {}, leaf = {}, text = out }
  -- each line read from its start: a frame named "Profile:_leaf" must not
  -- read as a "leaf" line
  out = "\n" .. out
  local total, n, typ, endv = out:match("\ntotal (%d+) (%d+) (%S+) (%d+)")
  r.total, r.nframes, r.type, r.endValue = tonumber(total), tonumber(n), typ, tonumber(endv)
  for name, file, line in out:gmatch("\nframe (%S+) (%S*) (%d+)") do
    r.frames[#r.frames + 1] = { name = name, file = file, line = tonumber(line) }
  end
  for name, w in out:gmatch("\nleaf (%S+) (%d+)") do r.leaf[name] = (r.leaf[name] or 0) + tonumber(w) end
  return r
end

local function write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

-- profile_work.lua in a child with pe.profile.start wrapped: the profile's
-- speedscope JSON and its aggregate ("count<TAB>key")
local WRAPPER = [=[
package.cpath = %q .. "/?.so;" .. package.cpath
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local pe = require("perf_event")
local prof = pe.profile
local start, kept = prof.start, nil
prof.start = function(o) local p, e = start(o) kept = kept or p return p, e end
local dir = %q
arg = { "jit", dir .. "/work.txt" }
dofile("spec/support/profile_work.lua")
local f = assert(io.open(dir .. "/p.json", "wb"))
f:write(require("perf_event.speedscope").from_profile(kept, { freq = 999, name = "profile_work" }))
f:close()
f = assert(io.open(dir .. "/agg.txt", "w"))
for _, e in ipairs(kept:aggregate()) do f:write(e.count, "\t", e.key, "\n") end
f:close()
]=]

local work
local function run_work()
  if work then return work end
  local dir = U.sh("mktemp -d"):gsub("%s+$", "")
  made[#made + 1] = dir
  write(dir .. "/wrap.lua", WRAPPER:format(BUILD, dir))
  local out = U.sh(("PE_WORK_SCALE=%s %s %s/wrap.lua 2>&1"):format(jit and "1" or "0.2", LUA, dir))
  work = { dir = dir, out = out, agg = {}, total = 0, leaf = {} }
  local af = assert(io.open(dir .. "/agg.txt"), out)
  for line in af:lines() do
    local n, key = line:match("^(%d+)\t(.*)$")
    n = tonumber(n)
    work.agg[key] = n
    work.total = work.total + n
    local leaf = key:match("([^;]+)$"):gsub("@[^@]*:%d+$", "")
    work.leaf[leaf] = (work.leaf[leaf] or 0) + n
  end
  af:close()
  return work
end

describe("speedscope.encode", function()
  it("writes a file the schema accepts, and the schema refuses a broken one", function()
    local t = { sample_types = { { type = "samples", unit = "count" } },
                samples = { { frames = { { name = "main", file = "a.lua", line = 1 },
                                         { name = "f \"q\"\n", file = "a.lua", line = 9 } }, values = { 5 } },
                            { frames = { { name = "main", file = "a.lua", line = 1 } }, values = { 2 } } } }
    local path = tmpdir .. "/unit.json"
    write(path, speedscope.encode(t))
    assert.equal("valid", validate(path))
    local r = summary(path)
    assert.equal(7, r.total)
    assert.equal(7, r.endValue)
    assert.equal(2, r.nframes)
    -- the same document without its weights is not a sampled profile
    write(path, (speedscope.encode(t):gsub(',"weights":%b[]', "")))
    local v = validate(path)
    assert.not_equal("valid", v)
    assert.truthy(v:find("jsonschema.exceptions.ValidationError", 1, true), v)
  end)

  it("raises for a caller's mistake", function()
    assert.has_error(function() speedscope.encode(nil) end)
    assert.has_error(function() speedscope.encode({ samples = { { frames = {} } } }) end)
    assert.has_error(function() speedscope.from_profile({}) end)
  end)
end)

describe("speedscope.from_profile of profile_work.lua's pe.profile", function()
  it("validates; its weights sum to the sample count, per leaf as p:aggregate()", function()
    local w = run_work()
    local path = w.dir .. "/p.json"
    assert.equal("valid", validate(path))
    local r = summary(path)
    assert.truthy(w.total > 0, w.out)
    assert.equal(w.total, r.total)
    assert.equal("sampled", r.type)
    assert.same(w.leaf, r.leaf)
    if jit then
      local seen = {}
      for _, f in ipairs(r.frames) do
        if f.file == WORK then seen[f.name] = true end
      end
      for _, fn in ipairs({ "alpha", "beta", "gamma" }) do
        assert.truthy(seen[fn], fn .. " is not a frame of " .. WORK .. ": " .. r.text)
      end
    end
  end)
end)

describe("luaperf record --speedscope", function()
  it("validates; its weights sum to the samples luaperf counted; pet_spin_inner is the hot leaf", function()
    local out = tmpdir .. "/rec.json"
    local msg = U.sh(("%s bin/luaperf record -g -F 999 --speedscope -o %s -- build/test/petarget spin 100000000 2>&1")
      :format(LUA, out))
    local n = tonumber(msg:match("luaperf record: (%d+) samples"))
    assert.truthy(n and n > 0, msg)
    assert.equal("valid", validate(out))
    local r = summary(out)
    assert.equal(n, r.total)
    assert.truthy((r.leaf.pet_spin_inner or 0) > n / 2, r.text)
    local lib
    for _, f in ipairs(r.frames) do if f.name == "pet_spin_inner" then lib = f.file end end
    assert.truthy(lib and lib:find("libpetarget%.so$"), tostring(lib))
  end)
end)
