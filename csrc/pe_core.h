/*
 * pe_core.h - declarations shared by the C files of perf_event.core.
 *
 * Owns: the event/group userdata layouts, the 64-bit value helpers and the
 * error helper every file uses.  Each .c file says at its top what it owns.
 *
 * Dependency direction (spec/cdeps_spec.lua checks it on the objects): a
 * file calls only files on lower lines, never one on its own line or
 * above, so no two files call each other.  A new file gets a line here.
 *
 *   core.c                 luaopen: assembles the module
 *   fast.c                 the pe_fast_* FFI entry points
 *   perfdata.c             perf.data helpers: raw ring records, LE packing, build-ids
 *   event.c                event methods, ioctls, reads, the event metatable
 *   lj/bpfprof.c           the BPF program that reads another process's
 *                          Lua stack at its samples: core._private.ljb_*
 *   lj/remote.c            another process's LuaJIT, read from outside
 *                          (luaperf dump --lua): core._private.ljr_*
 *   lj/safepoint.c         the safe-point stacks (pe.profile on LuaJIT): the
 *                          Lua entries, core._private.luasafe_*
 *   lj/arm.c               arming: LuaJIT's profiler started in our name
 *   lj/match.c             a drain: the sample ring skimmed through ring.c,
 *                          signal records matched to its samples
 *   lj/walk.c              the capture: frames walked at the safe point
 *   lj/signal.c lj/intern.c  the handler and its records' rings; interned
 *                          stacks and chunk names
 *   ring.c                 ring drain, records, AUX (methods added by event.c)
 *   group.c userpage.c     groups; the user-page (rdpmc) read, time_conv
 *   puc/hook.c             the PUC Lua count hook's stacks (pe.profile): the
 *                          hook, its capture, core._private.luahook_*
 *   puc/frames.c           PUC Lua's structs read at a signal: the leaf
 *                          popped before the hook fired
 *   puc/intern.c           the hook's string pool: sources and C names
 *   lj/hook.c              LuaJIT's profiler hook flag and dispatch table:
 *                          found, checked, repaired (by the safe point's handler)
 *   lj/layout.c            LuaJIT 2.1's layout (lj/layout.h): frames, G,
 *                          traces, lines, read through a peek function
 *   sigroute.c             an event's overflow signal to this thread, and
 *                          reads of this process's memory (the
 *                          samplers above)
 *   lifecycle.c            open, close/gc, fork generation, mmap, accessors
 *   layouts.c spawn.c dir.c tty.c  shared-ring decode layouts (E6); spawn/wait;
 *                          core.readdir, files at predictable paths; the
 *                          terminal of luaperf top
 *   unwind.c               core.unwind: DWARF unwinding of user stacks (libdw)
 *   records.c              the record decoder
 *   readfmt.c              read_format decoding, scaling
 *   attr.c errors.c        attr encoding; hints for each errno
 *   abi.c                  the kernel ABI tables (core.abi), errno names
 *   u64.c compat.c         64-bit values, int checks; Lua 5.1 compat,
 *                          core._private
 *
 * The ring and user-page simulators are not in core.so: they live in the
 * test-only module spec/support/pesim.c, linked against these objects;
 * what the LuaJIT specs do to LuaJIT on purpose likewise, in
 * spec/support/ljtest.c.
 */
#ifndef PE_CORE_H
#define PE_CORE_H

#include <stdint.h>
#include <stddef.h>
#include <errno.h>
#include <signal.h>
#include <unistd.h>
#include "pe_abi.h"
#include "pe_compat.h"

#define PE_EXPORT __attribute__((visibility("default")))
#define PE_EVENT_MT "perf_event.event"
#define PE_GROUP_MT "perf_event.group"

/* ---- 64-bit values (u64.c) ---------------------------------------------- */
/* Push v exactly: a Lua integer on 5.3+, a number when < 2^53, otherwise a
 * uint64_t cdata on LuaJIT and a "0x..." string on PUC 5.1. */
void pe_push_u64(lua_State *L, uint64_t v);
/* Read a 64-bit value: integer, integral number, decimal/0x string, or a
 * LuaJIT int64/uint64 cdata.  Returns 1 and sets *out, or 0 if idx holds
 * something else (message in *why). */
int pe_to_u64(lua_State *L, int idx, uint64_t *out, const char **why);
uint64_t pe_check_u64(lua_State *L, int arg);
/* field k of the table at t as a 64-bit value, dflt when nil; raises
 * "field 'k': why, got type" otherwise */
