/*
 * userpage.c - reading a self-monitoring counter from the mmap'ed user page
 * (doc/coverage.md D18-D23): the seqlock loop, rdpmc with pmc_width sign
 * extension, the cap_user_time(_short) conversion of time_enabled and
 * time_running, and perf-timestamp <-> TSC conversion (D21).
 *
 * Owns: pe_userpage_read (the one loop, used by real events and by the
 * simulated pages of the test-only pesim module through injectable
 * rdpmc/rdtsc hooks), the per-arch counter reads and core.time_conv.
 * Calls lifecycle.c (thread id, accessors) and the leaves.
 *
 * Deliberate differences from the D19/D20 snippet, both about time:
 *  - the TSC is read whenever cap_user_time is set, not only when
 *    enabled != running, so the returned times are current (read(2) gives
 *    current times too); the snippet leaves them as of the last update;
 *  - scaling uses pe_scale (128-bit, exact), the same as the read(2) path.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "userpage.h"

/* ---- per-architecture counter and clock reads (D23) -------------------- */
#if defined(__x86_64__) || defined(__i386__)
#define PE_UP_ARCH 1
static inline uint64_t arch_rdpmc(uint32_t counter)
{
  uint32_t lo, hi;
  __asm__ volatile("rdpmc" : "=a"(lo), "=d"(hi) : "c"(counter));
  return (uint64_t)hi << 32 | lo;
}

static inline uint64_t arch_rdtsc(void)
{
  uint32_t lo, hi;
  __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
  return (uint64_t)hi << 32 | lo;
}

static inline int arch_counter_ok(uint32_t counter)
{
  (void)counter;     /* fixed counters carry bit 30: rdpmc takes it as is */
  return 1;
}
#elif defined(__aarch64__)
/* arm64 (kernel >= 5.17): index-1 is 0..30 for PMEVCNTR<n>_EL0 and 31 for
 * PMCCNTR_EL0; user access needs /proc/sys/kernel/perf_user_access=1 and
 * the event opened with config1 bit 1 (rdpmc), otherwise index stays 0.
 * Not run on real hardware (see doc/fastpath.md). */
#define PE_UP_ARCH 1
#define MRS(reg) __extension__({ uint64_t v_; __asm__ volatile("mrs %0, " #reg : "=r"(v_)); v_; })
#define EVCNT(n) case n: return MRS(pmevcntr##n##_el0)
static inline uint64_t arch_rdpmc(uint32_t counter)
{
  switch (counter) {
  EVCNT(0); EVCNT(1); EVCNT(2); EVCNT(3); EVCNT(4); EVCNT(5); EVCNT(6); EVCNT(7);
  EVCNT(8); EVCNT(9); EVCNT(10); EVCNT(11); EVCNT(12); EVCNT(13); EVCNT(14);
  EVCNT(15); EVCNT(16); EVCNT(17); EVCNT(18); EVCNT(19); EVCNT(20); EVCNT(21);
  EVCNT(22); EVCNT(23); EVCNT(24); EVCNT(25); EVCNT(26); EVCNT(27); EVCNT(28);
  EVCNT(29); EVCNT(30);
  default: return MRS(pmccntr_el0);     /* 31; others are refused below */
  }
}
#undef EVCNT

static inline uint64_t arch_rdtsc(void)
{
  return MRS(cntvct_el0);
}

static inline int arch_counter_ok(uint32_t counter)
{
  return counter <= 31;   /* 32 (PMICNTR_EL0, FEAT_PMUv3_ICNTR) is not read */
}
#undef MRS
#else
#define PE_UP_ARCH 0
static inline uint64_t arch_rdpmc(uint32_t counter) { (void)counter; return 0; }
static inline uint64_t arch_rdtsc(void) { return 0; }
static inline int arch_counter_ok(uint32_t counter) { (void)counter; return 0; }
#endif

/* ---- the page: relaxed single loads, ordered by the lock's acquire ----- */
#define LD(field) __atomic_load_n(&pc->field, __ATOMIC_RELAXED)

