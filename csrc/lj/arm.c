/*
 * lj/arm.c - arming and disarming safe-point profiles: LuaJIT's profiler
 * started in our name (its SIGPROF handler taken, its own timer disarmed
 * at once, its ProfileState found so the handler can check it with three
 * loads), global_State's words found (lj/layout.c), the sample signal
 * routed to this thread (F_SETSIG, or a sigtrap event's SIGTRAP), and the
 * slot of each armed profile (lj/signal.c's rings).
 */
#define _GNU_SOURCE
#include "lj/safe.h"

#ifdef PE_LJ
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/time.h>

uint64_t ls_jcand;
int ls_jok;
static char ls_mode = 'l';   /* the mode LuaJIT's profiler was started in */
static int ls_signo;

int ls_push_fail(lua_State *L, const char *msg)
{
  lua_pushnil(L);
  lua_pushstring(L, msg);
  return 2;
}

/* global_State's words for L's VM (L runs this C function: it is cur_L) */
static const char *ls_find_g(lua_State *L)
{
  return lj_g_find(&LJ_SELF, (uint64_t)(uintptr_t)L, &ls_gs);
}

const char *ls_known_g(lua_State *L)
{
  const char *why;
  if (ls_gs.vmstate) return NULL;
  if ((why = ls_find_g(L)) != NULL) return why;
  ls_root = (uint64_t)(uintptr_t)L;
  return NULL;
}

/* right after our luaJIT_profile_start: the ProfileState is the static
 * that luaJIT_profile_start's code addresses RIP-relative (a ModRM byte
 * with mod 00, r/m 101, then disp32, then 0, 1 or 4 bytes of immediate)
 * and that holds G, ls_capture and &ls_token in its first three words. 0
 * when not found (ls_owned then checks with the two syscalls) */
static uint64_t ls_find_ps(void)
{
  uint8_t code[768];
  uint64_t at = (uint64_t)(uintptr_t)luaJIT_profile_start;
  size_t n = sizeof code, i;
  static const int imm[3] = { 0, 1, 4 };
  while (n >= 64 && !lj_read(&LJ_SELF, at, code, n)) n /= 2;
  if (n < 64) return 0;
  for (i = 1; i + 4 <= n; i++) {
    int32_t d;
    int k;
    if ((code[i - 1] & 0xc7) != 0x05) continue;
    memcpy(&d, code + i, 4);
    for (k = 0; k < 3; k++) {
      uint64_t t = at + i + 4 + (uint64_t)imm[k] + (uint64_t)(int64_t)d, w[3];
      if ((t & 7) == 0 && lj_read(&LJ_SELF, t, w, sizeof w) && w[0] == ls_gs.g
          && w[1] == (uint64_t)(uintptr_t)ls_capture && w[2] == (uint64_t)(uintptr_t)&ls_token)
        return t;
    }
  }
  return 0;
}

/* _private.luasafe_trap_busy() -> whether an armed profile's event sends
 * SIGTRAP: a second one must not.  Two SIGTRAPs due on the same return to
 * user space are one, and two clock events both overdue when the thread
 * is switched out both restart 10 us after it is back (the kernel's
 * perf_swevent_start_hrtimer): from then on they fire in step, and one of
 * the two profiles lost a third of its signals in a loaded run.  A block
 * profile's event is no clock (its samples are the thread's switches): it
 * neither counts here nor asks */
int ls_l_trap_busy(lua_State *L)
{
  int k, busy = 0;
  ls_prune();
  for (k = 0; k < LS_MAXP; k++) busy = busy || (ls_p[k].on && ls_p[k].trap && !ls_p[k].block);
  lua_pushboolean(L, busy);
  return 1;
}

/* why LuaJIT's profiler cannot be ours now (someone else's runs), or NULL */
static const char *ls_profiler_busy(void)
{
  struct sigaction old;
  struct itimerval it;
  if (getitimer(ITIMER_PROF, &it) == 0 && (it.it_value.tv_sec || it.it_value.tv_usec))
    return "LuaJIT's profiler is in use (ITIMER_PROF armed: jit.profile or -jp)";
  if (sigaction(SIGPROF, NULL, &old) == 0 && (old.sa_flags & SA_SIGINFO ? old.sa_sigaction != NULL
      : (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN)))
    return "SIGPROF has a handler already (jit.profile or -jp)";
  return NULL;
}

/* starts LuaJIT's profiler for the safe point (mode "f" or "l") with
 * resume and wrapped (stack indexes) naming coroutine.resume and a
 * coroutine.wrap function; 0, or pushes nil, why and returns 2 */
