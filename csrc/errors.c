/*
 * errors.c - turning an errno into something a person can act on.
 *
 * Owns: the luaposix-style nil/message/errno triple, and the
 * hints for perf_event_open's errnos (doc/coverage.md I), which look at the attr,
 * pid and cpu to name the likely cause.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/capability.h>
#include "pe_core.h"

/* errno names: abi.c (pe_errno_name) */

/* The first number in a small file, or dflt. */
static long read_long(const char *path, long dflt)
{
  char buf[64];
  FILE *f = fopen(path, "re");
  long v = dflt;
  if (!f) return dflt;
  if (fgets(buf, sizeof buf, f)) {
    char *end;
    long x = strtol(buf, &end, 10);
    if (end != buf) v = x;
  }
  fclose(f);
  return v;
}

/* A perf sysctl of /proc/sys/kernel, read only to word a hint.  The
 * environment variable PE_SYSCTL_DIR names another directory to read the
 * files from: the specs simulate perf_event_paranoid=3 with it without
 * writing the real sysctl.  It changes message text, never behaviour. */
long pe_read_sysctl(const char *name, long dflt)
{
  char path[512];
  const char *dir = getenv("PE_SYSCTL_DIR");
  if (!dir || !*dir) dir = "/proc/sys/kernel";
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return read_long(path, dflt);
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
  if (p >= 3) return "perf_event_open is refused to every process without CAP_PERFMON";
  if (p == 2) return "only user-space measurement of your own processes";
  if (p == 1) return "user and kernel measurement of your own processes, no CPU-wide events";
  if (p == 0) return "CPU-wide events allowed, raw tracepoint samples not";
  return "no restriction";
}

#define HAS(a, f) (((a)->flags >> PE_FLAG_##f) & 1u)

/* Does this process have capability cap in its effective set? */
static int has_cap(unsigned cap)
{
  struct __user_cap_header_struct h;
  struct __user_cap_data_struct d[2];
  memset(&h, 0, sizeof h);
  memset(d, 0, sizeof d);
  h.version = _LINUX_CAPABILITY_VERSION_3;
  if (syscall(SYS_capget, &h, d) != 0) return 0;
  return (d[cap >> 5].effective >> (cap & 31)) & 1u;
}

#ifndef CAP_PERFMON
#define CAP_PERFMON 38
#endif

/* the kernel's perfmon_capable(): what lifts perf_event_paranoid */
static int perfmon_capable(void)
{
  return has_cap(CAP_PERFMON) || has_cap(CAP_SYS_ADMIN);
}

/* type of a dynamic PMU by its sysfs name, or -1 */
static long pmu_type(const char *name)
{
  char path[128];
  snprintf(path, sizeof path, "/sys/bus/event_source/devices/%s/type", name);
  return read_long(path, -1);
}

/* 1 when pid's real/effective/saved/fs uids are not all ours (the ptrace
 * access check fails for them without CAP_SYS_PTRACE), 0 when they are,
 * -1 when /proc does not say */
static int foreign_process(int pid)
{
  char path[64], line[256];
  FILE *f;
  int r = -1;
  snprintf(path, sizeof path, "/proc/%d/status", pid);
  f = fopen(path, "re");
  if (!f) return -1;
  while (fgets(line, sizeof line, f)) {
    unsigned long u[4];
    if (sscanf(line, "Uid: %lu %lu %lu %lu", &u[0], &u[1], &u[2], &u[3]) == 4) {
      unsigned long me = (unsigned long)getuid();
      r = !(u[0] == me && u[1] == me && u[2] == me && u[3] == me);
      break;
    }
  }
  fclose(f);
  return r;
}

