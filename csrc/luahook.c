/*
 * luahook.c - Lua stacks for perf_event.profile on PUC Lua (5.1 to 5.4).
 *
 * The perf_event decides when a sample is taken; this file captures the
 * Lua stack at the next VM hook point after it.  The hook is a count hook
 * (LUA_MASKCOUNT) on the calling lua_State, set as described below.  Per
 * call it only compares the ring's data_head (in the
 * event's mmap page) with the value it last saw: when the kernel has
 * written a record since, it walks the stack with lua_getstack and
 * lua_getinfo("Sl"; "n" for C functions) into a fixed buffer, with the
 * CLOCK_MONOTONIC time, so that the Lua side pairs each sample with the
 * first capture taken after it.  The hook allocates nothing: source names
 * are copied once into a string pool, and a frame is four integers.
 *
 * In both modes the event also signals this thread on each sample
 * (O_ASYNC, F_SETSIG, F_SETOWN_EX), and the handler sets a count hook of
 * count 1 on the started thread, as lua.c's SIGINT handler does
 * (lua_sethook is meant to be callable from a signal handler): the capture
 * is at that thread's next instruction, also after a long C call.  Mode
 * "signal" sets no other hook, because on Lua 5.4 any hook mask sends
 * every instruction through luaG_traceexec; the hook removes itself after
 * the capture.  Mode "count" also keeps a count hook of `count`
 * instructions set, which coroutines created meanwhile inherit: a sample
 * taken while one runs is captured there within `count` instructions.
 *
 * One hooked profile per process (the state is static).  The event's
 * userdata and the hooked thread are kept alive by registry references
 * until luahook_stop, so the mmap page the hook reads cannot be unmapped
 * under it (a closed event has page == NULL, and the hook checks).
 * Coroutines created while the hook is set inherit it; after stop, such a
 * coroutine's hook finds the profile off and removes itself.
 */
#define _GNU_SOURCE
#include "pe_core.h"
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define LH_POOL (64 * 1024)     /* bytes of copied source and C names */
#define LH_STRS 2048            /* interned strings (power of two) */
#define LH_STRMAX 240           /* longer sources are cut */

typedef struct lh_frame {
  int32_t src;                  /* interned index: the source, or the C name */
  int32_t line;                 /* currentline; -1 for a C function */
  int32_t ld, lld;              /* linedefined, lastlinedefined (-1: C) */
  uint64_t fn;                  /* a C function's lua_topointer (0: Lua) */
} lh_frame;

typedef struct lh_cap {
  uint64_t time;                /* CLOCK_MONOTONIC ns */
  uint64_t head;                /* data_head seen */
  uint32_t n;                   /* frames, innermost first */
  uint32_t more;                /* 1 when the stack was deeper than depth */
  uint32_t foreign;             /* 1: a signal since the last capture found
                                 * the program's own hook set */
  uint64_t foff;                /* its frames: frames[foff % nframes ...] */
} lh_cap;

typedef struct lh_str {
  const void *ptr;              /* the string's address in the Lua state */
  uint32_t off, len;            /* the copy in pool */
} lh_str;

static struct {
  volatile int on;
  int signal_mode;              /* 1: no hook but the handler's one-shot */
  int signo, fd;
  int count;                    /* mode "count": the standing hook's count */
  volatile int boosted;         /* the handler set count 1 on the started thread */
  pe_event *ev;                 /* pinned by ev_ref */
  lua_State *L;                 /* pinned by th_ref */
  int ev_ref, th_ref;
  uint64_t last_head;
  lh_cap *caps;
  lh_frame *frames;             /* a ring of nframes: each capture takes n */
  uint64_t fhead, ftail;        /* frames written / read (ring indices) */
  uint32_t slots, depth, nframes;
  uint32_t head, tail;          /* captures written / read */
  uint32_t dropped;             /* captures lost to a full buffer */
  uint64_t ncalls;              /* hook calls */
  uint64_t ns;                  /* time spent capturing */
  uint64_t quiet_until;         /* no capture before (captures take <= 1/4) */
  uint64_t shed;                /* hook calls that skipped their capture */
  volatile uint64_t nsig, nsigio, nforeign;   /* signals taken; with a hook of the program's */
  volatile int foreign;         /* since the last capture */
  char pool[LH_POOL];
  uint32_t pool_used;
  lh_str strs[LH_STRS];         /* index 0: "?" */
  uint32_t nstrs;
  uint32_t slot_of[LH_STRS * 2];/* pointer hash -> index + 1 */
} lh = { .ev_ref = LUA_NOREF, .th_ref = LUA_NOREF };

static uint64_t lh_now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void lh_strs_reset(void)
{
  memset(lh.slot_of, 0, sizeof lh.slot_of);
  memcpy(lh.pool, "?", 2);
  lh.pool_used = 2;
  lh.strs[0].ptr = NULL;
  lh.strs[0].off = 0;
  lh.strs[0].len = 1;
  lh.nstrs = 1;
}

