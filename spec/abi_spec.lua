-- core.abi, the one copy of the kernel ABI: every table checked against
-- what <linux/perf_event.h> and <errno.h> say (a C program compiled here
-- prints the header's values), and lua/ searched for the hand-typed copies
-- the Lua modules used to carry, so none comes back.
local core = require("perf_event.core")
local U = require("support.util")
local abi = core.abi

local function hex(v) return (U.hex(v):lower():gsub("^0+(.)", "%1")) end

local function sh(cmd) return U.sh(cmd .. " 2>&1") end

local function upper(s) return (s:upper()) end

-- ---------------------------------------------------------------- the header

-- One check per line: {key, C expression}.  Lines naming something the
-- installed header does not know (a newer kernel's name) fail to compile;
-- they are dropped and reported back as missing, so each can be judged.
local checks = {}
local function check(key, expr) checks[#checks + 1] = { key = key, expr = expr } end

local ENUMS = {   -- abi table -> header prefix, and the header's count/limit
  { t = "type", prefix = "PERF_TYPE_", max = "PERF_TYPE_MAX" },
  { t = "sample_type", prefix = "PERF_SAMPLE_", max = "PERF_SAMPLE_MAX" },
  { t = "read_format", prefix = "PERF_FORMAT_", max = "PERF_FORMAT_MAX" },
  { t = "branch_sample_type", prefix = "PERF_SAMPLE_BRANCH_", max = "PERF_SAMPLE_BRANCH_MAX" },
  { t = "record_type", prefix = "PERF_RECORD_", max = "PERF_RECORD_MAX" },
  { t = "misc", prefix = "PERF_RECORD_MISC_" },
  { t = "context", prefix = "PERF_CONTEXT_" },
  { t = "bp_type", prefix = "HW_BREAKPOINT_" },
  { t = "sw", prefix = "PERF_COUNT_SW_", max = "PERF_COUNT_SW_MAX" },
  { t = "hw", prefix = "PERF_COUNT_HW_", max = "PERF_COUNT_HW_MAX" },
  { t = "hw_cache.id", prefix = "PERF_COUNT_HW_CACHE_", max = "PERF_COUNT_HW_CACHE_MAX" },
  { t = "hw_cache.op", prefix = "PERF_COUNT_HW_CACHE_OP_", max = "PERF_COUNT_HW_CACHE_OP_MAX" },
  { t = "hw_cache.result", prefix = "PERF_COUNT_HW_CACHE_RESULT_",
    max = "PERF_COUNT_HW_CACHE_RESULT_MAX" },
}

local function abi_table(path)
  local t = abi
  for part in path:gmatch("[^.]+") do t = t[part] end
  return t
end

for _, e in ipairs(ENUMS) do
  for name in pairs(abi_table(e.t)) do
    if type(name) == "string" then check(e.t .. "." .. name, e.prefix .. upper(name)) end
  end
  if e.max then check(e.t .. ".MAX", e.max) end
end
check("context_max", "PERF_CONTEXT_MAX")
for name in pairs(abi.errno) do check("errno." .. name, name) end

-- attr fields: offset and size of each member; a flag's bit as its position
-- in the struct's bytes (set it alone, find the bit)
local BITPOS = "bitpos(&a, sizeof a)"
for _, f in ipairs(abi.attr_fields) do
  local k = "attr." .. f.name
  if f.kind == "flag" or f.kind == "precise_ip" or f.kind == "aux_bit" then
    check(k .. ".bitpos", "(memset(&a, 0, sizeof a), a." .. f.name .. " = 1, " .. BITPOS .. ")")
  else
    check(k .. ".offset", "offsetof(struct perf_event_attr, " .. f.name .. ")")
    check(k .. ".size", "sizeof(a." .. f.name .. ")")
  end
end
check("attr.sizeof", "sizeof(struct perf_event_attr)")
for i = 1, 3 do   -- reserved members: where a newer kernel's field may sit
  check("attr.reserved" .. i, "offsetof(struct perf_event_attr, __reserved_" .. i .. ")")
end

local header   -- key -> hex value, and missing[key] = true

local function compile_and_run(list)
  local src = os.tmpname()
  local exe = src .. ".bin"
  local lines = {
    "#include <stddef.h>", "#include <stdio.h>", "#include <string.h>", "#include <errno.h>",
    "#include <linux/perf_event.h>", "#include <linux/hw_breakpoint.h>",
    "static unsigned long long bitpos(const void *p, size_t n) {",
    "  const unsigned char *b = p; size_t i; int k;",
    "  for (i = 0; i < n; i++) for (k = 0; k < 8; k++) if (b[i] >> k & 1) return i * 8 + k;",
    "  return ~0ull; }",
    "int main(void) { struct perf_event_attr a; memset(&a, 0, sizeof a);",
  }
  local first = #lines + 1
  for _, c in ipairs(list) do
    lines[#lines + 1] = ('  printf("%%s %%llx\\n", "%s", (unsigned long long)(%s));'):format(c.key, c.expr)
  end
  lines[#lines + 1] = "  return 0; }"
  local f = assert(io.open(src .. ".c", "w"))
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
  local out = sh("cc -w -o " .. exe .. " " .. src .. ".c")
  local bad = {}
  for ln in out:gmatch("%.c:(%d+):%d+: error") do
    local i = tonumber(ln) - first + 1
    if list[i] then bad[i] = true end
  end
  local res
  if next(bad) == nil then res = sh(exe) end
  os.remove(src); os.remove(src .. ".c"); os.remove(exe)
  return res, bad, out
end

local function read_header()
  if header then return header end
  if sh("command -v cc") == "" then return nil, "needs a C compiler" end
  local list = checks
  local res, bad, out = compile_and_run(list)
  local missing = {}
  if not res then
    assert(next(bad), "the header check program failed to build:\n" .. out)
    local keep = {}
    for i, c in ipairs(list) do
      if bad[i] then missing[c.key] = true else keep[#keep + 1] = c end
    end
    local bad2
    res, bad2, out = compile_and_run(keep)
    assert(next(bad2) == nil, "still failing to build:\n" .. out)
    assert(res, "the header check program failed to build:\n" .. out)
  end
  header = { missing = missing, v = {} }
  for k, v in res:gmatch("(%S+) (%x+)\n") do header.v[k] = v end
  return header
end

local function need_header()
  local h, why = read_header()
  if not h then pending(why) end
  return h
end

describe("core.abi against <linux/perf_event.h> and <errno.h>", function()
  it("has every enum value the header has, and only newer ones it lacks", function()
    local h = need_header()
    if not h then return end
    local compared, newer = 0, 0
    for _, e in ipairs(ENUMS) do
      local max = e.max and h.v[e.t .. ".MAX"]
      for name, v in pairs(abi_table(e.t)) do
        if type(name) == "string" then
          local key = e.t .. "." .. name
          if h.missing[key] then
            -- a name this header predates: it must lie past the header's range
            assert(max, key .. " is unknown to the header, which has no limit to place it past")
            assert.truthy(tonumber(hex(v), 16) >= tonumber(max, 16),
              key .. " = " .. hex(v) .. " is not past the header's " .. e.max .. " = " .. max)
            newer = newer + 1
          else
            assert.equal(h.v[key], hex(v), key)
            compared = compared + 1
          end
        end
      end
    end
    assert.equal(h.v.context_max, hex(abi.context_max))
    assert.truthy(compared > 100, "compared " .. compared)
    assert.truthy(newer <= 3, "newer than the header: " .. newer)
  end)

  it("reverse tables name what the forward ones number", function()
    for name, v in pairs(abi.type) do assert.equal(name, abi.type_name[v]) end
    for name, v in pairs(abi.sw) do assert.equal(name, abi.sw_name[v]) end
    for name, v in pairs(abi.hw) do assert.equal(name, abi.hw_name[v]) end
    for name, v in pairs(abi.errno) do assert.equal(name, abi.errno_name[v]) end
    local n = 0
    for k, v in pairs(abi.record_type) do
      if type(k) == "number" then assert.equal(k, abi.record_type[v]); n = n + 1 end
    end
    assert.equal(22, n)   -- PERF_RECORD_MMAP .. PERF_RECORD_CALLCHAIN_DEFERRED
    assert.equal("sample", abi.record_type[abi.record_type.sample])
  end)

  it("errno numbers are <errno.h>'s", function()
    local h = need_header()
    if not h then return end
    local n = 0
    for name, v in pairs(abi.errno) do
      assert.is_nil(h.missing["errno." .. name])
      assert.equal(h.v["errno." .. name], hex(v), name)
      n = n + 1
    end
    assert.truthy(n >= 30)
    assert.equal("EINVAL", abi.errno_name[tonumber(h.v["errno.EINVAL"], 16)])
  end)

  it("attr field offsets, sizes and flag bits are struct perf_event_attr's", function()
    local h = need_header()
    if not h then return end
    local size = tonumber(h.v["attr.sizeof"], 16)
    local reserved = {}
    for i = 1, 3 do
      local r = h.v["attr.reserved" .. i]
      if r then reserved[tonumber(r, 16)] = true end
    end
    local compared = 0
    for _, f in ipairs(abi.attr_fields) do
      local k = "attr." .. f.name
      if f.bit then
        if h.missing[k .. ".bitpos"] then
          -- newer than the header: its word is past the struct or reserved there
          assert.truthy(f.offset >= size or reserved[f.offset], k .. " unknown to the header")
        else
          assert.equal(tonumber(h.v[k .. ".bitpos"], 16), f.offset * 8 + f.bit, k)
          compared = compared + 1
        end
      elseif h.missing[k .. ".offset"] then
        assert.truthy(f.offset >= size or reserved[f.offset], k .. " unknown to the header")
      else
        assert.equal(tonumber(h.v[k .. ".offset"], 16), f.offset, k)
        assert.equal(tonumber(h.v[k .. ".size"], 16), f.size, k)
        compared = compared + 1
      end
    end
    assert.truthy(compared >= 60, "compared " .. compared)
    assert.truthy(abi.attr_size >= size)
  end)

  it("the fixed sample head is the sample_type bits the decoder lays out in order", function()
    -- a sample of every fixed field, bytes in the kernel's order, decoded by the core
    local st, body, n = 0, {}, 0
    for i, f in ipairs(abi.sample_fixed) do
      st = st + f.bit
      n = n + 1
      body[#body + 1] = f.field and U.le64(1000 + i) or (U.le64(1000 + i):sub(1, 4) .. U.le64(2000 + i):sub(1, 4))
    end
    assert.equal(abi.sample_fixed_mask, st)
    body = table.concat(body)
    local rec = assert(core.decode_record(U.le64(abi.record_type.sample):sub(1, 4) .. U.le64(0):sub(1, 2) ..
      U.le64(8 + #body):sub(1, 2) .. body, { sample_type = st }))
    for i, f in ipairs(abi.sample_fixed) do
      if f.field and f.field ~= "id" then assert.equal(1000 + i, rec[f.field], f.name) end
      if f.lo then assert.equal(1000 + i, rec[f.lo], f.name) end
      if f.hi then assert.equal(2000 + i, rec[f.hi], f.name) end
    end
    assert.equal(9, n)
  end)

  it("describe prints perf's labels from the field table", function()
    local pe = require("perf_event")
    local s = assert(pe.describe({ type = "breakpoint", bp_type = "w", bp_addr = 4096, bp_len = 8,
                                   sample_period = 1 }))
    assert.truthy(s:find("{ bp_addr, config1 }%s+0x1000"), s)
    assert.truthy(s:find("{ sample_period, sample_freq }%s+1\n"), s)
  end)
end)

-- ---------------------------------------------------------------- no copies

-- Per ABI fact: patterns of the hand-typed copies lua/ used to carry, each
-- with the line it was written against (so a pattern that no longer
-- catches its copy fails too), optionally limited to some files.
local FORBIDDEN = {
  { fact = "errno numbers", pat = "errno%s*[=~<>]=%s*%d",
    was = "  if not ev and errno == 22 and guest_default and attr.exclude_guest then" },
  { fact = "errno number -> name", pat = "%[%s*%d+%s*%]%s*=%s*\"E%u",
    was = "local WEAK_ERRNO = { [22] = \"EINVAL\", [9] = \"EBADF\", [28] = \"ENOSPC\"," },
  { fact = "attr types", pat = "TYPE_%u+%s*=%s*%d", was = "local TYPE_TRACEPOINT = 2" },
  { fact = "attr types", pat = "%f[%w_]tracepoint%s*=%s*%d",
    was = "M.TYPE = { hardware = 0, software = 1, tracepoint = 2, hw_cache = 3, raw = 4, breakpoint = 5 }" },
  { fact = "attr types", pat = "%f[%w_]hardware%s*=%s*%d", was = "local SOFTWARE, HARDWARE = 1, 0",
    ci = true },
  { fact = "attr types", pat = "type%)?%s*[=~]=%s*%d", was = "  if tonumber(atype) ~= 2 then return false end" },
  { fact = "sample_type bits", pat = "SAMPLE_[%u_]*BIT[%w_, ]*=%s*%d",
    was = "local SAMPLE_READ_BIT, SAMPLE_ID_BIT = 4, 6" },
  { fact = "sample_type bits", pat = "sample_type%s*,%s*%d",
    was = "      a.sample_type = small_or(a.sample_type, 32 + 4096 + 8192)" },
  { fact = "sample_type bits", pat = "%(st%s*/%s*%d",
    was = "  return (st / 1024) % 2 >= 1      -- PERF_SAMPLE_RAW: tracepoint fields" },
  { fact = "sample_type bits", pat = "%f[%w_]st%s*>=%s*%d%d%d", was = "  if st >= 33554432 then return false end" },
  { fact = "fixed sample layout", pat = "slot%(%s*0x", files = { "records.lua" },
    was = "    slot(0x10000, function(k) return (\"id = u64(q, %d)\"):format(k) end)" },
  { fact = "fixed sample layout", pat = "0x1%s*%+%s*0x2", was = "local SIMPLE = 0x1 + 0x2 + 0x4 + 0x8 + 0x40" },
  { fact = "record types", pat = "w%[0%]%s*[=~]=%s*%d",
    was = "    if w[0] ~= 9 or n ~= %d then return ev:_decode_current() end" },
  { fact = "misc bits", pat = "misc[^\n]-0x%x", was = "    if rec.misc and rec.misc % 0x4000 >= 0x2000 then" },
  { fact = "read_format bits", pat = "_RF%s*=%s*%d", was = "local GROUP_RF = 1 + 2 + 4 + 8" },
  { fact = "branch_sample_type bits", pat = "branch_sample_type%s*,%s*%d",
    was = "      a.branch_sample_type = small_or(a.branch_sample_type, 1 + 2048 + 16384 + 32768 + 131072)" },
  { fact = "branch_sample_type bits", pat = "any_ret%s*=%s*%d",
    was = "  u = 1, k = 2, hv = 4, any = 8, any_call = 16, any_ret = 32, ind_call = 64," },
  { fact = "context markers", pat = "fffffffffffff",
    was = "  [\"ffffffffffffffe0\"] = \"hv\", [\"ffffffffffffff80\"] = \"kernel\"," },
  { fact = "context markers", pat = "%-2176", was = "-- -2048 guest, -2176 guest kernel, -2560 guest user" },
  { fact = "attr print order", pat = "\"{ %l[%w_]+, %l[%w_]+ }\"",
    was = "  { \"sample_freq\", \"{ sample_period, sample_freq }\" }, { \"sample_type\" }, { \"read_format\" }," },
  { fact = "attr print order", pat = "{%s*\"exclude_user\"%s*}",
    was = "  { \"disabled\" }, { \"inherit\" }, { \"pinned\" }, { \"exclusive\" }, { \"exclude_user\" }," },
  { fact = "attr hex fields", pat = "HEXF%s*=%s*{%s*%l",
    was = "local HEXF = { config = true, config1 = true, config2 = true, config3 = true, bp_addr = true," },
  { fact = "sw/hw event ids", pat = "%[\"[%a%-]+%-[%a%-]+\"%]%s*=%s*%d", files = { "events.lua", "cli.lua",
    "stat.lua", "list.lua", "record.lua" },
    was = "  [\"cpu-clock\"] = 0, [\"task-clock\"] = 1, [\"page-faults\"] = 2, faults = 2," },
  { fact = "sw/hw event ids", pat = "%f[%w_]cycles%s*=%s*%d",
    was = "  [\"cpu-cycles\"] = 0, cycles = 0, instructions = 1, [\"cache-references\"] = 2," },
  { fact = "sw/hw event ids", pat = "\"software\"%s*,%s*config%s*=%s*%d",
    was = "  { type = \"software\", config = 1, name = \"task-clock\" }," },
  { fact = "sw/hw event ids", pat = "is_[hs]w%(%s*[%w_]+%s*,%s*%d",
    was = "    if is_hw(a, 4) then branches = e.value end" },
  { fact = "breakpoint types", pat = "%f[%w_]r%s*=%s*1%s*,%s*w%s*=%s*2",
    was = "        bp_type = bp_type + ({ r = 1, w = 2, x = 4 })[c]" },
  { fact = "breakpoint types", pat = "bp_type%s*[=~]=%s*%d",
    was = "  if l == 0 then l = (bp_type == 4) and 8 or 4 end" },
  { fact = "breakpoint types", pat = "bp_type%s+or%s+%d", was = "  bp_type = bp_type or 3" },
  { fact = "hw_cache ids", pat = "%[0%]%s*=%s*{%s*%[0%]", was = "  [0] = { [0] = true, true, true }," },
  { fact = "hw_cache config", pat = "op%s*%*%s*256", was = "  return id + op * 256 + res * 65536" },
  { fact = "hw_cache ids", pat = "%f[%w_]id%s*==%s*%d%s+and",
    was = "          id == 1 and \"loads, prefetches\" or \"loads\"))" },
  { fact = "hw_cache ops", pat = "%[0%]%s*=%s*\"load\"",
    was = "  local opname = { [0] = \"load\", \"store\", \"prefetch\" }" },
}

local function lua_files()
  local out = {}
  for f in sh("ls lua/perf_event/*.lua lua/perf_event/*/*.lua lua/*.lua bin/luaperf"):gmatch("[^\n]+") do
    if f:find("^[%w_/%.]+$") then out[#out + 1] = f end
  end
  return out
end

local function matches(rule, line)
  if rule.ci then line = line:lower() end
  return line:find(rule.pat) ~= nil
end

describe("no hand-typed copy of the ABI in lua/", function()
  it("each pattern catches the copy it was written against", function()
    for _, r in ipairs(FORBIDDEN) do
      assert.truthy(matches(r, r.was), r.fact .. ": " .. r.pat .. " misses " .. r.was)
    end
  end)

  it("no module carries one", function()
    local files = lua_files()
    assert.truthy(#files >= 12)
    local hits = {}
    for _, file in ipairs(files) do
      local base = file:match("[^/]+$")
      local n = 0
      for line in io.lines(file) do
        n = n + 1
        for _, r in ipairs(FORBIDDEN) do
          local applies = not r.files
          for _, only in ipairs(r.files or {}) do applies = applies or only == base end
          if applies and matches(r, line) then
            hits[#hits + 1] = ("%s:%d: %s (%s)"):format(file, n, line, r.fact)
          end
        end
      end
    end
    assert.same({}, hits)
  end)
end)
