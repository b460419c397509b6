/*
 * lj/safe.h - the safe-point stacks' shared declarations (pe.profile's
 * default stacks on LuaJIT): the signal records and their rings
 * (lj/signal.c), the interned stacks and chunk names (lj/intern.c), the
 * capture's walk (lj/walk.c), arming LuaJIT's profiler (lj/arm.c), a
 * drain's matching of records to ring samples (lj/match.c) and the Lua
 * entries (lj/safepoint.c).  The design is told at the top of
 * lj/safepoint.c.
 */
#ifndef PE_LJ_SAFE_H
#define PE_LJ_SAFE_H

#include "lj/layout.h"

#ifdef PE_LJ

#define LS_MAXP 4          /* profiles armed at once */
#define LS_SLOTS 4096      /* signal records per profile */
#define LS_MAXF 384        /* frames of one stack, C ones included */
#define LS_MAXLUA 256      /* Lua frames of one stack */
#define LS_MAXTH 16        /* threads joined in one stack */
#define LS_CFRAME_SPAN (8u << 20)

enum { LS_PENDING = 0, LS_DONE = 1 };

typedef struct ls_rec {
  uint64_t time, ip;
  uint64_t leaf;           /* GCfunc of a C function/builtin running (vmstate C), or 0 */
  uint64_t leaf_l;         /* its thread */
  uint32_t leaf_off;       /* its frame's slot in that thread's stack */
  uint32_t stack;          /* interned stack id (0: none) */
  uint32_t cut;            /* 1: the stack ends at the leaf's own frame */
  int32_t vms;             /* G->vmstate at the signal */
  uint64_t bcpc;           /* in a trace: its snapshot's bytecode PC at ip, or 0 */
  uint64_t ctx;            /* the captured thread's lua_getexdata (OpenResty: its request), or 0 */
  uint32_t route;          /* the route id luasafe_route gave the records of ctx, or 0 */
  uint8_t out, state;
} ls_rec;

/* the ring's samples (time, ip) that no taken record's time has passed
 * yet (l_take, ls_cover), and the records that found theirs */
typedef struct ls_sq {
  uint64_t t[LS_SLOTS], ip[LS_SLOTS];
  uint32_t head, tail;
  uint64_t matched;
} ls_sq;

/* a block profile's voluntary waits, from the event's switch records:
 * each one's end (switch-in) time and length, in time order */
typedef struct ls_bq {
  uint64_t t[LS_SLOTS], ns[LS_SLOTS];
  uint32_t head, tail;
  uint64_t out_t;          /* the last voluntary switch-out not yet back, or 0 */
} ls_bq;

/* requests that ended (luasafe_route) since the records were last given
 * their routes (ls_routes): the request, when, its route id */
#define LS_DONE_MAX 2048
typedef struct ls_done {
  uint64_t ctx, t;
  uint32_t route;
} ls_done;

typedef struct ls_prof {
  int on, fd, block;       /* block: a context-switch event, its waits weigh the records */
  uint64_t id;
  uint64_t trap;                          /* sig_data of a sigtrap event, or 0 */
  volatile uint32_t head, tail;
  volatile uint32_t dropped, late;
  ls_rec ring[LS_SLOTS];
  ls_sq q;
  ls_bq bq;
  uint64_t merged;                        /* samples a record stood for beside its own */
  ls_done done[LS_DONE_MAX];
  uint32_t ndone;
} ls_prof;

