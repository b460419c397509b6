-- One ring shared by events with different sample layouts (doc/coverage.md E6):
-- set_output teaches the target's ring the redirected event's id and
-- layout; records are attributed by PERF_SAMPLE_IDENTIFIER and decoded with
-- their own event's sample_type.  Real tracepoints with exact counts, and
-- simulated rings for the malformed cases (the asan suite checks the reads).
local pe = require("perf_event")
local core = require("perf_event.core")
local petest = require("petest")
local U = require("support.util")
-- the core's ring hook (a function of the event, not a method)
local ring_layouts = core._private.ring_layouts

local ME = U.pid()
local FD = 4242          -- close(4242) fails with EBADF, but its tracepoint fires

local function tp(name, st)
  return { type = "tracepoint", config = U.tp_id("syscalls", name), exclude_kernel = false,
           sample_period = 1, disabled = true, sample_type = st, name = "syscalls:" .. name }
end

-- ev1: getppid samples into its own ring; ev2: close(FD) samples (filtered
-- on the fd, so nothing else of this process counts) redirected into it
local function pair(st1, st2)
  local ev1 = assert(pe.open(tp("sys_enter_getppid", st1), { pages = 64 }))
  local ev2 = assert(pe.open(tp("sys_enter_close", st2), { pages = false }))
  assert.is_true(ev2:set_filter("fd == " .. FD))
  assert.is_true(ev2:set_output(ev1))
  return ev1, ev2
end

local function run(ev1, ev2, n, m)
  assert(ev1:enable())
  assert(ev2:enable())
  petest.getppid(n)
  petest.close(FD, m)
  assert(ev2:disable())
  assert(ev1:disable())
end

