/*
 * rb_test.c - a test-only Lua module for the sampling specs (ring_spec,
 * records_spec): exact syscalls with known arguments, a CPU burner in a
 * function whose address range is known (its own section), dlopen, and
 * children that fork/exec/unshare/exit on request.  Built by
 * spec/support/rb_build.lua into build/test/<suite>/rbtest.so.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <lua.h>
#include <lauxlib.h>

static uint64_t count_arg(lua_State *L, int i)
{
  lua_Number n = luaL_checknumber(L, i);
  if (n < 0 || n > 1e9) luaL_argerror(L, i, "count out of range");
  return (uint64_t)n;
}

/* rbtest.getppid(n): n getppid syscalls */
static int r_getppid(lua_State *L)
{
  uint64_t i, n = count_arg(L, 1);
  for (i = 0; i < n; i++) syscall(SYS_getppid);
  return 0;
}

/* rbtest.write(fd, count, n): n write(fd, buf, count) syscalls */
static int r_write(lua_State *L)
{
  int fd = (int)luaL_checknumber(L, 1);
  size_t count = (size_t)count_arg(L, 2);
  uint64_t i, n = count_arg(L, 3);
  static char buf[65536];
  if (count > sizeof buf) return luaL_argerror(L, 2, "at most 65536");
  for (i = 0; i < n; i++) (void)syscall(SYS_write, fd, buf, count);
  return 0;
}

/* the burner lives alone in a section so its exact range is known */
__attribute__((noinline, section("rb_spin_text"))) uint64_t rb_spin_inner(uint64_t ns)
{
  struct timespec t0, t;
  uint64_t x = 1, el;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do {
    int k;
    for (k = 0; k < 1000; k++) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    clock_gettime(CLOCK_MONOTONIC, &t);
    el = (uint64_t)(t.tv_sec - t0.tv_sec) * 1000000000ull + (uint64_t)(t.tv_nsec - t0.tv_nsec);
  } while (el < ns);
  return x;
}
extern char __start_rb_spin_text[], __stop_rb_spin_text[];

/* rbtest.spin(ms): burns CPU in rb_spin_inner */
static int r_spin(lua_State *L)
{
  lua_pushnumber(L, (lua_Number)(rb_spin_inner((uint64_t)(luaL_checknumber(L, 1) * 1e6)) & 0xffff));
  return 1;
}

/* rbtest.spin_range() -> lo, hi (numbers) of rb_spin_inner's section */
static int r_spin_range(lua_State *L)
{
  lua_pushnumber(L, (lua_Number)(uintptr_t)__start_rb_spin_text);
  lua_pushnumber(L, (lua_Number)(uintptr_t)__stop_rb_spin_text);
  return 2;
}

/* rbtest.dlopen(path) -> true | nil, err; the handle stays open */
static int r_dlopen(lua_State *L)
{
  void *h = dlopen(luaL_checkstring(L, 1), RTLD_NOW | RTLD_LOCAL);
  if (!h) { lua_pushnil(L); lua_pushstring(L, dlerror()); return 2; }
  lua_pushboolean(L, 1);
  return 1;
}

/* rbtest.child(what, n): forks a child that does `what` and exits 0;
 * returns its pid after it was reaped.  what: "getppid" (n calls),
 * "exec" (execs /bin/true), "unshare" (unshare(CLONE_NEWUTS) then n
 * getppid), "sleep" (n ms) */
