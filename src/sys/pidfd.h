// pidfd helpers with run-time detection (Linux >= 5.3 for pidfd_open, 5.1 for send_signal).
// A pidfd obtained right after fork, before anyone else can reap the child, refers to exactly
// that process: signalling through it cannot hit a recycled pid.
#pragma once

#include <sys/types.h>

#include "base/unique_fd.h"

namespace ctrun {

// Returns an invalid UniqueFd when pidfds are unsupported (ENOSYS) or the pid is gone.
UniqueFd PidfdOpen(pid_t pid);
// pidfd_send_signal; returns false with errno set on failure (ESRCH: already exited).
bool PidfdSendSignal(int pidfd, int sig);

}  // namespace ctrun