/* the index of string s (copied on first sight); 0 when the pool is full.
 * The pointer finds the entry; its copy must still equal s, because a
 * freed string's address can be reused by another one. */
static int32_t lh_intern_key(const void *key, const char *s, size_t len)
{
  if (len > LH_STRMAX) len = LH_STRMAX;
  uint32_t h = (uint32_t)(((uintptr_t)key >> 3) * 2654435761u) & (LH_STRS * 2 - 1);
  for (;;) {
    uint32_t i = lh.slot_of[h];
    if (i == 0) break;
    lh_str *e = &lh.strs[i - 1];
    if (e->ptr == key) {
      if (e->len == len && memcmp(lh.pool + e->off, s, len) == 0) return (int32_t)(i - 1);
      break;                     /* reused address: a new entry below */
    }
    h = (h + 1) & (LH_STRS * 2 - 1);
  }
  if (lh.nstrs >= LH_STRS || lh.pool_used + len + 1 > LH_POOL) return 0;
  lh_str *e = &lh.strs[lh.nstrs];
  e->ptr = key;
  e->off = lh.pool_used;
  e->len = (uint32_t)len;
  memcpy(lh.pool + e->off, s, len);
  lh.pool[e->off + len] = '\0';
  lh.pool_used += (uint32_t)len + 1;
  lh.slot_of[h] = ++lh.nstrs;
  return (int32_t)(lh.nstrs - 1);
}

static int32_t lh_intern(const char *s)
{
  return lh_intern_key(s, s, strnlen(s, LH_STRMAX));
}

/* ------------------------------------------------ 5.4: the popped leaf
 * Lua 5.4's luaV_execute keeps `trap` in a local, refreshed only at calls,
 * returns, backward jumps and the like ("updatetrap" points), so the hook a
 * signal sets in a function with no loop and no call fires only once that
 * function returned, in its caller: the sample would be charged to the
 * caller.  So the handler also notes which Lua function was running (L->ci,
 * its func slot's LClosure, that closure's Proto, and the ci's savedpc),
 * read with process_vm_readv: the handler interrupts the VM anywhere, a
 * torn pointer gives EFAULT, never a fault.  When the capture finds that
 * CallInfo gone, but as the one just above its top (ci->next of the
 * captured top: a frame popped since the signal, and nothing called
 * since), the noted function is added back as the leaf, at the line of its
 * savedpc (at or before where it was; its linedefined when unusable).
 * The offsets are those of 5.4.0-5.4.6 on LP64; l_start checks them
 * against lua_getstack/lua_getinfo on its own caller before use, and the
 * profile goes without this when they do not match (5.1's VM reads the
 * hook mask at every instruction, so it does not need this). */
#if LUA_VERSION_NUM == 504 && UINTPTR_MAX == UINT64_MAX
#define LF_ON 1
enum {
  LF_L_CI = 32,                 /* lua_State.ci */
  LF_CI_FUNC = 0, LF_CI_PREV = 16, LF_CI_NEXT = 24, LF_CI_SAVEDPC = 32,
  LF_TV_TT = 8,                 /* TValue.tt_ */
  LF_TAG_LCL = 0x46,            /* ctb(LUA_VLCL) */
  LF_TAG_LCF = 0x16,            /* LUA_VLCF: a light C function */
  LF_TAG_CCL = 0x66,            /* ctb(LUA_VCCL): a C closure */
  LF_GC_TT = 8,                 /* GCObject.tt */
  LF_VLCL = 6, LF_VPROTO = 10, LF_VSHRSTR = 4, LF_VLNGSTR = 0x14,
  LF_LCL_P = 24,                /* LClosure.p */
  LF_P_SIZECODE = 24, LF_P_SIZEABS = 40, LF_P_LD = 44, LF_P_LLD = 48,
  LF_P_CODE = 64, LF_P_LINEINFO = 88, LF_P_ABS = 96, LF_P_SOURCE = 112,
  LF_P_SIZE = 120,
  LF_TS_SHRLEN = 11, LF_TS_LNGLEN = 16, LF_TS_CONTENTS = 24,
  LF_MAXIWTHABS = 128
};
#endif

static struct {
  int ok;                       /* the offsets passed the self-test */
  pid_t pid;
  volatile uintptr_t ci, proto, savedpc;   /* noted at the last signal */
  volatile uintptr_t cfn;       /* or the C function running there (lua_topointer's) */
  uint64_t added;               /* leaf frames added back */
} lf;

#ifdef LF_ON
static int lf_read(uintptr_t addr, void *out, size_t n) { return pe_peek(lf.pid, addr, out, n); }

static uint64_t lf_u64(const unsigned char *b, int off)
{
  uint64_t v;
  memcpy(&v, b + off, 8);
  return v;
}

static int32_t lf_i32(const unsigned char *b, int off)
{
  int32_t v;
  memcpy(&v, b + off, 4);
  return v;
}

