/*
 * ring.c - the mmap ring buffer and the record stream (doc/coverage.md D, F).
 *
 * Owns: the sampling methods of "perf_event.event" (records, poll, lost,
 * ring, map_aux, aux; records.lua's hooks are functions in core._private,
 * not methods), the drain protocol
 * (acquire load of data_head, records that straddle the end copied into a
 * contiguous buffer, release store of data_tail when a pass ends), the
 * write_backward flight-recorder snapshot and the AUX area.
 * pe_ring_methods() is called by event.c with the method table on top of
 * the stack; pe_ring_funcs() by core.c with the module table on top.
 *
 * The per-event state lives in ev->scratch (one malloc, freed by
 * pe_event_close in lifecycle.c, which also unmaps ev->aux).  Records of
 * a ring other events were redirected into are decoded with the layout
 * layouts.c attributes to them (E6).  A simulated ring (pesim.sim_ring,
 * test-only) is an event whose mapping is anonymous memory: the same code
 * drains it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "pe_records.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

#define MAX_RECORD 65536   /* header.size is a u16 */

typedef struct ring_state {
  unsigned char *base;       /* data area */
  uint64_t size;             /* data_size, a power of two */
  uint64_t head;             /* data_head snapshot of the open pass */
  uint64_t published;        /* data_tail as we last stored it */
  int pass;                  /* a pass is open */
  int backward;              /* write_backward: snapshot mode */
  const unsigned char *cur;  /* the record last handed out */
  size_t cur_len;
  pe_decode_cfg cfg;
  /* write_backward snapshot: the bytes and the record offsets in them */
  unsigned char *snap;
  uint32_t *offs;
  size_t nrec, irec;
  char msg[320];             /* why the last pe_ring_next or record_cfg failed */
  unsigned char buf[MAX_RECORD];
} ring_state;

/* The ring state of ev, created on first use; NULL (message pushed) when
 * ev has no data area. */
static ring_state *get_state(lua_State *L, pe_event *ev)
{
  ring_state *st = (ring_state *)ev->scratch;
  uint64_t off, size;
  int backward;
  size_t extra = 0;
  if (st) return st;
  if (!ev->page && (ev->flags & PE_EV_FORKED)) {
    lua_pushliteral(L, "no ring buffer in this process: the ring was mapped by the parent "
                    "before fork() and a child never inherits it; open the event after the "
                    "fork (in an nginx worker: init_worker_by_lua)");
    return NULL;
  }
  if (!ev->page || ev->data_pages == 0) {
    lua_pushliteral(L, "this event has no ring buffer (open it with sample_period or "
                    "opts.pages; an event redirected with set_output is read through "
                    "the target's ring)");
    return NULL;
  }
  off = __atomic_load_n(&ev->page->data_offset, __ATOMIC_RELAXED);
  size = __atomic_load_n(&ev->page->data_size, __ATOMIC_RELAXED);
  if (size == 0) {                       /* kernels before 4.1 (D7) */
    off = (uint64_t)pe_page_size();
    size = (uint64_t)ev->data_pages * (uint64_t)pe_page_size();
  }
  if (size < 8 || (size & (size - 1)) || off > ev->map_len || size > ev->map_len - off) {
    lua_pushfstring(L, "the user page describes an invalid data area (offset %d, size %d)",
                    (int)off, (int)size);
    return NULL;
  }
  backward = (int)((ev->attr.flags >> PE_FLAG_write_backward) & 1);
  if (backward) extra = (size_t)size + (size_t)(size / 8) * sizeof(uint32_t);
  st = (ring_state *)calloc(1, sizeof *st + extra);
  if (!st) { lua_pushliteral(L, "out of memory"); return NULL; }
  st->base = (unsigned char *)ev->page + off;
  st->size = size;
  st->backward = backward;
  if (backward) {
    st->snap = (unsigned char *)(st + 1);
    st->offs = (uint32_t *)(st->snap + size);
  }
  pe_decode_cfg_from_attr(&st->cfg, &ev->attr);
  st->published = ev->tail;
  ev->scratch = st;
  ev->scratch_len = sizeof *st + extra;
  return st;
}

