/*
 * pe_core.h - declarations shared by the C files of perf_event.core.
 *
 * Owns: the event/group userdata layouts, the 64-bit value helpers and the
 * error helper every file uses.  Each .c file says at its top what it owns.
 */
#ifndef PE_CORE_H
#define PE_CORE_H

#include <stdint.h>
#include <stddef.h>
#include "pe_abi.h"
#include "pe_compat.h"

#define PE_EXPORT __attribute__((visibility("default")))
#define PE_EVENT_MT "perf_event.event"
#define PE_GROUP_MT "perf_event.group"

/* ---- 64-bit values (u64.c) ---------------------------------------------- */
/* Push v exactly: a Lua integer on 5.3+, a number when < 2^53, otherwise a
 * uint64_t cdata on LuaJIT and a "0x..." string on PUC 5.1. */
void pe_push_u64(lua_State *L, uint64_t v);
void pe_push_s64(lua_State *L, int64_t v);
/* Read a 64-bit value: integer, integral number, decimal/0x string, or a
 * LuaJIT int64/uint64 cdata.  Returns 1 and sets *out, or 0 if idx holds
 * something else (message in *why). */
int pe_to_u64(lua_State *L, int idx, uint64_t *out, const char **why);
uint64_t pe_check_u64(lua_State *L, int arg);
int pe_u64_init(lua_State *L);

/* ---- errors (errors.c) -------------------------------------------------- */
const char *pe_errno_name(int err);
/* Pushes nil, "op(what): ENAME: strerror (hint)", errno; returns 3.
 * hint may be NULL: a generic one for the errno is used then. */
int pe_push_syserror(lua_State *L, const char *op, const char *what, int err,
                     const char *hint);
/* Builds the message alone (used by the above and by raised errors). */
void pe_push_errmsg(lua_State *L, const char *op, const char *what, int err,
                    const char *hint);
/* The hint perf_event_open's errno deserves for this attr/pid/cpu. */
const char *pe_open_hint(char *buf, size_t len, int err,
                         const struct pe_attr *a, int pid, int cpu,
                         unsigned long flags);
long pe_read_sysctl(const char *name, long dflt);
const char *pe_mmap_hint(char *buf, size_t len, int err, const struct pe_attr *a,
                         int cpu, size_t pages);

/* ---- attr encoding (attr.c) --------------------------------------------- */
/* Fills *a from the table at idx; raises on a caller mistake.  Strings that
 * must outlive the syscall (uprobe_path, kprobe_func) are anchored in the
 * table at 'anchor' (a stack index) and their pointers stored in config1. */
void pe_attr_from_table(lua_State *L, int idx, struct pe_attr *a, int anchor);
void pe_attr_to_table(lua_State *L, const struct pe_attr *a);
int pe_flags_from_value(lua_State *L, int idx, const char *field, uint64_t *out);
int pe_l_attr_encode(lua_State *L);
int pe_l_attr_decode(lua_State *L);
int pe_l_bits(lua_State *L);
int pe_l_readdir(lua_State *L);           /* dir.c */

/* ---- read_format decoding (readfmt.c) ----------------------------------- */
typedef struct pe_readval {
  uint64_t value, id, lost;
} pe_readval;
typedef struct pe_reading {
  uint64_t time_enabled, time_running;
  uint64_t nr;           /* values filled */
  uint64_t nr_total;     /* nr the kernel reported (GROUP) */
  pe_readval *v;         /* caller's array */
  size_t cap;            /* its capacity */
} pe_reading;
/* Decodes buf[0..len) as read_format rf; returns bytes consumed or -1 when
 * the buffer is too short or inconsistent. */
long pe_readfmt_decode(const unsigned char *buf, size_t len, uint64_t rf,
                       pe_reading *out);
size_t pe_readfmt_size(uint64_t rf, uint64_t nr);
/* value * enabled / running without overflow (C7); running==0 -> 0 */
uint64_t pe_scale(uint64_t value, uint64_t enabled, uint64_t running);
void pe_push_reading(lua_State *L, const pe_reading *r, uint64_t rf);
int pe_l_decode_read(lua_State *L);

/* ---- events (event.c) --------------------------------------------------- */
/* the calling thread's id, cached per thread (reset in a forked child) */
int pe_current_tid(void);
#define PE_EV_CLOSED    0x1u
#define PE_EV_SELFMON   0x2u   /* pid==0 && cpu==-1: eligible for user-page reads */
#define PE_EV_MEMBER    0x4u   /* a member of a group (not its leader) */
#define PE_EV_AUTOEXCL  0x8u   /* exclude_kernel/hv were added for the caller */
#define PE_EV_FORKED    0x10u  /* its mapping stayed in the parent at a fork */

