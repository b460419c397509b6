/*
 * records.c - decoding of perf records into Lua tables (doc/coverage.md E).
 *
 * Owns: pe_decode_record (every record type of E7-E19f, the sample_id_all
 * trailer of E4/E5, every sample_type bit of E20-E35 in the kernel's
 * order) and core.decode_record for synthetic buffers.  Every read goes
 * through a bounds-checked cursor over (pointer, length): a record that is
 * too short for what its header and sample_type promise is an error, never
 * a read past its end.  The code takes no state besides its arguments, so a
 * fuzzer can drive it directly.
 */
#include <stdio.h>
#include <string.h>
#include "pe_records.h"

/* ---- bounds-checked cursor --------------------------------------------- */
typedef struct cur {
  const unsigned char *p;
  size_t pos, end;
  const char *err;
} cur;

static int need(cur *c, size_t n)
{
  if (c->err) return 0;
  if (n > c->end - c->pos) { c->err = "record truncated"; return 0; }
  return 1;
}

static uint64_t g64(cur *c)
{
  uint64_t v = 0;
  if (need(c, 8)) { memcpy(&v, c->p + c->pos, 8); c->pos += 8; }
  return v;
}

static uint32_t g32(cur *c)
{
  uint32_t v = 0;
  if (need(c, 4)) { memcpy(&v, c->p + c->pos, 4); c->pos += 4; }
  return v;
}

static uint16_t g16(cur *c)
{
  uint16_t v = 0;
  if (need(c, 2)) { memcpy(&v, c->p + c->pos, 2); c->pos += 2; }
  return v;
}

/* ---- table setters (the record table is on top) ------------------------ */
static void set_u64(lua_State *L, const char *k, uint64_t v)
{
  pe_push_u64(L, v);
  lua_setfield(L, -2, k);
}

static void set_int(lua_State *L, const char *k, lua_Integer v)
{
  lua_pushinteger(L, v);
  lua_setfield(L, -2, k);
}

static void set_bool(lua_State *L, const char *k, int v)
{
  lua_pushboolean(L, v);
  lua_setfield(L, -2, k);
}

static void set_bytes(lua_State *L, const char *k, cur *c, size_t n)
{
  if (!need(c, n)) return;
  lua_pushlstring(L, (const char *)c->p + c->pos, n);
  lua_setfield(L, -2, k);
  c->pos += n;
}

/* a NUL-padded string that runs to the end of the body */
static void set_cstr(lua_State *L, const char *k, cur *c)
{
  size_t n = c->end - c->pos, len = 0;
  while (len < n && c->p[c->pos + len]) len++;
  lua_pushlstring(L, (const char *)c->p + c->pos, len);
  lua_setfield(L, -2, k);
  c->pos = c->end;
}

static void set_hex(lua_State *L, const char *k, const unsigned char *b, size_t n)
{
  static const char hx[] = "0123456789abcdef";
  char buf[64];
  size_t i;
  if (n > 32) n = 32;
  for (i = 0; i < n; i++) { buf[2 * i] = hx[b[i] >> 4]; buf[2 * i + 1] = hx[b[i] & 15]; }
  lua_pushlstring(L, buf, 2 * n);
  lua_setfield(L, -2, k);
}

/* ---- names ------------------------------------------------------------- */
/* record type names: pe_record_type_name (abi.c) */

typedef struct { uint64_t bit; const char *name; } flagname;

/* "a|b|c" of the bits set in v; "" when none */
static void push_flags(lua_State *L, uint64_t v, const flagname *t)
{
  luaL_Buffer b;
  int first = 1;
  luaL_buffinit(L, &b);
  for (; t->name; t++) {
    if (v & t->bit) {
      if (!first) luaL_addchar(&b, '|');
      luaL_addstring(&b, t->name);
      first = 0;
    }
  }
  luaL_pushresult(&b);
}

