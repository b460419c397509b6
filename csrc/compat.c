/*
 * compat.c - Lua 5.2 API functions missing from PUC Lua 5.1 and LuaJIT's
 * 5.1 API, under private names (see pe_compat.h), and the core._private
 * table (the Lua layer's hooks: C methods and ring functions that
 * lua/perf_event/class.lua and records.lua bind, never on a public class).
 * A leaf: calls only the Lua API.
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
#endif

/* ---- core._private: the Lua layer's hooks, off the public classes ------ */
/* pushes core._private (created on first use); the module table is at mod */
void pe_push_private(lua_State *L, int mod)
{
  lua_getfield(L, mod, "_private");
  if (lua_istable(L, -1)) return;
  lua_pop(L, 1);
  lua_newtable(L);
  lua_pushvalue(L, -1);
  lua_setfield(L, mod, "_private");
}

/* core._private[name] = the value on top of the stack (left there) */
void pe_set_private(lua_State *L, int mod, const char *name)
{
  pe_push_private(L, mod);
  lua_pushvalue(L, -2);
  lua_setfield(L, -2, name);
  lua_pop(L, 1);
}
