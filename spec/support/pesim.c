/*
 * pesim.c - the test-only module "pesim": simulated rings and user pages
 * that run the core's own code on bytes a test chooses.  Never installed
 * and not part of perf_event.core: the Makefile links it with the core's
 * objects (build/obj/<lua>/libpecore.a, symbols kept private) into
 * build/test/<lua>/pesim.so; the fuzzers link it with the core's sources.
 * The specs reach it through U.sim() (spec/support/util.lua).
 *
 *   pesim.sim_ring{...}      -> a perf_event.event over anonymous memory
 *                               that ev:records()/aux()/poll() drain
 *   pesim.userpage_sim{...}  -> the user-page read on a scripted page
 *
 * The events it makes carry perf_event.core's metatable, so the methods
 * that run on them are core.so's; this module only builds them.  Its own
 * copy of the lifecycle code keeps the fork generation in step with the
 * core's (pe_lifecycle_init).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "pe_records.h"
#include "userpage.h"

#define RF_TIMES (PE_FORMAT_TOTAL_TIME_ENABLED | PE_FORMAT_TOTAL_TIME_RUNNING)

PE_EXPORT int luaopen_pesim(lua_State *L);

/* ---- simulated rings ----------------------------------------------------- */
/* the decode fields of a sim_ring table or of one of its layouts */
static void attr_from_table(lua_State *L, int t, struct pe_attr *a)
{
  pe_decode_cfg c;
  memset(&c, 0, sizeof c);
  memset(a, 0, sizeof *a);
  pe_decode_cfg_from_table(L, t, &c);
  a->sample_type = c.sample_type;
  a->read_format = c.read_format;
  a->branch_sample_type = c.branch_sample_type;
  a->sample_regs_user = c.regs_user;
  a->sample_regs_intr = c.regs_intr;
  if (c.sample_id_all) a->flags |= PE_FLAG_BIT(sample_id_all);
}

/* sim_ring's layouts = {{id=, sample_type=, read_format=, sample_id_all=,
 * branch_sample_type=, sample_regs_user=, sample_regs_intr=, name=,
 * type=, config=}, ...}: events "redirected" into the simulated ring */
static void sim_layouts(lua_State *L, pe_event *ev)
{
  int i, n, top = lua_gettop(L);
  lua_getfield(L, 1, "layouts");
  if (lua_isnil(L, -1)) { lua_settop(L, top); return; }
  luaL_argcheck(L, lua_istable(L, -1), 1, "layouts: a table of layouts");
  n = (int)pe_rawlen(L, -1);
  for (i = 1; i <= n; i++) {
    int t;
    struct pe_attr a;
    lua_rawgeti(L, top + 1, i);
    t = lua_gettop(L);
    luaL_argcheck(L, lua_istable(L, t), 1, "layouts: each layout is a table");
    attr_from_table(L, t, &a);
    a.type = (uint32_t)pe_opt_u64(L, t, "type", 0);
    a.config = pe_opt_u64(L, t, "config", 0);
    lua_getfield(L, t, "name");
    if (pe_layouts_add_attr(ev, pe_opt_u64(L, t, "id", 0), &a, lua_tostring(L, -1)) < 0)
      luaL_error(L, "sim_ring: out of memory");
    lua_settop(L, top + 1);
  }
  lua_settop(L, top);
}

/*
 * pesim.sim_ring{data=bytes, head=, tail=, sample_type=, read_format=,
 *   sample_id_all=, branch_sample_type=, sample_regs_user=,
 *   sample_regs_intr=, write_backward=, aux=bytes, aux_head=, aux_tail=,
 *   id=, layouts=}
 *   -> a perf_event.event whose ring holds `data` (its length a power of
 *   two, at least 8) with the given head/tail; `aux` likewise.  `id` is
 *   the event's id, `layouts` (see sim_layouts) the events sharing its
 *   ring.  The same records()/aux() code runs on it as on a kernel ring.
 */