/* data_src parts (E33) */
static const flagname mem_op[] = {
  {1, "na"}, {2, "load"}, {4, "store"}, {8, "pfetch"}, {0x10, "exec"}, {0, NULL}
};
static const flagname mem_lvl[] = {
  {1, "na"}, {2, "hit"}, {4, "miss"}, {8, "l1"}, {0x10, "lfb"}, {0x20, "l2"},
  {0x40, "l3"}, {0x80, "loc_ram"}, {0x100, "rem_ram1"}, {0x200, "rem_ram2"},
  {0x400, "rem_cce1"}, {0x800, "rem_cce2"}, {0x1000, "io"}, {0x2000, "unc"},
  {0, NULL}
};
static const flagname mem_snoop[] = {
  {1, "na"}, {2, "none"}, {4, "hit"}, {8, "miss"}, {0x10, "hitm"}, {0, NULL}
};
static const flagname mem_lock[] = { {1, "na"}, {2, "locked"}, {0, NULL} };
static const flagname mem_tlb[] = {
  {1, "na"}, {2, "hit"}, {4, "miss"}, {8, "l1"}, {0x10, "l2"}, {0x20, "wk"},
  {0x40, "os"}, {0, NULL}
};
static const flagname mem_snoopx[] = { {1, "fwd"}, {2, "peer"}, {0, NULL} };
static const flagname mem_blk[] = { {1, "na"}, {2, "data"}, {4, "addr"}, {0, NULL} };
static const char *const mem_lvlnum[16] = {
  NULL, "l1", "l2", "l3", "l4", "l2_mhb", "msc", NULL, "unc", "cxl", "io",
  "any_cache", "lfb", "ram", "pmem", "na"
};

static void push_data_src(lua_State *L, uint64_t v)
{
  uint64_t op = v & 0x1f, lvl = (v >> 5) & 0x3fff, snoop = (v >> 19) & 0x1f;
  uint64_t lock = (v >> 24) & 3, dtlb = (v >> 26) & 0x7f, lvl_num = (v >> 33) & 0xf;
  uint64_t remote = (v >> 37) & 1, snoopx = (v >> 38) & 3, blk = (v >> 40) & 7;
  uint64_t hops = (v >> 43) & 7;
  lua_createtable(L, 0, 20);
  set_u64(L, "value", v);
  set_int(L, "op", (lua_Integer)op);
  push_flags(L, op, mem_op); lua_setfield(L, -2, "op_names");
  set_int(L, "lvl", (lua_Integer)lvl);
  push_flags(L, lvl, mem_lvl); lua_setfield(L, -2, "lvl_names");
  set_int(L, "snoop", (lua_Integer)snoop);
  push_flags(L, snoop, mem_snoop); lua_setfield(L, -2, "snoop_names");
  set_int(L, "lock", (lua_Integer)lock);
  push_flags(L, lock, mem_lock); lua_setfield(L, -2, "lock_names");
  set_int(L, "dtlb", (lua_Integer)dtlb);
  push_flags(L, dtlb, mem_tlb); lua_setfield(L, -2, "dtlb_names");
  set_int(L, "lvl_num", (lua_Integer)lvl_num);
  if (mem_lvlnum[lvl_num]) { lua_pushstring(L, mem_lvlnum[lvl_num]); lua_setfield(L, -2, "lvl_num_name"); }
  set_bool(L, "remote", (int)remote);
  set_int(L, "snoopx", (lua_Integer)snoopx);
  push_flags(L, snoopx, mem_snoopx); lua_setfield(L, -2, "snoopx_names");
  set_int(L, "blk", (lua_Integer)blk);
  push_flags(L, blk, mem_blk); lua_setfield(L, -2, "blk_names");
  set_int(L, "hops", (lua_Integer)hops);
}

