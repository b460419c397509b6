/*
 * fast.c - plain C entry points for LuaJIT's FFI (lua/perf_event/fast.lua):
 * ev:read(), group:read(t), enable/disable/reset, with fixed prototypes so
 * the JIT compiles the call into the trace.  A full userdata passed to a
 * pointer parameter arrives as its payload (pe_event / pe_group).
 *
 * Owns: the pe_fast_* symbols (exported, like luaopen_*), and registering
 * core.time_conv, _private.fast_token and _private.fast_cdef (the fast
 * view of pe_core.h as C text for ffi.cdef).
 * Calls event.c (pe_event_read), group.c (pe_group_ioctl), lifecycle.c,
 * userpage.c and the leaves; nothing calls it but core.c.  Every entry
 * returns -1 for anything but plain success (closed, syscall failure,
 * odd layout): the Lua side then calls the C API method, which produces
 * the very same error or raise.
 */
#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include "userpage.h"

#define RF_TIMES (PE_FORMAT_TOTAL_TIME_ENABLED | PE_FORMAT_TOTAL_TIME_RUNNING)
#define EXACT_MAX ((uint64_t)1 << 53)   /* above: LuaJIT needs a uint64_t cdata */
#define FAST_BIG 4                       /* pe_fast_read: some value >= 2^53 */
#define FAST_GBIG 0x10000                /* pe_fast_group_read: the same */

static const char fast_token;           /* identifies this copy of the core */

/* the fast view as the FFI declares it from PE_FAST_CDEF (pe_core.h): the
 * same macros as pe_event/pe_group, so the same layout; checked anyway */
struct pe_fast_event { PE_FAST_EVENT_HEAD };
struct pe_fast_group { PE_FAST_GROUP_BODY(struct pe_fast_event) };
_Static_assert(offsetof(pe_event, fd) == offsetof(struct pe_fast_event, fd), "fast view");
_Static_assert(offsetof(pe_event, plain_fd1) == offsetof(struct pe_fast_event, plain_fd1),
               "fast view");
_Static_assert(offsetof(pe_group, n) == offsetof(struct pe_fast_group, n), "fast view");
_Static_assert(offsetof(pe_group, ev) == offsetof(struct pe_fast_group, ev), "fast view");

PE_EXPORT const void *pe_fast_token(void);
PE_EXPORT int pe_fast_read(pe_event *ev, uint64_t *out);
PE_EXPORT int pe_fast_ioctl(pe_event *ev, int op, int group);
PE_EXPORT int pe_fast_group_read(pe_group *g, uint64_t *out, int cap);
PE_EXPORT int pe_fast_group_ioctl(pe_group *g, int op);
PE_EXPORT uint64_t pe_fast_scale(uint64_t value, uint64_t enabled, uint64_t running);

const void *pe_fast_token(void)
{
  return &fast_token;
}

/* the general case of pe_fast_read: the user page, or any read_format
 * (GROUP members pick their own value by id), as l_read computes it */
static __attribute__((noinline)) int read_general(pe_event *ev, uint64_t out[3])
{
  long n;
  if (pe_event_read(ev, out, &n) < 0) return -1;
  if ((ev->read_format & RF_TIMES) == RF_TIMES) out[0] = pe_scale(out[0], out[1], out[2]);
  return 0;
}

static inline void store_double(uint64_t *slot, uint64_t v)
{
  double d = (double)(int64_t)v;     /* v < 2^53: exact */
  memcpy(slot, &d, sizeof d);
}

/*
 * ev:read() for the FFI.  out[0..2] = value, time_enabled, time_running as
 * uint64_t; when all three are below 2^53 they are also stored as doubles
 * in out[3..5], so the Lua side returns them without a conversion.
 * -> -1 (use the C method) or which results exist: bit 0 time_enabled,
 * bit 1 time_running (3 = value, enabled, running), | FAST_BIG when the
 * doubles were not stored.  A closed event has fd -1: read(2) fails with
 * EBADF and the C method raises.
 */
int pe_fast_read(pe_event *ev, uint64_t *out)
{
  int rc;
  if (ev->gen != pe_fork_gen) return -1;    /* forked: the C method fixes it up */
  /* the plain read(2) case was tried from the trace already (plain_fd1):
   * here are the user page, other read_formats and a failed plain read */
  if (read_general(ev, out) < 0) return -1;
  rc = ((ev->read_format & PE_FORMAT_TOTAL_TIME_ENABLED) ? 1 : 0) |
       ((ev->read_format & PE_FORMAT_TOTAL_TIME_RUNNING) ? 2 : 0);
  if ((out[0] | out[1] | out[2]) >= EXACT_MAX) return rc | FAST_BIG;
  store_double(out + 3, out[0]);
  store_double(out + 4, out[1]);
  store_double(out + 5, out[2]);
  return rc;
}

