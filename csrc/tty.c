/*
 * tty.c - the terminal of a live view (`luaperf top`): keys read one at a
 * time without echo, the window's size, the terminal's settings put back.
 *
 *   _private.tty_raw(on)   -> true | nil, message: standard input in
 *                             non-canonical mode without echo (on), or
 *                             as it was before (off)
 *   _private.tty_size()    -> rows, columns of standard output | nil
 *   _private.tty_key(ms)   -> the bytes typed, waiting up to ms
 *                             milliseconds (0: not at all) | nil (none
 *                             yet) | false (end of input, hung up)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>
#include "pe_core.h"

static struct termios tty_saved;
static int tty_is_raw;

static int l_tty_raw(lua_State *L)
{
  struct termios t;
  if (!lua_toboolean(L, 1)) {
    if (tty_is_raw && tcsetattr(0, TCSAFLUSH, &tty_saved) != 0)
      return pe_push_syserror(L, "tcsetattr", "standard input", errno, NULL);
    tty_is_raw = 0;
    lua_pushboolean(L, 1);
    return 1;
  }
  if (tcgetattr(0, &t) != 0) return pe_push_syserror(L, "tcgetattr", "standard input", errno, NULL);
  if (!tty_is_raw) tty_saved = t;
  t.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
  t.c_cc[VMIN] = 0;
  t.c_cc[VTIME] = 0;
  if (tcsetattr(0, TCSAFLUSH, &t) != 0) return pe_push_syserror(L, "tcsetattr", "standard input", errno, NULL);
  tty_is_raw = 1;
  lua_pushboolean(L, 1);
  return 1;
}

static int l_tty_size(lua_State *L)
{
  struct winsize w;
  if (ioctl(1, TIOCGWINSZ, &w) != 0 || w.ws_row == 0 || w.ws_col == 0) return 0;
  lua_pushinteger(L, w.ws_row);
  lua_pushinteger(L, w.ws_col);
  return 2;
}

static int l_tty_key(lua_State *L)
{
  struct pollfd p;
  char buf[64];
  ssize_t n;
  lua_Integer ms = luaL_optinteger(L, 1, 0);
  p.fd = 0;
  p.events = POLLIN;
  p.revents = 0;
  if (ms < 0) ms = 0;
  if (ms > 60000) ms = 60000;
  if (poll(&p, 1, (int)ms) <= 0) return 0;
  if (!(p.revents & POLLIN)) {
    lua_pushboolean(L, 0);        /* hung up: no key will come */
    return 1;
  }
  n = read(0, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return 0;
  if (n <= 0) {
    lua_pushboolean(L, 0);        /* end of input */
    return 1;
  }
  lua_pushlstring(L, buf, (size_t)n);
  return 1;
}

void pe_open_tty(lua_State *L)
{
  static const luaL_Reg fns[] = {
    {"tty_raw", l_tty_raw}, {"tty_size", l_tty_size}, {"tty_key", l_tty_key}, {NULL, NULL}
  };
  pe_push_private(L, lua_gettop(L));
  pe_setfuncs(L, fns);
  lua_pop(L, 1);
}
