/*
 * compat.c - Lua 5.2 API functions missing from PUC Lua 5.1 and LuaJIT's
 * 5.1 API, under private names (see pe_compat.h).
 */
#include "pe_compat.h"

#if LUA_VERSION_NUM < 502
void pe_setfuncs(lua_State *L, const luaL_Reg *l)
{
  for (; l->name; l++) {
    lua_pushcfunction(L, l->func);
    lua_setfield(L, -2, l->name);
  }
}

void *pe_testudata(lua_State *L, int idx, const char *tname)
{
  void *p = lua_touserdata(L, idx);
  if (p == NULL || !lua_getmetatable(L, idx)) return NULL;
  lua_getfield(L, LUA_REGISTRYINDEX, tname);
  if (!lua_rawequal(L, -1, -2)) p = NULL;
  lua_pop(L, 2);
  return p;
}
#else
typedef int pe_compat_unused;   /* ISO C forbids an empty translation unit */
#endif
