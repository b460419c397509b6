/*
 * bpf/ljstack.bpf.c - the BPF program `luaperf record --lua -p` attaches
 * to its sampling events: at each sample of a thread of a process whose
 * LuaJIT state userspace found (perf_event.remote), the running
 * coroutine's frames are read at that instant, where the sample's own
 * registers say the walk starts, and sent to userspace on a ring buffer,
 * raw (each frame's function, and the PC the frame below it resumes at).  Userspace checks each chain and
 * names it (csrc/lj/bpfprof.c, perf_event.remote).
 *
 * Built by clang -target bpf (the Makefile), embedded in core.so and
 * loaded with libbpf.  LuaJIT's layout comes from lj/offsets.h, as the C
 * readers' does.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "lj/offsets.h"
#include "bpf/ljstack.h"

typedef unsigned long long u64;
typedef unsigned int u32;
typedef int s32;

/* x86-64's struct pt_regs (this file is compiled for the bpf target) and
 * the perf event program's context, struct bpf_perf_event_data */
struct pe_regs {
  u64 r15, r14, r13, r12, rbp, rbx, r11, r10, r9, r8, rax, rcx, rdx, rsi, rdi, orig_rax, rip, cs, eflags,
    rsp, ss;
};
struct pe_ctx {
  struct pe_regs regs;
  u64 sample_period, addr;
};

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 4096);
  __type(key, u32);
  __type(value, struct ljb_vm);
} ljb_vms SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 1 << 22);
} ljb_samples SEC(".maps");

/* counts: [0] samples sent, [1] dropped (ring full), [2] not a known process */
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 4);
  __type(key, u32);
  __type(value, u64);
} ljb_counts SEC(".maps");

static __always_inline void ljb_count(u32 k)
{
  u64 *c = bpf_map_lookup_elem(&ljb_counts, &k);
  if (c) (*c)++;
}

static __always_inline u64 ljb_u64(u64 a)
{
  u64 v = 0;
  bpf_probe_read_user(&v, sizeof v, (const void *)a);
  return v;
}

/* do the interpreter's registers name a frame: BASE (rdx) a frame whose
 * function holds the PC (rbx, past the instruction it runs) in its
 * bytecode, or whose link rbx is (LJB_EDGE: a builtin runs, or a call
 * stored its link and has not loaded the callee's PC yet, or a return
 * loaded its link and has not popped the frame yet) */
static __always_inline u32 ljb_regs(u64 base, u64 pc)
{
  u64 w[2], fn, bc;
  u32 sizebc = 0;
  unsigned char t[2] = { 0, 0 };
  if (bpf_probe_read_user(w, sizeof w, (const void *)(base - 16))) return 0;
  if (pc == w[1]) return LJB_EDGE;
  fn = w[0] & LJ_GCMASK;
  if (bpf_probe_read_user(t, sizeof t, (const void *)(fn + LJ_FN_GCT)) || t[0] != LJ_GCT_FUNC || t[1] != 0)
    return 0;
  bc = ljb_u64(fn + LJ_FNL_PC);
  if (bpf_probe_read_user(&sizebc, sizeof sizebc, (const void *)(bc - LJ_PT_SIZE + LJ_PT_SIZEBC))) return 0;
  /* from the function's first instruction, before the dispatch moved
   * past it, to past its last */
  return pc >= bc && pc <= bc + 4ULL * sizebc ? LJB_REGS : 0;
}

