-- One spec -> attr resolver (issue 11): every form of spec goes through
-- every entry point (pe.attr, pe.describe, pe.open, pe.group, pe.stat and
-- `luaperf stat` under strace) and each must give the same attr identity,
-- or the same refusal with the same message.  Where the attr comes from:
--   pe.attr      the table it returns
--   pe.describe  the perf -vv text it prints, parsed back
--   pe.open      ev:attr(), the attr the kernel accepted
--   pe.group     every member's attr()
--   pe.stat      the attr of each counter in the result
--   luaperf      the perf_event_open(2) calls strace decodes (-X raw -v)
-- Also: the perf fallback for msr (exclude_guest retried on EINVAL) on
-- every path, pe.open's `disabled` option, and the bounded "did you mean".
local pe = require("perf_event")
local core = require("perf_event.core")
local parse = require("perf_event.parse")
local U = require("support.util")

local interp = jit and "luajit" or _VERSION:gsub("Lua ", "lua")

local sh = U.sh

local have_strace = sh("command -v strace") ~= ""
-- Kernel-mode counting allowed (root, CAP_PERFMON or paranoid < 2)?  If
-- not, the open paths add exclude_kernel/exclude_hv as perf does (and say
-- so in info()), and the msr PMU, which refuses those bits, cannot be
-- counted at all: `perf stat -e msr/tsc/` prints <not supported> then too.
local KERNEL_OK
do
  local ev = require("perf_event.core").open({ type = "software", config = 1 }, {})
  KERNEL_OK = ev ~= nil
  if ev then ev:close() end
end
local have_msr = KERNEL_OK and pe.pmu("msr") ~= nil and pe.pmu("msr").events
  and pe.pmu("msr").events.tsc ~= nil
local have_tp = U.tracefs() ~= nil

-- identity: what names the event and its privilege levels
local ID = { "type", "config", "config1", "config2", "bp_type", "exclude_user", "exclude_kernel",
             "exclude_hv" }

local function n(v)
  if v == nil or v == false then return 0 end
  if v == true then return 1 end
  if type(v) == "cdata" then return tonumber(v) end
  return tonumber(v)
end

-- an attr table (any spelling the core accepts) -> identity table
local function ident(a)
  local d = core.attr_decode(core.attr_encode(a))
  local out = {}
  for _, k in ipairs(ID) do out[k] = n(d[k]) end
  -- the union names: bp_addr is config1, bp_len config2
  if d.bp_addr ~= nil then out.config1 = n(d.bp_addr) end
  if d.bp_len ~= nil then out.config2 = n(d.bp_len) end
  return out
end

