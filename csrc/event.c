/*
 * event.c - the methods of perf_event.event: every ioctl and the reads.
 *
 * Owns: enable/disable/reset/refresh/period/set_output/set_filter/set_bpf/
 * pause_output/modify/query_bpf, read (through the user page when it can
 * be used, read(2) otherwise; pe_event_read, shared with fast.c),
 * read_raw, close, fd, id, name, attr, info, tostring (doc/coverage.md A, C,
 * G), the "perf_event.event" metatable with ring.c's sampling methods,
 * and enable_all/disable_all (prctl).  Opening, closing and the fork
 * generation are lifecycle.c's; groups group.c's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <unistd.h>
#include "pe_core.h"

/* ---- simple ioctls ----------------------------------------------------- */
/* Each control method first refuses in a forked child (pe_event_inherited):
 * the child's fd is the parent's file description, so its ioctl would
 * switch, reset or retarget the parent's event. */
/* true, or the error triple; EEXIST (a second filter or program) gets its
 * own hint when the ioctl can say so */
static int ioctl_result_ex(lua_State *L, int idx, const char *op, int rc, const char *hint,
                           const char *eexist_hint)
{
  if (rc < 0) {
    int err = errno;
    if (err == EEXIST && eexist_hint) hint = eexist_hint;
    return pe_push_syserror(L, op, pe_event_name(L, idx), err, hint);
  }
  lua_pushboolean(L, 1);
  return 1;
}

static int ioctl_result(lua_State *L, int idx, const char *op, int rc, const char *hint)
{
  return ioctl_result_ex(L, idx, op, rc, hint, NULL);
}

static int l_enable(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  if (pe_event_inherited(ev)) return pe_push_inherited(L, 1, ev, "enable");
  unsigned long arg = lua_toboolean(L, 2) ? PE_IOC_FLAG_GROUP : 0;
  return ioctl_result(L, 1, "enable", ioctl(ev->fd, PE_IOC_ENABLE, arg), NULL);
}

static int l_disable(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  if (pe_event_inherited(ev)) return pe_push_inherited(L, 1, ev, "disable");
  unsigned long arg = lua_toboolean(L, 2) ? PE_IOC_FLAG_GROUP : 0;
  return ioctl_result(L, 1, "disable", ioctl(ev->fd, PE_IOC_DISABLE, arg), NULL);
}

static int l_reset(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  if (pe_event_inherited(ev)) return pe_push_inherited(L, 1, ev, "reset");
  unsigned long arg = lua_toboolean(L, 2) ? PE_IOC_FLAG_GROUP : 0;
  return ioctl_result(L, 1, "reset", ioctl(ev->fd, PE_IOC_RESET, arg), NULL);
}

static int l_refresh(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  if (pe_event_inherited(ev)) return pe_push_inherited(L, 1, ev, "refresh");
  lua_Integer n = luaL_checkinteger(L, 2);
  if (n < 0 || n > 0x7fffffff) return luaL_argerror(L, 2, "must be 0..2^31-1");
  return ioctl_result(L, 1, "refresh", ioctl(ev->fd, PE_IOC_REFRESH, (unsigned long)n),
                      "refresh needs a sampling, non-inherited event");
}

static int l_period(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  if (pe_event_inherited(ev)) return pe_push_inherited(L, 1, ev, "period");
  uint64_t p = pe_check_u64(L, 2);
  int rc = ioctl(ev->fd, PE_IOC_PERIOD, &p);
  if (rc == 0) ev->attr.sample_period = p;
  return ioctl_result(L, 1, "period", rc,
                      "the period must be 1..2^63-1 and the event a sampling event");
}

