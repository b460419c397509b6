/*
 * lj/remote.c - another process's LuaJIT 2.1 (GC64, x86-64), read from
 * outside with no help from it (luaperf dump --lua): its global_State
 * found in its memory, a thread stopped with ptrace and its registers, the
 * running coroutine's frames walked through lj/layout.h's reads, the
 * names its globals and modules give to builtins and C functions.  The
 * Lua side is perf_event.remote.
 *
 *   _private.ljr_find(pid, ranges)    -> {G, ...}: every VM in the ranges
 *                                        ({{lo, hi}, ...}, rw memory)
 *   _private.ljr_state(pid, g, execs) -> {g=, mainth=, vmstate_at=,
 *                                        curl_at=, dispatch=, vm_lo=,
 *                                        vm_hi=} | nil, why
 *   _private.ljr_walk(pid, st [, regs [, thread]]) -> {vmstate=, thread=,
 *                                        running=, how=, frames={...}},
 *                                        leaf first
 *   _private.ljr_fields(pid, tab, max) -> {{name, "function"|"table",
 *                                        addr}, ...}: a table's string keys
 *   _private.ljr_env(pid, thread)     -> the thread's globals table
 *   _private.ljr_ffid(pid, fn)        -> the function's ffid
 *   _private.ljr_chain(pid, st, sample) -> {ok=, why=, frames=}: a chain
 *                                        the BPF program read, decoded and
 *                                        checked
 *   _private.ljr_stop(tid)            -> regs {rip=, rsp=, rbx=, rdx=,
 *                                        r14=} | nil, why, errno
 *   _private.ljr_step(tid)            -> regs one instruction on | nil,
 *                                        why, errno [, signal]
 *   _private.ljr_detach(tid [, sig])  -> true | nil, why, errno
 *
 * Addresses are Lua numbers (47 bits: exact in a double).
 */
#define _GNU_SOURCE
#include "lj/layout.h"
#include <sys/ptrace.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <signal.h>
#include <stdlib.h>

#ifdef __x86_64__

#define LJR_CHUNK (1u << 20)         /* bytes read at a time by the scan */
#define LJR_MAXF 256                 /* frames walked at most */
#define LJR_NAME 512                 /* bytes of a chunk name kept */
#define LJR_FRAME_CONT 2
#define LJR_RET 32                   /* a BPF sample's words above its sp */

/* ---- small helpers ---- */

static uint64_t ljr_num(lua_State *L, int t, const char *k)
{
  lua_Number v;
  lua_getfield(L, t, k);
  v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v > 0 && v < 18446744073709551616.0 ? (uint64_t)v : 0;
}

static void ljr_setnum(lua_State *L, const char *k, uint64_t v)
{
  lua_pushnumber(L, (lua_Number)v);
  lua_setfield(L, -2, k);
}

static pid_t ljr_pid(lua_State *L, int idx)
{
  lua_Number v = luaL_checknumber(L, idx);
  if (v < 1 || v > 4194304 || v != (lua_Number)(pid_t)v) luaL_argerror(L, idx, "not a pid");
  return (pid_t)v;
}

/* ranges table at idx: its i-th {lo, hi} */
static int ljr_range(lua_State *L, int idx, int i, uint64_t *lo, uint64_t *hi)
{
  int ok;
  lua_rawgeti(L, idx, i);
  ok = lua_istable(L, -1);
  if (ok) {
    lua_rawgeti(L, -1, 1);
    lua_rawgeti(L, -2, 2);
    *lo = (uint64_t)lua_tonumber(L, -2);
    *hi = (uint64_t)lua_tonumber(L, -1);
    lua_pop(L, 2);
  }
  lua_pop(L, 1);
  return ok && *lo < *hi;
}

/* ---- finding G ---- */

/* G candidate g (the word at g - 96, the main thread's glref, points to
 * it): the main thread at g - 112 is a thread of g, and G's first 4 KiB
 * link to it (mainthref) */
static int ljr_is_g(const lj_mem *m, uint64_t g)
{
  uint64_t w[512], mt = g - LJ_GG_G;
  int k;
  if (!lj_thread_of(m, mt, g) || !lj_read(m, g, w, sizeof w)) return 0;
  for (k = 0; k < 512; k++)
    if (w[k] == mt) return 1;
  return 0;
}

/* ljr_find(pid, ranges) -> {G, ...}: the words equal to their own address
 * + 96 (GG_State's main lua_State glref: G is 112 bytes past the thread, the
 * link 16 bytes into it), each checked */