-- perf -vv text (pe.describe) -> identity tables, one per attr block
local DESCR_KEY = { ["{ bp_addr, config1 }"] = "config1", ["{ bp_len, config2 }"] = "config2" }
local function ident_of_text(text)
  local out, cur = {}, nil
  for line in (text .. "\n"):gmatch("(.-)\n") do
    if line == "perf_event_attr:" then
      cur = {}
      for _, k in ipairs(ID) do cur[k] = 0 end
      out[#out + 1] = cur
    elseif cur and not line:find("^  #") then
      local k, v = line:match("^  (%S.-)%s%s+(%S+)$")
      if k then
        k = DESCR_KEY[k] or k
        if cur[k] ~= nil then cur[k] = tonumber(v) end
      end
    end
  end
  return out
end

-- strace's perf_event_open lines -> identity tables of the calls that succeeded
local function ident_of_strace(text)
  local out = {}
  for args, ret in text:gmatch("perf_event_open%(%{(.-)%}, [^\n]-%) = (%-?%d+)") do
    if tonumber(ret) >= 0 then
      local f = {}
      for k, v in args:gmatch("([%w_]+)=(0?x?%x+)") do f[k] = tonumber(v) end
      local t = {}
      for _, k in ipairs(ID) do t[k] = f[k] or 0 end
      if f.bp_addr then t.config1 = f.bp_addr end
      if f.bp_len then t.config2 = f.bp_len end
      out[#out + 1] = t
    end
  end
  return out
end

-- The entry points.  Each returns {ids = {identity...}} when it accepts the
-- spec, {msg =, raised = bool} when it refuses it.
local function outcome(build, ok, v, msg)
  if not ok then return { msg = (tostring(v):gsub("^[^\n]-:%d+: ", "")), raised = true } end
  if v == nil then return { msg = msg } end
  return build(v)
end

local ENTRY = {}

ENTRY.attr = function(spec)
  return outcome(function(a) return { ids = { ident(a) } } end, pcall(pe.attr, spec))
end

ENTRY.describe = function(spec)
  return outcome(function(d) return { ids = ident_of_text(d) } end, pcall(pe.describe, spec))
end

ENTRY.open = function(spec)
  return outcome(function(ev)
    local r = { ids = { ident(ev:attr()) } }
    ev:close()
    return r
  end, pcall(pe.open, spec))
end

ENTRY.group = function(spec)
  return outcome(function(g)
    local r = { ids = {} }
    for i, ev in ipairs(g:members()) do r.ids[i] = ident(ev:attr()) end
    g:close()
    return r
  end, pcall(pe.group, type(spec) == "string" and spec or { spec }))
end

ENTRY.stat = function(spec)
  return outcome(function(res)
    local r = { ids = {} }
    for i, e in ipairs(res) do r.ids[i] = ident(e.attr) end
    return r
  end, pcall(pe.stat, function() end, spec))
end

-- luaperf stat under strace: the attrs the kernel accepted, or the
-- message luaperf printed and its exit status
local TRACE = os.tmpname()
ENTRY.luaperf = function(spec)
  local out = sh(("strace -f -qq -v -X raw -e trace=perf_event_open -e signal=none -o %s " ..
                  "%s bin/luaperf stat -e '%s' -- true 2>&1; echo rc=$?"):format(TRACE, interp, spec))
  local rc = tonumber(out:match("rc=(%d+)\n?$"))
  if rc == 0 then
    local f = assert(io.open(TRACE))
    local text = f:read("*a")
    f:close()
    return { ids = ident_of_strace(text), out = out }
  end
  return { msg = out:match("luaperf stat: ([^\n]*)"), rc = rc, out = out }
end

-- The cases.  `ids` is the identity every accepting entry point must give
-- (checked against the kernel's and perf's own numbers where they exist);
-- `several` = the spec names several events: pe.attr and pe.open refuse it
-- (they take one), the others accept it.  A refusal names `refused`;
-- `kind` says how: "spec" (nil, msg everywhere), "type"/"field" (pe.open,
-- pe.group and pe.stat raise, pe.attr and pe.describe return nil, msg).
local SW, TP, BP = 1, 2, 5
local function id(t)
  local out = {}
  for _, k in ipairs(ID) do out[k] = t[k] or 0 end
  return out
end

local CASES = {
  { "a string", "task-clock", ids = { id { type = SW, config = 1 } } },
  { "a string with a modifier", "page-faults:u",
    ids = { id { type = SW, config = 2, exclude_kernel = 1, exclude_hv = 1 } } },
  { "{event=...}", { event = "cpu-clock" }, ids = { id { type = SW, config = 0 } } },
  { "{event=..., overrides}", { event = "page-faults", exclude_kernel = true, exclude_hv = true },
    ids = { id { type = SW, config = 2, exclude_kernel = 1, exclude_hv = 1 } } },
  { "a full attr table, named type", { type = "software", config = 1 },
    ids = { id { type = SW, config = 1 } } },
  { "a full attr table, numeric type", { type = 1, config = 2 },
    ids = { id { type = SW, config = 2 } } },
  { "a breakpoint", "mem:0x1000/8:rw", ids = { id { type = BP, bp_type = 3, config1 = 0x1000, config2 = 8 } } },
  { "a group string", "{task-clock,page-faults}:u", several = true,
    ids = { id { type = SW, config = 1, exclude_kernel = 1, exclude_hv = 1 },
            id { type = SW, config = 2, exclude_kernel = 1, exclude_hv = 1 } } },
  { "a list string", "cpu-clock,page-faults", several = true,
    ids = { id { type = SW, config = 0 }, id { type = SW, config = 2 } } },
  { "a malformed string", "task-clock:zz", refused = "bad event string", kind = "spec" },
  { "an unclosed group", "{task-clock,", refused = "bad event string '{task-clock,'", kind = "spec" },
  { "an empty string", "", refused = "empty event list", kind = "spec" },
  { "an unknown name", "no-such-event", refused = "unknown event 'no-such-event'", kind = "spec" },
  { "an unknown PMU", "nosuchpmu/event=1/", refused = "unknown PMU 'nosuchpmu'", kind = "spec" },
  { "an unknown term", "msr/evnt=1/", refused = "unknown term 'evnt'", kind = "spec" },
  { "an unknown name in {event=}", { event = "no-such-event" }, refused = "unknown event 'no-such-event'",
    kind = "spec" },
  { "a table without event or type", { config = 1 }, refused = "an attr table needs 'event' or 'type'",
    kind = "spec" },
  { "an unknown attr field", { type = "software", config = 1, bogus = 1 },
    refused = "unknown attr field 'bogus'", kind = "field" },
  { "an unknown field with event=", { event = "task-clock", bogus = 1 },
    refused = "unknown attr field 'bogus'", kind = "field" },
  { "a number", 42, refused = "spec must be an event string or a table, got number", kind = "type" },
  { "a boolean", true, refused = "got boolean", kind = "type" },
  { "a non-string event=", { event = 5 }, refused = "spec.event must be an event string", kind = "type" },
}
if have_msr then
  CASES[#CASES + 1] = { "msr/tsc/ (exclude_guest retried)", "msr/tsc/",
    ids = { id { type = pe.pmu("msr").type, config = 0 } } }
  CASES[#CASES + 1] = { "{event='msr/tsc/'}", { event = "msr/tsc/" },
    ids = { id { type = pe.pmu("msr").type, config = 0 } } }
end
if have_tp then
  CASES[#CASES + 1] = { "a tracepoint", "syscalls:sys_enter_getppid",
    ids = { id { type = TP, config = U.tp_id("syscalls", "sys_enter_getppid") } } }
  CASES[#CASES + 1] = { "an unknown tracepoint", "syscalls:sys_enter_nosuch",
    refused = "unknown tracepoint 'syscalls:sys_enter_nosuch'", kind = "spec" }
end

local ONE = { attr = true, open = true }     -- entry points that take exactly one event
local OPENS = { open = true, group = true, stat = true, luaperf = true }

-- Without kernel-mode counting every open added exclude_kernel/exclude_hv
-- (perf's fallback, spec/errors_spec.lua checks it): compare the rest.
local function unexclude(got, want)
  for i, g in ipairs(got) do
    local w = want[i] or {}
    if g.exclude_kernel == 1 and w.exclude_kernel == 0 then
      assert.equal(1, g.exclude_hv)
      g.exclude_kernel, g.exclude_hv = 0, w.exclude_hv
    end
  end
end
local RAISES = { open = true, group = true, stat = true }
local ORDER = { "attr", "describe", "open", "group", "stat", "luaperf" }

local function first_line(s) return (tostring(s):match("^[^\n]*")) end

-- runs case c through every entry point (luaperf unless in_process)
local function check_case(c, in_process)
  local label, spec = c[1], c[2]
  local msgs = {}
  for _, name in ipairs(ORDER) do
    local skip = name == "luaperf" and (in_process or type(spec) ~= "string" or not have_strace or spec == "")
    if not skip then
      local r = ENTRY[name](spec)
      local where = ("%s via %s"):format(label, name)
      if c.ids and not (c.several and ONE[name]) then
        assert(r.ids, ("%s refused: %s"):format(where, tostring(r.msg or r.out)))
        if not KERNEL_OK and OPENS[name] then unexclude(r.ids, c.ids) end
        assert.same(c.ids, r.ids, where)
      elseif c.ids then
        -- several events where one is expected
        assert.is_nil(r.ids, where)
        assert.falsy(r.raised, where)
        assert.truthy(r.msg:find("names " .. #c.ids .. " events", 1, true), where .. ": " .. r.msg)
        msgs[#msgs + 1] = first_line(r.msg)
      else
        assert.is_nil(r.ids, where .. " accepted it")
        assert.equal("string", type(r.msg), where)
        -- pe.stat words a wrong type its own way
        local needle = c.refused
        if c.kind == "type" and name == "stat" then
          needle = "got " .. type(type(spec) == "table" and spec.event or spec)
        end
        assert(r.msg:find(needle, 1, true), ("%s: %q lacks %q"):format(where, r.msg, needle))
        if name == "luaperf" then
          assert.equal(1, r.rc, where)
        elseif c.kind == "spec" or not RAISES[name] then
          assert.falsy(r.raised, where .. " raised: " .. r.msg)
        else
          assert.is_true(r.raised, where .. " returned instead of raising")
        end
        -- the resolver's own message, word for word, wherever it reaches the caller
        if not (c.kind == "type" and name == "stat") then msgs[#msgs + 1] = first_line(r.msg) end
      end
    end
  end
  for i = 2, #msgs do assert.equal(msgs[1], msgs[i], label) end
end

describe("one resolver behind every entry point", function()
  for _, c in ipairs(CASES) do
    it(c[1] .. ": the same attr or the same refusal everywhere", function()
      check_case(c)
    end)
  end

  it("a tracepoint while tracefs is missing: nil, msg everywhere, no raise", function()
    local tp = require("perf_event.tracepoint")
    tp.set_root("/nonexistent/tracefs")
    local ok, err = pcall(check_case, { "a tracepoint without tracefs", "syscalls:sys_enter_getppid",
      refused = "unknown tracepoint 'syscalls:sys_enter_getppid'", kind = "spec" }, true)
    tp.set_root(nil)
    assert(ok, err)
  end)
end)

describe("msr/tsc/ counts on every path", function()
  it("pe.stat(fn, 'msr/tsc/') counts TSC ticks", function()
    if not have_msr then pending("no msr PMU with a tsc event here, or no kernel-mode counting") return end
    local r = assert(pe.stat(function() for _ = 1, 1000 do end end, "msr/tsc/"))
    assert.is_true(r[1].counted)
    assert.is_true(r["msr/tsc/"] > 0)
  end)

  it("luaperf stat -e msr/tsc/ -- true counts, after the kernel refused exclude_guest", function()
    if not have_msr then pending("no msr PMU with a tsc event here, or no kernel-mode counting") return end
    if not have_strace then pending("strace is not installed") return end
    local r = ENTRY.luaperf("msr/tsc/")
    assert(r.ids, r.out)
    local count = tonumber(r.out:match("\n +(%d+)      msr/tsc/\n"))
    assert(count and count > 0, r.out)
    local f = assert(io.open(TRACE))
    local text = f:read("*a")
    f:close()
    -- what strace saw: exclude_guest=1 refused with EINVAL, then the open without it
    assert.truthy(text:find("exclude_guest=1,[^\n]*%) = %-1 EINVAL"), text)
    assert.truthy(text:find("exclude_guest=0,[^\n]*%) = %d+\n"), text)
  end)

  it("pe.group and pe.open take msr/tsc/ with or without a modifier-free default", function()
    if not have_msr then pending("no msr PMU with a tsc event here, or no kernel-mode counting") return end
    local g = assert(pe.group("{msr/tsc/,task-clock}"))
    assert.is_false(g:members()[1]:attr().exclude_guest == true)
    g:close()
    local ev = assert(pe.open({ event = "msr/tsc/" }))
    assert.is_true((ev:read()) >= 0)
    ev:close()
  end)
end)

describe("pe.open's disabled option", function()
  it("opens the event disabled: no time, no count until enable()", function()
    local ev = assert(pe.open("task-clock", { disabled = true }))
    assert.is_true(ev:attr().disabled)
    for _ = 1, 200000 do end
    local v, en, run = ev:read()
    assert.equal(0, n(v))
    assert.equal(0, n(en))
    assert.equal(0, n(run))
    assert(ev:enable())
    for _ = 1, 200000 do end
    assert.is_true(n((ev:read())) > 0)
    ev:close()
  end)

  it("without it an event opens counting", function()
    local ev = assert(pe.open("task-clock"))
    assert.is_nil(ev:attr().disabled)
    for _ = 1, 200000 do end
    assert.is_true(n((ev:read())) > 0)
    ev:close()
  end)
end)

describe("did you mean", function()
  it("still suggests for a near miss", function()
    local w0 = parse.suggest_work
    local ev, msg = pe.open("task-clok")
    assert.is_nil(ev)
    assert.truthy(msg:find("did you mean: task-clock", 1, true), msg)
    assert.is_true(parse.suggest_work > w0)
  end)

  it("computes no edit distance for a 100 KB unknown name", function()
    for _, s in ipairs({ string.rep("a", 100000), string.rep("x", 100000) .. ":" .. string.rep("y", 100000),
                         string.rep("q", 100000) .. "/event=1/" }) do
      local w0 = parse.suggest_work
      local ev, msg = pe.open(s)
      assert.is_nil(ev)
      assert.truthy(msg:find("^perf_event: bad event string"))
      assert.falsy(msg:find("did you mean", 1, true))
      assert.equal(w0, parse.suggest_work)
    end
  end)

  it("bounds the work for a long name just under the limit", function()
    local w0 = parse.suggest_work
    assert.is_nil(pe.open(string.rep("z", 64)))
    -- only candidates within 21 characters of 64 are compared, row by row
    -- until the distance passes 21: far less than 64 cells per letter of
    -- every name this machine offers
    local names = #pe.list()
    assert.is_true(parse.suggest_work - w0 < 64 * 64 * math.max(names, 1) / 4,
      tostring(parse.suggest_work - w0))
  end)
end)

teardown(function() os.remove(TRACE) end)
