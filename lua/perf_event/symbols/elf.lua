--- perf_event.symbols.elf: ELF64 files as the symbolizer reads them, in
-- pure Lua: the function symbols of `.symtab`/`.dynsym` (perf's choice
-- between aliases), PLT entries, PT_LOAD segments, the build-id, and the
-- `.gnu_debuglink` name and the build-id the separate debug file is found by
-- (perf_event.symbols looks for it and caches the files).  perf_event.symbols
-- gives `read_elf` under its own name.
-- Not a public interface: reached through perf_event.symbols.
-- @module perf_event.symbols.elf

local io, math, string, table = io, math, string, table
local setmetatable, ipairs = setmetatable, ipairs
local byte, sub, find, format = string.byte, string.sub, string.find, string.format
local floor = math.floor

local M = {}

local function u16(s, o) local a, b = byte(s, o + 1, o + 2) return a + b * 256 end
local function u32(s, o)
  local a, b, c, d = byte(s, o + 1, o + 4)
  return a + b * 256 + c * 65536 + d * 16777216
end
-- 64-bit little-endian; exact below 2^53, which covers offsets, sizes and
-- user-space link addresses
local function u64(s, o) return u32(s, o) + u32(s, o + 4) * 4294967296 end

local function cstr(s, o)
  local e = find(s, "\0", o + 1, true)
  return sub(s, o + 1, (e or #s + 1) - 1)
end

local function read_at(f, off, len)
  if len <= 0 then return "" end
  if not f:seek("set", off) then return nil end
  local s = f:read(len)
  if not s or #s < len then return nil end
  return s
end

local STT_FUNC, STT_GNU_IFUNC = 2, 10
local STB_LOCAL, STB_WEAK = 0, 2
local SHT_SYMTAB, SHT_NOTE, SHT_DYNSYM = 2, 7, 11
local PT_LOAD = 1
local NT_GNU_BUILD_ID = 3

local Elf = {}
Elf.__index = Elf

-- leading underscores of a name
local function underscores(name)
  local u = name:match("^_*")
  return #u
end

-- Of two function symbols at one address, the one perf keeps (its
-- choose_best_symbol): a sized one, then non-weak, then global, then the
-- one with fewer leading underscores, then the longer name; on a tie the
-- one earlier in the table (b, seen first) stays.
local function better(a, b)
  if (a.size == 0) ~= (b.size == 0) then return a.size ~= 0 end
  if (a.bind == STB_WEAK) ~= (b.bind == STB_WEAK) then return b.bind == STB_WEAK end
  if (a.bind == STB_LOCAL) ~= (b.bind == STB_LOCAL) then return b.bind == STB_LOCAL end
  local ua, ub = underscores(a.name), underscores(b.name)
  if ua ~= ub then return ua < ub end
  return #a.name > #b.name
end

-- the build-id of a GNU note section's bytes, as lower-case hex
local function note_build_id(s)
  local o = 0
  while o + 12 <= #s do
    local namesz, descsz, ntype = u32(s, o), u32(s, o + 4), u32(s, o + 8)
    local name_at = o + 12
    local desc_at = name_at + floor((namesz + 3) / 4) * 4
    if ntype == NT_GNU_BUILD_ID and sub(s, name_at + 1, name_at + 3) == "GNU"
       and desc_at + descsz <= #s then
      return (sub(s, desc_at + 1, desc_at + descsz):gsub(".", function(c)
        return format("%02x", byte(c)) end))
    end
    o = desc_at + floor((descsz + 3) / 4) * 4
  end
  return nil
end

-- the index of the last entry of `list` (sorted by field `key`) whose
-- `key` is <= v, or nil
local function last_at(list, key, v)
  local lo, hi, best = 1, #list, nil
  while lo <= hi do
    local mid = floor((lo + hi) / 2)
    if list[mid][key] <= v then best = mid; lo = mid + 1 else hi = mid - 1 end
  end
  return best
end

-- the index of the symbol of sorted `syms` covering vaddr (a symbol of
-- size 0 covers up to the next one, as perf's symbols__fixup_end makes it)
local function covering(syms, vaddr)
  local best = last_at(syms, "addr", vaddr)
  if not best then return nil end
  local s = syms[best]
  if s.size > 0 and vaddr >= s.addr + s.size then return nil end
  return best
end

-- syms (sorted) with the PLT entries no symbol covers: perf's lookup finds
-- a symbol stretched over the PLT (an `_init` of size 0) before its own
-- PLT names
local function with_plt(syms, plt)
  if not plt or #plt == 0 then return syms end
  local out = {}
  for i, s in ipairs(syms) do out[i] = s end
  for _, p in ipairs(plt) do
    if not covering(syms, p.addr) then out[#out + 1] = p end
  end
  table.sort(out, function(a, b) return a.addr < b.addr end)
  return out
end

--- Reads the symbol tables and load segments of an ELF64 little-endian file,
-- with its GNU build-id (`elf.build_id`, hex) and `.gnu_debuglink` name
-- (`elf.debuglink`) when it has them.  Function symbols of `.symtab` and
-- `.dynsym` at one address keep one name, the one perf shows.
-- @tparam string path
-- @treturn[1] table elf object with `:find(vaddr)` and `:vaddr(file_offset)`
-- @treturn[2] nil
-- @treturn[2] string why the file cannot be used
function M.read_elf(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local h = f:read(64)
  if not h or #h < 64 or sub(h, 1, 4) ~= "\127ELF" then
    f:close()
    return nil, path .. ": not an ELF file"
  end
  if byte(h, 5) ~= 2 or byte(h, 6) ~= 1 then
    f:close()
    return nil, path .. ": only ELF64 little-endian files are supported"
  end
  local elf = setmetatable({ path = path, etype = u16(h, 16), loads = {}, syms = {} }, Elf)
  local phoff, shoff = u64(h, 32), u64(h, 40)
  local phentsize, phnum = u16(h, 54), u16(h, 56)
  local shentsize, shnum, shstrndx = u16(h, 58), u16(h, 60), u16(h, 62)
  local ph = read_at(f, phoff, phentsize * phnum) or ""
  for i = 0, phnum - 1 do
    local o = i * phentsize
    if o + 56 <= #ph and u32(ph, o) == PT_LOAD then
      elf.loads[#elf.loads + 1] = { offset = u64(ph, o + 8), vaddr = u64(ph, o + 16),
                                    filesz = u64(ph, o + 32), flags = u32(ph, o + 4) }
    end
  end
  local sh = (shoff > 0 and read_at(f, shoff, shentsize * shnum)) or ""
  local secs = {}
  for i = 0, shnum - 1 do
    local o = i * shentsize
    if o + 64 <= #sh then
      secs[i] = { name = u32(sh, o), type = u32(sh, o + 4), addr = u64(sh, o + 16), offset = u64(sh, o + 24),
                  size = u64(sh, o + 32), link = u32(sh, o + 40), entsize = u64(sh, o + 56) }
    end
  end
  local names = secs[shstrndx] and read_at(f, secs[shstrndx].offset, secs[shstrndx].size)
  local named = {}
  for i = 0, shnum - 1 do
    local s = secs[i]
    local name = s and names and s.name < #names and cstr(names, s.name)
    if name then named[name] = s end
    if name == ".gnu_debuglink" and s.size < 4096 then
      local d = read_at(f, s.offset, s.size)
      elf.debuglink = d and cstr(d, 0) ~= "" and cstr(d, 0) or nil
    elseif s and s.type == SHT_NOTE and not elf.build_id and s.size < 4096 then
      local d = read_at(f, s.offset, s.size)
      elf.build_id = d and note_build_id(d)
    end
  end
  elf.eh_frame_hdr, elf.eh_frame = named[".eh_frame_hdr"], named[".eh_frame"]
  local best, addrs = {}, {}   -- address -> symbol; the addresses in order
  for _, want in ipairs({ SHT_SYMTAB, SHT_DYNSYM }) do
    for i = 0, shnum - 1 do
      local s = secs[i]
      if s and s.type == want and s.entsize >= 24 and secs[s.link] then
        if want == SHT_SYMTAB then elf.symtab = true end
        local tab = read_at(f, s.offset, s.size)
        local str = read_at(f, secs[s.link].offset, secs[s.link].size)
        if tab and str then
          for o = 0, s.size - s.entsize, s.entsize do
            local info = byte(tab, o + 5)
            local stype = info % 16
            if (stype == STT_FUNC or stype == STT_GNU_IFUNC) and u16(tab, o + 6) ~= 0 then
              local value = u64(tab, o + 8)
              local name = cstr(str, u32(tab, o))
              if value ~= 0 and name ~= "" then
                local sym = { addr = value, size = u64(tab, o + 16), name = name,
                              bind = floor(info / 16) }
                local old = best[value]
                if not old then addrs[#addrs + 1] = value end
                if not old or (old.name ~= name and better(sym, old)) then best[value] = sym end
              end
            end
          end
        end
      end
    end
  end
  -- perf's PLT symbols, "name@plt" ("@plt" for a relocation without a
  -- symbol, as libc's IRELATIVE ones): one entry per .rela.plt relocation,
  -- in .plt.sec when the file has one, else after .plt's first entry
  -- (x86-64 layout)
  elf.plt = {}
  local rela, plt = named[".rela.plt"], named[".plt.sec"] or named[".plt"]
  local dyn = rela and secs[rela.link]
  if plt and dyn and rela.entsize >= 24 and rela.size < 1048576 and secs[dyn.link] then
    local tab, dsyms = read_at(f, rela.offset, rela.size), read_at(f, dyn.offset, dyn.size)
    local dstr = read_at(f, secs[dyn.link].offset, secs[dyn.link].size)
    local step = plt.entsize > 0 and plt.entsize or 16
    local at = plt.addr + (named[".plt.sec"] and 0 or step)
    if tab and dsyms and dstr then
      -- the entries follow their GOT slots (r_offset), as objdump and newer
      -- perf pair them, not the order of the relocations
      local relocs = {}
      for o = 0, rela.size - rela.entsize, rela.entsize do
        local symidx = u32(tab, o + 12)          -- ELF64_R_SYM: r_info's high half
        local name = ""
        if symidx > 0 and (symidx + 1) * 24 <= #dsyms then name = cstr(dstr, u32(dsyms, symidx * 24)) end
        relocs[#relocs + 1] = { slot = u64(tab, o), name = name }
      end
      table.sort(relocs, function(a, b) return a.slot < b.slot end)
      for _, r in ipairs(relocs) do
        elf.plt[#elf.plt + 1] = { addr = at, size = step, name = r.name .. "@plt", bind = 1 }
        at = at + step
      end
    end
  end
  f:close()
  local syms = {}
  -- not pairs(): profile drains read ELF files from a __gc too, where a
  -- compiled pairs() loop may never end (see profile.lua's find_trace)
  for i = 1, #addrs do syms[i] = best[addrs[i]] end
  table.sort(syms, function(a, b) return a.addr < b.addr end)
  elf.file_syms = syms
  elf.syms = with_plt(syms, elf.plt)
  return elf
end

--- The link-time address of a file offset (through the PT_LOAD segments).
function Elf:vaddr(off)
  for _, l in ipairs(self.loads) do
    if off >= l.offset and off < l.offset + l.filesz then
      return off - l.offset + l.vaddr
    end
  end
  return nil
end

--- The symbol covering a link-time address: name, offset into it, and the
-- link-time address where its cover ends (its size, or the next symbol's
-- address for a symbol of size 0; nil for the last one of size 0).
function Elf:find(vaddr)
  local syms = self.syms
  local i = covering(syms, vaddr)
  if not i then return nil end
  local s = syms[i]
  local stop = s.size > 0 and s.addr + s.size or (syms[i + 1] and syms[i + 1].addr)
  return s.name, vaddr - s.addr, stop
end

-- The link-time range [lo, hi) around vaddr that no symbol of elf covers
-- (nil when unbounded on that side): between the symbol before it and the next.
local function gap(elf, vaddr)
  local syms = elf.syms
  local best = last_at(syms, "addr", vaddr)
  local s, n = best and syms[best], syms[(best or 0) + 1]
  return s and s.addr + s.size, n and n.addr
end

-- for the symbolizer: the last entry of a sorted list at or below a key,
-- the range around an address no symbol of a file covers, and a symbol
-- list with the PLT entries added
M.last_at, M.gap, M.with_plt = last_at, gap, with_plt

local function s32(s, o)
  local v = u32(s, o)
  return v >= 2147483648 and v - 4294967296 or v
end

--- The code range [lo, hi) of the .eh_frame FDE that covers link-time
-- address vaddr, through .eh_frame_hdr's sorted table (the layout GNU ld
-- writes: datarel sdata4 pairs; an FDE's pc_range the udata4 after its
-- pcrel sdata4 pc_begin); nil when the file has no such table or no FDE
-- covers vaddr.
function M.fde_range(elf, vaddr)
  local hdr, eh = elf.eh_frame_hdr, elf.eh_frame
  if not hdr or not eh or hdr.size < 12 then return nil end
  local f = io.open(elf.path, "rb")
  if not f then return nil end
  local h = read_at(f, hdr.offset, hdr.size)
  local lo, hi
  if h and byte(h, 1) == 1 and byte(h, 3) == 0x03 and byte(h, 4) == 0x3b then
    local n = u32(h, 8)
    local a, b, at = 0, n - 1, nil
    while a <= b and 12 + 8 * n <= #h do
      local mid = floor((a + b) / 2)
      if hdr.addr + s32(h, 12 + 8 * mid) <= vaddr then at = mid a = mid + 1 else b = mid - 1 end
    end
    if at then
      local start, fde = hdr.addr + s32(h, 12 + 8 * at), hdr.addr + s32(h, 16 + 8 * at)
      local d = fde >= eh.addr and read_at(f, eh.offset + (fde - eh.addr), 16)
      if d and u32(d, 0) ~= 0xffffffff then
        local range = u32(d, 12)
        if vaddr < start + range then lo, hi = start, start + range end
      end
    end
  end
  f:close()
  return lo, hi
end

return M
