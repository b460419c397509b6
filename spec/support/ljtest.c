/*
 * ljtest.c - the test-only module "ljtest": what the LuaJIT specs do to
 * LuaJIT on purpose (a torn dispatch table, a SIGPROF or LuaJIT's
 * profile_signal in the middle of a C call) and the pure parts of the
 * safe point run on inputs a test chooses.  Never installed and not part
 * of perf_event.core: the Makefile links it with the core's objects
 * (build/obj/<lua>/libpecore.a, symbols kept private) into
 * build/test/<lua>/ljtest.so, for LuaJIT (and its ASan build).
 *
 * Its copy of the core's objects has its own static state: what acts on
 * core.so's state goes through what core.so reports (the addresses in
 * core._private.ljhook_stats()) and through the process itself (its
 * signals, LuaJIT's own handler, LuaJIT's memory).
 *
 *   ljtest.ljhook_tear(stats, from [, flag]) -> true | nil, why
 *   ljtest.ljhook_repairs(stats, on) -> true | nil, why
 *   ljtest.ljhook_signal(f, ...)   -> f's results, after a SIGPROF
 *   ljtest.luasafe_signal(f, ...)  -> f's results, after profile_signal
 *   ljtest.ljhook_find()           -> true | nil, why (this module's copy)
 *   ljtest.ljhook_stats()          -> that copy's stats
 *   ljtest.luasafe_cover(samples, records) -> weights
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include "lj/safe.h"

PE_EXPORT int luaopen_ljtest(lua_State *L);

#ifdef PE_LJ

#define LJT_FLAG 0x80              /* HOOK_PROFILE */
#define LJT_MAXN 256

/* stats[k] as an address, 0 when missing */
static uint64_t ljt_addr(lua_State *L, int t, const char *k)
{
  lua_Number v;
  lua_getfield(L, t, k);
  v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v > 0 && v < 140737488355328.0 ? (uint64_t)v : 0;
}

static void ljt_st8(uint64_t a, uint8_t v) { *(volatile uint8_t *)(uintptr_t)a = v; }

/* ljtest.ljhook_tear(stats, from [, flag]) -> true | nil, why: what an
 * interrupted lj_dispatch_update leaves, in core.so's VM as its
 * ljhook_stats() (stats) found it: the flag set, every entry the hook,
 * then entries from..n-1 put back as the update for the mode now (no
 * flag) writes them.  With from 0 the flag is left set over a table
 * without the hook at all.  flag false: then the flag is cleared and the
 * mode put back as it was without it (the interrupted update's mode and
 * table written over the nested one's, but for the entries below from):
 * the stale state */
