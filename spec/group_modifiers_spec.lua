-- The group modifiers S (leader sampling) and W (weak group) in pe.group,
-- against the kernel and against what perf itself builds and does:
-- `perf record -vv` for the attrs of `{a,b}:S`, `perf stat -vv` for the
-- reopening of a weak group the kernel refuses.
local pe = require("perf_event")
local core = require("perf_event.core")
local petest = require("petest")
local U = require("support.util")

local ME = U.pid()

local function run(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("*a")
  p:close()
  return out
end

local have_perf = run("env -u LD_PRELOAD perf --version"):find("^perf version") ~= nil

-- perf -vv output -> its attr blocks (U.perf_attr_blocks) and the text
local function perf_vv(args)
  local out = run("env -u LD_PRELOAD perf " .. args)
  return U.perf_attr_blocks(out), out
end

-- perf's names of the sample_type / read_format bits (perf_event_attr_fprintf.c)
local SAMPLE_BITS = { "IP", "TID", "TIME", "ADDR", "READ", "CALLCHAIN", "ID", "CPU", "PERIOD",
  "STREAM_ID", "RAW" }
local READ_BITS = { "TOTAL_TIME_ENABLED", "TOTAL_TIME_RUNNING", "ID", "GROUP", "LOST" }

-- a flags number -> set of perf's names (only the low bits these specs use)
local function bitset(v, names)
  local set = {}
  v = tonumber(v) or 0
  for i, name in ipairs(names) do
    if math.floor(v / 2 ^ (i - 1)) % 2 == 1 then set[name] = true end
  end
  return set
end

-- perf's "IP|TID|..." -> set
local function nameset(s)
  local set = {}
  for name in (s or ""):gmatch("[%u_]+") do set[name] = true end
  return set
end

local function is_zero(v) return v == nil or v == false or v == 0 end

local function drain(ev)
  local out = {}
  for rec in ev:records() do out[#out + 1] = rec end
  return out
end

describe("S: leader sampling", function()
  if not have_perf then
    it("needs perf", function() pending("perf is not installed") end)
  else
    for _, str in ipairs({ "{cpu-clock,page-faults}:S", "{syscalls:sys_enter_getppid,page-faults}:S" }) do
      it("builds the attrs perf record -vv prints for " .. str, function()
        if str:find("syscalls:", 1, true) then U.need_tracing() end
        local all, out = perf_vv("record -vv -o /dev/null -e '" .. str .. "' -- true")
        -- as a user perf retries each refused attr without kernel mode: the
        -- attrs that opened are the ones to compare
        local blocks = {}
        for _, b in ipairs(all) do
          if not b.failed then blocks[#blocks + 1] = b end
        end
        assert.is_true(#blocks >= 2, "perf opened no attrs:\n" .. out)
        local g = assert(pe.group(str, { disabled = true }))
        for i = 1, 2 do
          local theirs, ours = blocks[i].fields, g:event(i):attr()
          assert.equal(tonumber(theirs.type), ours.type)
          assert.same(nameset(theirs.sample_type), bitset(ours.sample_type, SAMPLE_BITS), "sample_type " .. i)
          assert.equal(theirs.freq == "1", ours.freq == true, "freq " .. i)
          local period = theirs["{ sample_period, sample_freq }"]
          if period then
            assert.equal(tonumber(period), ours.freq and ours.sample_freq or ours.sample_period)
          else
            assert.is_true(is_zero(ours.sample_period) and is_zero(ours.sample_freq), "member samples")
          end
          -- perf adds LOST; pe.group reads GROUP|ID|TOTAL_TIME_* (doc/api.md)
          local rf = bitset(ours.read_format, READ_BITS)
          local prf = nameset(theirs.read_format)
          assert.is_true(prf.GROUP and prf.ID and rf.GROUP and rf.ID, "read_format " .. i)
        end
        assert.equal(1, g:event(1):info().pages > 0 and 1 or 0)    -- the leader has a ring
        assert.equal(0, g:event(2):info().pages)                    -- the member none
        g:close()
      end)
    end
  end

  it("each leader sample carries every member's count by id: N getppid -> N samples", function()
    U.need_tracing()
    local g = assert(pe.group("{syscalls:sys_enter_getppid,page-faults}:S", { disabled = true }))
    local lead, member = g:event(1), g:event(2)
    local lid, mid = lead:id(), member:id()
    assert.are_not.equal(lid, mid)
    assert.is_true(g:enable())
    local N, K = 25, 3
    for _ = 1, N do
      petest.touch_pages(K)
      petest.getppid(1)
    end
    assert.is_true(g:disable())
    local t = g:read()
    assert.equal(N, t["syscalls:sys_enter_getppid"])
    local recs = drain(lead)
    assert.equal(N, #recs)
    local prev = 0
    for i, r in ipairs(recs) do
      assert.equal("sample", r.type)
      assert.equal(lid, r.id)
      assert.equal(ME, r.pid)
      assert.equal(1, r.period)
      assert.equal(2, r.read.nr)
      assert.equal(lid, r.read.values[1].id)
      assert.equal(i, r.read.values[1].value)          -- the i-th call's sample counts i
      assert.equal(mid, r.read.values[2].id)
      local pf = r.read.values[2].value
      assert.is_true(pf - prev >= K, ("sample %d: page faults %d after %d"):format(i, pf, prev))
      prev = pf
      assert.is_true(r.read.time_enabled > 0)
    end
    assert.is_true(t["page-faults"] >= prev)
    assert.equal(0, member:info().pages)                -- only the leader samples
    g:close()
  end)

  it("cpu-clock leads at perf record's 4000 Hz and page-faults ride along", function()
    local g = assert(pe.group("{cpu-clock,page-faults}:S", { disabled = true }))
    local a = g:event(1):attr()
    assert.is_true(a.freq)
    assert.equal(math.min(4000, pe.sysctl().max_sample_rate), a.sample_freq)
    local lid, mid = g:event(1):id(), g:event(2):id()
    assert.is_true(g:enable())
    local t0 = os.clock()
    while os.clock() - t0 < 0.15 do petest.touch_pages(16) end
    assert.is_true(g:disable())
    local recs = drain(g:event(1))
    assert.is_true(#recs >= 5, #recs .. " samples in 150 ms of CPU at 4000 Hz")
    local prev_clock, prev_pf = 0, 0
    for _, r in ipairs(recs) do
      assert.equal(lid, r.id)
      assert.equal(lid, r.read.values[1].id)
      assert.equal(mid, r.read.values[2].id)
      assert.is_true(r.read.values[1].value > prev_clock)
      assert.is_true(r.read.values[2].value >= prev_pf)
      prev_clock, prev_pf = r.read.values[1].value, r.read.values[2].value
    end
    assert.is_true(prev_pf >= 16)
    g:close()
  end)

  it("':S' on the first spec of an array; a period and sample_type given are kept", function()
    U.need_tracing()
    local g = assert(pe.group({
      { event = "syscalls:sys_enter_getppid:S", sample_period = 2, sample_type = "tid", name = "calls" },
      "page-faults" }, { disabled = true }))
    assert.same({ TID = true, READ = true, ID = true }, bitset(g:event(1):attr().sample_type, SAMPLE_BITS))
    assert.same({ TID = true, READ = true, ID = true }, bitset(g:event(2):attr().sample_type, SAMPLE_BITS))
    assert.is_true(g:enable())
    petest.getppid(10)
    assert.is_true(g:disable())
    local recs = drain(g:event(1))
    assert.equal(5, #recs)
    for i, r in ipairs(recs) do
      assert.equal(2 * i, r.read.values[1].value)
      assert.equal(g:event(2):id(), r.read.values[2].id)
    end
    g:close()
  end)

  it("without S a group samples nothing, as before", function()
    local g = assert(pe.group("{cpu-clock,page-faults}", { disabled = true }))
    for _, ev in ipairs(g:members()) do
      local a = ev:attr()
      assert.is_true(is_zero(a.sample_type) and is_zero(a.sample_period) and not a.freq)
      assert.equal(0, ev:info().pages)
    end
    g:close()
  end)
end)

-- A group the kernel refuses on this machine: a member may not be pinned
-- or exclusive, nor differ from its leader in inherit (perf_event_open(2):
-- EINVAL); each of them alone opens fine.
local GETPPID = "syscalls:sys_enter_getppid"
local REFUSED = {
  pinned = { event = GETPPID, pinned = true, name = "b" },
  exclusive = { event = GETPPID, exclusive = true, name = "b" },
  inherit = { event = GETPPID, inherit = true, name = "b" },
}

describe("W: weak group", function()
  if have_perf then
    it("falls back as perf stat -vv does for {task-clock,page-faults:D}:W", function()
      local blocks, out = perf_vv("stat -vv -e '{task-clock,page-faults:D}:W' -- true")
      assert.truthy(out:find("sys_perf_event_open failed, error -22", 1, true))
      -- perf's last two opens: each member alone (group_fd -1), read without GROUP|ID
      local reopened = {}
      for _, b in ipairs(blocks) do
        local last = b.opens[#b.opens] or ""
        if last:find("group_fd %-1") and last:find("= %d+$") and not nameset(b.fields.read_format).GROUP then
          reopened[#reopened + 1] = b
        end
      end
      assert.equal(2, #reopened, out)
      local g = assert(pe.group("{task-clock,page-faults:D}:W"))
      assert.is_true(g.fallback)
      assert.equal(22, g.fallback_errno)
      for i, b in ipairs(reopened) do
        local a = g:event(i):attr()
        assert.equal(tonumber(b.fields.config), a.config)
        assert.same(nameset(b.fields.read_format), bitset(a.read_format, READ_BITS))
        assert.equal(b.fields.pinned == "1", a.pinned == true)
      end
      g:close()
    end)
  end

  for why, member in pairs(REFUSED) do
    it("refused (" .. why .. " member): separate events count exactly", function()
      U.need_tracing()
      local base = U.count_perf_fds()
      local g0, err0, errno0 = pe.group({ GETPPID, member })
      assert.is_nil(g0)
      assert.equal(22, errno0)
      assert.truthy(err0:find("EINVAL", 1, true))
      assert.equal(base, U.count_perf_fds())

      local g = assert(pe.group({ GETPPID .. ":W", member }, { disabled = true }))
      assert.is_true(g.fallback)
      assert.equal(22, g.fallback_errno)
      assert.equal(err0, g.fallback_reason)
      assert.equal(err0, g:info().weak_fallback)
      assert.equal(2, #g)
      assert.equal(base + 2, U.count_perf_fds())
      assert.equal(0, g:read()[1])                       -- disabled until enable
      petest.getppid(5)
      assert.is_true(g:enable())
      petest.getppid(37)
      local t = g:read()
      assert.equal(37, t[1])
      assert.equal(37, t[2])
      assert.equal(37, t[GETPPID .. ":W"])             -- names keep their modifiers
      assert.equal(37, t.b)
      assert.equal(t.times_enabled[1], t.time_enabled)
      assert.equal(t.times_running[1], t.time_running)
      assert.is_true(t.times_enabled[2] > 0)
      assert.is_true(g:disable())
      petest.getppid(9)
      assert.is_true(g:reset())
      assert.same({ 0, 0 }, { g:read(t)[1], t[2] })     -- t reused
      assert.is_true(g:enable())
      petest.getppid(4)
      assert.equal(4, g:read().b)
      g:close()
      assert.equal(base, U.count_perf_fds())
    end)
  end

  it("has the group's methods, and says it fell back", function()
    U.need_tracing()
    local g = assert(pe.group({ GETPPID .. ":W", REFUSED.pinned }))
    local s = tostring(g)
    assert.truthy(s:find("^perf_event%.group%({syscalls:sys_enter_getppid:W,b}, weak: fell back to 2 separate events"))
    assert.truthy(s:find("EINVAL", 1, true))
    assert.equal("{syscalls:sys_enter_getppid:W,b}", g:name())
    assert.equal(g:event(1):id(), g:id())
    assert.equal(g:event(1):fd(), g:fd())
    assert.equal(2, #g:members())
    assert.is_true(g:event(2):attr().pinned)
    local rf = bitset(g:event(1):attr().read_format, READ_BITS)
    assert.same({ TOTAL_TIME_ENABLED = true, TOTAL_TIME_RUNNING = true }, rf)
    g:close()
    g:close()                                           -- idempotent
    assert.equal(0, #g)
    assert.equal(0, #g:members())
    assert.equal("perf_event.group(weak, fell back, closed)", tostring(g))
    assert.has_error(function() g:read() end, "attempt to use a closed perf_event.group")
  end)

  it("a group that opens stays the ordinary group", function()
    U.need_tracing()
    local g = assert(pe.group("{syscalls:sys_enter_getppid,page-faults}:W"))
    assert.equal(core.group_mt, getmetatable(g))
    assert.is_nil(g.fallback)
    petest.getppid(6)
    assert.equal(6, g:read()["syscalls:sys_enter_getppid"])
    g:close()
  end)

  it("a member the kernel refuses alone too: nil, both messages, errno; no fd left", function()
    U.need_tracing()
    local base = U.count_perf_fds()
    local g, err, errno = pe.group({ GETPPID .. ":W",
      { event = "mem:0x1000/8:rw", bp_len = 3, pinned = true } })
    assert.is_nil(g)
    assert.equal(22, errno)
    assert.truthy(err:find("^perf_event_open%(mem:0x1000/8:rw%): EINVAL"))
    assert.truthy(err:find("(weak group fallback, after the group failed: perf_event_open(mem:", 1, true))
    assert.equal(base, U.count_perf_fds())
  end)

  it("the leader failing is no group matter: no fallback", function()
    U.need_tracing()
    local g, err, errno = pe.group({ { event = "mem:0x1000/8:rw:W", bp_len = 3 }, GETPPID })
    assert.is_nil(g)
    assert.equal(22, errno)
    assert.is_nil(err:find("weak group fallback", 1, true))
  end)

  it("SW that falls back: the leader still samples its own count, the member counts", function()
    U.need_tracing()
    local g = assert(pe.group({ GETPPID .. ":SW", REFUSED.pinned }, { disabled = true }))
    assert.is_true(g.fallback)
    local lid = g:id()
    assert.is_true(g:enable())
    petest.getppid(7)
    assert.is_true(g:disable())
    local recs = drain(g:event(1))
    assert.equal(7, #recs)
    for i, r in ipairs(recs) do
      assert.equal(lid, r.read.id)
      assert.equal(i, r.read.value)
    end
    assert.equal(7, g:read().b)
    assert.equal(0, g:event(2):info().pages)
    g:close()
  end)
end)

describe("S on a single event", function()
  it("adds READ|ID to a sampling event's sample_type, as perf record does", function()
    U.need_tracing()
    local ev = assert(pe.open({ event = "syscalls:sys_enter_getppid:S", sample_period = 1,
                                sample_type = "tid|period" }, { disabled = true }))
    -- TID|PERIOD as written, plus READ (bit 4) and ID (bit 6)
    assert.equal(2 + 256 + 16 + 64, ev:attr().sample_type)
    assert.is_true(ev:enable())
    local N = 7
    petest.getppid(N)
    assert.is_true(ev:disable())
    local recs = drain(ev)
    assert.equal(N, #recs)
    for i, r in ipairs(recs) do
      assert.equal(ev:id(), r.id)
      assert.equal(i, r.read.value)        -- the i-th call's sample counts i
    end
    ev:close()
  end)

  it("means nothing on a counting event (as in perf stat)", function()
    local ev = assert(pe.open("page-faults:S"))
    local plain = assert(pe.open("page-faults"))
    assert.are.same(plain:attr().sample_type, ev:attr().sample_type)
    assert.are.same(plain:attr().read_format, ev:attr().read_format)
    assert.equal(0, ev:info().pages)
    plain:close()
    ev:close()
  end)
end)

