-- perf as the oracle: for each event string, the attr pe.parse builds must
-- have the identity fields and modifier bits `perf stat -vv -e STR -- true`
-- prints for the same string on this machine (perf prints the attr even when
-- the open then fails); where perf rejects a string, we reject it too.
-- Strings with sampling terms (perf stat refuses them) go through
-- `perf record -vv`, which also prints the attr.
local parse = require("perf_event.parse")
local u64 = require("perf_event.u64")
local U = require("support.util")

local function sh(cmd) return U.sh(cmd .. " 2>&1") end

local quote = U.shell_quote

local have_perf = sh("env -u LD_PRELOAD perf --version"):match("^perf version") ~= nil
local tmpdata = os.tmpname()

-- perf's output for one string is the same in every suite of a run: the
-- first suite to ask keeps it in the run's directory (PE_CACHE, set by
-- tools/runtests), and the others read it there (250 runs of perf each)
local CACHE = os.getenv("PE_CACHE")
local function cached(key, run)
  if not CACHE then return run() end
  local path = CACHE .. "/perf-oracle-" .. key:gsub(".", function(c) return ("%02x"):format(c:byte()) end)
  local f = io.open(path, "rb")
  if f then
    local out = f:read("*a")
    f:close()
    return out
  end
  local out = run()
  -- (written whole, then renamed: a suite beside it reads all of it or none)
  local tmp = ("%s.%s"):format(path, os.getenv("PE_SUITE") or "busted")
  f = assert(io.open(tmp, "wb"))
  f:write(out)
  f:close()
  assert(os.rename(tmp, path))
  return out
end

-- perf -vv output -> array of {fields=..., failed=bool} attr blocks
local function perf_blocks(str, mode)
  local cmd
  if mode == "record" then
    cmd = "env -u LD_PRELOAD perf record -vv -o " .. tmpdata .. " -e " .. quote(str) .. " -- true"
  else
    cmd = "env -u LD_PRELOAD perf stat -vv -e " .. quote(str) .. " -- true"
  end
  local out = cached((mode or "stat") .. " " .. str, function() return sh(cmd) end)
  return U.perf_attr_blocks(out), out
end

local PERF_KEY = {
  config1 = "{ bp_addr, config1 }", bp_addr = "{ bp_addr, config1 }",
  config2 = "{ bp_len, config2 }", bp_len = "{ bp_len, config2 }",
  sample_period = "{ sample_period, sample_freq }", sample_freq = "{ sample_period, sample_freq }",
}
local IDENTITY = { "type", "config", "config1", "config2", "bp_type" }
local FLAGS = { "exclude_user", "exclude_kernel", "exclude_hv", "exclude_idle", "exclude_host",
  "exclude_guest", "pinned", "exclusive", "precise_ip" }

local function norm(v)
  if v == nil or v == false then return "0x0" end
  if v == true then return "0x1" end
  return u64.tohex(v) or tostring(v)
end

local function compare(ours, theirs, keys)
  for _, k in ipairs(keys) do
    local mine = ours[k]
    if (k == "config1" or k == "config2") and ours.type == 5 then
      mine = (k == "config1") and ours.bp_addr or ours.bp_len
    end
    local pv = theirs[PERF_KEY[k] or k]
    assert.are.equal(norm(pv), norm(mine), "field " .. k)
  end
end