/* transaction (E34) */
static void push_txn(lua_State *L, uint64_t v)
{
  lua_createtable(L, 0, 10);
  set_u64(L, "value", v);
  set_bool(L, "elision", (v & 1) != 0);
  set_bool(L, "transaction", (v & 2) != 0);
  set_bool(L, "sync", (v & 4) != 0);
  set_bool(L, "async", (v & 8) != 0);
  set_bool(L, "retry", (v & 0x10) != 0);
  set_bool(L, "conflict", (v & 0x20) != 0);
  set_bool(L, "capacity_write", (v & 0x40) != 0);
  set_bool(L, "capacity_read", (v & 0x80) != 0);
  set_int(L, "abort_code", (lua_Integer)(v >> 32));
}

/* register names by bit of the sample_regs_* mask (asm/perf_regs.h) */
static void reg_name(char *buf, size_t len, int bit)
{
#if defined(__x86_64__) || defined(__i386__)
  static const char *const x86[24] = {
    "ax", "bx", "cx", "dx", "si", "di", "bp", "sp", "ip", "flags", "cs", "ss",
    "ds", "es", "fs", "gs", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15"
  };
  if (bit < 24) { snprintf(buf, len, "%s", x86[bit]); return; }
  if (bit >= 32) { snprintf(buf, len, "xmm%d%s", (bit - 32) / 2, (bit & 1) ? "_hi" : ""); return; }
#elif defined(__aarch64__)
  if (bit < 31) { snprintf(buf, len, "x%d", bit); return; }
  if (bit == 31) { snprintf(buf, len, "sp"); return; }
  if (bit == 32) { snprintf(buf, len, "pc"); return; }
#endif
  snprintf(buf, len, "r%d", bit);
}

static void push_regs(lua_State *L, cur *c, uint64_t mask)
{
  uint64_t abi = g64(c);
  int bit;
  lua_createtable(L, 0, 4);
  set_u64(L, "abi", abi);
  set_u64(L, "mask", mask);
  if (abi == PE_SAMPLE_REGS_ABI_NONE) return;    /* E30: no regs follow */
  if ((size_t)__builtin_popcountll(mask) * 8 > c->end - c->pos) {
    c->err = "record truncated in regs";
    return;
  }
  for (bit = 0; bit < 64; bit++) {
    if (mask & ((uint64_t)1 << bit)) {
      char name[16];
      reg_name(name, sizeof name, bit);
      set_u64(L, name, g64(c));
    }
  }
}

/* u64 nr; u64 ips[nr] -> array, markers as context names (E26) */
static void push_callchain(lua_State *L, cur *c)
{
  uint64_t nr = g64(c), i;
  if (c->err) return;
  if (nr > (c->end - c->pos) / 8) { c->err = "callchain nr exceeds the record"; return; }
  lua_createtable(L, (int)nr, 0);
  for (i = 0; i < nr; i++) {
    uint64_t ip = g64(c);
    if (ip >= PE_CONTEXT_MAX) lua_pushstring(L, pe_context_name(ip));
    else pe_push_u64(L, ip);
    lua_rawseti(L, -2, (int)i + 1);
  }
}

/* branch stack (E28, E29) */
static void push_branches(lua_State *L, cur *c, uint64_t bst)
{
  uint64_t bnr = g64(c), i, hw_idx = 0;
  size_t per = 24 + ((bst & PE_SAMPLE_BRANCH_COUNTERS) ? 8 : 0);
  size_t cpos;
  if (bst & PE_SAMPLE_BRANCH_HW_INDEX) hw_idx = g64(c);
  if (c->err) return;
  if (bnr > (c->end - c->pos) / per) { c->err = "branch stack nr exceeds the record"; return; }
  lua_createtable(L, (int)bnr, 1);
  if (bst & PE_SAMPLE_BRANCH_HW_INDEX) set_u64(L, "hw_idx", hw_idx);
  cpos = c->pos + (size_t)bnr * 24;      /* counters[] follow the entries */
  for (i = 0; i < bnr; i++) {
    uint64_t from = g64(c), to = g64(c), f = g64(c);
    lua_createtable(L, 0, 12);
    set_u64(L, "from", from);
    set_u64(L, "to", to);
    set_bool(L, "mispred", (int)(f & 1));
    set_bool(L, "predicted", (int)((f >> 1) & 1));
    set_bool(L, "in_tx", (int)((f >> 2) & 1));
    set_bool(L, "abort", (int)((f >> 3) & 1));
    set_int(L, "cycles", (lua_Integer)((f >> 4) & 0xffff));
    set_int(L, "type", (lua_Integer)((f >> 20) & 0xf));
    set_int(L, "spec", (lua_Integer)((f >> 24) & 3));
    set_int(L, "new_type", (lua_Integer)((f >> 26) & 0xf));
    set_int(L, "priv", (lua_Integer)((f >> 30) & 7));
    if (bst & PE_SAMPLE_BRANCH_COUNTERS) {
      uint64_t cnt;
      memcpy(&cnt, c->p + cpos + (size_t)i * 8, 8);   /* in bounds: checked above */
      set_u64(L, "counters", cnt);
    }
    lua_rawseti(L, -2, (int)i + 1);
  }
  if (bst & PE_SAMPLE_BRANCH_COUNTERS) c->pos += (size_t)bnr * 8;
}