/* the Proto of the Lua function the CallInfo at ci runs (0 if none), and
 * its savedpc */
static uintptr_t lf_ci_proto(uintptr_t ci, uintptr_t *savedpc)
{
  unsigned char w[40], tv[16], gc[LF_LCL_P + 8];
  if (!lf_read(ci, w, sizeof w)) return 0;
  if (!lf_read((uintptr_t)lf_u64(w, LF_CI_FUNC), tv, sizeof tv) || tv[LF_TV_TT] != LF_TAG_LCL) return 0;
  if (!lf_read((uintptr_t)lf_u64(tv, 0), gc, sizeof gc) || gc[LF_GC_TT] != LF_VLCL) return 0;
  *savedpc = (uintptr_t)lf_u64(w, LF_CI_SAVEDPC);
  return (uintptr_t)lf_u64(gc, LF_LCL_P);
}

/* proto's frame at savedpc: 1, or 0 when it cannot be read.  The line is
 * luaG_getfuncline's (the nearest absolute line, then the deltas); the
 * function's linedefined when savedpc or the line tables do not serve */
static int lf_frame(uintptr_t proto, uintptr_t savedpc, lh_frame *f)
{
  unsigned char p[LF_P_SIZE], ts[LF_TS_CONTENTS];
  char src[LH_STRMAX];
  if (!lf_read(proto, p, sizeof p) || p[LF_GC_TT] != LF_VPROTO) return 0;
  int32_t ld = lf_i32(p, LF_P_LD), lld = lf_i32(p, LF_P_LLD), sizecode = lf_i32(p, LF_P_SIZECODE);
  uintptr_t sp = (uintptr_t)lf_u64(p, LF_P_SOURCE);
  if (!lf_read(sp, ts, sizeof ts) || (ts[LF_GC_TT] != LF_VSHRSTR && ts[LF_GC_TT] != LF_VLNGSTR)) return 0;
  size_t len = ts[LF_GC_TT] == LF_VSHRSTR ? ts[LF_TS_SHRLEN] : (size_t)lf_u64(ts, LF_TS_LNGLEN);
  if (len > LH_STRMAX) len = LH_STRMAX;
  if (!lf_read(sp + LF_TS_CONTENTS, src, len)) return 0;
  int32_t line = ld;
  uintptr_t code = (uintptr_t)lf_u64(p, LF_P_CODE), li = (uintptr_t)lf_u64(p, LF_P_LINEINFO);
  int64_t pc = savedpc >= code ? (int64_t)((savedpc - code) / 4) - 1 : -2;
  if (li && pc >= 0 && pc < sizecode) {
    int32_t nabs = lf_i32(p, LF_P_SIZEABS), base = ld, basepc = -1;
    int ok = 1;
    if (nabs > 0) {
      int32_t a[2 * 16];
      int32_t i = (int32_t)(pc / LF_MAXIWTHABS) - 1, n;
      if (i < 0) i = 0;
      n = nabs - i < 16 ? nabs - i : 16;
      if (!lf_read((uintptr_t)lf_u64(p, LF_P_ABS) + (uintptr_t)i * 8, a, (size_t)n * 8)) ok = 0;
      else if (pc >= a[0]) {
        int k = 0;
        while (k + 1 < n && pc >= a[2 * (k + 1)]) k++;
        basepc = a[2 * k];
        base = a[2 * k + 1];
      } else if (i > 0) ok = 0;
    }
    signed char d[256];
    if (ok && pc - basepc <= (int64_t)sizeof d && pc > basepc) {
      if (lf_read(li + (uintptr_t)(basepc + 1), d, (size_t)(pc - basepc))) {
        for (int64_t k = 0; k < pc - basepc; k++) base += d[k];
        line = base;
      }
    } else if (ok && pc == basepc) line = base;
  }
  if (line < ld || (lld >= ld && line > lld)) line = ld;
  f->src = lh_intern_key((const char *)(sp + LF_TS_CONTENTS), src, len);
  f->fn = 0;
  f->line = line;
  f->ld = ld;
  f->lld = lld;
  return 1;
}

/* the C function the CallInfo at ci runs, as lua_topointer gives it (the
 * function pointer of a light C function, the CClosure's address), or 0 */
static uintptr_t lf_ci_cfn(uintptr_t ci)
{
  unsigned char w[8], tv[16];
  if (!lf_read(ci + LF_CI_FUNC, w, sizeof w) || !lf_read((uintptr_t)lf_u64(w, 0), tv, sizeof tv)) return 0;
  return tv[LF_TV_TT] == LF_TAG_LCF || tv[LF_TV_TT] == LF_TAG_CCL ? (uintptr_t)lf_u64(tv, 0) : 0;
}

/* in the handler: which Lua function, or else which C function, the
 * started thread runs */
