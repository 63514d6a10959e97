#include "process/reaper.h"

#include <sys/prctl.h>
#include <sys/wait.h>

#include <cerrno>

#include "sys/posix_util.h"

namespace ctrun {

Status BecomeChildSubreaper() {
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) return Status::Errno("prctl(PR_SET_CHILD_SUBREAPER)", errno);
  return Status::Ok();
}

int DrainExitedChildren(const std::function<void(pid_t, ExitStatus)>& on_exit) {
  int n = 0;
  for (;;) {
    int status = 0;
    pid_t pid = RetryOnEintr([&] { return ::waitpid(-1, &status, WNOHANG); });
    if (pid <= 0) break;  // 0: children remain, none exited; -1/ECHILD: no children
    if (!WIFEXITED(status) && !WIFSIGNALED(status)) continue;
    ++n;
    on_exit(pid, ExitStatus::FromWaitStatus(status));
  }
  return n;
}

void DrainStoppedChildren(const std::function<void(pid_t, int)>& on_stop) {
  for (;;) {
    siginfo_t info{};
    if (RetryOnEintr([&] { return ::waitid(P_ALL, 0, &info, WSTOPPED | WNOHANG); }) != 0 || info.si_pid == 0) return;
    on_stop(info.si_pid, info.si_status);
  }
}

}  // namespace ctrun
