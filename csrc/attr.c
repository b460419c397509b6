/*
 * attr.c - struct perf_event_attr <-> Lua table (doc/coverage.md B).
 *
 * Owns: the encoder/decoder used by open, modify and attr(), which walk
 * abi.c's tables (pe_attr_fields: every attr field by its header name;
 * pe_sample_bits / pe_read_bits / pe_branch_bits: the bit names), and
 * core.attr_encode / attr_decode / bits.  An unknown field, a
 * value out of a field's range, or a contradiction (sample_period and
 * sample_freq both given) raises a Lua error naming the field.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pe_core.h"

/* ---- bit names (the tables are abi.c's) --------------------------------- */
static const pe_bitname *bits_for(const char *field)
{
  if (strcmp(field, "sample_type") == 0) return pe_sample_bits;
  if (strcmp(field, "read_format") == 0) return pe_read_bits;
  if (strcmp(field, "branch_sample_type") == 0) return pe_branch_bits;
  return NULL;
}

/* Looks up one bit name, case-insensitively, with or without the
 * PERF_SAMPLE_ / PERF_FORMAT_ / PERF_SAMPLE_BRANCH_ prefix. */
static int lookup_bit(const pe_bitname *t, const char *s, size_t len, uint64_t *bit)
{
  char low[64];
  size_t i;
  static const char *prefixes[] = {"perf_sample_branch_", "perf_sample_", "perf_format_", NULL};
  if (len == 0 || len >= sizeof low) return 0;
  for (i = 0; i < len; i++) low[i] = (char)tolower((unsigned char)s[i]);
  low[len] = 0;
  for (i = 0; prefixes[i]; i++) {
    size_t pl = strlen(prefixes[i]);
    if (len > pl && memcmp(low, prefixes[i], pl) == 0) {
      memmove(low, low + pl, len - pl + 1);
      break;
    }
  }
  for (; t->name; t++)
    if (strcmp(t->name, low) == 0) { *bit = t->bit; return 1; }
  return 0;
}

static void unknown_bit(lua_State *L, const char *field, const pe_bitname *t,
                        const char *s, size_t len)
{
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  lua_pushfstring(L, "unknown %s name '", field);
  luaL_addvalue(&b);
  luaL_addlstring(&b, s, len);
  luaL_addstring(&b, "' (valid: ");
  for (; t->name; t++) {
    luaL_addstring(&b, t->name);
    if (t[1].name) luaL_addstring(&b, ", ");
  }
  luaL_addchar(&b, ')');
  luaL_pushresult(&b);
  lua_error(L);
}

/* number | "a|b|c" | {"a","b"} -> bits; raises on unknown names */
int pe_flags_from_value(lua_State *L, int idx, const char *field, uint64_t *out)
{
  const pe_bitname *t = bits_for(field);
  const char *why;
  uint64_t v = 0, bit;
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  if (lua_type(L, idx) == LUA_TSTRING) {
    size_t len;
    const char *s = lua_tolstring(L, idx, &len), *p = s, *end = s + len;
    if (pe_to_u64(L, idx, out, &why)) return 1;    /* "0x10" is a number */
    while (p < end) {
      const char *q = memchr(p, '|', (size_t)(end - p));
      const char *e = q ? q : end;
      while (p < e && isspace((unsigned char)*p)) p++;
      while (e > p && isspace((unsigned char)e[-1])) e--;
      if (!lookup_bit(t, p, (size_t)(e - p), &bit))
        unknown_bit(L, field, t, p, (size_t)(e - p));
      v |= bit;
      p = q ? q + 1 : end;
    }
    *out = v;
    return 1;
  }
  if (lua_type(L, idx) == LUA_TTABLE) {
    size_t n = pe_rawlen(L, idx), i;
    for (i = 1; i <= n; i++) {
      size_t len;
      const char *s;
      lua_rawgeti(L, idx, (int)i);
      if (lua_type(L, -1) != LUA_TSTRING)
        luaL_error(L, "%s: entry %d is a %s, expected a name", field, (int)i,
                   luaL_typename(L, -1));
      s = lua_tolstring(L, -1, &len);
      if (!lookup_bit(t, s, len, &bit)) unknown_bit(L, field, t, s, len);
      v |= bit;
      lua_pop(L, 1);
    }
    *out = v;
    return 1;
  }
  if (!pe_to_u64(L, idx, out, &why))
    luaL_error(L, "attr field '%s': %s (a number, a name list or an 'a|b' string)", field, why);
  return 1;
}

/* ---- fields (the table is abi.c's pe_attr_fields) ------------------------ */
typedef pe_fielddesc fielddesc;

