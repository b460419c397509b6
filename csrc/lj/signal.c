/*
 * lj/signal.c - the safe point's signal handler and its records: one
 * fixed ring per armed profile, written here, completed by the capture
 * (lj/walk.c) and taken by a drain (lj/match.c) on the same thread,
 * ordered by signal fences.  The handler does no allocation.  Also owns
 * whether LuaJIT's profiler is still ours (its ProfileState, or two
 * syscalls) and SIGTRAP's chaining to the handler it had.
 */
#define _GNU_SOURCE
#include "lj/safe.h"

#ifdef PE_LJ
#include <errno.h>
#include <signal.h>
#include <sys/time.h>
#include <time.h>
#include <ucontext.h>

ls_prof ls_p[LS_MAXP];
lj_gstate ls_gs;
uint64_t ls_jtrace;
volatile uint32_t ls_throttled, ls_late;
volatile int ls_in_cap;
int ls_active;
void (*ls_ljh)(int);
uint64_t ls_ps;
pe_lj_profile_cb ls_cb;
char ls_token;
volatile uint64_t ls_hns, ls_nh;   /* the handler's own time (ns), its calls */
volatile uint64_t ls_nhslow;       /* handlers preempted (> 100 us), not in ls_hns */
/* blocked while ls_handler runs: both of its signals and SIGIO. Else a
 * SIGTRAP and a SIGRTMIN+4 due together (two profiles' clocks in step)
 * are delivered nested, and the second one's interrupted ip is the first
 * handler's entry (a third of the samples of a loaded run) */
sigset_t ls_blocked;

uint64_t ls_now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* notes in r the builtin or C function whose frame has BASE base in
 * thread l; 1 when found */
static int ls_leaf_at(ls_rec *r, uint64_t l, uint64_t base)
{
  uint32_t slot;
  uint64_t fn = lj_cfunc_at(&LJ_SELF, l, base, &slot);
  if (!fn) return 0;
  r->leaf = fn;
  r->leaf_l = l;
  r->leaf_off = slot;
  return 1;
}

/* LuaJIT's profiler is still the one arm.c started: SIGPROF still has its
 * handler (someone's luaJIT_profile_stop restores the default, and its
 * profile_signal would then dereference a NULL state), and ITIMER_PROF is
 * still disarmed (a jit.profile started since arms it: its profile is
 * left alone). Two syscalls: the fallback of ls_owned when LuaJIT's
 * profiler state was not found at arm */
