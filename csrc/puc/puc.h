/*
 * puc/puc.h - the PUC Lua hook sampler's shared declarations (pe.profile
 * on Lua 5.1 to 5.4): a captured frame, the string pool (puc/intern.c) and
 * the reading of PUC Lua's own structs at a signal (puc/frames.c).  The
 * design is told at the top of puc/hook.c.
 */
#ifndef PE_PUC_H
#define PE_PUC_H

#include "pe_core.h"

#define LH_STRMAX 240           /* longer sources are cut */

typedef struct lh_frame {
  int32_t src;                  /* interned index: the source, or the C name */
  int32_t line;                 /* currentline; -1 for a C function */
  int32_t ld, lld;              /* linedefined, lastlinedefined (-1: C) */
  uint64_t fn;                  /* a C function's lua_topointer (0: Lua) */
} lh_frame;

/* ---- the string pool (puc/intern.c) -------------------------------------- */
/* empties the pool: index 0 is "?" */
void lh_strs_reset(void);
/* the index of string s found by key (copied on first sight); 0 when the
 * pool is full */
int32_t lh_intern_key(const void *key, const char *s, size_t len);
int32_t lh_intern(const char *s);
/* the interned strings: how many, and index i's copy (NUL-terminated;
 * its length in *len when len is not NULL) */
uint32_t lh_nstrs(void);
const char *lh_str(uint32_t i, uint32_t *len);

/* ---- PUC Lua's structs read at a signal (puc/frames.c) ------------------- */
/* at luahook_start: resets what the handler notes, checks the offsets
 * (unless noleaf) and returns NULL, or why the popped leaf is not added
 * back (then lf_note notes nothing) */
const char *lf_start(lua_State *L, int noleaf);
/* in the signal handler: which function the started thread L runs */
void lf_note(lua_State *L);
/* in the capture of the started thread, frames f[0..n) innermost first (at
 * most depth): adds the noted function back when its frame was popped
 * since the signal; returns the new n, sets *more when that cut a frame */
uint32_t lf_fix(lua_State *L, lh_frame *f, uint32_t n, uint32_t depth, uint32_t *more);
/* forgets the noted Lua function (a capture shed) */
void lf_forget(void);
/* leaf frames added back since luahook_start */
uint64_t lf_added(void);

#endif