/* copy len bytes starting at ring position pos (wrapping) into dst */
static void ring_copy(unsigned char *dst, const unsigned char *base, uint64_t size,
                      uint64_t pos, size_t len)
{
  size_t off = (size_t)(pos & (size - 1));
  size_t first = (size_t)size - off;
  if (first >= len) {
    memcpy(dst, base + off, len);
  } else {
    memcpy(dst, base + off, first);
    memcpy(dst + first, base, len - first);
  }
}

static void count_lost(pe_event *ev, const unsigned char *p, size_t n)
{
  struct pe_event_header h;
  uint64_t v;
  memcpy(&h, p, sizeof h);
  if (h.type == PE_RECORD_LOST && n >= 24) {
    memcpy(&v, p + 16, 8);
    ev->lost += v;
  } else if (h.type == PE_RECORD_LOST_SAMPLES && n >= 16) {
    memcpy(&v, p + 8, 8);
    ev->lost_samples += v;
  }
}

static void publish_tail(pe_event *ev)
{
  /* our reads of the records happen before the kernel may reuse them (D13) */
  __atomic_store_n(&ev->page->data_tail, ev->tail, __ATOMIC_RELEASE);
  ((ring_state *)ev->scratch)->published = ev->tail;
}

/* write_backward: pause, copy what is new since the last pass, resume, and
 * index the records from the newest (at head) to the oldest (D16). */
static void backward_snapshot(pe_event *ev, ring_state *st)
{
  uint64_t head, avail, pos = 0;
  size_t n = 0;
  ioctl(ev->fd, PE_IOC_PAUSE_OUTPUT, 1ul);
  head = __atomic_load_n(&ev->page->data_head, __ATOMIC_ACQUIRE);
  avail = ev->tail - head;               /* ev->tail: head of the last pass */
  if (avail > st->size) avail = st->size;
  if (avail) ring_copy(st->snap, st->base, st->size, head, (size_t)avail);
  ioctl(ev->fd, PE_IOC_PAUSE_OUTPUT, 0ul);
  while (pos + 8 <= avail) {
    struct pe_event_header h;
    memcpy(&h, st->snap + pos, sizeof h);
    /* zero or invalid size: the end of what was written; a record that runs
     * past the window was partly overwritten by newer ones */
    if (h.size < 8 || (h.size & 7) || h.size > avail - pos) break;
    st->offs[n++] = (uint32_t)pos;
    pos += h.size;
  }
  ev->tail = head;
  st->nrec = n;
  st->irec = n;                          /* hand out oldest first */
}

/*
 * The next record of ev's ring: sets *rec to a contiguous copy or to the
 * record in place and returns its size; returns 0 at the end of the pass
 * (data_tail published), -1 on a corrupt ring (st->msg says why; the pass
 * is abandoned and the tail resynchronised to head) and -2 when the event
 * is closed or has no ring state.  Exported for the LuaJIT FFI fast path.
 */
