/*
 * lj/safepoint.c - Lua stacks taken at a safe point, through LuaJIT's own
 * profiler hook (pe.profile's default stacks on LuaJIT): the Lua entries
 * (core._private.luasafe_*, profile/safepoint.lua's) and the design.
 *
 * Each perf_event sample signals this thread (O_ASYNC, F_SETSIG,
 * F_SETOWN_EX with F_OWNER_TID; SIGRTMIN+4, not luaprof.c's SIGRTMIN+3),
 * or, for a sigtrap event, raises SIGTRAP itself.  The handler
 * (lj/signal.c) notes the time, the interrupted ip and, in a C function
 * the VM called, that function (the frame at cur_L->base).  When the
 * thread runs Lua (G->vmstate: a trace, the interpreter, the GC, the
 * compiler; or a C function below the VM's C frame) it calls the SIGPROF
 * handler that luaJIT_profile_start installed (lj/arm.c; its own timer is
 * disarmed at once): that only sets HOOK_PROFILE, and the VM calls the
 * capture (lj/walk.c) at its next instruction, or a trace exits there at
 * its next line check (mode "l").  There the Lua state is consistent: the
 * capture walks the frames, interns the stack (lj/intern.c) and the
 * signals' records of each armed profile get its id; a drain
 * (lj/match.c) takes them.  LuaJIT's layout is read through lj/layout.h.
 *
 * The core is built against 5.1's headers (LuaJIT's or PUC's) on x86-64
 * for this: when the interpreter that loaded it is not LuaJIT
 * (pe_lj_here), every entry answers nil, "needs LuaJIT (x86-64)".
 * What the specs do to LuaJIT on purpose (profile_signal in the middle of
 * a C call, ls_cover on chosen input) is in the test-only module
 * spec/support/ljtest.c, not here.
 */
#define _GNU_SOURCE
#include "lj/safe.h"

#ifdef PE_LJ
#include <dlfcn.h>

/* _private.luasafe_here([resume, wrapped]) -> words, chunks: the stack of
 * the calling thread as a capture takes it (the self-test), chunks id ->
 * name for all ids */
static int l_here(lua_State *L)
{
  const char *why;
  uint32_t flags, i, w;
  int n;
  if ((why = ls_known_g(L)) != NULL) return ls_push_fail(L, why);
  if (lua_isfunction(L, 1)) ls_resume_fn = (uint64_t)(uintptr_t)lua_topointer(L, 1);
  if (lua_isfunction(L, 2)) ls_wrap_ffid = lj_ffid(&LJ_SELF, (uint64_t)(uintptr_t)lua_topointer(L, 2));
  n = ls_stack_of(L, &flags);
  lua_createtable(L, 2 + 6 * n, 0);
  for (i = 0; i < 2u + 6u * (uint32_t)n; i++) {
    w = i == 0 ? flags : i == 1 ? (uint32_t)n : ls_frames[(i - 2) / 6].w[(i - 2) % 6];
    lua_pushinteger(L, (lua_Integer)(int32_t)w);
    lua_rawseti(L, -2, (int)i + 1);
  }
  lua_createtable(L, (int)ls_nchunks, 0);
  for (i = 1; i <= ls_nchunks; i++) { lua_pushstring(L, ls_chunks[i - 1]); lua_rawseti(L, -2, (int)i); }
  if (!ls_any_on()) ls_forget();
  return 2;
}

/* _private.luasafe_stats() -> {throttled=, late=, state=}: SIGIOs taken
 * (the kernel could not queue the signal), signals for no armed profile,
 * whether the handler checks LuaJIT's profiler state (true) or makes the
 * two syscalls (false).  LuaJIT's hook flag: _private.ljhook_stats */
static int l_stats(lua_State *L)
{
  lua_createtable(L, 0, 3);
  lua_pushboolean(L, ls_ps != 0); lua_setfield(L, -2, "state");
  lua_pushinteger(L, (lua_Integer)ls_throttled); lua_setfield(L, -2, "throttled");
  lua_pushinteger(L, (lua_Integer)ls_late); lua_setfield(L, -2, "late");
  return 1;
}