static int l_set_output(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  if (pe_event_inherited(ev)) return pe_push_inherited(L, 1, ev, "set_output");
  pe_event *t = NULL;
  long target = -1;    /* must be a long: see doc/coverage.md G7 */
  int rc;
  if (!lua_isnoneornil(L, 2)) {
    t = pe_test_event(L, 2);
    if (t) {
      if (t->fd < 0) return luaL_argerror(L, 2, "the target event is closed");
      target = t->fd;
    } else if (lua_type(L, 2) == LUA_TNUMBER) {
      target = pe_check_int(L, 2, "set_output: target fd", -1, INT_MAX);
    } else {
      return luaL_argerror(L, 2, "expected a perf_event.event, an fd or nil");
    }
  }
  rc = ioctl(ev->fd, PE_IOC_SET_OUTPUT, target);
  /* the target's ring learns this event's layout (or forgets it): E6 */
  if (rc == 0) pe_layouts_join(ev, t, pe_event_name(L, 1));
  return ioctl_result(L, 1, "set_output", rc,
                      "the target must be a perf fd on the same cpu/task with the same "
                      "clock, and this event must not have its own ring mapped");
}

static int l_set_filter(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  if (pe_event_inherited(ev)) return pe_push_inherited(L, 1, ev, "set_filter");
  size_t len;
  const char *s = luaL_checklstring(L, 2, &len);
  if (strlen(s) != len) return luaL_argerror(L, 2, "filter contains a NUL byte");
  return ioctl_result_ex(L, 1, "set_filter", ioctl(ev->fd, PE_IOC_SET_FILTER, s),
                         "filters apply to tracepoint/uprobe events and use ftrace syntax "
                         "over the tracepoint's format fields, e.g. 'fd == 1'",
                         "a filter is already set on this event; filters can be set once");
}

static int l_set_bpf(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  if (pe_event_inherited(ev)) return pe_push_inherited(L, 1, ev, "set_bpf");
  int pfd = pe_check_int(L, 2, "set_bpf: program fd", -1, INT_MAX);
  return ioctl_result_ex(L, 1, "set_bpf",
                         ioctl(ev->fd, PE_IOC_SET_BPF, (unsigned long)(uint32_t)pfd),
                         "pass a loaded BPF program fd of a type matching the event "
                         "(TRACEPOINT, KPROBE or PERF_EVENT)",
                         "a BPF program is already attached to this event");
}

static int l_pause_output(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  if (pe_event_inherited(ev)) return pe_push_inherited(L, 1, ev, "pause_output");
  unsigned long on = lua_isnoneornil(L, 2) ? 1 : (unsigned long)lua_toboolean(L, 2);
  return ioctl_result(L, 1, "pause_output", ioctl(ev->fd, PE_IOC_PAUSE_OUTPUT, on),
                      "pause_output needs a mapped ring buffer");
}

static int l_modify(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  if (pe_event_inherited(ev)) return pe_push_inherited(L, 1, ev, "modify");
  struct pe_attr a, cur = ev->attr;
  int rc;
  luaL_checktype(L, 2, LUA_TTABLE);
  pe_attr_from_table(L, 2, &a, 0);
  /* overlay: fields the caller named replace the event's current ones;
   * which fields the ioctl may change is the field table's (abi.c) */
  lua_pushnil(L);
  while (lua_next(L, 2)) {
    const char *k = lua_tostring(L, -2);
    const pe_fielddesc *f = pe_attr_field(k);
    if (f && f->modify)
      memcpy((unsigned char *)&cur + f->off, (const unsigned char *)&a + f->off, f->size);
    else if (strcmp(k, "type") != 0) {
      luaL_Buffer b;
      luaL_buffinit(L, &b);
      for (f = pe_attr_fields; f->name; f++)
        if (f->modify) {
          luaL_addstring(&b, ", ");
          luaL_addstring(&b, f->name);
        }
      luaL_pushresult(&b);
      luaL_error(L, "modify: field '%s' cannot be changed (only %s)", k, lua_tostring(L, -1) + 2);
    }
    lua_pop(L, 1);
  }
  cur.size = sizeof cur;
  rc = ioctl(ev->fd, PE_IOC_MODIFY_ATTRIBUTES, &cur);
  if (rc == 0) ev->attr = cur;
  return ioctl_result(L, 1, "modify", rc,
                      "only breakpoint events can be modified (bp_addr, bp_len, bp_type, sig_data)");
}

