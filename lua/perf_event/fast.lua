--- perf_event.fast: the hot methods through LuaJIT's FFI.
-- On LuaJIT, `ev:read()`, `ev:enable()`, `ev:disable()`, `ev:reset()` and
-- the same methods of groups (`group:read(t)` included) call plain C entry
-- points of the core (`pe_fast_*`, csrc/fast.c) through the FFI, so the JIT
-- compiles the call into the trace instead of stitching around a
-- `lua_CFunction`.  Semantics are those of the C API methods: on anything
-- but plain success (closed object, failed system call, unusual layout) the
-- wrapper calls the C method, which raises or returns `nil, msg, errno`
-- exactly as it does without this module.
--
-- This module only returns the routes: perf_event.class installs them into
-- the classes on LuaJIT.  Elsewhere, or when the core cannot be found
-- through `ffi.load`, `available` is false with a `reason`.
--
-- The Lua side knows no offset into the core's structs: it reads the
-- fields of the fast view (`struct pe_fast_event`, `struct pe_fast_group`)
-- that the core declares once (csrc/pe_core.h) and exports as the C text
-- `ffi.cdef` is given.
-- Not a public interface: reached through perf_event (doc/api.md lists what is).
-- @module perf_event.fast

local core = require("perf_event.native")

local M = {}

--- Whether the FFI routes exist: true on LuaJIT once `ffi.load` bound the
-- loaded core; false elsewhere, with `reason` saying why.
M.available = false
--- Why `available` is false (nil when it is true).
M.reason = nil

local P = core._private
local event_mt, group_mt = core.event_mt, core.group_mt
local eidx, gidx = P.event_methods, P.group_methods

--- The C API methods, whatever happens below (the specs run both routes).
M.c = {
  event = { read = eidx.read, enable = eidx.enable, disable = eidx.disable, reset = eidx.reset },
  group = { read = gidx.read, enable = gidx.enable, disable = gidx.disable, reset = gidx.reset },
}

if not jit then
  M.reason = "not LuaJIT: the C API methods are used"
  return M
end

local ffi = require("ffi")
local getmetatable, tonumber, type, rawset = getmetatable, tonumber, type, rawset
local setmetatable, pcall, tostring = setmetatable, pcall, tostring

-- an idempotent cdef: another copy of this module may have declared these
pcall(ffi.cdef, [[
const void *pe_fast_token(void);
int pe_fast_read(void *ev, uint64_t *out);
int pe_fast_ioctl(void *ev, int op, int group);
int pe_fast_group_read(void *g, uint64_t *out, int cap);
int pe_fast_group_ioctl(void *g, int op);
uint64_t pe_fast_scale(uint64_t value, uint64_t enabled, uint64_t running);
]])
-- the fast view, as the core declares it (idempotent like the above)
pcall(ffi.cdef, P.fast_cdef)
-- libc's read(2) under a name of our own (another cdef may declare `read`)
pcall(ffi.cdef, [[
intptr_t pe_libc_read(int fd, void *buf, size_t len) __asm__("read");
]])

-- The FFI must bind to the very copy of the core that `require` loaded (its
-- structs are what the userdata hold): compare an address only it knows.
local lib
do
  local path = P.path                   -- where perf_event.native loaded it from
  local ok, l = pcall(ffi.load, path)
  if ok then
    local same
    ok, same = pcall(function()
      return ffi.cast("const void *", P.fast_token) == l.pe_fast_token()
    end)
    if ok and same then lib = l end
  end
  if not lib then
    M.reason = "ffi.load could not bind to the loaded perf_event.core (" .. tostring(path) .. ")"
    return M
  end
end
M.lib = lib

local fast_read, fast_ioctl = lib.pe_fast_read, lib.pe_fast_ioctl
local fast_group_read, fast_group_ioctl = lib.pe_fast_group_read, lib.pe_fast_group_ioctl
-- On failure the C method is tail-called: a raise it makes then points at
-- the caller's line, as without this module.  A wrong argument type is
-- raised here with the C API's message, for the same reason.
local c_read, c_enable, c_disable, c_reset =
  M.c.event.read, M.c.event.enable, M.c.event.disable, M.c.event.reset
local cg_read, cg_enable, cg_disable, cg_reset =
  M.c.group.read, M.c.group.enable, M.c.group.disable, M.c.group.reset
local error, format = error, string.format

local function bad_self(name, tname, x)
  error(format("bad argument #1 to '%s' (%s expected, got %s)", name, tname, type(x)), 3)
end

local u64_t = ffi.typeof("uint64_t")
local EXACT = 2 ^ 53
local BIG, GBIG = 4, 0x10000
local GROUP_MAX = 256

-- a value as the C core pushes it on LuaJIT: a number below 2^53, else cdata
local function u64(x)
  if x < EXACT then return tonumber(x) end
  return u64_t(x)
end

