/*
 * luaprof.c - sample-time capture for perf_event.profile (LuaJIT frames).
 *
 * A sampling event is armed so that each sample also sends a signal to
 * this thread (O_ASYNC, F_SETSIG, F_SETOWN_EX with F_OWNER_TID). The
 * handler records the interrupted rip, rbx (the interpreter's PC), rdx
 * (its BASE) and rsp, the CLOCK_MONOTONIC time, and walks LuaJIT's frame
 * links upward from BASE (GC64: the link is the slot at BASE-8; a Lua
 * frame's link is the caller's PC, whose previous instruction, a call,
 * has the A operand that gives the caller's BASE; other frames hold a byte
 * delta). When rdx is not BASE: in a trace, G->jit_base; in a C function
 * the interpreter called, cur_L->base (the VM stores it before the call;
 * G->vmstate, when found, tells a trace from the interpreter); else the
 * words near sp, since traces spill BASE there. Every load goes
 * through process_vm_readv on this process, so a wrong address is EFAULT,
 * never a fault. The Lua side trusts a chain only where its PCs fall in
 * bytecode it knows, so the walk needs no knowledge of lua_State.
 *
 * The records go to a fixed ring written only by the handler and read by
 * the same thread (luaprof_read), so a signal fence orders them.
 */
#define _GNU_SOURCE
#include "pe_core.h"
#include <sys/ioctl.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <sys/uio.h>

#define LP_SLOTS 8192       /* about 2 MB of bss, touched only when used */
#define LP_DEPTH 24

typedef struct lp_ent {
  uint64_t time, ip, bx, dx, sp;
  uint64_t fpc;                 /* GCfuncL.pc of the function at the walk's BASE */
  uint64_t fn;                  /* that function (a GCfunc address), or 0 */
  int32_t vms;                  /* G->vmstate when it was read, else 1 << 30 */
  uint32_t n;
  uint32_t out;                 /* 1: not in Lua (vmstate C, sp above cur_L's cframe) */
  uint64_t pcs[LP_DEPTH];
} lp_ent;

static lp_ent lp_ring[LP_SLOTS];
static volatile uint32_t lp_head, lp_tail, lp_dropped, lp_late;
static volatile uint64_t lp_ns;      /* time spent in the handler's walks */
/* The walk's own CPU time makes samples.  When a walk costs more than the
 * sample period the handler would run back to back for ever, and the
 * signals it cannot take in time queue up to the user's RLIMIT_SIGPENDING,
 * after which the kernel sends SIGIO instead (its default action ends the
 * process).  So: no walk until 3x the last walk's cost has passed (walks
 * take at most a quarter of the thread's time), and the copies of the
 * signal queued meanwhile are taken off the queue on entry. */
static volatile uint64_t lp_quiet_until, lp_throttled;
static int lp_signo;
static volatile int lp_on;
static int lp_fd = -1;              /* the armed event's fd */
static uint64_t lp_id;              /* and its id (fd numbers are reused) */
static pid_t lp_pid;

static int lp_read(uint64_t addr, void *out, size_t n) { return pe_peek(lp_pid, addr, out, n); }

#if defined(__x86_64__)
static uint8_t lp_callop[256];     /* opcodes a return PC follows (CALL, ...) */

/* The frame slots of one walk come from 2 KiB of the Lua stack read at
 * once (frames go down from BASE). The handler is not reentered (its own
 * signal is blocked while it runs), so one static buffer serves. */
#define LP_CHUNK 2048
static uint64_t lp_chunk[LP_CHUNK / 8];
static uint64_t lp_cbeg, lp_cend;

static int lp_slot(uint64_t addr, uint64_t *out)
{
  if (addr < lp_cbeg || addr + 8 > lp_cend) {
    uint64_t start = addr + 8 >= LP_CHUNK ? addr + 8 - LP_CHUNK : 0;
    if (!lp_read(start, lp_chunk, LP_CHUNK)) {
      lp_cbeg = lp_cend = 0;
      return lp_read(addr, out, 8);   /* the chunk crosses an unmapped page */
    }
    lp_cbeg = start;
    lp_cend = start + LP_CHUNK;
  }
  *out = lp_chunk[(addr - lp_cbeg) / 8];
  return 1;
}

/* Walks frame links from base into pcs; returns how many Lua frames. A
 * Lua frame's link must follow one of the call opcodes, so a wrong base
 * rarely gets past its first link. */