/* ---- signal.c: the handler and the records' rings ---- */
extern ls_prof ls_p[LS_MAXP];
extern lj_gstate ls_gs;                   /* the VM's global_State words, found at arm */
extern uint64_t ls_jtrace;                /* &J->trace in use, or 0 (compiled lines by mode "l") */
extern volatile uint32_t ls_throttled, ls_late;
extern volatile int ls_in_cap;            /* 1 while ls_capture runs */
extern int ls_active;                     /* LuaJIT's profiler is ours */
extern void (*ls_ljh)(int);               /* LuaJIT's SIGPROF handler */
extern uint64_t ls_ps;                    /* LuaJIT's ProfileState, or 0 */
extern pe_lj_profile_cb ls_cb;            /* the callback our start gave it */
extern char ls_token;                     /* the data pointer we start with */
extern volatile uint64_t ls_hns, ls_nh, ls_nhslow;
extern sigset_t ls_blocked;
extern void *(*ls_exdata)(lua_State *L);  /* OpenResty LuaJIT's lua_getexdata, or NULL */
uint64_t ls_now(void);
int ls_profiler_ours(void);
int ls_owned(void);
ls_prof *ls_find(int fd, uint64_t trap);
int ls_any_on(void);
void ls_prune(void);
void ls_mask(void);
void ls_handler(int sig, siginfo_t *si, void *ctx);
/* installs ls_handler for SIGTRAP once: 0, or -1 and errno */
int ls_trap_install(void);

/* ---- intern.c: stacks (flags, n, then 6 words a frame) and chunk names ---- */
extern char **ls_chunks;
extern uint32_t ls_nchunks;
extern uint32_t **ls_stacks;
extern uint32_t ls_nstacks;
uint32_t ls_hashw(const uint32_t *w, size_t n);
uint32_t ls_chunk(const char *s);         /* id (1-based), 0 when out of memory */
uint32_t ls_intern(const uint32_t *w);    /* likewise */
void ls_forget(void);

/* ---- walk.c: the capture ----
 * one frame, as the stack's words hold it:
 *   Lua:     0, chunk id, linedefined, lastlinedefined, currentline, 0
 *   builtin: 1, ffid, GCfunc address low, high, 0, 0
 *   C:       2, 0, GCfunc address low, high, lua_CFunction low, high
 *   a coroutine.wrap function: 3, ffid, GCfunc address low, high, 0, 0 */
enum { LS_FLUA, LS_FFF, LS_FC, LS_FWRAP };
#define LS_TRUNC 1u        /* flags: deeper frames left out */
#define LS_UNJOINED 2u     /* a coroutine whose resumer was not found */
typedef struct ls_fr {
  uint32_t w[6];
  uint64_t fn;             /* a Lua frame's GCfunc */
  uint64_t l;              /* thread */
  uint32_t off;            /* frame slot in its stack */
} ls_fr;
extern ls_fr ls_frames[LS_MAXF];
extern uint64_t ls_resume_fn;             /* coroutine.resume's GCfunc */
extern int ls_wrap_ffid;                  /* ffid of coroutine.wrap's functions */
extern uint64_t ls_root;                  /* the thread that armed, when no main thread */
extern uint64_t ls_ns, ls_ncap, ls_njoin, ls_nunjoined, ls_ncapslow;
int ls_stack_of(lua_State *L, uint32_t *flags);
void ls_capture(void *data, lua_State *L, int samples, int vmstate);

/* gives the records of p that a capture completed for a request which
 * has ended since (p->done) that request's route (match.c) */
void ls_routes(ls_prof *p);

/* ---- arm.c ---- */
extern uint64_t ls_jcand;                 /* &J->trace found by luasafe_lines */
extern int ls_jok;                        /* luasafe_lines_use: its self-test passed */
const char *ls_known_g(lua_State *L);
int ls_push_fail(lua_State *L, const char *msg);
int ls_l_arm(lua_State *L);
int ls_l_disarm(lua_State *L);
int ls_l_trap_busy(lua_State *L);

/* ---- match.c ---- */
uint32_t ls_cover(ls_sq *q, uint64_t time, uint64_t ip);
void ls_queue(ls_sq *q, uint64_t t, uint64_t ip);
int ls_l_take(lua_State *L);

#endif /* PE_LJ */
#endif /* PE_LJ_SAFE_H */