typedef struct pe_event {
  int fd;                    /* -1 once closed */
  int plain_fd1;             /* fd + 1 when ev:read() is exactly one read(2)
                              * of value, enabled, running (pe_fast_plain);
                              * 0 otherwise.  Read by lua/perf_event/fast.lua */
  unsigned flags;            /* PE_EV_* */
  uint64_t read_format;
  uint64_t sample_type;
  uint64_t id;               /* IOC_ID, 0 if unknown */
  int pid, cpu;
  int tid;                   /* the thread that opened it (user-page reads) */
  struct pe_mmap_page *page; /* mmap base (user page), NULL if none */
  size_t map_len;            /* bytes mapped at page */
  size_t data_pages;         /* ring data pages (0 = user page only) */
  uint64_t tail;             /* ring consumer position */
  uint64_t lost;             /* records lost reported by LOST records */
  uint64_t lost_samples;     /* ... and by LOST_SAMPLES */
  void *scratch;             /* contiguous copy of a wrapped record */
  size_t scratch_len;
  struct pe_attr attr;       /* what was passed to the kernel */
  unsigned gen;              /* pe_fork_gen when created (see below) */
  /* shared rings (ring.c, CHECKLIST E6): the decode layouts, by id, of the
   * events whose records go to a ring.  own_lt: the table of this event's
   * own ring (created when another event is redirected into it); out_lt:
   * the table of the ring this event was redirected to by set_output.
   * Reference-counted heap tables holding copies, never event pointers. */
  struct pe_layouts *own_lt;
  struct pe_layouts *out_lt;
} pe_event;

/* Bumped in a forked child (pthread_atfork).  The kernel does not copy
 * perf mappings into a child (VM_DONTCOPY), so an event whose gen differs
 * has a stale page pointer: pe_to_event forgets its mapping (no munmap)
 * before any method runs, and the FFI entry points fall back to it. */
extern unsigned pe_fork_gen;
void pe_event_after_fork(pe_event *ev);

#define GROUP_MAX 256

typedef struct pe_group {
  int n;                 /* members, leader first; -1 once closed */
  uint64_t read_format;  /* the leader's */
  pe_event *ev[GROUP_MAX];
} pe_group;

/* enable/disable/reset a whole group (event.c) -> 0, or -1 with errno */
int pe_group_ioctl(pe_group *g, unsigned long req);

pe_event *pe_check_event(lua_State *L, int idx);   /* raises if closed */
pe_event *pe_to_event(lua_State *L, int idx);      /* may be closed */
int pe_event_close(pe_event *ev);
int pe_open_events(lua_State *L);
/* ring.c: adds the sampling methods to the table on top of the stack */
void pe_ring_methods(lua_State *L);
/* ring.c: releases the AUX mapping and the shared-ring layout tables
 * (called by pe_event_close) and adds
 * core's record functions to the module table on top of the stack */
void pe_ring_close(pe_event *ev);
void pe_ring_funcs(lua_State *L);
/* ring.c: after a successful SET_OUTPUT of ev to target (NULL: detached or
 * an fd we do not know), moves ev's layout to target's ring table; name is
 * kept for the Lua layer (tracepoint formats). */
void pe_ring_join(pe_event *ev, pe_event *target, const char *name);
/* spawn.c: adds spawn/catch_signals/wait_pid to the module table on top */
void pe_open_spawn(lua_State *L);
void pe_open_luaprof(lua_State *L);         /* luaprof.c */

/* ---- user page and FFI fast path (userpage.c, fast.c) ------------------- */
/* ev:read() through the user page (seqlock + rdpmc): 0 with out = unscaled
 * count, time_enabled, time_running; or a reason > 0 to use read(2) */
int pe_userpage_try_read(const pe_event *ev, uint64_t out[3]);
/* 0 when a read now would use rdpmc, else the reason (for info()) */
int pe_userpage_usable(const pe_event *ev);
const char *pe_userpage_reason(int rc);
/* recomputes ev->plain_fd1 after the fd, the mapping or the format changed */
void pe_fast_plain(pe_event *ev);
/* adds time_conv, _userpage_sim, _fast_token to the module table on top */
void pe_fast_open(lua_State *L);

/* ---- entry point -------------------------------------------------------- */
PE_EXPORT int luaopen_perf_event_core(lua_State *L);

#endif /* PE_CORE_H */