/* _private.luasafe_pending(slot) -> n: the signal records of that profile
 * not yet taken (a drain's worth to wait for, read without a system call) */
static int l_pending(lua_State *L)
{
  int slot = pe_check_int(L, 1, "slot", 1, LS_MAXP) - 1;
  ls_prof *p = &ls_p[slot];
  __atomic_signal_fence(__ATOMIC_ACQUIRE);
  lua_pushinteger(L, (lua_Integer)(uint32_t)(p->head - p->tail));
  return 1;
}

/* _private.luasafe_block(slot): that profile's event is a context-switch
 * event with switch records (a block profile): each record is weighed by
 * the voluntary waits that ended before its signal */
static int l_block(lua_State *L)
{
  int slot = pe_check_int(L, 1, "slot", 1, LS_MAXP) - 1;
  ls_p[slot].block = 1;
  return 0;
}

/* _private.luasafe_route(id) -> ctx | nil: the calling thread's request
 * (lua_getexdata: in OpenResty the request, in log_by_lua too) has ended
 * with route id (1..2^31): noted for every armed profile, whose records of
 * it get the route at the next take (ls_routes; at once when 2048 wait);
 * returns that request as a number for the samples already taken (nil: no
 * exdata, not OpenResty's LuaJIT) */
static int l_route(lua_State *L)
{
  uint32_t id = (uint32_t)pe_check_int(L, 1, "id", 1, 0x7fffffff);
  uint64_t ctx, now;
  int k;
  if (!ls_exdata) ls_exdata = (void *(*)(lua_State *))(uintptr_t)dlsym(RTLD_DEFAULT, "lua_getexdata");
  if (!ls_exdata || !(ctx = (uint64_t)(uintptr_t)ls_exdata(L))) { lua_pushnil(L); return 1; }
  now = ls_now();
  for (k = 0; k < LS_MAXP; k++) {
    ls_prof *p = &ls_p[k];
    if (!p->on) continue;
    if (p->ndone == LS_DONE_MAX) ls_routes(p);
    p->done[p->ndone].ctx = ctx;
    p->done[p->ndone].t = now;
    p->done[p->ndone].route = id;
    p->ndone++;
  }
  lua_pushnumber(L, (lua_Number)ctx);   /* an address: 47 bits, exact */
  return 1;
}

/* _private.luasafe_forget(): frees the interned stacks and chunk names
 * when no profile is armed (true), else false */
static int l_forget(lua_State *L)
{
  int ok = !ls_any_on() && !ls_active;
  if (ok) ls_forget();
  lua_pushboolean(L, ok);
  return 1;
}

/* _private.luasafe_lines(fn, t, mcaddr, mcsize) -> lines, snaps | nil,
 * reason: the self-test of compiled lines.  lines[pos + 1] is the line of
 * Lua function fn's bytecode pos as lj_pc_line reads it; trace t (its
 * machine code at mcaddr, mcsize bytes, from jit.util.tracemc) locates
 * J->trace, and snaps[i + 1] is {ref, line in fn or -1} of its snapshot i
 * as lj_trace_pc reads them.  luasafe_lines_use(true) then puts J->trace
 * to use */
