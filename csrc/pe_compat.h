/*
 * pe_compat.h - the small slice of the Lua 5.2+ C API the core uses,
 * provided for Lua 5.1 and LuaJIT (after LuaSocket's compat.h).  Every
 * helper has a pe_ prefix so nothing clashes with the host's own symbols.
 */
#ifndef PE_COMPAT_H
#define PE_COMPAT_H

#include <lua.h>
#include <lauxlib.h>

#if LUA_VERSION_NUM >= 502
#define pe_setfuncs(L, l) luaL_setfuncs((L), (l), 0)
#define pe_testudata luaL_testudata
#define pe_rawlen lua_rawlen
#else
void pe_setfuncs(lua_State *L, const luaL_Reg *l);
void *pe_testudata(lua_State *L, int idx, const char *tname);
#define pe_rawlen lua_objlen
#endif

#if LUA_VERSION_NUM >= 504
#define pe_newuserdata(L, sz) lua_newuserdatauv((L), (sz), 1)
#define pe_setuservalue(L, idx) lua_setiuservalue((L), (idx), 1)
#define pe_getuservalue(L, idx) ((void)lua_getiuservalue((L), (idx), 1))
#elif LUA_VERSION_NUM >= 502
#define pe_newuserdata(L, sz) lua_newuserdata((L), (sz))
#define pe_setuservalue(L, idx) lua_setuservalue((L), (idx))
#define pe_getuservalue(L, idx) lua_getuservalue((L), (idx))
#else
#define pe_newuserdata(L, sz) lua_newuserdata((L), (sz))
#define pe_setuservalue(L, idx) lua_setfenv((L), (idx))
#define pe_getuservalue(L, idx) lua_getfenv((L), (idx))
#endif

#if LUA_VERSION_NUM >= 503
#define PE_HAVE_INT64 1
#else
#define PE_HAVE_INT64 0
#endif

#ifndef LUA_TCDATA
#define LUA_TCDATA 10  /* LuaJIT's cdata type tag */
#endif

/* pushes core._private (the Lua layer's hooks; created on first use) with
 * the module table at index mod (compat.c: a leaf) */
void pe_push_private(lua_State *L, int mod);
/* core._private[name] = the value on top of the stack (left there) */
void pe_set_private(lua_State *L, int mod, const char *name);

#endif /* PE_COMPAT_H */
