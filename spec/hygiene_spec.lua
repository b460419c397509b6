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

  it("no file of the project names a path of the machine it was written on", function()
    -- an absolute path under /work, /home, /root or /Users (at a line's start,
    -- after a quote, a space, '=', '(' or '`'): a file outside the checkout
    -- that another machine does not have (the API contract is doc/api.md)
    local function outside(text)
      for _, top in ipairs({ "work", "home", "root", "Users" }) do
        local pat = "/" .. top .. "/"
        local at = 1
        while true do
          local i = text:find(pat, at, true)
          if not i then break end
          local before = i == 1 and "\n" or text:sub(i - 1, i - 1)
          if before:find("^[\n\"' =(`]") then return text:sub(i, i + 40):match("^[^\n]*") end
          at = i + 1
        end
      end
    end
    assert.equal("/" .. "work/shared/API.md\")", outside("x = slurp(\"/" .. "work/shared/API.md\")\n"))
    assert.is_nil(outside("(\"%s/root/.build-id\"):format(dir); location = /work { }"))
    local p = io.popen("find lua spec bin csrc doc tools examples bench fuzz rockspec .ci " ..
                       "README.md Makefile config.ld -type f")
    local n = 0
    for path in p:read("*a"):gmatch("[^\n]+") do
      local f = assert(io.open(path, "rb"))
      local text = f:read("*a")
      f:close()
      n = n + 1
      assert.is_nil(outside(text), path)
    end
    p:close()
    assert.is_true(n > 100, n .. " files")
  end)

  it("no tracked file reads as a development diary (numbered sessions, the writer's machine)", function()
    -- what `git grep -iE` would find with the diary's regex, also across a
    -- line break; the patterns are built from pieces so that this file does
    -- not match them itself
    local pats = { "sess" .. "ions?%s+%d", "this%s+" .. "vm", "this%s+" .. "session" }
    local function diary(text)
      local low = text:lower()
      for _, pat in ipairs(pats) do
        local i = low:find(pat)
        if i then return low:sub(i, i + 40):match("^[^\n]*") end
      end
    end
    assert.equal("sess" .. "ion 12 found", diary("the spin of Sess" .. "ion 12 found"))
    assert.equal("this " .. "vm's timer", diary("on This " .. "VM's timer"))
    assert.equal("this", diary("on this\n" .. "VM's timer"))
    assert.equal("sess" .. "ions 6-9)", diary("figures (sess" .. "ions 6-9)"))
    assert.is_nil(diary("a session's events, a VM's steal"))
    local p = io.popen("git ls-files 2>/dev/null")
    local list = p:read("*a")
    p:close()
    if list == "" then return pending("not a git checkout") end
    local n = 0
    for path in list:gmatch("[^\n]+") do
      local f = io.open(path, "rb")
      if f then
        local text = f:read("*a")
        f:close()
        if not text:find("\0", 1, true) then
          n = n + 1
          local hit = diary(text)
          assert.is_nil(hit, path .. ": " .. tostring(hit))
        end
      end
    end
    assert.is_true(n > 100, n .. " files")
  end)

  it("no test registers two finally blocks (busted runs only the last one)", function()
    -- busted/init.lua: `element.env.finally = function(fn) finally = fn end`:
    -- a test's first finally is dropped, so what it opened stays open when
    -- the test fails. A test runs from
    -- its `it(` to the `end)` at the same indent; helpers between tests that
    -- call finally once per call are not counted
    local function twice(text)
      local out = {}
      for at, indent, head in text:gmatch("()\n([ \t]*)it%(([^\n]*)") do
        local stop = text:find("\n" .. indent .. "end%)", at + 1) or #text
        local n = 0
        for _ in text:sub(at, stop):gmatch("[^%w_.:]finally%s*%(") do n = n + 1 end
        if n > 1 then out[#out + 1] = head .. " (" .. n .. " finally)" end
      end
      return out
    end
    local fin = "fin" .. "ally"      -- (this file is checked too)
    local bad = ("describe(\"d\", function()\n  it(\"a\", function()\n    F(f)\n    F(g)\n  end)\n" ..
                 "  local function h() F(f) end\n  it(\"b\", function()\n    F(f)\n  end)\nend)\n"):gsub("F", fin)
    assert.same({ "\"a\", function() (2 finally)" }, twice(bad))
    local p = io.popen("ls spec/*_spec.lua")
    local tests = 0
    for path in p:read("*a"):gmatch("[^\n]+") do
      local f = assert(io.open(path, "rb"))
      local text = f:read("*a")
      f:close()
      for _ in text:gmatch("\n[ \t]*it%(") do tests = tests + 1 end
      assert.same({}, twice(text), path)
    end
    p:close()
    assert.is_true(tests > 500, tests .. " tests")
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
