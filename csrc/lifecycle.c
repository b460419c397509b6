/*
 * lifecycle.c - the perf_event.event object from perf_event_open to close.
 *
 * Owns: core.open (attr encoding -> syscall -> userdata, with perf's
 * fallback to exclude_kernel/hv on EACCES when the caller allows it, and
 * the user-page / ring mapping), the idempotent close shared by close(),
 * __gc and __close (unmapping the page, the ring and the AUX area, freeing
 * the ring state, leaving shared-ring tables), the fork generation that
 * makes a forked child forget mappings it does not have, the event
 * accessors every method uses (pe_to_event, pe_check_event,
 * pe_event_name), the opener's pid that pe_event_inherited compares with
 * getpid() (a forked child only closes its copy: the control methods
 * refuse there), and the helpers the read paths share (pe_read_fd,
 * pe_push_read_error, pe_fast_plain).  Calls layouts.c and the leaves
 * (attr.c, errors.c, u64.c); nothing above it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "pe_core.h"

#define RF_TIMES (PE_FORMAT_TOTAL_TIME_ENABLED | PE_FORMAT_TOTAL_TIME_RUNNING)

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


long pe_page_size(void)
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

/*
 * ev:read() in its commonest shape costs one read(2) and a comparison: the
 * FFI route (fast.lua) does those in the trace itself when plain_fd1 says
 * so.  That holds for the read_format pe.open asks for when no rdpmc can
 * be used: no user page, or one whose cap_user_rdpmc was off when it was
 * mapped (software, tracepoint, breakpoint events; every event where
 * there is no hardware PMU).
 * A kernel that turns rdpmc on later is not noticed: read(2) stays right.
 */
/* recomputes ev->plain_fd1 after the fd, the mapping or the format changed */
static void pe_fast_plain(pe_event *ev)
{
  int plain = ev->fd >= 0 && ev->read_format == RF_TIMES &&
              (!ev->page || !(ev->page->capabilities & PE_CAP_USER_RDPMC));
  ev->plain_fd1 = plain ? ev->fd + 1 : 0;
}

/* ---- fork --------------------------------------------------------------- */
unsigned pe_fork_gen = 1;

static void atfork_child(void)
{
  pe_fork_gen++;
}

/* registers the fork handler once per copy of this code (core.so; the
 * test-only pesim.so links its own copy and calls it too, so both
 * generations advance together) */
void pe_lifecycle_init(void)
{
  static int atfork_done = 0;
  if (!atfork_done) {    /* glibc unregisters it if the module is dlclose'd */
    pthread_atfork(NULL, NULL, atfork_child);
    atfork_done = 1;
  }
}

void pe_event_after_fork(pe_event *ev)
{
  /* the child has the fd but not the mapping: drop the pointers, never
   * munmap (the range may hold another mapping by now) */
  if (ev->page && ev->data_pages) ev->flags |= PE_EV_FORKED;
  ev->page = NULL;
  ev->map_len = 0;
  ev->data_pages = 0;
  free(ev->scratch);     /* heap, copied: the ring state */
  ev->scratch = NULL;
  ev->scratch_len = 0;
  ev->aux = NULL;        /* not mapped in the child either */
  ev->aux_len = 0;
  ev->flags &= ~PE_EV_SELFMON;    /* pid 0 meant the parent */
  if (ev->opener != (int)getpid()) ev->flags |= PE_EV_INHERITED;   /* the FFI routes test it */
  ev->gen = pe_fork_gen;
  pe_fast_plain(ev);
}

int pe_event_inherited(pe_event *ev)
{
  if (ev->opener == (int)getpid()) return 0;
  ev->flags |= PE_EV_INHERITED;
  return 1;
}

int pe_push_inherited(lua_State *L, int idx, const pe_event *ev, const char *op)
{
  char hint[160];
  snprintf(hint, sizeof hint, "event opened by pid %d: a forked child cannot control it; "
           "it may read it or close its copy, or open its own event", ev->opener);
  return pe_push_syserror(L, op, pe_event_name(L, idx), EPERM, hint);
}

/* ---- accessors --------------------------------------------------------- */
pe_event *pe_test_event(lua_State *L, int idx)
{
  pe_event *ev = (pe_event *)pe_testudata(L, idx, PE_EVENT_MT);
  if (ev && ev->gen != pe_fork_gen) pe_event_after_fork(ev);
  return ev;
}

const char *pe_event_name(lua_State *L, int idx)
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
  if (ev->aux) {
    munmap(ev->aux, ev->aux_len);
    ev->aux = NULL;
    ev->aux_len = 0;
  }
  pe_layouts_release(ev);                /* its layout leaves a shared ring */
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
  size_t len = (size_t)pe_page_size() * (1 + data_pages);
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
/* opts[k] as an int in lo..hi (never truncated), dflt when absent */
static int opt_int(lua_State *L, int opts, const char *k, int dflt, int lo, int hi)
{
  int v = dflt;
  lua_getfield(L, opts, k);
  if (!lua_isnil(L, -1)) {
    char what[32];
    snprintf(what, sizeof what, "option '%s'", k);
    v = pe_check_int(L, -1, what, lo, hi);
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
int pe_l_open(lua_State *L)
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
  pid = opt_int(L, 2, "pid", 0, INT_MIN, INT_MAX);
  cpu = opt_int(L, 2, "cpu", -1, INT_MIN, INT_MAX);
  if (opt_bool(L, 2, "cloexec", 1)) flags |= PE_FLAG_FD_CLOEXEC;
  {
    int raw = opt_int(L, 2, "flags", 0, INT_MIN, INT_MAX);
    if (raw < 0) luaL_error(L, "option 'flags': must be >= 0");
    flags |= (unsigned long)raw;
  }
  lua_getfield(L, 2, "pages");
  nomap = lua_type(L, -1) == LUA_TBOOLEAN && !lua_toboolean(L, -1);   /* pages=false */
  lua_pop(L, 1);
  pages = nomap ? -1 : opt_int(L, 2, "pages", -1, INT_MIN, INT_MAX);
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
      group_fd = pe_check_int(L, 3, "option 'group'", -1, INT_MAX);
    } else {
      luaL_error(L, "option 'group': expected a perf_event.event or an fd, got %s",
                 luaL_typename(L, 3));
    }
  }
  lua_getfield(L, 2, "cgroup");                   /* stack 4 */
  if (!lua_isnil(L, 4)) {
    if (lua_type(L, 4) == LUA_TNUMBER) {
      cg_fd = pe_check_int(L, 4, "option 'cgroup'", 0, INT_MAX);
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
  ev->opener = (int)getpid();
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


/* The error rule (doc/errors.md): a read that fails is nil, msg, errno
 * with a real errno.  read(2) returning 0 is the kernel's error state of a
 * pinned event (C9): ENODATA; fewer bytes than the read_format needs: EIO;
 * a failed read(2): its errno. */
int pe_push_read_error(lua_State *L, int idx, long n, int err)
{
  char hint[128];
  if (n == 0)
    return pe_push_syserror(L, "read", pe_event_name(L, idx), ENODATA,
                            "read(2) returned 0 bytes: the event is in error state (a "
                            "pinned event could not be scheduled); re-enable it");
  if (n > 0) {
    snprintf(hint, sizeof hint, "read(2) returned %ld bytes, fewer than the read_format "
             "needs", n);
    return pe_push_syserror(L, "read", pe_event_name(L, idx), EIO, hint);
  }
  return pe_push_syserror(L, "read", pe_event_name(L, idx), err,
                          err == ENOSPC ? "read buffer too small for read_format" : NULL);
}

