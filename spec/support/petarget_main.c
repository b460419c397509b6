/*
 * petarget - runs libpetarget functions from the command line so specs and
 * peer tools (perf) can measure a separate process:
 *   petarget call N          pet_work called N times
 *   petarget getppid N       getppid(2) called N times
 *   petarget getpids N M     getppid(2) N times, then getpgrp(2) M times (neither is
 *                            made by the ASan runtime, which calls getpid once)
 *   petarget spin ITERS      burn CPU in pet_spin_inner
 *   petarget spincpu ITERS F the same, then write the process's CPU time (ns) to file F
 *   petarget touch W R       W writes and R reads of pet_cell[0]
 *   petarget sleep MS        sleep, then exit
 *   petarget threads N ITERS N threads each burn pet_spin(ITERS); main waits
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <stdint.h>
#include <pthread.h>

uint64_t pet_call(uint64_t n);
uint64_t pet_spin(uint64_t iters);
uint64_t pet_touch(uint64_t writes, uint64_t reads);

static void *spin_thread(void *arg)
{
  pet_spin((uint64_t)(uintptr_t)arg);
  return NULL;
}

int main(int argc, char **argv)
{
  uint64_t a = argc > 2 ? strtoull(argv[2], NULL, 0) : 0;
  uint64_t b = argc > 3 ? strtoull(argv[3], NULL, 0) : 0;
  uint64_t i;
  if (argc < 2) {
    fprintf(stderr, "usage: petarget call N | getppid N | getpids N M | spin ITERS | spincpu ITERS FILE | touch W R | sleep MS\n");
    return 2;
  }
  if (strcmp(argv[1], "call") == 0) pet_call(a);
  else if (strcmp(argv[1], "getppid") == 0) for (i = 0; i < a; i++) getppid();
  else if (strcmp(argv[1], "getpids") == 0) {
    for (i = 0; i < a; i++) getppid();
    for (i = 0; i < b; i++) getpgrp();
  } else if (strcmp(argv[1], "spin") == 0) printf("%llu\n", (unsigned long long)pet_spin(a));
  else if (strcmp(argv[1], "spincpu") == 0 && argc > 3) {
    struct timespec ts;
    FILE *f;
    printf("%llu\n", (unsigned long long)pet_spin(a));
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    if (!(f = fopen(argv[3], "w"))) { perror(argv[3]); return 1; }
    fprintf(f, "%lld\n", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
    if (fclose(f) != 0) { perror(argv[3]); return 1; }
  }
  else if (strcmp(argv[1], "touch") == 0) pet_touch(a, b);
  else if (strcmp(argv[1], "sleep") == 0) {
    struct timespec ts = { (time_t)(a / 1000), (long)(a % 1000) * 1000000L };
    nanosleep(&ts, NULL);
  } else if (strcmp(argv[1], "threads") == 0) {
    pthread_t t[64];
    for (i = 0; i < a && i < 64; i++) pthread_create(&t[i], NULL, spin_thread, (void *)(uintptr_t)b);
    for (i = 0; i < a && i < 64; i++) pthread_join(t[i], NULL);
  } else { fprintf(stderr, "petarget: unknown command %s\n", argv[1]); return 2; }
  return 0;
}
