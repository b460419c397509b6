/*
 * dir.c - directory listings without a child process.
 *
 * Owns: core.readdir, the one way the Lua layer lists sysfs, tracefs and
 * procfs directories (fs.lua).  Before it the listings went through
 * `ls`/`find` children, which forks inside the measured process (nginx
 * workers saw SIGCHLD and "unknown process exited").
 */
#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
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
