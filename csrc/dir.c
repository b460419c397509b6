/*
 * dir.c - directory listings without a child process, and files at
 * predictable paths opened safely.
 *
 * Owns: core.readdir, the one way the Lua layer lists sysfs, tracefs and
 * procfs directories (fs.lua).  Before it the listings went through
 * `ls`/`find` children, which forks inside the measured process (nginx
 * workers saw SIGCHLD and "unknown process exited").  And
 * core._private.own_*: a file such as /tmp/perf-PID.map, which anyone may
 * have planted first, opened without following a link and written only
 * when it is the writer's own (fs.own_file).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "pe_core.h"

/* d is an entry of the open directory dfd: does it name a directory, with
 * symlinks followed (as `find -L ... -type d`)?  DT_UNKNOWN (some file
 * systems) and DT_LNK need a stat. */
static int is_dir(int dfd, const struct dirent *d)
{
  struct stat st;
  if (d->d_type == DT_DIR) return 1;
  if (d->d_type != DT_UNKNOWN && d->d_type != DT_LNK) return 0;
  if (fstatat(dfd, d->d_name, &st, 0) != 0) return 0;
  return S_ISDIR(st.st_mode);
}

/* core.readdir(path [, dirs_only]) -> array of entry names in the
 * directory's own (readdir) order, without "." and ".."; with dirs_only,
 * only the entries that are directories.  nil, message, errno when the
 * directory cannot be opened or read. */
int pe_l_readdir(lua_State *L)
{
  const char *path = luaL_checkstring(L, 1);
  int dirs_only = lua_toboolean(L, 2);
  DIR *dir = opendir(path);
  struct dirent *d;
  int n = 0, err;
  if (!dir) return pe_push_syserror(L, "opendir", path, errno, NULL);
  lua_newtable(L);
  for (;;) {
    errno = 0;
    d = readdir(dir);
    if (!d) break;
    if (d->d_name[0] == '.' && (d->d_name[1] == '\0' ||
                                (d->d_name[1] == '.' && d->d_name[2] == '\0')))
      continue;
    if (dirs_only && !is_dir(dirfd(dir), d)) continue;
    lua_pushstring(L, d->d_name);
    lua_rawseti(L, -2, ++n);
  }
  err = errno;
  closedir(dir);
  if (err) {
    lua_pop(L, 1);
    return pe_push_syserror(L, "readdir", path, err, NULL);
  }
  return 1;
}

/* own_open(path) -> fd | nil, message, errno: opened read-write for
 * appending, created (0644) when missing; a link at path is refused
 * (O_NOFOLLOW: ELOOP), and so is a file that is not a regular file of this
 * effective user with one link (a hard link to another file), before
 * anything is written */
static int l_own_open(lua_State *L)
{
  const char *path = luaL_checkstring(L, 1);
  struct stat st;
  int fd = open(path, O_RDWR | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0) {
    int err = errno;
    return pe_push_syserror(L, "open", path, err,
                            err == ELOOP ? "a link: a file at this path is written only when it is no link" : NULL);
  }
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return pe_push_syserror(L, "fstat", path, err, NULL);
  }
  if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || st.st_nlink != 1) {
    close(fd);
    lua_pushnil(L);
    lua_pushfstring(L, "%s: not written: not a regular file of this user with one link "
                    "(a file planted at a predictable path)", path);
    lua_pushinteger(L, EPERM);
    return 3;
  }
  lua_pushinteger(L, fd);
  return 1;
}

static int own_fd(lua_State *L) { return pe_check_int(L, 1, "fd", 0, 1 << 20); }

/* own_head(fd, n) -> the first n bytes (fewer at the end) */
static int l_own_head(lua_State *L)
{
  char buf[512];
  int n = pe_check_int(L, 2, "n", 0, (int)sizeof buf);
  ssize_t r = pread(own_fd(L), buf, (size_t)n, 0);
  lua_pushlstring(L, buf, r > 0 ? (size_t)r : 0);
  return 1;
}

/* own_write(fd, s) -> true | nil, message, errno */
static int l_own_write(lua_State *L)
{
  size_t len, done = 0;
  int fd = own_fd(L);
  const char *s = luaL_checklstring(L, 2, &len);
  while (done < len) {
    ssize_t w = write(fd, s + done, len - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return pe_push_syserror(L, "write", "the map", w < 0 ? errno : EIO, NULL);
    done += (size_t)w;
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* own_truncate(fd): emptied; own_close(fd) */
static int l_own_truncate(lua_State *L)
{
  if (ftruncate(own_fd(L), 0) != 0) return pe_push_syserror(L, "ftruncate", "the map", errno, NULL);
  lua_pushboolean(L, 1);
  return 1;
}

static int l_own_close(lua_State *L)
{
  close(own_fd(L));
  return 0;
}

void pe_open_ownfile(lua_State *L)
{
  static const luaL_Reg fns[] = {
    {"own_open", l_own_open}, {"own_head", l_own_head}, {"own_write", l_own_write},
    {"own_truncate", l_own_truncate}, {"own_close", l_own_close}, {NULL, NULL}
  };
  pe_push_private(L, lua_gettop(L));
  pe_setfuncs(L, fns);
  lua_pop(L, 1);
}