static int sim_ring(lua_State *L)
{
  size_t dlen, alen = 0;
  const char *data, *aux = NULL;
  size_t ps = (size_t)pe_page_size(), pages, maplen;
  pe_event *ev;
  void *p;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  lua_getfield(L, 1, "data");
  data = luaL_checklstring(L, -1, &dlen);
  lua_getfield(L, 1, "aux");
  if (!lua_isnil(L, -1)) aux = luaL_checklstring(L, -1, &alen);
  if (dlen < 8 || (dlen & (dlen - 1))) return luaL_argerror(L, 1, "data: length must be a power of two >= 8");
  if (aux && (alen < 8 || (alen & (alen - 1)))) return luaL_argerror(L, 1, "aux: length must be a power of two >= 8");
  pages = (dlen + ps - 1) / ps;
  maplen = ps * (1 + pages);
  ev = (pe_event *)pe_newuserdata(L, sizeof *ev);     /* 4 */
  memset(ev, 0, sizeof *ev);
  ev->gen = pe_fork_gen;
  ev->fd = -1;
  ev->flags = PE_EV_CLOSED;
  luaL_getmetatable(L, PE_EVENT_MT);
  lua_setmetatable(L, -2);
  lua_createtable(L, 0, 1);
  lua_pushliteral(L, "sim_ring");
  lua_setfield(L, -2, "name");
  pe_setuservalue(L, 4);
  attr_from_table(L, 1, &ev->attr);
  lua_getfield(L, 1, "write_backward");
  if (lua_toboolean(L, -1)) ev->attr.flags |= PE_FLAG_BIT(write_backward);
  lua_settop(L, 4);
  ev->sample_type = ev->attr.sample_type;
  ev->read_format = ev->attr.read_format;
  ev->id = pe_opt_u64(L, 1, "id", 0);

  p = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return pe_push_syserror(L, "mmap", "sim_ring", errno, NULL);
  ev->page = (struct pe_mmap_page *)p;
  ev->map_len = maplen;
  ev->data_pages = pages;
  ev->page->data_offset = ps;
  ev->page->data_size = dlen;
  memcpy((char *)p + ps, data, dlen);
  /* an fd that poll() and close() accept: the event is "open" */
  ev->fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (ev->fd < 0) { int err = errno; pe_event_close(ev); return pe_push_syserror(L, "open", "/dev/null", err, NULL); }
  ev->flags = 0;
  ev->page->data_head = pe_opt_u64(L, 1, "head", dlen);
  ev->page->data_tail = pe_opt_u64(L, 1, "tail", 0);
  ev->tail = ev->page->data_tail;
  if (ev->attr.flags & PE_FLAG_BIT(write_backward)) ev->tail = pe_opt_u64(L, 1, "last", 0);
  sim_layouts(L, ev);
  if (aux) {
    void *a = mmap(NULL, alen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) return pe_push_syserror(L, "mmap", "sim_ring aux", errno, NULL);
    memcpy(a, aux, alen);
    ev->aux = a;
    ev->aux_len = alen;
    ev->page->aux_size = alen;
    ev->page->aux_head = pe_opt_u64(L, 1, "aux_head", alen);
    ev->page->aux_tail = pe_opt_u64(L, 1, "aux_tail", 0);
  }
  lua_settop(L, 4);
  return 1;
}


#define SIM_MAX 16
#define SIM_HDR offsetof(struct pe_mmap_page, reserved)

typedef struct sim {
  pe_up_hooks h;               /* first: the hooks get a pointer to it */
  struct pe_mmap_page *pc;
  uint64_t pmc[SIM_MAX], tsc[SIM_MAX];
  int npmc, ntsc, pmc_calls, tsc_calls;
  unsigned char tear[SIM_MAX][SIM_HDR];
  int ntear, itear, tear_on_tsc;
  uint32_t counter;
} sim;

static void sim_tear(sim *s)
{
  if (s->itear < s->ntear) memcpy(s->pc, s->tear[s->itear++], SIM_HDR);
}

static uint64_t sim_rdpmc(pe_up_hooks *h, uint32_t counter)
{
  sim *s = (sim *)h;
  uint64_t v = s->npmc ? s->pmc[s->pmc_calls < s->npmc ? s->pmc_calls : s->npmc - 1] : 0;
  s->pmc_calls++;
  s->counter = counter;
  if (!s->tear_on_tsc) sim_tear(s);
  return v;
}

