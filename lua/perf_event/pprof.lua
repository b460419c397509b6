--- perf_event.pprof: profiles as pprof's `profile.proto`, gzipped: the
-- format `go tool pprof`, Pyroscope and Parca read.
--
--    local pprof = require("perf_event.pprof")
--    local p = assert(pe.profile.start{ event = "cpu-clock", freq = 999 })
--    work()
--    p:stop()
--    local bytes = pprof.from_profile(p, { freq = 999 })
--    assert(io.open("cpu.pb.gz", "wb")):write(bytes)
--
-- The protobuf encoding (varints, length-delimited and packed repeated
-- fields) is perf_event.pprof.wire's; the message and field numbers are those of
-- github.com/google/pprof `proto/profile.proto`.  Compression
-- (perf_event.pprof.gzip) goes through a maintained zlib: Debian's lua-zlib (`require "zlib"`), else libz.so.1
-- through the LuaJIT FFI, else the bytes stay plain (pprof reads both).
--
-- Three ways in, one neutral table in the middle (see `encode`):
-- `from_profile(p)` for a `pe.profile`, `recorder(sym)` for decoded
-- samples with native callchains (what `luaperf record` reads), and any
-- table built by hand.
-- @module perf_event.pprof

local string, table, math = string, table, math
local type, tostring, tonumber, ipairs, pairs, require, error =
      type, tostring, tonumber, ipairs, pairs, require, error
local format, sub, concat = string.format, string.sub, table.concat
local floor = math.floor
local sort = table.sort

local M = {}

local function symbols() return require("perf_event.symbols") end

local wire = require("perf_event.pprof.wire")
local fv, fb, fpacked = wire.fv, wire.fb, wire.fpacked
local gz = require("perf_event.pprof.gzip")

-- ---------------------------------------------------------------- gzip
-- (perf_event.pprof.gzip)

--- Gzips `s` with the first compressor found: lua-zlib, then libz through
-- the LuaJIT FFI.
-- @function gzip
-- @tparam string s
-- @tparam[opt] string how `"zlib"` or `"ffi"` for that one only
-- @treturn[1] string the gzip member
-- @treturn[1] string which compressor (`"zlib"` or `"ffi"`)
-- @treturn[2] nil
-- @treturn[2] string why none could
M.gzip = gz.gzip

--- Which compressor `gzip` would use now: `"zlib"`, `"ffi"` or nil (plain).
-- @function gzip_available
M.gzip_available = gz.gzip_available

-- ---------------------------------------------------------------- encode

local function check_vt(vt, what)
  if type(vt) ~= "table" or type(vt.type) ~= "string" or type(vt.unit) ~= "string" then
    error(format("pprof.encode: %s must be {type=string, unit=string}", what), 3)
  end
end