/* The call instruction before each return PC seen, direct-mapped by the PC:
 * the same call sites come back sample after sample. The profile holds
 * every prototype it knows, so their bytecode does not move while armed;
 * the cache is cleared at each arm. */
#define LP_ICACHE 1024
static struct { uint64_t pc; uint32_t ins; } lp_icache[LP_ICACHE];
static uint64_t lp_last_base;      /* BASE of the last walk that worked */
static uint64_t lp_jit_base;       /* &G->jit_base (BASE while a trace runs), or 0 */
static int lp_jb_mode;             /* 0 never, 1 after rdx fails, 2 only (self-test) */
static uint64_t lp_cur_l;          /* &G->cur_L (the word before jit_base), or 0 */
static int lp_lb_mode;             /* cur_L->base: 0 never, 1 after rdx fails outside
                                    * traces, 2 only (self-test) */
static uint64_t lp_vmstate;        /* &G->vmstate, or 0 */
static int lp_vs_mode;             /* 1: vmstate decides which base to try */
#define LP_VMST_C (~1)             /* ~LJ_VMST_C: the VM runs a C function */
#define LP_VMST_GC (~2)            /* ~LJ_VMST_GC (a trace's GC step keeps BASE near sp) */
#define LP_NO_VMS (1 << 30)
/* The global_State words found at arm (vmstate, cur_L, jit_base) are
 * loaded directly, not through process_vm_readv (~1.4 us each): the
 * global_State lives as long as the Lua state the profile was armed in,
 * and a profile is disarmed before that state closes (stop, __gc) */
#define LP_G32(a) (*(volatile int32_t *)(uintptr_t)(a))
#define LP_G64(a) (*(volatile uint64_t *)(uintptr_t)(a))
static int lp_cf_ok;               /* lua_State.cframe (+80) passed the arm's check */
#define LP_L_CFRAME 80
#define LP_CFRAME_SPAN (8u << 20)  /* a C function's stack below the VM's frame */

/* with vmstate ~LJ_VMST_C: whether the interrupted code runs below the
 * VM's C frame (a lua_CFunction the interpreter called, or what it calls),
 * rather than outside Lua (the host's own code after lua_resume returned
 * or yielded: a coroutine out of the VM has cframe NULL). Reads cur_L and
 * then its base and cframe; *lb gets the base. -1: unknown. */
static int lp_in_vm(uint64_t sp, uint64_t *lb)
{
  uint64_t l, w[(LP_L_CFRAME + 8) / 8], cf;
  l = LP_G64(lp_cur_l);
  if (!l || !lp_read(l, w, sizeof w)) return -1;   /* unknown */
  *lb = w[4];
  cf = w[LP_L_CFRAME / 8] & ~(uint64_t)3;   /* cframe_raw: the low bits are flags */
  return cf != 0 && sp <= cf && cf - sp < LP_CFRAME_SPAN;
}

static int lp_ins(uint64_t pc, uint32_t *ins)
{
  unsigned h = (unsigned)((pc >> 2) ^ (pc >> 12)) % LP_ICACHE;
  if (lp_icache[h].pc == pc) { *ins = lp_icache[h].ins; return 1; }
  if (!lp_read(pc - 4, ins, 4)) return 0;
  lp_icache[h].pc = pc;
  lp_icache[h].ins = *ins;
  return 1;
}

static uint64_t lp_base_fpc;      /* set by lp_walk: pc of the function at BASE */
static uint64_t lp_base_fn;       /* and the function itself */

/* the GCfunc in the slot at base-16 (tagged; GC64 keeps 47 address bits),
 * or 0 when the word does not look like one: GCHeader's gct (+9) must be
 * ~LJ_TFUNC (8); its ffid (+10) is 0 for a Lua function, 1 for a C
 * function, more for a builtin */
static uint64_t lp_fa_base, lp_fa_fn, lp_fa_pc;   /* the last answer, this signal only */
static int lp_fa_ffid;

