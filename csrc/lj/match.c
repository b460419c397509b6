/*
 * lj/match.c - a drain of a safe-point profile (luasafe_take): the
 * event's ring skimmed (its samples counted and queued by time and ip,
 * through ring.c), the completed signal records taken (lj/signal.c) and
 * each matched to the ring samples it stands for (ls_cover), the distinct
 * samples keyed, and the stacks and chunk names not yet handed out
 * (lj/intern.c) pushed to Lua with the counters.
 */
#include "lj/safe.h"
#include "pe_records.h"

#ifdef PE_LJ

/* the distinct samples of one take: a record's key (stack, leaf, cut,
 * out, whether a trace ran, ip, the VM state's class, the route or else
 * the request) and how many records had it, with a block profile's wait */
typedef struct ls_key {
  uint64_t ip, leaf, ctx, ns;
  uint32_t stack, count, route;
  uint8_t cut, out, trace, vm, used;
} ls_key;
static ls_key ls_keys[LS_SLOTS];
static uint32_t ls_khash[2 * LS_SLOTS];   /* key index + 1, or 0 (all 0 between takes) */
static uint32_t ls_kslot[LS_SLOTS];       /* the ls_khash slot of each key, to clear it */
static uint32_t ls_order[2 * LS_SLOTS];  /* a record's key, once per sample it stands for (ls_l_take) */

void ls_queue(ls_sq *q, uint64_t t, uint64_t ip)
{
  uint32_t k = q->head % LS_SLOTS;
  if (q->head - q->tail == LS_SLOTS) q->tail++;   /* the oldest unmatched goes */
  q->t[k] = t;
  q->ip[k] = ip;
  q->head++;
}

/* how many samples the record of a signal whose handler ran at time, at
 * ip, stands for (see ls_l_take): it takes the queued samples taken before
 * it; the ones at its ip are its own, and so are those in the kernel (the
 * upper half: the thread was in a system call or a fault, whose return to
 * user space is where the one pending signal came, at the user ip the
 * kernel went back to) (q->matched counts the records that found one); at
 * least 1 */
uint32_t ls_cover(ls_sq *q, uint64_t time, uint64_t ip)
{
  uint32_t w = 0;
  while (q->tail != q->head && q->t[q->tail % LS_SLOTS] <= time) {
    uint64_t at = q->ip[q->tail % LS_SLOTS];
    if (at == ip || at >> 63) w++;
    q->tail++;
  }
  if (w) q->matched++;
  return w ? w : 1;
}

/* a switch record of a block profile: a voluntary switch-out (the thread
 * waits: not preempted) starts a wait, the next switch-in ends it */
static void ls_wait(ls_bq *b, uint16_t misc, uint64_t t)
{
  if (misc & PE_RECORD_MISC_SWITCH_OUT) {
    b->out_t = (misc & PE_RECORD_MISC_SWITCH_OUT_PREEMPT) ? 0 : t;
  } else if (b->out_t) {
    uint32_t k = b->head % LS_SLOTS;
    if (b->head - b->tail == LS_SLOTS) b->tail++;   /* the oldest unclaimed goes */
    b->t[k] = t;
    b->ns[k] = t > b->out_t ? t - b->out_t : 0;
    b->head++;
    b->out_t = 0;
  }
}

/* the waits that ended before time: a block profile's record (its SIGTRAP
 * came on the thread's way back to user space) stands for them */
static uint64_t ls_waited(ls_bq *b, uint64_t time)
{
  uint64_t ns = 0;
  while (b->tail != b->head && b->t[b->tail % LS_SLOTS] <= time) ns += b->ns[b->tail++ % LS_SLOTS];
  return ns;
}

/* ls_routes' index of the ended requests: by request, the first of its
 * entries in p->done and each entry's next one (all 0 between calls) */
#define LS_RHASH (2 * LS_DONE_MAX)
static uint64_t ls_rkey[LS_RHASH];
static uint32_t ls_rfirst[LS_RHASH], ls_rlast[LS_RHASH];   /* entry index + 1, or 0 */
static uint32_t ls_rnext[LS_DONE_MAX];
static uint32_t ls_rused[LS_DONE_MAX];   /* the slots taken, to clear them (a probe stops at a cleared one) */

