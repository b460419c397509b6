/*
 * lj/layout.h - what reading LuaJIT 2.1's state needs (GC64, x86-64):
 * the struct offsets, TValue and GCfunc decoding, frame links, trace and
 * snapshot lookup, a prototype's line of a bytecode, and finding and
 * checking global_State.  Owned here once for every reader of LuaJIT's
 * memory (the safe point's files; the hook-flag repair, lj/hook.c).
 *
 * Every read goes through the peek functions below and an lj_mem: the
 * process whose memory is read.  LJ_SELF (pid 0) is this process, read by
 * plain loads (the signal handler's path); another pid is read with
 * process_vm_readv (pe_peek), a word that is not mapped reading as 0, so
 * that a profiler of another process can reuse the same decoding.
 *
 * The offsets are LuaJIT 2.1's, GC64 (lj_obj.h, lj_frame.h, lj_jit.h):
 * lua_State glref +16, base +32, stack +56, cframe +80, stacksize +88; a
 * TValue holding a GC object keeps its address in the low 47 bits, its
 * itype in the top 17; GCfunc: gct +9 (~LJ_TFUNC = 8), ffid +10 (0 Lua,
 * 1 C, more a builtin), GCfuncL.pc +32, GCfuncC.f +40, upvalue[0] +48; a
 * thread's gct is ~LJ_TTHREAD = 6, a trace's ~LJ_TTRACE = 9.  GCtrace:
 * nsnap +10, snap +48, snapmap +56, szmcode +84, mcode +88; SnapShot (12
 * bytes): mapofs +0, ref +4, mcofs +6, nent +10; its bytecode PC is the
 * 64-bit word at snapmap[mapofs + nent] shifted right 8.  GCproto (104
 * bytes, before its bytecode): sizebc +12, firstline +72, numline +76,
 * lineinfo +80.  The global_State words (vmstate, cur_L, mainthref) and
 * jit_State's trace array are found by scans (lj_g_find, lj_find_traces)
 * and each use is checked by a self-test (profile/safepoint.lua).
 */
#ifndef PE_LJ_LAYOUT_H
#define PE_LJ_LAYOUT_H

#include "pe_core.h"
#include <string.h>

/* LuaJIT's API is 5.1's: against either 5.1's headers (LuaJIT's own or
 * PUC 5.1's, the rock's) on x86-64 the LuaJIT readers are compiled, and
 * the few LuaJIT entries they call are weak references, resolved when the
 * module is loaded: NULL under PUC Lua 5.1.  pe_lj_here: 1 when the
 * interpreter running this module is LuaJIT (luaJIT_profile_start is
 * there, in the object that also holds lua_gettop) */
#if LUA_VERSION_NUM == 501 && defined(__x86_64__)
#define PE_LJ 1
typedef void (*pe_lj_profile_cb)(void *data, lua_State *L, int samples, int vmstate);
extern void luaJIT_profile_start(lua_State *L, const char *mode, pe_lj_profile_cb cb, void *data)
  __attribute__((weak, visibility("default")));
extern void luaJIT_profile_stop(lua_State *L) __attribute__((weak, visibility("default")));
int pe_lj_here(void);
#endif

#include "lj/offsets.h"

/* the process read: pid 0 is this one */
typedef struct lj_mem {
  pid_t pid;
} lj_mem;
static const lj_mem LJ_SELF = { 0 };

/* n bytes at a, 0 when not all of them are mapped (both cases through
 * process_vm_readv: the scans read where nothing is known yet) */
static inline int lj_read(const lj_mem *m, uint64_t a, void *out, size_t n)
{
  return pe_peek(m->pid ? m->pid : getpid(), a, out, n);
}

#define LJ_PEEK_(name, type)                                                \
  static inline type name(const lj_mem *m, uint64_t a)                      \
  {                                                                         \
    type v = 0;                                                             \
    if (!m->pid) return *(volatile type *)(uintptr_t)a;                     \
    pe_peek(m->pid, a, &v, sizeof v);                                       \
    return v;                                                               \
  }
LJ_PEEK_(lj_u64, uint64_t)
LJ_PEEK_(lj_i32, int32_t)
LJ_PEEK_(lj_u16, uint16_t)
LJ_PEEK_(lj_u8, uint8_t)
#undef LJ_PEEK_

/* a 64-bit word at an address that may not be 8-aligned (a snapshot map) */
static inline uint64_t lj_u64_any(const lj_mem *m, uint64_t a)
{
  uint64_t v = 0;
  if (!m->pid) memcpy(&v, (const void *)(uintptr_t)a, sizeof v);
  else pe_peek(m->pid, a, &v, sizeof v);
  return v;
}