int pe_userpage_read(const struct pe_mmap_page *pc, pe_up_hooks *h, pe_up_result *r)
{
  uint32_t seq, idx, loops = 0, time_mult = 0;
  uint16_t time_shift = 0, width;
  uint64_t enabled, running, caps, cyc = 0, time_offset = 0, time_cycles = 0;
  uint64_t time_mask = ~(uint64_t)0, count, pmc;
  int have_time;

  if (!h && !PE_UP_ARCH) return PE_UP_NOARCH;
  do {
    seq = __atomic_load_n(&pc->lock, __ATOMIC_ACQUIRE);
    loops++;
    enabled = LD(time_enabled);
    running = LD(time_running);
    caps = LD(capabilities);
    have_time = (caps & PE_CAP_USER_TIME) != 0;
    if (have_time) {
      cyc = h ? h->rdtsc(h) : arch_rdtsc();
      time_offset = LD(time_offset);
      time_mult = LD(time_mult);
      time_shift = LD(time_shift);
      if (caps & PE_CAP_USER_TIME_SHORT) {
        if (LD(size) < offsetof(struct pe_mmap_page, reserved)) return PE_UP_BADTIME;
        time_cycles = LD(time_cycles);
        time_mask = LD(time_mask);
      } else {
        time_cycles = 0;
        time_mask = ~(uint64_t)0;
      }
    }
    idx = LD(index);
    count = (uint64_t)LD(offset);
    if (!(caps & PE_CAP_USER_RDPMC)) return PE_UP_NOCAP;
    if (!idx) return PE_UP_NOINDEX;
    width = LD(pmc_width);
    if (width == 0 || width > 64) return PE_UP_BADWIDTH;
    if (!h && !arch_counter_ok(idx - 1)) return PE_UP_NOARCH;
    pmc = h ? h->rdpmc(h, idx - 1) : arch_rdpmc(idx - 1);
    if (width < 64)     /* sign-extend the pmc_width-bit hardware value */
      pmc = (uint64_t)((int64_t)(pmc << (64 - width)) >> (64 - width));
    count += pmc;       /* s64 offset + s64 pmc, in wrapping u64 arithmetic */
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
  } while (__atomic_load_n(&pc->lock, __ATOMIC_RELAXED) != seq);

  r->loops = loops;
  r->index = idx;
  r->time_current = 0;
  if (have_time) {    /* D20, after the loop */
    uint64_t quot, rem, delta;
    if (time_shift >= 64) return PE_UP_BADTIME;
    cyc = time_cycles + ((cyc - time_cycles) & time_mask);
    quot = cyc >> time_shift;
    rem = cyc & (((uint64_t)1 << time_shift) - 1);
    delta = time_offset + quot * time_mult + ((rem * time_mult) >> time_shift);
    enabled += delta;
    running += delta;  /* idx != 0 here: the counter is running */
    r->time_current = 1;
  }
  if ((int64_t)count < 0) return PE_UP_NEGATIVE;
  r->count = count;
  r->enabled = enabled;
  r->running = running;
  return PE_UP_OK;
}

#define RF_TIMES (PE_FORMAT_TOTAL_TIME_ENABLED | PE_FORMAT_TOTAL_TIME_RUNNING)

/* the checks that need no seqlock: what kind of event this is, and the
 * kernel's current verdict (the loop re-checks the latter) */
static int event_gate(const pe_event *ev)
{
  const struct pe_mmap_page *pc = ev->page;
  if (!pc || !(ev->flags & PE_EV_SELFMON) || ev->fd < 0) return PE_UP_NOPAGE;
  /* the page describes the counter of the thread that opened the event:
   * rdpmc on another thread would read that thread's CPU counter */
  if (ev->tid != pe_current_tid()) return PE_UP_THREAD;
  if (!(LD(capabilities) & PE_CAP_USER_RDPMC)) return PE_UP_NOCAP;
  if (!LD(index)) return PE_UP_NOINDEX;
  if ((ev->attr.flags >> PE_FLAG_inherit) & 1) return PE_UP_INHERIT;
  return PE_UP_OK;
}

