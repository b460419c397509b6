/*
 * fuzz_records.c - libFuzzer target for the record decoder (csrc/records.c)
 * and the ring drain (csrc/ring.c) on arbitrary ring contents.
 *
 * Input (little-endian; a short input reads as zeros):
 *   byte  0      mode: bit0 sample_id_all, bit1 write_backward,
 *                bit2 head = tail + data length (a "full" ring),
 *                bit3 a shared ring (E6): the ring's event has id 1 and a
 *                second event with id 2 writes into it with its own layout
 *                (sample_type from bits 32-56 of bytes 1-8, read_format
 *                from bits 8-12 of bytes 9-16, sample_id_all from mode bit4)
 *   bytes 1-8    sample_type   (masked to the 25 bits the kernel defines)
 *   bytes 9-16   read_format   (masked to the 5 defined bits)
 *   bytes 17-24  branch_sample_type
 *   bytes 25-32  sample_regs_user   33-40 sample_regs_intr
 *   bytes 41-48  data_head          49-56 data_tail (or "last" backward)
 *   bytes 57-    the ring's data area, zero-padded to a power of two
 *                (8 .. 65536 bytes)
 *
 * Two passes over the same bytes:
 *  1. pe_decode_record directly on the records laid out linearly from the
 *     start of the data (the walk records() does on an unwrapped ring),
 *     each from an exact-size heap copy so ASan flags any overread;
 *  2. pesim.sim_ring (spec/support/pesim.c) with those head/tail values
 *     and the ring drained with records() (pe_ring_next: wrap, straddling
 *     copies, resync on corrupt headers, the write_backward snapshot),
 *     then lost()/ring()/poll(0)
 *     and close().  Errors raised to Lua are expected; crashes are not.
 * Property: a record the decoder accepts yields a table whose "type" is a
 * string; a rejected one leaves exactly one message string.
 */
#include "fuzz_common.h"
#include "../csrc/pe_records.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static lua_State *L;

static const char drain[] =
  "local data, mode, st, rf, bst, ru, ri, head, tail, st2, rf2 = ...\n"
  "local opts = { data = data, sample_type = st, read_format = rf,\n"
  "  branch_sample_type = bst, sample_regs_user = ru, sample_regs_intr = ri,\n"
  "  sample_id_all = mode % 2 == 1, write_backward = mode % 4 >= 2,\n"
  "  head = head, tail = tail, last = tail }\n"
  "if mode % 16 >= 8 then\n"
  "  opts.id = 1\n"
  "  opts.layouts = { { id = 2, sample_type = st2, read_format = rf2,\n"
  "    sample_id_all = mode % 32 >= 16, branch_sample_type = bst,\n"
  "    sample_regs_user = ru, sample_regs_intr = ri } }\n"
  "end\n"
  "local ok, ev = pcall(pesim.sim_ring, opts)\n"
  "if not ok then return 'sim_ring: ' .. tostring(ev) end\n"
  "local n = 0\n"
  "for _ = 1, 2 do\n"            /* twice: the second pass starts at the resynced tail */
  "  local ok2, err = pcall(function()\n"
  "    for rec in ev:records() do\n"
  "      assert(type(rec.type) == 'string')\n"
  "      n = n + 1\n"
  "    end\n"
  "  end)\n"
  "  if not ok2 and not tostring(err):find('records%(') then error(err) end\n"
  "end\n"
  "ev:lost(); ev:ring(); ev:poll(0)\n"
  "ev:close(); ev:close()\n"
  "return n\n";

static int decode_one(lua_State *l)
{
  const unsigned char *rec = (const unsigned char *)lua_touserdata(l, 1);
  size_t len = (size_t)lua_tointeger(l, 2);
  const pe_decode_cfg *cfg = (const pe_decode_cfg *)lua_touserdata(l, 3);
  int top = lua_gettop(l), ok = pe_decode_record(l, rec, len, cfg);
  FZ_ASSERT(lua_gettop(l) == top + 1, "decoder left %d values", lua_gettop(l) - top);
  if (ok) {
    lua_getfield(l, -1, "type");
    FZ_ASSERT(lua_type(l, -1) == LUA_TSTRING, "record without a type");
  } else {
    FZ_ASSERT(lua_type(l, -1) == LUA_TSTRING, "error is not a message");
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  fz f = { data, size, 0 };
  pe_decode_cfg cfg;
  unsigned mode = fz_u8(&f);
  uint64_t head, tail, st_in, rf_in;
  size_t dlen, ring = 8, pos;
  unsigned char *buf;
  memset(&cfg, 0, sizeof cfg);
  st_in = fz_u64(&f);
  rf_in = fz_u64(&f);
  cfg.sample_type = st_in & ((1ull << 25) - 1);
  cfg.read_format = rf_in & 0x1f;
  cfg.branch_sample_type = fz_u64(&f);
  cfg.regs_user = fz_u64(&f);
  cfg.regs_intr = fz_u64(&f);
  cfg.sample_id_all = (int)(mode & 1);
  head = fz_u64(&f);
  tail = fz_u64(&f);
  dlen = fz_left(&f);
  if (dlen > 65536) dlen = 65536;
  while (ring < dlen) ring <<= 1;
  if (mode & 4) head = tail + ring;
  if (!L) L = fz_lua();

  /* 1: the decoder alone, record by record */
  for (pos = 0; pos + 8 <= dlen;) {
    uint16_t rs;
    size_t avail = dlen - pos;
    memcpy(&rs, data + f.pos + pos + 6, 2);
    if (rs < 8) rs = 8;
    if (rs > avail) rs = (uint16_t)avail;    /* and also hand it a short buffer */
    buf = (unsigned char *)malloc(rs);
    memcpy(buf, data + f.pos + pos, rs);
    lua_pushcfunction(L, decode_one);
    lua_pushlightuserdata(L, buf);
    lua_pushinteger(L, rs);
    lua_pushlightuserdata(L, &cfg);
    if (lua_pcall(L, 3, 0, 0) != 0) {
      /* only running out of memory may raise here */
      FZ_ASSERT(0, "decode raised: %s", lua_tostring(L, -1));
    }
    free(buf);
    pos += rs;
  }

  /* 2: the ring code through pesim.sim_ring */
  buf = (unsigned char *)calloc(1, ring);
  memcpy(buf, data + f.pos, dlen);
  if (luaL_loadbuffer(L, drain, sizeof drain - 1, "=drain") != 0) abort();
  lua_pushlstring(L, (const char *)buf, ring);
  lua_pushinteger(L, mode);
  lua_pushinteger(L, (lua_Integer)cfg.sample_type);
  lua_pushinteger(L, (lua_Integer)cfg.read_format);
  lua_pushinteger(L, (lua_Integer)cfg.branch_sample_type);
  lua_pushinteger(L, (lua_Integer)cfg.regs_user);
  lua_pushinteger(L, (lua_Integer)cfg.regs_intr);
  lua_pushinteger(L, (lua_Integer)head);
  lua_pushinteger(L, (lua_Integer)tail);
  lua_pushinteger(L, (lua_Integer)((st_in >> 32) & ((1ull << 25) - 1)));
  lua_pushinteger(L, (lua_Integer)((rf_in >> 8) & 0x1f));
  if (lua_pcall(L, 11, 1, 0) != 0) FZ_ASSERT(0, "drain raised: %s", lua_tostring(L, -1));
  lua_settop(L, 0);
  free(buf);
  lua_gc(L, LUA_GCCOLLECT, 0);
  return 0;
}
