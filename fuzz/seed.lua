-- fuzz/seed.lua DIR: writes a seed corpus for the fuzz targets from this
-- kernel: the rings of real sampling events (samples with many sample_type
-- and read_format combinations, mmap/comm/fork/exit/switch/lost records, a
-- write_backward ring), the read(2) results of every read_format, and a few
-- attr-encoder programs.  LuaJIT (the FFI reads the ring bytes); run from
-- the checkout after `make`:  luajit fuzz/seed.lua fuzz/corpus
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = "build/?.so;build/test/luajit/?.so;" .. package.cpath
local ffi = require("ffi")
local pe = require("perf_event")
local petest = require("petest")

local dir = assert(arg[1], "usage: luajit fuzz/seed.lua DIR")
for _, t in ipairs({ "records", "readfmt", "attr" }) do os.execute("mkdir -p " .. dir .. "/" .. t) end

ffi.cdef [[ long read(int fd, void *buf, unsigned long n); ]]

local function le64(v)
  v = ffi.cast("uint64_t", v)
  local b = {}
  for i = 1, 8 do
    b[i] = string.char(tonumber(v % 256))
    v = v / 256
  end
  return table.concat(b)
end

local function save(kind, name, bytes)
  local f = assert(io.open(("%s/%s/%s"):format(dir, kind, name), "wb"))
  f:write(bytes)
  f:close()
end

-- the ring of ev as a records-target input (see fuzz/fuzz_records.c)
local function ring_input(ev, mode)
  local r = assert(ev:ring())
  local a = ev:attr()
  local base = ffi.cast("const char *", r.base)
  local data = ffi.string(base + tonumber(r.data_offset), tonumber(r.data_size))
  if #data > 65536 then data = data:sub(1, 65536) end
  data = data:gsub("%z+$", "")      -- the harness pads with zeros again
  return string.char(mode) .. le64(a.sample_type or 0) .. le64(a.read_format or 0)
    .. le64(a.branch_sample_type or 0) .. le64(a.sample_regs_user or 0)
    .. le64(a.sample_regs_intr or 0) .. le64(r.data_head) .. le64(r.data_tail) .. data
end

