/*
 * spawn.c - child processes for `luaperf stat|record -- CMD` and pe.stat's
 * command form: fork a child that waits on a pipe until the parent has
 * opened its counters on the child's pid (enable_on_exec, inherit), then
 * execvp.  Also waiting with a timeout (pidfd + poll) and catching SIGINT /
 * SIGTERM through a signalfd so the command line tool can print its counts
 * when interrupted, as perf does.
 *
 *   core.spawn(argv [, {stopped=bool}]) -> child | nil, msg, errno
 *   child:pid()
 *   child:start()            -> true | nil, msg, errno (the exec failed)
 *   child:wait([timeout_ms]) -> "exited", code, rusage | "signaled", signo, rusage
 *                             | false (timeout) | "signal", signo (caught)
 *   child:kill([signo])      -> true | nil, msg, errno
 *   core.catch_signals()     -> true   (SIGINT/SIGTERM go to a signalfd)
 *   core.wait_pid(pid [, timeout_ms]) -> "exited" | false | "signal", signo
 *                             | nil, msg, errno
 *   core.now()               -> CLOCK_MONOTONIC in seconds (a number)
 *   core._private.cloexec(file) -> true (FD_CLOEXEC on a Lua file's fd)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <lualib.h>
#include "pe_core.h"

#define PE_CHILD_MT "perf_event.child"
#define MAX_ARGS 4096

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

typedef struct pe_child {
  pid_t pid;         /* 0 once reaped */
  int gate;          /* write end the child waits on, -1 once released */
  int errpipe;       /* read end: the child's exec errno, -1 once read */
  int status;        /* wait status once reaped */
  char name[64];     /* argv[0], for messages */
  struct rusage ru;
} pe_child;

static int sig_fd = -1;   /* signalfd of catch_signals(), process-wide */

static void close_fd(int *fd)
{
  if (*fd >= 0) { close(*fd); *fd = -1; }
}

/* runs in the child between fork and exec: only async-signal-safe calls */
static void child_main(char **argv, int gate_rd, int err_wr, int stopped)
{
  sigset_t none;
  int e;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);   /* catch_signals() blocked some */
  signal(SIGPIPE, SIG_DFL);                /* hosts such as nginx ignore it */
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  if (stopped) {
    char c;
    ssize_t n;
    do n = read(gate_rd, &c, 1); while (n < 0 && errno == EINTR);
    if (n != 1) _exit(127);                /* the parent gave up */
  }
  close(gate_rd);
  execvp(argv[0], argv);
  e = errno;
  while (write(err_wr, &e, sizeof e) < 0 && errno == EINTR) {}
  _exit(127);
}

/* reads the exec result: 0 when exec succeeded (EOF), else the errno */
static int exec_result(pe_child *c)
{
  int e = 0;
  ssize_t n;
  if (c->errpipe < 0) return 0;
  do n = read(c->errpipe, &e, sizeof e); while (n < 0 && errno == EINTR);
  close_fd(&c->errpipe);
  return n == (ssize_t)sizeof e ? e : 0;
}

static int reap(pe_child *c, int nohang)
{
  int st;
  pid_t r;
  if (c->pid <= 0) return 1;
  do r = wait4(c->pid, &st, nohang ? WNOHANG : 0, &c->ru); while (r < 0 && errno == EINTR);
  if (r == c->pid) { c->status = st; c->pid = 0; return 1; }
  return r < 0 ? -1 : 0;
}

static pe_child *check_child(lua_State *L)
{
  return (pe_child *)luaL_checkudata(L, 1, PE_CHILD_MT);
}

