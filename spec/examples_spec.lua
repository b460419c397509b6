-- Every example in examples/ runs, under the suite's interpreter, and
-- prints what it promises.  examples/openresty runs in spec/nginx_spec.lua.
local interp = jit and "luajit" or _VERSION:gsub("Lua ", "lua")

local function run(file)
  local p = io.popen(interp .. " " .. file .. " 2>&1; echo \"rc=$?\"")
  local out = p:read("*a")
  p:close()
  local rc = tonumber(out:match("rc=(%d+)\n?$"))
  return out:gsub("rc=%d+\n?$", ""), rc
end

local tracefs = io.open("/sys/kernel/tracing/events/syscalls/sys_enter_close/id")
if tracefs then tracefs:close() end

-- what each example must print (patterns); examples not listed only need
-- to exit 0
local EXPECT = {
  ["examples/stat_function.lua"] = {
    "Performance counter stats for 'work%(200000%)':",
    "msec task%-clock",
    "work returned 200000",
    tracefs and "close%(2%) calls counted by the kernel: 25\n" or nil,
  },
  ["examples/profile_self.lua"] = { "\n?%d+ samples; hottest functions:\n +%d+  %S" },
  ["examples/explore.lua"] = { "perf_event_paranoid", "\ntype +1\n", "exclude_kernel +true",
                               "%-%- one counter: page%-faults=%d+", "\nsample +%d+" },
  ["examples/first.lua"] = { "task%-clock" },
}

describe("examples", function()
  local p = io.popen("ls examples/*.lua")
  local files = {}
  for f in p:lines() do files[#files + 1] = f end
  p:close()

  it("are all here", function()
    assert.truthy(#files >= 3)
  end)

  for _, file in ipairs(files) do
    it(file .. " runs and prints what it promises", function()
      local out, rc = run(file)
      assert.equal(0, rc, out)
      for _, pat in pairs(EXPECT[file] or {}) do
        assert.truthy(out:find(pat), ("%s: no match for %q in:\n%s"):format(file, pat, out))
      end
    end)
  end

  it("include the OpenResty example the nginx spec runs", function()
    assert.truthy(io.open("examples/openresty/nginx.conf"))
    assert.truthy(io.open("examples/openresty/lua/perfwork.lua"))
  end)
end)