static int ljt_tear(lua_State *L)
{
  uint64_t g, hm, disp, plain[LJT_MAXN];
  uint32_t from = (uint32_t)pe_check_int(L, 2, "from", 0, LJT_MAXN), n, i;
  int flag = lua_isnoneornil(L, 3) || lua_toboolean(L, 3);
  lua_Hook hook = lua_gethook(L);
  int mask = lua_gethookmask(L), count = lua_gethookcount(L);
  uint8_t mode;
  sigset_t block, old;
  luaL_checktype(L, 1, LUA_TTABLE);
  g = ljt_addr(L, 1, "g");
  hm = ljt_addr(L, 1, "hookmask_at");
  disp = ljt_addr(L, 1, "dispatch_at");
  n = (uint32_t)ljt_addr(L, 1, "n");
  if (!hm || !disp || !n || n > LJT_MAXN) return ls_push_fail(L, "the hook flag and table were not found");
  if (g != lj_g_of(&LJ_SELF, (uint64_t)(uintptr_t)L)) return ls_push_fail(L, "another VM");
  if (from > n) from = n;
  /* no profile_signal and no repair meanwhile */
  sigfillset(&block);
  sigdelset(&block, SIGSEGV); sigdelset(&block, SIGBUS);
  sigdelset(&block, SIGILL); sigdelset(&block, SIGFPE);
  pthread_sigmask(SIG_BLOCK, &block, &old);
  ljt_st8(hm, lj_u8(&LJ_SELF, hm) & ~LJT_FLAG);
  lua_sethook(L, hook, mask, count);          /* the table without the hook */
  for (i = 0; i < n; i++) plain[i] = lj_u64(&LJ_SELF, disp + 8 * (uint64_t)i);
  mode = lj_u8(&LJ_SELF, hm + 1);
  ljt_st8(hm, lj_u8(&LJ_SELF, hm) | LJT_FLAG);
  lua_sethook(L, hook, mask, count);          /* every entry the hook */
  for (i = from; i < n; i++) *(volatile uint64_t *)(uintptr_t)(disp + 8 * (uint64_t)i) = plain[i];
  if (!flag) {
    ljt_st8(hm, lj_u8(&LJ_SELF, hm) & ~LJT_FLAG);
    ljt_st8(hm + 1, mode);
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  lua_pushboolean(L, 1);
  return 1;
}

/* ljtest.ljhook_signal(f, ...) -> f's results: a SIGPROF to this thread
 * (LuaJIT's profile_signal, when jit.profile, -jp or a safe-point profile
 * runs LuaJIT's profiler), then f(...) within this C call, before any
 * instruction of the caller takes the hook */
static int ljt_ljhook_signal(lua_State *L)
{
  luaL_checktype(L, 1, LUA_TFUNCTION);
  pthread_kill(pthread_self(), SIGPROF);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}

/* ljtest.luasafe_signal(f, ...) -> f's results: LuaJIT's profile_signal
 * called as a sample's signal handler calls it (the SIGPROF handler that
 * luaJIT_profile_start installed, when LuaJIT's profiler runs), then
 * f(...) within this C call, before any instruction of the caller takes
 * the hook */
static int ljt_luasafe_signal(lua_State *L)
{
  struct sigaction cur;
  luaL_checktype(L, 1, LUA_TFUNCTION);
  if (sigaction(SIGPROF, NULL, &cur) == 0 && !(cur.sa_flags & SA_SIGINFO) && cur.sa_handler != SIG_DFL
      && cur.sa_handler != SIG_IGN)
    cur.sa_handler(SIGPROF);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}

/* ljtest.ljhook_find() -> true | nil, why: this module's copy of the
 * hook flag's search (lj/hook.c), run anew on the running LuaJIT */
static int ljt_find(lua_State *L)
{
  const char *why;
  pe_ljhook_forget();
  why = pe_ljhook_find(L);
  if (why) return ls_push_fail(L, why);
  lua_pushboolean(L, 1);
  return 1;
}

/* t[i], a number in [0, 2^63) (ljt_cover) */
static uint64_t ljt_u64_at(lua_State *L, int t, int i)
{
  lua_Number v;
  lua_rawgeti(L, t, i);
  v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  if (!(v >= 0 && v < 9223372036854775808.0)) luaL_error(L, "luasafe_cover: element %d is not a time or an ip", i);
  return (uint64_t)v;
}

/* ljtest.luasafe_cover(samples, records) -> weights: the drain's ls_cover
 * (lj/match.c) on a queue of its own: samples and records are flat arrays
 * of time, ip pairs, in time order; weights[i] the samples record i
 * stands for */
static int ljt_cover(lua_State *L)
{
  ls_sq *q;
  int i, ns, nr;
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checktype(L, 2, LUA_TTABLE);
  ns = (int)pe_rawlen(L, 1) / 2;
  nr = (int)pe_rawlen(L, 2) / 2;
  q = (ls_sq *)pe_newuserdata(L, sizeof *q);   /* collected with the call */
  q->head = q->tail = 0;
  q->matched = 0;
  for (i = 0; i < ns; i++) ls_queue(q, ljt_u64_at(L, 1, 2 * i + 1), ljt_u64_at(L, 1, 2 * i + 2));
  lua_createtable(L, nr, 0);
  for (i = 0; i < nr; i++) {
    lua_pushinteger(L, (lua_Integer)ls_cover(q, ljt_u64_at(L, 2, 2 * i + 1), ljt_u64_at(L, 2, 2 * i + 2)));
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* ljtest.ljhook_repairs(stats, on) -> true | nil, why: core.so's repairs
 * on (its default) or off, at the address its ljhook_stats() (stats)
 * reports: the specs' controls, showing what a repair changes */
static int ljt_repairs(lua_State *L)
{
  uint64_t a;
  luaL_checktype(L, 1, LUA_TTABLE);
  a = ljt_addr(L, 1, "off_at");
  if (!a) {
    lua_pushnil(L);
    lua_pushliteral(L, "stats without off_at");
    return 2;
  }
  *(volatile int *)(uintptr_t)a = !lua_toboolean(L, 2);
  lua_pushboolean(L, 1);
  return 1;
}

int luaopen_ljtest(lua_State *L)
{
  static const luaL_Reg funcs[] = {
    {"ljhook_tear", ljt_tear}, {"ljhook_signal", ljt_ljhook_signal}, {"luasafe_signal", ljt_luasafe_signal},
    {"ljhook_find", ljt_find}, {"luasafe_cover", ljt_cover}, {"ljhook_repairs", ljt_repairs},
    {NULL, NULL}
  };
  if (!pe_lj_here()) return luaL_error(L, "ljtest: needs LuaJIT (x86-64)");
  lua_newtable(L);
  pe_setfuncs(L, funcs);
  /* this module's copy of the hook code: its stats, beside ljhook_find */
  pe_open_ljhook(L);
  pe_push_private(L, lua_gettop(L));
  lua_getfield(L, -1, "ljhook_stats");
  lua_setfield(L, -3, "ljhook_stats");
  lua_pop(L, 1);
  lua_pushnil(L);
  lua_setfield(L, -2, "_private");
  return 1;
}
#else
int luaopen_ljtest(lua_State *L) { return luaL_error(L, "ljtest: needs LuaJIT (x86-64)"); }
#endif
