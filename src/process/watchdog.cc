#include "process/watchdog.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstring>

#include "sys/cgroup.h"
#include "sys/posix_util.h"

namespace ctrun {
namespace {

// How long a watchdog waits for the workers' cgroup to empty after cgroup.kill (a process in D
// state dies only when its I/O ends) before it gives up and leaves the directory.
constexpr std::chrono::seconds kCgroupEmptyBudget{10};

[[noreturn]] void WatchdogMain(int rfd, const std::string& cgroup_dir, const std::function<void()>& on_agent_death) {
  // Close everything except the pipe: the watchdog must not keep worker pipes or sockets open.
  // The pipe moves above fds 0-2 first (ctrun started with them closed can have it there), or
  // /dev/null would replace it below.
  if (rfd < 3) {
    const int moved = ::fcntl(rfd, F_DUPFD, 3);
    if (moved >= 0) rfd = moved;
  }
  for (int fd = 0; fd < 3; ++fd) {
    int nul = ::open("/dev/null", O_RDWR);
    if (nul >= 0 && nul != fd) {
      ::dup2(nul, fd);
      ::close(nul);
    }
  }
  if (rfd > 3) ::dup2(rfd, 3), rfd = 3;
  ::syscall(SYS_close_range, 4u, ~0u, 0u);
  ::setpgid(0, 0);  // out of ctrun's group: terminal ^C and killpg(ctrun) do not reach it
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE}) ::signal(s, SIG_IGN);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  // Not "ctrun...": `pkill -9 ctrun` matches process names, and must leave the watchdog to do
  // its job (it took both, and the workers' children ran on).
  ::prctl(PR_SET_NAME, "ct-watchdog");

  // Off ctrun's critical path: the watchdog idles from here until ctrun ends.
  if (!cgroup_dir.empty()) RemoveStaleWorkerCgroups(cgroup_dir);

  static PgidSet groups;  // static: zero-initialised BSS, not 512 KiB of stack
  bool clean = false;
  WatchdogMessage m;
  for (;;) {
    ssize_t r = RetryOnEintr([&] { return ::read(rfd, &m, sizeof m); });
    if (r != static_cast<ssize_t>(sizeof m)) break;  // EOF (or torn message): agent is gone
    if (m.op == 'A') {
      groups.Add(m.pgid);
    } else if (m.op == 'R') {
      groups.Remove(m.pgid);
    } else if (m.op == 'Q') {
      clean = true;
    }
  }
  if (!clean) {
    groups.ForEach([](pid_t pgid) { ::kill(-pgid, SIGKILL); });
    if (!cgroup_dir.empty()) RemoveWorkerCgroup(cgroup_dir, kCgroupEmptyBudget);
    if (on_agent_death) on_agent_death();
  }
  ::_exit(0);
}

}  // namespace

void PgidSet::Add(pid_t pgid) {
  if (pgid > 0 && static_cast<uint32_t>(pgid) < kPidLimit)
    bits_[pgid / kWordBits] |= Word{1} << (pgid % kWordBits);
}

void PgidSet::Remove(pid_t pgid) {
  if (pgid > 0 && static_cast<uint32_t>(pgid) < kPidLimit)
    bits_[pgid / kWordBits] &= ~(Word{1} << (pgid % kWordBits));
}

StatusOr<Watchdog> Watchdog::Start(const std::string& cgroup_dir, std::function<void()> on_agent_death) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::Errno("pipe2", errno);
  UniqueFd r(fds[0]), w(fds[1]);
  pid_t pid = ::fork();
  if (pid < 0) return Status::Errno("fork watchdog", errno);
  if (pid == 0) {
    w.reset();
    WatchdogMain(r.release(), cgroup_dir, on_agent_death);
  }
  return Watchdog(std::move(w), pid);
}

Watchdog::~Watchdog() {
  if (write_) Send('Q', 0);
}

namespace {

void SendTo(int fd, char op, pid_t pgid) {
  const WatchdogMessage m{op, static_cast<int32_t>(pgid)};
  (void)RetryOnEintr([&] { return ::write(fd, &m, sizeof m); });  // 5 bytes < PIPE_BUF: whole or nothing
}

}  // namespace

void AnnounceGroup(int watchdog_fd, pid_t pgid) {
  if (watchdog_fd >= 0) SendTo(watchdog_fd, 'A', pgid);
}

void Watchdog::Send(char op, pid_t pgid) {
  if (write_) SendTo(write_.get(), op, pgid);
}

void Watchdog::RemoveGroup(pid_t pgid) { Send('R', pgid); }

}  // namespace ctrun