static void lf_note(lua_State *L)
{
  uintptr_t ci, pc = 0, proto;
  lf.proto = 0;
  lf.cfn = 0;
  if (!lf.ok) return;
  memcpy(&ci, (const char *)L + LF_L_CI, sizeof ci);
  proto = lf_ci_proto(ci, &pc);
  lf.ci = ci;
  lf.savedpc = pc;
  lf.proto = proto;
  if (!proto) lf.cfn = lf_ci_cfn(ci);
}

/* in the capture of the started thread, frames f[0..n) innermost first:
 * adds the noted function back when its frame was popped since the signal
 * (a C function too: the hook a signal sets during a C call fires once it
 * returned, so its frame is never on the captured stack; it comes back as
 * a C frame with its address, which the Lua side names from
 * package.loaded's tables or leaves out) */
static uint32_t lf_fix(lua_State *L, lh_frame *f, uint32_t n, lh_cap *c)
{
  lua_Debug d;
  uintptr_t proto = lf.proto, cfn = lf.cfn, next;
  lf.proto = 0;
  lf.cfn = 0;
  if ((!proto && !cfn) || !lua_getstack(L, 0, &d) || (uintptr_t)d.i_ci == lf.ci) return n;
  memcpy(&next, (const char *)d.i_ci + LF_CI_NEXT, sizeof next);
  if (next != lf.ci) return n;
  lh_frame nf;
  if (proto) {
    if (!lf_frame(proto, lf.savedpc, &nf)) return n;
  } else {
    nf.src = 0;
    nf.line = nf.ld = nf.lld = -1;
    nf.fn = cfn;
  }
  /* a full capture loses the innermost frame of its outer part */
  uint32_t shift = n == lh.depth ? (n - 1) / 2 : n;
  memmove(f + 1, f, shift * sizeof *f);
  f[0] = nf;
  lf.added++;
  if (n == lh.depth) { c->more = 1; return n; }
  return n + 1;
}

/* l_start's check of the offsets on its own caller (a Lua function): NULL,
 * or what did not match */
static const char *lf_check(lua_State *L)
{
  lua_Debug a0, a1;
  uintptr_t ci, w[4], pc = 0, proto;
  lh_frame fr;
  if (!lua_getstack(L, 0, &a0) || !lua_getstack(L, 1, &a1) || !lua_getinfo(L, "Sl", &a1)
      || a1.what[0] != 'L')
    return "luahook_start was not called from a Lua function";
  if (!lf_read((uintptr_t)L + LF_L_CI, &ci, sizeof ci) || ci != (uintptr_t)a0.i_ci)
    return "lua_State.ci is not where 5.4.0-5.4.6 have it";
  if (!lf_read(ci, w, sizeof w) || w[LF_CI_PREV / 8] != (uintptr_t)a1.i_ci)
    return "CallInfo.previous is not where 5.4.0-5.4.6 have it";
  if (!lf_read((uintptr_t)a1.i_ci, w, sizeof w) || w[LF_CI_NEXT / 8] != ci)
    return "CallInfo.next is not where 5.4.0-5.4.6 have it";
  proto = lf_ci_proto((uintptr_t)a1.i_ci, &pc);
  if (!proto) return "the caller's CallInfo.func does not lead to its LClosure and Proto";
  lh_strs_reset();
  if (!lf_frame(proto, pc, &fr)) return "the caller's Proto could not be read";
  if (fr.ld != a1.linedefined || fr.lld != a1.lastlinedefined)
    return "Proto.linedefined is not where 5.4.0-5.4.6 have it";
  if (strcmp(lh.pool + lh.strs[fr.src].off, a1.source) != 0)
    return "Proto.source is not where 5.4.0-5.4.6 have it";
  if (fr.line != a1.currentline)
    return "the line from CallInfo.savedpc and Proto's line tables differs from currentline";
  lua_getinfo(L, "f", &a0);              /* luahook_start itself: a C function */
  uintptr_t self = (uintptr_t)lua_topointer(L, -1);
  lua_pop(L, 1);
  if (lf_ci_cfn(ci) != self) return "a C function's CallInfo.func is not where 5.4.0-5.4.6 have it";
  return NULL;
}
#elif LUA_VERSION_NUM == 501 && UINTPTR_MAX == UINT64_MAX && !defined(LUA_JROOT)  /* not LuaJIT */
/* 5.1: its VM reads the hook mask at every instruction, so a popped Lua
 * function needs nothing; a C function running at the signal has
 * returned by the capture (the hook fires at the next Lua instruction),
 * so the handler notes it: L->ci, its func slot, a Closure with isC set
 * (lua_topointer's address).  The capture adds it back as a C frame when
 * that CallInfo is the one just above the captured top (base_ci[i_ci + 1]
 * of level 0).  The offsets are 5.1.5's on LP64; l_start checks them on
 * itself. */
