/*
 * luasafe.c - Lua stacks taken at a safe point, through LuaJIT's own
 * profiler hook (pe.profile's default stacks on LuaJIT).
 *
 * Each perf_event sample signals this thread (O_ASYNC, F_SETSIG,
 * F_SETOWN_EX with F_OWNER_TID; SIGRTMIN+4, not luaprof.c's SIGRTMIN+3).
 * The handler notes the time, the interrupted ip and, in a C function the
 * VM called, that function (the frame at cur_L->base).  When the thread
 * runs Lua (G->vmstate: a trace, the interpreter, the GC, the compiler; or
 * a C function below the VM's C frame) it calls the SIGPROF handler that
 * luaJIT_profile_start installed (its own timer is disarmed at once): that
 * only sets HOOK_PROFILE, and the VM calls ls_capture at its next
 * instruction, or a trace exits there at its next line check (mode "l").
 * There the Lua state is consistent: ls_capture walks the frames of L in
 * O(depth) (LuaJIT 2.1 GC64, lj_frame.h) and asks lua_getinfo for each
 * frame's chunk and lines with an i_ci it fills as lua_getstack does, so
 * LuaJIT's own line logic is kept.  A coroutine's frames are joined under
 * the frames of the threads that resumed it, from the main thread down.
 * Each distinct stack is interned (a hash table of frame words), and the
 * signals' records of each armed profile get the id of the stack.
 *
 * Records live in fixed rings (one per armed profile), written by the
 * handler, completed by the capture and read by luasafe_read on the same
 * thread; signal fences order them.  The handler does no allocation; the
 * capture allocates only for a stack or chunk name not seen before.
 */
#define _GNU_SOURCE
#include "pe_core.h"
#include <errno.h>
#include <string.h>

/* LuaJIT's C API is 5.1's: a core built against PUC 5.1's headers (the
 * rock's) has the safe point too, used when LuaJIT loads it (pe_lj_here) */
#ifdef PE_LJ
#define LS_LUAJIT 1
#endif

#ifdef LS_LUAJIT
#include <sys/ioctl.h>
#include <sys/time.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <ucontext.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>
#include "pe_records.h"

/* ---------------------------------------------------------------- layouts
 * LuaJIT 2.1, GC64 (lj_obj.h): lua_State glref +16, base +32, top +40,
 * stack +56, cframe +80, stacksize +88; a TValue holding a GC object keeps its address
 * in the low 47 bits; GCfunc: gct +9 (~LJ_TFUNC = 8), ffid +10 (0 Lua,
 * 1 C, more a builtin), GCfuncC.f +40, upvalue[0] +48; a thread's gct is
 * ~LJ_TTHREAD = 6.  The global_State words (vmstate, mainthref, cur_L)
 * are found at arm and checked (ls_find_g). */
#define LS_L_G 16
#define LS_L_BASE 32
#define LS_L_STACK 56
#define LS_L_CFRAME 80
#define LS_GCMASK ((((uint64_t)1) << 47) - 1)
#define LS_FN_GCT 9
#define LS_FN_FFID 10
#define LS_FNC_F 40
#define LS_FNC_UV0 48
#define LS_GCT_FUNC 8
#define LS_GCT_THREAD 6
#define LS_VMST_INTERP (~0)
#define LS_VMST_C (~1)
#define LS_L_SIZE 88                 /* lua_State.stacksize (slots) */
#define LS_ITYPE_FUNC 0x1fff7u       /* (~LJ_TFUNC) & 0x1ffff */
#define LS_CFRAME_SPAN (8u << 20)

#define LD64(a) (*(volatile uint64_t *)(uintptr_t)(a))
#define LD32(a) (*(volatile int32_t *)(uintptr_t)(a))
#define LD8(a) (*(volatile uint8_t *)(uintptr_t)(a))
#define LD16(a) (*(volatile uint16_t *)(uintptr_t)(a))

/* A compiled line, LuaJIT 2.1 GC64 (lj_jit.h, lj_obj.h): jit_State's
 * trace array (GCRef *trace, then freetrace, sizetrace at +12) is found at
 * the self-test (ls_find_traces); GCtrace: gct 9 (~LJ_TTRACE), nsnap +10,
 * snap +48, snapmap +56, szmcode +84, mcode +88; SnapShot (12 bytes):
 * mapofs +0, ref +4, mcofs +6 (where its machine code starts), nent +10,
 * and its bytecode PC is the 64-bit word at snapmap[mapofs + nent] shifted
 * right 8; GCfuncL.pc +32 is its proto's bytecode, which follows the
 * GCproto (104 bytes): sizebc +12, firstline +72, numline +76, lineinfo
 * +80 (lj_debug_line's decoding).  Each is checked at the self-test */
#define LS_GCT_TRACE 9
#define LS_T_NSNAP 10
#define LS_T_SNAP 48
#define LS_T_SNAPMAP 56
#define LS_T_SZMCODE 84
#define LS_T_MCODE 88
#define LS_SNAP_SIZE 12
#define LS_FNL_PC 32
#define LS_PT_SIZE 104
#define LS_PT_SIZEBC 12
#define LS_PT_FIRSTLINE 72
#define LS_PT_NUMLINE 76
#define LS_PT_LINEINFO 80
#define LS_RET_WORDS 64    /* stack words searched for a trace's return address */

static uint64_t ls_g, ls_vmstate, ls_curl, ls_mainth;   /* addresses in global_State */
static uint64_t ls_jtrace;   /* &J->trace in use, or 0 (compiled lines by mode "l") */
static uint64_t ls_jcand;    /* &J->trace found by luasafe_lines */
static int ls_jok;           /* luasafe_lines_use: its self-test passed */
static char ls_mode = 'l';   /* the mode LuaJIT's profiler was started in */

/* ---------------------------------------------------------------- records */
#define LS_MAXP 4          /* profiles armed at once */
#define LS_SLOTS 4096      /* signal records per profile */
#define LS_MAXF 384        /* frames of one stack, C ones included */
#define LS_MAXLUA 256      /* Lua frames of one stack */
#define LS_MAXTH 16        /* threads joined in one stack */

enum { LS_PENDING = 0, LS_DONE = 1 };

typedef struct ls_rec {
  uint64_t time, ip;
  uint64_t leaf;           /* GCfunc of a C function/builtin running (vmstate C), or 0 */
  uint64_t leaf_l;         /* its thread */
  uint32_t leaf_off;       /* its frame's slot in that thread's stack */
  uint32_t stack;          /* interned stack id (0: none) */
  uint32_t cut;            /* 1: the stack ends at the leaf's own frame */
  int32_t vms;             /* G->vmstate at the signal */
  uint64_t bcpc;           /* in a trace: its snapshot's bytecode PC at ip, or 0 */
  uint8_t out, state;
} ls_rec;

/* the ring's samples (time, ip) that no taken record's time has passed
 * yet (l_take, ls_cover), and the records that found theirs */
typedef struct ls_sq {
  uint64_t t[LS_SLOTS], ip[LS_SLOTS];
  uint32_t head, tail;
  uint64_t matched;
} ls_sq;

typedef struct ls_prof {
  int on, fd;
  uint64_t id;
  uint64_t trap;                          /* sig_data of a sigtrap event, or 0 */
  volatile uint32_t head, tail;
  volatile uint32_t dropped, late;
  ls_rec ring[LS_SLOTS];
  ls_sq q;
  uint64_t merged;                        /* samples a record stood for beside its own */
} ls_prof;