static uint32_t ls_rslot(uint64_t ctx)
{
  uint32_t h = (uint32_t)((ctx >> 4) * 0x9e3779b1u) & (LS_RHASH - 1);
  while (ls_rfirst[h] && ls_rkey[h] != ctx) h = (h + 1) & (LS_RHASH - 1);
  return h;
}

/* a request's address is reused once it ended: a record of a request
 * takes the route of the first entry of its address that ended after the
 * record's signal */
void ls_routes(ls_prof *p)
{
  uint32_t i, head, h, j, nused = 0;
  if (!p->ndone) return;
  for (i = 0; i < p->ndone; i++) {       /* entries in time order: chains oldest first */
    h = ls_rslot(p->done[i].ctx);
    ls_rnext[i] = 0;
    if (!ls_rfirst[h]) { ls_rkey[h] = p->done[i].ctx; ls_rfirst[h] = i + 1; ls_rused[nused++] = h; }
    else ls_rnext[ls_rlast[h] - 1] = i + 1;
    ls_rlast[h] = i + 1;
  }
  __atomic_signal_fence(__ATOMIC_ACQUIRE);
  head = p->head;
  for (i = p->tail; i != head; i++) {
    ls_rec *r = &p->ring[i % LS_SLOTS];
    if (r->state != LS_DONE || !r->ctx || r->route) continue;
    h = ls_rslot(r->ctx);
    for (j = ls_rfirst[h]; j; j = ls_rnext[j - 1])
      if (p->done[j - 1].t >= r->time) { r->route = p->done[j - 1].route; break; }
  }
  for (i = 0; i < nused; i++) {
    h = ls_rused[i];
    ls_rfirst[h] = ls_rlast[h] = 0;
    ls_rkey[h] = 0;
  }
  p->ndone = 0;
}

/* the class of a G->vmstate: 1 interpreted, 2 compiled, 3 C (a C
 * function, a builtin, code outside the VM), 4 GC, 5 the JIT compiler
 * (recording, optimising, assembling, a trace exit); 0 not known */
static uint8_t ls_vm_class(const ls_rec *r)
{
  if (r->out) return 3;
  if (r->vms > 0) return 2;
  switch (r->vms) {
  case LJ_VMST_INTERP: return r->leaf ? 3 : 1;
  case LJ_VMST_C: return 3;
  case LJ_VMST_GC: return 4;
  case 0: return 0;
  default: return 5;
  }
}

