/*
 * ring.c - the mmap ring buffer and the record stream (CHECKLIST D, F).
 *
 * Owns: the sampling methods of "perf_event.event" (records, poll, lost,
 * ring, map_aux, aux; records.lua's hooks are functions in core._private,
 * not methods), the drain protocol
 * (acquire load of data_head, records that straddle the end copied into a
 * contiguous buffer, release store of data_tail when a pass ends), the
 * write_backward flight-recorder snapshot, the AUX area, and simulated
 * rings (core.sim_ring) that let tests feed the same code synthetic bytes.
 * pe_ring_methods() is called by event.c with the method table on top of
 * the stack; pe_ring_funcs() by core.c with the module table on top.
 *
 * The per-event state lives in ev->scratch (one malloc, freed by
 * pe_event_close); the AUX mapping is released by pe_ring_close().
 *
 * Shared rings (E6): when another event is redirected into a ring with
 * set_output, the ring's layout table (ev->own_lt) learns a copy of that
 * event's decode parameters under its id.  While every layout equals the
 * owner's, records decode exactly as before; when they differ, each record
 * is attributed by its PERF_SAMPLE_IDENTIFIER (first u64 of a SAMPLE body,
 * last u64 of the sample_id trailer otherwise) and decoded with its event's
 * layout.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "pe_records.h"

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
  void *aux;                 /* AUX mapping (map_aux), NULL if none */
  size_t aux_len;
  int sim;                   /* a simulated ring (core.sim_ring) */
  /* write_backward snapshot: the bytes and the record offsets in them */
  unsigned char *snap;
  uint32_t *offs;
  size_t nrec, irec;
  char msg[320];             /* why the last pe_ring_next or record_cfg failed */
  unsigned char buf[MAX_RECORD];
} ring_state;

static long page_size(void)
{
  static long ps = 0;
  if (!ps) ps = sysconf(_SC_PAGESIZE);
  return ps;
}