-- pe_fast_read's output: 3 uint64_t, then the same 3 as doubles when exact
local rbuf = ffi.new("uint64_t[6]")
local dbuf = ffi.cast("double *", rbuf)   -- rbuf, an upvalue, keeps it alive

-- the rarer shapes of pe_fast_read's result (read_format without both
-- times, or a value >= 2^53)
local function read_rest(rc)
  local v, e, r
  if rc >= BIG then
    rc = rc - BIG
    v, e, r = u64(rbuf[0]), u64(rbuf[1]), u64(rbuf[2])
  else
    v, e, r = dbuf[3], dbuf[4], dbuf[5]
  end
  if rc == 3 then return v, e, r end
  if rc == 1 then return v, e end
  if rc == 2 then return v, nil, r end
  return v
end

-- The plain case (see pe_fast_plain in csrc/fast.c): the event's fast view
-- holds fd + 1 in plain_fd1 when ev:read() is exactly one read(2) of
-- {value, time_enabled, time_running}; the trace then makes that call and
-- returns the three numbers when the event ran all the time it was enabled
-- and they are exact doubles.  Everything else goes through pe_fast_read.
local C = ffi.C
local bit = require("bit")
local bor, rshift = bit.bor, bit.rshift
local ev_view = ffi.typeof("const struct pe_fast_event *")
local group_view = ffi.typeof("const struct pe_fast_group *")
local pbuf = ffi.new("int64_t[3]")
local libc_read, fast_scale = C.pe_libc_read, lib.pe_fast_scale

local function plain_rest(v, e, r)
  v, e, r = ffi.cast(u64_t, v), ffi.cast(u64_t, e), ffi.cast(u64_t, r)
  if r < e then v = fast_scale(v, e, r) elseif r == 0 then v = u64_t(0) end
  return u64(v), u64(e), u64(r)
end

M._plain_rest = plain_rest      -- for the specs (synthetic multiplexing)

local function ffi_read(ev)
  if getmetatable(ev) ~= event_mt then bad_self("read", "perf_event.event", ev) end
  local fd1 = ffi.cast(ev_view, ev).plain_fd1
  if fd1 > 0 and libc_read(fd1 - 1, pbuf, 24) == 24 then
    local v, e, r = pbuf[0], pbuf[1], pbuf[2]
    if r == e and r ~= 0 and rshift(bor(v, e), 53) == 0 then
      return tonumber(v), tonumber(e), tonumber(r)
    end
    return plain_rest(v, e, r)
  end
  local rc = fast_read(ev, rbuf)
  if rc == 3 then return dbuf[3], dbuf[4], dbuf[5] end
  if rc >= 0 then return read_rest(rc) end
  return c_read(ev)
end

-- enable/disable/reset (op 0/1/2 of pe_fast_ioctl), falling back to the
-- C method `cfn` on anything but success
local function ffi_ioctl(name, op, cfn)
  return function(ev, group)
    if getmetatable(ev) ~= event_mt then bad_self(name, "perf_event.event", ev) end
    if fast_ioctl(ev, op, group and 1 or 0) == 0 then return true end
    return cfn(ev, group)
  end
end
local ffi_enable = ffi_ioctl("enable", 0, c_enable)
local ffi_disable = ffi_ioctl("disable", 1, c_disable)
local ffi_reset = ffi_ioctl("reset", 2, c_reset)

-- member names per group, fetched once (they are fixed at open)
local names_of = setmetatable({}, { __mode = "k" })
local function member_names(g)
  local names = {}
  local members = g:members()
  for i = 1, #members do names[i] = members[i]:name() end
  names_of[g] = names
  return names
end

local gbuf = ffi.new("uint64_t[?]", GROUP_MAX + 2)

-- The read pe.group asks for (GROUP|ID|TOTAL_TIME_*, nr then {value, id}
-- per member) is made from the trace too, by a reader generated once per
-- group with the member count, ids and names as constants: libc's read(2)
-- into gb, checks that the kernel answered every member in order, then
-- constant-keyed stores into the caller's table.  Anything else (a member
-- gone, another layout or order, a failed read) returns nil and the read
-- is made again by pe_fast_group_read / the C method; multiplexed or large
-- values are finished from the same bytes by group_rest.
local GEN_MAX = 16                 -- larger groups: the general path
local RF = core.abi.read_format    -- the layout pe.group asks for:
local GROUP_RF = RF.total_time_enabled + RF.total_time_running + RF.id + RF.group
local gb = ffi.new("int64_t[?]", 3 + 2 * GEN_MAX)
local readers = setmetatable({}, { __mode = "k" })   -- group -> reader | false

