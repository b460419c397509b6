/*
 * event.c - perf_event_open, the event and group userdata, every ioctl.
 *
 * Owns: core.open (attr encoding -> syscall -> userdata, with perf's
 * fallback to exclude_kernel/hv on EACCES when the caller allows it),
 * the "perf_event.event" and "perf_event.group" metatables and their
 * methods (CHECKLIST A, C, G), the user-page / ring mapping, and the
 * idempotent close shared by close(), __gc and __close.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "pe_core.h"

/* gettid() cached per thread; a forked child starts with its parent's TLS,
 * so the cache is cleared in the child (glibc unregisters the handler if
 * the module is unloaded) */
static __thread int tls_tid;
static void clear_tid(void) { tls_tid = 0; }
static void register_atfork(void) { pthread_atfork(NULL, NULL, clear_tid); }

int pe_current_tid(void)
{
  if (!tls_tid) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_atfork);
    tls_tid = (int)syscall(SYS_gettid);
  }
  return tls_tid;
}

static long page_size(void)
{
  static long ps = 0;
  if (!ps) ps = sysconf(_SC_PAGESIZE);
  return ps;
}

static int sys_perf_event_open(struct pe_attr *a, int pid, int cpu, int group_fd,
                               unsigned long flags)
{
  return (int)syscall(PE_NR_perf_event_open, a, pid, cpu, group_fd, flags);
}

/* ---- fork --------------------------------------------------------------- */
unsigned pe_fork_gen = 1;

static void atfork_child(void)
{
  pe_fork_gen++;
}

void pe_event_after_fork(pe_event *ev)
{
  /* the child has the fd but not the mapping: drop the pointers, never
   * munmap (the range may hold another mapping by now) */
  if (ev->page && ev->data_pages) ev->flags |= PE_EV_FORKED;
  ev->page = NULL;
  ev->map_len = 0;
  ev->data_pages = 0;
  free(ev->scratch);     /* heap, copied: ring state incl. the AUX pointer */
  ev->scratch = NULL;
  ev->scratch_len = 0;
  ev->flags &= ~PE_EV_SELFMON;    /* pid 0 meant the parent */
  ev->gen = pe_fork_gen;
  pe_fast_plain(ev);
}

/* ---- accessors --------------------------------------------------------- */
pe_event *pe_to_event(lua_State *L, int idx)
{
  pe_event *ev = (pe_event *)luaL_checkudata(L, idx, PE_EVENT_MT);
  if (ev->gen != pe_fork_gen) pe_event_after_fork(ev);
  return ev;
}

pe_event *pe_check_event(lua_State *L, int idx)
{
  pe_event *ev = pe_to_event(L, idx);
  if (ev->fd < 0) luaL_error(L, "attempt to use a closed perf_event.event");
  return ev;
}

static const char *ev_name(lua_State *L, int idx)
{
  const char *s;
  pe_getuservalue(L, idx);
  if (!lua_istable(L, -1)) { lua_pop(L, 1); return "?"; }
  lua_getfield(L, -1, "name");
  s = lua_tostring(L, -1);
  lua_pop(L, 2);     /* the string stays anchored in the uservalue table */
  return s ? s : "?";
}

int pe_event_close(pe_event *ev)
{
  int had = ev->fd >= 0;
  if (ev->page) {
    munmap(ev->page, ev->map_len);
    ev->page = NULL;
    ev->map_len = 0;
  }
  pe_ring_close(ev);
  free(ev->scratch);
  ev->scratch = NULL;
  ev->scratch_len = 0;
  if (ev->fd >= 0) {
    close(ev->fd);
    ev->fd = -1;
  }
  ev->plain_fd1 = 0;
  ev->flags |= PE_EV_CLOSED;
  return had;
}

/* ---- mapping ----------------------------------------------------------- */
static int map_event(pe_event *ev, size_t data_pages)
{
  size_t len = (size_t)page_size() * (1 + data_pages);
  int prot = PROT_READ | PROT_WRITE;
  void *p;
  if ((ev->attr.flags >> PE_FLAG_write_backward) & 1) prot = PROT_READ;
  p = mmap(NULL, len, prot, MAP_SHARED, ev->fd, 0);
  if (p == MAP_FAILED) return errno;
  ev->page = (struct pe_mmap_page *)p;
  ev->map_len = len;
  ev->data_pages = data_pages;
  ev->tail = 0;
  return 0;
}