uint64_t pe_opt_u64(lua_State *L, int t, const char *k, uint64_t dflt);
/* The Lua number at idx as an int in lo..hi, for values the kernel takes
 * as int (pid, cpu, fds, pages, ioctl arguments): raises "what: N is out
 * of range (argument must be lo..hi)" or "what: N is not an integer"
 * instead of truncating. */
int pe_check_int(lua_State *L, int idx, const char *what, int lo, int hi);
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
void pe_open_ownfile(lua_State *L);       /* dir.c: core._private.own_* */
void pe_open_tty(lua_State *L);           /* tty.c: core._private.tty_* (luaperf top) */
void pe_open_unwind(lua_State *L);        /* unwind.c: core.unwind, unwind_available, unwind_regs */

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
/* The index in r->v of the value with this id (GROUP|ID reads), looking
 * at index 'hint' first (a member's usual place); -1 when none has it.
 * Inline: the read paths call it per member. */
static inline long pe_reading_find(const pe_reading *r, uint64_t id, uint64_t hint)
{
  uint64_t k;
  if (hint < r->nr && r->v[hint].id == id) return (long)hint;
  for (k = 0; k < r->nr; k++)
    if (r->v[k].id == id) return (long)k;
  return -1;
}
int pe_l_decode_read(lua_State *L);

/* ---- the event object (lifecycle.c) ------------------------------------ */
/* the calling thread's id, cached per thread (reset in a forked child) */
int pe_current_tid(void);

/* ---- an event's overflow signal (sigroute.c) ---------------------------- */
typedef void (*pe_sig_fn)(int, siginfo_t *, void *);
/* fn handles signo (SA_SIGINFO, SA_RESTART; mask, or NULL: the signals
 * blocked while it runs besides signo); sigio_fn handles SIGIO when the
 * process left it at its default action.  0, or -1 and errno. */
int pe_sig_install(int signo, pe_sig_fn fn, pe_sig_fn sigio_fn, const sigset_t *mask);
/* fd's overflows signal the calling thread with signo (F_SETOWN_EX,
 * F_SETSIG, O_ASYNC | O_NONBLOCK).  0, or -1 and errno. */
int pe_sig_route(int fd, int signo);
/* no more signals from fd (O_ASYNC cleared; fd < 0: nothing) */
void pe_sig_unroute(int fd);
/* the kernel's id of the event fd, or 0 (fd closed, or not an event) */
uint64_t pe_fd_id(int fd);
/* reads n bytes at addr of process pid (the caller's own, its pid given:
 * getpid is a system call) with process_vm_readv, so that an address
 * not mapped is EFAULT, not a fault: 1 when all n were read (addr 0: 0).
 * Async-signal-safe: the samplers' handlers read the VM through it */
int pe_peek(pid_t pid, uint64_t addr, void *out, size_t n);
/* is fd still the event whose id was id (not 0)? */
static inline int pe_fd_is(int fd, uint64_t id) { return id != 0 && pe_fd_id(fd) == id; }
#define PE_EV_CLOSED    0x1u
#define PE_EV_SELFMON   0x2u   /* pid==0 && cpu==-1: eligible for user-page reads */
#define PE_EV_MEMBER    0x4u   /* a member of a group (not its leader) */
#define PE_EV_AUTOEXCL  0x8u   /* exclude_kernel/hv were added for the caller */
#define PE_EV_FORKED    0x10u  /* its mapping stayed in the parent at a fork */
#define PE_EV_INHERITED 0x20u  /* seen in a process other than its opener (a forked child) */

/*
 * The fast view: the head of pe_event and the whole of pe_group, the only
 * fields LuaJIT's FFI reads (lua/perf_event/fast.lua).  Declared once, here,
 * as macros: C builds pe_event/pe_group from them, and the same text is
 * exported as core._private.fast_cdef (PE_FAST_CDEF), which fast.lua hands
 * to ffi.cdef.  The Lua side names fields; it never knows an offset.
 *   fd         -1 once closed
 *   plain_fd1  fd + 1 when ev:read() is exactly one read(2) of value,
 *              enabled, running (pe_fast_plain); 0 otherwise
 *   n          group members, leader first; -1 once closed
 *   ev         the members (pe_event *; struct pe_fast_event * to the FFI)
 */
#define PE_FAST_EVENT_HEAD int fd; int plain_fd1;
#define PE_FAST_GROUP_BODY(EV) int n; uint64_t read_format; EV *ev[GROUP_MAX];
#define GROUP_MAX 256
#define PE_STR_(x) #x
#define PE_STR(x) PE_STR_(x)
#define PE_FAST_CDEF \
  "struct pe_fast_event { " PE_STR(PE_FAST_EVENT_HEAD) " };\n" \
  "struct pe_fast_group { " PE_STR(PE_FAST_GROUP_BODY(struct pe_fast_event)) " };\n"

