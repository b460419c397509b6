/*
 * fuzz_common.h - shared helpers of the libFuzzer targets (fuzz/fuzz_*.c):
 * a byte reader over the fuzz input and a Lua 5.4 state with
 * perf_event.core and the test-only simulators (pesim) loaded.  The
 * targets link the core's sources, spec/support/pesim.c and liblua5.4.a
 * into the fuzzer binary only; the shipped module links no Lua library.
 */
#ifndef FUZZ_COMMON_H
#define FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>

int luaopen_perf_event_core(lua_State *L);
int luaopen_pesim(lua_State *L);

typedef struct fz {
  const uint8_t *p;
  size_t n, pos;
} fz;

static inline uint8_t fz_u8(fz *f)
{
  return f->pos < f->n ? f->p[f->pos++] : 0;
}

static inline uint64_t fz_u64(fz *f)
{
  uint64_t v = 0;
  size_t k = f->n - f->pos < 8 ? f->n - f->pos : 8;
  memcpy(&v, f->p + f->pos, k);
  f->pos += k;
  return v;
}

static inline size_t fz_left(const fz *f)
{
  return f->n - f->pos;
}

/* a Lua state with the base library, core as global "core" and the
 * simulators as global "pesim" (the harness's own state: the modules
 * themselves create no globals) */
static inline lua_State *fz_lua(void)
{
  lua_State *L = luaL_newstate();
  if (!L) abort();
  luaL_openlibs(L);
  luaL_requiref(L, "perf_event.core", luaopen_perf_event_core, 0);
  lua_setglobal(L, "core");
  luaL_requiref(L, "pesim", luaopen_pesim, 0);
  lua_setglobal(L, "pesim");
  return L;
}

/* a property the target checks did not hold: a crash for libFuzzer */
#define FZ_ASSERT(c, ...) do { if (!(c)) { fprintf(stderr, "property failed: " __VA_ARGS__); \
  fputc('\n', stderr); abort(); } } while (0)

#endif