local function drain(ev)
  local t = {}
  for rec in ev:records() do t[#t + 1] = rec end
  return t
end

-- records split by id; anything else is a failure
local function by_id(recs, ev1, ev2)
  local a, b = {}, {}
  local id1, id2 = ev1:id(), ev2:id()
  for _, r in ipairs(recs) do
    assert.equal("sample", r.type)
    if r.id == id1 then a[#a + 1] = r
    elseif r.id == id2 then b[#b + 1] = r
    else error("record with an id of neither event: " .. tostring(r.id)) end
  end
  return a, b
end

describe("a ring shared by events with different sample_type", function()
  it("N + M samples come back attributed, each decoded with its own event's layout", function()
    U.need_tracing()
    local ev1, ev2 = pair("identifier|ip|tid|time", "identifier|tid|period|raw")
    local N, M = 300, 200
    run(ev1, ev2, N, M)
    local a, b = by_id(drain(ev1), ev1, ev2)
    assert.equal(N, #a)
    assert.equal(M, #b)
    local tid = require("support.rb_build").gettid()
    local last = -1
    for _, r in ipairs(a) do          -- ev1's layout: ip, tid, time; no raw, no period
      assert.is_not_nil(r.ip)
      assert.equal(ME, r.pid)
      assert.equal(tid, r.tid)
      assert.is_true(r.time >= last)
      last = r.time
      assert.is_nil(r.raw)
      assert.is_nil(r.period)
      assert.is_nil(r.fields)
    end
    for _, r in ipairs(b) do          -- ev2's layout: tid, period, raw; no ip, no time
      assert.is_nil(r.ip)
      assert.is_nil(r.time)
      assert.equal(ME, r.pid)
      assert.equal(tid, r.tid)
      assert.equal(1, r.period)
      assert.is_string(r.raw)
      assert.equal(FD, r.fields.fd)   -- close's format, from ev2's tracepoint
    end
    assert.equal(0, ev1:lost())
    ev2:close()
    ev1:close()
  end)

  it("tracepoint fields come from each record's own event when the layouts are equal", function()
    U.need_tracing()
    local ev1, ev2 = pair("identifier|tid|raw", "identifier|tid|raw")
    run(ev1, ev2, 3, 4)
    local a, b = by_id(drain(ev1), ev1, ev2)
    assert.equal(3, #a)
    assert.equal(4, #b)
    local nr1 = a[1].fields.__syscall_nr
    local nr2 = b[1].fields.__syscall_nr
    assert.is_number(nr1)
    assert.is_number(nr2)
    assert.are_not.equal(nr1, nr2)      -- getppid's and close's numbers
    for _, r in ipairs(a) do assert.equal(nr1, r.fields.__syscall_nr); assert.is_nil(r.fields.fd) end
    for _, r in ipairs(b) do assert.equal(nr2, r.fields.__syscall_nr); assert.equal(FD, r.fields.fd) end
    ev2:close()
    ev1:close()
  end)

  it("set_output(nil) and close forget the layout; left-over records give a clear error", function()
    U.need_tracing()
    local ev1, ev2 = pair("identifier|ip|tid", "identifier|tid|raw")
    local _, lays = ring_layouts(ev1)
    assert.is_table(lays[ev2:id()])
    assert.equal("syscalls:sys_enter_close", lays[ev2:id()].name)
    assert.is_true(ev2:set_output(nil))
    _, lays = ring_layouts(ev1)
    assert.is_nil(next(lays))
    -- again, then close ev2 with its records still in ev1's ring
    assert.is_true(ev2:set_output(ev1))
    run(ev1, ev2, 5, 2)
    local id2 = ev2:id()
    ev2:close()
    _, lays = ring_layouts(ev1)
    assert.is_nil(next(lays))
    local got = {}
    local ok, err = pcall(function() for rec in ev1:records() do got[#got + 1] = rec end end)
    assert.is_false(ok)
    assert.equal(5, #got)               -- ev1's records, then ev2's first
    assert.matches("sample record with id " .. tostring(id2):gsub("ULL$", "") ..
                   ": no event sending records to this ring has that id", err, 1, true)
    assert.matches("drain the ring before closing the event", err, 1, true)
    ev1:close()
  end)

  it("different layouts without identifier raise an error that says what to add", function()
    U.need_tracing()
    local ev1, ev2 = pair("ip|tid", "tid|raw")
    run(ev1, ev2, 1, 1)
    local ok, err = pcall(drain, ev1)
    assert.is_false(ok)
    assert.matches("records(syscalls:sys_enter_getppid): events with different sample layouts "
                   .. "share this ring", err, 1, true)
    assert.matches('add "identifier" to the sample_type of every event sharing the ring', err, 1, true)
    ev2:close()
    ev1:close()
  end)

  it("an event redirected to a redirected event joins the first ring (three layouts)", function()
    U.need_tracing()
    local t = tp("sys_enter_getppid", "identifier|ip")
    local ev1 = assert(pe.open(t, { pages = 16 }))
    t.sample_type = "identifier|tid"
    local ev2 = assert(pe.open(t, { pages = false }))
    t.sample_type = "identifier|time|period"
    local ev3 = assert(pe.open(t, { pages = false }))
    assert.is_true(ev2:set_output(ev1))
    assert.is_true(ev3:set_output(ev2))     -- the kernel resolves this to ev1's ring
    for _, ev in ipairs({ ev1, ev2, ev3 }) do assert(ev:enable()) end
    petest.getppid(4)
    for _, ev in ipairs({ ev1, ev2, ev3 }) do assert(ev:disable()) end
    local n = {}
    for r in ev1:records() do
      n[r.id] = (n[r.id] or 0) + 1
      if r.id == ev1:id() then assert.is_not_nil(r.ip); assert.is_nil(r.tid)
      elseif r.id == ev2:id() then assert.equal(ME, r.pid); assert.is_nil(r.ip)
      else assert.equal(ev3:id(), r.id); assert.equal(1, r.period); assert.is_nil(r.pid) end
    end
    assert.same({ [ev1:id()] = 4, [ev2:id()] = 4, [ev3:id()] = 4 }, n)
    ev3:close(); ev2:close(); ev1:close()
  end)

  it("the ring's owner may go first: the members' tables stay valid (asan)", function()
    U.need_tracing()
    collectgarbage(); collectgarbage()
    local fds = U.count_perf_fds()
    local ev1, ev2 = pair("identifier|ip", "identifier|tid|raw")
    local t = tp("sys_enter_getppid", "identifier|time")
    local ev3 = assert(pe.open(t, { pages = false }))
    assert.is_true(ev3:set_output(ev1))
    ev1:close()
    assert.is_true(ev2:set_output(nil))     -- leaves the owner's table after the owner
    ev2:close()
    assert.equal(fds + 1, U.count_perf_fds())
    ev3 = nil                               -- luacheck: ignore (the last member goes through __gc)
    collectgarbage(); collectgarbage()
    assert.equal(fds, U.count_perf_fds())
  end)

  it("equal layouts decode as before (the FFI path stays on)", function()
    U.need_tracing()
    local ev1, ev2 = pair("identifier|tid", "identifier|tid")
    local by_id_flag, lays = ring_layouts(ev1)
    assert.is_false(by_id_flag)
    assert.is_table(lays[ev2:id()])
    run(ev1, ev2, 6, 7)
    local a, b = by_id(drain(ev1), ev1, ev2)
    assert.equal(6, #a)
    assert.equal(7, #b)
    ev2:close()
    ev1:close()
  end)
end)

-- ---- simulated rings ----------------------------------------------------------
local function d(v) return U.le64(v):sub(1, 4) end
local function w(v) return U.le64(v):sub(1, 2) end
local q = U.le64

local function record(type_, body)
  return d(type_) .. w(0) .. w(8 + #body) .. body
end

local function ring(bytes, opts)
  local size = 8
  while size < #bytes do size = size * 2 end
  opts.data = bytes .. string.rep("\0", size - #bytes)
  opts.head = #bytes
  return U.sim().sim_ring(opts)
end

local OWN = { id = 1, sample_type = "identifier|ip|tid" }
local OTHER = { { id = 2, sample_type = "identifier|tid|period|raw", name = "other" } }

local function sim(bytes)
  return ring(bytes, { id = OWN.id, sample_type = OWN.sample_type, layouts = OTHER })
end

-- a sample of the owner (id 1) and of the other event (id 2)
local function s1(ip) return record(9, q(1) .. q(ip) .. d(10) .. d(11)) end
local function s2(period, raw)
  return record(9, q(2) .. d(20) .. d(21) .. q(period) .. d(#raw) .. raw)
end

describe("simulated shared rings", function()
  it("decodes each record with its id's layout", function()
    local ev = sim(s1(0x401000) .. s2(7, "abcd") .. s1(0x402000))
    local recs = drain(ev)
    assert.equal(3, #recs)
    assert.same({ 1, 0x401000, 10, 11 }, { recs[1].id, recs[1].ip, recs[1].pid, recs[1].tid })
    assert.same({ 2, 20, 21, 7, "abcd" },
                { recs[2].id, recs[2].pid, recs[2].tid, recs[2].period, recs[2].raw })
    assert.is_nil(recs[2].ip)
    assert.equal(0x402000, recs[3].ip)
    assert.is_nil(recs[3].raw)
    ev:close()
  end)

  it("an unknown id is an error naming it; the next record decodes", function()
    local bad = record(9, q(3) .. q(0x401000) .. d(10) .. d(11))
    local ev = sim(s1(0x401000) .. bad .. s2(9, "wxyz"))
    local got = {}
    local ok, err = pcall(function() for r in ev:records() do got[#got + 1] = r end end)
    assert.is_false(ok)
    assert.equal(1, #got)
    assert.matches("records(sim_ring): sample record with id 3: no event sending records", err, 1, true)
    local rest = drain(ev)              -- the pass goes on after the bad record
    assert.equal(1, #rest)
    assert.equal(9, rest[1].period)
    ev:close()
  end)

  it("a record too short for its identifier, or for its layout, is a clean error", function()
    local ev = sim(record(9, ""))
    local ok, err = pcall(drain, ev)
    assert.is_false(ok)
    assert.matches("sample record (8 bytes) is too short for its identifier", err, 1, true)
    ev:close()
    -- id 2's layout promises tid, period and raw: only tid is there
    ev = sim(record(9, q(2) .. d(20) .. d(21)))
    ok, err = pcall(drain, ev)
    assert.is_false(ok)
    assert.matches("sample record (24 bytes): record truncated", err, 1, true)
    ev:close()
    -- raw size running past the record
    ev = sim(record(9, q(2) .. d(20) .. d(21) .. q(1) .. d(64) .. "abcd"))
    ok, err = pcall(drain, ev)
    assert.is_false(ok)
    assert.matches("record truncated", err, 1, true)
    ev:close()
  end)

  it("non-sample records are attributed by the last u64 of their trailer", function()
    local lays = { { id = 2, sample_type = "identifier|tid", sample_id_all = true } }
    -- COMM: pid, tid, "lua\0" padded to 8; then the trailer
    local comm = d(30) .. d(31) .. "lua\0\0\0\0\0"
    local own = record(3, comm .. d(40) .. d(41) .. q(5000) .. q(1))   -- tid|time|identifier
    local other = record(3, comm .. d(50) .. d(51) .. q(2))            -- tid|identifier
    local ev = ring(own .. other, { id = 1, sample_type = "identifier|tid|time",
                                    sample_id_all = true, layouts = lays })
    local recs = drain(ev)
    assert.equal(2, #recs)
    assert.same({ "comm", "lua", 30, 31, 5000, 1 },
                { recs[1].type, recs[1].comm, recs[1].pid, recs[1].tid, recs[1].time,
                  recs[1].identifier })
    assert.same({ "comm", "lua", 30, 31, 2 },
                { recs[2].type, recs[2].comm, recs[2].pid, recs[2].tid, recs[2].identifier })
    assert.is_nil(recs[2].time)
    ev:close()
    -- sample_id_all on one event only: cannot be attributed
    ev = ring(own, { id = 1, sample_type = "identifier|tid|time", sample_id_all = true,
                     layouts = { { id = 2, sample_type = "identifier|tid" } } })
    local ok, err = pcall(drain, ev)
    assert.is_false(ok)
    assert.matches("sample_id_all is set on some of the events sharing this ring but not on all",
                   err, 1, true)
    ev:close()
  end)

  it("different layouts without identifier: the error says to add it", function()
    local ev = ring(record(9, q(0x401000) .. d(10) .. d(11)),
                    { id = 1, sample_type = "ip|tid", layouts = { { id = 2, sample_type = "tid" } } })
    local ok, err = pcall(drain, ev)
    assert.is_false(ok)
    assert.matches('add "identifier" to the sample_type of every event sharing the ring', err, 1, true)
    ev:close()
  end)

  it("the LuaJIT fast path is not used for a mixed ring, and equal layouts keep it", function()
    local ev = sim(s1(0x401000))
    assert.is_true((ring_layouts(ev)))
    ev:close()
    ev = ring(s1(0x401000), { id = 1, sample_type = OWN.sample_type,
                             layouts = { { id = 2, sample_type = OWN.sample_type } } })
    assert.is_false((ring_layouts(ev)))
    local reuse = {}
    local n = 0
    for r in ev:records(reuse) do
      n = n + 1
      assert.equal(0x401000, r.ip)
      if jit and require("perf_event.records").ffi then assert.equal(reuse, r) end
    end
    assert.equal(1, n)
    ev:close()
  end)
end)
