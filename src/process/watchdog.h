// Watchdog: covers the one case PR_SET_PDEATHSIG cannot. When ctrun itself is SIGKILLed, its
// workers die by PDEATHSIG, but their children (DataLoader workers, ...) are merely reparented
// and keep running, holding GPUs. The watchdog is a tiny forked process that holds the read end
// of a pipe whose only write end lives in the agent. The agent tells it each worker process
// group as it starts ('A' pgid) and when it is gone ('R' pgid). If the pipe reaches EOF without
// a prior 'Q' (clean shutdown), the agent died: the watchdog SIGKILLs every registered group and
// exits. It ignores INT/TERM/HUP/QUIT so a signal aimed at ctrun's group cannot take it first.
//
// Limits: a descendant that leaves its worker's process group (setsid/setpgid) is not covered
// after an agent SIGKILL; everything else is.
#pragma once

#include <sys/types.h>

#include "base/status.h"
#include "base/unique_fd.h"

namespace ctrun {

class Watchdog {
 public:
  // Forks the watchdog. Call before starting workers and before any thread exists.
  static StatusOr<Watchdog> Start();
  Watchdog(Watchdog&&) = default;
  Watchdog& operator=(Watchdog&&) = default;
  ~Watchdog();  // clean shutdown ('Q' + close) unless released

  void AddGroup(pid_t pgid);
  void RemoveGroup(pid_t pgid);
  pid_t pid() const { return pid_; }

 private:
  Watchdog(UniqueFd w, pid_t pid) : write_(std::move(w)), pid_(pid) {}
  void Send(char op, pid_t pgid);
  UniqueFd write_;
  pid_t pid_ = -1;
};

}  // namespace ctrun
