-- perf_event.symbols: ELF symbol tables checked against nm(1), address
-- resolution through the process's mappings, kallsyms, callchains.
local symbols = require("perf_event.symbols")

local function sh(cmd)
  local p = io.popen(cmd)
  local s = p:read("*a")
  p:close()
  return s
end

local have_nm = sh("command -v nm") ~= ""

-- rec.callchain as the core's decoder makes it from a PERF_RECORD_SAMPLE
-- built to the kernel's layout; entries are numbers or 16-digit hex strings
-- (the marker values of <linux/perf_event.h>, as the kernel writes them)
local function decoded_chain(entries)
  local U = require("support.util")
  local function u64(v)
    if type(v) == "number" then return U.le64(v) end
    local t = {}
    for i = 15, 1, -2 do t[#t + 1] = string.char(tonumber(v:sub(i, i + 1), 16)) end
    return table.concat(t)
  end
  local body = { U.le64(#entries) }
  for _, v in ipairs(entries) do body[#body + 1] = u64(v) end
  body = table.concat(body)
  local bytes = U.le64(9):sub(1, 4) .. U.le64(1):sub(1, 2) .. U.le64(8 + #body):sub(1, 2) .. body
  local rec = assert(require("perf_event.core").decode_record(bytes, { sample_type = "callchain" }))
  return rec.callchain
end
local KERNEL, USER = "ffffffffffffff80", "fffffffffffffe00"   -- PERF_CONTEXT_KERNEL, _USER

-- name -> address from `nm [-D] file` for defined text symbols
local function nm(file, dynamic)
  local t = {}
  local out = sh("nm " .. (dynamic and "-D " or "") .. file .. " 2>/dev/null")
  for addr, kind, name in out:gmatch("(%x+) (%a) ([^\n@]+)") do
    if kind == "T" or kind == "t" or kind == "W" or kind == "i" then t[name] = tonumber(addr, 16) end
  end
  return t
end

local function libc_path()
  for line in io.lines("/proc/self/maps") do
    local p = line:match("%s(/%S*libc[.-]%S*%.so[.%d]*)$") or line:match("%s(/%S*/libc%.so%.6)$")
    if p then return p end
  end
end

describe("ELF reader", function()
  it("finds the functions of libpetarget.so at nm's addresses", function()
    if not have_nm then pending("needs nm (binutils)") return end
    local elf = assert(symbols.read_elf("build/test/libpetarget.so"))
    local want = nm("build/test/libpetarget.so", true)
    local found = 0
    for _, s in ipairs(elf.syms) do
      if s.name:match("^pet_") then
        assert.equal(want[s.name], s.addr, s.name)
        found = found + 1
      end
    end
    assert.equal(7, found)   -- pet_work, pet_call, pet_touch, pet_spin(_inner), pet_addr_*
    local name, off = elf:find(want.pet_spin_inner + 5)
    assert.equal("pet_spin_inner", name)
    assert.equal(5, off)
  end)

  it("reads .symtab of an executable (main is not dynamic)", function()
    if not have_nm then pending("needs nm (binutils)") return end
    local elf = assert(symbols.read_elf("build/test/petarget"))
    local want = nm("build/test/petarget")
    assert.truthy(want.main)
    assert.equal("main", (elf:find(want.main)))
  end)

  it("maps file offsets to link addresses through PT_LOAD", function()
    local elf = assert(symbols.read_elf("build/test/libpetarget.so"))
    assert.truthy(#elf.loads >= 2)
    for _, l in ipairs(elf.loads) do
      assert.equal(l.vaddr + 16, elf:vaddr(l.offset + 16))
    end
  end)

  it("rejects what is not an ELF file", function()
    local e, err = symbols.read_elf("/proc/self/status")
    assert.is_nil(e)
    assert.truthy(err:find("not an ELF", 1, true))
    assert.is_nil((symbols.read_elf("/nonexistent/file")))
  end)
end)

describe("symbolizer", function()
  it("resolves libc's getppid in this process through /proc/self/maps", function()
    if not have_nm then pending("needs nm (binutils)") return end
    local path = libc_path()
    if not path then pending("libc not found in /proc/self/maps") return end
    local sym = symbols.new()
    local pid = assert(sym:load_maps("self"))
    -- runtime address = where the file's offset 0 is mapped + st_value
    local base
    for line in io.lines("/proc/self/maps") do
      local s, off, p = line:match("^(%x+)%-%x+ %S+ (%x+) %S+ %d+%s+(%S+)$")
      if p == path and tonumber(off, 16) == 0 then base = tonumber(s, 16) break end
    end
    local addr = base + nm(path, true).getppid
    local name, off, module = sym:lookup(addr + 1, pid)
    assert.equal("getppid", name)
    assert.equal(1, off)
    assert.equal(path:match("[^/]+$"), module)
    assert.equal("getppid", sym:name(addr))   -- without a pid: the "self" mappings
  end)

  it("names mappings it has no symbol for as file+0xoffset, and [unknown] outside", function()
    local sym = symbols.new()
    sym:add_map(7, 0x10000, 0x2000, 0x3000, "/nonexistent/libfoo.so")
    assert.equal("libfoo.so+0x3010", sym:name(0x10010, 7))
    assert.equal("[unknown]", sym:name(0x9000, 7))
    assert.equal("[unknown]", sym:name(0x10010, 8))
  end)

  it("splits older mappings that a new one overlaps, as mmap does", function()
    local sym = symbols.new()
    sym:add_map(1, 0x1000, 0x3000, 0, "/x/a")
    sym:add_map(1, 0x2000, 0x1000, 0, "/x/b")
    assert.equal("a+0x0", sym:name(0x1000, 1))
    assert.equal("b+0x0", sym:name(0x2000, 1))
    assert.equal("a+0x2000", sym:name(0x3000, 1))
    assert.equal(3, #sym.maps[1])
  end)

  it("follows mmap2, fork and exec records", function()
    local sym = symbols.new()
    sym:record({ type = "mmap2", pid = 5, addr = 0x400000, len = 0x1000, pgoff = 0, filename = "/x/prog" })
    sym:record({ type = "fork", pid = 6, ppid = 5 })
    assert.equal("prog+0x10", sym:name(0x400010, 6))
    sym:record({ type = "comm", pid = 6, misc = 0x2000, comm = "new" })  -- exec
    assert.equal("[unknown]", sym:name(0x400010, 6))
    assert.equal("prog+0x10", sym:name(0x400010, 5))
  end)

  it("reads callchains leaf first, skipping PERF_CONTEXT markers, one [unknown] per run", function()
    local sym = symbols.new()
    sym:add_map(1, 0x1000, 0x1000, 0, "/x/a")
    local chain = decoded_chain({ USER, 0x1010, 0x1021, 0x9999, 0x9998, 0x1031 })
    assert.equal("user", chain[1])
    local frames = sym:callchain(chain, 1)
    -- return addresses are looked up at addr-1
    assert.same({ "a+0x10", "a+0x20", "[unknown]", "a+0x30" }, frames)
  end)

  it("names the frames of a callchain the core's decoder made, first user frame exactly", function()
    -- the markers come back from the decoder as names, as from any ring
    local file = assert(os.getenv("PWD")) .. "/build/test/libpetarget.so"  -- mappings name absolute paths
    local elf = assert(symbols.read_elf(file))
    local f                                 -- pet_spin_inner's symbol
    for _, s in ipairs(elf.syms) do if s.name == "pet_spin_inner" then f = s end end
    assert.truthy(f and f.size > 8)
    local fileoff
    for _, l in ipairs(elf.loads) do
      if f.addr >= l.vaddr and f.addr < l.vaddr + l.filesz then fileoff = f.addr - l.vaddr + l.offset end
    end
    assert.truthy(fileoff)
    local base = 0x400000
    local entry = base + fileoff             -- the sampled user ip: the function's first byte
    local ret = base + fileoff + 5           -- a return address inside it
    local chain = decoded_chain({ KERNEL, "ffffffff81000000", USER, entry, ret })
    assert.equal("kernel", chain[1])
    assert.equal("user", chain[3])
    local sym = symbols.new({ kernel = false })
    sym:add_map(42, base, 0x100000, 0, file)
    -- the lookup the frame needs differs from the byte before it
    assert.equal("pet_spin_inner", sym:name(entry, 42))
    assert.are_not.equal("pet_spin_inner", sym:name(entry - 1, 42))
    local frames = sym:callchain(chain, 42)
    assert.same({ "[unknown]", "pet_spin_inner", "pet_spin_inner" }, frames)
    -- the same chain with the raw marker numbers (as another tool's decoder gives it)
    local raw = { "0xffffffffffffff80", "0xffffffff81000000", "0xfffffffffffffe00", entry, ret }
    assert.same(frames, sym:callchain(raw, 42))
  end)

  it("turns every 64-bit representation into the same hex", function()
    assert.equal("0000000000001000", symbols.hex(4096))
    assert.equal("ffffffff81000000", symbols.hex("0xFFFFFFFF81000000"))
    assert.equal("00000000000000ff", symbols.hex("0xff"))
    if jit then
      -- the ULL literal is LuaJIT syntax: load it so PUC Lua can parse this file
      assert.equal("fffffffffffffe00", symbols.hex(load("return 0xfffffffffffffe00ULL")()))
    end
    if rawget(math, "type") then
      assert.equal("fffffffffffffe00", symbols.hex(load("return -512")()))
    end
    assert.is_nil(symbols.hex(-1.5))
    assert.is_nil(symbols.hex({}))
  end)
end)

describe("kernel symbols", function()
  it("names a kallsyms address and an offset into it", function()
    local k = symbols.kallsyms()
    if not k then pending("/proc/kallsyms hides addresses (kptr_restrict) or is unreadable") return end
    -- a function with a unique address, straight from the file
    local addr, name
    for line in io.lines("/proc/kallsyms") do
      local a, t, n = line:match("^(%x+) (%a) (%S+)$")
      if t == "T" and n == "schedule" then addr, name = a, n break end
    end
    assert.truthy(addr)
    local sym = symbols.new()
    local got, off, module = sym:lookup("0x" .. addr)
    assert.equal(name, got)
    assert.equal(0, off)
    assert.equal("[kernel]", module)
    local hex = symbols.hex("0x" .. addr)
    local plus4 = hex:sub(1, 12) .. ("%04x"):format(tonumber(hex:sub(13), 16) + 4)
    local got2, off2 = sym:lookup("0x" .. plus4)
    assert.equal(name, got2)
    assert.equal(4, off2)
  end)
end)
