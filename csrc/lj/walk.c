/*
 * lj/walk.c - the safe point's capture (luaJIT_profile_callback): at the
 * VM's next instruction after a signal, the frames of L are walked in
 * O(depth) (lj/layout.h's frame links), each Lua frame's chunk and lines
 * asked of lua_getinfo with an i_ci filled as lua_getstack does (LuaJIT's
 * own line logic kept), a coroutine's frames joined under the frames of
 * the threads that resumed it, from the main thread down; the stack is
 * interned (lj/intern.c) and the pending signal records (lj/signal.c) get
 * its id, a trace's sample its snapshot's line.
 */
#include "lj/safe.h"

#ifdef PE_LJ

ls_fr ls_frames[LS_MAXF];
static uint32_t ls_words[2 + 6 * LS_MAXF];
uint64_t ls_resume_fn;
int ls_wrap_ffid = -1;
uint64_t ls_root;
uint64_t ls_ns, ls_ncap, ls_njoin, ls_nunjoined;
uint64_t ls_ncapslow;             /* captures preempted (> 1 ms), not in ls_ns */

/* one frame of thread l, at slot off, of function fn (its link ftsz,
 * size slots to the frame above), into f; 0 when lua_getinfo fails */
static int ls_frame(lua_State *L, ls_fr *f, uint64_t l, uint64_t fn, ptrdiff_t off, ptrdiff_t size, int *nlua)
{
  int ffid = lj_ffid(&LJ_SELF, fn);
  memset(f, 0, sizeof *f);
  f->l = l;
  f->off = (uint32_t)off;
  if (ffid == 0) {
    lua_Debug ar;
    memset(&ar, 0, sizeof ar);
    ar.i_ci = (int)((size << 16) + off);
    if (!lua_getinfo(L, "Sl", &ar)) return 0;
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
      uint64_t cf = lj_u64(&LJ_SELF, fn + LJ_FNC_F);
      f->w[4] = (uint32_t)cf;
      f->w[5] = (uint32_t)(cf >> 32);
    }
  }
  return 1;
}

/* Walks L's frames, leaf first, into out (at most max); returns how many,
 * *trunc set when frames were left out. lj_debug_frame's traversal: dummy
 * frames (the thread itself as function) are skipped, and the frame below
 * a vararg frame (its pseudo-frame). */
static int ls_walk(lua_State *L, ls_fr *out, int max, int *nlua, int *trunc)
{
  uint64_t l = (uint64_t)(uintptr_t)L;
  uint64_t stack = lj_u64(&LJ_SELF, l + LJ_L_STACK);
  uint64_t frame = lj_u64(&LJ_SELF, l + LJ_L_BASE) - 8, next = 0, bot = stack + 8;
  int n = 0, skip = 0;
  while (frame > bot) {
    uint64_t fn = lj_gcref(lj_u64(&LJ_SELF, frame - 8));
    int64_t ftsz = (int64_t)lj_u64(&LJ_SELF, frame);
    uint64_t prev = lj_frame_prev(&LJ_SELF, frame, ftsz);
    if (fn != l && !skip) {
      ptrdiff_t off = (ptrdiff_t)((frame - stack) / 8), size = next ? (ptrdiff_t)((next - frame) / 8) : 0;
      if (n == max || *nlua == LS_MAXLUA || off > 0xffff || size > 0xffff) { *trunc = 1; break; }
      if (!ls_frame(L, &out[n], l, fn, off, size, nlua)) { *trunc = 1; break; }
      n++;
    }
    skip = lj_frame_isvarg(ftsz);    /* the frame below is its pseudo-frame */
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
  uint64_t base = lj_u64(&LJ_SELF, r + LJ_L_BASE), stack = lj_u64(&LJ_SELF, r + LJ_L_STACK), fn, th = 0;
  if (base < stack + 24 || (base & 7)) return 0;
  fn = lj_gcref(lj_u64(&LJ_SELF, base - 16));
  if (lj_gct(&LJ_SELF, fn) != LJ_GCT_FUNC) return 0;
  if (fn == ls_resume_fn) th = lj_gcref(lj_u64(&LJ_SELF, base));
  else if (ls_wrap_ffid > 1 && lj_ffid(&LJ_SELF, fn) == ls_wrap_ffid) th = lj_gcref(lj_u64(&LJ_SELF, fn + LJ_FNC_UV0));
  if (lj_gct(&LJ_SELF, th) != LJ_GCT_THREAD) return 0;
  return th;
}

int ls_stack_of(lua_State *L, uint32_t *flags)
{
  uint64_t chain[LS_MAXTH], root = ls_gs.mainth ? lj_gcref(lj_u64(&LJ_SELF, ls_gs.mainth)) : ls_root;
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
  uint64_t ctx;            /* lua_getexdata(L), or 0 */
} ls_cap;

void *(*ls_exdata)(lua_State *L);

/* completes record r with the capture's stack */
static void ls_complete(ls_cap *c, ls_rec *r)
{
  int n;
  if (c->n < 0) { c->n = ls_stack_of(c->L, &c->flags); c->full = ls_intern_frames(c->n, c->flags); }
  n = c->n;
  r->stack = c->full;
  r->ctx = c->ctx;
  if (r->bcpc && n > 0 && ls_frames[n - 1].w[0] == LS_FLUA) {
    /* a sample in a trace: the line its machine code was at, when in
     * the function the capture found running (the trace has no check
     * between a function's lines) */
    int32_t line = lj_pc_line(&LJ_SELF, ls_frames[n - 1].fn, r->bcpc);
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

/* the safe point: the pending records of every armed profile get the
 * stack of L.  A second pass takes the records of the signals that came
 * meanwhile (two profiles' clocks in step: the kernel restarts both
 * together after the thread was switched out, and one's samples then fall
 * in the other's capture, 40-60 % of them in a loaded run); one that comes
 * after it arms the hook as usual */
void ls_capture(void *data, lua_State *L, int samples, int vmstate)
{
  uint64_t t0 = ls_now(), d;
  ls_cap c = { L, -1, 0, 0, 0, -1, 0 };
  (void)data; (void)samples; (void)vmstate;
  /* OpenResty's LuaJIT: the thread's exdata, which lua-nginx-module sets
   * to the request each coroutine runs for (the route of luasafe_route) */
  if (ls_exdata) c.ctx = (uint64_t)(uintptr_t)ls_exdata(L);
  ls_in_cap = 1;
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  ls_complete_all(&c);
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  ls_in_cap = 0;
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  ls_complete_all(&c);
  /* a capture of more than 1 ms was preempted (CLOCK_MONOTONIC time on
   * shared CPUs): counted apart, its time left out */
  d = ls_now() - t0;
  if (d < 1000000) { ls_ns += d; ls_ncap++; }
  else ls_ncapslow++;
}
#endif