int pe_userpage_event_read(const pe_event *ev, pe_up_hooks *h, uint64_t out[3],
                           pe_up_result *r)
{
  int rc = event_gate(ev);
  uint64_t rf = ev->read_format;
  if (rc) return rc;
  rc = pe_userpage_read(ev->page, h, r);
  if (rc) return rc;
  /* read(2) gives current times; without cap_user_time the page's are not */
  if (!r->time_current && (rf & RF_TIMES)) return PE_UP_STALE;
  out[0] = r->count;
  out[1] = r->enabled;
  out[2] = r->running;
  return PE_UP_OK;
}

int pe_userpage_try_read(const pe_event *ev, uint64_t out[3])
{
  pe_up_result r;
  return pe_userpage_event_read(ev, NULL, out, &r);
}

int pe_userpage_usable(const pe_event *ev)
{
  const struct pe_mmap_page *pc = ev->page;
  int rc = event_gate(ev);
  if (rc) return rc;
  if (!PE_UP_ARCH || !arch_counter_ok(LD(index) - 1)) return PE_UP_NOARCH;
  if (!(LD(capabilities) & PE_CAP_USER_TIME) && (ev->read_format & RF_TIMES))
    return PE_UP_STALE;
  return PE_UP_OK;
}

const char *pe_userpage_reason(int rc)
{
  switch (rc) {
  case PE_UP_OK: return "rdpmc";
  case PE_UP_NOCAP: return "the kernel does not offer rdpmc on this event (cap_user_rdpmc=0)";
  case PE_UP_NOINDEX: return "the counter is not on a hardware PMC now (index=0)";
  case PE_UP_NOARCH: return "no user-space counter read for this architecture";
  case PE_UP_BADWIDTH: return "the user page has an invalid pmc_width";
  case PE_UP_BADTIME: return "the user page has invalid time conversion fields";
  case PE_UP_NEGATIVE: return "the user page gave a negative total";
  case PE_UP_NOPAGE: return "not a mapped self-monitoring event (pid=0, cpu=-1)";
  case PE_UP_INHERIT: return "inherited event: the page lacks the children's counts";
  case PE_UP_STALE: return "the page's times are not current (cap_user_time=0)";
  case PE_UP_THREAD: return "read from another thread than the one that opened the event";
  default: return "?";
  }
}

/* ---- perf timestamps <-> TSC (D21) --------------------------------------
 * Valid when time_mult != 0 and time_shift < 64 (checked on creation). */
uint64_t pe_tconv_to_tsc(const pe_tconv *c, uint64_t timestamp)
{
  uint64_t t = timestamp - c->time_zero;
  uint64_t quot = t / c->time_mult, rem = t % c->time_mult;
  return (quot << c->time_shift) + (rem << c->time_shift) / c->time_mult;
}

uint64_t pe_tconv_to_perf(const pe_tconv *c, uint64_t cyc)
{
  uint64_t quot, rem;
  if (c->time_short) cyc = c->time_cycles + ((cyc - c->time_cycles) & c->time_mask);
  quot = cyc >> c->time_shift;
  rem = cyc & (((uint64_t)1 << c->time_shift) - 1);
  return c->time_zero + quot * c->time_mult + ((rem * c->time_mult) >> c->time_shift);
}

/* the conversion parameters of a live page, read under its seqlock */
static uint64_t page_tconv(const struct pe_mmap_page *pc, pe_tconv *c)
{
  uint32_t seq;
  uint64_t caps;
  do {
    seq = __atomic_load_n(&pc->lock, __ATOMIC_ACQUIRE);
    caps = LD(capabilities);
    c->time_zero = LD(time_zero);
    c->time_mult = LD(time_mult);
    c->time_shift = LD(time_shift);
    c->time_short = (caps & PE_CAP_USER_TIME_SHORT) &&
                    LD(size) >= offsetof(struct pe_mmap_page, reserved);
    c->time_cycles = c->time_short ? LD(time_cycles) : 0;
    c->time_mask = c->time_short ? LD(time_mask) : ~(uint64_t)0;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
  } while (__atomic_load_n(&pc->lock, __ATOMIC_RELAXED) != seq);
  return caps;
}

static int tc_to_tsc(lua_State *L)
{
  const pe_tconv *c = (const pe_tconv *)lua_touserdata(L, lua_upvalueindex(1));
  pe_push_u64(L, pe_tconv_to_tsc(c, pe_check_u64(L, 1)));
  return 1;
}