typedef struct pe_event {
  PE_FAST_EVENT_HEAD         /* fd, plain_fd1: see the fast view above */
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
  void *scratch;             /* ring.c's state: one malloc, freed on close */
  size_t scratch_len;
  struct pe_attr attr;       /* what was passed to the kernel */
  unsigned gen;              /* pe_fork_gen when created (see below) */
  /* shared rings (layouts.c, doc/coverage.md E6): the decode layouts, by id, of
   * the events whose records go to a ring.  own_lt: the table of this
   * event's own ring (created when another event is redirected into it);
   * out_lt: the table of the ring this event was redirected to by
   * set_output.  Reference-counted heap tables holding copies, never
   * event pointers. */
  struct pe_layouts *own_lt;
  struct pe_layouts *out_lt;
  void *aux;                 /* AUX mapping (ev:map_aux), NULL if none */
  size_t aux_len;
  int opener;                /* getpid() at open: the process that controls it */
} pe_event;

/* Bumped in a forked child (pthread_atfork, registered by
 * pe_lifecycle_init).  The kernel does not copy perf mappings into a child
 * (VM_DONTCOPY), so an event whose gen differs has a stale page pointer:
 * pe_to_event forgets its mapping (no munmap) before any method runs, and
 * the FFI entry points fall back to it. */
extern unsigned pe_fork_gen;
void pe_lifecycle_init(void);
/* forgets the mapping a forked child does not have (gen != pe_fork_gen) */
void pe_event_after_fork(pe_event *ev);
/* 1 when this process is not the one that opened ev: a forked child, whose
 * fd shares the parent's file description, so that an ioctl or fcntl on it
 * would act on the parent's event.  Such a process only closes its copy. */
int pe_event_inherited(pe_event *ev);
/* nil, "op(name): EPERM: ... (event opened by pid N: a forked child cannot
 * control it ...)", EPERM -> 3 */
int pe_push_inherited(lua_State *L, int idx, const pe_event *ev, const char *op);

/* the event at idx (may be closed); raises on another type.  Inline, as
 * pe_check_event: every method's first call */
static inline pe_event *pe_to_event(lua_State *L, int idx)
{
  pe_event *ev = (pe_event *)luaL_checkudata(L, idx, PE_EVENT_MT);
  if (ev->gen != pe_fork_gen) pe_event_after_fork(ev);
  return ev;
}
/* raises if closed */
static inline pe_event *pe_check_event(lua_State *L, int idx)
{
  pe_event *ev = pe_to_event(L, idx);
  if (ev->fd < 0) luaL_error(L, "attempt to use a closed perf_event.event");
  return ev;
}
/* the event at idx or NULL when it is something else; fork fixed up */
pe_event *pe_test_event(lua_State *L, int idx);
/* the name given at open (kept in the userdata's uservalue), "?" if none */
const char *pe_event_name(lua_State *L, int idx);
/* munmaps the user page/ring and AUX area, frees the ring state, leaves
 * the shared-ring tables, closes the fd; idempotent; 1 if it was open */
int pe_event_close(pe_event *ev);
/* read(2) retried on EINTR; the result of read(2) (inline: the read
 * paths' hot call) */
static inline long pe_read_fd(int fd, void *buf, size_t len)
{
  long n;
  do n = (long)read(fd, buf, len); while (n < 0 && errno == EINTR);
  return n;
}
long pe_page_size(void);
/* pushes the error triple of a failed ev:read()/group:read() of the event
 * at idx: n == 0 is the error state of a pinned event (C9) */
int pe_push_read_error(lua_State *L, int idx, long n, int err);
/* core.open(attr, opts) */
int pe_l_open(lua_State *L);

/* ---- shared-ring layouts (layouts.c) ------------------------------------ */
typedef struct pe_decode_cfg pe_decode_cfg;
/* after a successful SET_OUTPUT of ev to target (NULL: detached or an fd
 * we do not know), moves ev's layout to target's ring table; name is kept
 * for the Lua layer (tracepoint formats). */
void pe_layouts_join(pe_event *ev, pe_event *target, const char *name);
/* ev's layout leaves the ring it joined; ev's own table is released */
void pe_layouts_release(pe_event *ev);
/* adds an event with this id/attr/name to the table of ev's ring
 * (created when needed): simulated shared rings; 0 or -1 (no memory) */
int pe_layouts_add_attr(pe_event *ev, uint64_t id, const struct pe_attr *a,
                        const char *name);
