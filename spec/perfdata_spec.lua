-- luaperf record -o FILE.data writes perf.data that Debian's perf reads:
-- `perf script -i` shows the samples this spec decodes from the same file
-- (count, pid/tid, time, ip, the symbol our symbolizer gives), `perf
-- report` names the known top function, `perf report --header-only` and
-- `perf buildid-list` show the feature sections.  Runs the tool under the
-- suite's interpreter.
local U = require("support.util")
local stats = require("support.stats")
local core = require("perf_event.core")

local interp = U.lua_cmd()

local sh = U.sh

local function luaperf(args)
  local out = sh(interp .. " bin/luaperf " .. args .. " 2>&1; echo \"rc=$?\"")
  return out:gsub("rc=%d+\n?$", ""), tonumber(out:match("rc=(%d+)\n?$"))
end

local have_perf = sh("command -v perf") ~= ""
local format = string.format

local function hexip(v) return (U.hex(v):lower():gsub("^0+(.)", "%1")) end

local slurp = U.slurp

-- little-endian unsigned at 0-based offset off (values below 2^53)
local function le(s, off, n)
  local v = 0
  for i = off + n, off + 1, -1 do v = v * 256 + s:byte(i) end
  return v
end

-- our reading of the file: the header's sections, the attrs, and the data
-- section's records decoded by core.decode_record with the file's attr
local function parse(path)
  local s = slurp(path)
  assert.equal("PERFILE2", s:sub(1, 8))
  assert.equal(104, le(s, 8, 8))
  local attr_size = le(s, 16, 8)
  local attrs_off, attrs_size = le(s, 24, 8), le(s, 32, 8)
  local data_off, data_size = le(s, 40, 8), le(s, 48, 8)
  local attrs = {}
  for off = attrs_off, attrs_off + attrs_size - 1, attr_size do
    local a = core.attr_decode(s:sub(off + 1, off + attr_size - 16))
    local ids_off, ids_size = le(s, off + attr_size - 16, 8), le(s, off + attr_size - 8, 8)
    a.ids = {}
    for k = ids_off, ids_off + ids_size - 1, 8 do a.ids[#a.ids + 1] = le(s, k, 8) end
    attrs[#attrs + 1] = a
  end
  assert.equal(1, #attrs)
  local recs, off = {}, data_off
  while off < data_off + data_size do
    local size = le(s, off + 6, 2)
    assert.truthy(size >= 8 and off + size <= data_off + data_size, "record size " .. size)
    recs[#recs + 1] = core.decode_record(s:sub(off + 1, off + size),
      { sample_type = attrs[1].sample_type, sample_id_all = attrs[1].sample_id_all })
    off = off + size
  end
  assert.equal(data_off + data_size, off)
  return { attrs = attrs, recs = recs, size = #s, data_end = data_off + data_size }
end

local function samples(p)
  local out = {}
  for _, r in ipairs(p.recs) do if r.type == "sample" then out[#out + 1] = r end end
  return out
end

-- `perf script -G -F pid,tid,time,ip,sym,dso` lines as tables
local function perf_script(path)
  local out = sh("perf script -G -F pid,tid,time,ip,sym,dso -i " .. path .. " 2>/dev/null")
  local rows = {}
  for line in out:gmatch("[^\n]+") do
    local pid, tid, sec, usec, ip, rest = line:match("^%s*(%-?%d+)/(%-?%d+)%s+(%d+)%.(%d+):%s+(%x+)%s+(.*)$")
    assert.truthy(pid, "unexpected perf script line: " .. line)
    local sym, dso = rest:match("^(.-)%s*%((.*)%)$")
    -- the kernel may write pid/tid -1 (a task leaving): perf prints it signed, we decode a u32
    rows[#rows + 1] = { pid = tonumber(pid) % 4294967296, tid = tonumber(tid) % 4294967296,
                        usec = tonumber(sec) * 1e6 + tonumber(usec), ip = ip, sym = sym, dso = dso }
  end
  return rows
end


-- the decoded samples and perf script's rows are the same samples in the same
-- order; unordered: as sets (system wide, the per-CPU rings are merged by
-- time per drain only, perf sorts the whole file)
local function same_samples(ours, rows, unordered)
  if unordered then
    local function key(usec, tid, ip) return format("%020d %010d %s", usec, tid, ip) end
    local a, b = {}, {}
    for _, r in ipairs(ours) do
      a[#a + 1] = key(math.floor(tonumber(r.time) / 1000), r.tid % 4294967296, hexip(r.ip))
    end
    for _, row in ipairs(rows) do b[#b + 1] = key(row.usec, row.tid, row.ip) end
    table.sort(a)
    table.sort(b)
    local missing = {}
    local inb = {}
    for _, k in ipairs(b) do inb[k] = (inb[k] or 0) + 1 end
    for _, k in ipairs(a) do
      if (inb[k] or 0) > 0 then inb[k] = inb[k] - 1 else missing[#missing + 1] = k end
    end
    assert.equal(0, #missing, "samples perf script does not show: " .. table.concat(missing, ", "))
    assert.equal(#ours, #rows)
    return
  end
  assert.equal(#ours, #rows)
  for i, r in ipairs(ours) do
    local row = rows[i]
    assert.equal(r.pid % 4294967296, row.pid)
    assert.equal(r.tid % 4294967296, row.tid)
    assert.equal(math.floor(tonumber(r.time) / 1000), row.usec)
    assert.equal(hexip(r.ip), row.ip)
  end
end

describe("luaperf record -o FILE.data", function()
  local base, tmp
  before_each(function() base = os.tmpname() tmp = base .. ".data" end)
  after_each(function() os.remove(tmp) os.remove(base) end)

  it("perf script shows exactly the getppid(2) samples we decode, pid/tid/time/ip for ip", function()
    U.need_tracing()
    if not have_perf then U.pending("perf is not installed") end
    local out, rc = luaperf("record -e syscalls:sys_enter_getppid -c 1 -o " .. tmp ..
                            " -- build/test/petarget getppid 321")
    assert.equal(0, rc, out)
    assert.truthy(out:find("321 samples written to " .. tmp .. " (perf.data)", 1, true), out)
    local p = parse(tmp)
    local ours = samples(p)
    assert.equal(321, #ours)
    local child = ours[1].pid
    local last = 0
    for _, r in ipairs(ours) do
      assert.equal(child, r.pid)
      assert.equal(child, r.tid)
      assert.truthy(tonumber(r.time) >= last, "samples out of time order")
      last = tonumber(r.time)
    end
    -- the kernel's COMM (exec) record names the child as perf shows it
    local comm
    for _, r in ipairs(p.recs) do if r.type == "comm" and r.pid == child then comm = r.comm end end
    assert.equal("petarget", comm)
    local rows = perf_script(tmp)
    same_samples(ours, rows)
    -- sys_enter's ip is the user-mode ip of the syscall: inside libc's getppid
    for _, row in ipairs(rows) do
      assert.truthy(row.sym:find("getppid", 1, true), row.sym)
      assert.truthy(row.dso:find("libc.so", 1, true), row.dso)
    end
    local comms = sh("perf script -F comm -i " .. tmp .. " 2>/dev/null | sort | uniq -c")
    assert.truthy(comms:match("^%s*321%s+petarget%s*\n$"), comms)
  end)

  it("tracepoint fields: perf script decodes the RAW data through our TRACING_DATA as we do", function()
    U.need_tracing()
    if not have_perf then U.pending("perf is not installed") end
    local out, rc = luaperf("record -e syscalls:sys_enter_openat -c 1 -o " .. tmp .. " -- cat /dev/null")
    assert.equal(0, rc, out)
    local fmt = require("perf_event.tracepoint").tracepoint("syscalls:sys_enter_openat")
    local ours = samples(parse(tmp))
    assert.truthy(#ours > 0, "no openat")
    local lines = {}
    for l in sh("perf script -F tid,time,trace -i " .. tmp .. " 2>/dev/null"):gmatch("[^\n]+") do
      lines[#lines + 1] = l
    end
    assert.equal(#ours, #lines)
    for i, r in ipairs(ours) do
      local f = require("perf_event.records").decode_fields(r.raw, fmt)
      local want = format("dfd: 0x%08x, filename: 0x%s, flags: 0x%08x, mode: 0x%08x",
                          f.dfd % 4294967296, hexip(f.filename), f.flags, f.mode)
      assert.truthy(lines[i]:find(want, 1, true), lines[i] .. " vs " .. want)
    end
  end)

  it("-g: perf report names pet_spin_inner top under pet_spin; perf script's symbols are ours", function()
    if not have_perf then U.pending("perf is not installed") end
    local out, rc = luaperf("record -g -F " .. math.floor(1e9 / U.sample_period(999)) .. " -o " .. tmp ..
                            " -- build/test/petarget spin 200000000")
    assert.equal(0, rc, out)
    local p = parse(tmp)
    local ours = samples(p)
    assert.truthy(#ours > 20, "only " .. #ours .. " samples")
    local rows = perf_script(tmp)
    same_samples(ours, rows)
    -- our symbolizer, fed the file's own MMAP2 records, names what perf names
    local sym = require("perf_event.symbols").new()
    local named = 0
    for _, r in ipairs(p.recs) do if r.type == "mmap2" or r.type == "mmap" then sym:record(r) end end
    for i, r in ipairs(ours) do
      if rows[i].dso:find("libpetarget.so", 1, true) then
        assert.equal(rows[i].sym:gsub("%+0x%x+$", ""), sym:name(r.ip, r.pid))
        named = named + 1
      end
    end
    assert.truthy(named > #ours / 2, named .. " of " .. #ours .. " samples in libpetarget.so")
    local rep = sh("perf report --stdio --no-children --sort sym -g none -i " .. tmp .. " 2>/dev/null")
    local top = rep:match("\n%s+[%d.]+%%%s+%[%.%]%s+(%S+)")
    assert.equal("pet_spin_inner", top, rep)
    local script = sh("perf script -i " .. tmp .. " 2>/dev/null")
    assert.truthy(script:find("pet_spin_inner%+0x%x+ %(.-libpetarget%.so%)\n%s+%x+ pet_spin%+0x%x+"), "no call chain")
  end)

  it("perf report --header-only shows the feature sections; perf buildid-list the build-ids", function()
    if not have_perf then U.pending("perf is not installed") end
    local out, rc = luaperf("record -c 1000000 -o " .. tmp .. " -- build/test/petarget spin 20000000")
    assert.equal(0, rc, out)
    local h = sh("perf report --header-only -i " .. tmp .. " 2>&1")
    local function line(key) return h:match("\n# " .. key .. " : ([^\n]*)") end
    assert.equal(sh("uname -n"):gsub("\n$", ""), line("hostname"))
    assert.equal(sh("uname -r"):gsub("\n$", ""), line("os release"))
    assert.equal(sh("uname -m"):gsub("\n$", ""), line("arch"))
    assert.equal(sh("nproc"):gsub("\n$", ""), line("nrcpus online"))
    assert.equal("luaperf record -c 1000000 -o " .. tmp .. " -- build/test/petarget spin 20000000",
                 (line("cmdline"):gsub("%s+$", "")))
    local ev = line("event")
    assert.truthy(ev and ev:find("^name = cpu%-clock,"), h)
    local p = parse(tmp)
    for _, id in ipairs(p.attrs[1].ids) do assert.truthy(ev:find(tostring(id), 1, true), ev) end
    assert.truthy(line("time of first sample"), h)
    -- build-ids: the ELF notes readelf shows, for the files the kernel mapped
    local ids = sh("perf buildid-list -i " .. tmp .. " 2>/dev/null")
    for _, f in ipairs({ "build/test/petarget", "build/test/libpetarget.so" }) do
      local id = sh("readelf -n " .. f):match("Build ID: (%x+)")
      assert.truthy(id, f)
      assert.truthy(ids:find(id .. " [^\n]*" .. f:gsub("%.", "%%.") .. "\n"), ids)
    end
  end)

  it("kernel samples: perf names them through our [kernel.kallsyms] MMAP, as our symbolizer does", function()
    U.need_kernel()
    if not have_perf then U.pending("perf is not installed") end
    local out, rc = luaperf("record -c 100000 -o " .. tmp .. " -- build/test/petarget getppid 1000000")
    assert.equal(0, rc, out)
    local p = parse(tmp)
    local ours = samples(p)
    local rows = perf_script(tmp)
    same_samples(ours, rows)
    local sym = require("perf_event.symbols").new()
    local kernel, same, names, addr, bad = 0, 0, {}, {}, {}
    for l in io.lines("/proc/kallsyms") do
      local a, name = l:match("^(%x+) [Tt] ([%w_.]+)$")
      if a then addr[name] = a end
    end
    for i, row in ipairs(rows) do
      if row.dso == "[kernel.kallsyms]" then
        kernel = kernel + 1
        names[row.sym] = true
        local n = sym:name(ours[i].ip, ours[i].pid)
        -- an alias at the same address (__x64_sys_getppid = __do_sys_getppid) is the same name
        if n == row.sym or (addr[n] and addr[n] == addr[row.sym]) then same = same + 1
        else bad[#bad + 1] = row.sym .. "/" .. tostring(n) end
      end
    end
    assert.truthy(kernel > 0, "no kernel sample")
    -- getppid's own code: __x64_sys_getppid is small (6-13 samples of ~650
    -- here; none once in a full run), the __task_pid_nr_ns it calls ~100
    local seen = {}
    for n in pairs(names) do seen[#seen + 1] = n end
    assert.truthy(names.__x64_sys_getppid or names.__task_pid_nr_ns,
                  "perf named no sample in getppid's code: " .. table.concat(seen, " ", 1, math.min(#seen, 20)))
    local ok, why = stats.at_least("kernel names that agree", same, kernel, 0.9)
    assert.truthy(ok, why .. ": " .. table.concat(bad, " ", 1, math.min(#bad, 10)))
  end)

  it("-p PID: the threads and mappings of a running process come from /proc, perf names its code", function()
    if not have_perf then U.pending("perf is not installed") end
    local pidfile = os.tmpname()
    os.execute("build/test/petarget spin 3000000000 >/dev/null & echo $! > " .. pidfile)
    local target = tonumber(slurp(pidfile))
    os.remove(pidfile)
    os.execute("sleep 0.2")
    -- the target's CPU time over the recording, in ms: on a busy machine
    -- (two suites side by side, other users) it gets less than the 0.5 s
    -- of wall time, and the samples (one per ms of cpu-clock) follow it
    local tck = tonumber((sh("getconf CLK_TCK")))
    local function cpu_ms()
      local st = slurp("/proc/" .. target .. "/stat"):match("%) (.*)")
      local f = {}
      for x in st:gmatch("%S+") do f[#f + 1] = x end
      return (tonumber(f[12]) + tonumber(f[13])) * 1000 / tck     -- utime, stime
    end
    local cpu0 = cpu_ms()
    local out, rc = luaperf("record -c 1000000 -o " .. tmp .. " -p " .. target .. " -- sleep 0.5")
    local cpu = cpu_ms() - cpu0
    os.execute("kill " .. target)
    assert.equal(0, rc, out)
    local p = parse(tmp)
    local comm, mapped
    for _, r in ipairs(p.recs) do
      if r.type == "comm" and r.pid == target and r.tid == target then comm = r.comm end
      if r.type == "mmap2" and r.pid == target and r.filename:find("libpetarget.so", 1, true) then mapped = r end
    end
    assert.equal("petarget", comm)
    assert.truthy(mapped, "no MMAP2 of libpetarget.so")
    local ours = samples(p)
    -- at least half the target's CPU time in ms (the recording is shorter
    -- than the span measured, which includes luaperf's start), at most all
    -- of it (20: two readings of 10 ms ticks), and some
    local what = #ours .. " samples for " .. cpu .. " ms of CPU"
    local enough, few = stats.count_at_least("samples", #ours, math.max(0, cpu - 40), 0.5)
    assert.truthy(#ours >= 10 and enough, what .. "; " .. few)
    assert.truthy(#ours <= cpu + 20, what)
    local rows = perf_script(tmp)
    same_samples(ours, rows)
    local inner = 0
    for _, row in ipairs(rows) do
      assert.equal(target, row.pid)
      if row.sym == "pet_spin_inner" and row.dso:find("libpetarget.so", 1, true) then inner = inner + 1 end
    end
    local ok, why = stats.at_least("samples named pet_spin_inner", inner, #rows, 0.8)
    assert.truthy(ok, why)
  end)

  -- perf record's own attr and opens (-vv) for the same target options
  local function perf_attr(opts)
    local out = sh("perf record -vv " .. opts .. " -c 1000000 -o /dev/null -- sleep 0.05 2>&1")
    local ok
    for _, b in ipairs(U.perf_attr_blocks(out)) do   -- the sampling event (not perf's dummy sideband)
      if not b.failed and #b.opens > 0 and b.fields["{ sample_period, sample_freq }"] == "1000000" then ok = b end
    end
    assert.truthy(ok, out)
    return ok
  end

  it("-C CPUS: pid -1 on those CPUs, as perf record -C; every sample on them", function()
    U.need_tracing()
    if not have_perf then U.pending("perf is not installed") end
    local out, rc = luaperf("record -C 0 -c 100000 -o " .. tmp .. " -- build/test/petarget spin 50000000")
    assert.equal(0, rc, out)
    local p = parse(tmp)
    local theirs = perf_attr("-C 0")
    assert.equal(#theirs.opens, #p.attrs[1].ids)
    for _, l in ipairs(theirs.opens) do assert.truthy(l:find("pid %-1%s+cpu 0%s"), l) end
    assert.equal(theirs.fields.inherit == "1", p.attrs[1].inherit == true)
    local ours = samples(p)
    assert.truthy(#ours > 0, "no samples")
    for _, r in ipairs(ours) do assert.equal(0, r.cpu) end
    same_samples(ours, perf_script(tmp), true)
  end)

  it("-a: every CPU and every process; perf names the command's pet_spin_inner", function()
    U.need_tracing()
    if not have_perf then U.pending("perf is not installed") end
    local out, rc = luaperf("record -a -c 1000000 -o " .. tmp .. " -- build/test/petarget spin 300000000")
    assert.equal(0, rc, out)
    local p = parse(tmp)
    local theirs = perf_attr("-a")
    assert.equal(#theirs.opens, #p.attrs[1].ids)
    assert.equal(theirs.fields.inherit == "1", p.attrs[1].inherit == true)
    local ours = samples(p)
    local rows = perf_script(tmp)
    same_samples(ours, rows, true)
    local spin = 0
    for _, row in ipairs(rows) do if row.sym == "pet_spin_inner" then spin = spin + 1 end end
    if spin == 0 then
      -- in a chroot perf script names no symbol of any process (its own
      -- perf.data neither): "assertion failed at util/namespaces.c", its
      -- namespace code meeting a root that is not the mount namespace's
      local err = sh("perf script -i " .. tmp .. " 2>&1 >/dev/null")
      if err:find("util/namespaces.c", 1, true) then
        U.pending("perf script cannot name symbols here (a chroot?): " .. err:match("[^\n]*"))
      end
    end
    assert.truthy(spin > 0, "no pet_spin_inner sample among " .. #rows)
  end)

  it("-t TID: that thread only, without inherit as perf record -t", function()
    if not have_perf then U.pending("perf is not installed") end
    local pidfile = os.tmpname()
    os.execute("build/test/petarget spin 3000000000 >/dev/null & echo $! > " .. pidfile)
    local target = tonumber(slurp(pidfile))
    os.remove(pidfile)
    os.execute("sleep 0.2")
    local out, rc = luaperf("record -t " .. target .. " -c 1000000 -o " .. tmp .. " -- sleep 0.3")
    local theirs = perf_attr("-t " .. target)
    os.execute("kill " .. target)
    assert.equal(0, rc, out)
    local p = parse(tmp)
    assert.equal(theirs.fields.inherit == "1", p.attrs[1].inherit == true)
    for _, l in ipairs(theirs.opens) do assert.truthy(l:find("pid " .. target .. "%s"), l) end
    local ours = samples(p)
    assert.truthy(#ours > 20, #ours .. " samples")
    for _, r in ipairs(ours) do assert.equal(target, r.tid) end
    local rows = perf_script(tmp)
    same_samples(ours, rows)
    local inner = 0
    for _, row in ipairs(rows) do if row.sym == "pet_spin_inner" then inner = inner + 1 end end
    local ok, why = stats.at_least("samples named pet_spin_inner", inner, #rows, 0.8)
    assert.truthy(ok, why)
  end)

  it("an unwritable FILE.data fails before the command runs", function()
    local marker = os.tmpname()
    os.remove(marker)
    local out, rc = luaperf("record -o /nonexistent-dir/x.data -- touch " .. marker)
    assert.equal(1, rc, out)
    assert.truthy(out:find("/nonexistent-dir/x.data: No such file or directory", 1, true), out)
    local f = io.open(marker, "r")
    if f then f:close() os.remove(marker) end
    assert.falsy(f, "the command ran")
  end)

  it("--folded keeps folded stacks for a .data name; a .folded name stays folded", function()
    local out, rc = luaperf("record --folded -c 1000000 -o " .. tmp .. " -- build/test/petarget spin 20000000")
    assert.equal(0, rc, out)
    local s = slurp(tmp)
    assert.truthy(s:find("^petarget;pet_spin_inner %d+\n") or s:find("\npetarget;pet_spin_inner %d+\n"), s)
    assert.falsy(s:find("PERFILE2", 1, true))
    local folded = tmp:gsub("%.data$", ".folded")
    out, rc = luaperf("record -c 1000000 -o " .. folded .. " -- build/test/petarget spin 20000000")
    os.remove(folded)
    assert.equal(0, rc, out)
    assert.truthy(out:find("stacks", 1, true), out)
  end)
end)