static int tc_to_perf(lua_State *L)
{
  const pe_tconv *c = (const pe_tconv *)lua_touserdata(L, lua_upvalueindex(1));
  pe_push_u64(L, pe_tconv_to_perf(c, pe_check_u64(L, 1)));
  return 1;
}

/*
 * core.time_conv(ev | params) -> conv | nil, msg
 *   params: {time_zero=, time_mult=, time_shift=, time_cycles=, time_mask=,
 *   cap_user_time_short=} (e.g. saved from a page or a perf.data header).
 *   conv: those fields plus conv.to_tsc(timestamp) and conv.to_perf(cyc).
 */
int pe_l_time_conv(lua_State *L)
{
  pe_tconv *c;
  pe_tconv tmp;
  pe_event *ev = pe_test_event(L, 1);      /* fork fixed up: no mapping in a child */
  memset(&tmp, 0, sizeof tmp);
  if (ev) {
    uint64_t caps;
    if (ev->fd < 0) return luaL_error(L, "attempt to use a closed perf_event.event");
    if (!ev->page) {
      return pe_push_syserror(L, "time_conv", pe_event_name(L, 1), ENODATA,
                              "the event has no user page: only mapped events carry "
                              "the conversion");
    }
    caps = page_tconv(ev->page, &tmp);
    if (!(caps & PE_CAP_USER_TIME_ZERO) || tmp.time_mult == 0 || tmp.time_shift >= 64) {
      char hint[200];
      snprintf(hint, sizeof hint, "the kernel does not offer cap_user_time_zero on this "
               "event's user page (capabilities=0x%llx): the perf clock is not derived "
               "from the TSC here (e.g. a VM without a stable TSC)", (unsigned long long)caps);
      return pe_push_syserror(L, "time_conv", pe_event_name(L, 1), EOPNOTSUPP, hint);
    }
  } else if (lua_istable(L, 1)) {
    uint64_t v;
    tmp.time_zero = pe_opt_u64(L, 1, "time_zero", 0);
    v = pe_opt_u64(L, 1, "time_mult", 0);
    if (v == 0 || v > UINT32_MAX) return luaL_argerror(L, 1, "time_mult must be 1..2^32-1");
    tmp.time_mult = (uint32_t)v;
    v = pe_opt_u64(L, 1, "time_shift", 0);
    if (v >= 64) return luaL_argerror(L, 1, "time_shift must be 0..63");
    tmp.time_shift = (uint16_t)v;
    lua_getfield(L, 1, "cap_user_time_short");
    tmp.time_short = lua_toboolean(L, -1);
    lua_pop(L, 1);
    tmp.time_cycles = tmp.time_short ? pe_opt_u64(L, 1, "time_cycles", 0) : 0;
    tmp.time_mask = tmp.time_short ? pe_opt_u64(L, 1, "time_mask", ~(uint64_t)0) : ~(uint64_t)0;
  } else {
    return luaL_argerror(L, 1, "expected a perf_event.event or a table of time_* fields");
  }
  lua_createtable(L, 0, 8);
  pe_push_u64(L, tmp.time_zero); lua_setfield(L, -2, "time_zero");
  lua_pushinteger(L, (lua_Integer)tmp.time_mult); lua_setfield(L, -2, "time_mult");
  lua_pushinteger(L, tmp.time_shift); lua_setfield(L, -2, "time_shift");
  pe_push_u64(L, tmp.time_cycles); lua_setfield(L, -2, "time_cycles");
  pe_push_u64(L, tmp.time_mask); lua_setfield(L, -2, "time_mask");
  lua_pushboolean(L, tmp.time_short); lua_setfield(L, -2, "cap_user_time_short");
  c = (pe_tconv *)pe_newuserdata(L, sizeof *c);
  *c = tmp;
  lua_pushvalue(L, -1);
  lua_pushcclosure(L, tc_to_tsc, 1); lua_setfield(L, -3, "to_tsc");
  lua_pushcclosure(L, tc_to_perf, 1); lua_setfield(L, -2, "to_perf");
  return 1;
}