/* the layout to decode rec (len >= 8 bytes, from ev's ring) with: own
 * when not attributed by id; NULL with msg filled when the record cannot
 * be attributed */
const pe_decode_cfg *pe_layouts_cfg(const pe_event *ev, const pe_decode_cfg *own,
                                    const unsigned char *rec, size_t len,
                                    char *msg, size_t msglen);
/* a number that changes whenever the events redirected into ev's ring
 * change; 0 when none ever was */
unsigned pe_layouts_version(const pe_event *ev);
/* pushes by_id and {[id] = {name=, type=, config=, sample_type=}} of the
 * events redirected into ev's ring; returns 2 */
int pe_layouts_push(lua_State *L, const pe_event *ev);

/* ---- groups (group.c) --------------------------------------------------- */
typedef struct pe_group {
  /* n (-1 once closed), read_format (the leader's), ev[]: the fast view */
  PE_FAST_GROUP_BODY(pe_event)
} pe_group;

/* enable/disable/reset a whole group -> 0, or -1 with errno */
int pe_group_ioctl(pe_group *g, unsigned long req);
/* creates the "perf_event.group" metatable; stores it as group_mt and
 * make_group in the module table on top of the stack (at index mod), its C
 * methods as core._private.group_methods */
void pe_open_groups(lua_State *L, int mod);

/* ---- events (event.c) --------------------------------------------------- */
/* ev:read()'s numbers: out[0] the unscaled value (a GROUP member's own),
 * out[1] time_enabled, out[2] time_running, through the user page when it
 * can be used, else read(2).  -> 0, or -1 with *nread the read(2) result
 * (<= 0: errno set; > 0: bytes of a short or inconsistent read). */
int pe_event_read(pe_event *ev, uint64_t out[3], long *nread);
int pe_open_events(lua_State *L);
/* spawn.c: adds spawn/catch_signals/wait_pid to the module table on top */
void pe_open_spawn(lua_State *L);
/* spawn.c, for ring.c's core.wait_events: catch_signals()'s signalfd (-1
 * before it); the pid of the child userdata at idx (0 once reaped, -1 when
 * idx holds none; raises for a child not started) */
int pe_signal_fd(void);
int pe_child_pid(lua_State *L, int idx);
void pe_open_luasafe(lua_State *L);         /* lj/safepoint.c */
void pe_open_ljremote(lua_State *L);        /* lj/remote.c */
void pe_open_ljbpf(lua_State *L);           /* lj/bpfprof.c */
void pe_open_luahook(lua_State *L);         /* puc/hook.c */
/* lj/hook.c: LuaJIT's profiler hook flag and dispatch table (LuaJIT on
 * x86-64; elsewhere find says why not and the rest do nothing).  find:
 * NULL once found for L's VM, else why not (tried again at the next
 * call); repair (async-signal-safe): clears a flag set over a table that
 * does not call the hook everywhere (stuck), and there
 * or when the flag is clear over entries that are the hook (stale) makes
 * the next dispatch update rewrite the whole table: 1 (stuck) or 2
 * (stale) when it did, else 0; repaired: the flags it cleared */
const char *pe_ljhook_find(lua_State *L);
int pe_ljhook_repair(void);
uint64_t pe_ljhook_repaired(void);
/* the next pe_ljhook_find looks anew */
void pe_ljhook_forget(void);
void pe_open_ljhook(lua_State *L);
/* perfdata.c: adds pd_next/pd_pack/pd_build_id to core._private */
void pe_open_perfdata(lua_State *L);

/* ---- ring (ring.c) ------------------------------------------------------ */
/* adds the sampling methods to the table on top of the stack */
void pe_ring_methods(lua_State *L);
/* adds core's record functions to the module table on top of the stack */
void pe_ring_funcs(lua_State *L);

/* ---- user page and FFI fast path (userpage.c, fast.c) ------------------- */
/* ev:read() through the user page (seqlock + rdpmc): 0 with out = unscaled
 * count, time_enabled, time_running; or a reason > 0 to use read(2) */
int pe_userpage_try_read(const pe_event *ev, uint64_t out[3]);
/* 0 when a read now would use rdpmc, else the reason (for info()) */
int pe_userpage_usable(const pe_event *ev);
const char *pe_userpage_reason(int rc);
/* adds time_conv to the module table on top, and fast_token/fast_cdef to
 * core._private */
void pe_fast_open(lua_State *L);

/* ---- entry point -------------------------------------------------------- */
PE_EXPORT int luaopen_perf_event_core(lua_State *L);

#endif /* PE_CORE_H */