/* ---- options ----------------------------------------------------------- */
static int opt_int(lua_State *L, int opts, const char *k, int dflt)
{
  int v = dflt;
  lua_getfield(L, opts, k);
  if (!lua_isnil(L, -1)) {
    lua_Number n;
    if (lua_type(L, -1) != LUA_TNUMBER)
      luaL_error(L, "option '%s': expected an integer, got %s", k, luaL_typename(L, -1));
    n = lua_tonumber(L, -1);
    if (n != (lua_Number)(int)n) luaL_error(L, "option '%s': %f is not a 32-bit integer", k, (double)n);
    v = (int)n;
  }
  lua_pop(L, 1);
  return v;
}

static int opt_bool(lua_State *L, int opts, const char *k, int dflt)
{
  int v = dflt;
  lua_getfield(L, opts, k);
  if (!lua_isnil(L, -1)) {
    if (lua_type(L, -1) != LUA_TBOOLEAN)
      luaL_error(L, "option '%s': expected a boolean, got %s", k, luaL_typename(L, -1));
    v = lua_toboolean(L, -1);
  }
  lua_pop(L, 1);
  return v;
}

static const char *const known_opts[] = {
  "pid", "cpu", "group", "cgroup", "cloexec", "flags", "name", "pages",
  "auto_exclude", NULL
};

/*
 * core.open(attr, opts) -> event | nil, msg, errno
 *   attr: table of attr fields (attr.c); opts: pid, cpu, group (event or
 *   fd), cgroup (path or fd), cloexec, flags (raw PERF_FLAG_* bits),
 *   name, pages (ring data pages; 0 = user page only; nil = default;
 *   false = map nothing),
 *   auto_exclude (retry with exclude_kernel/hv on EACCES).
 */