#define LF_ON51 1
enum {
  LF_L_CI = 40, LF_L_BASE_CI = 80,   /* lua_State.ci, .base_ci */
  LF_CI_FUNC = 8, LF_CI_SIZE = 40,   /* CallInfo.func, sizeof(CallInfo) */
  LF_TV_TT = 8, LF_TFUNCTION = 6,    /* TValue.tt (int) */
  LF_CL_ISC = 10                     /* Closure.c.isC */
};

static int lf_read(uintptr_t addr, void *out, size_t n) { return pe_peek(lf.pid, addr, out, n); }

static uintptr_t lf_ci_cfn(uintptr_t ci)
{
  uintptr_t func, cl;
  unsigned char tv[16], hdr[16];
  int tt;
  if (!lf_read(ci + LF_CI_FUNC, &func, sizeof func) || !lf_read(func, tv, sizeof tv)) return 0;
  memcpy(&tt, tv + LF_TV_TT, sizeof tt);
  memcpy(&cl, tv, sizeof cl);
  if (tt != LF_TFUNCTION || !lf_read(cl, hdr, sizeof hdr) || hdr[LF_CL_ISC] != 1) return 0;
  return cl;
}

static void lf_note(lua_State *L)
{
  uintptr_t ci;
  lf.cfn = 0;
  if (!lf.ok || !lf_read((uintptr_t)L + LF_L_CI, &ci, sizeof ci)) return;
  lf.ci = ci;
  lf.cfn = lf_ci_cfn(ci);
}

static uint32_t lf_fix(lua_State *L, lh_frame *f, uint32_t n, lh_cap *c)
{
  lua_Debug d;
  uintptr_t cfn = lf.cfn, base;
  lf.cfn = 0;
  if (!cfn || !lua_getstack(L, 0, &d)) return n;
  memcpy(&base, (const char *)L + LF_L_BASE_CI, sizeof base);
  if (base + (uintptr_t)(d.i_ci + 1) * LF_CI_SIZE != lf.ci) return n;
  lh_frame nf;
  nf.src = 0;
  nf.line = nf.ld = nf.lld = -1;
  nf.fn = cfn;
  uint32_t shift = n == lh.depth ? (n - 1) / 2 : n;
  memmove(f + 1, f, shift * sizeof *f);
  f[0] = nf;
  lf.added++;
  if (n == lh.depth) { c->more = 1; return n; }
  return n + 1;
}

/* l_start's check of the offsets on itself (a C function at level 0) */
static const char *lf_check(lua_State *L)
{
  lua_Debug a0;
  uintptr_t ci, base;
  if (!lua_getstack(L, 0, &a0)) return "luahook_start has no stack level 0";
  if (!lf_read((uintptr_t)L + LF_L_CI, &ci, sizeof ci) || !lf_read((uintptr_t)L + LF_L_BASE_CI, &base, sizeof base)
      || ci != base + (uintptr_t)a0.i_ci * LF_CI_SIZE)
    return "lua_State.ci and .base_ci are not where 5.1.5 has them";
  lua_getinfo(L, "f", &a0);
  uintptr_t self = (uintptr_t)lua_topointer(L, -1);
  lua_pop(L, 1);
  if (lf_ci_cfn(ci) != self) return "a C function's CallInfo.func is not where 5.1.5 has it";
  return NULL;
}
#else
static void lf_note(lua_State *L) { (void)L; }
static uint32_t lf_fix(lua_State *L, lh_frame *f, uint32_t n, lh_cap *c)
{
  (void)L; (void)f; (void)c;
  return n;
}
static const char *lf_check(lua_State *L)
{
  (void)L;
  return "only on PUC Lua 5.1 and 5.4 on 64-bit";
}
#endif

/* the frame of the function at d's level */
static void lh_fill(lua_State *L, lua_Debug *d, lh_frame *f)
{
  f->fn = 0;
  if (!lua_getinfo(L, "Sl", d)) {
    f->src = 0;
    f->line = f->ld = f->lld = -1;
  } else if (d->what && d->what[0] == 'C') {
    /* "f" pushes the function (into the LUA_MINSTACK slots a hook and a
     * running C function have: no allocation): its address names it by
     * the table it is in (perf_event.profile.naming's builtins) */
    lua_getinfo(L, "nf", d);
    f->fn = (uint64_t)(uintptr_t)lua_topointer(L, -1);
    lua_pop(L, 1);
    f->src = lh_intern(d->name ? d->name : "?");
    f->line = f->ld = f->lld = -1;
  } else {
    f->src = lh_intern(d->source ? d->source : "?");
    f->line = d->currentline;
    f->ld = d->linedefined;
    f->lld = d->lastlinedefined;
  }
}

/* L's frames into f[0..cap), innermost first.  A deeper stack keeps its
 * innermost and its outermost cap/2 frames (what a recursion is under
 * stays known) and sets *more.  lua_getstack walks from the top on 5.4,
 * so the depth is found by doubling, then bisection. */