static int l_query_bpf(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  lua_Integer max = luaL_optinteger(L, 2, 64);
  struct { uint32_t ids_len, prog_cnt; uint32_t ids[256]; } q;
  uint32_t i;
  if (max < 0 || max > 256) return luaL_argerror(L, 2, "0..256");
  memset(&q, 0, sizeof q);
  q.ids_len = (uint32_t)max;
  if (ioctl(ev->fd, PE_IOC_QUERY_BPF, &q) < 0) {
    int err = errno;
    return pe_push_syserror(L, "query_bpf", pe_event_name(L, 1), err,
                            err == ENOSPC ? "more programs are attached than the ids array holds"
                            : "query_bpf works on tracepoint/kprobe/uprobe events (needs "
                              "CAP_PERFMON or CAP_SYS_ADMIN)");
  }
  lua_createtable(L, (int)q.prog_cnt, 1);
  for (i = 0; i < q.prog_cnt && i < q.ids_len; i++) {
    lua_pushinteger(L, q.ids[i]);
    lua_rawseti(L, -2, (int)i + 1);
  }
  lua_pushinteger(L, q.prog_cnt);
  lua_setfield(L, -2, "prog_cnt");
  return 1;
}

/* inlined into l_read (the C API route's hot path); fast.c calls the
 * out-of-line pe_event_read below */
static inline __attribute__((always_inline)) int event_read(pe_event *ev, uint64_t out[3],
                                                             long *nread)
{
  uint64_t buf[5 + 3 * GROUP_MAX];
  pe_readval vals[GROUP_MAX];
  pe_reading r;
  long n, k;
  if (pe_userpage_try_read(ev, out) == 0) return 0;   /* seqlock + rdpmc (userpage.c) */
  r.v = vals;
  r.cap = GROUP_MAX;
  n = pe_read_fd(ev->fd, buf, sizeof buf);
  if (n <= 0 || pe_readfmt_decode((unsigned char *)buf, (size_t)n, ev->read_format, &r) < 0 ||
      r.nr == 0) {
    *nread = n;
    return -1;
  }
  k = 0;                         /* a GROUP member picks its own value */
  if ((ev->read_format & PE_FORMAT_GROUP) && (ev->read_format & PE_FORMAT_ID)) {
    k = pe_reading_find(&r, ev->id, 0);
    if (k < 0) k = 0;
  }
  out[0] = r.v[k].value;
  out[1] = r.time_enabled;
  out[2] = r.time_running;
  return 0;
}

int pe_event_read(pe_event *ev, uint64_t out[3], long *nread)
{
  return event_read(ev, out, nread);
}

/* ev:read() -> value (scaled), time_enabled, time_running */
static int l_read(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  uint64_t out[3], value;
  struct { uint64_t time_enabled, time_running; } r;
  long n = 0;
  if (event_read(ev, out, &n) < 0) return pe_push_read_error(L, 1, n, errno);
  value = out[0];
  r.time_enabled = out[1];
  r.time_running = out[2];
  if ((ev->read_format & PE_FORMAT_TOTAL_TIME_ENABLED) &&
      (ev->read_format & PE_FORMAT_TOTAL_TIME_RUNNING)) {
    pe_push_u64(L, pe_scale(value, r.time_enabled, r.time_running));
    pe_push_u64(L, r.time_enabled);
    pe_push_u64(L, r.time_running);
    return 3;
  }
  pe_push_u64(L, value);
  if (ev->read_format & PE_FORMAT_TOTAL_TIME_ENABLED) { pe_push_u64(L, r.time_enabled); return 2; }
  if (ev->read_format & PE_FORMAT_TOTAL_TIME_RUNNING) {
    lua_pushnil(L);
    pe_push_u64(L, r.time_running);
    return 3;
  }
  return 1;
}

