-- DWARF call graphs: core.unwind (csrc/unwind.c, elfutils' libdwfl) and
-- `luaperf record --call-graph dwarf` against `perf record --call-graph
-- dwarf` + `perf script` on one program built without frame pointers; the
-- build without libdw; -F above perf_event_max_sample_rate.
local core = require("perf_event.core")
local U = require("support.util")
local stats = require("support.stats")

local interp = jit and "luajit" or _VERSION:gsub("Lua ", "lua")
local build = os.getenv("PE_BUILD") or (jit and "build" or "build/" .. _VERSION:gsub("Lua ", "lua"))

local sh = U.sh

local function run(cmd)
  local out = sh("(" .. cmd .. ") 2>&1; echo rc=$?")
  local rc = tonumber(out:match("rc=(%d+)\n$"))
  return out:gsub("rc=%d+\n$", ""), rc
end

local have_perf = sh("command -v perf") ~= ""
local have_cc = sh("command -v cc") ~= ""

-- three nested functions the compiler may not inline, built without frame
-- pointers: only the call frame information knows leaf's callers
local PROGRAM = [[
#include <stdlib.h>
volatile unsigned long sink;
__attribute__((noinline)) static unsigned long leaf(unsigned long n) {
  unsigned long s = 0, i;
  for (i = 0; i < n; i++) s += (i * i) ^ (s >> 3);
  return s;
}
__attribute__((noinline)) static unsigned long middle(unsigned long n) {
  unsigned long r = leaf(n); sink = r; return r + 1;
}
__attribute__((noinline)) static unsigned long outer(unsigned long n) {
  unsigned long r = middle(n); sink = r; return r + 2;
}
int main(int argc, char **argv) {
  sink = outer(argc > 1 ? strtoul(argv[1], 0, 10) : 100000000UL);
  return 0;
}
]]

describe("core.unwind", function()
  it("is there when the core was linked with libdw, and says so when not", function()
    local libs = sh("ldd " .. build .. "/perf_event/core.so")
    assert.equal(libs:find("libdw.so", 1, true) ~= nil, core.unwind_available)
    if not core.unwind_available then
      local r, msg = core.unwind({}, { abi = 2 }, { data = "" })
      assert.is_nil(r)
      assert.truthy(msg:find("without libdw", 1, true), msg)
      local out, rc = run(interp .. " bin/luaperf record --call-graph dwarf -o /dev/null -- true")
      assert.equal(1, rc)
      assert.truthy(out:find("luaperf was built without libdw: --call-graph dwarf is not available", 1, true), out)
    end
  end)

  it("starts at the sampled ip, stops where no file covers it, refuses a sample without registers", function()
    if not core.unwind_available then pending("built without libdw") return end
    -- an ip no mapped file covers: the first frame is the ip and nothing follows
    local lib = assert(os.getenv("PWD")) .. "/build/test/libpetarget.so"
    local maps = { { start = 0x400000, stop = 0x500000, pgoff = 0, file = lib } }
    local stack = { data = ("\0"):rep(64), dyn_size = 64 }
    local pcs = assert(core.unwind(maps, { abi = 2, ip = 0x1234, sp = 0x7000 }, stack))
    assert.same({ 0x1234 }, pcs)
    -- no file at all: libdwfl cannot tell the architecture
    local r, msg = core.unwind({}, { abi = 2, ip = 0x1234, sp = 0x7000 }, stack)
    assert.is_nil(r)
    assert.truthy(msg:find("libdwfl", 1, true), msg)
    r, msg = core.unwind({}, { abi = 0 }, { data = "" })
    assert.is_nil(r)
    assert.truthy(msg:find("no user registers", 1, true), msg)
    assert.truthy(core.unwind_regs)
  end)
end)

describe("luaperf record --call-graph dwarf", function()
  local dir
  before_each(function() dir = sh("mktemp -d /tmp/pe-unwind.XXXXXX"):gsub("%s+$", "") end)
  after_each(function()
    if dir and dir:match("^/tmp/pe%-unwind%.") then os.execute("rm -rf " .. dir) end
  end)

  local function program()
    local f = assert(io.open(dir .. "/nofp.c", "w"))
    f:write(PROGRAM)
    f:close()
    local out, rc = run(("cc -O2 -fomit-frame-pointer -g %s/nofp.c -o %s/nofp"):format(dir, dir))
    assert.equal(0, rc, out)
    return dir .. "/nofp"
  end

  it("finds leaf's callers in code without frame pointers, as perf does", function()
    if not core.unwind_available then pending("built without libdw") return end
    if not (have_perf and have_cc) then pending("needs perf and cc") return end
    local prog = program()
    local period = U.sample_period(2000)
    -- perf: its frames of each sample in leaf, leaf first
    local out, rc = run(("perf record -q --call-graph dwarf -e cpu-clock:u -c %d -o %s/p.data %s 100000000")
                        :format(period, dir, prog))
    assert.equal(0, rc, out)
    local script = sh(("perf script -i %s/p.data -F ip,sym --no-inline 2>/dev/null"):format(dir))
    local theirs, n_theirs = {}, 0
    for block in (script .. "\n\n"):gmatch("(.-)\n\n") do
      local frames = {}
      for sym in block:gmatch("%x+ ([^\n]+)") do frames[#frames + 1] = sym end
      if frames[1] == "leaf" then
        local stack = {}
        for i = #frames, 1, -1 do stack[#stack + 1] = frames[i] end
        local key = table.concat(stack, ";")
        theirs[key] = (theirs[key] or 0) + 1
        n_theirs = n_theirs + 1
      end
    end
    assert.truthy(n_theirs >= 20, script:sub(1, 2000))
    local perf_top, perf_n = nil, 0
    for k, n in pairs(theirs) do if n > perf_n then perf_top, perf_n = k, n end end
    -- perf unwinds leaf <- middle <- outer <- main
    assert.truthy(perf_top:find(";main;outer;middle;leaf$"), perf_top)

    -- ours, on the same program
    out, rc = run(("%s bin/luaperf record --call-graph dwarf -e cpu-clock:u -c %d -o %s/o.folded -- %s 100000000")
                  :format(interp, period, dir, prog))
    assert.equal(0, rc, out)
    local ours, n_ours, full = {}, 0, 0
    for line in io.lines(dir .. "/o.folded") do
      local stack, n = line:match("^nofp;(.-) (%d+)$")
      if stack and stack:match("leaf$") then
        ours[stack] = (ours[stack] or 0) + tonumber(n)
        n_ours = n_ours + tonumber(n)
        if stack == perf_top then full = full + tonumber(n) end
      end
    end
    assert.truthy(n_ours >= 20, out)
    -- the stack perf finds for most samples is ours for most samples too
    local ok, why = stats.at_least("samples unwound to " .. perf_top, full, n_ours, 0.9)
    assert.truthy(ok, why)

    -- frame pointers alone do not get there: the comparison above tests the unwinder
    out, rc = run(("%s bin/luaperf record -g -e cpu-clock:u -c %d -o %s/fp.folded -- %s 100000000")
                  :format(interp, period, dir, prog))
    assert.equal(0, rc, out)
    local fp_full = 0
    for line in io.lines(dir .. "/fp.folded") do
      local stack, n = line:match("^nofp;(.-) (%d+)$")
      if stack == perf_top then fp_full = fp_full + tonumber(n) end
    end
    assert.truthy(fp_full < full, "frame pointers found the same stacks")
  end)

  it("takes perf's --call-graph values and refuses others", function()
    local cli = require("perf_event.cli.record")   -- internal: the -g/--call-graph parser
    assert.same({ mode = "fp" }, cli.call_graph("fp"))
    assert.same({ mode = "dwarf", size = 8192 }, cli.call_graph("dwarf"))
    assert.same({ mode = "dwarf", size = 4096 }, cli.call_graph("dwarf,4096"))
    assert.same({ mode = "dwarf", size = 104 }, cli.call_graph("dwarf,100"))   -- rounded up to 8
    assert.is_nil(cli.call_graph(nil))
    for _, bad in ipairs({ "lbr2", "dwarf,0", "dwarf,70000", "dwarf,x", "fp,1" }) do
      local r, err = cli.call_graph(bad)
      assert.is_nil(r)
      assert.truthy(err:find("--call-graph", 1, true), err)
    end
    local out, rc = run(interp .. " bin/luaperf record --call-graph bogus -o /dev/null -- true")
    assert.equal(2, rc, out)
    assert.truthy(out:find("'fp' or 'dwarf[,SIZE]'", 1, true), out)
  end)
end)

describe("luaperf record -F", function()
  it("throttles a frequency above perf_event_max_sample_rate with perf's warning", function()
    local max = require("perf_event").sysctl().max_sample_rate
    assert.truthy(max and max > 0)
    local out, rc = run(("%s bin/luaperf record -F %d -o /dev/null -- build/test/petarget spin 1000")
                        :format(interp, max * 2))
    assert.equal(0, rc, out)
    local ours = out:match("(warning: Maximum frequency rate[^\n]*)")
    assert.equal(("warning: Maximum frequency rate (%d Hz) exceeded, throttling from %d Hz to %d Hz.")
                 :format(max, max * 2, max), ours)
    if have_perf then
      local pout = sh(("perf record -F %d -o /dev/null -- true 2>&1"):format(max * 2))
      assert.equal(pout:match("(warning: Maximum frequency rate[^\n]*)"), ours)
    end
    -- at the limit: no warning
    out = run(("%s bin/luaperf record -F %d -o /dev/null -- build/test/petarget spin 1000"):format(interp, max))
    assert.is_nil(out:find("Maximum frequency", 1, true), out)
  end)
end)
