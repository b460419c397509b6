/*
 * puc/hook.c - Lua stacks for perf_event.profile on PUC Lua (5.1 to 5.4):
 * the hook and its capture, the signal handlers, the capture buffer and the
 * Lua entries (core._private.luahook_*).  The string pool is puc/intern.c;
 * the reading of PUC Lua's structs at a signal, puc/frames.c.
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
#include "puc/puc.h"
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

typedef struct lh_cap {
  uint64_t time;                /* CLOCK_MONOTONIC ns */
  uint64_t head;                /* data_head seen */
  uint32_t n;                   /* frames, innermost first */
  uint32_t more;                /* 1 when the stack was deeper than depth */
  uint32_t foreign;             /* 1: a signal since the last capture found
                                 * the program's own hook set */
  uint64_t foff;                /* its frames: frames[foff % nframes ...] */
} lh_cap;

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
} lh = { .ev_ref = LUA_NOREF, .th_ref = LUA_NOREF };

static uint64_t lh_now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

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
  if (L == lh.L) n = lf_fix(L, f, n, lh.depth, &c->more);
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
    lf_forget();
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
 * nil or why the popped leaf is not added back (puc/frames.c); or nil, why.  Arms the event's signal (it needs wakeup_events = 1, and a
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
  const char *why = lf_start(L, lua_toboolean(L, 5));
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
  uint32_t nstrs = lh_nstrs();
  lua_createtable(L, (int)nstrs, 0);
  for (uint32_t i = 0; i < nstrs; i++) {
    uint32_t len;
    const char *s = lh_str(i, &len);
    lua_pushlstring(L, s, len);
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
  pe_push_u64(L, lf_added());
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
