/*
 * lj/layout.c - reading LuaJIT 2.1 (GC64, x86-64) state through an
 * lj_mem: frame links, a C function's frame, global_State's words, the
 * trace array, snapshots, a prototype's lines (lj/layout.h says the
 * layout); and whether LuaJIT is the interpreter that loaded this module.
 */
#define _GNU_SOURCE
#include "lj/layout.h"

#ifdef PE_LJ
#include <dlfcn.h>

int pe_lj_here(void)
{
  static int known = -1;
  if (known < 0) {
    Dl_info a, b;
    known = luaJIT_profile_start != NULL && luaJIT_profile_stop != NULL
            && dladdr((void *)(uintptr_t)luaJIT_profile_start, &a) && dladdr((void *)(uintptr_t)lua_gettop, &b)
            && a.dli_fbase == b.dli_fbase;
  }
  return known;
}
#endif

uint64_t lj_frame_prev(const lj_mem *m, uint64_t frame, int64_t ftsz)
{
  if ((ftsz & 3) == 0) {        /* Lua frame: the link is the caller's PC */
    uint32_t ins = (uint32_t)lj_i32(m, (uint64_t)ftsz - 4);
    return frame - 8 * (2 + ((ins >> 8) & 0xff));
  }
  return frame - (uint64_t)(ftsz & ~(int64_t)7);
}

uint64_t lj_cfunc_at(const lj_mem *m, uint64_t l, uint64_t base, uint32_t *slot)
{
  uint64_t stack = lj_u64(m, l + LJ_L_STACK), size = (uint64_t)(uint32_t)lj_i32(m, l + LJ_L_SIZE), tv, fn;
  if (base < stack + 24 || (base & 7) || base >= stack + 8 * size) return 0;
  tv = lj_u64(m, base - 16);
  if (!lj_tv_isfunc(tv)) return 0;
  fn = lj_gcref(tv);
  if (lj_gct(m, fn) != LJ_GCT_FUNC || lj_ffid(m, fn) == 0) return 0;
  *slot = (uint32_t)((base - stack) / 8 - 1);
  return fn;
}

const char *lj_g_find(const lj_mem *m, uint64_t l, lj_gstate *out)
{
  uint64_t g = lj_g_of(m, l), mt;
  int k, cur = -1, vm = -1, nvm = 0;
  if (!g) return "no global_State";
  for (k = 0; k < 511; k++)
    if (lj_u64(m, g + 8 * k) == l && lj_u64(m, g + 8 * (k + 1)) == 0) cur = k;
  if (cur < 0) return "G->cur_L not found";
  for (k = 0; k < cur * 2; k++)
    if (lj_i32(m, g + 4 * k) == LJ_VMST_C) { vm = k; nvm++; }
  if (nvm != 1) return "G->vmstate not found";
  out->g = g;
  out->curl = g + 8 * (uint64_t)cur;
  out->vmstate = g + 4 * (uint64_t)vm;
  out->mainth = (out->vmstate + 4 + 7) & ~(uint64_t)7;
  mt = lj_gcref(lj_u64(m, out->mainth));
  if (!lj_thread_of(m, mt, g)) out->mainth = 0;
  return NULL;
}

uint64_t lj_find_traces(const lj_mem *m, uint64_t g, uint32_t t, uint64_t mc, uint32_t sz)
{
  uint64_t w[512], found = 0, at;
  int nfound = 0;
  /* chunks overlap by a word: a field pair across two is seen whole */
  for (at = g; at < g + 65536 && lj_read(m, at, w, sizeof w); at += sizeof w - 8) {
    int k;
    for (k = 0; k + 1 < 512; k++) {
      uint64_t tr, mcode;
      uint32_t size = (uint32_t)(w[k + 1] >> 32), msz;
      uint8_t gct;
      if (!lj_gcaddr(w[k]) || size <= t || size > (1u << 20)) continue;
      if (!lj_read(m, w[k] + 8 * (uint64_t)t, &tr, 8) || !lj_gcaddr(tr)) continue;
      if (!lj_read(m, tr + LJ_FN_GCT, &gct, 1) || gct != LJ_GCT_TRACE) continue;
      if (!lj_read(m, tr + LJ_T_MCODE, &mcode, 8) || mcode != mc || !lj_read(m, tr + LJ_T_SZMCODE, &msz, 4)
          || msz != sz)
        continue;
      found = at + 8 * (uint64_t)k;
      nfound++;
    }
  }
  return nfound == 1 ? found : 0;
}