static int l_open(lua_State *L)
{
  struct pe_attr a;
  int pid, cpu, group_fd = -1, cg_fd = -1, own_cg = 0, fd, err, pages, retried = 0, nomap;
  unsigned long flags = 0;
  const char *name;
  char hint[512];
  pe_event *ev;
  int i;

  luaL_checktype(L, 1, LUA_TTABLE);
  if (lua_isnoneornil(L, 2)) { lua_settop(L, 1); lua_newtable(L); }
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_settop(L, 2);

  /* reject unknown options: a typo must not pass silently */
  lua_pushnil(L);
  while (lua_next(L, 2)) {
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
    int ok = 0;
    for (i = 0; k && known_opts[i]; i++) if (strcmp(k, known_opts[i]) == 0) ok = 1;
    if (!ok) luaL_error(L, "unknown option '%s'", k ? k : luaL_typename(L, -2));
    lua_pop(L, 1);
  }

  pe_attr_from_table(L, 1, &a, 0);
  pid = opt_int(L, 2, "pid", 0);
  cpu = opt_int(L, 2, "cpu", -1);
  if (opt_bool(L, 2, "cloexec", 1)) flags |= PE_FLAG_FD_CLOEXEC;
  {
    int raw = opt_int(L, 2, "flags", 0);
    if (raw < 0) luaL_error(L, "option 'flags': must be >= 0");
    flags |= (unsigned long)raw;
  }
  lua_getfield(L, 2, "pages");
  nomap = lua_type(L, -1) == LUA_TBOOLEAN && !lua_toboolean(L, -1);   /* pages=false */
  lua_pop(L, 1);
  pages = nomap ? -1 : opt_int(L, 2, "pages", -1);
  if (pages > 0 && (pages & (pages - 1)))
    luaL_error(L, "option 'pages': %d is not a power of two", pages);
  if (pages < -1) luaL_error(L, "option 'pages': must be >= 0");
  lua_getfield(L, 2, "name");
  name = lua_isstring(L, -1) ? lua_tostring(L, -1) : "event";
  lua_pop(L, 1);

  lua_getfield(L, 2, "group");                    /* stack 3: group or nil */
  if (!lua_isnil(L, 3)) {
    pe_event *g = (pe_event *)pe_testudata(L, 3, PE_EVENT_MT);
    if (g) {
      if (g->fd < 0) luaL_error(L, "option 'group': the leader event is closed");
      group_fd = g->fd;
    } else if (lua_type(L, 3) == LUA_TNUMBER) {
      group_fd = (int)lua_tointeger(L, 3);
    } else {
      luaL_error(L, "option 'group': expected a perf_event.event or an fd, got %s",
                 luaL_typename(L, 3));
    }
  }
  lua_getfield(L, 2, "cgroup");                   /* stack 4 */
  if (!lua_isnil(L, 4)) {
    if (lua_type(L, 4) == LUA_TNUMBER) {
      cg_fd = (int)lua_tointeger(L, 4);
    } else if (lua_type(L, 4) == LUA_TSTRING) {
      size_t plen;
      const char *path = lua_tolstring(L, 4, &plen);
      if (strlen(path) != plen) luaL_error(L, "option 'cgroup': the path contains a NUL byte");
      cg_fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (cg_fd < 0) {
        err = errno;
        return pe_push_syserror(L, "open(cgroup)", path, err,
                                "the cgroup must be a directory of a cgroup v2 filesystem");
      }
      own_cg = 1;
    } else {
      luaL_error(L, "option 'cgroup': expected a path or an fd, got %s", luaL_typename(L, 4));
    }
    flags |= PE_FLAG_PID_CGROUP;
    pid = cg_fd;
  }

again:
  fd = sys_perf_event_open(&a, pid, cpu, group_fd, flags);
  err = errno;
  if (fd < 0 && err == EACCES && !retried && opt_bool(L, 2, "auto_exclude", 0) &&
      !((a.flags >> PE_FLAG_exclude_kernel) & 1)) {
    /* what perf does: fall back to user-space only measurement */
    a.flags |= PE_FLAG_BIT(exclude_kernel) | PE_FLAG_BIT(exclude_hv);
    retried = 1;
    goto again;
  }
  if (own_cg) close(cg_fd);
  if (fd < 0) {
    if (retried) {   /* report the original attempt's cause */
      a.flags &= ~(PE_FLAG_BIT(exclude_kernel) | PE_FLAG_BIT(exclude_hv));
    }
    return pe_push_syserror(L, "perf_event_open", name,
                            err, pe_open_hint(hint, sizeof hint, err, &a,
                                              (flags & PE_FLAG_PID_CGROUP) ? 0 : pid, cpu, flags));
  }

  ev = (pe_event *)pe_newuserdata(L, sizeof *ev);  /* stack 5 */
  memset(ev, 0, sizeof *ev);
  ev->gen = pe_fork_gen;
  ev->fd = fd;
  ev->attr = a;
  ev->read_format = a.read_format;
  ev->sample_type = a.sample_type;
  ev->pid = pid;
  ev->cpu = cpu;
  if (retried) ev->flags |= PE_EV_AUTOEXCL;
  if (group_fd >= 0 && !(flags & PE_FLAG_FD_NO_GROUP)) ev->flags |= PE_EV_MEMBER;
  if (pid == 0 && cpu == -1 && !(flags & PE_FLAG_PID_CGROUP)) ev->flags |= PE_EV_SELFMON;
  ev->tid = pe_current_tid();
  luaL_getmetatable(L, PE_EVENT_MT);
  lua_setmetatable(L, -2);

  /* uservalue: name, the probe string config1 points at, the leader */
  lua_createtable(L, 0, 4);
  lua_pushstring(L, name);
  lua_setfield(L, -2, "name");
  lua_getfield(L, 1, "uprobe_path");
  lua_setfield(L, -2, "uprobe_path");
  lua_getfield(L, 1, "kprobe_func");
  lua_setfield(L, -2, "kprobe_func");
  if (!lua_isnil(L, 3)) { lua_pushvalue(L, 3); lua_setfield(L, -2, "leader"); }
  pe_setuservalue(L, 5);

  {
    uint64_t id = 0;
    if (ioctl(fd, PE_IOC_ID, &id) == 0) ev->id = id;
  }

  /* ring buffer for sampling events, user page for self-monitoring */
  if (pages < 0 && !nomap) {
    if (a.sample_period && !(flags & PE_FLAG_FD_OUTPUT)) pages = 8;
  }
  if (pages >= 0) {
    err = map_event(ev, (size_t)pages);
    if (err) {
      pe_event_close(ev);
      return pe_push_syserror(L, "mmap", name, err,
                              pe_mmap_hint(hint, sizeof hint, err, &a, cpu, (size_t)pages));
    }
  } else if ((ev->flags & PE_EV_SELFMON) && !a.sample_period && !nomap) {
    /* one user page for the self-monitoring read path; failure is not an
     * error (the read falls back to read(2)) */
    if (map_event(ev, 0) != 0) ev->page = NULL;
  }
  pe_fast_plain(ev);
  return 1;
}