static uint64_t sim_rdtsc(pe_up_hooks *h)
{
  sim *s = (sim *)h;
  uint64_t v = s->ntsc ? s->tsc[s->tsc_calls < s->ntsc ? s->tsc_calls : s->ntsc - 1] : 0;
  s->tsc_calls++;
  if (s->tear_on_tsc) sim_tear(s);
  return v;
}

static const char *const sim_fields[] = {
  "version", "compat_version", "lock", "index", "offset", "time_enabled",
  "time_running", "capabilities", "pmc_width", "time_shift", "time_mult",
  "time_offset", "time_zero", "size", "time_cycles", "time_mask", NULL
};
static const char *const sim_controls[] = {
  "pmc", "tsc", "tear", "tear_on", "read_format", "inherit", "selfmon", "other_thread", NULL
};

static int in_list(const char *k, const char *const *l)
{
  for (; *l; l++) if (strcmp(k, *l) == 0) return 1;
  return 0;
}

/* applies the page fields of table t to p; unknown keys are a mistake */
static int sim_set(lua_State *L, int t, struct pe_mmap_page *p, int controls_ok)
{
  int lock_set = 0;
  lua_pushnil(L);
  while (lua_next(L, t)) {
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
    uint64_t v;
    if (!k || !in_list(k, sim_fields)) {
      if (k && controls_ok && in_list(k, sim_controls)) { lua_pop(L, 1); continue; }
      return luaL_error(L, "userpage_sim: unknown page field '%s'", k ? k : luaL_typename(L, -2));
    }
    v = pe_check_u64(L, -1);
#define SET(f) else if (strcmp(k, #f) == 0) p->f = (__typeof__(p->f))v
    if (0) {}
    SET(version); SET(compat_version); SET(lock); SET(index); SET(offset);
    SET(time_enabled); SET(time_running); SET(capabilities); SET(pmc_width);
    SET(time_shift); SET(time_mult); SET(time_offset); SET(time_zero); SET(size);
    SET(time_cycles); SET(time_mask);
#undef SET
    if (strcmp(k, "lock") == 0) lock_set = 1;
    lua_pop(L, 1);
  }
  return lock_set;
}

static int sim_values(lua_State *L, int t, const char *k, uint64_t *dst)
{
  int n = 0;
  lua_getfield(L, t, k);
  if (lua_istable(L, -1)) {
    int i, len = (int)pe_rawlen(L, -1);
    if (len > SIM_MAX) luaL_error(L, "userpage_sim: at most %d '%s' values", SIM_MAX, k);
    for (i = 1; i <= len; i++) {
      lua_rawgeti(L, -1, i);
      dst[n++] = pe_check_u64(L, lua_gettop(L));
      lua_pop(L, 1);
    }
  } else if (!lua_isnil(L, -1)) {
    dst[n++] = pe_check_u64(L, lua_gettop(L));
  }
  lua_pop(L, 1);
  return n;
}

static const char *const up_codes[] = {
  "ok", "nocap", "noindex", "noarch", "badwidth", "badtime", "negative", "nopage",
  "inherit", "stale", "thread"
};