uint64_t lj_find_traces_no(const lj_mem *m, uint64_t g, uint32_t t)
{
  uint64_t w[512], found = 0, at;
  int nfound = 0;
  for (at = g; at < g + 65536 && lj_read(m, at, w, sizeof w); at += sizeof w - 8) {
    int k;
    for (k = 0; k + 1 < 512; k++) {
      uint64_t tr;
      uint32_t size = (uint32_t)(w[k + 1] >> 32);
      uint16_t no;
      uint8_t gct;
      if (!lj_gcaddr(w[k]) || size <= t || size > (1u << 20)) continue;
      if (!lj_read(m, w[k] + 8 * (uint64_t)t, &tr, 8) || !lj_gcaddr(tr)) continue;
      if (!lj_read(m, tr + LJ_FN_GCT, &gct, 1) || gct != LJ_GCT_TRACE) continue;
      if (!lj_read(m, tr + LJ_T_TRACENO, &no, 2) || no != t) continue;
      found = at + 8 * (uint64_t)k;
      nfound++;
    }
  }
  return nfound == 1 ? found : 0;
}

uint64_t lj_trace(const lj_mem *m, uint64_t jtrace, int32_t t)
{
  uint64_t arr, tr;
  if (!jtrace || t <= 0) return 0;
  arr = lj_u64(m, jtrace);
  if (!arr || (uint32_t)t >= (uint32_t)lj_i32(m, jtrace + 12)) return 0;
  tr = lj_u64(m, arr + 8 * (uint64_t)t);
  return tr && lj_u8(m, tr + LJ_FN_GCT) == LJ_GCT_TRACE ? tr : 0;
}

uint64_t lj_snap_pc(const lj_mem *m, uint64_t tr, uint64_t s)
{
  uint64_t map = lj_u64(m, tr + LJ_T_SNAPMAP);
  uint64_t ent = (uint64_t)(uint32_t)lj_i32(m, s) + lj_u8(m, s + LJ_SNAP_NENT);
  return lj_u64_any(m, map + 4 * ent) >> 8;
}

/* the PC of trace tr's snapshot for machine code offset ofs */
static uint64_t lj_snap_at(const lj_mem *m, uint64_t tr, uint32_t ofs)
{
  uint64_t snap;
  uint32_t lo, hi;
  snap = lj_u64(m, tr + LJ_T_SNAP);
  hi = lj_u16(m, tr + LJ_T_NSNAP);
  if (!snap || !hi) return 0;
  for (lo = 0; lo < hi;) {
    uint32_t mid = (lo + hi) / 2;
    if (ofs < lj_u16(m, snap + LJ_SNAP_SIZE * (uint64_t)mid + LJ_SNAP_MCOFS)) hi = mid; else lo = mid + 1;
  }
  if (lo == 0) return 0;
  return lj_snap_pc(m, tr, snap + LJ_SNAP_SIZE * (uint64_t)(lo - 1));
}

/* trace t's snapshot PC for ip, or for the first return address into its
 * machine code among n words: words[], or read at sp when words is NULL
 * (one at a time: the signal handler stops at the first that answers) */
static uint64_t lj_trace_pc_of(const lj_mem *m, uint64_t jtrace, int32_t t, uint64_t ip, uint64_t sp,
                               const uint64_t *words, int n)
{
  uint64_t tr = lj_trace(m, jtrace, t), mc;
  uint32_t sz;
  int k;
  if (!tr) return 0;
  mc = lj_u64(m, tr + LJ_T_MCODE);
  sz = (uint32_t)lj_i32(m, tr + LJ_T_SZMCODE);
  for (k = 0; ip - mc >= sz; k++) {
    if (k == n) return 0;
    ip = words ? words[k] : lj_u64(m, sp + 8 * (uint64_t)k);
  }
  return lj_snap_at(m, tr, (uint32_t)(ip - mc));
}

uint64_t lj_trace_pc(const lj_mem *m, uint64_t jtrace, int32_t t, uint64_t ip, uint64_t sp)
{
  return lj_trace_pc_of(m, jtrace, t, ip, sp, NULL, LJ_RET_WORDS);
}

uint64_t lj_trace_pc_w(const lj_mem *m, uint64_t jtrace, int32_t t, uint64_t ip, const uint64_t *words, int n)
{
  return lj_trace_pc_of(m, jtrace, t, ip, 0, words, n);
}

int32_t lj_pc_line(const lj_mem *m, uint64_t fn, uint64_t pc)
{
  uint64_t bc = lj_u64(m, fn + LJ_FNL_PC);
  if (bc < 0x10000 || (bc & 3)) return -1;
  return lj_pt_line(m, bc - LJ_PT_SIZE, pc);
}

int32_t lj_pt_line(const lj_mem *m, uint64_t pt, uint64_t pc)
{
  uint64_t bc = pt + LJ_PT_SIZE, li;
  uint32_t size, pos, numline;
  int32_t first;
  if (m->pid) {
    /* another process: its header in one read */
    uint8_t hdr[LJ_PT_SIZE];
    if (!lj_read(m, pt, hdr, sizeof hdr)) return -1;
    return lj_pt_line_h(m, pt, hdr, pc);
  }
  size = (uint32_t)lj_i32(m, pt + LJ_PT_SIZEBC);
  if (pc < bc || pc - bc >= 4 * (uint64_t)size || (pc & 3)) return -1;
  pos = (uint32_t)((pc - bc) / 4);
  li = lj_u64(m, pt + LJ_PT_LINEINFO);
  first = lj_i32(m, pt + LJ_PT_FIRSTLINE);
  numline = (uint32_t)lj_i32(m, pt + LJ_PT_NUMLINE);
  if (!li) return -1;
  if (pos-- == 0) return first;
  if (numline < 256) return first + (int32_t)lj_u8(m, li + pos);
  if (numline < 65536) return first + (int32_t)lj_u16(m, li + 2 * (uint64_t)pos);
  return first + lj_i32(m, li + 4 * (uint64_t)pos);
}

