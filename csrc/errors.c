/*
 * errors.c - turning an errno into something a person can act on.
 *
 * Owns: the luaposix-style nil/message/errno triple, and the
 * hints for perf_event_open's errnos (CHECKLIST I), which look at the attr,
 * pid and cpu to name the likely cause.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include "pe_core.h"

/* errno names: abi.c (pe_errno_name) */

long pe_read_sysctl(const char *name, long dflt)
{
  char path[128], buf[64];
  FILE *f;
  long v = dflt;
  snprintf(path, sizeof path, "/proc/sys/kernel/%s", name);
  f = fopen(path, "re");
  if (!f) return dflt;
  if (fgets(buf, sizeof buf, f)) {
    char *end;
    long x = strtol(buf, &end, 10);
    if (end != buf) v = x;
  }
  fclose(f);
  return v;
}

static const char *generic_hint(int err)
{
  switch (err) {
  case EBADF: return "not an open perf_event file descriptor";
  case ENOTTY: return "the kernel does not know this ioctl";
  case EMFILE: return "out of file descriptors: raise RLIMIT_NOFILE (ulimit -n) or open fewer events";
  case ENFILE: return "the system-wide file table is full";
  case ENOMEM: return "out of memory";
  case EFAULT: return "a pointer argument was invalid";
  case EPERM: return "operation not permitted: a privilege or mlock limit is missing";
  case EACCES: return "permission denied";
  case EINTR: return "interrupted by a signal";
  default: return NULL;
  }
}

void pe_push_errmsg(lua_State *L, const char *op, const char *what, int err,
                    const char *hint)
{
  luaL_Buffer b;
  if (!hint) hint = generic_hint(err);
  luaL_buffinit(L, &b);
  luaL_addstring(&b, op);
  if (what && *what) {
    luaL_addchar(&b, '(');
    luaL_addstring(&b, what);
    luaL_addchar(&b, ')');
  }
  luaL_addstring(&b, ": ");
  luaL_addstring(&b, pe_errno_name(err));
  luaL_addstring(&b, ": ");
  luaL_addstring(&b, strerror(err));
  if (hint) {
    luaL_addstring(&b, " (");
    luaL_addstring(&b, hint);
    luaL_addchar(&b, ')');
  }
  luaL_pushresult(&b);
}

int pe_push_syserror(lua_State *L, const char *op, const char *what, int err,
                     const char *hint)
{
  lua_pushnil(L);
  pe_push_errmsg(L, op, what, err, hint);
  lua_pushinteger(L, err);
  return 3;
}

static const char *paranoid_meaning(long p)
{
  if (p >= 3) return "perf is disabled for unprivileged users";
  if (p == 2) return "only user-space measurement of your own processes";
  if (p == 1) return "user and kernel measurement of your own processes, no CPU-wide events";
  if (p == 0) return "CPU-wide events allowed, raw tracepoint samples not";
  return "no restriction";
}

#define HAS(a, f) (((a)->flags >> PE_FLAG_##f) & 1u)