--- Encodes a profile given in the neutral form as `profile.proto` bytes
-- (gzipped unless `opts.gzip == false`).
--
-- The neutral form (every field but `samples` optional):
--
--    {
--      sample_types = { {type="samples", unit="count"}, {type="cpu", unit="nanoseconds"} },
--      default_sample_type = "cpu",          -- a sample_types[i].type
--      period_type = {type="cpu", unit="nanoseconds"}, period = 1001001,
--      time_nanos = 1.7e18, duration_nanos = 2e9,   -- wall clock start, length
--      comments = { "text", ... },
--      mappings = { {start=, limit=, offset=, file=, build_id=}, ... },
--      samples = {
--        { frames = { frame, ... },          -- ROOT FIRST, as p:aggregate()
--          values = { 12, 12012012 },        -- one per sample type
--          labels = { {key="pid", num=42}, {key="comm", str="nginx"} } },
--      },
--    }
--
-- A frame: `{name=, system_name=, file=, start_line=, line=}` for a
-- function and its line (a Lua frame), and `addr=` with `mapping=`
-- (an index into `mappings`) for native code.  Frames with equal
-- (address, mapping) or, without an address, equal function and line
-- share one Location; equal (name, system_name, file, start_line) one
-- Function.  Integers may be numbers, 5.3 integers, LuaJIT uint64 cdata
-- or "0x..." strings.
-- @tparam table t the profile
-- @tparam[opt] table opts `gzip=false` for plain bytes, or `"zlib"`/`"ffi"`
--   for that compressor (else the first available, plain when none is)
-- @treturn string the bytes
-- @treturn string|nil which compressor (`"zlib"`, `"ffi"`; nil: plain)
function M.encode(t, opts)
  opts = opts or {}
  if type(t) ~= "table" then error("pprof.encode: profile table expected", 2) end
  if type(t.samples) ~= "table" then error("pprof.encode: t.samples must be an array", 2) end
  local types = t.sample_types or { { type = "samples", unit = "count" } }
  for i, vt in ipairs(types) do check_vt(vt, "sample_types[" .. i .. "]") end
  if t.period_type then check_vt(t.period_type, "period_type") end

  local strings, sidx = { "" }, { [""] = 0 }
  local function str(s)
    if s == nil then return 0 end
    s = tostring(s)
    local i = sidx[s]
    if not i then i = #strings; strings[i + 1] = s; sidx[s] = i end
    return i
  end

  local out = {}
  for _, vt in ipairs(types) do
    local m = {}
    fv(m, 1, str(vt.type)); fv(m, 2, str(vt.unit))
    fb(out, 1, concat(m))
  end

  local funcs, fkeys = {}, {}
  local function func_id(fr)
    local name = fr.name or "[unknown]"
    local k = concat({ tostring(name), tostring(fr.system_name or ""), tostring(fr.file or ""),
                       tostring(fr.start_line or 0) }, "\0")
    local id = fkeys[k]
    if not id then
      id = #funcs + 1
      fkeys[k] = id
      local m = {}
      fv(m, 1, id); fv(m, 2, str(name)); fv(m, 3, str(fr.system_name or name))
      fv(m, 4, str(fr.file)); fv(m, 5, fr.start_line)
      funcs[id] = concat(m)
    end
    return id
  end

  local maps = t.mappings or {}
  local locs, lkeys, by_frame = {}, {}, {}
  local function loc_id(fr)
    local known = by_frame[fr]
    if known then return known end
    if type(fr) ~= "table" then error("pprof.encode: a frame must be a table", 4) end
    local fid = func_id(fr)
    local line = fr.line or fr.start_line or 0
    local k
    if fr.addr ~= nil then
      k = "a" .. (symbols().hex(fr.addr) or error("pprof.encode: bad frame addr " .. tostring(fr.addr), 4))
        .. ":" .. tostring(fr.mapping or 0) .. ":" .. fid
    else
      k = "f" .. fid .. ":" .. tostring(line)
    end
    local id = lkeys[k]
    if not id then
      id = #locs + 1
      lkeys[k] = id
      if fr.mapping and not maps[fr.mapping] then
        error("pprof.encode: frame mapping " .. tostring(fr.mapping) .. " is not in t.mappings", 4)
      end
      local ln = {}
      fv(ln, 1, fid); fv(ln, 2, line)
      local m = {}
      fv(m, 1, id); fv(m, 2, fr.mapping); fv(m, 3, fr.addr)
      fb(m, 4, concat(ln))
      locs[id] = concat(m)
    end
    by_frame[fr] = id   -- producers reuse one table for a repeated frame
    return id
  end

  for i, s in ipairs(t.samples) do
    if type(s) ~= "table" or type(s.frames) ~= "table" or type(s.values) ~= "table" then
      error(format("pprof.encode: samples[%d] must be {frames=, values=}", i), 2)
    end
    if #s.values ~= #types then
      error(format("pprof.encode: samples[%d] has %d values for %d sample types", i, #s.values, #types), 2)
    end
    local ids = {}
    for j = #s.frames, 1, -1 do ids[#ids + 1] = loc_id(s.frames[j]) end   -- leaf first
    local m = {}
    fpacked(m, 1, ids)
    fpacked(m, 2, s.values)
    for _, l in ipairs(s.labels or {}) do
      local lm = {}
      fv(lm, 1, str(l.key))
      if l.str ~= nil then fv(lm, 2, str(l.str)) end
      if l.num ~= nil then fv(lm, 3, l.num) end
      if l.unit ~= nil then fv(lm, 4, str(l.unit)) end
      fb(m, 3, concat(lm))
    end
    fb(out, 2, concat(m))
  end

  for i, mp in ipairs(maps) do
    local m = {}
    fv(m, 1, i); fv(m, 2, mp.start); fv(m, 3, mp.limit); fv(m, 4, mp.offset)
    fv(m, 5, str(mp.file)); fv(m, 6, str(mp.build_id))
    -- every location names its function: no symbolization to do
    fv(m, 7, mp.has_functions ~= false)
    fv(m, 8, mp.has_filenames)
    fv(m, 9, mp.has_line_numbers)
    fb(out, 3, concat(m))
  end
  for _, l in ipairs(locs) do fb(out, 4, l) end
  for _, f in ipairs(funcs) do fb(out, 5, f) end

  local tail = {}
  fv(tail, 9, t.time_nanos and floor(t.time_nanos))
  fv(tail, 10, t.duration_nanos and floor(t.duration_nanos))
  if t.period_type then
    local m = {}
    fv(m, 1, str(t.period_type.type)); fv(m, 2, str(t.period_type.unit))
    fb(tail, 11, concat(m))
  end
  fv(tail, 12, t.period and floor(t.period + 0.5))
  local cs = {}
  for i, c in ipairs(t.comments or {}) do cs[i] = str(c) end
  fpacked(tail, 13, cs)
  if t.default_sample_type then fv(tail, 14, str(t.default_sample_type)) end

  -- the string table last: every string above is in it now ("" is 0)
  for _, s in ipairs(strings) do fb(out, 6, s) end
  out[#out + 1] = concat(tail)
  local bytes = concat(out)
  if opts.gzip == false then return bytes, nil end
  local how = opts.gzip
  if how == true then how = nil end
  local z, used = M.gzip(bytes, how)
  if z then return z, used end
  if how then error("pprof.encode: " .. tostring(used), 2) end
  return bytes, nil
end

-- ---------------------------------------------------------------- inputs

local CLOCKS = { ["cpu-clock"] = true, ["task-clock"] = true }

-- sample types and period type for an event: time for the clocks, event
-- counts for anything else
local function types_for(event)
  event = tostring(event or "cpu-clock")
  if event == "block" then
    -- a block profile's one value, the time waited (Go's is "delay")
    return { { type = "delay", unit = "nanoseconds" } }, { type = "delay", unit = "nanoseconds" }, "delay"
  end
  if CLOCKS[event] then
    return { { type = "samples", unit = "count" }, { type = "cpu", unit = "nanoseconds" } },
           { type = "cpu", unit = "nanoseconds" }, "cpu"
  end
  return { { type = "samples", unit = "count" }, { type = event, unit = "count" } },
         { type = event, unit = "count" }, event
end

-- a mapping table keyed by its identity: index into t.mappings
local function mapping_set(t)
  local keys = {}
  return function(m)
    local k = format("%s:%s:%s", symbols().hex(m.start) or "", symbols().hex(m.stop) or "", m.file)
    local i = keys[k]
    if i then return i end
    local e = { start = m.start, limit = m.stop, offset = m.pgoff, file = m.file }
    if sub(m.file, 1, 1) == "/" then
      local elf = symbols().elf(m.file)
      e.build_id = elf and elf.build_id
    end
    t.mappings[#t.mappings + 1] = e
    i = #t.mappings
    keys[k] = i
    return i
  end
end

local function find_map(list, a) return symbols().find_map(list, a) end

-- a user-space address as a plain number (below 2^48), else nil
local function user_number(v)
  local h = symbols().hex(v)
  if h and sub(h, 1, 4) == "0000" then return tonumber(h, 16) end
  return nil
end

local function wall_nanos()
  return os.time() * 1e9
end

--- The neutral table (see `encode`) of a `pe.profile`, from its
-- `p:aggregate()`: Lua frames become functions (`name`, system name
-- `name@chunk:linedefined`, file = the chunk, start line) at the sampled
-- line; C frames become locations at their address in a mapping of this
-- process (/proc/self/maps, with the file's build-id).
-- @tparam table p a stopped (or drained) profile
-- @tparam[opt] table opts `freq` or `period` (default: what the profile
--   was started with; the period in event units: nanoseconds for
--   cpu-clock); `lines` and `traces` as p:aggregate's; `time_nanos` (the
--   profile's start, in whole seconds) and `duration_nanos` (the profile's,
--   LuaJIT only; left out when unknown); `comments`; `labels` (put on
--   every sample, e.g. `{ {key="worker", num=pid}, {key="route", str="/api"} }`)
-- @treturn table
function M.profile_table(p, opts)
  opts = opts or {}
  if type(p) ~= "table" or type(p.aggregate) ~= "function" then
    error("pprof.profile_table: a pe.profile expected", 2)
  end
  local period = opts.period or not opts.freq and p.period or (1e9 / (opts.freq or p.freq or 999))
  local types, ptype, default = types_for(p.block and "block" or p.event)
  local t = { sample_types = types, period_type = ptype, period = period, default_sample_type = default,
              time_nanos = opts.time_nanos or p.time_nanos or wall_nanos(),
              duration_nanos = opts.duration_nanos or p.duration_nanos,
              mappings = {}, samples = {},
              comments = opts.comments or { format("perf_event.profile %s, mode %s", tostring(p.event),
                                                   tostring(p.mode)) } }
  local add_map = mapping_set(t)
  local sym = p.sym
  local own = sym and sym.maps and sym.maps[sym.self_pid]
  local lines = opts.lines ~= false
  local lua_frames = {}   -- info -> line -> frame: one table per function and line
  for _, e in ipairs(p:aggregate({ lines = opts.lines, traces = opts.traces })) do
    local frames = {}
    for i, f in ipairs(e.frames) do
      if f.lua then
        local info = f.lua
        local line = lines and f.line or info.linedefined
        local by_line = lua_frames[info]
        if not by_line then by_line = {}; lua_frames[info] = by_line end
        local fr = by_line[line]
        if not fr then
          fr = { name = info.name, file = info.chunk, start_line = info.linedefined,
                 system_name = format("%s@%s:%d", info.name, info.chunk, info.linedefined), line = line }
          by_line[line] = fr
        end
        frames[i] = fr
      else
        local fr = { name = f.c, addr = f.addr }
        local a = f.addr and user_number(f.addr)
        local m = a and find_map(own, a)
        if m then fr.mapping = add_map(m) end
        frames[i] = fr
      end
    end
    local v = e.count * period
    local values = p.block and { e.count } or { e.count, floor(v + 0.5) }
    t.samples[#t.samples + 1] = { frames = frames, values = values, labels = opts.labels }
  end
  return t
end

--- A `pe.profile` as pprof bytes: `encode(profile_table(p, opts), opts)`.
-- @tparam table p the profile
-- @tparam[opt] table opts as profile_table and encode
-- @treturn string bytes (gzipped when a compressor is there)
-- @treturn string|nil the compressor used
function M.from_profile(p, opts)
  if type(p) ~= "table" or type(p.aggregate) ~= "function" then
    error("pprof.from_profile: a pe.profile expected", 2)
  end
  return M.encode(M.profile_table(p, opts), opts)
end

--- The neutral table of folded stacks ("a;b;c" -> count), such as the
-- files `luaperf record --lua` gathers from its Lua processes: a frame
-- `name@chunk:line` becomes a Lua function (file = the chunk, at that
-- line; its first line is not known: `start_line` 0), any other frame a
-- function of that name with no address.
-- @tparam table counts folded key -> samples
-- @tparam[opt] table opts `event` ("cpu-clock"; "block": each count is
--   nanoseconds waited, the one sample type `delay`), `freq` (999) or `period`,
--   `time_nanos`, `duration_nanos`, `comments`, `labels`
-- @treturn table
function M.folded_table(counts, opts)
  opts = opts or {}
  if type(counts) ~= "table" then error("pprof.folded_table: a table of folded stacks expected", 2) end
  local period = opts.event == "block" and 1 or opts.period or (1e9 / (opts.freq or 999))
  local types, ptype, default = types_for(opts.event)
  local t = { sample_types = types, period_type = ptype, period = period, default_sample_type = default,
              time_nanos = opts.time_nanos or wall_nanos(), duration_nanos = opts.duration_nanos,
              mappings = {}, samples = {},
              comments = opts.comments or { "folded stacks, " .. tostring(opts.event or "cpu-clock") } }
  local frames_of = {}   -- folded frame text -> one shared frame
  local keys = {}
  for k in pairs(counts) do keys[#keys + 1] = k end
  sort(keys)
  for _, key in ipairs(keys) do
    local n = counts[key]
    if type(n) ~= "number" then error("pprof.folded_table: the count of '" .. key .. "' is not a number", 2) end
    local frames = {}
    for text in key:gmatch("[^;]+") do
      local fr = frames_of[text]
      if not fr then
        local name, chunk, line = text:match("^(.-)@(.+):(%d+)$")
        if name then
          fr = { name = name, file = chunk, line = tonumber(line), start_line = 0,
                 system_name = name .. "@" .. chunk }
        else
          fr = { name = text }
        end
        frames_of[text] = fr
      end
      frames[#frames + 1] = fr
    end
    if #frames > 0 then
      local values = opts.event == "block" and { n } or { n, floor(n * period + 0.5) }
      t.samples[#t.samples + 1] = { frames = frames, values = values, labels = opts.labels }
    end
  end
  return t
end

--- A collector of decoded samples with native callchains (what `luaperf
-- record` reads): `r.add(rec)` for each sample (its `callchain`, or `ip`
-- alone, `pid`, `period`), `r.table()` for the neutral table.  Frames are
-- named by the symbolizer `sym` (perf_event.symbols, fed with the
-- process's maps and mmap records); each user address keeps its mapping
-- (start, limit, file offset, file, build-id).  Samples of one stack and
-- one pid are summed.  Each address is looked up once per set of mappings.
-- @tparam table sym a perf_event.symbols symbolizer
-- @tparam[opt] table opts `event` (name, "cpu-clock"), `period` (a fixed
--   period, for samples without one), `comm` (function pid -> command name
--   for the `comm` label); `events` (a list of two or more names): one
--   sample type per event, its count (a clock's nanoseconds), and
--   `add(rec, i)` adds a sample of the i-th event (the others' values 0)
-- @treturn table collector
function M.recorder(sym, opts)
  opts = opts or {}
  if type(sym) ~= "table" or type(sym.lookup) ~= "function" then
    error("pprof.recorder: a perf_event.symbols symbolizer expected", 2)
  end
  local abi = require("perf_event.core").abi
  local S = symbols()
  local ctx_min = S.hex(abi.context_max)
  local markers = { [abi.context_other] = true }
  for name in pairs(abi.context) do markers[name] = true end
  local types, ptype, default = types_for(opts.event)
  local multi = type(opts.events) == "table" and #opts.events > 1 and opts.events
  local comment = "luaperf record -e " .. tostring(opts.event or "cpu-clock")
  if multi then
    -- one value per event: its count (nanoseconds for a clock), named by it
    types = {}
    for i, name in ipairs(multi) do
      name = tostring(name)
      types[i] = { type = name, unit = CLOCKS[name] and "nanoseconds" or "count" }
    end
    ptype, default = types[1], types[1].type
    comment = "luaperf record -e " .. concat(multi, " -e ")
  end
  local nvalues = #types
  local t = { sample_types = types, period_type = ptype, period = opts.period, default_sample_type = default,
              time_nanos = opts.time_nanos or wall_nanos(), mappings = {}, samples = {},
              comments = { comment } }
  local add_map = mapping_set(t)
  local by = {}
  local r = { samples = 0, t = t }
  local periods, nperiods, pids = 0, 0, {}
  -- frames shared by the samples: mappings list -> "address[r]" -> frame
  local frame_of, all, serial, none = {}, {}, {}, {}
  function r.add(rec, ei)
    local chain = rec.callchain
    if not chain or #chain == 0 then chain = { rec.ip } end
    local pid = rec.pid
    pids[pid] = true
    ei = multi and ei or 1
    local leaf_first, keys = {}, { ei .. ":" .. tostring(pid) }
    local first = true
    for _, a in ipairs(chain) do
      local h = not (type(a) == "string" and markers[a]) and S.hex(a)
      if not h or h >= ctx_min then
        first = true   -- a context marker: its first entry is an exact ip
      else
        -- the mappings' table is replaced whenever they change: a frame
        -- resolved under one set is not reused under another
        local list = sym.maps[pid] or none
        local cache = frame_of[list]
        if not cache then cache = {}; frame_of[list] = cache end
        local fk = first and h or h .. "r"
        local fr = cache[fk]
        if not fr then
          local n = sub(h, 1, 4) == "0000" and tonumber(h, 16)
          local look = (n and not first) and n - 1 or a
          fr = { name = (sym:lookup(look, pid)), addr = n or ("0x" .. h) }
          local m = n and find_map(sym.maps[pid], n)
          if m then fr.mapping = add_map(m) end
          cache[fk] = fr
          all[#all + 1] = fr
          serial[fr] = #all
        end
        leaf_first[#leaf_first + 1] = fr
        keys[#keys + 1] = serial[fr]
        first = false
      end
    end
    local k = concat(keys, ",")
    local s = by[k]
    local period = tonumber(rec.period) or opts.period or 1
    if not s then
      local frames = {}
      for i = #leaf_first, 1, -1 do frames[#frames + 1] = leaf_first[i] end
      local labels = { { key = "pid", num = pid } }
      local comm = opts.comm and opts.comm(pid)
      if comm then labels[2] = { key = "comm", str = comm } end
      local values = {}
      for i = 1, nvalues do values[i] = 0 end
      s = { frames = frames, values = values, labels = labels }
      by[k] = s
      t.samples[#t.samples + 1] = s
    end
    if multi then s.values[ei] = s.values[ei] + period
    else
      s.values[1] = s.values[1] + 1
      s.values[2] = s.values[2] + period
    end
    periods, nperiods = periods + period, nperiods + 1
    r.samples = r.samples + 1
  end
  function r.table()
    -- freq mode: the period varies by sample; the mean stands for it
    if not t.period and nperiods > 0 then t.period = periods / nperiods end
    if r.sorted == #t.mappings then return t end
    -- each process's lowest file mapping (its executable, as loaded
    -- first) is named even when no sample fell in it
    for pid in pairs(pids) do
      for _, m in ipairs(sym.maps[pid] or {}) do
        if sub(m.file, 1, 1) == "/" then add_map(m) break end
      end
    end
    -- pprof takes the first mapping for the main binary: by address, the
    -- executable (0x55...) comes before the libraries (0x7f...)
    local order = {}
    for i = 1, #t.mappings do order[i] = i end
    table.sort(order, function(x, y)
      local a, b = S.hex(t.mappings[x].start), S.hex(t.mappings[y].start)
      if a ~= b then return a < b end
      return x < y
    end)
    local new, maps = {}, {}
    for i, old in ipairs(order) do new[old] = i; maps[i] = t.mappings[old] end
    t.mappings = maps
    for _, fr in ipairs(all) do
      if fr.mapping then fr.mapping = new[fr.mapping] end
    end
    r.sorted = #t.mappings
    return t
  end
  return r
end

return M