static uint32_t lh_walk(lua_State *L, lh_frame *f, uint32_t cap, uint32_t *more)
{
  lua_Debug d;
  uint32_t n = 0;
  while (n < cap && lua_getstack(L, (int)n, &d)) {
    lh_fill(L, &d, &f[n]);
    n++;
  }
  if (n < cap || !lua_getstack(L, (int)n, &d)) return n;
  *more = 1;
  int lo = (int)n, hi = (int)n * 2;        /* level lo exists */
  while (lua_getstack(L, hi, &d)) { lo = hi; hi *= 2; }
  while (hi - lo > 1) {                      /* lo exists, hi does not */
    int mid = lo + (hi - lo) / 2;
    if (lua_getstack(L, mid, &d)) lo = mid;
    else hi = mid;
  }
  uint32_t outer = cap / 2;
  n = cap - outer;
  for (int lv = hi - (int)outer; lv < hi; lv++) {
    if (!lua_getstack(L, lv, &d)) break;
    lh_fill(L, &d, &f[n++]);
  }
  return n;
}

static void lh_capture(lua_State *L, uint64_t head)
{
  /* depth contiguous frames from fhead, or from the ring's start */
  uint64_t foff = lh.fhead;
  if (foff % lh.nframes + lh.depth > lh.nframes) foff += lh.nframes - foff % lh.nframes;
  if (lh.head - lh.tail >= lh.slots || foff + lh.depth - lh.ftail > lh.nframes) {
    lh.dropped++;
    return;
  }
  uint32_t slot = lh.head % lh.slots;
  lh_cap *c = &lh.caps[slot];
  lh_frame *f = &lh.frames[foff % lh.nframes];
  c->foff = foff;
  c->foreign = lh.foreign;
  lh.foreign = 0;
  lua_Debug d;
  uint32_t n;
  c->time = lh_now();
  c->head = head;
  c->more = 0;
  n = lh_walk(L, f, lh.depth, &c->more);
  /* a coroutine (mode "count"): the started thread, when it is the one
   * resuming (its top is a C function such as coroutine.resume), is what
   * it runs under: its frames follow, so the resuming function gets the
   * coroutine's time inclusive */
  if (L != lh.L && n < lh.depth && lua_status(lh.L) == 0 && lua_getstack(lh.L, 0, &d)
      && lua_getinfo(lh.L, "S", &d) && d.what && d.what[0] == 'C')
    n += lh_walk(lh.L, f + n, lh.depth - n, &c->more);
  if (L == lh.L) n = lf_fix(L, f, n, c);
  c->n = n;
  lh.fhead = foff + n;
  lh.head++;
  uint64_t end = lh_now();
  lh.ns += end - c->time;
  /* wall time: a capture preempted meanwhile would look long, so the
   * quiet time is bounded (to 1 ms) */
  lh.quiet_until = end + (end - c->time < 333333 ? 3 * (end - c->time) : 1000000);
}

static void lh_hook(lua_State *L, lua_Debug *ar)
{
  (void)ar;
  if (!lh.on) {                  /* a coroutine that inherited the hook */
    lua_sethook(L, NULL, 0, 0);
    return;
  }
  lh.ncalls++;
  /* one shot in mode "signal"; in mode "count", back to the standing
   * count, after the handler's count 1 (a coroutine created while the
   * count-1 hook was set inherited it too) */
  if (lh.signal_mode) lua_sethook(L, NULL, 0, 0);
  else if (L == lh.L ? lh.boosted : lua_gethookcount(L) != lh.count) {
    if (L == lh.L) lh.boosted = 0;
    lua_sethook(L, lh_hook, LUA_MASKCOUNT, lh.count);
  }
  pe_event *ev = lh.ev;
  if (ev->fd < 0 || ev->page == NULL || ev->gen != pe_fork_gen) return;
  uint64_t head = __atomic_load_n(&ev->page->data_head, __ATOMIC_ACQUIRE);
  if (head == lh.last_head) return;
  lh.last_head = head;
  /* a capture's own time makes samples: after one, none for 3x its time,
   * so that captures take at most a quarter of the thread's time; the
   * samples meanwhile pair with the next capture */
  if (lh.quiet_until && lh_now() < lh.quiet_until) {
    lh.shed++;
    lf.proto = 0;
    return;
  }
  lh_capture(L, head);
}

/* a sample was written: capture at the started thread's next instruction */
static void lh_handler(int sig, siginfo_t *si, void *uc)
{
  (void)sig;
  (void)uc;
  if (!lh.on || si->si_fd != lh.fd || lh.L == NULL) return;
  lh.nsig = lh.nsig + 1;
  lua_Hook h = lua_gethook(lh.L);
  if (h != NULL && h != lh_hook) {         /* the program's own hook stays */
    lh.nforeign = lh.nforeign + 1;
    lh.foreign = 1;
    return;
  }
  lh.boosted = 1;
  lua_sethook(lh.L, lh_hook, LUA_MASKCOUNT, 1);
  lf_note(lh.L);
}