/* read_format blob (C1/C2) -> table; advances the cursor */
static void push_read(lua_State *L, cur *c, uint64_t rf)
{
  pe_readval vals[256];
  pe_reading r;
  long n;
  if (c->err) return;
  r.v = vals;
  r.cap = 256;
  n = pe_readfmt_decode(c->p + c->pos, c->end - c->pos, rf, &r);
  if (n < 0) { c->err = "record truncated in read_format values"; return; }
  if (r.nr_total > r.cap) { c->err = "read_format group larger than 256 members"; return; }
  pe_push_reading(L, &r, rf);
  c->pos += (size_t)n;
}

size_t pe_sample_id_size(uint64_t st)
{
  size_t n = 0;
  if (st & PE_SAMPLE_TID) n += 8;
  if (st & PE_SAMPLE_TIME) n += 8;
  if (st & PE_SAMPLE_ID) n += 8;
  if (st & PE_SAMPLE_STREAM_ID) n += 8;
  if (st & PE_SAMPLE_CPU) n += 8;
  if (st & PE_SAMPLE_IDENTIFIER) n += 8;
  return n;
}

/* is k already set in the record table? (body fields win over the trailer) */
static int has(lua_State *L, const char *k)
{
  int r;
  lua_getfield(L, -1, k);
  r = !lua_isnil(L, -1);
  lua_pop(L, 1);
  return r;
}

static void set_u64_once(lua_State *L, const char *k, uint64_t v)
{
  if (!has(L, k)) set_u64(L, k, v);
}

/* the sample_id trailer (E4) at c's position */
static void decode_trailer(lua_State *L, cur *c, uint64_t st)
{
  if (st & PE_SAMPLE_TID) {
    uint32_t pid = g32(c), tid = g32(c);
    set_u64_once(L, "pid", pid);
    set_u64_once(L, "tid", tid);
  }
  if (st & PE_SAMPLE_TIME) set_u64_once(L, "time", g64(c));
  if (st & PE_SAMPLE_ID) set_u64_once(L, "id", g64(c));
  if (st & PE_SAMPLE_STREAM_ID) set_u64_once(L, "stream_id", g64(c));
  if (st & PE_SAMPLE_CPU) { set_u64_once(L, "cpu", g32(c)); (void)g32(c); }
  if (st & PE_SAMPLE_IDENTIFIER) set_u64_once(L, "identifier", g64(c));
}

