/*
 * bpf/ljstack.h - what the BPF program of `luaperf record --lua -p`
 * (bpf/ljstack.bpf.c) and its loader (lj/bpfprof.c) share: the VM a
 * process holds, as user space found it, and one sample's raw chain as the
 * program writes it to the ring.  Plain C types: both compilers read it.
 */
#ifndef PE_LJSTACK_H
#define PE_LJSTACK_H

#define LJB_MAXF 64
#define LJB_RET 32       /* words read above the sample's sp (a trace's return address) */

/* where a walk started */
#define LJB_REGS 1       /* the interpreter's registers (BASE rdx, PC rbx) */
#define LJB_JIT 2        /* a trace: jit_base, the leaf's PC from its snapshot later */
#define LJB_SAVED 3      /* L->base, the PC the VM saved leaving for C */
#define LJB_IDLE 4       /* no Lua running (cframe NULL) */
#define LJB_JITC 5       /* called from a trace (GC, a helper): jit_base, no leaf PC */
#define LJB_EDGE 6       /* the registers, rbx the frame's link: a call's or a return's edge, a builtin */
#define LJB_TRANSIENT 7  /* in the VM, its registers name no frame: L->base (checked later) */

/* what user space found of a process's VM (perf_event.remote's state) */
struct ljb_vm {
  unsigned long long g, curl_at, vmstate_at, dispatch, vm_lo, vm_hi, mainth;
};

/* a sample: each frame's function as it was at the sample (a closure may
 * be freed, its memory reused, before user space reads the chain): its
 * address, its gct and ffid (kind: gct | ffid << 8), and its bytecode
 * (a Lua function's pc) or C function (f) */
struct ljb_sample {
  unsigned int pid, tid;
  int vmstate;
  unsigned int how, n, trunc;
  unsigned long long l, base, pc, rip, rsp, ret[LJB_RET];
  unsigned long long fn[LJB_MAXF], pcs[LJB_MAXF], fpc[LJB_MAXF];
  unsigned int kind[LJB_MAXF];
};

#endif
