/*
 * puc/frames.c - PUC Lua's own structs read at a signal (lua_State.ci,
 * CallInfo, the closure and its Proto, at the offsets of 5.4.0-5.4.6 and
 * 5.1.5 on LP64, checked at start): the handler notes the function the
 * started thread runs, and the capture adds it back as the leaf when its
 * frame was popped before the hook fired.  Reads go through pe_peek, so a
 * torn pointer gives an error, never a fault.
 */
#include "puc/puc.h"
#include <string.h>
#include <unistd.h>

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

/* lf_fix's last step, both layouts: nf (the noted function) becomes the
 * innermost of f[0..n); a full capture (n == depth) loses the innermost
 * frame of its outer part and says it is cut (*more) */
static inline uint32_t lf_insert(lh_frame *f, uint32_t n, uint32_t depth, uint32_t *more, lh_frame nf)
{
  uint32_t shift = n == depth ? (n - 1) / 2 : n;
  memmove(f + 1, f, shift * sizeof *f);
  f[0] = nf;
  lf.added++;
  if (n == depth) { *more = 1; return n; }
  return n + 1;
}

/* a C function's frame (lua_topointer's address; named on the Lua side) */
static inline lh_frame lf_cframe(uintptr_t cfn)
{
  lh_frame nf;
  nf.src = 0;
  nf.line = nf.ld = nf.lld = -1;
  nf.fn = cfn;
  return nf;
}

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
void lf_note(lua_State *L)
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
uint32_t lf_fix(lua_State *L, lh_frame *f, uint32_t n, uint32_t depth, uint32_t *more)
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
    nf = lf_cframe(cfn);
  }
  return lf_insert(f, n, depth, more, nf);
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
  if (strcmp(lh_str((uint32_t)fr.src, NULL), a1.source) != 0)
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

void lf_note(lua_State *L)
{
  uintptr_t ci;
  lf.cfn = 0;
  if (!lf.ok || !lf_read((uintptr_t)L + LF_L_CI, &ci, sizeof ci)) return;
  lf.ci = ci;
  lf.cfn = lf_ci_cfn(ci);
}

uint32_t lf_fix(lua_State *L, lh_frame *f, uint32_t n, uint32_t depth, uint32_t *more)
{
  lua_Debug d;
  uintptr_t cfn = lf.cfn, base;
  lf.cfn = 0;
  if (!cfn || !lua_getstack(L, 0, &d)) return n;
  memcpy(&base, (const char *)L + LF_L_BASE_CI, sizeof base);
  if (base + (uintptr_t)(d.i_ci + 1) * LF_CI_SIZE != lf.ci) return n;
  return lf_insert(f, n, depth, more, lf_cframe(cfn));
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
void lf_note(lua_State *L) { (void)L; }
uint32_t lf_fix(lua_State *L, lh_frame *f, uint32_t n, uint32_t depth, uint32_t *more)
{
  (void)L; (void)f; (void)depth; (void)more;
  return n;
}
static const char *lf_check(lua_State *L)
{
  (void)L;
  return "only on PUC Lua 5.1 and 5.4 on 64-bit";
}
#endif

/* _private.luahook_start's part: noleaf is its hook_leaf=false */
const char *lf_start(lua_State *L, int noleaf)
{
  lf.pid = getpid();
  lf.proto = 0;
  lf.added = 0;
  const char *why = noleaf ? "hook_leaf=false" : lf_check(L);
  lf.ok = why == NULL;
  return why;
}

void lf_forget(void)
{
  lf.proto = 0;
}

uint64_t lf_added(void)
{
  return lf.added;
}