static int l_spawn(lua_State *L)
{
  int n, i, stopped = 0, gate[2], errp[2], err;
  char **argv;
  pe_child *c;
  pid_t pid;

  luaL_checktype(L, 1, LUA_TTABLE);
  n = (int)pe_rawlen(L, 1);
  if (n < 1) return luaL_argerror(L, 1, "argv must name a command");
  if (n > MAX_ARGS) return luaL_argerror(L, 1, "too many arguments");
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_getfield(L, 2, "stopped");
    stopped = lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  lua_settop(L, 2);
  /* the strings stay anchored in table 1 until exec */
  argv = (char **)lua_newuserdata(L, sizeof(char *) * (size_t)(n + 1));
  for (i = 0; i < n; i++) {
    lua_rawgeti(L, 1, i + 1);
    if (lua_type(L, -1) != LUA_TSTRING)
      return luaL_argerror(L, 1, "argv entries must be strings");
    argv[i] = (char *)lua_tostring(L, -1);
    lua_pop(L, 1);
  }
  argv[n] = NULL;

  c = (pe_child *)pe_newuserdata(L, sizeof *c);
  memset(c, 0, sizeof *c);
  c->gate = c->errpipe = -1;
  luaL_getmetatable(L, PE_CHILD_MT);
  lua_setmetatable(L, -2);

  if (pipe2(gate, O_CLOEXEC) < 0)
    return pe_push_syserror(L, "pipe", argv[0], errno, NULL);
  if (pipe2(errp, O_CLOEXEC) < 0) {
    err = errno;
    close(gate[0]); close(gate[1]);
    return pe_push_syserror(L, "pipe", argv[0], err, NULL);
  }
  fflush(NULL);
  pid = fork();
  if (pid < 0) {
    err = errno;
    close(gate[0]); close(gate[1]); close(errp[0]); close(errp[1]);
    return pe_push_syserror(L, "fork", argv[0], err, NULL);
  }
  if (pid == 0) {
    close(gate[1]);
    close(errp[0]);
    child_main(argv, gate[0], errp[1], stopped);
  }
  close(gate[0]);
  close(errp[1]);
  snprintf(c->name, sizeof c->name, "%s", argv[0]);
  c->pid = pid;
  c->gate = gate[1];
  c->errpipe = errp[0];
  if (!stopped) {
    close_fd(&c->gate);
    err = exec_result(c);
    if (err) {
      reap(c, 0);
      return pe_push_syserror(L, "exec", argv[0], err,
                              err == ENOENT ? "no such command in PATH" : NULL);
    }
  }
  return 1;
}

static int l_child_pid(lua_State *L)
{
  pe_child *c = check_child(L);
  lua_pushinteger(L, c->pid);
  return 1;
}

/* one byte to the gate; a child that is already gone gives EPIPE, never a
 * SIGPIPE that would kill the host (SIGPIPE blocked, consumed, restored) */
static void gate_write(int fd)
{
  sigset_t set, old, pend;
  struct timespec zero = {0, 0};
  int was_pending;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, &old);
  sigpending(&pend);
  was_pending = sigismember(&pend, SIGPIPE);
  while (write(fd, "g", 1) < 0 && errno == EINTR) {}
  if (!was_pending) while (sigtimedwait(&set, NULL, &zero) < 0 && errno == EINTR) {}
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static int l_child_start(lua_State *L)
{
  pe_child *c = check_child(L);
  int err;
  if (c->gate < 0) return luaL_error(L, "child:start(): the child was already started");
  gate_write(c->gate);
  close_fd(&c->gate);
  err = exec_result(c);
  if (err) {
    reap(c, 0);
    return pe_push_syserror(L, "exec", c->name, err,
                            err == ENOENT ? "no such command in PATH" : NULL);
  }
  lua_pushboolean(L, 1);
  return 1;
}

static void push_rusage(lua_State *L, const struct rusage *ru)
{
  lua_createtable(L, 0, 4);
  lua_pushnumber(L, (lua_Number)ru->ru_utime.tv_sec + ru->ru_utime.tv_usec / 1e6);
  lua_setfield(L, -2, "utime");
  lua_pushnumber(L, (lua_Number)ru->ru_stime.tv_sec + ru->ru_stime.tv_usec / 1e6);
  lua_setfield(L, -2, "stime");
  lua_pushinteger(L, (lua_Integer)ru->ru_maxrss);
  lua_setfield(L, -2, "maxrss_kb");
}

static int push_status(lua_State *L, pe_child *c)
{
  if (WIFEXITED(c->status)) {
    lua_pushliteral(L, "exited");
    lua_pushinteger(L, WEXITSTATUS(c->status));
  } else {
    lua_pushliteral(L, "signaled");
    lua_pushinteger(L, WTERMSIG(c->status));
  }
  push_rusage(L, &c->ru);
  return 3;
}

/* waits until fd is readable or a caught signal arrives; returns 1 ready,
 * 0 timeout, 2 interrupted (EINTR: the caller recomputes what is left of
 * its timeout, a retry here would start it over), -signo for a signal,
 * -1000 on error */
static int wait_ready(int fd, int timeout_ms)
{
  struct pollfd p[2];
  int n = 0, r;
  if (fd >= 0) { p[n].fd = fd; p[n].events = POLLIN; p[n].revents = 0; n++; }
  if (sig_fd >= 0) { p[n].fd = sig_fd; p[n].events = POLLIN; p[n].revents = 0; n++; }
  r = poll(p, (nfds_t)n, timeout_ms);
  if (r < 0 && errno == EINTR) return 2;
  if (r < 0) return -1000;
  if (r == 0) return 0;
  if (sig_fd >= 0 && (p[n - 1].revents & POLLIN)) {
    struct signalfd_siginfo si;
    if (read(sig_fd, &si, sizeof si) == (ssize_t)sizeof si) return -(int)si.ssi_signo;
  }
  return 1;
}

