--- perf_event.pprof.gzip: gzip through a maintained zlib: Debian's
-- lua-zlib (`require "zlib"`), else libz.so.1 through the LuaJIT FFI (its
-- z_stream and functions declared under names of our own).
-- Not a public interface: reached through perf_event.pprof (gzip, gzip_available).
-- @module perf_event.pprof.gzip

local table = table
local type, tostring, tonumber, ipairs, pcall, require, error =
      type, tostring, tonumber, ipairs, pcall, require, error
local concat = table.concat

local M = {}


local ffi_z, ffi_err   -- libz through the FFI: loaded once

local function load_ffi_z()
  if ffi_z or ffi_err then return ffi_z, ffi_err end
  local ok, ffi = pcall(require, "ffi")
  if not ok then ffi_err = "no LuaJIT FFI" return nil, ffi_err end
  local okl, lib = pcall(ffi.load, "libz.so.1")
  if not okl then ffi_err = "libz.so.1: " .. tostring(lib) return nil, ffi_err end
  -- zlib.h's z_stream (LP64) and functions, under names of our own (a
  -- program may have declared zlib's with its own z_stream)
  pcall(ffi.cdef, [[
    typedef struct pe_z_stream {
      const unsigned char *next_in; unsigned avail_in; unsigned long total_in;
      unsigned char *next_out; unsigned avail_out; unsigned long total_out;
      const char *msg; void *state; void *zalloc; void *zfree; void *opaque;
      int data_type; unsigned long adler; unsigned long reserved;
    } pe_z_stream;
    const char *pe_zlibVersion(void) __asm__("zlibVersion");
    int pe_deflateInit2_(pe_z_stream *strm, int level, int method, int windowBits, int memLevel,
                         int strategy, const char *version, int stream_size) __asm__("deflateInit2_");
    unsigned long pe_deflateBound(pe_z_stream *strm, unsigned long sourceLen) __asm__("deflateBound");
    int pe_deflate(pe_z_stream *strm, int flush) __asm__("deflate");
    int pe_deflateEnd(pe_z_stream *strm) __asm__("deflateEnd");
  ]])
  ffi_z = { ffi = ffi, lib = lib }
  return ffi_z
end

local GZIP_WINDOW = 31   -- zlib's windowBits 15 + 16: a gzip header and trailer
local Z_DEFLATED, Z_FINISH, Z_STREAM_END = 8, 4, 1

local gzippers = {
  -- Debian's lua-zlib (lua-zlib/lua_zlib.c: deflate(level, windowBits))
  zlib = function(s)
    local ok, zlib = pcall(require, "zlib")
    if not ok or type(zlib) ~= "table" or type(zlib.deflate) ~= "function" then
      return nil, "lua-zlib is not installed (require 'zlib')"
    end
    local okd, out = pcall(function() return zlib.deflate(6, GZIP_WINDOW)(s, "finish") end)
    if not okd then return nil, "lua-zlib: " .. tostring(out) end
    return out
  end,
  ffi = function(s)
    local z, err = load_ffi_z()
    if not z then return nil, err end
    local ffi, lib = z.ffi, z.lib
    local strm = ffi.new("pe_z_stream")
    local rc = lib.pe_deflateInit2_(strm, 6, Z_DEFLATED, GZIP_WINDOW, 8, 0, lib.pe_zlibVersion(),
                                    ffi.sizeof("pe_z_stream"))
    if rc ~= 0 then return nil, "deflateInit2: " .. tostring(rc) end
    local cap = tonumber(lib.pe_deflateBound(strm, #s))
    local out = ffi.new("unsigned char[?]", cap)
    strm.next_in, strm.avail_in = s, #s
    strm.next_out, strm.avail_out = out, cap
    rc = lib.pe_deflate(strm, Z_FINISH)
    local n = cap - strm.avail_out
    lib.pe_deflateEnd(strm)
    if rc ~= Z_STREAM_END then return nil, "deflate: " .. tostring(rc) end
    return ffi.string(out, n)
  end,
}

--- Gzips `s` with the first compressor found: lua-zlib, then libz through
-- the LuaJIT FFI.
-- @tparam string s
-- @tparam[opt] string how `"zlib"` or `"ffi"` for that one only
-- @treturn[1] string the gzip member
-- @treturn[1] string which compressor (`"zlib"` or `"ffi"`)
-- @treturn[2] nil
-- @treturn[2] string why none could
function M.gzip(s, how)
  if type(s) ~= "string" then error("pprof.gzip: string expected", 2) end
  if how ~= nil and not gzippers[how] then error("pprof.gzip: how is 'zlib' or 'ffi', got " .. tostring(how), 2) end
  local why = {}
  for _, name in ipairs({ "zlib", "ffi" }) do
    if how == nil or how == name then
      local out, err = gzippers[name](s)
      if out then return out, name end
      why[#why + 1] = err
    end
  end
  return nil, concat(why, "; ")
end

--- Which compressor `gzip` would use now: `"zlib"`, `"ffi"` or nil (plain).
function M.gzip_available()
  local _, how = M.gzip("")
  return how
end

return M