static int userpage_sim(lua_State *L)
{
  sim s;
  pe_event ev;
  pe_up_result r;
  uint64_t out[3];
  struct pe_mmap_page *pc;
  int rc;

  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  memset(&s, 0, sizeof s);
  memset(&ev, 0, sizeof ev);
  memset(&r, 0, sizeof r);
  /* build everything that can raise before allocating the page */
  {
    struct pe_mmap_page hdr;
    memset(&hdr, 0, sizeof hdr);
    hdr.size = (uint32_t)SIM_HDR;
    sim_set(L, 1, &hdr, 1);
    s.npmc = sim_values(L, 1, "pmc", s.pmc);
    s.ntsc = sim_values(L, 1, "tsc", s.tsc);
    lua_getfield(L, 1, "tear");                    /* 2 */
    if (lua_istable(L, 2)) {
      int i, len = (int)pe_rawlen(L, 2);
      if (len > SIM_MAX) luaL_error(L, "userpage_sim: at most %d tear updates", SIM_MAX);
      for (i = 1; i <= len; i++) {
        lua_rawgeti(L, 2, i);
        luaL_checktype(L, 3, LUA_TTABLE);
        if (!sim_set(L, 3, &hdr, 0)) hdr.lock += 2;
        memcpy(s.tear[i - 1], &hdr, SIM_HDR);
        lua_pop(L, 1);
      }
      s.ntear = len;
    }
    lua_pop(L, 1);
    lua_getfield(L, 1, "tear_on");
    s.tear_on_tsc = lua_isstring(L, -1) && strcmp(lua_tostring(L, -1), "tsc") == 0;
    lua_pop(L, 1);
    ev.read_format = pe_opt_u64(L, 1, "read_format", RF_TIMES);
    lua_getfield(L, 1, "inherit");
    if (lua_toboolean(L, -1)) ev.attr.flags |= PE_FLAG_BIT(inherit);
    lua_getfield(L, 1, "selfmon");
    if (lua_isnil(L, -1) || lua_toboolean(L, -1)) ev.flags |= PE_EV_SELFMON;
    lua_pop(L, 2);
    lua_getfield(L, 1, "other_thread");
    ev.tid = lua_toboolean(L, -1) ? -1 : pe_current_tid();
    lua_pop(L, 1);
    /* the initial page: the top-level fields again, on a clean header */
    memset(&hdr, 0, sizeof hdr);
    hdr.size = (uint32_t)SIM_HDR;
    sim_set(L, 1, &hdr, 1);
    pc = (struct pe_mmap_page *)calloc(1, sizeof *pc);
    if (!pc) return luaL_error(L, "userpage_sim: out of memory");
    memcpy(pc, &hdr, SIM_HDR);
  }
  s.pc = pc;
  s.h.rdpmc = sim_rdpmc;
  s.h.rdtsc = sim_rdtsc;
  ev.fd = 1 << 30;        /* never used: the fake event is never read(2) */
  ev.page = pc;

  rc = pe_userpage_event_read(&ev, &s.h, out, &r);
  free(pc);

  lua_createtable(L, 0, 12);
  lua_pushstring(L, rc >= 0 && rc <= PE_UP_THREAD ? up_codes[rc] : "?");
  lua_setfield(L, -2, "status");
  lua_pushstring(L, pe_userpage_reason(rc)); lua_setfield(L, -2, "reason");
  if (rc == PE_UP_OK) {
    /* scaled as ev:read() scales it (both times in read_format) */
    pe_push_u64(L, (ev.read_format & RF_TIMES) == RF_TIMES ? pe_scale(out[0], out[1], out[2])
                                                           : out[0]);
    lua_setfield(L, -2, "value");
    pe_push_u64(L, out[1]); lua_setfield(L, -2, "enabled");
    pe_push_u64(L, out[2]); lua_setfield(L, -2, "running");
    pe_push_u64(L, r.count); lua_setfield(L, -2, "count");
    lua_pushinteger(L, r.loops); lua_setfield(L, -2, "loops");
    lua_pushinteger(L, (lua_Integer)r.index); lua_setfield(L, -2, "index");
  }
  lua_pushinteger(L, (lua_Integer)s.counter); lua_setfield(L, -2, "counter");
  lua_pushinteger(L, s.pmc_calls); lua_setfield(L, -2, "pmc_calls");
  lua_pushinteger(L, s.tsc_calls); lua_setfield(L, -2, "tsc_calls");
  return 1;
}

/* ---- the module ---------------------------------------------------------- */
int luaopen_pesim(lua_State *L)
{
  static const luaL_Reg funcs[] = {
    {"sim_ring", sim_ring}, {"userpage_sim", userpage_sim}, {NULL, NULL}
  };
  /* the events made here need perf_event.core's metatable */
  luaL_getmetatable(L, PE_EVENT_MT);
  if (lua_isnil(L, -1)) {
    lua_getglobal(L, "require");
    lua_pushliteral(L, "perf_event.core");
    lua_call(L, 1, 0);
  }
  lua_pop(L, 1);
  pe_lifecycle_init();
  pe_u64_init(L);
  lua_newtable(L);
  pe_setfuncs(L, funcs);
  return 1;
}