static uint64_t lp_func_at(uint64_t base, int *ffid, uint64_t *pc)
{
  uint64_t fv, fn, w[5];
  uint8_t hdr[2];
  if (base && base == lp_fa_base) { *ffid = lp_fa_ffid; *pc = lp_fa_pc; return lp_fa_fn; }
  if (base < 16 || !lp_slot(base - 16, &fv)) return 0;
  fn = fv & (((uint64_t)1 << 47) - 1);
  /* one read: GCHeader's gct and ffid, and GCfuncL.pc at +32 */
  if (fn < 0x10000 || (fn & 7) || !lp_read(fn, w, sizeof w)) return 0;
  memcpy(hdr, (const char *)w + 9, 2);
  if (hdr[0] != 8) return 0;
  *ffid = hdr[1];
  *pc = w[4];
  lp_fa_base = base; lp_fa_fn = fn; lp_fa_ffid = hdr[1]; lp_fa_pc = w[4];
  return fn;
}

static uint32_t lp_walk(uint64_t base, uint64_t *pcs, int strict)
{
  uint64_t start = base;
  uint32_t n = 0;
  uint64_t link;
  lp_cbeg = lp_cend = 0;
  while (n < LP_DEPTH && base >= 16 && (base & 7) == 0 && lp_slot(base - 8, &link)) {
    if ((link & 3) == 0) {              /* Lua frame: link = caller's PC */
      uint32_t ins;
      if (!lp_ins(link, &ins) || !lp_callop[ins & 0xff]) break;
      pcs[n++] = link;
      base -= (2 + ((ins >> 8) & 0xff)) * 8;
    } else {                            /* C, continuation, vararg, pcall */
      uint64_t delta = link & ~(uint64_t)7;
      if ((strict && n == 0) || delta == 0 || delta > base) break;
      base -= delta;
    }
  }
  /* the frame's function slot (BASE-16, a tagged GCfunc pointer) and its
   * GCfuncL.pc at +32: the Lua side checks it against known bytecode, or
   * (a builtin, a C function) the function's address against the library
   * tables' */
  lp_base_fpc = lp_base_fn = 0;
  if (n > 0) {
    int ffid;
    uint64_t pc, fn = lp_func_at(start, &ffid, &pc);
    if (fn) {
      lp_base_fpc = pc;
      lp_base_fn = fn;
    }
  }
  return n;
}