const char *pe_open_hint(char *buf, size_t len, int err,
                         const struct pe_attr *a, int pid, int cpu,
                         unsigned long flags)
{
  long paranoid = pe_read_sysctl("perf_event_paranoid", 2);
  switch (err) {
  case EACCES:
  case EPERM:
    if (a->type == PE_TYPE_BREAKPOINT && err == EPERM)
      snprintf(buf, len, "a kernel-address breakpoint needs CAP_PERFMON or CAP_SYS_ADMIN");
    else if (pid == -1)
      snprintf(buf, len, "perf_event_paranoid=%ld: %s; a CPU-wide event (pid=-1) needs "
               "CAP_PERFMON, CAP_SYS_ADMIN or perf_event_paranoid < 1", paranoid,
               paranoid_meaning(paranoid));
    else if (!HAS(a, exclude_kernel) && paranoid >= 2)
      snprintf(buf, len, "perf_event_paranoid=%ld: %s; try the ':u' modifier or "
               "exclude_kernel=true", paranoid, paranoid_meaning(paranoid));
    else if (HAS(a, namespaces))
      snprintf(buf, len, "namespaces=1 needs CAP_PERFMON or CAP_SYS_ADMIN");
    else if (a->sample_type & PE_SAMPLE_PHYS_ADDR)
      snprintf(buf, len, "PERF_SAMPLE_PHYS_ADDR needs CAP_PERFMON or CAP_SYS_ADMIN");
    else if (pid > 0)
      snprintf(buf, len, "perf_event_paranoid=%ld: %s; attaching to pid %d needs ptrace "
               "access to it (same user, dumpable) or CAP_PERFMON", paranoid,
               paranoid_meaning(paranoid), pid);
    else
      snprintf(buf, len, "perf_event_paranoid=%ld: %s; a uprobe/kprobe PMU event needs "
               "CAP_SYS_ADMIN; otherwise grant CAP_PERFMON or lower "
               "/proc/sys/kernel/perf_event_paranoid", paranoid, paranoid_meaning(paranoid));
    return buf;
  case ENOENT:
    if (flags & PE_FLAG_PID_CGROUP)
      snprintf(buf, len, "the cgroup hierarchy has no perf_event controller (use cgroup v2)");
    else if (a->type == PE_TYPE_HARDWARE || a->type == PE_TYPE_HW_CACHE || a->type == PE_TYPE_RAW)
      snprintf(buf, len, "this machine exposes no such PMU event (no hardware PMU, e.g. "
               "in a VM); see /sys/bus/event_source/devices");
    else if (a->type == PE_TYPE_SOFTWARE)
      snprintf(buf, len, "software event config %llu is unknown to this kernel (0-%d)",
               (unsigned long long)a->config, PE_SW_MAX - 1);
    else if (a->type > PE_TYPE_BREAKPOINT)
      snprintf(buf, len, "PMU type %u does not exist, or the probe target (path/function) "
               "was not found", a->type);
    else
      snprintf(buf, len, "PMU type %u does not exist here", a->type);
    return buf;
  case ESRCH:
    snprintf(buf, len, "no process with pid %d (it may have exited)", pid);
    return buf;
  case EBADF:
    if (flags & PE_FLAG_PID_CGROUP)
      snprintf(buf, len, "the cgroup must be an open directory of a cgroup filesystem");
    else
      snprintf(buf, len, "group_fd must be an open perf fd of the group leader");
    return buf;
  case E2BIG:
    snprintf(buf, len, "kernel supports attr size %u: clear fields newer than your kernel "
             "(config3, aux_action, sig_data)", a->size);
    return buf;
  case ENOSPC:
    if (a->type == PE_TYPE_BREAKPOINT)
      snprintf(buf, len, "no free hardware breakpoint slot: at most 4 per task on x86");
    else
      snprintf(buf, len, "no room for the event on the PMU");
    return buf;
  case EMFILE:
    {
      struct rlimit rl;
      if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
        snprintf(buf, len, "out of file descriptors (RLIMIT_NOFILE=%llu): raise it or open "
                 "fewer events/CPUs", (unsigned long long)rl.rlim_cur);
      else
        snprintf(buf, len, "out of file descriptors: raise RLIMIT_NOFILE");
    }
    return buf;
  case EBUSY:
    snprintf(buf, len, "another user has exclusive access to the PMU; retry later");
    return buf;
  case ENODEV:
    snprintf(buf, len, "the event needs a feature this CPU model does not have");
    return buf;
  case ENOSYS:
    snprintf(buf, len, "PERF_SAMPLE_STACK_USER (or another feature) is not supported here");
    return buf;
  case EOPNOTSUPP:
    if (a->sample_type & PE_SAMPLE_BRANCH_STACK)
      snprintf(buf, len, "branch stacks need a hardware PMU with LBR/BRS");
    else if (a->sample_regs_user >> 32 || a->sample_regs_intr >> 32)
      snprintf(buf, len, "XMM register sampling needs a PEBS-capable PMU");
    else if (HAS(a, aux_output) || (a->aux_action & 1u))
      snprintf(buf, len, "aux_output/aux_start_paused need an AUX-area PMU leader");
    else if (a->flags & (3ull << PE_FLAG_precise_ip))
      snprintf(buf, len, "precise_ip needs a PMU with precise sampling (PEBS/IBS)");
    else
      snprintf(buf, len, "the PMU does not support this (e.g. sampling without an overflow interrupt)");
    return buf;
  case EOVERFLOW:
    snprintf(buf, len, "sample_max_stack=%u exceeds perf_event_max_stack=%ld",
             a->sample_max_stack, pe_read_sysctl("perf_event_max_stack", 127));
    return buf;
  case EINTR:
    snprintf(buf, len, "interrupted: perf and ftrace handling of a uprobe were mixed, or a signal arrived");
    return buf;
  case EFAULT:
    snprintf(buf, len, "the attr or a string it points to (uprobe path) is not readable");
    return buf;
  case EINVAL:
    {
      long maxrate = pe_read_sysctl("perf_event_max_sample_rate", 100000);
      if (pid == -1 && cpu == -1)
        snprintf(buf, len, "pid=-1 needs a cpu >= 0 (pid=-1, cpu=-1 is invalid)");
      else if (HAS(a, freq) && a->sample_period > (uint64_t)maxrate)
        snprintf(buf, len, "sample_freq=%llu exceeds perf_event_max_sample_rate=%ld",
                 (unsigned long long)a->sample_period, maxrate);
      else if (!HAS(a, freq) && (a->sample_period >> 63))
        snprintf(buf, len, "sample_period must be below 2^63");
      else if (HAS(a, sigtrap) && !HAS(a, remove_on_exec))
        snprintf(buf, len, "sigtrap requires remove_on_exec");
      else if (HAS(a, inherit_thread) && !HAS(a, inherit))
        snprintf(buf, len, "inherit_thread requires inherit");
      else if (HAS(a, remove_on_exec) && HAS(a, enable_on_exec))
        snprintf(buf, len, "remove_on_exec and enable_on_exec cannot be combined");
      else if (a->sample_type >> PE_SAMPLE_MAX_BIT)
        snprintf(buf, len, "sample_type has bits this kernel does not know");
      else if ((a->sample_type & PE_SAMPLE_WEIGHT) && (a->sample_type & PE_SAMPLE_WEIGHT_STRUCT))
        snprintf(buf, len, "sample_type WEIGHT and WEIGHT_STRUCT are exclusive");
      else if (a->read_format >> PE_FORMAT_MAX_BIT)
        snprintf(buf, len, "read_format has bits this kernel does not know");
      else if (a->flags >> 38)
        snprintf(buf, len, "reserved attr flag bits (38-63) are set");
      else if ((a->sample_type & PE_SAMPLE_STACK_USER) &&
               (a->sample_stack_user % 8 || a->sample_stack_user >= 65536))
        snprintf(buf, len, "sample_stack_user must be a multiple of 8 below 65536");
      else if ((a->sample_type & PE_SAMPLE_REGS_USER) && a->sample_regs_user == 0)
        snprintf(buf, len, "PERF_SAMPLE_REGS_USER needs a non-zero sample_regs_user mask");
      else if ((a->sample_type & PE_SAMPLE_BRANCH_STACK) && a->branch_sample_type == 0)
        snprintf(buf, len, "PERF_SAMPLE_BRANCH_STACK needs branch_sample_type");
      else if (HAS(a, use_clockid))
        snprintf(buf, len, "clockid %d is not accepted (use MONOTONIC, MONOTONIC_RAW, "
                 "REALTIME, BOOTTIME or TAI)", a->clockid);
      else if (a->type == PE_TYPE_TRACEPOINT)
        snprintf(buf, len, "tracepoint id %llu is unknown to the kernel; or, as a group "
                 "member: pinned/exclusive set, or inherit unlike the leader's",
                 (unsigned long long)a->config);
      else if (a->type == PE_TYPE_BREAKPOINT)
        snprintf(buf, len, "bad breakpoint: bp_type must be W, RW or X (R alone is not "
                 "supported on x86), bp_len 1/2/4/8 (8 for X) and bp_addr aligned to bp_len");
      else if (cpu < -1 || cpu >= 0)
        snprintf(buf, len, "cpu %d may not exist, or the group leader is on another cpu/task, "
                 "or pinned/exclusive was set on a group member, or its inherit is unlike the "
                 "leader's", cpu);
      else if (a->type > PE_TYPE_BREAKPOINT && (a->flags & (7ull << PE_FLAG_exclude_user)))
        snprintf(buf, len, "this PMU may not support exclude_user/kernel/hv or sampling "
                 "(msr accepts neither)");
      else
        snprintf(buf, len, "an attr field is out of range for this PMU, or the group "
                 "pairing is invalid (leader on another cpu/task, pinned/exclusive on a member, "
                 "inherit unlike the leader's)");
      return buf;
    }
  default:
    return NULL;
  }
}