/* PERF_RECORD_SAMPLE body (E20), fields in the kernel's order */
static void decode_sample(lua_State *L, cur *c, const pe_decode_cfg *cfg)
{
  uint64_t st = cfg->sample_type;
  if (st & PE_SAMPLE_IDENTIFIER) set_u64(L, "id", g64(c));
  if (st & PE_SAMPLE_IP) set_u64(L, "ip", g64(c));
  if (st & PE_SAMPLE_TID) {
    uint32_t pid = g32(c), tid = g32(c);
    set_int(L, "pid", pid);
    set_int(L, "tid", tid);
  }
  if (st & PE_SAMPLE_TIME) set_u64(L, "time", g64(c));
  if (st & PE_SAMPLE_ADDR) set_u64(L, "addr", g64(c));
  if (st & PE_SAMPLE_ID) set_u64(L, "id", g64(c));
  if (st & PE_SAMPLE_STREAM_ID) set_u64(L, "stream_id", g64(c));
  if (st & PE_SAMPLE_CPU) { set_int(L, "cpu", g32(c)); (void)g32(c); }
  if (st & PE_SAMPLE_PERIOD) set_u64(L, "period", g64(c));
  if (c->err) return;
  if (st & PE_SAMPLE_READ) {
    push_read(L, c, cfg->read_format);
    if (c->err) return;
    lua_setfield(L, -2, "read");
  }
  if (st & PE_SAMPLE_CALLCHAIN) {
    push_callchain(L, c);
    if (c->err) return;
    lua_setfield(L, -2, "callchain");
  }
  if (st & PE_SAMPLE_RAW) {
    uint32_t size = g32(c);
    set_bytes(L, "raw", c, size);
  }
  if (c->err) return;
  if (st & PE_SAMPLE_BRANCH_STACK) {
    push_branches(L, c, cfg->branch_sample_type);
    if (c->err) return;
    lua_setfield(L, -2, "branch_stack");
  }
  if (st & PE_SAMPLE_REGS_USER) {
    push_regs(L, c, cfg->regs_user);
    if (c->err) return;
    lua_setfield(L, -2, "regs_user");
  }
  if (st & PE_SAMPLE_STACK_USER) {
    uint64_t size = g64(c);
    if (c->err) return;
    if (size > c->end - c->pos) { c->err = "stack_user size exceeds the record"; return; }
    lua_createtable(L, 0, 3);
    set_u64(L, "size", size);
    set_bytes(L, "data", c, (size_t)size);
    if (size) {
      uint64_t dyn = g64(c);
      set_u64(L, "dyn_size", dyn);
      if (!c->err && dyn > size) c->err = "stack_user dyn_size larger than size";
    } else {
      set_u64(L, "dyn_size", 0);
    }
    if (c->err) return;
    lua_setfield(L, -2, "stack_user");
  }
  if (st & PE_SAMPLE_WEIGHT) set_u64(L, "weight", g64(c));
  if (st & PE_SAMPLE_WEIGHT_STRUCT) {
    uint32_t var1 = g32(c);
    uint16_t var2 = g16(c), var3 = g16(c);
    lua_createtable(L, 0, 3);
    set_int(L, "var1_dw", var1);
    set_int(L, "var2_w", var2);
    set_int(L, "var3_w", var3);
    lua_setfield(L, -2, "weight_struct");
    set_int(L, "weight", var1);
  }
  if (st & PE_SAMPLE_DATA_SRC) {
    uint64_t v = g64(c);
    push_data_src(L, v);
    lua_setfield(L, -2, "data_src");
  }
  if (st & PE_SAMPLE_TRANSACTION) {
    uint64_t v = g64(c);
    push_txn(L, v);
    lua_setfield(L, -2, "transaction");
  }
  if (c->err) return;
  if (st & PE_SAMPLE_REGS_INTR) {
    push_regs(L, c, cfg->regs_intr);
    if (c->err) return;
    lua_setfield(L, -2, "regs_intr");
  }
  if (st & PE_SAMPLE_PHYS_ADDR) set_u64(L, "phys_addr", g64(c));
  if (st & PE_SAMPLE_CGROUP) set_u64(L, "cgroup", g64(c));
  if (st & PE_SAMPLE_DATA_PAGE_SIZE) set_u64(L, "data_page_size", g64(c));
  if (st & PE_SAMPLE_CODE_PAGE_SIZE) set_u64(L, "code_page_size", g64(c));
  if (st & PE_SAMPLE_AUX) {
    uint64_t size = g64(c);
    if (c->err) return;
    if (size > c->end - c->pos) { c->err = "aux size exceeds the record"; return; }
    set_bytes(L, "aux", c, (size_t)size);
  }
  if (!c->err && c->pos != c->end)
    c->err = "sample is longer than its sample_type describes (sample_type differs "
             "from the event's?)";
}