static int l_lines(lua_State *L)
{
  const lj_mem *m = &LJ_SELF;
  uint64_t fn, bc, tr, snap;
  uint32_t t = (uint32_t)pe_check_int(L, 2, "trace", 1, 0xffff), i, size, ns;
  uint64_t mc = (uint64_t)luaL_checknumber(L, 3);
  uint32_t sz = (uint32_t)pe_check_int(L, 4, "mcsize", 1, 0x7fffffff);
  const char *why;
  luaL_checktype(L, 1, LUA_TFUNCTION);
  if ((why = ls_known_g(L)) != NULL) return ls_push_fail(L, why);
  fn = (uint64_t)(uintptr_t)lua_topointer(L, 1);
  if (lj_ffid(m, fn) != 0) return ls_push_fail(L, "not a Lua function");
  if (!(ls_jcand = lj_find_traces(m, ls_gs.g, t, mc, sz))) return ls_push_fail(L, "J->trace not found");
  bc = lj_u64(m, fn + LJ_FNL_PC);
  if (bc < 0x10000 || (bc & 3)) return ls_push_fail(L, "no bytecode");
  size = (uint32_t)lj_i32(m, bc - LJ_PT_SIZE + LJ_PT_SIZEBC);
  if (size > (1u << 20)) return ls_push_fail(L, "GCproto.sizebc out of range");
  lua_createtable(L, (int)size, 0);
  for (i = 0; i < size; i++) {
    lua_pushinteger(L, lj_pc_line(m, fn, bc + 4 * (uint64_t)i));
    lua_rawseti(L, -2, (int)i + 1);
  }
  tr = lj_u64(m, lj_u64(m, ls_jcand) + 8 * (uint64_t)t);
  snap = lj_u64(m, tr + LJ_T_SNAP);
  ns = lj_u16(m, tr + LJ_T_NSNAP);
  lua_createtable(L, (int)ns, 0);
  for (i = 0; i < ns; i++) {
    uint64_t s = snap + LJ_SNAP_SIZE * (uint64_t)i;
    lua_createtable(L, 2, 0);
    lua_pushinteger(L, (lua_Integer)lj_u16(m, s + LJ_SNAP_REF) - 0x8000);
    lua_rawseti(L, -2, 1);
    lua_pushinteger(L, lj_pc_line(m, fn, lj_snap_pc(m, tr, s)));
    lua_rawseti(L, -2, 2);
    lua_rawseti(L, -2, (int)i + 1);
  }
  return 2;
}

/* _private.luasafe_lines_use(ok): the self-test of luasafe_lines passed
 * (or not): an arm that starts LuaJIT's profiler in mode "f" takes a
 * compiled sample's line from its snapshot.  Returns whether J->trace is
 * known */
static int l_lines_use(lua_State *L)
{
  ls_jok = lua_toboolean(L, 1) && ls_jcand;
  lua_pushboolean(L, ls_jok);
  return 1;
}
#endif

/* every entry where the interpreter is not LuaJIT on x86-64 */
static int l_needs(lua_State *L)
{
  lua_pushnil(L);
  lua_pushliteral(L, "needs LuaJIT (x86-64)");
  return 2;
}

/* the functions go to core._private (profile/safepoint.lua's, not API) */
void pe_open_luasafe(lua_State *L)
{
#ifdef PE_LJ
  static const luaL_Reg fns[] = {
    {"luasafe_arm", ls_l_arm}, {"luasafe_disarm", ls_l_disarm}, {"luasafe_take", ls_l_take},
    {"luasafe_here", l_here}, {"luasafe_forget", l_forget}, {"luasafe_stats", l_stats},
    {"luasafe_pending", l_pending}, {"luasafe_trap_busy", ls_l_trap_busy}, {"luasafe_lines", l_lines},
    {"luasafe_lines_use", l_lines_use}, {"luasafe_block", l_block}, {"luasafe_route", l_route}, {NULL, NULL}
  };
#endif
  static const char *const names[] = {
    "luasafe_arm", "luasafe_disarm", "luasafe_take", "luasafe_here", "luasafe_forget", "luasafe_stats",
    "luasafe_pending", "luasafe_trap_busy", "luasafe_lines", "luasafe_lines_use", "luasafe_block",
    "luasafe_route", NULL
  };
  int k;
  pe_push_private(L, lua_gettop(L));
#ifdef PE_LJ
  if (pe_lj_here()) {
    pe_setfuncs(L, fns);
    lua_pop(L, 1);
    return;
  }
#endif
  for (k = 0; names[k]; k++) {
    lua_pushcfunction(L, l_needs);
    lua_setfield(L, -2, names[k]);
  }
  lua_pop(L, 1);
}