int pe_ring_next(pe_event *ev, const unsigned char **rec)
{
  ring_state *st = (ring_state *)ev->scratch;
  struct pe_event_header h;
  uint64_t avail;
  size_t off;
  if (ev->fd < 0 || !ev->page || !st || ev->gen != pe_fork_gen) return -2;
  if (st->backward) {
    const unsigned char *p;
    if (!st->pass) { backward_snapshot(ev, st); st->pass = 1; }
    if (st->irec == 0) { st->pass = 0; st->cur = NULL; return 0; }
    p = st->snap + st->offs[--st->irec];
    memcpy(&h, p, sizeof h);
    count_lost(ev, p, h.size);
    st->cur = *rec = p;
    st->cur_len = h.size;
    return (int)h.size;
  }
  if (!st->pass) {
    /* someone else (C code through ring().base) consumed: continue there */
    uint64_t t = __atomic_load_n(&ev->page->data_tail, __ATOMIC_RELAXED);
    if (t != st->published) ev->tail = st->published = t;
    st->head = __atomic_load_n(&ev->page->data_head, __ATOMIC_ACQUIRE);
    st->pass = 1;
  }
  avail = st->head - ev->tail;
  if (avail == 0 || (int64_t)avail < 0) {
    publish_tail(ev);
    st->pass = 0;
    st->cur = NULL;
    return 0;
  }
  off = (size_t)(ev->tail & (st->size - 1));
  if (avail > st->size || avail < 8) {
    snprintf(st->msg, sizeof st->msg, "ring out of sync: %llu bytes between tail and "
             "head in a %llu-byte ring", (unsigned long long)avail,
             (unsigned long long)st->size);
    goto corrupt;
  }
  memcpy(&h, st->base + off, sizeof h);  /* 8-aligned: never straddles */
  if (h.size < 8 || (h.size & 7) || h.size > avail) {
    snprintf(st->msg, sizeof st->msg, "corrupt record at ring offset %llu: size %u "
             "(type %u; %llu bytes readable)", (unsigned long long)ev->tail,
             (unsigned)h.size, (unsigned)h.type, (unsigned long long)avail);
    goto corrupt;
  }
  if (off + h.size <= st->size) {
    *rec = st->base + off;
  } else {                               /* straddles the end (D14) */
    ring_copy(st->buf, st->base, st->size, ev->tail, h.size);
    *rec = st->buf;
  }
  ev->tail += h.size;
  count_lost(ev, *rec, h.size);
  st->cur = *rec;
  st->cur_len = h.size;
  return (int)h.size;
corrupt:
  ev->tail = st->head;
  publish_tail(ev);
  st->pass = 0;
  st->cur = NULL;
  return -1;
}

/* Makes ev's ring state for pe_ring_next (the LuaJIT safe-point drain
 * reads the ring from C): 1, or 0 with the reason pushed. */
int pe_ring_ready(lua_State *L, pe_event *ev)
{
  return get_state(L, ev) != NULL;
}

/* decodes rec from ev's ring and pushes the record; raises on failure */
static int push_record(lua_State *L, pe_event *ev, ring_state *st,
                       const unsigned char *rec, size_t len)
{
  const pe_decode_cfg *cfg = pe_layouts_cfg(ev, &st->cfg, rec, len, st->msg, sizeof st->msg);
  if (!cfg) return luaL_error(L, "records(%s): %s", pe_event_name(L, 1), st->msg);
  if (!pe_decode_record(L, rec, len, cfg))
    return luaL_error(L, "records(%s): %s", pe_event_name(L, 1), lua_tostring(L, -1));
  return 1;
}

/* ---- Lua methods --------------------------------------------------------- */
/* The ring of the event at idx for method 'what'; an event without one is
 * the caller's mistake (doc/errors.md): raises, saying how to get one. */
static ring_state *check_ring(lua_State *L, int idx, pe_event **evp, const char *what)
{
  pe_event *ev = pe_check_event(L, idx);
  ring_state *st = get_state(L, ev);
  if (!st) luaL_error(L, "%s(%s): %s", what, pe_event_name(L, idx), lua_tostring(L, -1));
  if (evp) *evp = ev;
  return st;
}

static int records_iter(lua_State *L)
{
  pe_event *ev = pe_to_event(L, 1);
  ring_state *st = (ring_state *)ev->scratch;
  const unsigned char *p;
  int n;
  if (ev->fd < 0) return luaL_error(L, "records: the event was closed during iteration");
  n = pe_ring_next(ev, &p);
  if (n == 0) return 0;
  if (n < 0) return luaL_error(L, "records(%s): %s", pe_event_name(L, 1),
                               n == -1 ? st->msg : "no ring");
  return push_record(L, ev, st, p, (size_t)n);
}

/* ev:records() -> iterator over the records in the ring now (non-blocking) */
static int l_records(lua_State *L)
{
  check_ring(L, 1, NULL, "records");
  lua_pushcfunction(L, records_iter);
  lua_pushvalue(L, 1);
  return 2;
}

/* _private.ring_ptr(ev) -> lightuserdata of the event (LuaJIT fast path; the
 * caller keeps the event referenced while it uses the pointer) */