/* a PMU name -> its dynamic type from sysfs; -1 if there is no such PMU */
static long pmu_type_from_sysfs(const char *name)
{
  char path[256], buf[32];
  FILE *f;
  long v = -1;
  const char *p;
  for (p = name; *p; p++)
    if (!(isalnum((unsigned char)*p) || *p == '_' || *p == '-' || *p == '.')) return -1;
  if (p == name || p - name > 100) return -1;
  snprintf(path, sizeof path, "/sys/bus/event_source/devices/%s/type", name);
  f = fopen(path, "re");
  if (!f) return -1;
  if (fgets(buf, sizeof buf, f)) {
    char *end;
    long x = strtol(buf, &end, 10);
    if (end != buf && x >= 0) v = x;
  }
  fclose(f);
  return v;
}

static const struct { const char *name; int id; } clock_names[] = {
  {"realtime", 0}, {"monotonic", 1}, {"monotonic_raw", 4}, {"boottime", 7},
  {"tai", 11}, {NULL, 0}
};

static void field_error(lua_State *L, const char *name, const char *what)
{
  luaL_error(L, "attr field '%s': %s", name, what);
}

static uint64_t field_u64(lua_State *L, int idx, const char *name)
{
  uint64_t v;
  const char *why;
  if (lua_type(L, idx) == LUA_TBOOLEAN) return (uint64_t)lua_toboolean(L, idx);
  if (!pe_to_u64(L, idx, &v, &why)) field_error(L, name, why);
  return v;
}

static void set_one(lua_State *L, const fielddesc *f, int vidx, struct pe_attr *a)
{
  unsigned char *base = (unsigned char *)a;
  uint64_t v;
  switch (f->kind) {
  case PE_K_U64:
    v = field_u64(L, vidx, f->name);
    memcpy(base + f->off, &v, 8);
    break;
  case PE_K_U32: case PE_K_U16: {
    uint64_t max = f->kind == PE_K_U32 ? 0xffffffffull : 0xffffull;
    v = field_u64(L, vidx, f->name);
    if (v > max)
      luaL_error(L, "attr field '%s': %s out of range (0-%s)", f->name,
                 lua_tostring(L, vidx) ? lua_tostring(L, vidx) : "value",
                 f->kind == PE_K_U32 ? "4294967295" : "65535");
    if (f->kind == PE_K_U32) { uint32_t x = (uint32_t)v; memcpy(base + f->off, &x, 4); }
    else { uint16_t x = (uint16_t)v; memcpy(base + f->off, &x, 2); }
    break;
  }
  case PE_K_FLAG:
    if (lua_type(L, vidx) == LUA_TBOOLEAN) v = (uint64_t)lua_toboolean(L, vidx);
    else {
      v = field_u64(L, vidx, f->name);
      if (v > 1) field_error(L, f->name, "a flag takes true/false (or 0/1)");
    }
    a->flags = (a->flags & ~((uint64_t)1 << f->bit)) | (v << f->bit);
    break;
  case PE_K_AUXBIT:
    if (lua_type(L, vidx) == LUA_TBOOLEAN) v = (uint64_t)lua_toboolean(L, vidx);
    else {
      v = field_u64(L, vidx, f->name);
      if (v > 1) field_error(L, f->name, "a flag takes true/false (or 0/1)");
    }
    a->aux_action = (a->aux_action & ~(1u << f->bit)) | ((uint32_t)v << f->bit);
    break;
  case PE_K_PRECISE:
    v = field_u64(L, vidx, f->name);
    if (v > 3) field_error(L, f->name, "must be 0-3");
    a->flags = (a->flags & ~(3ull << PE_FLAG_precise_ip)) | (v << PE_FLAG_precise_ip);
    break;
  case PE_K_BITS:
    pe_flags_from_value(L, vidx, f->name, &v);
    memcpy(base + f->off, &v, 8);
    break;
  case PE_K_TYPE:
    if (lua_type(L, vidx) == LUA_TSTRING && !lua_isnumber(L, vidx)) {
      const char *s = lua_tostring(L, vidx);
      int i;
      long t = -1;
      for (i = 0; pe_type_names[i].name; i++)
        if (strcmp(pe_type_names[i].name, s) == 0) t = pe_type_names[i].value;
      if (t < 0) t = pmu_type_from_sysfs(s);
      if (t < 0)
        luaL_error(L, "attr field 'type': unknown type or PMU '%s' (hardware, software, "
                   "tracepoint, hw_cache, raw, breakpoint, or a name under "
                   "/sys/bus/event_source/devices)", s);
      a->type = (uint32_t)t;
    } else {
      v = field_u64(L, vidx, "type");
      if (v > 0xffffffffull) field_error(L, "type", "out of range");
      a->type = (uint32_t)v;
    }
    break;
  case PE_K_BPTYPE:
    if (lua_type(L, vidx) == LUA_TSTRING && !lua_isnumber(L, vidx)) {
      const char *s = lua_tostring(L, vidx);
      uint32_t t = 0;
      for (; *s; s++) {
        char c = (char)tolower((unsigned char)*s);
        if (c == 'r') t |= PE_BP_R;
        else if (c == 'w') t |= PE_BP_W;
        else if (c == 'x') t |= PE_BP_X;
        else field_error(L, "bp_type", "use a number or a combination of r, w, x");
      }
      a->bp_type = t;
    } else {
      v = field_u64(L, vidx, "bp_type");
      if (v > 0xffffffffull) field_error(L, "bp_type", "out of range");
      a->bp_type = (uint32_t)v;
    }
    break;
  case PE_K_CLOCKID:
    if (lua_type(L, vidx) == LUA_TSTRING && !lua_isnumber(L, vidx)) {
      const char *s = lua_tostring(L, vidx);
      int i, found = 0;
      for (i = 0; clock_names[i].name; i++)
        if (strcasecmp(clock_names[i].name, s) == 0 ||
            (strncasecmp(s, "CLOCK_", 6) == 0 && strcasecmp(clock_names[i].name, s + 6) == 0)) {
          a->clockid = clock_names[i].id;
          found = 1;
        }
      if (!found)
        field_error(L, "clockid", "unknown clock (monotonic, monotonic_raw, realtime, boottime, tai, or a number)");
    } else {
      int64_t x = (int64_t)field_u64(L, vidx, "clockid");
      if (x < -2147483647 - 1 || x > 2147483647) field_error(L, "clockid", "out of range");
      a->clockid = (int32_t)x;
    }
    break;
  case PE_K_STRPTR: {
    size_t len;
    const char *s;
    if (lua_type(L, vidx) != LUA_TSTRING)
      field_error(L, f->name, "expected a string (a path or a function name)");
    s = lua_tolstring(L, vidx, &len);
    if (strlen(s) != len) field_error(L, f->name, "string contains a NUL byte");
    if (len >= 4096) field_error(L, f->name, "string too long");
    a->config1 = (uint64_t)(uintptr_t)s;  /* kept alive by the table on the stack */
    break;
  }
  }
}