-- strings and what perf must do with them
local ACCEPT = {
  -- generic hardware names and aliases (B4, H13)
  "cycles", "cpu-cycles", "instructions", "cache-references", "cache-misses",
  "branch-instructions", "branches", "branch-misses", "bus-cycles", "stalled-cycles-frontend",
  "idle-cycles-frontend", "stalled-cycles-backend", "idle-cycles-backend", "ref-cycles",
  -- software names and aliases (B6, H14)
  "cpu-clock", "task-clock", "page-faults", "faults", "context-switches", "cs", "cpu-migrations",
  "migrations", "minor-faults", "major-faults", "alignment-faults", "emulation-faults", "dummy",
  "bpf-output", "cgroup-switches",
  -- hardware cache names, every spelling (B8, H15)
  "L1-dcache", "L1-dcache-loads", "L1-dcache-load-misses", "L1-dcache-stores",
  "L1-dcache-store-misses", "L1-dcache-prefetches", "L1-dcache-prefetch-misses", "l1-d-loads",
  "l1d-load-miss", "L1-data-read-access", "L1-dcache-Reference", "L1-dcache-ops",
  "L1-icache-loads", "L1-icache-load-misses", "L1-icache-prefetches", "l1i-speculative-read",
  "l1-i-speculative-load", "L1-instruction-prefetch-misses", "LLC-loads", "L2-load-misses",
  "LLC-stores", "LLC-write-miss", "dTLB-load-misses", "d-tlb-stores", "Data-TLB-prefetch-misses",
  "iTLB-loads", "iTLB-load-misses", "Instruction-TLB", "i-tlb-read-refs", "branch-loads",
  "branch-load-misses", "bpu-read", "btb-read-miss", "bpc-loads", "node-loads",
  "node-load-misses", "node-stores", "node-prefetches", "L1-dcache-misses",
  "L1-dcache-speculative-load", "l1-d-write-misses", "L1-dcache-misses-loads",
  "L1-dcache-load-load", "L1-dcache-access-misses", "L1-dcache-refs-stores",
  -- raw (B9, H16)
  "r1", "r01c4", "rff", "r0", "r8000000000000000", "rffffffffffffffff", "r1c4:k",
  -- dynamic PMUs, formats and aliases (H17)
  "msr/tsc/", "msr/event=0/", "msr/event=0xff/", "msr/event=18446744073709551615/",
  "msr/event=0xffffffffffffffff/", "msr/tsc,config1=2/", "msr/event=0xff,config1=1/",
  "msr/event/", "msr/event,event=2/", "msr/config=1,event=2/", "msr/event=2,config=1/",
  "msr/config=1,config=2/", "msr/tsc,event=5/", "msr//", "msr/event= 1/", "msr/tsc/u",
  "msr/tsc/uk", "tsc", "uprobe/retprobe/", "uprobe/retprobe,ref_ctr_offset=0x10/",
  "uprobe/ref_ctr_offset=0xffffffff/", "software/config=1/", "breakpoint/config=0/",
  "tracepoint/config=0x174/",
  -- generic terms perf stat accepts
  "task-clock/config=5/", "task-clock/config1=0x12,config2=3/", "task-clock/period=1000,name=x/",
  "task-clock/percore/", "task-clock/metric-id=x/", "task-clock/name='a,b'/", "cycles//",
  "cycles/period=1000/", "cycles/period=1/u", "r1c4/config1=5/", "r1/config1=1/u",
  "L1-dcache-load-misses/name=foo/",
  -- tracepoints (B7, H19), globs expand to several events
  "sched:sched_switch", "syscalls:sys_enter_getppid", "syscalls:sys_enter_getppid:u",
  "sched:sched_switch:k", "sched:sched_wak*", "sched:sched_switch:P",
  -- breakpoints (B29-B31, H20)
  "mem:0x1000", "mem:4096", "mem:0x1000:w", "mem:0x1000/4", "mem:0x1000/2:w", "mem:0x1000:x",
  "mem:0x1000/8:x", "mem:0x1000:r", "mem:0x1000:rwx", "mem:0x1000:wr", "mem:0x1000:xr",
  "mem:0x1000:rw:u", "mem:0x1000/8:rw:k", "mem:0x1000:u", "mem:0x1000/3", "mem:0x1000/16",
  "mem:0xffffffff81000000:x", "mem:0x1000/0", "mem:0x1000:rwu", "mem:0x1000/8:u",
  "mem:0x1000:p", "mem:0x1000:P",
  -- every modifier (H18), alone and combined
  "cycles:u", "cycles:k", "cycles:h", "cycles:uk", "cycles:ku", "cycles:G", "cycles:H",
  "cycles:GH", "cycles:I", "cycles:p", "cycles:pp", "cycles:ppp", "cycles:P", "cycles:S",
  "cycles:D", "cycles:W", "cycles:e", "cycles:b", "cycles:upp", "cycles:Gu", "cycles:uG",
  "cycles:Hk", "cycles:pG", "cycles:Pu", "task-clock:u", "task-clock:k", "task-clock:h",
  "task-clock:P", "task-clock:pP", "task-clock:pppP", "task-clock:ukhGHpPSDIWeb",
  "task-clock:ukhGHppPSDIWeb", "task-clock:", "L1-dcache-load-misses:pp", "msr/tsc/P",
  "instructions:ppp", "page-faults:Iu", "cpu-clock:De", " task-clock", "task-clock ",
  -- lists and groups (H21)
  "task-clock,page-faults", "{task-clock,page-faults}:u", "{task-clock}",
  "{task-clock:k,page-faults}:S", "{task-clock,page-faults}:W", "{task-clock,page-faults}:D",
  "{cycles}:k", "{cycles:u,instructions}:k", "{cycles,instructions}:D",
  "{task-clock}:u,cpu-clock", "foo{task-clock,cpu-clock}", "msr/tsc/,task-clock",
  "{task-clock:u,page-faults:k}:p", "{cpu-clock,sched:sched_switch,mem:0x1000:w}:u",
}