static const char *const ns_names[] = {
  "net", "uts", "ipc", "pid", "user", "mnt", "cgroup"
};

/* MMAP and MMAP2: the mapping, MMAP2's inode or build-id form */
static void decode_mmap(lua_State *L, cur *c, uint32_t type, unsigned misc)
{
  set_int(L, "pid", g32(c));
  set_int(L, "tid", g32(c));
  set_u64(L, "addr", g64(c));
  set_u64(L, "len", g64(c));
  set_u64(L, "pgoff", g64(c));
  if (type == PE_RECORD_MMAP2) {
    if (misc & PE_RECORD_MISC_MMAP_BUILD_ID) {
      unsigned n;
      if (!need(c, 24)) return;
      n = c->p[c->pos];
      if (n > 20) { c->err = "mmap2 build_id_size > 20"; return; }
      set_hex(L, "build_id", c->p + c->pos + 4, n);
      c->pos += 24;
    } else {
      set_int(L, "maj", g32(c));
      set_int(L, "min", g32(c));
      set_u64(L, "ino", g64(c));
      set_u64(L, "ino_generation", g64(c));
    }
    set_int(L, "prot", g32(c));
    set_int(L, "flags", g32(c));
  }
  if (c->err) return;
  set_bool(L, "data", (misc & PE_RECORD_MISC_MMAP_DATA) != 0);
  set_cstr(L, "filename", c);
}

/* NAMESPACES: pid, tid and each namespace's dev and inode, by index and by
 * name (the kernel's order) */
static void decode_namespaces(lua_State *L, cur *c)
{
  uint64_t nr, i;
  set_int(L, "pid", g32(c));
  set_int(L, "tid", g32(c));
  nr = g64(c);
  if (c->err) return;
  if (nr > (c->end - c->pos) / 16) { c->err = "namespaces nr exceeds the record"; return; }
  set_u64(L, "nr_namespaces", nr);
  lua_createtable(L, (int)nr, 7);
  for (i = 0; i < nr; i++) {
    uint64_t dev = g64(c), ino = g64(c);
    lua_createtable(L, 0, 2);
    set_u64(L, "dev", dev);
    set_u64(L, "inode", ino);
    if (i < 7) { lua_pushvalue(L, -1); lua_setfield(L, -3, ns_names[i]); }
    lua_rawseti(L, -2, (int)i + 1);
  }
  lua_setfield(L, -2, "namespaces");
}

