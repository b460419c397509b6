-- core.decode_record on synthetic byte buffers built to the documented
-- layouts (doc/coverage.md E): the hardware-only payloads this machine never
-- produces, every record type, and malformed records (clean errors; the
-- asan suite proves no out-of-bounds read).
local core = require("perf_event.core")
local U = require("support.util")

-- little-endian bytes of a u64 given as a number < 2^53 or a 16-digit hex string
local function q(v)
  if type(v) == "string" then
    local t = {}
    for i = 15, 1, -2 do t[#t + 1] = string.char(tonumber(v:sub(i, i + 1), 16)) end
    return table.concat(t)
  end
  return U.le64(v)
end
local function d(v) return U.le64(v):sub(1, 4) end
local function w(v) return U.le64(v):sub(1, 2) end

local function record(type_, misc, body)
  local size = 8 + #body
  return d(type_) .. w(misc) .. w(size) .. body
end

local function decode(bytes, opts)
  return core.decode_record(bytes, opts)
end

describe("synthetic samples", function()
  it("decodes the fixed fields in the kernel's order", function()
    local body = q(77) .. q(0x401000) .. d(10) .. d(11) .. q(12345) .. q(0xdead) .. q(77) ..
                 q(78) .. d(1) .. d(0) .. q(1000)
    local r = assert(decode(record(9, 2, body), { sample_type =
      "identifier|ip|tid|time|addr|id|stream_id|cpu|period" }))
    assert.equal("sample", r.type)
    assert.equal(2, r.misc)
    assert.equal(0x401000, r.ip)
    assert.equal(10, r.pid)
    assert.equal(11, r.tid)
    assert.equal(12345, r.time)
    assert.equal(0xdead, r.addr)
    assert.equal(77, r.id)
    assert.equal(78, r.stream_id)
    assert.equal(1, r.cpu)
    assert.equal(1000, r.period)
  end)

  it("kernel addresses round-trip exactly", function()
    local r = assert(decode(record(9, 1, q("ffffffff81377c60")), { sample_type = "ip" }))
    assert.equal("ffffffff81377c60", U.hex(r.ip))
  end)

  it("callchain context markers become names", function()
    local body = q(5) .. q("ffffffffffffff80") .. q("ffffffff81000000") ..
                 q("fffffffffffffe00") .. q(0x401000) .. q(0x402000)
    local r = assert(decode(record(9, 1, body), { sample_type = "callchain" }))
    assert.equal(5, #r.callchain)
    assert.equal("kernel", r.callchain[1])
    assert.equal("ffffffff81000000", U.hex(r.callchain[2]))
    assert.equal("user", r.callchain[3])
    assert.equal(0x401000, r.callchain[4])
  end)

  it("every marker of core.abi.context decodes to its name; an unnamed one to context_other", function()
    local abi = core.abi
    local names, body = {}, {}
    for name, v in pairs(abi.context) do
      names[#names + 1] = name
      body[#body + 1] = q(U.hex(v):lower())
    end
    assert.equal(6, #names)   -- hv, kernel, user, guest, guest_kernel, guest_user
    body[#body + 1] = q(U.hex(abi.context_max):lower())     -- PERF_CONTEXT_MAX: no name
    local r = assert(decode(record(9, 1, q(#body) .. table.concat(body)), { sample_type = "callchain" }))
    for i, name in ipairs(names) do assert.equal(name, r.callchain[i]) end
    assert.equal(abi.context_other, r.callchain[#names + 1])
    assert.equal("context", abi.context_other)
  end)

  it("read: non-group and group layouts are not swapped", function()
    local one = assert(decode(record(9, 0, q(500) .. q(10) .. q(9) .. q(42)),
      { sample_type = "read", read_format = "total_time_enabled|total_time_running|id" }))
    assert.equal(500, one.read.value)
    assert.equal(10, one.read.time_enabled)
    assert.equal(9, one.read.time_running)
    assert.equal(42, one.read.id)
    local grp = assert(decode(record(9, 0, q(2) .. q(10) .. q(100) .. q(1) .. q(200) .. q(2)),
      { sample_type = "read", read_format = "group|total_time_enabled|id" }))
    assert.equal(2, grp.read.nr)
    assert.equal(10, grp.read.time_enabled)
    assert.equal(100, grp.read.values[1].value)
    assert.equal(1, grp.read.values[1].id)
    assert.equal(200, grp.read.values[2].value)
  end)

  it("raw bytes, then branch stack with hw_idx and entry bitfields", function()
    -- flags: mispred(1) | in_tx(4) | cycles 300 << 4 | type 3 << 20 | spec 2 << 24 |
    --        new_type 5 << 26 | priv 1 << 30
    local flags = 1 + 4 + 300 * 16 + 3 * 2 ^ 20 + 2 * 2 ^ 24 + 5 * 2 ^ 26 + 2 ^ 30
    local body = d(4) .. "abcd" .. q(1) .. q(99) .. q(0x1000) .. q(0x2000) .. q(flags)
    local r = assert(decode(record(9, 0, body), { sample_type = "raw|branch_stack",
      branch_sample_type = "any|hw_index" }))
    assert.equal("abcd", r.raw)
    assert.equal(99, r.branch_stack.hw_idx)
    local e = r.branch_stack[1]
    assert.equal(0x1000, e.from)
    assert.equal(0x2000, e.to)
    assert.is_true(e.mispred)
    assert.is_false(e.predicted)
    assert.is_true(e.in_tx)
    assert.is_false(e.abort)
    assert.equal(300, e.cycles)
    assert.equal(3, e.type)
    assert.equal(2, e.spec)
    assert.equal(5, e.new_type)
    assert.equal(1, e.priv)
  end)

  it("branch counters follow the entries", function()
    local body = q(2) .. q(1) .. q(2) .. q(0) .. q(3) .. q(4) .. q(0) .. q(7) .. q(8)
    local r = assert(decode(record(9, 0, body), { sample_type = "branch_stack",
      branch_sample_type = "any|counters" }))
    assert.equal(7, r.branch_stack[1].counters)
    assert.equal(8, r.branch_stack[2].counters)
  end)

  it("regs (abi none and 64, named by mask), stack_user with dyn_size", function()
    local none = assert(decode(record(9, 0, q(0)), { sample_type = "regs_user", sample_regs_user = 0x3 }))
    assert.equal(0, none.regs_user.abi)
    assert.is_nil(none.regs_user.ax)
    local body = q(2) .. q(11) .. q(22) .. q(0x7fff0000) .. q(16) .. "0123456789abcdef" .. q(8)
    local r = assert(decode(record(9, 0, body), { sample_type = "regs_user|stack_user",
      sample_regs_user = 2 ^ 0 + 2 ^ 8 + 2 ^ 7 }))
    assert.equal(2, r.regs_user.abi)
    assert.equal(11, r.regs_user.ax)
    assert.equal(22, r.regs_user.sp)
    assert.equal(0x7fff0000, r.regs_user.ip)
    assert.equal(16, r.stack_user.size)
    assert.equal("0123456789abcdef", r.stack_user.data)
    assert.equal(8, r.stack_user.dyn_size)
    local empty = assert(decode(record(9, 0, q(0)), { sample_type = "stack_user" }))
    assert.equal(0, empty.stack_user.size)        -- no dyn_size when size is 0
  end)

  it("weight_struct, data_src parts, transaction, regs_intr and the u64 tail", function()
    -- data_src: op LOAD(2) | lvl HIT|L1 (0xa)<<5 | snoop NONE(2)<<19 | lock LOCKED(2)<<24 |
    --           dtlb HIT|L1 (0xa)<<26 | lvl_num L2(2)<<33 | remote<<37 | snoopx FWD<<38 |
    --           blk DATA(2)<<40 | hops 2<<43
    local ds = 2 + 0xa * 2 ^ 5 + 2 * 2 ^ 19 + 2 * 2 ^ 24 + 0xa * 2 ^ 26 + 2 * 2 ^ 33 +
               2 ^ 37 + 2 ^ 38 + 2 * 2 ^ 40 + 2 * 2 ^ 43
    local txn = 2 + 0x20 + 0x42 * 2 ^ 32
    local body = d(1234) .. w(56) .. w(78) .. q(ds) .. q(txn) .. q(2) .. q(0xffff) ..
                 q(0x1000) .. q(5) .. q(4096) .. q(2097152) .. q(8) .. "xyz\0\0\0\0\0"
    local r = assert(decode(record(9, 0, body), { sample_type =
      "weight_struct|data_src|transaction|regs_intr|phys_addr|cgroup|data_page_size|" ..
      "code_page_size|aux", sample_regs_intr = 2 ^ 7 }))
    assert.equal(1234, r.weight_struct.var1_dw)
    assert.equal(56, r.weight_struct.var2_w)
    assert.equal(78, r.weight_struct.var3_w)
    assert.equal(1234, r.weight)
    local s = r.data_src
    assert.equal("load", s.op_names)
    assert.equal("hit|l1", s.lvl_names)
    assert.equal("none", s.snoop_names)
    assert.equal("locked", s.lock_names)
    assert.equal("hit|l1", s.dtlb_names)
    assert.equal("l2", s.lvl_num_name)
    assert.is_true(s.remote)
    assert.equal("fwd", s.snoopx_names)
    assert.equal("data", s.blk_names)
    assert.equal(2, s.hops)
    assert.is_true(r.transaction.transaction)
    assert.is_true(r.transaction.conflict)
    assert.is_false(r.transaction.elision)
    assert.equal(0x42, r.transaction.abort_code)
    assert.equal(0xffff, r.regs_intr.sp)
    assert.equal(0x1000, r.phys_addr)
    assert.equal(5, r.cgroup)
    assert.equal(4096, r.data_page_size)
    assert.equal(2097152, r.code_page_size)
    assert.equal("xyz\0\0\0\0\0", r.aux)     -- the kernel pads aux_size to 8
  end)

  it("PERF_MEM_NA decodes to na everywhere", function()
    local r = assert(decode(record(9, 0, q(0x1e05080021)), { sample_type = "data_src" }))
    for _, k in ipairs({ "op_names", "lvl_names", "snoop_names", "lock_names", "dtlb_names" }) do
      assert.equal("na", r.data_src[k])
    end
    assert.equal("na", r.data_src.lvl_num_name)
  end)
end)

describe("synthetic non-sample records", function()
  local opts = { sample_type = "tid|time|cpu|identifier", sample_id_all = true }
  local trailer = d(100) .. d(101) .. q(555) .. d(1) .. d(0) .. q(9)

  local function dec(type_, misc, body)
    return assert(decode(record(type_, misc, body .. trailer), opts))
  end

  it("mmap, mmap2 (inode and build-id forms) with sample_id trailer", function()
    local r = dec(1, 0x2002, d(1) .. d(2) .. q(0x1000) .. q(0x2000) .. q(0) .. "/a/b\0\0\0\0")
    assert.equal("mmap", r.type)
    assert.equal("/a/b", r.filename)
    assert.is_true(r.data)
    assert.equal(1, r.pid)                 -- body wins over the trailer
    assert.equal(555, r.time)
    assert.equal(1, r.cpu)
    assert.equal(9, r.identifier)
    r = dec(10, 2, d(1) .. d(2) .. q(0x1000) .. q(0x2000) .. q(0) .. d(8) .. d(1) .. q(99) ..
        q(3) .. d(5) .. d(2) .. "/lib/x.so\0\0\0\0\0\0\0")
    assert.equal("mmap2", r.type)
    assert.equal(8, r.maj)
    assert.equal(99, r.ino)
    assert.equal(5, r.prot)
    assert.equal("/lib/x.so", r.filename)
    local bid = string.char(20, 0, 0, 0) .. ("\171"):rep(20)
    r = dec(10, 0x4002, d(1) .. d(2) .. q(0x1000) .. q(0x2000) .. q(0) .. bid .. d(5) .. d(2) ..
        "/bin/true\0\0\0\0\0\0\0")
    assert.equal(("ab"):rep(20), r.build_id)
    assert.is_nil(r.ino)
  end)

  it("lost, comm, exit, fork, throttle, unthrottle, read", function()
    local r = dec(2, 0, q(5) .. q(66))
    assert.equal(66, r.lost)
    r = dec(3, 0x2000, d(7) .. d(7) .. "true\0\0\0\0")
    assert.equal("true", r.comm)
    assert.is_true(r.exec)
    for t, name in pairs({ [4] = "exit", [7] = "fork" }) do
      r = dec(t, 0, d(10) .. d(1) .. d(11) .. d(2) .. q(123))
      assert.equal(name, r.type)
      assert.equal(10, r.pid)
      assert.equal(1, r.ppid)
      assert.equal(123, r.time)
    end
    r = dec(5, 0, q(1) .. q(2) .. q(3))
    assert.equal("throttle", r.type)
    assert.equal(2, r.id)
    r = dec(6, 0, q(1) .. q(2) .. q(3))
    assert.equal("unthrottle", r.type)
    assert.equal(3, r.stream_id)
    r = assert(decode(record(8, 0, d(50) .. d(51) .. q(7) .. q(44) .. trailer),
      { sample_type = opts.sample_type, sample_id_all = true, read_format = "id" }))
    assert.equal(7, r.values.value)
    assert.equal(44, r.values.id)
  end)

  it("aux, itrace_start, lost_samples, switch, switch_cpu_wide", function()
    local r = dec(11, 0, q(4096) .. q(512) .. q(1 + 4 + 0x100))
    assert.is_true(r.truncated)
    assert.is_true(r.partial)
    assert.is_false(r.overwrite)
    assert.equal(1, r.pmu_format_type)
    r = dec(12, 0, d(3) .. d(4))
    assert.equal("itrace_start", r.type)
    r = dec(13, 0, q(17))
    assert.equal(17, r.lost)
    r = dec(14, 0x6000, "")
    assert.is_true(r.out)
    assert.is_true(r.preempt)
    assert.equal(100, r.pid)               -- from the trailer
    r = dec(15, 0, d(200) .. d(201))
    assert.equal(200, r.next_prev_pid)
    assert.is_false(r.out)
  end)

  it("namespaces, ksymbol, bpf_event, cgroup, text_poke, aux_output_hw_id, callchain_deferred", function()
    local ns = ""
    for i = 1, 7 do ns = ns .. q(i) .. q(1000 + i) end
    local r = dec(16, 0, d(1) .. d(1) .. q(7) .. ns)
    assert.equal(7, #r.namespaces)
    assert.equal(1002, r.namespaces.uts.inode)
    r = dec(17, 0, q(0x1000) .. d(64) .. w(1) .. w(1) .. "bpf_prog_x\0\0\0\0\0\0")
    assert.equal("bpf_prog_x", r.name)
    assert.is_true(r.unregister)
    r = dec(18, 0, w(1) .. w(0) .. d(109) .. "\1\2\3\4\5\6\7\8")
    assert.equal(109, r.id)
    assert.equal("0102030405060708", r.tag)
    r = dec(19, 0, q(42) .. "/x/y\0\0\0\0")
    assert.equal("/x/y", r.path)
    r = dec(20, 0, q(0x1000) .. w(2) .. w(3) .. "ab" .. "cde" .. "\0\0\0")
    assert.equal("ab", r.old_bytes)
    assert.equal("cde", r.new_bytes)
    r = dec(21, 0, q(9))
    assert.equal(9, r.hw_id)
    r = dec(22, 0, q(1) .. q(1) .. q(0x400000))
    assert.equal(0x400000, r.callchain[1])
  end)

  it("an unknown type keeps its bytes and is skipped by size", function()
    local r = assert(decode(record(99, 0, "12345678"), {}))
    assert.equal("unknown", r.type)
    assert.equal(99, r.type_id)
    assert.equal("12345678", r.data)
  end)
end)

describe("malformed records are clean errors", function()
  local cases = {
    { "shorter than a header", "\9\0\0\0", {} },
    { "size zero", d(9) .. w(0) .. w(0) .. q(1), { sample_type = "ip" } },
    { "size past the buffer", d(9) .. w(0) .. w(64) .. q(1), { sample_type = "ip" } },
    { "sample shorter than sample_type", record(9, 0, d(1)), { sample_type = "ip" } },
    { "callchain nr too large", record(9, 0, q(1000) .. q(1)), { sample_type = "callchain" } },
    { "huge callchain nr", record(9, 0, q("7fffffffffffffff")), { sample_type = "callchain" } },
    { "raw size past the end", record(9, 0, d(100) .. "abcd"), { sample_type = "raw" } },
    { "branch nr too large", record(9, 0, q(5) .. q(1)), { sample_type = "branch_stack",
      branch_sample_type = "any" } },
    { "regs past the end", record(9, 0, q(2) .. q(1)), { sample_type = "regs_user",
      sample_regs_user = 0xff } },
    { "stack size past the end", record(9, 0, q(4096) .. q(0)), { sample_type = "stack_user" } },
    { "dyn_size > size", record(9, 0, q(8) .. q(0) .. q(16)), { sample_type = "stack_user" } },
    { "aux size past the end", record(9, 0, q(64)), { sample_type = "aux" } },
    { "group read nr too large", record(9, 0, q(100) .. q(1)), { sample_type = "read",
      read_format = "group" } },
    { "namespaces nr too large", record(16, 0, d(1) .. d(1) .. q(50)), {} },
    { "mmap2 build_id_size > 20", record(10, 0x4000, d(1) .. d(1) .. q(0) .. q(0) .. q(0) ..
      string.char(200, 0, 0, 0) .. ("\0"):rep(20) .. d(0) .. d(0)), {} },
    { "trailer longer than the record", record(3, 0, d(1)), { sample_type = "tid|time|id",
      sample_id_all = true } },
    { "text_poke lengths past the end", record(20, 0, q(0) .. w(100) .. w(100)), {} },
  }
  for _, c in ipairs(cases) do
    it(c[1], function()
      local r, err = decode(c[2], c[3])
      assert.is_nil(r)
      assert.is_string(err)
    end)
  end

  it("every truncation of a full sample is an error, never a crash", function()
    local body = q(1) .. d(2) .. d(3) .. q(3) .. q(2) .. q("ffffffffffffff80") .. q(5) ..
                 d(4) .. "wxyz" .. q(2) .. q(1) .. q(2) .. q(8) .. "abcdefgh" .. q(8)
    local opts = { sample_type = "ip|tid|time|callchain|raw|regs_user|stack_user",
                   sample_regs_user = 3 }
    local full = record(9, 0, body)
    assert.is_table(decode(full, opts))
    for n = 8, #full - 8, 8 do
      local cut = full:sub(1, 6) .. w(n) .. full:sub(9, n)
      local r, err = decode(cut, opts)
      assert.is_nil(r)
      assert.is_string(err)
    end
  end)
end)
