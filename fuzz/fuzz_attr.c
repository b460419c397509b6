/*
 * fuzz_attr.c - libFuzzer target for the attr encoder, pe_attr_from_table
 * (csrc/attr.c), through core.attr_encode on a Lua table built from the
 * fuzz bytes, and the decoder pe_attr_to_table (core.attr_decode).
 *
 * Input: a little program.  Each entry takes a key byte (below the number
 * of names: an attr field name, a bit name or a near miss; otherwise a
 * string, integer or boolean key from the bytes) and a value byte choosing
 * an integer, a double (NaN, inf, fractions), a string (names, "a|b"
 * lists, decimal/hex numbers, raw bytes with NULs), a boolean, a table of
 * names, a nested table or a function.
 * Properties: encoding either raises a Lua error with a string message or
 * returns 136 bytes; for those, decode(encoded) re-encodes to the very same
 * bytes (the two directions agree on every field and flag); and
 * attr_decode never raises on any 136-byte string.
 */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static lua_State *L;

static const char *const names[] = {
  "type", "size", "config", "sample_period", "sample_freq", "sample_type",
  "read_format", "disabled", "inherit", "pinned", "exclusive", "exclude_user",
  "exclude_kernel", "exclude_hv", "exclude_idle", "mmap", "comm", "freq",
  "inherit_stat", "enable_on_exec", "task", "watermark", "precise_ip",
  "mmap_data", "sample_id_all", "exclude_host", "exclude_guest",
  "exclude_callchain_kernel", "exclude_callchain_user", "mmap2", "comm_exec",
  "use_clockid", "context_switch", "write_backward", "namespaces", "ksymbol",
  "bpf_event", "aux_output", "cgroup", "text_poke", "build_id",
  "inherit_thread", "remove_on_exec", "sigtrap", "wakeup_events",
  "wakeup_watermark", "bp_type", "config1", "bp_addr", "kprobe_func",
  "uprobe_path", "config2", "bp_len", "kprobe_addr", "probe_offset",
  "branch_sample_type", "sample_regs_user", "sample_stack_user", "clockid",
  "sample_regs_intr", "aux_watermark", "sample_max_stack", "aux_sample_size",
  "aux_action", "aux_start_paused", "aux_pause", "aux_resume", "sig_data",
  "config3",
  /* values and near misses */
  "ip", "tid", "time", "callchain", "raw", "id", "group", "lost",
  "total_time_enabled", "PERF_SAMPLE_IP", "perf_format_id", "any_call",
  "hw_index", "plm_all", "counters", "software", "tracepoint", "breakpoint",
  "hardware", "msr", "uprobe", "kprobe", "rw", "x", "rwx", "monotonic",
  "CLOCK_TAI", "boottime", "ip|tid|time", "ip | bogus", "|", "", " ",
  "0x10", "-1", "18446744073709551615", "18446744073709551616", "0x1p3",
  "1ULL", "12LL", "nan", "inf", "sample_typ", "Type", "../../x"
};
#define NNAMES (sizeof names / sizeof names[0])
#define NFIELDS 69   /* the attr field names come first */

static void push_value(fz *f, int depth);

static void push_string(fz *f)
{
  uint8_t k = fz_u8(f);
  if (k < NNAMES) { lua_pushstring(L, names[k]); return; }
  {
    size_t n = (size_t)(k - NNAMES) % 40;
    if (n > fz_left(f)) n = fz_left(f);
    lua_pushlstring(L, (const char *)f->p + f->pos, n);
    f->pos += n;
  }
}

static void push_table(fz *f, int depth)
{
  int n = fz_u8(f) % 8, i;
  lua_createtable(L, n, 0);
  for (i = 1; i <= n; i++) {
    if (depth < 3 && fz_u8(f) % 4 == 0) push_value(f, depth + 1);
    else push_string(f);
    lua_rawseti(L, -2, i);
  }
}

static void push_value(fz *f, int depth)
{
  uint8_t k = fz_u8(f);
  switch (k % 9) {
  case 0: lua_pushinteger(L, (lua_Integer)fz_u64(f)); break;
  case 1: lua_pushinteger(L, (lua_Integer)(int8_t)fz_u8(f)); break;
  case 2: { uint64_t b = fz_u64(f); double d; memcpy(&d, &b, 8); lua_pushnumber(L, d); break; }
  case 3: lua_pushnumber(L, (double)(int8_t)fz_u8(f) / 4.0); break;
  case 4: push_string(f); break;
  case 5: lua_pushboolean(L, k & 0x10); break;
  case 6: push_table(f, depth); break;
  case 7: lua_pushfstring(L, "0x%s%d", (k & 0x10) ? "ffffffff" : "", (int)fz_u8(f)); break;
  default: lua_pushcfunction(L, luaopen_perf_event_core); break;
  }
}

static void push_key(fz *f)
{
  uint8_t k = fz_u8(f);
  if (k < 200) { lua_pushstring(L, names[k % NFIELDS]); return; }   /* the field names */
  switch (k % 4) {
  case 0: lua_pushinteger(L, (lua_Integer)fz_u8(f)); break;
  case 1: lua_pushboolean(L, 1); break;
  default: push_string(f); break;
  }
}

static int build(lua_State *l)
{
  fz *f = (fz *)lua_touserdata(l, 1);
  int n = 0;
  (void)l;
  lua_newtable(L);
  while (fz_left(f) && n++ < 40) {
    push_key(f);
    push_value(f, 0);
    if (lua_isnil(L, -2)) lua_pop(L, 2);
    else lua_rawset(L, -3);
  }
  return 1;
}

static const char check[] =
  "local t = ...\n"
  "local ok, enc = pcall(core.attr_encode, t)\n"
  "if not ok then\n"
  "  assert(type(enc) == 'string', 'encoder raised a non-string')\n"
  "  return false\n"
  "end\n"
  "assert(type(enc) == 'string' and #enc == 136, 'encoding is not 136 bytes')\n"
  "local dec = core.attr_decode(enc)\n"
  "local ok2, enc2 = pcall(core.attr_encode, dec)\n"
  "if not ok2 then error('decoded attr does not re-encode: ' .. tostring(enc2)) end\n"
  "if enc2 ~= enc then error('round trip changed the bytes') end\n"
  "return true\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  fz f = { data, size, 0 };
  if (!L) L = fz_lua();
  lua_settop(L, 0);
  if (size >= 1 && data[0] == 0xa7) {
    /* a raw 136-byte struct for the decoder alone */
    char raw[136];
    memset(raw, 0, sizeof raw);
    memcpy(raw, data + 1, size - 1 < sizeof raw ? size - 1 : sizeof raw);
    lua_getglobal(L, "core");
    lua_getfield(L, -1, "attr_decode");
    lua_pushlstring(L, raw, sizeof raw);
    if (lua_pcall(L, 1, 1, 0) != 0) FZ_ASSERT(0, "attr_decode raised: %s", lua_tostring(L, -1));
    lua_settop(L, 0);
    return 0;
  }
  lua_pushcfunction(L, build);
  lua_pushlightuserdata(L, &f);
  if (lua_pcall(L, 1, 1, 0) != 0) FZ_ASSERT(0, "building the table raised: %s", lua_tostring(L, -1));
  if (luaL_loadbuffer(L, check, sizeof check - 1, "=check") != 0) abort();
  lua_insert(L, -2);
  if (lua_pcall(L, 1, 1, 0) != 0) FZ_ASSERT(0, "%s", lua_tostring(L, -1));
  lua_settop(L, 0);
  lua_gc(L, LUA_GCSTEP, 0);
  return 0;
}
