/*
 * lj/hook.c - LuaJIT's profiler hook flag and its dispatch table: found,
 * checked and repaired (the safe-point stacks, lj/signal.c).  G is read through lj/layout.h.
 *
 * LuaJIT keeps the flag (G->hookmask's HOOK_PROFILE, 0x80) apart from
 * the instruction dispatch table that makes the interpreter call the
 * profiler hook (lj_dispatch_update writes the table from the flag), and
 * its own paths leave the flag set with a table that does not follow it
 * (LuaJIT 2.1 as of 2026-11, Debian's luajit2 2.1-20230119 included):
 * - lj_vmevent_call (a jit.attach callback: -jv, jit.dump, a profile's
 *   registry) and a GC finalizer's run restore the flag with no dispatch
 *   update: the table has no hook at all;
 * - profile_signal (from a SIGPROF) that interrupts lj_dispatch_update:
 *   its own update writes the hooked table, and the interrupted one goes
 *   on with the mode it had computed, or with the rest of its table copy
 *   over the hooked one: the table is hooked for some instructions only
 *   (its first entry may well be the hook).
 * Then no profile_signal sets the flag again (it is set), so no sample is
 * taken until another dispatch update, a compiled loop exits at each line
 * check (7-15 times slower here), and a trace exit that finds the flag set
 * skips the GC step of an atomic phase (lj_trace_exit: "just exit to
 * interpreter"): a compiled loop that exits at its GC check and whose
 * instructions between the exit and the trace's entry are not hooked
 * re-enters and exits for ever (a spin in lj_trace_exit at 100 % CPU;
 * doc/internals/safepoint.md).
 * The same race the other way leaves the flag clear, a mode byte without
 * the hook and entries that are the hook (stale): lj_dispatch_update sees
 * no mode change and never rewrites them, and lj_dispatch_profile
 * re-dispatches the same instruction to the hook for ever (a -jp run of
 * profile_work.lua spins there with hookmask 0x20, mode 0x10 and a hooked
 * table; writing the repair's mode byte by hand ends it).
 *
 * pe_ljhook_find learns, once per VM, where the flag, the dispatch mode
 * (the byte after it) and the instruction table are, how many entries the
 * table has and what the hook's entry is: from G's bytes read before and
 * after lua_sethook's own dispatch updates (a count hook, then the flag
 * set by hand), with the signals that could update it blocked, and every
 * hook put back as it was.  pe_ljhook_repair, called from the samplers'
 * signal handlers, clears a flag that the table does not follow (set,
 * with a mode without DISPMODE_PROF or an entry not the hook), and in
 * both states writes a mode byte no mode has (LJH_DM_NONE), so that the
 * next dispatch update rewrites the whole table: a trace exit steps the
 * GC again, the next profile_signal sets the flag with a table that calls
 * the hook, and stale entries go.
 */
#define _GNU_SOURCE
#include "lj/layout.h"

#ifdef PE_LJ
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

#define LJH_SCAN 32768             /* bytes of G read: G, jit_State, hot counts, dispatch */
#define LJH_MAXN 256               /* instruction entries at most (BC__MAX is 97 in 2.1) */
#define LJH_FLAG 0x80              /* HOOK_PROFILE */
#define LJH_MASKCOUNT 0x08         /* LUA_MASKCOUNT in hookmask's low bits */
#define LJH_DM_INS 0x04            /* DISPMODE_INS */
#define LJH_DM_PROF 0x40           /* DISPMODE_PROF */
/* the mode byte a repair writes: no mode LuaJIT computes has it (PROF
 * comes with INS), and it differs from each in PROF or INS, so that the
 * next lj_dispatch_update rewrites the whole instruction table */
#define LJH_DM_NONE 0xc0

#define LD64(a) lj_u64(&LJ_SELF, (a))
#define LD8(a) lj_u8(&LJ_SELF, (a))
#define ST8(a, v) (*(volatile uint8_t *)(uintptr_t)(a) = (uint8_t)(v))