local REJECT = {
  "Cycles", "CPU-CLOCK", "r0x1c4", "R1", "r01c4g", "rfffffffffffffffff", "llc-loads",
  "LLC-LOADS", "LLC-read-miss-miss", "L1-dcache-load-misses-x", "L1-icache-stores",
  "i-tlb-stores", "branch-stores", "branches-loads", "task-clock:pppp", "cycles:x", "cycles:R",
  "task-clock:uu", "task-clock:ku:", "task-clock::u", ":u", "task-clock,,cpu-clock", "{}",
  "task-clock}", "{task-clock,{cpu-clock}}", "cycles/period=1/:u", "msr/tsc/:u", "msr/foo/",
  "msr/event=1,umask=2/", "msr/Event=1/", "msr/event=0x/", "msr/event=-1/", "msr/event=?/",
  "msr/event=0x10000000000000000/", "msr/config=18446744073709551616/",
  "uprobe/ref_ctr_offset=0x100000000/", "uprobe/retprobe=2/", "software/task-clock/",
  "tracepoint/sched:sched_switch/", "sched:nosuch", "nosuch:sched_switch",
  "sched:sched_switch/period=1/", "mem:0x1000/8/name=x/", "mem:0x1000//", "mem:", "mem:abc",
  "mem:0x1000:rr", "mem:0x1000:rwxx", "task-clock/name=a,b/", "task-clock/foo=1/",
  "nosuchevent", "cpu/event=0x3c/", "{cycles:pp}:pp", "",
}

-- sampling terms: perf stat refuses them, perf record prints the attr
local RECORD = {
  { "task-clock/freq=100/", { "sample_freq", "freq" } },
  { "task-clock/period=1000/", { "sample_period" } },
  { "task-clock/max-stack=10/", { "sample_max_stack" } },
  { "task-clock/call-graph=dwarf,stack-size=4096/",
    { "sample_stack_user", "sample_regs_user", "exclude_callchain_user" } },
  { "task-clock/no-inherit/", { "inherit" } },
  { "task-clock/aux-output/", { "aux_output" } },
  { "cpu-clock/period=12345/u", { "sample_period" } },
}