static int l_ring_ptr(lua_State *L)
{
  pe_event *ev;
  check_ring(L, 1, &ev, "records");
  lua_pushlightuserdata(L, ev);
  return 1;
}

/* _private.decode_current(ev) -> the record pe_ring_next last returned, decoded */
static int l_decode_current(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  ring_state *st = (ring_state *)ev->scratch;
  if (!st || !st->cur) return luaL_error(L, "records: no current record");
  return push_record(L, ev, st, st->cur, st->cur_len);
}

/*
 * _private.ring_take(ev) -> the bytes of every whole record in ev's ring now,
 * as the kernel wrote them, in one string (nil when the ring is empty); the
 * tail is published at once, so the kernel may reuse the space before a
 * record is decoded (luaperf record keeps up with a burst by copying, and
 * decodes later with chunk_record).  LOST and LOST_SAMPLES records are
 * counted (ev:lost()).  On a corrupt ring: the records before the fault,
 * then the tail resynchronised to head, and a second value saying why.
 */
static int l_ring_take(lua_State *L)
{
  pe_event *ev;
  ring_state *st = check_ring(L, 1, &ev, "ring_take");
  uint64_t head, avail, pos = 0;
  size_t off, first;
  luaL_Buffer b;
  const char *why = NULL;
  if (ev->fd < 0 || ev->gen != pe_fork_gen) return luaL_error(L, "ring_take: the event is closed");
  if (st->backward) return luaL_error(L, "ring_take: a write_backward ring is read with records()");
  if (st->pass) return luaL_error(L, "ring_take: a records() pass of this ring is open");
  {
    uint64_t t = __atomic_load_n(&ev->page->data_tail, __ATOMIC_RELAXED);
    if (t != st->published) ev->tail = st->published = t;
  }
  head = __atomic_load_n(&ev->page->data_head, __ATOMIC_ACQUIRE);
  avail = head - ev->tail;
  if (avail == 0) return 0;
  if (avail > st->size) {
    snprintf(st->msg, sizeof st->msg, "ring out of sync: %llu bytes between tail and head in a "
             "%llu-byte ring", (unsigned long long)avail, (unsigned long long)st->size);
    ev->tail = head;
    publish_tail(ev);
    lua_pushnil(L);
    lua_pushstring(L, st->msg);
    return 2;
  }
  while (pos < avail) {
    struct pe_event_header h;
    ring_copy((unsigned char *)&h, st->base, st->size, ev->tail + pos, sizeof h);
    if (avail - pos < 8 || h.size < 8 || (h.size & 7) || h.size > avail - pos) {
      snprintf(st->msg, sizeof st->msg, "corrupt record at ring offset %llu: size %u (type %u; "
               "%llu bytes readable)", (unsigned long long)(ev->tail + pos), (unsigned)h.size,
               (unsigned)h.type, (unsigned long long)(avail - pos));
      why = st->msg;
      break;
    }
    if (h.type == PE_RECORD_LOST || h.type == PE_RECORD_LOST_SAMPLES) {
      ring_copy(st->buf, st->base, st->size, ev->tail + pos, h.size);
      count_lost(ev, st->buf, h.size);
    }
    pos += h.size;
  }
  luaL_buffinit(L, &b);
  off = (size_t)(ev->tail & (st->size - 1));
  first = (size_t)st->size - off;
  if (first >= pos) {
    luaL_addlstring(&b, (const char *)st->base + off, (size_t)pos);
  } else {
    luaL_addlstring(&b, (const char *)st->base + off, first);
    luaL_addlstring(&b, (const char *)st->base, (size_t)pos - first);
  }
  /* the copy is made: the kernel may write there again */
  ev->tail = why ? head : ev->tail + pos;
  publish_tail(ev);
  luaL_pushresult(&b);
  if (pos == 0) { lua_pop(L, 1); lua_pushnil(L); }
  if (why) { lua_pushstring(L, why); return 2; }
  return 1;
}

/*
 * _private.chunk_record(ev, chunk, pos) -> record, next_pos: the record at
 * byte pos (1-based) of a string ring_take(ev) returned, decoded as
 * ev:records() decodes it; nil at the end of the chunk; raises on a record
 * that does not fit.
 */
