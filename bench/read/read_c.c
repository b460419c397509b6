/*
 * bench/read/read_c.c - the C baseline for bench/read: what a C program pays
 * to read the counters ev:read() and group:read(t) read.
 *
 *   read_c MODE N        prints "MODE N ns_per_op"
 *   bare    read(fd, buf, 24) of task-clock (value, enabled, running)
 *   scaled  the same plus the multiplex scaling ev:read() returns
 *   mapped  scaled, with the event's user page mmap'ed as the binding maps
 *           it for self-monitoring counters (the kernel's read(2) of a
 *           mapped event does a little more work)
 *   group4  one read(2) of a 4-event group (GROUP|ID|TOTAL_TIME_*) and the
 *           4 scaled values, by position
 *   group3  the same for perf_event.openresty's default 3-event group
 *           (task-clock, page-faults, context-switches): bench/nginx's
 *           per-request read
 * Events are software events (task-clock, page-faults, context-switches,
 * cpu-migrations) with exclude_kernel, as perf_event_paranoid=2 allows.
 */
#define _GNU_SOURCE
#include <linux/perf_event.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int open_sw(uint64_t config, uint64_t rf, int group_fd, int disabled)
{
  struct perf_event_attr a;
  int fd;
  memset(&a, 0, sizeof a);
  a.size = sizeof a;
  a.type = PERF_TYPE_SOFTWARE;
  a.config = config;
  a.read_format = rf;
  a.disabled = disabled;
  a.exclude_kernel = 1;
  a.exclude_hv = 1;
  fd = (int)syscall(SYS_perf_event_open, &a, 0, -1, group_fd, PERF_FLAG_FD_CLOEXEC);
  if (fd < 0) { perror("perf_event_open"); exit(1); }
  return fd;
}

static uint64_t scale(uint64_t v, uint64_t en, uint64_t run)
{
  if (run == 0) return 0;
  if (run >= en) return v;
  return (uint64_t)((unsigned __int128)v * en / run);
}

static double now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
  const char *mode = argc > 1 ? argv[1] : "bare";
  long n = argc > 2 ? atol(argv[2]) : 1000000, i;
  volatile uint64_t sink = 0;
  double t0, t1;
  uint64_t rf = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING;

  if (strcmp(mode, "group4") == 0 || strcmp(mode, "group3") == 0) {
    uint64_t buf[3 + 2 * 4];
    uint64_t grf = rf | PERF_FORMAT_GROUP | PERF_FORMAT_ID;
    size_t members = mode[5] == '4' ? 4 : 3, len = 8 * (3 + 2 * members);
    int lead = open_sw(PERF_COUNT_SW_TASK_CLOCK, grf, -1, 1);
    open_sw(PERF_COUNT_SW_PAGE_FAULTS, grf, lead, 0);
    open_sw(PERF_COUNT_SW_CONTEXT_SWITCHES, grf, lead, 0);
    if (members == 4) open_sw(PERF_COUNT_SW_CPU_MIGRATIONS, grf, lead, 0);
    ioctl(lead, PERF_EVENT_IOC_ENABLE, PERF_IOC_FLAG_GROUP);
    t0 = now();
    for (i = 0; i < n; i++) {
      uint64_t k, v[4] = { 0, 0, 0, 0 };
      if (read(lead, buf, len) != (ssize_t)len) { perror("read"); return 1; }
      for (k = 0; k < members; k++) v[k] = scale(buf[3 + 2 * k], buf[1], buf[2]);
      sink += v[0] + v[members - 1];
    }
    t1 = now();
  } else {
    uint64_t buf[3];
    int fd = open_sw(PERF_COUNT_SW_TASK_CLOCK, rf, -1, 0);
    int mapped = strcmp(mode, "mapped") == 0;
    int scaled = mapped || strcmp(mode, "scaled") == 0;
    if (!scaled && strcmp(mode, "bare") != 0) { fprintf(stderr, "unknown mode %s\n", mode); return 2; }
    if (mapped && mmap(NULL, (size_t)sysconf(_SC_PAGESIZE), PROT_READ | PROT_WRITE, MAP_SHARED,
                       fd, 0) == MAP_FAILED) { perror("mmap"); return 1; }
    t0 = now();
    if (scaled) {
      for (i = 0; i < n; i++) {
        if (read(fd, buf, sizeof buf) != (ssize_t)sizeof buf) { perror("read"); return 1; }
        sink += scale(buf[0], buf[1], buf[2]);
      }
    } else {
      for (i = 0; i < n; i++) read(fd, buf, sizeof buf);
    }
    t1 = now();
  }
  printf("%s %ld %.1f\n", mode, n, (t1 - t0) / (double)n);
  return (int)(sink & 0);
}
