/*
 * userpage.h - the self-monitoring read through the mmap'ed user page
 * (doc/coverage.md D18-D23) and the plain C fast-path entry points (fast.c).
 */
#ifndef PE_USERPAGE_H
#define PE_USERPAGE_H

#include <stdint.h>
#include "pe_core.h"

/* Injectable counter and clock reads, for the simulated tests
 * (spec/support/pesim.c).  A NULL
 * hooks pointer means "this CPU": rdpmc/mrs and rdtsc/cntvct. */
typedef struct pe_up_hooks {
  uint64_t (*rdpmc)(struct pe_up_hooks *h, uint32_t counter);  /* counter = index - 1 */
  uint64_t (*rdtsc)(struct pe_up_hooks *h);
  void *ud;
} pe_up_hooks;

typedef struct pe_up_result {
  uint64_t count;          /* offset + sign-extended pmc: the unscaled total */
  uint64_t enabled, running;
  uint32_t index;          /* what the page said on the pass that won */
  uint32_t loops;          /* seqlock passes (1 when nothing raced) */
  int time_current;        /* 1: enabled/running advanced by the TSC delta */
} pe_up_result;

/* Why a user-page read was not possible (the caller falls back to read(2)). */
enum {
  PE_UP_OK = 0,
  PE_UP_NOCAP,        /* cap_user_rdpmc is off */
  PE_UP_NOINDEX,      /* index == 0: the counter is not on a PMC now */
  PE_UP_NOARCH,       /* no user counter read on this architecture */
  PE_UP_BADWIDTH,     /* pmc_width is 0 or > 64 */
  PE_UP_BADTIME,      /* time_shift >= 64 or time_short without the fields */
  PE_UP_NEGATIVE,     /* offset + pmc < 0: not a total a counter can have */
  PE_UP_NOPAGE,       /* the event has no user page / is not self-monitoring */
  PE_UP_INHERIT,      /* inherited: the page lacks live children's counts */
  PE_UP_STALE,        /* times requested but cap_user_time off */
  PE_UP_THREAD        /* read from another thread than the one that opened it */
};

/* The D19/D20 algorithm on page pc.  Returns PE_UP_OK and fills *r, or a
 * PE_UP_* reason.  rdpmc is executed only when the page says
 * cap_user_rdpmc && index != 0. */
int pe_userpage_read(const struct pe_mmap_page *pc, pe_up_hooks *h, pe_up_result *r);

/* ev:read() through the user page: out[0] the unscaled count, out[1]
 * enabled, out[2] running (current, like read(2)'s).  Returns PE_UP_OK or a reason; the caller then uses read(2).
 * h as above (NULL on real events); r receives the raw result. */
int pe_userpage_event_read(const pe_event *ev, pe_up_hooks *h, uint64_t out[3],
                           pe_up_result *r);


/* perf timestamp <-> TSC (D21) */
typedef struct pe_tconv {
  uint64_t time_zero, time_cycles, time_mask;
  uint32_t time_mult;
  uint16_t time_shift;
  int time_short;
} pe_tconv;
uint64_t pe_tconv_to_tsc(const pe_tconv *c, uint64_t timestamp);
uint64_t pe_tconv_to_perf(const pe_tconv *c, uint64_t cyc);

/* core.time_conv (registered by fast.c) */
int pe_l_time_conv(lua_State *L);

#endif /* PE_USERPAGE_H */