/* ev:read_raw() -> the whole read_format decoded, unscaled */
static int l_read_raw(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  uint64_t buf[5 + 3 * GROUP_MAX];
  pe_readval vals[GROUP_MAX];
  pe_reading r;
  long n;
  r.v = vals;
  r.cap = GROUP_MAX;
  n = pe_read_fd(ev->fd, buf, sizeof buf);
  if (n <= 0 || pe_readfmt_decode((unsigned char *)buf, (size_t)n, ev->read_format, &r) < 0)
    return pe_push_read_error(L, 1, n, errno);
  pe_push_reading(L, &r, ev->read_format);
  lua_pushinteger(L, n);      /* bytes read(2) returned */
  return 2;
}

/* ---- misc methods ------------------------------------------------------ */
static int l_close(lua_State *L)
{
  pe_event *ev = pe_to_event(L, 1);
  pe_event_close(ev);
  return 0;
}

static int l_fd(lua_State *L)
{
  lua_pushinteger(L, pe_check_event(L, 1)->fd);
  return 1;
}

static int l_id(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  if (!ev->id) {
    uint64_t id = 0;
    if (ioctl(ev->fd, PE_IOC_ID, &id) < 0)
      return pe_push_syserror(L, "id", pe_event_name(L, 1), errno, NULL);
    ev->id = id;
  }
  pe_push_u64(L, ev->id);
  return 1;
}

static int l_name(lua_State *L)
{
  pe_to_event(L, 1);
  lua_pushstring(L, pe_event_name(L, 1));
  return 1;
}

