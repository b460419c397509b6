-- perf_event.pprof: profiles written as pprof's profile.proto and read back
-- by the real reader, Debian golang-go's `go tool pprof` (-raw, -top): a
-- pe.profile of spec/support/profile_work.lua's hot functions (its stacks
-- and counts equal p:aggregate()'s), luaperf record --pprof of
-- build/test/petarget (pet_spin_inner under pet_spin under main, at
-- addresses nm puts in pet_spin_inner, in a mapping whose build-id is
-- readelf's), gzipped by lua-zlib, by libz through the FFI, and plain.
local U = require("support.util")
local stats = require("support.stats")
local pprof = require("perf_event.pprof")

local jit = rawget(_G, "jit")
local LUA = U.lua_cmd()
local BUILD = os.getenv("PE_BUILD") or (jit and "build" or "build/" .. LUA)
local WORK = "spec/support/profile_work.lua"

local have_go = U.sh("command -v go 2>/dev/null") ~= ""
local tmpdir = U.sh("mktemp -d 2>/dev/null"):gsub("%s+$", "")
local made = { tmpdir }   -- removed after the file's tests
teardown(function()
  for _, d in ipairs(made) do
    -- what mktemp -d made, in $TMPDIR or /tmp (tools/runtests as a user sets TMPDIR)
    if d:find("^/.*/tmp%.%w+$") then U.sh("rm -rf '" .. d .. "'") end
  end
end)

-- the Go tools under a temporary HOME and GOCACHE, without the ASan run's
-- LD_PRELOAD (go is not built for it); -symbolize=none: the names as
-- written (pprof would demangle the C++ names of ASan's interceptors)
local function go_pprof(args)
  return U.sh(("env -u LD_PRELOAD HOME=%s GOCACHE=%s/gocache go tool pprof -symbolize=none %s 2>&1")
    :format(tmpdir, tmpdir, args))
end

local function need_go()
  U.need(have_go, "needs `go tool pprof` (Debian golang-go; tools/debian-packages)")
end

local slurp = U.slurp

-- `go tool pprof -raw`: { locs = {id = {addr=, mapping=, name=, file=, line=, start=}},
--   samples = { {values = {...}, ids = {leaf first}} }, mappings = {id = {...}}, head = text }
local function raw(path)
  local out = go_pprof("-raw " .. path)
  local r = { locs = {}, samples = {}, mappings = {}, text = out }
  local section
  for line in out:gmatch("[^\n]+") do
    if line == "Samples:" then section = "samples"
    elseif line == "Locations" then section = "locs"
    elseif line == "Mappings" then section = "maps"
    elseif section == "samples" then
      local vals, ids = line:match("^%s*([%d%s]-%d):%s*([%d%s]*)$")
      if vals then
        local s = { values = {}, ids = {} }
        for v in vals:gmatch("%d+") do s.values[#s.values + 1] = tonumber(v) end
        for v in ids:gmatch("%d+") do s.ids[#s.ids + 1] = tonumber(v) end
        r.samples[#r.samples + 1] = s
      end
    elseif section == "locs" then
      local id, addr, rest = line:match("^%s*(%d+): (0x%x+) (.*)$")
      if id then
        local m, after = rest:match("^M=(%d+) (.*)$")
        if m then rest = after end
        -- a name may hold spaces (PUC Lua names a C function "for iterator")
        local name, file, ln, start = rest:match("^(.-) (%S*):(%d+) s=(%d+)")
        r.locs[tonumber(id)] = { addr = addr, mapping = tonumber(m), name = name, file = file,
                                 line = tonumber(ln), start = tonumber(start) }
      end
    elseif section == "maps" then
      -- go tool pprof adds a mapping without a file for addresses that
      -- have none (a C frame outside every mapping of /proc/PID/maps)
      local id, s, e, off, file, rest = line:match("^%s*(%d+): (0x%x+)/(0x%x+)/(0x%x+)%s*(%S*)%s*(.*)$")
      if id then
        r.mappings[tonumber(id)] = { start = tonumber(s), limit = tonumber(e), offset = tonumber(off),
                                     file = file, build_id = rest:match("^(%x+)") }
      end
    end
  end
  return r
end

-- the stacks of a -raw read back as folded keys (root first, frames named
-- as pe.profile names them: name@file:line, or the C name) and their
-- value #i, summed
local function raw_stacks(r, i)
  local by, total = {}, 0
  for _, s in ipairs(r.samples) do
    local parts = {}
    for j = #s.ids, 1, -1 do
      local l = assert(r.locs[s.ids[j]], "sample names location " .. s.ids[j] .. ", not in -raw")
      parts[#parts + 1] = (l.file ~= "" and ("%s@%s:%d"):format(l.name, l.file, l.line)) or l.name
    end
    local k = table.concat(parts, ";")
    by[k] = (by[k] or 0) + s.values[i]
    total = total + s.values[i]
  end
  return by, total
end

-- `-top` flat counts (sample_index=samples), summed per name
local function top_flat(path)
  local out = go_pprof("-top -nodecount=1000 -nodefraction=0 -sample_index=samples " .. path)
  local flat = {}
  for n, name in out:gmatch("\n%s*(%d+)%s+[%d%.]+%%%s+[%d%.]+%%%s+%d+%s+[%d%.]+%%%s+([^\n]+)") do
    flat[name] = (flat[name] or 0) + tonumber(n)
  end
  return flat, out
end

-- first and last line of each `local function NAME` of a source file
local function ranges(path)
  local r, cur, n = {}, nil, 0
  for l in io.lines(path) do
    n = n + 1
    local name = l:match("^local function ([%w_]+)")
    if name then cur = name; r[name] = { n } end
    if cur and l:match("^end") then r[cur][2] = n; cur = nil end
  end
  return r
end

-- profile_work.lua run unchanged in a child of this suite's interpreter,
-- with pe.profile.start wrapped to keep its profile; the profile is then
-- encoded every way and its p:aggregate() written out as "count<TAB>key"
local WRAPPER = [=[
package.cpath = %q .. "/?.so;" .. package.cpath
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local pe = require("perf_event")
local pprof = require("perf_event.pprof")
local prof = pe.profile
local start, kept = prof.start, nil
prof.start = function(o) local p, e = start(o) kept = kept or p return p, e end
local dir = %q
arg = { "jit", dir .. "/work.txt" }
dofile("spec/support/profile_work.lua")
assert(kept, "profile_work.lua started no profile")
local function put(name, bytes, how)
  local f = assert(io.open(dir .. "/" .. name, "wb")) f:write(bytes) f:close()
  io.write(name, " ", tostring(how), "\n")
end
put("auto.pb.gz", pprof.from_profile(kept, { freq = 999 }))
put("plain.pb", pprof.from_profile(kept, { freq = 999, gzip = false,
  labels = { { key = "worker", num = 77 }, { key = "route", str = "/x" } } }))
if jit then put("ffi.pb.gz", pprof.from_profile(kept, { freq = 999, gzip = "ffi" })) end
put("own.pb.gz", pprof.from_profile(kept))   -- period, time and duration: the profile's own
-- lua-zlib made unloadable: the automatic choice falls back
package.loaded.zlib = nil
package.preload.zlib = function() error("lua-zlib hidden by pprof_spec") end
put("nozlib.pb", pprof.from_profile(kept, { freq = 999 }))
local f = assert(io.open(dir .. "/agg.txt", "w"))
for _, e in ipairs(kept:aggregate()) do f:write(e.count, "\t", e.key, "\n") end
f:write("nsamples\t", kept.nsamples, "\n")
f:write("duration\t", tostring(kept.duration_nanos), "\n")
f:write("time\t", string.format("%%.0f", kept.time_nanos), "\n")
f:close()
]=]

local work -- the child's result, run once for the describe block

local function run_work()
  if work then return work end
  local dir = U.sh("mktemp -d"):gsub("%s+$", "")
  made[#made + 1] = dir
  local script = dir .. "/wrap.lua"
  local f = assert(io.open(script, "w"))
  f:write(WRAPPER:format(BUILD, dir))
  f:close()
  -- PUC Lua walks the loops ~50 times slower than LuaJIT's traces
  local scale = jit and "1" or "0.2"
  local out = U.sh(("PE_WORK_SCALE=%s %s %s 2>&1"):format(scale, LUA, script))
  work = { dir = dir, out = out, how = {}, agg = {}, total = 0 }
  for name, how in out:gmatch("([%w%.]+%.pb[%.gz]*) (%S+)\n") do work.how[name] = how end
  local af = io.open(dir .. "/agg.txt")
  assert(af, "the workload wrote no aggregate: " .. out)
  for line in af:lines() do
    local n, key = line:match("^(%d+)\t(.*)$")
    if key then work.agg[key] = tonumber(n); work.total = work.total + tonumber(n) end
    work.nsamples = tonumber(line:match("^nsamples\t(%d+)$")) or work.nsamples
    work.duration = tonumber(line:match("^duration\t(%d+)$")) or work.duration
    work.time = tonumber(line:match("^time\t(%d+)$")) or work.time
  end
  af:close()
  return work
end

describe("pprof.encode (the wire format, read by go tool pprof)", function()
  it("keeps a 64-bit kernel address, labels, period and times exactly", function()
    need_go()
    local t = {
      sample_types = { { type = "samples", unit = "count" }, { type = "cpu", unit = "nanoseconds" } },
      period_type = { type = "cpu", unit = "nanoseconds" }, period = 1000000,
      time_nanos = 1700000000123456789, duration_nanos = 2500000000,
      comments = { "made by pprof_spec" },
      mappings = { { start = 0x400000, limit = 0x401000, offset = 0x1000, file = "/bin/example",
                     build_id = "abcd" } },
      samples = {
        { frames = { { name = "main", file = "app.lua", line = 3, start_line = 1 },
                     { name = "k_fn", addr = "0xffffffff81000010" } },
          values = { 7, 7000000 }, labels = { { key = "pid", num = 4242 }, { key = "comm", str = "nginx" } } },
        { frames = { { name = "main", file = "app.lua", line = 3, start_line = 1 },
                     { name = "u_fn", addr = 0x400123, mapping = 1 } },
          values = { 300, 300000000 } },
      },
    }
    local path = tmpdir .. "/unit.pb"
    local f = assert(io.open(path, "wb"))
    f:write((pprof.encode(t, { gzip = false })))
    f:close()
    local r = raw(path)
    assert.truthy(r.text:find("Comment: made by pprof_spec", 1, true), r.text)
    assert.truthy(r.text:find("PeriodType: cpu nanoseconds\nPeriod: 1000000\n", 1, true), r.text)
    assert.truthy(r.text:find("Duration: 2.5", 1, true), r.text)
    assert.truthy(r.text:find("pid:[4242]", 1, true), r.text)
    assert.truthy(r.text:find("comm:[nginx]", 1, true), r.text)
    local by = raw_stacks(r, 1)
    assert.same({ ["main@app.lua:3;k_fn"] = 7, ["main@app.lua:3;u_fn"] = 300 }, by)
    local seen = {}
    for _, l in pairs(r.locs) do seen[l.name] = l end
    assert.equal("0xffffffff81000010", seen.k_fn.addr)
    assert.equal("0x400123", seen.u_fn.addr)
    assert.equal(1, seen.u_fn.mapping)
    assert.same({ start = 0x400000, limit = 0x401000, offset = 0x1000, file = "/bin/example", build_id = "abcd" },
                r.mappings[1])
    assert.equal(1, seen.main.start)
  end)

  it("raises for a caller's mistake", function()
    assert.has_error(function() pprof.encode(nil) end)
    assert.has_error(function() pprof.encode({ samples = { { frames = {}, values = { 1, 2 } } } }) end)
    assert.has_error(function()
      pprof.encode({ samples = { { frames = { { name = "x", addr = 1, mapping = 3 } }, values = { 1 } } } })
    end)
    assert.has_error(function() pprof.gzip("x", "bzip2") end)
  end)

  it("gzips through lua-zlib or libz, which gzip(1) reads back", function()
    local s = string.rep("perf_event ", 1000)
    local z, how = pprof.gzip(s)
    U.need(z ~= nil, "neither lua-zlib nor the LuaJIT FFI: " .. tostring(how))
    local path = tmpdir .. "/g.gz"
    local f = assert(io.open(path, "wb"))
    f:write(z)
    f:close()
    assert.equal(s, U.sh("gzip -dc " .. path))
    assert.truthy(#z < 200)
  end)
end)

describe("pprof.from_profile of profile_work.lua's pe.profile", function()
  it("go tool pprof -raw reads every stack of p:aggregate() with its exact count", function()
    need_go()
    local w = run_work()
    assert.truthy(w.total > 0, w.out)
    assert.equal(w.nsamples, w.total)
    for _, name in ipairs({ "auto.pb.gz", "plain.pb", "nozlib.pb" }) do
      local r = raw(w.dir .. "/" .. name)
      local by, total = raw_stacks(r, 1)
      assert.same(w.agg, by, name)
      assert.equal(w.total, total, name)
      -- the second value is the count times the period (1e9/999 ns)
      local _, ns = raw_stacks(r, 2)
      assert.truthy(math.abs(ns - w.total * 1e9 / 999) <= #r.samples, name)
    end
  end)

  it("takes the period, start time and duration from the profile itself", function()
    need_go()
    local w = run_work()
    local r = raw(w.dir .. "/own.pb.gz")
    -- profile_work.lua samples at 999 Hz: a period of 1e9/999 ns
    assert.truthy(r.text:find("PeriodType: cpu nanoseconds\nPeriod: 1001001\n", 1, true), r.text)
    assert.same(w.agg, (raw_stacks(r, 1)))
    assert.is_number(w.time)
    assert.truthy(math.abs(w.time / 1e9 - os.time()) < 600, w.time)
    if jit then
      -- pprof prints Go's duration text cut to 4 characters ("%.4v"):
      -- "733.960123ms" shows as "733.", "1.234567s" as "1.23"
      local d = w.duration
      assert.truthy(d > 0 and d < 60e9, d)
      local go = d < 1e9 and string.format("%.6fms", d / 1e6) or string.format("%.9fs", d / 1e9)
      assert.truthy(r.text:find("Duration: " .. go:sub(1, 4) .. "\n", 1, true), go .. "\n" .. r.text)
    else
      assert.is_nil(r.text:match("Duration: "), "PUC Lua's profile knows no duration")
    end
  end)

  it("is gzipped by lua-zlib, else libz through the FFI, else plain; each reads the same", function()
    need_go()
    local w = run_work()
    assert.equal("zlib", w.how["auto.pb.gz"], w.out)
    assert.equal("nil", w.how["plain.pb"], w.out)
    assert.equal("\31\139", slurp(w.dir .. "/auto.pb.gz"):sub(1, 2))
    assert.equal("\10", slurp(w.dir .. "/plain.pb"):sub(1, 1))   -- field 1 (sample_type), length-delimited
    -- opts.labels: on every sample
    local r = raw(w.dir .. "/plain.pb")
    local _, nworker = r.text:gsub("worker:%[77%]", "")
    local _, nroute = r.text:gsub("route:%[/x%]", "")
    assert.equal(#r.samples, nworker)
    assert.equal(#r.samples, nroute)
    if jit then
      assert.equal("ffi", w.how["nozlib.pb"], w.out)
      assert.equal("ffi", w.how["ffi.pb.gz"], w.out)
      assert.same(w.agg, (raw_stacks(raw(w.dir .. "/ffi.pb.gz"), 1)))
      assert.equal("\31\139", slurp(w.dir .. "/nozlib.pb"):sub(1, 2))
    else
      assert.equal("nil", w.how["nozlib.pb"], w.out)   -- no FFI on PUC Lua: plain
      assert.equal("\10", slurp(w.dir .. "/nozlib.pb"):sub(1, 1))
    end
  end)

  it("-top and -raw show the hot Lua functions with their file and lines", function()
    need_go()
    local w = run_work()
    local r = raw(w.dir .. "/auto.pb.gz")
    local want = ranges(WORK)
    local flat = top_flat(w.dir .. "/auto.pb.gz")
    for _, fn in ipairs({ "alpha", "beta", "gamma" }) do
      local n, lines = 0, 0
      for key, c in pairs(w.agg) do
        local leaf = key:match("([^;]+)$")
        if leaf:match("^" .. fn .. "@") then n = n + c end
      end
      -- PUC Lua's hook mode puts the interpreter's C leaf under the Lua
      -- frame: flat counts are the leaves' there
      if jit then
        assert.truthy(n > 0, fn .. " has no sample: " .. w.out)
        assert.equal(n, flat[fn], fn)
      end
      for _, l in pairs(r.locs) do
        if l.name == fn then
          assert.equal(WORK, l.file)
          assert.equal(want[fn][1], l.start)
          assert.truthy(l.line >= want[fn][1] and l.line <= want[fn][2], fn .. " line " .. l.line)
          lines = lines + 1
        end
      end
      assert.truthy(lines > 0, fn)
    end
  end)

  it("C frames of the interpreter sit in a mapping of /proc/PID/maps with its build-id", function()
    need_go()
    local w = run_work()
    local r = raw(w.dir .. "/auto.pb.gz")
    local checked = 0
    for _, l in pairs(r.locs) do
      local m = l.mapping and assert(r.mappings[l.mapping], r.text:match("Mappings.*$"))
      if m and m.file ~= "" then
        local a = tonumber(l.addr)
        assert.truthy(a >= m.start and a < m.limit, l.addr)
        local id = U.sh("readelf -n " .. m.file .. " 2>/dev/null"):match("Build ID: (%x+)")
        if id then assert.equal(id, m.build_id) end
        checked = checked + 1
      end
    end
    -- LuaJIT's samples in its VM are C frames with an address; PUC Lua's
    -- hook mode drops the interpreter's own frames under the Lua ones
    if jit then assert.truthy(checked > 0, r.text) end
  end)
end)

describe("luaperf record --pprof", function()
  it("petarget's pet_spin_inner under pet_spin under main, at nm's addresses, counts as luaperf says", function()
    need_go()
    local out = tmpdir .. "/rec.pb.gz"
    local msg = U.sh(("%s bin/luaperf record -g -F 999 --pprof -o %s -- build/test/petarget spin 100000000 2>&1")
      :format(LUA, out))
    local n = tonumber(msg:match("luaperf record: (%d+) samples"))
    assert.truthy(n and n > 0, msg)
    assert.equal("\31\139", slurp(out):sub(1, 2))
    local r = raw(out)
    local by, total = raw_stacks(r, 1)
    assert.equal(n, total)
    local hits = 0
    for k, c in pairs(by) do
      if k:find("main;pet_spin;pet_spin_inner$") then hits = hits + c end
    end
    local ok, why = stats.at_least("samples in main;pet_spin;pet_spin_inner", hits, n, 0.5)
    assert.truthy(ok, why .. "\n" .. r.text)
    -- the first mapping is the main binary, its build-id readelf's
    local id = U.sh("readelf -n build/test/petarget"):match("Build ID: (%x+)")
    assert.truthy(r.mappings[1].file:find("build/test/petarget$"), r.text)
    assert.equal(id, r.mappings[1].build_id)
    -- each pet_spin_inner location maps back into the symbol nm gives
    local checked = 0
    for _, l in pairs(r.locs) do
      if l.name == "pet_spin_inner" then
        local m = r.mappings[l.mapping]
        local lo, size = U.sh("nm -S " .. m.file):match("(%x+) (%x+) T pet_spin_inner\n")
        assert.truthy(lo, m.file)
        local fileoff = tonumber(l.addr) - m.start + m.offset
        -- the library's text segment: file offset == link-time address
        assert.truthy(fileoff >= tonumber(lo, 16) and fileoff < tonumber(lo, 16) + tonumber(size, 16), l.addr)
        checked = checked + 1
      end
    end
    assert.truthy(checked > 0)
    local flat = top_flat(out)
    assert.truthy((flat.pet_spin_inner or 0) >= hits, "pet_spin_inner flat")
  end)

  it("without -g (-c PERIOD): the period as given, the executable still the main binary", function()
    need_go()
    local out = tmpdir .. "/rec_c.pb.gz"
    local msg = U.sh(("%s bin/luaperf record -c 1000000 --pprof -o %s -- build/test/petarget spin 50000000 2>&1")
      :format(LUA, out))
    local n = tonumber(msg:match("luaperf record: (%d+) samples"))
    assert.truthy(n and n > 0, msg)
    local r = raw(out)
    assert.truthy(r.text:find("PeriodType: cpu nanoseconds\nPeriod: 1000000\n", 1, true), r.text)
    local by, total = raw_stacks(r, 1)
    assert.equal(n, total)
    local _, ns = raw_stacks(r, 2)
    assert.equal(n * 1000000, ns)
    assert.truthy((by.pet_spin_inner or 0) > n / 2, r.text)
    assert.truthy(r.mappings[1].file:find("build/test/petarget$"), r.text)
  end)

  it("--lua -- CMD: the Lua processes' own profiles, Lua functions with their file and line", function()
    need_go()
    local script = tmpdir .. "/hot.lua"
    local f = assert(io.open(script, "w"))
    f:write([[
local function hot(n)
  local s = 0
  for i = 1, n do s = (s * 31 + i) % 1000003 end
  return s
end
local t0 = os.clock()
while os.clock() - t0 < 0.5 do hot(100000) end
]])
    f:close()
    local out = tmpdir .. "/lua.pb.gz"
    local msg = U.sh(("%s bin/luaperf record --lua --pprof -o %s -- %s %s 2>&1"):format(LUA, out, LUA, script))
    local n = tonumber(msg:match("luaperf record: (%d+) samples"))
    assert.truthy(n and n > 100, msg)
    assert.truthy(msg:find("(pprof)", 1, true), msg)
    local r = raw(out)
    local _, total = raw_stacks(r, 1)
    assert.equal(n, total)
    -- hot's body is lines 2-4 of the script
    local seen = 0
    for _, l in pairs(r.locs) do
      if l.name == "hot" then
        assert.equal(script, l.file)
        assert.truthy(l.line >= 1 and l.line <= 5, "hot at line " .. l.line)
        seen = seen + 1
      end
    end
    assert.truthy(seen > 0, r.text)
    local flat = top_flat(out)
    local top, best = nil, 0
    for name, c in pairs(flat) do if c > best then top, best = name, c end end
    -- the hot loop is the leaf (LuaJIT), or the Lua frame over the
    -- interpreter's C leaf (PUC Lua)
    if jit then assert.equal("hot", top, r.text) end
    local cum = go_pprof("-top -cum -nodecount=5 -sample_index=samples " .. out)
    assert.truthy(cum:find("%s+hot\n"), cum)
  end)

  it("refuses --pprof with --speedscope or --folded", function()
    local msg = U.sh(LUA .. " bin/luaperf record --pprof --speedscope -- true 2>&1; echo rc=$?")
    assert.truthy(msg:find("exclude each other", 1, true), msg)
    assert.truthy(msg:find("rc=2", 1, true), msg)
    msg = U.sh(LUA .. " bin/luaperf record --pprof --folded -- true 2>&1; echo rc=$?")
    assert.truthy(msg:find("exclude each other", 1, true), msg)
  end)
end)