/* the body of a non-SAMPLE record, c covering the body only */
static void decode_other(lua_State *L, cur *c, uint32_t type, unsigned misc,
                         const pe_decode_cfg *cfg)
{
  switch (type) {
  case PE_RECORD_MMAP:
  case PE_RECORD_MMAP2:
    decode_mmap(L, c, type, misc);
    break;
  case PE_RECORD_LOST:
    set_u64(L, "id", g64(c));
    set_u64(L, "lost", g64(c));
    break;
  case PE_RECORD_COMM:
    set_int(L, "pid", g32(c));
    set_int(L, "tid", g32(c));
    if (c->err) break;
    set_bool(L, "exec", (misc & PE_RECORD_MISC_COMM_EXEC) != 0);
    set_cstr(L, "comm", c);
    break;
  case PE_RECORD_EXIT:
  case PE_RECORD_FORK:
    set_int(L, "pid", g32(c));
    set_int(L, "ppid", g32(c));
    set_int(L, "tid", g32(c));
    set_int(L, "ptid", g32(c));
    set_u64(L, "time", g64(c));
    break;
  case PE_RECORD_THROTTLE:
  case PE_RECORD_UNTHROTTLE:
    set_u64(L, "time", g64(c));
    set_u64(L, "id", g64(c));
    set_u64(L, "stream_id", g64(c));
    break;
  case PE_RECORD_READ:
    set_int(L, "pid", g32(c));
    set_int(L, "tid", g32(c));
    push_read(L, c, cfg->read_format);
    if (c->err) break;
    lua_setfield(L, -2, "values");
    break;
  case PE_RECORD_AUX: {
    uint64_t flags;
    set_u64(L, "aux_offset", g64(c));
    set_u64(L, "aux_size", g64(c));
    flags = g64(c);
    set_u64(L, "flags", flags);
    set_bool(L, "truncated", (flags & 1) != 0);
    set_bool(L, "overwrite", (flags & 2) != 0);
    set_bool(L, "partial", (flags & 4) != 0);
    set_bool(L, "collision", (flags & 8) != 0);
    set_int(L, "pmu_format_type", (lua_Integer)((flags >> 8) & 0xff));
    break;
  }
  case PE_RECORD_ITRACE_START:
    set_int(L, "pid", g32(c));
    set_int(L, "tid", g32(c));
    break;
  case PE_RECORD_LOST_SAMPLES:
    set_u64(L, "lost", g64(c));
    break;
  case PE_RECORD_SWITCH:
  case PE_RECORD_SWITCH_CPU_WIDE:
    if (type == PE_RECORD_SWITCH_CPU_WIDE) {
      set_int(L, "next_prev_pid", g32(c));
      set_int(L, "next_prev_tid", g32(c));
    }
    set_bool(L, "out", (misc & PE_RECORD_MISC_SWITCH_OUT) != 0);
    set_bool(L, "preempt", (misc & PE_RECORD_MISC_SWITCH_OUT_PREEMPT) != 0);
    break;
  case PE_RECORD_NAMESPACES:
    decode_namespaces(L, c);
    break;
  case PE_RECORD_KSYMBOL: {
    uint16_t flags;
    set_u64(L, "addr", g64(c));
    set_int(L, "len", g32(c));
    set_int(L, "ksym_type", g16(c));
    flags = g16(c);
    set_int(L, "flags", flags);
    if (c->err) break;
    set_bool(L, "unregister", flags & 1);
    set_cstr(L, "name", c);
    break;
  }
  case PE_RECORD_BPF_EVENT:
    set_int(L, "bpf_type", g16(c));
    set_int(L, "flags", g16(c));
    set_int(L, "id", g32(c));
    if (!need(c, 8)) break;
    set_hex(L, "tag", c->p + c->pos, 8);
    c->pos += 8;
    break;
  case PE_RECORD_CGROUP:
    set_u64(L, "id", g64(c));
    if (c->err) break;
    set_cstr(L, "path", c);
    break;
  case PE_RECORD_TEXT_POKE: {
    uint16_t old_len, new_len;
    set_u64(L, "addr", g64(c));
    old_len = g16(c);
    new_len = g16(c);
    set_int(L, "old_len", old_len);
    set_int(L, "new_len", new_len);
    set_bytes(L, "old_bytes", c, old_len);
    set_bytes(L, "new_bytes", c, new_len);
    c->pos = c->err ? c->pos : c->end;     /* padding */
    break;
  }
  case PE_RECORD_AUX_OUTPUT_HW_ID:
    set_u64(L, "hw_id", g64(c));
    break;
  case PE_RECORD_CALLCHAIN_DEFERRED:
    set_u64(L, "cookie", g64(c));
    push_callchain(L, c);
    if (c->err) break;
    lua_setfield(L, -2, "callchain");
    break;
  default:   /* unknown: the body as bytes, skipped by size (E19f) */
    set_bytes(L, "data", c, c->end - c->pos);
    break;
  }
}