static void lp_handler(int sig, siginfo_t *si, void *ctx)
{
  int saved = errno;
  (void)si;
  if (sig == SIGIO) {                  /* see l_arm: a signal the kernel could not queue */
    lp_throttled = lp_throttled + 1;
    return;
  }
  if (lp_on) {
    /* the queued copies (blocked while this handler runs) are dropped */
    sigset_t one;
    siginfo_t info;
    struct timespec zero = { 0, 0 }, now;
    sigemptyset(&one);
    sigaddset(&one, lp_signo);
    while (sigtimedwait(&one, &info, &zero) == lp_signo) lp_throttled = lp_throttled + 1;
    uint64_t t;
    clock_gettime(CLOCK_MONOTONIC, &now);
    t = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
    if (t < lp_quiet_until) {
      lp_throttled = lp_throttled + 1;
      errno = saved;
      return;
    }
    /* LuaJIT's hook flag and dispatch table out of step (the profiler of
     * jit.profile or -jp, with this profile's registry callbacks): a
     * compiled loop could spin in lj_trace_exit, a callback in the hook
     * (csrc/ljhook.c) */
    pe_ljhook_repair();
  }
  if (lp_on && lp_head - lp_tail < LP_SLOTS) {
    ucontext_t *uc = ctx;
    lp_ent *e = &lp_ring[lp_head % LP_SLOTS];
    struct timespec ts;
    uint32_t n;
    uint64_t jb = 0, lb = 0;
    int only = lp_jb_mode == 2 || lp_lb_mode == 2, vs, in_vm = -1;
    n = 0;
    lp_fa_base = 0;
    e->out = 0;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    e->time = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    e->ip = (uint64_t)uc->uc_mcontext.gregs[REG_RIP];
    e->bx = (uint64_t)uc->uc_mcontext.gregs[REG_RBX];
    e->dx = (uint64_t)uc->uc_mcontext.gregs[REG_RDX];
    e->sp = (uint64_t)uc->uc_mcontext.gregs[REG_RSP];
    e->vms = LP_NO_VMS;
    if (lp_vmstate) e->vms = LP_G32(lp_vmstate);
    vs = lp_vs_mode && e->vms != LP_NO_VMS;
    /* ~LJ_VMST_C outside the VM's C frame: the host's own code (nginx's
     * event loop), no Lua stack to walk; cur_L->base there is left from the
     * last call and would name a stale caller */
    if (vs && e->vms == LP_VMST_C && lp_cf_ok && lp_cur_l) {
      in_vm = lp_in_vm(e->sp, &lb);
      if (in_vm == 0) { e->out = 1; goto done; }
    }
    n = only ? 0 : lp_walk(e->dx, e->pcs, 0);
    if (n == 0 && lp_jit_base) {
      /* whether a trace runs: G->vmstate holds its number (>= 0) where
       * the self-test found vmstate, else G->jit_base is not NULL */
      int in_trace;
      jb = LP_G64(lp_jit_base);
      in_trace = vs ? e->vms >= 0 : jb != 0;
      if (in_trace && jb > 1 && lp_lb_mode != 2) n = lp_walk(jb, e->pcs, 1);
    }
    if (n == 0 && lp_jit_base && lp_cur_l && lp_lb_mode && lp_jb_mode != 2
        && (vs ? e->vms < 0 : jb == 0)) {
      /* outside traces, a C function the interpreter called (BC_FUNCC),
       * or a C helper a builtin calls (tostring's number formatting, with
       * vmstate still INTERP), runs with its frame's BASE stored in
       * cur_L->base (lua_State +32) and rdx clobbered. The frame must hold
       * a C function or builtin, so a base left over from an earlier call
       * rarely passes */
      uint64_t l, pc;
      int ffid;
      lp_cbeg = lp_cend = 0;
      if (in_vm < 0 && !((l = LP_G64(lp_cur_l)) && lp_read(l + 32, &lb, 8))) lb = 0;
      if (lb && lp_func_at(lb, &ffid, &pc) && ffid != 0)
        n = lp_walk(lb, e->pcs, 1);
    }
    /* rdx is not BASE (C called from a trace clobbers it): try the words
     * near sp, where a trace keeps BASE spilled. Only while a trace runs
     * (or its GC step), when vmstate tells */
    if (n == 0 && !only && (!vs || e->vms >= 0 || e->vms == LP_VMST_GC)) {
      uint64_t words[48];
      if (lp_read(e->sp, words, sizeof words)) {
        int i, tries = 0;
        for (i = 0; i < 48 && n == 0 && tries < 6; i++) {
          uint64_t w = words[i];
          if ((w & 7) || w < 0x10000 || w >= ((uint64_t)1 << 47)) continue;
          /* once a walk has worked, only words within 16 MiB of its BASE
           * (the Lua stacks live there) are worth a read */
          if (lp_last_base && (w > lp_last_base + (16u << 20) || w + (16u << 20) < lp_last_base)) continue;
          tries++;
          {
            /* one 8-byte read before a whole walk: the link must be a PC
             * after a call */
            uint64_t link;
            uint32_t ins;
            if (!lp_read(w - 8, &link, 8) || (link & 3) || link < 0x10000
                || !lp_ins(link, &ins) || !lp_callop[ins & 0xff]) continue;
          }
          n = lp_walk(w, e->pcs, 1);   /* a guess: its first link must be Lua */
          if (n > 0) lp_last_base = w;
        }
      }
    }
  done:
    e->n = n;
    e->fpc = n > 0 ? lp_base_fpc : 0;
    e->fn = n > 0 ? lp_base_fn : 0;
    if (n > 0 && !lp_last_base) lp_last_base = e->dx;
    {
      struct timespec t2;
      clock_gettime(CLOCK_MONOTONIC, &t2);
      uint64_t end = (uint64_t)t2.tv_sec * 1000000000u + (uint64_t)t2.tv_nsec;
      lp_ns = lp_ns + (end - e->time);
      lp_quiet_until = end + 3 * (end - e->time);
    }
    __atomic_signal_fence(__ATOMIC_RELEASE);
    lp_head = lp_head + 1;
  } else if (lp_on) {
    lp_dropped = lp_dropped + 1;
  } else {
    lp_late = lp_late + 1;              /* queued before disarm */
  }
  errno = saved;
}
#endif

/* &G->jit_base of LuaJIT 2.1 GC64, found and checked here, or 0.
 * lua_State: glref at +16, base at +32, top at +40 (checked against this
 * call's own arguments). global_State: cur_L, then jit_base; cur_L is the
 * last word equal to L in the first 4 KiB (mainthref comes earlier), and
 * jit_base is NULL while this C function runs. */
