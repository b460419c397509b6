/*
 * readfmt.c - the read(2) layouts of all 32 read_format combinations
 * (doc/coverage.md C1-C7) and multiplex scaling.
 *
 * Owns: pe_readfmt_decode (bounds-checked, used for read(2) results and for
 * READ records and PERF_SAMPLE_READ payloads), pe_scale, and the Lua view.
 */
#include <string.h>
#include "pe_core.h"

static uint64_t ld64(const unsigned char *p)
{
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

size_t pe_readfmt_size(uint64_t rf, uint64_t nr)
{
  size_t te = (rf & PE_FORMAT_TOTAL_TIME_ENABLED) ? 1 : 0;
  size_t tr = (rf & PE_FORMAT_TOTAL_TIME_RUNNING) ? 1 : 0;
  size_t id = (rf & PE_FORMAT_ID) ? 1 : 0;
  size_t lost = (rf & PE_FORMAT_LOST) ? 1 : 0;
  if (rf & PE_FORMAT_GROUP) return 8 * (1 + te + tr) + (size_t)nr * 8 * (1 + id + lost);
  return 8 * (1 + te + tr + id + lost);
}

long pe_readfmt_decode(const unsigned char *buf, size_t len, uint64_t rf,
                       pe_reading *out)
{
  size_t pos = 0, per, i;
  uint64_t nr;
  out->time_enabled = out->time_running = 0;
  out->nr = out->nr_total = 0;
#define TAKE(dst) do { if (pos + 8 > len) return -1; (dst) = ld64(buf + pos); pos += 8; } while (0)
  if (rf & PE_FORMAT_GROUP) {
    TAKE(nr);
    out->nr_total = nr;
    if (rf & PE_FORMAT_TOTAL_TIME_ENABLED) TAKE(out->time_enabled);
    if (rf & PE_FORMAT_TOTAL_TIME_RUNNING) TAKE(out->time_running);
    per = 8 * (1 + ((rf & PE_FORMAT_ID) ? 1 : 0) + ((rf & PE_FORMAT_LOST) ? 1 : 0));
    if (nr > (len - pos) / per) return -1;
    for (i = 0; i < nr; i++) {
      pe_readval tmp = {0, 0, 0}, *v = i < out->cap ? &out->v[i] : &tmp;
      memset(v, 0, sizeof *v);
      TAKE(v->value);
      if (rf & PE_FORMAT_ID) TAKE(v->id);
      if (rf & PE_FORMAT_LOST) TAKE(v->lost);
    }
    out->nr = nr < out->cap ? nr : out->cap;
  } else {
    pe_readval tmp = {0, 0, 0}, *v = out->cap ? &out->v[0] : &tmp;
    memset(v, 0, sizeof *v);
    TAKE(v->value);
    if (rf & PE_FORMAT_TOTAL_TIME_ENABLED) TAKE(out->time_enabled);
    if (rf & PE_FORMAT_TOTAL_TIME_RUNNING) TAKE(out->time_running);
    if (rf & PE_FORMAT_ID) TAKE(v->id);
    if (rf & PE_FORMAT_LOST) TAKE(v->lost);
    out->nr_total = 1;
    out->nr = out->cap ? 1 : 0;
  }
#undef TAKE
  return (long)pos;
}

uint64_t pe_scale(uint64_t value, uint64_t enabled, uint64_t running)
{
  unsigned __int128 r;
  if (running == 0) return 0;
  if (running >= enabled) return value;
  r = (unsigned __int128)value * enabled / running;
  return r > UINT64_MAX ? UINT64_MAX : (uint64_t)r;
}

static void push_val(lua_State *L, const pe_readval *v, uint64_t rf)
{
  lua_createtable(L, 0, 3);
  pe_push_u64(L, v->value); lua_setfield(L, -2, "value");
  if (rf & PE_FORMAT_ID) { pe_push_u64(L, v->id); lua_setfield(L, -2, "id"); }
  if (rf & PE_FORMAT_LOST) { pe_push_u64(L, v->lost); lua_setfield(L, -2, "lost"); }
}

/* {value=, id=, lost=, time_enabled=, time_running=} or, with GROUP,
 * {nr=, time_enabled=, time_running=, values={{value=,id=,lost=},...}} */
void pe_push_reading(lua_State *L, const pe_reading *r, uint64_t rf)
{
  uint64_t i;
  if (rf & PE_FORMAT_GROUP) {
    lua_createtable(L, 0, 4);
    pe_push_u64(L, r->nr_total); lua_setfield(L, -2, "nr");
    lua_createtable(L, (int)r->nr, 0);
    for (i = 0; i < r->nr; i++) {
      push_val(L, &r->v[i], rf);
      lua_rawseti(L, -2, (int)i + 1);
    }
    lua_setfield(L, -2, "values");
  } else {
    push_val(L, &r->v[0], rf);
  }
  if (rf & PE_FORMAT_TOTAL_TIME_ENABLED) {
    pe_push_u64(L, r->time_enabled); lua_setfield(L, -2, "time_enabled");
  }
  if (rf & PE_FORMAT_TOTAL_TIME_RUNNING) {
    pe_push_u64(L, r->time_running); lua_setfield(L, -2, "time_running");
  }
}

/* core.decode_read(bytes, read_format) -> table | nil, "truncated" */
int pe_l_decode_read(lua_State *L)
{
  size_t len;
  const unsigned char *buf = (const unsigned char *)luaL_checklstring(L, 1, &len);
  uint64_t rf;
  pe_readval vals[64];
  pe_reading r;
  long n;
  pe_flags_from_value(L, 2, "read_format", &rf);
  if (rf >> PE_FORMAT_MAX_BIT) return luaL_argerror(L, 2, "unknown read_format bits");
  r.v = vals;
  r.cap = 64;
  n = pe_readfmt_decode(buf, len, rf, &r);
  if (n < 0) {
    lua_pushnil(L);
    lua_pushfstring(L, "read_format buffer truncated (%d bytes)", (int)len);
    return 2;
  }
  if (r.nr_total > r.cap) {
    lua_pushnil(L);
    lua_pushliteral(L, "read_format group has more than 64 members");
    return 2;
  }
  pe_push_reading(L, &r, rf);
  lua_pushinteger(L, n);
  return 2;
}
