--- perf_event.symbols: addresses to function names, in pure Lua.
-- User addresses go through the mappings of the process (MMAP/MMAP2 records
-- or /proc/PID/maps) to a file offset, then through the ELF program headers
-- to a link-time address, then to the `.symtab`/`.dynsym` symbol covering it
-- (the file's own, or its separate debug file's: /usr/lib/debug/.build-id,
-- .gnu_debuglink).
-- Kernel addresses go through `/proc/kallsyms` when it shows real addresses.
-- No external tools are run.
--
--    local sym = pe.symbols.new()
--    sym:load_maps("self")                  -- or feed records: sym:record(rec)
--    print(sym:name(addr))                  -- "pet_spin", "[libfoo.so]", "[unknown]"
--    local frames = sym:callchain(rec.callchain, rec.pid)   -- leaf first
-- @module perf_event.symbols

local io, math, string, table = io, math, string, table
local type, tonumber, tostring, setmetatable, ipairs, pairs = type, tonumber, tostring, setmetatable, ipairs, pairs
local sub, find, format = string.sub, string.find, string.format
local floor = math.floor
local mtype = rawget(math, "type")
local bit = rawget(_G, "jit") and require("bit") or nil
local abi = require("perf_event.core").abi

local M = {}

-- ---------------------------------------------------------------- addresses

