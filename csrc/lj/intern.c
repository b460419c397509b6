/*
 * lj/intern.c - the safe point's interned stacks and chunk names: each
 * distinct stack (its words: flags, n, then 6 words a frame) and each
 * chunk name gets a 1-based id, through open-addressing hash tables.  The
 * capture allocates here only for a stack or name not seen before; the
 * last profile's last drain frees them all (ids restart).
 */
#include "lj/safe.h"

#ifdef PE_LJ
#include <stdlib.h>

/* chunk names: id -> string, and a hash of them */
char **ls_chunks;
uint32_t ls_nchunks;
static uint32_t ls_capchunks;
static uint32_t *ls_chash;              /* open addressing: chunk id + 1, or 0 */
static uint32_t ls_chsize;

/* stacks: id -> words, and a hash */
uint32_t **ls_stacks;
uint32_t ls_nstacks;
static uint32_t ls_capstacks;
static uint32_t *ls_shash;
static uint32_t ls_shsize;

static uint32_t ls_hash(const void *d, size_t n)
{
  const uint8_t *b = d;
  uint32_t h = 2166136261u;
  size_t i;
  for (i = 0; i < n; i++) h = (h ^ b[i]) * 16777619u;
  return h ? h : 1;
}

/* a stack's words: one step a word */
uint32_t ls_hashw(const uint32_t *w, size_t n)
{
  uint32_t h = 2166136261u;
  size_t i;
  for (i = 0; i < n; i++) h = (h ^ w[i]) * 16777619u;
  return h ? h : 1;
}

static int ls_grow(uint32_t **tab, uint32_t *size, uint32_t n, uint32_t (*key)(uint32_t))
{
  uint32_t ns = *size ? *size * 2 : 256, i;
  uint32_t *t = calloc(ns, sizeof *t);
  if (!t) return 0;
  for (i = 0; i < n; i++) {
    uint32_t h = key(i) & (ns - 1);
    while (t[h]) h = (h + 1) & (ns - 1);
    t[h] = i + 1;
  }
  free(*tab);
  *tab = t;
  *size = ns;
  return 1;
}

static uint32_t ls_chunk_key(uint32_t i) { return ls_hash(ls_chunks[i], strlen(ls_chunks[i])); }
static uint32_t ls_stack_key(uint32_t i) { return ls_hashw(ls_stacks[i], 2 + 6 * (size_t)ls_stacks[i][1]); }

uint32_t ls_chunk(const char *s)
{
  size_t n = strlen(s);
  uint32_t h, i;
  char *c;
  if ((ls_nchunks + 1) * 2 > ls_chsize && !ls_grow(&ls_chash, &ls_chsize, ls_nchunks, ls_chunk_key))
    return 0;
  h = ls_hash(s, n) & (ls_chsize - 1);
  while ((i = ls_chash[h]) != 0) {
    if (strcmp(ls_chunks[i - 1], s) == 0) return i;
    h = (h + 1) & (ls_chsize - 1);
  }
  if (ls_nchunks == ls_capchunks) {
    uint32_t nc = ls_capchunks ? ls_capchunks * 2 : 64;
    char **t = realloc(ls_chunks, nc * sizeof *t);
    if (!t) return 0;
    ls_chunks = t;
    ls_capchunks = nc;
  }
  c = malloc(n + 1);
  if (!c) return 0;
  memcpy(c, s, n + 1);
  ls_chunks[ls_nchunks++] = c;
  ls_chash[h] = ls_nchunks;
  return ls_nchunks;
}

uint32_t ls_intern(const uint32_t *w)
{
  size_t bytes = (2 + 6 * (size_t)w[1]) * 4;
  uint32_t h, i, *c;
  if ((ls_nstacks + 1) * 2 > ls_shsize && !ls_grow(&ls_shash, &ls_shsize, ls_nstacks, ls_stack_key))
    return 0;
  h = ls_hashw(w, bytes / 4) & (ls_shsize - 1);
  while ((i = ls_shash[h]) != 0) {
    if (ls_stacks[i - 1][1] == w[1] && memcmp(ls_stacks[i - 1], w, bytes) == 0) return i;
    h = (h + 1) & (ls_shsize - 1);
  }
  if (ls_nstacks == ls_capstacks) {
    uint32_t nc = ls_capstacks ? ls_capstacks * 2 : 256;
    uint32_t **t = realloc(ls_stacks, nc * sizeof *t);
    if (!t) return 0;
    ls_stacks = t;
    ls_capstacks = nc;
  }
  c = malloc(bytes);
  if (!c) return 0;
  memcpy(c, w, bytes);
  ls_stacks[ls_nstacks++] = c;
  ls_shash[h] = ls_nstacks;
  return ls_nstacks;
}

void ls_forget(void)
{
  uint32_t i;
  for (i = 0; i < ls_nchunks; i++) free(ls_chunks[i]);
  for (i = 0; i < ls_nstacks; i++) free(ls_stacks[i]);
  free(ls_chunks); free(ls_stacks); free(ls_chash); free(ls_shash);
  ls_chunks = NULL; ls_stacks = NULL; ls_chash = ls_shash = NULL;
  ls_nchunks = ls_capchunks = ls_chsize = ls_nstacks = ls_capstacks = ls_shsize = 0;
}
#endif