static int r_child(lua_State *L)
{
  const char *what = luaL_checkstring(L, 1);
  uint64_t n = lua_isnoneornil(L, 2) ? 0 : count_arg(L, 2);
  int st;
  pid_t pid = fork();
  if (pid < 0) { lua_pushnil(L); lua_pushinteger(L, errno); return 2; }
  if (pid == 0) {
    uint64_t i;
    if (strcmp(what, "exec") == 0) {
      execl("/bin/true", "true", (char *)NULL);
      _exit(127);
    }
    if (strcmp(what, "unshare") == 0 && unshare(CLONE_NEWUTS) != 0) _exit(3);
    if (strcmp(what, "sleep") == 0) {
      struct timespec ts = { (time_t)(n / 1000), (long)(n % 1000) * 1000000L };
      nanosleep(&ts, NULL);
      _exit(0);
    }
    for (i = 0; i < n; i++) syscall(SYS_getppid);
    _exit(0);
  }
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  lua_pushinteger(L, pid);
  lua_pushinteger(L, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  return 2;
}

/* rbtest.fork_sleep(ms [, n]) -> pid: a child that sleeps ms, makes n
 * getppid calls and exits, not reaped
 * (rbtest.reap(pid) waits for it) */
static int r_fork_sleep(lua_State *L)
{
  uint64_t ms = count_arg(L, 1);
  uint64_t n = lua_isnoneornil(L, 2) ? 0 : count_arg(L, 2);
  pid_t pid = fork();
  if (pid == 0) {
    struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000L };
    uint64_t i;
    nanosleep(&ts, NULL);
    for (i = 0; i < n; i++) syscall(SYS_getppid);
    _exit(0);
  }
  lua_pushinteger(L, pid);
  return 1;
}

static int r_reap(lua_State *L)
{
  int st;
  pid_t pid = (pid_t)luaL_checknumber(L, 1);
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  return 0;
}

/* rbtest.bpf_cycle() -> true | nil, errno: loads and unloads "r0=0; exit"
 * (a socket filter), which emits KSYMBOL and BPF_EVENT twice */
static int r_bpf_cycle(lua_State *L)
{
  struct { uint8_t code, regs; int16_t off; int32_t imm; } insns[2] = {
    {0xb7, 0, 0, 0}, {0x95, 0, 0, 0}
  };
  union {
    struct {
      uint32_t prog_type, insn_cnt;
      uint64_t insns, license;
      uint32_t log_level, log_size;
      uint64_t log_buf;
      uint32_t kern_version, prog_flags;
    } load;
    unsigned char pad[128];
  } attr;
  int fd;
  memset(&attr, 0, sizeof attr);
  attr.load.prog_type = 1;   /* SOCKET_FILTER */
  attr.load.insn_cnt = 2;
  attr.load.insns = (uint64_t)(uintptr_t)insns;
  attr.load.license = (uint64_t)(uintptr_t)"GPL";
  fd = (int)syscall(SYS_bpf, 5, &attr, sizeof attr);
  if (fd < 0) { lua_pushnil(L); lua_pushinteger(L, errno); return 2; }
  close(fd);
  lua_pushboolean(L, 1);
  return 1;
}

/* rbtest.mkdir(path), rbtest.rmdir(path) -> true | nil, errno (in this process:
 * a CGROUP record goes to the creating task's events) */
static int r_mkdir(lua_State *L)
{
  if (mkdir(luaL_checkstring(L, 1), 0755) != 0) { lua_pushnil(L); lua_pushinteger(L, errno); return 2; }
  lua_pushboolean(L, 1);
  return 1;
}

static int r_rmdir(lua_State *L)
{
  if (rmdir(luaL_checkstring(L, 1)) != 0) { lua_pushnil(L); lua_pushinteger(L, errno); return 2; }
  lua_pushboolean(L, 1);
  return 1;
}

/* rbtest.gettid() */
static int r_gettid(lua_State *L)
{
  lua_pushinteger(L, (lua_Integer)syscall(SYS_gettid));
  return 1;
}

int luaopen_rbtest(lua_State *L)
{
  static const luaL_Reg f[] = {
    {"getppid", r_getppid}, {"write", r_write}, {"spin", r_spin},
    {"spin_range", r_spin_range}, {"dlopen", r_dlopen}, {"child", r_child},
    {"fork_sleep", r_fork_sleep}, {"reap", r_reap}, {"bpf_cycle", r_bpf_cycle},
    {"gettid", r_gettid}, {"mkdir", r_mkdir}, {"rmdir", r_rmdir}, {NULL, NULL}
  };
  lua_newtable(L);
  for (const luaL_Reg *r = f; r->name; r++) {
    lua_pushcfunction(L, r->func);
    lua_setfield(L, -2, r->name);
  }
  return 1;
}