static int l_chunk_record(lua_State *L)
{
  pe_event *ev;
  ring_state *st = check_ring(L, 1, &ev, "chunk_record");
  size_t len;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 2, &len);
  lua_Integer pos = luaL_checkinteger(L, 3);
  struct pe_event_header h;
  size_t at;
  if (pos < 1) return luaL_argerror(L, 3, "expected a position >= 1");
  if ((size_t)(pos - 1) >= len) return 0;
  at = (size_t)(pos - 1);
  if (len - at < sizeof h) return luaL_error(L, "chunk_record: %d bytes left at %d", (int)(len - at), (int)pos);
  memcpy(&h, s + at, sizeof h);
  if (h.size < 8 || h.size > len - at)
    return luaL_error(L, "chunk_record: a record of %d bytes at %d of %d", (int)h.size, (int)pos, (int)len);
  push_record(L, ev, st, s + at, h.size);
  lua_pushinteger(L, pos + (lua_Integer)h.size);
  return 2;
}

/*
 * core.wait_events(evs, timeout_ms [, child | pid])
 *                          -> "ready" | "exited" | false, hung
 *                           | "signal", signo | nil, msg, errno
 *     waits, as perf record's main loop does, until a ring of evs (an
 *     array of events) crossed its wakeup watermark ("ready"), the child
 *     or the process pid ended ("exited": not reaped; child:wait(0) reaps
 *     it), a caught SIGINT/SIGTERM arrived, or the timeout passed (false).
 *     hung: an array of the indices in evs whose fd reported POLLHUP or
 *     POLLERR (their task is gone: poll them no more), or nil.
 */
#define WAIT_EVENTS_MAX 65536

static int l_wait_events(lua_State *L)
{
  int timeout = -1;
  int n, i, nfd = 0, ev_fds, pfd = -1, r, nhung = 0, sig_fd = pe_signal_fd();
  int sig_at = -1, pid_at = -1;
  int *which;
  struct pollfd *p;
  luaL_checktype(L, 1, LUA_TTABLE);
  if (!lua_isnoneornil(L, 2)) {   /* nil or negative: no timeout */
    lua_Number t = luaL_checknumber(L, 2);
    if (t != t) return luaL_argerror(L, 2, "timeout is NaN");
    timeout = t < 0 ? -1 : t > (lua_Number)INT_MAX ? INT_MAX : (int)t;
  }
  n = (int)pe_rawlen(L, 1);
  if (n > WAIT_EVENTS_MAX) return luaL_argerror(L, 1, "too many events");
  if (!lua_isnoneornil(L, 3)) {
    int cpid = pe_child_pid(L, 3);
    pid_t pid = cpid >= 0 ? (pid_t)cpid : (pid_t)pe_check_int(L, 3, "wait_events: pid", 1, INT_MAX);
    if (pid == 0) { lua_pushliteral(L, "exited"); return 1; }   /* reaped */
    pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pfd < 0 && errno == ESRCH) { lua_pushliteral(L, "exited"); return 1; }
  }
  p = (struct pollfd *)lua_newuserdata(L, sizeof *p * (size_t)(n + 2));
  which = (int *)lua_newuserdata(L, sizeof *which * (size_t)(n + 2));
  for (i = 1; i <= n; i++) {
    pe_event *ev;
    lua_rawgeti(L, 1, i);
    ev = pe_to_event(L, -1);
    lua_pop(L, 1);
    if (ev->fd < 0) continue;
    p[nfd].fd = ev->fd; p[nfd].events = POLLIN; p[nfd].revents = 0;
    which[nfd++] = i;
  }
  ev_fds = nfd;
  if (pfd >= 0) { p[nfd].fd = pfd; p[nfd].events = POLLIN; p[nfd].revents = 0; pid_at = nfd++; }
  if (sig_fd >= 0) { p[nfd].fd = sig_fd; p[nfd].events = POLLIN; p[nfd].revents = 0; sig_at = nfd++; }
  do r = poll(p, (nfds_t)nfd, timeout); while (r < 0 && errno == EINTR);
  if (r < 0) {
    int e = errno;
    if (pfd >= 0) close(pfd);
    return pe_push_syserror(L, "poll", "events", e, NULL);
  }
  if (pfd >= 0) close(pfd);
  if (sig_at >= 0 && (p[sig_at].revents & POLLIN)) {
    struct signalfd_siginfo si;
    if (read(sig_fd, &si, sizeof si) == (ssize_t)sizeof si) {
      lua_pushliteral(L, "signal");
      lua_pushinteger(L, (lua_Integer)si.ssi_signo);
      return 2;
    }
  }
  if (pid_at >= 0 && p[pid_at].revents) lua_pushliteral(L, "exited");
  else {
    int ready = 0;
    for (i = 0; i < ev_fds; i++) if (p[i].revents & POLLIN) ready = 1;
    if (ready) lua_pushliteral(L, "ready"); else lua_pushboolean(L, 0);
  }
  for (i = 0; i < ev_fds; i++) {
    if (!(p[i].revents & (POLLHUP | POLLERR | POLLNVAL))) continue;
    if (nhung == 0) lua_newtable(L);
    lua_pushinteger(L, which[i]);
    lua_rawseti(L, -2, ++nhung);
  }
  if (nhung == 0) lua_pushnil(L);
  return 2;
}

