/*
 * u64.c - exact 64-bit values across Lua versions (doc/api.md, "64-bit values").
 *
 * Lua 5.3+: integers (a u64 >= 2^63 is the negative integer with the same
 * bits, as string.format("%x") and math.ult expect).  LuaJIT: a number when
 * the value is below 2^53, otherwise a uint64_t cdata created through the
 * FFI and filled in place.  PUC 5.1: a number below 2^53, otherwise a
 * "0x..." hex string, which every function of the binding accepts back.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pe_core.h"


#if !PE_HAVE_INT64
/* registry keys for the LuaJIT FFI helpers */
static char key_u64ctor, key_istype;
static int have_ffi = 0;

/* Creates the FFI constructors; verifies that lua_topointer gives the
 * payload address of a cdata (LuaJIT 2.1) before relying on it. */
static const char ffi_setup[] =
  "local ok, ffi = pcall(require, 'ffi')\n"
  "if not ok then return nil end\n"
  "local u64 = ffi.typeof('uint64_t')\n"
  "local i64 = ffi.typeof('int64_t')\n"
  "local istype = ffi.istype\n"
  "return u64, function(v) return istype(u64, v) or istype(i64, v) end,\n"
  "       u64(0x0123456789abcdefULL)\n";
#endif

int pe_u64_init(lua_State *L)
{
#if !PE_HAVE_INT64
  int top = lua_gettop(L);
  if (luaL_loadstring(L, ffi_setup) == 0 && lua_pcall(L, 0, 3, 0) == 0 &&
      !lua_isnil(L, -3)) {
    const uint64_t *probe = (const uint64_t *)lua_topointer(L, -1);
    if (probe && *probe == 0x0123456789abcdefULL) {
      lua_pushlightuserdata(L, &key_istype);
      lua_pushvalue(L, -3);
      lua_rawset(L, LUA_REGISTRYINDEX);
      lua_pushlightuserdata(L, &key_u64ctor);
      lua_pushvalue(L, -4);
      lua_rawset(L, LUA_REGISTRYINDEX);
      have_ffi = 1;
    }
  }
  lua_settop(L, top);
#else
  (void)L;
#endif
  return 0;
}

void pe_push_u64(lua_State *L, uint64_t v)
{
#if PE_HAVE_INT64
  lua_pushinteger(L, (lua_Integer)v);
#else
  if (v < (1ULL << 53)) {
    lua_pushnumber(L, (lua_Number)v);
  } else if (have_ffi) {
    lua_pushlightuserdata(L, &key_u64ctor);
    lua_rawget(L, LUA_REGISTRYINDEX);
    lua_call(L, 0, 1);
    *(uint64_t *)lua_topointer(L, -1) = v;
  } else {
    char buf[24];
    snprintf(buf, sizeof buf, "0x%llx", (unsigned long long)v);
    lua_pushstring(L, buf);
  }
#endif
}

static int parse_u64_string(const char *s, size_t len, uint64_t *out)
{
  char *end;
  int neg = 0;
  unsigned long long v;
  if (len == 0 || strlen(s) != len) return 0;       /* embedded NUL */
  while (*s == ' ' || *s == '\t') s++;
  if (*s == '-') { neg = 1; s++; }
  if (*s < '0' || *s > '9') return 0;
  errno = 0;
  v = strtoull(s, &end, 0);
  if (errno == ERANGE) return 0;
  /* accept LuaJIT's tostring() suffixes */
  if (end[0] == 'U' && end[1] == 'L' && end[2] == 'L') end += 3;
  else if (end[0] == 'L' && end[1] == 'L') end += 2;
  while (*end == ' ' || *end == '\t') end++;
  if (*end) return 0;
  *out = neg ? (uint64_t)0 - v : v;
  return 1;
}

int pe_to_u64(lua_State *L, int idx, uint64_t *out, const char **why)
{
  *why = NULL;
  switch (lua_type(L, idx)) {
  case LUA_TNUMBER: {
#if PE_HAVE_INT64
    if (lua_isinteger(L, idx)) {
      *out = (uint64_t)lua_tointeger(L, idx);
      return 1;
    }
#endif
    lua_Number n = lua_tonumber(L, idx);
    if (n != n) { *why = "NaN is not an integer"; return 0; }
    if (n >= 18446744073709551616.0 || n < -9223372036854775808.0) {
      *why = "number out of 64-bit range";
      return 0;
    }
    if (n >= 9223372036854775808.0) {
      *out = (uint64_t)n;          /* every double here is an integer */
    } else {
      int64_t i = (int64_t)n;
      if ((lua_Number)i != n) { *why = "number has a fractional part"; return 0; }
      *out = (uint64_t)i;
    }
    return 1;
  }
  case LUA_TSTRING: {
    size_t len;
    const char *s = lua_tolstring(L, idx, &len);
    if (parse_u64_string(s, len, out)) return 1;
    *why = "string is not a decimal or 0x-hex 64-bit integer";
    return 0;
  }
#if !PE_HAVE_INT64
  case LUA_TCDATA:
    if (have_ffi) {
      int ok;
      lua_pushlightuserdata(L, &key_istype);
      lua_rawget(L, LUA_REGISTRYINDEX);
      lua_pushvalue(L, idx);
      lua_call(L, 1, 1);
      ok = lua_toboolean(L, -1);
      lua_pop(L, 1);
      if (ok) {
        *out = *(const uint64_t *)lua_topointer(L, idx);
        return 1;
      }
    }
    *why = "cdata is not an int64_t/uint64_t";
    return 0;
#endif
  default:
    *why = "expected an integer";
    return 0;
  }
}

uint64_t pe_check_u64(lua_State *L, int arg)
{
  uint64_t v = 0;
  const char *why;
  if (!pe_to_u64(L, arg, &v, &why))
    luaL_argerror(L, arg, lua_pushfstring(L, "%s, got %s", why, luaL_typename(L, arg)));
  return v;
}

uint64_t pe_opt_u64(lua_State *L, int t, const char *k, uint64_t dflt)
{
  uint64_t v = dflt;
  const char *why;
  lua_getfield(L, t, k);
  if (!lua_isnil(L, -1) && !pe_to_u64(L, -1, &v, &why))
    luaL_error(L, "field '%s': %s, got %s", k, why, luaL_typename(L, -1));
  lua_pop(L, 1);
  return v;
}

int pe_check_int(lua_State *L, int idx, const char *what, int lo, int hi)
{
  lua_Number n;
  char num[32];
  if (lua_type(L, idx) != LUA_TNUMBER)
    return luaL_error(L, "%s: expected an integer, got %s", what, luaL_typename(L, idx));
  n = lua_tonumber(L, idx);
  snprintf(num, sizeof num, "%.14g", (double)n);   /* the same text on every Lua */
  /* compared as doubles before any cast: (int)1e12 is undefined */
  if (!(n >= (lua_Number)lo && n <= (lua_Number)hi))
    return luaL_error(L, "%s: %s is out of range (argument must be %d..%d)", what, num, lo, hi);
  if (n != (lua_Number)(int)n)
    return luaL_error(L, "%s: %s is not an integer", what, num);
  return (int)n;
}