describe("perf oracle (perf stat -vv)", function()
  if not have_perf then
    it("needs perf", function() pending("perf is not installed") end)
    return
  end

  it("covers at least 80 accepted strings", function()
    assert.is_true(#ACCEPT >= 80)
  end)

  for _, str in ipairs(ACCEPT) do
    it("builds what perf builds for '" .. str .. "'", function()
      U.need_tracing()
      local blocks, out = perf_blocks(str)
      assert.is_true(#blocks > 0, "perf rejected '" .. str .. "':\n" .. out)
      local list, err = parse.parse(str)
      assert.is_truthy(list, err)
      -- block i is event i while every open succeeded; after a failure perf
      -- retries or falls back, so later blocks no longer map to our events
      local n = 0
      for i, b in ipairs(blocks) do
        if i > #list then break end
        compare(list[i].attr, b.fields, IDENTITY)
        compare(list[i].attr, b.fields, FLAGS)
        n = n + 1
        if b.failed then break end
      end
      assert.is_true(n >= 1)
      if str:find(",") == nil and not str:find("%*") then
        assert.are.equal(1, #list)
      end
    end)
  end

  for _, str in ipairs(REJECT) do
    it("rejects '" .. str .. "' as perf does", function()
      local blocks, out = perf_blocks(str)
      assert.are.equal(0, #blocks, "perf accepted '" .. str .. "':\n" .. out)
      local list, err = parse.parse(str)
      assert.is_nil(list)
      assert.is_string(err)
      assert.truthy(err:find("'" .. str .. "'", 1, true), err)
      assert.truthy(err:find("\n%s*%^$"), "caret line: " .. err)
    end)
  end
end)

describe("perf oracle (perf record -vv, sampling terms)", function()
  if not have_perf then
    it("needs perf", function() pending("perf is not installed") end)
    return
  end
  for _, case in ipairs(RECORD) do
    local str, keys = case[1], case[2]
    it("builds what perf record builds for '" .. str .. "'", function()
      local blocks, out = perf_blocks(str, "record")
      assert.is_true(#blocks > 0, out)
      local list, err = parse.parse(str)
      assert.is_truthy(list, err)
      compare(list[1].attr, blocks[1].fields, IDENTITY)
      compare(list[1].attr, blocks[1].fields, FLAGS)
      compare(list[1].attr, blocks[1].fields, keys)
    end)
  end
  it("perf stat refuses the sampling terms, as the attr shows", function()
    local blocks = perf_blocks("task-clock/freq=100/")
    assert.are.equal(0, #blocks)
  end)
end)

-- Fixture PMU trees (Intel/AMD/ARM-like, spec/fixtures/sysfs/*): perf itself
-- reads them when they are bind-mounted over /sys/bus/event_source/devices in
-- a private mount namespace, so perf stays the oracle for formats this
-- machine lacks (non-contiguous ranges, config1:0-63, `?` parameters, ...).
local pmu = require("perf_event.pmu")

local FIXTURE_STRINGS = {
  intel = {
    "cpu/event=0x3c/", "cpu/event=0x3c,umask=0x1,edge,inv,cmask=3/", "cpu/cpu-cycles/",
    "cpu/mem-loads/", "cpu/mem-loads,ldlat=30/", "cpu/offcore_rsp=0xffffffffffffffff/",
    "cpu/offcore_rsp=0x8000000000000001,event=0xb7,umask=1/u", "cpu/event=0x100/",
    "cpu/in_tx,in_tx_cp/", "cpu/cycles-ct/k", "cpu/topdown-total-slots/",
    "uncore_imc_0/cas_count_read/", "uncore_imc/cas_count_read/", "imc/cas_count_read/",
    "uncore_imc_*/event=0x4/", "power/energy-pkg/", "power/energy-cores/u", "msr/smi/",
    "cpu/nosuch/", "cpu/event=0x3c,ldlat=3/", "cpu/frontend=0x800000/", "cpu/umask=0x100/",
    "cpu/event=0x3c/pp", "{cpu/event=0x3c/,cpu/event=0xc0/}:u", "cpu/config=0x1234,event=0x3c/",
    "cpu/event=0x3c,config1=0x10/", "cpu/instructions/", "cpu/event=0x3c,name=foo/",
    "cpu_core/event=0x3c/", "cpu_atom/event=0x3c,umask=2/", "mem-loads", "cpu/mem-loads,umask=2/",
  },
  amd = {
    "cpu/event=0x1ff,umask=3/u", "cpu/event=0xfff/", "cpu/event=0x1000/",
    "amd_df/dram_channel_data_controller_0/", "amd_df/event=0x7ff/", "amd_df/event=0x3fff/",
    "amd_df/event=0x4000/", "ibs_op/cnt_ctl/", "ibs_op/cnt_ctl=1/", "ibs_op/cnt_ctl=2/",
    "amd_df/event=0x3fff,umask=0xff/k", "cpu/event=0xc0,inv,cmask=0xff/", "df/event=1/",
  },
  arm = {
    "armv8_pmuv3_0/event=0x11/", "armv8_pmuv3_0/cpu_cycles,long/", "armv8_pmuv3_0/inst_retired/u",
    "arm_spe_0/ts_enable,pa_enable,jitter,load_filter,min_latency=20,event_filter=0x8000000000000002/",
    "arm_cmn_0/hnf_cache_miss,nodeid=0x68/", "arm_cmn_0/hnf_cache_miss/",
    "arm_cmn_0/xp_txflit,occupid=1,nodeid=2/", "arm_cmn_0/xp_txflit,nodeid=2/",
    "arm_cmn_0/wp_dev_sel=0xf/", "arm_cmn_0/wp_dev_sel=0x10/", "arm_cmn_0/wp_val=0xffffffffffffffff/",
    "arm_cmn_0/dtc_cycles/", "arm_cmn_0/nodeid=0xffff,eventid=0x7ff/", "arm_spe_0/min_latency=0x1000/",
    "arm_cmn_0/type=0x5,eventid=0x1,nodeid=0x68/",
  },
}

local can_unshare = have_perf and
  sh("unshare -m true 2>/dev/null && echo yes"):match("yes") ~= nil

-- runs perf stat -vv for every string inside one private mount namespace
local function perf_on_fixture(tree, strings)
  local script = { "mount --bind " .. quote(tree) .. " /sys/bus/event_source/devices || exit 1" }
  for i, s in ipairs(strings) do
    script[#script + 1] = "echo '@@@ " .. i .. "'; perf stat -vv -e " .. quote(s) .. " -- true 2>&1"
  end
  local out = sh("env -u LD_PRELOAD unshare -m sh -c " .. quote(table.concat(script, "\n")))
  local res = {}
  local chunks = {}
  for i, chunk in (out .. "@@@ 0\n"):gmatch("@@@ (%d+)\n(.-)\n?%f[@]") do chunks[#chunks + 1] = { i, chunk } end
  for _, c in ipairs(chunks) do
    local i, chunk = c[1], c[2]
    res[tonumber(i)] = { blocks = U.perf_attr_blocks(chunk), out = chunk }
  end
  res[0] = nil
  return res
end

describe("perf oracle on fixture PMU trees", function()
  if not can_unshare then
    it("needs perf and unshare -m (root)", function() pending("no perf or no mount namespaces") end)
    return
  end
  for tree, strings in pairs(FIXTURE_STRINGS) do
    describe(tree, function()
      local root = "spec/fixtures/sysfs/" .. tree
      local results
      setup(function()
        results = perf_on_fixture(root, strings)
        pmu.set_root(root)
      end)
      teardown(function() pmu.set_root(nil) end)
      for i, str in ipairs(strings) do
        it("agrees with perf on '" .. str .. "'", function()
          local r = results[i]
          assert.is_truthy(r, "no perf output")
          local list, err = parse.parse(str)
          if #r.blocks == 0 then
            assert.is_nil(list, "perf rejects '" .. str .. "' but we accept it:\n" .. r.out)
            assert.truthy(err:find("^", 1, true))
          else
            assert.is_truthy(list, err)
            for j, b in ipairs(r.blocks) do
              if j > #list then break end
              compare(list[j].attr, b.fields, IDENTITY)
              compare(list[j].attr, b.fields, FLAGS)
              if b.failed then break end
            end
          end
        end)
      end
    end)
  end
end)

-- after every test of the file (a removal in a describe body runs before
-- them); perf record moves an existing output file to NAME.old
teardown(function() os.remove(tmpdata) os.remove(tmpdata .. ".old") end)