/* ---- TValues and GC objects ---- */
static inline uint64_t lj_gcref(uint64_t tv) { return tv & LJ_GCMASK; }
/* an address a GC object may have: mapped above the null page, 8-aligned */
static inline int lj_gcaddr(uint64_t a) { return a >= 0x10000 && !(a & 7); }
static inline int lj_tv_isfunc(uint64_t tv) { return (tv >> 47) == LJ_ITYPE_FUNC; }
/* the object's gct byte, when a may be one */
static inline int lj_gct(const lj_mem *m, uint64_t a) { return lj_gcaddr(a) ? lj_u8(m, a + LJ_FN_GCT) : -1; }
static inline int lj_ffid(const lj_mem *m, uint64_t fn) { return lj_u8(m, fn + LJ_FN_FFID); }
/* a thread of the VM whose G is g */
static inline int lj_thread_of(const lj_mem *m, uint64_t th, uint64_t g)
{
  return lj_gct(m, th) == LJ_GCT_THREAD && lj_u64(m, th + LJ_L_G) == g;
}

/* ---- frames (lj_frame.h, GC64) ----
 * a frame's slot holds its link (ftsz): a Lua frame's is its caller's PC
 * (low bits 0), any other's the frame's size in bytes with its type in the
 * low 3 bits (FRAME_VARG 3); the slot below holds the function */
static inline int lj_frame_isvarg(int64_t ftsz) { return (ftsz & 7) == LJ_FRAME_VARG; }
/* the frame below the one at frame (its link ftsz): one slot above the
 * caller's base */
uint64_t lj_frame_prev(const lj_mem *m, uint64_t frame, int64_t ftsz);
/* the builtin or C function whose frame has BASE base in thread l: base
 * must lie in l's stack and the slot below its link hold a function that
 * is not a Lua one; 0, or the GCfunc and *slot (its frame's slot in l's
 * stack) */
uint64_t lj_cfunc_at(const lj_mem *m, uint64_t l, uint64_t base, uint32_t *slot);

/* ---- global_State ----
 * g: G; curl: &G->cur_L; vmstate: &G->vmstate; mainth: &G->mainthref, or
 * 0 when the word found there is not a thread of this LuaJIT state */
typedef struct lj_gstate {
  uint64_t g, curl, vmstate, mainth;
} lj_gstate;
static inline uint64_t lj_g_of(const lj_mem *m, uint64_t l) { return lj_u64(m, l + LJ_L_G); }
/* G's words, found from thread l that runs a C function now (cur_L is l):
 * cur_L the last word of G's first 4 KiB equal to l and followed by a NULL
 * jit_base, vmstate the one int32 before it holding ~LJ_VMST_C, mainthref
 * the next 8-byte word.  NULL, or why not */
const char *lj_g_find(const lj_mem *m, uint64_t l, lj_gstate *out);

/* ---- traces ----
 * &J->trace: a word among the first 64 KiB after G that points to an array
 * whose slot t holds a trace of machine code mc, size sz, with sizetrace
 * > t 12 bytes after it; 0 unless exactly one */
uint64_t lj_find_traces(const lj_mem *m, uint64_t g, uint32_t t, uint64_t mc, uint32_t sz);
/* &J->trace as lj_find_traces finds it, knowing of trace t only its
 * number (GCtrace.traceno): for a reader that has not seen the trace */
uint64_t lj_find_traces_no(const lj_mem *m, uint64_t g, uint32_t t);
/* trace t from the array at jtrace (&J->trace), or 0 */
uint64_t lj_trace(const lj_mem *m, uint64_t jtrace, int32_t t);
/* the bytecode PC of snapshot s (its address) of trace tr */
uint64_t lj_snap_pc(const lj_mem *m, uint64_t tr, uint64_t s);
/* the bytecode PC of the snapshot of trace t whose machine code holds ip
 * (lj_trace_unwind's search: the last snapshot starting at or before it),
 * or, ip being in a helper the trace called, of the return address into
 * the trace among the LJ_RET_WORDS words above sp; 0 when none */
uint64_t lj_trace_pc(const lj_mem *m, uint64_t jtrace, int32_t t, uint64_t ip, uint64_t sp);
/* the same with the n words above sp given (read at a sample) */
uint64_t lj_trace_pc_w(const lj_mem *m, uint64_t jtrace, int32_t t, uint64_t ip, const uint64_t *words, int n);

/* ---- prototypes ----
 * the line of bytecode PC pc in Lua function fn (lj_debug_line), or -1
 * when pc is not one of fn's */
int32_t lj_pc_line(const lj_mem *m, uint64_t fn, uint64_t pc);
/* the prototype (GCproto) whose bytecode holds pc, searched backwards
 * from pc over at most 2^16 instructions, each candidate checked (its gct,
 * sizebc, a chunk name that is a string, its lines); 0 when none */
uint64_t lj_proto_of_pc(const lj_mem *m, uint64_t pc);
/* the line of bytecode PC pc in prototype pt, -1 when not one of its */
int32_t lj_pt_line(const lj_mem *m, uint64_t pt, uint64_t pc);
/* the same from the prototype's header, read already (LJ_PT_SIZE bytes at pt) */
int32_t lj_pt_line_h(const lj_mem *m, uint64_t pt, const uint8_t *hdr, uint64_t pc);
/* a GCstr's bytes (at most n - 1, NUL-terminated) into out; 0 when s is not
 * a readable string */
int lj_str(const lj_mem *m, uint64_t s, char *out, size_t n);

#endif /* PE_LJ_LAYOUT_H */
