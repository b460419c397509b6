--- perf_event.perfdata: writes the perf.data file `perf report` and
-- `perf script` read (the format of the kernel tree's
-- tools/perf/Documentation/perf.data-file-format.txt), for
-- `luaperf record -o file.data`.
--
--    local w = perfdata.create(path, { { ev = ev1, name = "cpu-clock", evs = {ev1, ev2} } },
--                              { cmdline = { "luaperf", "record", ... } })
--    for raw, rec in perfdata.records(ev) do w:add(raw, rec) end
--    w:close()
--
-- The file: the header, the ids and attrs of each event, the data section
-- (the ring's records byte for byte as the kernel wrote them, plus one
-- synthesized kernel MMAP so perf names kernel addresses), then the feature
-- sections HOSTNAME, OSRELEASE, VERSION, ARCH, NRCPUS, TOTAL_MEM, CMDLINE,
-- EVENT_DESC, BUILD_ID, SAMPLE_TIME and, for tracepoints, TRACING_DATA.  Integers are little endian (the
-- machine's order, as perf writes them on x86 and arm64).
-- @module perf_event.perfdata

local core = require("perf_event.core")
local fs = require("perf_event.fs")

local io, string, table = io, string, table
local ipairs, pairs, tostring, tonumber, type, pcall, setmetatable = ipairs, pairs, tostring, tonumber, type,
  pcall, setmetatable
local concat, rep, format = table.concat, string.rep, string.format

local P = core._private
local pd_next, pd_pack, pd_attr, pd_build_id, pd_synth = P.pd_next, P.pd_pack, P.pd_attr, P.pd_build_id,
  P.pd_synth
local decode_current, ring_ptr = P.decode_current, P.ring_ptr
local abi = core.abi
local RT, MISC, ST = abi.record_type, abi.misc, abi.sample_type

local M = {}

-- perf's own numbers (the perf.data format, not the kernel's ABI): the
-- feature bits of the header's bitmap, the header's magic and size, the
-- alignment of strings and the build-id size flag of a BUILD_ID entry
local FEAT = { tracing_data = 1, build_id = 2, hostname = 3, osrelease = 4, version = 5, arch = 6, nrcpus = 7,
               total_mem = 10, cmdline = 11, event_desc = 12, sample_time = 21 }
local MAGIC = "PERFILE2"
local HEADER_SIZE = 104          -- magic, size, attr_size, 3 sections, 256-bit feature map
local NAME_ALIGN = 64
local BUILD_ID_SIZE_FLAG = 32768 -- PERF_RECORD_MISC_BUILD_ID_SIZE (1 << 15)
local FINISHED_ROUND = 68       -- PERF_RECORD_FINISHED_ROUND, a perf (user) record type
local VERSION = "luaperf " .. tostring(core.VERSION)   -- `perf report --header-only`'s "perf version"

M.FEATURES = FEAT

local function u16(...) return pd_pack(2, ...) end
local function u32(...) return pd_pack(4, ...) end
local function u64(...) return pd_pack(8, ...) end

local function align(n, a) return n + (a - n % a) % a end