/* SIGIO: what the kernel sends instead when it cannot queue the real-time
 * signal (the user's RLIMIT_SIGPENDING is full); it carries no fd */
static void lh_sigio(int sig, siginfo_t *si, void *uc)
{
  (void)sig;
  (void)si;
  (void)uc;
  if (!lh.on || lh.L == NULL) return;
  lh.nsigio = lh.nsigio + 1;
  lua_Hook h = lua_gethook(lh.L);
  if (h != NULL && h != lh_hook) {
    lh.nforeign = lh.nforeign + 1;
    lh.foreign = 1;
    return;
  }
  lh.boosted = 1;
  lua_sethook(lh.L, lh_hook, LUA_MASKCOUNT, 1);
  lf_note(lh.L);
}

static int lh_arm(int fd, int signo)
{
  if (pe_sig_install(signo, lh_handler, lh_sigio, NULL) < 0) return -1;
  return pe_sig_route(fd, signo);
}

/* no more signals from the event; the handler stays installed, doing
 * nothing, so that a signal still queued meets no default action */
static void lh_disarm(void)
{
  if (lh.ev != NULL) pe_sig_unroute(lh.ev->fd);
}

static void lh_release(lua_State *L)
{
  luaL_unref(L, LUA_REGISTRYINDEX, lh.ev_ref);
  luaL_unref(L, LUA_REGISTRYINDEX, lh.th_ref);
  lh.ev_ref = lh.th_ref = LUA_NOREF;
  lh.ev = NULL;
  lh.L = NULL;
}

/* _private.luahook_start(event, count|"signal", slots, depth, noleaf) -> true and
 * nil or why the popped leaf is not added back (lf_check); or nil, why.  Arms the event's signal (it needs wakeup_events = 1, and a
 * mmap page: the hook compares its data_head); a count also sets the
 * standing count hook on the calling thread. */
static int l_start(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  int sigmode = lua_type(L, 2) == LUA_TSTRING;
  lua_Integer count = sigmode ? 1 : luaL_checkinteger(L, 2);
  if (sigmode) luaL_argcheck(L, strcmp(lua_tostring(L, 2), "signal") == 0, 2, "a count or \"signal\"");
  lua_Integer slots = luaL_optinteger(L, 3, 8192);
  lua_Integer depth = luaL_optinteger(L, 4, 256);
  luaL_argcheck(L, count >= 1 && count <= 1000000000, 2, "count must be 1..1e9");
  luaL_argcheck(L, slots >= 16 && slots <= 1 << 20, 3, "slots must be 16..2^20");
  luaL_argcheck(L, depth >= 1 && depth <= 1024, 4, "depth must be 1..1024");
  if (lh.on) {
    lua_pushnil(L);
    lua_pushliteral(L, "another profile's hook is set in this process");
    return 2;
  }
  if (lua_gethook(L) != NULL) {
    lua_pushnil(L);
    lua_pushliteral(L, "a debug hook is already set on this thread");
    return 2;
  }
  if (ev->page == NULL) {
    lua_pushnil(L);
    lua_pushliteral(L, "the event has no mmap page");
    return 2;
  }
  free(lh.caps);
  free(lh.frames);
  lh.caps = calloc((size_t)slots, sizeof(lh_cap));
  /* 32 frames a capture on average, and at least 4 deepest captures */
  uint64_t nfr = (uint64_t)slots * 32 > (uint64_t)depth * 4 ? (uint64_t)slots * 32 : (uint64_t)depth * 4;
  lh.frames = calloc((size_t)nfr, sizeof(lh_frame));
  if (!lh.caps || !lh.frames) {
    free(lh.caps);
    free(lh.frames);
    lh.caps = NULL;
    lh.frames = NULL;
    lua_pushnil(L);
    lua_pushliteral(L, "out of memory for the capture buffer");
    return 2;
  }
  lh.slots = (uint32_t)slots;
  lh.depth = (uint32_t)depth;
  lh.nframes = (uint32_t)nfr;
  lh.fhead = lh.ftail = 0;
  lh.head = lh.tail = lh.dropped = 0;
  lh.ncalls = lh.ns = lh.quiet_until = lh.shed = lh.nsig = lh.nsigio = lh.nforeign = 0;
  lh.foreign = 0;
  lf.pid = getpid();
  lf.proto = 0;
  lf.added = 0;
  const char *why = lua_toboolean(L, 5) ? "hook_leaf=false" : lf_check(L);
  lf.ok = why == NULL;
  lh_strs_reset();
  lua_pushvalue(L, 1);
  lh.ev_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pushthread(L);
  lh.th_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lh.ev = ev;
  lh.L = L;
  lh.last_head = __atomic_load_n(&ev->page->data_head, __ATOMIC_ACQUIRE);
  lh.signal_mode = sigmode;
  lh.count = (int)count;
  lh.boosted = 0;
  lh.fd = ev->fd;
  lh.signo = SIGRTMIN + 4;
  if (lh_arm(ev->fd, lh.signo) < 0) {
    int err = errno;
    lh_release(L);
    return pe_push_syserror(L, "luahook_start", "profile", err, NULL);
  }
  lh.on = 1;
  if (!sigmode) lua_sethook(L, lh_hook, LUA_MASKCOUNT, (int)count);
  lua_pushboolean(L, 1);
  if (why) lua_pushstring(L, why);
  else lua_pushnil(L);
  return 2;
}