static int l_attr(lua_State *L)
{
  pe_event *ev = pe_to_event(L, 1);
  pe_attr_to_table(L, &ev->attr);
  pe_getuservalue(L, 1);
  if (lua_istable(L, -1)) {
    lua_getfield(L, -1, "uprobe_path");
    if (!lua_isnil(L, -1)) { lua_setfield(L, -3, "uprobe_path"); lua_pushnil(L); lua_setfield(L, -3, "config1"); }
    else lua_pop(L, 1);
    lua_getfield(L, -1, "kprobe_func");
    if (!lua_isnil(L, -1)) { lua_setfield(L, -3, "kprobe_func"); lua_pushnil(L); lua_setfield(L, -3, "config1"); }
    else lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return 1;
}

static int l_info(lua_State *L)
{
  pe_event *ev = pe_to_event(L, 1);
  lua_createtable(L, 0, 14);
  lua_pushstring(L, pe_event_name(L, 1)); lua_setfield(L, -2, "name");
  lua_pushboolean(L, ev->fd < 0); lua_setfield(L, -2, "closed");
  lua_pushinteger(L, ev->fd); lua_setfield(L, -2, "fd");
  pe_push_u64(L, ev->id); lua_setfield(L, -2, "id");
  lua_pushinteger(L, ev->pid); lua_setfield(L, -2, "pid");
  lua_pushinteger(L, ev->opener); lua_setfield(L, -2, "opener");
  lua_pushboolean(L, pe_event_inherited(ev)); lua_setfield(L, -2, "inherited");
  lua_pushinteger(L, ev->cpu); lua_setfield(L, -2, "cpu");
  pe_push_u64(L, ev->read_format); lua_setfield(L, -2, "read_format");
  pe_push_u64(L, ev->sample_type); lua_setfield(L, -2, "sample_type");
  lua_pushboolean(L, ev->page != NULL); lua_setfield(L, -2, "mapped");
  lua_pushinteger(L, (lua_Integer)ev->data_pages); lua_setfield(L, -2, "pages");
  lua_pushboolean(L, (ev->flags & PE_EV_MEMBER) != 0); lua_setfield(L, -2, "member");
  lua_pushboolean(L, (ev->flags & PE_EV_SELFMON) != 0); lua_setfield(L, -2, "self");
  lua_pushboolean(L, (ev->flags & PE_EV_AUTOEXCL) != 0);
  lua_setfield(L, -2, "auto_exclude_kernel");
  if (ev->flags & PE_EV_AUTOEXCL) {
    lua_pushliteral(L, "exclude_kernel and exclude_hv were set because the kernel refused "
                    "kernel-mode measurement (perf_event_paranoid >= 2, no CAP_PERFMON): "
                    "counts are user-space only");
    lua_setfield(L, -2, "note");
  }
  {
    int up = pe_userpage_usable(ev);            /* userpage.c */
    if (ev->page && ev->fd >= 0) {
      uint64_t caps = __atomic_load_n(&ev->page->capabilities, __ATOMIC_RELAXED);
      pe_push_u64(L, caps); lua_setfield(L, -2, "capabilities");
    }
    lua_pushboolean(L, up == 0); lua_setfield(L, -2, "rdpmc");
    if (up == 0) lua_pushliteral(L, "rdpmc");
    else lua_pushfstring(L, "read(2): %s", pe_userpage_reason(up));
    lua_setfield(L, -2, "read_path");
  }
  return 1;
}

static int l_tostring(lua_State *L)
{
  pe_event *ev = pe_to_event(L, 1);
  if (ev->fd < 0)
    lua_pushfstring(L, "perf_event.event(%s, closed)", pe_event_name(L, 1));
  else
    lua_pushfstring(L, "perf_event.event(%s, fd %d)", pe_event_name(L, 1), ev->fd);
  return 1;
}

/* ---- prctl ------------------------------------------------------------- */
static int l_enable_all(lua_State *L)
{
  if (prctl(PE_PR_TASK_PERF_EVENTS_ENABLE, 0, 0, 0, 0) < 0)
    return pe_push_syserror(L, "prctl", "PR_TASK_PERF_EVENTS_ENABLE", errno, NULL);
  lua_pushboolean(L, 1);
  return 1;
}

static int l_disable_all(lua_State *L)
{
  if (prctl(PE_PR_TASK_PERF_EVENTS_DISABLE, 0, 0, 0, 0) < 0)
    return pe_push_syserror(L, "prctl", "PR_TASK_PERF_EVENTS_DISABLE", errno, NULL);
  lua_pushboolean(L, 1);
  return 1;
}

static const luaL_Reg event_methods[] = {
  {"enable", l_enable}, {"disable", l_disable}, {"reset", l_reset},
  {"refresh", l_refresh}, {"period", l_period}, {"set_output", l_set_output},
  {"set_filter", l_set_filter}, {"set_bpf", l_set_bpf},
  {"pause_output", l_pause_output}, {"modify", l_modify},
  {"query_bpf", l_query_bpf}, {"read", l_read}, {"read_raw", l_read_raw},
  {"close", l_close}, {"fd", l_fd}, {"id", l_id}, {"name", l_name},
  {"attr", l_attr}, {"info", l_info}, {NULL, NULL}
};

static const luaL_Reg funcs[] = {
  {"open", pe_l_open},
  {"enable_all", l_enable_all}, {"disable_all", l_disable_all}, {NULL, NULL}
};

int pe_open_events(lua_State *L)
{
  pe_lifecycle_init();
  /* stack: module table.  The C methods also go to core._private, from
   * which lua/perf_event/class.lua assembles each class's __index */
  int mod = lua_gettop(L);
  luaL_newmetatable(L, PE_EVENT_MT);
  lua_newtable(L);
  pe_setfuncs(L, event_methods);
  pe_ring_methods(L);
  pe_set_private(L, mod, "event_methods");      /* the table on top, kept */
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, l_close); lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, l_close); lua_setfield(L, -2, "__close");
  lua_pushcfunction(L, l_tostring); lua_setfield(L, -2, "__tostring");
  lua_pushliteral(L, PE_EVENT_MT); lua_setfield(L, -2, "__name");
  lua_setfield(L, -2, "event_mt");

  pe_open_groups(L, mod);

  pe_setfuncs(L, funcs);
  return 0;
}