/* _private.page_size() -> the page size ring sizes are counted in */
static int l_page_size(lua_State *L)
{
  lua_pushinteger(L, (lua_Integer)pe_page_size());
  return 1;
}

/* _private.ring_error(ev) -> why pe_ring_next returned -1 */
static int l_ring_error(lua_State *L)
{
  pe_event *ev = pe_to_event(L, 1);
  ring_state *st = (ring_state *)ev->scratch;
  lua_pushstring(L, st ? st->msg : "no ring");
  return 1;
}

static int unread(pe_event *ev, ring_state *st)
{
  uint64_t head;
  if (!ev->page || ev->data_pages == 0) return 0;
  if (st && st->backward) {
    head = __atomic_load_n(&ev->page->data_head, __ATOMIC_ACQUIRE);
    return head != ev->tail || (st->pass && st->irec > 0);
  }
  if (st && st->pass && st->head != ev->tail) return 1;
  head = __atomic_load_n(&ev->page->data_head, __ATOMIC_ACQUIRE);
  return head != ev->tail;
}

static double now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/*
 * ev:poll([timeout_ms]) -> true (records to read) | false (timeout) |
 * nil, "hup", ESRCH (the event is gone: the task exited) | nil, msg, errno
 */
static int l_poll(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  ring_state *st = (ring_state *)ev->scratch;
  int timeout = -1;
  double deadline = 0;
  struct pollfd p;
  if (!lua_isnoneornil(L, 2)) {
    lua_Number t = luaL_checknumber(L, 2);
    if (t != t) return luaL_argerror(L, 2, "timeout is NaN");   /* (int)NaN: wait forever */
    if (t < 0) timeout = -1;
    else timeout = t > 2147483647.0 ? 2147483647 : (int)t;
  }
  if (unread(ev, st)) { lua_pushboolean(L, 1); return 1; }
  if (timeout > 0) deadline = now_ms() + timeout;
  for (;;) {
    int rc;
    p.fd = ev->fd;
    p.events = POLLIN;
    p.revents = 0;
    rc = poll(&p, 1, timeout);
    if (rc < 0) {
      if (errno == EINTR) {
        if (timeout > 0) {
          double left = deadline - now_ms();
          timeout = left > 0 ? (int)left : 0;
        }
        continue;
      }
      return pe_push_syserror(L, "poll", pe_event_name(L, 1), errno, NULL);
    }
    if (rc == 0) { lua_pushboolean(L, 0); return 1; }
    if (p.revents & POLLIN) {
      /* a wakeup for records already consumed (the kernel clears its flag
       * when polled, not when read): wait for the next one */
      if (ev->data_pages && !unread(ev, st) && !(p.revents & POLLHUP)) {
        if (timeout == 0) { lua_pushboolean(L, 0); return 1; }  /* poll(0): no spin */
        if (timeout > 0) {
          double left = deadline - now_ms();
          timeout = left > 0 ? (int)left : 0;
        }
        continue;
      }
      lua_pushboolean(L, 1);
      return 1;
    }
    if (unread(ev, st)) { lua_pushboolean(L, 1); return 1; }
    lua_pushnil(L);           /* the message doc/api.md fixes, with the errno rule's */
    lua_pushliteral(L, "hup");
    lua_pushinteger(L, ESRCH);
    return 3;
  }
}