static ls_prof ls_p[LS_MAXP];
static volatile uint32_t ls_throttled, ls_late;
static volatile int ls_in_cap;            /* 1 while ls_capture runs */
static int ls_active;                     /* LuaJIT's profiler is ours */
static int ls_signo;
static void (*ls_ljh)(int);               /* LuaJIT's SIGPROF handler */
static uint64_t ls_resume_fn;             /* coroutine.resume's GCfunc */
static int ls_wrap_ffid = -1;             /* ffid of coroutine.wrap's functions */
static uint64_t ls_root;                  /* the thread that armed, when no main thread */
static uint64_t ls_ns, ls_ncap, ls_njoin, ls_nunjoined;
static volatile uint64_t ls_hns, ls_nh;   /* the handler's own time (ns), its calls */
static uint64_t ls_ncapslow;             /* captures preempted (> 1 ms), not in ls_ns */
static volatile uint64_t ls_nhslow;       /* handlers preempted (> 100 us), not in ls_hns */

static uint64_t ls_now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---------------------------------------------------------------- signal */

/* notes in r the builtin or C function whose frame has BASE base in
 * thread l: base must lie in l's stack, the slot below its link must hold
 * a function value (GC64 itype ~LJ_TFUNC in the top 17 bits), not a Lua
 * one; 1 when found */
static int ls_leaf_at(ls_rec *r, uint64_t l, uint64_t base)
{
  uint64_t stack = LD64(l + LS_L_STACK), size = (uint64_t)(uint32_t)LD32(l + LS_L_SIZE), tv, fn;
  if (base < stack + 24 || (base & 7) || base >= stack + 8 * size) return 0;
  tv = LD64(base - 16);
  if ((tv >> 47) != LS_ITYPE_FUNC) return 0;
  fn = tv & LS_GCMASK;
  if (fn < 0x10000 || (fn & 7) || LD8(fn + LS_FN_GCT) != LS_GCT_FUNC || LD8(fn + LS_FN_FFID) == 0) return 0;
  r->leaf = fn;
  r->leaf_l = l;
  r->leaf_off = (uint32_t)((base - stack) / 8 - 1);
  return 1;
}

/* LuaJIT's profiler is still the one this file started: SIGPROF still
 * has its handler (someone's luaJIT_profile_stop restores the default, and
 * its profile_signal would then dereference a NULL state), and ITIMER_PROF
 * is still disarmed (a jit.profile started since arms it: its profile is
 * left alone). Two syscalls: the fallback of ls_owned when LuaJIT's
 * profiler state was not found at arm */
static int ls_sigprof_ours(void)
{
  struct sigaction cur;
  return sigaction(SIGPROF, NULL, &cur) == 0 && !(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == ls_ljh;
}

static int ls_profiler_ours(void)
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
static uint64_t ls_ps;
static char ls_token;                       /* the data pointer we start with */

static void ls_capture(void *data, lua_State *L, int samples, int vmstate);

static int ls_ps_ours(uint64_t ps)
{
  return LD64(ps) == ls_g && LD64(ps + 8) == (uint64_t)(uintptr_t)ls_capture
         && LD64(ps + 16) == (uint64_t)(uintptr_t)&ls_token;
}

static int ls_owned(void)
{
  return ls_ps ? ls_ps_ours(ls_ps) : ls_profiler_ours();
}

/* reads n bytes at a of this process, 0 when not all mapped */
static int ls_peek(uint64_t a, void *out, size_t n) { return pe_peek(getpid(), a, out, n); }

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
  while (n >= 64 && !ls_peek(at, code, n)) n /= 2;
  if (n < 64) return 0;
  for (i = 1; i + 4 <= n; i++) {
    int32_t d;
    int k;
    if ((code[i - 1] & 0xc7) != 0x05) continue;
    memcpy(&d, code + i, 4);
    for (k = 0; k < 3; k++) {
      uint64_t t = at + i + 4 + (uint64_t)imm[k] + (uint64_t)(int64_t)d, w[3];
      if ((t & 7) == 0 && ls_peek(t, w, sizeof w) && w[0] == ls_g
          && w[1] == (uint64_t)(uintptr_t)ls_capture && w[2] == (uint64_t)(uintptr_t)&ls_token)
        return t;
    }
  }
  return 0;
}

/* the armed profile whose event signalled: by the fd (F_SETSIG), or by the
 * sig_data of a sigtrap event (trap != 0) */
static ls_prof *ls_find(int fd, uint64_t trap)
{
  int k;
  for (k = 0; k < LS_MAXP; k++)
    if (ls_p[k].on && (trap ? ls_p[k].trap == trap : !ls_p[k].trap && ls_p[k].fd == fd)) return &ls_p[k];
  return NULL;
}

/* the bytecode PC of snapshot s (its address) of trace tr */
static uint64_t ls_snap_pc(uint64_t tr, uint64_t s)
{
  uint64_t map = LD64(tr + LS_T_SNAPMAP), w;
  memcpy(&w, (const void *)(uintptr_t)(map + 4 * ((uint64_t)(uint32_t)LD32(s) + LD8(s + 10))), sizeof w);
  return w >> 8;
}

/* the bytecode PC of the snapshot of trace t whose machine code holds
 * ip (lj_trace_unwind's search: the last snapshot starting at or before
 * it), or, ip being in a helper the trace called, the return address
 * into the trace among the LS_RET_WORDS words above sp; 0 when none.  The
 * trace runs, so it and the trace array are as the compiler left them */