SEC("perf_event")
int ljb_sample(struct pe_ctx *ctx)
{
  u64 id = bpf_get_current_pid_tgid(), frame, stack;
  u32 pid = (u32)(id >> 32), i;
  struct ljb_vm *vm = bpf_map_lookup_elem(&ljb_vms, &pid);
  struct ljb_sample *s;
  int skip = 0, resumer = 0;
  if (!vm) { ljb_count(2); return 0; }
  s = bpf_ringbuf_reserve(&ljb_samples, sizeof *s, 0);
  if (!s) { ljb_count(1); return 0; }
  s->pid = pid;
  s->tid = (u32)id;
  s->rip = ctx->regs.rip;
  s->rsp = ctx->regs.rsp;
  bpf_probe_read_user(s->ret, sizeof s->ret, (const void *)ctx->regs.rsp);
  s->l = ljb_u64(vm->curl_at);
  s->vmstate = (s32)ljb_u64(vm->vmstate_at);
  s->n = 0;
  s->trunc = 0;
  s->base = ljb_u64(s->l + LJ_L_BASE);
  s->pc = 0;
  s->how = LJB_SAVED;
  {
    u64 cf = ljb_u64(s->l + LJ_L_CFRAME) & ~3ULL;
    if (!cf && s->l != vm->mainth) {
      /* a coroutine that yielded (or ended) while G->cur_L still names
       * it: the thread that resumed it runs resume's builtin, from the
       * base it saved calling it (the registers are not yet its own) */
      resumer = 1;
      s->l = vm->mainth;
      s->base = ljb_u64(s->l + LJ_L_BASE);
      cf = ljb_u64(s->l + LJ_L_CFRAME) & ~3ULL;
    }
    if (!cf) {
      s->how = LJB_IDLE;
    } else {
      u64 pc = ljb_u64(cf + LJ_CF_PC);
      if (pc != ljb_u64(cf + LJ_CF_L)) s->pc = pc;
    }
  }
  if (s->how != LJB_IDLE) {
    if (s->vmstate == LJ_VMST_INTERP && ctx->regs.rip >= vm->vm_lo && ctx->regs.rip < vm->vm_hi) {
      /* (r14 is not DISPATCH in the VM's entry and exit code: L->base may
       * be stale there too) */
      u32 how = (resumer || ctx->regs.r14 != vm->dispatch) ? 0 : ljb_regs(ctx->regs.rdx, ctx->regs.rbx);
      if (how) {
        s->base = ctx->regs.rdx;
        s->pc = ctx->regs.rbx - 4;
        s->how = how;
      } else {
        s->how = LJB_TRANSIENT;
      }
    } else {
      /* in a trace, or in what a trace called (a helper, the GC): L->base
       * is stale, jit_base is the trace's base frame */
      u64 jb = ljb_u64(vm->curl_at + 8);
      if (jb) { s->base = jb; s->pc = 0; s->how = s->vmstate > 0 ? LJB_JIT : LJB_JITC; }
    }
  }
  stack = ljb_u64(s->l + LJ_L_STACK);
  frame = s->base - 8;
  /* the running thread's frames, then (a coroutine) the main thread's,
   * which resumed it: from its L->base, set when it called resume */
  for (i = 0; i < 2 * LJB_MAXF && s->how != LJB_IDLE; i++) {
    u64 w[2], link;
    /* (not when the main thread runs no Lua, its C frame NULL: a host
     * such as nginx resumed the coroutine from C, and the main thread's
     * L->base is an old call's) */
    if (frame <= stack + 8 && s->l != vm->mainth && stack != ljb_u64(vm->mainth + LJ_L_STACK)
        && (ljb_u64(vm->mainth + LJ_L_CFRAME) & ~3ULL)) {
      stack = ljb_u64(vm->mainth + LJ_L_STACK);
      frame = ljb_u64(vm->mainth + LJ_L_BASE) - 8;
      skip = 0;
    }
    if (frame <= stack + 8) break;
    if (bpf_probe_read_user(w, sizeof w, (const void *)(frame - 8))) { s->trunc = 1; break; }
    link = w[1];
    if (!skip) {
      u32 k = s->n;
      if (k < LJB_MAXF) {
        /* the PC the frame below resumes at: a Lua frame's link, a
         * continuation's (a metamethod's) two slots below its link */
        u64 cpc = (link & 3) == 0 ? link : (link & 7) == LJ_FRAME_CONT ? ljb_u64(frame - 16) : 0;
        u64 fn = w[0] & LJ_GCMASK, f[2] = { 0, 0 };
        unsigned char t[2] = { 0, 0 };
        /* the function as it is now: gct, ffid, its bytecode or C function */
        bpf_probe_read_user(t, sizeof t, (const void *)(fn + LJ_FN_GCT));
        if (t[0] == LJ_GCT_FUNC) bpf_probe_read_user(f, sizeof f, (const void *)(fn + LJ_FNL_PC));
        s->fn[k] = fn;
        s->pcs[k] = cpc;
        s->kind[k] = t[0] | (u32)t[1] << 8;
        s->fpc[k] = t[1] == 0 ? f[0] : t[1] == 1 ? f[1] : 0;
        s->n = k + 1;
      }
    }
    skip = (link & 7) == LJ_FRAME_VARG;
    if ((link & 3) == 0) {
      u32 ins = 0;
      bpf_probe_read_user(&ins, sizeof ins, (const void *)(link - 4));
      frame = frame - 8 * (2 + ((ins >> 8) & 0xff));
    } else {
      frame = frame - (link & ~7ULL);
    }
  }
  if (i == 2 * LJB_MAXF || s->n == LJB_MAXF) s->trunc = 1;
  bpf_ringbuf_submit(s, 0);
  ljb_count(0);
  return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