/* the multiplex scaling of the plain case (fast.lua's plain_rest) */
uint64_t pe_fast_scale(uint64_t value, uint64_t enabled, uint64_t running)
{
  return pe_scale(value, enabled, running);
}

static unsigned long ioctl_req(int op)
{
  return op == 0 ? PE_IOC_ENABLE : op == 1 ? PE_IOC_DISABLE : PE_IOC_RESET;
}

/* op: 0 enable, 1 disable, 2 reset; group != 0 adds PERF_IOC_FLAG_GROUP */
int pe_fast_ioctl(pe_event *ev, int op, int group)
{
  /* a forked child's copy (or one not yet seen since a fork): the C
   * method answers, refusing (pe_event_inherited) */
  if (ev->fd < 0 || op < 0 || op > 2 || ev->gen != pe_fork_gen || (ev->flags & PE_EV_INHERITED))
    return -1;
  return ioctl(ev->fd, ioctl_req(op), group ? PE_IOC_FLAG_GROUP : 0) < 0 ? -1 : 0;
}

int pe_fast_group_ioctl(pe_group *g, int op)
{
  if (g->n < 0 || g->ev[0]->fd < 0 || op < 0 || op > 2 || g->ev[0]->gen != pe_fork_gen
      || (g->ev[0]->flags & PE_EV_INHERITED))
    return -1;
  return pe_group_ioctl(g, ioctl_req(op));
}

/* out[0] time_enabled, out[1] time_running, out[2+i] member i's scaled
 * value (matched by id as g_read does) -> members | FAST_GBIG, or -1 */
int pe_fast_group_read(pe_group *g, uint64_t *out, int cap)
{
  uint64_t buf[3 + 3 * GROUP_MAX], big;
  pe_readval vals[GROUP_MAX];
  pe_reading r;
  long n;
  int i;
  if (g->n < 0 || g->ev[0]->fd < 0 || cap < g->n + 2) return -1;
  if (g->read_format == (PE_FORMAT_GROUP | PE_FORMAT_ID | RF_TIMES)) {
    /* what pe.group asks for: nr, enabled, running, {value, id} * nr */
    uint64_t en, run, nr;
    n = pe_read_fd(g->ev[0]->fd, buf, 8 * (3 + 2 * (size_t)g->n));
    if (n < 24) return -1;
    nr = buf[0];
    if ((uint64_t)n != 8 * (3 + 2 * nr) || nr > GROUP_MAX) return -1;
    en = out[0] = buf[1];
    run = out[1] = buf[2];
    big = en | run;
    for (i = 0; i < g->n; i++) {
      uint64_t id = g->ev[i]->id, v, k = (uint64_t)i;
      if (k >= nr || buf[4 + 2 * k] != id)
        for (k = 0; k < nr && buf[4 + 2 * k] != id; k++) {}
      if (k == nr) return -1;                  /* member gone: g_read gives nil */
      v = buf[3 + 2 * k];
      v = run < en || run == 0 ? pe_scale(v, en, run) : v;
      out[2 + i] = v;
      big |= v;
    }
    return g->n | (big >= EXACT_MAX ? FAST_GBIG : 0);
  }
  r.v = vals;
  r.cap = GROUP_MAX;
  n = pe_read_fd(g->ev[0]->fd, buf, sizeof buf);
  if (n <= 0 || pe_readfmt_decode((unsigned char *)buf, (size_t)n, g->read_format, &r) < 0)
    return -1;
  out[0] = r.time_enabled;
  out[1] = r.time_running;
  big = r.time_enabled | r.time_running;
  for (i = 0; i < g->n; i++) {
    long k = (g->read_format & PE_FORMAT_ID) ? pe_reading_find(&r, g->ev[i]->id, (uint64_t)i)
             : (uint64_t)i < r.nr ? i : -1;
    uint64_t v;
    if (k < 0) return -1;                      /* member gone: g_read gives nil */
    v = r.v[k].value;
    out[2 + i] = pe_scale(v, r.time_enabled, r.time_running);
    big |= out[2 + i];
  }
  return g->n | (big >= EXACT_MAX ? FAST_GBIG : 0);
}

/* adds time_conv to the module table on top of the stack, and to
 * core._private what fast.lua binds with: the token of this copy and the
 * fast view's declaration */
void pe_fast_open(lua_State *L)
{
  int mod = lua_gettop(L);
  lua_pushcfunction(L, pe_l_time_conv);
  lua_setfield(L, mod, "time_conv");
  pe_push_private(L, mod);
  lua_pushlightuserdata(L, (void *)&fast_token);
  lua_setfield(L, -2, "fast_token");
  lua_pushliteral(L, PE_FAST_CDEF);
  lua_setfield(L, -2, "fast_cdef");
  lua_pop(L, 1);
}