static uint64_t h_g;               /* the VM found (its G), 0 none */
static uint64_t h_hm, h_disp;      /* &G->hookmask, &dispatch[0] */
static uint64_t h_hook;            /* lj_vm_profhook: every entry while the flag is set */
static uint32_t h_n;               /* instruction entries */
static const char *h_why = "not looked for";
static volatile uint64_t h_repaired, h_stale;
static uint64_t h_npending;        /* scans that met a sample pending */
static volatile int h_off;         /* repairs switched off (a test, through off_at) */

static int h_peek(uint64_t a, void *out, size_t n) { return lj_read(&LJ_SELF, a, out, n); }

static void h_noop(lua_State *L, lua_Debug *ar) { (void)L; (void)ar; }

/* all signals but the synchronous ones, blocked while the table is made
 * by hand: no profile_signal and no repair meanwhile */
static void h_block(sigset_t *old)
{
  sigset_t block;
  sigfillset(&block);
  sigdelset(&block, SIGSEGV); sigdelset(&block, SIGBUS);
  sigdelset(&block, SIGILL); sigdelset(&block, SIGFPE);
  pthread_sigmask(SIG_BLOCK, &block, old);
}

/* G's first n bytes with no hook (a) and with a count hook (b) */
static const char *h_two(lua_State *L, uint64_t g, size_t n, uint64_t *a, uint64_t *b)
{
  lua_sethook(L, NULL, 0, 0);
  if (!h_peek(g, a, n)) return "G not readable";
  lua_sethook(L, h_noop, LUA_MASKCOUNT, 1 << 30);
  if (!h_peek(g, b, n)) return "G not readable";
  return NULL;
}

/* whether only bytes i and i + 1 changed in the aligned words that hold
 * them: the hook mask and the dispatch mode share theirs with fields a
 * hook leaves alone, where the hook function's new address in G->hookf
 * changes most bytes of its word (one of them, by the luck of ASLR, may
 * look like the mask gaining its count bit) */
static int h_alone(const uint8_t *ab, const uint8_t *bb, size_t i)
{
  size_t j, lo = i & ~(size_t)7, hi = ((i + 1) | 7) + 1;
  for (j = lo; j < hi; j++)
    if (j != i && j != i + 1 && ab[j] != bb[j]) return 0;
  return 1;
}

/* the hook flag, mode and instruction table of L's VM, from G's first n
 * bytes plain (no hook), with a count hook and with the flag set by hand.
 * A sample may be pending (the flag set, the table hooked: then the count
 * hook changes no mode bit): the flag is cleared for the scan, *pending
 * says so and the caller sets it again */
