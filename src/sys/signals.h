// Signal plumbing for the agent: no work in signal handlers, ever. At start-up (before any thread)
// the agent blocks the asynchronous signals it cares about and reads them from a signalfd in the
// event loop. The original mask is remembered so spawned workers get it back before exec.
// Synchronous fault signals (SEGV, BUS, FPE, ILL, ABRT, TRAP, SYS) stay unblocked.
#pragma once

#include <signal.h>

#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"

namespace ctrun {

// Blocks `signals` (plus SIGCHLD) for the calling thread, records the previous mask, sets
// SIGPIPE to SIG_IGN (a dead console must be an EPIPE, not a dead agent) and SIGCHLD to SIG_DFL
// (an inherited SIG_IGN would let the kernel reap the workers unseen). Call once, early.
Status BlockAgentSignals(const std::vector<int>& signals);
// The mask in force before BlockAgentSignals (empty set if never called). Safe after fork.
const sigset_t& OriginalSignalMask();

// A signalfd over the given signals (which must already be blocked).
class SignalFd {
 public:
  static StatusOr<SignalFd> Create(const std::vector<int>& signals);
  int fd() const { return fd_.get(); }
  // Reads every pending signal (non-blocking); returns their numbers in arrival order.
  std::vector<int> ReadPending();

 private:
  explicit SignalFd(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

}  // namespace ctrun