static const char *ev_label(lua_State *L, int idx)
{
  const char *s = NULL;
  pe_getuservalue(L, idx);
  if (lua_istable(L, -1)) {
    lua_getfield(L, -1, "name");
    s = lua_tostring(L, -1);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return s ? s : "event";
}

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
    off = (uint64_t)page_size();
    size = (uint64_t)ev->data_pages * (uint64_t)page_size();
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

static void ring_leave(pe_event *ev);
static void layouts_unref(struct pe_layouts *lt);

void pe_ring_close(pe_event *ev)
{
  ring_state *st = (ring_state *)ev->scratch;
  if (st && st->aux) {
    munmap(st->aux, st->aux_len);
    st->aux = NULL;
  }
  ring_leave(ev);                        /* its layout leaves the shared ring */
  if (ev->own_lt) {                      /* members keep the table alive */
    layouts_unref(ev->own_lt);
    ev->own_lt = NULL;
  }
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

/* ---- shared rings: the layouts of redirected events (E6) ----------------- */
typedef struct pe_layout {
  uint64_t id;
  pe_decode_cfg cfg;
  uint32_t type;             /* attr type and config: the Lua layer finds */
  uint64_t config;           /* tracepoint formats with them */
  char name[96];
} pe_layout;

struct pe_layouts {
  int refs;                  /* the owner (own_lt) + each member (out_lt) */
  int n, cap;
  unsigned version;          /* changes whenever the members change */
  int mixed;                 /* some member's layout differs from the owner's */
  int was_mixed;             /* ... was so once: records of a member that
                              * has left may still be in the ring */
  int demux;                 /* every layout has PERF_SAMPLE_IDENTIFIER */
  int sia;                   /* sample_id_all: 0 in none, 1 in all, 2 in some */
  int rf_same;               /* every layout has the owner's read_format */
  pe_layout own;             /* the owner's layout */
  pe_layout *v;              /* the members' */
};

static unsigned layouts_version = 0;

static int cfg_equal(const pe_decode_cfg *a, const pe_decode_cfg *b)
{
  return a->sample_type == b->sample_type && a->read_format == b->read_format &&
         a->branch_sample_type == b->branch_sample_type &&
         a->regs_user == b->regs_user && a->regs_intr == b->regs_intr &&
         a->sample_id_all == b->sample_id_all;
}

static void layout_set(pe_layout *l, uint64_t id, const struct pe_attr *a, const char *name)
{
  memset(l, 0, sizeof *l);
  l->id = id;
  pe_decode_cfg_from_attr(&l->cfg, a);
  l->type = a->type;
  l->config = a->config;
  if (name) snprintf(l->name, sizeof l->name, "%s", name);
}

/* recomputes the summary flags after the members changed */
static void layouts_update(struct pe_layouts *lt)
{
  int i, with_sia = lt->own.cfg.sample_id_all ? 1 : 0;
  lt->mixed = 0;
  lt->demux = (lt->own.cfg.sample_type & PE_SAMPLE_IDENTIFIER) != 0;
  lt->rf_same = 1;
  for (i = 0; i < lt->n; i++) {
    const pe_decode_cfg *c = &lt->v[i].cfg;
    if (!cfg_equal(c, &lt->own.cfg)) lt->mixed = 1;
    if (!(c->sample_type & PE_SAMPLE_IDENTIFIER)) lt->demux = 0;
    if (c->read_format != lt->own.cfg.read_format) lt->rf_same = 0;
    if (c->sample_id_all) with_sia++;
  }
  lt->sia = with_sia == 0 ? 0 : with_sia == lt->n + 1 ? 1 : 2;
  if (lt->mixed) lt->was_mixed = 1;
  lt->version = ++layouts_version;   /* plans in records.lua are keyed by it */
  if (lt->version == 0) lt->version = ++layouts_version;   /* 0 means "none" */
}

/* records of this ring are attributed by id (see record_cfg): while the
 * layouts differ, and afterwards while the owner has IDENTIFIER, so that a
 * record of an event that has left is an error, not misread */
static int layouts_by_id(const struct pe_layouts *lt)
{
  return lt && (lt->mixed || (lt->was_mixed && lt->demux));
}

static void layouts_unref(struct pe_layouts *lt)
{
  if (--lt->refs > 0) return;
  free(lt->v);
  free(lt);
}

/* adds (or replaces) a member's layout; 0, or -1 when out of memory */
static int layouts_add(struct pe_layouts *lt, const pe_layout *l)
{
  int i;
  for (i = 0; i < lt->n; i++) {
    if (lt->v[i].id == l->id) { lt->v[i] = *l; layouts_update(lt); return 0; }
  }
  if (lt->n == lt->cap) {
    int cap = lt->cap ? 2 * lt->cap : 4;
    pe_layout *v = (pe_layout *)realloc(lt->v, (size_t)cap * sizeof *v);
    if (!v) return -1;
    lt->v = v;
    lt->cap = cap;
  }
  lt->v[lt->n++] = *l;
  layouts_update(lt);
  return 0;
}

static void layouts_remove(struct pe_layouts *lt, uint64_t id)
{
  int i;
  for (i = 0; i < lt->n; i++) {
    if (lt->v[i].id == id) {
      lt->v[i] = lt->v[--lt->n];
      layouts_update(lt);
      return;
    }
  }
}

static uint64_t event_id(pe_event *ev)
{
  uint64_t id = 0;
  if (!ev->id && ev->fd >= 0 && ioctl(ev->fd, PE_IOC_ID, &id) == 0) ev->id = id;
  return ev->id;
}

/* ev leaves the table of the ring it was redirected to */
static void ring_leave(pe_event *ev)
{
  struct pe_layouts *lt = ev->out_lt;
  if (!lt) return;
  ev->out_lt = NULL;
  layouts_remove(lt, ev->id);
  layouts_unref(lt);
}

/* The table of the ring target's records go to: its own ring's (created
 * here) or, when target is itself redirected, that ring's.  NULL when
 * target has no ring we know of. */
static struct pe_layouts *target_table(pe_event *t)
{
  struct pe_layouts *lt;
  if (t->out_lt) return t->out_lt;
  if (t->own_lt) return t->own_lt;
  if (!t->page || t->data_pages == 0) return NULL;
  lt = (struct pe_layouts *)calloc(1, sizeof *lt);
  if (!lt) return NULL;
  lt->refs = 1;
  layout_set(&lt->own, event_id(t), &t->attr, NULL);
  layouts_update(lt);
  t->own_lt = lt;
  return lt;
}

void pe_ring_join(pe_event *ev, pe_event *target, const char *name)
{
  struct pe_layouts *lt;
  pe_layout l;
  ring_leave(ev);
  if (!target || target == ev) return;
  lt = target_table(target);
  if (!lt || !event_id(ev)) return;   /* out of memory / no id: nothing to attribute */
  layout_set(&l, ev->id, &ev->attr, name);
  if (layouts_add(lt, &l) < 0) return;
  lt->refs++;
  ev->out_lt = lt;
}

static const char *const demux_hint =
  "add \"identifier\" to the sample_type of every event sharing the ring";

/*
 * The layout to decode rec (len bytes, len >= 8, from ev's ring) with: the
 * owner's while every layout is the same; otherwise the one of the event
 * whose id the record carries.  NULL with st->msg set when the record
 * cannot be attributed.
 */
static const pe_decode_cfg *record_cfg(pe_event *ev, ring_state *st,
                                       const unsigned char *rec, size_t len)
{
  const struct pe_layouts *lt = ev->own_lt;
  struct pe_event_header h;
  const char *tname;
  uint64_t id;
  int i;
  if (!layouts_by_id(lt)) return &st->cfg;   /* one layout: as unshared */
  memcpy(&h, rec, sizeof h);
  tname = pe_record_type_name(h.type);
  if (!tname) tname = "unknown";
  if (!lt->demux) {
    snprintf(st->msg, sizeof st->msg, "events with different sample layouts share this "
             "ring (set_output) and a %s record cannot be attributed: %s", tname, demux_hint);
    return NULL;
  }
  if (h.type == PE_RECORD_SAMPLE) {
    if (len < 16) {
      snprintf(st->msg, sizeof st->msg, "sample record (%u bytes) is too short for its "
               "identifier", (unsigned)len);
      return NULL;
    }
    memcpy(&id, rec + 8, 8);
  } else if (lt->sia == 0) {
    /* no trailers: the bodies do not depend on sample_type; READ's does on
     * read_format */
    if (h.type == PE_RECORD_READ && !lt->rf_same) {
      snprintf(st->msg, sizeof st->msg, "a read record in a ring shared by events with "
               "different read_format cannot be attributed: set sample_id_all on every "
               "event sharing the ring");
      return NULL;
    }
    return &st->cfg;
  } else if (lt->sia == 2) {
    snprintf(st->msg, sizeof st->msg, "a %s record cannot be attributed: sample_id_all is "
             "set on some of the events sharing this ring but not on all; set it on every "
             "one (or none)", tname);
    return NULL;
  } else {
    if (len < 16) {
      snprintf(st->msg, sizeof st->msg, "%s record (%u bytes) is too short for its "
               "sample_id trailer", tname, (unsigned)len);
      return NULL;
    }
    memcpy(&id, rec + len - 8, 8);
  }
  if (id == lt->own.id) return &st->cfg;
  for (i = 0; i < lt->n; i++)
    if (lt->v[i].id == id) return &lt->v[i].cfg;
  snprintf(st->msg, sizeof st->msg, "%s record with id %llu: no event sending records to "
           "this ring has that id (redirect with set_output(event), not an fd, and drain "
           "the ring before closing the event; %s)", tname, (unsigned long long)id,
           demux_hint);
  return NULL;
}

/* decodes rec from ev's ring and pushes the record; raises on failure */
static int push_record(lua_State *L, pe_event *ev, ring_state *st,
                       const unsigned char *rec, size_t len)
{
  const pe_decode_cfg *cfg = record_cfg(ev, st, rec, len);
  if (!cfg) return luaL_error(L, "records(%s): %s", ev_label(L, 1), st->msg);
  if (!pe_decode_record(L, rec, len, cfg))
    return luaL_error(L, "records(%s): %s", ev_label(L, 1), lua_tostring(L, -1));
  return 1;
}

/* ---- Lua methods --------------------------------------------------------- */
static ring_state *check_ring(lua_State *L, int idx, pe_event **evp)
{
  pe_event *ev = pe_check_event(L, idx);
  ring_state *st = get_state(L, ev);
  if (!st) luaL_error(L, "records(%s): %s", ev_label(L, idx), lua_tostring(L, -1));
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
  if (n < 0) return luaL_error(L, "records(%s): %s", ev_label(L, 1),
                               n == -1 ? st->msg : "no ring");
  return push_record(L, ev, st, p, (size_t)n);
}

/* ev:records() -> iterator over the records in the ring now (non-blocking) */
static int l_records(lua_State *L)
{
  check_ring(L, 1, NULL);
  lua_pushcfunction(L, records_iter);
  lua_pushvalue(L, 1);
  return 2;
}

/* _private.ring_ptr(ev) -> lightuserdata of the event (LuaJIT fast path; the
 * caller keeps the event referenced while it uses the pointer) */
static int l_ring_ptr(lua_State *L)
{
  pe_event *ev;
  check_ring(L, 1, &ev);
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
 * nil, "hup" (the event is gone: the task exited) | nil, msg, errno
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
      return pe_push_syserror(L, "poll", ev_label(L, 1), errno, NULL);
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
    lua_pushnil(L);
    lua_pushliteral(L, "hup");
    return 2;
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

/* ev:ring() -> the control fields of the user page and the consumer state */
static int l_ring(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  struct pe_mmap_page *pg = ev->page;
  ring_state *st;
  if (!pg) { lua_pushnil(L); lua_pushliteral(L, "not mapped"); return 2; }
  st = ev->data_pages ? get_state(L, ev) : NULL;
  if (ev->data_pages && !st) { lua_pushnil(L); lua_insert(L, -2); return 2; }
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
  ring_state *st = check_ring(L, 1, &ev);
  lua_Integer pages = luaL_checkinteger(L, 2);
  size_t len;
  uint64_t off;
  void *p;
  if (pages <= 0 || (pages & (pages - 1)) || pages > (1 << 20))
    return luaL_argerror(L, 2, "a power of two of pages");
  if (st->aux) return luaL_error(L, "map_aux: the AUX area is already mapped");
  len = (size_t)pages * (size_t)page_size();
  off = (uint64_t)ev->map_len;           /* right after the data area */
  ev->page->aux_offset = off;
  ev->page->aux_size = len;
  p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, ev->fd, (off_t)off);
  if (p == MAP_FAILED) {
    int err = errno;
    return pe_push_syserror(L, "mmap(aux)", ev_label(L, 1), err,
                            err == EOPNOTSUPP ? "this PMU has no AUX area (intel_pt, "
                            "cs_etm, arm_spe ... provide one)" : NULL);
  }
  st->aux = p;
  st->aux_len = len;
  lua_pushboolean(L, 1);
  return 1;
}

/* ev:aux() -> the AUX bytes between aux_tail and aux_head (publishes
 * aux_tail), or nil, msg when there is no AUX area */
static int l_aux(lua_State *L)
{
  pe_event *ev;
  ring_state *st = check_ring(L, 1, &ev);
  uint64_t head, tail, n, size = st->aux_len;
  luaL_Buffer b;
  if (!st->aux) { lua_pushnil(L); lua_pushliteral(L, "no AUX area: call map_aux first"); return 2; }
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
    luaL_addlstring(&b, (const char *)st->aux + off, first);
    luaL_addlstring(&b, (const char *)st->aux, (size_t)n - first);
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
  lua_pushinteger(L, ev->own_lt ? (lua_Integer)ev->own_lt->version : 0);
  return 1;
}

/* _private.ring_layouts(ev) -> by_id, {[id] = {name=, type=, config=,
 * sample_type=}} of the events redirected into ev's ring (not ev itself);
 * by_id is true when records are attributed by id (layouts differ, or did:
 * the FFI fast path, which knows one layout, must not run) */
static int l_ring_layouts(lua_State *L)
{
  pe_event *ev = pe_to_event(L, 1);
  const struct pe_layouts *lt = ev->own_lt;
  int i;
  lua_pushboolean(L, layouts_by_id(lt));
  lua_createtable(L, 0, lt ? lt->n : 0);
  for (i = 0; lt && i < lt->n; i++) {
    const pe_layout *l = &lt->v[i];
    pe_push_u64(L, l->id);
    lua_createtable(L, 0, 4);
    lua_pushstring(L, l->name); lua_setfield(L, -2, "name");
    lua_pushinteger(L, (lua_Integer)l->type); lua_setfield(L, -2, "type");
    pe_push_u64(L, l->config); lua_setfield(L, -2, "config");
    pe_push_u64(L, l->cfg.sample_type); lua_setfield(L, -2, "sample_type");
    lua_settable(L, -3);
  }
  return 2;
}

static const luaL_Reg ring_methods[] = {
  {"records", l_records}, {"poll", l_poll}, {"lost", l_lost}, {"ring", l_ring},
  {"map_aux", l_map_aux}, {"aux", l_aux}, {NULL, NULL}
};

/* records.lua's hooks: functions of an event in core._private, not methods */
static const luaL_Reg ring_private[] = {
  {"ring_ptr", l_ring_ptr}, {"decode_current", l_decode_current},
  {"ring_error", l_ring_error}, {"ring_version", l_ring_version},
  {"ring_layouts", l_ring_layouts}, {NULL, NULL}
};

void pe_ring_methods(lua_State *L)
{
  pe_setfuncs(L, ring_methods);
}

/* ---- simulated rings ----------------------------------------------------- */
static uint64_t opt_u64(lua_State *L, int t, const char *k, uint64_t dflt)
{
  uint64_t v = dflt;
  lua_getfield(L, t, k);
  if (!lua_isnil(L, -1)) v = pe_check_u64(L, lua_gettop(L));
  lua_pop(L, 1);
  return v;
}

/* sim_ring's layouts = {{id=, sample_type=, read_format=, sample_id_all=,
 * branch_sample_type=, sample_regs_user=, sample_regs_intr=, name=,
 * type=, config=}, ...}: events "redirected" into the simulated ring */
static void sim_layouts(lua_State *L, pe_event *ev)
{
  int i, n, top = lua_gettop(L);
  lua_getfield(L, 1, "layouts");
  if (lua_isnil(L, -1)) { lua_settop(L, top); return; }
  luaL_argcheck(L, lua_istable(L, -1), 1, "layouts: a table of layouts");
  n = (int)pe_rawlen(L, -1);
  for (i = 1; i <= n; i++) {
    int t;
    struct pe_attr a;
    pe_layout l;
    struct pe_layouts *lt;
    lua_rawgeti(L, top + 1, i);
    t = lua_gettop(L);
    luaL_argcheck(L, lua_istable(L, t), 1, "layouts: each layout is a table");
    memset(&a, 0, sizeof a);
    lua_getfield(L, t, "sample_type");
    if (!lua_isnil(L, -1)) pe_flags_from_value(L, -1, "sample_type", &a.sample_type);
    lua_getfield(L, t, "read_format");
    if (!lua_isnil(L, -1)) pe_flags_from_value(L, -1, "read_format", &a.read_format);
    lua_getfield(L, t, "branch_sample_type");
    if (!lua_isnil(L, -1)) pe_flags_from_value(L, -1, "branch_sample_type", &a.branch_sample_type);
    lua_getfield(L, t, "sample_id_all");
    if (lua_toboolean(L, -1)) a.flags |= PE_FLAG_BIT(sample_id_all);
    lua_settop(L, t);
    a.sample_regs_user = opt_u64(L, t, "sample_regs_user", 0);
    a.sample_regs_intr = opt_u64(L, t, "sample_regs_intr", 0);
    a.type = (uint32_t)opt_u64(L, t, "type", 0);
    a.config = opt_u64(L, t, "config", 0);
    lua_getfield(L, t, "name");
    layout_set(&l, opt_u64(L, t, "id", 0), &a, lua_tostring(L, -1));
    lt = target_table(ev);
    if (!lt || layouts_add(lt, &l) < 0) luaL_error(L, "sim_ring: out of memory");
    lua_settop(L, top + 1);
  }
  lua_settop(L, top);
}

/*
 * core.sim_ring{data=bytes, head=, tail=, sample_type=, read_format=,
 *   sample_id_all=, branch_sample_type=, sample_regs_user=,
 *   sample_regs_intr=, write_backward=, aux=bytes, aux_head=, aux_tail=,
 *   id=, layouts=}
 *   -> a perf_event.event whose ring holds `data` (its length a power of
 *   two, at least 8) with the given head/tail; `aux` likewise.  `id` is
 *   the event's id, `layouts` (see sim_layouts) the events sharing its
 *   ring.  The same records()/aux() code runs on it as on a kernel ring.
 */
static int l_sim_ring(lua_State *L)
{
  size_t dlen, alen = 0;
  const char *data, *aux = NULL;
  size_t ps = (size_t)page_size(), pages, maplen;
  pe_event *ev;
  void *p;
  ring_state *st;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  lua_getfield(L, 1, "data");
  data = luaL_checklstring(L, -1, &dlen);
  lua_getfield(L, 1, "aux");
  if (!lua_isnil(L, -1)) aux = luaL_checklstring(L, -1, &alen);
  if (dlen < 8 || (dlen & (dlen - 1))) return luaL_argerror(L, 1, "data: length must be a power of two >= 8");
  if (aux && (alen < 8 || (alen & (alen - 1)))) return luaL_argerror(L, 1, "aux: length must be a power of two >= 8");
  pages = (dlen + ps - 1) / ps;
  maplen = ps * (1 + pages);
  ev = (pe_event *)pe_newuserdata(L, sizeof *ev);     /* 4 */
  memset(ev, 0, sizeof *ev);
  ev->gen = pe_fork_gen;
  ev->fd = -1;
  ev->flags = PE_EV_CLOSED;
  luaL_getmetatable(L, PE_EVENT_MT);
  lua_setmetatable(L, -2);
  lua_createtable(L, 0, 1);
  lua_pushliteral(L, "sim_ring");
  lua_setfield(L, -2, "name");
  pe_setuservalue(L, 4);
  lua_getfield(L, 1, "sample_type");
  if (!lua_isnil(L, -1)) pe_flags_from_value(L, -1, "sample_type", &ev->attr.sample_type);
  lua_getfield(L, 1, "read_format");
  if (!lua_isnil(L, -1)) pe_flags_from_value(L, -1, "read_format", &ev->attr.read_format);
  lua_getfield(L, 1, "branch_sample_type");
  if (!lua_isnil(L, -1)) pe_flags_from_value(L, -1, "branch_sample_type", &ev->attr.branch_sample_type);
  lua_getfield(L, 1, "sample_id_all");
  if (lua_toboolean(L, -1)) ev->attr.flags |= PE_FLAG_BIT(sample_id_all);
  lua_getfield(L, 1, "write_backward");
  if (lua_toboolean(L, -1)) ev->attr.flags |= PE_FLAG_BIT(write_backward);
  lua_settop(L, 4);
  ev->attr.sample_regs_user = opt_u64(L, 1, "sample_regs_user", 0);
  ev->attr.sample_regs_intr = opt_u64(L, 1, "sample_regs_intr", 0);
  ev->sample_type = ev->attr.sample_type;
  ev->read_format = ev->attr.read_format;
  ev->id = opt_u64(L, 1, "id", 0);

  p = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return pe_push_syserror(L, "mmap", "sim_ring", errno, NULL);
  ev->page = (struct pe_mmap_page *)p;
  ev->map_len = maplen;
  ev->data_pages = pages;
  ev->page->data_offset = ps;
  ev->page->data_size = dlen;
  memcpy((char *)p + ps, data, dlen);
  /* an fd that poll() and close() accept: the event is "open" */
  ev->fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (ev->fd < 0) { int err = errno; pe_event_close(ev); return pe_push_syserror(L, "open", "/dev/null", err, NULL); }
  ev->flags = 0;
  ev->page->data_head = opt_u64(L, 1, "head", dlen);
  ev->page->data_tail = opt_u64(L, 1, "tail", 0);
  ev->tail = ev->page->data_tail;
  if (ev->attr.flags & PE_FLAG_BIT(write_backward)) ev->tail = opt_u64(L, 1, "last", 0);
  st = get_state(L, ev);
  if (!st) return lua_error(L);
  st->sim = 1;
  sim_layouts(L, ev);
  if (aux) {
    void *a = mmap(NULL, alen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) return pe_push_syserror(L, "mmap", "sim_ring aux", errno, NULL);
    memcpy(a, aux, alen);
    st->aux = a;
    st->aux_len = alen;
    ev->page->aux_size = alen;
    ev->page->aux_head = opt_u64(L, 1, "aux_head", alen);
    ev->page->aux_tail = opt_u64(L, 1, "aux_tail", 0);
  }
  lua_settop(L, 4);
  return 1;
}

/* core.sim_ring_write(ev, pos, bytes): writes into a simulated ring's data
 * area at ring position pos (wrapping) and returns the new head when
 * `head` (3rd arg) is given.  Lets tests append records across the end. */
static int l_sim_ring_write(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  ring_state *st = (ring_state *)ev->scratch;
  uint64_t pos = pe_check_u64(L, 2);
  size_t len, i;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 3, &len);
  if (!st || !st->sim) return luaL_argerror(L, 1, "not a simulated ring");
  if (len > st->size) return luaL_argerror(L, 3, "longer than the ring");
  for (i = 0; i < len; i++) st->base[(pos + i) & (st->size - 1)] = s[i];
  if (!lua_isnoneornil(L, 4))
    __atomic_store_n(&ev->page->data_head, pe_check_u64(L, 4), __ATOMIC_RELEASE);
  return 0;
}

void pe_ring_funcs(lua_State *L)
{
  static const luaL_Reg funcs[] = {
    {"decode_record", pe_l_decode_record}, {"sim_ring", l_sim_ring},
    {"sim_ring_write", l_sim_ring_write}, {NULL, NULL}
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