static const char *h_scan(lua_State *L, uint64_t g, size_t n, uint64_t *a, uint64_t *b, uint64_t *c,
                          uint64_t *pending)
{
  const uint8_t *ab = (const uint8_t *)a, *bb = (const uint8_t *)b;
  uint64_t hm = 0;
  size_t i, run = 0, end;
  int nhm = 0;
  const char *why = h_two(L, g, n, a, b);
  if (why) return why;
  /* the flag's byte gained only the count bit, and the mode after it
   * DISPMODE_INS, or had it already with the flag (a sample pending) */
  for (i = 0; i + 1 < 512; i++)
    if ((ab[i] ^ bb[i]) == LJH_MASKCOUNT && (bb[i] & LJH_MASKCOUNT) && (bb[i + 1] & LJH_DM_INS)
        && (!(ab[i + 1] & LJH_DM_INS) || (ab[i] & LJH_FLAG && ab[i + 1] == bb[i + 1]
                                           && (ab[i + 1] & LJH_DM_PROF)))
        && h_alone(ab, bb, i)) {
      hm = g + i;
      nhm++;
    }
  if (nhm != 1) return "G->hookmask not found";
  if (LD8(hm) & LJH_FLAG) {
    *pending = hm;
    ST8(hm, LD8(hm) & ~LJH_FLAG);
    if ((why = h_two(L, g, n, a, b)) != NULL) return why;
  }
  /* the instructions: the first run of 64 words or more that all changed
   * to one value (lj_vm_inshook) */
  for (i = 0; i < n / 8; i++) {
    run = a[i] == b[i] ? 0 : run > 0 && b[i] == b[i - 1] ? run + 1 : 1;
    if (run >= 64 && (i + 1 == n / 8 || b[i + 1] != b[i] || a[i + 1] == b[i + 1])) break;
  }
  if (run < 64 || run > LJH_MAXN || i == n / 8) return "the dispatch table not found";
  end = i + 1;
  /* the flag by hand, then a dispatch update: every entry becomes the hook */
  ST8(hm, LD8(hm) | LJH_FLAG);
  lua_sethook(L, NULL, 0, 0);
  i = h_peek(g, c, n);
  ST8(hm, LD8(hm) & ~LJH_FLAG);
  lua_sethook(L, NULL, 0, 0);
  if (!i) return "G not readable";
  if (!(LD8(hm + 1) == ab[hm - g + 1])) return "the dispatch mode did not come back";
  {
    size_t k, first = end - run;
    for (k = first; k < end; k++)
      if (c[k] != c[first] || c[k] == b[first] || a[k] != LD64(g + 8 * k)) return "the hooked table not found";
    h_hm = hm;
    h_disp = g + 8 * first;
    h_n = (uint32_t)run;
    h_hook = c[first];
  }
  return NULL;
}

const char *pe_ljhook_find(lua_State *L)
{
  uint64_t g = lj_g_of(&LJ_SELF, (uint64_t)(uintptr_t)L);
  uint64_t *a, *b, *c, pending = 0;
  size_t n = LJH_SCAN;
  sigset_t old;
  lua_Hook hook;
  int mask, count;
  if (!pe_lj_here()) return h_why = "not LuaJIT on x86-64";
  if (g == h_g && h_hm) return NULL;
  /* not found yet, or another VM: look (one VM at a time has repairs) */
  h_hm = 0;
  h_g = g;
  a = malloc(3 * LJH_SCAN);
  if (!a) return h_why = "out of memory";
  b = a + LJH_SCAN / 8;
  c = b + LJH_SCAN / 8;
  while (n >= 4096 && !h_peek(g, a, n)) n /= 2;
  if (n < 4096) {
    free(a);
    return h_why = "G not readable";
  }
  h_block(&old);
  hook = lua_gethook(L);
  mask = lua_gethookmask(L);
  count = lua_gethookcount(L);
  h_why = h_scan(L, g, n, a, b, c, &pending);
  if (pending) {
    ST8(pending, LD8(pending) | LJH_FLAG);
    h_npending++;
  }
  lua_sethook(L, hook, mask, count);           /* (with the flag: the hooked table) */
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  free(a);
  return h_why;
}

/* whether every instruction entry is the hook (all), or any is */
static int h_hooked(int all)
{
  uint32_t i;
  for (i = 0; i < h_n; i++)
    if ((LD64(h_disp + 8 * (uint64_t)i) == h_hook) != all) return !all;
  return all;
}

/* the flag set with a table that does not call the hook everywhere */
static int h_stuck(void)
{
  uint8_t m;
  if (!h_hm || !(LD8(h_hm) & LJH_FLAG)) return 0;
  m = LD8(h_hm + 1);
  return m == LJH_DM_NONE || !(m & LJH_DM_PROF) || !h_hooked(1);
}

/* the flag clear, a mode without the hook, and entries that are the hook
 * all the same: lj_dispatch_update, finding the mode unchanged, never
 * rewrites them, and each one calls the hook for ever (lj_dispatch_profile
 * re-dispatches the same instruction: the -jp spin above) */
static int h_stale_now(void)
{
  uint8_t m;
  if (!h_hm || (LD8(h_hm) & LJH_FLAG)) return 0;
  m = LD8(h_hm + 1);
  return m != LJH_DM_NONE && !(m & LJH_DM_PROF) && h_hooked(0);
}