/* _private.luahook_stop() -> true if a hook was removed.  The started
 * thread's hook goes now; inherited ones remove themselves when they next
 * fire.  The capture buffer stays for the last luahook_read. */
static int l_stop(lua_State *L)
{
  if (!lh.on) { lua_pushboolean(L, 0); return 1; }
  lh_disarm();
  lh.on = 0;
  if (lh.L && lua_gethook(lh.L) == lh_hook) lua_sethook(lh.L, NULL, 0, 0);
  if (lua_gethook(L) == lh_hook) lua_sethook(L, NULL, 0, 0);
  lh_release(L);
  lua_pushboolean(L, 1);
  return 1;
}

/* _private.luahook_read() -> caps, strings, dropped, hook calls, vm module,
 * ns spent capturing, leaf frames added back, captures shed, signals taken,
 * SIGIOs taken, signals that found another hook set.
 * caps: array of {time = ns, more = bool, foreign = bool (the samples
 * before it found the program's hook set: not their stack),
 * f = {src, line, ld, lld, fn, ...}}
 * (five integers a frame, innermost first; src indexes strings, 1-based;
 * ld == -1 marks a C function, src its name, fn its address as tostring
 * shows it; fn is 0 for a Lua function).  Takes the captures out;
 * after luahook_stop, also frees the buffer. */
static int l_read(lua_State *L)
{
  lua_createtable(L, (int)(lh.head - lh.tail), 0);
  int k = 1;
  for (; lh.caps && lh.tail != lh.head; lh.tail++) {
    uint32_t slot = lh.tail % lh.slots;
    lh_cap *c = &lh.caps[slot];
    lh_frame *f = &lh.frames[c->foff % lh.nframes];
    lua_createtable(L, 0, 3);
    pe_push_u64(L, c->time);
    lua_setfield(L, -2, "time");
    lua_pushboolean(L, c->more);
    lua_setfield(L, -2, "more");
    lua_pushboolean(L, c->foreign);
    lua_setfield(L, -2, "foreign");
    lua_createtable(L, (int)c->n * 5, 0);
    for (uint32_t i = 0; i < c->n; i++) {
      lua_pushinteger(L, f[i].src + 1);
      lua_rawseti(L, -2, (int)i * 5 + 1);
      lua_pushinteger(L, f[i].line);
      lua_rawseti(L, -2, (int)i * 5 + 2);
      lua_pushinteger(L, f[i].ld);
      lua_rawseti(L, -2, (int)i * 5 + 3);
      lua_pushinteger(L, f[i].lld);
      lua_rawseti(L, -2, (int)i * 5 + 4);
      lua_pushinteger(L, (lua_Integer)f[i].fn);   /* < 2^53: exact as a 5.1 number */
      lua_rawseti(L, -2, (int)i * 5 + 5);
    }
    lua_setfield(L, -2, "f");
    lua_rawseti(L, -2, k++);
    lh.ftail = c->foff + c->n;  /* read: a capture may now reuse them */
  }
  lua_createtable(L, (int)lh.nstrs, 0);
  for (uint32_t i = 0; i < lh.nstrs; i++) {
    lua_pushlstring(L, lh.pool + lh.strs[i].off, lh.strs[i].len);
    lua_rawseti(L, -2, (int)i + 1);
  }
  if (!lh.on) {                  /* stopped and now read: the buffer goes */
    free(lh.caps);
    free(lh.frames);
    lh.caps = NULL;
    lh.frames = NULL;
  }
  lua_pushinteger(L, lh.dropped);
  pe_push_u64(L, lh.ncalls);
  Dl_info di;
  if (dladdr((void *)(uintptr_t)lua_gettop, &di) && di.dli_fname) lua_pushstring(L, di.dli_fname);
  else lua_pushnil(L);
  pe_push_u64(L, lh.ns);
  pe_push_u64(L, lf.added);
  pe_push_u64(L, lh.shed);
  pe_push_u64(L, lh.nsig);
  pe_push_u64(L, lh.nsigio);
  pe_push_u64(L, lh.nforeign);
  return 11;
}

/* the three functions go to core._private (lua/perf_event/profile/hook.lua) */
void pe_open_luahook(lua_State *L)
{
  static const luaL_Reg fns[] = {
    {"luahook_start", l_start}, {"luahook_stop", l_stop}, {"luahook_read", l_read}, {NULL, NULL}
  };
  pe_push_private(L, lua_gettop(L));
  pe_setfuncs(L, fns);
  lua_pop(L, 1);
}
