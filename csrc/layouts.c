/*
 * layouts.c - the decode layouts of events sharing one ring (doc/coverage.md E6).
 *
 * Owns: the reference-counted tables ev->own_lt / ev->out_lt.  When another
 * event is redirected into a ring with set_output, the ring's table learns
 * a copy of that event's decode parameters under its id.  While every
 * layout equals the owner's, records decode exactly as unshared; when
 * they differ, each record is attributed by its PERF_SAMPLE_IDENTIFIER
 * (first u64 of a SAMPLE body, last u64 of the sample_id trailer
 * otherwise) and decoded with its event's layout (pe_layouts_cfg).
 * Tables hold copies, never event pointers.  Called by lifecycle.c
 * (release on close), event.c (set_output), ring.c (decoding) and the
 * test-only simulator (spec/support/pesim.c); calls only records.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include "pe_records.h"

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
static int by_id(const struct pe_layouts *lt)
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

void pe_layouts_join(pe_event *ev, pe_event *target, const char *name)
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


/* ev's layout leaves the ring it joined, and ev's own table is let go
 * (members keep it alive) */
void pe_layouts_release(pe_event *ev)
{
  ring_leave(ev);
  if (ev->own_lt) {
    layouts_unref(ev->own_lt);
    ev->own_lt = NULL;
  }
}

int pe_layouts_add_attr(pe_event *ev, uint64_t id, const struct pe_attr *a,
                        const char *name)
{
  pe_layout l;
  struct pe_layouts *lt = target_table(ev);
  if (!lt) return -1;
  layout_set(&l, id, a, name);
  return layouts_add(lt, &l);
}

unsigned pe_layouts_version(const pe_event *ev)
{
  return ev->own_lt ? ev->own_lt->version : 0;
}

/* pushes by_id, {[id] = {name=, type=, config=, sample_type=}} of the
 * events redirected into ev's ring (not ev itself); returns 2 */
int pe_layouts_push(lua_State *L, const pe_event *ev)
{
  const struct pe_layouts *lt = ev->own_lt;
  int i;
  lua_pushboolean(L, by_id(lt));
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

static const char *const demux_hint =
  "add \"identifier\" to the sample_type of every event sharing the ring";

/*
 * The layout to decode rec (len bytes, len >= 8, from ev's ring) with: the
 * owner's while every layout is the same; otherwise the one of the event
 * whose id the record carries.  NULL with msg set when the record
 * cannot be attributed.
 */
const pe_decode_cfg *pe_layouts_cfg(const pe_event *ev, const pe_decode_cfg *own,
                                    const unsigned char *rec, size_t len,
                                    char *msg, size_t msglen)
{
  const struct pe_layouts *lt = ev->own_lt;
  struct pe_event_header h;
  const char *tname;
  uint64_t id;
  int i;
  if (!by_id(lt)) return own;   /* one layout: as unshared */
  memcpy(&h, rec, sizeof h);
  tname = pe_record_type_name(h.type);
  if (!tname) tname = "unknown";
  if (!lt->demux) {
    snprintf(msg, msglen, "events with different sample layouts share this "
             "ring (set_output) and a %s record cannot be attributed: %s", tname, demux_hint);
    return NULL;
  }
  if (h.type == PE_RECORD_SAMPLE) {
    if (len < 16) {
      snprintf(msg, msglen, "sample record (%u bytes) is too short for its "
               "identifier", (unsigned)len);
      return NULL;
    }
    memcpy(&id, rec + 8, 8);
  } else if (lt->sia == 0) {
    /* no trailers: the bodies do not depend on sample_type; READ's does on
     * read_format */
    if (h.type == PE_RECORD_READ && !lt->rf_same) {
      snprintf(msg, msglen, "a read record in a ring shared by events with "
               "different read_format cannot be attributed: set sample_id_all on every "
               "event sharing the ring");
      return NULL;
    }
    return own;
  } else if (lt->sia == 2) {
    snprintf(msg, msglen, "a %s record cannot be attributed: sample_id_all is "
             "set on some of the events sharing this ring but not on all; set it on every "
             "one (or none)", tname);
    return NULL;
  } else {
    if (len < 16) {
      snprintf(msg, msglen, "%s record (%u bytes) is too short for its "
               "sample_id trailer", tname, (unsigned)len);
      return NULL;
    }
    memcpy(&id, rec + len - 8, 8);
  }
  if (id == lt->own.id) return own;
  for (i = 0; i < lt->n; i++)
    if (lt->v[i].id == id) return &lt->v[i].cfg;
  snprintf(msg, msglen, "%s record with id %llu: no event sending records to "
           "this ring has that id (redirect with set_output(event), not an fd, and drain "
           "the ring before closing the event; %s)", tname, (unsigned long long)id,
           demux_hint);
  return NULL;
}

