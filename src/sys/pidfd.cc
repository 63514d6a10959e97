#include "sys/pidfd.h"

#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

namespace ctrun {

UniqueFd PidfdOpen(pid_t pid) {
  // pidfds are always O_CLOEXEC.
  long fd = ::syscall(SYS_pidfd_open, pid, 0);
  return UniqueFd(fd < 0 ? -1 : static_cast<int>(fd));
}

bool PidfdSignal(const UniqueFd& pidfd, int sig) {
  return pidfd && ::syscall(SYS_pidfd_send_signal, pidfd.get(), sig, nullptr, 0) == 0;
}

}  // namespace ctrun