local function group_rest(g, t, n)
  local names = names_of[g] or member_names(g)
  if type(t) ~= "table" then t = {} end
  local e, r = ffi.cast(u64_t, gb[1]), ffi.cast(u64_t, gb[2])
  for i = 1, n do
    local v = ffi.cast(u64_t, gb[1 + 2 * i])
    if r < e or r == 0 then v = fast_scale(v, e, r) end
    v = u64(v)
    rawset(t, i, v)
    rawset(t, names[i], v)
  end
  t.time_enabled, t.time_running = u64(e), u64(r)
  return t
end

local function make_reader(g)
  local members = g:members()
  local n = #members
  if n < 1 or n > GEN_MAX or members[1]:attr().read_format ~= GROUP_RF then return false end
  local names, ids = member_names(g), {}
  for i = 1, n do
    local id = members[i]:id()
    if type(id) ~= "number" or id < 1 then return false end    -- unknown id, or >= 2^53
    ids[i] = format("%.0fLL", id)
  end
  local len = 8 * (3 + 2 * n)
  local src = { "local cast, group_view, read, gb, bor, rshift, tonumber, type, rawset, rest = ...",
                "return function(g, t)",
                "  local gv = cast(group_view, g)",
                format("  if gv.n ~= %d then return nil end", n),
                "  local fd = gv.ev[0].fd",
                format("  if fd < 0 or read(fd, gb, %d) ~= %d or gb[0] ~= %d then return nil end",
                       len, len, n) }
  local checks, vals, ors = {}, {}, { "e" }
  for i = 1, n do
    checks[i] = format("gb[%d] ~= %s", 2 + 2 * i, ids[i])
    vals[i] = format("gb[%d]", 1 + 2 * i)
    ors[i + 1] = "v" .. i
  end
  src[#src + 1] = "  if " .. table.concat(checks, " or ") .. " then return nil end"
  src[#src + 1] = "  local e, r = gb[1], gb[2]"
  for i = 1, n do src[#src + 1] = format("  local v%d = %s", i, vals[i]) end
  src[#src + 1] = format("  if e ~= r or r == 0 or rshift(bor(%s), 53) ~= 0 then return rest(g, t, %d) end",
                         table.concat(ors, ", "), n)
  src[#src + 1] = "  if type(t) ~= 'table' then t = {} end"
  for i = 1, n do
    src[#src + 1] = format("  local x%d = tonumber(v%d); rawset(t, %d, x%d); rawset(t, %q, x%d)",
                           i, i, i, i, names[i], i)
  end
  src[#src + 1] = "  t.time_enabled = tonumber(e); t.time_running = tonumber(r)"
  src[#src + 1] = "  return t"
  src[#src + 1] = "end"
  local chunk = assert(load(table.concat(src, "\n"), "=perf_event.fast group reader"))
  return chunk(ffi.cast, group_view, libc_read, gb, bor, rshift, tonumber, type, rawset,
               group_rest)
end

local function group_read(g, t)
  if getmetatable(g) ~= group_mt then bad_self("read", "perf_event.group", g) end
  local rd = readers[g]
  if rd == nil then
    -- the members' methods raise on a closed group or member: no reader
    local ok, made = pcall(make_reader, g)
    rd = ok and made or false
    readers[g] = rd
  end
  if rd then
    local res = rd(g, t)
    if res then return res end
  end
  local n = fast_group_read(g, gbuf, GROUP_MAX + 2)
  if n < 0 then return cg_read(g, t) end
  if type(t) ~= "table" then t = {} end
  local names = names_of[g] or member_names(g)
  if n >= GBIG then
    n = n - GBIG
    for i = 1, n do
      local v = u64(gbuf[i + 1])
      rawset(t, i, v)
      rawset(t, names[i], v)
    end
    t.time_enabled, t.time_running = u64(gbuf[0]), u64(gbuf[1])
    return t
  end
  for i = 1, n do
    local v = tonumber(gbuf[i + 1])
    rawset(t, i, v)
    rawset(t, names[i], v)
  end
  t.time_enabled = tonumber(gbuf[0])
  t.time_running = tonumber(gbuf[1])
  return t
end

M._group_rest = group_rest     -- for the specs (synthetic multiplexing)
M._group_buf = gb
M._readers = readers           -- group -> its generated reader (false: none)

local function group_ioctl(name, op, cfn)
  return function(g)
    if getmetatable(g) ~= group_mt then bad_self(name, "perf_event.group", g) end
    if fast_group_ioctl(g, op) == 0 then return true end
    return cfn(g)
  end
end
local group_enable = group_ioctl("enable", 0, cg_enable)
local group_disable = group_ioctl("disable", 1, cg_disable)
local group_reset = group_ioctl("reset", 2, cg_reset)

--- The FFI routes (perf_event.class installs them as the classes' methods).
M.ffi = {
  event = { read = ffi_read, enable = ffi_enable, disable = ffi_disable, reset = ffi_reset },
  group = { read = group_read, enable = group_enable, disable = group_disable,
            reset = group_reset },
}
M.available = true
return M
