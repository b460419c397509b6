/*
 * puc/intern.c - the PUC Lua hook sampler's string pool: each source and
 * C function name a capture meets is copied once into a fixed pool and
 * named by its index, so that the hook allocates nothing.  Found by the
 * string's address, checked against the copy.  luahook_start empties it.
 */
#include "puc/puc.h"
#include <string.h>

#define LH_POOL (64 * 1024)     /* bytes of copied source and C names */
#define LH_STRS 2048            /* interned strings (power of two) */

typedef struct lh_entry {
  const void *ptr;              /* the string's address in the Lua state */
  uint32_t off, len;            /* the copy in pool */
} lh_entry;

static struct {
  char pool[LH_POOL];
  uint32_t pool_used;
  lh_entry strs[LH_STRS];       /* index 0: "?" */
  uint32_t nstrs;
  uint32_t slot_of[LH_STRS * 2];/* pointer hash -> index + 1 */
} sp;

void lh_strs_reset(void)
{
  memset(sp.slot_of, 0, sizeof sp.slot_of);
  memcpy(sp.pool, "?", 2);
  sp.pool_used = 2;
  sp.strs[0].ptr = NULL;
  sp.strs[0].off = 0;
  sp.strs[0].len = 1;
  sp.nstrs = 1;
}

/* the index of string s (copied on first sight); 0 when the pool is full.
 * The pointer finds the entry; its copy must still equal s, because a
 * freed string's address can be reused by another one. */
int32_t lh_intern_key(const void *key, const char *s, size_t len)
{
  if (len > LH_STRMAX) len = LH_STRMAX;
  uint32_t h = (uint32_t)(((uintptr_t)key >> 3) * 2654435761u) & (LH_STRS * 2 - 1);
  for (;;) {
    uint32_t i = sp.slot_of[h];
    if (i == 0) break;
    lh_entry *e = &sp.strs[i - 1];
    if (e->ptr == key) {
      if (e->len == len && memcmp(sp.pool + e->off, s, len) == 0) return (int32_t)(i - 1);
      break;                     /* reused address: a new entry below */
    }
    h = (h + 1) & (LH_STRS * 2 - 1);
  }
  if (sp.nstrs >= LH_STRS || sp.pool_used + len + 1 > LH_POOL) return 0;
  lh_entry *e = &sp.strs[sp.nstrs];
  e->ptr = key;
  e->off = sp.pool_used;
  e->len = (uint32_t)len;
  memcpy(sp.pool + e->off, s, len);
  sp.pool[e->off + len] = '\0';
  sp.pool_used += (uint32_t)len + 1;
  sp.slot_of[h] = ++sp.nstrs;
  return (int32_t)(sp.nstrs - 1);
}

int32_t lh_intern(const char *s)
{
  return lh_intern_key(s, s, strnlen(s, LH_STRMAX));
}

uint32_t lh_nstrs(void)
{
  return sp.nstrs;
}

const char *lh_str(uint32_t i, uint32_t *len)
{
  if (len) *len = sp.strs[i].len;
  return sp.pool + sp.strs[i].off;
}