void pe_decode_cfg_from_attr(pe_decode_cfg *c, const struct pe_attr *a)
{
  c->sample_type = a->sample_type;
  c->read_format = a->read_format;
  c->branch_sample_type = a->branch_sample_type;
  c->regs_user = a->sample_regs_user;
  c->regs_intr = a->sample_regs_intr;
  c->sample_id_all = (int)((a->flags >> PE_FLAG_sample_id_all) & 1);
}

int pe_decode_record(lua_State *L, const unsigned char *rec, size_t len,
                     const pe_decode_cfg *cfg)
{
  struct pe_event_header h;
  const char *name;
  cur c;
  int top = lua_gettop(L);
  if (len < sizeof h) {
    lua_pushfstring(L, "record of %d bytes is shorter than its header", (int)len);
    return 0;
  }
  memcpy(&h, rec, sizeof h);
  if (h.size < sizeof h || h.size > len) {
    lua_pushfstring(L, "record header size %d is invalid (%d bytes available)",
                    (int)h.size, (int)len);
    return 0;
  }
  len = h.size;
  name = pe_record_type_name(h.type);
  lua_createtable(L, 0, 10);
  if (name) lua_pushstring(L, name);
  else lua_pushliteral(L, "unknown");
  lua_setfield(L, -2, "type");
  set_int(L, "misc", h.misc);
  if (!name) set_int(L, "type_id", h.type);
  c.p = rec;
  c.pos = sizeof h;
  c.end = len;
  c.err = NULL;
  if (h.type == PE_RECORD_SAMPLE) {
    decode_sample(L, &c, cfg);
  } else {
    size_t tsz = cfg->sample_id_all ? pe_sample_id_size(cfg->sample_type) : 0;
    if (tsz > len - sizeof h) {
      c.err = "record shorter than its sample_id trailer";
    } else {
      c.end = len - tsz;
      decode_other(L, &c, h.type, h.misc, cfg);
      if (!c.err && tsz) {
        c.pos = len - tsz;
        c.end = len;
        decode_trailer(L, &c, cfg->sample_type);
      }
    }
  }
  if (c.err) {
    lua_settop(L, top);   /* the record and any half-built field table */
    lua_pushfstring(L, "%s record (%d bytes): %s", name ? name : "unknown",
                    (int)len, c.err);
    return 0;
  }
  return 1;
}

void pe_decode_cfg_from_table(lua_State *L, int t, pe_decode_cfg *c)
{
  int top = lua_gettop(L);
  lua_getfield(L, t, "sample_type");
  if (!lua_isnil(L, -1)) pe_flags_from_value(L, -1, "sample_type", &c->sample_type);
  lua_getfield(L, t, "read_format");
  if (!lua_isnil(L, -1)) pe_flags_from_value(L, -1, "read_format", &c->read_format);
  lua_getfield(L, t, "branch_sample_type");
  if (!lua_isnil(L, -1))
    pe_flags_from_value(L, -1, "branch_sample_type", &c->branch_sample_type);
  lua_getfield(L, t, "sample_id_all");
  c->sample_id_all = lua_toboolean(L, -1);
  lua_settop(L, top);
  c->regs_user = pe_opt_u64(L, t, "sample_regs_user", 0);
  c->regs_intr = pe_opt_u64(L, t, "sample_regs_intr", 0);
}

/*
 * core.decode_record(bytes, opts) -> record | nil, message
 *   opts: sample_type, read_format, branch_sample_type (numbers, name
 *   tables or "a|b" strings), sample_regs_user, sample_regs_intr,
 *   sample_id_all (boolean).  Used for synthetic buffers.
 */
int pe_l_decode_record(lua_State *L)
{
  size_t len;
  const unsigned char *buf = (const unsigned char *)luaL_checklstring(L, 1, &len);
  pe_decode_cfg cfg;
  memset(&cfg, 0, sizeof cfg);
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    pe_decode_cfg_from_table(L, 2, &cfg);
  }
  if (!pe_decode_record(L, buf, len, &cfg)) {
    lua_pushnil(L);
    lua_insert(L, -2);
    return 2;
  }
  return 1;
}