--- An address (number, Lua 5.3+ integer, LuaJIT uint64 cdata, or "0x..."
-- string, as the core returns 64-bit values) as 16 lower-case hex digits.
-- @return string or nil for something that is not an address
function M.hex(v)
  local t = type(v)
  if t == "number" then
    if mtype and mtype(v) == "integer" then return format("%016x", v) end
    if v < 0 or v ~= floor(v) or v >= 2^63 then return nil end
    return format("%016x", v)
  elseif t == "cdata" and bit then
    return bit.tohex(v, 16)
  elseif t == "string" then
    local h = v:match("^0[xX](%x+)$") or v:match("^(%x+)$")
    if not h or #h > 16 then return nil end
    return (string.rep("0", 16 - #h) .. h):lower()
  end
  return nil
end

-- user-space addresses fit in 48 bits: a plain number is exact
local function user_number(h)
  if sub(h, 1, 4) == "0000" then return tonumber(h, 16) end
  return nil
end

-- PERF_CONTEXT_* markers in callchains (core.abi.context).  The decoder
-- gives them by name ("user", "kernel", ...; abi.context_other for one it
-- has no name for); a chain of raw numbers has the values, every one at or
-- above PERF_CONTEXT_MAX.  CONTEXTS maps both forms to the name.
local CONTEXTS = { [abi.context_other] = abi.context_other }
for name, v in pairs(abi.context) do
  CONTEXTS[name] = name
  CONTEXTS[M.hex(v)] = name
end
local CONTEXT_MIN = M.hex(abi.context_max)   -- 16 hex digits compare as numbers

-- the context name of a callchain entry, or nil for an address
local function context_of(a)
  if type(a) == "string" and CONTEXTS[a] then return CONTEXTS[a] end
  local h = M.hex(a)
  if h and h >= CONTEXT_MIN then return CONTEXTS[h] or abi.context_other end
  return nil
end

-- ---------------------------------------------------------------- ELF files
-- (perf_event.symbols.elf)

local E = require("perf_event.symbols.elf")

--- Reads the symbol tables and load segments of an ELF64 little-endian file
-- (perf_event.symbols.elf's).
-- @function read_elf
-- @tparam string path
M.read_elf = E.read_elf
local last_at, gap, with_plt = E.last_at, E.gap, E.with_plt

--- Where separate debug information is looked for, as gdb and perf do:
-- `<dir>/.build-id/xx/yyyy.debug` by build-id, then the `.gnu_debuglink`
-- name next to the file, in its `.debug/` and under `<dir>/<file's dir>/`.
-- Debian's `*-dbg` packages (libc6-dbg) install there.
M.debug_dirs = { "/usr/lib/debug" }

local function readable(p)
  local f = io.open(p, "rb")
  if f then f:close() return true end
  return false
end

--- The separate debug file of an ELF file read by read_elf, or nil.  A
-- candidate with a build-id must have the file's build-id.
-- @tparam table elf
-- @treturn string|nil path
function M.debug_file(elf)
  local cands = {}
  local id = elf.build_id
  if id and #id > 2 then
    for _, d in ipairs(M.debug_dirs) do
      cands[#cands + 1] = d .. "/.build-id/" .. sub(id, 1, 2) .. "/" .. sub(id, 3) .. ".debug"
    end
  end
  local link = elf.debuglink
  if link and not find(link, "/", 1, true) then
    local dir = elf.path:match("^(.*)/[^/]*$") or "."
    cands[#cands + 1] = dir .. "/" .. link
    cands[#cands + 1] = dir .. "/.debug/" .. link
    for _, d in ipairs(M.debug_dirs) do cands[#cands + 1] = d .. dir .. "/" .. link end
  end
  for _, c in ipairs(cands) do
    if c ~= elf.path and readable(c) then
      local ok, dbg = pcall(M.read_elf, c)
      if ok and dbg and (not id or not dbg.build_id or dbg.build_id == id) then return c, dbg end
    end
  end
  return nil
end

-- the file's own symbols with those of its debug file: the debug file's
-- name wins at an address both have (its .symtab knows the local ones)
local function with_debuginfo(elf)
  if elf.symtab and not elf.debuglink and not elf.build_id then return elf end
  local path, dbg = M.debug_file(elf)
  if not path or #dbg.file_syms == 0 then return elf end
  local at, syms = {}, {}
  for _, s in ipairs(dbg.file_syms) do at[s.addr] = true; syms[#syms + 1] = s end
  for _, s in ipairs(elf.file_syms) do
    if not at[s.addr] then syms[#syms + 1] = s end
  end
  table.sort(syms, function(a, b) return a.addr < b.addr end)
  elf.file_syms = syms
  elf.syms = with_plt(syms, elf.plt)
  elf.debug_path = path
  return elf
end

local elf_cache = {}   -- path -> elf | false

--- The ELF file `path` as the symbolizer uses it: read_elf, with the
-- symbols of its separate debug file (see debug_file; `elf.debug_path`).
-- Cached per path.
-- @treturn table|nil
function M.elf(path)
  local e = elf_cache[path]
  if e == nil then
    local ok, res = pcall(M.read_elf, path)
    e = ok and res or false
    if e then
      local ok2, full = pcall(with_debuginfo, e)
      e = ok2 and full or e
    end
    elf_cache[path] = e
  end
  return e or nil
end
local elf_for = M.elf

-- ---------------------------------------------------------------- kernel

local kernel, kernel_err -- { hex = {...sorted}, name = {...} } | false, why

--- Loads /proc/kallsyms (the kernel's text symbols), once.
-- @tparam[opt] string path another file of that format (not cached)
-- @treturn[1] table `{hex = {...}, name = {...}}`, sorted by address
-- @treturn[2] nil
-- @treturn[2] string why: the file cannot be read, or kptr_restrict hides
--   its addresses (all zero)
function M.kallsyms(path)
  if kernel ~= nil and not path then
    if kernel then return kernel end
    return nil, kernel_err
  end
  local file = path or "/proc/kallsyms"
  local f, open_err = io.open(file, "r")
  local k, why = false, nil
  if not f then why = "cannot read kernel symbols: " .. tostring(open_err) end
  if f then
    local hex, names = {}, {}
    local n = 0
    for line in f:lines() do
      local a, t, name = line:match("^(%x+) (%a) (%S+)")
      if a and (t == "t" or t == "T" or t == "w" or t == "W") and a ~= "0000000000000000" then
        n = n + 1
        hex[n], names[n] = a:lower(), name
      end
    end
    f:close()
    if n > 0 then
      local idx = {}
      for i = 1, n do idx[i] = i end
      table.sort(idx, function(x, y) return hex[x] < hex[y] end)
      local sh, sn = {}, {}
      for i, j in ipairs(idx) do sh[i], sn[i] = hex[j], names[j] end
      k = { hex = sh, name = sn }
    else
      why = file .. " shows no kernel text address (kptr_restrict hides them: a user without CAP_SYSLOG sees zeros)"
    end
  end
  if not path then kernel, kernel_err = k, why end
  if not k then return nil, why end
  return k
end

local function kernel_name(h)
  local k = M.kallsyms()
  if not k then return nil end
  local hex = k.hex
  local lo, hi, best = 1, #hex, nil
  while lo <= hi do
    local mid = floor((lo + hi) / 2)
    if hex[mid] <= h then best = mid; lo = mid + 1 else hi = mid - 1 end
  end
  if not best then return nil end
  -- the offset, from the low 52 bits (exact in a double)
  local off = tonumber(sub(h, 4), 16) - tonumber(sub(hex[best], 4), 16)
  return k.name[best], off
end

-- ---------------------------------------------------------------- mappings

local Sym = {}
Sym.__index = Sym

--- A new symbolizer: keeps the mappings of each process it is told about.
-- @tparam[opt] table opts `kernel=false` to never read /proc/kallsyms;
--   `offsets=true` to name code without a symbol `"lib.so+0x1f0"` (its file
--   offset, for addr2line) instead of `"[lib.so]"`
function M.new(opts)
  return setmetatable({ maps = {}, opts = opts or {} }, Sym)
end

local function basename(p) return (p:match("([^/]+)$")) or p end

--- Adds one mapping of process `pid`: [start, start+len) maps `filename`
-- from file offset `pgoff`.  A later mapping replaces the overlapped part
-- of earlier ones, as mmap does.
function Sym:add_map(pid, start, len, pgoff, filename)
  local list = self.maps[pid]
  if not list then list = {}; self.maps[pid] = list end
  local stop = start + len
  local out = {}
  for _, m in ipairs(list) do
    if m.stop <= start or m.start >= stop then
      out[#out + 1] = m
    else
      if m.start < start then
        out[#out + 1] = { start = m.start, stop = start, pgoff = m.pgoff, file = m.file }
      end
      if m.stop > stop then
        out[#out + 1] = { start = stop, stop = m.stop, pgoff = m.pgoff + (stop - m.start), file = m.file }
      end
    end
  end
  out[#out + 1] = { start = start, stop = stop, pgoff = pgoff, file = filename }
  table.sort(out, function(a, b) return a.start < b.start end)
  self.maps[pid] = out
end

--- Reads /proc/PID/maps (PID a number or "self") into the mappings.
-- @treturn[1] true
-- @treturn[2] nil
-- @treturn[2] string
function Sym:load_maps(pid)
  pid = pid or "self"
  local f, err = io.open("/proc/" .. tostring(pid) .. "/maps", "r")
  if not f then return nil, err end
  local key = pid
  if pid == "self" then
    local st = io.open("/proc/self/stat", "r")
    key = st and tonumber(st:read("*l"):match("^(%d+)")) or pid
    if st then st:close() end
    self.self_pid = key   -- lookups without a pid use these mappings
  end
  for line in f:lines() do
    local s, e, perms, off, path = line:match("^(%x+)%-(%x+) (%S+) (%x+) %S+ %d+%s*(.*)$")
    if s and perms:sub(3, 3) == "x" then
      local start, stop = tonumber(s, 16), tonumber(e, 16)
      if start and stop and start < 2^48 then
        self:add_map(key, start, stop - start, tonumber(off, 16), path ~= "" and path or "//anon")
      end
    end
  end
  f:close()
  return key
end

--- Feeds a decoded record: mmap/mmap2 add mappings (executable ones
-- matter), fork copies the parent's, an exec (comm with the misc bit
-- PERF_RECORD_MISC_COMM_EXEC, `rec.exec` as decoded) and exit forget them.
function Sym:record(rec)
  local t = rec.type
  if t == "mmap2" or t == "mmap" then
    local start, len = user_number(M.hex(rec.addr) or ""), tonumber(rec.len)
    if start and len and rec.filename then
      self:add_map(rec.pid, start, len, tonumber(rec.pgoff) or 0, rec.filename)
    end
  elseif t == "fork" then
    if rec.pid ~= rec.ppid and self.maps[rec.ppid] and not self.maps[rec.pid] then
      local copy = {}
      for i, m in ipairs(self.maps[rec.ppid]) do copy[i] = m end
      self.maps[rec.pid] = copy
    end
    -- a child that does not exec keeps its parent's name (perf's thread
    -- takes the parent's comm); an exec's COMM record names it later
    if rec.pid ~= rec.ppid then
      self.parents = self.parents or {}
      self.parents[rec.pid] = rec.ppid
      if self.comms and self.comms[rec.ppid] and not self.comms[rec.pid] then
        self.comms[rec.pid] = self.comms[rec.ppid]
      end
    end
  elseif t == "comm" then
    local x = abi.misc.comm_exec
    if rec.exec or (rec.misc and rec.misc % (2 * x) >= x) then self.maps[rec.pid] = nil end
    self.comms = self.comms or {}
    self.comms[rec.pid] = rec.comm
  end
end

-- the mapping of a sorted list (`start`, `stop`) that holds address `a`
local function find_map(list, a)
  if not list then return nil end
  local best = last_at(list, "start", a)
  local m = best and list[best]
  if m and a < m.stop then return m end
  return nil
end

--- The mapping holding an address, from a list sorted by `start` (as
-- `sym.maps[pid]` holds them).
-- @tparam table list mappings `{start=, stop=, ...}` sorted by start
-- @tparam number a the address
-- @treturn table|nil the mapping
M.find_map = find_map
-- (private: the safe-point drain searches its symbol ranges with it)
M._last_at = last_at

--- Resolves an address of process `pid` (user or kernel).
-- User code is named from the file's `.symtab`/`.dynsym` or those of its
-- separate debug file (see debug_file); code of a file without a symbol for
-- it is `"[lib.so]"` (the offset returned is then the file offset).
-- @return name (`"func"`, `"[lib.so]"`, `"[vdso]"`, `"[unknown]"`), the
--   offset into the function or file (or nil), the module (file basename or
--   `"[kernel]"`), and for a user address the range `lo, hi` (numbers,
--   `lo <= addr < hi`) it falls in: the symbol's cover in this mapping;
--   for code no symbol covers, the gap between the symbols around it (the
--   same name, or with `offsets` the same file and another offset); for a
--   pseudo-file (`[vdso]`) the mapping; for an address in no mapping
--   (`"[unknown]"`), the gap between the mappings around it (nil for a
--   kernel address)
function Sym:lookup(addr, pid)
  local h = M.hex(addr)
  if not h then return "[unknown]" end
  local a = user_number(h)
  if not a then
    if self.opts.kernel == false then return "[unknown]", nil, "[kernel]" end
    local name, off = kernel_name(h)
    return name or "[unknown]", off, "[kernel]"
  end
  local list = self.maps[pid or self.self_pid]
  local m = find_map(list, a)
  if not m then
    -- the gap between the mappings around it (disjoint: add_map splits)
    local i = list and last_at(list, "start", a) or 0
    local prev, nxt = list and list[i], list and list[i + 1]
    return "[unknown]", nil, nil, prev and prev.stop or 0, nxt and nxt.start or 2 ^ 47
  end
  local fileoff = a - m.start + m.pgoff
  local file = m.file
  local glo, ghi = m.start, m.stop   -- addresses named as this one when no symbol covers it
  if sub(file, 1, 1) == "/" and not find(file, " (deleted)", 1, true) then
    local elf = elf_for(file)
    if elf then
      local v = elf:vaddr(fileoff)
      -- a page of the file mapped but not in a PT_LOAD segment: use the offset
      local name, off, stop = elf:find(v or fileoff)
      if name then
        -- the symbol's cover, in this mapping's addresses
        local lo, hi = a - off, stop and a + (stop - (v or fileoff))
        if lo < m.start then lo = m.start end
        if not hi or hi > m.stop then hi = m.stop end
        return name, off, basename(file), lo, hi
      end
      local gv = v or fileoff
      local glink, hlink = gap(elf, gv)
      glo = glink and glink <= gv and a - (gv - glink) or m.start
      ghi = hlink and hlink > gv and a + (hlink - gv) or m.stop
      if glo < m.start then glo = m.start end
      if ghi > m.stop then ghi = m.stop end
    end
  end
  if sub(file, 1, 1) == "[" then return file, fileoff, file, m.start, m.stop end
  local base = basename(file)
  if self.opts.offsets then return format("%s+0x%x", base, fileoff), nil, base, glo, ghi end
  -- code without a symbol: one name per file, as perf's "[unknown]" in
  -- that file, so that a stack keeps one frame for it, not one per address
  -- (the range: the gap between the symbols around it in this mapping)
  return "[" .. base .. "]", fileoff, base, glo, ghi
end

--- The name alone (see lookup).
function Sym:name(addr, pid)
  return (self:lookup(addr, pid))
end

--- Names the frames of a sample's callchain, leaf first, without the
-- PERF_CONTEXT_* markers; consecutive frames of one bracketed name
-- (`[unknown]`, `[lib.so]`, `[vdso]`) count as one.
-- Return addresses (every frame after the first of a context) are looked
-- up at addr-1 so a call at the very end of a function still names it.
-- @param chain the record's `callchain` array
-- @param pid the record's pid
-- @treturn table array of names
function Sym:callchain(chain, pid)
  local out = {}
  local first = true
  for _, a in ipairs(chain or {}) do
    local ctx = context_of(a)
    local h = not ctx and M.hex(a)
    if ctx then
      -- a known context starts over: its first entry is the exact ip
      first = ctx ~= abi.context_other or first
    elseif h then
      local look = a
      if not first then
        local n = user_number(h)
        if n then look = n - 1 end
      end
      -- one frame per address, as perf's: a run of addresses without a
      -- symbol (a stripped binary, JIT code) is a run of "[prog]" (a
      -- file's code) or "[unknown]" frames, as perf script names them and
      -- stackcollapse-perf.pl folds them
      out[#out + 1] = self:name(look, pid)
      first = false
    end
  end
  return out
end

--- The callchain of a sample taken with DWARF call graphs
-- (`sample_type` regs_user, stack_user, `sample_regs_user = core.unwind_regs`):
-- the kernel part of `rec.callchain` as the kernel gave it, then a "user"
-- marker and the user frames core.unwind finds in the sampled stack with the
-- call frame information of the process's mapped files (elfutils' libdw).
-- The result goes to `callchain` like any chain.
-- @tparam table rec a decoded sample
-- @treturn[1] table callchain
-- @treturn[2] nil
-- @treturn[2] string why not (built without libdw, no user registers)
function Sym:unwind(rec)
  local core = require("perf_event.core")
  local chain = {}
  for _, a in ipairs(rec.callchain or {}) do
    if context_of(a) == "user" then break end
    chain[#chain + 1] = a
  end
  if not (rec.regs_user and rec.stack_user) then return nil, "the sample has no user registers and stack" end
  local maps = self.maps[rec.pid]
  if not maps then return nil, "no mappings known for pid " .. tostring(rec.pid) end
  -- registers as "0x..." strings: every decoder's 64-bit form becomes one
  local regs = {}
  for k, v in pairs(rec.regs_user) do
    local h = M.hex(v)
    regs[k] = h and "0x" .. h or v
  end
  local pcs, err = core.unwind(maps, regs, rec.stack_user, self.opts.max_stack)
  if not pcs then return nil, err end
  chain[#chain + 1] = "user"
  for _, pc in ipairs(pcs) do chain[#chain + 1] = pc end
  return chain
end

--- Forgets the cached ELF files and kallsyms (e.g. after a library changed).
function M.flush()
  elf_cache = {}
  kernel, kernel_err = nil, nil
end

return M