/* ---- simple ioctls ----------------------------------------------------- */
/* true, or the error triple; EEXIST (a second filter or program) gets its
 * own hint when the ioctl can say so */
static int ioctl_result_ex(lua_State *L, int idx, const char *op, int rc, const char *hint,
                           const char *eexist_hint)
{
  if (rc < 0) {
    int err = errno;
    if (err == EEXIST && eexist_hint) hint = eexist_hint;
    return pe_push_syserror(L, op, ev_name(L, idx), err, hint);
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
  unsigned long arg = lua_toboolean(L, 2) ? PE_IOC_FLAG_GROUP : 0;
  return ioctl_result(L, 1, "enable", ioctl(ev->fd, PE_IOC_ENABLE, arg), NULL);
}

static int l_disable(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  unsigned long arg = lua_toboolean(L, 2) ? PE_IOC_FLAG_GROUP : 0;
  return ioctl_result(L, 1, "disable", ioctl(ev->fd, PE_IOC_DISABLE, arg), NULL);
}

static int l_reset(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  unsigned long arg = lua_toboolean(L, 2) ? PE_IOC_FLAG_GROUP : 0;
  return ioctl_result(L, 1, "reset", ioctl(ev->fd, PE_IOC_RESET, arg), NULL);
}

static int l_refresh(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  lua_Integer n = luaL_checkinteger(L, 2);
  if (n < 0 || n > 0x7fffffff) return luaL_argerror(L, 2, "must be 0..2^31-1");
  return ioctl_result(L, 1, "refresh", ioctl(ev->fd, PE_IOC_REFRESH, (unsigned long)n),
                      "refresh needs a sampling, non-inherited event");
}

static int l_period(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  uint64_t p = pe_check_u64(L, 2);
  int rc = ioctl(ev->fd, PE_IOC_PERIOD, &p);
  if (rc == 0) ev->attr.sample_period = p;
  return ioctl_result(L, 1, "period", rc,
                      "the period must be 1..2^63-1 and the event a sampling event");
}

static int l_set_output(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  pe_event *t = NULL;
  long target = -1;    /* must be a long: see CHECKLIST G7 */
  int rc;
  if (!lua_isnoneornil(L, 2)) {
    t = (pe_event *)pe_testudata(L, 2, PE_EVENT_MT);
    if (t) {
      if (t->gen != pe_fork_gen) pe_event_after_fork(t);
      if (t->fd < 0) return luaL_argerror(L, 2, "the target event is closed");
      target = t->fd;
    } else if (lua_type(L, 2) == LUA_TNUMBER) {
      target = (long)lua_tointeger(L, 2);
    } else {
      return luaL_argerror(L, 2, "expected a perf_event.event, an fd or nil");
    }
  }
  rc = ioctl(ev->fd, PE_IOC_SET_OUTPUT, target);
  /* the target's ring learns this event's layout (or forgets it): E6 */
  if (rc == 0) pe_ring_join(ev, t, ev_name(L, 1));
  return ioctl_result(L, 1, "set_output", rc,
                      "the target must be a perf fd on the same cpu/task with the same "
                      "clock, and this event must not have its own ring mapped");
}

static int l_set_filter(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
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
  lua_Integer pfd = luaL_checkinteger(L, 2);
  return ioctl_result_ex(L, 1, "set_bpf",
                         ioctl(ev->fd, PE_IOC_SET_BPF, (unsigned long)(uint32_t)pfd),
                         "pass a loaded BPF program fd of a type matching the event "
                         "(TRACEPOINT, KPROBE or PERF_EVENT)",
                         "a BPF program is already attached to this event");
}

static int l_pause_output(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  unsigned long on = lua_isnoneornil(L, 2) ? 1 : (unsigned long)lua_toboolean(L, 2);
  return ioctl_result(L, 1, "pause_output", ioctl(ev->fd, PE_IOC_PAUSE_OUTPUT, on),
                      "pause_output needs a mapped ring buffer");
}

static int l_modify(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
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
    return pe_push_syserror(L, "query_bpf", ev_name(L, 1), err,
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

/* ---- reading ----------------------------------------------------------- */
/* read(2) into buf; handles EINTR and the 0-byte "error state" (C9) */
static long read_fd(int fd, void *buf, size_t len)
{
  ssize_t n;
  do n = read(fd, buf, len); while (n < 0 && errno == EINTR);
  return (long)n;
}

static int push_read_error(lua_State *L, int idx, long n, int err)
{
  if (n == 0) {
    lua_pushnil(L);
    lua_pushfstring(L, "read(%s): event is in error state (a pinned event could not be "
                    "scheduled); re-enable it", ev_name(L, idx));
    lua_pushinteger(L, 0);
    return 3;
  }
  return pe_push_syserror(L, "read", ev_name(L, idx), err,
                          err == ENOSPC ? "read buffer too small for read_format" : NULL);
}

/* ev:read() -> value (scaled), time_enabled, time_running */
static int l_read(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  uint64_t buf[5 + 3 * GROUP_MAX];
  pe_readval vals[GROUP_MAX];
  pe_reading r;
  uint64_t value;
  long n;
  r.v = vals;
  r.cap = GROUP_MAX;
  if (pe_userpage_try_read(ev, buf) == 0) {    /* seqlock + rdpmc (userpage.c) */
    value = buf[0];
    r.time_enabled = buf[1];
    r.time_running = buf[2];
    goto push;
  }
  n = read_fd(ev->fd, buf, sizeof buf);
  if (n <= 0) return push_read_error(L, 1, n, errno);
  if (pe_readfmt_decode((unsigned char *)buf, (size_t)n, ev->read_format, &r) < 0 || r.nr == 0)
    return luaL_error(L, "read(%s): short read of %d bytes", ev_name(L, 1), (int)n);
  value = r.v[0].value;
  if ((ev->read_format & PE_FORMAT_GROUP) && (ev->read_format & PE_FORMAT_ID)) {
    uint64_t i;
    for (i = 0; i < r.nr; i++)
      if (r.v[i].id == ev->id) { value = r.v[i].value; break; }
  }
push:
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
  n = read_fd(ev->fd, buf, sizeof buf);
  if (n <= 0) return push_read_error(L, 1, n, errno);
  if (pe_readfmt_decode((unsigned char *)buf, (size_t)n, ev->read_format, &r) < 0)
    return luaL_error(L, "read(%s): short read of %d bytes", ev_name(L, 1), (int)n);
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
      return pe_push_syserror(L, "id", ev_name(L, 1), errno, NULL);
    ev->id = id;
  }
  pe_push_u64(L, ev->id);
  return 1;
}

static int l_name(lua_State *L)
{
  pe_to_event(L, 1);
  lua_pushstring(L, ev_name(L, 1));
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
  lua_createtable(L, 0, 12);
  lua_pushstring(L, ev_name(L, 1)); lua_setfield(L, -2, "name");
  lua_pushboolean(L, ev->fd < 0); lua_setfield(L, -2, "closed");
  lua_pushinteger(L, ev->fd); lua_setfield(L, -2, "fd");
  pe_push_u64(L, ev->id); lua_setfield(L, -2, "id");
  lua_pushinteger(L, ev->pid); lua_setfield(L, -2, "pid");
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
    lua_pushfstring(L, "perf_event.event(%s, closed)", ev_name(L, 1));
  else
    lua_pushfstring(L, "perf_event.event(%s, fd %d)", ev_name(L, 1), ev->fd);
  return 1;
}

/* ---- groups ------------------------------------------------------------ */
static pe_group *check_group(lua_State *L, int idx, int open)
{
  pe_group *g = (pe_group *)luaL_checkudata(L, idx, PE_GROUP_MT);
  if (open && (g->n < 0 || g->ev[0]->fd < 0))
    luaL_error(L, "attempt to use a closed perf_event.group");
  return g;
}

/* core.make_group({ev1, ev2, ...}) -> group (leader first) */
static int l_make_group(lua_State *L)
{
  int n, i;
  pe_group *g;
  luaL_checktype(L, 1, LUA_TTABLE);
  n = (int)pe_rawlen(L, 1);
  if (n < 1 || n > GROUP_MAX) return luaL_argerror(L, 1, "1..256 events");
  g = (pe_group *)pe_newuserdata(L, sizeof *g);
  memset(g, 0, sizeof *g);
  for (i = 0; i < n; i++) {
    lua_rawgeti(L, 1, i + 1);
    g->ev[i] = pe_check_event(L, -1);
    lua_pop(L, 1);
  }
  if (!(g->ev[0]->read_format & PE_FORMAT_GROUP))
    return luaL_argerror(L, 1, "the leader must read with PERF_FORMAT_GROUP");
  g->n = n;
  g->read_format = g->ev[0]->read_format;
  luaL_getmetatable(L, PE_GROUP_MT);
  lua_setmetatable(L, -2);
  /* the members live as long as the group: keep them in its uservalue */
  lua_createtable(L, n, 0);
  for (i = 0; i < n; i++) {
    lua_rawgeti(L, 1, i + 1);
    lua_rawseti(L, -2, i + 1);
  }
  pe_setuservalue(L, -2);
  return 1;
}

/*
 * ENABLE, DISABLE or RESET on the whole group.  Enabling goes member by
 * member, leader last: on 6.18, ENABLE with PERF_IOC_FLAG_GROUP on the
 * leader after a group DISABLE schedules the leader alone and its siblings
 * stay off (they count nothing: spec/core_spec.lua, "re-enabled group").
 * Members enabled while the leader is off wait for it, so the group still
 * starts as one.  -> 0, or -1 with errno.
 */
int pe_group_ioctl(pe_group *g, unsigned long req)
{
  int i;
  if (req != PE_IOC_ENABLE) return ioctl(g->ev[0]->fd, req, PE_IOC_FLAG_GROUP) < 0 ? -1 : 0;
  for (i = 1; i < g->n; i++)
    if (g->ev[i]->fd >= 0 && ioctl(g->ev[i]->fd, PE_IOC_ENABLE, 0) < 0) return -1;
  return ioctl(g->ev[0]->fd, PE_IOC_ENABLE, 0) < 0 ? -1 : 0;
}

static int g_ioctl(lua_State *L, const char *op, unsigned long req)
{
  pe_group *g = check_group(L, 1, 1);
  if (pe_group_ioctl(g, req) < 0) {
    int err = errno;
    pe_getuservalue(L, 1);
    lua_rawgeti(L, -1, 1);
    return pe_push_syserror(L, op, ev_name(L, lua_gettop(L)), err, NULL);
  }
  lua_pushboolean(L, 1);
  return 1;
}

static int g_enable(lua_State *L) { return g_ioctl(L, "enable", PE_IOC_ENABLE); }
static int g_disable(lua_State *L) { return g_ioctl(L, "disable", PE_IOC_DISABLE); }
static int g_reset(lua_State *L) { return g_ioctl(L, "reset", PE_IOC_RESET); }

/* group:read([t]) -> t with t[i], t[name], t.time_enabled, t.time_running */
static int g_read(lua_State *L)
{
  pe_group *g = check_group(L, 1, 1);
  uint64_t buf[3 + 3 * GROUP_MAX];
  pe_readval vals[GROUP_MAX];
  pe_reading r;
  long n;
  int i, names;
  r.v = vals;
  r.cap = GROUP_MAX;
  n = read_fd(g->ev[0]->fd, buf, sizeof buf);
  if (n <= 0) {
    int err = errno;
    pe_getuservalue(L, 1);
    lua_rawgeti(L, -1, 1);
    return push_read_error(L, lua_gettop(L), n, err);
  }
  if (pe_readfmt_decode((unsigned char *)buf, (size_t)n, g->read_format, &r) < 0)
    return luaL_error(L, "group read: short read of %d bytes", (int)n);
  if (lua_istable(L, 2)) lua_settop(L, 2);
  else { lua_settop(L, 1); lua_createtable(L, g->n, g->n + 2); }
  pe_getuservalue(L, 1);                  /* 3: members */
  names = lua_gettop(L);
  for (i = 0; i < g->n; i++) {
    uint64_t v = 0;
    int found = 0;
    uint64_t k;
    if (g->read_format & PE_FORMAT_ID) {
      for (k = 0; k < r.nr; k++)
        if (r.v[(k + (uint64_t)i) % r.nr].id == g->ev[i]->id) {
          v = r.v[(k + (uint64_t)i) % r.nr].value; found = 1; break;
        }
    } else if ((uint64_t)i < r.nr) {
      v = r.v[i].value; found = 1;
    }
    if (found) pe_push_u64(L, pe_scale(v, r.time_enabled, r.time_running));
    else lua_pushnil(L);                 /* member gone (closed) */
    lua_pushvalue(L, -1);
    lua_rawseti(L, 2, i + 1);
    lua_rawgeti(L, names, i + 1);
    lua_pushstring(L, ev_name(L, lua_gettop(L)));
    lua_replace(L, -2);
    lua_insert(L, -2);
    lua_rawset(L, 2);
  }
  lua_settop(L, 2);
  pe_push_u64(L, r.time_enabled);
  lua_setfield(L, 2, "time_enabled");
  pe_push_u64(L, r.time_running);
  lua_setfield(L, 2, "time_running");
  return 1;
}

static int g_close(lua_State *L)
{
  pe_group *g = check_group(L, 1, 0);
  int i;
  if (g->n < 0) return 0;
  for (i = g->n - 1; i >= 0; i--) pe_event_close(g->ev[i]);
  g->n = -1;
  return 0;
}

static int g_len(lua_State *L)
{
  pe_group *g = check_group(L, 1, 0);
  lua_pushinteger(L, g->n < 0 ? 0 : g->n);
  return 1;
}

/* group:members() -> array of the member events (leader first) */
static int g_members(lua_State *L)
{
  pe_group *g = check_group(L, 1, 0);
  int i;
  pe_getuservalue(L, 1);
  lua_createtable(L, g->n > 0 ? g->n : 0, 0);
  for (i = 0; i < g->n; i++) {
    lua_rawgeti(L, -2, i + 1);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

static int g_tostring(lua_State *L)
{
  pe_group *g = check_group(L, 1, 0);
  luaL_Buffer b;
  int i;
  if (g->n < 0) { lua_pushliteral(L, "perf_event.group(closed)"); return 1; }
  pe_getuservalue(L, 1);
  luaL_buffinit(L, &b);
  luaL_addstring(&b, "perf_event.group({");
  for (i = 0; i < g->n; i++) {
    lua_rawgeti(L, 2, i + 1);
    lua_pushstring(L, ev_name(L, lua_gettop(L)));
    lua_remove(L, -2);
    if (i) luaL_addstring(&b, ",");  /* the buffer may sit on the stack: */
    luaL_addvalue(&b);               /* add the name after the comma */
  }
  lua_pushfstring(L, "}, leader fd %d)", g->ev[0]->fd);
  luaL_addvalue(&b);
  luaL_pushresult(&b);
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

static const luaL_Reg group_methods[] = {
  {"enable", g_enable}, {"disable", g_disable}, {"reset", g_reset},
  {"read", g_read}, {"close", g_close}, {"members", g_members}, {NULL, NULL}
};

static const luaL_Reg funcs[] = {
  {"open", l_open}, {"make_group", l_make_group},
  {"enable_all", l_enable_all}, {"disable_all", l_disable_all}, {NULL, NULL}
};

int pe_open_events(lua_State *L)
{
  static int atfork_done = 0;
  if (!atfork_done) {    /* glibc unregisters it if the module is dlclose'd */
    pthread_atfork(NULL, NULL, atfork_child);
    atfork_done = 1;
  }
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

  luaL_newmetatable(L, PE_GROUP_MT);
  lua_newtable(L);
  pe_setfuncs(L, group_methods);
  pe_set_private(L, mod, "group_methods");      /* the table on top, kept */
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, g_close); lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, g_close); lua_setfield(L, -2, "__close");
  lua_pushcfunction(L, g_tostring); lua_setfield(L, -2, "__tostring");
  lua_pushcfunction(L, g_len); lua_setfield(L, -2, "__len");
  lua_pushliteral(L, PE_GROUP_MT); lua_setfield(L, -2, "__name");
  lua_setfield(L, -2, "group_mt");

  pe_setfuncs(L, funcs);
  return 0;
}
