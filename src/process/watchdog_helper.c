/* ct-watchdog: ctrun's watchdog (process/watchdog.h) as a program of its own, so that ctrun starts
 * it with posix_spawn instead of forking itself. A fork write-protects the agent's whole address
 * space and the agent then pays a copy-on-write fault for every page it writes afterwards, which on
 * the development VM cost 3-4 ms of an 8-worker launch (README, Benchmarks); an exec'd program
 * costs the agent only its clone.
 *
 * It is freestanding (no C library: raw system calls, the kernel's own headers; x86-64 only)
 * because its start-up is on every launch's critical path: a static glibc program of the same
 * few lines took 1.6 ms per spawn on that VM, this one 0.6 ms. CMake builds it only where this
 * file compiles; elsewhere ctrun forks the watchdog as before.
 *
 * Contract with ctrun (process/watchdog.cc, Watchdog::Start):
 *   fd 0-2  /dev/null
 *   fd 3    the read end of the watchdog pipe (process/watchdog_wire.h)
 *   fd 4    ctrun's executable (O_PATH), or closed
 *   argv    ct-watchdog [CLEANUP_ARG...]
 * ctrun starts it in a process group of its own (POSIX_SPAWN_SETPGROUP: ^C and killpg(ctrun) miss
 * it from its first instruction). It ignores the signals a terminal or `kill` aimed at ctrun send,
 * closes every other descriptor, and reads messages until EOF. EOF after a 'Q': ctrun ended
 * cleanly; exit 0. EOF without one (or a torn message): ctrun died, so it SIGKILLs every group
 * registered and not removed, then, when CLEANUP_ARGs were given, execs fd 4 with argv
 * CLEANUP_ARG... (ctrun's watchdog-cleanup mode: the workers' cgroup, the next attempt's
 * directories), and exits 0 if that exec fails. */

#include <asm/signal.h> /* the kernel's own: SIG*, SIG_IGN, SIG_SETMASK, struct sigaction */
#include <asm/unistd.h> /* __NR_* of this architecture */
#include <linux/errno.h>
#include <linux/fcntl.h> /* AT_EMPTY_PATH */
#include <linux/prctl.h>

#include "process/watchdog_wire.h"

typedef long i64;
typedef unsigned long u64;
typedef int i32;
typedef unsigned int u32;

static i64 Syscall6(i64 n, i64 a, i64 b, i64 c, i64 d, i64 e, i64 f) {
  register i64 r10 __asm__("r10") = d;
  register i64 r8 __asm__("r8") = e;
  register i64 r9 __asm__("r9") = f;
  i64 ret;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                   : "rcx", "r11", "memory");
  return ret;
}
static i64 Syscall3(i64 n, i64 a, i64 b, i64 c) { return Syscall6(n, a, b, c, 0, 0, 0); }

/* One bit per possible process group id: zero pages until touched. */
static u64 groups[kWatchdogPidLimit / 64];

static void SetGroup(i32 pgid, int on) {
  if (pgid <= 0 || pgid >= kWatchdogPidLimit) return;
  const u64 bit = (u64)1 << (pgid % 64);
  if (on) groups[pgid / 64] |= bit;
  else groups[pgid / 64] &= ~bit;
}

static void KillGroups(void) {
  for (u32 w = 0; w < kWatchdogPidLimit / 64; ++w)
    for (u64 left = groups[w]; left != 0; left &= left - 1)
      Syscall3(__NR_kill, -(i64)(w * 64 + (u32)__builtin_ctzll(left)), SIGKILL, 0);
}

/* Reads one message; 0 at EOF or on a torn message. */
static int ReadMessage(struct WatchdogMessage* m) {
  i64 r;
  do r = Syscall3(__NR_read, 3, (i64)m, sizeof *m);
  while (r == -EINTR);
  return r == (i64)sizeof *m;
}

__attribute__((noreturn)) static void Exit(int code) {
  for (;;) Syscall3(__NR_exit_group, code, 0, 0);
}

__attribute__((noreturn, used)) void WatchdogStart(i64* sp) {
  const i64 argc = sp[0];
  char** argv = (char**)(sp + 1);
  char** envp = argv + argc + 1;

  /* The signals first: until they are ignored a TERM sent to this pid (pkill -f) takes it. */
  const struct sigaction ignore = {.sa_handler = SIG_IGN};
  const int ignored[] = {SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE, SIGTERM};
  for (u32 i = 0; i < sizeof ignored / sizeof ignored[0]; ++i)
    Syscall6(__NR_rt_sigaction, ignored[i], (i64)&ignore, 0, sizeof(sigset_t), 0, 0);
  const sigset_t none = 0;
  Syscall6(__NR_rt_sigprocmask, SIG_SETMASK, (i64)&none, 0, sizeof none, 0, 0);
  Syscall3(__NR_close_range, 5, ~0u, 0);
  Syscall3(__NR_prctl, PR_SET_PDEATHSIG, 0, 0);

  int clean = 0;
  struct WatchdogMessage m;
  while (ReadMessage(&m)) {
    if (m.op == 'A') SetGroup(m.pgid, 1);
    else if (m.op == 'R') SetGroup(m.pgid, 0);
    else if (m.op == 'Q') clean = 1;
  }
  if (clean) Exit(0);
  KillGroups();
  if (argc > 1) Syscall6(__NR_execveat, 4, (i64) "", (i64)(argv + 1), (i64)envp, AT_EMPTY_PATH, 0);
  Exit(0);
}

/* The kernel enters with the stack pointer at argc; the ABI wants it 16-byte aligned at a call. */
__asm__(
    ".text\n"
    ".globl _start\n"
    "_start:\n"
    "  xor %rbp, %rbp\n"
    "  mov %rsp, %rdi\n"
    "  and $-16, %rsp\n"
    "  call WatchdogStart\n"
    "  hlt\n");