int pe_ljhook_repair(void)
{
  if (h_off) return 0;
  if (h_stuck()) {
    ST8(h_hm, LD8(h_hm) & ~LJH_FLAG);
    ST8(h_hm + 1, LJH_DM_NONE);
    h_repaired = h_repaired + 1;
    return 1;
  }
  if (h_stale_now()) {
    ST8(h_hm + 1, LJH_DM_NONE);
    h_stale = h_stale + 1;
    return 2;
  }
  return 0;
}

uint64_t pe_ljhook_repaired(void) { return h_repaired; }

void pe_ljhook_forget(void) { h_hm = 0; }

/* _private.ljhook_stats() -> {found=true|why, repaired=, rewritten=,
 * stuck=, stale=, n=, pending=, off_at=, hookmask=, mode=, g=,
 * hookmask_at=, dispatch_at=, hook=}: flags cleared, stale tables made to
 * be rewritten, the two states now, the entries, the scans that met a
 * sample pending, the address of the int that turns the repairs off (only
 * spec/support/ljtest.c writes it: ljtest.ljhook_repairs), and (when
 * found) the two bytes, and the addresses of G, of the flag's byte and of
 * the table, and the hook's entry */
static int l_stats(lua_State *L)
{
  lua_createtable(L, 0, 14);
  if (h_hm) lua_pushboolean(L, 1); else lua_pushstring(L, h_why);
  lua_setfield(L, -2, "found");
  lua_pushnumber(L, (lua_Number)h_repaired); lua_setfield(L, -2, "repaired");
  lua_pushnumber(L, (lua_Number)h_stale); lua_setfield(L, -2, "rewritten");
  lua_pushboolean(L, h_stuck()); lua_setfield(L, -2, "stuck");
  lua_pushboolean(L, h_stale_now()); lua_setfield(L, -2, "stale");
  lua_pushinteger(L, (lua_Integer)h_n); lua_setfield(L, -2, "n");
  lua_pushnumber(L, (lua_Number)h_npending); lua_setfield(L, -2, "pending");
  lua_pushnumber(L, (lua_Number)(uintptr_t)&h_off); lua_setfield(L, -2, "off_at");
  if (h_hm) {
    lua_pushinteger(L, LD8(h_hm)); lua_setfield(L, -2, "hookmask");
    lua_pushinteger(L, LD8(h_hm + 1)); lua_setfield(L, -2, "mode");
    lua_pushnumber(L, (lua_Number)h_g); lua_setfield(L, -2, "g");   /* addresses: 47 bits, exact */
    lua_pushnumber(L, (lua_Number)h_hm); lua_setfield(L, -2, "hookmask_at");
    lua_pushnumber(L, (lua_Number)h_disp); lua_setfield(L, -2, "dispatch_at");
    lua_pushnumber(L, (lua_Number)h_hook); lua_setfield(L, -2, "hook");
  }
  return 1;
}

#else

const char *pe_ljhook_find(lua_State *L) { (void)L; return "not LuaJIT on x86-64"; }
int pe_ljhook_repair(void) { return 0; }
uint64_t pe_ljhook_repaired(void) { return 0; }

static int l_stats(lua_State *L)
{
  lua_createtable(L, 0, 4);
  lua_pushstring(L, "not LuaJIT on x86-64"); lua_setfield(L, -2, "found");
  lua_pushnumber(L, 0); lua_setfield(L, -2, "repaired");
  lua_pushboolean(L, 0); lua_setfield(L, -2, "stuck");
  lua_pushinteger(L, 0); lua_setfield(L, -2, "n");
  return 1;
}

void pe_ljhook_forget(void) {}

#endif

void pe_open_ljhook(lua_State *L)
{
  static const luaL_Reg fns[] = {
    {"ljhook_stats", l_stats}, {NULL, NULL}
  };
  pe_push_private(L, lua_gettop(L));
  pe_setfuncs(L, fns);
  lua_pop(L, 1);
}
