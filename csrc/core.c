/*
 * core.c - luaopen_perf_event_core: assembles the module from the files
 * that own each concern (lifecycle.c, event.c, group.c, ring.c, fast.c,
 * attr.c, readfmt.c, errors.c, u64.c, spawn.c, dir.c, abi.c); the top of
 * the file dependency order stated in pe_core.h.
 */
#define _GNU_SOURCE 1   /* dladdr, RTLD_NODELETE */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <string.h>
#include "pe_core.h"

static int l_strerror(lua_State *L)
{
  int err = pe_check_int(L, 1, "strerror: errno", 0, INT_MAX);
  lua_pushstring(L, pe_errno_name(err));
  lua_pushstring(L, strerror(err));
  return 2;
}

/* core.u64(v) -> v normalised the way the core returns 64-bit values */
static int l_u64(lua_State *L)
{
  pe_push_u64(L, pe_check_u64(L, 1));
  return 1;
}

/* core.scale(value, enabled, running) -> value * enabled / running (C7) */
static int l_scale(lua_State *L)
{
  pe_push_u64(L, pe_scale(pe_check_u64(L, 1), pe_check_u64(L, 2), pe_check_u64(L, 3)));
  return 1;
}

/* core.explain(errno, attr [, {pid=, cpu=, cgroup=bool, name=}]) -> the
 * message perf_event_open's errno gets for this attr: the hint table made
 * visible, for teaching and for checking every errno of doc/coverage.md I. */
static int l_explain(lua_State *L)
{
  int err = pe_check_int(L, 1, "explain: errno", 0, INT_MAX);
  struct pe_attr a;
  int pid = 0, cpu = -1;
  unsigned long flags = 0;
  const char *name = "event";
  char hint[512];
  pe_attr_from_table(L, 2, &a, 0);
  if (lua_istable(L, 3)) {
    lua_getfield(L, 3, "pid");
    if (lua_isnumber(L, -1)) pid = pe_check_int(L, -1, "explain: pid", INT_MIN, INT_MAX);
    lua_getfield(L, 3, "cpu");
    if (lua_isnumber(L, -1)) cpu = pe_check_int(L, -1, "explain: cpu", INT_MIN, INT_MAX);
    lua_getfield(L, 3, "cgroup");
    if (lua_toboolean(L, -1)) flags |= PE_FLAG_PID_CGROUP;
    lua_getfield(L, 3, "name");
    if (lua_isstring(L, -1)) name = lua_tostring(L, -1);
  }
  pe_push_errmsg(L, "perf_event_open", name, err,
                 pe_open_hint(hint, sizeof hint, err, &a, pid, cpu, flags));
  return 1;
}

static const luaL_Reg funcs[] = {
  {"scale", l_scale}, {"explain", l_explain},
  {"attr_encode", pe_l_attr_encode}, {"attr_decode", pe_l_attr_decode},
  {"bits", pe_l_bits}, {"decode_read", pe_l_decode_read},
  {"readdir", pe_l_readdir},
  {"strerror", l_strerror}, {"u64", l_u64}, {NULL, NULL}
};

/* The interpreter unloads C modules when its state closes (a finalizer
 * run with the others, in an order the program does not choose), but the
 * profilers' signal handlers stay installed and a finalizer may still call
 * in (a profile stopped at close): this library stays loaded until the
 * process ends. */
static void pe_stay_loaded(void)
{
  Dl_info info;
  static int done;
  if (done) return;
  done = 1;
  if (dladdr((const void *)pe_stay_loaded, &info) && info.dli_fname)
    (void)dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}

PE_EXPORT int luaopen_perf_event_core(lua_State *L)
{
  pe_stay_loaded();
  pe_u64_init(L);
  lua_newtable(L);
  pe_setfuncs(L, funcs);
  pe_ring_funcs(L);
  pe_open_events(L);
  pe_fast_open(L);
  pe_open_spawn(L);
  pe_open_perfdata(L);
  pe_open_unwind(L);
  pe_open_abi(L);
  pe_open_luasafe(L);
  pe_open_luahook(L);
  pe_open_ljhook(L);
  pe_open_ljremote(L);
  pe_open_ljbpf(L);
  pe_open_ownfile(L);
  pe_open_tty(L);
  lua_pushinteger(L, PE_ATTR_SIZE_VER8);
  lua_setfield(L, -2, "ATTR_SIZE");
  lua_pushliteral(L, "0.1.0");
  lua_setfield(L, -2, "VERSION");
  return 1;
}
