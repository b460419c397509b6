/*
 * fuzz_readfmt.c - libFuzzer target for pe_readfmt_decode (csrc/readfmt.c),
 * no Lua state involved.
 *
 * Input: byte 0 = read_format (low 5 bits, the rest of the byte is kept
 * too so unknown bits are exercised), byte 1 = capacity of the caller's
 * value array (0..255, 256 when 255), the rest = the read(2) buffer.
 * Properties: never reads outside the buffer (ASan), consumes at most len
 * bytes, and what it consumes is exactly pe_readfmt_size(rf, nr) for the
 * known bits; nr filled never exceeds the capacity.
 */
#include "fuzz_common.h"
#include "../csrc/pe_core.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  fz f = { data, size, 0 };
  uint64_t rf = fz_u8(&f);
  size_t cap = fz_u8(&f);
  pe_readval *vals;
  pe_reading r;
  long n;
  size_t len = fz_left(&f);
  unsigned char *buf;
  if (cap == 255) cap = 256;
  /* exact-size heap copies so ASan sees any overread */
  buf = (unsigned char *)malloc(len ? len : 1);
  memcpy(buf, data + f.pos, len);
  vals = (pe_readval *)malloc(sizeof *vals * (cap ? cap : 1));
  r.v = vals;
  r.cap = cap;
  n = pe_readfmt_decode(buf, len, rf, &r);
  if (n >= 0) {
    FZ_ASSERT((size_t)n <= len, "consumed %ld of %zu bytes", n, len);
    FZ_ASSERT(r.nr <= cap, "nr %llu > cap %zu", (unsigned long long)r.nr, cap);
    FZ_ASSERT((size_t)n == pe_readfmt_size(rf & 0x1f, r.nr_total),
              "consumed %ld, layout says %zu", n, pe_readfmt_size(rf & 0x1f, r.nr_total));
  } else {
    /* too short: the layout for the nr it saw must not fit */
    FZ_ASSERT(n == -1, "returned %ld", n);
  }
  free(vals);
  free(buf);
  return 0;
}