void pe_attr_from_table(lua_State *L, int idx, struct pe_attr *a, int anchor)
{
  const fielddesc *seen_group[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
  int saw_freq_value = 0, saw_freq_flag = -1, saw_wm_value = 0, saw_wm_flag = -1;
  (void)anchor;
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  luaL_checktype(L, idx, LUA_TTABLE);
  memset(a, 0, sizeof *a);
  a->size = sizeof *a;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    const fielddesc *f;
    const char *name;
    if (lua_type(L, -2) != LUA_TSTRING)
      luaL_error(L, "attr: keys must be field names, got a %s key", luaL_typename(L, -2));
    name = lua_tostring(L, -2);
    f = pe_attr_field(name);
    if (!f) luaL_error(L, "unknown attr field '%s'", name);
    if (f->group) {
      const fielddesc *prev = seen_group[f->group];
      if (prev && prev != f)
        luaL_error(L, "attr fields '%s' and '%s' share storage: give only one", prev->name, f->name);
      seen_group[f->group] = f;
    }
    if (f->kind == PE_K_AUXBIT && seen_group[5])
      luaL_error(L, "attr fields 'aux_action' and '%s' overlap: give only one", f->name);
    if (strcmp(name, "sample_freq") == 0) saw_freq_value = 1;
    if (strcmp(name, "wakeup_watermark") == 0) saw_wm_value = 1;
    set_one(L, f, lua_gettop(L), a);
    if (strcmp(name, "freq") == 0) saw_freq_flag = (int)((a->flags >> PE_FLAG_freq) & 1);
    if (strcmp(name, "watermark") == 0) saw_wm_flag = (int)((a->flags >> PE_FLAG_watermark) & 1);
    lua_pop(L, 1);
  }
  if (seen_group[5]) {   /* aux_action given whole: the bit names must not be */
    lua_getfield(L, idx, "aux_start_paused");
    lua_getfield(L, idx, "aux_pause");
    lua_getfield(L, idx, "aux_resume");
    if (!lua_isnil(L, -1) || !lua_isnil(L, -2) || !lua_isnil(L, -3))
      luaL_error(L, "attr field 'aux_action' overlaps aux_start_paused/aux_pause/aux_resume: give only one");
    lua_pop(L, 3);
  }
  if (saw_freq_value) {
    if (saw_freq_flag == 0) luaL_error(L, "attr: sample_freq given with freq=false");
    a->flags |= PE_FLAG_BIT(freq);
  } else if (saw_freq_flag == 1 && seen_group[1] && strcmp(seen_group[1]->name, "sample_period") == 0) {
    luaL_error(L, "attr: freq=true with sample_period: use sample_freq");
  }
  if (saw_wm_value) {
    if (saw_wm_flag == 0) luaL_error(L, "attr: wakeup_watermark given with watermark=false");
    a->flags |= PE_FLAG_BIT(watermark);
  }
}