int32_t lj_pt_line_h(const lj_mem *m, uint64_t pt, const uint8_t *hdr, uint64_t pc)
{
  uint64_t bc = pt + LJ_PT_SIZE, li;
  uint32_t size, pos, numline;
  int32_t first;
  memcpy(&size, hdr + LJ_PT_SIZEBC, 4);
  if (pc < bc || pc - bc >= 4 * (uint64_t)size || (pc & 3)) return -1;
  pos = (uint32_t)((pc - bc) / 4);
  memcpy(&li, hdr + LJ_PT_LINEINFO, 8);
  memcpy(&first, hdr + LJ_PT_FIRSTLINE, 4);
  memcpy(&numline, hdr + LJ_PT_NUMLINE, 4);
  if (!li) return -1;
  if (pos-- == 0) return first;
  if (numline < 256) return first + (int32_t)lj_u8(m, li + pos);
  if (numline < 65536) return first + (int32_t)lj_u16(m, li + 2 * (uint64_t)pos);
  return first + lj_i32(m, li + 4 * (uint64_t)pos);
}

int lj_str(const lj_mem *m, uint64_t s, char *out, size_t n)
{
  size_t k;
  if (n == 0 || lj_gct(m, s) != LJ_GCT_STR) return 0;
  /* a page at a time: the string's end may be the mapping's */
  for (k = 0; k + 1 < n; ) {
    uint64_t a = s + LJ_STR_DATA + k;
    size_t chunk = 4096 - (size_t)(a & 4095), j;
    if (chunk > n - 1 - k) chunk = n - 1 - k;
    if (!lj_read(m, a, out + k, chunk)) break;
    for (j = 0; j < chunk; j++)
      if (out[k + j] == 0) return 1;
    k += chunk;
  }
  out[k] = 0;
  return k > 0;
}

/* the prototype whose header is hdr (read at pt), k instructions before
 * pc: its type, size, lines and name check, and pc has a line in it */
static int lj_pt_at(const lj_mem *m, uint64_t pt, const uint8_t *hdr, uint32_t k, uint64_t pc)
{
  uint64_t name;
  uint32_t sizebc;
  int32_t numline;
  if (hdr[LJ_FN_GCT] != LJ_GCT_PROTO) return 0;
  memcpy(&sizebc, hdr + LJ_PT_SIZEBC, 4);
  memcpy(&name, hdr + LJ_PT_CHUNKNAME, 8);
  memcpy(&numline, hdr + LJ_PT_NUMLINE, 4);
  if (sizebc <= k || numline < 0 || lj_gct(m, lj_gcref(name)) != LJ_GCT_STR) return 0;
  return lj_pt_line_h(m, pt, hdr, pc) >= 0;
}

uint64_t lj_proto_of_pc(const lj_mem *m, uint64_t pc)
{
  /* the candidates' headers a block at a time (one read for 1024 of
   * them: another process's memory costs a system call a read) */
  enum { NB = 1024 };
  uint8_t buf[4 * (NB - 1) + LJ_PT_SIZE];
  uint32_t k = 0, n, j;
  if (pc < 0x10000 + LJ_PT_SIZE || (pc & 3)) return 0;
  while (k < 65536) {
    uint64_t hi = pc - 4 * (uint64_t)k - LJ_PT_SIZE, lo;
    n = NB;
    if (n > 65536 - k) n = 65536 - k;
    if (hi < 0x10000) return 0;
    if ((hi - 0x10000) / 4 + 1 < n) n = (uint32_t)((hi - 0x10000) / 4 + 1);
    lo = hi - 4 * (uint64_t)(n - 1);
    if (lj_read(m, lo, buf, 4 * (size_t)(n - 1) + LJ_PT_SIZE)) {
      for (j = 0; j < n; j++)
        if (lj_pt_at(m, hi - 4 * (uint64_t)j, buf + 4 * (n - 1 - j), k + j, pc)) return hi - 4 * (uint64_t)j;
    } else {
      for (j = 0; j < n; j++) {
        uint8_t hdr[LJ_PT_SIZE];
        uint64_t pt = hi - 4 * (uint64_t)j;
        if (lj_read(m, pt, hdr, sizeof hdr) && lj_pt_at(m, pt, hdr, k + j, pc)) return pt;
      }
    }
    k += n;
  }
  return 0;
}