/* ev:lost() -> total lost, from LOST records, from LOST_SAMPLES records */
static int l_lost(lua_State *L)
{
  pe_event *ev = pe_to_event(L, 1);
  pe_push_u64(L, ev->lost + ev->lost_samples);
  pe_push_u64(L, ev->lost);
  pe_push_u64(L, ev->lost_samples);
  return 3;
}

/* ev:ring() -> the control fields of the user page and the consumer state;
 * raises for an event with nothing mapped */
static int l_ring(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  struct pe_mmap_page *pg = ev->page;
  ring_state *st;
  if (!pg) {                  /* nothing mapped: the caller's mistake */
    if (ev->flags & PE_EV_FORKED) check_ring(L, 1, NULL, "ring");
    return luaL_error(L, "ring(%s): this event has no mapping (a sampling event, or "
                      "opts.pages, maps one; so does a counting event of this thread)",
                      pe_event_name(L, 1));
  }
  st = ev->data_pages ? check_ring(L, 1, NULL, "ring") : NULL;
  lua_createtable(L, 0, 14);
  pe_push_u64(L, __atomic_load_n(&pg->data_head, __ATOMIC_ACQUIRE)); lua_setfield(L, -2, "data_head");
  pe_push_u64(L, __atomic_load_n(&pg->data_tail, __ATOMIC_RELAXED)); lua_setfield(L, -2, "data_tail");
  pe_push_u64(L, pg->data_offset); lua_setfield(L, -2, "data_offset");
  pe_push_u64(L, st ? st->size : pg->data_size); lua_setfield(L, -2, "data_size");
  pe_push_u64(L, __atomic_load_n(&pg->aux_head, __ATOMIC_ACQUIRE)); lua_setfield(L, -2, "aux_head");
  pe_push_u64(L, __atomic_load_n(&pg->aux_tail, __ATOMIC_RELAXED)); lua_setfield(L, -2, "aux_tail");
  pe_push_u64(L, pg->aux_offset); lua_setfield(L, -2, "aux_offset");
  pe_push_u64(L, pg->aux_size); lua_setfield(L, -2, "aux_size");
  pe_push_u64(L, ev->tail); lua_setfield(L, -2, "tail");
  lua_pushinteger(L, (lua_Integer)ev->data_pages); lua_setfield(L, -2, "pages");
  lua_pushboolean(L, st && st->backward); lua_setfield(L, -2, "backward");
  lua_pushlightuserdata(L, pg); lua_setfield(L, -2, "base");
  return 1;
}

/* ev:map_aux(pages) -> true | nil, msg, errno: maps the AUX area (D17) */
static int l_map_aux(lua_State *L)
{
  pe_event *ev;
  lua_Integer pages;
  size_t len;
  uint64_t off;
  void *p;
  check_ring(L, 1, &ev, "map_aux");
  pages = luaL_checkinteger(L, 2);
  if (pages <= 0 || (pages & (pages - 1)) || pages > (1 << 20))
    return luaL_argerror(L, 2, "a power of two of pages");
  if (ev->aux) return luaL_error(L, "map_aux: the AUX area is already mapped");
  len = (size_t)pages * (size_t)pe_page_size();
  off = (uint64_t)ev->map_len;           /* right after the data area */
  ev->page->aux_offset = off;
  ev->page->aux_size = len;
  p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, ev->fd, (off_t)off);
  if (p == MAP_FAILED) {
    int err = errno;
    return pe_push_syserror(L, "mmap(aux)", pe_event_name(L, 1), err,
                            err == EOPNOTSUPP ? "this PMU has no AUX area (intel_pt, "
                            "cs_etm, arm_spe ... provide one)" : NULL);
  }
  ev->aux = p;
  ev->aux_len = len;
  lua_pushboolean(L, 1);
  return 1;
}

