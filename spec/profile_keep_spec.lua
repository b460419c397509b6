-- pe.profile's aggregated mode (start{keep=false}): samples folded into
-- per-stack counts at drain, for an always-on sampler (examples/openresty).
-- The counts are checked against the kernel's own number of samples, the
-- hot function planted here, and the memory the state holds after many
-- drains (collectgarbage("count")).
local pe = require("perf_event")
local U = require("support.util")
local stats = require("support.stats")
local jit = rawget(_G, "jit")
local clock = os.clock

local function agg_hot(n)
  local s = 0
  for i = 1, n do s = (s * 31 + i) % 1000003 end
  return s
end

local function agg_other(n)
  local s = 0
  for i = 1, n do s = s + (i % 11) * 0.25 end
  return s
end

-- runs f for `secs` of CPU time (os.clock)
local function burn(f, secs)
  local t0, s = clock(), 0
  while clock() - t0 < secs do s = s + f(20000) end
  return s
end

local function sum_folded(text)
  local n, lines = 0, 0
  for _, c in text:gmatch("([^\n]+) (%d+)\n") do n = n + tonumber(c); lines = lines + 1 end
  return n, lines
end

local function sum(list, field)
  local n = 0
  for _, e in ipairs(list) do n = n + e[field] end
  return n
end

local CHUNK = "spec/profile_keep_spec.lua"

