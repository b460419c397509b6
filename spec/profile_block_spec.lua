-- pe.profile's block profiles (start{block=true}: where the thread waited
-- in the kernel, in nanoseconds) and p:vmstates() (the VM state each sample
-- found). The waits are checked against what the kernel makes true: a
-- usleep of 20 ms waits at least 20 ms and at most the wall time of the
-- call; a loop on the CPU waits for nothing. The states against what the
-- code planted here runs: an interpreted function (jit.off), a compiled
-- loop, an allocating loop (the GC).
local pe = require("perf_event")
local U = require("support.util")
local stats = require("support.stats")
local jit = rawget(_G, "jit")

local ffi = jit and require("ffi")
if ffi then pcall(ffi.cdef, "int usleep(unsigned int);") end

local function wall() return require("perf_event.profile.raw").now() end

local function dump(t)
  local parts = {}
  for k, v in pairs(t) do parts[#parts + 1] = k .. "=" .. v end
  table.sort(parts)
  return table.concat(parts, " ")
end

local function blk_sleeper(n)
  for _ = 1, n do ffi.C.usleep(20000) end
end

local function blk_spin(secs)
  local t0, s = os.clock(), 0
  while os.clock() - t0 < secs do
    for i = 1, 10000 do s = (s * 31 + i) % 1000003 end
  end
  return s
end

-- the nanoseconds of the folded lines whose stack holds `name`, and all
local function waited(p, name)
  local n, all = 0, 0
  for _, e in ipairs(p:aggregate()) do
    all = all + e.count
    if e.key:find(name, 1, true) then n = n + e.count end
  end
  return n, all
end

describe("pe.profile block profiles (block=true)", function()
  it("weighs the stack that waited by the time it waited: 20 usleeps of 20 ms", function()
    U.need(jit, "block profiles need LuaJIT's safe point")
    U.need_kernel()
    local p = assert(pe.profile.start({ block = true }))
    finally(function() p:stop() end)
    local t0 = wall()
    blk_sleeper(20)
    local dt = wall() - t0
    blk_spin(0.2)
    p:stop()
    assert.equal("context-switches", p.event)
    assert.is_true(p.block)
    local n, all = waited(p, "blk_sleeper@")
    -- each usleep waits its 20 ms at least (its timer armed before the
    -- switch-out, the switch-in after it fired) and no longer than the calls
    assert.is_true(n >= 20 * 20e6 * 0.99, ("blk_sleeper waited %.1f ms\n%s"):format(n / 1e6, p:folded()))
    assert.is_true(n <= dt, ("blk_sleeper waited %.1f ms in %.1f ms of calls"):format(n / 1e6, dt / 1e6))
    -- the loop on the CPU is preempted at most: it never gave its CPU up
    assert.is_true(all - n < 0.01 * n, ("%.1f ms waited elsewhere\n%s"):format((all - n) / 1e6, p:folded()))
    assert.is_true(p.nwaits >= 20, "waits: " .. tostring(p.nwaits))
    -- the state at the wait's end: a C function (the FFI call) or the trace calling it
    local st = p:vmstates()
    assert.equal(all, (st.c or 0) + (st.compiled or 0) + (st.interpreted or 0), dump(st))
    -- pprof's one sample type: delay in nanoseconds
    local t = require("perf_event.pprof").profile_table(p)
    assert.same({ { type = "delay", unit = "nanoseconds" } }, t.sample_types)
    local sum = 0
    for _, s in ipairs(t.samples) do sum = sum + s.values[1] end
    assert.equal(all, sum)
  end)

  it("refuses what it cannot do, saying why", function()
    -- a caller's mistake raises
    local ok, err = pcall(pe.profile.start, { block = true, freq = 99 })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("option 'block' takes none of", 1, true), err)
    ok, err = pcall(pe.profile.start, { block = true, kernel = false })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("kernel=false", 1, true), err)
    if not jit then
      local p, why = pe.profile.start({ block = true })
      assert.is_nil(p)
      assert.truthy(why:find("needs LuaJIT's safe point", 1, true), why)
      return
    end
    -- unprivileged (perf_event_paranoid 2): the kernel's refusal, explained
    U.need_root("runs a LuaJIT as nobody with setpriv")
    U.need(U.paranoid() >= 2, "perf_event_paranoid is below 2: nobody may count kernel switches here")
    local out = U.luajit_as_nobody('local p, e = require("perf_event").profile.start({ block = true }) print(p, e)')
    assert.truthy(out:find("^nil\ta block profile samples the thread's switches", 1), out)
    assert.truthy(out:find("CAP_PERFMON", 1, true), out)
    assert.truthy(out:find("EACCES", 1, true), out)
  end)
