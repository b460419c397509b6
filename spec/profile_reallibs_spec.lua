-- pe.profile on real libraries it was never tuned on (Debian's lua-markdown,
-- lua-dkjson, lua-messagepack, lua-cosmo, lua-penlight, lua-cjson), each
-- called from a top-level function of its own (spec/support/reallibs.lua):
-- each function's share of the samples (inclusive) agrees with its share of
-- os.clock time, and every sample has a Lua frame. The kernel's time for
-- the thread is in both (pe.profile samples it where allowed: p.kernel).
local U = require("support.util")
local S = require("support.stats")

local interp = U.lua_cmd()
local build = os.getenv("PE_BUILD") or (jit and "build" or ("build/" .. interp))
local asan = os.getenv("PE_SUITE") == "asan"

-- what a workload's share may differ from os.clock's by, besides sampling:
-- the samples at a window's edges and the os.clock calls around each batch
local ALLOW = 0.01
local SECONDS = 3

local function run()
  local out, rc = U.run(("%s spec/support/reallibs.lua %s %d 2>&1"):format(interp, build, SECONDS))
  assert.are.equal(0, rc, out)
  local w, order, total, nolua, kernel = {}, {}, nil, nil, nil
  for line in out:gmatch("[^\n]+") do
    local name, secs, hits = line:match("^w (%S+) (%S+) (%d+)$")
    if name then
      w[name] = { secs = tonumber(secs), hits = tonumber(hits) }
      order[#order + 1] = name
    end
    kernel = line:match("^kernel (.+)$") or kernel
    total, nolua = line:match("^total (%d+) (%d+)$")
    if total then break end
  end
  assert.truthy(total, out)
  return { w = w, order = order, total = tonumber(total), nolua = tonumber(nolua), kernel = kernel, out = out }
end

describe("pe.profile on real libraries", function()
  if asan then
    it("runs in the luajit, lua5.1 and lua5.4 suites", function() pending("ASan suite: the luajit suite has it") end)
    return
  end

  it("gives each library's function its os.clock share, every sample with a Lua frame", function()
    local r = S.measure(run, { what = "the real-library profile", delay = false })
    -- os.clock counts the time the kernel spends for the thread (here the
    -- JIT's mprotect calls: a third of cosmo's time on Linux 6.18 under
    -- Firecracker), which a user-only profile cannot sample
    if r.kernel ~= "yes" then
      pending("os.clock counts kernel time, and this profile has user time only: " .. tostring(r.kernel))
      return
    end
    assert.is_true(#r.order >= 3, "fewer than 3 libraries installed (tools/debian-packages):\n" .. r.out)
    local secs, hits = 0, 0
    for _, name in ipairs(r.order) do
      secs = secs + r.w[name].secs
      hits = hits + r.w[name].hits
    end
    assert.is_true(hits >= 500, "only " .. hits .. " samples in the libraries:\n" .. r.out)
    assert.are.equal(0, r.nolua, r.nolua .. " of " .. r.total .. " samples have no Lua frame")
    local bad = {}
    for _, name in ipairs(r.order) do
      local ok, msg = S.share(name, r.w[name].hits, hits, r.w[name].secs / secs, ALLOW)
      if not ok then bad[#bad + 1] = msg end
    end
    assert(#bad == 0, table.concat(bad, "\n") .. "\n" .. r.out)
  end)
end)
