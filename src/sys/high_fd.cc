#include "sys/high_fd.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

namespace ctrun {
namespace {

std::atomic<bool> g_reserved{false};

// close_range(2) with flags (5.11+) and not refused by a seccomp filter: a range that holds no
// descriptor at all makes the call a no-op.
bool CloseRangeWorks() {
#ifdef SYS_close_range
  return ::syscall(SYS_close_range, ~0u, ~0u, CLOSE_RANGE_CLOEXEC) == 0;
#else
  return false;
#endif
}

}  // namespace

bool ReserveHighFds() {
  if (g_reserved.load()) return true;
  if (!CloseRangeWorks()) return false;
  // A descriptor at the line grows the table to hold it; closing it does not shrink the table.
  // Any descriptor will do to copy there (fd 0 may be closed).
  UniqueFd any(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!any) return false;
  UniqueFd probe(::fcntl(any.get(), F_DUPFD_CLOEXEC, kHighFdLine));
  if (!probe) return false;  // EINVAL: RLIMIT_NOFILE does not reach past the line
  g_reserved.store(true);
  return true;
}

bool HighFdsReserved() { return g_reserved.load(std::memory_order_relaxed); }

int MoveHigh(int fd) {
  if (fd < 0 || fd >= kHighFdLine || !HighFdsReserved()) return fd;
  const int high = ::fcntl(fd, F_DUPFD_CLOEXEC, kHighFdLine);
  if (high < 0) return fd;
  ::close(fd);
  return high;
}

void MoveHigh(UniqueFd* fd) {
  if (*fd) fd->reset(MoveHigh(fd->release()));
}

bool ChildUnshareBelowLine() {
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, static_cast<unsigned>(kHighFdLine), ~0u, CLOSE_RANGE_UNSHARE) == 0) return true;
#endif
  return ::unshare(CLONE_FILES) == 0;
}

}  // namespace ctrun
