/*
 * sigroute.c - an event's overflow signal, sent to the calling thread.
 *
 * Owns the arming that the two Lua-level samplers share (puc/hook.c, the
 * PUC hook; lj/signal.c and lj/arm.c, LuaJIT's safe point):
 * the handler of their real-time signal, SIGIO taken when the process left
 * it at its default action (the kernel sends a plain SIGIO when it cannot
 * queue the real-time one, and SIGIO's default ends the process), the
 * fd's owner, signal and O_ASYNC, and whether an armed fd is still the
 * event it was (a profile dropped without stop() has its fd closed, and
 * fd numbers are reused); and their reads of this process's memory
 * (pe_peek).  O_ASYNC, the owner and the signal belong to the fd's file
 * description, which a forked child shares with its parent: unrouting in a
 * process other than the one that routed the fd would silence the
 * parent's sampler, so it is done only there.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>
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

/* the fds routed, and by which process (a forked child inherits a copy of
 * this table, with the parent's pid) */
#define ROUTED_MAX 64
static struct { int fd; pid_t pid; } routed[ROUTED_MAX];
static int nrouted;

static int routed_at(int fd)
{
  for (int i = 0; i < nrouted; i++) if (routed[i].fd == fd) return i;
  return -1;
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
  {
    int i = routed_at(fd);
    if (i < 0 && nrouted < ROUTED_MAX) i = nrouted++;
    if (i >= 0) { routed[i].fd = fd; routed[i].pid = getpid(); }
  }
  return 0;
}

void pe_sig_unroute(int fd)
{
  int i = fd >= 0 ? routed_at(fd) : -1, fl;
  if (i >= 0) {
    pid_t by = routed[i].pid;
    routed[i] = routed[--nrouted];
    if (by != getpid()) return;          /* a forked child: the parent's routing */
  }
  fl = fd >= 0 ? fcntl(fd, F_GETFL) : -1;
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