/* ev:aux() -> the AUX bytes between aux_tail and aux_head (publishes
 * aux_tail); raises when no AUX area was mapped */
static int l_aux(lua_State *L)
{
  pe_event *ev;
  uint64_t head, tail, n, size;
  luaL_Buffer b;
  check_ring(L, 1, &ev, "aux");
  size = ev->aux_len;
  if (!ev->aux)
    return luaL_error(L, "aux(%s): no AUX area: call map_aux(pages) first", pe_event_name(L, 1));
  head = __atomic_load_n(&ev->page->aux_head, __ATOMIC_ACQUIRE);
  tail = __atomic_load_n(&ev->page->aux_tail, __ATOMIC_RELAXED);
  n = head - tail;
  if (n > size) {       /* overwrite mode or a corrupt head: the newest size bytes */
    tail = head - size;
    n = size;
  }
  luaL_buffinit(L, &b);
  if (n) {                               /* the two parts of a wrapped range */
    size_t off = (size_t)(tail & (size - 1)), first = (size_t)size - off;
    if (first > n) first = (size_t)n;
    luaL_addlstring(&b, (const char *)ev->aux + off, first);
    luaL_addlstring(&b, (const char *)ev->aux, (size_t)n - first);
  }
  luaL_pushresult(&b);
  __atomic_store_n(&ev->page->aux_tail, head, __ATOMIC_RELEASE);
  return 1;
}

/* _private.ring_version(ev) -> a number that changes whenever the set of events
 * redirected into ev's ring changes; 0 when none ever was (records.lua
 * caches its per-event plan on it) */
static int l_ring_version(lua_State *L)
{
  pe_event *ev = pe_to_event(L, 1);
  lua_pushinteger(L, (lua_Integer)pe_layouts_version(ev));
  return 1;
}

/* _private.ring_layouts(ev) -> by_id, {[id] = {name=, type=, config=,
 * sample_type=}} of the events redirected into ev's ring (not ev itself);
 * by_id is true when records are attributed by id (layouts differ, or did:
 * the FFI fast path, which knows one layout, must not run) */
static int l_ring_layouts(lua_State *L)
{
  pe_event *ev = pe_to_event(L, 1);
  return pe_layouts_push(L, ev);
}

static const luaL_Reg ring_methods[] = {
  {"records", l_records}, {"poll", l_poll}, {"lost", l_lost}, {"ring", l_ring},
  {"map_aux", l_map_aux}, {"aux", l_aux}, {NULL, NULL}
};

/* records.lua's hooks: functions of an event in core._private, not methods */
static const luaL_Reg ring_private[] = {
  {"ring_ptr", l_ring_ptr}, {"decode_current", l_decode_current},
  {"ring_error", l_ring_error}, {"ring_version", l_ring_version},
  {"ring_layouts", l_ring_layouts}, {"ring_take", l_ring_take},
  {"chunk_record", l_chunk_record}, {"page_size", l_page_size}, {NULL, NULL}
};

void pe_ring_methods(lua_State *L)
{
  pe_setfuncs(L, ring_methods);
}

void pe_ring_funcs(lua_State *L)
{
  static const luaL_Reg funcs[] = {
    {"decode_record", pe_l_decode_record}, {"wait_events", l_wait_events}, {NULL, NULL}
  };
  union { int (*f)(pe_event *, const unsigned char **); void *p; } u;
  pe_setfuncs(L, funcs);
  pe_push_private(L, lua_gettop(L));
  pe_setfuncs(L, ring_private);
  lua_pop(L, 1);
  /* the C entry the LuaJIT FFI fast path calls (records.lua) */
  u.f = pe_ring_next;
  lua_pushlightuserdata(L, u.p);
  lua_setfield(L, -2, "ring_next_ptr");
}