local function work()
  petest.getppid(200)
  local t = {}
  for i = 1, 20000 do t[i] = tostring(i) end
  assert(#t == 20000)
  ffi.load("libm.so.6")
  os.execute("true")
end

local n = 0
local function capture(name, spec, opts, mode)
  local ev, err = pe.open(spec, opts)
  if not ev then io.stderr:write("seed ", name, ": ", err, "\n") return end
  ev:enable()
  work()
  ev:disable()
  save("records", name, ring_input(ev, mode or 0))
  n = n + 1
  ev:close()
end

local ALL_SIMPLE = "ip|tid|time|addr|id|stream_id|cpu|period|identifier"
capture("clock-simple", { event = "task-clock", sample_period = 100000, sample_type = ALL_SIMPLE,
  disabled = true }, { pages = 4 })
capture("clock-sideband", { event = "task-clock", sample_period = 200000,
  sample_type = "ip|tid|time|id|cpu|identifier", sample_id_all = true, mmap = true, mmap2 = true,
  comm = true, task = true, context_switch = true, disabled = true, inherit = false }, { pages = 8 }, 1)
capture("getppid-raw", { event = "syscalls:sys_enter_getppid", sample_period = 1,
  sample_type = "ip|tid|time|raw|callchain|period", disabled = true }, { pages = 16 })
capture("getppid-read", { event = "syscalls:sys_enter_getppid", sample_period = 7,
  sample_type = "tid|read|id", read_format = "total_time_enabled|total_time_running|id|lost",
  disabled = true }, { pages = 4 })
capture("clock-regs-stack", { event = "task-clock", sample_period = 300000,
  sample_type = "ip|regs_user|stack_user|weight|data_src|phys_addr|cgroup",
  sample_regs_user = 0xff, sample_stack_user = 256, disabled = true }, { pages = 8 })
capture("getppid-lost", { event = "syscalls:sys_enter_getppid", sample_period = 1,
  sample_type = "ip|tid|time|raw", disabled = true }, { pages = 1 })
capture("getppid-backward", { event = "syscalls:sys_enter_getppid", sample_period = 1,
  sample_type = "ip|tid|time", write_backward = true, disabled = true }, { pages = 2 }, 2)

-- a group with SAMPLE_READ of the whole group
do
  local g = pe.group({ { event = "syscalls:sys_enter_getppid", sample_period = 5,
    sample_type = "tid|time|read" }, "syscalls:sys_enter_getppid", "task-clock" }, { disabled = true })
  if g then
    g:enable(); work(); g:disable()
    local lead = g:members()[1]
    if lead:ring() then save("records", "group-read", ring_input(lead, 0)); n = n + 1 end
    g:close()
  end
end

-- a ring shared by two events with different layouts (mode bit3, E6):
-- the ring's event has id 1 and identifier|ip|tid, the other id 2 and
-- identifier|tid|period|raw (upper half of the sample_type word); both
-- with sample_id_all (mode bits 0 and 4), a COMM of each after the samples
do
  local function rec(type_, body)
    return le64(type_):sub(1, 4) .. le64(0):sub(1, 2) .. le64(8 + #body):sub(1, 2) .. body
  end
  local function d(v) return le64(v):sub(1, 4) end
  local comm = d(30) .. d(31) .. "lua\0\0\0\0\0"
  local data = rec(9, le64(1) .. le64(0x401000) .. d(10) .. d(11)) ..
    rec(9, le64(2) .. d(20) .. d(21) .. le64(7) .. d(4) .. "abcd") ..
    rec(3, comm .. d(10) .. d(11) .. le64(1)) .. rec(3, comm .. d(20) .. d(21) .. le64(2))
  local st = 0x10003 + 0x10502 * 2 ^ 32
  save("records", "shared-ring", string.char(1 + 8 + 16) .. le64(st) .. le64(0) .. le64(0) ..
    le64(0) .. le64(0) .. le64(#data) .. le64(0) .. data)
end

-- read_format: every layout from real read(2)s
local buf = ffi.new("uint8_t[4096]")
for rf = 0, 31 do
  local spec = { event = "task-clock", read_format = rf }
  local lead = pe.open(spec, { pages = false })
  local members = {}
  if rf % 16 >= 8 then            -- GROUP: two more members
    for i = 1, 2 do members[i] = pe.open("page-faults", { group = lead, pages = false }) end
  end
  work()
  local got = tonumber(ffi.C.read(lead:fd(), buf, 4096))
  if got and got > 0 then
    save("readfmt", ("rf%02d"):format(rf), string.char(rf, 255) .. ffi.string(buf, got))
    save("readfmt", ("rf%02d-cap1"):format(rf), string.char(rf, 1) .. ffi.string(buf, got))
  end
  for _, m in ipairs(members) do m:close() end
  lead:close()
end

-- attr programs (fuzz/fuzz_attr.c): key byte < 200 = field index, value
-- byte selects the kind (0 integer, 4 string from the name table, 5 bool,
-- 6 table of names)
local function prog(t) return table.concat(t) end
local function int(v) return string.char(0) .. le64(v) end
local function str(i) return string.char(4, i) end
save("attr", "software-clock", prog({ string.char(0), str(85), string.char(2), int(1) }))
save("attr", "sampling", prog({ string.char(0), int(1), string.char(3), int(4000),
  string.char(5), string.char(6, 3, 69, 70, 71), string.char(6), str(76), string.char(7),
  string.char(5 + 16), string.char(17), string.char(5 + 16) }))
save("attr", "breakpoint", prog({ string.char(0), str(87), string.char(46), str(92),
  string.char(48), int(0x1000), string.char(52), int(8) }))
save("attr", "freq", prog({ string.char(4), int(99), string.char(17), string.char(5) }))
save("attr", "raw-struct", string.char(0xa7) .. string.rep("\255", 136))
print(("seeded %d ring captures, 64 read_format buffers, 5 attr programs into %s"):format(n, dir))