static int ls_start(lua_State *L, int resume, int wrapped, int mode_f)
{
  struct sigaction old;
  struct itimerval zero;
  const char *why;
  if ((why = ls_profiler_busy()) != NULL || (why = ls_find_g(L)) != NULL) return ls_push_fail(L, why);
  ls_root = (uint64_t)(uintptr_t)L;
  ls_resume_fn = lua_isfunction(L, resume) ? (uint64_t)(uintptr_t)lua_topointer(L, resume) : 0;
  ls_wrap_ffid = lua_isfunction(L, wrapped) ? lj_ffid(&LJ_SELF, (uint64_t)(uintptr_t)lua_topointer(L, wrapped))
                                            : -1;
  /* "f": a trace checks the hook at function changes only, and a
   * compiled sample's line is its snapshot's (lj_trace_pc), once the
   * self-test found J->trace; "l": a trace exits at its next line change,
   * and the capture names that line (as -jp=l does) */
  ls_mode = mode_f ? 'f' : 'l';
  ls_cb = ls_capture;
  luaJIT_profile_start(L, mode_f ? "f" : "l", ls_capture, &ls_token);
  ls_jtrace = mode_f && ls_jok ? ls_jcand : 0;
  memset(&zero, 0, sizeof zero);
  setitimer(ITIMER_PROF, &zero, NULL);     /* its timer never fires */
  if (sigaction(SIGPROF, NULL, &old) < 0 || (old.sa_flags & SA_SIGINFO)
      || old.sa_handler == SIG_DFL || old.sa_handler == SIG_IGN) {
    luaJIT_profile_stop(L);
    return ls_push_fail(L, "luaJIT_profile_start installed no SIGPROF handler");
  }
  ls_ljh = old.sa_handler;
  ls_ps = ls_find_ps();
  pe_ljhook_find(L);    /* (its stats: _private.ljhook_stats) */
  ls_signo = SIGRTMIN + 4;
  ls_mask();
  if (pe_sig_install(ls_signo, ls_handler, ls_handler, &ls_blocked) < 0) {
    int err = errno;
    luaJIT_profile_stop(L);
    return pe_push_syserror(L, "luasafe_arm", "sigaction", err, NULL);
  }
  ls_active = 1;
  return 0;
}

/* _private.luasafe_arm(fd, resume, wrapped [, "l"|"f" [, trap]]) -> slot,
 * mode | nil, reason: resume is coroutine.resume, wrapped a coroutine.wrap
 * function (their identities let the capture find who resumed a
 * coroutine); the profiler's mode applies when this arm starts it (mode:
 * the one it runs in).  trap: the event was opened with sigtrap and this
 * sig_data (not 0), and signals its samples itself (SIGTRAP, no wakeup);
 * else its fd is made to signal (F_SETSIG, which needs a wakeup per
 * sample) */
int ls_l_arm(lua_State *L)
{
  int fd = pe_check_int(L, 1, "fd", 0, 0x7fffffff);
  uint64_t trap = lua_isnoneornil(L, 5) ? 0 : (uint64_t)pe_check_int(L, 5, "trap", 1, 0x7fffffff);
  int k, slot = -1;
  ls_prof *p;
  ls_prune();
  for (k = 0; k < LS_MAXP; k++) if (!ls_p[k].on) { slot = k; break; }
  if (slot < 0) return ls_push_fail(L, "4 safe-point profiles are armed already");
  if (trap && ls_find(-1, trap)) return ls_push_fail(L, "a safe-point profile is armed with this sig_data already");
  if (ls_active && !ls_owned())
    return ls_push_fail(L, "LuaJIT's profiler is in use (restarted by jit.profile or -jp since)");
  if (!ls_active) {
    int rc = ls_start(L, 2, 3, lua_isstring(L, 4) && lua_tostring(L, 4)[0] == 'f');
    if (rc) return rc;
  }
  p = &ls_p[slot];
  if (!ls_exdata) ls_exdata = (void *(*)(lua_State *))(uintptr_t)dlsym(RTLD_DEFAULT, "lua_getexdata");
  p->block = 0;
  p->ndone = 0;
  memset(&p->bq, 0, sizeof p->bq);
  p->head = p->tail = p->dropped = p->late = 0;
  p->q.head = p->q.tail = 0;
  p->q.matched = p->merged = 0;
  p->fd = fd;
  p->id = pe_fd_id(fd);
  p->trap = trap;
  if (trap && ls_trap_install() < 0) return pe_push_syserror(L, "luasafe_arm", "sigaction", errno, NULL);
  if (!trap && pe_sig_route(fd, ls_signo) < 0) return pe_push_syserror(L, "luasafe_arm", "fcntl", errno, NULL);
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  ls_p[slot].on = 1;
  lua_pushinteger(L, slot + 1);
  lua_pushlstring(L, &ls_mode, 1);
  return 2;
}

/* _private.luasafe_disarm(slot [, fd]) -> true | false (not armed so) */
int ls_l_disarm(lua_State *L)
{
  int slot = pe_check_int(L, 1, "slot", 1, LS_MAXP) - 1;
  int fd = lua_isnoneornil(L, 2) ? -1 : pe_check_int(L, 2, "fd", 0, 0x7fffffff);
  ls_prof *p = &ls_p[slot];
  /* fd nil: the event was closed behind the profile's back */
  if (!p->on || (fd >= 0 && p->fd != fd)) { lua_pushboolean(L, 0); return 1; }
  pe_sig_unroute(fd);
  p->on = 0;
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  if (!ls_any_on() && ls_active) {
    /* the handlers stay installed (a signal already queued must not meet
     * a default action); LuaJIT's stop restores SIGPROF. Not when
     * jit.profile took the profiler over meanwhile: its profile stays */
    ls_active = 0;
    if (ls_owned()) luaJIT_profile_stop(L);
  }
  lua_pushboolean(L, 1);
  return 1;
}
#endif