static uint64_t lp_find_jit_base(lua_State *L)
{
  uint64_t lw[6], g, words[512], base, top;
  double d;
  int k, found = -1;
  if (!lp_read((uint64_t)(uintptr_t)L, lw, sizeof lw)) return 0;
  base = lw[4];
  top = lw[5];
  if (top < base || (top - base) / 8 != (uint64_t)lua_gettop(L)) return 0;
  if (!lp_read(base, &d, 8) || d != (double)lua_tonumber(L, 1)) return 0;
  g = lw[2];
  if (!g || !lp_read(g, words, sizeof words)) return 0;
  for (k = 0; k < 511; k++)
    if (words[k] == (uint64_t)(uintptr_t)L && words[k + 1] == 0) found = k;
  return found < 0 ? 0 : g + (uint64_t)(found + 1) * 8;
}

/* &G->vmstate, or 0: the one int32 in global_State before cur_L that holds
 * ~LJ_VMST_C while this C function runs (the Lua side checks it: a trace
 * number while a trace runs) */
static uint64_t lp_find_vmstate(uint64_t cur_l)
{
  int32_t w[1024];
  uint64_t l, g;
  int k, found = -1, n = 0;
  if (!cur_l || !lp_read(cur_l, &l, 8) || !lp_read(l + 16, &g, 8)) return 0;   /* L->glref */
  if (cur_l <= g || cur_l - g > sizeof w) return 0;
  if (!lp_read(g, w, (size_t)(cur_l - g))) return 0;
  for (k = 0; k < (int)((cur_l - g) / 4); k++)
    if (w[k] == LP_VMST_C) { found = k; n++; }
  return n == 1 ? g + (uint64_t)found * 4 : 0;
}

/* _private.luaprof_arm(fd, signo|nil, callops [, jit_base_mode [, lbase_mode
 * [, vmstate_mode]]]):
 * signals on each sample of fd to this thread; callops is a string of the
 * opcode bytes a return PC follows; jit_base_mode 0 never walks from
 * G->jit_base, 1 (default) when rdx is not BASE, 2 only from it (the
 * self-test); lbase_mode likewise for cur_L->base outside traces (default
 * 0); vmstate_mode 1 lets G->vmstate say whether a trace or a C function
 * runs (default 0: G->jit_base being NULL says no trace runs) */
static int l_arm(lua_State *L)
{
#if defined(__x86_64__)
  int fd = pe_check_int(L, 1, "fd", 0, 0x7fffffff);
  int signo = lua_isnoneornil(L, 2) ? SIGRTMIN + 3 : pe_check_int(L, 2, "signo", 1, SIGRTMAX);
  size_t nops, i;
  const char *ops = luaL_checklstring(L, 3, &nops);
  /* a profile dropped without stop(): its event's fd is closed by now */
  if (lp_on && !pe_fd_is(lp_fd, lp_id)) lp_on = 0;
  if (lp_on) {
    return pe_push_syserror(L, "luaprof_arm", "profile", EBUSY,
                            "another profile is running on this process");
  }
  lp_jb_mode = lua_isnoneornil(L, 4) ? 1 : pe_check_int(L, 4, "jit_base_mode", 0, 2);
  lp_lb_mode = lua_isnoneornil(L, 5) ? 0 : pe_check_int(L, 5, "lbase_mode", 0, 2);
  lp_pid = getpid();                 /* lp_read needs it from here on */
  pe_ljhook_find(L);                 /* (when not found, no repair: as before) */
  lp_jit_base = lp_find_jit_base(L);
  lp_cur_l = lp_jit_base ? lp_jit_base - 8 : 0;
  lp_vmstate = lp_find_vmstate(lp_cur_l);
  {
    /* this C function runs below the VM's C frame, with cur_L->base its
     * own BASE: lp_in_vm must say so, or it is not used */
    uint64_t lb = 0, mine = 1;
    volatile int here = 0;
    lp_cf_ok = lp_cur_l && lp_in_vm((uint64_t)(uintptr_t)&here, &lb) == 1
               && lp_read((uint64_t)(uintptr_t)L + 32, &mine, 8) && lb == mine;
  }
  lp_vs_mode = lua_isnoneornil(L, 6) ? 0 : pe_check_int(L, 6, "vmstate_mode", 0, 1);
  if (!lp_jb_mode) lp_jit_base = 0;
  memset(lp_callop, 0, sizeof lp_callop);
  memset(lp_icache, 0, sizeof lp_icache);
  lp_last_base = 0;
  for (i = 0; i < nops; i++) lp_callop[(uint8_t)ops[i]] = 1;
  lp_head = lp_tail = lp_dropped = 0;
  lp_throttled = lp_quiet_until = 0;
  lp_signo = signo;
  /* SIGIO (a signal the kernel could not queue) too: the handler counts
   * it as a sample without a walk */
  if (pe_sig_install(signo, lp_handler, lp_handler, NULL) < 0)
    return pe_push_syserror(L, "luaprof_arm", "sigaction", errno, NULL);
  if (pe_sig_route(fd, signo) < 0)
    return pe_push_syserror(L, "luaprof_arm", "fcntl", errno, NULL);
  lp_fd = fd;
  lp_id = pe_fd_id(fd);
  lp_on = 1;
  lua_pushboolean(L, 1);
  return 1;
#else
  return pe_push_syserror(L, "luaprof_arm", "profile", EOPNOTSUPP,
                          "the LuaJIT stack walk is x86-64 only");
#endif
}