static uint64_t ls_trace_pc(int32_t t, uint64_t ip, uint64_t sp)
{
  uint64_t arr, tr, mc, snap;
  uint32_t sz, ofs, lo, hi;
  int k;
  if (!ls_jtrace || t <= 0) return 0;
  arr = LD64(ls_jtrace);
  if (!arr || (uint32_t)t >= (uint32_t)LD32(ls_jtrace + 12)) return 0;
  tr = LD64(arr + 8 * (uint64_t)t);
  if (!tr || LD8(tr + LS_FN_GCT) != LS_GCT_TRACE) return 0;
  mc = LD64(tr + LS_T_MCODE);
  sz = (uint32_t)LD32(tr + LS_T_SZMCODE);
  for (k = 0; ip - mc >= sz; k++) {
    if (k == LS_RET_WORDS) return 0;
    ip = LD64(sp + 8 * (uint64_t)k);
  }
  ofs = (uint32_t)(ip - mc);
  snap = LD64(tr + LS_T_SNAP);
  hi = LD16(tr + LS_T_NSNAP);
  if (!snap || !hi) return 0;
  for (lo = 0; lo < hi;) {
    uint32_t mid = (lo + hi) / 2;
    if (ofs < LD16(snap + LS_SNAP_SIZE * (uint64_t)mid + 6)) hi = mid; else lo = mid + 1;
  }
  if (lo == 0) return 0;
  return ls_snap_pc(tr, snap + LS_SNAP_SIZE * (uint64_t)(lo - 1));
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
  r->out = 0;
  r->vms = ls_vmstate ? LD32(ls_vmstate) : 0;
  r->bcpc = r->vms > 0 ? ls_trace_pc(r->vms, r->ip, (uint64_t)uc->uc_mcontext.gregs[REG_RSP]) : 0;
  if (r->vms == LS_VMST_C) {
    /* a C function the VM called runs below cur_L's C frame, and the VM
     * itself on it (sp == cframe: its call and return sequences); above it
     * (the host's code after lua_resume returned) there is no Lua to
     * charge, and cur_L->base is stale */
    uint64_t l = LD64(ls_curl), sp = (uint64_t)uc->uc_mcontext.gregs[REG_RSP];
    uint64_t cf = l ? LD64(l + LS_L_CFRAME) & ~(uint64_t)3 : 0;
    if (!cf || sp > cf || cf - sp >= LS_CFRAME_SPAN) {
      r->out = 1;
    } else {
      ls_leaf_at(r, l, LD64(l + LS_L_BASE));
    }
  } else if (r->vms == LS_VMST_INTERP) {
    /* a fast function (math.sqrt) or the C helper of one (tostring's
     * number formatting): its BASE is in rdx, or (rdx clobbered by the
     * helper) stored in cur_L->base before the call */
    uint64_t l = LD64(ls_curl);
    if (l && !ls_leaf_at(r, l, (uint64_t)uc->uc_mcontext.gregs[REG_RDX]))
      ls_leaf_at(r, l, LD64(l + LS_L_BASE));
  }
  /* LuaJIT's hook flag and dispatch table out of step (csrc/ljhook.c),
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

/* blocked while ls_handler runs: both of its signals and SIGIO. Else a
 * SIGTRAP and a SIGRTMIN+4 due together (two profiles' clocks in step)
 * are delivered nested, and the second one's interrupted ip is the first
 * handler's entry (a third of the samples of a loaded run) */
static sigset_t ls_blocked;

static void ls_mask(void)
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

static void ls_handler(int sig, siginfo_t *si, void *ctx)
{
  int saved = errno;
  uint64_t t0;
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
   * delivered when it returns: no sigtimedwait (a syscall) per signal */
  {
    /* a handler of more than 100 us was preempted (its work is bounded):
     * counted apart, its time left out */
    uint64_t d = ls_now() - t0;
    if (d < 100000) { ls_hns += d; ls_nh++; }
    else ls_nhslow++;
  }
  errno = saved;
}

/* ---------------------------------------------------------------- interning */

/* chunk names: id -> string, and a hash of them */
static char **ls_chunks;
static uint32_t ls_nchunks, ls_capchunks;
static uint32_t *ls_chash;              /* open addressing: chunk id + 1, or 0 */
static uint32_t ls_chsize;

/* stacks: id -> words (flags, n, then 6 words a frame), and a hash */
static uint32_t **ls_stacks;
static uint32_t ls_nstacks, ls_capstacks;
static uint32_t *ls_shash;
static uint32_t ls_shsize;

static uint32_t ls_hash(const void *d, size_t n)
{
  const uint8_t *b = d;
  uint32_t h = 2166136261u;
  size_t i;
  for (i = 0; i < n; i++) h = (h ^ b[i]) * 16777619u;
  return h ? h : 1;
}

static int ls_grow(uint32_t **tab, uint32_t *size, uint32_t n, uint32_t (*key)(uint32_t))
{
  uint32_t ns = *size ? *size * 2 : 256, i;
  uint32_t *t = calloc(ns, sizeof *t);
  if (!t) return 0;
  for (i = 0; i < n; i++) {
    uint32_t h = key(i) & (ns - 1);
    while (t[h]) h = (h + 1) & (ns - 1);
    t[h] = i + 1;
  }
  free(*tab);
  *tab = t;
  *size = ns;
  return 1;
}

/* a stack's words: one step a word */
static uint32_t ls_hashw(const uint32_t *w, size_t n)
{
  uint32_t h = 2166136261u;
  size_t i;
  for (i = 0; i < n; i++) h = (h ^ w[i]) * 16777619u;
  return h ? h : 1;
}

static uint32_t ls_chunk_key(uint32_t i) { return ls_hash(ls_chunks[i], strlen(ls_chunks[i])); }
static uint32_t ls_stack_key(uint32_t i) { return ls_hashw(ls_stacks[i], 2 + 6 * (size_t)ls_stacks[i][1]); }

/* the chunk's id (1-based), or 0 when out of memory */
static uint32_t ls_chunk(const char *s)
{
  size_t n = strlen(s);
  uint32_t h, i;
  char *c;
  if ((ls_nchunks + 1) * 2 > ls_chsize && !ls_grow(&ls_chash, &ls_chsize, ls_nchunks, ls_chunk_key))
    return 0;
  h = ls_hash(s, n) & (ls_chsize - 1);
  while ((i = ls_chash[h]) != 0) {
    if (strcmp(ls_chunks[i - 1], s) == 0) return i;
    h = (h + 1) & (ls_chsize - 1);
  }
  if (ls_nchunks == ls_capchunks) {
    uint32_t nc = ls_capchunks ? ls_capchunks * 2 : 64;
    char **t = realloc(ls_chunks, nc * sizeof *t);
    if (!t) return 0;
    ls_chunks = t;
    ls_capchunks = nc;
  }
  c = malloc(n + 1);
  if (!c) return 0;
  memcpy(c, s, n + 1);
  ls_chunks[ls_nchunks++] = c;
  ls_chash[h] = ls_nchunks;
  return ls_nchunks;
}

static uint32_t ls_intern(const uint32_t *w)
{
  size_t bytes = (2 + 6 * (size_t)w[1]) * 4;
  uint32_t h, i, *c;
  if ((ls_nstacks + 1) * 2 > ls_shsize && !ls_grow(&ls_shash, &ls_shsize, ls_nstacks, ls_stack_key))
    return 0;
  h = ls_hashw(w, bytes / 4) & (ls_shsize - 1);
  while ((i = ls_shash[h]) != 0) {
    if (ls_stacks[i - 1][1] == w[1] && memcmp(ls_stacks[i - 1], w, bytes) == 0) return i;
    h = (h + 1) & (ls_shsize - 1);
  }
  if (ls_nstacks == ls_capstacks) {
    uint32_t nc = ls_capstacks ? ls_capstacks * 2 : 256;
    uint32_t **t = realloc(ls_stacks, nc * sizeof *t);
    if (!t) return 0;
    ls_stacks = t;
    ls_capstacks = nc;
  }
  c = malloc(bytes);
  if (!c) return 0;
  memcpy(c, w, bytes);
  ls_stacks[ls_nstacks++] = c;
  ls_shash[h] = ls_nstacks;
  return ls_nstacks;
}

static void ls_forget(void)
{
  uint32_t i;
  for (i = 0; i < ls_nchunks; i++) free(ls_chunks[i]);
  for (i = 0; i < ls_nstacks; i++) free(ls_stacks[i]);
  free(ls_chunks); free(ls_stacks); free(ls_chash); free(ls_shash);
  ls_chunks = NULL; ls_stacks = NULL; ls_chash = ls_shash = NULL;
  ls_nchunks = ls_capchunks = ls_chsize = ls_nstacks = ls_capstacks = ls_shsize = 0;
}

/* ---------------------------------------------------------------- the walk */

/* one frame, as the stack's words hold it:
 *   Lua:     0, chunk id, linedefined, lastlinedefined, currentline, 0
 *   builtin: 1, ffid, GCfunc address low, high, 0, 0
 *   C:       2, 0, GCfunc address low, high, lua_CFunction low, high
 *   a coroutine.wrap function: 3, ffid, GCfunc address low, high, 0, 0 */
enum { LS_FLUA, LS_FFF, LS_FC, LS_FWRAP };
#define LS_TRUNC 1u        /* flags: deeper frames left out */
#define LS_UNJOINED 2u     /* a coroutine whose resumer was not found */

typedef struct ls_fr {
  uint32_t w[6];
  uint64_t fn;             /* a Lua frame's GCfunc */
  uint64_t l;              /* thread */
  uint32_t off;            /* frame slot in its stack */
} ls_fr;

static ls_fr ls_frames[LS_MAXF];
static uint32_t ls_words[2 + 6 * LS_MAXF];

/* Walks L's frames, leaf first, into out (at most max); returns how many,
 * *trunc set when frames were left out. lj_debug_frame's traversal: dummy
 * frames (the thread itself as function) are skipped, and the frame below
 * a vararg frame (its pseudo-frame). */
static int ls_walk(lua_State *L, ls_fr *out, int max, int *nlua, int *trunc)
{
  uint64_t l = (uint64_t)(uintptr_t)L;
  uint64_t *stack = (uint64_t *)(uintptr_t)LD64(l + LS_L_STACK);
  uint64_t *base = (uint64_t *)(uintptr_t)LD64(l + LS_L_BASE);
  uint64_t *frame = base - 1, *next = NULL, *bot = stack + 1;
  int n = 0, skip = 0;
  while (frame > bot) {
    uint64_t fn = frame[-1] & LS_GCMASK;
    int64_t ftsz = (int64_t)frame[0];
    uint64_t *prev;
    if ((ftsz & 3) == 0) {        /* Lua frame: the link is the caller's PC */
      const uint32_t *pc = (const uint32_t *)(uintptr_t)ftsz;
      prev = frame - (2 + ((pc[-1] >> 8) & 0xff));
    } else {
      prev = (uint64_t *)(uintptr_t)((char *)frame - (ftsz & ~(int64_t)7));
    }
    if (fn != l && !skip) {
      ls_fr *f;
      int ffid;
      ptrdiff_t off = frame - stack, size = next ? next - frame : 0;
      if (n == max || *nlua == LS_MAXLUA || off > 0xffff || size > 0xffff) { *trunc = 1; break; }
      f = &out[n];
      memset(f, 0, sizeof *f);
      f->l = l;
      f->off = (uint32_t)off;
      ffid = LD8(fn + LS_FN_FFID);
      if (ffid == 0) {
        lua_Debug ar;
        memset(&ar, 0, sizeof ar);
        ar.i_ci = (int)((size << 16) + off);
        if (!lua_getinfo(L, "Sl", &ar)) { *trunc = 1; break; }
        f->w[0] = LS_FLUA;
        f->fn = fn;
        f->w[1] = ls_chunk(ar.source ? ar.source : "?");
        f->w[2] = (uint32_t)ar.linedefined;
        f->w[3] = (uint32_t)ar.lastlinedefined;
        f->w[4] = (uint32_t)ar.currentline;
        (*nlua)++;
      } else {
        f->w[0] = ffid == 1 ? LS_FC : ffid == ls_wrap_ffid ? LS_FWRAP : LS_FFF;
        f->w[1] = ffid == 1 ? 0 : (uint32_t)ffid;
        f->w[2] = (uint32_t)fn;
        f->w[3] = (uint32_t)(fn >> 32);
        if (ffid == 1) {
          uint64_t cf = LD64(fn + LS_FNC_F);
          f->w[4] = (uint32_t)cf;
          f->w[5] = (uint32_t)(cf >> 32);
        }
      }
      n++;
    }
    skip = (ftsz & 7) == 3;    /* FRAME_VARG: the frame below is its pseudo-frame */
    next = frame;
    if (prev >= frame) break;  /* never loops */
    frame = prev;
  }
  return n;
}

/* the thread a suspended thread R resumed (its top frame is
 * coroutine.resume, the thread in its first slot, or a coroutine.wrap
 * function, the thread its upvalue), or 0 */
static uint64_t ls_resumed(uint64_t r)
{
  uint64_t base = LD64(r + LS_L_BASE), stack = LD64(r + LS_L_STACK), fn, th = 0;
  if (base < stack + 24 || (base & 7)) return 0;
  fn = LD64(base - 16) & LS_GCMASK;
  if (fn < 0x10000 || (fn & 7) || LD8(fn + LS_FN_GCT) != LS_GCT_FUNC) return 0;
  if (fn == ls_resume_fn) th = LD64(base) & LS_GCMASK;
  else if (ls_wrap_ffid > 1 && LD8(fn + LS_FN_FFID) == ls_wrap_ffid) th = LD64(fn + LS_FNC_UV0) & LS_GCMASK;
  if (th < 0x10000 || (th & 7) || LD8(th + LS_FN_GCT) != LS_GCT_THREAD) return 0;
  return th;
}

/* the whole stack of L into ls_frames, root first; returns how many */
static int ls_stack_of(lua_State *L, uint32_t *flags)
{
  uint64_t chain[LS_MAXTH], root = ls_mainth ? LD64(ls_mainth) & LS_GCMASK : ls_root;
  uint64_t l = (uint64_t)(uintptr_t)L;
  int nth = 0, n = 0, nlua = 0, trunc = 0, i, t;
  static ls_fr tmp[LS_MAXF];
  *flags = 0;
  if (root && root != l) {
    uint64_t r = root;
    chain[nth++] = r;
    while (nth < LS_MAXTH && (r = ls_resumed(r)) != 0 && r != l) chain[nth++] = r;
    if (r != l) { nth = 0; *flags |= LS_UNJOINED; ls_nunjoined++; }
    else ls_njoin++;
  }
  /* leaf first: L, then the resumers from the innermost up */
  n = ls_walk(L, tmp, LS_MAXF, &nlua, &trunc);
  for (t = nth - 1; t >= 0 && !trunc; t--)
    n += ls_walk((lua_State *)(uintptr_t)chain[t], tmp + n, LS_MAXF - n, &nlua, &trunc);
  if (trunc) *flags |= LS_TRUNC;
  for (i = 0; i < n; i++) ls_frames[i] = tmp[n - 1 - i];
  return n;
}

/* interns frames [0, n) with flags; 0 when out of memory */
static uint32_t ls_intern_frames(int n, uint32_t flags)
{
  int i;
  ls_words[0] = flags;
  ls_words[1] = (uint32_t)n;
  for (i = 0; i < n; i++) memcpy(&ls_words[2 + 6 * i], ls_frames[i].w, sizeof ls_frames[i].w);
  return ls_intern(ls_words);
}

/* the line of bytecode PC pc in Lua function fn (lj_debug_line), or -1
 * when pc is not one of fn's */
static int32_t ls_pc_line(uint64_t fn, uint64_t pc)
{
  uint64_t bc = LD64(fn + LS_FNL_PC), pt = bc - LS_PT_SIZE, li;
  uint32_t size, pos, numline;
  int32_t first;
  if (bc < 0x10000 || (bc & 3)) return -1;
  size = (uint32_t)LD32(pt + LS_PT_SIZEBC);
  if (pc < bc || pc - bc >= 4 * (uint64_t)size || (pc & 3)) return -1;
  pos = (uint32_t)((pc - bc) / 4);
  li = LD64(pt + LS_PT_LINEINFO);
  first = LD32(pt + LS_PT_FIRSTLINE);
  numline = (uint32_t)LD32(pt + LS_PT_NUMLINE);
  if (!li) return -1;
  if (pos-- == 0) return first;
  if (numline < 256) return first + (int32_t)LD8(li + pos);
  if (numline < 65536) return first + (int32_t)LD16(li + 2 * (uint64_t)pos);
  return first + LD32(li + 4 * (uint64_t)pos);
}

/* interns frames [0, n) with the leaf's line set to line */
static uint32_t ls_intern_line(int n, uint32_t flags, int32_t line)
{
  uint32_t id, keep = ls_frames[n - 1].w[4];
  ls_frames[n - 1].w[4] = (uint32_t)line;
  id = ls_intern_frames(n, flags);
  ls_frames[n - 1].w[4] = keep;
  return id;
}

/* one capture's stack, walked at the first pending record (n < 0 before) */
typedef struct ls_cap {
  lua_State *L;
  int n;
  uint32_t flags, full, cached_id;
  int32_t cached_line;
} ls_cap;

/* completes record r with the capture's stack */
static void ls_complete(ls_cap *c, ls_rec *r)
{
  int n;
  if (c->n < 0) { c->n = ls_stack_of(c->L, &c->flags); c->full = ls_intern_frames(c->n, c->flags); }
  n = c->n;
  r->stack = c->full;
  if (r->bcpc && n > 0 && ls_frames[n - 1].w[0] == LS_FLUA) {
    /* a sample in a trace: the line its machine code was at, when in
     * the function the capture found running (the trace has no check
     * between a function's lines) */
    int32_t line = ls_pc_line(ls_frames[n - 1].fn, r->bcpc);
    if (line > 0 && (uint32_t)line != ls_frames[n - 1].w[4]) {
      if (line != c->cached_line) { c->cached_line = line; c->cached_id = ls_intern_line(n, c->flags, line); }
      r->stack = c->cached_id;
    }
  }
  if (r->leaf) {
    /* the C function the signal found: still on the stack (table.sort
     * running a Lua comparator) the stack ends at its frame; else it
     * returned and is the leaf under the stack */
    int j;
    for (j = n - 1; j >= 0; j--) {
      if (ls_frames[j].l == r->leaf_l && ls_frames[j].off == r->leaf_off) {
        uint64_t fn = (uint64_t)ls_frames[j].w[2] | ((uint64_t)ls_frames[j].w[3] << 32);
        if (ls_frames[j].w[0] != LS_FLUA && fn == r->leaf) {
          r->stack = j == n - 1 ? c->full : ls_intern_frames(j + 1, c->flags & ~LS_TRUNC);
          r->cut = 1;
        }
        break;
      }
    }
  }
  __atomic_signal_fence(__ATOMIC_RELEASE);
  r->state = LS_DONE;
}

/* completes the pending records of every armed profile */
static void ls_complete_all(ls_cap *c)
{
  int k;
  for (k = 0; k < LS_MAXP; k++) {
    ls_prof *p = &ls_p[k];
    uint32_t i, head;
    if (!p->on) continue;
    __atomic_signal_fence(__ATOMIC_ACQUIRE);
    head = p->head;
    for (i = p->tail; i != head; i++)
      if (p->ring[i % LS_SLOTS].state == LS_PENDING) ls_complete(c, &p->ring[i % LS_SLOTS]);
  }
}

/* the safe point (luaJIT_profile_callback): the pending records of every
 * armed profile get the stack of L.  A second pass takes the records of
 * the signals that came meanwhile (two profiles' clocks in step: the
 * kernel restarts both together after the thread was switched out, and
 * one's samples then fall in the other's capture, 40-60 % of them in a
 * loaded run); one that comes after it arms the hook as usual */
static void ls_capture(void *data, lua_State *L, int samples, int vmstate)
{
  uint64_t t0 = ls_now();
  ls_cap c = { L, -1, 0, 0, 0, -1 };
  (void)data; (void)samples; (void)vmstate;
  ls_in_cap = 1;
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  ls_complete_all(&c);
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  ls_in_cap = 0;
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  ls_complete_all(&c);
  {
    /* a capture of more than 1 ms was preempted (CLOCK_MONOTONIC time on
     * shared CPUs): counted apart, its time left out */
    uint64_t d = ls_now() - t0;
    if (d < 1000000) { ls_ns += d; ls_ncap++; }
    else ls_ncapslow++;
  }
}

/* ---------------------------------------------------------------- arming */

/* the global_State words of L's VM: cur_L (the last word of the first
 * 4 KiB equal to L and followed by a NULL jit_base, this C function runs
 * interpreted), vmstate (the one int32 before it holding ~LJ_VMST_C) and
 * mainthref (the next 8-byte word: a thread of the same VM) */
static const char *ls_find_g(lua_State *L)
{
  uint64_t l = (uint64_t)(uintptr_t)L, g = LD64(l + LS_L_G);
  int k, cur = -1, vm = -1, nvm = 0;
  uint64_t mt;
  if (!g) return "no global_State";
  for (k = 0; k < 511; k++)
    if (LD64(g + 8 * k) == l && LD64(g + 8 * (k + 1)) == 0) cur = k;
  if (cur < 0) return "G->cur_L not found";
  for (k = 0; k < cur * 2; k++)
    if (LD32(g + 4 * k) == LS_VMST_C) { vm = k; nvm++; }
  if (nvm != 1) return "G->vmstate not found";
  ls_g = g;
  ls_curl = g + 8 * (uint64_t)cur;
  ls_vmstate = g + 4 * (uint64_t)vm;
  ls_mainth = (ls_vmstate + 4 + 7) & ~(uint64_t)7;
  mt = LD64(ls_mainth) & LS_GCMASK;
  if (mt < 0x10000 || (mt & 7) || LD8(mt + LS_FN_GCT) != LS_GCT_THREAD || LD64(mt + LS_L_G) != g)
    ls_mainth = 0;      /* the arming thread stands for the root */
  return NULL;
}

static int ls_push_fail(lua_State *L, const char *msg)
{
  lua_pushnil(L);
  lua_pushstring(L, msg);
  return 2;
}

/* a profile dropped without stop(): its event's fd is closed by now */
static void ls_prune(void)
{
  int k;
  for (k = 0; k < LS_MAXP; k++) if (ls_p[k].on && !pe_fd_is(ls_p[k].fd, ls_p[k].id)) ls_p[k].on = 0;
}

/* _private.luasafe_trap_busy() -> whether an armed profile's event sends
 * SIGTRAP: a second one must not.  Two SIGTRAPs due on the same return to
 * user space are one, and two clock events both overdue when the thread
 * is switched out both restart 10 us after it is back (the kernel's
 * perf_swevent_start_hrtimer): from then on they fire in step, and one of
 * the two profiles lost a third of its signals in a loaded run */
static int l_trap_busy(lua_State *L)
{
  int k, busy = 0;
  ls_prune();
  for (k = 0; k < LS_MAXP; k++) busy = busy || (ls_p[k].on && ls_p[k].trap);
  lua_pushboolean(L, busy);
  return 1;
}

/* _private.luasafe_arm(fd, resume, wrapped [, "l"|"f" [, trap]]) -> slot,
 * mode | nil, reason: resume is coroutine.resume, wrapped a coroutine.wrap
 * function (their identities let the capture find who resumed a
 * coroutine); the profiler's mode applies when this arm starts it (mode:
 * the one it runs in).  trap:
 * the event was opened with sigtrap and this sig_data (not 0), and signals
 * its samples itself (SIGTRAP, no wakeup); else its fd is made to signal
 * (F_SETSIG, which needs a wakeup per sample) */
static int l_arm(lua_State *L)
{
  int fd = pe_check_int(L, 1, "fd", 0, 0x7fffffff);
  uint64_t trap = lua_isnoneornil(L, 5) ? 0 : (uint64_t)pe_check_int(L, 5, "trap", 1, 0x7fffffff);
  int k, slot = -1;
  ls_prune();
  for (k = 0; k < LS_MAXP; k++) if (!ls_p[k].on) { slot = k; break; }
  if (slot < 0) return ls_push_fail(L, "4 safe-point profiles are armed already");
  if (trap && ls_find(-1, trap)) return ls_push_fail(L, "a safe-point profile is armed with this sig_data already");
  if (ls_active && !ls_owned())
    return ls_push_fail(L, "LuaJIT's profiler is in use (restarted by jit.profile or -jp since)");
  if (!ls_active) {
    struct sigaction old;
    struct itimerval it, zero;
    const char *why;
    int mode_f;
    if (getitimer(ITIMER_PROF, &it) == 0 && (it.it_value.tv_sec || it.it_value.tv_usec))
      return ls_push_fail(L, "LuaJIT's profiler is in use (ITIMER_PROF armed: jit.profile or -jp)");
    if (sigaction(SIGPROF, NULL, &old) == 0 && (old.sa_flags & SA_SIGINFO ? old.sa_sigaction != NULL
        : (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN)))
      return ls_push_fail(L, "SIGPROF has a handler already (jit.profile or -jp)");
    if ((why = ls_find_g(L)) != NULL) return ls_push_fail(L, why);
    ls_root = (uint64_t)(uintptr_t)L;
    ls_resume_fn = lua_isfunction(L, 2) ? (uint64_t)(uintptr_t)lua_topointer(L, 2) : 0;
    ls_wrap_ffid = lua_isfunction(L, 3) ? LD8((uint64_t)(uintptr_t)lua_topointer(L, 3) + LS_FN_FFID) : -1;
    /* "f": a trace checks the hook at function changes only, and a
     * compiled sample's line is its snapshot's (ls_trace_pc), once the
     * self-test found J->trace; "l": a trace exits at its next line change,
     * and the capture names that line (as -jp=l does) */
    mode_f = lua_isstring(L, 4) && lua_tostring(L, 4)[0] == 'f';
    ls_mode = mode_f ? 'f' : 'l';
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
  }
  {
    ls_prof *p = &ls_p[slot];
    p->head = p->tail = p->dropped = p->late = 0;
    p->q.head = p->q.tail = 0;
    p->q.matched = p->merged = 0;
    p->fd = fd;
    p->id = pe_fd_id(fd);
    p->trap = trap;
  }
  if (trap && !ls_trap_installed) {
    /* installed once and for good, as the other handlers: a SIGTRAP
     * already on its way must not meet the default action */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = ls_handler;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sa.sa_mask = ls_blocked;     /* (ls_mask ran when LuaJIT's profiler was started, above or earlier) */
    if (sigaction(SIGTRAP, &sa, &ls_trap_old) < 0) return pe_push_syserror(L, "luasafe_arm", "sigaction", errno, NULL);
    ls_trap_installed = 1;
  }
  if (!trap && pe_sig_route(fd, ls_signo) < 0) return pe_push_syserror(L, "luasafe_arm", "fcntl", errno, NULL);
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  ls_p[slot].on = 1;
  lua_pushinteger(L, slot + 1);
  lua_pushlstring(L, &ls_mode, 1);
  return 2;
}

static int ls_any_on(void)
{
  int k;
  for (k = 0; k < LS_MAXP; k++) if (ls_p[k].on) return 1;
  return 0;
}

/* _private.luasafe_disarm(slot [, fd]) -> true | false (not armed so) */
static int l_disarm(lua_State *L)
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

static void ls_push_stack(lua_State *L, uint32_t id)
{
  const uint32_t *w = ls_stacks[id - 1];
  uint32_t i, n = 2 + 6 * w[1];
  lua_createtable(L, (int)n, 0);
  for (i = 0; i < n; i++) {
    lua_pushinteger(L, (lua_Integer)(int32_t)w[i]);
    lua_rawseti(L, -2, (int)i + 1);
  }
}

/* the distinct samples of one take: a record's key (stack, leaf, cut,
 * out, whether a trace ran, ip) and how many records had it */
typedef struct ls_key {
  uint64_t ip, leaf;
  uint32_t stack, count;
  uint8_t cut, out, trace, used;
} ls_key;
static ls_key ls_keys[LS_SLOTS];
static uint32_t ls_khash[2 * LS_SLOTS];   /* key index + 1, or 0 (all 0 between takes) */
static uint32_t ls_kslot[LS_SLOTS];       /* the ls_khash slot of each key, to clear it */
static uint32_t ls_order[2 * LS_SLOTS];  /* a record's key, once per sample it stands for (l_take) */

static void ls_push_num(lua_State *L, int t, int i, uint64_t v)
{
  lua_pushnumber(L, (lua_Number)v);        /* addresses: 47 bits, exact */
  lua_rawseti(L, t, i);
}

/* a ring sample (its time, ip) that a record may stand for (ls_cover) */
static void ls_queue(ls_sq *q, uint64_t t, uint64_t ip)
{
  uint32_t k = q->head % LS_SLOTS;
  if (q->head - q->tail == LS_SLOTS) q->tail++;   /* the oldest unmatched goes */
  q->t[k] = t;
  q->ip[k] = ip;
  q->head++;
}

/* how many samples the record of a signal whose handler ran at time, at
 * ip, stands for (see l_take): it takes the queued samples taken before
 * it; the ones at its ip are its own (q->matched counts the records that
 * found one); at least 1 */
static uint32_t ls_cover(ls_sq *q, uint64_t time, uint64_t ip)
{
  uint32_t w = 0;
  while (q->tail != q->head && q->t[q->tail % LS_SLOTS] <= time) {
    if (q->ip[q->tail % LS_SLOTS] == ip) w++;
    q->tail++;
  }
  if (w) q->matched++;
  return w ? w : 1;
}

/* t[i], a number in [0, 2^63) (l_cover) */
static uint64_t ls_u64_at(lua_State *L, int t, int i)
{
  lua_Number v;
  lua_rawgeti(L, t, i);
  v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  if (!(v >= 0 && v < 9223372036854775808.0)) luaL_error(L, "luasafe_cover: element %d is not a time or an ip", i);
  return (uint64_t)v;
}

/* _private.luasafe_cover(samples, records) -> weights: ls_cover on a
 * queue of its own (tests): samples and records are flat arrays of time,
 * ip pairs, in time order; weights[i] the samples record i stands for */
static int l_cover(lua_State *L)
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
  for (i = 0; i < ns; i++) ls_queue(q, ls_u64_at(L, 1, 2 * i + 1), ls_u64_at(L, 1, 2 * i + 2));
  lua_createtable(L, nr, 0);
  for (i = 0; i < nr; i++) {
    lua_pushinteger(L, (lua_Integer)ls_cover(q, ls_u64_at(L, 2, 2 * i + 1), ls_u64_at(L, 2, 2 * i + 2)));
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* _private.luasafe_take(slot, event, nstacks, nchunks, final, keep) ->
 * keys, order, stacks, chunks, stats.
 * Reads the event's ring (its samples counted: stats.ring_samples, their
 * time and ip queued; its LOST records counted by the ring code), then
 * takes the signal records whose capture is done (all of them when final):
 * keys is a flat array, 7 numbers per distinct sample (stack id or 0, leaf
 * GCfunc or 0, cut, out, trace, ip, count); order (keep only) the key
 * index of each sample in turn; stacks id -> words for the ids above
 * nstacks, chunks id -> name above nchunks.
 * A record stands for the ring's samples taken since the record before it
 * and at the ip its signal interrupted: the kernel sends one signal for
 * samples taken before it could send the first (its timer interrupt, late
 * in a VM, takes two periods' samples at once; one wakeup, or one pending
 * SIGTRAP), and the thread has not run in between, so the record's stack
 * is theirs too (stats.merged: those samples, since the arm). Samples at
 * another ip have no record (the Lua side counts them "[no signal]") */
static int l_take(lua_State *L)
{
  int slot = pe_check_int(L, 1, "slot", 1, LS_MAXP) - 1;
  pe_event *ev = pe_to_event(L, 2);
  uint32_t ks = (uint32_t)pe_check_int(L, 3, "nstacks", 0, 0x7fffffff);
  uint32_t kc = (uint32_t)pe_check_int(L, 4, "nchunks", 0, 0x7fffffff);
  int final = lua_toboolean(L, 5), keep = lua_toboolean(L, 6);
  ls_prof *p = &ls_p[slot];
  uint32_t i, head, nk = 0, nr = 0, no = 0, pending;
  uint64_t nring = 0;
  int t;
  if (ev->fd >= 0 && (ev->scratch || pe_ring_ready(L, ev) || (lua_pop(L, 1), 0))) {
    const unsigned char *rec;
    int len;
    while ((len = pe_ring_next(ev, &rec)) > 0) {
      struct pe_event_header h;
      memcpy(&h, rec, sizeof h);
      if (h.type != PE_RECORD_SAMPLE) continue;
      nring++;
      if (len >= 32) {     /* ip|tid|time: the ip at 8, the time at 24 */
        uint64_t ip, tm;
        memcpy(&ip, rec + 8, 8);
        memcpy(&tm, rec + 24, 8);
        ls_queue(&p->q, tm, ip);
      }
    }
  }
  __atomic_signal_fence(__ATOMIC_ACQUIRE);
  head = p->head;
  for (i = p->tail; i != head; i++) {
    ls_rec *r = &p->ring[i % LS_SLOTS];
    ls_key k;
    uint32_t h, j;
    if (r->state != LS_DONE && !final) break;
    memset(&k, 0, sizeof k);
    k.ip = r->ip;
    k.stack = r->state == LS_DONE ? r->stack : 0;
    k.leaf = r->leaf;
    k.cut = r->cut;
    k.out = r->out;
    k.trace = r->vms >= 0;
    h = ls_hashw((const uint32_t *)&k, 24 / 4) & (2 * LS_SLOTS - 1);
    while ((j = ls_khash[h]) != 0) {
      ls_key *e = &ls_keys[j - 1];
      if (e->ip == k.ip && e->leaf == k.leaf && e->stack == k.stack && e->cut == k.cut && e->out == k.out
          && e->trace == k.trace) break;
      h = (h + 1) & (2 * LS_SLOTS - 1);
    }
    if (!j) {
      k.count = 0;
      ls_keys[nk] = k;
      ls_kslot[nk] = h;
      ls_khash[h] = j = ++nk;
    }
    {
      /* (each sample beyond a record's own is one taken off the queue,
       * which holds LS_SLOTS at most: no <= nr + LS_SLOTS) */
      uint32_t w = ls_cover(&p->q, r->time, r->ip);
      p->merged += w - 1;
      ls_keys[j - 1].count += w;
      while (w-- > 0) ls_order[no++] = j;
    }
    nr++;
  }
  __atomic_signal_fence(__ATOMIC_RELEASE);
  p->tail = i;
  pending = p->head - i;
  for (i = 0; i < nk; i++) ls_khash[ls_kslot[i]] = 0;
  lua_createtable(L, (int)(7 * nk), 0);
  t = lua_gettop(L);
  for (i = 0; i < nk; i++) {
    ls_key *e = &ls_keys[i];
    ls_push_num(L, t, (int)(7 * i + 1), e->stack);
    ls_push_num(L, t, (int)(7 * i + 2), e->leaf);
    ls_push_num(L, t, (int)(7 * i + 3), e->cut);
    ls_push_num(L, t, (int)(7 * i + 4), e->out);
    ls_push_num(L, t, (int)(7 * i + 5), e->trace);
    ls_push_num(L, t, (int)(7 * i + 6), e->ip);
    ls_push_num(L, t, (int)(7 * i + 7), e->count);
  }
  lua_createtable(L, keep ? (int)no : 0, 0);
  t = lua_gettop(L);
  if (keep) for (i = 0; i < no; i++) ls_push_num(L, t, (int)i + 1, ls_order[i]);
  lua_createtable(L, 0, 0);
  for (i = ks + 1; i <= ls_nstacks; i++) { ls_push_stack(L, i); lua_rawseti(L, -2, (int)i); }
  lua_createtable(L, 0, 0);
  for (i = kc + 1; i <= ls_nchunks; i++) { lua_pushstring(L, ls_chunks[i - 1]); lua_rawseti(L, -2, (int)i); }
  lua_createtable(L, 0, 18);
  lua_pushinteger(L, ls_nstacks); lua_setfield(L, -2, "nstacks");
  lua_pushinteger(L, ls_nchunks); lua_setfield(L, -2, "nchunks");
  lua_pushnumber(L, (lua_Number)ls_ns); lua_setfield(L, -2, "capture_ns");
  lua_pushnumber(L, (lua_Number)ls_ncap); lua_setfield(L, -2, "captures");
  lua_pushnumber(L, (lua_Number)ls_ncapslow); lua_setfield(L, -2, "captures_slow");
  lua_pushnumber(L, (lua_Number)ls_hns); lua_setfield(L, -2, "handler_ns");
  lua_pushnumber(L, (lua_Number)ls_nh); lua_setfield(L, -2, "handlers");
  lua_pushnumber(L, (lua_Number)ls_nhslow); lua_setfield(L, -2, "handlers_slow");
  lua_pushnumber(L, (lua_Number)ls_njoin); lua_setfield(L, -2, "joined");
  lua_pushnumber(L, (lua_Number)ls_nunjoined); lua_setfield(L, -2, "unjoined");
  lua_pushnumber(L, (lua_Number)nring); lua_setfield(L, -2, "ring_samples");
  lua_pushnumber(L, (lua_Number)(ev->lost + ev->lost_samples)); lua_setfield(L, -2, "lost");
  lua_pushinteger(L, (lua_Integer)nr); lua_setfield(L, -2, "records");
  lua_pushinteger(L, (lua_Integer)pending); lua_setfield(L, -2, "pending");
  lua_pushinteger(L, p->dropped); lua_setfield(L, -2, "dropped");
  lua_pushnumber(L, (lua_Number)p->merged); lua_setfield(L, -2, "merged");
  lua_pushnumber(L, (lua_Number)p->q.matched); lua_setfield(L, -2, "matched");
  lua_pushinteger(L, (lua_Integer)ls_throttled); lua_setfield(L, -2, "throttled");
  lua_pushnumber(L, (lua_Number)pe_ljhook_repaired()); lua_setfield(L, -2, "unstuck");
  /* once a drain: the check the handler makes with its three loads,
   * here with the two syscalls too when the state was found (a LuaJIT
   * whose ProfileState is not as lj_profile.c has it) */
  if (ls_active && ls_ps && !ls_profiler_ours()) ls_ps = 0;
  /* the last profile's last read: the interned stacks go (ids restart) */
  if (final && !ls_any_on() && !ls_active) ls_forget();
  return 5;
}

/* the global_State words found once (no profile armed yet: L's thread
 * stands for the root); NULL, or why not */
static const char *ls_known_g(lua_State *L)
{
  const char *why;
  if (ls_vmstate) return NULL;
  if ((why = ls_find_g(L)) != NULL) return why;
  ls_root = (uint64_t)(uintptr_t)L;
  return NULL;
}

/* _private.luasafe_here([resume, wrapped]) -> words, chunks: the stack of
 * the calling thread as a capture takes it (the self-test), chunks id ->
 * name for all ids */
static int l_here(lua_State *L)
{
  const char *why;
  uint32_t flags, i;
  int n;
  if ((why = ls_known_g(L)) != NULL) return ls_push_fail(L, why);
  if (lua_isfunction(L, 1)) ls_resume_fn = (uint64_t)(uintptr_t)lua_topointer(L, 1);
  if (lua_isfunction(L, 2)) ls_wrap_ffid = LD8((uint64_t)(uintptr_t)lua_topointer(L, 2) + LS_FN_FFID);
  n = ls_stack_of(L, &flags);
  ls_words[0] = flags;
  ls_words[1] = (uint32_t)n;
  lua_createtable(L, 2 + 6 * n, 0);
  for (i = 0; i < 2u + 6u * (uint32_t)n; i++) {
    if (i >= 2) ls_words[i] = ls_frames[(i - 2) / 6].w[(i - 2) % 6];
    lua_pushinteger(L, (lua_Integer)(int32_t)ls_words[i]);
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

/* _private.luasafe_signal(f, ...) -> f's results: LuaJIT's
 * profile_signal, as a sample's signal calls it (when LuaJIT's profiler is
 * ours), then f(...) within this C call, before any instruction of the
 * caller takes the hook (tests) */
static int l_signal(lua_State *L)
{
  luaL_checktype(L, 1, LUA_TFUNCTION);
  if (ls_active && ls_owned()) ls_ljh(SIGPROF);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
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

/* _private.luasafe_forget(): frees the interned stacks and chunk names
 * when no profile is armed (true), else false */
static int l_forget(lua_State *L)
{
  int ok = !ls_any_on() && !ls_active;
  if (ok) ls_forget();
  lua_pushboolean(L, ok);
  return 1;
}
/* &J->trace: a word among the first 64 KiB after G that points to an
 * array whose slot t holds a trace (gct 9) of machine code mc, size sz,
 * with sizetrace > t 12 bytes after it; 0 unless exactly one */
static uint64_t ls_find_traces(uint32_t t, uint64_t mc, uint32_t sz)
{
  uint64_t w[512], found = 0, at;
  int nfound = 0;
  /* chunks overlap by a word: a field pair across two is seen whole */
  for (at = ls_g; at < ls_g + 65536 && ls_peek(at, w, sizeof w); at += sizeof w - 8) {
    int k;
    for (k = 0; k + 1 < 512; k++) {
      uint64_t tr, m;
      uint32_t size = (uint32_t)(w[k + 1] >> 32), msz;
      uint8_t gct;
      if (w[k] < 0x10000 || (w[k] & 7) || size <= t || size > (1u << 20)) continue;
      if (!ls_peek(w[k] + 8 * (uint64_t)t, &tr, 8) || tr < 0x10000 || (tr & 7)) continue;
      if (!ls_peek(tr + LS_FN_GCT, &gct, 1) || gct != LS_GCT_TRACE) continue;
      if (!ls_peek(tr + LS_T_MCODE, &m, 8) || m != mc || !ls_peek(tr + LS_T_SZMCODE, &msz, 4) || msz != sz) continue;
      found = at + 8 * (uint64_t)k;
      nfound++;
    }
  }
  return nfound == 1 ? found : 0;
}


/* _private.luasafe_lines(fn, t, mcaddr, mcsize) -> lines, snaps | nil,
 * reason: the self-test of compiled lines.  lines[pos + 1] is the line of
 * Lua function fn's bytecode pos as ls_pc_line reads it; trace t (its
 * machine code at mcaddr, mcsize bytes, from jit.util.tracemc) locates
 * J->trace, and snaps[i + 1] is {ref, line in fn or -1} of its snapshot i
 * as ls_trace_pc reads them.  luasafe_lines_use(true) then puts J->trace
 * to use */
static int l_lines(lua_State *L)
{
  uint64_t fn, bc, arr, tr, snap;
  uint32_t t = (uint32_t)pe_check_int(L, 2, "trace", 1, 0xffff), i, size, ns;
  uint64_t mc = (uint64_t)luaL_checknumber(L, 3);
  uint32_t sz = (uint32_t)pe_check_int(L, 4, "mcsize", 1, 0x7fffffff);
  const char *why;
  luaL_checktype(L, 1, LUA_TFUNCTION);
  if ((why = ls_known_g(L)) != NULL) return ls_push_fail(L, why);
  fn = (uint64_t)(uintptr_t)lua_topointer(L, 1);
  if (LD8(fn + LS_FN_FFID) != 0) return ls_push_fail(L, "not a Lua function");
  if (!(ls_jcand = ls_find_traces(t, mc, sz))) return ls_push_fail(L, "J->trace not found");
  bc = LD64(fn + LS_FNL_PC);
  if (bc < 0x10000 || (bc & 3)) return ls_push_fail(L, "no bytecode");
  size = (uint32_t)LD32(bc - LS_PT_SIZE + LS_PT_SIZEBC);
  if (size > (1u << 20)) return ls_push_fail(L, "GCproto.sizebc out of range");
  lua_createtable(L, (int)size, 0);
  for (i = 0; i < size; i++) {
    lua_pushinteger(L, ls_pc_line(fn, bc + 4 * (uint64_t)i));
    lua_rawseti(L, -2, (int)i + 1);
  }
  arr = LD64(ls_jcand);
  tr = LD64(arr + 8 * (uint64_t)t);
  snap = LD64(tr + LS_T_SNAP);
  ns = LD16(tr + LS_T_NSNAP);
  lua_createtable(L, (int)ns, 0);
  for (i = 0; i < ns; i++) {
    uint64_t s = snap + LS_SNAP_SIZE * (uint64_t)i;
    lua_createtable(L, 2, 0);
    lua_pushinteger(L, (lua_Integer)LD16(s + 4) - 0x8000);
    lua_rawseti(L, -2, 1);
    lua_pushinteger(L, ls_pc_line(fn, ls_snap_pc(tr, s)));
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
#ifdef LS_LUAJIT
  static const luaL_Reg fns[] = {
    {"luasafe_arm", l_arm}, {"luasafe_disarm", l_disarm}, {"luasafe_take", l_take},
    {"luasafe_here", l_here}, {"luasafe_forget", l_forget}, {"luasafe_stats", l_stats},
    {"luasafe_pending", l_pending}, {"luasafe_trap_busy", l_trap_busy}, {"luasafe_lines", l_lines},
    {"luasafe_lines_use", l_lines_use}, {"luasafe_cover", l_cover}, {"luasafe_signal", l_signal},
    {NULL, NULL}
  };
#endif
  static const char *const names[] = {
    "luasafe_arm", "luasafe_disarm", "luasafe_take", "luasafe_here", "luasafe_forget", "luasafe_stats",
    "luasafe_pending", "luasafe_trap_busy", "luasafe_lines", "luasafe_lines_use", "luasafe_cover",
    "luasafe_signal", NULL
  };
  int k;
  pe_push_private(L, lua_gettop(L));
#ifdef LS_LUAJIT
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
