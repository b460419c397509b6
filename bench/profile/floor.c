/* bench/profile/floor.c - what a sample costs before any profiler code
 * runs: the kernel's side of a cpu-clock sample (timer interrupt, the
 * sample written to the ring) and the delivery of the per-sample signal to
 * an empty handler, both ways pe.profile's safe point asks for it, on a
 * plain C loop. bench/profile/run.sh runs it beside overhead.lua so that
 * pe.profile's cost per sample can be split into this floor and the rest.
 *   floor MODE ITERS FREQ    MODE 0: no event; 1: the event and its ring,
 *                            no wakeup, no signal; 2: a wakeup per sample
 *                            and the fd's signal (O_ASYNC, F_SETSIG,
 *                            F_SETOWN_EX to this thread); 3: sigtrap (the
 *                            kernel's SIGTRAP on the way back to user
 *                            space, no wakeup), pe.profile's default;
 *                            4: no perf event, a POSIX timer on
 *                            CLOCK_MONOTONIC at FREQ whose signal goes to
 *                            this thread (what any timer of that rate and
 *                            its signal cost here, perf or not)
 *   floor MODE ITERS FREQ KB the loop also reads a buffer of KB KiB, a cache
 *                            line an iteration (a working set like a Lua
 *                            program's): what an interrupt's disturbed
 *                            caches cost the code it interrupts
 * prints: MODE cpu_seconds samples */
#define _GNU_SOURCE
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PAGES 64

static volatile sig_atomic_t nsig;

static void on_sample(int signo, siginfo_t *si, void *uc)
{
  (void)signo;
  (void)si;
  (void)uc;
  nsig++;
}

/* on_sample as sig's handler: 0, or -1 */
static int catch_samples(int sig)
{
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sample;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  return sigaction(sig, &sa, NULL);
}

static double cpu_now(void)
{
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double spin(long n, const unsigned char *buf, size_t size)
{
  double a = 0;
  long i;
  size_t at = 0;
  if (!buf) {
    for (i = 0; i < n; i++) a += (double)(i % 7) * 1.000001;
    return a;
  }
  for (i = 0; i < n; i++) {
    a += (double)buf[at] * 1.000001;
    at += 64 * 7;             /* a line an iteration, in an order the */
    if (at >= size) at -= size; /* prefetcher half follows */
  }
  return a;
}

int main(int argc, char **argv)
{
  int mode, freq, fd = -1;
  timer_t tm;
  long iters, kb = 0;
  unsigned char *buf = NULL;
  struct perf_event_mmap_page *up = NULL;
  double t0, t;
  volatile double sink;
  unsigned long samples = 0;
  if (argc != 4 && argc != 5) {
    fprintf(stderr, "usage: floor MODE(0|1|2|3|4) ITERS FREQ [KB]\n");
    return 2;
  }
  mode = atoi(argv[1]);
  iters = atol(argv[2]);
  freq = atoi(argv[3]);
  if (argc == 5) kb = atol(argv[4]);
  if (mode < 0 || mode > 4 || iters <= 0 || freq <= 0 || kb < 0 || kb > (1L << 20)) {
    fprintf(stderr, "floor: bad arguments\n");
    return 2;
  }
  if (kb > 0) {
    size_t i;
    /* lines not a multiple of 7, so that the stride visits every line */
    size_t lines = (size_t)kb * 1024 / 64, size;
    if (lines % 7 == 0) lines++;
    size = lines * 64;
    buf = malloc(size);
    if (!buf) {
      perror("floor: malloc");
      return 1;
    }
    for (i = 0; i < size; i++) buf[i] = (unsigned char)(i * 31);
    kb = (long)size;
  }
  if (mode == 4) {
    struct sigevent se;
    struct itimerspec it;
    memset(&se, 0, sizeof se);
    se.sigev_notify = SIGEV_THREAD_ID;
    se.sigev_signo = SIGRTMIN + 5;
    se._sigev_un._tid = (pid_t)syscall(SYS_gettid);
    memset(&it, 0, sizeof it);
    it.it_interval.tv_nsec = it.it_value.tv_nsec = 1000000000L / freq;
    if (catch_samples(SIGRTMIN + 5) || timer_create(CLOCK_MONOTONIC, &se, &tm)
        || timer_settime(tm, 0, &it, NULL)) {
      perror("floor: the POSIX timer");
      return 1;
    }
  }
  if (mode > 0 && mode < 4) {
    struct perf_event_attr a;
    void *m;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = PERF_TYPE_SOFTWARE;
    a.config = PERF_COUNT_SW_CPU_CLOCK;
    a.freq = 1;
    a.sample_freq = (uint64_t)freq;
    /* what pe.profile's safe point asks for */
    a.sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME;
    a.exclude_kernel = 1;
    a.exclude_hv = 1;
    a.disabled = 1;
    if (mode == 2) a.wakeup_events = 1;
    if (mode == 3) {
      a.sigtrap = 1;
      a.remove_on_exec = 1;
      a.sig_data = 1;
    }
    fd = (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) {
      perror("floor: perf_event_open");
      return 1;
    }
    m = mmap(NULL, (size_t)(PAGES + 1) * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
      perror("floor: mmap");
      return 1;
    }
    up = m;
    if (mode == 3) {
      if (catch_samples(SIGTRAP)) {
        perror("floor: sigaction");
        return 1;
      }
    }
    if (mode == 2) {
      struct f_owner_ex o;
      o.type = F_OWNER_TID;
      o.pid = (pid_t)syscall(SYS_gettid);
      if (catch_samples(SIGRTMIN + 4) || fcntl(fd, F_SETOWN_EX, &o) || fcntl(fd, F_SETSIG, SIGRTMIN + 4)
          || fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_ASYNC)) {
        perror("floor: arming the signal");
        return 1;
      }
    }
    if (ioctl(fd, PERF_EVENT_IOC_ENABLE, 0)) {
      perror("floor: enable");
      return 1;
    }
  }
  t0 = cpu_now();
  sink = spin(iters, buf, (size_t)kb);
  t = cpu_now() - t0;
  (void)sink;
  if (mode == 4) {
    timer_delete(tm);
    samples = (unsigned long)nsig;
  }
  if (fd >= 0) {
    ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
    /* each sample is 8 (header) + 3 * 8 bytes; a LOST or THROTTLE record
     * would be counted as one too (none at these rates and ring size) */
    samples = mode >= 2 ? (unsigned long)nsig : (unsigned long)(__atomic_load_n(&up->data_head, __ATOMIC_ACQUIRE) / 32);
  }
  printf("%d %.6f %lu\n", mode, t, samples);
  free(buf);
  return 0;
}