static int ls_sigprof_ours(void)
{
  struct sigaction cur;
  return sigaction(SIGPROF, NULL, &cur) == 0 && !(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == ls_ljh;
}

int ls_profiler_ours(void)
{
  struct itimerval it;
  return ls_sigprof_ours() && getitimer(ITIMER_PROF, &it) == 0 && !it.it_value.tv_sec && !it.it_value.tv_usec;
}

/* LuaJIT's own profiler state (lj_profile.c's static ProfileState: g, cb,
 * data as its first three words), found at arm, or 0. Every start of
 * LuaJIT's profiler (jit.profile.start, -jp, a C caller of
 * luaJIT_profile_start) writes its own cb and data there, every stop
 * clears g: while the three words are ours, profile_signal is safe to call
 * and sets the hook for our capture. Three loads per signal instead of two
 * syscalls */
static int ls_ps_ours(uint64_t ps)
{
  return lj_u64(&LJ_SELF, ps) == ls_gs.g && lj_u64(&LJ_SELF, ps + 8) == (uint64_t)(uintptr_t)ls_cb
         && lj_u64(&LJ_SELF, ps + 16) == (uint64_t)(uintptr_t)&ls_token;
}

int ls_owned(void)
{
  return ls_ps ? ls_ps_ours(ls_ps) : ls_profiler_ours();
}

ls_prof *ls_find(int fd, uint64_t trap)
{
  int k;
  for (k = 0; k < LS_MAXP; k++)
    if (ls_p[k].on && (trap ? ls_p[k].trap == trap : !ls_p[k].trap && ls_p[k].fd == fd)) return &ls_p[k];
  return NULL;
}

int ls_any_on(void)
{
  int k;
  for (k = 0; k < LS_MAXP; k++) if (ls_p[k].on) return 1;
  return 0;
}

/* a profile dropped without stop(): its event's fd is closed by now */
void ls_prune(void)
{
  int k;
  for (k = 0; k < LS_MAXP; k++) if (ls_p[k].on && !pe_fd_is(ls_p[k].fd, ls_p[k].id)) ls_p[k].on = 0;
}

/* where the VM was: the C function or builtin running, or out of Lua */
static void ls_where(ls_rec *r, const ucontext_t *uc)
{
  if (r->vms == LJ_VMST_C) {
    /* a C function the VM called runs below cur_L's C frame, and the VM
     * itself on it (sp == cframe: its call and return sequences); above it
     * (the host's code after lua_resume returned) there is no Lua to
     * charge, and cur_L->base is stale */
    uint64_t l = lj_u64(&LJ_SELF, ls_gs.curl), sp = (uint64_t)uc->uc_mcontext.gregs[REG_RSP];
    uint64_t cf = l ? lj_u64(&LJ_SELF, l + LJ_L_CFRAME) & ~(uint64_t)3 : 0;
    if (!cf || sp > cf || cf - sp >= LS_CFRAME_SPAN) {
      r->out = 1;
    } else {
      ls_leaf_at(r, l, lj_u64(&LJ_SELF, l + LJ_L_BASE));
    }
  } else if (r->vms == LJ_VMST_INTERP) {
    /* a fast function (math.sqrt) or the C helper of one (tostring's
     * number formatting): its BASE is in rdx, or (rdx clobbered by the
     * helper) stored in cur_L->base before the call */
    uint64_t l = lj_u64(&LJ_SELF, ls_gs.curl);
    if (l && !ls_leaf_at(r, l, (uint64_t)uc->uc_mcontext.gregs[REG_RDX]))
      ls_leaf_at(r, l, lj_u64(&LJ_SELF, l + LJ_L_BASE));
  }
}

static void ls_record(ls_prof *p, const ucontext_t *uc, uint64_t now)
{
  ls_rec *r;
  if (!p) { ls_late = ls_late + 1; return; }
  if (p->head - p->tail >= LS_SLOTS) { p->dropped = p->dropped + 1; return; }
  r = &p->ring[p->head % LS_SLOTS];
  r->time = now;
  r->ip = (uint64_t)uc->uc_mcontext.gregs[REG_RIP];
  r->leaf = r->leaf_l = 0;
  r->leaf_off = 0;
  r->stack = r->cut = 0;
  r->ctx = 0;
  r->route = 0;
  r->out = 0;
  r->vms = ls_gs.vmstate ? lj_i32(&LJ_SELF, ls_gs.vmstate) : 0;
  r->bcpc = r->vms > 0 ? lj_trace_pc(&LJ_SELF, ls_jtrace, r->vms, r->ip, (uint64_t)uc->uc_mcontext.gregs[REG_RSP])
                       : 0;
  ls_where(r, uc);
  /* LuaJIT's hook flag and dispatch table out of step (lj/hook.c),
   * whoever runs its profiler: repaired before profile_signal, whose
   * update then rewrites the whole table (else no capture would come, and
   * a compiled loop could spin in lj_trace_exit or the hook for good) */
  pe_ljhook_repair();
  if (r->out || !ls_active || !ls_owned()) {
    r->state = LS_DONE;
  } else if (ls_in_cap) {
    /* a sample taken while a capture (another profile's) runs on this
     * thread: the capture takes it too (ls_capture's second pass), its ip
     * the leaf under the stack; the C function found is the capture's */
    r->leaf = r->leaf_l = 0;
    r->leaf_off = 0;
    r->state = LS_PENDING;
  } else {
    r->state = LS_PENDING;
    ls_ljh(SIGPROF);    /* LuaJIT's profile_signal: sets HOOK_PROFILE */
  }
  __atomic_signal_fence(__ATOMIC_RELEASE);
  p->head = p->head + 1;
}

/* a perf event's SIGTRAP (attr.sigtrap, Linux 5.13): si_code TRAP_PERF and
 * the event's sig_data in the siginfo's _sigfault._perf._data, right after
 * si_addr (offset 24 on x86-64), which glibc 2.36 does not name */
#ifndef TRAP_PERF
#define TRAP_PERF 6
#endif
static uint64_t ls_perf_data(const siginfo_t *si)
{
  uint64_t d;
  memcpy(&d, (const char *)si + 24, sizeof d);
  return d;
}

void ls_mask(void)
{
  sigemptyset(&ls_blocked);
  sigaddset(&ls_blocked, SIGTRAP);
  sigaddset(&ls_blocked, SIGRTMIN + 4);
  sigaddset(&ls_blocked, SIGIO);
}

/* SIGTRAP's disposition before the first sigtrap arm: the SIGTRAPs that
 * are not a perf event's (a breakpoint's int3) go there */
static struct sigaction ls_trap_old;
static int ls_trap_installed;

static void ls_trap_chain(int sig, siginfo_t *si, void *ctx)
{
  if (ls_trap_old.sa_flags & SA_SIGINFO) {
    if (ls_trap_old.sa_sigaction) ls_trap_old.sa_sigaction(sig, si, ctx);
  } else if (ls_trap_old.sa_handler == SIG_DFL) {
    /* the default action (a core dump), once this handler returns */
    signal(SIGTRAP, SIG_DFL);
    raise(SIGTRAP);
  } else if (ls_trap_old.sa_handler != SIG_IGN) {
    ls_trap_old.sa_handler(sig);
  }
}

void ls_handler(int sig, siginfo_t *si, void *ctx)
{
  int saved = errno;
  uint64_t t0, d;
  if (sig == SIGIO) {              /* the kernel could not queue the signal */
    ls_throttled = ls_throttled + 1;
    errno = saved;
    return;
  }
  if (sig == SIGTRAP && si->si_code != TRAP_PERF) {
    ls_trap_chain(sig, si, ctx);
    errno = saved;
    return;
  }
  t0 = ls_now();
  ls_record(sig == SIGTRAP ? ls_find(-1, ls_perf_data(si)) : ls_find(si->si_fd, 0), ctx, t0);
  /* a copy queued while this one ran (it is blocked meanwhile) is
   * delivered when it returns: no sigtimedwait (a syscall) per signal.
   * A handler of more than 100 us was preempted (its work is bounded):
   * counted apart, its time left out */
  d = ls_now() - t0;
  if (d < 100000) { ls_hns += d; ls_nh++; }
  else ls_nhslow++;
  errno = saved;
}

int ls_trap_install(void)
{
  /* installed once and for good, as the other handlers: a SIGTRAP
   * already on its way must not meet the default action */
  struct sigaction sa;
  if (ls_trap_installed) return 0;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = ls_handler;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sa.sa_mask = ls_blocked;     /* (ls_mask ran when LuaJIT's profiler was started) */
  if (sigaction(SIGTRAP, &sa, &ls_trap_old) < 0) return -1;
  ls_trap_installed = 1;
  return 0;
}
#endif
