// pidfd_open with run-time detection (Linux >= 5.3). A pidfd obtained right after fork, before
// anyone else can reap the child, refers to exactly that process; it becomes readable when the
// process exits, which is how the event loop learns of a worker's exit without polling.
#pragma once

#include <sys/types.h>

#include "base/unique_fd.h"

namespace ctrun {

// Returns an invalid UniqueFd when pidfds are unsupported (ENOSYS) or the pid is gone.
UniqueFd PidfdOpen(pid_t pid);

// pidfd_send_signal: signals exactly the process `pidfd` names, never a process that took its pid
// later. False when that process is gone, or `pidfd` is invalid.
bool PidfdSignal(const UniqueFd& pidfd, int sig);

}  // namespace ctrun
