-- PMU discovery: the real sysfs of this machine, and fixture trees for the
-- forms it lacks.  Expected values come from the files themselves (read
-- with the shell) or from the kernel (opening what we discovered).
local pmu = require("perf_event.pmu")
local parse = require("perf_event.parse")
local u64 = require("perf_event.u64")
local U = require("support.util")

local function sh(cmd) return (U.sh(cmd):gsub("%s+$", "")) end

local FIX = "spec/fixtures/sysfs/"

describe("pmu on this machine", function()
  before_each(function() pmu.set_root(nil) end)

  it("lists every PMU directory of /sys/bus/event_source/devices with its type", function()
    local want = sh("ls /sys/bus/event_source/devices | sort | tr '\\n' ' '")
    local names = {}
    for i, p in ipairs(pmu.pmus()) do
      names[i] = p.name
      assert.are.equal(tonumber(sh("cat /sys/bus/event_source/devices/" .. p.name .. "/type")), p.type)
    end
    assert.are.equal(want, table.concat(names, " "))
  end)

  it("reads msr's format and tsc alias, which open and count", function()
    local msr = pmu.pmu("msr")
    if not msr then pending("no msr PMU") return end
    if not U.is_root() then
      pending("needs root: the msr PMU refuses exclude_kernel, which perf_event_paranoid forces on a user")
      return
    end
    assert.are.same({ { 0, 63 } }, msr.format.event.bits)
    assert.are.equal("config", msr.format.event.config)
    assert.are.equal(sh("cat /sys/bus/event_source/devices/msr/events/tsc"), msr.events.tsc.raw)
    local pe = require("perf_event")
    -- perf's default exclude_guest is refused by msr (EINVAL); perf then
    -- retries without it, and so do we here
    local _, _, errno = pe.open("msr/tsc/")
    if errno then assert.are.equal(22, errno) end
    local ev = assert(pe.open({ event = "msr/tsc/", exclude_guest = false }))
    for _ = 1, 1e5 do end
    local v = ev:read()
    ev:close()
    assert.is_true(v > 0)
  end)

  it("reads perf_event_mux_interval_ms", function()
    local sw = pmu.pmu("software")
    assert.are.equal(tonumber(sh("cat /sys/bus/event_source/devices/software/perf_event_mux_interval_ms")),
      sw.mux_interval_ms)
  end)

  it("returns nil for an unknown or malformed PMU name", function()
    local none, msg = pmu.pmu("nosuch")
    assert.is_nil(none)
    assert.truthy(msg:find('no PMU named "nosuch" (the PMUs here: ', 1, true), msg)
    assert.truthy(msg:find("software", 1, true), msg)
    assert.is_nil(pmu.pmu("../msr"))
    assert.is_nil(pmu.pmu(""))
  end)

  it("sysctl() gives the /proc/sys/kernel values as numbers", function()
    local s = pmu.sysctl()
    assert.are.equal(tonumber(sh("cat /proc/sys/kernel/perf_event_paranoid")), s.paranoid)
    assert.are.equal(tonumber(sh("cat /proc/sys/kernel/perf_event_max_sample_rate")), s.max_sample_rate)
    assert.are.equal(tonumber(sh("cat /proc/sys/kernel/perf_event_mlock_kb")), s.mlock_kb)
    assert.are.equal(tonumber(sh("cat /proc/sys/kernel/perf_event_max_stack")), s.max_stack)
  end)

  it("list() includes every software event, msr/tsc/ and the tracepoints", function()
    local l = pmu.list()
    local set = {}
    for _, n in ipairs(l) do set[n] = true end
    for _, n in ipairs(require("perf_event.events").software_list) do
      assert.is_true(set[n], n)
      assert.is_truthy(parse.parse(n))
    end
    if pmu.pmu("msr") then assert.is_true(set["msr/tsc/"]) end
    local tp = require("perf_event.tracepoint")
    if tp.root() then
      local n = tonumber(sh("find " .. tp.root() .. "/events -mindepth 2 -maxdepth 2 -type d | wc -l"))
      local count = 0
      for _, x in ipairs(l) do if x:find(":", 1, true) then count = count + 1 end end
      assert.are.equal(n, count)
      assert.is_true(set["syscalls:sys_enter_getppid"])
    end
  end)

  it("list() shows only names pe.attr accepts, each resolving to its kind", function()
    local pe = require("perf_event")
    local rejected, kinds = {}, {}
    local l = pe.list()
    for _, n in ipairs(l) do
      local a, msg = pe.attr(n)
      if not a then rejected[#rejected + 1] = n .. ": " .. tostring(msg):gsub("\n.*", "")
      else kinds[a.type] = (kinds[a.type] or 0) + 1 end
    end
    assert.same({}, rejected)
    -- hardware (0), software (1), tracepoints (2), cache (3) all went through
    assert.equal(#require("perf_event.events").software_list, kinds[1])
    assert.equal(#require("perf_event.events").cache_list(), kinds[3])
    assert.is_true((kinds[2] or 0) > 0 or not require("perf_event.tracepoint").root())
  end)

  it("lists the cache names perf accepts (L1-dcache-prefetches, not -prefetchs)", function()
    local cache = require("perf_event.events").cache_list()
    local set = {}
    for _, n in ipairs(pmu.list()) do set[n] = true end
    assert.is_nil(set["L1-dcache-prefetchs"])
    assert.is_true(set["L1-dcache-prefetches"])
    assert.is_true(set["LLC-prefetch-misses"])
    for _, n in ipairs(cache) do assert.is_true(set[n], n) end
    if sh("command -v perf") == "" then pending("perf is not installed") return end
    -- perf parses every one (hardware-less machines say <not supported>, not a syntax error)
    local out = sh("perf stat -x, -e " .. table.concat(cache, ",") .. " -- true 2>&1")
    assert.is_nil(out:find("syntax error", 1, true), out)
    local seen = 0
    for _, n in ipairs(cache) do
      -- (as a user perf adds :u itself, as it does for every event then)
      if out:find("," .. n .. ",", 1, true) or out:find("," .. n .. "\n", 1, true)
         or out:find("," .. n .. ":u,", 1, true) then
        seen = seen + 1
      end
    end
    assert.equal(#cache, seen, out)
    -- and a misspelling is perf's syntax error too: the oracle can fail
    assert.truthy(sh("perf stat -e L1-dcache-prefetchs -- true 2>&1"):find("syntax error", 1, true))
  end)

  it("list(pattern) filters by substring or glob", function()
    assert.are.same({ "task-clock" }, pmu.list("task-clock"))
    for _, n in ipairs(pmu.list("sched:sched_wak*")) do assert.truthy(n:match("^sched:sched_wak")) end
    assert.are.equal(tonumber(sh("ls -d /sys/kernel/tracing/events/sched/sched_wak* | wc -l")),
      #pmu.list("sched:sched_wak*"))
  end)
end)

describe("pmu on fixture trees", function()
  after_each(function() pmu.set_root(nil) end)

  it("parses non-contiguous ranges and single bits", function()
    pmu.set_root(FIX .. "amd")
    local df = pmu.pmu("amd_df")
    assert.are.same({ { 0, 7 }, { 32, 35 }, { 59, 60 } }, df.format.event.bits)
    assert.are.equal(14, df.format.event.width)
    pmu.set_root(FIX .. "intel")
    local cpu = pmu.pmu("cpu")
    assert.are.same({ { 18, 18 } }, cpu.format.edge.bits)
    assert.are.equal("config1", cpu.format.offcore_rsp.config)
    assert.are.same({ { 0, 63 } }, cpu.format.offcore_rsp.bits)
    pmu.set_root(FIX .. "arm")
    assert.are.equal("config3", pmu.pmu("arm_spe_0").format.inv_event_filter.config)
    assert.are.equal("config2", pmu.pmu("arm_spe_0").format.min_latency.config)
  end)

  it("reads the PMU list once per process; refresh() reads it again", function()
    local d = sh("mktemp -d"):gsub("%s+$", "")
    assert(d:find("^/"), d)
    finally(function() sh("rm -rf '" .. d .. "'") end)
    sh("cp -r " .. FIX .. "amd/amd_df " .. FIX .. "amd/ibs_op " .. d .. "/")
    pmu.set_root(d)
    assert.are.same({ "amd_df", "ibs_op" }, pmu.names())
    sh("cp -r " .. FIX .. "amd/cpu " .. d .. "/")
    assert.equal(sh("cat " .. FIX .. "amd/cpu/type"), sh("cat " .. d .. "/cpu/type"))
    assert.are.same({ "amd_df", "ibs_op" }, pmu.names())       -- cached
    assert.equal(2, #pmu.pmus())
    pmu.refresh()
    assert.are.same({ "amd_df", "cpu", "ibs_op" }, pmu.names())
    assert.equal(3, #pmu.pmus())
    -- a returned list is the caller's: changing it leaves the cache alone
    local l = pmu.names()
    l[1] = "x"
    assert.equal("amd_df", pmu.names()[1])
  end)

  it("packs value bit k into the k-th lowest listed bit", function()
    local fmt = pmu.parse_format("config:0-7,32-35")
    local w = u64.zero()
    assert(pmu.pack(fmt, u64.parse("0x1ff"), w))
    assert.are.equal("0x1000000ff", u64.hex(w))
    local ok, err = pmu.pack(fmt, u64.parse("0x1000"), u64.zero())
    assert.is_nil(ok)
    assert.truthy(err:find("12 bits"))
  end)

  it("rejects malformed format lines", function()
    assert.is_nil(pmu.parse_format("config:8-4"))
    assert.is_nil(pmu.parse_format("config4:0"))
    assert.is_nil(pmu.parse_format("config:64"))
    assert.is_nil(pmu.parse_format("garbage"))
  end)

  it("round-trips config1:0-63 with bit 63 set exactly", function()
    pmu.set_root(FIX .. "intel")
    local a = assert(parse.attr("cpu/offcore_rsp=0x8000000000000001,event=0xb7/"))
    assert.are.equal("0x8000000000000001", u64.tohex(a.config1))
    assert.are.equal("0xb7", u64.tohex(a.config))
    -- the C core encodes it bit for bit
    local core = require("perf_event.core")
    local enc = core.attr_encode({ type = 4, config = a.config, config1 = a.config1 })
    assert.are.equal("\1\0\0\0\0\0\0\128", enc:sub(57, 64))
    assert.are.equal("0x8000000000000001", u64.tohex(core.u64(a.config1)))
    local mininteger = rawget(math, "mininteger")
    if mininteger then
      assert.are.equal(mininteger + 1, a.config1)
    elseif jit then
      assert.are.equal("cdata", type(a.config1))
    else
      assert.are.equal("0x8000000000000001", a.config1)
    end
  end)

  it("a missing '?' parameter is an error naming it", function()
    pmu.set_root(FIX .. "arm")
    assert.are.same({ "nodeid" }, pmu.pmu("arm_cmn_0").events.hnf_cache_miss.params)
    local l, err = parse.parse("arm_cmn_0/hnf_cache_miss/")
    assert.is_nil(l)
    assert.truthy(err:find("'nodeid'", 1, true), err)
    l, err = parse.parse("arm_cmn_0/xp_txflit,nodeid=2/")
    assert.is_nil(l)
    assert.truthy(err:find("'occupid'", 1, true), err)
    assert.is_truthy(parse.parse("arm_cmn_0/hnf_cache_miss,nodeid=0x68/"))
  end)

  it("exposes .scale, .unit, .per-pkg and .snapshot", function()
    pmu.set_root(FIX .. "intel")
    local e = pmu.pmu("power").events["energy-pkg"]
    assert.are.equal(tonumber(sh("cat " .. FIX .. "intel/power/events/energy-pkg.scale")), e.scale)
    assert.are.equal("Joules", e.unit)
    assert.is_true(pmu.pmu("msr").events.smi.snapshot)
    local l = assert(parse.parse("power/energy-pkg/"))
    assert.are.equal(e.scale, l[1].scale)
    assert.are.equal("Joules", l[1].unit)
    pmu.set_root(FIX .. "amd")
    assert.is_true(pmu.pmu("amd_df").events.dram_channel_data_controller_0.per_pkg)
  end)

  it("reads caps, cpumask, cpus (hybrid) and the mux interval", function()
    pmu.set_root(FIX .. "intel")
    local cpu = pmu.pmu("cpu")
    assert.are.equal(3, cpu.caps.max_precise)
    assert.are.equal("skylake", cpu.caps.pmu_name)
    assert.are.equal(4, cpu.mux_interval_ms)
    assert.are.same({ 0 }, pmu.pmu("uncore_imc_0").cpumask_list)
    assert.are.same({ 8, 9, 10, 11, 16 }, pmu.pmu("cpu_atom").cpus_list)
    assert.are.equal("0-7", pmu.pmu("cpu_core").cpus)
    pmu.set_root(FIX .. "amd")
    assert.are.same({ 0, 8 }, pmu.pmu("amd_df").cpumask_list)
  end)

  it("an unknown term names the PMU's format terms", function()
    pmu.set_root(FIX .. "intel")
    local l, err = parse.parse("cpu/evnt=0x3c/")
    assert.is_nil(l)
    assert.truthy(err:find("did you mean: event", 1, true), err)
    assert.truthy(err:find("umask", 1, true), err)
    assert.truthy(err:find("cpu/evnt=0x3c/\n        ^", 1, true), err)
  end)
end)
