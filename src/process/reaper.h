// Reaper: ctrun is a child subreaper (PR_SET_CHILD_SUBREAPER), so every orphaned descendant of a
// worker (DataLoader processes, wrapper-script children) is reparented to ctrun and must be
// reaped here. Drain() collects every exited child with waitpid(-1, WNOHANG) and reports each.
// The agent calls Drain() on SIGCHLD and on pidfd readiness; whichever comes first reaps.
#pragma once

#include <sys/types.h>

#include <functional>

#include "base/status.h"
#include "process/exit_status.h"

namespace ctrun {

Status BecomeChildSubreaper();

// Reaps all exited children; calls on_exit(pid, status) for each. Returns the number reaped.
int DrainExitedChildren(const std::function<void(pid_t, ExitStatus)>& on_exit);

// Reports every child that stopped since it was last reported (waitid WSTOPPED, which consumes
// the report and reaps nothing): on_stop(pid, the stopping signal).
void DrainStoppedChildren(const std::function<void(pid_t, int)>& on_stop);

}  // namespace ctrun