/* The member of a union group the attr means: the freq / watermark flags
 * and a breakpoint's type choose the name; the others are not shown. */
static int chosen(const fielddesc *f, const struct pe_attr *a)
{
  int bp = a->type == PE_TYPE_BREAKPOINT;
  switch (f->group) {
  case 1: return strcmp(f->name, (a->flags & PE_FLAG_BIT(freq)) ? "sample_freq" : "sample_period") == 0;
  case 2: return strcmp(f->name, (a->flags & PE_FLAG_BIT(watermark)) ? "wakeup_watermark"
                                                                     : "wakeup_events") == 0;
  case 3: return strcmp(f->name, bp ? "bp_addr" : "config1") == 0;
  case 4: return strcmp(f->name, bp ? "bp_len" : "config2") == 0;
  default: return 1;
  }
}

/* The attr as a table: every field of the field table with a non-zero
 * value, by the name its union group means (see chosen); type, size and
 * config always, a breakpoint's bp_type/bp_addr/bp_len always, clockid
 * whenever use_clockid is set. */
void pe_attr_to_table(lua_State *L, const struct pe_attr *a)
{
  const fielddesc *f;
  const unsigned char *base = (const unsigned char *)a;
  int bp = a->type == PE_TYPE_BREAKPOINT;
  lua_createtable(L, 0, 16);
  for (f = pe_attr_fields; f->name; f++) {
    uint64_t v = 0;
    int always = f->off == offsetof(struct pe_attr, type) || f->off == offsetof(struct pe_attr, size) ||
                 f->off == offsetof(struct pe_attr, config);
    if (f->kind == PE_K_STRPTR || f->kind == PE_K_AUXBIT || !chosen(f, a)) continue;
    if (f->group == 3 || f->group == 4 || f->kind == PE_K_BPTYPE) always = always || bp;
    switch (f->kind) {
    case PE_K_FLAG:
      if ((a->flags >> f->bit) & 1) { lua_pushboolean(L, 1); lua_setfield(L, -2, f->name); }
      continue;
    case PE_K_PRECISE:
      v = (a->flags >> f->bit) & 3;
      break;
    case PE_K_CLOCKID:
      if (a->clockid || (a->flags & PE_FLAG_BIT(use_clockid))) {
        lua_pushinteger(L, a->clockid);
        lua_setfield(L, -2, f->name);
      }
      continue;
    default:
      if (f->size == 8) memcpy(&v, base + f->off, 8);
      else if (f->size == 4) { uint32_t x; memcpy(&x, base + f->off, 4); v = x; }
      else if (f->size == 2) { uint16_t x; memcpy(&x, base + f->off, 2); v = x; }
      break;
    }
    if (v || always) {
      pe_push_u64(L, v);
      lua_setfield(L, -2, f->name);
    }
  }
}

/* core.attr_encode(tbl) -> 136-byte string (used by tests and tooling) */
int pe_l_attr_encode(lua_State *L)
{
  struct pe_attr a;
  pe_attr_from_table(L, 1, &a, 0);
  lua_pushlstring(L, (const char *)&a, sizeof a);
  return 1;
}

/* core.attr_decode(bytes) -> table */
int pe_l_attr_decode(lua_State *L)
{
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  struct pe_attr a;
  memset(&a, 0, sizeof a);
  memcpy(&a, s, len < sizeof a ? len : sizeof a);
  pe_attr_to_table(L, &a);
  return 1;
}

/* core.bits(field, value) -> number: resolves a sample_type/read_format/
 * branch_sample_type spec; core.bits(field) -> table of name -> bit */
int pe_l_bits(lua_State *L)
{
  const char *field = luaL_checkstring(L, 1);
  const pe_bitname *t = bits_for(field);
  uint64_t v;
  if (!t) return luaL_argerror(L, 1, "sample_type, read_format or branch_sample_type");
  if (lua_isnoneornil(L, 2)) {
    lua_newtable(L);
    for (; t->name; t++) {
      pe_push_u64(L, t->bit);
      lua_setfield(L, -2, t->name);
    }
    return 1;
  }
  pe_flags_from_value(L, 2, field, &v);
  pe_push_u64(L, v);
  return 1;
}