static long long now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* a deadline timeout_ms from now, in ns (-1: none). Kept in ns, not ms: a
 * deadline from a clock truncated to the ms came up to 1 ms early (a 5 ms
 * `luaperf stat -I 5` step of 4.27 ms) */
static long long deadline_of(int timeout_ms)
{
  return timeout_ms >= 0 ? now_ns() + (long long)timeout_ms * 1000000 : -1;
}

/* the ms left to a deadline, rounded up (-1: no deadline; <= 0: passed) */
static int ms_left(long long deadline)
{
  long long ns;
  if (deadline < 0) return -1;
  ns = deadline - now_ns();
  if (ns <= 0) return 0;
  return ns / 1000000 >= INT_MAX ? INT_MAX : (int)((ns + 999999) / 1000000);
}

/* an optional timeout in ms at idx: nil or negative -1 (no timeout);
 * beyond INT_MAX clamped (never wrapped into a short one) */
static int opt_timeout(lua_State *L, int idx)
{
  lua_Number t;
  if (lua_isnoneornil(L, idx)) return -1;
  t = luaL_checknumber(L, idx);
  if (t != t) return luaL_argerror(L, idx, "timeout is NaN");
  if (t < 0) return -1;
  return t > (lua_Number)INT_MAX ? INT_MAX : (int)t;
}

/* child:wait([timeout_ms]): no timeout (or negative) waits for the end */
static int l_child_wait(lua_State *L)
{
  pe_child *c = check_child(L);
  int timeout = opt_timeout(L, 2);
  int pfd, r;
  long long deadline = deadline_of(timeout);
  if (c->pid == 0) return push_status(L, c);
  if (c->gate >= 0) return luaL_error(L, "child:wait(): call child:start() first");
  pfd = (int)syscall(SYS_pidfd_open, c->pid, 0);
  for (;;) {
    int left, step;
    r = reap(c, 1);
    if (r == 1) break;
    if (r < 0) { int e = errno; if (pfd >= 0) close(pfd); return pe_push_syserror(L, "wait4", "child", e, NULL); }
    left = ms_left(deadline);
    if (deadline >= 0 && left <= 0) { if (pfd >= 0) close(pfd); lua_pushboolean(L, 0); return 1; }
    /* without pidfd (kernel < 5.3) poll the signalfd in 10 ms steps */
    step = pfd >= 0 ? left : (left < 0 || left > 10 ? 10 : left);
    r = wait_ready(pfd, step);
    if (r < 0 && r != -1000) {
      if (pfd >= 0) close(pfd);
      lua_pushliteral(L, "signal");
      lua_pushinteger(L, -r);
      return 2;
    }
  }
  if (pfd >= 0) close(pfd);
  return push_status(L, c);
}

static int l_child_kill(lua_State *L)
{
  pe_child *c = check_child(L);
  int sig = lua_isnoneornil(L, 2) ? SIGTERM : pe_check_int(L, 2, "kill: signal", 0, INT_MAX);
  if (c->pid <= 0) return pe_push_syserror(L, "kill", "child", ESRCH, "the child has exited");
  if (kill(c->pid, sig) < 0) return pe_push_syserror(L, "kill", "child", errno, NULL);
  lua_pushboolean(L, 1);
  return 1;
}

/* __gc: a child never started is told to give up (EOF on its gate) and
 * reaped; a running child is left alone (not killed, not waited for) */
static int l_child_gc(lua_State *L)
{
  pe_child *c = (pe_child *)luaL_checkudata(L, 1, PE_CHILD_MT);
  if (c->gate >= 0) {
    close_fd(&c->gate);
    reap(c, 0);
  }
  close_fd(&c->errpipe);
  return 0;
}

static int l_child_tostring(lua_State *L)
{
  pe_child *c = check_child(L);
  if (c->pid > 0) lua_pushfstring(L, "perf_event.child(pid %d)", (int)c->pid);
  else lua_pushliteral(L, "perf_event.child(reaped)");
  return 1;
}