static void ls_push_num(lua_State *L, int t, int i, uint64_t v)
{
  lua_pushnumber(L, (lua_Number)v);        /* addresses: 47 bits, exact */
  lua_rawseti(L, t, i);
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

/* the event's ring (at stack index 2): its samples counted, their time
 * and ip queued on p's queue */
static uint64_t ls_skim(lua_State *L, pe_event *ev, ls_prof *p)
{
  const unsigned char *rec;
  int len;
  uint64_t nring = 0;
  if (ev->fd < 0 || !(ev->scratch || pe_ring_ready(L, ev) || (lua_pop(L, 1), 0))) return 0;
  while ((len = pe_ring_next(ev, &rec)) > 0) {
    struct pe_event_header h;
    memcpy(&h, rec, sizeof h);
    if (h.type == PE_RECORD_SWITCH && p->block && len >= 24) {
      uint64_t tm;
      memcpy(&tm, rec + 16, 8);    /* sample_id: pid, tid, then the time */
      ls_wait(&p->bq, h.misc, tm);
      continue;
    }
    if (h.type != PE_RECORD_SAMPLE) continue;
    nring++;
    if (len >= 32) {     /* ip|tid|time: the ip at 8, the time at 24 */
      uint64_t ip, tm;
      memcpy(&ip, rec + 8, 8);
      memcpy(&tm, rec + 24, 8);
      ls_queue(&p->q, tm, ip);
    }
  }
  return nring;
}

/* the key of record r among ls_keys[0, *nk) (added when new): its index + 1 */
static uint32_t ls_key_of(const ls_rec *r, uint32_t *nk)
{
  ls_key k;
  uint32_t h, j, hw[10];
  memset(&k, 0, sizeof k);
  k.ip = r->ip;
  k.stack = r->state == LS_DONE ? r->stack : 0;
  k.leaf = r->leaf;
  k.cut = r->cut;
  k.out = r->out;
  k.trace = r->vms >= 0;
  k.vm = ls_vm_class(r);
  k.route = r->route;
  k.ctx = r->route ? 0 : r->ctx;
  memcpy(hw, &k.ip, 8);
  memcpy(hw + 2, &k.leaf, 8);
  memcpy(hw + 4, &k.ctx, 8);
  hw[6] = k.stack;
  hw[7] = k.route;
  hw[8] = (uint32_t)k.cut | (uint32_t)k.out << 8 | (uint32_t)k.trace << 16 | (uint32_t)k.vm << 24;
  hw[9] = 0;
  h = ls_hashw(hw, 10) & (2 * LS_SLOTS - 1);
  while ((j = ls_khash[h]) != 0) {
    ls_key *e = &ls_keys[j - 1];
    if (e->ip == k.ip && e->leaf == k.leaf && e->stack == k.stack && e->cut == k.cut && e->out == k.out
        && e->trace == k.trace && e->vm == k.vm && e->route == k.route && e->ctx == k.ctx)
      return j;
    h = (h + 1) & (2 * LS_SLOTS - 1);
  }
  k.count = 0;
  ls_keys[*nk] = k;
  ls_kslot[*nk] = h;
  ls_khash[h] = ++*nk;
  return *nk;
}

#define LS_KEYW 11   /* numbers a key in luasafe_take's keys */
static void ls_push_keys(lua_State *L, uint32_t nk, uint32_t no, int keep)
{
  uint32_t i;
  int t, b;
  lua_createtable(L, (int)(LS_KEYW * nk), 0);
  t = lua_gettop(L);
  for (i = 0; i < nk; i++) {
    ls_key *e = &ls_keys[i];
    b = (int)(LS_KEYW * i);
    ls_push_num(L, t, b + 1, e->stack);
    ls_push_num(L, t, b + 2, e->leaf);
    ls_push_num(L, t, b + 3, e->cut);
    ls_push_num(L, t, b + 4, e->out);
    ls_push_num(L, t, b + 5, e->trace);
    ls_push_num(L, t, b + 6, e->ip);
    ls_push_num(L, t, b + 7, e->count);
    ls_push_num(L, t, b + 8, e->vm);
    ls_push_num(L, t, b + 9, e->route);
    ls_push_num(L, t, b + 10, e->ctx);
    ls_push_num(L, t, b + 11, e->ns);
  }
  lua_createtable(L, keep ? (int)no : 0, 0);
  t = lua_gettop(L);
  if (keep) for (i = 0; i < no; i++) ls_push_num(L, t, (int)i + 1, ls_order[i]);
}

#define LS_SETN(name, v) (lua_pushnumber(L, (lua_Number)(v)), lua_setfield(L, -2, name))
static void ls_push_stats(lua_State *L, const pe_event *ev, const ls_prof *p, uint64_t nring, uint32_t nr,
                          uint32_t pending)
{
  lua_createtable(L, 0, 20);
  LS_SETN("nstacks", ls_nstacks);
  LS_SETN("nchunks", ls_nchunks);
  LS_SETN("capture_ns", ls_ns);
  LS_SETN("captures", ls_ncap);
  LS_SETN("captures_slow", ls_ncapslow);
  LS_SETN("handler_ns", ls_hns);
  LS_SETN("handlers", ls_nh);
  LS_SETN("handlers_slow", ls_nhslow);
  LS_SETN("joined", ls_njoin);
  LS_SETN("unjoined", ls_nunjoined);
  LS_SETN("ring_samples", nring);
  LS_SETN("lost", ev->lost + ev->lost_samples);
  LS_SETN("records", nr);
  LS_SETN("pending", pending);
  LS_SETN("dropped", p->dropped);
  LS_SETN("merged", p->merged);
  LS_SETN("matched", p->q.matched);
  LS_SETN("throttled", ls_throttled);
  LS_SETN("unstuck", pe_ljhook_repaired());
}
#undef LS_SETN

/* _private.luasafe_take(slot, event, nstacks, nchunks, final, keep) ->
 * keys, order, stacks, chunks, stats.
 * Reads the event's ring (its samples counted: stats.ring_samples, their
 * time and ip queued; its LOST records counted by the ring code), then
 * takes the signal records whose capture is done (all of them when final):
 * keys is a flat array, 11 numbers per distinct sample (stack id or 0, leaf
 * GCfunc or 0, cut, out, trace, ip, count, the VM state's class (ls_vm_class),
 * route id or 0, the request (lua_getexdata) when no route, a block
 * profile's wait in ns); order (keep only) the key
 * index of each sample in turn; stacks id -> words for the ids above
 * nstacks, chunks id -> name above nchunks.
 * A record stands for the ring's samples taken since the record before it
 * and at the ip its signal interrupted: the kernel sends one signal for
 * samples taken before it could send the first (its timer interrupt, late
 * in a VM, takes two periods' samples at once; one wakeup, or one pending
 * SIGTRAP), and the thread has not run in between, so the record's stack
 * is theirs too (stats.merged: those samples, since the arm). Samples at
 * another ip have no record (the Lua side counts them "[no signal]") */
int ls_l_take(lua_State *L)
{
  int slot = pe_check_int(L, 1, "slot", 1, LS_MAXP) - 1;
  pe_event *ev = pe_to_event(L, 2);
  uint32_t ks = (uint32_t)pe_check_int(L, 3, "nstacks", 0, 0x7fffffff);
  uint32_t kc = (uint32_t)pe_check_int(L, 4, "nchunks", 0, 0x7fffffff);
  int final = lua_toboolean(L, 5), keep = lua_toboolean(L, 6);
  ls_prof *p = &ls_p[slot];
  uint32_t i, head, nk = 0, nr = 0, no = 0, pending;
  uint64_t nring = ls_skim(L, ev, p);
  ls_routes(p);
  __atomic_signal_fence(__ATOMIC_ACQUIRE);
  head = p->head;
  for (i = p->tail; i != head; i++) {
    ls_rec *r = &p->ring[i % LS_SLOTS];
    uint32_t j, w;
    if (r->state != LS_DONE && !final) break;
    j = ls_key_of(r, &nk);
    /* (each sample beyond a record's own is one taken off the queue,
     * which holds LS_SLOTS at most: no <= nr + LS_SLOTS) */
    w = ls_cover(&p->q, r->time, r->ip);
    p->merged += w - 1;
    ls_keys[j - 1].count += w;
    if (p->block) ls_keys[j - 1].ns += ls_waited(&p->bq, r->time);
    while (w-- > 0) ls_order[no++] = j;
    nr++;
  }
  __atomic_signal_fence(__ATOMIC_RELEASE);
  p->tail = i;
  pending = p->head - i;
  for (i = 0; i < nk; i++) ls_khash[ls_kslot[i]] = 0;
  ls_push_keys(L, nk, no, keep);
  lua_createtable(L, 0, 0);
  for (i = ks + 1; i <= ls_nstacks; i++) { ls_push_stack(L, i); lua_rawseti(L, -2, (int)i); }
  lua_createtable(L, 0, 0);
  for (i = kc + 1; i <= ls_nchunks; i++) { lua_pushstring(L, ls_chunks[i - 1]); lua_rawseti(L, -2, (int)i); }
  ls_push_stats(L, ev, p, nring, nr, pending);
  /* once a drain: the check the handler makes with its three loads,
   * here with the two syscalls too when the state was found (a LuaJIT
   * whose ProfileState is not as lj_profile.c has it) */
  if (ls_active && ls_ps && !ls_profiler_ours()) ls_ps = 0;
  /* the last profile's last read: the interned stacks go (ids restart) */
  if (final && !ls_any_on() && !ls_active) ls_forget();
  return 5;
}
#endif
