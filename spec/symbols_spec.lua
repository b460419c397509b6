-- perf_event.symbols: ELF symbol tables checked against nm(1), address
-- resolution through the process's mappings, kallsyms, callchains.
local symbols = require("perf_event.symbols")
local sh = require("support.util").sh

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
      if s.name:match("^pet_[%w_]*$") then   -- not the pet_*@plt entries
        assert.equal(want[s.name], s.addr, s.name)
        found = found + 1
      end
    end
    assert.equal(7, found)   -- pet_work, pet_call, pet_touch, pet_spin(_inner), pet_addr_*

    local name, off = elf:find(want.pet_spin_inner + 5)
    assert.equal("pet_spin_inner", name)
    assert.equal(5, off)
  end)

  it("names PLT entries as perf does, at the addresses objdump gives them", function()
    if sh("command -v objdump") == "" then pending("needs objdump (binutils)") return end
    local path = libc_path()
    if not path then pending("libc not found in /proc/self/maps") return end
    -- libc: no symbol stretches over its .plt, each entry is name@plt
    local elf = assert(symbols.read_elf(path))
    local n = 0
    for addr, name in sh("objdump -d -j .plt " .. path):gmatch("\n(%x+) <([%w_]+@plt)>:") do
      assert.equal(name, (elf:find(tonumber(addr, 16))))
      n = n + 1
    end
    assert.truthy(n >= 10, n)
    -- petarget: the linker's _init (size 0) comes before .plt and covers it
    -- in perf's lookup, which then names its PLT entries _init
    local exe = assert(symbols.read_elf("build/test/petarget"))
    local entries = 0
    for addr in sh("objdump -d -j .plt build/test/petarget"):gmatch("\n(%x+) <[%w_]+@plt>:") do
      assert.equal("_init", (exe:find(tonumber(addr, 16))))
      entries = entries + 1
    end
    assert.truthy(entries >= 1)
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
    local link = nm(path, true).getppid
    local addr = base + link
    local name, off, module = sym:lookup(addr + 1, pid)
    -- getppid itself, or with libc's debug symbols (libc6-dbg) the alias at
    -- its address that perf would show (e.g. __GI___getppid)
    local elf = assert(symbols.elf(path))
    assert.equal(link, nm(elf.debug_path or path, not elf.debug_path)[name])
    assert.equal(1, off)
    assert.equal(path:match("[^/]+$"), module)
    assert.equal(name, sym:name(addr))   -- without a pid: the "self" mappings
  end)

  it("names mappings it has no symbol for as [file] (file+0xoffset when asked), and [unknown] outside", function()
    local sym = symbols.new()
    sym:add_map(7, 0x10000, 0x2000, 0x3000, "/nonexistent/libfoo.so")
    local name, off, module = sym:lookup(0x10010, 7)
    assert.equal("[libfoo.so]", name)
    assert.equal(0x3010, off)
    assert.equal("libfoo.so", module)
    assert.equal("[unknown]", sym:name(0x9000, 7))
    assert.equal("[unknown]", sym:name(0x10010, 8))
    local raw = symbols.new({ offsets = true })
    raw:add_map(7, 0x10000, 0x2000, 0x3000, "/nonexistent/libfoo.so")
    assert.equal("libfoo.so+0x3010", raw:name(0x10010, 7))
  end)

  it("gives the range of addresses that answer a lookup's name: the symbol's size (nm -S), a gap, a mapping", function()
    if not have_nm then pending("needs nm (binutils)") return end
    local path = sh("realpath build/test/libpetarget.so"):gsub("%s+$", "")
    -- nm -S -D: link address and size of pet_spin_inner
    local link, size = sh("nm -S -D " .. path):match("(%x+) (%x+) T pet_spin_inner\n")
    link, size = tonumber(link, 16), tonumber(size, 16)
    assert.is_true(size > 0)
    local elf = assert(symbols.read_elf(path))
    local fileoff
    for _, l in ipairs(elf.loads) do
      if link >= l.vaddr and link < l.vaddr + l.filesz then fileoff = link - l.vaddr + l.offset end
    end
    local base = 0x40000000
    local sym = symbols.new()
    sym:add_map(7, base, 0x100000, 0, path)
    local a = base + fileoff
    local name, off, module, lo, hi = sym:lookup(a + 3, 7)
    assert.equal("pet_spin_inner", name)
    assert.equal(3, off)
    assert.equal("libpetarget.so", module)
    assert.equal(a, lo)
    assert.equal(a + size, hi)
    -- the last byte of the function answers the same; the next one does not
    assert.equal(a, select(4, sym:lookup(a + size - 1, 7)))
    assert.are_not.equal("pet_spin_inner", (sym:lookup(a + size, 7)))
    -- a file without symbols: the whole mapping; outside every mapping:
    -- the gap between the mappings around it
    sym:add_map(7, 0x10000, 0x2000, 0x3000, "/nonexistent/libfoo.so")
    assert.same({ "[libfoo.so]", 0x3010, "libfoo.so", 0x10000, 0x12000 }, { sym:lookup(0x10010, 7) })
    assert.same({ "[unknown]", nil, nil, 0x12000, base }, { sym:lookup(0x20000, 7) })
  end)

  it("splits older mappings that a new one overlaps, as mmap does", function()
    local sym = symbols.new({ offsets = true })
    sym:add_map(1, 0x1000, 0x3000, 0, "/x/a")
    sym:add_map(1, 0x2000, 0x1000, 0, "/x/b")
    assert.equal("a+0x0", sym:name(0x1000, 1))
    assert.equal("b+0x0", sym:name(0x2000, 1))
    assert.equal("a+0x2000", sym:name(0x3000, 1))
    assert.equal(3, #sym.maps[1])
  end)

  it("follows mmap2, fork and exec records", function()
    local sym = symbols.new({ offsets = true })
    sym:record({ type = "mmap2", pid = 5, addr = 0x400000, len = 0x1000, pgoff = 0, filename = "/x/prog" })
    sym:record({ type = "fork", pid = 6, ppid = 5 })
    assert.equal("prog+0x10", sym:name(0x400010, 6))
    sym:record({ type = "comm", pid = 6, misc = 0x2000, comm = "new" })  -- exec
    assert.equal("[unknown]", sym:name(0x400010, 6))
    assert.equal("prog+0x10", sym:name(0x400010, 5))
  end)

  it("reads callchains leaf first, skipping PERF_CONTEXT markers, one [unknown] per unknown address", function()
    local sym = symbols.new({ offsets = true })
    sym:add_map(1, 0x1000, 0x1000, 0, "/x/a")
    local chain = decoded_chain({ USER, 0x1010, 0x1021, 0x9999, 0x9998, 0x1031 })
    assert.equal("user", chain[1])
    local frames = sym:callchain(chain, 1)
    -- return addresses are looked up at addr-1
    assert.same({ "a+0x10", "a+0x20", "[unknown]", "[unknown]", "a+0x30" }, frames)
  end)

  it("names each address of a run of a file's code without symbols, one [file] frame each, as perf", function()
    local sym = symbols.new()
    sym:add_map(1, 0x1000, 0x1000, 0, "/x/a")
    sym:add_map(1, 0x2000, 0x1000, 0, "//anon")
    local chain = decoded_chain({ USER, 0x1010, 0x1021, 0x1031, 0x2010, 0x2020, 0x9999, 0x999a, 0x1041 })
    assert.same({ "[a]", "[a]", "[a]", "[anon]", "[anon]", "[unknown]", "[unknown]", "[a]" },
                sym:callchain(chain, 1))
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
  it("kallsyms(path) gives nil and why for a file it cannot use (doc/errors.md)", function()
    local none, msg = symbols.kallsyms("/nonexistent/kallsyms")
    assert.is_nil(none)
    assert.truthy(msg:find("^cannot read kernel symbols: /nonexistent/kallsyms: No such file"), msg)
    local path = os.tmpname()
    finally(function() os.remove(path) end)
    local f = assert(io.open(path, "w"))
    f:write("0000000000000000 T schedule\n0000000000000000 t helper\n")
    f:close()
    none, msg = symbols.kallsyms(path)
    assert.is_nil(none)
    assert.truthy(msg:find("shows no kernel text address (kptr_restrict", 1, true), msg)
    f = assert(io.open(path, "w"))
    f:write("ffffffff81000010 T b_func\nffffffff81000000 T a_func\nffffffff81000020 D data\n")
    f:close()
    local k = assert(symbols.kallsyms(path))
    assert.same({ "ffffffff81000000", "ffffffff81000010" }, k.hex)
    assert.same({ "a_func", "b_func" }, k.name)
  end)

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

describe("separate debug information", function()
  local have_cc = sh("command -v cc && command -v objcopy && command -v strip && command -v readelf")
  have_cc = #have_cc > 0 and select(2, have_cc:gsub("\n", "")) == 4
  local dir

  local function run(cmd)
    local out = sh("(" .. cmd .. ") 2>&1; echo rc=$?")
    assert(out:match("rc=0\n$"), cmd .. "\n" .. out)
  end

  local function build_id_of(file)
    return sh("readelf -n " .. file):match("Build ID: (%x+)")
  end

  -- a library whose static function only a debug file names: built with
  -- a build-id, its debug part split off, stripped, a debuglink added
  local function build(name, variant)
    local src = dir .. "/" .. name .. ".c"
    local f = assert(io.open(src, "w"))
    f:write(([[
static int __attribute__((noinline)) dbg_hidden_%s(int x) {
  int i, s = 0; for (i = 0; i < x; i++) s += i * x; return s;
}
int dbg_public(int x) { return dbg_hidden_%s(x) + 1; }
]]):format(variant, variant))
    f:close()
    local so = dir .. "/" .. name .. ".so"
    run(("cc -O1 -g -fPIC -shared -Wl,--build-id %s -o %s"):format(src, so))
    run(("cd %s && objcopy --only-keep-debug %s.so %s.so.dbg && strip -s %s.so && " ..
         "objcopy --add-gnu-debuglink=%s.so.dbg %s.so"):format(dir, name, name, name, name, name))
    return so, so .. ".dbg"
  end

  local saved_dirs
  before_each(function()
    dir = sh("mktemp -d /tmp/pe-dbg.XXXXXX"):gsub("%s+$", "")
    saved_dirs = symbols.debug_dirs
    symbols.flush()
  end)
  after_each(function()
    symbols.debug_dirs = saved_dirs
    symbols.flush()
    if dir and dir:match("^/tmp/pe%-dbg%.") then os.execute("rm -rf " .. dir) end
  end)

  it("reads the build-id and .gnu_debuglink of a stripped file, as readelf shows them", function()
    if not have_cc or not have_nm then pending("needs cc, objcopy, strip, readelf, nm") return end
    local so = build("libd", "a")
    local elf = assert(symbols.read_elf(so))
    assert.equal(build_id_of(so), elf.build_id)
    assert.equal(40, #elf.build_id)
    assert.equal("libd.so.dbg", elf.debuglink)
    assert.is_nil(elf.symtab)
    for _, s in ipairs(elf.syms) do assert.are_not.equal("dbg_hidden_a", s.name) end
  end)

  it("names a static function from the debuglink file next to it, in .debug/ and under the debug dir", function()
    if not have_cc or not have_nm then pending("needs cc, objcopy, strip, readelf, nm") return end
    local so, dbg = build("libd", "a")
    local want = nm(dbg).dbg_hidden_a
    assert.truthy(want)
    symbols.debug_dirs = { dir .. "/root" }
    local function check(where)
      symbols.flush()
      local elf = assert(symbols.elf(so))
      assert.equal(where, elf.debug_path)
      local name, off = elf:find(want + 3)
      assert.equal("dbg_hidden_a", name)
      assert.equal(3, off)
    end
    check(dbg)
    run(("mkdir %s/.debug && mv %s %s/.debug/"):format(dir, dbg, dir))
    check(dir .. "/.debug/libd.so.dbg")
    run(("mkdir -p %s/root%s && mv %s/.debug/libd.so.dbg %s/root%s/"):format(dir, dir, dir, dir, dir))
    check(dir .. "/root" .. dir .. "/libd.so.dbg")
  end)

  it("finds the debug file by build-id, and refuses one of another build", function()
    if not have_cc or not have_nm then pending("needs cc, objcopy, strip, readelf, nm") return end
    local so, dbg = build("libd", "a")
    local id = build_id_of(so)
    local by_id = ("%s/root/.build-id/%s/%s.debug"):format(dir, id:sub(1, 2), id:sub(3))
    run(("mkdir -p %s && mv %s %s"):format(by_id:match("^(.*)/"), dbg, by_id))
    symbols.debug_dirs = { dir .. "/root" }
    local elf = assert(symbols.elf(so))
    assert.equal(by_id, elf.debug_path)
    assert.equal("dbg_hidden_a", (elf:find(nm(by_id).dbg_hidden_a)))
    -- another build (another build-id) left where the debuglink points
    os.remove(by_id)
    local _, other = build("libe", "b")
    run(("cp %s %s/libd.so.dbg"):format(other, dir))
    assert.are_not.equal(id, build_id_of(dir .. "/libd.so.dbg"))
    symbols.flush()
    elf = assert(symbols.elf(so))
    assert.is_nil(elf.debug_path)
    for _, s in ipairs(elf.syms) do assert.is_nil(s.name:match("^dbg_hidden")) end
  end)

  it("names libc's and the program's frames as perf does on the same recording (libc6-dbg)", function()
    if not have_cc then pending("needs cc") return end
    if sh("command -v perf") == "" then pending("needs perf (linux-perf)") return end
    local libc = libc_path()
    local elf = libc and symbols.elf(libc)
    if not (elf and elf.debug_path) then pending("needs libc6-dbg (libc's separate debug symbols)") return end
    -- a qsort-heavy program: libc's msort_with_tmp is a local symbol
    local src = dir .. "/qs.c"
    local f = assert(io.open(src, "w"))
    f:write([[
#include <stdlib.h>
static int cmp(const void *a, const void *b) { int x = *(const int *)a, y = *(const int *)b; return (x > y) - (x < y); }
int main(void) {
  int n = 100000, r, i, *v = malloc(n * sizeof *v);
  for (r = 0; r < 30; r++) { srand(r); for (i = 0; i < n; i++) v[i] = rand(); qsort(v, n, sizeof *v, cmp); }
  return v[0] < 0;   /* rand() is never negative: exit 0 */
}
]])
    f:close()
    run(("cc -O2 %s -o %s/qs"):format(src, dir))
    local U = require("support.util")
    run(("perf record -q -e cpu-clock:u -c %d -o %s/qs.data %s/qs"):format(U.sample_period(4000), dir, dir))
    local out = sh(("perf script -i %s/qs.data -F pid,ip,sym,dso --show-mmap-events 2>/dev/null"):format(dir))
    -- the mappings perf saw, into our symbolizer; then every libc sample
    local sym = symbols.new({ kernel = false })
    -- perf 6.1 pairs a PLT entry with the nth relocation of .rela.plt; libc
    -- lists its IRELATIVE relocations last though their GOT slots are first,
    -- so in libc's PLT perf's names are shifted. objdump pairs each entry
    -- with its GOT slot: there its label is the name ("*ABS*+0x...@plt", a
    -- relocation without a symbol, is perf's "@plt")
    local plt = {}
    for a, label in sh("objdump -d -j .plt " .. libc .. " 2>/dev/null"):gmatch("\n(%x+) <([^>\n]+@plt)>:") do
      plt[tonumber(a, 16)] = label:gsub("^%*ABS%*%+0x%x+", "")
    end
    -- every entry of libc's PLT named as objdump names it
    assert.truthy(#elf.plt >= 10, "libc's PLT entries: " .. #elf.plt)
    for _, e in ipairs(elf.plt) do assert.equal(plt[e.addr], e.name, ("PLT entry at 0x%x"):format(e.addr)) end
    local maps = {}
    local compared, names, wrong = 0, {}, {}
    for line in out:gmatch("[^\n]+") do
      local pid, start, len, pgoff, path =
        line:match("^%s*(%d+) PERF_RECORD_MMAP2? %d+/%d+: %[0x(%x+)%(0x(%x+)%) @ 0x(%x+).-%]: %S+ (%S+)$")
      if pid then
        sym:add_map(tonumber(pid), tonumber(start, 16), tonumber(len, 16), tonumber(pgoff, 16), path)
        if path == libc then
          maps[#maps + 1] = { start = tonumber(start, 16), len = tonumber(len, 16), pgoff = tonumber(pgoff, 16) }
        end
      else
        local spid, ip, name, dso = line:match("^%s*(%d+)%s+(%x+) (.-) %((.-)%)$")
        -- libc's frames and the program's own (its PLT entries: qsort@plt, ...)
        if (dso == libc or dso == dir .. "/qs") and name ~= "[unknown]" then
          compared = compared + 1
          names[name] = (names[name] or 0) + 1
          if dso == libc and name:match("@plt$") then
            -- libc's .plt is in its first executable segment, where file
            -- offsets are addresses: objdump's label of the entry
            local at = tonumber(ip, 16)
            for _, m in ipairs(maps) do
              if at >= m.start and at < m.start + m.len then
                local off = at - m.start + m.pgoff
                name = plt[off - off % 16] or name
              end
            end
          end
          local ours = sym:name(tonumber(ip, 16), tonumber(spid))
          if ours ~= name then wrong[#wrong + 1] = ip .. ": perf " .. name .. ", ours " .. ours end
        end
      end
    end
    assert.truthy(compared >= 100, "libc samples: " .. compared .. "\n" .. out:sub(1, 2000))
    assert.truthy(names["msort_with_tmp.part.0"], "perf names no msort_with_tmp.part.0")
    assert.truthy(names.cmp, "perf names no cmp")
    assert.same({}, wrong)
  end)
end)

describe("a stripped binary's frames in luaperf record's folded stacks", function()
  local dir
  before_each(function() dir = sh("mktemp -d /tmp/pe_symbols_strip.XXXXXX"):gsub("%s+$", "") end)
  after_each(function()
    if dir and dir:match("^/tmp/pe_symbols_strip%.") then sh("rm -rf '" .. dir .. "'") end
  end)

  -- the stack of the most samples in folded text
  local function heaviest(text)
    local best, most = nil, -1
    for stack, n in text:gmatch("([^\n]+) (%d+)\n") do
      if tonumber(n) > most then best, most = stack, tonumber(n) end
    end
    return best
  end

  it("has one frame per address without a symbol, as perf's own folded output (perf script report stackcollapse)",
     function()
    if sh("command -v cc strip") == "" then pending("needs cc and strip") return end
    -- petarget with its library in one executable, frame pointers kept,
    -- stripped: main -> pet_spin -> pet_spin_inner, three addresses in a row
    -- without a symbol
    local exe = dir .. "/pst"
    sh(("cc -O0 -fno-omit-frame-pointer spec/support/petarget_main.c spec/support/petarget.c -o %s -lpthread "
        .. "&& strip %s"):format(exe, exe))
    assert.equal("", sh("nm " .. exe .. " 2>/dev/null"))
    local interp = jit and "luajit" or _VERSION:gsub("Lua ", "lua")
    local out = sh(("%s bin/luaperf record -g -F 999 -o %s/l.folded -- %s spin 100000000 2>&1 >/dev/null")
                   :format(interp, dir, exe))
    local f = assert(io.open(dir .. "/l.folded", "r"), out)
    local ours = heaviest(f:read("*a"))
    f:close()
    -- the leaf and its two callers, each named by the file: [pst];[pst];[pst]
    assert.truthy(ours and ours:match("^pst;.-__libc_start_call_main;%[pst%];%[pst%];%[pst%]$"), ours)
    if sh("command -v perf") == "" then return end
    sh(("perf record -q -g -F 999 -o %s/p.data -- %s spin 100000000 >/dev/null 2>&1"):format(dir, exe))
    local theirs = heaviest(sh("perf script report stackcollapse -i " .. dir .. "/p.data 2>/dev/null"))
    if not theirs then pending("this perf has no python scripting (perf script report stackcollapse)") return end
    -- perf names them [unknown] where luaperf names the file (as
    -- stackcollapse-perf.pl does from perf script's "[unknown] (/path/pst)"):
    -- the same frames, one per address; perf's stack starts at the libc frame
    local mapped = ours:gsub("%[pst%]", "[unknown]")
    assert.equal(theirs, mapped:sub(-#theirs), ours .. " / " .. theirs)
    assert.truthy(theirs:match("%[unknown%];%[unknown%];%[unknown%]$"), theirs)
  end)
end)