static int l_catch_signals(lua_State *L)
{
  sigset_t set;
  if (sig_fd < 0) {
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
      return pe_push_syserror(L, "sigprocmask", "SIGINT", errno, NULL);
    sig_fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sig_fd < 0) return pe_push_syserror(L, "signalfd", "SIGINT", errno, NULL);
    /* an ignored signal is dropped, blocked or not: a shell starts a
     * background job with SIGINT ignored; perf installs its handlers over
     * that, and so the signalfd sees them here (blocked: never delivered) */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* core.wait_pid(pid [, timeout_ms]): waits for any process to exit */
static int l_wait_pid(lua_State *L)
{
  pid_t pid = (pid_t)pe_check_int(L, 1, "wait_pid: pid", INT_MIN, INT_MAX);
  int timeout = opt_timeout(L, 2);
  long long deadline = deadline_of(timeout);
  int pfd, r;
  if (pid <= 0) return luaL_argerror(L, 1, "expected a pid > 0");
  pfd = (int)syscall(SYS_pidfd_open, pid, 0);
  if (pfd < 0 && errno == ESRCH) return pe_push_syserror(L, "wait_pid", "pid", ESRCH, "no such process");
  for (;;) {
    int left = ms_left(deadline);
    int step;
    if (pfd < 0 && kill(pid, 0) < 0 && errno == ESRCH) { r = 1; break; }
    if (deadline >= 0 && left <= 0) { r = 0; break; }
    step = pfd >= 0 ? left : (left < 0 || left > 10 ? 10 : left);
    r = wait_ready(pfd, step);
    if (r < 0 || (r == 1 && pfd >= 0)) break;   /* signal, error, or exited */
  }
  if (pfd >= 0) close(pfd);
  if (r == 1) { lua_pushliteral(L, "exited"); return 1; }
  if (r == 0) { lua_pushboolean(L, 0); return 1; }
  if (r == -1000) return pe_push_syserror(L, "poll", "pid", errno, NULL);
  lua_pushliteral(L, "signal");
  lua_pushinteger(L, -r);
  return 2;
}

/* _private.cloexec(file) -> true: the fd under a Lua file handle gets
 * FD_CLOEXEC, so a command luaperf starts does not inherit it (io.open
 * cannot ask for O_CLOEXEC on every Lua).  A file handle's userdata starts
 * with its FILE * in Lua 5.1, 5.4 (luaL_Stream) and LuaJIT (IOFileUD). */
static int l_cloexec(lua_State *L)
{
  FILE *f;
  int fd, fl;
#if LUA_VERSION_NUM >= 502
  luaL_Stream *p = (luaL_Stream *)luaL_checkudata(L, 1, LUA_FILEHANDLE);
  f = p->closef ? p->f : NULL;        /* a closed stream keeps a stale f */
#else
  f = *(FILE **)luaL_checkudata(L, 1, LUA_FILEHANDLE);   /* NULL once closed */
#endif
  if (!f) return luaL_argerror(L, 1, "the file is closed");
  fd = fileno(f);
  fl = fcntl(fd, F_GETFD);
  if (fl < 0 || fcntl(fd, F_SETFD, fl | FD_CLOEXEC) < 0)
    return pe_push_syserror(L, "fcntl", "F_SETFD", errno, NULL);
  lua_pushboolean(L, 1);
  return 1;
}

/* for ring.c's core.wait_events: the signalfd of catch_signals() (-1 before) */
int pe_signal_fd(void)
{
  return sig_fd;
}

/* for ring.c's core.wait_events: the pid of the child at idx, 0 once it
 * was reaped, -1 when idx holds no child; raises for one not started */
int pe_child_pid(lua_State *L, int idx)
{
  pe_child *c = (pe_child *)pe_testudata(L, idx, PE_CHILD_MT);
  if (!c) return -1;
  if (c->gate >= 0) luaL_error(L, "wait_events: call child:start() first");
  return c->pid > 0 ? (int)c->pid : 0;
}

static int l_now(lua_State *L)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec / 1e9);
  return 1;
}

static const luaL_Reg child_methods[] = {
  {"pid", l_child_pid}, {"start", l_child_start}, {"wait", l_child_wait},
  {"kill", l_child_kill}, {NULL, NULL}
};

static const luaL_Reg spawn_funcs[] = {
  {"spawn", l_spawn}, {"catch_signals", l_catch_signals}, {"wait_pid", l_wait_pid},
  {"now", l_now}, {NULL, NULL}
};

/* adds spawn/catch_signals/wait_pid to the module table on top of the stack */
void pe_open_spawn(lua_State *L)
{
  luaL_newmetatable(L, PE_CHILD_MT);
  lua_newtable(L);
  pe_setfuncs(L, child_methods);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, l_child_gc); lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, l_child_tostring); lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
  pe_setfuncs(L, spawn_funcs);
  pe_push_private(L, lua_gettop(L));
  lua_pushcfunction(L, l_cloexec);
  lua_setfield(L, -2, "cloexec");
  lua_pop(L, 1);
}
