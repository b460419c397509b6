/*
 * bench/nginx/switch_c.c - the CPU time a thread spends per voluntary
 * context switch, plain and with a block profile's event armed (the floor
 * of bench/nginx/block.sh): N round trips through two pipes with a child
 * process on the same CPU (taskset), each one voluntary switch of this
 * thread (it waits in read() until the child answers), timed by
 * CLOCK_THREAD_CPUTIME_ID; the switches counted by /proc/self/status.  "armed"
 * opens what pe.profile{block=true} opens (context-switches, a sample per
 * switch with sigtrap, the switch records, on a 32 KiB ring drained every
 * 64 switches) and catches each SIGTRAP in a handler that only counts it.
 *   switch_c plain|armed N  ->  "MODE ns_per_round_trip switches signals"
 * Needs perf_event_paranoid <= 1 or CAP_PERFMON for "armed".
 */
#define _GNU_SOURCE
#include <linux/perf_event.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t traps;

static void on_trap(int sig, siginfo_t *si, void *ctx)
{
  (void)sig; (void)si; (void)ctx;
  traps = traps + 1;
}

static uint64_t cpu_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* this process's voluntary context switches so far */
static long switches(void)
{
  char line[256];
  long v = -1;
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "voluntary_ctxt_switches: %ld", &v) == 1) break;
  fclose(f);
  return v;
}

int main(int argc, char **argv)
{
  int to[2], from[2];
  char c = 0;
  pid_t child;
  long s0, s1;
  struct perf_event_attr a;
  struct perf_event_mmap_page *pg = NULL;
  struct sigaction sa;
  long n = argc > 2 ? atol(argv[2]) : 20000, i;
  int armed = argc > 1 && strcmp(argv[1], "armed") == 0, fd = -1;
  uint64_t t0, t1;
  if (pipe(to) < 0 || pipe(from) < 0) { perror("pipe"); return 2; }
  child = fork();
  if (child < 0) { perror("fork"); return 2; }
  if (child == 0) {   /* answers each byte, until this process closes its end */
    close(to[1]);
    close(from[0]);
    while (read(to[0], &c, 1) == 1) if (write(from[1], &c, 1) != 1) break;
    _exit(0);
  }
  close(to[0]);
  close(from[1]);
  if (armed) {
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_trap;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGTRAP, &sa, NULL);
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = PERF_TYPE_SOFTWARE;
    a.config = PERF_COUNT_SW_CONTEXT_SWITCHES;
    a.sample_period = 1;
    a.sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME;
    a.exclude_hv = 1;
    a.use_clockid = 1;
    a.clockid = CLOCK_MONOTONIC;
    a.context_switch = 1;
    a.sample_id_all = 1;
    a.sigtrap = 1;
    a.remove_on_exec = 1;
    a.sig_data = 1;
    fd = (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
    if (fd < 0) { perror("perf_event_open(context-switches, sigtrap)"); return 2; }
    pg = mmap(NULL, 9 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (pg == MAP_FAILED) { perror("mmap"); return 2; }
  }
  s0 = switches();
  t0 = cpu_ns();
  for (i = 0; i < n; i++) {
    if (write(to[1], &c, 1) != 1 || read(from[0], &c, 1) != 1) { perror("pipe"); return 2; }
    if (pg && (i & 63) == 0) {
      uint64_t head = __atomic_load_n(&pg->data_head, __ATOMIC_ACQUIRE);
      __atomic_store_n(&pg->data_tail, head, __ATOMIC_RELEASE);
    }
  }
  t1 = cpu_ns();
  s1 = switches();
  if (fd >= 0) close(fd);
  close(to[1]);
  waitpid(child, NULL, 0);
  printf("%s %.1f %ld %ld\n", armed ? "armed" : "plain", (double)(t1 - t0) / (double)n, s1 - s0, (long)traps);
  return 0;
}
