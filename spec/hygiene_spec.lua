-- What keeps `make test` safe to run anywhere, twice at once: no spec writes
-- a kernel-wide sysctl (spec/support/helper.lua refuses the open), and the
-- spec that must is outside busted's pattern (spec/optin/, make test-sysctl).
describe("test hygiene", function()
  it("opening a /proc/sys file for writing raises, naming the opt-in target", function()
    local file = "/proc/sys/kernel/perf_event_max_sample_rate"
    local g = assert(io.open(file))
    local before = g:read("*l")
    g:close()
    for _, path in ipairs({ file, "/proc//sys/kernel/perf_event_max_sample_rate" }) do
      for _, mode in ipairs({ "w", "a", "r+", "wb" }) do
        local ok, err = pcall(io.open, path, mode)
        assert.is_false(ok, mode)
        assert.matches("make test-sysctl", err, 1, true)
      end
    end
    -- reading stays allowed, and the value is what it was
    local f = assert(io.open(file))
    assert.equal(before, f:read("*l"))
    f:close()
    assert.equal(tonumber(before), require("perf_event").sysctl().max_sample_rate)
  end)

  it("no spec busted runs in make test sits in spec/optin/", function()
    local p = io.popen("ls spec/optin")
    local names = p:read("*a")
    p:close()
    assert.truthy(names:find("sysctl_throttle.lua", 1, true))
    for name in names:gmatch("[^\n]+") do
      assert.is_nil(name:find("_spec", 1, true), "spec/optin/" .. name .. " would run in make test")
    end
  end)
end)
