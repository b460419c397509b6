/*
 * ring.c - the mmap ring buffer and the record stream (CHECKLIST D, E, F).
 *
 * Owns: the methods added to "perf_event.event" for sampling (records,
 * poll, lost, ...).  pe_ring_methods() is called by event.c with the
 * event method table on top of the stack.
 */
#include "pe_core.h"

void pe_ring_methods(lua_State *L)
{
  (void)L;   /* sampling methods are registered here (issue 4) */
}