-- perf's string: u32 length (NUL included, rounded up to 64), the padded bytes
local function pstring(s)
  local len = align(#s + 1, NAME_ALIGN)
  return u32(len) .. s .. rep("\0", len - #s)
end

-- the one-line files of /proc and /sys (fs.read strips the newline)
local function read_first_line(path)
  return fs.read(path)
end

-- number of CPUs in a list like "0-3,5" (pmu.parse_cpus)
local function count_cpus(list)
  return #require("perf_event.pmu").parse_cpus(list)
end

local function arch()
  local a = read_first_line("/proc/sys/kernel/arch")
  if a then return a end
  local ok, ffi = pcall(require, "ffi")
  if ok then return ({ x64 = "x86_64", arm64 = "aarch64" })[ffi.arch] or ffi.arch end
  return "unknown"
end

local function total_mem_kb()
  local f = io.open("/proc/meminfo", "r")
  if not f then return 0 end
  local s = f:read("*a")
  f:close()
  return tonumber(s:match("MemTotal:%s*(%d+)")) or 0
end

-- the kernel text start (_text) from /proc/kallsyms, as "0x..." or nil
local function kernel_text()
  local f = io.open("/proc/kallsyms", "r")
  if not f then return nil end
  for l in f:lines() do
    local a = l:match("^(%x+) [Tt] _text$")
    if a then
      f:close()
      if a:match("^0+$") then return nil end   -- kptr_restrict hides it
      return a
    end
  end
  f:close()
  return nil
end

-- ~x of a hex string, as "0x..." (the length of the kernel map: ~0 - start)
local function hex_not(h)
  h = rep("0", 16 - #h) .. h
  return "0x" .. h:gsub("%x", function(d) return format("%x", 15 - tonumber(d, 16)) end)
end

-- the bytes of the sample_id trailer non-sample records carry, zeroed but
-- for pid/tid and the event's id (sample_type order: tid, time, id,
-- stream_id, cpu, identifier); id 0 stands for the first event
local function sample_id_trailer(sample_type, pid, tid, id)
  local st = tonumber(sample_type) or 0
  local function has(bit) return (st / bit) % 2 >= 1 end
  local out = {}
  if has(ST.tid) then out[#out + 1] = u32(pid, tid) end
  for _, b in ipairs({ ST.time, ST.id, ST.stream_id, ST.cpu, ST.identifier }) do
    if has(b) then out[#out + 1] = u64((b == ST.id or b == ST.identifier) and id or 0) end
  end
  return concat(out)
end

-- A PERF_RECORD_MMAP of the kernel text as perf record synthesizes it
-- ("[kernel.kallsyms]_text", start = pgoff = _text), or nil when
-- /proc/kallsyms does not show the address.
-- sample_type: the events' (for the sample_id trailer); sample_id_all: whether they have it
local function kernel_mmap(sample_type, sample_id_all)
  local text = kernel_text()
  if not text then return nil end
  local name = "[kernel.kallsyms]_text"
  local fname = name .. rep("\0", align(#name + 1, 8) - #name)
  local trailer = sample_id_all and sample_id_trailer(sample_type, -1, 0, 0) or ""
  local body = u32(-1, 0) .. u64("0x" .. text, hex_not(text), "0x" .. text) .. fname .. trailer
  return u32(RT.mmap) .. u16(MISC.kernel, 8 + #body) .. body
end

--- The records of ev's ring now, as `raw, rec`: the kernel's bytes and the
-- same record decoded (as `event:records()` decodes it, without tracepoint
-- fields).
-- @param ev an event with a ring
-- @treturn function iterator
function M.records(ev)
  ring_ptr(ev)   -- sets up the ring's read state (raises without a ring)
  return function()
    local raw = pd_next(ev)
    if not raw then return nil end
    return raw, decode_current(ev)
  end
end

local Writer = {}
Writer.__index = Writer

--- Starts a perf.data file.
-- @tparam string path the file
-- @tparam table events a list of `{ ev = event, evs = { events sharing its attr }, name = string }`:
--   one attr per entry, the ids of all `evs`
-- @tparam[opt] table opts `cmdline` (list of strings, as perf's `# cmdline`);
--   `pid`: a running process whose threads (COMM) and executable mappings
--   (MMAP2) are written first, read from /proc as perf record synthesizes
--   them, so perf names what was mapped before recording began; `all`:
--   the same for every process in /proc (system-wide recording)
-- @return a writer, or nil, msg
function M.create(path, events, opts)
  opts = opts or {}
  local f, err = io.open(path, "wb")
  if not f then return nil, err end
  P.cloexec(f)   -- a command started later never inherits it
  local attrs, asz = {}, 0
  for i, e in ipairs(events) do
    local bytes = pd_attr(e.ev)
    if #bytes > asz then asz = #bytes end
    local ids = {}
    for _, x in ipairs(e.evs or { e.ev }) do
      local id = x:id()
      if id then ids[#ids + 1] = id end
    end
    attrs[i] = { bytes = bytes, ids = ids, name = e.name or e.ev:name(),
                 sample_type = e.ev:info().sample_type, sample_id_all = e.ev:attr().sample_id_all,
                 mmap_data = e.ev:attr().mmap_data,
                 tracepoint = tonumber(e.ev:attr().type) == abi.type.tracepoint }
  end
  -- one attr size for all: pad the shorter ones and say so in attr.size
  for _, a in ipairs(attrs) do
    if #a.bytes < asz then a.bytes = a.bytes .. rep("\0", asz - #a.bytes) end
    a.bytes = a.bytes:sub(1, 4) .. u32(asz) .. a.bytes:sub(9)
  end
  local w = setmetatable({ f = f, path = path, attrs = attrs, attr_size = asz,
                           cmdline = opts.cmdline or { "luaperf" }, data_size = 0,
                           files = {}, file_order = {}, samples = 0 }, Writer)
  -- header placeholder, ids, attrs; the data section follows
  local parts, off = { rep("\0", HEADER_SIZE) }, HEADER_SIZE
  for _, a in ipairs(attrs) do
    a.ids_offset = off
    for _, id in ipairs(a.ids) do parts[#parts + 1] = u64(id) end
    off = off + 8 * #a.ids
  end
  w.attrs_offset = off
  for _, a in ipairs(attrs) do
    parts[#parts + 1] = a.bytes .. u64(a.ids_offset, 8 * #a.ids)
    off = off + asz + 16
  end
  w.data_offset = off
  f:write(concat(parts))
  local first = attrs[1]
  local km = first and kernel_mmap(first.sample_type, first.sample_id_all)
  if km then w:add(km) end
  local pids = {}
  if opts.all then   -- system wide: every process, as perf record -a
    for _, name in ipairs(core.readdir("/proc") or {}) do
      if name:match("^%d+$") then pids[#pids + 1] = tonumber(name) end
    end
  elseif opts.pid then
    pids[1] = opts.pid
  end
  if first then
    local cfg = { sample_type = first.sample_type, sample_id_all = first.sample_id_all }
    for _, pid in ipairs(pids) do
      for _, raw in ipairs(pd_synth(pid, first.sample_type, first.sample_id_all, first.mmap_data)) do
        w:add(raw, core.decode_record(raw, cfg))
      end
    end
  end
  return w
end

--- Appends one record (its raw bytes; rec decoded, to note mmapped files
-- and sample times).
function Writer:add(raw, rec)
  local ok, err = self.f:write(raw)
  -- a full disk: the first error is kept, close() reports it
  if not ok and not self.err then self.err = tostring(err) end
  self.data_size = self.data_size + #raw
  if rec then
    if rec.type == "sample" then
      self.samples = self.samples + 1
      local t = tonumber(rec.time)
      if t then
        if not self.first_time or t < self.first_time then self.first_time = t end
        if not self.last_time or t > self.last_time then self.last_time = t end
      end
    elseif (rec.type == "mmap2" or rec.type == "mmap") and type(rec.filename) == "string" and
        rec.filename:sub(1, 1) == "/" and not self.files[rec.filename] then
      self.files[rec.filename] = true
      self.file_order[#self.file_order + 1] = rec.filename
    end
  end
end

-- one BUILD_ID entry: header, pid, 20+4 bytes of id and size, padded name
local function slurp(path)
  return fs.read(path, true)
end

local TRACEFS = { "/sys/kernel/tracing", "/sys/kernel/debug/tracing" }

-- TRACING_DATA (perf's trace-event-info, version 0.6): the tracefs formats
-- perf needs to name tracepoint events (perf refuses a file with
-- tracepoint attrs and no formats); nil when no attr is a tracepoint
local function tracing_data(attrs)
  local systems, order = {}, {}
  for _, a in ipairs(attrs) do
    local sys, ev = tostring(a.name):match("^([%w_]+):([%w_]+)")
    if a.tracepoint and sys then
      if not systems[sys] then systems[sys] = {}; order[#order + 1] = sys end
      systems[sys][#systems[sys] + 1] = ev
    end
  end
  if #order == 0 then return nil end
  local root
  for _, d in ipairs(TRACEFS) do
    if slurp(d .. "/events/header_page") then root = d break end
  end
  if not root then return nil end
  local out = { string.char(23, 8, 68) .. "tracing" .. "0.6\0", string.char(0, 8), u32(4096) }
  for _, h in ipairs({ "header_page", "header_event" }) do
    local body = slurp(root .. "/events/" .. h) or ""
    out[#out + 1] = h .. "\0" .. u64(#body) .. body
  end
  out[#out + 1] = u32(0)                      -- ftrace's own formats: none
  out[#out + 1] = u32(#order)
  for _, sys in ipairs(order) do
    out[#out + 1] = sys .. "\0" .. u32(#systems[sys])
    for _, ev in ipairs(systems[sys]) do
      local body = slurp(root .. "/events/" .. sys .. "/" .. ev .. "/format") or ""
      out[#out + 1] = u64(#body) .. body
    end
  end
  out[#out + 1] = u32(0) .. u32(0) .. u64(0)   -- kallsyms, printk formats, saved cmdlines
  return concat(out)
end

local function build_id_entry(name, id, cpumode)
  local len = align(#name + 1, NAME_ALIGN)
  local bid = id .. rep("\0", 20 - #id) .. string.char(#id) .. rep("\0", 3)
  return u32(0) .. u16(cpumode + BUILD_ID_SIZE_FLAG, 36 + len) .. u32(-1) .. bid ..
         name .. rep("\0", len - #name)
end

--- Appends a LOST_SAMPLES record: n samples the kernel dropped (read_format
-- LOST), as perf record writes one at its end (one per event); `perf
-- report` prints them as "Total Lost Samples".
-- @tparam number n the samples lost
-- @tparam[opt] number i the event's index in `create`'s list (1): its
--   first id goes in the record's sample_id
function Writer:lost_samples(n, i)
  local a = self.attrs[i or 1] or self.attrs[1]
  local st = a and a.sample_type
  local trailer = a and a.sample_id_all and sample_id_trailer(st, 0, 0, a.ids[1] or 0) or ""
  local raw = u32(RT.lost_samples) .. u16(0, 16 + #trailer) .. u64(n) .. trailer
  self:add(raw)
end

--- Ends a round: every record of the rings up to now was written (perf
-- sorts the records before it and flushes them, so its queue stays small).
function Writer:round()
  self:add(u32(FINISHED_ROUND) .. u16(0, 8))
end

function Writer:features()
  local feats = {}
  local function str(file) return pstring(read_first_line(file) or "") end
  feats[FEAT.hostname] = str("/proc/sys/kernel/hostname")
  feats[FEAT.osrelease] = str("/proc/sys/kernel/osrelease")
  feats[FEAT.version] = pstring(VERSION)
  feats[FEAT.arch] = pstring(arch())
  local online = count_cpus(read_first_line("/sys/devices/system/cpu/online"))
  local possible = count_cpus(read_first_line("/sys/devices/system/cpu/possible"))
  feats[FEAT.nrcpus] = u32(possible > 0 and possible or online, online)
  feats[FEAT.total_mem] = u64(total_mem_kb())
  local cl = { u32(#self.cmdline) }
  for _, a in ipairs(self.cmdline) do cl[#cl + 1] = pstring(tostring(a)) end
  feats[FEAT.cmdline] = concat(cl)
  local ed = { u32(#self.attrs, self.attr_size) }
  for _, a in ipairs(self.attrs) do
    ed[#ed + 1] = a.bytes .. u32(#a.ids) .. pstring(a.name)
    for _, id in ipairs(a.ids) do ed[#ed + 1] = u64(id) end
  end
  feats[FEAT.event_desc] = concat(ed)
  local bids = {}
  local kid = pd_build_id("/sys/kernel/notes")
  if kid then bids[#bids + 1] = build_id_entry("[kernel.kallsyms]", kid, MISC.kernel) end
  for _, file in ipairs(self.file_order) do
    local id = pd_build_id(file)
    if id then bids[#bids + 1] = build_id_entry(file, id, MISC.user) end
  end
  feats[FEAT.build_id] = concat(bids)
  feats[FEAT.tracing_data] = tracing_data(self.attrs)
  if self.first_time then feats[FEAT.sample_time] = u64(self.first_time, self.last_time) end
  return feats
end

--- Writes the feature sections and the header; closes the file.
-- @treturn boolean|nil true, or nil, msg
function Writer:close()
  local f = self.f
  local feats = self:features()
  local bits = {}
  for b in pairs(feats) do bits[#bits + 1] = b end
  table.sort(bits)
  local off = self.data_offset + self.data_size + 16 * #bits
  local table_, bodies, map = {}, {}, 0
  for _, b in ipairs(bits) do
    local body = feats[b]
    table_[#table_ + 1] = u64(off, #body)
    bodies[#bodies + 1] = body
    off = off + #body
    map = map + 2 ^ b
  end
  local wok, werr = f:write(concat(table_), concat(bodies))
  if not wok and not self.err then self.err = tostring(werr) end
  local header = MAGIC .. u64(HEADER_SIZE, self.attr_size + 16,
                              self.attrs_offset, (self.attr_size + 16) * #self.attrs,
                              self.data_offset, self.data_size, 0, 0, map, 0, 0, 0)
  f:seek("set", 0)
  wok, werr = f:write(header)
  if not wok and not self.err then self.err = tostring(werr) end
  local ok, err = f:close()
  if not ok and not self.err then self.err = tostring(err) end
  if self.err then return nil, self.err end
  return true
end

return M
