/*
 * pe_rock_lj.h - put first (-include) in every object of the Lua 5.1 rock
 * when LuaJIT's headers are installed (Makefile, ROCK_LJ).
 *
 * One 5.1 rock serves PUC Lua 5.1 and LuaJIT (OpenResty loads it): built
 * with LuaJIT's headers after luarocks' own, it has LuaJIT's safe-point
 * stacks (luasafe.c).  LuaJIT's two entry points that luasafe.c calls are
 * weak references there, so that PUC Lua 5.1, which has neither, still
 * loads the module; they are called only under LuaJIT (pe.profile arms the
 * safe point only when the `jit` module is there).
 */
#pragma weak luaJIT_profile_start
#pragma weak luaJIT_profile_stop
