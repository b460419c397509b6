/*
 * group.c - perf_event.group: events read and switched as one (doc/coverage.md C).
 *
 * Owns: core.make_group, the "perf_event.group" metatable and its methods
 * (enable/disable/reset leader-last, read with each member's value picked
 * by id, close, members, #g, tostring) and pe_group_ioctl, which the FFI
 * route (fast.c) shares.  Calls lifecycle.c (accessors, close, read(2))
 * and the leaves (readfmt.c, errors.c, u64.c).
 */
#include <errno.h>
#include <string.h>
#include <sys/ioctl.h>
#include "pe_core.h"

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
  if (pe_event_inherited(g->ev[0])) {      /* a forked child: the parent's group */
    pe_getuservalue(L, 1);
    lua_rawgeti(L, -1, 1);
    return pe_push_inherited(L, lua_gettop(L), g->ev[0], op);
  }
  if (pe_group_ioctl(g, req) < 0) {
    int err = errno;
    pe_getuservalue(L, 1);
    lua_rawgeti(L, -1, 1);
    return pe_push_syserror(L, op, pe_event_name(L, lua_gettop(L)), err, NULL);
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
  n = pe_read_fd(g->ev[0]->fd, buf, sizeof buf);
  if (n <= 0 || pe_readfmt_decode((unsigned char *)buf, (size_t)n, g->read_format, &r) < 0) {
    int err = errno;
    pe_getuservalue(L, 1);
    lua_rawgeti(L, -1, 1);                  /* the leader names the read */
    return pe_push_read_error(L, lua_gettop(L), n, err);
  }
  if (lua_istable(L, 2)) lua_settop(L, 2);
  else { lua_settop(L, 1); lua_createtable(L, g->n, g->n + 2); }
  pe_getuservalue(L, 1);                  /* 3: members */
  names = lua_gettop(L);
  for (i = 0; i < g->n; i++) {
    long k = (g->read_format & PE_FORMAT_ID) ? pe_reading_find(&r, g->ev[i]->id, (uint64_t)i)
             : (uint64_t)i < r.nr ? i : -1;
    if (k >= 0) pe_push_u64(L, pe_scale(r.v[k].value, r.time_enabled, r.time_running));
    else lua_pushnil(L);                 /* member gone (closed) */
    lua_pushvalue(L, -1);
    lua_rawseti(L, 2, i + 1);
    lua_rawgeti(L, names, i + 1);
    lua_pushstring(L, pe_event_name(L, lua_gettop(L)));
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
    lua_pushstring(L, pe_event_name(L, lua_gettop(L)));
    lua_remove(L, -2);
    if (i) luaL_addstring(&b, ",");  /* the buffer may sit on the stack: */
    luaL_addvalue(&b);               /* add the name after the comma */
  }
  lua_pushfstring(L, "}, leader fd %d)", g->ev[0]->fd);
  luaL_addvalue(&b);
  luaL_pushresult(&b);
  return 1;
}


static const luaL_Reg group_methods[] = {
  {"enable", g_enable}, {"disable", g_disable}, {"reset", g_reset},
  {"read", g_read}, {"close", g_close}, {"members", g_members}, {NULL, NULL}
};

void pe_open_groups(lua_State *L, int mod)
{
  /* stack: module table (at mod).  The C methods also go to core._private,
   * from which lua/perf_event/class.lua assembles the class's __index */
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
  lua_pushcfunction(L, l_make_group);
  lua_setfield(L, -2, "make_group");
}