describe("pe.profile aggregated mode (keep=false)", function()
  it("counts every sample the kernel delivered, without keeping them", function()
    local p = assert(pe.profile.start({ freq = 999, keep = false }))
    burn(agg_hot, 0.3)
    p:stop()
    assert.equal(0, #p.samples)
    -- at least a sixth of 0.3 s of CPU at 999 Hz, up to the Poisson bound
    assert.is_true(stats.count_at_least("samples in 0.3 s of CPU at 999 Hz", p.nsamples, 0.3 * 999, 5 / 6))
    local agg = p:aggregate()
    assert.equal(p.nsamples, sum(agg, "count"))
    assert.equal(p.nstacks, #agg)       -- lines and traces kept apart by default
    assert.equal(p.nsamples, (sum_folded(p:folded())))
    assert.equal(p.nsamples, sum(p:top(), "count"))
    local k = p:kinds()
    assert.equal(p.nsamples, k.trace + k.interp + k.caller + k.c)
    -- coarser groupings sum to the same total and never have more stacks
    local coarse = p:aggregate({ lines = false })
    assert.equal(p.nsamples, sum(coarse, "count"))
    assert.is_true(#coarse <= #agg)
    if jit and p.mode ~= "c" then
      local top = p:top(1)[1]
      assert.truthy(top.name:find("^agg_hot@" .. CHUNK:gsub("%p", "%%%0") .. ":%d+$"), top.name)
      assert.is_true(stats.at_least(top.name, top.count, p.nsamples, 0.5))
    end
  end)

  it("reads and clears with reset=true: the two reads add up to the kernel's samples", function()
    local p = assert(pe.profile.start({ freq = 999, keep = false }))
    burn(agg_hot, 0.2)
    p:drain()
    local first = p:top(nil, { reset = true })
    assert.equal("", p:folded())
    burn(agg_other, 0.2)
    p:stop()
    local second = p:top()
    assert.equal(p.nsamples, sum(first, "count") + sum(second, "count"))
    assert.is_true(sum(first, "count") > 20 and sum(second, "count") > 20)
    if jit and p.mode ~= "c" then
      assert.truthy(first[1].name:find("^agg_hot@"), first[1].name)
      assert.truthy(second[1].name:find("^agg_other@"), second[1].name)
    end
  end)

  it("keeps memory bounded over many drains and trace flushes (soak)", function()
    -- the symbol tables of every mapped file, read once per process on the
    -- first sample in it, are read here first: they are not the profile's
    for line in io.lines("/proc/self/maps") do
      local perms, path = line:match("^%S+ (%S+) %x+ %S+ %d+%s+(/%S+)$")
      if path and perms:find("x", 1, true) then pe.symbols.elf(path) end
    end
    local p = assert(pe.profile.start({ freq = 999, keep = false }))
    local mem, n_at, st_at, dead_max = {}, {}, {}, 0
    for i = 1, 600 do
      burn(i % 2 == 0 and agg_hot or agg_other, 0.004)
      if i % 10 == 0 and jit then jit.flush() end   -- new traces, old ones closed
      p:drain()
      if p.reg then dead_max = math.max(dead_max, #p.reg.dead) end
      if i == 100 or i == 600 then
        collectgarbage("collect")
        collectgarbage("collect")
        mem[#mem + 1] = collectgarbage("count")
        n_at[#n_at + 1] = p.nsamples
        st_at[#st_at + 1] = p.nstacks
      end
    end
    p:stop()
    local grown, n, new_stacks = mem[2] - mem[1], n_at[2] - n_at[1], st_at[2] - st_at[1]
    if os.getenv("PE_VERBOSE") then
      print(("soak: +%.1f KiB over %d samples, %d stacks (%d new)"):format(grown, n, p.nstacks, new_stacks))
    end
    -- kept, each sample would be a table of frames (over 100 bytes)
    assert.is_true(n >= 1000, "only " .. n .. " samples in the soak")
    -- the state grows with the distinct stacks (each keeps one sample's
    -- frames: 3-7 KiB for busted's 40-deep stacks), not with the samples:
    -- kept, 2000 samples would take several MiB
    assert.is_true(grown < 96 + 8 * new_stacks,
                   ("the state grew by %.1f KiB over %d samples and %d new stacks"):format(grown, n, new_stacks))
    assert.is_true(p.nstacks < 300, p.nstacks .. " distinct stacks")
    assert.equal(0, #p.samples)
    assert.equal(p.nsamples, sum(p:aggregate(), "count"))
    -- closed traces are forgotten once no sample can fall in them
    assert.is_true(dead_max < 50, dead_max .. " closed traces kept")
  end)
end)

-- the drain's own work, standing in for a first drain's reading of libc's
-- symbol tables (50 ms of CPU)
local function in_the_drain(n)
  local s = 0
  for i = 1, n do s = (s + i * 7) % 65521 end
  return s
end

describe("pe.profile's drain while the profile runs", function()
  it("does not sample its own work: the event pauses while a drain runs", function()
    local p = assert(pe.profile.start({ freq = 999 }))
    finally(function() p:stop() end)
    if p.mode == "c" then U.pending("C leaves only: " .. tostring(p.reason)) end
    -- a symbol reader whose map reading, at the first drain, takes 0.15 s
    local slow = require("perf_event.symbols").new({ kernel = false, offsets = true })
    local load_maps = slow.load_maps
    function slow.load_maps(...)
      burn(in_the_drain, 0.15)
      return load_maps(...)
    end
    p.sym = slow
    burn(agg_hot, 0.15)
    p:drain()
    burn(agg_hot, 0.05)
    p:stop()
    local hot, drain = 0, 0
    for stack, n in p:folded():gmatch("([^\n]+) (%d+)\n") do
      if stack:find("in_the_drain@", 1, true) then drain = drain + tonumber(n)
      elseif stack:find("agg_hot@", 1, true) then hot = hot + tonumber(n) end
    end
    assert.is_true(stats.count_at_least("samples in agg_hot's 0.2 s of CPU at 999 Hz", hot, 0.2 * 999, 5 / 6))
    -- sampled, the drain's 0.15 s would hold 150 samples, at least 95 at odds
    -- of 1e-6; paused, none but the one sample the kernel may have signalled
    -- just before the pause and that the safe point (or the PUC hook) takes
    -- at its next check, inside the drain
    assert.is_true(drain <= 1, drain .. " samples in the drain's own work")
  end)
end)