static int l_find(lua_State *L)
{
  lj_mem m;
  uint64_t *buf;
  int i, n = 0;
  m.pid = ljr_pid(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  buf = malloc(LJR_CHUNK);
  if (!buf) return luaL_error(L, "out of memory");
  lua_newtable(L);
  for (i = 1;; i++) {
    uint64_t lo, hi, at;
    lua_rawgeti(L, 2, i);
    if (lua_isnil(L, -1)) { lua_pop(L, 1); break; }
    lua_pop(L, 1);
    if (!ljr_range(L, 2, i, &lo, &hi)) continue;
    lo = (lo + 7) & ~(uint64_t)7;
    for (at = lo; at < hi; at += LJR_CHUNK) {
      size_t len = hi - at < LJR_CHUNK ? (size_t)(hi - at) & ~(size_t)7 : LJR_CHUNK, k;
      if (len == 0 || !lj_read(&m, at, buf, len)) continue;
      for (k = 0; k < len / 8; k++) {
        uint64_t self = at + 8 * k;
        if (buf[k] == self + 96 && ljr_is_g(&m, self + 96)) {
          lua_pushnumber(L, (lua_Number)(self + 96));
          lua_rawseti(L, -2, ++n);
        }
      }
    }
  }
  free(buf);
  return 1;
}

/* ---- G's words ---- */

/* in exec range i of execs (idx), or 0 */
static int ljr_exec_of(lua_State *L, int idx, uint64_t a)
{
  int i;
  for (i = 1;; i++) {
    uint64_t lo, hi;
    lua_rawgeti(L, idx, i);
    if (lua_isnil(L, -1)) { lua_pop(L, 1); return 0; }
    lua_pop(L, 1);
    if (ljr_range(L, idx, i, &lo, &hi) && a >= lo && a < hi) return i;
  }
}

/* the dispatch table: the first run of 64 words after G that point into
 * one executable mapping, the one its 64th word points into (jit_State
 * before it may point to machine code too); its lowest entry is where the
 * VM's code starts, its highest one lies in it (perf_event.remote finds
 * the end in the binary's .eh_frame) */
static uint64_t ljr_dispatch(lua_State *L, const lj_mem *m, uint64_t g, int execs, uint64_t *vlo, uint64_t *vhi)
{
  uint64_t w[512], at;
  for (at = g; at < g + 65536; at += 8 * 448) {
    int k;
    if (!lj_read(m, at, w, sizeof w)) return 0;
    for (k = 0; k + 64 <= 512; k++) {
      int j, e = ljr_exec_of(L, execs, w[k + 63]);
      if (!e) continue;
      for (j = 0; j < 64 && ljr_exec_of(L, execs, w[k + j]) == e; j++) {}
      if (j == 64) {
        /* the whole table: its entries as long as they point there */
        uint64_t start = at + 8 * (uint64_t)k, e8, lo = w[k], hi = w[k];
        for (j = 0; j < 2048 && (e8 = lj_u64(m, start + 8 * (uint64_t)j)) && ljr_exec_of(L, execs, e8) == e; j++) {
          if (e8 < lo) lo = e8;
          if (e8 > hi) hi = e8;
        }
        *vlo = lo;
        *vhi = hi;
        return start;
      }
    }
  }
  return 0;
}

/* a value global_State.vmstate takes: ~LJ_VMST_* (-1..-7) or a trace's
 * number (TraceNo1: up to 65535) */
static int ljr_vmstate_ok(int32_t v) { return (v >= -8 && v <= -1) || (v >= 1 && v <= 65535); }

/* ljr_state(pid, g, execs) -> the words of G a walk reads: cur_L (jit_base
 * follows it), mainthref, vmstate, the dispatch table */
static int l_state(lua_State *L)
{
  lj_mem m;
  uint64_t g, w[512], mt, mainth = 0, curl = 0, disp, vlo = 0, vhi = 0;
  int k, vm;
  m.pid = ljr_pid(L, 1);
  g = (uint64_t)luaL_checknumber(L, 2);
  luaL_checktype(L, 3, LUA_TTABLE);
  mt = g - LJ_GG_G;
  if (!ljr_is_g(&m, g) || !lj_read(&m, g, w, sizeof w)) {
    lua_pushnil(L);
    lua_pushliteral(L, "not a LuaJIT global_State");
    return 2;
  }
  /* cur_L first: the word after bc_cfunc_int and bc_cfunc_ext (two
   * instructions: BC_FUNCC, and it again or BC_FUNCCW, the next opcode,
   * once a C function wrapper is set; A = LUA_MINSTACK, D = 0) that links
   * a thread of G */
  for (k = 1; k < 512 && !curl; k++) {
    uint32_t fi = (uint32_t)w[k - 1], fw = (uint32_t)(w[k - 1] >> 32);
    if (lj_gcaddr(w[k]) && lj_thread_of(&m, w[k], g) && (fi >> 8) == LJ_MINSTACK && (fw >> 8) == LJ_MINSTACK
        && ((fw & 0xff) == (fi & 0xff) || (fw & 0xff) == (fi & 0xff) + 1))
      curl = g + 8 * (uint64_t)k;
  }
  /* mainthref: LJ_CURL_MAINTH bytes before it (the GC's gray lists and
   * tmpbuf.L may link the main thread too), checked */
  if (curl && curl - LJ_CURL_MAINTH > g && w[(curl - LJ_CURL_MAINTH - g) / 8] == mt) mainth = curl - LJ_CURL_MAINTH;
  if (!mainth) {
    lua_pushnil(L);
    lua_pushliteral(L, "G->cur_L or G->mainthref not found: not a LuaJIT 2.1 layout this reads");
    return 2;
  }
  /* vmstate: the int32 right before mainthref, else (padding between
   * them) the one before that */
  vm = ljr_vmstate_ok(lj_i32(&m, mainth - 4)) ? 4 : 8;
  disp = ljr_dispatch(L, &m, g, 3, &vlo, &vhi);
  lua_createtable(L, 0, 8);
  ljr_setnum(L, "g", g);
  ljr_setnum(L, "mainth", mt);
  ljr_setnum(L, "vmstate_at", mainth - (uint64_t)vm);
  ljr_setnum(L, "curl_at", curl);
  if (disp) {
    ljr_setnum(L, "dispatch", disp);
    ljr_setnum(L, "vm_lo", vlo);
    ljr_setnum(L, "vm_hi", vhi + 4096);
  }
  return 1;
}

/* ---- the walk ---- */

typedef struct ljr_frame {
  uint64_t fn, pt, cfunc, pc;
  int ffid, line, inlined;
} ljr_frame;

typedef struct ljr_walk {
  const lj_mem *m;
  uint64_t l, base, pc;           /* the thread, where its walk starts, the leaf's PC or 0 */
  int vmstate, running;
  const char *how;                /* where base and pc came from */
  ljr_frame f[LJR_MAXF];
  int n, trunc;
} ljr_walk;

/* the top frame's PC the VM saved in L's C frame, or 0 */
static uint64_t ljr_saved_pc(const lj_mem *m, uint64_t l)
{
  uint64_t cf = lj_u64(m, l + LJ_L_CFRAME) & ~(uint64_t)3, pc;
  if (!cf) return 0;
  pc = lj_u64(m, cf + LJ_CF_PC);
  return pc && pc != lj_u64(m, cf + LJ_CF_L) ? pc : 0;
}

/* where the walk of the running thread starts: from the registers in
 * the interpreter's own code (BASE in rdx, PC in rbx, DISPATCH in r14),
 * from jit_base and the snapshot of the machine code in a trace, else from
 * L->base and the PC the VM saved when it left for C */
static void ljr_start(lua_State *L, ljr_walk *w, int st, int regs)
{
  const lj_mem *m = w->m;
  uint64_t g = ljr_num(L, st, "g"), disp = ljr_num(L, st, "dispatch");
  uint64_t curl = ljr_num(L, st, "curl_at");
  w->l = lj_u64(m, curl);
  w->vmstate = lj_i32(m, ljr_num(L, st, "vmstate_at"));
  w->running = lj_u64(m, w->l + LJ_L_CFRAME) != 0;
  w->base = lj_u64(m, w->l + LJ_L_BASE);
  w->pc = ljr_saved_pc(m, w->l);
  w->how = "L->base";
  if (!regs) return;
  if (w->vmstate == LJ_VMST_INTERP && disp && ljr_num(L, regs, "r14") == disp) {
    uint64_t rip = ljr_num(L, regs, "rip");
    if (rip >= ljr_num(L, st, "vm_lo") && rip < ljr_num(L, st, "vm_hi")) {
      w->base = ljr_num(L, regs, "rdx");
      w->pc = ljr_num(L, regs, "rbx") - 4;
      w->how = "registers";
    }
  } else if (w->vmstate > 0) {
    uint64_t jb = lj_u64(m, curl + 8), jt = lj_find_traces_no(m, g, (uint32_t)w->vmstate);
    if (jb) {
      w->base = jb;
      w->pc = jt ? lj_trace_pc(m, jt, w->vmstate, ljr_num(L, regs, "rip"), ljr_num(L, regs, "rsp")) : 0;
      w->how = jt ? "trace snapshot" : "jit_base";
    }
  }
}

/* one frame: fn (a GCfunc) of ffid ffid whose bytecode (a Lua function)
 * or C function is x, with PC pc (0: not known) */
static void ljr_add_as(ljr_walk *w, uint64_t fn, int ffid, uint64_t x, uint64_t pc)
{
  ljr_frame *f;
  if (w->n == LJR_MAXF) { w->trunc = 1; return; }
  f = &w->f[w->n++];
  memset(f, 0, sizeof *f);
  f->fn = fn;
  f->ffid = ffid;
  f->line = -1;
  if (f->ffid == 0) {
    uint64_t bc = x;
    f->pt = bc - LJ_PT_SIZE;
    if (pc) {
      f->line = lj_pt_line(w->m, f->pt, pc);
      if (f->line < 0 && w->n == 1 && w->vmstate > 0) {
        /* the leaf of a trace: its PC in a function the trace inlined */
        uint64_t pt = lj_proto_of_pc(w->m, pc);
        if (pt) {
          ljr_frame *in;
          f->pc = 0;
          if (w->n == LJR_MAXF) { w->trunc = 1; return; }
          in = &w->f[w->n++];
          *in = *f;
          memset(f, 0, sizeof *f);
          f->pt = pt;
          f->line = lj_pt_line(w->m, pt, pc);
          f->inlined = 1;
          f->ffid = 0;
          f->pc = pc;
          return;
        }
      }
    }
    f->pc = pc;
  } else if (f->ffid == 1) {
    f->cfunc = x;
  }
}

/* one frame: fn (a GCfunc) as it is now, with PC pc (0: not known) */
static void ljr_add(ljr_walk *w, uint64_t fn, uint64_t pc)
{
  int ffid = lj_ffid(w->m, fn);
  ljr_add_as(w, fn, ffid, ffid == 0 ? lj_u64(w->m, fn + LJ_FNL_PC) : ffid == 1 ? lj_u64(w->m, fn + LJ_FNC_F) : 0, pc);
}

/* the frames of w->l from w->base down (lj/walk.c's traversal: dummy
 * frames skipped, and a vararg frame's pseudo-frame); a Lua frame's PC is
 * the return PC the frame above it links to */
static void ljr_frames(ljr_walk *w)
{
  const lj_mem *m = w->m;
  uint64_t stack = lj_u64(m, w->l + LJ_L_STACK), bot = stack + 8;
  uint64_t size = 8 * (uint64_t)(uint32_t)lj_i32(m, w->l + LJ_L_SIZE);
  uint64_t frame = w->base - 8, pc = w->pc;
  int skip = 0, steps = 0;
  if (w->base <= stack || w->base > stack + size) { w->trunc = 1; return; }
  while (frame > bot && steps++ < 4 * LJR_MAXF) {
    uint64_t fn = lj_gcref(lj_u64(m, frame - 8));
    int64_t ftsz = (int64_t)lj_u64(m, frame);
    uint64_t prev = lj_frame_prev(m, frame, ftsz);
    /* (a dummy frame, or a resume's holding the coroutine it resumes: a
     * thread where the function would be) */
    if (fn != w->l && !skip && lj_gct(m, fn) != LJ_GCT_THREAD) {
      if (lj_gct(m, fn) != LJ_GCT_FUNC) { w->trunc = 1; break; }
      ljr_add(w, fn, pc);
    }
    skip = lj_frame_isvarg(ftsz);
    /* the caller's PC: a Lua frame's link; a continuation's (a metamethod
     * the VM called) two slots below its link (lj_frame.h, FR2) */
    if (!skip)
      pc = (ftsz & 3) == 0 ? (uint64_t)ftsz - 4 : (ftsz & 7) == LJ_FRAME_CONT ? lj_u64(m, frame - 16) - 4 : 0;
    if (prev >= frame) break;
    frame = prev;
  }
}

static void ljr_push_frame(lua_State *L, const lj_mem *m, const ljr_frame *f)
{
  char name[LJR_NAME];
  lua_createtable(L, 0, 7);
  ljr_setnum(L, "fn", f->fn);
  lua_pushinteger(L, f->ffid);
  lua_setfield(L, -2, "ffid");
  if (f->ffid == 0) {
    uint8_t hdr[LJ_PT_SIZE];
    uint64_t chunk = 0;
    int32_t first = 0, numline = 0;
    if (lj_read(m, f->pt, hdr, sizeof hdr)) {      /* the prototype's header in one read */
      memcpy(&chunk, hdr + LJ_PT_CHUNKNAME, 8);
      memcpy(&first, hdr + LJ_PT_FIRSTLINE, 4);
      memcpy(&numline, hdr + LJ_PT_NUMLINE, 4);
    }
    lua_pushstring(L, chunk && lj_str(m, lj_gcref(chunk), name, sizeof name) ? name : "?");
    lua_setfield(L, -2, "chunk");
    lua_pushinteger(L, first);
    lua_setfield(L, -2, "linedefined");
    lua_pushinteger(L, first + numline);
    lua_setfield(L, -2, "lastlinedefined");
    ljr_setnum(L, "pt", f->pt);
    if (f->line >= 0) {
      lua_pushinteger(L, f->line);
      lua_setfield(L, -2, "line");
    }
    if (f->inlined) {
      lua_pushboolean(L, 1);
      lua_setfield(L, -2, "inlined");
    }
  } else if (f->ffid == 1) {
    ljr_setnum(L, "cfunc", f->cfunc);
  }
}

/* the table on top gets w's frames as `frames`; w is freed */
static int ljr_frames_out(lua_State *L, const lj_mem *m, ljr_walk *w)
{
  int i;
  lua_createtable(L, w->n, 0);
  for (i = 0; i < w->n; i++) {
    ljr_push_frame(L, m, &w->f[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "frames");
  free(w);
  return 1;
}

/* ljr_walk(pid, st [, regs [, thread]]): the running thread (G->cur_L)
 * of the VM st describes, leaf first; regs: its OS thread's registers,
 * stopped; thread: that thread instead (one that resumed cur_L) */
static int l_walk(lua_State *L)
{
  lj_mem m;
  ljr_walk *w;
  int regs;
  m.pid = ljr_pid(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  regs = lua_istable(L, 3) ? 3 : 0;
  w = calloc(1, sizeof *w);
  if (!w) return luaL_error(L, "out of memory");
  w->m = &m;
  if (lua_isnumber(L, 4)) {
    /* a thread that is not running: a resumer, from its L->base */
    w->l = (uint64_t)lua_tonumber(L, 4);
    w->vmstate = lj_i32(&m, ljr_num(L, 2, "vmstate_at"));
    w->base = lj_u64(&m, w->l + LJ_L_BASE);
    w->running = lj_u64(&m, w->l + LJ_L_CFRAME) != 0;
    w->how = "L->base";
  } else {
    ljr_start(L, w, 2, regs);
  }
  if (lj_thread_of(&m, w->l, ljr_num(L, 2, "g"))) ljr_frames(w);
  else w->trunc = 1;
  lua_createtable(L, 0, 6);
  lua_pushinteger(L, w->vmstate);
  lua_setfield(L, -2, "vmstate");
  ljr_setnum(L, "thread", w->l);
  lua_pushboolean(L, w->running);
  lua_setfield(L, -2, "running");
  lua_pushstring(L, w->how);
  lua_setfield(L, -2, "how");
  lua_pushboolean(L, w->trunc);
  lua_setfield(L, -2, "truncated");
  return ljr_frames_out(L, &m, w);
}

/* a sample table's array field k: its i-th number (1-based), 0 when none */
static uint64_t ljr_at(lua_State *L, int t, const char *k, int i)
{
  uint64_t v;
  lua_getfield(L, t, k);
  lua_rawgeti(L, -1, i);
  v = lua_isnumber(L, -1) ? (uint64_t)lua_tonumber(L, -1) : 0;
  lua_pop(L, 2);
  return v;
}

/* ljr_chain(pid, st, sample) -> {ok=, why=, frames={...}}: a chain the
 * BPF program read at a sample (lj/bpfprof.c's sample table), decoded as
 * ljr_walk decodes one and checked: each frame holds a function, and the
 * leaf's PC lies in the leaf's bytecode (interpreted), or in a prototype
 * (compiled: the trace's snapshot, found from the sample's ip and the
 * words above its sp).  st.jtrace is found once and kept */
static int l_chain(lua_State *L)
{
  lj_mem m;
  ljr_walk *w;
  uint64_t words[LJR_RET], pc;
  int i, n, how;
  const char *why = NULL;
  m.pid = ljr_pid(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checktype(L, 3, LUA_TTABLE);
  w = calloc(1, sizeof *w);
  if (!w) return luaL_error(L, "out of memory");
  w->m = &m;
  w->l = ljr_num(L, 3, "l");
  lua_getfield(L, 3, "vmstate");
  w->vmstate = (int)lua_tointeger(L, -1);
  lua_getfield(L, 3, "how");
  how = (int)lua_tointeger(L, -1);
  lua_pop(L, 2);
  pc = ljr_num(L, 3, "pc");
  if (how == 2 && w->vmstate > 0) {            /* a trace: its snapshot's PC */
    uint64_t jt = ljr_num(L, 2, "jtrace");
    if (!jt && (jt = lj_find_traces_no(&m, ljr_num(L, 2, "g"), (uint32_t)w->vmstate))) {
      lua_pushnumber(L, (lua_Number)jt);
      lua_setfield(L, 2, "jtrace");
    }
    for (i = 0; i < LJR_RET; i++) words[i] = ljr_at(L, 3, "ret", i + 1);
    /* (0, no snapshot: the sample in code the trace called, its return
     * address deeper than the words read; the leaf without its line) */
    pc = jt ? lj_trace_pc_w(&m, jt, w->vmstate, ljr_num(L, 3, "rip"), words, LJR_RET) : 0;
  }
  lua_getfield(L, 3, "fn");
  n = (int)pe_rawlen(L, -1);
  lua_pop(L, 1);
  for (i = 1; i <= n && !why; i++) {
    /* each function as the program found it at the sample (gct, ffid,
     * bytecode or C function): a closure may be gone by now */
    uint64_t fn = ljr_at(L, 3, "fn", i), x = ljr_at(L, 3, "fpc", i), kind = ljr_at(L, 3, "kind", i);
    uint64_t fpc = i == 1 ? (how == 6 ? 0 : pc) : ljr_at(L, 3, "pcs", i - 1);
    int gct = (int)(kind & 0xff), ffid = (int)((kind >> 8) & 0xff);
    if (i > 1 && fpc) fpc -= 4;
    /* a dummy frame, or the frame of a resume holding the coroutine it
     * resumes: a thread where the function would be */
    if (fn == w->l || gct == LJ_GCT_THREAD) continue;
    /* at a return's edge the returning frame's slot may hold a result
     * already: the frame is gone, its caller is the leaf */
    if (i == 1 && how == 6 && gct != LJ_GCT_FUNC) continue;
    if (gct != LJ_GCT_FUNC || (ffid <= 1 && !x)) { why = "a frame without a function"; break; }
    /* interpreted, before the dispatch moved past the function's first
     * instruction: PC is that instruction */
    if (i == 1 && how == 1 && ffid == 0 && fpc + 4 == x) fpc += 4;
    ljr_add_as(w, fn, ffid, x, fpc);
  }
  /* interpreted: the leaf's PC in its bytecode (at an edge or in a
   * builtin, rbx is the leaf frame's link: the frames are the check) */
  if (!why && how == 1 && (w->n == 0 || w->f[0].ffid != 0 || w->f[0].line < 0))
    why = "the leaf's PC is not in the leaf's function";
  /* C, the GC, a helper the interpreter called: L->base and the PC the VM
   * saved with it agree (a Lua leaf holds that PC) */
  if (!why && how == 3 && w->n > 0 && w->f[0].ffid == 0 && pc && w->f[0].line < 0)
    why = "the saved PC is not in the leaf's function";
  /* the registers named no frame (the VM's entry and exit code, between
   * two threads): L->base is fresh while the C function or builtin whose
   * frame it is runs (the VM between it and what it calls, or a resume
   * between the threads); a Lua function there may be long gone */
  if (!why && how == 7 && (w->n == 0 || w->f[0].ffid == 0)) why = "the VM between two frames";
  /* a trace (or what it called): the base frame is the trace's, a Lua
   * function; its line is the snapshot's when one is found (a stitched
   * call's snapshot, a side trace's, may hold a PC in no prototype: the
   * leaf without its line then) */
  if (!why && (how == 2 || how == 5) && (w->n == 0 || w->f[0].ffid != 0))
    why = "the trace's base frame holds no Lua function";
  lua_createtable(L, 0, 3);
  lua_pushboolean(L, why == NULL);
  lua_setfield(L, -2, "ok");
  if (why) {
    lua_pushstring(L, why);
    lua_setfield(L, -2, "why");
  }
  return ljr_frames_out(L, &m, w);
}

/* ljr_fields(pid, tab, max): tab's string keys whose values are functions
 * or tables (its hash part; at most max, default 4096) */
static int l_fields(lua_State *L)
{
  lj_mem m;
  uint64_t t, node;
  uint32_t hmask, i;
  int n = 0, max;
  char name[256];
  m.pid = ljr_pid(L, 1);
  t = (uint64_t)luaL_checknumber(L, 2);
  max = (int)luaL_optinteger(L, 3, 4096);
  lua_newtable(L);
  if (lj_gct(&m, t) != LJ_GCT_TAB) return 1;
  node = lj_u64(&m, t + LJ_TAB_NODE);
  hmask = (uint32_t)lj_i32(&m, t + LJ_TAB_HMASK);
  if (!node || hmask >= (1u << 24)) return 1;
  for (i = 0; i <= hmask && n < max; i++) {
    uint64_t nd[3], it;
    const char *kind;
    if (!lj_read(&m, node + LJ_NODE_SIZE * (uint64_t)i, nd, sizeof nd)) break;
    if ((nd[1] >> 47) != LJ_ITYPE_STR) continue;
    it = nd[0] >> 47;
    kind = it == LJ_ITYPE_FUNC ? "function" : it == LJ_ITYPE_TAB ? "table" : NULL;
    if (!kind || !lj_str(&m, lj_gcref(nd[1]), name, sizeof name)) continue;
    lua_createtable(L, 3, 0);
    lua_pushstring(L, name);
    lua_rawseti(L, -2, 1);
    lua_pushstring(L, kind);
    lua_rawseti(L, -2, 2);
    lua_pushnumber(L, (lua_Number)lj_gcref(nd[0]));
    lua_rawseti(L, -2, 3);
    lua_rawseti(L, -2, ++n);
  }
  return 1;
}

/* ljr_env(pid, thread) -> the thread's globals table (its env), or nil */
static int l_env(lua_State *L)
{
  lj_mem m;
  uint64_t th, env;
  m.pid = ljr_pid(L, 1);
  th = (uint64_t)luaL_checknumber(L, 2);
  if (lj_gct(&m, th) != LJ_GCT_THREAD) return 0;
  env = lj_gcref(lj_u64(&m, th + LJ_L_ENV));
  if (lj_gct(&m, env) != LJ_GCT_TAB) return 0;
  lua_pushnumber(L, (lua_Number)env);
  return 1;
}

/* ljr_ffid(pid, fn) -> the function's ffid (0 Lua, 1 C, more a
 * builtin), or nil when fn is not a function */
static int l_ffid(lua_State *L)
{
  lj_mem m;
  uint64_t fn;
  m.pid = ljr_pid(L, 1);
  fn = (uint64_t)luaL_checknumber(L, 2);
  if (lj_gct(&m, fn) != LJ_GCT_FUNC) return 0;
  lua_pushinteger(L, lj_ffid(&m, fn));
  return 1;
}

/* ---- stopping a thread ---- */

static int ljr_fail(lua_State *L, const char *what, int err)
{
  lua_pushnil(L);
  lua_pushfstring(L, "%s: %s", what, strerror(err));
  lua_pushinteger(L, err);
  return 3;
}

/* the registers the walk reads, as a table */
static int ljr_regs(lua_State *L, const struct user_regs_struct *r)
{
  lua_createtable(L, 0, 6);
  ljr_setnum(L, "rip", r->rip);
  ljr_setnum(L, "rsp", r->rsp);
  ljr_setnum(L, "rbx", r->rbx);
  ljr_setnum(L, "rdx", r->rdx);
  ljr_setnum(L, "r14", r->r14);
  ljr_setnum(L, "r15", r->r15);
  return 1;
}

/* ljr_stop(tid): seized and interrupted (PTRACE_SEIZE, PTRACE_INTERRUPT:
 * no signal sent to the process), its registers once it stopped */
static int l_stop(lua_State *L)
{
  pid_t tid = ljr_pid(L, 1);
  struct user_regs_struct r;
  int status;
  if (ptrace(PTRACE_SEIZE, tid, NULL, NULL) < 0) return ljr_fail(L, "ptrace(PTRACE_SEIZE)", errno);
  if (ptrace(PTRACE_INTERRUPT, tid, NULL, NULL) < 0) {
    int err = errno;
    ptrace(PTRACE_DETACH, tid, NULL, NULL);
    return ljr_fail(L, "ptrace(PTRACE_INTERRUPT)", err);
  }
  while (waitpid(tid, &status, __WALL) < 0) {
    if (errno != EINTR) {
      int err = errno;
      ptrace(PTRACE_DETACH, tid, NULL, NULL);
      return ljr_fail(L, "waitpid", err);
    }
  }
  if (!WIFSTOPPED(status)) return ljr_fail(L, "the thread ended", ESRCH);
  if (ptrace(PTRACE_GETREGS, tid, NULL, &r) < 0) {
    int err = errno;
    ptrace(PTRACE_DETACH, tid, NULL, NULL);
    return ljr_fail(L, "ptrace(PTRACE_GETREGS)", err);
  }
  return ljr_regs(L, &r);
}

/* ljr_step(tid): a stopped thread one instruction further
 * (PTRACE_SINGLESTEP), its registers; nil, why, errno [, signal] when it
 * did not get there: a signal that arrived meanwhile is the fourth value,
 * for ljr_detach to hand over. The thread is still held, except when it
 * ended */
static int l_step(lua_State *L)
{
  pid_t tid = ljr_pid(L, 1);
  struct user_regs_struct r;
  siginfo_t si;
  int status;
  if (ptrace(PTRACE_SINGLESTEP, tid, NULL, NULL) < 0) return ljr_fail(L, "ptrace(PTRACE_SINGLESTEP)", errno);
  while (waitpid(tid, &status, __WALL) < 0)
    if (errno != EINTR) return ljr_fail(L, "waitpid", errno);
  if (!WIFSTOPPED(status)) return ljr_fail(L, "the thread ended", ESRCH);
  /* the step's own trap is a SIGTRAP the kernel made (si_code > 0); a
   * signal sent meanwhile, or a group stop, ends the stepping */
  if (status >> 8 != SIGTRAP || ptrace(PTRACE_GETSIGINFO, tid, NULL, &si) < 0 || si.si_code <= 0) {
    ljr_fail(L, "a signal arrived while stepping", EINTR);
    lua_pushinteger(L, status >> 16 == 0 ? WSTOPSIG(status) : 0);
    return 4;
  }
  if (ptrace(PTRACE_GETREGS, tid, NULL, &r) < 0) return ljr_fail(L, "ptrace(PTRACE_GETREGS)", errno);
  return ljr_regs(L, &r);
}

/* ljr_detach(tid [, signal]): the thread let go, with the signal that
 * arrived while it was held */
static int l_detach(lua_State *L)
{
  pid_t tid = ljr_pid(L, 1);
  long sig = (long)luaL_optinteger(L, 2, 0);
  if (sig < 0 || sig > 64) return luaL_argerror(L, 2, "not a signal");
  if (ptrace(PTRACE_DETACH, tid, NULL, (void *)sig) < 0) return ljr_fail(L, "ptrace(PTRACE_DETACH)", errno);
  lua_pushboolean(L, 1);
  return 1;
}

#define LJR_FUNCS                                                                         \
  {"ljr_find", l_find}, {"ljr_state", l_state}, {"ljr_walk", l_walk}, {"ljr_fields", l_fields}, \
  {"ljr_stop", l_stop}, {"ljr_step", l_step}, {"ljr_detach", l_detach}, {"ljr_env", l_env}, \
  {"ljr_ffid", l_ffid}, {"ljr_chain", l_chain}

#else

static int l_none(lua_State *L)
{
  lua_pushnil(L);
  lua_pushliteral(L, "reading another process's LuaJIT needs x86-64");
  return 2;
}
#define LJR_FUNCS                                                                            \
  {"ljr_find", l_none}, {"ljr_state", l_none}, {"ljr_walk", l_none}, {"ljr_fields", l_none}, \
  {"ljr_stop", l_none}, {"ljr_step", l_none}, {"ljr_detach", l_none}, {"ljr_env", l_none}, \
  {"ljr_ffid", l_none}, {"ljr_chain", l_none}

#endif

void pe_open_ljremote(lua_State *L)
{
  static const luaL_Reg fns[] = { LJR_FUNCS, {NULL, NULL} };
  pe_push_private(L, lua_gettop(L));
  pe_setfuncs(L, fns);
  lua_pop(L, 1);
}