static void perm_hint(char *buf, size_t len, int err, const struct pe_attr *a, int pid,
                      long paranoid)
{
  const char *mean = paranoid_meaning(paranoid);
  int user_only = HAS(a, exclude_kernel);
  int probe = a->type > PE_TYPE_BREAKPOINT &&
              ((long)a->type == pmu_type("uprobe") || (long)a->type == pmu_type("kprobe"));
  if (probe && !has_cap(CAP_SYS_ADMIN)) {
    snprintf(buf, len, "a uprobe/kprobe PMU event needs CAP_SYS_ADMIN: neither CAP_PERFMON, "
             "perf_event_paranoid nor the ':u' modifier lifts that");
  } else if (perfmon_capable()) {
    /* paranoid does not apply to this process: do not blame it */
    if (a->type == PE_TYPE_TRACEPOINT)
      snprintf(buf, len, "this process has CAP_PERFMON/CAP_SYS_ADMIN, so perf_event_paranoid "
               "is not the cause: the kernel refuses this tracepoint to perf (as it can "
               "ftrace:function), or a security policy (LSM, lockdown, seccomp) does");
    else
      snprintf(buf, len, "this process has CAP_PERFMON/CAP_SYS_ADMIN, so perf_event_paranoid "
               "is not the cause: the kernel or a security policy (LSM, lockdown, seccomp) "
               "refuses this event");
  } else if (paranoid >= 3) {
    snprintf(buf, len, "perf_event_paranoid=%ld: %s (the default of Debian and Ubuntu "
             "kernels); as root run 'sysctl kernel.perf_event_paranoid=2', or grant "
             "CAP_PERFMON", paranoid, mean);
  } else if (a->type == PE_TYPE_BREAKPOINT && err == EPERM) {
    snprintf(buf, len, "a kernel-address breakpoint needs CAP_SYS_ADMIN");
  } else if (pid == -1) {
    snprintf(buf, len, "perf_event_paranoid=%ld: %s; a CPU-wide event (pid=-1) needs "
             "CAP_PERFMON, CAP_SYS_ADMIN or perf_event_paranoid < 1", paranoid, mean);
  } else if (pid > 0 && (user_only || foreign_process(pid) == 1)) {
    snprintf(buf, len, "attaching to pid %d needs ptrace access to it (same user and "
             "dumpable, or CAP_SYS_PTRACE) or CAP_PERFMON%s", pid,
             user_only || paranoid < 2 ? "" : "; kernel-mode counting would also need "
             "the ':u' modifier at perf_event_paranoid >= 2");
  } else if (!user_only && paranoid >= 2) {
    snprintf(buf, len, "perf_event_paranoid=%ld: %s; try the ':u' modifier or "
             "exclude_kernel=true", paranoid, mean);
  } else if (HAS(a, namespaces)) {
    snprintf(buf, len, "namespaces=1 needs CAP_PERFMON or CAP_SYS_ADMIN");
  } else if (a->sample_type & PE_SAMPLE_PHYS_ADDR) {
    snprintf(buf, len, "PERF_SAMPLE_PHYS_ADDR needs CAP_PERFMON or CAP_SYS_ADMIN");
  } else {
    snprintf(buf, len, "perf_event_paranoid=%ld: %s; grant CAP_PERFMON or lower "
             "/proc/sys/kernel/perf_event_paranoid", paranoid, mean);
  }
}

const char *pe_open_hint(char *buf, size_t len, int err,
                         const struct pe_attr *a, int pid, int cpu,
                         unsigned long flags)
{
  switch (err) {
  case EACCES:
  case EPERM:
    perm_hint(buf, len, err, a, pid, pe_read_sysctl("perf_event_paranoid", 2));
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

/* The hint for a failed mmap of an event's ring (pages data pages + the
 * user page) right after perf_event_open. */
const char *pe_mmap_hint(char *buf, size_t len, int err, const struct pe_attr *a,
                         int cpu, size_t pages)
{
  long mlock_kb = pe_read_sysctl("perf_event_mlock_kb", 516);
  unsigned long long kib = (unsigned long long)(pages + 1) *
                           (unsigned long long)sysconf(_SC_PAGESIZE) / 1024u;
  if (err == EPERM)
    snprintf(buf, len, "mlock limit: %zu+1 pages (%llu KiB) exceed perf_event_mlock_kb=%ld "
             "per CPU and RLIMIT_MEMLOCK; use fewer pages or grant CAP_IPC_LOCK", pages, kib,
             mlock_kb);
  else if (err == ENOMEM)
    snprintf(buf, len, "the kernel cannot allocate a ring of %zu+1 pages (%llu KiB); use "
             "fewer pages (perf_event_mlock_kb=%ld per CPU is the budget without "
             "CAP_IPC_LOCK)", pages, kib, mlock_kb);
  else if (err == EINVAL && HAS(a, inherit) && cpu == -1)
    snprintf(buf, len, "an inherited event with cpu=-1 cannot be mapped: open one event "
             "per CPU");
  else
    snprintf(buf, len, "the kernel refused to map %zu+1 pages of this event", pages);
  return buf;
}