/* _private.luaprof_disarm(fd): no more signals from fd; false when fd is not
 * the armed event (then nothing changes) */
static int l_disarm(lua_State *L)
{
  int fd = pe_check_int(L, 1, "fd", 0, 0x7fffffff);
  if (!lp_on || fd != lp_fd || !pe_fd_is(fd, lp_id)) {
    lua_pushboolean(L, 0);
    return 1;
  }
  pe_sig_unroute(fd);
  /* the handler stays installed, doing nothing: a signal already queued
   * must not meet the default action (which ends the process) */
  lp_on = 0;
  lp_fd = -1;
  lua_pushboolean(L, 1);
  return 1;
}

/* _private.luaprof_read() -> array of {time, ip, bx, fpc, fn (with a walk), vms, out (outside
 * Lua), pcs = {...}},
 * dropped (ring full), late (signals that came while disarmed), and the
 * nanoseconds spent walking in the handler so far */
static int l_read(lua_State *L)
{
  uint32_t head, i, k = 0;
  __atomic_signal_fence(__ATOMIC_ACQUIRE);
  head = lp_head;
  lua_createtable(L, (int)(head - lp_tail), 0);
  for (i = lp_tail; i != head; i++) {
    const lp_ent *e = &lp_ring[i % LP_SLOTS];
    uint32_t j;
    lua_createtable(L, 0, 7);
    pe_push_u64(L, e->time); lua_setfield(L, -2, "time");
    pe_push_u64(L, e->ip); lua_setfield(L, -2, "ip");
    pe_push_u64(L, e->bx); lua_setfield(L, -2, "bx");
    if (e->n > 0) {     /* a walk: its BASE frame's function */
      pe_push_u64(L, e->fpc); lua_setfield(L, -2, "fpc");
      pe_push_u64(L, e->fn); lua_setfield(L, -2, "fn");
    }
    if (e->vms != LP_NO_VMS) { lua_pushinteger(L, e->vms); lua_setfield(L, -2, "vms"); }
    if (e->out) { lua_pushboolean(L, 1); lua_setfield(L, -2, "out"); }
    lua_createtable(L, (int)e->n, 0);
    for (j = 0; j < e->n; j++) {
      pe_push_u64(L, e->pcs[j]);
      lua_rawseti(L, -2, (int)j + 1);
    }
    lua_setfield(L, -2, "pcs");
    lua_rawseti(L, -2, (int)++k);
  }
  __atomic_signal_fence(__ATOMIC_RELEASE);
  lp_tail = head;
  lua_pushinteger(L, lp_dropped);
  lua_pushinteger(L, lp_late);
  pe_push_u64(L, lp_ns);
  pe_push_u64(L, lp_jit_base);
  pe_push_u64(L, lp_vmstate);
  pe_push_u64(L, lp_throttled);
  return 7;
}

/* the three functions go to core._private (lua/perf_event/profile/, not API) */
void pe_open_luaprof(lua_State *L)
{
  static const luaL_Reg fns[] = {
    {"luaprof_arm", l_arm}, {"luaprof_disarm", l_disarm}, {"luaprof_read", l_read}, {NULL, NULL}
  };
  pe_push_private(L, lua_gettop(L));
  pe_setfuncs(L, fns);
  lua_pop(L, 1);
}
