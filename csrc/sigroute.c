/*
 * sigroute.c - an event's overflow signal, sent to the calling thread.
 *
 * Owns the arming that the two Lua-level samplers share (luahook.c, the
 * PUC hook; lj/signal.c and lj/arm.c, LuaJIT's safe point):
 * the handler of their real-time signal, SIGIO taken when the process left
 * it at its default action (the kernel sends a plain SIGIO when it cannot
 * queue the real-time one, and SIGIO's default ends the process), the
 * fd's owner, signal and O_ASYNC, and whether an armed fd is still the
 * event it was (a profile dropped without stop() has its fd closed, and
 * fd numbers are reused); and their reads of this process's memory
 * (pe_peek).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include "pe_core.h"

int pe_sig_install(int signo, pe_sig_fn fn, pe_sig_fn sigio_fn, const sigset_t *mask)
{
  struct sigaction sa, old;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = fn;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  if (mask) sa.sa_mask = *mask;
  else sigemptyset(&sa.sa_mask);
  if (sigaction(signo, &sa, NULL) < 0) return -1;
  /* a process that handles SIGIO itself (nginx) keeps its handler */
  if (sigaction(SIGIO, NULL, &old) == 0 && !(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_DFL) {
    sa.sa_sigaction = sigio_fn;
    sigaction(SIGIO, &sa, NULL);
  }
  return 0;
}

int pe_sig_route(int fd, int signo)
{
  struct f_owner_ex own;
  int fl;
  own.type = F_OWNER_TID;
  own.pid = pe_current_tid();
  fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETOWN_EX, &own) < 0 || fcntl(fd, F_SETSIG, signo) < 0
      || fcntl(fd, F_SETFL, fl | O_ASYNC | O_NONBLOCK) < 0)
    return -1;
  return 0;
}

void pe_sig_unroute(int fd)
{
  int fl = fd >= 0 ? fcntl(fd, F_GETFL) : -1;
  if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_ASYNC);
}

int pe_peek(pid_t pid, uint64_t addr, void *out, size_t n)
{
  struct iovec l = { out, n }, r = { (void *)(uintptr_t)addr, n };
  if (addr == 0) return 0;
  return syscall(SYS_process_vm_readv, (long)pid, &l, 1, &r, 1, 0) == (long)n;
}

uint64_t pe_fd_id(int fd)
{
  uint64_t id = 0;
  if (fd < 0 || ioctl(fd, PE_IOC_ID, &id) < 0) return 0;
  return id;
}