end)

local function vm_interp(n)
  local s = 0
  for i = 1, n do s = (s + i * 3) % 65521 end
  return s
end

local function vm_compiled(n)
  local s = 0
  for i = 1, n do s = (s + i * 5) % 65521 end
  return s
end

local function vm_alloc(n)
  local t
  for i = 1, n do t = { i, { i }, { i, i } } end
  return t
end

local function burn(f, secs, n)
  local t0 = os.clock()
  while os.clock() - t0 < secs do f(n) end
end

describe("p:vmstates()", function()
  it("tells interpreted, compiled and GC time apart (LuaJIT), each where its code ran", function()
    U.need(jit, "LuaJIT's VM states")
    jit.off(vm_interp)
    local p = assert(pe.profile.start({ freq = 999 }))
    finally(function() p:stop() jit.on(vm_interp) end)
    local c0 = os.clock()
    burn(vm_interp, 0.3, 20000)
    burn(vm_compiled, 0.3, 20000)
    burn(vm_alloc, 0.3, 20000)
    local cpu = os.clock() - c0
    p:stop()
    local st = p:vmstates()
    local sum = 0
    for _, n in pairs(st) do sum = sum + n end
    assert.equal(p.nsamples, sum)
    -- a third of the samples ran each function; each state gets at least
    -- a tenth of its function's share (the GC: an allocating loop spends
    -- more than that collecting), up to the Poisson bound
    local mu = 999 * cpu / 3
    for _, s in ipairs({ "interpreted", "compiled", "gc" }) do
      local ok, why = stats.count_at_least(s .. " samples", st[s] or 0, mu, 0.9)
      assert.is_true(ok, why .. "\n" .. dump(st))
    end
    -- labelled aggregates: the interpreted function's samples are interpreted
    local interp, other = 0, 0
    for _, e in ipairs(p:aggregate({ labels = true })) do
      if e.key:find("vm_interp@", 1, true) then
        if e.labels.vmstate == "interpreted" then interp = interp + e.count else other = other + e.count end
      end
    end
    local ok, why = stats.at_least("vm_interp's samples interpreted", interp, interp + other, 0.9)
    assert.is_true(ok, why)
  end)

  it("tells Lua from C leaves on PUC Lua", function()
    U.need(not jit, "PUC Lua's leaf frames")
    local p = assert(pe.profile.start({ freq = 999 }))
    finally(function() p:stop() end)
    burn(vm_interp, 0.3, 20000)
    burn(function() return string.rep("x", 1e6):upper() end, 0.3)
    p:stop()
    local st = p:vmstates()
    local sum = 0
    for _, n in pairs(st) do sum = sum + n end
    assert.equal(p.nsamples, sum)
    assert.is_nil(st.compiled)
    assert.is_nil(st.gc)
    local cpu_mu = 999 * 0.3
    for _, s in ipairs({ "interpreted", "c" }) do
      local ok, why = stats.count_at_least(s .. " samples", st[s] or 0, cpu_mu, 0.5)
      assert.is_true(ok, why)
    end
  end)
end)
